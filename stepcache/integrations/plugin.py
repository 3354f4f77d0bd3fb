# SPDX-License-Identifier: Apache-2.0
"""An engine's plugin, declared once: its switch, its versions, its patches.

:class:`EnginePlugin` holds what one engine's plugin is (the environment variable
that turns it on, the engine's distributions and the release series it was tested
against, its :class:`~stepcache.integrations.patching.Patch` table, each patch
declaring how it is wrapped) and the lifecycle every engine's plugin shares:

===================  ==================================================================
the switch's value   what :meth:`EnginePlugin.register` does
===================  ==================================================================
unset, ``0``         nothing (one debug line): installing stepcache never changes the
                     engine
``1``                applies the patches, if the installed version is one the plugin
                     was tested against (else one warning naming it and those)
``verify``           the same, and every call of a :class:`~.patching.Verify` patch
                     also runs the engine's own code and compares (a difference raises
                     :class:`stepcache.StaleCacheError`)
``force``            applies the patches on any version (each target's shape is still
                     checked)
===================  ==================================================================

Anything else is a :class:`SwitchError` (logged once; the engine is left alone). A
plugin may also name two more variables, each holding patch names separated by commas
and read at each registration: ``skip_env``, the patches to leave out (a cache that does
not pay on one's machine), and ``add_env``, the patches off by default
(``Patch.opt_in``) to apply (the word ``all``: every one that ``skip_env`` does not
leave out). A name that is no patch of the plugin, or one that both name, is a
:class:`SwitchError` too. A plugin may declare a :class:`Gate` that holds some patches
back until the engine shows it needs them (vLLM's waits for a metadata builder that
shares values).
:meth:`~EnginePlugin.register` is idempotent and may run again in a process (an
engine may load its plugins in every process, more than once); it imports nothing of
the engine (each patch waits for its module,
:func:`~stepcache.integrations.patching.when_imported`), logs a target it leaves alone
(:class:`~stepcache.integrations.patching.SkipPatch`) and never raises into the engine.
:meth:`~EnginePlugin.unregister` undoes every patch; :meth:`~EnginePlugin.status`
says where each patch is; :meth:`~EnginePlugin.counters` counts the scopes opened and
the calls compared.

>>> import logging
>>> toy = EnginePlugin(
...     engine="Toy", package="toyengine", env="STEPCACHE_TOY",
...     supported=(("toyengine", (1, 2)),), patches=(),
...     logger=logging.getLogger("stepcache.toy"),
... )
>>> toy.parse_mode(" Verify "), toy.parse_mode(None)
('verify', 'off')
>>> toy.supports("toyengine", "1.2.7"), toy.supports("toyengine", "1.3.0")
(True, False)
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import importlib.util
import logging
import os
import re
import sys
import threading
from collections.abc import Callable
from types import ModuleType
from typing import Final, Protocol

from .patching import (
    Hook,
    InScope,
    Patch,
    SkipPatch,
    StockCheck,
    Undo,
    absent,
    counters,
    install,
)
from .patching import when_imported as _when_imported

__all__ = [
    "ADD_ALL",
    "MODES",
    "EnginePlugin",
    "Gate",
    "PluginFunctions",
    "SwitchError",
    "installed_distribution",
]

#: What a plugin's switch may say, after :meth:`EnginePlugin.parse_mode`.
MODES: Final = ("off", "on", "verify", "force")

_OFF: Final = ("", "0", "off", "false", "no")
_ON: Final = ("1", "on", "true", "yes")

#: The word of a plugin's ``add_env`` that names every patch off by default.
ADD_ALL: Final = "all"

#: ``(distribution, version)``
Installed = tuple[str, str]


class Gate(Protocol):
    """What holds some of a plugin's patches back until the engine shows it needs
    them, declared per engine (vLLM's: its metadata builders,
    :mod:`stepcache.integrations.vllm.builders`). Made once per plugin object
    (:attr:`EnginePlugin.gate`), it is asked under the plugin's lock and releases a
    patch with :meth:`EnginePlugin.apply`."""

    def holds(self, patch: Patch) -> str | None:
        """Why ``patch`` waits, as :meth:`EnginePlugin.status` says it (``None``: it
        applies when its module is imported)."""

    def start(self) -> None:
        """At each registration, after the patches it does not hold were scheduled:
        watch for what releases the others (:meth:`EnginePlugin.on_import`)."""

    def installed(self, patch: Patch) -> Patch:
        """``patch`` as it is to be installed now (the gate may change its wrap)."""

    def stop(self) -> None:
        """At unregister: stop watching (what it saw is kept for the process)."""


class SwitchError(ValueError):
    """A plugin's environment variable holds a value it does not know."""


class _State:
    """What one plugin did in this process (guarded by ``lock``)."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.registered = False
        self.mode = "off"
        #: verify mode's comparison, while registered with ``verify``
        self.check: StockCheck | None = None
        self.quiet = False
        #: the registration line, until a configured log has shown it
        self.summary: str | None = None
        self.undo: dict[str, Undo] = {}
        self.skipped: dict[str, str] = {}
        #: the patches this registration leaves out: named by ``skip_env``, and off
        #: by default (``Patch.opt_in``) where ``add_env`` does not name them
        self.left_out: frozenset[str] = frozenset()
        self.cancel: list[Callable[[], None]] = []
        #: the warnings given (register() may run more than once per process)
        self.warned: set[str] = set()
        #: the plugin's gate (made at the first registration, kept for the process)
        self.gate: Gate | None = None


@dataclasses.dataclass(frozen=True, eq=False)
class EnginePlugin:
    """One engine's plugin: what it is, declared; what it does, shared.

    ``engine`` names the engine in messages; ``package`` is its import name;
    ``env`` the environment variable that turns the plugin on; ``supported`` the
    ``(distribution, (major, minor))`` release series it was tested against;
    ``patches`` its patch table, applied in this order; ``logger`` where it logs.
    ``distributions`` are asked first which one installed ``package`` (several may);
    ``find_installed`` replaces that search (an engine that is not a distribution).
    The state of the registration in this process is the object's own.
    """

    engine: str
    package: str
    env: str
    supported: tuple[tuple[str, tuple[int, int]], ...]
    patches: tuple[Patch, ...]
    logger: logging.Logger
    distributions: tuple[str, ...] = ()
    find_installed: Callable[[], Installed | None] | None = None
    #: What holds some patches back until the engine shows it needs them, made
    #: from the plugin at its first registration (:class:`Gate`); ``None``: every
    #: patch applies when its module is imported.
    gate: Callable[[EnginePlugin], Gate] | None = None
    #: The environment variable that names patches to leave out, read at each
    #: registration (:meth:`parse_skip`); ``None``: every patch applies.
    skip_env: str | None = None
    #: The environment variable that names patches off by default (``opt_in``) to
    #: apply, read at each registration (:meth:`parse_add`); a plugin with such
    #: patches must name one.
    add_env: str | None = None
    _state: _State = dataclasses.field(default_factory=_State, init=False, repr=False)

    def __post_init__(self) -> None:
        if any(patch.name == ADD_ALL for patch in self.patches):
            raise TypeError(f"no patch may be named {ADD_ALL!r} (add_env's word)")
        if self.opt_in and self.add_env is None:
            raise TypeError(
                f"the {self.engine} plugin declares patches off by default "
                f"({', '.join(sorted(self.opt_in))}) but no add_env to apply them"
            )

    @property
    def opt_in(self) -> frozenset[str]:
        """The names of the patches off by default (``Patch.opt_in``)."""
        return frozenset(patch.name for patch in self.patches if patch.opt_in)

    # -- the switch and the version ----------------------------------------------------
    def parse_mode(self, raw: str | None) -> str:
        """One of :data:`MODES` for a value of the switch (``None``: unset).

        ``0``/``off``/``false``/``no`` and the empty string are ``"off"``;
        ``1``/``on``/``true``/``yes`` are ``"on"``; anything else but ``verify`` and
        ``force`` is a :class:`SwitchError` naming the variable and what it may say.
        """
        if raw is None:
            return "off"
        value = raw.strip().lower()
        if value in _OFF:
            return "off"
        if value in _ON:
            return "on"
        if value in ("verify", "force"):
            return value
        raise SwitchError(f"{self.env} must be 0, 1, verify or force (got {raw!r})")

    def parse_skip(self, raw: str | None) -> frozenset[str]:
        """The patch names a value of ``skip_env`` leaves out (``None`` or empty:
        none). A name that is no patch of this plugin is a :class:`SwitchError` that
        names it and the patches."""
        return self._patch_names(self.skip_env, raw)

    def parse_add(self, raw: str | None) -> frozenset[str]:
        """The patch names a value of ``add_env`` applies, as :meth:`parse_skip`
        reads them (a patch applied by default may be named: it applies); the word
        ``all`` (:data:`ADD_ALL`) names every patch off by default."""
        return self._added(self._patch_names(self.add_env, raw, ADD_ALL))

    def _added(self, named: frozenset[str]) -> frozenset[str]:
        """The patches ``named`` in ``add_env`` apply, ``all`` read."""
        return named - {ADD_ALL} | self.opt_in if ADD_ALL in named else named

    def _patch_names(
        self, var: str | None, raw: str | None, word: str = ""
    ) -> frozenset[str]:
        """The names in ``raw``; one that is no patch (nor ``word``) raises."""
        names = frozenset(n.strip() for n in (raw or "").split(",") if n.strip())
        unknown = sorted(names - {patch.name for patch in self.patches} - {word})
        if unknown:
            raise SwitchError(
                f"{var} names no patch of the {self.engine} plugin: "
                f"{', '.join(map(repr, unknown))} (its patches: "
                f"{', '.join(patch.name for patch in self.patches)})"
            )
        return names

    def _chosen(self) -> tuple[frozenset[str], frozenset[str]]:
        """The patches ``skip_env`` leaves out and those off by default that
        ``add_env`` does not name, from the environment now."""
        skip = self.parse_skip(os.environ.get(self.skip_env) if self.skip_env else None)
        add = os.environ.get(self.add_env) if self.add_env else None
        named = self._patch_names(self.add_env, add, ADD_ALL)
        # only a name both spell out conflicts: ``all`` adds the others
        both = sorted(skip & named)
        if both:
            raise SwitchError(
                f"{self.skip_env} and {self.add_env} both name "
                f"{', '.join(map(repr, both))}: leave it out or add it"
            )
        return skip, self.opt_in - self._added(named) - skip

    def installed_version(self) -> Installed | None:
        """``(distribution, version)`` of the installed engine, ``None`` if there is
        none (:func:`installed_distribution`, unless ``find_installed`` is given)."""
        if self.find_installed is not None:
            return self.find_installed()
        return installed_distribution(self.package, self.distributions)

    def supports(self, distribution: str, version: str) -> bool:
        """Whether ``distribution`` ``version`` is of a release series in
        ``supported`` (a local version, ``+cpu``, counts as its release)."""
        found = re.match(r"(\d+)\.(\d+)(?:\.\d+)*(?:\+\S*)?$", version)
        if found is None:
            return False
        series = (int(found.group(1)), int(found.group(2)))
        name = distribution.lower().replace("_", "-")
        return (name, series) in self.supported

    def tested(self) -> str:
        """The supported series, as the messages name them."""
        return ", ".join(f"{n} {a}.{b}.x" for n, (a, b) in self.supported)

    # -- the lifecycle -----------------------------------------------------------------
    def active_mode(self) -> str:
        """The mode the plugin was registered with in this process (``"off"``: not
        registered)."""
        state = self._state
        return state.mode if state.registered else "off"

    @property
    def verify(self) -> bool:
        """Whether the patches applied compare with the engine's own code."""
        return self._state.check is not None

    @property
    def stock_check(self) -> StockCheck | None:
        """Verify mode's comparison (``None`` unless registered with ``verify``), for
        a patch of one's own that follows this plugin's mode
        (:func:`~stepcache.integrations.patching.verified`)."""
        return self._state.check

    def register(self) -> None:
        """Apply the patches (once per process), if the switch asks for it."""
        state, log = self._state, self.logger
        with state.lock:
            if state.registered:
                log.debug(
                    "stepcache: %s plugin already registered in this process",
                    self.engine,
                )
                return
            try:
                mode = self.parse_mode(os.environ.get(self.env))
            except SwitchError as exc:
                self._warn_once(f"stepcache: {exc}; {self.engine} left unpatched")
                return
            if mode == "off":
                log.debug(
                    "stepcache: %s is not set to 1; %s left unpatched",
                    self.env,
                    self.engine,
                )
                return
            try:
                skip, off = self._chosen()
            except SwitchError as exc:
                self._warn_once(f"stepcache: {exc}; {self.engine} left unpatched")
                return
            found = self.installed_version()
            if found is None:
                log.debug(
                    "stepcache: %s is not installed; nothing to patch", self.engine
                )
                return
            distribution, version = found
            if mode != "force" and not self.supports(distribution, version):
                self._warn_once(
                    f"stepcache: {self.engine} plugin not applied: {distribution} "
                    f"{version} is not a version it was tested against "
                    f"({self.tested()}); {self.env}=force applies it anyway"
                )
                return
            # a patch of a module this release does not have would wait forever
            gone = {
                p.name: p.module
                for p in self.patches
                if p.name not in skip | off and absent(p.module)
            }
            state.registered = True
            state.mode = mode
            state.left_out = skip | off | gone.keys()
            for name, module in gone.items():
                state.skipped[name] = f"{distribution} {version} has no {module}"
            for name in skip:
                state.skipped[name] = f"left out by {self.skip_env}"
            for name in off:
                state.skipped[name] = (
                    f"off by default ({self.add_env}={name} applies it)"
                )
            state.check = (
                StockCheck(self.engine, f"{self.env}=0") if mode == "verify" else None
            )
            # Patches whose module is imported already apply now, silently (the
            # summary below names them); the others apply when the engine imports
            # their module, and log a line then.
            state.quiet = True
            try:
                gate = self.the_gate
                for patch in self.patches:
                    if gate is None or gate.holds(patch) is None:
                        self.apply(patch)
                if gate is not None:
                    gate.start()
            finally:
                state.quiet = False
            self._log_summary(
                f"{distribution} {version}", mode, skip, off, frozenset(gone)
            )

    def unregister(self) -> None:
        """Undo every patch and forget the registration (for tests, and to switch the
        plugin off in a running process)."""
        state = self._state
        with state.lock:
            for cancel in state.cancel:
                cancel()
            if state.gate is not None:
                state.gate.stop()
            for patch in reversed(self.patches):
                undo = state.undo.pop(patch.name, None)
                if undo is not None:
                    undo()
            state.cancel.clear()
            state.skipped.clear()
            state.left_out = frozenset()
            state.warned.clear()
            state.registered = False
            state.summary = None
            state.mode = "off"
            state.check = None

    def status(self) -> dict[str, str]:
        """Each patch's state: ``"applied"``, ``"waiting for <module>"``,
        ``"skipped: <reason>"`` or ``"off"`` (not registered)."""
        state = self._state
        with state.lock:
            gate = state.gate
            out: dict[str, str] = {}
            for patch in self.patches:
                held = None if gate is None else gate.holds(patch)
                if patch.name in state.undo:
                    out[patch.name] = "applied"
                elif patch.name in state.skipped:
                    out[patch.name] = f"skipped: {state.skipped[patch.name]}"
                elif state.registered and held is not None:
                    out[patch.name] = held
                elif state.registered:
                    out[patch.name] = f"waiting for {patch.module}"
                else:
                    out[patch.name] = "off"
            return out

    def counters(self) -> dict[str, dict[str, int]]:
        """This process's counts of the plugin's patches, by name: the scopes opened
        (``scopes``) and the calls left without one (``unscoped``), the calls
        compared with the engine's own code (``verified``), and what a patch counts
        itself. The caches count in :func:`stepcache.stats`."""
        return counters.to_dict(self._counter_names())

    def reset_counters(self) -> None:
        """Zero :meth:`counters`."""
        counters.reset(self._counter_names())

    # -- for a gate ---------------------------------------------------------------------
    @property
    def the_gate(self) -> Gate | None:
        """This plugin object's :class:`Gate`, made at the first call (``None``:
        it declares none)."""
        state = self._state
        with state.lock:
            if state.gate is None and self.gate is not None:
                state.gate = self.gate(self)
            return state.gate

    @property
    def lock(self) -> threading.RLock:
        """The lock a gate holds while it changes what is applied."""
        return self._state.lock

    @property
    def registered(self) -> bool:
        """Whether the plugin is registered in this process, with patches to apply."""
        return self._state.registered

    @property
    def left_out(self) -> frozenset[str]:
        """The patches this registration leaves out (skipped, off by default, or of
        a module the release lacks): a gate must not apply them."""
        return self._state.left_out

    def on_import(self, module: str, hook: Hook) -> None:
        """Run ``hook`` when ``module`` is imported (now, if it is), until
        :meth:`unregister`."""
        self._state.cancel.append(_when_imported(module, hook))

    def apply(self, patch: Patch) -> None:
        """Apply ``patch`` when its module is imported (now, if it is), unless this
        registration leaves it out or it is applied already."""
        if patch.name not in self._state.left_out:
            self.on_import(patch.module, self._applier(patch))

    def withdraw(self, patch: Patch) -> bool:
        """Undo ``patch`` if it is applied (a gate applies it again, changed);
        whether it was."""
        undo = self._state.undo.pop(patch.name, None)
        if undo is not None:
            undo()
        return undo is not None

    # -- helpers -----------------------------------------------------------------------
    def _counter_names(self) -> set[str]:
        names = {patch.name for patch in self.patches}
        names |= {
            p.wrap.count_as
            for p in self.patches
            if isinstance(p.wrap, InScope) and p.wrap.count_as is not None
        }
        return names

    def _warn_once(self, message: str) -> None:
        if message not in self._state.warned:
            self._state.warned.add(message)
            self.logger.warning("%s", message)

    def _applier(self, patch: Patch) -> Callable[[ModuleType], None]:
        state, log = self._state, self.logger

        def apply(module: ModuleType) -> None:
            with state.lock:
                if (
                    not state.registered
                    or patch.name in state.undo
                    or patch.name in state.left_out
                ):
                    return
                try:
                    gate = state.gate
                    installed = patch if gate is None else gate.installed(patch)
                    state.undo[patch.name] = install(installed, module, state.check)
                except SkipPatch as exc:
                    state.skipped[patch.name] = str(exc)
                    log.warning("stepcache: left %s unpatched: %s", patch.name, exc)
                    return
                except Exception as exc:  # a bug of ours must not stop the engine
                    state.skipped[patch.name] = f"{type(exc).__name__}: {exc}"
                    log.exception("stepcache: could not apply %s", patch.name)
                    return
                if not state.quiet:
                    log.info("stepcache: patched %s", patch.name)
                    self._show_summary()

        return apply

    def _log_summary(
        self,
        version: str,
        mode: str,
        skip: frozenset[str],
        off: frozenset[str],
        gone: frozenset[str],
    ) -> None:
        state = self._state
        applied = [p.name for p in self.patches if p.name in state.undo]
        waiting = sorted(
            {
                p.module
                for p in self.patches
                if p.name not in state.undo and p.name not in state.skipped
            }
        )
        state.summary = (
            f"stepcache: {self.engine} plugin registered (pid {os.getpid()}, "
            f"{self.env}={mode}, {version}); patched: "
            f"{', '.join(applied) or 'nothing yet'}; waiting for the import of: "
            f"{', '.join(waiting) or 'nothing'}"
            + "".join(
                f"; {why}: {', '.join(sorted(names))}"
                for why, names in (
                    (f"left out ({self.skip_env})", skip),
                    (f"off by default ({self.add_env} applies)", off),
                    ("not in this release (their module is gone)", gone),
                )
                if names
            )
        )
        self._show_summary()

    def _show_summary(self) -> None:
        # An engine may load plugins before it configures its log: a line logged
        # then is lost. The registration line waits for the first patch applied once
        # it is configured.
        state, log = self._state, self.logger
        if state.summary is None:
            return
        if log.isEnabledFor(logging.INFO) and _has_handler(log):
            log.info("%s", state.summary)
            state.summary = None


class PluginFunctions:
    """An engine's plugin module's functions, written once: each calls the module's
    declaration (its attribute ``attr``, looked up at every call, so a test may put a
    declaration of its own in its place). A plugin module binds them by name::

        _functions = PluginFunctions(__name__)
        register = _functions.register
    """

    def __init__(self, module: str, attr: str = "PLUGIN") -> None:
        self.module, self.attr = module, attr

    def plugin(self) -> EnginePlugin:
        """The declaration the module holds now."""
        found = getattr(sys.modules[self.module], self.attr)
        if not isinstance(found, EnginePlugin):
            raise TypeError(
                f"{self.module}.{self.attr} is a {type(found).__name__}, "
                "expected an EnginePlugin"
            )
        return found

    def register(self) -> None:
        """Apply the patches (once per process), if the plugin's switch asks for
        it (:meth:`EnginePlugin.register`); the engine's entry point."""
        self.plugin().register()

    def unregister(self) -> None:
        """Undo every patch and forget the registration
        (:meth:`EnginePlugin.unregister`)."""
        self.plugin().unregister()

    def active_mode(self) -> str:
        """The mode registered in this process (``"off"``: not registered)."""
        return self.plugin().active_mode()

    def status(self) -> dict[str, str]:
        """Each patch's state (:meth:`EnginePlugin.status`)."""
        return self.plugin().status()

    def counters(self) -> dict[str, dict[str, int]]:
        """This process's counts by patch (:meth:`EnginePlugin.counters`)."""
        return self.plugin().counters()

    def reset_counters(self) -> None:
        """Zero :meth:`counters`."""
        self.plugin().reset_counters()


def _has_handler(log: logging.Logger) -> bool:
    current: logging.Logger | None = log
    while current is not None:
        if current.handlers:
            return True
        if not current.propagate:
            return False
        current = current.parent
    return False


def installed_distribution(
    package: str, preferred: tuple[str, ...] = ()
) -> Installed | None:
    """``(distribution, version)`` of the distribution that installed the import
    package ``package``; ``None`` if it is not importable, ``("unknown",
    "unknown")`` if no distribution owns it.

    One package may be installed by several distributions (a CPU build under another
    name): ``preferred`` are asked first, then every distribution that lists it.

    >>> installed_distribution("sc_no_such_package") is None
    True
    """
    try:
        if importlib.util.find_spec(package) is None:
            return None
    except (ImportError, ValueError):  # ValueError: sys.modules[package] is None
        return None
    names = list(preferred)
    names += [
        n
        for n in importlib.metadata.packages_distributions().get(package, [])
        if n not in names
    ]
    for name in names:
        try:
            dist = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            continue
        if _owns(dist, package):
            return dist.metadata["Name"], dist.version
    return ("unknown", "unknown")


def _owns(dist: importlib.metadata.Distribution, package: str) -> bool:
    top = dist.read_text("top_level.txt")
    if top is not None:
        return package in top.split()
    files = dist.files or []
    return any(str(f).startswith(f"{package}/") for f in files[:200]) or not files
