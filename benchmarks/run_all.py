# SPDX-License-Identifier: Apache-2.0
"""Run every CPU benchmark and write docs/benchmarks.md, its plots and README's figures.

Run: ``python -m benchmarks.run_all`` (tens of minutes on 2 cores: pyperf starts
several worker processes per benchmark of ``bench_hit`` and ``bench_cold``) or
``python -m benchmarks.run_all --quick`` (a smoke run of a minute or so, written to
``build/benchmarks-quick/`` unless ``--out`` says otherwise). The page gets the
command, the date, the commit, the machine, every table, the goals with met / not
met, the plots (``docs/benchmarks/*.png``) and the raw numbers
(``docs/benchmarks/results.json``: the same, with ``git rev-parse HEAD`` and whether
the tree had uncommitted changes). The measured figures of ``README.md`` and
``docs/index.md`` (the block between ``<!-- bench:start -->`` and
``<!-- bench:end -->``, :mod:`benchmarks._readme`) are rewritten from that
``results.json``; a run into another folder writes copies of both pages there
instead. The GPU section is kept from ``docs/benchmarks/gpu.json`` when that exists
(see ``benchmarks.bench_gpu``).

Needs the ``.[dev]`` extras (cachetools, matplotlib) and git on the PATH (for the
commit; without it the commit is recorded as ``null``).
"""

from __future__ import annotations

import argparse
import datetime
import json
import shlex
import sys
import time
from pathlib import Path
from typing import Any

import torch

from benchmarks import (
    _engine_page,
    _plots,
    _profile_page,
    _pyperf,
    _readme,
    bench_cold,
    bench_dsv4,
    bench_floor,
    bench_gpu,
    bench_hit,
    bench_import,
    bench_soak,
    bench_stages,
)
from benchmarks._report import GoalResult, markdown_table
from benchmarks._timing import environment, machine, progress, source_state

ROOT = Path(__file__).resolve().parents[1]

FULL: dict[str, Any] = {
    "hit": {"options": ()},
    "dsv4": {"rounds": bench_dsv4.ROUNDS, "processes": bench_dsv4.PROCESSES},
    "soak": {"steps": 100_000, "warmup": 1_000},
    "stages": {"layers": 8, "tokens": 4, "rounds": bench_stages.ROUNDS},
    "floor": {"rounds": bench_floor.ROUNDS},
    "imports": {"processes": bench_import.PROCESSES},
    "cold": {"options": ()},
}
QUICK: dict[str, Any] = {
    "hit": {"options": ("--debug-single-value",)},
    "dsv4": {
        "tokens": bench_dsv4.QUICK_TOKENS,
        "layers": bench_dsv4.QUICK_LAYERS,
        "rounds": 4,
        "processes": 2,
    },
    "soak": {"steps": 2_000, "warmup": 200},
    "stages": {"layers": 8, "tokens": 4, "rounds": 5},
    "floor": {"tokens": (1,), "rounds": 3},
    "imports": {"processes": 2, "warmup": 0},
    "cold": {"options": ("--debug-single-value",)},
}


def _stage_summary(stages: bench_stages.StageResults) -> str:
    """The stage table's differences by what stepcache does there, as a phrase."""
    groups = bench_stages.stage_groups(stages)
    total = sum(ns for _, ns in groups.values())
    parts = [f"{n} {name} {ns / 1e3:+.1f} us" for name, (n, ns) in groups.items() if n]
    return f"{', '.join(parts)} (in all {total / 1e3:+.1f} us)"


def _soak_goals(soak: bench_soak.SoakResults) -> str:
    rows = [
        f"| RSS growth over {soak.steps:,} steps | "
        f"{soak.growth / 2**20:+.3f} MiB | <= 1 MiB | "
        f"{'yes' if soak.growth_met else '**no**'} | issue 5 |",
        f"| live entries once a step's owners are gone (max over all steps) | "
        f"{soak.max_live_after} | 0 | {'yes' if soak.live_met else '**no**'} | issue 5 |",
    ]
    return "\n".join(rows)


def page(
    *,
    command: str,
    raw: dict[str, Any],
    started: datetime.datetime,
    minutes: float,
    quick: bool,
    hit: dict[str, Any],
    dsv4: bench_dsv4.Dsv4Results,
    soak: bench_soak.SoakResults,
    stages: bench_stages.StageResults,
    floor: bench_floor.FloorResults,
    cold: dict[str, Any],
    gpu_section: str,
    instructions_section: str = "",
    engine_section: str = "",
    imports: bench_import.ImportResults | None = None,
    profile_section: str = "",
) -> str:
    worst: GoalResult = max(dsv4.goals, key=lambda g: g.ratio)
    worst_point = dsv4.points[dsv4.goals.index(worst)]
    dsv4_goal = (
        f"| DSv4 step simulation, metadata build time: stepcache (its request index "
        f"and decorated sparse-index builder) / the seeds' hand-written caches (a slot "
        f"and a dict, checked inline); median of the per-round ratios, worst of "
        f"{len(dsv4.points)} points ({worst_point.tokens} tokens, "
        f"{worst_point.layers} layers) | {worst.ratio:.3f}x | <= {worst.goal.limit}x | "
        f"{'yes' if dsv4.goal_met else '**no**'} "
        f"({sum(g.met for g in dsv4.goals)} of {len(dsv4.goals)} points) | issue 5 |"
    )
    parts = [
        markdown_table(
            ["goal (ratio of medians)", "measured", "limit", "met", "set by"],
            [],
            "lrrcl",
        ),
        _pyperf.goal_rows(hit["goals"]),
        bench_cold.goal_rows(cold),
        dsv4_goal,
        _soak_goals(soak),
        *([bench_import.goal_rows(imports)] if imports else []),
    ]
    # a run of some rows only has no goal rows of a benchmark: no blank line
    goals = "\n".join(part for part in parts if part)
    lines = [
        "# Benchmarks",
        "",
    ]
    if quick:
        lines += [
            '!!! warning "Quick smoke run"',
            "    These numbers come from `--quick`: too few repetitions to mean anything.",
            "",
        ]
    lines += [
        f"Measured with `{command}` on {started:%Y-%m-%d %H:%M} UTC "
        f"({minutes:.1f} minutes), {_code(raw)}.",
        "",
        f"Environment: {environment()}; CPU: {raw['machine']['cpu']}, "
        f"{raw['machine']['memory_gib']} GiB of memory.",
        "",
        "Machines are noisy, so every number is the median over repeated runs, with the",
        "minimum and maximum: pyperf's worker processes for the hit and the cold path,",
        "rounds interleaved in fresh processes for the DSv4 step. Goals are ratios of",
        "medians; for the DSv4 step, the median of the per-round ratios (below). The",
        "tests never assert on timings.",
        "The raw numbers, with the commit, the command and the machine, are in",
        "[`benchmarks/results.json`](benchmarks/results.json) beside this page; the",
        "figures in the README and on the home page are generated from it.",
        "",
        "## Goals",
        "",
        goals,
        "",
        "## 1. Cache hit cost",
        "",
        "`python -m benchmarks.bench_hit`, with pyperf: nanoseconds per call, each "
        "call a statement as written at a call site, timed in worker processes of "
        "its own (loops calibrated, one warm-up, then values) after its first call "
        "(a miss), the cost of an empty loop subtracted; a row is the ratio of the "
        "medians of two calls timed one after the other in one pyperf run, with the "
        "significance test of `pyperf compare_to` (Student's t-test at 95%). Raw "
        "numbers, with the commit: [hit.json](benchmarks/hit.json).",
        "",
        "- *request index*: DSv4's `token_to_req_indices(buffer)` on a step of 8",
        "  requests padded to 16 tokens, three ways that do different work on a hit.",
        "  *stepcache hit* is `stepcache.integrations.dsv4.request_index.token_to_req_indices`",
        "  as shipped: a hit re-checks its declared dependencies (two tensors, by",
        "  identity and version counter, and an int) and the version counter of its",
        "  result (`guard_result`), and returns the stored tensor. *stock vLLM's",
        "  method* is the seeds' hand-written hit (vLLM PR 47474,",
        "  `stepcache/integrations/dsv4/seed.py`),",
        "  whose hit branch is the one vLLM 0.33 ships in",
        "  `CommonAttentionMetadata.token_to_req_indices` (a test compares the source):",
        "  three asserts (device, dtype, rows) and a new slice of the cached tensor on",
        "  every call. *hand-written cache that keeps its slice* returns the slice it",
        "  returned first and checks nothing: the floor for a cache that stores its",
        "  result, and the fair baseline for stepcache's own checks. A ratio against",
        "  stock vLLM's method says what replacing vLLM's method saves per hit, not",
        "  what stepcache's checks cost. *layout of inference tensors* is the same hit",
        "  on a step whose layout tensors were made under `torch.inference_mode()`, as",
        "  a vLLM step makes its own tensors (the buffer, as vLLM's persistent buffers,",
        "  was made outside): such a tensor has no version counter, so a hit re-reads",
        "  its data pointer, shape, strides, dtype and device, five calls into torch.",
        "- the other rows cache the same trivial method (`return k`) in each way;",
        "  *plain undecorated method* calls it with no cache, and *disabled mode* calls",
        "  the stepcache-decorated method under `stepcache.disabled()`, which calls",
        "  through every time: what switching caching off costs per call.",
        "- the checks-mode rows use owners of their own, so their entries were stored in",
        "  checks mode: a hit compares the deep fingerprints (the contents of small CPU",
        "  tensors), validates `expect` and hands out the guarded view.",
        "- a *goal* has a limit set by an issue; a *comparison* is reported with none.",
        "",
        bench_hit.render(hit),
        "",
        "![Hit cost](benchmarks/hit_cost.png)",
        "",
        "### The cold path: a fresh owner's first call",
        "",
        "`python -m benchmarks.bench_cold`, with pyperf: each benchmark in "
        "worker processes of its own (loops calibrated, one warm-up, then values; "
        "the garbage collector on), the two sides of a row one after the other in "
        "one pyperf run; a row is the ratio of their medians, with the significance "
        "test of `pyperf compare_to` (Student's t-test at 95%). *stepcache* is "
        "`@step_cached` as shipped; the baselines are `functools.cached_property`, "
        "the hand-threaded value of vLLM's Model Runner V2, and the seeds' own code "
        "(`stepcache/integrations/dsv4/seed.py`, written from the PR description, "
        "calling none of stepcache's helpers). The request-index rows are counted "
        "first (copies into the index buffers per step), then timed. Raw numbers, "
        "with the commit: [cold.json](benchmarks/cold.json).",
        "",
        bench_cold.render(cold),
        "",
        "## 2. DSv4 step simulation",
        "",
        "`python -m benchmarks.bench_dsv4`: the metadata build of one engine-free DSv4",
        "step (`stepcache.integrations.dsv4.sim`: the sparse-MLA, compressor and",
        "sparse-SWA builders each ask for the request index, then every layer asks for",
        "its sparse indices), on the CPU, for batches of 1 to 4096 tokens and 8, 30 and",
        "61 layers (two SWA-only layers, then C4A and C128A alternating; C4A layers are",
        "never cached). Batches are decode-heavy: up to 256 one-token decodes, the rest",
        "in prefill chunks of at most 1024 tokens. *hand-written* is the seed PRs'",
        "caches (a slot on the step metadata and a dict on the SWA metadata, checked",
        "inline). *stepcache* is `token_to_req_indices` for the three builders, and",
        "for the layers their builder (`Builders.build_sparse_indices`) decorated with",
        "`sparse_index_builder` (`Builders.cached_sparse_indices`), as a model's own",
        f"code would use it. Each cell: ms per step, median over {dsv4.rounds} rounds",
        f"(min-max), split between {dsv4.processes} fresh processes run one after the",
        "other (a process's memory layout and string-hash seed can favour one variant",
        "for its whole life), the variants interleaved step by step (a round times",
        "one step of uncached and two each of hand-written and stepcache, in a random",
        "order, all with the same builders and buffers; the cycle collector paused);",
        "each point first checks that the three variants give the same values. A",
        "ratio is the median over the rounds of the ratio of the variants' mean step",
        "times in one round: their steps ran milliseconds apart, so the machine's",
        "changes of speed",
        "between rounds cancel out. The order is random because a step's time depends",
        "on the step before it (what that one left in the caches): in a fixed rotation",
        "each variant always followed the same one, which moved two identical",
        "hand-written builds apart by up to 2% and favoured stepcache, which followed",
        "the hand-written build. Both are timed twice so that they run equally often:",
        "a step is faster when a recent step of the same variant left its code and",
        "data in the caches, and before 2026-12-01 only the hand-written build was",
        "timed twice, which added about 1% to stepcache / hand-written at 8 layers.",
        "The control columns divide each variant's second step of a round by its",
        "first.",
        "",
        bench_dsv4.render(dsv4),
        "",
        "![Build time per step](benchmarks/dsv4_build_time.png)",
        "",
        "![Ratios](benchmarks/dsv4_ratio.png)",
        "",
        "### Where the difference goes",
        "",
        f"`python -m benchmarks.bench_stages --layers {stages.layers} --tokens "
        f"{stages.tokens}`: the same step, each stage timed on its own, median over",
        f"{stages.rounds} rounds (the two variants alternating, with the same builders,",
        "the cycle collector paused). stepcache's extra time per step, by what it",
        f"does at each stage, in this run: {_stage_summary(stages)}. A miss runs",
        "stepcache's bookkeeping (find or create the step's store, fingerprint the",
        "dependencies, check `expect` (`TensorSpec.check`), make the",
        "entry, insert, count: about 20 Python calls in the one slow path that every",
        "decorated function shares), a few microseconds of Python when run in a loop;",
        "in a step it",
        "runs once, between the builders' tensor work, with the CPU's caches cold.",
        "Where the hand-written build checks its dict inline, a hit makes one Python",
        "call (the decorated function's fast path); a C4A bypass makes that call",
        "before the build, and a miss two (the fast path, then the slow path).",
        "A stage's median also moves by several microseconds from run to run on this",
        "machine.",
        "",
        bench_stages.render(stages),
        "",
        "#### How low a cache behind a function call goes",
        "",
        f"`python -m benchmarks.bench_floor`: the 8-layer steps, timed as above "
        f"({floor.rounds} rounds, in one process, each column's step once per round and",
        "the hand-written build's twice), with one part swapped at a time. *stepcache request index*: stepcache's request index,",
        "the layers' cache hand-written. In the other columns but *stepcache*, the",
        "request index is hand-written and the layers' cache is swapped. Three columns",
        "call the builder through a function, the form for a builder you do not own",
        "(`f(swa, kind, num_rows, build, *args)`, which calls `build(*args)`):",
        "*plain function*, the seed's dict cache moved into such a function; *minimal",
        "decorator*, the smallest per-owner decorator of that form that stays correct",
        "for a copied owner (`bench_floor.minimal_cached`: a store per owner, the owner",
        "checked through a weak reference on a hit; no dependency checks, validation,",
        "statistics or debug mode); *stepcache sparse_index()*, stepcache's",
        "`sparse_index`. *stepcache sparse index* is the layers' builder decorated with",
        "`sparse_index_builder`, as in the table above, and *stepcache* both",
        "integrations, as there.",
        "",
        bench_floor.render(floor),
        "",
        "In this run the request index alone cost",
        f"{bench_floor.ratio_range(floor, 'stepcache request index')} the hand-written",
        "build, the decorated builder alone",
        f"{bench_floor.ratio_range(floor, 'stepcache sparse index')}, and the",
        "call-through `sparse_index()`",
        f"{bench_floor.ratio_range(floor, 'stepcache sparse_index()')}. In the",
        "call-through form every layer also passes the builder and its arguments",
        "(`*args`), packed at every call and unpacked at every miss and C4A layer.",
        "",
        "### Instructions per step (callgrind)",
        "",
        instructions_section
        or "Not measured yet: run `python -m benchmarks.bench_instructions "
        "--markdown docs/benchmarks/instructions.md` (needs valgrind), then this page.",
        "",
        "## 3. Memory soak",
        "",
        "`python -m benchmarks.bench_soak`: every step builds fresh DSv4 metadata for a",
        "random decode batch, asks for the request index from the three consumers (the",
        "builders' persistent buffers) and for the sparse indices of four layers",
        "(SWA-only, two C128A, one C4A), then drops the metadata. The cycle collector is",
        "off during the soak: what is freed is freed by reference counting.",
        "",
        bench_soak.render(soak),
        "",
        "![Memory soak](benchmarks/soak.png)",
        "",
        "## 4. GPU",
        "",
        gpu_section,
        "",
        "## 5. The vLLM plugin against stock vLLM",
        "",
        engine_section,
        "",
        "## 6. Import time",
        "",
        _import_section(imports),
        "",
        "## 7. What repeats per step in a real vLLM engine (the profiler)",
        "",
        profile_section or _profile_page.section(None),
        "",
        "## Reproduce",
        "",
        "From the repository root, in the environment `bash scripts/setup_env.sh --full`",
        "makes (`.venv`, with the dev extras: cachetools, matplotlib), with git on the",
        "PATH so that the run can record its commit. Commit first: a run on a tree with",
        "uncommitted changes says so, and names them. A full run rewrites this page,",
        "`benchmarks/results.json`, the plots, and the figures in `README.md` and",
        "`index.md`; commit them together.",
        "",
        "    python -m benchmarks.run_all            # everything, writes this page",
        "    python -m benchmarks.run_all --quick    # smoke run, into build/",
        "    python -m benchmarks.bench_hit --fast   # the hit (pyperf)",
        "    python -m benchmarks.bench_cold --fast  # the cold path (pyperf)",
        "    python -m benchmarks.bench_dsv4",
        "    python -m benchmarks.bench_soak",
        "    python -m benchmarks.bench_stages       # the DSv4 step, stage by stage",
        "    python -m benchmarks.bench_floor        # the DSv4 step, part by part",
        "    python -m benchmarks.bench_import       # import time, modules loaded",
        "    python -m benchmarks.bench_instructions --markdown "
        "docs/benchmarks/instructions.md",
        "    python scripts/gpu_bench.py             # on a machine with one GPU",
        "    python -m benchmarks.bench_engine       # the plugin; needs .venv-engine",
        "    python -m benchmarks.profile_engine     # the profiler on vLLM; .venv-engine",
        "    python -m benchmarks._readme            # figures from the results files",
        "",
    ]
    return "\n".join(lines)


def _import_section(imports: bench_import.ImportResults | None) -> str:
    """Section 6: what ``import stepcache`` adds to ``import torch``."""
    if imports is None:
        return "Not measured in this run: run `python -m benchmarks.bench_import`."
    return "\n".join(
        [
            "`python -m benchmarks.bench_import`: `import stepcache` after `import "
            "torch` in a fresh process, cumulative time of the `stepcache` entry in "
            f"`-X importtime`, median of {imports.processes} processes (min-max), each "
            f"running `{bench_import.COMMAND}` from the repository root, after "
            f"{imports.warmup} warm-up process(es) not counted (they leave the files "
            "and bytecode in the OS's cache; every process runs without "
            "`PYTHONDONTWRITEBYTECODE`, so the warm-up writes stepcache's bytecode to "
            "its `__pycache__` as an install does, and no counted process compiles "
            "source). The `torch` row is the cumulative time "
            "of the `torch` entry of the same processes: `import torch` alone, with "
            "nothing imported before it but what Python's start-up imports. Both "
            "include `-X importtime`'s own overhead. Then one more fresh process "
            "compares `sys.modules` before and after `import stepcache` (torch "
            "already imported) and checks that the modules that load lazily are not "
            "among those it added.",
            "",
            bench_import.render(imports),
        ]
    )


def _code(raw: dict[str, Any]) -> str:
    """The commit the run measured, as a phrase for the page."""
    source = raw["source"]
    if source["commit"] is None:
        return "at a commit it could not read (no git checkout)"
    dirty = (
        "with uncommitted changes in "
        + ", ".join(f"`{p}`" for p in source["dirty_paths"])
        if source["dirty"]
        else "with no uncommitted changes"
    )
    return f"at commit `{source['commit']}` {dirty}"


def _pages(out: Path) -> list[tuple[Path, str]]:
    """The pages with a figures block, and the path from each to the docs folder:
    the checkout's own for a run into ``docs``, copies in ``out`` otherwise."""
    if out.resolve() == (ROOT / "docs").resolve():
        return [(ROOT / "README.md", "docs/"), (ROOT / "docs" / "index.md", "")]
    pages = []
    for source, docs in (
        (ROOT / "README.md", "docs/"),
        (ROOT / "docs" / "index.md", ""),
    ):
        copy = out / source.name
        copy.write_text(source.read_text())
        pages.append((copy, docs))
    return pages


def _instructions(path: Path) -> str:
    """The instruction-count table of ``bench_instructions``, if it was made."""
    return path.read_text().strip() if path.exists() else ""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0] if __doc__ else None
    )
    parser.add_argument("--quick", action="store_true", help="a fast smoke run")
    parser.add_argument(
        "--out",
        type=Path,
        help="docs folder to write into (default: docs; build/benchmarks-quick "
        "with --quick)",
    )
    args = parser.parse_args(argv)
    out: Path = args.out or Path("build/benchmarks-quick" if args.quick else "docs")
    settings = QUICK if args.quick else FULL
    given = sys.argv[1:] if argv is None else argv
    command = shlex.join(["python", "-m", "benchmarks.run_all", *given])
    source = source_state()  # before the run writes anything
    torch.set_num_threads(1)
    started = datetime.datetime.now(datetime.UTC)
    t0 = time.monotonic()
    print(f"Environment: {environment()}", flush=True)
    # in fresh processes of its own: what this process has loaded does not matter
    imports = bench_import.run(**settings["imports"])
    print(bench_import.render(imports), "\n", flush=True)
    figures = out / "benchmarks"
    figures.mkdir(parents=True, exist_ok=True)
    # pyperf allows one runner per process: each pyperf benchmark runs in its own
    progress("bench_hit: pyperf, in processes of its own")
    hit = bench_hit.run(figures / "hit.json", **settings["hit"])
    print(bench_hit.render(hit), "\n", flush=True)
    dsv4 = bench_dsv4.run(**settings["dsv4"])
    print(bench_dsv4.render(dsv4), "\n", flush=True)
    stages = bench_stages.run(**settings["stages"])
    print(bench_stages.render(stages), "\n", flush=True)
    floor = bench_floor.run(**settings["floor"])
    print(bench_floor.render(floor), "\n", flush=True)
    progress("bench_cold: pyperf, in processes of its own")
    cold = bench_cold.run(figures / "cold.json", **settings["cold"])
    print(bench_cold.render(cold), "\n", flush=True)
    # the soak last: its live-entry count turns on the tracking of every new store
    # (stepcache.live_caches()), which a store's creation pays for from then on
    soak = bench_soak.soak(**settings["soak"])
    print(bench_soak.render(soak), "\n", flush=True)
    minutes = (time.monotonic() - t0) / 60

    _plots.plot_hits(bench_hit.HitResults.of(hit), figures / "hit_cost.png")
    _plots.plot_dsv4_times(dsv4, figures / "dsv4_build_time.png")
    _plots.plot_dsv4_ratio(dsv4, figures / "dsv4_ratio.png")
    _plots.plot_soak(soak, figures / "soak.png")
    raw = {
        "command": command,
        "date": f"{started:%Y-%m-%d %H:%M} UTC",
        "source": source,
        "machine": machine(),
        "environment": environment(),
        "minutes": minutes,
        "hit": hit,
        "dsv4": dsv4.to_dict(),
        "soak": soak.to_dict(),
        "stages": stages.to_dict(),
        "floor": floor.to_dict(),
        "cold": cold,
        "imports": imports.to_dict(),
    }
    (figures / "results.json").write_text(
        json.dumps(raw, indent=2, sort_keys=True) + "\n"
    )
    engine = _readme.load_engine(out)
    text = page(
        command=command,
        raw=raw,
        started=started,
        minutes=minutes,
        quick=args.quick,
        hit=hit,
        dsv4=dsv4,
        soak=soak,
        stages=stages,
        floor=floor,
        cold=cold,
        gpu_section=bench_gpu.section(out),
        instructions_section=_instructions(figures / "instructions.md"),
        engine_section=_engine_page.section(engine),
        imports=imports,
        profile_section=_profile_page.section(_profile_page.load(out)),
    )
    (out / "benchmarks.md").write_text(text)
    pages = _pages(out)
    for path, docs in pages:
        _readme.rewrite(path, raw, docs, engine=engine)
    progress(
        f"run_all: wrote {out / 'benchmarks.md'}, {figures}/*.png and the figures "
        f"in {', '.join(str(p) for p, _ in pages)}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
