# SPDX-License-Identifier: Apache-2.0
"""The vLLM plugin on a CUDA device: vLLM's own Triton kernel computes the index (not
interpreted), the plugin only caches it, and fixes stock vLLM's stale rows.

Run by ``scripts/gpu_check.sh``. Each test skips, saying why, where CUDA or the real
vLLM is not available (a namespace package named vllm is not vLLM:
``tests/require_vllm.py``), and in a process where tests/vllm_plugin switched Triton's
interpreter on (run this folder alone). No run of them on a GPU with vLLM is recorded
(see docs/limits.md)."""

from __future__ import annotations

import os
import random
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import pytest
import torch
from require_vllm import vllm_or_skip

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.vllm,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
    pytest.mark.skipif(
        os.environ.get("TRITON_INTERPRET") == "1",
        reason="Triton's interpreter is on in this process (tests/vllm_plugin "
        "switches it on); run tests/cuda alone: scripts/gpu_check.sh",
    ),
]


def reference(lens: list[int], rows: int) -> list[int]:
    out = [i for i, n in enumerate(lens) for _ in range(n)]
    return out + [0] * (rows - len(out))


def metadata(lens: list[int], rows: int) -> Any:
    from vllm.v1.attention.backend import CommonAttentionMetadata

    qsl = torch.zeros(len(lens) + 1, dtype=torch.int32)
    if lens:
        qsl[1:] = torch.tensor(lens, dtype=torch.int32).cumsum(0)
    seq_lens = torch.tensor([5 + n for n in lens], dtype=torch.int32)
    return CommonAttentionMetadata(
        query_start_loc=qsl.cuda(),
        query_start_loc_cpu=qsl,
        seq_lens=seq_lens.cuda(),
        num_reqs=len(lens),
        num_actual_tokens=rows,
        max_query_len=max(lens, default=0),
        max_seq_len=int(seq_lens.max()) if lens else 0,
        block_table_tensor=torch.zeros((len(lens), 4), dtype=torch.int32).cuda(),
        slot_mapping=torch.arange(rows).cuda(),
    )


@pytest.fixture
def plugin(monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    vllm_or_skip()
    # the modules whose import applies the patches used here
    import vllm.v1.attention.backends.mla.sparse_swa
    import vllm.v1.worker.gpu.attn_utils
    import vllm.v1.worker.gpu.model_states.default  # noqa: F401

    from stepcache.integrations import vllm as plugin_module

    plugin_module.unregister()
    monkeypatch.setenv(plugin_module.ENV, "1")
    plugin_module.register()
    assert plugin_module.status()[
        "vllm.CommonAttentionMetadata.token_to_req_indices"
    ] == ("applied")
    yield plugin_module
    plugin_module.unregister()


def layouts(count: int, seed: int) -> list[tuple[list[int], int]]:
    """The edge cases, then ``count`` random layouts: (query lengths, padding)."""
    rng = random.Random(seed)
    drawn = [
        ([rng.randint(0, 300) for _ in range(rng.randint(0, 9))], rng.randint(0, 9))
        for _ in range(count)
    ]
    return [([], 0), ([], 9), ([0, 0], 1), ([300] * 9, 9), ([1], 0), *drawn]


def test_the_plugin_gives_stock_vllms_rows_from_vllms_kernel(
    plugin: ModuleType,
) -> None:
    for lens, pad in layouts(30, seed=0):
        rows = sum(lens) + pad
        ours = metadata(lens, rows).token_to_req_indices(
            torch.full((4096,), -1, dtype=torch.int32, device="cuda")
        )
        plugin.unregister()
        try:
            stock = metadata(lens, rows).token_to_req_indices(
                torch.full((4096,), -1, dtype=torch.int32, device="cuda")
            )
        finally:
            plugin.register()
        expected = reference(lens, rows)
        assert ours.tolist() == stock.tolist() == expected, (lens, pad)


def test_the_plugin_fixes_the_stale_rows_on_the_device(plugin: ModuleType) -> None:
    cam = metadata([3, 2, 2], 7)
    buffer = torch.zeros(64, dtype=torch.int32, device="cuda")
    assert cam.token_to_req_indices(buffer).tolist() == [0, 0, 0, 1, 1, 2, 2]
    qsl = torch.arange(4, dtype=torch.int32)
    other = cam.replace(
        query_start_loc=qsl.cuda(), query_start_loc_cpu=qsl, num_actual_tokens=3
    )
    assert other.token_to_req_indices(buffer).tolist() == [0, 1, 2]
    cam.num_actual_tokens = 3  # the draft loop, in place
    cam.query_start_loc, cam.query_start_loc_cpu = qsl.cuda(), qsl.clone()
    assert cam.token_to_req_indices(buffer).tolist() == [0, 1, 2]


def test_a_captured_graph_reads_the_index_vllms_kernel_wrote(
    plugin: ModuleType,
) -> None:
    buffer = torch.zeros(64, dtype=torch.int32, device="cuda")
    out = torch.zeros(16, dtype=torch.int32, device="cuda")
    cam = metadata([3, 5], 16)
    rows = cam.token_to_req_indices(buffer)
    side = torch.cuda.Stream()  # type: ignore[no-untyped-call]
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        out.copy_(rows * 2)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out.copy_(cam.token_to_req_indices(buffer) * 2)  # a hit inside the capture
    for lens in ([3, 5], [1, 1, 1, 13], [0, 16]):
        step = metadata(lens, 16)
        assert step.token_to_req_indices(buffer).data_ptr() == buffer.data_ptr()
        graph.replay()
        torch.cuda.synchronize()
        assert out.tolist() == [2 * r for r in reference(lens, 16)]


def _v2_build(builders: list[Any], lens: list[int], capture: bool) -> None:
    """One V2 build (vLLM's ``build_attn_metadata``, as the default model state binds
    it) with a builder per KV-cache group that asks for the request index."""
    from types import SimpleNamespace

    from vllm.v1.worker.gpu import model_states

    groups = [
        [
            SimpleNamespace(
                get_metadata_builder=lambda ubatch_idx=0, b=b: b,
                kv_cache_spec=object(),
                layer_names=[f"layer.{i}"],
                build_metadata=lambda cm, ubatch_idx=0, b=b, **kw: b(cm),
                build_metadata_for_cudagraph_capture=lambda cm, ubatch_idx=0, b=b: b(
                    cm
                ),
            )
        ]
        for i, b in enumerate(builders)
    ]
    cam = metadata(lens, sum(lens))
    n = len(builders)
    default: Any = model_states.default  # stand-ins for its groups and config
    with torch.inference_mode():
        default.build_attn_metadata(
            groups,
            num_reqs=len(lens),
            num_tokens=sum(lens),
            query_start_loc_gpu=cam.query_start_loc,
            query_start_loc_cpu=cam.query_start_loc_cpu,
            max_query_len=max(lens),
            seq_lens=cam.seq_lens,
            max_seq_len=cam.max_seq_len,
            block_tables=[cam.block_table_tensor] * n,
            slot_mappings=torch.zeros((n, sum(lens)), dtype=torch.int64).cuda(),
            kv_cache_config=SimpleNamespace(kv_cache_groups=[None] * n),
            for_cudagraph_capture=capture,
        )


def test_capture_builds_share_nothing_and_a_step_build_shares(
    plugin: ModuleType,
) -> None:
    """During CUDA-graph capture each group's index is its own builder's, in its own
    buffer (a value shared from another build would bake that build's tensor into the
    graph); in a step's build, one computation serves every group."""
    import vllm.v1.worker.gpu.model_states.default  # noqa: F401

    assert plugin.status()["vllm.v2.build_attn_metadata"] == "applied"

    class Builder:
        supports_update_block_table = False

        def __init__(self) -> None:
            self.buffer = torch.zeros(64, dtype=torch.int32, device="cuda")
            self.rows: list[torch.Tensor] = []

        def __call__(self, cm: Any) -> None:
            self.rows.append(cm.token_to_req_indices(self.buffer))

    builders = [Builder() for _ in range(3)]
    _v2_build(builders, [3, 5], capture=True)
    _v2_build(builders, [3, 5], capture=True)  # V2 builds each FULL graph twice
    for b in builders:
        assert [r.data_ptr() for r in b.rows] == [b.buffer.data_ptr()] * 2
        assert all(r.tolist() == reference([3, 5], 8) for r in b.rows)
    for b in builders:
        b.rows.clear()
    _v2_build(builders, [1, 2], capture=False)
    first = builders[0].rows[0]
    assert all(b.rows[0] is first for b in builders)  # computed once, in group 0's
    assert first.tolist() == reference([1, 2], 3)
