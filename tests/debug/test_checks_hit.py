# SPDX-License-Identifier: Apache-2.0
"""A checks-mode hit: the same hits for unchanged entries, and every behind-the-back
change caught, with its message."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import stepcache
from stepcache import Arg, Attr, StaleCacheError, TensorSpec, step_cached


class Meta:
    def __init__(self, small: torch.Tensor, big: torch.Tensor, n: int) -> None:
        self.small = small  # a small CPU tensor: its contents are re-read on a hit
        self.big = big  # too big to re-read: pointer, dtype and shape are compared
        self.num_actual_tokens = n

    @step_cached(
        ignore=("buffer",),
        depends_on=("small", "big", "num_actual_tokens"),
        expect=TensorSpec(
            device=Arg("buffer"),
            dtype=torch.int32,
            min_shape=(Attr("num_actual_tokens"),),
        ),
    )
    def rows(self, buffer: torch.Tensor) -> torch.Tensor:
        buffer[: self.num_actual_tokens].copy_(self.small.sum().to(torch.int32))
        return buffer[: self.num_actual_tokens]


def make() -> Meta:
    return Meta(torch.arange(6), torch.zeros(100_000), 4)


def test_unchanged_entry_hits_and_counts_hits(checks: None) -> None:
    md, buf = make(), torch.zeros(8, dtype=torch.int32)
    first = md.rows(buf)
    before = stepcache.stats()["Meta.rows"].hits
    assert all(md.rows(buf) is first for _ in range(5))
    assert stepcache.stats()["Meta.rows"].hits == before + 5
    assert type(first).__name__ == "GuardedTensor"
    assert len(stepcache.debug_report()) == 0


def _numpy_write(md: Meta) -> None:
    md.small.numpy()[2] = 40  # no version bump


def _data_swap_same_shape(md: Meta) -> None:
    md.big.data = torch.ones(100_000)  # new storage, same shape and dtype


def _data_swap_other_dtype(md: Meta) -> None:
    md.small.data = torch.arange(6, dtype=torch.int32)


def _data_swap_other_shape(md: Meta) -> None:
    md.big.data = torch.zeros(99_999)


CHANGES: dict[str, tuple[Callable[[Meta], None], str]] = {
    "numpy write": (_numpy_write, "dependency 'small' changed.*contents mismatch"),
    "data swap": (_data_swap_same_shape, "dependency 'big' changed"),
    "dtype swap": (_data_swap_other_dtype, "dependency 'small' changed"),
    "shape swap": (_data_swap_other_shape, "dependency 'big' changed"),
}


@pytest.mark.parametrize("change", sorted(CHANGES))
def test_changes_behind_the_version_counter_are_still_caught(
    checks: None, change: str, step_mode: str
) -> None:
    mutate, message = CHANGES[change]
    md, buf = make(), torch.zeros(8, dtype=torch.int32)
    md.rows(buf)
    md.rows(buf)  # a hit first
    mutate(md)
    if step_mode == "inference" and change != "numpy write":
        # an inference tensor is matched by its place, shape and dtype: any swap of
        # them is a plain invalidation, caught before debug mode looks
        assert md.rows(buf).tolist() == [int(md.small.sum())] * 4
        assert len(stepcache.debug_report()) == 0
        return
    with pytest.raises(StaleCacheError, match=message):
        md.rows(buf)
    assert stepcache.debug_report()[-1].kind == "dependency-changed"


def test_expect_failing_on_a_hit_reports_the_violation(checks: None) -> None:
    md, buf = make(), torch.zeros(8, dtype=torch.int32)
    md.rows(buf)
    other = torch.zeros(8, dtype=torch.int32, device="meta")
    with pytest.raises(stepcache.CacheValidationError, match="on a hit.*device"):
        md.rows(other)


def test_an_ignored_argument_found_changed_is_compared_once(checks: None) -> None:
    """Another buffer where the ignored one was: the hit computes again to compare,
    the value is the same, and the new buffer is remembered: later hits with it
    compute nothing."""

    class Rows:
        computed = 0

        @step_cached(ignore=("buffer",))
        def rows(self, buffer: torch.Tensor) -> int:
            Rows.computed += 1
            return 4

    r = Rows()
    first, second = torch.zeros(8), torch.zeros(8)
    assert r.rows(first) == 4 and r.rows(first) == 4
    assert Rows.computed == 1
    assert r.rows(second) == 4  # compared: computed again
    assert Rows.computed == 2
    assert all(r.rows(second) == 4 for _ in range(3))
    assert Rows.computed == 2
    assert len(stepcache.debug_report()) == 0


def test_watched_attributes_are_compared_on_each_hit(checks: None) -> None:
    class Reads:
        def __init__(self) -> None:
            self.scale = 2

        @step_cached()
        def value(self) -> int:
            return self.scale * 3

    r = Reads()
    assert r.value() == 6
    assert r.value() == 6
    r.scale = 5
    with pytest.raises(StaleCacheError, match="owner attribute 'scale'"):
        r.value()


@settings(max_examples=60, deadline=None)
@given(
    writes=st.lists(st.tuples(st.integers(0, 5), st.integers(-50, 50)), max_size=4),
    hits=st.integers(1, 3),
)
def test_checks_hit_is_stale_exactly_when_contents_changed(
    writes: list[tuple[int, int]], hits: int
) -> None:
    stepcache.clear_debug_report()
    with stepcache.debug("checks"):
        md, buf = make(), torch.zeros(8, dtype=torch.int32)
        md.rows(buf)
        for _ in range(hits):
            md.rows(buf)
        before = md.small.tolist()
        view = md.small.numpy()
        for i, v in writes:
            view[i] = v  # behind the version counter
        changed = md.small.tolist() != before
        if changed:
            with pytest.raises(StaleCacheError):
                md.rows(buf)
        else:
            assert md.rows(buf) is md.rows(buf)


def test_result_overwritten_after_a_hit_is_caught(
    checks: None, persistent: Callable[[torch.Tensor], torch.Tensor]
) -> None:
    md, buf = make(), persistent(torch.zeros(8, dtype=torch.int32))
    md.rows(buf)
    md.rows(buf)
    buf.fill_(7)  # the next step's build writes the same persistent buffer
    with pytest.raises(StaleCacheError, match="overwritten"):
        md.rows(buf)
    assert stepcache.debug_report()[-1].kind == "buffer-overwritten"
