# SPDX-License-Identifier: Apache-2.0
"""A `TensorSpec` argument of the wrong type is refused when the spec is made, with a
`StepCacheError` that names the field, what was got, what is expected and the fix."""

from __future__ import annotations

import re
from typing import Any

import pytest
import torch

from stepcache import (
    Arg,
    Attr,
    CacheValidationError,
    StepCacheError,
    TensorSpec,
    step_cached,
)


def refused(**fields: Any) -> str:
    with pytest.raises(StepCacheError) as info:
        TensorSpec(**fields)
    assert type(info.value) is StepCacheError
    return str(info.value)


@pytest.mark.parametrize("name", ["shape", "min_shape"])
def test_dims_that_are_not_a_tuple(name: str) -> None:
    assert refused(**{name: 5}) == (
        f"TensorSpec {name} must be a tuple of int, None, Arg or Attr (got 5 that is "
        f"a <class 'int'>). Fix: a tuple with one entry per leading dim, e.g. "
        f"{name}=(5,)"
    )
    assert f"e.g. {name}=(Attr('n'),)" in refused(**{name: "n"})
    assert f"TensorSpec {name} must be" in refused(**{name: 2.0})


@pytest.mark.parametrize("name", ["shape", "min_shape"])
def test_dim_entries_of_the_wrong_type(name: str) -> None:
    assert refused(**{name: (4, "n")}) == (
        f"TensorSpec {name}[1] must be an int, None, Arg or Attr (got 'n' that is a "
        "<class 'str'>). Fix: Attr('n') for the owner's attribute, Arg('n') for an "
        "argument"
    )
    assert "Fix: an int size, None to skip" in refused(**{name: (True,)})
    assert "Fix: an int size, None to skip" in refused(**{name: (2.0,)})
    text = refused(**{name: (None, -1)})
    assert text.startswith(f"TensorSpec {name}[1] must be a size >= 0 (got -1")
    assert text.endswith("Fix: None skips a dim")


def test_dims_from_any_iterable_are_kept_as_a_tuple() -> None:
    spec = TensorSpec(shape=[2, None], min_shape=torch.Size([1]))  # type: ignore[arg-type]
    assert spec.shape == (2, None) and spec.min_shape == (1,)


def test_ndim_that_is_not_an_int() -> None:
    assert refused(ndim="2") == (
        "TensorSpec ndim must be an int >= 0 or None (got '2' that is a <class "
        "'str'>). Fix: ndim=2"
    )
    assert "(got True that is a <class 'bool'>)" in refused(ndim=True)
    assert "(got -1 that is a <class 'int'>)" in refused(ndim=-1)
    assert TensorSpec(ndim=0).ndim == 0


def test_device_of_the_wrong_type() -> None:
    assert refused(device=0) == (
        "TensorSpec device must be a str, torch.device, Arg, Attr or None (got 0 that "
        "is a <class 'int'>). Fix: device='cuda:0' (an int is not taken as a device "
        "here)"
    )
    assert "Fix: a device such as 'cpu'" in refused(device=torch.float32)


def test_a_device_string_torch_does_not_know() -> None:
    text = refused(device="gpu:zero")
    assert text.startswith("TensorSpec device 'gpu:zero' is not a device torch knows (")
    assert text.endswith("). Fix: a device string such as 'cpu', 'cuda' or 'cuda:1'")
    assert "\n" not in text


def test_dtype_of_the_wrong_type() -> None:
    assert refused(dtype="int32") == (
        "TensorSpec dtype must be a torch.dtype, Arg, Attr or None (got 'int32' that "
        "is a <class 'str'>). Fix: dtype=torch.int32"
    )
    assert "Fix: a dtype such as torch.int32" in refused(dtype=int)


def test_well_typed_specs_are_accepted() -> None:
    spec = TensorSpec(
        device=torch.device("cpu"), dtype=Arg("buf"), ndim=1, shape=(Attr("n"),)
    )
    assert spec.refs() == [Arg("buf"), Attr("n")]
    assert TensorSpec(device="cuda:1", min_shape=()).min_shape == ()


class Meta:
    n: Any = 3

    @step_cached(expect=TensorSpec(device=Attr("n")))
    def value(self) -> torch.Tensor:
        return torch.zeros(2)


def test_an_int_device_from_a_reference_is_explained() -> None:
    message = (
        "expected cuda:3 (from owner attribute 'n', the int 3 read as a CUDA device "
        "index), actual cpu"
    )
    with pytest.raises(CacheValidationError, match=re.escape(message)):
        Meta().value()


def test_a_device_from_a_reference_that_is_not_an_int_keeps_its_label() -> None:
    m = Meta()
    m.n = "cuda:2"
    with pytest.raises(CacheValidationError) as info:
        m.value()
    assert "expected cuda:2 (from owner attribute 'n'), actual cpu" in str(info.value)
    m2 = Meta()
    m2.n = "cpu"
    assert m2.value().device.type == "cpu"
