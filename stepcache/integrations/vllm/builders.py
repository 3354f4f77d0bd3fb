# SPDX-License-Identifier: Apache-2.0
"""vLLM's gate: the scopes and the caches apply once vLLM makes a builder that shares.

A scope costs a few microseconds per build, and a stand-in a little per call: an
engine that never makes a metadata builder whose groups share a value (Llama, say)
should pay neither. :class:`Builders` is the plugin's
:class:`~stepcache.integrations.plugin.Gate`: it holds back every ``InScope`` patch
until the engine makes one of the builders its :class:`Sharer` list names (it watches
their ``__init__``), and each patch a sharer names in ``shares`` until a builder of
that sharer is made. The Mamba family's builders share only prefill rows: while they
are the only ones made, an :class:`InBuildScope` build of decodes only (its longest query
one token) opens no scope; once a builder that shares in decodes is made, every build
opens one. What it saw is kept for the process (the engine makes its builders once),
across :func:`~stepcache.integrations.vllm.unregister`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from types import ModuleType
from typing import TYPE_CHECKING, Any, NamedTuple

from ..patching import (
    InScope,
    Patch,
    StockCheck,
    Target,
    Undo,
    marked,
    replace_attribute,
    scoped,
)

if TYPE_CHECKING:
    from ..plugin import EnginePlugin

__all__ = ["Builders", "InBuildScope", "Sharer", "builders"]


class Sharer(NamedTuple):
    """One of vLLM's metadata builders whose builds use a cached function: its
    module and class; whether a build of decodes only (every query one token) shares
    anything (``False`` for a builder that calls its cached functions only for
    prefill rows; or the names of the patches its decodes call: it shares there
    unless each is left out); and ``shares``, the patches only its builds share
    (they apply once such a builder is made; where each is left out it shares
    nothing and opens no scope; empty: it shares the patches no sharer names)."""

    module: str
    name: str
    decode: bool | tuple[str, ...] = True
    shares: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class InBuildScope(InScope):
    """A :class:`~stepcache.integrations.patching.InScope` around one of vLLM's
    builds whose parameter ``longest`` holds its longest query: a build of decodes
    only (an int of at most 1) opens no scope while no builder that shares in decodes
    was made (:class:`Builders` drops ``longest`` then)."""

    longest: str | None = None

    def build(self, name: str, target: Target, check: StockCheck | None) -> Any:
        """The function to install for the patch ``name``."""
        counted = self.count_as or name
        return marked(scoped(target.original, counted, self.unless, self.longest), name)


class Builders:
    """The gate of one plugin object (:func:`builders` makes it): what the engine's
    builders made so far release."""

    def __init__(self, plugin: EnginePlugin, sharers: tuple[Sharer, ...]) -> None:
        self.plugin, self.sharers = plugin, sharers
        #: the patches some sharer names as its own (``Sharer.shares``)
        self.named = frozenset(name for s in sharers for name in s.shares)
        #: a builder of ``sharers`` was made in this process
        self.scopes_wanted = False
        #: one of them shares values in builds of decodes only too
        self.decode_wanted = False
        #: the patches of ``Sharer.shares`` whose builder was made
        self.shared: set[str] = set()
        #: how to give back the classes watched
        self.unwatch: list[Undo] = []

    # -- the gate ------------------------------------------------------------------------
    def holds(self, patch: Patch) -> str | None:
        """Why ``patch`` waits: for a builder that shares it, or (an ``InScope``
        patch) for any builder; ``None`` once one is made."""
        if patch.name in self.named:
            if patch.name in self.shared:
                return None
            return "waiting for a builder that shares it"
        if isinstance(patch.wrap, InScope) and self.sharers and not self.scopes_wanted:
            return "waiting for a builder that needs scopes"
        return None

    def start(self) -> None:
        """Watch each sharer's class whose first object would apply more."""
        for sharer in self.sharers:
            if not self._left_out(sharer.shares) and self._would_change(sharer):
                self.plugin.on_import(sharer.module, self._watcher(sharer))

    def installed(self, patch: Patch) -> Patch:
        """``patch``; an :class:`InBuildScope` opens in every build once a builder that
        shares in decodes was made."""
        wrap = patch.wrap
        if isinstance(wrap, InBuildScope) and wrap.longest and self.decode_wanted:
            return dataclasses.replace(
                patch, wrap=dataclasses.replace(wrap, longest=None)
            )
        return patch

    def stop(self) -> None:
        """Give back the classes watched."""
        for unwatch in self.unwatch:
            unwatch()
        self.unwatch.clear()

    # -- what a builder made releases ----------------------------------------------------
    def want_scopes(
        self, decode: bool = True, shares: tuple[str, ...] | None = None
    ) -> None:
        """A builder that needs scopes was made (or a caller that drives vLLM's
        builds itself, a test say, asks): apply the ``InScope`` patches and the
        patches of ``shares`` (``None``: every patch a sharer names), now and at every
        later registration in this process; the scopes in builds of decodes only
        too if ``decode``."""
        plugin = self.plugin
        with plugin.lock:
            new = self.named if shares is None else self.named & set(shares)
            new = new - self.shared
            scoped = self.decode_wanted or (self.scopes_wanted and not decode)
            if scoped and not new:
                return
            self.shared |= new
            first = not self.scopes_wanted
            self.scopes_wanted = True
            self.decode_wanted |= decode
            if self.decode_wanted and self.shared >= self.named:
                self.stop()  # nothing left that a builder could change
            if not plugin.registered:
                return
            for patch in plugin.patches:
                if patch.name in new:
                    plugin.apply(patch)
                if scoped or not isinstance(patch.wrap, InScope):
                    continue
                # applied already: again, if its scope shut builds of decodes
                shut = isinstance(patch.wrap, InBuildScope) and patch.wrap.longest
                if first or (shut and plugin.withdraw(patch)):
                    plugin.apply(patch)
            self._log(sorted(new - plugin.left_out), scoped, decode)

    def _log(self, applying: list[str], scoped: bool, decode: bool) -> None:
        log = self.plugin.logger
        if applying:
            log.info(
                "stepcache: a builder that shares them was made: %s apply",
                ", ".join(applying),
            )
        if not scoped:
            log.info(
                "stepcache: a builder that calls cached functions%s was made: "
                "the scopes apply%s",
                " in decodes" if decode else "",
                "" if decode else " (in builds with a prefill)",
            )

    def _would_change(self, sharer: Sharer) -> bool:
        """Whether making one of ``sharer``'s objects would apply something more."""
        return (
            not self.scopes_wanted
            or (self._decodes(sharer) and not self.decode_wanted)
            or not self.shared.issuperset(sharer.shares)
        )

    def _decodes(self, sharer: Sharer) -> bool:
        """Whether ``sharer``'s builds of decodes only share a value, with the
        patches this registration leaves out."""
        if isinstance(sharer.decode, bool):
            return sharer.decode
        return bool(sharer.decode) and not self._left_out(sharer.decode)

    def _left_out(self, names: tuple[str, ...]) -> bool:
        """Whether this registration leaves out each patch of ``names`` (some)."""
        return bool(names) and self.plugin.left_out.issuperset(names)

    def _watcher(self, sharer: Sharer) -> Callable[[ModuleType], None]:
        """Watch ``sharer``'s class: making one releases what it shares."""
        decode = self._decodes(sharer)

        def watch(module: ModuleType) -> None:
            cls = getattr(module, sharer.name, None)
            if not isinstance(cls, type):
                return  # not in this version: nothing of it will be made
            init: Callable[..., None] = getattr(cls, "__init__")  # noqa: B009

            def watched_init(obj: object, *args: object, **kwargs: object) -> None:
                self.want_scopes(decode, sharer.shares)
                init(obj, *args, **kwargs)

            with self.plugin.lock:
                if self.plugin.registered and self._would_change(sharer):
                    self.unwatch.append(
                        replace_attribute(cls, "__init__", watched_init)
                    )

        return watch


def builders(
    *sharers: Sharer | tuple[str, str],
) -> Callable[[EnginePlugin], Builders]:
    """The gate to declare on a plugin (``EnginePlugin(gate=builders(...))``): each
    plugin object gets its own :class:`Builders` of these sharers (a
    ``(module, class)`` pair is a sharer in every build)."""
    listed = tuple(Sharer(*sharer) for sharer in sharers)
    return lambda plugin: Builders(plugin, listed)
