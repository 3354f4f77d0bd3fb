# SPDX-License-Identifier: Apache-2.0
"""The miss (generated for each function) against a model, for any sequence of calls
and changes: every value equals a fresh computation, and the function runs exactly
when the model says the entry is missing or stale."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import stepcache
from stepcache import TensorSpec, step_cached


class Meta:
    def __init__(self) -> None:
        # persistent buffers (allocated before any step, outside inference mode)
        with torch.inference_mode(False):
            self.qsl = torch.tensor([0, 2, 3, 7])
            self.buf = torch.zeros(16, dtype=torch.int64)
        self.n = 3
        self.runs = 0

    @step_cached(
        key="k",
        depends_on=("qsl", "n"),
        expect=TensorSpec(dtype=torch.int64, ndim=1),
    )
    def scaled(self, k: int) -> torch.Tensor:
        self.runs += 1
        return self.qsl[: self.n] * k

    @step_cached(depends_on=("qsl",), guard_result=True)
    def into_buffer(self) -> torch.Tensor:
        # a view into a persistent buffer, as the request index is
        self.runs += 1
        m = self.qsl.numel()
        self.buf[:m].copy_(self.qsl.cumsum(0))
        return self.buf[:m]


def _same(
    was: tuple[torch.Tensor, int, int] | None, now: tuple[torch.Tensor, int, int]
) -> bool:
    """The same tensor object (not equal contents), and the same numbers."""
    return was is not None and was[0] is now[0] and was[1:] == now[1:]


def _fresh_scaled(md: Meta, k: int) -> list[int]:
    return (md.qsl[: md.n] * k).tolist()


OPS = st.lists(
    st.one_of(
        st.tuples(st.just("call"), st.integers(0, 3)),
        st.tuples(st.just("buffer"), st.just(0)),
        st.tuples(st.just("add_"), st.integers(1, 3)),  # in place: a version bump
        st.tuples(st.just("reassign"), st.integers(0, 5)),  # a new tensor object
        st.tuples(st.just("n"), st.integers(1, 4)),
        st.tuples(st.just("scribble"), st.integers(0, 9)),  # writes the buffer
    ),
    max_size=25,
)


@settings(max_examples=150, deadline=None)
@given(ops=OPS)
def test_every_value_is_fresh_and_runs_are_exactly_the_stale_ones(
    ops: list[tuple[str, int]],
) -> None:
    md = Meta()
    # the model: per key, the (qsl object, its version, n) the entry was made from
    made: dict[int, tuple[torch.Tensor, int, int]] = {}
    buffer_made: tuple[torch.Tensor, int, int] | None = None  # qsl, version, buf ver
    for op, x in ops:
        # a tensor made in a step under inference mode has no version counter: -1
        version = -1 if md.qsl.is_inference() else md.qsl._version
        if op == "call":
            before = md.runs
            assert md.scaled(x).tolist() == _fresh_scaled(md, x)
            stale = not _same(made.get(x), (md.qsl, version, md.n))
            assert md.runs - before == int(stale)
            made[x] = (md.qsl, version, md.n)
        elif op == "buffer":
            before = md.runs
            assert md.into_buffer().tolist() == md.qsl.cumsum(0).tolist()
            stale = not _same(buffer_made, (md.qsl, version, md.buf._version))
            assert md.runs - before == int(stale)
            buffer_made = (md.qsl, version, md.buf._version)
        elif op == "add_" and version >= 0:
            md.qsl.add_(x)  # in place on a persistent buffer: a version bump
        elif op == "add_":
            # no counter to bump (production cannot see this write): vLLM writes a
            # step's own tensors by making new ones
            md.qsl = md.qsl + x
        elif op == "reassign":
            md.qsl = torch.arange(x + 2) * 2  # made in the step, as vLLM's draft loop
        elif op == "n":
            md.n = x
        else:
            md.buf[x] = -1
    counts = stepcache.cache_of(md).stats()
    assert sum(c["misses"] for c in counts.values()) == md.runs
