# SPDX-License-Identifier: Apache-2.0
"""The ablation benchmark takes out what it names: each part rewrites generated code
(a part the core no longer has would measure the core as shipped under its name)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks import ablate_core  # noqa: E402

CHECK = """
import sys
from benchmarks import ablate_core
made = ablate_core.take_out(sys.argv[1])
from benchmarks import bench_cold, bench_hit
import stepcache, torch
t = torch.zeros(4)
assert bench_cold.cold_stepcache(t) == 1 and bench_cold.cold_stepcache(t) == 1
ns = bench_hit.namespace()
with stepcache.debug("checks"):
    first = ns["rix"](ns["step_checks"], ns["buf"]).tolist()
    assert ns["rix"](ns["step_checks"], ns["buf"]).tolist() == first
print(made[0])
"""


@pytest.mark.parametrize("part", [p for p in ablate_core.PARTS if p != "as shipped"])
def test_each_part_is_taken_out_and_the_rows_still_compute(part: str) -> None:
    done = subprocess.run(
        [sys.executable, "-c", CHECK, part],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert int(done.stdout.split()[-1]) > 0  # rewrites made
