# SPDX-License-Identifier: Apache-2.0
"""Debug mode: validation on every hit, misdeclarations, the report, and no false
positives over a long run of correct steps."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import io
import pickle
import random
from collections.abc import Callable

import numpy as np
import pytest
import torch

import stepcache
from stepcache import (
    Arg,
    Attr,
    CacheValidationError,
    StaleCacheError,
    TensorSpec,
    step_cached,
)


@dataclasses.dataclass
class Meta:
    query_start_loc: torch.Tensor
    num_actual_tokens: int

    @step_cached(
        ignore=("buffer",),
        depends_on=("query_start_loc", "num_actual_tokens"),
        expect=TensorSpec(
            device=Arg("buffer"),
            dtype=torch.int32,
            min_shape=(Attr("num_actual_tokens"),),
        ),
    )
    def index(self, buffer: torch.Tensor) -> torch.Tensor:
        lens = self.query_start_loc.diff()
        idx = torch.repeat_interleave(
            torch.arange(lens.numel(), dtype=torch.int32), lens
        )
        n = self.num_actual_tokens
        buffer[: idx.numel()].copy_(idx)
        buffer[idx.numel() : n].zero_()
        return buffer[:n]

    @step_cached(
        key=lambda self, kind, rows: (kind, rows), depends_on=("query_start_loc",)
    )
    def sparse(self, kind: str, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
        base = torch.arange(rows) + int(self.query_start_loc[-1])
        return base * (128 if kind == "c128a" else 1), base


def make(lens: list[int], pad: int = 0) -> Meta:
    qsl = torch.tensor([0, *np.cumsum(lens).tolist()], dtype=torch.int32)
    return Meta(qsl, int(qsl[-1]) + pad)


def test_expect_is_validated_on_every_hit_in_checks_mode(
    checks: None, persistent: Callable[[torch.Tensor], torch.Tensor]
) -> None:
    md = make([2, 2])
    buf = persistent(torch.zeros(8, dtype=torch.int32))
    md.index(buf)
    cached = stepcache.cache_of(md)
    ((_, entry),) = list(cached.entries())
    with torch.inference_mode(False):  # dtype changed behind our back
        entry.value.data = torch.zeros(4, dtype=torch.int64)
    with pytest.raises(
        CacheValidationError,
        match=r"on a hit.*dtype mismatch. expected torch.int32, actual torch.int64",
    ):
        md.index(buf)
    assert stepcache.debug_report()[-1].kind == "validation"


def test_builder_that_mutates_its_declared_dependency_is_reported(checks: None) -> None:
    @step_cached(owner="md", depends_on=("buffer",))
    def bad(md: Meta, buffer: torch.Tensor) -> torch.Tensor:
        buffer.add_(1)
        return buffer

    with pytest.raises(
        StaleCacheError,
        match=r"changed its declared dependency 'buffer'.*expect=TensorSpec",
    ):
        bad(make([1]), torch.zeros(2))


def test_key_function_reading_an_undeclared_attribute_is_reported(checks: None) -> None:
    @step_cached(
        key=lambda md: md.num_actual_tokens, owner="md", depends_on=("query_start_loc",)
    )
    def f(md: Meta) -> int:
        return 1

    with pytest.raises(
        StaleCacheError,
        match=r"key function reads owner attribute\(s\) \['num_actual_tokens'\]",
    ):
        f(make([2]))


def test_report_collects_and_renders_detections(checks: None) -> None:
    md = make([2])
    value = md.index(torch.zeros(4, dtype=torch.int32))
    stepcache.cache_of(md).close()
    with pytest.raises(StaleCacheError):
        value.sum()
    report = stepcache.debug_report()
    assert len(report) == 1 and report[0].kind == "use-after-close"
    assert report[0].function == "Meta.index"
    text = str(report)
    assert (
        text.startswith("stepcache debug report: 1 detection(s)")
        and "[use-after-close]" in text
    )
    stepcache.clear_debug_report()
    assert str(stepcache.debug_report()) == "stepcache debug report: nothing detected"


def test_guarded_values_behave_like_tensors(checks: None) -> None:
    md = make([1, 2])
    buf = torch.zeros(8, dtype=torch.int32)
    value = md.index(buf)
    assert isinstance(value, stepcache.GuardedTensor) and isinstance(
        value, torch.Tensor
    )
    assert (value + 1).tolist() == [1, 2, 2]
    assert type(value + 1) is torch.Tensor
    assert torch.equal(value, torch.tensor([0, 1, 1], dtype=torch.int32))
    assert value.data_ptr() == buf.data_ptr()


def test_production_mode_hands_out_plain_tensors() -> None:
    md = make([1, 2])
    assert type(md.index(torch.zeros(8, dtype=torch.int32))) is torch.Tensor


def _long_run(mode: str, steps: int, seed: int) -> None:
    rng = random.Random(seed)
    buffers = [torch.zeros(64, dtype=torch.int32) for _ in range(3)]
    for _ in range(steps):
        lens = [rng.randint(0, 6) for _ in range(rng.randint(1, 6))]
        md = make(lens, pad=rng.choice([0, 0, 3]))
        twin = dataclasses.replace(md, num_actual_tokens=md.num_actual_tokens)
        stepcache.attach(twin, stepcache.cache_of(md))
        expected = md.index(torch.zeros(64, dtype=torch.int32)).clone()
        for layer in range(6):
            owner = twin if layer % 2 else md
            got = owner.index(buffers[layer % 3])
            assert torch.equal(got, expected)
            kind = rng.choice(["swa_only", "c128a"])
            rows = rng.choice([4, 8])
            a, b = owner.sparse(kind, rows)
            assert a.shape == (rows,) and b.shape == (rows,)
        if rng.random() < 0.3:  # a draft step: reassign on the same object
            md.query_start_loc = md.query_start_loc.clone()
            md.index(buffers[0])
        if rng.random() < 0.5:
            stepcache.cache_of(md).close()


@pytest.mark.parametrize("mode", ["checks", "verify"])
def test_no_false_positives_over_a_long_run_of_correct_steps(mode: str) -> None:
    stepcache.clear_debug_report()
    with stepcache.debug(mode):
        _long_run(mode, steps=150, seed=7)
    assert len(stepcache.debug_report()) == 0, str(stepcache.debug_report())


@pytest.mark.parametrize("mode", ["off", "checks", "verify"])
def test_a_guarded_entry_rewritten_with_equal_rows_by_verify_stays_a_hit(
    mode: str, persistent: Callable[[torch.Tensor], torch.Tensor]
) -> None:
    # verify recomputes on every hit, here into the cached rows' own buffer: equal
    # rows leave the entry valid, so the cache behaves as in the other modes
    class Rows:
        @step_cached(guard_result=True, ignore=("buf",), name="test.guarded_rows")
        def rows(self, buf: torch.Tensor) -> torch.Tensor:
            buf[:2] = torch.tensor([1, 2], dtype=buf.dtype)
            return buf[:2]

    buf = persistent(torch.zeros(4, dtype=torch.int64))
    owner = Rows()
    with stepcache.debug(mode):
        served = [owner.rows(buf).tolist() for _ in range(4)]
    assert served == [[1, 2]] * 4
    counts = stepcache.cache_of(owner).stats()["test.guarded_rows"]
    assert (counts["misses"], counts["invalidations"]) == (1, 0)


def test_report_counts_detections_past_the_kept_maximum(
    monkeypatch: pytest.MonkeyPatch, checks: None
) -> None:
    from stepcache import _debug

    monkeypatch.setattr(_debug, "_MAX_REPORT", 2)
    for _ in range(3):
        md = make([2])
        value = md.index(torch.zeros(4, dtype=torch.int32))
        stepcache.cache_of(md).close()
        with pytest.raises(StaleCacheError):
            value.sum()
    report = stepcache.debug_report()
    assert (len(report), report.total, report.dropped) == (2, 3, 1)
    assert "(1 more not kept)" in str(report)
    stepcache.clear_debug_report()
    assert stepcache.debug_report().total == 0


@pytest.mark.parametrize("mode", ["checks", "verify"])
def test_a_guarded_inference_result_written_in_place_is_caught(mode: str) -> None:
    # a persistent buffer made under inference mode has no version counter: the
    # second owner's build rewrites the rows the first owner's entry still shows
    class Rows:
        def __init__(self, first: int) -> None:
            self.first = first

        @step_cached(
            guard_result=True,
            depends_on=("first",),
            ignore=("buf",),
            name="test.inf_rows",
        )
        def rows(self, buf: torch.Tensor) -> torch.Tensor:
            buf[:2] = torch.tensor([self.first, self.first + 1], dtype=buf.dtype)
            return buf[:2]

    with torch.inference_mode():
        buf = torch.zeros(4, dtype=torch.int64)
    a, b = Rows(1), Rows(3)
    stepcache.clear_debug_report()
    with stepcache.debug(mode), torch.inference_mode():
        assert a.rows(buf).tolist() == [1, 2]
        assert b.rows(buf).tolist() == [3, 4]
        with pytest.raises(StaleCacheError, match="contents written in place"):
            a.rows(buf)
    assert [d.kind for d in stepcache.debug_report()] == ["buffer-overwritten"]
    with torch.inference_mode():  # verify did not recompute a's rows into buf
        assert b.rows(buf).tolist() == [3, 4]


def test_a_copied_owner_s_guarded_values_watch_the_store_they_came_from(
    checks: None,
) -> None:
    # a copy's hit reads the store it carried, as production's does: what it hands
    # out are the original's entries, which end with the original's step
    md, buffer = make([2, 1]), torch.zeros(8, dtype=torch.int32)
    md.index(buffer)
    twin = copy.copy(md)
    served = twin.index(buffer)  # md's entry, from the store the copy carried
    assert stepcache.stats()["Meta.index"].misses == 1
    assert (served + 1).tolist() == [1, 1, 2]
    original = stepcache.cache_of(md)
    original.close()  # the original's step ends
    with pytest.raises(StaleCacheError, match="closed"):
        served + 1
    again = twin.index(buffer)  # the copy's own store now: computed again
    assert stepcache.cache_of(twin) is not original
    assert (again + 1).tolist() == [1, 1, 2]


def test_a_bypassed_call_on_a_closed_store_is_caught(checks: None) -> None:
    @step_cached(key=lambda md: stepcache.BYPASS, name="test.closed_bypass")
    def value(md: Meta) -> int:
        return 1

    md = make([1])
    stepcache.cache_of(md).close()
    with pytest.raises(StaleCacheError, match="closed"):
        value(md)
    assert [d.kind for d in stepcache.debug_report()] == ["use-after-close"]


@pytest.mark.parametrize("mode", ["off", "checks", "verify"])
def test_a_bypassed_call_leaves_the_owner_as_production_does(mode: str) -> None:
    @step_cached(key=lambda md: stepcache.BYPASS, name="test.bypass_no_store")
    def value(md: Meta) -> int:
        return 1

    stepcache.clear_debug_report()
    md = make([1])
    before = dict(vars(md))
    with stepcache.debug(mode) if mode != "off" else contextlib.nullcontext():
        assert value(md) == 1
    assert vars(md) == before  # no store made for a call that does not cache
    assert stepcache.debug_report().total == 0


def test_an_inference_dependency_written_in_place_gets_its_own_fix(
    checks: None,
) -> None:
    with torch.inference_mode():
        md = make([2, 1])
    md.index(torch.zeros(8, dtype=torch.int32))
    with torch.inference_mode():
        md.query_start_loc[1] = 1
    with pytest.raises(
        StaleCacheError, match="It is an inference tensor .* assign a new"
    ):
        md.index(torch.zeros(8, dtype=torch.int32))


def test_a_list_dependency_is_shown_as_written(checks: None) -> None:
    class Lens:
        def __init__(self) -> None:
            self.lens = [3, 5]

        @step_cached(depends_on=("lens",), name="test.list_shown")
        def total(self) -> int:
            self.lens[0] += 1  # BUG: the builder writes its own dependency
            return sum(self.lens)

    with pytest.raises(
        StaleCacheError, match=r"\(expected \[3, 5\], actual \[4, 5\]\)"
    ):
        Lens().total()


@dataclasses.dataclass
class _Built:
    lens: torch.Tensor
    longest: int


class _Plan:  # an object compared by identity, as a kernel plan often is
    def __init__(self, lens: list[int]) -> None:
        self.lens, self.itself = lens, self


@dataclasses.dataclass
class _Stamped:
    lens: torch.Tensor
    made: list[int] = dataclasses.field(default_factory=list, compare=False)


_stamps: list[int] = []


def _stamped(qsl: torch.Tensor) -> _Stamped:
    _stamps.append(1)
    return _Stamped(qsl.diff(), list(_stamps))  # == leaves out when it was made


# results that equal a fresh computation by value, though == cannot say so
EQUAL_RESULTS: dict[str, Callable[[torch.Tensor], object]] = {
    "dataclass of tensors": lambda qsl: _Built(qsl.diff(), int(qsl.diff().max())),
    "object without ==": lambda qsl: _Plan(qsl.diff().tolist()),
    "float NaN in a tuple": lambda qsl: (qsl.diff(), float("nan")),
    "array of strings": lambda qsl: np.array([str(n) for n in qsl.tolist()]),
    "a field == leaves out": _stamped,
}


@pytest.mark.parametrize("build", list(EQUAL_RESULTS.values()), ids=list(EQUAL_RESULTS))
def test_verify_compares_results_by_value(
    verify: None, build: Callable[[torch.Tensor], object]
) -> None:
    class Step:
        qsl = torch.tensor([0, 2, 5])

        @step_cached(depends_on=("qsl",), name="test.equal_result")
        def value(self) -> object:
            return build(self.qsl)

    s = Step()
    assert s.value() is s.value()
    assert stepcache.debug_report().total == 0


def test_verify_names_the_field_that_differs(verify: None) -> None:
    calls: list[int] = []

    class Step:
        qsl = torch.tensor([0, 2, 5])

        @step_cached(name="test.field_differs")  # BUG: depends on calls, undeclared
        def value(self) -> _Built:
            calls.append(1)
            return _Built(self.qsl.diff() * len(calls), 3)

    s = Step()
    s.value()
    with pytest.raises(StaleCacheError, match=r"'result\.lens' value mismatch"):
        s.value()


def _pickled(x: object) -> object:
    return pickle.loads(pickle.dumps(x))


def _saved(x: object) -> object:
    buffer = io.BytesIO()
    torch.save(x, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


COPIES: dict[str, Callable[[object], object]] = {
    "copy.copy": copy.copy,
    "copy.deepcopy": copy.deepcopy,
    "pickle": _pickled,
    "torch.save": _saved,
}


@pytest.mark.parametrize("mode", ["off", "checks"])
@pytest.mark.parametrize("take", list(COPIES.values()), ids=list(COPIES))
def test_a_handed_out_value_copies_as_in_production(
    mode: str, take: Callable[[object], object]
) -> None:
    stepcache.clear_debug_report()
    with stepcache.debug(mode) if mode != "off" else contextlib.nullcontext():
        md = make([2, 1])
        rows = md.index(torch.zeros(8, dtype=torch.int32))
        copied = take(rows)
        assert type(copied) is torch.Tensor and copied.tolist() == rows.tolist()
        assert (copied + 1).tolist() == [1, 1, 2]  # a copy is nobody's cache
        assert stepcache.debug_report().total == 0
        stepcache.cache_of(md).close()
        if mode == "checks":  # a copy taken too late is a use after close
            with pytest.raises(StaleCacheError, match="closed"):
                take(rows)


def test_misses_in_two_threads_leave_the_owner_class_as_it_was(checks: None) -> None:
    import threading

    second_in, first_done = threading.Event(), threading.Event()

    class Step:
        def __init__(self, name: str) -> None:
            self.name, self.qsl = name, torch.tensor([0, 2, 5])

        @step_cached(depends_on=("qsl",), name="test.two_threads")
        def lens(self) -> torch.Tensor:
            if self.name == "first":
                second_in.wait(10)  # the second miss starts meanwhile
            else:
                second_in.set()
                first_done.wait(10)  # and ends after the first
            return self.qsl.diff() + self.undeclared

        undeclared = 0

    inference = torch.is_inference_mode_enabled()  # thread-local: passed on

    def miss(step: Step) -> None:
        with torch.inference_mode(inference):
            step.lens()

    first, second = Step("first"), Step("second")
    t1 = threading.Thread(target=miss, args=(first,))
    t1.start()
    t2 = threading.Thread(target=miss, args=(second,))
    t2.start()
    t1.join(10)
    first_done.set()
    t2.join(10)
    assert "__getattribute__" not in Step.__dict__  # no recording patch left behind
    first.undeclared = 1  # each miss recorded its own owner's reads
    with pytest.raises(StaleCacheError, match="undeclared"):
        first.lens()


class _Node:
    def __init__(self, v: int) -> None:
        self.v = v


def _loop(v: int) -> _Node:
    node = _Node(v)
    node.nxt = node  # type: ignore[attr-defined]
    return node


def test_first_difference_sees_past_cycles_and_extra_attributes() -> None:
    from stepcache._debug import first_difference

    other = _Node(1)
    other.nxt = _loop(2)  # type: ignore[attr-defined]
    assert first_difference(_loop(1), other) == "'result.nxt.v': expected 1, actual 2"
    assert first_difference(_loop(1), _loop(1)) is None
    extra = _Node(1)
    extra.more = 3  # type: ignore[attr-defined]
    assert "fields mismatch" in str(first_difference(_Node(1), extra))
