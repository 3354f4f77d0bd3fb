# SPDX-License-Identifier: Apache-2.0
"""Real-vLLM tests: vLLM 0.33 on the CPU, its Triton kernels in Triton's interpreter.

Stock vLLM computes the request index with a Triton kernel. On a machine without a GPU,
vLLM replaces Triton by a placeholder and the kernel cannot run; Triton's interpreter
runs it on CPU tensors, if it is switched on before vLLM's modules are imported (the
``@triton.jit`` decorator reads ``TRITON_INTERPRET`` when vLLM's kernels are defined,
and vLLM keeps Triton only if a GPU driver reports itself active). This conftest is
imported while pytest collects this folder, before any test imports vLLM, so it does
both here. Nothing else in this repository imports vLLM at collection time.

If vLLM was imported before (by another plugin of the pytest process), the kernels
cannot be interpreted any more: the tests that need them fail with that explanation
(the fixture ``stock_kernel``), and the others run.

``STEPCACHE_REQUIRE_VLLM=1`` (the test command sets it) turns the skip of a test here
into a failure: a broken vLLM install fails the run instead of skipping its tests.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import pytest
from releases import GONE
from require_vllm import skip_fails, vllm_or_skip, vllm_problem

#: why vLLM's Triton kernels cannot run in this process (None: they can)
NO_KERNELS: str | None = vllm_problem()  # not None: every test here skips
if NO_KERNELS is None and "vllm" in sys.modules:
    NO_KERNELS = (
        "vLLM was imported before tests/vllm_plugin/conftest.py could switch "
        "Triton's interpreter on: run tests/vllm_plugin in a pytest process that "
        "imports vLLM nowhere else"
    )
elif NO_KERNELS is None:
    os.environ["TRITON_INTERPRET"] = "1"
    try:
        from triton.backends import backends
    except ImportError:
        NO_KERNELS = "Triton is not installed (vLLM's CPU requirements pull it in)"
    else:
        if "nvidia" in backends:
            backends["nvidia"].driver.is_active = staticmethod(lambda: True)
        else:
            NO_KERNELS = "this Triton has no NVIDIA backend to interpret"


pytest_runtest_makereport = skip_fails(
    "vLLM", "(the vLLM this run installed does not work here)"
)


@pytest.fixture(scope="session")
def vllm_mod() -> ModuleType:
    """vLLM itself; every test of this folder skips, saying why, when the real vLLM
    is not importable (a namespace package named vllm is not vLLM)."""
    return vllm_or_skip()


@pytest.fixture
def stock_kernel(vllm_mod: ModuleType) -> None:
    """Fail (not skip) a test that needs vLLM's Triton kernels when they cannot run."""
    if NO_KERNELS is not None:
        pytest.fail(f"vLLM's Triton kernels cannot run on this CPU: {NO_KERNELS}")


def import_patched_modules() -> None:
    """Import every module the plugin patches that this release has, so that each
    patch applies at once."""
    import importlib

    from stepcache.integrations import vllm as plugin_module
    from stepcache.integrations.patching import absent

    for patch in plugin_module.PATCHES:
        if not absent(patch.module):
            importlib.import_module(patch.module)


def registered(
    monkeypatch: pytest.MonkeyPatch, mode: str = "1"
) -> Iterator[ModuleType]:
    """The plugin, registered with ``STEPCACHE_VLLM=mode`` and every patch off by
    default added (these tests drive each patch), removed after."""
    from stepcache.integrations import vllm as plugin_module

    plugin_module.unregister()
    import_patched_modules()
    monkeypatch.setenv(plugin_module.ENV, mode)
    monkeypatch.setenv(plugin_module.ADD_ENV, "all")
    plugin_module.register()
    # these tests drive vLLM's builds with builders of their own: the scopes apply
    # as they do once the engine makes a builder that calls a cached function
    plugin_module.want_scopes()
    status = plugin_module.status()
    gone = {name for name, state in status.items() if state != "applied"}
    assert gone == set(GONE), status
    yield plugin_module
    plugin_module.unregister()


@pytest.fixture
def register_plugin(
    vllm_mod: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Any]:
    """A function that registers the plugin with ``STEPCACHE_VLLM=mode`` (default
    ``1``) and returns it; the plugin is removed after the test."""
    from stepcache.integrations import vllm as plugin_module

    def register(mode: str = "1") -> ModuleType:
        gen = registered(monkeypatch, mode)
        return next(gen)

    yield register
    plugin_module.unregister()


@pytest.fixture
def patched_modules(vllm_mod: ModuleType) -> None:
    """Every module the plugin patches, imported."""
    import_patched_modules()


@pytest.fixture(params=["1", "verify"])
def plugin(
    request: pytest.FixtureRequest,
    vllm_mod: ModuleType,
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[ModuleType]:
    """The stepcache vLLM plugin, registered for the test and removed after it: on
    (``STEPCACHE_VLLM=1``) and in parity mode (``verify``), each test in both."""
    yield from registered(monkeypatch, request.param)


@pytest.fixture
def plugin_on(
    vllm_mod: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> Iterator[ModuleType]:
    """The plugin with ``STEPCACHE_VLLM=1`` only (for tests that count calls of
    vLLM's code, which parity mode calls once more)."""
    yield from registered(monkeypatch)


@pytest.fixture
def verify_plugin(
    vllm_mod: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> Iterator[ModuleType]:
    """The plugin registered with ``STEPCACHE_VLLM=verify``."""
    yield from registered(monkeypatch, "verify")


@pytest.fixture
def stock(vllm_mod: ModuleType) -> Iterator[None]:
    """Stock vLLM: the plugin is not registered during the test."""
    from stepcache.integrations import vllm as plugin_module

    plugin_module.unregister()
    yield


def layout_metadata(
    query_lens: list[int],
    pad_to: int | None = None,
    *,
    context: int = 5,
    block_size: int = 16,
) -> Any:
    """A real ``CommonAttentionMetadata`` on the CPU for requests running
    ``query_lens`` tokens after ``context`` tokens each, padded to ``pad_to`` tokens."""
    import numpy as np
    import torch
    from vllm.v1.attention.backend import CommonAttentionMetadata

    qsl = torch.zeros(len(query_lens) + 1, dtype=torch.int32)
    qsl[1:] = torch.from_numpy(np.cumsum(query_lens, dtype=np.int64)).to(torch.int32)
    total = int(qsl[-1])
    seq_lens = torch.tensor([context + n for n in query_lens], dtype=torch.int32)
    blocks = (context + max(query_lens, default=0)) // block_size + 1
    return CommonAttentionMetadata(
        query_start_loc=qsl,
        query_start_loc_cpu=qsl.clone(),
        seq_lens=seq_lens,
        num_reqs=len(query_lens),
        num_actual_tokens=total if pad_to is None else pad_to,
        max_query_len=max(query_lens, default=0),
        max_seq_len=int(seq_lens.max()) if query_lens else 0,
        block_table_tensor=torch.arange(
            len(query_lens) * blocks, dtype=torch.int32
        ).reshape(len(query_lens), blocks),
        slot_mapping=torch.arange(total if pad_to is None else pad_to),
        seq_lens_cpu_upper_bound=seq_lens.clone(),
    )


@pytest.fixture(scope="session")
def make_metadata(vllm_mod: ModuleType) -> Any:
    """:func:`layout_metadata`, once vLLM is known to be importable."""
    return layout_metadata
