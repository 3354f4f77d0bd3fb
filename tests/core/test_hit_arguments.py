# SPDX-License-Identifier: Apache-2.0
"""A hit checks what ``expect`` reads of the caller's arguments (`Arg`), as the seed's
three asserts do on every hit: a buffer on another device, of another dtype, or a
row count the cached value is too short for gets `CacheValidationError` naming both
sides, in production and in every debug mode."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import stepcache
from stepcache import Arg, CacheValidationError, TensorSpec

MODES = ["off", "checks", "verify"]
DEVICES = ["meta"] + (["cuda"] if torch.cuda.is_available() else [])


@dataclasses.dataclass
class Step:
    n: int
    computed: int = 0

    @stepcache.step_cached(
        depends_on=("n",),
        expect=TensorSpec(
            device=Arg("buffer"), dtype=Arg("buffer"), min_shape=(Arg("rows"),)
        ),
        ignore=("buffer", "rows"),
        name="hit_args.index",
    )
    def index(self, buffer: torch.Tensor, rows: int) -> torch.Tensor:
        self.computed += 1
        return torch.zeros(self.n, dtype=buffer.dtype, device=buffer.device)


def _buffer(device: str = "cpu", dtype: torch.dtype = torch.int32) -> torch.Tensor:
    return torch.zeros(16, dtype=dtype, device=device)


@pytest.mark.parametrize("mode", MODES)
def test_the_same_or_an_equal_buffer_hits(mode: str) -> None:
    step, first = Step(4), _buffer()
    with stepcache.debug(mode):
        value = step.index(first, 4)
        assert step.index(first, 4) is value or mode != "off"
        assert torch.equal(step.index(_buffer(), 3), value)  # another CPU buffer
    # debug modes compute again to compare (an ignored argument changed, verify)
    assert step.computed == 1 or mode != "off"


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("device", DEVICES)
def test_a_buffer_on_another_device_is_refused(mode: str, device: str) -> None:
    step = Step(4)
    with stepcache.debug(mode):
        step.index(_buffer(), 4)
        with pytest.raises(CacheValidationError) as raised:
            step.index(_buffer(device), 4)
    text = str(raised.value)
    assert "hit_args.index" in text and "device mismatch" in text
    assert "(from argument 'buffer')" in text and "actual cpu" in text
    assert f"expected {stepcache.normalize_device(device)}" in text


@pytest.mark.parametrize("mode", MODES)
def test_a_buffer_of_another_dtype_is_refused(mode: str) -> None:
    step = Step(4)
    with stepcache.debug(mode):
        step.index(_buffer(), 4)
        with pytest.raises(CacheValidationError) as raised:
            step.index(_buffer(dtype=torch.int64), 4)
    text = str(raised.value)
    assert "dtype mismatch. expected torch.int64 (from argument 'buffer')" in text
    assert "actual torch.int32" in text


@pytest.mark.parametrize("mode", MODES)
def test_more_rows_than_the_cached_value_has_are_refused(mode: str) -> None:
    step = Step(4)
    with stepcache.debug(mode):
        step.index(_buffer(), 4)
        with pytest.raises(CacheValidationError) as raised:
            step.index(_buffer(), 9)
    text = str(raised.value)
    assert "expected at least 9 (from argument 'rows'), actual 4" in text


def test_a_refused_hit_keeps_the_entry_for_the_right_caller() -> None:
    step, buffer = Step(4), _buffer()
    value = step.index(buffer, 4)
    with pytest.raises(CacheValidationError):
        step.index(_buffer("meta"), 4)
    assert step.index(buffer, 4) is value and step.computed == 1


def test_the_request_index_checks_the_callers_buffer_on_a_hit() -> None:
    from stepcache.integrations.dsv4.request_index import token_to_req_indices
    from stepcache.integrations.dsv4.sim import make_step

    meta = make_step([2, 3])
    token_to_req_indices(meta, torch.zeros(8, dtype=torch.int32))
    with pytest.raises(CacheValidationError, match="device mismatch. expected meta"):
        token_to_req_indices(meta, torch.zeros(8, dtype=torch.int32, device="meta"))
