# SPDX-License-Identifier: Apache-2.0
"""The compiled fast check of ``expect`` agrees with ``validate()``.

The rule: the fast check never passes a value that ``validate()`` rejects; for specs
written with plain values (a ``torch.device``, a dtype, int sizes, references to
tensors and ints) it passes every value ``validate()`` accepts, so valid stores do
not pay for the general path.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import stepcache
from stepcache import Arg, Attr, CacheValidationError, TensorSpec
from stepcache._spec import validate
from stepcache._speccheck import compile_check, inline_check

DTYPES = [torch.int32, torch.int64, torch.float32]


class Owner:
    rows = 3


def _resolver(a: tuple[Any, ...]) -> Any:
    def resolve(ref: Arg | Attr) -> Any:
        if isinstance(ref, Arg):
            return a[1]
        return getattr(a[0], ref.name)

    return resolve


def _valid(value: Any, spec: Any, a: tuple[Any, ...]) -> bool:
    try:
        validate(value, spec, _resolver(a), "")
    except CacheValidationError:
        return False
    return True


dims = st.one_of(
    st.none(), st.integers(0, 4), st.just(Attr("rows")), st.just(Arg("ref"))
)
specs = st.builds(
    TensorSpec,
    device=st.sampled_from([None, torch.device("cpu"), "cpu", Arg("ref"), "meta"]),
    dtype=st.sampled_from([None, *DTYPES, Arg("ref")]),
    ndim=st.one_of(st.none(), st.integers(0, 3)),
    shape=st.one_of(st.none(), st.lists(dims, max_size=3).map(tuple)),
    min_shape=st.one_of(st.none(), st.lists(dims, max_size=3).map(tuple)),
)
tensors = st.builds(
    lambda shape, dtype: torch.zeros(shape, dtype=dtype),
    st.lists(st.integers(0, 4), max_size=3),
    st.sampled_from(DTYPES),
)
values = st.one_of(tensors, st.just(None), st.just(3))
refs = st.one_of(tensors, st.integers(0, 4))


@settings(max_examples=400, deadline=None)
@given(spec=specs, value=values, ref=refs)
def test_fast_check_never_passes_an_invalid_value(
    spec: TensorSpec, value: Any, ref: Any
) -> None:
    quick = compile_check(spec, {"owner": 0, "ref": 1}, 0)
    a = (Owner(), ref)
    try:
        passed = quick(value, a)
    except Exception:
        passed = False  # the decorator then runs validate(), as for a False
    if passed:
        assert _valid(value, spec, a)


@settings(max_examples=300, deadline=None)
@given(
    value=tensors,
    ref=tensors,
    use_device=st.booleans(),
    dtype_from=st.sampled_from(["none", "const", "arg"]),
    with_ndim=st.booleans(),
    size_from=st.sampled_from(["none", "int", "attr", "arg"]),
    exact=st.booleans(),
)
def test_fast_check_passes_plain_valid_values(
    value: torch.Tensor,
    ref: torch.Tensor,
    use_device: bool,
    dtype_from: str,
    with_ndim: bool,
    size_from: str,
    exact: bool,
) -> None:
    # Specs a step-cached builder is written with, and references that are tensors
    # (a device, a dtype) or ints (a size): a valid value passes without validate().
    dim: Any = {
        "none": None,
        "int": int(value.shape[0]) if value.dim() else 0,
        "attr": Attr("rows"),
        "arg": None,
    }[size_from]
    sizes = (dim,) if value.dim() and dim is not None else None
    spec = TensorSpec(
        device=Arg("ref") if use_device else None,
        dtype={"none": None, "const": value.dtype, "arg": Arg("ref")}[dtype_from],
        ndim=value.dim() if with_ndim else None,
        shape=sizes if exact else None,
        min_shape=None if exact else sizes,
    )
    quick = compile_check(spec, {"owner": 0, "ref": 1}, 0)
    a = (Owner(), ref)
    if _valid(value, spec, a):
        assert quick(value, a)
    else:
        assert not quick(value, a)


def _inline_as_function(spec: Any, index_of: dict[str, int]) -> Any:
    """The lines of `inline_check` in the frame the generated miss gives them."""
    lines, consts = inline_check(spec, index_of, 0)
    body = "".join(f"            {line}\n" for line in lines)
    src = (
        "def check(_sc_val, a):\n"
        "    _sc_ok = False\n"
        "    try:\n"
        "        while True:\n"
        f"{body}"
        "    except Exception:\n"
        "        _sc_ok = False\n"
        "    return _sc_ok\n"
    )
    ns: dict[str, Any] = {
        "_sc_QC": consts,
        "_sc_Tensor": torch.Tensor,
        "_sc_device": torch.device,
    }
    exec(compile(src, "<inline check>", "exec"), ns)
    return ns["check"]


def _answer(check: Any, value: Any, a: tuple[Any, ...]) -> bool:
    try:
        return bool(check(value, a))
    except Exception:
        return False  # the decorator then runs validate(), as for a False


@settings(max_examples=400, deadline=None)
@given(
    spec=st.one_of(specs, st.lists(st.one_of(st.none(), specs), max_size=3).map(tuple)),
    value=st.one_of(values, st.lists(values, max_size=3).map(tuple)),
    ref=refs,
)
def test_the_check_written_into_the_miss_answers_as_the_compiled_one(
    spec: Any, value: Any, ref: Any
) -> None:
    index_of = {"owner": 0, "ref": 1}
    a = (Owner(), ref)
    inline = _inline_as_function(spec, index_of)
    assert _answer(inline, value, a) == _answer(
        compile_check(spec, index_of, 0), value, a
    )


def test_tuple_spec_checks_each_item_and_the_length() -> None:
    spec = (TensorSpec(dtype=torch.int32, ndim=2), None, TensorSpec(ndim=1))
    quick = compile_check(spec, {"owner": 0}, 0)
    good = (torch.zeros(2, 3, dtype=torch.int32), "anything", torch.zeros(4))
    assert quick(good, (None,))
    assert not quick(good[:2], (None,))
    assert not quick((torch.zeros(2, 3), "x", torch.zeros(4)), (None,))
    assert not quick(list(good), (None,))  # validate() decides for lists
    assert _valid(list(good), spec, (None,))


def test_attr_names_that_are_not_identifiers_are_read_with_getattr() -> None:
    owner = Owner()
    setattr(owner, "not-an-identifier", 2)
    quick = compile_check(
        TensorSpec(shape=(Attr("not-an-identifier"),)), {"owner": 0}, 0
    )
    assert quick(torch.zeros(2), (owner,))
    assert not quick(torch.zeros(3), (owner,))


def test_a_stored_value_failing_the_fast_check_gets_validates_message() -> None:
    class Meta:
        rows = 4

        @stepcache.step_cached(expect=TensorSpec(min_shape=(Attr("rows"),)))
        def index(self) -> torch.Tensor:
            return torch.zeros(3)

    with pytest.raises(CacheValidationError, match="size mismatch at index 0"):
        Meta().index()


def test_a_spec_needing_validates_general_path_still_accepts_valid_values() -> None:
    # "cpu" as a string and a size given by a tensor are left to validate()
    class Meta:
        @stepcache.step_cached(
            expect=TensorSpec(device="cpu", shape=(Arg("like"),)),
        )
        def rows(self, like: torch.Tensor) -> torch.Tensor:
            return torch.zeros(like.shape[0])

    assert Meta().rows(torch.zeros(5)).shape == (5,)
