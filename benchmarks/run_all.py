# SPDX-License-Identifier: Apache-2.0
"""Run every CPU benchmark, then write the README's and the benchmarks page's tables.

Run: ``python -m benchmarks.run_all`` (about 15 minutes on 2 cores), or with
``--quick`` (a smoke run, written with copies of both pages into
``build/benchmarks-quick/`` unless ``--out`` says otherwise). It runs the pyperf
modules (``bench_hit``, ``bench_cold``, ``bench_dsv4``; each in a process of its own,
as pyperf allows one runner per process), the import time and the memory soak, writes
``results.json`` with the command, the date, the commit and pyperf's description of
the machine, then :mod:`benchmarks.page` writes the tables from it.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from benchmarks import _pyperf, bench_import, bench_soak, page

#: pyperf options of each module, the soak's and the import's sizes
FULL: dict[str, Any] = {
    "hit": (),
    "cold": (),
    "dsv4": (),
    "soak": {"steps": 100_000, "warmup": 1_000},
    "imports": {"processes": bench_import.PROCESSES},
}
QUICK: dict[str, Any] = {
    "hit": ("--debug-single-value",),
    "cold": ("--debug-single-value",),
    "dsv4": ("--debug-single-value",),
    "soak": {"steps": 2_000, "warmup": 200},
    "imports": {"processes": 2, "warmup": 0},
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run")
    parser.add_argument("--out", type=Path, help="folder for a run's results and pages")
    args = parser.parse_args(argv)
    out = args.out or (Path("build/benchmarks-quick") if args.quick else None)
    settings = QUICK if args.quick else FULL
    given = sys.argv[1:] if argv is None else argv
    started = time.time()
    results = _pyperf.header(["python", "-m", "benchmarks.run_all", *given], started)
    # in fresh processes of their own: what this process loads does not matter
    results["imports"] = bench_import.run(**settings["imports"])
    with tempfile.TemporaryDirectory() as tmp:
        for name in ("hit", "cold", "dsv4"):
            print(f"run_all: benchmarks.bench_{name} (pyperf)", file=sys.stderr)
            module = f"benchmarks.bench_{name}"
            path = Path(tmp) / f"{name}.json"
            results[name] = _pyperf.run_module(module, path, settings[name])
    results["machine"] = results["hit"]["machine"]
    # the soak last, in this process: its live-entry count makes every new store
    # tracked (stepcache.live_caches()) from then on
    torch.set_num_threads(1)
    results["soak"] = bench_soak.soak(**settings["soak"])
    results["minutes"] = round((time.time() - started) / 60, 1)
    folder = page.RESULTS if out is None else out / "benchmarks"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    data = page.load(results=folder / "results.json")
    page.write(data, into=out)
    print(f"run_all: wrote {folder / 'results.json'} and the pages", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
