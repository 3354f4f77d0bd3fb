#!/usr/bin/env bash
# GPU checks, for a machine with a CUDA device (under 15 minutes):
#   1. the CUDA-only tests: pinned staging kept alive, a non_blocking copy that does
#      not block the host, CUDA-graph capture and replay of a builder reading the
#      cached index;
#   2. the vLLM plugin on the GPU: vLLM's own Triton kernel, natively (skipped, and
#      reported, where vLLM is not installed);
#   3. vLLM's real engine (a CUDA vLLM 0.33, CUDA graphs on) with the tiny models of
#      tests/engine, plugin off, on and verify: the same greedy tokens, the worker's
#      report; results in docs/benchmarks/gpu_engine.json.
# tests/cuda runs in a process of its own: tests/vllm_plugin switches Triton's interpreter on
# for the CPU, which must not be on here.
#   PYTHON=/path/to/python scripts/gpu_check.sh [pytest args]
# NOT RUN YET: no GPU was available where this was written (see docs/integrations.md).
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
timeout 450 "$PY" -m pytest tests/cuda -q -p no:cacheprovider -rs "$@"

# 3. the real engine on the GPU, if this Python has a CUDA vLLM
if ! "$PY" -c "import vllm" 2>/dev/null; then
  echo "gpu_check: no vLLM in $PY: the engine run is skipped"
  exit 0
fi
OUT=$(mktemp -d)
for model in llama qwen3_next deepseek_v2; do
  spec=""
  [ "$model" = llama ] && spec="--spec"
  for mode in 0 1 verify; do
    echo "gpu_check: engine $model STEPCACHE_VLLM=$mode (CUDA graphs on) ..."
    STEPCACHE_VLLM=$mode VLLM_ALLOW_INSECURE_SERIALIZATION=1 timeout 300 \
      "$PY" tests/engine/engine_run.py --model "$model" $spec --cuda-graphs \
      --timed 3 --out "$OUT/$model-$mode.json" > "$OUT/$model-$mode.log" 2>&1 ||
      { echo "gpu_check: engine $model $mode FAILED:"; tail -20 "$OUT/$model-$mode.log"; exit 1; }
  done
done
"$PY" - "$OUT" <<'PYEOF'
import json, subprocess, sys
from pathlib import Path

out = Path(sys.argv[1])
runs = {p.stem: json.loads(p.read_text()) for p in out.glob("*.json")}
summary = {}
bad = []
for model in ("llama", "qwen3_next", "deepseek_v2"):
    off = runs[f"{model}-0"]
    row = {}
    for mode in ("1", "verify"):
        run = runs[f"{model}-{mode}"]
        worker = run["workers"][0]
        same = run["tokens"] == off["tokens"]
        bad += [] if same else [f"{model} {mode}: other tokens than plugin off"]
        row[mode] = {
            "same_tokens": same,
            "mode": worker["mode"],
            "status": worker["status"],
            "counters": worker["counters"],
            "stats": worker["stats"],
            "tokens_per_s": run["generated_tokens"] / min(run["timed_s"]),
        }
    row["off_tokens_per_s"] = off["generated_tokens"] / min(off["timed_s"])
    summary[model] = row
commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True)
import torch, importlib.metadata as md
record = {
    "command": "bash scripts/gpu_check.sh",
    "commit": commit.stdout.strip(),
    "device": torch.cuda.get_device_name(),
    "vllm": md.version("vllm"),
    "runs": summary,
}
Path("docs/benchmarks/gpu_engine.json").write_text(json.dumps(record, indent=1) + "\n")
print(json.dumps(summary, indent=1))
if bad:
    sys.exit("gpu_check: " + "; ".join(bad))
print("gpu_check: engine runs passed; recorded in docs/benchmarks/gpu_engine.json")
PYEOF
