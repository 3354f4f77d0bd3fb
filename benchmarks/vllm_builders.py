# SPDX-License-Identifier: Apache-2.0
"""vLLM's real GDN, Kimi KDA and Mamba2 metadata builders on the CPU, and one step's build
through Model Runner V2's real ``build_attn_metadata`` or V1's copy per group.

The builders are vLLM's own classes, made with vLLM's ``__init__``; three things of
this CPU-only venv are set aside first (:func:`cpu_ready`): pinned memory (no CUDA
driver), the GDN layer module's import (it pulls in quantization packages the venv
lacks; only its backend resolver is asked, stood in by one that answers ``triton``),
and Triton's driver query while FLA's ops import (the conftest reports a GPU driver
active so that vLLM keeps Triton; FLA then asks that driver for its target, which
fails here: it is told there is none, as on a plain CPU).
"""

from __future__ import annotations

import contextlib
import copy
import functools
import sys
import types
from collections.abc import Callable, Iterator, Sequence
from types import SimpleNamespace
from typing import Any

import pytest
import torch

import stepcache

_GDN_LAYER = "vllm.model_executor.layers.mamba.gdn.qwen_gdn_linear_attn"
_FLA_INDEX = "vllm.third_party.flash_linear_attention.ops.index"


class _NoTarget:
    def get_current_target(self) -> Any:
        raise RuntimeError("no GPU: FLA falls back to the CPU")


def _import_fla() -> None:
    if _FLA_INDEX in sys.modules:
        return
    import importlib

    import triton

    driver = triton.runtime.driver
    saved = driver._active
    driver._active = _NoTarget()
    try:
        importlib.import_module(_FLA_INDEX)
    finally:
        driver._active = saved


def cpu_ready(monkeypatch: pytest.MonkeyPatch) -> None:
    """What vLLM's builders need to build on this CPU, undone after the test."""
    import vllm.v1.attention.backends.gdn_attn  # noqa: F401
    import vllm.v1.attention.backends.mamba2_attn  # noqa: F401

    for module in list(sys.modules.values()):
        name = getattr(module, "__name__", "")
        if name.startswith("vllm") and vars(module).get("PIN_MEMORY") is True:
            monkeypatch.setattr(module, "PIN_MEMORY", False)
    try:
        __import__(_GDN_LAYER)
    except ImportError:
        stand_in = types.ModuleType(_GDN_LAYER)
        stand_in._resolve_gdn_prefill_backend = (  # type: ignore[attr-defined]
            lambda config: (None, "triton")
        )
        monkeypatch.setitem(sys.modules, _GDN_LAYER, stand_in)
    _import_fla()


def _config(chunk_size: int = 64) -> Any:
    from vllm.config import DeviceConfig, VllmConfig

    config = VllmConfig(device_config=DeviceConfig(device="cpu"))
    # Mamba2's builder asks the model config for its chunk size only
    model = SimpleNamespace(get_mamba_chunk_size=lambda: chunk_size)
    object.__setattr__(config, "model_config", model)
    return config


def _spec() -> Any:
    from vllm.v1.kv_cache_interface import MambaSpec

    return MambaSpec(block_size=16, shapes=((4, 4),), dtypes=(torch.float32,))


def gdn_builder() -> Any:
    """vLLM's ``GDNAttentionMetadataBuilder`` (Triton prefill backend, CPU)."""
    from vllm.v1.attention.backends.gdn_attn import GDNAttentionMetadataBuilder

    return GDNAttentionMetadataBuilder(_spec(), ["gdn"], _config(), torch.device("cpu"))


_KIMI = ("vllm.models.kimi_k3", "vllm.models.kimi_k3.nvidia")


def kda_builder(monkeypatch: pytest.MonkeyPatch) -> Any:
    """vLLM's ``KimiK3KDAMetadataBuilder`` (a GDN builder's subclass), CPU. Kimi's
    package ``__init__`` imports the whole model (quantization packages the venv
    lacks): its packages stand empty, so only the metadata module is imported."""
    import importlib.util

    for name in _KIMI:
        if name in sys.modules and hasattr(sys.modules[name], "__file__"):
            continue
        spec = importlib.util.find_spec(name)
        assert spec is not None and spec.submodule_search_locations is not None
        package = types.ModuleType(name)
        package.__path__ = list(spec.submodule_search_locations)
        package.__spec__ = spec
        monkeypatch.setitem(sys.modules, name, package)
    from vllm.models.kimi_k3.nvidia.kda_metadata import KimiK3KDAMetadataBuilder

    return KimiK3KDAMetadataBuilder(_spec(), ["kda"], _config(), torch.device("cpu"))


def mamba2_builder(chunk_size: int = 64) -> Any:
    """vLLM's ``Mamba2AttentionMetadataBuilder`` (CPU)."""
    from vllm.v1.attention.backends.mamba2_attn import Mamba2AttentionMetadataBuilder

    return Mamba2AttentionMetadataBuilder(
        _spec(), ["mamba"], _config(chunk_size), torch.device("cpu")
    )


def step_layout(
    query_lens: Sequence[int], context: Sequence[int] | int = 0
) -> dict[str, Any]:
    """One step's layout tensors, made under inference mode as an engine step makes
    them: decodes first (the batch order vLLM's reorder gives these builders); a row
    is prefilling while its query runs from context 0, or is longer than 1."""
    lens = list(query_lens)
    ctx = [context] * len(lens) if isinstance(context, int) else list(context)
    with torch.inference_mode():
        qsl = torch.zeros(len(lens) + 1, dtype=torch.int32)
        qsl[1:] = torch.tensor(lens, dtype=torch.int32).cumsum(0)
        seq_lens = torch.tensor(
            [c + n for c, n in zip(ctx, lens, strict=True)], dtype=torch.int32
        )
        prefilling = torch.tensor(
            [c == 0 or n > 1 for c, n in zip(ctx, lens, strict=True)],
            dtype=torch.bool,
        )
        return {
            "query_start_loc": qsl,
            "query_start_loc_cpu": qsl.clone(),
            "seq_lens": seq_lens,
            "seq_lens_cpu_upper_bound": seq_lens.clone(),
            "is_prefilling": prefilling,
            "num_reqs": len(lens),
            "num_actual_tokens": int(qsl[-1]),
            "max_query_len": max(lens),
            "max_seq_len": int(seq_lens.max()),
        }


def common_metadata(layout: dict[str, Any], group: int = 0) -> Any:
    """A ``CommonAttentionMetadata`` of ``layout``, with group ``group``'s own block
    table and slot mapping."""
    from vllm.v1.attention.backend import CommonAttentionMetadata

    with torch.inference_mode():
        reqs, tokens = layout["num_reqs"], layout["num_actual_tokens"]
        return CommonAttentionMetadata(
            block_table_tensor=torch.arange(reqs * 4, dtype=torch.int32).reshape(
                reqs, 4
            )
            + 100 * group,
            slot_mapping=torch.arange(tokens, dtype=torch.int64) + 1000 * group,
            **layout,
        )


def v1_build(builders: Sequence[Any], layout: dict[str, Any]) -> list[Any]:
    """What V1's ``GPUModelRunner._build_attention_metadata`` does with them: one
    ``copy(cm_base)`` per KV-cache group, its own block table and slot mapping, each
    group's builder building from its copy (the caller opens the scope the plugin
    opens around that method, or none)."""
    base = common_metadata(layout)
    out = []
    for gid, builder in enumerate(builders):
        cm = copy.copy(base)
        if gid > 0:
            own = common_metadata(layout, gid)
            cm.block_table_tensor, cm.slot_mapping = (
                own.block_table_tensor,
                (own.slot_mapping),
            )
        out.append(builder.build(0, cm))
    return out


def v2_build(
    builders: Sequence[Any], layout: dict[str, Any], capture: bool = False
) -> list[Any]:
    """One step's metadata through V2's real ``build_attn_metadata`` (bound by name
    in the default model state, as a step calls it), one KV-cache group per builder;
    the built metadata, in group order."""
    import vllm.v1.worker.gpu.model_states.default as default_state

    def group(builder: Any, i: int) -> Any:
        return SimpleNamespace(
            get_metadata_builder=lambda ubatch_idx=0: builder,
            kv_cache_spec=object(),  # no Mamba reuse between groups
            layer_names=[f"layer.{i}"],
            build_metadata=lambda cm, ubatch_idx=0, **kw: builder.build(0, cm),
            build_metadata_for_cudagraph_capture=lambda cm, ubatch_idx=0: builder.build(
                0, cm
            ),
        )

    n = len(builders)
    reqs, tokens = layout["num_reqs"], layout["num_actual_tokens"]
    with torch.inference_mode():
        tables = [common_metadata(layout, g).block_table_tensor for g in range(n)]
        slots = torch.stack([common_metadata(layout, g).slot_mapping for g in range(n)])
    # bound by name in the model state's module, as a step calls it (not exported)
    build_attn_metadata: Callable[..., dict[str, Any]] = getattr(  # noqa: B009
        default_state, "build_attn_metadata"
    )
    built = build_attn_metadata(
        [[group(b, i)] for i, b in enumerate(builders)],
        num_reqs=reqs,
        num_tokens=tokens,
        query_start_loc_gpu=layout["query_start_loc"],
        query_start_loc_cpu=layout["query_start_loc_cpu"],
        max_query_len=layout["max_query_len"],
        seq_lens=layout["seq_lens"],
        max_seq_len=layout["max_seq_len"],
        block_tables=tables,
        slot_mappings=slots,
        kv_cache_config=SimpleNamespace(kv_cache_groups=[None] * n),
        seq_lens_cpu_upper_bound=layout["seq_lens_cpu_upper_bound"],
        is_prefilling=layout["is_prefilling"],
        for_cudagraph_capture=capture,
    )
    return [built[f"layer.{i}"] for i in range(n)]


@contextlib.contextmanager
def maybe_scope(scoped: bool) -> Iterator[None]:
    """A :func:`stepcache.scope` where ``scoped``, else nothing."""
    if not scoped:
        yield
        return
    with stepcache.scope():
        yield


def counting(
    counts: dict[str, int], what: str, fn: Callable[..., Any]
) -> Callable[..., Any]:
    """``fn``, adding 1 to ``counts[what]`` on each call (a test installs it in
    vLLM's place to count stock's computations beneath the plugin)."""

    @functools.wraps(fn)
    def counted(*args: Any, **kwargs: Any) -> Any:
        counts[what] += 1
        return fn(*args, **kwargs)

    return counted


def counted_calls(
    monkeypatch: pytest.MonkeyPatch,
    owner: object,
    attr: str,
    what: str,
    descriptor: Callable[[Callable[..., Any]], Any] | None = None,
) -> dict[str, int]:
    """The plugin unregistered; vLLM's ``owner.attr`` (under ``what``) and every
    ``.item()`` (``items``) counted by wrappers installed before the plugin registers
    (it keeps the function it finds). ``descriptor`` wraps the counter as the
    original is (``staticmethod``)."""
    from stepcache.integrations import vllm as plugin_module

    plugin_module.unregister()
    seen = {what: 0, "items": 0}
    wrapped = counting(seen, what, getattr(owner, attr))
    monkeypatch.setattr(
        owner, attr, wrapped if descriptor is None else descriptor(wrapped)
    )
    monkeypatch.setattr(
        torch.Tensor, "item", counting(seen, "items", torch.Tensor.item)
    )
    return seen
