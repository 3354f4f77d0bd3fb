# SPDX-License-Identifier: Apache-2.0
"""Instructions per DSv4 step, counted by valgrind's callgrind: a noise-free ratio.

Run: ``python -m benchmarks.bench_instructions [--steps 20]`` (needs ``valgrind``;
about 6 minutes on 2 cores). Wall-clock timings on shared machines swing by tens of
percent between runs; instruction counts repeat exactly, so the ratio
stepcache / hand-written is measured here too. Each cell runs the variant's steps in
its own process (garbage collection off) and counts only the steps.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from benchmarks._timing import environment, progress, source_state

VARIANTS = ("uncached", "handwritten", "stepcache")
POINTS = ((8, 4), (61, 4), (8, 1024), (61, 1024))
#: the point at which the cost of ``expect`` is counted
EXPECT_POINT = (8, 4)


@functools.cache
def _fixed_layout() -> tuple[str, ...]:
    """The command prefix that turns off address-space randomization
    (``setarch -R``), where it works here; else none. Probed once per process."""
    command = ("setarch", platform.machine(), "-R")
    if shutil.which("setarch") is None:
        return ()
    try:
        subprocess.run([*command, "true"], check=True, capture_output=True)
    except (OSError, subprocess.CalledProcessError):
        return ()
    return command


def count(variant: str, steps: int, layers: int, tokens: int) -> int:
    """Instructions of ``steps`` steps of ``variant``.

    The process runs with a fixed string-hash seed and, where ``setarch -R`` works,
    without address-space randomization: with either left random, the count of one
    cell moved by up to 0.3% from run to run (measured at 61 layers, 1024 tokens:
    the hash seed accounts for most of it).
    """
    env = dict(os.environ, PYTHONHASHSEED="0")
    with tempfile.TemporaryDirectory() as tmp:
        out = subprocess.run(
            [
                *_fixed_layout(),
                "valgrind",
                "--tool=callgrind",
                "--instr-atstart=no",
                f"--callgrind-out-file={Path(tmp) / 'cg.out'}",
                sys.executable,
                "-m",
                "benchmarks._cg_step",
                variant,
                str(steps),
                str(layers),
                str(tokens),
            ],
            capture_output=True,
            text=True,
            check=True,
            env=env,
        )
    found = re.search(r"Collected : (\d+)", out.stderr)
    if found is None:
        raise RuntimeError(f"callgrind printed no count:\n{out.stderr[-2000:]}")
    return int(found.group(1))


def expect_rows(steps: int, handwritten: float, stepcache: float) -> list[str]:
    """What validating each stored value (``expect``) costs a step at
    :data:`EXPECT_POINT`: stepcache's count with and without the checks."""
    layers, tokens = EXPECT_POINT
    progress(f"  counting {layers} layers, {tokens} tokens without expect ...")
    without = count("stepcache-without-expect", steps, layers, tokens) / steps
    extra, checks = stepcache - handwritten, stepcache - without
    return [
        "",
        f"What validation costs a step ({layers} layers, {tokens} tokens): the stepcache "
        "step as above, and the same with `expect` turned off on the request index "
        "and the decorated sparse-index builder (each checks the value it stores: 1 "
        "request index and 2 sparse-index pairs per step).",
        "",
        "| stepcache step | instr/step | / hand-written |",
        "| --- | ---: | ---: |",
        f"| with expect (as above) | {stepcache:,.0f} | {stepcache / handwritten:.3f}x |",
        f"| without expect | {without:,.0f} | {without / handwritten:.3f}x |",
        f"| the expect checks | {checks:,.0f} | {checks / extra:.0%} of the "
        f"{extra:,.0f} stepcache adds |",
    ]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0] if __doc__ else None
    )
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--markdown", type=Path, help="also write the table here")
    args = parser.parse_args(argv)
    if shutil.which("valgrind") is None:
        print("bench_instructions: valgrind is not installed; nothing measured")
        return
    source = source_state()
    code = (
        f"commit `{source['commit'][:12]}`"
        + (" with uncommitted changes" if source["dirty"] else "")
        if source["commit"]
        else "an unrecorded commit"
    )
    lines = [
        f"`python -m benchmarks.bench_instructions --steps {args.steps}` on "
        f"{datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC, at {code}; "
        f"{environment()}.",
        "Instructions per step (valgrind callgrind, the steps only, garbage collection",
        "off, a fixed hash seed and no address randomization): counts that repeat",
        "from run to run, where wall-clock times do not.",
        "",
        "| layers | tokens | uncached instr/step | hand-written instr/step "
        "| stepcache instr/step | stepcache / hand-written | uncached / stepcache |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    counted: dict[tuple[int, int], dict[str, float]] = {}
    with ThreadPoolExecutor(max_workers=2) as pool:
        for layers, tokens in POINTS:
            progress(f"  counting {layers} layers, {tokens} tokens ...")
            jobs = {
                v: pool.submit(count, v, args.steps, layers, tokens) for v in VARIANTS
            }
            per = counted[layers, tokens] = {
                v: jobs[v].result() / args.steps for v in VARIANTS
            }
            lines.append(
                f"| {layers} | {tokens} | {per['uncached']:,.0f} "
                f"| {per['handwritten']:,.0f} | {per['stepcache']:,.0f} "
                f"| {per['stepcache'] / per['handwritten']:.3f}x "
                f"| {per['uncached'] / per['stepcache']:.2f}x |"
            )
    at = counted[EXPECT_POINT]
    lines += expect_rows(args.steps, at["handwritten"], at["stepcache"])
    text = "\n".join(lines)
    print(text)
    if args.markdown:
        args.markdown.parent.mkdir(parents=True, exist_ok=True)
        args.markdown.write_text(text + "\n")


if __name__ == "__main__":
    main()
