# SPDX-License-Identifier: Apache-2.0
"""The hazard suite: one planted bug per case, on small engine-free metadata objects.

Each case has a production test, which asserts what production mode does with the bug,
and a debug test, which asserts what debug mode (``checks`` or ``verify``) raises, or,
where it raises nothing, that it serves the same value production does. What each
shows:

1. ``dataclasses.replace`` carries a cache to an object whose ``query_start_loc``
   changed. Planted with an explicit ``stepcache.attach`` (the twin shares the first
   object's cache, as vLLM's metadata objects of one step share one), and the function
   does not declare ``query_start_loc``. Production: a stale value. checks:
   ``undeclared-input``.
2. The draft loop reassigns ``query_start_loc`` on the same object; the function does
   not declare it. Production: a stale value. checks: ``undeclared-input``. Declared,
   it recomputes in every mode.
3. A declared small CPU tensor written through a numpy view (no version bump).
   Production: a stale value. checks: ``dependency-changed`` (contents compared).
4. A key that misses the layer kind: refused at decoration unless the kind is named
   in ``ignore=``; ignored, production serves another layer's value. checks: a call
   with another kind computes again and compares: ``ignored-argument``.
5. A key that misses the row count, ignored the same way. Production: a value of the
   wrong shape. checks: ``ignored-argument``.
6. Use after close. Production: **not** a stale value: the value stays readable and
   nothing says its step is over. checks: the read and the next call raise.
7. A persistent buffer overwritten by the next step. Production: a stale value (step
   2's rows read as step 1's). checks: ``buffer-overwritten``.
8. ``cuda`` and ``cuda:0`` keys. Production: **not** a stale value: the value is
   computed twice, into two copies. checks: ``device-alias``.
9. A declared numpy array changed in place. Production: a stale value. checks:
   ``dependency-changed``.
10. Writes the version counter does not see, on a declared tensor: through a numpy
    view, through the numpy array the tensor was made from (``torch.from_numpy``, as
    vLLM's persistent CPU buffers are written), through ``.data``, and through the raw
    pointer (as a Triton or other kernel writes). Production: a stale value, for any
    size. checks: caught for a CPU tensor of at most 4,096 elements (its contents are
    compared); **not caught** for a larger one (5,000 elements here: the same stale
    value is served, and nothing is reported) nor for a CUDA tensor (run only where
    CUDA is present); verify catches both, by computing again.
11. An in-place write to a declared inference tensor (made under
    ``torch.inference_mode()``, no version counter). Production: a stale value. checks:
    caught (small CPU tensor).
12. An in-place write inside a ``stepcache.scope()`` (a broken promise: the scope
    matches inference tensors by identity alone), to a layout of 5,000 tokens.
    Production: a stale value. checks: not caught (too large to compare); verify:
    caught, by computing again.

Every case plants its bug on CPU tensors of a few elements unless it says otherwise.
"""

from __future__ import annotations

import ctypes
import dataclasses
from collections.abc import Callable

import numpy as np
import pytest
import torch

import stepcache
from stepcache import StaleCacheError, StepCacheError, _spec, step_cached

# -- a small engine-free metadata object and builders with planted bugs ------------------


@dataclasses.dataclass
class Meta:
    query_start_loc: torch.Tensor
    num_actual_tokens: int
    req_idx: np.ndarray = dataclasses.field(default_factory=lambda: np.arange(3))


def reference_index(qsl: torch.Tensor, n: int) -> torch.Tensor:
    lens = qsl.diff()
    idx = torch.repeat_interleave(torch.arange(lens.numel(), dtype=torch.int32), lens)
    return torch.cat([idx, torch.zeros(n - idx.numel(), dtype=torch.int32)])


@step_cached(
    owner="md", depends_on=("num_actual_tokens",)
)  # BUG: misses query_start_loc
def index_missing_qsl(md: Meta) -> torch.Tensor:
    return reference_index(md.query_start_loc, md.num_actual_tokens)


@step_cached(owner="md", depends_on=("query_start_loc", "num_actual_tokens"))
def index_ok(md: Meta) -> torch.Tensor:
    return reference_index(md.query_start_loc, md.num_actual_tokens)


@step_cached(
    ignore=("buffer",), owner="md", depends_on=("query_start_loc", "num_actual_tokens")
)
def index_into(md: Meta, buffer: torch.Tensor) -> torch.Tensor:
    ref = reference_index(md.query_start_loc, md.num_actual_tokens)
    buffer[: ref.numel()].copy_(ref)
    return buffer[: ref.numel()]


# BUG: the layer kind changes the value, and it is ignored
@step_cached(key="num_rows", owner="md", ignore=("kind",))
def sparse_missing_kind(md: Meta, kind: str, num_rows: int) -> torch.Tensor:
    return torch.full((num_rows,), 128 if kind == "c128a" else 1)


# BUG: the row count changes the value, and it is ignored
@step_cached(key="kind", owner="md", ignore=("num_rows",))
def sparse_missing_rows(md: Meta, kind: str, num_rows: int) -> torch.Tensor:
    return torch.full((num_rows,), 128 if kind == "c128a" else 1)


@step_cached(owner="md", depends_on=("req_idx",))
def from_req_idx(md: Meta) -> list[int]:
    return [int(x) * 10 for x in md.req_idx]


@step_cached(key="device", owner="md")
def per_device(md: Meta, device: str) -> torch.Tensor:
    return torch.zeros(md.num_actual_tokens)


def step(lens: list[int], pad: int = 0) -> Meta:
    qsl = torch.tensor([0, *np.cumsum(lens).tolist()], dtype=torch.int32)
    return Meta(qsl, int(qsl[-1]) + pad)


def _last_kind() -> str:
    return stepcache.debug_report()[-1].kind


# -- 1. dataclasses.replace carries a shared cache to an object whose qsl changed ----------


def _replace_carry(fn: object) -> tuple[torch.Tensor, Meta]:
    md = step([2, 1])
    first = index_missing_qsl(md)
    twin = dataclasses.replace(
        md, query_start_loc=torch.tensor([0, 1, 3], dtype=torch.int32)
    )
    stepcache.attach(twin, stepcache.cache_of(md))  # one cache per step, as vLLM shares
    return first, twin


def test_replace_carry_is_stale_in_production() -> None:
    _, twin = _replace_carry(index_missing_qsl)
    got = index_missing_qsl(twin)
    assert not torch.equal(got, reference_index(twin.query_start_loc, 3))  # stale


def test_replace_carry_is_caught_in_checks_mode(checks: None) -> None:
    _, twin = _replace_carry(index_missing_qsl)
    with pytest.raises(
        StaleCacheError, match=r"'query_start_loc'.*neither the key nor depends_on"
    ) as info:
        index_missing_qsl(twin)
    assert "index_missing_qsl" in str(
        info.value
    ) and "add 'query_start_loc' to depends_on" in str(info.value)
    assert _last_kind() == "undeclared-input"


# -- 2. the draft loop reassigns query_start_loc on the same object --------------------------


def _draft_loop() -> Meta:
    md = step([3, 3])
    index_missing_qsl(md)
    md.query_start_loc = torch.tensor([0, 1, 6], dtype=torch.int32)  # next draft token
    return md


def test_draft_loop_reassignment_is_stale_in_production() -> None:
    md = _draft_loop()
    assert index_missing_qsl(md).tolist() == [0, 0, 0, 1, 1, 1]  # the old rows


def test_draft_loop_reassignment_is_caught_in_checks_mode(checks: None) -> None:
    md = _draft_loop()
    with pytest.raises(
        StaleCacheError, match="'query_start_loc'.*changed since the entry was stored"
    ):
        index_missing_qsl(md)
    assert _last_kind() == "undeclared-input"


def test_declared_dependency_recomputes_after_reassignment_in_every_mode(
    checks: None,
) -> None:
    md = step([3, 3])
    index_ok(md)
    md.query_start_loc = torch.tensor([0, 1, 6], dtype=torch.int32)
    assert index_ok(md).tolist() == [0, 1, 1, 1, 1, 1]


# -- 3. a dependency mutated in place behind the version counter -----------------------------


def _mutate_behind_version() -> Meta:
    md = step([2, 2])
    index_ok(md)
    md.query_start_loc.numpy()[1] = 1  # writes memory without bumping _version
    return md


def test_mutation_behind_the_version_counter_is_stale_in_production() -> None:
    md = _mutate_behind_version()
    assert index_ok(md).tolist() == [0, 0, 1, 1]  # old rows; correct is [0, 1, 1, 1]


def test_mutation_behind_the_version_counter_is_caught_in_checks_mode(
    checks: None,
) -> None:
    md = _mutate_behind_version()
    with pytest.raises(
        StaleCacheError,
        match=r"dependency 'query_start_loc' changed without the cache noticing: contents mismatch at flat index 1. expected 2, actual 1",
    ):
        index_ok(md)
    assert _last_kind() == "dependency-changed"


# -- 4. a key that misses the layer kind -----------------------------------------------------


def test_key_missing_layer_kind_is_stale_in_production() -> None:
    md = step([4])
    sparse_missing_kind(md, "swa_only", 4)
    assert sparse_missing_kind(md, "c128a", 4).tolist() == [
        1,
        1,
        1,
        1,
    ]  # swa_only's value


def test_key_missing_layer_kind_is_refused_unless_ignored() -> None:
    with pytest.raises(StepCacheError, match="parameter 'kind' is in neither key="):
        step_cached(key="num_rows", owner="md")(sparse_missing_kind.__wrapped__)  # type: ignore[attr-defined]


def test_key_missing_layer_kind_is_caught_in_checks_mode(checks: None) -> None:
    md = step([4])
    sparse_missing_kind(md, "swa_only", 4)
    with pytest.raises(
        StaleCacheError,
        match=r"depends on 'kind', which ignore= says it does not: tensor 'result' value mismatch at flat index 0. expected 1, actual 128",
    ):
        sparse_missing_kind(md, "c128a", 4)
    assert _last_kind() == "ignored-argument"


# -- 5. a key that misses the row count ------------------------------------------------------


def test_key_missing_row_count_is_stale_in_production() -> None:
    md = step([4])
    sparse_missing_rows(md, "c128a", 4)
    assert sparse_missing_rows(md, "c128a", 2).shape == (4,)  # wrong row count


def test_key_missing_row_count_is_caught_in_checks_mode(checks: None) -> None:
    md = step([4])
    sparse_missing_rows(md, "c128a", 4)
    with pytest.raises(
        StaleCacheError,
        match=r"depends on 'num_rows', which ignore= says it does not: tensor 'result' size mismatch at index 0. expected 4, actual 2",
    ):
        sparse_missing_rows(md, "c128a", 2)
    assert _last_kind() == "ignored-argument"


# -- 6. use after close -------------------------------------------------------------------------


def test_use_after_close_goes_unnoticed_in_production() -> None:
    md = step([2])
    value = index_ok(md)
    stepcache.cache_of(md).close()
    assert value.tolist() == [0, 0]  # still readable: nothing says the step is over


def test_use_after_close_is_caught_in_checks_mode(checks: None) -> None:
    md = step([2])
    value = index_ok(md)
    stepcache.cache_of(md).close()
    with pytest.raises(
        StaleCacheError, match="handed out by a step cache that has since been closed"
    ):
        value.tolist()
    assert _last_kind() == "use-after-close"
    with pytest.raises(StaleCacheError, match="closed"):
        index_ok(md)
    assert _last_kind() == "use-after-close"


# -- 7. a persistent buffer overwritten by the next step --------------------------------------


def _two_steps_one_buffer() -> tuple[torch.Tensor, Meta]:
    with torch.inference_mode(False):  # persistent: allocated before any step
        buffer = torch.zeros(16, dtype=torch.int32)
    md1 = step([2, 2])
    old = index_into(md1, buffer)
    md2 = step([1, 3])
    index_into(md2, buffer)  # the next step's build writes the same storage
    return old, md1


def test_overwritten_buffer_is_stale_in_production() -> None:
    old, _ = _two_steps_one_buffer()
    assert old.tolist() == [0, 1, 1, 1]  # step 2's rows, read as step 1's


def test_overwritten_buffer_is_caught_in_checks_mode(checks: None) -> None:
    old, md1 = _two_steps_one_buffer()
    with pytest.raises(
        StaleCacheError, match=r"was overwritten after it was stored.*clone\(\)"
    ):
        old.tolist()
    assert _last_kind() == "buffer-overwritten"
    with pytest.raises(StaleCacheError, match="was overwritten after it was stored"):
        index_into(md1, torch.zeros(16, dtype=torch.int32))


def test_a_clone_taken_in_time_stays_valid(checks: None) -> None:
    buffer = torch.zeros(16, dtype=torch.int32)
    kept = index_into(step([2, 2]), buffer).clone()
    index_into(step([1, 3]), buffer)
    assert kept.tolist() == [0, 0, 1, 1]


# -- 8. cuda and cuda:0 name one device ---------------------------------------------------------


@pytest.fixture
def current_device_zero(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_spec, "_current_index", lambda device_type: 0)


def test_device_aliases_compute_twice_in_production(current_device_zero: None) -> None:
    md = step([2])
    assert per_device(md, "cuda") is not per_device(
        md, "cuda:0"
    )  # two copies, two buffers


def test_device_aliases_are_caught_in_checks_mode(
    current_device_zero: None, checks: None
) -> None:
    md = step([2])
    per_device(md, "cuda")
    with pytest.raises(
        StaleCacheError,
        match=r"'cuda:0' and the cached key 'cuda' name the same device",
    ):
        per_device(md, "cuda:0")
    per_device(md, "cuda:1")  # another device: no alias
    assert _last_kind() == "device-alias"


# -- 9. a numpy dependency changed in place ------------------------------------------------------


def test_numpy_dependency_changed_in_place_is_stale_in_production() -> None:
    md = step([1, 1, 1])
    from_req_idx(md)
    md.req_idx[0] = 7
    assert from_req_idx(md) == [0, 10, 20]


def test_numpy_dependency_changed_in_place_is_caught_in_checks_mode(
    checks: None,
) -> None:
    md = step([1, 1, 1])
    from_req_idx(md)
    md.req_idx[0] = 7
    with pytest.raises(
        StaleCacheError,
        match=r"'req_idx' changed without the cache noticing: contents mismatch at flat index 0. expected 0, actual 7",
    ):
        from_req_idx(md)


# -- 10. writes the version counter does not see -------------------------------------------

#: more elements than debug mode compares the contents of (4,096)
LARGE = 5_000
POISON = 1_000_000


class Buffers:
    """A tensor made from a numpy array, as vLLM's persistent CPU buffers are
    (``CpuGpuBuffer``: ``.np`` is written, ``.cpu`` is read)."""

    def __init__(self, n: int) -> None:
        self.np = np.arange(n, dtype=np.int64)
        # a normal tensor, with a version counter, even if the suite runs under
        # inference mode: inference tensors are case 11
        with torch.inference_mode(False):
            self.cpu = torch.from_numpy(self.np)

    @step_cached(depends_on=("cpu",), name="hazards.Buffers.total")
    def total(self) -> torch.Tensor:
        return self.cpu.sum()


def _through_numpy_view(b: Buffers) -> None:
    b.cpu.numpy()[0] = POISON


def _through_the_source_array(b: Buffers) -> None:
    b.np[0] = POISON


def _through_data(b: Buffers) -> None:
    b.cpu.data[0] = POISON


def _through_the_raw_pointer(b: Buffers) -> None:
    value = np.array([POISON], dtype=np.int64)
    ctypes.memmove(b.cpu.data_ptr(), value.ctypes.data, value.nbytes)


BYPASSES: dict[str, Callable[[Buffers], None]] = {
    "numpy view": _through_numpy_view,
    "source array": _through_the_source_array,
    ".data": _through_data,
    "raw pointer": _through_the_raw_pointer,
}
bypasses = pytest.mark.parametrize("write", list(BYPASSES.values()), ids=list(BYPASSES))


def _written_behind_the_counter(
    n: int, write: Callable[[Buffers], None]
) -> tuple[Buffers, int]:
    b = Buffers(n)
    first = int(b.total())
    version = b.cpu._version
    write(b)
    assert b.cpu._version == version and int(b.cpu[0]) == POISON  # written, unseen
    return b, first


@bypasses
@pytest.mark.parametrize("n", [8, LARGE], ids=["small", "large"])
def test_a_write_behind_the_version_counter_is_stale_in_production(
    n: int, write: Callable[[Buffers], None]
) -> None:
    b, first = _written_behind_the_counter(n, write)
    assert int(b.total()) == first != int(b.cpu.sum())  # the old total


@bypasses
def test_a_write_behind_the_counter_to_a_small_cpu_tensor_is_caught_in_checks_mode(
    checks: None, write: Callable[[Buffers], None]
) -> None:
    b, _ = _written_behind_the_counter(8, write)
    with pytest.raises(
        StaleCacheError, match=r"'cpu' changed without the cache noticing"
    ):
        b.total()
    assert _last_kind() == "dependency-changed"


@bypasses
def test_a_write_behind_the_counter_to_a_large_cpu_tensor_is_not_caught_in_checks_mode(
    checks: None, write: Callable[[Buffers], None]
) -> None:
    # checks mode compares the contents of at most 4,096 elements: beyond that it sees
    # what production sees, and serves the same stale value without a report
    b, first = _written_behind_the_counter(LARGE, write)
    assert int(b.total()) == first != int(b.cpu.sum())
    assert len(stepcache.debug_report()) == 0  # nothing reported


@bypasses
def test_a_write_behind_the_counter_to_a_large_cpu_tensor_is_caught_in_verify_mode(
    verify: None, write: Callable[[Buffers], None]
) -> None:
    b, _ = _written_behind_the_counter(LARGE, write)
    with pytest.raises(StaleCacheError, match="differs from a fresh computation"):
        b.total()


class DeviceBuffer:
    def __init__(self) -> None:
        with torch.inference_mode(False):  # a normal tensor, as in case 10
            self.gpu = torch.arange(8, dtype=torch.int64, device="cuda")

    @step_cached(depends_on=("gpu",), name="hazards.DeviceBuffer.total")
    def total(self) -> torch.Tensor:
        return self.gpu.sum()


def _device_written_behind_the_counter() -> tuple[DeviceBuffer, int]:
    b = DeviceBuffer()
    first = int(b.total())
    version = b.gpu._version
    b.gpu.data[0] = POISON  # as a kernel writes: no version bump
    assert b.gpu._version == version
    return b, first


needs_cuda = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


@needs_cuda[0]
@needs_cuda[1]
def test_a_write_behind_the_counter_to_a_cuda_tensor_is_not_caught_in_checks_mode(
    checks: None,
) -> None:
    # checks mode compares the contents of CPU tensors only
    b, first = _device_written_behind_the_counter()
    assert int(b.total()) == first != int(b.gpu.sum())
    assert len(stepcache.debug_report()) == 0  # nothing reported


@needs_cuda[0]
@needs_cuda[1]
def test_a_write_behind_the_counter_to_a_cuda_tensor_is_caught_in_verify_mode(
    verify: None,
) -> None:
    b, _ = _device_written_behind_the_counter()
    with pytest.raises(StaleCacheError, match="differs from a fresh computation"):
        b.total()


# -- 11. an inference tensor written in place ---------------------------------------------


class InferenceStep:
    def __init__(self) -> None:
        with torch.inference_mode():
            self.query_start_loc = torch.tensor([0, 2, 4], dtype=torch.int32)

    @step_cached(depends_on=("query_start_loc",), name="hazards.InferenceStep.lens")
    def lens(self) -> list[int]:
        return self.query_start_loc.diff().tolist()  # type: ignore[no-any-return]


def _inference_written_in_place() -> InferenceStep:
    step = InferenceStep()
    assert step.lens() == [2, 2]
    with torch.inference_mode():
        step.query_start_loc[1] = 1  # in place: an inference tensor has no counter
    return step


def test_an_inference_tensor_written_in_place_is_stale_in_production() -> None:
    assert _inference_written_in_place().lens() == [2, 2]  # correct is [1, 3]


def test_an_inference_tensor_written_in_place_is_caught_in_checks_mode(
    checks: None,
) -> None:
    step = _inference_written_in_place()
    with pytest.raises(
        StaleCacheError, match=r"'query_start_loc' changed without the cache noticing"
    ):
        step.lens()


def test_a_reassigned_inference_tensor_recomputes_in_production() -> None:
    step = InferenceStep()
    assert step.lens() == [2, 2]
    with torch.inference_mode():
        step.query_start_loc = torch.tensor([0, 1, 4], dtype=torch.int32)
    assert step.lens() == [1, 3]


# -- 12. an in-place write inside a scope ------------------------------------------------


@dataclasses.dataclass
class BigGroup:
    query_start_loc: torch.Tensor

    @step_cached(depends_on=("query_start_loc",), name="hazards.BigGroup.total")
    def total(self) -> int:
        return int(self.query_start_loc[-1])


def _written_inside_a_scope() -> int:
    """The second owner's value, after the first's call and a write in place."""
    with torch.inference_mode():
        qsl = torch.arange(5_000)
    with stepcache.scope():
        assert BigGroup(qsl).total() == 4_999
        with torch.inference_mode():
            qsl[-1] = 7  # breaks the scope's promise
        return BigGroup(qsl).total()


def test_a_write_inside_a_scope_is_stale_in_production() -> None:
    assert _written_inside_a_scope() == 4_999  # correct is 7


def test_a_write_inside_a_scope_is_not_seen_in_checks_mode(checks: None) -> None:
    assert _written_inside_a_scope() == 4_999  # 5,000 elements: contents not compared
    assert len(stepcache.debug_report()) == 0


def test_a_write_inside_a_scope_is_caught_in_verify_mode(verify: None) -> None:
    with pytest.raises(
        StaleCacheError,
        match=r"differs from a fresh computation: 'result': expected 4999, actual 7",
    ):
        _written_inside_a_scope()
    assert _last_kind() == "key-too-coarse"
