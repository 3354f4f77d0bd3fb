# SPDX-License-Identifier: Apache-2.0
"""DeepSeek V4's prefill chunk plan on vLLM's real ``DeepseekSparseSWAMetadata``:
every attention layer asks for it (61 per prefill step), stock computes it each time
(a host loop with ``.item()`` per request), the plugin once per layer kind."""

from __future__ import annotations

from collections.abc import Iterator
from types import ModuleType
from typing import Any

import pytest
import torch

import stepcache
from benchmarks import vllm_builders as real_builders
from stepcache.integrations.vllm.chunk_plan import PLAN_NAME

pytestmark = pytest.mark.vllm

#: DeepSeek V4's 61 layers by compression ratio, as its config lays them out: the
#: first two SWA-only, then C4A and C128A in turn (V4.1's callers also pass
#: has_compressed; the plan depends on the three arguments)
RATIOS = [1, 1] + [4, 128] * 29 + [4]
CHUNK = 2  # small, so the plan has several chunks


def step_metadata(seq_lens: list[int], query_lens: list[int]) -> Any:
    """A step's sparse-SWA metadata with prefill requests, its tensors made under
    inference mode as a step makes them."""
    from vllm.v1.attention.backends.mla.sparse_swa import DeepseekSparseSWAMetadata

    with torch.inference_mode():
        n = len(seq_lens)
        return DeepseekSparseSWAMetadata(
            block_table=torch.zeros((n, 4), dtype=torch.int32),
            slot_mapping=torch.zeros(sum(query_lens), dtype=torch.int64),
            block_size=64,
            num_prefills=n,
            prefill_seq_lens_cpu=torch.tensor(seq_lens, dtype=torch.int32),
            prefill_query_lens_cpu=torch.tensor(query_lens, dtype=torch.int32),
            prefill_window_size=16,
            prefill_max_model_len=1024,
            prefill_max_num_batched_tokens=64,
        )


def one_step(md: Any) -> list[Any]:
    """Every layer's call, as ``_forward_prefill`` makes it."""
    return [
        md.get_prefill_chunk_plan(compress_ratio=r, prefill_chunk_size=CHUNK)
        for r in RATIOS
    ]


@pytest.fixture
def counts(
    vllm_mod: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> Iterator[dict[str, int]]:
    """vLLM's computations of the plan and every ``.item()`` (a host sync on a
    device tensor), counted by wrappers installed before the plugin registers."""
    from vllm.v1.attention.backends.mla.sparse_swa import DeepseekSparseSWAMetadata

    yield real_builders.counted_calls(
        monkeypatch, DeepseekSparseSWAMetadata, "get_prefill_chunk_plan", "plans"
    )


LAYOUT = ([300, 90, 40, 700], [60, 90, 8, 100])


def stock_step() -> list[Any]:
    return one_step(step_metadata(*LAYOUT))


def test_stock_computes_the_plan_in_every_layer(
    counts: dict[str, int], stock: None
) -> None:
    plans = stock_step()
    assert counts["plans"] == len(RATIOS) == 61
    assert counts["items"] > 2 * 61  # at least two per layer
    assert len({repr(p) for p in plans}) == 3  # SWA-only, C4A, C128A


@pytest.mark.parametrize(
    ("mode", "debug"),
    [("1", "off"), ("1", "checks"), ("1", "verify"), ("verify", "off")],
    ids=["production", "checks", "verify", "plugin-verify"],
)
def test_the_plugin_computes_each_plan_once_per_step(
    counts: dict[str, int], register_plugin: Any, mode: str, debug: str
) -> None:
    from stepcache.integrations import vllm as plugin_module

    plugin_module.unregister()
    expected = stock_step()  # the plugin off: stock's plans, and its counts
    stock_plans, stock_items = counts["plans"], counts["items"]
    counts.update(plans=0, items=0)
    register_plugin(mode)
    stepcache.reset_stats()
    with stepcache.debug(debug):
        plans = stock_step()
    assert plans == expected
    if mode == "1" and debug != "verify":
        # production, and checks mode: one computation per layer kind
        assert counts["plans"] == 3
        assert counts["items"] * 10 < stock_items  # 3 plans' syncs, not 61's
        row = stepcache.stats()[PLAN_NAME]
        assert (row.misses, row.hits) == (3, 58)
    else:  # the verify modes also run stock's code on every call, to compare
        assert counts["plans"] >= stock_plans


def test_a_write_into_the_host_tensors_is_a_new_plan(
    counts: dict[str, int], register_plugin: Any
) -> None:
    """A write that moves no version counter (numpy, an inference tensor) still
    changes the plan: the key holds the tensors' contents."""
    register_plugin("1")
    md = step_metadata(*LAYOUT)
    before = md.get_prefill_chunk_plan(compress_ratio=4, prefill_chunk_size=CHUNK)
    md.prefill_seq_lens_cpu.numpy()[:] = [900, 900, 900, 900]
    after = md.get_prefill_chunk_plan(compress_ratio=4, prefill_chunk_size=CHUNK)
    fresh = step_metadata([900] * 4, LAYOUT[1])
    from stepcache.integrations.vllm.chunk_plan import stock_prefill_chunk_plan

    assert after == stock_prefill_chunk_plan(fresh, 4, CHUNK)
    assert after != before


def test_a_step_without_prefills_is_vllms_empty_plan(register_plugin: Any) -> None:
    register_plugin("1")
    md = step_metadata([], [])
    md.num_prefills = 0
    assert md.get_prefill_chunk_plan(compress_ratio=4, prefill_chunk_size=CHUNK) == []
