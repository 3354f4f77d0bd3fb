# SPDX-License-Identifier: Apache-2.0
"""The request index on a CUDA device: pinned staging kept alive, a copy that does not
block the host, and a captured CUDA graph that reads the cached index of each step.

Run by ``scripts/gpu_check.sh``; skipped, with the reason, where CUDA is not available.
They need torch, numpy, attrs and pytest only (no vLLM, no hypothesis: the layouts are
drawn from a seeded ``random.Random``), so a bare CUDA torch runs them. No run of them
on a GPU is recorded since they were last changed (see docs/limits.md)."""

from __future__ import annotations

import random
from typing import Any

import pytest
import torch

import stepcache
from stepcache.integrations.dsv4.request_index import token_to_req_indices
from stepcache.integrations.dsv4.sim import make_step

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def reference(lens: list[int], rows: int) -> list[int]:
    out = [i for i, n in enumerate(lens) for _ in range(n)]
    return out + [0] * (rows - len(out))


@pytest.fixture
def kept(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """What the request index hands to its step's keep_alive."""
    objects: list[Any] = []
    original = stepcache.StepCache.keep_alive

    def spy(self: stepcache.StepCache, obj: Any) -> None:
        objects.append(obj)
        original(self, obj)

    monkeypatch.setattr(stepcache.StepCache, "keep_alive", spy)
    return objects


def layouts(count: int, seed: int) -> list[tuple[list[int], int]]:
    """The edge cases, then ``count`` random layouts: (query lengths, padding)."""
    rng = random.Random(seed)
    drawn = [
        ([rng.randint(0, 6) for _ in range(rng.randint(0, 8))], rng.randint(0, 5))
        for _ in range(count)
    ]
    return [([], 0), ([], 5), ([0, 0], 0), ([6] * 8, 5), ([1], 0), *drawn]


@pytest.mark.parametrize("qsl_on_device", [False, True], ids=["host-qsl", "cuda-qsl"])
def test_rows_on_the_device_equal_the_reference(qsl_on_device: bool) -> None:
    for lens, pad in layouts(150, seed=int(qsl_on_device)):
        meta = make_step(
            lens, pad_to=sum(lens) + pad, device="cuda" if qsl_on_device else "cpu"
        )
        buffer = torch.full((64,), -1, dtype=torch.int32, device="cuda")
        rows = token_to_req_indices(meta, buffer)
        assert rows.device.type == "cuda", (lens, pad)
        assert rows.tolist() == reference(lens, sum(lens) + pad), (lens, pad)
        assert token_to_req_indices(meta, torch.zeros_like(buffer)) is rows


def test_the_staging_tensor_is_pinned_and_kept_until_the_step_ends(
    kept: list[Any],
) -> None:
    meta = make_step([2, 3], pad_to=7)
    rows = token_to_req_indices(meta, torch.zeros(16, dtype=torch.int32, device="cuda"))
    torch.cuda.synchronize()
    assert rows.tolist() == [0, 0, 1, 1, 1, 0, 0]
    assert len(kept) == 1
    staging = kept[0]
    assert staging.is_pinned() and staging.device.type == "cpu"
    assert staging.tolist() == [0, 0, 1, 1, 1]
    # a hit stages nothing
    token_to_req_indices(meta, torch.zeros(16, dtype=torch.int32, device="cuda"))
    assert len(kept) == 1


def test_the_copy_to_the_device_does_not_block_the_host(kept: list[Any]) -> None:
    buffer = torch.zeros(64, dtype=torch.int32, device="cuda")
    # warm the pinned-memory allocator, so the call below allocates nothing new
    token_to_req_indices(make_step([4, 4]), buffer)
    torch.cuda.synchronize()
    meta = make_step([1, 5, 2], pad_to=10)  # host query_start_loc: no device read
    stream = torch.cuda.current_stream()
    torch.cuda._sleep(int(2e8))  # type: ignore[no-untyped-call]  # busy stream
    rows = token_to_req_indices(meta, buffer)
    still_busy = not stream.query()
    torch.cuda.synchronize()
    assert still_busy, "token_to_req_indices waited for the device"
    assert rows.tolist() == reference([1, 5, 2], 10)


def test_a_captured_builder_reads_the_index_of_every_replayed_step() -> None:
    rows_per_step = 16
    index_buffer = torch.zeros(64, dtype=torch.int32, device="cuda")
    seq_lens = torch.zeros(16, dtype=torch.int64, device="cuda")
    out = torch.zeros(rows_per_step, dtype=torch.int64, device="cuda")
    offsets = torch.arange(rows_per_step, device="cuda")

    def builder(rows: torch.Tensor) -> None:
        # what a metadata builder derives from the index, on the device
        out.copy_(seq_lens.index_select(0, rows.long()) * 100 + offsets)

    def step(lens: list[int]) -> tuple[Any, torch.Tensor, list[int]]:
        meta = make_step(lens, pad_to=rows_per_step)
        host_seq_lens = [8 + n for n in lens] + [0] * (16 - len(lens))
        seq_lens.copy_(torch.tensor(host_seq_lens))
        return meta, token_to_req_indices(meta, index_buffer), host_seq_lens

    meta, rows, _ = step([3, 5, 2])
    side = torch.cuda.Stream()  # type: ignore[no-untyped-call]
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        builder(rows)  # warm-up before capture, as CUDA graphs require
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = token_to_req_indices(meta, index_buffer)  # a hit: no host work
        builder(captured)
    assert captured is rows

    for lens in ([3, 5, 2], [1, 1, 1, 1, 9], [16], [], [0, 7, 0]):
        meta, rows, host_seq_lens = step(lens)
        assert rows.data_ptr() == index_buffer.data_ptr()  # the captured address
        graph.replay()
        torch.cuda.synchronize()
        expected = [
            host_seq_lens[r] * 100 + i
            for i, r in enumerate(reference(lens, rows_per_step))
        ]
        assert out.tolist() == expected
