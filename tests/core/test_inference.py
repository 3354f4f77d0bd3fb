# SPDX-License-Identifier: Apache-2.0
"""Inference tensors (made under ``torch.inference_mode()``, as every tensor a vLLM
step makes) as dependencies and results, in each mode: no version counter is ever
read; a reassignment always recomputes; an in-place write is served stale in
production (nothing can see it cheaply) and caught in checks and verify mode for a
small CPU tensor."""

from __future__ import annotations

import pytest
import torch

import stepcache
from stepcache import StaleCacheError, step_cached


class Draft:
    """vLLM's draft loop: ``query_start_loc_cpu`` made in the step, reassigned."""

    def __init__(self) -> None:
        with torch.inference_mode():
            self.query_start_loc_cpu = torch.tensor([0, 2, 5])
        self.builds = 0

    @step_cached(depends_on=("query_start_loc_cpu",), name="inference.lens")
    def lens(self) -> torch.Tensor:
        self.builds += 1
        return self.query_start_loc_cpu.diff()


MODES = ["off", "checks", "verify"]


@pytest.mark.parametrize("mode", MODES)
def test_reassigning_an_inference_dependency_recomputes(mode: str) -> None:
    with stepcache.debug(mode):
        md = Draft()
        first = md.lens()
        assert first.tolist() == [2, 3]
        assert md.lens().tolist() == [2, 3]
        with torch.inference_mode():
            md.query_start_loc_cpu = torch.tensor([0, 1, 5])
        assert md.lens().tolist() == [1, 4]
    row = stepcache.stats()["inference.lens"]  # (verify mode also recomputes a hit)
    assert (row.hits, row.misses, row.invalidations) == (1, 2, 1)


def test_an_in_place_write_to_an_inference_dependency_is_not_seen_in_production() -> (
    None
):
    md = Draft()
    cached = md.lens()
    with torch.inference_mode():
        md.query_start_loc_cpu[2] = 9  # no version counter to bump
    assert md.lens() is cached and cached.tolist() == [2, 3]  # stale, as documented


@pytest.mark.parametrize("mode", ["checks", "verify"])
def test_an_in_place_write_to_an_inference_dependency_is_caught_in_debug_mode(
    mode: str,
) -> None:
    stepcache.clear_debug_report()
    with stepcache.debug(mode):
        md = Draft()
        md.lens()
        with torch.inference_mode():
            md.query_start_loc_cpu[2] = 9
        with pytest.raises(StaleCacheError, match="dependency 'query_start_loc_cpu'"):
            md.lens()
    assert stepcache.debug_report()[-1].kind == "dependency-changed"


def test_a_resized_inference_dependency_recomputes_in_production() -> None:
    md = Draft()
    md.lens()
    with torch.inference_mode():
        md.query_start_loc_cpu.resize_(4).copy_(torch.tensor([0, 1, 2, 3]))
    assert md.lens().tolist() == [1, 1, 1] and md.builds == 2


def _transposed(x: torch.Tensor) -> None:
    x.t_()  # the same shape (square), other strides


def _moved(x: torch.Tensor) -> None:
    x.set_(torch.tensor([[1, 2], [3, 4]]))  # the same shape, other data


def _retyped(x: torch.Tensor) -> None:
    x.data = x.view(torch.float64)  # the same data, shape and strides; another dtype


@pytest.mark.parametrize("change", [_transposed, _moved, _retyped])
def test_an_inference_dependency_changed_in_its_place_recomputes(
    change: object,
) -> None:
    # what an inference tensor's fingerprint keeps outside a scope: its data
    # pointer, shape, strides and dtype (and device), each of which moves here
    # while the object stays the same
    class Square:
        def __init__(self) -> None:
            with torch.inference_mode():
                self.m = torch.tensor([[0, 1], [2, 3]])
            self.builds = 0

        @step_cached(depends_on=("m",), name="inference.square")
        def rows(self) -> list[list[float]]:
            self.builds += 1
            return self.m.tolist()

    sq = Square()
    assert sq.rows() == sq.rows() == [[0, 1], [2, 3]] and sq.builds == 1
    with torch.inference_mode():
        change(sq.m)  # type: ignore[operator]
    assert sq.rows() == sq.m.tolist() and sq.builds == 2
    assert sq.rows() == sq.m.tolist() and sq.builds == 2  # and then it hits


@pytest.mark.parametrize("mode", MODES)
def test_an_inference_result_is_handed_out_and_guarded(mode: str) -> None:
    @step_cached(guard_result=True, name="inference.result")
    def result(md: Draft) -> torch.Tensor:
        md.builds += 1
        with torch.inference_mode():
            return torch.arange(3)

    with stepcache.debug(mode):
        md = Draft()
        first = result(md)
        assert result(md).tolist() == [0, 1, 2]
        assert stepcache.stats()["inference.result"].misses == 1
        stepcache.cache_of(md).close()
        if mode != "off":  # a guarded view: read after its step, it raises
            with pytest.raises(StaleCacheError, match="closed"):
                first.tolist()
        else:
            assert first.tolist() == [0, 1, 2]
