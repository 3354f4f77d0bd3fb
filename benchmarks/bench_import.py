# SPDX-License-Identifier: Apache-2.0
"""Import time: what ``import stepcache`` adds to ``import torch``, and what it loads.

Run: ``python -m benchmarks.bench_import [--processes N]``. Each of ``N`` fresh
processes (default 5, after one warm-up process that is not counted, so that every
counted one finds the files and bytecode in the OS's cache) runs, without
``PYTHONDONTWRITEBYTECODE`` in its environment (so the warm-up writes stepcache's
bytecode to its ``__pycache__``, as installing a package does, and no counted process
compiles source)
``python -X importtime -c "import torch; import stepcache"`` from the repository root
(so the checkout's ``stepcache`` is the one imported); the cumulative microseconds of
the top-level ``torch`` and ``stepcache`` entries are read from its output. torch is
imported first, so the ``stepcache`` entry holds only what ``import stepcache`` adds.
Reported: median, min and max of both over the processes.

One more process compares ``sys.modules`` before and after ``import stepcache`` (torch
already imported) and lists what it loaded; the modules that must load lazily
(:data:`LAZY`: the profiler, the integrations, the pytest plugin, attrs, vLLM) must
not be among them. Goal (issue 19): the median ``stepcache`` entry <= 50 ms.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs

from benchmarks._report import markdown_table
from benchmarks._timing import Timing, environment, progress

ROOT = Path(__file__).resolve().parents[1]
PROCESSES = 5
LIMIT_MS = 50.0
GOAL_SOURCE = "issue 19"
#: the statement each timed process runs, as the page quotes it
STATEMENT = "import torch; import stepcache"
COMMAND = f'python -X importtime -c "{STATEMENT}"'
#: modules (and their submodules) that ``import stepcache`` must not load
LAZY = (
    "stepcache.profiler",
    "stepcache.integrations",
    "stepcache.pytest_plugin",
    "stepcache_pytest",
    "pytest",
    "attrs",
    "attr",
    "vllm",
)
#: not counted as "outside the standard library": the core's own dependencies
DEPENDENCIES = ("torch", "numpy")

# json is imported before the snapshot, so that it is not counted as stepcache's
_MODULES_SCRIPT = """\
import json, sys
import torch
before = set(sys.modules)
import stepcache
print(json.dumps({"new": sorted(set(sys.modules) - before), "file": stepcache.__file__}))
"""


def _python(*args: str) -> subprocess.CompletedProcess[str]:
    """``python args`` in a fresh process, from the repository root: ``-c`` puts the
    current folder first on ``sys.path``, so this checkout's stepcache is imported
    even where the environment's editable install points at another one."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    done = subprocess.run(
        [sys.executable, *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    if done.returncode != 0:
        raise RuntimeError(
            f"bench_import: {args} failed (exit {done.returncode}):\n{done.stderr[-2000:]}"
        )
    return done


def top_level_us(importtime: str) -> dict[str, int]:
    """Cumulative microseconds of each top-level entry of ``-X importtime`` output.

    >>> top_level_us(
    ...     "import time: self [us] | cumulative | imported package\\n"
    ...     "import time:       100 |        300 |   torch._C\\n"
    ...     "import time:       400 |        700 | torch\\n"
    ... )
    {'torch': 700}
    """
    found: dict[str, int] = {}
    for line in importtime.splitlines():
        parts = line.split("|")
        if not line.startswith("import time:") or len(parts) != 3:
            continue
        cumulative, name = parts[1].strip(), parts[2]
        # a nested module is indented by two more spaces per level
        if cumulative.isdigit() and not name.startswith("  "):
            found[name.strip()] = int(cumulative)
    return found


def time_once() -> tuple[int, int]:
    """(torch, stepcache) cumulative microseconds, from one fresh process."""
    entries = top_level_us(_python("-X", "importtime", "-c", STATEMENT).stderr)
    missing = {"torch", "stepcache"} - set(entries)
    if missing:
        raise RuntimeError(f"bench_import: no top-level {sorted(missing)} entry")
    return entries["torch"], entries["stepcache"]


def _is_lazy(name: str) -> bool:
    return any(name == m or name.startswith(m + ".") for m in LAZY)


@attrs.frozen
class ModuleCheck:
    """What ``import stepcache`` loaded after torch, in one fresh process."""

    #: every module it added to ``sys.modules``
    loaded: list[str]
    #: the file of the stepcache that was imported (this checkout's, or the check is void)
    stepcache_file: str

    @property
    def outside_stdlib(self) -> list[str]:
        """The loaded modules outside the standard library, torch and numpy."""
        stdlib = set(sys.stdlib_module_names) | set(DEPENDENCIES)
        return [m for m in self.loaded if m.split(".")[0] not in stdlib]

    @property
    def other_packages(self) -> list[str]:
        """Of those, the ones that are not stepcache's own."""
        return [m for m in self.outside_stdlib if m.split(".")[0] != "stepcache"]

    @property
    def lazy_loaded(self) -> list[str]:
        """The loaded modules that should have loaded lazily: none, if all is well."""
        return [m for m in self.loaded if _is_lazy(m)]

    @property
    def is_this_checkout(self) -> bool:
        return Path(self.stepcache_file).resolve().is_relative_to(ROOT)


def check_modules() -> ModuleCheck:
    found = json.loads(_python("-c", _MODULES_SCRIPT).stdout.strip().splitlines()[-1])
    return ModuleCheck(loaded=found["new"], stepcache_file=found["file"])


@attrs.frozen
class ImportResults:
    processes: int
    warmup: int
    #: cumulative microseconds per process, in the order they ran
    torch_us: list[int]
    stepcache_us: list[int]
    modules: ModuleCheck

    @property
    def torch(self) -> Timing:
        return Timing.of("import torch", [us * 1e3 for us in self.torch_us])

    @property
    def stepcache(self) -> Timing:
        return Timing.of("import stepcache", [us * 1e3 for us in self.stepcache_us])

    @property
    def time_met(self) -> bool:
        return self.stepcache.median_ns <= LIMIT_MS * 1e6

    @property
    def lazy_met(self) -> bool:
        return not self.modules.lazy_loaded

    def to_dict(self) -> dict[str, Any]:
        return {
            "command": COMMAND,
            "processes": self.processes,
            "warmup_processes": self.warmup,
            "torch_us_per_process": self.torch_us,
            "stepcache_us_per_process": self.stepcache_us,
            "torch_ns": self.torch.to_dict(),
            "stepcache_ns": self.stepcache.to_dict(),
            "limit_ms": LIMIT_MS,
            "modules_loaded": self.modules.loaded,
            "modules_outside_stdlib_torch_numpy": self.modules.outside_stdlib,
            "lazy_checked": list(LAZY),
            "lazy_loaded": self.modules.lazy_loaded,
            "stepcache_file": self.modules.stepcache_file,
            "goals": {"time": self.time_met, "lazy": self.lazy_met},
        }


def run(processes: int = PROCESSES, warmup: int = 1) -> ImportResults:
    if processes < 1:
        raise ValueError(f"processes must be at least 1, not {processes}")
    for _ in range(warmup):
        time_once()
    torch_us: list[int] = []
    stepcache_us: list[int] = []
    for i in range(processes):
        t, s = time_once()
        torch_us.append(t)
        stepcache_us.append(s)
        progress(
            f"bench_import: process {i + 1}/{processes}: torch {t / 1e3:.1f} ms, "
            f"stepcache {s / 1e3:.1f} ms"
        )
    modules = check_modules()
    if not modules.is_this_checkout:
        raise RuntimeError(
            f"bench_import: imported {modules.stepcache_file}, not this checkout's"
        )
    return ImportResults(processes, warmup, torch_us, stepcache_us, modules)


def _ms(t: Timing) -> list[str]:
    return [
        f"{t.median_ns / 1e6:.1f}",
        f"{t.min_ns / 1e6:.1f}",
        f"{t.max_ns / 1e6:.1f}",
    ]


def _names(modules: Sequence[str]) -> str:
    return ", ".join(f"`{m}`" for m in modules) if modules else "none"


def render(r: ImportResults) -> str:
    table = markdown_table(
        ["cumulative import time (`-X importtime`)", "median ms", "min ms", "max ms"],
        [
            ["`import torch` (first, in a fresh process)", *_ms(r.torch)],
            ["`import stepcache` after `import torch`", *_ms(r.stepcache)],
        ],
        "lrrr",
    )
    own = [m for m in r.modules.outside_stdlib if m not in r.modules.other_packages]
    stdlib = [m for m in r.modules.loaded if m not in r.modules.outside_stdlib]
    return "\n".join(
        [
            table,
            "",
            f"`import stepcache` loaded {len(r.modules.loaded)} modules: "
            f"{len(own)} of stepcache's own ({_names(own)}), {len(stdlib)} of the "
            f"standard library, and outside the standard library, torch and numpy: "
            f"{_names(r.modules.other_packages)}. Checked not loaded (with their "
            f"submodules): {_names(LAZY)}; loaded of those: "
            f"{_names(r.modules.lazy_loaded)}.",
        ]
    )


def goal_rows(r: ImportResults) -> str:
    """The goals table's rows: the time over torch, and the lazy imports."""
    return "\n".join(
        [
            f"| import stepcache over import torch (the cumulative `stepcache` entry of "
            f"`-X importtime` after `import torch`, median of {r.processes} fresh "
            f"processes) | {r.stepcache.median_ns / 1e6:.1f} ms | <= {LIMIT_MS:g} ms | "
            f"{'yes' if r.time_met else '**no**'} | {GOAL_SOURCE} |",
            f"| modules `import stepcache` loads that should load lazily (the profiler, "
            f"the integrations, the pytest plugin, attrs, vLLM) | "
            f"{len(r.modules.lazy_loaded)} | 0 | {'yes' if r.lazy_met else '**no**'} | "
            f"{GOAL_SOURCE} |",
        ]
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0] if __doc__ else None
    )
    parser.add_argument("--processes", type=int, default=PROCESSES)
    parser.add_argument("--quick", action="store_true", help="a fast smoke run")
    args = parser.parse_args(argv)
    print(f"Environment: {environment()}")
    results = run(2, warmup=0) if args.quick else run(args.processes)
    print(render(results))
    print()
    print(goal_rows(results))


if __name__ == "__main__":
    main()
