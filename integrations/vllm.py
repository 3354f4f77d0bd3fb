# SPDX-License-Identifier: Apache-2.0
"""The vLLM plugin: replaces vLLM's hand-written step caches with stepcache's.

vLLM calls :func:`register` through the ``vllm.general_plugins`` entry point in every
process, sometimes more than once. It is idempotent, imports nothing of vLLM (each
patch waits for its module to be imported by vLLM, see
:mod:`stepcache.integrations.post_import`), checks every target's shape before it
touches it (a missing or reshaped target is logged and left alone), and logs which
patches it applied. ``STEPCACHE_VLLM=0`` turns it off.

>>> names = [patch.name for patch in PATCHES]
>>> "vllm.CommonAttentionMetadata.token_to_req_indices" in names
True
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import logging
import os
import threading
from collections.abc import Callable
from types import ModuleType

from . import post_import
from ._vllm_dsv4 import (
    C128_BOUNDARY_NAME,
    SPARSE_INDEX_NAME,
    apply_c128_boundary,
    apply_sparse_index,
)
from ._vllm_metadata import (
    COPY_NAME,
    INDEX_NAME,
    NUM_COMPUTED_NAME,
    apply_copy,
    apply_num_computed_tokens,
    apply_token_to_req_indices,
)
from ._vllm_patch import Patch, SkipPatch, Undo
from ._vllm_split import SPLIT_NAME, apply_split

__all__ = ["ENV", "PATCHES", "enabled", "logger", "register", "status", "unregister"]

#: Under vLLM's logger, so the lines appear in vLLM's log with its format.
logger = logging.getLogger("vllm.stepcache")

#: The environment variable that turns the plugin off (``0``) or on (``1``, default).
ENV = "STEPCACHE_VLLM"

_BACKEND = "vllm.v1.attention.backend"

#: Every patch, in the order they are applied.
PATCHES: tuple[Patch, ...] = (
    Patch(INDEX_NAME, _BACKEND, apply_token_to_req_indices),
    Patch(NUM_COMPUTED_NAME, _BACKEND, apply_num_computed_tokens),
    Patch(COPY_NAME, _BACKEND, apply_copy),
    Patch(SPLIT_NAME, "vllm.v1.attention.backends.utils", apply_split),
    Patch(
        SPARSE_INDEX_NAME,
        "vllm.models.deepseek_v4.nvidia.flashinfer_sparse",
        apply_sparse_index,
    ),
    Patch(
        C128_BOUNDARY_NAME, "vllm.models.deepseek_v4.compressor", apply_c128_boundary
    ),
)


class _State:
    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.registered = False
        self.quiet = False
        self.undo: dict[str, Undo] = {}
        self.skipped: dict[str, str] = {}
        self.cancel: list[Callable[[], None]] = []


_state = _State()


def enabled() -> bool:
    """Whether ``STEPCACHE_VLLM`` allows the plugin (read now, not at import): unset,
    empty or ``1`` allow it, ``0`` does not, anything else does not and logs why.

    >>> import os
    >>> saved = os.environ.get("STEPCACHE_VLLM")
    >>> os.environ["STEPCACHE_VLLM"] = "0"
    >>> enabled()
    False
    >>> os.environ["STEPCACHE_VLLM"] = "1"
    >>> enabled()
    True
    >>> if saved is None:
    ...     del os.environ["STEPCACHE_VLLM"]
    ... else:
    ...     os.environ["STEPCACHE_VLLM"] = saved
    """
    raw = os.environ.get(ENV, "").strip().lower()
    if raw in ("", "1", "true", "yes", "on"):
        return True
    if raw not in ("0", "false", "no", "off"):
        logger.warning(
            "stepcache: %s must be 0 or 1 (got %r); leaving vLLM unpatched",
            ENV,
            os.environ[ENV],
        )
    return False


def _vllm_version() -> str | None:
    try:
        if importlib.util.find_spec("vllm") is None:
            return None
    except (ImportError, ValueError):  # ValueError: sys.modules["vllm"] is None
        return None
    try:
        return importlib.metadata.version("vllm")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def register() -> None:
    """The ``vllm.general_plugins`` entry point: patch vLLM (once per process)."""
    with _state.lock:
        if _state.registered:
            logger.debug("stepcache: vLLM plugin already registered in this process")
            return
        if not enabled():
            logger.info("stepcache: %s=0, vLLM left unpatched", ENV)
            return
        version = _vllm_version()
        if version is None:
            logger.debug("stepcache: vLLM is not installed; nothing to patch")
            return
        _state.registered = True
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
        _log_summary(version)


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

    return apply


def _log_summary(version: str) -> None:
    applied = [p.name for p in PATCHES if p.name in _state.undo]
    waiting = sorted(
        {
            p.module
            for p in PATCHES
            if p.name not in _state.undo and p.name not in _state.skipped
        }
    )
    logger.info(
        "stepcache: vLLM %s plugin registered; patched: %s; waiting for the import "
        "of: %s",
        version,
        ", ".join(applied) or "nothing yet",
        ", ".join(waiting) or "nothing",
    )


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
        _state.registered = False


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
