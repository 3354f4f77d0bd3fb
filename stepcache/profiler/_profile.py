# SPDX-License-Identifier: Apache-2.0
"""``stepcache.profile``: wrap the targets for the length of a ``with`` block, then
put every original back (also when the block raises)."""

from __future__ import annotations

import functools
import inspect
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from types import TracebackType
from typing import Any

from stepcache.profiler._errors import ProfilerError, TargetError
from stepcache.profiler._recorder import FnState, Recorder
from stepcache.profiler._report import ProfileReport
from stepcache.profiler._targets import (
    Site,
    Target,
    add_aliases,
    resolve,
    resolve_all,
    signature_of,
)

__all__ = ["Profile", "profile"]

_active_lock = threading.Lock()
_active: Profile | None = None

TargetSpec = str | object


def _is_step_cached(f: Any) -> bool:
    return hasattr(f, "__stepcache__")


def profile(
    targets: TargetSpec | Iterable[TargetSpec],
    *,
    step: str | Callable[..., Any] | None = None,
    step_by: str | Sequence[str] = (),
    results: bool = True,
    fields: bool = False,
) -> Profile:
    """Find the calls a per-step cache would save.

    Wraps `targets` while the `with` block runs, records for each step the calls
    that repeat an earlier call of the same step (identical arguments, or an equal
    result), and ranks the functions by the time those calls took, each with a
    suggested owner, key and `depends_on` and a ready `@stepcache.step_cached` line.
    When the block ends every original is back in place, also if the block raised.
    The command line does the same: `python -m stepcache profile MODULE:CALLABLE`.

    Args:
        targets: What to wrap: `"pkg.mod"` (every function and method defined in the
            module), `"pkg.mod:Class"`, `"pkg.mod:func"`, `"pkg.mod:Class.method"`
            (shell wildcards allowed after the colon), or the module, class or
            function objects themselves. A module-level function is also wrapped
            where other loaded modules imported it by name.
        step: A function (or `"module:attr"`) whose each outermost call is one step,
            such as an engine's `execute_model`. It is not analysed unless it is a
            target too.
        step_by: Parameter name(s) of the step's metadata object: a call that
            receives another object there starts a new step
            (`"common_attn_metadata"`). Without `step` or `step_by`, mark steps with
            `report.step()`; with none of the three, the whole block is one step.
        results: Digest each result's contents, so that calls with different
            arguments but equal results (a parameter the result does not depend on)
            are found too. `False` compares arguments only, which costs less.
        fields: Also compare each object argument by the attributes the function
            read from it (fingerprinted at the call), so calls that got two copies
            of one step's metadata, or two objects made from the same tensors,
            count as equal inputs (each row's `equal_inputs`, `equal_copies`,
            `other_result` and `needed`). Costs a fingerprint of every attribute of
            each object argument per call.

    Returns:
        A context manager; `with` gives the report (a
            `stepcache.profiler.ProfileReport`), complete when the block ends.

    Raises:
        TargetNotFoundError: A module or attribute that does not exist (also a
            `LookupError`).
        TargetNotCallableError: An attribute that is not a function, method or class
            (also a `TypeError`).
        ProfilerError: Another profile is active in this process.

    Examples:
        >>> import stepcache, json as mod
        >>> with stepcache.profile("json:dumps") as report:
        ...     for step in range(2):
        ...         _ = [mod.dumps([1, 2]) for _ in range(3)]
        ...         report.step()
        >>> row = report["dumps"]
        >>> row.calls, row.identical, row.calls_per_step
        (6, 4, 3.0)
        >>> hasattr(mod.dumps, "__wrapped__")  # the original is back
        False
    """
    if isinstance(targets, (str, bytes)) or not isinstance(targets, Iterable):
        specs: list[Any] = [targets]
    else:
        specs = list(targets)
    if not specs:
        raise TargetError("profile() needs at least one target")
    names = (step_by,) if isinstance(step_by, str) else tuple(step_by)
    return Profile(specs, step, names, results, fields)


class Profile:
    """The context manager :func:`profile` returns (one use)."""

    def __init__(
        self,
        specs: list[Any],
        step: str | Callable[..., Any] | None,
        step_by: tuple[str, ...],
        results: bool,
        fields: bool = False,
    ) -> None:
        self._specs = specs
        self._step = step
        self._step_by = step_by
        self._recorder = Recorder(results=results, fields=fields)
        self._installed: list[tuple[Site, Any, str]] = []
        self._report: ProfileReport | None = None
        self._t0 = 0

    def __enter__(self) -> ProfileReport:
        global _active
        clock = time.perf_counter_ns
        t0 = clock()
        with _active_lock:
            if _active is not None:
                raise ProfilerError(
                    "another stepcache.profile() is active: profiles do not nest "
                    "(give the outer one every target)"
                )
            if self._report is not None:
                raise ProfilerError(
                    "a Profile is used once: call stepcache.profile() again"
                )
            _active = self
        try:
            targets = resolve_all(self._specs)
            step_target = self._step_target(targets)
            self._recorder.has_step_function = step_target is not None
            add_aliases(targets)
            states: list[FnState] = []
            for target in targets:
                is_step = step_target is not None and target is step_target
                f = inspect.unwrap(target.function)
                lazy = inspect.isgeneratorfunction(f) or inspect.iscoroutinefunction(f)
                lazy = lazy or inspect.isasyncgenfunction(f)
                cached = hasattr(
                    inspect.unwrap(target.function, stop=_is_step_cached),
                    "__stepcache__",
                )
                state = FnState(
                    target.name,
                    signature_of(target.function),
                    is_step,
                    self._step_by,
                    lazy,
                    cached,
                )
                if (
                    step_target is None
                    or target is not step_target
                    or self._step_in_targets
                ):
                    states.append(state)
                self._install(target, state)
        except BaseException:
            self._restore()
            with _active_lock:
                _active = None
            raise
        self._report = ProfileReport(self._recorder, states)
        self._recorder.start()
        self._report.setup_ns = clock() - t0
        self._t0 = clock()
        return self._report

    _step_in_targets = False

    def _step_target(self, targets: list[Target]) -> Target | None:
        if self._step is None:
            return None
        found = resolve(self._step)
        if len(found) != 1:
            raise TargetError(
                f"step={self._step!r} names {len(found)} functions; it must name one "
                "(each outermost call of it is one step)"
            )
        home = found[0].sites[0]
        for target in targets:
            site = target.sites[0]
            if site.cid == home.cid and site.attr == home.attr:
                self._step_in_targets = True
                return target
        targets.append(found[0])
        return found[0]

    def _install(self, target: Target, state: FnState) -> None:
        wrapper = self._recorder.wrap(state, target.function)
        # the function's attributes stay visible (a step_cached one's __stepcache__)
        functools.update_wrapper(wrapper, target.function)
        if target.kind == "staticmethod":
            value: Any = staticmethod(wrapper)
        elif target.kind == "classmethod":
            value = classmethod(wrapper)
        else:
            value = wrapper
        for site in target.sites:
            try:
                setattr(site.container, site.attr, value)
            except (TypeError, AttributeError) as exc:
                raise TargetError(
                    f"cannot wrap {target.name}: {site.container!r} does not allow "
                    f"setting {site.attr!r} ({exc})"
                ) from exc
            self._installed.append((site, value, target.name))

    def _restore(self) -> tuple[str, ...]:
        left: list[str] = []
        for site, value, name in reversed(self._installed):
            current = vars(site.container).get(site.attr)
            if current is value:
                setattr(site.container, site.attr, site.raw)
            else:
                where = getattr(site.container, "__name__", repr(site.container))
                left.append(f"{where}.{site.attr} ({name})")
        self._installed.clear()
        self._recorder.reads.restore_all()
        return tuple(left)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        global _active
        clock = time.perf_counter_ns
        t1 = clock()
        report = self._report
        assert report is not None
        try:
            self._recorder.stop()
            report.wall_ns = t1 - self._t0
            t2 = clock()
            report.not_restored = self._restore()
            report.setup_ns += clock() - t2
            # closing the last step is analysis, after the block's wall time
            t3 = clock()
            self._recorder.finish()
            report._finish(clock, t3)
        finally:
            self._recorder.stop()
            self._restore()
            with _active_lock:
                _active = None
