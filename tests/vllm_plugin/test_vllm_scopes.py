# SPDX-License-Identifier: Apache-2.0
"""The scopes the plugin opens where vLLM 0.33 builds a step's metadata, counted on
vLLM's own functions: Model Runner V2's ``build_attn_metadata`` with a DeepSeek V4
compressor-like builder per KV-cache group (each builder asks for the request index
and ``_get_c128_boundary``, as ``CompressorMetadataBuilder.build`` does), V1's
proposer ``build_per_group_and_layer_attn_metadata`` through a draft loop as
``SpecDecodeBaseProposer.propose`` runs it, and the other lifetimes (V1's build, V2's
draft update) through probes in vLLM's place."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from types import ModuleType, SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch
from releases import needs_v1

import stepcache
from stepcache.integrations.vllm import metadata as _vllm_metadata

pytestmark = pytest.mark.vllm

GROUPS = 3


@pytest.fixture
def computations(
    vllm_mod: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> Iterator[dict[str, int]]:
    """How often the request index and the c128 boundary are computed, whoever
    computes them: vLLM's kernel or the plugin's numpy path; vLLM's function, which
    the plugin calls. Installed before the plugin registers (it keeps vLLM's function
    as it finds it)."""
    import vllm.v1.attention.ops.metadata as backend  # imported by the method
    from vllm.models.deepseek_v4 import compressor

    counts = {"index": 0, "c128": 0}
    kernel = backend.compute_token_to_req_indices
    numpy_path = _vllm_metadata.request_index_array
    boundary = compressor._get_c128_boundary

    def count_kernel(*args: Any, **kwargs: Any) -> Any:
        counts["index"] += 1
        return kernel(*args, **kwargs)

    def count_numpy(*args: Any, **kwargs: Any) -> Any:
        counts["index"] += 1
        return numpy_path(*args, **kwargs)

    def _get_c128_boundary(metadata: Any) -> bool | None:
        counts["c128"] += 1
        return boundary(metadata)  # type: ignore[no-any-return]

    monkeypatch.setattr(backend, "compute_token_to_req_indices", count_kernel)
    monkeypatch.setattr(_vllm_metadata, "request_index_array", count_numpy)
    monkeypatch.setattr(compressor, "_get_c128_boundary", _get_c128_boundary)
    yield counts


class Builder:
    """What DeepSeek V4's compressor builder asks of each group's metadata."""

    supports_update_block_table = False

    def __init__(self) -> None:
        self.buffer = torch.zeros(64, dtype=torch.int32)
        self.built: list[tuple[list[int], bool | None]] = []

    def build(self, cm: Any) -> tuple[list[int], bool | None]:
        from vllm.models.deepseek_v4 import compressor

        rows = cm.token_to_req_indices(self.buffer).tolist()
        result = rows, compressor._get_c128_boundary(cm)
        self.built.append(result)
        return result


def groups(builders: list[Builder]) -> list[list[Any]]:
    def group(builder: Builder, i: int) -> Any:
        return SimpleNamespace(
            get_metadata_builder=lambda ubatch_idx=0: builder,
            kv_cache_spec=object(),
            layer_names=[f"layer.{i}"],
            build_metadata=lambda cm, ubatch_idx=0, **kw: builder.build(cm),
            build_metadata_for_cudagraph_capture=lambda cm, ubatch_idx=0: builder.build(
                cm
            ),
        )

    return [[group(b, i)] for i, b in enumerate(builders)]


def v2_build(query_lens: list[int], capture: bool = False) -> list[Builder]:
    """One step's metadata through V2's real ``build_attn_metadata``, its layout made
    under inference mode as an engine step makes it."""
    from vllm.v1.worker.gpu import model_states

    builders = [Builder() for _ in range(GROUPS)]
    with torch.inference_mode():
        qsl = torch.zeros(len(query_lens) + 1, dtype=torch.int32)
        qsl[1:] = torch.tensor(np.cumsum(query_lens), dtype=torch.int32)
        seq_lens = torch.tensor([120 + n for n in query_lens], dtype=torch.int32)
        tokens = int(qsl[-1])
        # the default model state binds it by name: the call a step makes
        model_states.default.build_attn_metadata(
            groups(builders),
            num_reqs=len(query_lens),
            num_tokens=tokens,
            query_start_loc_gpu=qsl,
            query_start_loc_cpu=qsl.clone(),
            max_query_len=max(query_lens),
            seq_lens=seq_lens,
            max_seq_len=int(seq_lens.max()),
            block_tables=[torch.zeros((len(query_lens), 4), dtype=torch.int32)]
            * GROUPS,
            slot_mappings=torch.zeros((GROUPS, tokens), dtype=torch.int64),
            kv_cache_config=SimpleNamespace(kv_cache_groups=[None] * GROUPS),
            seq_lens_cpu_upper_bound=seq_lens.clone(),
            for_cudagraph_capture=capture,
        )
    return builders


STEPS = ([3, 1, 4], [1, 1, 1], [9, 2])


def expected(query_lens: list[int]) -> tuple[list[int], bool]:
    rows = [i for i, n in enumerate(query_lens) for _ in range(n)]
    crosses = any(119 % 128 + n >= 128 for n in query_lens)  # context 120: 8 to spare
    return rows, crosses


@pytest.mark.parametrize("mode", ["stock", "1", "verify"])
def test_v2_computes_each_value_once_per_build(
    computations: dict[str, int], register_plugin: Any, stock_kernel: None, mode: str
) -> None:
    """Stock vLLM threads the index from group to group by hand and computes the
    boundary in every group; inside the plugin's scope both are computed once per
    build (in verify mode, stock's own computation runs once more per call)."""
    import vllm.v1.worker.gpu.model_states.default  # noqa: F401

    plugin = None if mode == "stock" else register_plugin(mode)
    if plugin is not None:
        plugin.reset_counters()
    for query_lens in STEPS:
        for b in v2_build(query_lens):
            assert b.built == [expected(query_lens)]
    if mode == "stock":
        assert computations == {"index": len(STEPS), "c128": GROUPS * len(STEPS)}
    elif mode == "1":
        assert computations == {"index": len(STEPS), "c128": len(STEPS)}
        assert plugin is not None
        assert plugin.counters()["vllm.v2.build_attn_metadata"] == {"scopes": 3}
    else:  # the plugin's computation, and stock vLLM's on every call, compared
        calls = GROUPS * len(STEPS)
        assert computations == {"index": len(STEPS) + calls, "c128": len(STEPS) + calls}


def test_v2_capture_builds_open_no_scope(
    computations: dict[str, int], register_plugin: Any
) -> None:
    """A build for CUDA-graph capture shares nothing, not even between its groups:
    some backends write ``seq_lens`` in place to capture."""
    import vllm.v1.worker.gpu.model_states.default  # noqa: F401

    plugin = register_plugin()
    plugin.reset_counters()
    for b in v2_build([2, 2], capture=True):
        assert b.built == [expected([2, 2])]
    assert computations == {"index": GROUPS, "c128": GROUPS}  # nothing shared
    assert plugin.counters()["vllm.v2.build_attn_metadata"] == {"unscoped": 1}
    assert stepcache.active_scope() is None


def test_what_a_scope_made_is_gone_after_the_build(
    computations: dict[str, int], register_plugin: Any
) -> None:
    import vllm.v1.worker.gpu.model_states.default  # noqa: F401

    register_plugin()
    stepcache.reset_stats()
    v2_build([2, 2])
    v2_build([2, 2])  # the same layout again, new tensors: computed again
    assert computations["index"] == 2
    row = stepcache.stats()[_vllm_metadata.INDEX_NAME]
    assert (row.misses, row.hits) == (2, 2 * (GROUPS - 1))


# -- V1's draft loop, and a stale index in stock vLLM ----------------------------------
def draft_loop(query_lens: list[int], draft_steps: int) -> list[list[int]]:
    """The request index each draft step's build gets, as V1's proposer runs them:
    ``SpecDecodeBaseProposer.propose`` builds for the first pass, reassigns the
    layout on the same object (one token per request), then builds once per draft
    step (``build_per_group_and_layer_attn_metadata``, vLLM's own, with a DSv4-like
    builder per draft group)."""
    from vllm.v1.spec_decode.llm_base_proposer import SpecDecodeBaseProposer

    from tests.vllm_plugin.conftest import layout_metadata

    builder = Builder()
    group = SimpleNamespace(
        layer_names=["mtp.0"],
        build_metadata_for_drafting=lambda common_attn_metadata, draft_index: (
            builder.build(common_attn_metadata)
        ),
    )
    proposer = SimpleNamespace(draft_attn_groups=[group])
    build = SpecDecodeBaseProposer.build_per_group_and_layer_attn_metadata
    with torch.inference_mode():
        cad = layout_metadata(query_lens, context=120)
        build(proposer, cad)  # the first pass
        batch_size = len(query_lens)
        cad.num_actual_tokens = batch_size  # llm_base_proposer.py, before the loop
        cad.max_query_len = 1
        cad.query_start_loc = torch.arange(batch_size + 1, dtype=torch.int32)
        cad.query_start_loc_cpu = torch.from_numpy(
            np.arange(batch_size + 1, dtype=np.int32)
        ).clone()
        for draft_index in range(1, draft_steps):
            cad.seq_lens_cpu_upper_bound += 1  # _update_positions_dependent_metadata
            build(proposer, cad, draft_index)
    return [rows for rows, _ in builder.built]


@needs_v1
def test_stock_vllm_hands_later_draft_steps_the_first_passs_index(
    stock: None, stock_kernel: None
) -> None:
    """DeepSeek V4 with MTP and more than one draft token on V1: the field keeps the
    first pass's index, and every later draft step reads its first rows."""
    rows = draft_loop([3, 2, 2], draft_steps=3)
    assert rows[0] == [0, 0, 0, 1, 1, 2, 2]
    assert rows[1:] == [[0, 0, 0], [0, 0, 0]]  # the right rows are [0, 1, 2]


@needs_v1
@pytest.mark.parametrize("mode", ["1", "verify"])
def test_the_plugin_gives_each_draft_step_its_own_index(
    register_plugin: Any, stock_kernel: None, mode: str
) -> None:
    plugin = register_plugin(mode)
    plugin.reset_counters()
    rows = draft_loop([3, 2, 2], draft_steps=3)
    assert rows == [[0, 0, 0, 1, 1, 2, 2], [0, 1, 2], [0, 1, 2]]
    draft = "vllm.v1.build_per_group_and_layer_attn_metadata"
    assert plugin.counters()[draft]["scopes"] == 3


# -- the other lifetimes, through probes in vLLM's place -------------------------------
def probe(seen: list[Any]) -> Callable[..., None]:
    # the parameters the scope's patch reads, where the V1 build has them
    def record(
        self: Any,
        num_tokens: int = 2,
        num_reqs: int = 1,
        max_query_len: int = 2,
        *args: Any,
        for_cudagraph_capture: bool = False,
    ) -> None:
        seen.append(stepcache.active_scope())

    return record


@needs_v1
@pytest.mark.parametrize("capture", [False, True])
def test_the_v1_build_opens_a_scope_except_for_capture(
    vllm_mod: ModuleType,
    register_plugin: Any,
    monkeypatch: pytest.MonkeyPatch,
    capture: bool,
) -> None:
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    seen: list[Any] = []
    from stepcache.integrations import vllm as plugin_module

    plugin_module.unregister()
    monkeypatch.setattr(GPUModelRunner, "_build_attention_metadata", probe(seen))
    register_plugin()
    GPUModelRunner._build_attention_metadata(object(), for_cudagraph_capture=capture)
    assert (seen[0] is None) is capture
    assert stepcache.active_scope() is None


def test_the_v2_draft_update_opens_a_scope_per_draft_step(
    vllm_mod: ModuleType, register_plugin: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from vllm.v1.worker.gpu.spec_decode.speculator import DraftModelSpeculator

    from stepcache.integrations import vllm as plugin_module

    seen: list[Any] = []

    def update(self: Any, attn_metadata: Any, num_reqs: int) -> None:
        seen.append(stepcache.active_scope())

    plugin_module.unregister()
    monkeypatch.setattr(DraftModelSpeculator, "_update_draft_decode_metadata", update)
    register_plugin()
    for _ in range(2):
        DraftModelSpeculator._update_draft_decode_metadata(object(), {}, 1)
    assert None not in seen and seen[0] is not seen[1]


@needs_v1
def test_a_draft_build_that_calls_its_parents_nests(
    vllm_mod: ModuleType, register_plugin: Any
) -> None:
    """DFlash's proposer calls the base proposer's build: two scopes, nested."""
    from vllm.v1.spec_decode.llm_base_proposer import SpecDecodeBaseProposer

    register_plugin()
    seen: list[Any] = []

    def build_metadata_for_drafting(common_attn_metadata: Any, draft_index: int) -> Any:
        seen.append(stepcache.active_scope())

    proposer = SimpleNamespace(
        draft_attn_groups=[
            SimpleNamespace(
                layer_names=["d"],
                build_metadata_for_drafting=build_metadata_for_drafting,
            )
        ]
    )
    build = SpecDecodeBaseProposer.build_per_group_and_layer_attn_metadata
    with stepcache.scope() as outer:
        build(proposer, object())
    assert seen[0] is not None and seen[0] is not outer
