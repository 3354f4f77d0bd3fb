# SPDX-License-Identifier: Apache-2.0
"""The engine-agnostic request index: right rows for every layout, computed once per
step, recomputed when the layout changes, typed errors for bad inputs."""

from __future__ import annotations

import copy
import dataclasses
import re
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import stepcache
from stepcache.integrations.dsv4 import request_index
from stepcache.integrations.dsv4.request_index import token_to_req_indices
from stepcache.integrations.dsv4.sim import StepMetadata, make_step

query_lens = st.lists(st.integers(0, 6), max_size=8)
padding = st.one_of(st.none(), st.integers(0, 5))


def reference(lens: list[int], rows: int) -> list[int]:
    """The index written out by hand: request i owns lens[i] rows, padding is 0."""
    out = [i for i, n in enumerate(lens) for _ in range(n)]
    return out + [0] * (rows - len(out))


def padded(lens: list[int], pad: int | None) -> int | None:
    return None if pad is None else sum(lens) + pad


@pytest.fixture
def count_computations(monkeypatch: pytest.MonkeyPatch) -> Callable[[], int]:
    """Counts the index computations (calls of the numpy function)."""
    calls: list[int] = []
    original = request_index.request_index_array

    def counting(*args: Any, **kwargs: Any) -> np.ndarray:
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(request_index, "request_index_array", counting)
    return lambda: len(calls)


@settings(max_examples=150, deadline=None)
@given(lens=query_lens, pad=padding, spare=st.integers(0, 4))
def test_rows_equal_the_uncached_reference(
    lens: list[int], pad: int | None, spare: int
) -> None:
    meta = make_step(lens, pad_to=padded(lens, pad))
    n = meta.num_actual_tokens
    buffer = torch.full((n + spare,), -7, dtype=torch.int32)
    rows = token_to_req_indices(meta, buffer)
    assert rows.dtype == torch.int32
    assert rows.tolist() == reference(lens, n)
    # the rows live in the caller's buffer, whose other rows are left alone
    assert n == 0 or rows.data_ptr() == buffer.data_ptr()
    assert buffer[n:].tolist() == [-7] * spare


@settings(max_examples=60, deadline=None)
@given(lens=query_lens, pad=padding, callers=st.integers(1, 6))
def test_computed_once_per_step_however_many_builders_ask(
    lens: list[int], pad: int | None, callers: int
) -> None:
    calls: list[int] = []
    original = request_index.request_index_array

    def counting(*args: Any, **kwargs: Any) -> np.ndarray:
        calls.append(1)
        return original(*args, **kwargs)

    meta = make_step(lens, pad_to=padded(lens, pad))
    buffers = [torch.zeros(64, dtype=torch.int32) for _ in range(callers)]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(request_index, "request_index_array", counting)
        results = [token_to_req_indices(meta, b) for b in buffers]
    assert len(calls) == 1
    assert all(r is results[0] for r in results)
    # later builders' buffers are not written: the first builder's rows are shared
    assert all(int(b.abs().sum()) == 0 for b in buffers[1:])
    assert results[0].tolist() == reference(lens, meta.num_actual_tokens)


def test_a_new_step_recomputes(count_computations: Callable[[], int]) -> None:
    buffer = torch.zeros(32, dtype=torch.int32)
    first = token_to_req_indices(make_step([2, 1]), buffer).tolist()
    second = token_to_req_indices(make_step([1, 0, 3], pad_to=6), buffer).tolist()
    assert count_computations() == 2
    assert (first, second) == ([0, 0, 1], [0, 2, 2, 2, 0, 0])


def _reassign_qsl(meta: StepMetadata) -> None:
    # the V1 draft loop: every request becomes one token, on the same object
    meta.num_actual_tokens = meta.num_reqs
    meta.query_start_loc = torch.arange(meta.num_reqs + 1, dtype=torch.int32)
    meta.query_start_loc_cpu = torch.arange(meta.num_reqs + 1, dtype=torch.int32)


def _rewrite_qsl_in_place(meta: StepMetadata) -> None:
    meta.query_start_loc.copy_(torch.arange(meta.num_reqs + 1, dtype=torch.int32))
    meta.query_start_loc_cpu.copy_(torch.arange(meta.num_reqs + 1, dtype=torch.int32))
    meta.num_actual_tokens = meta.num_reqs


def _pad_more(meta: StepMetadata) -> None:
    meta.num_actual_tokens += 3


@pytest.mark.parametrize("change", [_reassign_qsl, _rewrite_qsl_in_place, _pad_more])
def test_a_changed_layout_on_the_same_object_recomputes(
    change: Callable[[StepMetadata], None], count_computations: Callable[[], int]
) -> None:
    meta = make_step([3, 2, 2])
    buffer = torch.zeros(32, dtype=torch.int32)
    assert token_to_req_indices(meta, buffer).tolist() == [0, 0, 0, 1, 1, 2, 2]
    change(meta)
    lens = meta.query_start_loc_cpu.diff().tolist()
    assert token_to_req_indices(meta, buffer).tolist() == reference(
        lens, meta.num_actual_tokens
    )
    assert count_computations() == 2


def test_copies_recompute_only_when_their_layout_differs(
    count_computations: Callable[[], int],
) -> None:
    meta = make_step([2, 2])
    buffer = torch.zeros(32, dtype=torch.int32)
    rows = token_to_req_indices(meta, buffer)
    same = copy.copy(meta)
    assert token_to_req_indices(same, torch.zeros(8, dtype=torch.int32)) is rows
    assert count_computations() == 1

    other = copy.copy(meta)
    other.query_start_loc = torch.tensor([0, 1, 4], dtype=torch.int32)
    other.query_start_loc_cpu = other.query_start_loc.clone()
    other_rows = torch.zeros(8, dtype=torch.int32)
    assert token_to_req_indices(other, other_rows).tolist() == [0, 1, 1, 1]
    assert count_computations() == 2

    replaced = dataclasses.replace(meta, num_actual_tokens=6)
    assert token_to_req_indices(replaced, other_rows).tolist() == [0, 0, 1, 1, 0, 0]
    assert count_computations() == 3
    # the original keeps its own entry
    assert token_to_req_indices(meta, buffer) is rows
    assert count_computations() == 3


def _meta(qsl: list[int], n: int | None = None) -> StepMetadata:
    t = torch.tensor(qsl, dtype=torch.int32)
    total = qsl[-1] if qsl else 0
    return StepMetadata(t, t.clone(), torch.zeros(max(len(qsl) - 1, 0)), 0, n or total)


@pytest.mark.parametrize(
    ("meta", "buffer", "error", "words"),
    [
        (
            _meta([0, 3]),
            torch.zeros(2, dtype=torch.int32),
            stepcache.CacheValidationError,
            "expected at least 3 rows",
        ),
        (
            _meta([0, 3], 5),
            torch.zeros(4, dtype=torch.int32),
            stepcache.CacheValidationError,
            "actual 4",
        ),
        (
            _meta([0, 3]),
            torch.zeros(8, dtype=torch.int64),
            stepcache.CacheValidationError,
            "must be int32 (got torch.int64)",
        ),
        (
            _meta([0, 3]),
            torch.zeros(8, 1, dtype=torch.int32),
            stepcache.CacheValidationError,
            "must be 1-D",
        ),
        (
            _meta([0, 3]),
            [0] * 8,
            stepcache.CacheValidationError,
            "must be a torch.Tensor (got list)",
        ),
    ],
)
def test_bad_inputs_raise_typed_errors_naming_the_expectation(
    meta: StepMetadata, buffer: torch.Tensor, error: type[Exception], words: str
) -> None:
    with pytest.raises(error, match=words.replace("(", r"\(").replace(")", r"\)")):
        token_to_req_indices(meta, buffer)
    # nothing was cached: a good buffer then works
    if error is stepcache.CacheValidationError:
        assert token_to_req_indices(meta, torch.zeros(8, dtype=torch.int32)).numel()


@pytest.mark.parametrize(
    ("starts", "words"),
    [
        ([0, 3, 1], "never decrease; it goes from 3 to 1 at request 1"),
        ([2, 3], "must start at 0 (got 2)"),
    ],
)
def test_debug_mode_checks_the_layout_production_does_not(
    starts: list[int], words: str
) -> None:
    """Production checks what the seed checks (the buffer); the layout's values are
    debug mode's job."""
    buffer = torch.zeros(8, dtype=torch.int32)
    for mode in ("checks", "verify"):
        with stepcache.debug(mode), pytest.raises(ValueError, match=re.escape(words)):
            token_to_req_indices(_meta(starts), buffer)
    if starts == [2, 3]:  # production computes what the seed computes
        assert token_to_req_indices(_meta(starts), buffer).tolist() == [0, 0, 0]
    else:  # numpy refuses a negative length, as in the seed's code
        with pytest.raises(ValueError):
            token_to_req_indices(_meta(starts), buffer)


def test_layouts_that_are_not_a_1d_integer_sequence_are_refused_in_debug_mode() -> None:
    buffer = torch.zeros(8, dtype=torch.int32)
    two_d = StepMetadata(
        torch.zeros(2, 2, dtype=torch.int32),
        torch.tensor([0, 0], dtype=torch.int32),
        torch.zeros(1),
        1,
        0,
    )
    floats = _meta([0, 2])
    floats.query_start_loc_cpu = torch.tensor([0.0, 2.0])
    disagree = _meta([0, 2])
    disagree.query_start_loc_cpu = torch.tensor([0, 3], dtype=torch.int32)
    with stepcache.debug("checks"):
        with pytest.raises(ValueError, match=r"must be 1-D .* \(got shape \[2, 2\]\)"):
            token_to_req_indices(two_d, buffer)
        with pytest.raises(ValueError, match="query_start_loc_cpu must hold integers"):
            token_to_req_indices(floats, buffer)
        with pytest.raises(ValueError, match="describe different batches"):
            token_to_req_indices(disagree, buffer)


def test_boundaries_come_from_the_host_copy_and_debug_mode_compares() -> None:
    # adaptive verification: same total, other per-request boundaries on the host;
    # the seed (and so production) reads the host copy, checks mode says they differ
    meta = _meta([0, 1, 4])
    meta.query_start_loc_cpu = torch.tensor([0, 2, 4], dtype=torch.int32)
    rows = token_to_req_indices(meta, torch.zeros(8, dtype=torch.int32))
    assert rows.tolist() == [0, 0, 1, 1]
    meta = _meta([0, 1, 4])
    meta.query_start_loc_cpu = torch.tensor([0, 2, 4], dtype=torch.int32)
    with (
        stepcache.debug("checks"),
        pytest.raises(
            ValueError, match=r"\[0, 1, 4\] and query_start_loc_cpu \[0, 2, 4\]"
        ),
    ):
        token_to_req_indices(meta, torch.zeros(8, dtype=torch.int32))


def test_debug_mode_does_not_take_the_device_layout_for_an_input(
    count_computations: Callable[[], int],
) -> None:
    # the device copy is only compared with the host's: a new device tensor with the
    # same boundaries is no reason to compute again (the index reads the host copy)
    meta = _meta([0, 1, 4])
    buffer = torch.zeros(8, dtype=torch.int32)
    stepcache.clear_debug_report()
    with stepcache.debug("checks"):
        first = token_to_req_indices(meta, buffer)
        meta.query_start_loc = meta.query_start_loc.clone()
        again = token_to_req_indices(meta, buffer)
    assert count_computations() == 1
    assert again.data_ptr() == first.data_ptr()
    assert not stepcache.debug_report()


def test_a_cpu_buffer_is_filled_without_pinned_staging(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    kept: list[object] = []
    monkeypatch.setattr(
        stepcache.StepCache, "keep_alive", lambda self, o: kept.append(o)
    )
    monkeypatch.setattr(
        torch.Tensor, "pin_memory", lambda self: pytest.fail("pinned on CPU")
    )
    rows = token_to_req_indices(make_step([2, 3]), torch.zeros(8, dtype=torch.int32))
    assert rows.tolist() == [0, 0, 1, 1, 1]
    assert kept == []


def test_rows_overwritten_in_the_shared_buffer_are_not_returned() -> None:
    """Two layouts computed into one builder's buffer in the same step: the first
    object's entry still points at the buffer, which now holds the second layout."""
    buffer = torch.zeros(16, dtype=torch.int32)
    first = make_step([3, 2, 2])
    assert token_to_req_indices(first, buffer).tolist() == [0, 0, 0, 1, 1, 2, 2]
    token_to_req_indices(make_step([1, 1, 1]), buffer)
    assert token_to_req_indices(first, buffer).tolist() == [0, 0, 0, 1, 1, 2, 2]


def test_debug_checks_mode_catches_a_read_of_overwritten_rows() -> None:
    """The entry recomputes (guard_result); a view handed out before the overwrite
    raises when it is read again."""
    buffer = torch.zeros(16, dtype=torch.int32)
    with stepcache.debug("checks"):
        first = make_step([3, 2, 2])
        old = token_to_req_indices(first, buffer)
        token_to_req_indices(make_step([1, 1, 1]), buffer)
        with pytest.raises(stepcache.StaleCacheError, match="overwritten"):
            old.tolist()
        assert token_to_req_indices(first, buffer).tolist() == [0, 0, 0, 1, 1, 2, 2]
