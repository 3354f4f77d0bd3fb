# SPDX-License-Identifier: Apache-2.0
"""The per-token request index (``token_to_req_indices``), computed once per step.

DeepSeek V4's sparse-MLA, compressor and sparse-SWA metadata builders all need, for
every token of the batch, the index of the request it belongs to. The index is a pure
function of the batch layout, so :func:`token_to_req_indices` computes it on the first
call of a step and hands the same rows to every later caller, until the layout changes.

The owner is any metadata object with ``query_start_loc`` (device), its host copy
``query_start_loc_cpu`` and ``num_actual_tokens`` (vLLM's ``CommonAttentionMetadata``
has them; :mod:`stepcache.integrations.dsv4.sim` has a small stand-in). As in the
seed (vLLM PR 47474), production reads the host copy only and checks what the seed
checks: the buffer's device, dtype and length. Checking the layout's values (starts
at 0, never decreases, host and device agree) is debug mode's job.

>>> import dataclasses, torch
>>> @dataclasses.dataclass
... class Batch:
...     query_start_loc: torch.Tensor
...     query_start_loc_cpu: torch.Tensor
...     num_actual_tokens: int
>>> qsl = torch.tensor([0, 2, 2, 5], dtype=torch.int32)
>>> batch = Batch(qsl, qsl.clone(), num_actual_tokens=7)  # padded to 7 tokens
>>> buffer = torch.empty(16, dtype=torch.int32)
>>> token_to_req_indices(batch, buffer).tolist()
[0, 0, 2, 2, 2, 0, 0]
>>> token_to_req_indices(batch, torch.empty(16, dtype=torch.int32)).data_ptr() == (
...     buffer.data_ptr())  # a second builder gets the first one's rows
True
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final, Protocol

import numpy as np
import torch

import stepcache
from stepcache import Arg, Attr, CacheValidationError, TensorSpec
from stepcache.kit import unrecorded

__all__ = [
    "INDEX_DEPENDS_ON",
    "INDEX_SPEC",
    "StepBatch",
    "check_index_buffer",
    "check_layout",
    "request_index_array",
    "token_to_req_indices",
    "total_tokens",
    "write_request_index",
]


class StepBatch(Protocol):
    """What :func:`token_to_req_indices` reads from its owner."""

    #: ``(num_reqs + 1,)`` start of each request's tokens, on the model's device
    query_start_loc: torch.Tensor
    #: the same on the host (its last entry is the number of mapped tokens)
    query_start_loc_cpu: torch.Tensor
    #: rows the caller wants, padding included (CUDA graphs pad the batch)
    num_actual_tokens: int


#: Everything the index is computed from: the host layout (a change recomputes it).
INDEX_DEPENDS_ON: Final = ("query_start_loc_cpu", "num_actual_tokens")

#: The index lives in the caller's buffer: on its device, int32, one row per token.
INDEX_SPEC: Final = TensorSpec(
    device=Arg("buffer"),
    dtype=torch.int32,
    ndim=1,
    min_shape=(Attr("num_actual_tokens"),),
)


def _host_boundaries(
    query_start_loc: torch.Tensor | np.ndarray, name: str = "query_start_loc"
) -> np.ndarray:
    if isinstance(query_start_loc, torch.Tensor):
        if query_start_loc.device.type != "cpu":
            # One small device-to-host copy, and a synchronisation: the price of
            # reading the boundaries the device holds. Engines with a device kernel
            # for the index (vLLM's Triton kernel) avoid it; the vLLM plugin does.
            query_start_loc = query_start_loc.cpu()
        if query_start_loc.dtype.is_floating_point or query_start_loc.is_complex():
            raise ValueError(
                f"{name} must hold integers (got a tensor of {query_start_loc.dtype})"
            )
        array = query_start_loc.numpy()
    else:
        array = np.asarray(query_start_loc)
        if not np.issubdtype(array.dtype, np.integer):
            raise ValueError(
                f"{name} must hold integers (got an array of {array.dtype})"
            )
    if array.ndim != 1 or array.shape[0] == 0:
        raise ValueError(
            f"{name} must be 1-D with num_reqs + 1 >= 1 entries "
            f"(got shape {list(array.shape)})"
        )
    return array.astype(np.int64, copy=False)


def total_tokens(query_start_loc_cpu: torch.Tensor | np.ndarray) -> int:
    """The number of mapped tokens: the last entry of ``query_start_loc_cpu``.

    >>> total_tokens(torch.tensor([0, 3, 4]))
    4
    """
    return int(_host_boundaries(query_start_loc_cpu, "query_start_loc_cpu")[-1])


def request_index_array(query_start_loc: torch.Tensor | np.ndarray) -> np.ndarray:
    """The request index of every token, as int32: ``repeat(arange(n), diff(qsl))``,
    from a host ``query_start_loc`` (the seed's code; :func:`check_layout` checks
    the layout, in debug mode).

    >>> request_index_array(torch.tensor([0, 2, 2, 5])).tolist()
    [0, 0, 2, 2, 2]
    """
    starts = (
        query_start_loc.numpy()
        if isinstance(query_start_loc, torch.Tensor)
        else np.asarray(query_start_loc)
    )
    lens = np.diff(starts)
    return np.repeat(np.arange(lens.shape[0], dtype=np.int32), lens)


def check_layout(metadata: StepBatch, *, source: str = "host") -> None:
    """Raise `ValueError` unless the layout the index is computed from starts at 0
    and never decreases: what debug mode checks before the index is computed.

    ``source="host"`` (the seed's path, which reads ``query_start_loc_cpu``): the
    device copy must also describe the same batch. ``source="device"`` (vLLM's
    kernel, which reads the device ``query_start_loc``): the device boundaries are
    checked, and the host copy may differ from them, as vLLM allows (adaptive
    verification trims drafts on the device: ``supports_device_cpu_query_lens_
    mismatch``). Reads the device ``query_start_loc`` (a synchronisation).

    >>> import dataclasses
    >>> @dataclasses.dataclass
    ... class Batch:
    ...     query_start_loc: torch.Tensor
    ...     query_start_loc_cpu: torch.Tensor
    ...     num_actual_tokens: int = 0
    >>> check_layout(Batch(torch.tensor([0, 3, 1]), torch.tensor([0, 3, 1])))
    Traceback (most recent call last):
    ...
    ValueError: query_start_loc_cpu must never decrease; it goes from 3 to 1 at request 1
    >>> check_layout(Batch(torch.tensor([0, 2, 4]), torch.tensor([0, 3, 4])), source="device")
    """
    # checked, no input of the index where it is the host's: a read debug mode does
    # not watch on hits
    device = _host_boundaries(unrecorded(metadata, "query_start_loc"))
    if source == "device":
        _check_boundaries(device, "query_start_loc")
        return
    host = _host_boundaries(metadata.query_start_loc_cpu, "query_start_loc_cpu")
    _check_boundaries(host, "query_start_loc_cpu")
    if device.shape != host.shape or (device != host).any():
        raise ValueError(
            f"query_start_loc {device.tolist()} and query_start_loc_cpu "
            f"{host.tolist()} describe different batches: the index is computed from "
            "the host copy. Fix: keep the two copies of the layout in step (or compute "
            "the index on the device from query_start_loc)."
        )


def _check_boundaries(boundaries: np.ndarray, name: str) -> None:
    if boundaries[0] != 0:
        raise ValueError(f"{name} must start at 0 (got {int(boundaries[0])})")
    bad = np.flatnonzero(np.diff(boundaries) < 0)
    if bad.size:
        i = int(bad[0])
        raise ValueError(
            f"{name} must never decrease; it goes from {int(boundaries[i])} to "
            f"{int(boundaries[i + 1])} at request {i}"
        )


def check_index_buffer(buffer: torch.Tensor, rows: int, where: str) -> None:
    """Raise :class:`~stepcache.CacheValidationError` unless ``buffer`` is a 1-D int32
    tensor with at least ``rows`` rows.

    >>> try:
    ...     check_index_buffer(torch.empty(2, dtype=torch.int64), 2, "demo")
    ... except stepcache.CacheValidationError as exc:
    ...     print(exc)
    demo: the buffer must be int32 (got torch.int64)
    """
    if not isinstance(buffer, torch.Tensor):
        raise CacheValidationError(
            f"{where}: the buffer must be a torch.Tensor (got {type(buffer).__name__})"
        )
    if buffer.dtype != torch.int32:
        raise CacheValidationError(
            f"{where}: the buffer must be int32 (got {buffer.dtype})"
        )
    if buffer.dim() != 1:
        raise CacheValidationError(
            f"{where}: the buffer must be 1-D (got shape {list(buffer.shape)})"
        )
    if buffer.shape[0] < rows:
        raise CacheValidationError(
            f"{where}: buffer size mismatch at index 0. expected at least {rows} rows "
            f"(the mapped tokens, padded to num_actual_tokens), actual "
            f"{buffer.shape[0]}. Fix: size the persistent buffer for "
            "max_num_batched_tokens."
        )


def write_request_index(
    index: np.ndarray,
    buffer: torch.Tensor,
    rows: int,
    keep_alive: Callable[[Any], None] | None = None,
) -> torch.Tensor:
    """Copy ``index`` into the front of ``buffer``, zero the rows after it up to
    ``rows``, and return ``buffer[:max(len(index), rows)]``.

    A CUDA buffer is filled from a pinned staging tensor with ``non_blocking=True``;
    ``keep_alive`` receives that tensor, which must outlive the copy (give it the
    step's :meth:`StepCache.keep_alive <stepcache.StepCache.keep_alive>`). Other
    buffers get a plain copy.

    >>> buf = torch.full((6,), -1, dtype=torch.int32)
    >>> write_request_index(np.array([0, 1, 1], dtype=np.int32), buf, 5).tolist()
    [0, 1, 1, 0, 0]
    """
    mapped = int(index.shape[0])
    total = max(mapped, rows)
    # what the seed asserts, as a typed error
    if (
        not isinstance(buffer, torch.Tensor)
        or buffer.dtype != torch.int32
        or buffer.dim() != 1
        or buffer.shape[0] < total
    ):
        check_index_buffer(buffer, total, "write_request_index")
    if mapped:
        host = torch.from_numpy(np.ascontiguousarray(index, dtype=np.int32))
        if buffer.is_cuda:
            staging = host.pin_memory()
            buffer[:mapped].copy_(staging, non_blocking=True)
            if keep_alive is not None:
                keep_alive(staging)
        else:
            buffer[:mapped].copy_(host)
    if total > mapped:
        buffer[mapped:total].zero_()
    return buffer[:total]


@stepcache.step_cached(
    depends_on=INDEX_DEPENDS_ON,
    expect=INDEX_SPEC,
    # each builder passes its own buffer; the rows are the same
    ignore=("buffer",),
    name="dsv4.token_to_req_indices",
    # the rows live in a persistent buffer: a later computation into the same buffer
    # (another layout of the step) invalidates this entry instead of showing its rows
    guard_result=True,
)
def token_to_req_indices(metadata: StepBatch, buffer: torch.Tensor) -> torch.Tensor:
    """Rows ``[0, num_actual_tokens)`` of the per-token request index, in ``buffer``.

    Computed on the step's first call into that caller's persistent ``buffer`` (1-D,
    int32, at least ``max(mapped tokens, num_actual_tokens)`` rows); rows past the
    mapped tokens are zero. The boundaries are the host copy's,
    ``query_start_loc_cpu`` (no device read); debug mode also checks that they start
    at 0, never decrease and equal the device's. Later calls of the step return the
    same tensor while ``query_start_loc_cpu`` and ``num_actual_tokens`` are the same
    objects and values and the caller's buffer is on the same device: a reassigned
    or in-place-modified layout, a copy or a ``dataclasses.replace`` with another
    layout recomputes, and so does an entry whose rows were overwritten in the
    buffer by a later computation (``guard_result``).
    """
    num_tokens = metadata.num_actual_tokens
    if stepcache.get_debug() != "off":
        check_layout(metadata)  # the layout's values: debug mode's job
    index = request_index_array(metadata.query_start_loc_cpu)
    # the step's store holds a CUDA copy's pinned staging tensor (none on the CPU)
    cuda = isinstance(buffer, torch.Tensor) and buffer.is_cuda  # else: a typed error
    keep = stepcache.cache_of(metadata).keep_alive if cuda else None
    full = write_request_index(index, buffer, num_tokens, keep_alive=keep)
    return full[:num_tokens]
