# SPDX-License-Identifier: Apache-2.0
"""What the profiler records while it runs: every call of a wrapped function, grouped
into steps, timed without the profiler's own cost.

A *step* is a run of calls that a per-step cache could share. It ends, and a new one
begins, when

* the step function is entered (``step=``: each outermost call of it is one step;
  calls outside it form steps of their own);
* a call receives, under a ``step_by=`` parameter name, an object other than the one
  the current step was opened for (e.g. a new ``common_attn_metadata``);
* the report's :meth:`~stepcache.profiler.ProfileReport.step` is called.

Without any of them the whole profiled run is one step.

At the end of a step its calls are bound to parameter names and their argument
fingerprints are turned into small codes; the arguments themselves are released one
step later (they are kept alive until then so that no ``id()`` is reused within a step,
and so that an object seen in two consecutive steps is recognised as persistent).
"""

from __future__ import annotations

import contextlib
import gc
import inspect
import threading
import time
from collections.abc import Callable, Hashable
from inspect import Parameter, Signature
from typing import Any, Final

from stepcache._watch import Watch
from stepcache.profiler import _argprint
from stepcache.profiler._reads import ReadRecorder

__all__ = ["Call", "FnState", "Recorder"]

#: calls kept for the key analysis: the first ones of each function, and at most so
#: many in all, to bound the memory (counters stay exact beyond; a function that lost
#: calls to either limit says so in its row)
MAX_KEPT_PER_FUNCTION: Final = 20_000
MAX_KEPT_CALLS: Final = 200_000
#: the first calls of each function also record which attributes of their object
#: arguments they read (for ``depends_on``); those calls run slower (every attribute
#: read on an object of a watched class goes through Python while they run)
READ_CALLS: Final = 2


class Call:
    """One call of a wrapped function."""

    __slots__ = (
        "child_oh",
        "codes",
        "error",
        "fcodes",
        "fields",
        "fn",
        "fp",
        "kwfp",
        "ns",
        "parent",
        "reads",
        "redundant",
        "repeat",
        "result",
        "step",
        "watched",
    )

    def __init__(
        self,
        fn: FnState,
        fp: tuple[Hashable, ...],
        kwfp: tuple[tuple[str, Hashable], ...],
        parent: Call | None,
        step: int,
    ) -> None:
        self.fn = fn
        self.fp: tuple[Hashable, ...] | None = fp
        self.kwfp = kwfp
        self.parent = parent
        self.step = step
        self.child_oh = 0
        self.ns = 0
        self.error = False
        self.result: Hashable | None = None
        self.reads: dict[int, Watch] | None = None
        #: per parameter of ``fn.params``: a value fingerprint, or a step-local code
        self.codes: tuple[Hashable, ...] = ()
        #: fields mode: object arguments' attribute fingerprints, by ``id``
        self.fields: dict[int, dict[str, Hashable]] | None = None
        #: fields mode: ``codes`` with each object argument replaced by the
        #: fingerprints of the attributes the function read from it
        self.fcodes: tuple[Hashable, ...] = ()
        #: its arguments equal an earlier call's of the same step
        self.repeat = False
        #: a cache with the suggested key would have served it (set by the analysis)
        self.redundant = False
        #: one of the function's first calls, whose reads were recorded: slower, and
        #: the very first pays one-time costs (imports, torch's first dispatch)
        self.watched = False


class FnState:
    """Everything recorded about one wrapped function."""

    def __init__(
        self,
        name: str,
        signature: Signature | None,
        is_step: bool,
        step_by: tuple[str, ...],
        lazy: bool = False,
        cached: bool = False,
    ) -> None:
        self.name = name
        self.signature = signature
        self.is_step = is_step
        #: it returns a generator or coroutine: a cache would hand out a used one
        self.lazy = lazy
        #: it is (or wraps) a ``@stepcache.step_cached`` function already
        self.cached = cached
        self.params: list[str] = []
        self.step_positions: list[tuple[int, str]] = []
        if signature is not None:
            self.params = list(signature.parameters)
            for i, p in enumerate(signature.parameters.values()):
                if p.name in step_by and p.kind in (
                    Parameter.POSITIONAL_ONLY,
                    Parameter.POSITIONAL_OR_KEYWORD,
                ):
                    self.step_positions.append((i, p.name))
                elif p.name in step_by and p.kind is Parameter.KEYWORD_ONLY:
                    self.step_positions.append((-1, p.name))
        self.calls = 0
        self.errors = 0
        #: calls that returned although their arguments do not bind to ``signature``
        #: (a wrapper that takes other arguments): not analysed
        self.unbound = 0
        #: calls beyond the analysis' budget (see ``MAX_KEPT_PER_FUNCTION``)
        self.dropped = 0
        #: calls inside which a new step began: counted, not analysed
        self.across_steps = 0
        self.total_ns = 0
        #: the median time of the calls kept for the analysis, but for its first
        #: (``Call.watched``) ones when it has others (set by the analysis)
        self.median_ns = 0
        self.repeats = 0
        #: identical arguments, different result
        self.impure = 0
        #: calls that returned None, whose results are not compared
        self.returned_none = 0
        #: calls whose inputs equal an earlier call's of the same step (object
        #: arguments by identity, or in fields mode by the attributes the function
        #: read): the same computation again, unless its result differs
        self.equal_inputs = 0
        #: of those, calls whose arguments were other objects than the earlier
        #: call's (copies of the step's metadata, in fields mode)
        self.equal_copies = 0
        #: of those, calls whose result differed from the earlier call's (it reads
        #: something its arguments do not show, or its result's bytes differ)
        self.other_result = 0
        self.steps: set[int] = set()
        self.max_per_step = 0
        self.read_budget = READ_CALLS
        #: parameter -> kinds seen (see ``_argprint.kind_of``)
        self.kinds: dict[str, set[str]] = {}
        #: parameters whose object was the same one in two consecutive steps
        self.persistent: set[str] = set()
        #: parameter -> attributes read from the object passed there
        self.reads: dict[str, set[str]] = {}
        #: calls kept for the analysis
        self.kept: list[Call] = []
        self._plans: dict[
            tuple[int, tuple[str, ...]], list[tuple[str, int, Any]] | None
        ] = {}

    def plan(
        self, nargs: int, kwnames: tuple[str, ...]
    ) -> list[tuple[str, int, Any]] | None:
        """How calls with ``nargs`` positional arguments and these keywords bind to the
        parameters: (name, how, where) for each one; ``None`` when they do not bind
        (or the signature is unknown). Worked out once per call shape."""
        shape = (nargs, kwnames)
        if shape in self._plans:
            return self._plans[shape]
        plan: list[tuple[str, int, Any]] | None = None
        if self.signature is not None:
            try:
                bound = self.signature.bind(
                    *[_Slot(_POS, i) for i in range(nargs)],
                    **{k: _Slot(_KW, k) for k in kwnames},
                )
            except TypeError:
                pass
            else:
                plan = []
                for name, p in self.signature.parameters.items():
                    if name not in bound.arguments:
                        plan.append((name, _DEFAULT, p.default))
                    elif p.kind is Parameter.VAR_POSITIONAL:
                        slots = bound.arguments[name]
                        plan.append((name, _VARPOS, slots[0].where if slots else nargs))
                    elif p.kind is Parameter.VAR_KEYWORD:
                        plan.append((name, _VARKW, tuple(bound.arguments[name])))
                    else:
                        slot = bound.arguments[name]
                        plan.append((name, slot.how, slot.where))
        self._plans[shape] = plan
        return plan


_POS, _KW, _DEFAULT, _VARPOS, _VARKW = range(5)


class _Slot:
    """A placeholder argument, to learn how a call shape binds."""

    __slots__ = ("how", "where")

    def __init__(self, how: int, where: Any) -> None:
        self.how = how
        self.where = where


#: nanoseconds the garbage collector has paused the process while a profile ran, and
#: when the collection under way began
_gc_paused = [0, 0]


def _on_gc(phase: str, info: dict[str, int]) -> None:
    now = time.perf_counter_ns()
    if phase == "start":
        _gc_paused[1] = now
    else:
        _gc_paused[0] += now - _gc_paused[1]


def clock() -> int:
    """The profiler's clock: wall time less the garbage collector's pauses.

    A collection runs inside whichever call allocated last, and its cost is that of
    the whole heap (the arguments the profiler keeps for a step, everything loaded),
    not the call's: one 10 ms collection made a 20 us function's call read 10 ms.
    Its pauses are left out of every call's time and of the profiler's overhead.
    """
    return time.perf_counter_ns() - _gc_paused[0]


def _kind_of_print(fp: Hashable) -> str:
    if isinstance(fp, tuple) and fp:
        head = fp[0]
        if head == "T":
            return _argprint.KIND_TENSOR
        if head == "O":
            return _argprint.KIND_OBJECT
        if head in (tuple, list):
            inner = {_kind_of_print(x) for x in fp[1:]}
            return (
                _argprint.KIND_VALUE
                if inner <= {_argprint.KIND_VALUE}
                else _argprint.KIND_OBJECT
            )
    return _argprint.KIND_VALUE


def _ids_in(fp: Hashable) -> list[int]:
    if isinstance(fp, tuple) and fp:
        if fp[0] in ("T", "O"):
            return [fp[1]]  # type: ignore[list-item]
        if fp[0] in (tuple, list):
            return [i for x in fp[1:] for i in _ids_in(x)]
    return []


class Recorder:
    """The calls of one profile run, grouped into steps."""

    def __init__(self, *, results: bool, fields: bool = False) -> None:
        self.results = results
        #: also compare object arguments by the attributes the function read
        self.fields = fields
        self.lock = threading.RLock()
        self.local = threading.local()
        self.reads = ReadRecorder()
        self.active = False
        self.step_index = 0
        self.step_calls: list[Call] = []
        self.keep: dict[int, object] = {}
        self.prev_keep: dict[int, object] = {}
        #: tensor digests of this step, by id (see ``_argprint.digest``)
        self.digests: _argprint.Memo = {}
        self.step_token: object | None = None
        self.step_depth = 0
        #: with a step function, only its calls' steps count as steps (the calls
        #: between them are grouped, but not counted)
        self.has_step_function = False
        self.step_is_function_call = False
        self.steps_with_calls = 0
        self.overhead_ns = 0
        self.calls = 0
        self.kept_calls = 0

    def start(self) -> None:
        """Record the wrapped functions' calls from now on."""
        if _on_gc not in gc.callbacks:
            gc.callbacks.append(_on_gc)
        self.active = True

    def stop(self) -> None:
        """Let the wrapped functions call straight through again."""
        self.active = False
        with contextlib.suppress(ValueError):
            gc.callbacks.remove(_on_gc)

    # -- the wrapper ----------------------------------------------------------------------
    def wrap(self, fn: FnState, original: Callable[..., Any]) -> Callable[..., Any]:
        """A function that records each call of ``original`` and calls it."""
        enter = self.enter
        leave = self.leave
        fail = self.fail

        def profiled(*args: Any, **kwargs: Any) -> Any:
            if not self.active:
                return original(*args, **kwargs)
            t0 = clock()
            call = enter(fn, args, kwargs)
            t1 = clock()
            try:
                result = original(*args, **kwargs)
            except BaseException:
                fail(call, t0, t1, clock())
                raise
            t2 = clock()
            leave(call, result, t0, t1, t2)
            return result

        async def profiled_async(*args: Any, **kwargs: Any) -> Any:
            # A coroutine function stays one (callers dispatch on that), and its
            # time runs to its return, the awaits included.
            if not self.active:
                return await original(*args, **kwargs)
            t0 = clock()
            call = enter(fn, args, kwargs)
            t1 = clock()
            try:
                result = await original(*args, **kwargs)
            except BaseException:
                fail(call, t0, t1, clock())
                raise
            t2 = clock()
            leave(call, result, t0, t1, t2)
            return result

        return profiled_async if inspect.iscoroutinefunction(original) else profiled

    def enter(self, fn: FnState, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Call:
        with self.lock:
            if fn.is_step and self.step_depth == 0:
                self.new_step(inside_call=True)
                self.step_is_function_call = True
            if fn.is_step:
                self.step_depth += 1
            if fn.step_positions:
                self._follow_step_object(fn, args, kwargs)
            keep = self.keep
            fp = tuple([_argprint.argprint(a, keep) for a in args])
            kwfp = (
                tuple([(k, _argprint.argprint(v, keep)) for k, v in kwargs.items()])
                if kwargs
                else ()
            )
            stack: list[Call] | None = getattr(self.local, "stack", None)
            if stack is None:
                stack = self.local.stack = []
            call = Call(fn, fp, kwfp, stack[-1] if stack else None, self.step_index)
            if self.fields and not fn.is_step:
                # at the call: the attributes may change before the step closes
                call.fields = _fieldprints(args, kwargs, keep)
            if fn.read_budget > 0 and not fn.is_step:
                # Objects of the previous step live longer than a step: not owners.
                fn.read_budget -= 1
                call.watched = True
                call.reads = self.reads.start(args, kwargs, self.prev_keep)
            stack.append(call)
            return call

    def _follow_step_object(
        self, fn: FnState, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> None:
        for pos, name in fn.step_positions:
            if 0 <= pos < len(args):
                token = args[pos]
            elif name in kwargs:
                token = kwargs[name]
            else:
                continue
            if token is not self.step_token:
                self.new_step(inside_call=True)
                self.step_token = token
            return

    def leave(self, call: Call, result: Any, t0: int, t1: int, t2: int) -> None:
        with self.lock:
            self._finish(call, t1, t2)
            if self.results and not call.fn.is_step:
                if result is None:
                    # None says nothing of what the call did (it may write into an
                    # argument): left undigested, so only identical arguments count
                    call.fn.returned_none += 1
                else:
                    try:
                        call.result = _argprint.digest(result, self.digests)
                    except Exception:
                        call.result = None
            self._account(call, t0, t1, t2, clock())

    def fail(self, call: Call, t0: int, t1: int, t2: int) -> None:
        with self.lock:
            call.error = True
            self._finish(call, t1, t2)
            call.fn.errors += 1
            self._account(call, t0, t1, t2, clock())

    def _finish(self, call: Call, t1: int, t2: int) -> None:
        self._record(call, t1, t2)
        if call.fn.is_step:
            self.step_depth = max(0, self.step_depth - 1)
            if self.step_depth == 0:
                self.new_step(inside_call=True)  # timed by the caller

    def _record(self, call: Call, t1: int, t2: int) -> None:
        stack: list[Call] = self.local.stack
        if stack and stack[-1] is call:
            stack.pop()
        else:  # pragma: no cover - a generator or callback left frames out of order
            with contextlib.suppress(ValueError):
                stack.remove(call)
        if call.reads is not None:
            self.reads.stop(call.reads)
        call.ns = max(0, (t2 - t1) - call.child_oh)
        fn = call.fn
        fn.calls += 1
        fn.total_ns += call.ns
        self.calls += 1
        if call.step == self.step_index:
            self.step_calls.append(call)
        else:  # its step closed while it ran: nothing left to compare it with
            fn.across_steps += 1

    def _account(self, call: Call, t0: int, t1: int, t2: int, t3: int) -> None:
        own = (t1 - t0) + (t3 - t2)
        self.overhead_ns += own
        if call.parent is not None:
            call.parent.child_oh += own + call.child_oh

    # -- steps ----------------------------------------------------------------------------
    def new_step(self, *, inside_call: bool = False) -> None:
        """Close the current step (if it had calls) and open the next one.

        Its time counts as overhead here, unless a wrapper runs it (``inside_call``):
        the wrapper counts its own time.
        """
        with self.lock:
            t0 = clock()
            if self.step_calls:
                self._close_step()
                if self.step_is_function_call or not self.has_step_function:
                    self.steps_with_calls += 1
            self.step_index += 1
            self.step_token = None
            self.step_is_function_call = False
            if not inside_call:
                self.overhead_ns += clock() - t0

    def _close_step(self) -> None:
        calls, self.step_calls = self.step_calls, []
        keep, previous = self.keep, self.prev_keep
        by_fn: dict[FnState, list[Call]] = {}
        for call in calls:
            by_fn.setdefault(call.fn, []).append(call)
        for fn, fn_calls in by_fn.items():
            self._close_fn_step(fn, fn_calls, keep, previous)
        self.prev_keep, self.keep = keep, {}
        self.digests = {}

    def _close_fn_step(
        self,
        fn: FnState,
        calls: list[Call],
        keep: dict[int, object],
        previous: dict[int, object],
    ) -> None:
        fn.steps.add(calls[0].step)
        fn.max_per_step = max(fn.max_per_step, len(calls))
        codes: dict[str, dict[Hashable, int]] = {}
        first_result: dict[tuple[Hashable, ...], Hashable | None] = {}
        #: fields mode: each analysed call's object arguments (position in its row,
        #: parameter, the object's id)
        objects: list[tuple[Call, list[tuple[int, str, int]]]] = []
        for call in calls:
            named = self._bind(fn, call, keep)
            if named is None:
                # Arguments that do not bind raised TypeError (an error call), or the
                # signature is not the one called: no parameter names to compare by.
                fn.unbound += not call.error
                call.fp, call.kwfp, call.reads = None, (), None
                continue
            row: list[Hashable] = []
            held: list[tuple[int, str, int]] = []
            for name, fp in named:
                kind = _kind_of_print(fp)
                fn.kinds.setdefault(name, set()).add(kind)
                if kind == _argprint.KIND_VALUE:
                    row.append(fp)
                    continue
                ids = _ids_in(fp)
                if any(previous.get(i) is keep.get(i) is not None for i in ids):
                    fn.persistent.add(name)
                if call.reads:
                    for i in ids:
                        read = call.reads.get(i)
                        names = None if read is None else read.names
                        if names:
                            fn.reads.setdefault(name, set()).update(
                                _data_attributes(keep.get(i), names)
                            )
                if call.fields is not None and isinstance(fp, tuple) and fp[0] == "O":
                    held.append((len(row), name, fp[1]))
                table = codes.setdefault(name, {})
                row.append(table.setdefault(fp, len(table)))
            call.codes = tuple(row)
            if call.fields is not None:
                objects.append((call, held))
            call.fp = None
            call.kwfp = ()
            call.reads = None
            if call.error:
                continue
            if call.codes in first_result:
                call.repeat = True
                fn.repeats += 1
                earlier = first_result[call.codes]
                # a result that could not be digested is not evidence either way
                if self.results and None not in (earlier, call.result):
                    fn.impure += earlier != call.result
            else:
                first_result[call.codes] = call.result
            if (
                self.kept_calls < MAX_KEPT_CALLS
                and len(fn.kept) < MAX_KEPT_PER_FUNCTION
            ):
                fn.kept.append(call)
                self.kept_calls += 1
            else:
                fn.dropped += 1
        # after the loop: the reads of this step's first calls are merged now
        for call, held in objects:
            call.fcodes = _field_codes(fn, call, held)
            call.fields = None
        self._count_equal_inputs(fn, calls)

    def _count_equal_inputs(self, fn: FnState, calls: list[Call]) -> None:
        """Count the step's calls whose inputs equal an earlier call's (``fcodes``
        in fields mode), and of them those whose result differed: the comparison
        missed an input (an attribute read by a call whose reads were not
        recorded, a nested object, a global) or the result's bytes vary."""
        first: dict[tuple[Hashable, ...], Call] = {}
        for call in calls:
            if call.error or not (call.codes or call.fcodes):
                continue  # raised, or did not bind: not analysed
            key = call.fcodes if self.fields else call.codes
            earlier = first.setdefault(key, call)
            if earlier is call:
                continue
            fn.equal_inputs += 1
            fn.equal_copies += earlier.codes != call.codes
            results = (earlier.result, call.result)
            fn.other_result += None not in results and results[0] != results[1]

    def _bind(
        self, fn: FnState, call: Call, keep: dict[int, object]
    ) -> list[tuple[str, Hashable]] | None:
        """The call's fingerprints by parameter name; ``None`` when they do not bind
        to the signature. Without a signature they are named ``arg0``, ``arg1``, ...
        and by keyword, and ``fn.params`` grows as new names are seen (the rows of
        earlier steps are shorter: the analysis pads them with ``None``, absent)."""
        fp = call.fp or ()
        kw = dict(call.kwfp)
        plan = fn.plan(len(fp), tuple(kw))
        if plan is not None:
            out: list[tuple[str, Hashable]] = []
            for name, how, where in plan:
                if how == _POS:
                    out.append((name, fp[where]))
                elif how == _KW:
                    out.append((name, kw[where]))
                elif how == _DEFAULT:
                    out.append((name, _argprint.argprint(where, keep)))
                elif how == _VARPOS:
                    out.append((name, (tuple, *fp[where:])))
                else:  # **kwargs: the names count as much as the values
                    items = ((tuple, (str, k), kw[k]) for k in sorted(where))
                    out.append((name, (tuple, *items)))
            return out
        if fn.signature is not None:
            return None
        names = [f"arg{i}" for i in range(len(fp))]
        for name in names + list(kw):
            if name not in fn.params:
                fn.params.append(name)
        row = dict(zip(names, fp, strict=True))
        row.update(kw)
        return [(name, row.get(name)) for name in fn.params]

    def finish(self) -> None:
        """Close the last step and release every argument kept alive.

        This runs after the profiled block: its time is the caller's (the report's
        analysis), not overhead of the run (which the block's wall time holds).
        """
        self.new_step(inside_call=True)
        self.keep = {}
        self.prev_keep = {}
        self.digests = {}


def _data_attributes(obj: object, names: set[str]) -> set[str]:
    """The names that are data on ``obj`` (not methods, not properties)."""
    if obj is None:
        return set()
    cls = type(obj)
    out = set()
    for name in names:
        if name.startswith("__") or name == "_stepcache":
            continue
        on_class = getattr(cls, name, None)
        if callable(on_class) or isinstance(on_class, property):
            continue
        out.add(name)
    return out


def _fieldprints(
    args: tuple[Any, ...], kwargs: dict[str, Any], keep: dict[int, object]
) -> dict[int, dict[str, Hashable]]:
    """Fields mode: the attribute fingerprints of each object argument, by ``id``."""
    out: dict[int, dict[str, Hashable]] = {}
    for value in (*args, *kwargs.values()):
        if id(value) not in out:
            prints = _argprint.fieldprint(value, keep)
            if prints is not None:
                out[id(value)] = prints
    return out


#: an attribute the function read that the object did not have at the call
_ABSENT: Final = ("absent",)


def _field_codes(
    fn: FnState, call: Call, held: list[tuple[int, str, int]]
) -> tuple[Hashable, ...]:
    """``call.codes`` with each object argument whose reads are known replaced by the
    fingerprints of the attributes read (kept by identity otherwise). Identity codes
    are tagged apart, so a code never equals a fingerprint by accident."""
    row: list[Hashable] = [("I", c) for c in call.codes]
    fields = call.fields or {}
    for pos, name, oid in held:
        names = fn.reads.get(name)
        prints = fields.get(oid)
        if names and prints is not None:
            row[pos] = ("F", tuple((a, prints.get(a, _ABSENT)) for a in sorted(names)))
    return tuple(row)
