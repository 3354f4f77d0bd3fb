# SPDX-License-Identifier: Apache-2.0
"""Copies of an owner never see an entry computed for the original unless every
declared dependency is identical on the copy; reused ids never match old entries."""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import attrs
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import stepcache
from stepcache import step_cached

calls: list[str] = []


def _index(self: Any) -> list[int]:
    calls.append("index")
    lens = self.qsl.diff().tolist()
    return [i for i, n in enumerate(lens) for _ in range(n)] + [0] * (
        self.num_tokens - sum(lens)
    )


@dataclasses.dataclass
class DC:
    qsl: torch.Tensor
    num_tokens: int
    other: int = 0

    index = step_cached(depends_on=("qsl", "num_tokens"), name="copies.dc.index")(
        _index
    )
    bound = step_cached(name="copies.dc.bound")(_index)


@attrs.define
class ATF:
    """A slotted attrs class that declares the store field (no side table)."""

    qsl: torch.Tensor
    num_tokens: int
    other: int = 0
    _stepcache: stepcache.StepCache | None = stepcache.cache_field()

    index = step_cached(depends_on=("qsl", "num_tokens"), name="copies.atf.index")(
        _index
    )
    bound = step_cached(name="copies.atf.bound")(_index)


def reference(qsl: torch.Tensor, num_tokens: int) -> list[int]:
    lens = qsl.diff().tolist()
    out = [i for i, n in enumerate(lens) for _ in range(n)]
    return out + [0] * (num_tokens - len(out))


CHANGES = {
    "dataclasses.replace": lambda o, **kw: dataclasses.replace(o, **kw),
    "attrs.evolve": lambda o, **kw: attrs.evolve(o, **kw),
}


def _copy_then_set(o: Any, **kw: Any) -> Any:
    c = copy.copy(o)
    for k, v in kw.items():
        setattr(c, k, v)
    return c


@pytest.mark.parametrize("cls", [DC, ATF])
@pytest.mark.parametrize("method", ["index", "bound"])
@pytest.mark.parametrize("how", ["replace", "copy"])
def test_copy_with_changed_qsl_recomputes(cls: type, method: str, how: str) -> None:
    orig = cls(torch.tensor([0, 2, 3]), 3)
    getattr(orig, method)()
    new_qsl = torch.tensor([0, 1, 3])
    if how == "copy":
        twin = _copy_then_set(orig, qsl=new_qsl)
    else:
        twin = (dataclasses.replace if cls is DC else attrs.evolve)(orig, qsl=new_qsl)
        assert len(stepcache.cache_of(twin)) == 0, (
            "replace/evolve never carry the store"
        )
    assert getattr(twin, method)() == [0, 1, 1]
    assert getattr(orig, method)() == [0, 0, 1]


@pytest.mark.parametrize("cls", [DC, ATF])
def test_copy_with_identical_deps_shares_dep_entries_only(cls: type) -> None:
    orig = cls(torch.tensor([0, 2, 3]), 3)
    calls.clear()
    shared, bound = orig.index(), orig.bound()
    twin = copy.copy(orig)
    twin.other = 5  # not a dependency
    bound_again = twin.bound()
    assert bound_again == bound and bound_again is not bound
    # copy.copy carries the store (in __dict__ or the declared slot): the dep-checked
    # entry is shared
    assert twin.index() is shared
    assert calls == ["index", "index", "index"]
    assert orig.bound() is bound


@pytest.mark.parametrize("cls", [DC, ATF])
def test_deepcopy_starts_empty(cls: type) -> None:
    orig = cls(torch.tensor([0, 2, 3]), 3)
    orig.index()
    twin = copy.deepcopy(orig)
    assert len(stepcache.cache_of(twin)) == 0
    assert twin.index() == orig.index()


def test_reused_id_never_matches_an_old_entry() -> None:
    # Free an owner while a copy keeps its store alive, then make new owners that reach
    # that store (the worst case: a carried store) until one lands at the freed address.
    # The entry bound to the dead owner must never answer for the newcomer.
    reused = 0
    for i in range(2000):  # until the allocator has reused an address a few times
        if reused >= 3:
            break
        a = DC(torch.tensor([0, 1]), 1, other=i)
        a.bound()
        b = copy.copy(a)  # b carries a's store
        addr = id(a)
        del a
        made = []  # new owners, until one lands at the freed address
        for _ in range(50):
            made.append(DC(torch.tensor([0, 2]), 2, other=i))
            if id(made[-1]) == addr:
                break
        c = made[-1]
        c.__dict__["_stepcache"] = b.__dict__["_stepcache"]
        reused += id(c) == addr
        assert c.bound() == [0, 0]
    assert reused > 0, "the allocator never reused an address; the test proved nothing"


qsl_strategy = st.lists(st.integers(0, 5), min_size=0, max_size=6).map(
    lambda lens: torch.tensor(
        [0, *torch.tensor(lens, dtype=torch.long).cumsum(0).tolist()]
    )
)


@settings(max_examples=60, deadline=None)
@given(
    first=qsl_strategy,
    second=qsl_strategy,
    pad=st.integers(0, 3),
    how=st.sampled_from(["replace", "evolve", "copy", "inplace", "setattr"]),
)
def test_any_change_of_a_dependency_never_returns_the_old_rows(
    first: torch.Tensor, second: torch.Tensor, pad: int, how: str
) -> None:
    cls = ATF if how == "evolve" else DC
    n1 = int(first[-1]) + pad
    n2 = int(second[-1]) + pad
    # an in-place write goes to a persistent buffer, made outside inference mode as
    # vLLM's are (an in-place write to an inference tensor is not seen, by design)
    with torch.inference_mode(
        False if how == "inplace" else torch.is_inference_mode_enabled()
    ):
        owner = cls(first.clone(), n1)
    assert owner.index() == reference(first, n1)
    if how == "replace":
        new = dataclasses.replace(owner, qsl=second.clone(), num_tokens=n2)
    elif how == "evolve":
        new = attrs.evolve(owner, qsl=second.clone(), num_tokens=n2)
    elif how == "copy":
        new = _copy_then_set(owner, qsl=second.clone(), num_tokens=n2)
    elif how == "setattr":
        new = owner
        new.qsl, new.num_tokens = second.clone(), n2
    else:
        new = owner
        if owner.qsl.shape == second.shape:
            new.qsl.copy_(second)
        else:
            new.qsl.resize_(second.shape).copy_(second)
        new.num_tokens = n2
    assert new.index() == reference(second, n2)


@dataclasses.dataclass
class Saved:
    qsl: torch.Tensor

    @step_cached(depends_on=("qsl",), name="copies.saved")
    def lens(self) -> torch.Tensor:
        return self.qsl.diff()


def test_a_saved_owner_loads_with_an_empty_store_once_allowlisted() -> None:
    import io

    md = Saved(torch.tensor([0, 2, 5]))
    md.lens()
    saved = io.BytesIO()
    torch.save(md, saved)
    with torch.serialization.safe_globals([Saved]):
        saved.seek(0)
        with pytest.raises(Exception, match="StepCache"):  # torch names what to allow
            torch.load(saved, weights_only=True)
    with torch.serialization.safe_globals([Saved, stepcache.StepCache]):
        saved.seek(0)
        loaded = torch.load(saved, weights_only=True)
    assert len(stepcache.cache_of(loaded)) == 0
    assert loaded.lens().tolist() == [2, 3]
    assert stepcache.stats()["copies.saved"].misses == 2
