# SPDX-License-Identifier: Apache-2.0
"""The profiler's report: functions ranked by time spent on redundant calls, as a
table and as JSON."""

from __future__ import annotations

import gc
import json
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import attrs

from stepcache.profiler._errors import ProfilerError
from stepcache.profiler._infer import Suggestion, suggest
from stepcache.profiler._recorder import FnState, Recorder

__all__ = ["FunctionReport", "ProfileReport", "format_ns"]


@attrs.frozen
class FunctionReport:
    """What the profiler found about one wrapped function."""

    #: ``"module:Qual.name"``
    name: str
    calls: int
    #: calls that raised (not analysed)
    errors: int
    #: steps in which it was called
    steps: int
    max_calls_per_step: int
    #: time inside the function (nested wrapped calls included, profiler cost not)
    total_ns: int
    #: the median time of one call; the ``*_ns`` below are call counts times it, so
    #: that one call stalled by the machine does not decide the ranking
    median_ns: int
    #: calls whose arguments were identical to an earlier call's in the same step
    identical: int
    identical_ns: int
    #: identical calls whose result differed (the function reads hidden inputs)
    impure: int
    #: calls the suggested cache would have served (identical or equal-result calls)
    redundant: int
    redundant_ns: int
    #: redundant time spent inside another function's redundant calls
    covered_ns: int
    #: the outermost redundant function whose calls contain most of this one's
    #: redundant time
    inside: str | None
    suggestion: Suggestion | None
    #: calls that returned although their arguments do not bind to the function's
    #: signature (a wrapper that takes other arguments): not analysed
    unbound: int = 0
    #: calls left out of the analysis when its budget was spent (the first
    #: ``MAX_KEPT_PER_FUNCTION`` of each function are kept): ``redundant`` and the
    #: suggestion come from the others
    dropped: int = 0
    #: calls inside which a new step began (counted, not analysed)
    across_steps: int = 0
    #: what limits this row's analysis (calls left out of it, why no suggestion)
    notes: tuple[str, ...] = ()
    #: calls whose inputs equal an earlier call's of the same step: the same
    #: computation again. Object arguments compare by identity, or with
    #: ``fields=True`` by the attributes the function read from them (so copies of
    #: the step's metadata, such as vLLM's one per KV-cache group, are equal)
    equal_inputs: int = 0
    #: their time (``equal_inputs`` times the median call time)
    equal_inputs_ns: int = 0
    #: of ``equal_inputs``, the calls that got other objects than the earlier call
    #: (equal copies; 0 without ``fields``)
    equal_copies: int = 0
    #: of ``equal_inputs``, the calls whose result differed from the earlier
    #: call's: an input the comparison missed, or bytes that vary (check them)
    other_result: int = 0

    @property
    def calls_per_step(self) -> float:
        """Mean calls per step in which it was called."""
        return self.calls / self.steps if self.steps else 0.0

    @property
    def needed(self) -> int:
        """The calls with inputs their step had not seen (distinct inputs): all
        calls less ``equal_inputs``."""
        return self.calls - self.equal_inputs

    @property
    def uncovered_ns(self) -> int:
        """Redundant time not already inside another function's redundant calls: what
        caching this function adds."""
        return self.redundant_ns - self.covered_ns

    def to_dict(self) -> dict[str, Any]:
        """Plain data, for JSON."""
        out = attrs.asdict(self, recurse=True)
        out["calls_per_step"] = round(self.calls_per_step, 3)
        out["needed"] = self.needed
        out["uncovered_ns"] = self.uncovered_ns
        return out


def format_ns(ns: float) -> str:
    """A duration for people.

    >>> format_ns(812), format_ns(12_340), format_ns(4_560_000), format_ns(2e9)
    ('812 ns', '12.3 us', '4.56 ms', '2.00 s')
    """
    if ns < 1_000:
        return f"{int(ns)} ns"
    if ns < 1_000_000:
        return f"{ns / 1e3:.1f} us"
    if ns < 1_000_000_000:
        return f"{ns / 1e6:.2f} ms"
    return f"{ns / 1e9:.2f} s"


class ProfileReport:
    """The result of ``with stepcache.profile(...) as report:``.

    Inside the block it marks steps (:meth:`step`); after the block it holds the
    ranking: :attr:`functions`, ``str(report)`` (a table and the suggestions),
    :meth:`to_dict` and :meth:`to_json`.
    """

    def __init__(self, recorder: Recorder, states: list[FnState]) -> None:
        self._recorder = recorder
        #: whether object arguments were also compared by their attributes
        self.fields = recorder.fields
        self._states = states
        self._functions: tuple[FunctionReport, ...] | None = None
        #: wall time of the profiled block
        self.wall_ns = 0
        #: time spent wrapping the targets and putting the originals back
        self.setup_ns = 0
        #: time spent analysing the calls after the block
        self.analysis_ns = 0
        #: sites whose wrapper had been replaced by someone else, left as they were
        self.not_restored: tuple[str, ...] = ()

    # -- while profiling --------------------------------------------------------------------
    def step(self) -> None:
        """End the current step: later calls are never compared with earlier ones."""
        if not self._recorder.active:
            raise ProfilerError("report.step() marks steps inside the profiled block")
        self._recorder.new_step()

    # -- after ------------------------------------------------------------------------------
    def _finish(self, clock: Callable[[], int], t0: int) -> None:
        """Analyse the calls; ``t0`` is when the analysis began."""
        # The analysis makes many small tuples and no cycles: a full collection of a
        # torch process's heap in the middle of it would cost more than all of it.
        enabled = gc.isenabled()
        gc.disable()
        try:
            self._analyse()
        finally:
            if enabled:
                gc.enable()
        self.analysis_ns = clock() - t0

    def _analyse(self) -> None:
        steps = self._recorder.steps_with_calls
        suggestions = {fn: suggest(fn, steps) for fn in self._states}
        covered: dict[FnState, int] = {fn: 0 for fn in self._states}
        inside: dict[FnState, Counter[str]] = {fn: Counter() for fn in self._states}
        for fn in self._states:
            for call in fn.kept:
                if not call.redundant:
                    continue
                outer = None
                parent = call.parent
                while parent is not None:
                    if parent.redundant:
                        outer = parent  # the outermost one is what a cache would skip
                    parent = parent.parent
                if outer is not None:
                    covered[fn] += fn.median_ns
                    inside[fn][outer.fn.name] += 1
        rows = []
        for fn in self._states:
            s = suggestions[fn]
            notes: list[str] = []
            if fn.dropped and fn.kept:
                notes.append(
                    f"only the first {len(fn.kept):,} calls were analysed ({fn.dropped:,} "
                    "more, over the profiler's budget, were counted only): the "
                    "redundant calls and the suggestion are theirs"
                )
            elif fn.dropped:
                notes.append(
                    f"its {fn.dropped:,} calls came after the profiler's budget of kept "
                    "calls was spent: counted, not analysed"
                )
            if fn.across_steps:
                notes.append(
                    f"{fn.across_steps:,} call(s) spanned a step change (a new step began "
                    "inside them): counted, not analysed"
                )
            if fn.cached:
                notes.append(
                    "already @stepcache.step_cached: its repeats are what its cache "
                    "serves (no suggestion)"
                )
            if fn.unbound:
                notes.append(
                    f"{fn.unbound} call(s) returned with arguments that do not bind to "
                    f"the signature {fn.signature}: not analysed"
                )
            rows.append(
                FunctionReport(
                    name=fn.name,
                    calls=fn.calls,
                    errors=fn.errors,
                    steps=len(fn.steps),
                    max_calls_per_step=fn.max_per_step,
                    total_ns=fn.total_ns,
                    identical=fn.repeats,
                    identical_ns=fn.repeats * fn.median_ns,
                    median_ns=fn.median_ns,
                    impure=fn.impure,
                    redundant=s.hits if s else 0,
                    redundant_ns=s.hit_ns if s else 0,
                    covered_ns=covered[fn],
                    inside=inside[fn].most_common(1)[0][0] if inside[fn] else None,
                    suggestion=s,
                    unbound=fn.unbound,
                    dropped=fn.dropped,
                    across_steps=fn.across_steps,
                    notes=tuple(notes),
                    equal_inputs=fn.equal_inputs,
                    equal_inputs_ns=fn.equal_inputs * fn.median_ns,
                    equal_copies=fn.equal_copies,
                    other_result=fn.other_result,
                )
            )
        # by time, then by counts and name: the rows without redundant calls (no time
        # to rank by) come in the same order in every run
        rows.sort(
            key=lambda r: (
                -r.uncovered_ns,
                -r.redundant_ns,
                -r.redundant,
                -r.calls,
                r.name,
            )
        )
        self._functions = tuple(rows)
        for fn in self._states:  # the calls are summarised: let them go
            fn.kept = []

    def _ready(self) -> tuple[FunctionReport, ...]:
        if self._functions is None:
            raise ProfilerError(
                "the report is complete when the `with stepcache.profile(...)` block "
                "ends; read it after the block"
            )
        return self._functions

    @property
    def functions(self) -> tuple[FunctionReport, ...]:
        """Every wrapped function that was called, most avoidable time first."""
        return tuple(r for r in self._ready() if r.calls)

    @property
    def redundant(self) -> tuple[FunctionReport, ...]:
        """The functions with redundant calls, most avoidable time first."""
        return tuple(r for r in self.functions if r.redundant)

    def __getitem__(self, name: str) -> FunctionReport:
        """A function's row, by its full name or a unique ending (``"Builders.build"``)."""
        rows = self._ready()
        for r in rows:
            if r.name == name:
                return r
        hits = [r for r in rows if r.name.endswith(("." + name, ":" + name))]
        if len(hits) == 1:
            return hits[0]
        if not hits:
            raise KeyError(f"no profiled function named {name!r}")
        raise KeyError(f"{name!r} is ambiguous: {', '.join(r.name for r in hits)}")

    def __iter__(self) -> Iterator[FunctionReport]:
        return iter(self.functions)

    def __len__(self) -> int:
        return len(self.functions)

    @property
    def steps(self) -> int:
        """Steps that had at least one call."""
        return self._recorder.steps_with_calls

    @property
    def calls(self) -> int:
        """Calls of the profiled functions (not of a ``step=`` function that is not a
        target: it is wrapped only to mark steps)."""
        return sum(fn.calls for fn in self._states)

    @property
    def overhead_ns(self) -> int:
        """The profiler's own time while the block ran (wrappers, fingerprints,
        digests, step bookkeeping), measured by the wrappers themselves."""
        return self._recorder.overhead_ns

    @property
    def overhead_per_call_ns(self) -> float:
        """Mean profiler cost per wrapped call (the step function's too)."""
        n = self._recorder.calls
        return self.overhead_ns / n if n else 0.0

    def to_dict(self) -> dict[str, Any]:
        """Plain data, for JSON."""
        return {
            "steps": self.steps,
            "calls": self.calls,
            "wall_ns": self.wall_ns,
            "overhead_ns": self.overhead_ns,
            "overhead_per_call_ns": round(self.overhead_per_call_ns, 1),
            "setup_ns": self.setup_ns,
            "analysis_ns": self.analysis_ns,
            "not_restored": list(self.not_restored),
            "fields": self.fields,
            "functions": [r.to_dict() for r in self.functions],
        }

    def to_json(self, indent: int | None = 2) -> str:
        """The report as JSON (durations in nanoseconds)."""
        return json.dumps(self.to_dict(), indent=indent, default=repr)

    def table(self, top: int | None = None) -> str:
        """The ranking as a table, then the suggestions for the top functions."""
        if top is not None and top < 0:
            raise ValueError(f"top must be at least 0 (got {top})")
        rows = self.functions
        lines = [self._headline()]
        if not rows:
            lines.append("no wrapped function was called")
            return "\n".join(lines)
        shown = rows if top is None else rows[:top]
        header: tuple[str, ...] = (
            "#",
            "function",
            "calls/step",
            "calls",
            "identical",
            "redundant",
            "redundant time",
            "of its calls",
            "inside",
        )
        if self.fields:  # before "inside": repeats of equal inputs, copies included
            extra = ("equal inputs", "copies", "other result", "needed")
            header = (*header[:8], *extra, header[8])
        body = []
        for i, r in enumerate(shown, 1):
            share = f"{100 * r.redundant / r.calls:.0f}%" if r.calls else "-"
            row: tuple[str, ...] = (
                str(i),
                r.name + (" *" if r.notes else ""),
                f"{r.calls_per_step:.1f}" if r.steps else "-",
                str(r.calls),
                str(r.identical),
                str(r.redundant),
                format_ns(r.redundant_ns) if r.redundant else "-",
                share if r.redundant else "-",
                _short(r.inside) if r.inside and r.uncovered_ns == 0 else "",
            )
            if self.fields:
                counts = (r.equal_inputs, r.equal_copies, r.other_result, r.needed)
                row = (*row[:8], *map(str, counts), row[8])
            body.append(row)
        widths = [
            max([len(h), *(len(b[i]) for b in body)]) for i, h in enumerate(header)
        ]
        left = {1, len(header) - 1}
        fmt = [
            "  ".join(
                c.ljust(w) if i in left else c.rjust(w)
                for i, (c, w) in enumerate(zip(row, widths, strict=True))
            ).rstrip()
            for row in (header, *body)
        ]
        lines += ["", fmt[0], "  ".join("-" * w for w in widths), *fmt[1:]]
        if top is not None and len(rows) > top:
            lines.append(f"... {len(rows) - top} more (report.table() shows all)")
        suggestions = [r for r in shown if r.suggestion and r.uncovered_ns > 0]
        if suggestions:
            lines += ["", "Suggestions (redundant calls not inside another's):"]
            for i, r in enumerate(suggestions, 1):
                lines += _suggestion_lines(i, r)
        noted = [r for r in shown if r.notes]
        if noted:
            lines += ["", "Notes (*):"]
            for r in noted:
                lines.append(f"- {r.name}")
                lines += [f"  {note}" for note in r.notes]
        return "\n".join(lines)

    def _headline(self) -> str:
        n = sum(1 for r in self._ready() if r.calls)
        return (
            f"stepcache profile: {self.steps} step(s), {self.calls:,} call(s) of {n} "
            f"function(s) in {format_ns(self.wall_ns)}; profiler overhead "
            f"{format_ns(self.overhead_ns)} ({format_ns(self.overhead_per_call_ns)} per "
            f"call, {self._share(self.overhead_ns)} of the run), "
            f"+{format_ns(self.setup_ns)} to wrap and restore, "
            f"+{format_ns(self.analysis_ns)} to analyse"
        )

    def _share(self, ns: int) -> str:
        return f"{100 * ns / self.wall_ns:.0f}%" if self.wall_ns else "-"

    def __str__(self) -> str:
        return self.table(top=15)

    def __repr__(self) -> str:
        if self._functions is None:
            return "<ProfileReport (profiling)>"
        return f"<ProfileReport: {self.steps} steps, {self.calls} calls, {len(self)} functions>"


def _short(name: str) -> str:
    return name.rpartition(":")[2] or name


def _suggestion_lines(i: int, r: FunctionReport) -> list[str]:
    s = r.suggestion
    assert s is not None
    per_step = r.redundant / r.steps if r.steps else 0.0
    kind = "identical arguments" if r.redundant == r.identical else "equal results"
    lines = [
        f"{i}. {r.name}",
        f"   {r.redundant} of {r.calls} calls ({per_step:.1f} per step) repeat an "
        f"earlier call of the same step ({kind}): {format_ns(r.redundant_ns)} "
        f"({format_ns(r.median_ns)} a call)",
        f"   owner: {s.owner or '-'}   key: {', '.join(s.key) or '-'}"
        + (f" (BYPASS when {s.bypass[0]} in {list(s.bypass[1])!r})" if s.bypass else "")
        + f"   depends_on: {', '.join(s.depends_on) or '-'}",
    ]
    lines += [f"   note: {note}" for note in s.notes]
    if s.decorator:
        lines.append(f"   {s.decorator}")
    return lines
