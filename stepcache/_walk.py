# SPDX-License-Identifier: Apache-2.0
"""Walking a cached value: the tensors it holds, through tuples, lists and dicts."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

__all__ = ["tensors"]


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
