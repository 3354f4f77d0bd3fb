#!/usr/bin/env bash
# GPU checks, for a machine with a CUDA device (under 8 minutes):
#   1. the CUDA-only tests: pinned staging kept alive, a non_blocking copy that does
#      not block the host, CUDA-graph capture and replay of a builder reading the
#      cached index;
#   2. the vLLM plugin on the GPU: vLLM's own Triton kernel, natively (skipped, and
#      reported, where vLLM is not installed).
# tests/cuda runs in a process of its own: tests/vllm switches Triton's interpreter on
# for the CPU, which must not be on here.
#   PYTHON=/path/to/python scripts/gpu_check.sh [pytest args]
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
[ -x "$PY" ] || PY=python3
"$PY" - <<'PYEOF'
import sys

try:
    import torch
except ImportError:
    sys.exit(f"gpu_check: {sys.executable} has no torch; set PYTHON to one that has")
if not torch.cuda.is_available():
    sys.exit(f"gpu_check: torch {torch.__version__} sees no CUDA device; run this on a "
             "GPU machine, with PYTHON pointing at a CUDA build of torch")
print(f"gpu_check: torch {torch.__version__} on {torch.cuda.get_device_name()}")
try:
    import importlib.metadata as md
    print(f"gpu_check: vLLM {md.version('vllm')}")
except Exception:
    print("gpu_check: vLLM is not installed; its GPU tests will be skipped")
PYEOF
unset TRITON_INTERPRET
exec timeout 450 "$PY" -m pytest tests/cuda -q -p no:cacheprovider -rs "$@"
