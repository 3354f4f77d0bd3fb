# SPDX-License-Identifier: Apache-2.0
"""Walking a cached value: the tensors it holds, through tuples, lists and dicts."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

__all__ = ["TensorVersions", "result_guard", "tensors"]


def tensors(value: Any) -> Iterator[torch.Tensor]:
    """Every tensor in ``value`` (itself, or inside tuples, lists and dict values).

    >>> [t.tolist() for t in tensors((torch.tensor([1]), [torch.tensor([2])], "x"))]
    [[1], [2]]
    """
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (tuple, list)):
        for v in value:
            yield from tensors(v)
    elif isinstance(value, dict):
        for v in value.values():
            yield from tensors(v)


class TensorVersions:
    """The version counters of several tensors, read together as one ``_version``.

    An entry guards its result with one ``(tensor, version)`` pair that the hit path
    compares with ``tensor._version == version``; a result holding other than exactly
    one tensor is guarded by this stand-in, whose ``_version`` is the tuple of them all.

    >>> a, b = torch.zeros(2), torch.zeros(2)
    >>> guard, version = result_guard((a, [b]))
    >>> b.add_(1) is b, guard._version == version
    (True, False)
    """

    __slots__ = ("tensors",)

    def __init__(self, tensors: tuple[torch.Tensor, ...]) -> None:
        self.tensors = tensors

    @property
    def _version(self) -> tuple[int, ...]:
        return tuple([t._version for t in self.tensors])


def result_guard(value: Any) -> tuple[Any, Any]:
    """``(guard, version)``: ``guard._version == version`` until a tensor of ``value``
    is written in place."""
    found = tuple(tensors(value))
    if len(found) == 1:
        return found[0], found[0]._version
    several = TensorVersions(found)
    return several, several._version
