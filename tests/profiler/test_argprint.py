# SPDX-License-Identifier: Apache-2.0
"""Argument fingerprints (identity and version for tensors, values for scalars) and
result digests (contents)."""

from __future__ import annotations

import dataclasses
import enum

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from stepcache.profiler._argprint import argprint, digest

small_tensors = st.builds(
    lambda values, dtype, rows: (
        torch.tensor(values, dtype=dtype).reshape(rows, -1)
        if len(values) % rows == 0
        else torch.tensor(values, dtype=dtype)
    ),
    st.lists(st.integers(-3, 3), min_size=0, max_size=6),
    st.sampled_from(
        [torch.int32, torch.int64, torch.float32, torch.bfloat16, torch.bool]
    ),
    st.sampled_from([1, 2]),
)


@given(small_tensors, small_tensors)
def test_digests_are_equal_exactly_for_equal_tensors(
    a: torch.Tensor, b: torch.Tensor
) -> None:
    same = a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    assert (digest(a) == digest(b)) == same


@given(small_tensors)
def test_a_view_or_a_copy_digests_like_the_original(a: torch.Tensor) -> None:
    assert digest(a.clone()) == digest(a)
    if a.dim() == 2:
        assert digest(a.t().contiguous()) == digest(a.t())


def test_tensors_are_fingerprinted_by_identity_and_version() -> None:
    keep: dict[int, object] = {}
    t = torch.zeros(2)
    first = argprint(t, keep)
    assert argprint(t, keep) == first
    assert argprint(t.clone(), keep) != first  # equal values, another object
    t.add_(1)
    assert argprint(t, keep) != first
    assert keep[id(t)] is t  # kept alive for the step


class Kind(enum.Enum):
    A = 1


@pytest.mark.parametrize(
    ("a", "b", "equal"),
    [
        (1, 1, True),
        (1, True, False),
        (1, 1.0, False),
        ("swa", "swa", True),
        (None, None, True),
        ((1, "a"), (1, "a"), True),
        ([1, 2], [1, 2], True),  # small lists by value
        ((1, 2), [1, 2], False),
        (torch.int32, torch.int32, True),
        (torch.device("cpu"), torch.device("cpu"), True),
        (Kind.A, Kind.A, True),
        (np.arange(3), np.arange(3), True),  # small arrays by contents
    ],
)
def test_values_by_value_and_type(a: object, b: object, equal: bool) -> None:
    keep: dict[int, object] = {}
    assert (argprint(a, keep) == argprint(b, keep)) is equal


def test_objects_by_identity() -> None:
    keep: dict[int, object] = {}

    class Meta:
        pass

    m = Meta()
    assert argprint(m, keep) == argprint(m, keep) != argprint(Meta(), keep)
    big = list(range(100))
    assert argprint(big, keep) == argprint(big, keep) != argprint(list(big), keep)


@dataclasses.dataclass
class Result:
    index: torch.Tensor
    n: int


def test_result_digests_look_inside_containers_and_objects() -> None:
    assert digest(Result(torch.ones(2), 1)) == digest(Result(torch.ones(2), 1))
    assert digest(Result(torch.ones(2), 1)) != digest(Result(torch.ones(2), 2))
    assert digest({"a": (torch.ones(1), [1])}) == digest({"a": (torch.ones(1), [1])})
    assert digest(np.ones(3)) == digest(np.ones(3)) != digest(np.zeros(3))
    assert digest(object()) is None  # nothing to compare
    assert digest(torch.ones(2, 2).to_sparse()) is None
    assert digest(torch.ones(2, device="meta")) is None
    assert digest(torch.ones(2, requires_grad=True)) == digest(torch.ones(2))


def test_the_digest_memo_reads_a_tensor_once_per_version() -> None:
    memo: dict[int, tuple[torch.Tensor, int, object]] = {}
    t = torch.ones(3)
    first = digest((t, t), memo)
    assert list(memo) == [id(t)]
    t.add_(1)
    assert digest(t, memo) != first[1]  # type: ignore[index]


def test_inference_tensors_have_fingerprints_and_digests() -> None:
    # every tensor a vLLM step makes is one: it has no version counter to read
    with torch.inference_mode():
        t = torch.arange(3)
        keep: dict[int, object] = {}
        assert argprint(t, keep) == argprint(t, keep)
        assert argprint(t, keep) != argprint(t.clone(), keep)
        memo: dict[int, tuple[torch.Tensor, object, object]] = {}
        before = digest(t, memo)
        assert before == digest(t, memo) == digest(torch.arange(3))
        t.add_(1)  # in place: no version counter moves, the digest must still change
        assert digest(t, memo) == digest(torch.arange(1, 4)) != before
