# SPDX-License-Identifier: Apache-2.0
"""The layout caches of the plugin on vLLM 0.33's real GDN and Mamba2 builders
(tests/vllm_plugin/real_builders.py): ``split_decodes_and_prefills`` (as the GDN module
binds it), ``GDNAttentionMetadataBuilder._build_chunk_metadata``,
``CommonAttentionMetadata.compute_num_computed_tokens`` and
``BaseMambaAttentionMetadataBuilder._prefill_cpu_metadata``: stock vLLM's value for
any layout, once per build across the KV-cache groups inside the plugin's scope
(through V2's real ``build_attn_metadata``, and V1's copy per group), again for
another layout, never outside a scope, and a difference from stock raised in verify
mode."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from releases import needs_v1

import stepcache
from benchmarks import vllm_builders as real_builders
from stepcache.integrations.vllm import computed_tokens as _computed
from stepcache.integrations.vllm import gdn as _gdn
from stepcache.integrations.vllm import mamba as _mamba

pytestmark = pytest.mark.vllm

#: Qwen3-Next's tiny test model: three GDN layer groups (and one attention group)
GROUPS = 3
NAMES = {
    "split": _gdn.SPLIT_NAME,
    "chunks": _gdn.CHUNK_NAME,
    "computed": _computed.COMPUTED_NAME,
    "prefill": _mamba.PREFILL_NAME,
}
#: a prefill step with a decode in front: 1 decode, a first chunk, a later chunk
MIXED = ([1, 5, 70], [10, 0, 64])
#: the first step of three requests: prefills only
PREFILLS = ([3, 9, 70], 0)
#: a decode step
DECODES = ([1, 1, 1], [4, 9, 70])

HYPOTHESIS = settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)


@pytest.fixture
def cpu(vllm_mod: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    real_builders.cpu_ready(monkeypatch)


@pytest.fixture
def counted(cpu: None, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, int]]:
    """How often stock vLLM's functions compute, whoever calls them: counting
    wrappers in vLLM's place, installed before the plugin registers (the plugin
    keeps the function it finds, and calls it on a miss)."""
    from vllm.v1.attention.backend import CommonAttentionMetadata
    from vllm.v1.attention.backends import gdn_attn, mamba_attn

    from stepcache.integrations import vllm as plugin_module

    plugin_module.unregister()
    counts = dict.fromkeys(NAMES, 0)

    targets = [
        (gdn_attn, "split_decodes_and_prefills", "split"),
        (gdn_attn.GDNAttentionMetadataBuilder, "_build_chunk_metadata", "chunks"),
        (CommonAttentionMetadata, "compute_num_computed_tokens", "computed"),
        (
            mamba_attn.BaseMambaAttentionMetadataBuilder,
            "_prefill_cpu_metadata",
            "prefill",
        ),
    ]
    for owner, attr, what in targets:
        monkeypatch.setattr(
            owner, attr, real_builders.counting(counts, what, getattr(owner, attr))
        )
    yield counts


def layout(query_lens: list[int], context: list[int] | int) -> dict[str, Any]:
    return real_builders.step_layout(query_lens, context)


# -- stock vLLM's value, for any layout ------------------------------------------------
decode_first = st.tuples(
    st.lists(st.integers(1, 60), min_size=0, max_size=3),  # decodes' contexts
    st.lists(  # prefills: (query length, context; 0: the first chunk)
        st.tuples(st.integers(2, 90), st.sampled_from([0, 0, 7, 64])),
        min_size=0,
        max_size=4,
    ),
).filter(lambda t: len(t[0]) + len(t[1]) > 0)


def _lens(
    batch: tuple[list[int], list[tuple[int, int]]],
) -> tuple[list[int], list[int]]:
    decodes, prefills = batch
    return [1] * len(decodes) + [n for n, _ in prefills], decodes + [
        c for _, c in prefills
    ]


@HYPOTHESIS
@given(
    batch=decode_first,
    flags=st.lists(st.booleans(), min_size=7, max_size=7),
    threshold=st.integers(1, 4),
    uniform=st.booleans(),
    short_as_decodes=st.booleans(),
)
def test_split_equals_stock_for_any_layout(
    plugin: ModuleType,
    batch: tuple[list[int], list[tuple[int, int]]],
    flags: list[bool],
    threshold: int,
    uniform: bool,
    short_as_decodes: bool,
) -> None:
    from vllm.v1.attention.backends import gdn_attn

    lens, context = _lens(batch)
    cm = real_builders.common_metadata(layout(lens, context))
    with torch.inference_mode():
        cm.is_prefilling = torch.tensor(flags[: len(lens)])
    kwargs = {
        "decode_threshold": threshold,
        "require_uniform": uniform,
        "treat_short_extends_as_decodes": short_as_decodes,
    }
    stock = _gdn._original[_gdn.SPLIT_NAME](cm, **kwargs)
    assert gdn_attn.split_decodes_and_prefills(cm, **kwargs) == stock
    with stepcache.scope():
        assert gdn_attn.split_decodes_and_prefills(cm, **kwargs) == stock
        # another group's object: a new is_prefilling tensor with the same flags
        with torch.inference_mode():
            other = cm.replace(is_prefilling=cm.is_prefilling.clone())
        assert gdn_attn.split_decodes_and_prefills(other, **kwargs) == stock


@HYPOTHESIS
@given(batch=decode_first)
def test_gdn_chunk_metadata_equals_stock_for_any_layout(
    plugin: ModuleType, cpu: None, batch: tuple[list[int], list[tuple[int, int]]]
) -> None:
    lens, _ = _lens(batch)
    builders = [real_builders.gdn_builder() for _ in range(2)]
    with torch.inference_mode():
        qsl = torch.tensor([0, *lens], dtype=torch.int32).cumsum(0).to(torch.int32)
    stock = _gdn._original[_gdn.CHUNK_NAME](builders[0], qsl, qsl, qsl.device)
    with stepcache.scope():
        for builder in builders:  # each group's prefill rows: a tensor of its own
            ours = builder._build_chunk_metadata(qsl, qsl.clone(), qsl.device)
            assert stepcache.first_difference(stock, ours) is None


@HYPOTHESIS
@given(batch=decode_first)
def test_num_computed_tokens_equals_stock_for_any_layout(
    plugin: ModuleType, batch: tuple[list[int], list[tuple[int, int]]]
) -> None:
    lens, context = _lens(batch)
    step = layout(lens, context)
    original = _computed._original[_computed.COMPUTED_NAME]
    stock = original(real_builders.common_metadata(step))
    assert stock.tolist() == [c for c in context]
    with stepcache.scope():
        for group in range(GROUPS):
            ours = real_builders.common_metadata(
                step, group
            ).compute_num_computed_tokens()
            assert stepcache.first_difference(stock, ours) is None


@HYPOTHESIS
@given(batch=decode_first)
def test_mamba_prefill_cpu_metadata_equals_stock_for_any_layout(
    plugin: ModuleType, cpu: None, batch: tuple[list[int], list[tuple[int, int]]]
) -> None:
    decodes, prefills = batch
    lens, context = _lens(batch)
    cm = real_builders.common_metadata(layout(lens, context))
    builder = real_builders.mamba2_builder()
    args = (len(lens), len(prefills), len(decodes))
    stock = _mamba._original[_mamba.PREFILL_NAME](builder, cm, *args)
    with stepcache.scope():
        for _ in range(2):
            ours = builder._prefill_cpu_metadata(cm, *args)
            assert stepcache.first_difference(stock, ours) is None


# -- once per build, across the groups -------------------------------------------------
def _gdn_fields(md: Any) -> dict[str, Any]:
    fields = {f.name: getattr(md, f.name) for f in dataclasses.fields(md)}
    # a group's own state slots, and the builder's per-group staging buffers
    for own in ("non_spec_state_indices_tensor", "prefill_state_indices", "checkpoint"):
        fields.pop(own)
    return fields


@pytest.mark.parametrize("runner", [pytest.param("v1", marks=needs_v1), "v2"])
@pytest.mark.parametrize("mode", ["stock", "1", "verify"])
@pytest.mark.parametrize(
    ("step", "computations"),
    [
        (MIXED, {"split": 1, "chunks": 1, "computed": 1}),
        (PREFILLS, {"split": 1, "chunks": 1, "computed": 1}),
        (DECODES, {"split": 1, "chunks": 0, "computed": 0}),
    ],
    ids=["mixed", "prefills", "decodes"],
)
def test_gdn_groups_compute_once_per_build(
    counted: dict[str, int],
    register_plugin: Any,
    runner: str,
    mode: str,
    step: tuple[list[int], Any],
    computations: dict[str, int],
) -> None:
    """Stock vLLM computes each per KV-cache group (3 here); in the plugin's scope
    once per build (in verify mode, stock also computes once per call)."""
    plugin = None if mode == "stock" else register_plugin(mode)
    builders = [real_builders.gdn_builder() for _ in range(GROUPS)]
    step_layout = layout(*step)
    if runner == "v2":
        built = real_builders.v2_build(builders, step_layout)
    else:
        with stepcache.scope() if plugin is not None else _no_scope():
            built = real_builders.v1_build(builders, step_layout)
    for md in built[1:]:  # every group got the same batch-level metadata
        assert (
            stepcache.first_difference(_gdn_fields(built[0]), _gdn_fields(md)) is None
        )
    counts = {k: counted[k] for k in computations}
    if mode == "stock":
        assert counts == {k: GROUPS * n for k, n in computations.items()}
    elif mode == "1":
        assert counts == computations
    else:
        assert counts == {k: n + GROUPS * n for k, n in computations.items()}


class _no_scope:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


@pytest.mark.parametrize("runner", [pytest.param("v1", marks=needs_v1), "v2"])
@pytest.mark.parametrize("mode", ["stock", "1"])
def test_the_mamba2_builder_computes_its_prefill_rows_once(
    counted: dict[str, int], register_plugin: Any, runner: str, mode: str
) -> None:
    """``build`` asks ``_prefill_cpu_metadata`` and so does its
    ``_build_chunk_metadata_tensors``: twice in stock vLLM, once in the scope."""
    if mode != "stock":
        register_plugin(mode)
    builder = real_builders.mamba2_builder()
    step = layout(*MIXED)
    if runner == "v2":
        (md,) = real_builders.v2_build([builder], step)
    else:
        with stepcache.scope() if mode != "stock" else _no_scope():
            (md,) = real_builders.v1_build([builder], step)
    assert (md.num_decodes, md.num_prefills) == (1, 2)
    assert md.prep_initial_states is True  # the later chunk has computed tokens
    assert counted["prefill"] == (2 if mode == "stock" else 1)


@pytest.mark.parametrize("runner", [pytest.param("v1", marks=needs_v1), "v2"])
def test_debug_checks_find_nothing_in_a_build(
    counted: dict[str, int], register_plugin: Any, runner: str
) -> None:
    """Debug mode's checks on every layout cache, through vLLM's real builders: no
    key function reads an input it does not declare (``is_prefilling`` is an argument
    of the split cache, the backend a dependency of the chunk cache), nothing is
    detected, and each value still serves every group of its build (checks mode
    computes again where an input the function reads but does not declare is another
    object: ``is_prefilling``, vLLM's own field, each group's own)."""
    register_plugin("1")
    stepcache.clear_debug_report()
    stepcache.reset_stats()
    gdn = [real_builders.gdn_builder() for _ in range(GROUPS)]
    mamba = [real_builders.mamba2_builder()]
    with stepcache.debug("checks"):
        for builders in (gdn, mamba):
            if runner == "v2":
                real_builders.v2_build(builders, layout(*MIXED))
            else:
                with stepcache.scope():
                    real_builders.v1_build(builders, layout(*MIXED))
    assert list(stepcache.debug_report()) == []
    stats = stepcache.stats()
    for name in NAMES.values():
        assert stats[name].hits >= 1 and stats[name].misses >= 1, (name, stats[name])
    assert stats[_gdn.SPLIT_NAME].hits == GROUPS - 1  # one build, three groups


def test_each_cache_is_named_in_stats(
    counted: dict[str, int], register_plugin: Any
) -> None:
    register_plugin()
    stepcache.reset_stats()
    real_builders.v2_build(
        [real_builders.gdn_builder() for _ in range(GROUPS)], layout(*MIXED)
    )
    real_builders.v2_build([real_builders.mamba2_builder()], layout(*MIXED))
    stats = stepcache.stats()
    for name in NAMES.values():
        row = stats[name]
        assert row.misses >= 1 and row.hits >= 1, (name, row)
        assert row.live_entries == 0  # dropped when the build's scope closed


# -- another layout, no scope ----------------------------------------------------------
def test_another_layout_computes_again(
    counted: dict[str, int], register_plugin: Any
) -> None:
    """A new build (its own scope) computes; so does, within one build, an object
    with other layout tensors, or other is_prefilling flags."""
    from vllm.v1.attention.backends import gdn_attn

    register_plugin()
    builders = [real_builders.gdn_builder() for _ in range(GROUPS)]
    real_builders.v2_build(builders, layout(*MIXED))
    real_builders.v2_build(builders, layout(*MIXED))  # the same values, new tensors
    assert counted["split"] == counted["chunks"] == counted["computed"] == 2
    split = functools.partial(
        gdn_attn.split_decodes_and_prefills,
        decode_threshold=1,
        treat_short_extends_as_decodes=False,
    )
    with stepcache.scope():
        cm = real_builders.common_metadata(layout(*MIXED))
        assert split(cm) == (1, 2, 1, 75)
        with torch.inference_mode():
            flags = torch.tensor([True, True, True])
        assert split(cm.replace(is_prefilling=flags)) == (0, 3, 0, 76)
        other = real_builders.common_metadata(layout([1, 1, 70], [3, 3, 0]))
        assert split(other) == (2, 1, 2, 70)
        assert other.compute_num_computed_tokens().tolist() == [3, 3, 0]
        assert cm.compute_num_computed_tokens().tolist() == [10, 0, 64]
    assert counted["split"] == 2 + 3 and counted["computed"] == 2 + 2


def test_flags_and_rows_of_another_dtype_or_shape_are_another_input(
    plugin_on: ModuleType, cpu: None
) -> None:
    """The split's is_prefilling and the chunk metadata's prefill rows, with the
    values of a cached call in another dtype (``1 == True``) or shape: stock's value,
    or stock's error, never the cached value."""
    from vllm.v1.attention.backends import gdn_attn

    split = functools.partial(
        gdn_attn.split_decodes_and_prefills,
        decode_threshold=1,
        treat_short_extends_as_decodes=False,
    )
    cm = real_builders.common_metadata(layout(*DECODES))
    builder = real_builders.gdn_builder()
    with stepcache.scope(), torch.inference_mode():
        assert split(cm.replace(is_prefilling=torch.tensor([False, True, False]))) == (
            1,
            2,
            1,
            2,
        )
        for flags in (torch.tensor([0, 1, 0]), torch.tensor([[False, True, False]])):
            with pytest.raises(RuntimeError, match="output"):
                split(cm.replace(is_prefilling=flags))
        for dtype in (torch.int32, torch.int64):
            rows = torch.tensor([0, 70, 75], dtype=dtype)
            indices, _ = builder._build_chunk_metadata(rows, rows, rows.device)
            assert indices.dtype == dtype


def test_outside_a_scope_every_call_computes(
    counted: dict[str, int], register_plugin: Any
) -> None:
    """No build, no scope: vLLM's functions compute on every call (bypasses), and a
    build for CUDA-graph capture opens none (some backends write seq_lens in place
    to capture)."""
    from vllm.v1.attention.backends import gdn_attn

    register_plugin()
    stepcache.reset_stats()
    cm = real_builders.common_metadata(layout(*MIXED))
    builder = real_builders.mamba2_builder()
    for _ in range(2):
        gdn_attn.split_decodes_and_prefills(cm)
        cm.replace().compute_num_computed_tokens()
        builder._prefill_cpu_metadata(cm, 3, 2, 1)
    assert (counted["split"], counted["computed"], counted["prefill"]) == (2, 2, 2)
    builders = [real_builders.gdn_builder() for _ in range(GROUPS)]
    real_builders.v2_build(builders, layout(*DECODES), capture=True)
    assert counted["split"] == 2 + GROUPS
    assert stepcache.stats()[_gdn.SPLIT_NAME].bypasses == 2 + GROUPS


def test_split_is_replaced_in_the_gdn_module_only(plugin: ModuleType) -> None:
    """The other builders ask once per build: they keep vLLM's function."""
    from vllm.v1.attention.backends import gdn_attn, mamba_attn, utils
    from vllm.v1.attention.backends.mla import sparse_swa

    assert gdn_attn.split_decodes_and_prefills.__module__ == _gdn.__name__
    assert utils.split_decodes_and_prefills.__module__ == utils.__name__
    for module in (mamba_attn, sparse_swa):
        assert module.split_decodes_and_prefills is utils.split_decodes_and_prefills


# -- verify mode -----------------------------------------------------------------------
def test_a_write_inside_the_scope_is_caught_by_verify(
    cpu: None, register_plugin: Any
) -> None:
    """The scope's promise broken: a layout tensor made in the step (an inference
    tensor, matched by identity inside a scope) written in place between two
    groups' calls. Mode 1 hands the second group the first one's value (the hazard
    docs/limits.md names); verify mode raises, naming the patch."""
    from vllm.v1.attention.backends import gdn_attn

    def second_group(mode: str) -> Any:
        register_plugin(mode)
        step = layout(*MIXED)
        builder = real_builders.mamba2_builder()
        with stepcache.scope(), torch.inference_mode():
            first = real_builders.common_metadata(step)
            gdn_attn.split_decodes_and_prefills(first)
            first.compute_num_computed_tokens()
            builder._prefill_cpu_metadata(first, 3, 2, 1)
            step["query_start_loc_cpu"][1:] += 1  # all three, in place
            step["seq_lens"] += 1
            step["seq_lens_cpu_upper_bound"] += 1
            second = real_builders.common_metadata(step, group=1)
            return (
                gdn_attn.split_decodes_and_prefills(second, decode_threshold=1),
                second.compute_num_computed_tokens().tolist(),
                builder._prefill_cpu_metadata(second, 3, 2, 1)[0].tolist(),
            )

    # stock vLLM's values here: (0, 3, 0, 76), [11, 1, 65], [1, 65]
    assert second_group("1") == ((1, 2, 1, 75), [10, 0, 64], [0, 64])
    with pytest.raises(stepcache.StaleCacheError, match=_gdn.SPLIT_NAME):
        second_group("verify")


@pytest.mark.parametrize(
    "what", ["computed", "prefill"], ids=["compute_num_computed_tokens", "prefill"]
)
def test_verify_names_each_cache_that_differs(
    cpu: None, register_plugin: Any, what: str
) -> None:
    from stepcache.integrations import vllm as plugin_module

    register_plugin("verify").reset_counters()
    step = layout(*MIXED)
    builder = real_builders.mamba2_builder()
    with stepcache.scope(), torch.inference_mode():
        first = real_builders.common_metadata(step)
        call: Callable[[Any], Any] = (
            (lambda cm: cm.compute_num_computed_tokens())
            if what == "computed"
            else (lambda cm: builder._prefill_cpu_metadata(cm, 3, 2, 1))
        )
        call(first)
        step["seq_lens"] += 1
        step["seq_lens_cpu_upper_bound"] += 1
        with pytest.raises(stepcache.StaleCacheError, match=NAMES[what]):
            call(real_builders.common_metadata(step, group=1))
    assert plugin_module.counters()[NAMES[what]]["verified"] == 2


def test_verify_catches_chunk_metadata_that_differs_from_stock(
    cpu: None, register_plugin: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The chunk cache keys on the values of the prefill rows; an input it does not
    key on (FLA's chunk size, a constant) changed between two groups: verify mode
    finds the other value."""
    from vllm.third_party.flash_linear_attention.ops import utils as fla_utils

    register_plugin("verify")
    builders = [real_builders.gdn_builder() for _ in range(2)]
    with torch.inference_mode():
        qsl = torch.tensor([0, 70, 75], dtype=torch.int32)
    with stepcache.scope():
        builders[0]._build_chunk_metadata(qsl, qsl, qsl.device)
        monkeypatch.setattr(fla_utils, "FLA_CHUNK_SIZE", 32)
        with pytest.raises(stepcache.StaleCacheError, match=_gdn.CHUNK_NAME):
            builders[1]._build_chunk_metadata(qsl, qsl, qsl.device)


def _record_scopes(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """V1's build replaced by one that records whether it runs in a scope (the
    plugin's scope patch wraps it), for each call."""
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    seen: list[bool] = []

    def build(
        self: Any,
        num_tokens: int,
        num_reqs: int,
        max_query_len: int,
        *args: Any,
        for_cudagraph_capture: bool = False,
    ) -> None:
        seen.append(stepcache.active_scope() is not None)

    monkeypatch.setattr(GPUModelRunner, "_build_attention_metadata", build)
    return seen


@needs_v1
def test_a_build_of_decodes_opens_no_scope_while_only_mamba_builders_are_made(
    cpu: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The Mamba family's builders share values for prefill rows only: an engine
    that made no other builder opens a scope in V1's builds with a prefill, not in
    builds of decodes only (``max_query_len`` 1); once a GDN builder is made, its
    groups share in every build."""
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    from stepcache.integrations import vllm as plugin_module

    plugin_module.unregister()
    seen = _record_scopes(monkeypatch)
    # a process whose engine has made no builder yet
    fresh = dataclasses.replace(plugin_module.PLUGIN)
    monkeypatch.setenv(plugin_module.ENV, "1")
    # the split, which GDN's decodes call, and the Mamba builders' cache added (both
    # off by default)
    monkeypatch.setenv(
        plugin_module.ADD_ENV, f"{_gdn.SPLIT_NAME},{_mamba.PREFILL_NAME}"
    )
    fresh.register()
    try:
        real_builders.mamba2_builder()
        GPUModelRunner._build_attention_metadata(None, 3, 3, 1)  # decodes
        GPUModelRunner._build_attention_metadata(None, 12, 3, 9)  # a prefill
        GPUModelRunner._build_attention_metadata(None, 3, 3, max_query_len=1)
        real_builders.gdn_builder()
        GPUModelRunner._build_attention_metadata(None, 3, 3, 1)
        assert seen == [False, True, False, True]
    finally:
        fresh.unregister()


@needs_v1
def test_by_default_mamba_builders_open_no_scope_and_apply_no_layout_cache(
    cpu: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the plugin's defaults the Mamba family's builders share nothing (their
    cache is off by default): an engine that makes only them opens no scope, and
    the computed-token counts, which only GDN's groups share, stay vLLM's own until
    a GDN builder is made."""
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    from stepcache.integrations import vllm as plugin_module

    plugin_module.unregister()
    seen = _record_scopes(monkeypatch)
    fresh = dataclasses.replace(plugin_module.PLUGIN)
    monkeypatch.setenv(plugin_module.ENV, "1")
    monkeypatch.delenv(plugin_module.ADD_ENV, raising=False)
    monkeypatch.delenv(plugin_module.SKIP_ENV, raising=False)
    fresh.register()
    try:
        real_builders.mamba2_builder()
        GPUModelRunner._build_attention_metadata(None, 12, 3, 9)  # a prefill
        status = fresh.status()
        assert status[_mamba.PREFILL_NAME].startswith("skipped: off by default")
        for name in (_computed.COMPUTED_NAME, _gdn.CHUNK_NAME):
            assert status[name] == "waiting for a builder that shares it"
        real_builders.gdn_builder()
        GPUModelRunner._build_attention_metadata(None, 12, 3, 9)
        GPUModelRunner._build_attention_metadata(None, 3, 3, 1)  # decodes
        assert seen == [False, True, False]
        status = fresh.status()
        assert status[_computed.COMPUTED_NAME] == status[_gdn.CHUNK_NAME] == "applied"
        assert status[_mamba.PREFILL_NAME].startswith("skipped: off by default")
    finally:
        fresh.unregister()


@needs_v1
@pytest.mark.parametrize("skip", [False, True])
def test_the_split_off_or_left_out_is_vllms_own_and_gdn_decodes_open_no_scope(
    cpu: None, monkeypatch: pytest.MonkeyPatch, skip: bool
) -> None:
    """By default, or named by ``STEPCACHE_VLLM_SKIP``, the GDN split is not cached:
    the GDN module keeps vLLM's function, the other GDN caches apply, and a GDN
    builder's build of decodes only (which calls nothing else cached) opens no scope;
    one with a prefill does."""
    from vllm.v1.attention.backends import gdn_attn
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    from stepcache.integrations import vllm as plugin_module

    plugin_module.unregister()
    stock_split = gdn_attn.split_decodes_and_prefills
    seen = _record_scopes(monkeypatch)
    fresh = dataclasses.replace(plugin_module.PLUGIN)
    monkeypatch.setenv(plugin_module.ENV, "1")
    monkeypatch.delenv(plugin_module.ADD_ENV, raising=False)
    why = f"off by default ({plugin_module.ADD_ENV}={_gdn.SPLIT_NAME} applies it)"
    if skip:
        monkeypatch.setenv(plugin_module.SKIP_ENV, _gdn.SPLIT_NAME)
        why = f"left out by {plugin_module.SKIP_ENV}"
    fresh.register()
    try:
        real_builders.gdn_builder()
        status = fresh.status()
        assert status[_gdn.SPLIT_NAME] == f"skipped: {why}"
        assert status[_gdn.CHUNK_NAME] == "applied"
        assert gdn_attn.split_decodes_and_prefills is stock_split
        GPUModelRunner._build_attention_metadata(None, 3, 3, 1)  # decodes
        GPUModelRunner._build_attention_metadata(None, 12, 3, 9)  # a prefill
        assert seen == [False, True]
    finally:
        fresh.unregister()
