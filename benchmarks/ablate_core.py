# SPDX-License-Identifier: Apache-2.0
"""What the core's speed-only code buys: four issue-56 ratios with each part taken out.

Run: ``python -m benchmarks.ablate_core [--processes N] [--results PATH]``. Four parts
of the core exist only for speed: the generated debug-mode hit, the `expect`
expression a miss inlines (`stepcache._spec.quick`), the miss's inline fingerprint of
a dependency and its inline store for a fresh owner. Each is taken out by rewriting
the generated code before the benchmark's functions are decorated (every call then
takes the slow path, or the full check, that the part short-cuts), in a fresh
process per part and run, the parts interleaved; the ratios are medians over the
processes. ``timeit``, not pyperf: a ratio here compares code, one process at a time.
The rows' code is bench_cold's and bench_hit's own.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import time
import timeit
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from benchmarks import _pyperf

RESULTS = _pyperf.ROOT / "docs" / "benchmarks" / "ablation.json"
#: each part: what taking it out leaves
PARTS = {
    "as shipped": "the core as it is",
    "no debug hit": "debug mode's generated hit removed: every debug-mode call takes "
    "the slow path",
    "no expect expression": "the miss's inline `expect` test removed: every miss runs "
    "the full check",
    "no inline fingerprint": "the miss's inline fingerprint removed: each dependency's "
    "is taken by a call",
    "no inline first store": "the miss's inline store for a fresh owner removed: an "
    "owner's first call takes the slow path",
}
#: each ratio: what both sides do
RATIOS = {
    "cold": "make an owner, call once, drop it (a version-counted tensor dependency): "
    "stepcache / functools.cached_property",
    "two kinds": "make an owner, ask for two keys twice each, drop it: stepcache / a "
    "dict in the owner",
    "rix step": "request index, one step of three consumers (a fresh metadata object):"
    " stepcache / the seed's hand-written cache",
    "checks": "request-index hit: stepcache in checks mode / in production",
}
_FINGERPRINT = re.compile(
    r"    if (\w+)\.__class__ is _sc_Tensor and not \1\.is_inference\(\):\n"
    r"        (\w+) = .*\n(?:    elif .*\n        .*\n){2}    else:\n"
    r"        \2 = (_sc_fingerprint\(.*\))\n"
)
_FIRST_STORE = re.compile(
    r"    if (\w+) is _sc_NO_STORE:\n        (\w+) = _sc_StepCache.*\n(?:.*\n){7}"
    r"    else:\n        \2 = (_sc_miss_store.*)\n"
)


def take_out(part: str) -> list[int]:
    """Rewrite the generated code without ``part`` from here on; a list that counts
    the rewrites made (a part the code no longer has makes none: an error below)."""
    from stepcache import _codegen

    made = [0]
    shipped = _codegen.source

    def source(fn: Any, name: str, variant: str, values: dict[str, object]) -> str:
        text = shipped(fn, name, variant, values)
        if part == "no debug hit" and variant == "debug":
            made[0] += 1
            packed = "(" + "".join(f"{n}, " for n in fn.names) + ")"
            head = _codegen.signature(fn.params)
            return f"def {name}({head}):\n    return _sc_call({packed})\n"
        pattern = {
            "no inline fingerprint": _FINGERPRINT,
            "no inline first store": _FIRST_STORE,
        }.get(part)
        if pattern is not None and variant == "production":
            text, n = pattern.subn(lambda m: f"    {m[2]} = {m[3]}\n", text)
            made[0] += n
        return text

    _codegen.source = source
    if part == "no expect expression":
        setattr(_codegen, "quick", lambda *args: "False")  # noqa: B010
        made[0] += 1
    return made


def _best(fn: Callable[[], object], number: int) -> float:
    return min(timeit.repeat(fn, number=number, repeat=7)) / number * 1e9


def measure(part: str) -> dict[str, float]:
    """The four ratios with ``part`` taken out, in this process."""
    made = take_out(part)
    import torch

    import stepcache
    from benchmarks import bench_cold, bench_hit

    if part != "as shipped" and not made[0]:
        raise SystemExit(f"ablate_core: the generated code has no {part!r} to take out")
    t = torch.zeros(4)
    layout = bench_cold.Layout()
    ours, seeds = (bench_cold.three_consumers(v) for v in ("stepcache", "hand-written"))
    ns = bench_hit.namespace()
    rix, step, checked, buf = ns["rix"], ns["step"], ns["step_checks"], ns["buf"]
    out = {
        "cold": _best(lambda: bench_cold.cold_stepcache(t), 20_000)
        / _best(lambda: bench_cold.cold_cached_property(t), 20_000),
        "two kinds": _best(lambda: bench_cold.kinds_stepcache(t), 20_000)
        / _best(lambda: bench_cold.kinds_by_hand(t), 20_000),
        "rix step": _best(lambda: ours(layout), 5_000)
        / _best(lambda: seeds(layout), 5_000),
    }
    production = _best(lambda: rix(step, buf), 20_000)
    with stepcache.debug("checks"):
        rix(checked, buf)  # stored in checks mode, as bench_hit's row
        out["checks"] = _best(lambda: rix(checked, buf), 20_000) / production
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, default=3)
    parser.add_argument("--results", type=Path, default=RESULTS)
    parser.add_argument("--one", choices=PARTS, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.one:  # a worker: one part, one process
        print(json.dumps(measure(args.one)))
        return 0
    started, command = time.time(), ["python", "-m", MODULE, *(argv or sys.argv[1:])]
    runs: dict[str, list[dict[str, float]]] = {part: [] for part in PARTS}
    for i in range(args.processes):
        for part in PARTS:
            print(f"[{i + 1}/{args.processes}] {part} ...", file=sys.stderr, flush=True)
            done = subprocess.run(
                [sys.executable, "-m", MODULE, "--one", part],
                cwd=_pyperf.ROOT,
                capture_output=True,
                text=True,
                check=True,
            )
            runs[part].append(json.loads(done.stdout.splitlines()[-1]))
    table = {
        part: {k: round(statistics.median(r[k] for r in rs), 3) for k in RATIOS}
        for part, rs in runs.items()
    }
    results = {
        **_pyperf.header(command, started),
        "parts": PARTS,
        "ratios": RATIOS,
        "medians": table,
    }
    args.results.parent.mkdir(parents=True, exist_ok=True)
    args.results.write_text(json.dumps(results, indent=2) + "\n")
    print("| taken out | " + " | ".join(RATIOS) + " |")
    print("| --- |" + " ---: |" * len(RATIOS))
    for part, ratios in table.items():
        print(f"| {part} | " + " | ".join(f"{ratios[k]:.2f}x" for k in RATIOS) + " |")
    return 0


MODULE = "benchmarks.ablate_core"

if __name__ == "__main__":
    raise SystemExit(main())
