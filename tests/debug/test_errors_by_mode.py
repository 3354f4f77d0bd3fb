# SPDX-License-Identifier: Apache-2.0
"""Every error production raises, debug modes raise with the same type: a test per
error type and mode (a checks-mode validation failure once came out as TypeError)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pytest
import torch

import stepcache
from stepcache import CacheValidationError, StaleCacheError, StepCacheError

MODES = ["off", "checks", "verify"]


@dataclasses.dataclass
class Meta:
    n: int = 3

    @stepcache.step_cached(
        expect=stepcache.TensorSpec(dtype=torch.int32), name="modes.wrong_dtype"
    )
    def wrong_dtype(self) -> torch.Tensor:
        return torch.zeros(2)  # float32

    @stepcache.step_cached(
        expect=stepcache.TensorSpec(device=stepcache.Arg("buf")),
        ignore=("buf",),
        name="modes.on_device",
    )
    def on_device(self, buf: torch.Tensor) -> torch.Tensor:
        return torch.zeros(2, device=buf.device)

    @stepcache.step_cached(key="k", name="modes.keyed")
    def keyed(self, k: object) -> int:
        return 1

    @stepcache.step_cached(key=lambda self, k: 1 // k, name="modes.key_fn")
    def key_fn(self, k: int) -> int:
        return k

    @stepcache.step_cached(depends_on=("missing",), name="modes.missing_dep")
    def missing_dep(self) -> int:
        return 1

    @stepcache.step_cached(depends_on=("method",), name="modes.method_dep")
    def method_dep(self) -> int:
        return 1

    def method(self) -> int:
        return self.n


@stepcache.step_cached(name="modes.int_owner")
def int_owner(owner: object) -> int:
    return 1


def _hit_on_another_device(m: Meta) -> object:
    m.on_device(torch.zeros(1))
    return m.on_device(torch.zeros(1, device="meta"))


def _closed(m: Meta) -> object:
    m.keyed(1)
    stepcache.cache_of(m).close()
    return m.keyed(1)


CASES: list[tuple[str, Callable[[Meta], object], type[Exception], str]] = [
    ("miss breaks expect", lambda m: m.wrong_dtype(), CacheValidationError, "dtype"),
    ("hit breaks expect", _hit_on_another_device, CacheValidationError, "device"),
    ("unhashable key", lambda m: m.keyed([1]), StepCacheError, "unhashable"),
    ("key function raised", lambda m: m.key_fn(0), StepCacheError, "ZeroDivision"),
    ("missing dependency", lambda m: m.missing_dep(), StepCacheError, "missing"),
    ("method dependency", lambda m: m.method_dep(), StepCacheError, "a method"),
    ("owner that cannot be one", lambda m: int_owner(3), StepCacheError, "'owner'"),
    ("closed store", _closed, StaleCacheError, "closed"),
]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(
    ("case", "call", "error", "words"), CASES, ids=[c[0] for c in CASES]
)
def test_each_mode_raises_the_same_typed_error(
    mode: str,
    case: str,
    call: Callable[[Meta], object],
    error: type[Exception],
    words: str,
) -> None:
    with stepcache.debug(mode), pytest.raises(StepCacheError) as raised:
        call(Meta())
    # the type production raises (a StaleCacheError is not a CacheValidationError)
    assert isinstance(raised.value, error), f"{case} in {mode}: {raised.value!r}"
    assert error is StepCacheError or type(raised.value) is error
    assert words in str(raised.value)
    assert "modes." in str(raised.value) or error is StaleCacheError
