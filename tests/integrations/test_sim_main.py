# SPDX-License-Identifier: Apache-2.0
"""``python -m stepcache demo``: the simulation's short demo, which ships in the wheel."""

from __future__ import annotations

import re

import pytest
import torch

from stepcache.__main__ import main as cli
from stepcache.integrations.dsv4 import request_index, sim


def rows(out: str) -> dict[str, tuple[float, float]]:
    """Each variant's request-index computations and sparse builds per step."""
    found = re.findall(r"^(\w+) +([\d.]+) +([\d.]+) +[\d.]+ ms$", out, re.M)
    return {v: (float(index), float(sparse)) for v, index, sparse in found}


def test_the_variants_agree_and_stepcache_does_less_work(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert sim.main(["--steps", "6", "--layers", "4", "--seed", "1"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("stepcache demo: 6 simulated DeepSeek V4 steps (seed 1)")
    # three builders compute the index uncached, once cached; 4 layers build sparse
    # indices uncached, the cached kinds once a step (swa_only, c128a) and C4A always
    assert rows(out) == {
        "uncached": (3.0, 4.0),
        "handwritten": (1.0, 3.0),
        "stepcache": (1.0, 3.0),
    }
    assert "Every variant gave the uncached results in every step." in out
    assert "dsv4.token_to_req_indices" in out  # the stats table
    assert out.rstrip().endswith("bash scripts/demo.sh\nin the stepcache repository.")


def test_the_workload_is_seeded_and_mixed() -> None:
    plans = sim._mixed_steps(40, seed=3)
    assert plans == sim._mixed_steps(40, seed=3) != sim._mixed_steps(40, seed=4)
    assert {pad is None for _, pad in plans} == {True, False}  # prefills and decodes
    assert any(0 in lens for lens, _ in plans)


def test_a_variant_that_differs_fails_the_demo(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def wrong(meta: sim.StepMetadata, buffer: torch.Tensor) -> torch.Tensor:
        return buffer[: meta.num_actual_tokens].fill_(7)

    monkeypatch.setattr(request_index, "token_to_req_indices", wrong)
    assert sim.main(["--steps", "2", "--layers", "2"]) == 1
    assert "step 1: stepcache differ from uncached" in capsys.readouterr().err


def test_bad_sizes_are_usage_errors(capsys: pytest.CaptureFixture[str]) -> None:
    for args in (["--steps", "0"], ["--layers", "-1"], ["--seed", "x"]):
        with pytest.raises(SystemExit) as info:
            sim.main(args)
        assert info.value.code == 2
    assert "python -m stepcache demo: error: argument --steps: must be >= 1" in (
        capsys.readouterr().err
    )


def test_the_cli_runs_the_simulation(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli(["demo", "--steps", "2", "--layers", "2"]) == 0
    assert rows(capsys.readouterr().out)["uncached"] == (3.0, 2.0)


def test_an_unknown_command_is_named_and_a_usage_error(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert cli(["bogus"]) == 2
    out, err = capsys.readouterr()
    assert "unknown command 'bogus'" in err and "usage:" in out
    assert cli(["--help"]) == 0
    assert "unknown" not in capsys.readouterr().err
