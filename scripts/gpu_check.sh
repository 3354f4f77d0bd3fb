#!/usr/bin/env bash
# GPU checks, for a machine with a CUDA device:
#   1. tests/cuda (about a minute; at most 7 minutes, then it is stopped): the request
#      index with CUDA buffers over 310 layouts (edge cases, then seeded random ones),
#      pinned staging kept alive, a non_blocking copy that does not block the host,
#      CUDA-graph capture and replay of a builder reading the cached index; and the
#      vLLM plugin on the GPU with vLLM's own Triton kernel, which skips, saying why,
#      where vLLM is not installed.
#      It needs a CUDA build of torch, numpy, attrs and pytest, nothing else (no vLLM,
#      no hypothesis, no network, no install). Ends with one line:
#        gpu_check: SUMMARY tests/cuda: N passed, N skipped, N failed, N errors ...
#   1b. benchmarks/bench_gpu.py --quick (about a minute): the request index per step
#      against the seed's code, copies and synchronisations counted.
#   2. only where this Python has a CUDA vLLM 0.33: vLLM's real engine with the tiny
#      models of tests/engine, CUDA graphs on, plugin off, on and verify: the same
#      greedy tokens, the worker's report; results in docs/benchmarks/gpu_engine.json
#      (up to 5 minutes a run, 9 runs: this part is not within the 8 minutes).
# tests/cuda runs in a process of its own: tests/vllm_plugin switches Triton's
# interpreter on for the CPU, which must not be on here.
#   PYTHON=/path/to/python scripts/gpu_check.sh [pytest args]
# Exit status: 0 when every test of tests/cuda passed or skipped with its reason (and
# the CUDA-only tests ran), 1 otherwise.
# Not run since the CUDA tests last changed (no GPU was lent); an earlier version ran
# on an H200 without vLLM, as docs/limits.md reports.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
[ -x "$PY" ] || PY=python3
"$PY" - <<'PYEOF'
import importlib.util
import sys

try:
    import torch
except ImportError:
    sys.exit(f"gpu_check: {sys.executable} has no torch; set PYTHON to one that has")
if not torch.cuda.is_available():
    sys.exit(f"gpu_check: torch {torch.__version__} sees no CUDA device; run this on a "
             "GPU machine, with PYTHON pointing at a CUDA build of torch")
missing = [
    m for m in ("pytest", "numpy", "attrs") if importlib.util.find_spec(m) is None
]
if missing:
    sys.exit(f"gpu_check: {sys.executable} lacks {', '.join(missing)} (tests/cuda "
             "needs torch, numpy, attrs and pytest)")
print(f"gpu_check: {sys.executable}: torch {torch.__version__} (CUDA "
      f"{torch.version.cuda}) on {torch.cuda.get_device_name()}")
PYEOF
# the real vLLM: a package with an __init__.py and vllm.v1 (a folder named vllm on
# sys.path would import as an empty namespace package)
HAS_VLLM=0
REAL_VLLM="import sys, vllm, vllm.v1; sys.exit(vllm.__file__ is None)"
if "$PY" -c "$REAL_VLLM" 2>/dev/null; then
  HAS_VLLM=1
  echo "gpu_check: vLLM $("$PY" -c 'import vllm; print(vllm.__version__)')"
else
  echo "gpu_check: no vLLM here: its GPU tests skip, the engine run is left out"
fi
unset TRITON_INTERPRET
REPORT=$(mktemp -d)
rc=0
timeout 420 "$PY" -m pytest tests/cuda -q -p no:cacheprovider -rs \
  --junitxml="$REPORT/cuda.xml" "$@" || rc=$?
"$PY" - "$REPORT/cuda.xml" "$rc" <<'PYEOF'
import sys
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

report, rc = Path(sys.argv[1]), int(sys.argv[2])
if not report.is_file():
    why = "timed out after 420 s" if rc == 124 else f"pytest exited {rc}"
    sys.exit(f"gpu_check: SUMMARY tests/cuda: no report ({why}): FAILED")
counts: Counter[str] = Counter()
reasons: Counter[str] = Counter()
cuda_only_skipped = []
for case in ET.parse(report).iter("testcase"):
    outcome = "passed"
    for child in case:
        if child.tag in ("failure", "error", "skipped"):
            outcome = {"failure": "failed", "error": "errors"}.get(child.tag, "skipped")
            if child.tag == "skipped":
                reasons[child.get("message", "")] += 1
                if case.get("classname", "").endswith("test_cuda_request_index"):
                    cuda_only_skipped.append(case.get("name"))
    counts[outcome] += 1
line = ", ".join(f"{counts[k]} {k}" for k in ("passed", "skipped", "failed", "errors"))
why = "; ".join(f"{n} skipped: {r}" for r, n in reasons.items())
bad = counts["failed"] or counts["errors"] or rc not in (0,) or not counts["passed"]
if cuda_only_skipped:  # a CUDA device is here: these must run
    bad = True
    why += f"; CUDA-only tests skipped on a CUDA machine: {cuda_only_skipped}"
verdict = "FAILED" if bad else "OK"
print(f"gpu_check: SUMMARY tests/cuda: {line}" + (f" ({why})" if why else "")
      + f": {verdict}")
sys.exit(1 if bad else 0)
PYEOF

# 1b. the GPU benchmark (benchmarks/bench_gpu.py, one point: about a minute): host-to-
#     device copies, synchronisations and CPU time per step of the request index
#     (three consumers; V2's six groups) against the seed's code, and the DSv4 step
timeout 300 "$PY" scripts/gpu_bench.py --quick ||
  { echo "gpu_check: SUMMARY bench_gpu: FAILED"; exit 1; }
echo "gpu_check: SUMMARY bench_gpu: OK (written under docs/benchmarks/)"

# 2. the real engine on the GPU, if this Python has a CUDA vLLM
if [ "$HAS_VLLM" != 1 ]; then
  echo "gpu_check: SUMMARY engine: left out (no vLLM in $PY)"
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
      { echo "gpu_check: engine $model $mode FAILED:"
        tail -20 "$OUT/$model-$mode.log"; exit 1; }
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
    sys.exit("gpu_check: SUMMARY engine: " + "; ".join(bad) + ": FAILED")
print("gpu_check: SUMMARY engine: 3 models, plugin off, on and verify, same tokens: OK "
      "(recorded in docs/benchmarks/gpu_engine.json)")
PYEOF
