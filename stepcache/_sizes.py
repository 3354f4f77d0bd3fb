# SPDX-License-Identifier: Apache-2.0
"""How many bytes a cached value holds (tensors, arrays, and containers of them)."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch


def nbytes(value: Any) -> int:
    """Bytes of tensor and array data reachable from ``value`` (views count their own
    elements, not their whole storage)."""
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, np.ndarray):
        return int(value.nbytes)
    if isinstance(value, (tuple, list)):
        return sum(nbytes(v) for v in value)
    if isinstance(value, dict):
        return sum(nbytes(v) for v in value.values())
    return 0
