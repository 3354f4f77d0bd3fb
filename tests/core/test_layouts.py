# SPDX-License-Identifier: Apache-2.0
"""Sparse and nested tensors, which have no data pointer or strides, as dependencies
and results in every mode: matched by identity where an inference tensor's place
cannot be read, and never a raw error from the fingerprint, debug mode or stats."""

from __future__ import annotations

import warnings
from collections.abc import Callable

import pytest
import torch

import stepcache
from stepcache import step_cached

MODES = ["off", "checks", "verify"]


def sparse() -> torch.Tensor:
    return torch.eye(3).to_sparse()


def nested() -> torch.Tensor:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # nested tensors are a prototype API
        return torch.nested.nested_tensor([torch.ones(2), torch.ones(3)])


class Meta:
    def __init__(self, x: torch.Tensor) -> None:
        self.x = x

    @step_cached(depends_on=("x",), name="layouts.dep")
    def dep(self) -> int:
        return id(self.x)

    @step_cached(guard_result=True, name="layouts.result")
    def result(self) -> torch.Tensor:
        return self.x


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("make", [sparse, nested])
def test_a_tensor_without_strides_is_a_dependency(
    mode: str, make: Callable[[], torch.Tensor]
) -> None:
    with stepcache.debug(mode):
        md = Meta(make())
        assert md.dep() == md.dep() == id(md.x)
        md.x = make()  # reassigned: recomputes
        assert md.dep() == id(md.x)
    row = stepcache.stats()["layouts.dep"]
    assert (row.misses, row.invalidations) == (2, 1)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("make", [sparse, nested])
def test_a_tensor_without_strides_is_a_result(
    mode: str, make: Callable[[], torch.Tensor]
) -> None:
    with stepcache.debug(mode):
        md = Meta(make())
        first = md.result()
        assert md.result() is first
    row = stepcache.stats()["layouts.result"]
    assert (row.hits, row.misses, row.live_entries) == (1, 1, 1)
    assert row.live_bytes == 0  # the bytes of strided tensors only
    assert "layouts.result" in str(stepcache.stats())
