#!/usr/bin/env bash
# The test command: installs everything into .venv (and the real-engine venv
# .venv-engine, and SGLang's .venv-sglang), then lint, types, docs and tests.
set -euo pipefail
cd "$(dirname "$0")/.."
# a fresh install of the three venvs takes about 17 GiB: say so before pip fails on it
free_gib=$(df -Pk . | awk 'NR == 2 {print int($4 / 1048576)}')
if [ ! -d .venv-engine ] && [ "${free_gib:-99}" -lt 18 ]; then
  echo "[setup] warning: ${free_gib} GiB free here; .venv, .venv-engine and" \
    ".venv-sglang take about 17 GiB" >&2
fi
bash scripts/setup_env.sh --full
bash scripts/setup_env.sh --engine
# a vLLM-marked or engine test that skips fails: a broken install must not pass
export STEPCACHE_REQUIRE_VLLM=1
PY=.venv/bin/python
echo "== ruff"
$PY -m ruff check stepcache stepcache_pytest.py demo tests benchmarks scripts docs
$PY -m ruff format --check stepcache stepcache_pytest.py demo tests benchmarks scripts docs
echo "== mypy --strict"
$PY -m mypy stepcache stepcache_pytest.py demo benchmarks tests/typing_example.py
if [ -f mkdocs.yml ]; then
  echo "== mkdocs build --strict"
  # every warning fails it (--strict), and is printed: no --quiet
  NO_MKDOCS_2_WARNING=1 $PY -m mkdocs build --strict --site-dir .venv/site 2>&1 |
    { grep -v '^INFO' || true; }
  [ "${PIPESTATUS[0]}" -eq 0 ] || { echo "mkdocs build failed" >&2; exit 1; }
fi
echo "== pytest"
# -rs: the reason of every skip
$PY -m pytest -q -rs "$@"
if [ $# -eq 0 ]; then
  # the run above is on vLLM 0.33 (.venv's); the plugin's tests again on 0.34.0, the
  # current release (a test of what 0.34 removed skips, saying "release:")
  echo "== pytest: the vLLM plugin's tests on vLLM 0.34.0"
  PYTHONPATH=.venv/vllm-0.34 $PY -m pytest -q -rs tests/vllm_plugin \
    tests/profiler/test_vllm_profile.py
fi
# SGLang 0.5.23 (.venv-sglang, scripts/setup_env.sh --sglang): the SGLang plugin's
# tests on its real classes (~2-3 min and ~6 GiB installed, the tests ~15 s)
if [ $# -eq 0 ]; then
  bash scripts/setup_env.sh --sglang
  echo "== pytest: the SGLang plugin's tests on SGLang 0.5.23"
  STEPCACHE_REQUIRE_SGLANG=1 .venv-sglang/bin/python -m pytest -q -rs tests/sglang \
    stepcache/integrations/sglang
fi
