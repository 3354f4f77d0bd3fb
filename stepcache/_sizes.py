# SPDX-License-Identifier: Apache-2.0
"""How many bytes a cached value holds (tensors, arrays, and containers of them)."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from stepcache._fingerprint import walk


def nbytes(value: Any) -> int:
    """Bytes of tensor and array data in ``value`` (as `walk` finds them; views count
    their own elements, not their whole storage)."""
    sizes: list[int] = []
    walk(value, lambda x: sizes.append(int(x.nbytes)), (torch.Tensor, np.ndarray))
    return sum(sizes)
