# SPDX-License-Identifier: Apache-2.0
"""The DSv4 FlashInfer sparse-index cache: one build per layer kind per step.

Every DeepSeek V4 attention layer running the FlashInfer sparse-MLA kernel needs the
mixed sparse indices of the batch. Within a step they depend only on the step's SWA
metadata and the layer's kind, so all SWA-only layers can share one build, and all
C128A layers another. C4A layers read their own top-k indices, which differ per layer,
so they are never cached.

Only the ``(sparse_indices, sparse_topk_lens)`` pair is cached. Whatever else a layer
derives (its own compressed KV cache, for instance) belongs to that layer and is not.

Two forms, one cache policy:

* :func:`sparse_index_builder` decorates a builder you own: the cache sits in front
  of it, and a hit returns without calling anything else. The form to use in a model's
  own code (and the one the DSv4 step simulation times).
* :func:`sparse_index` calls a builder through the cache, for code you do not own (the
  vLLM plugin routes vLLM's builder through it). It costs more per call: the caller
  passes the builder and its arguments, and a miss or a C4A layer goes through one more
  Python call (``sparse_index`` itself) before the builder.

>>> import torch
>>> class SWAMetadata: pass
>>> swa = SWAMetadata()
>>> builds = []
>>> def build():
...     builds.append(1)
...     return torch.zeros(3, 4, dtype=torch.int32), torch.zeros(3, dtype=torch.int32)
>>> first = sparse_index(swa, "c128a", None, build)
>>> second = sparse_index(swa, "c128a", None, build)
>>> len(builds), first[0] is second[0]
(1, True)
>>> _ = sparse_index(swa, "c4a", None, build); _ = sparse_index(swa, "c4a", None, build)
>>> len(builds)
3
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any, Final, ParamSpec

import torch

import stepcache
from stepcache import TensorSpec

__all__ = [
    "CACHED_KINDS",
    "PAIR_SPEC",
    "SparseIndexPair",
    "layer_kind",
    "sparse_index",
    "sparse_index_builder",
]

SparseIndexPair = tuple[torch.Tensor, torch.Tensor]

#: Layer kinds whose sparse indices are shared by every layer of that kind in a step.
CACHED_KINDS: Final = frozenset({"swa_only", "c128a"})

#: What a build returns: ``(sparse_indices, sparse_topk_lens)``, int32, 2-D and 1-D.
#: Checked whenever a pair is stored (and on every hit in debug mode).
PAIR_SPEC: Final = (
    TensorSpec(dtype=torch.int32, ndim=2),
    TensorSpec(dtype=torch.int32, ndim=1),
)

_P = ParamSpec("_P")


def layer_kind(swa_only: bool, compress_ratio: int) -> str:
    """The layer kind as vLLM's FlashInfer backend names it.

    SWA-only layers are ``"swa_only"``; compressed layers are ``"c128a"`` at ratio 128
    and ``"c4a"`` otherwise.

    >>> layer_kind(True, 1), layer_kind(False, 128), layer_kind(False, 4)
    ('swa_only', 'c128a', 'c4a')
    """
    if swa_only:
        return "swa_only"
    return "c128a" if compress_ratio == 128 else "c4a"


def sparse_index_builder(
    *,
    owner: str = "swa_metadata",
    kind: str = "kind",
    num_rows: str | None = "num_rows",
    name: str | None = None,
) -> Callable[[Callable[_P, SparseIndexPair]], Callable[_P, SparseIndexPair]]:
    """Decorate a sparse-index builder with the DSv4 sparse-index cache (which
    :func:`sparse_index` also uses).

    The builder returns the ``(sparse_indices, sparse_topk_lens)`` pair. Its parameter
    ``owner`` is the step's SWA metadata object, which holds the entries (they live and
    die with it; a copy of it builds its own). ``kind`` is the parameter with the layer
    kind, and ``num_rows`` the one with the row count the kernel call wants (``None``:
    the builder has none, and the key is the kind alone). Calls of a kind in
    :data:`CACHED_KINDS` build once per step for each ``(kind, num_rows)``; every
    other kind builds on every call. The builder's other parameters are not part of
    the key (a layer index, say): they must not change what a cached kind builds.
    ``name`` labels the builder in :func:`stepcache.stats` (default: its qualified
    name). Each pair is checked against :data:`PAIR_SPEC` when it is stored.

    A name that is not a parameter of the builder is a
    :class:`~stepcache.StepCacheError` when the builder is decorated.

    >>> import torch
    >>> class Layer:
    ...     def __init__(self, kind):
    ...         self.kind, self.builds = kind, 0
    ...     @sparse_index_builder(owner="swa", num_rows=None, name="doc.builder")
    ...     def indices(self, swa, kind):
    ...         self.builds += 1
    ...         return torch.zeros(2, 4, dtype=torch.int32), torch.zeros(2, dtype=torch.int32)
    >>> class SWAMetadata: pass
    >>> swa, layers = SWAMetadata(), [Layer("swa_only"), Layer("swa_only"), Layer("c4a")]
    >>> pairs = [layer.indices(swa, layer.kind) for layer in layers * 2]
    >>> [layer.builds for layer in layers]  # the second SWA-only layer shares the first's
    [1, 0, 2]
    """
    names = {"owner": owner, "kind": kind}
    if num_rows is not None:
        names["num_rows"] = num_rows
    for what, value in names.items():
        if not isinstance(value, str) or not value:
            raise stepcache.StepCacheError(
                f"sparse_index_builder: {what} must name a parameter of the builder"
                f"{' (or be None: no row count)' if what == 'num_rows' else ''}"
                f" (got {value!r})"
            )

    def decorate(
        builder: Callable[_P, SparseIndexPair],
    ) -> Callable[_P, SparseIndexPair]:
        # the builder's other parameters (a layer, the build to call) are not part of
        # the key, by this decorator's contract: ignored explicitly
        params = inspect.signature(builder).parameters
        return stepcache.step_cached(
            key=(kind,) if num_rows is None else (kind, num_rows),
            # C4A layers (and any kind this module does not know) read per-layer
            # top-k indices: building once for all of them would hand every layer the
            # first layer's indices, so their calls bypass the cache
            only={kind: CACHED_KINDS},
            owner=owner,
            expect=PAIR_SPEC,
            ignore=tuple(n for n in params if n not in names.values()),
            name=name,
        )(builder)

    return decorate


# the same policy as a decorated builder: this function is one, whose build is passed in
@sparse_index_builder(name="dsv4.sparse_index")
def sparse_index(
    swa_metadata: object,
    kind: str,
    num_rows: int | None,
    build: Callable[..., SparseIndexPair],
    *args: Any,
) -> SparseIndexPair:
    """``build(*args)``'s ``(sparse_indices, sparse_topk_lens)``, built once per step
    for each ``(kind, num_rows)`` of the kinds in :data:`CACHED_KINDS`.

    ``swa_metadata`` is the step's SWA metadata object, which owns the entries: they
    live and die with it, and a copy of it never sees them (no dependency is declared,
    so an entry is bound to the object itself). ``num_rows`` is the row count the
    kernel call wants (``None``: the real tokens). Every other kind calls ``build()``
    each time. ``args`` are passed to ``build`` and are not part of the key (a layer
    index, say): they must not change what a cached kind builds.
    """
    return build(*args)
