# SPDX-License-Identifier: Apache-2.0
"""TensorSpec validation through `expect`, and device normalisation."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch

import stepcache
from stepcache import (
    Arg,
    Attr,
    CacheValidationError,
    StepCacheError,
    TensorSpec,
    _spec,
    step_cached,
)


class Meta:
    def __init__(self, n: int) -> None:
        self.num_actual_tokens = n
        self.dtype = torch.int32

    @step_cached(
        ignore=("buffer",),
        key="rows",
        expect=TensorSpec(
            device=Arg("buffer"),
            dtype=torch.int32,
            ndim=1,
            min_shape=(Attr("num_actual_tokens"),),
        ),
    )
    def index(self, buffer: torch.Tensor, rows: int) -> torch.Tensor:
        return buffer[:rows]

    @step_cached(
        ignore=("a", "b", "c"),
        expect=(TensorSpec(shape=(2, None)), None, TensorSpec(dtype=Attr("dtype"))),
    )
    def triple(self, a: torch.Tensor, b: object, c: torch.Tensor) -> tuple[object, ...]:
        return (a, b, c)


def test_valid_values_pass() -> None:
    m = Meta(4)
    buf = torch.zeros(8, dtype=torch.int32)
    assert m.index(buf, 5).shape == (5,)
    m.triple(torch.zeros(2, 7), "anything", torch.zeros(1, dtype=torch.int32))


@pytest.mark.parametrize(
    ("buffer", "rows", "message"),
    [
        (torch.zeros(8, dtype=torch.int64), 5, "dtype mismatch. expected torch.int32"),
        (
            torch.zeros(8, dtype=torch.int32),
            3,
            r"size mismatch at index 0. expected at least 4 \(from owner attribute 'num_actual_tokens'\), actual 3",
        ),
        (
            torch.zeros(8, 2, dtype=torch.int32),
            5,
            "ndim mismatch. expected 1, actual 2",
        ),
    ],
)
def test_violations_name_what_was_expected(
    buffer: torch.Tensor, rows: int, message: str
) -> None:
    m = Meta(4)
    with pytest.raises(CacheValidationError, match=message) as info:
        m.index(buffer, rows)
    assert "Meta.index" in str(info.value) and f"key={rows}" in str(info.value)
    assert len(stepcache.cache_of(m)) == 0, "an invalid value must not be cached"


def test_tuple_specs_check_each_item() -> None:
    m = Meta(1)
    with pytest.raises(
        CacheValidationError, match=r"result\[0\] size mismatch at index 0. expected 2"
    ):
        m.triple(torch.zeros(3, 7), None, torch.zeros(1, dtype=torch.int32))
    with pytest.raises(CacheValidationError, match=r"result\[2\] dtype mismatch"):
        m.triple(torch.zeros(2, 7), None, torch.zeros(1))


def test_validation_error_is_an_assertion_error_that_survives_dash_o() -> None:
    import subprocess
    import sys

    code = (
        "import torch, stepcache\n"
        "class M:\n"
        "    @stepcache.step_cached(expect=stepcache.TensorSpec(dtype=torch.int32))\n"
        "    def f(self): return torch.zeros(1)\n"
        "try:\n"
        "    M().f()\n"
        "except AssertionError as e:\n"
        "    print('caught', type(e).__name__)\n"
    )
    out = subprocess.run(
        [sys.executable, "-O", "-c", code], capture_output=True, text=True, timeout=120
    )
    assert out.stdout.strip() == "caught CacheValidationError"


@pytest.fixture
def fake_current_cuda(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(_spec, "_current_index", lambda device_type: 1)
    yield


def test_cuda_and_cuda_index_of_the_current_device_are_the_same(
    fake_current_cuda: None,
) -> None:
    assert stepcache.normalize_device("cuda") == torch.device("cuda", 1)
    assert stepcache.normalize_device("cuda") == stepcache.normalize_device("cuda:1")
    assert stepcache.normalize_device("cuda") != stepcache.normalize_device("cuda:0")
    assert stepcache.normalize_device("cpu") == torch.device("cpu")


def test_device_spec_compares_normalised_devices(fake_current_cuda: None) -> None:
    @step_cached(expect=TensorSpec(device="cpu"))
    def on_cpu(owner: object) -> torch.Tensor:
        return torch.zeros(2)

    @step_cached(expect=TensorSpec(device="cuda"))
    def on_cuda(owner: object) -> torch.Tensor:
        return torch.zeros(2)

    class Meta:
        pass

    assert on_cpu(Meta()).device.type == "cpu"
    with pytest.raises(
        CacheValidationError, match="device mismatch. expected cuda:1, actual cpu"
    ):
        on_cuda(Meta())


def test_malformed_specs_are_refused() -> None:
    with pytest.raises(StepCacheError, match=r"shape\[0\] must be an int"):
        TensorSpec(shape=("x",))  # type: ignore[arg-type]
    with pytest.raises(StepCacheError, match="dtype"):
        TensorSpec(dtype="int32")  # type: ignore[arg-type]
    with pytest.raises(StepCacheError, match="not a device torch knows"):
        TensorSpec(device="gpu:zero")


def test_a_reference_that_resolves_to_none_is_not_checked() -> None:
    class Meta:
        dev: Any = None
        dt: Any = None
        n: Any = None

        @step_cached(
            expect=TensorSpec(device=Attr("dev"), dtype=Attr("dt"), shape=(Attr("n"),))
        )
        def value(self) -> torch.Tensor:
            return torch.zeros(2)

    m = Meta()
    assert m.value().shape == (2,)
    m2 = Meta()
    m2.dt = torch.int32
    with pytest.raises(CacheValidationError, match="dtype mismatch"):
        m2.value()
