# SPDX-License-Identifier: Apache-2.0
"""SGLang 0.5.23's real classes on the CPU (``.venv-sglang``, scripts/setup_env.sh
--sglang): forward batches, the GDN backend and two-batch overlap's preparer, with
only what needs a GPU or a running server faked at the boundary (the conv kernel, the
process's published device and parallel config, the global attention backend).

Without SGLang these tests are not collected (``.venv`` has none);
``STEPCACHE_REQUIRE_SGLANG=1`` (scripts/test.sh) makes that an error instead."""

from __future__ import annotations

import importlib.util
import os
import types
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch


def _installed() -> bool:
    # not find_spec("sglang"): with tests/ on sys.path, this folder is a namespace
    # package of that name
    try:
        return importlib.util.find_spec("sglang.srt") is not None
    except ImportError:
        return False


if not _installed():
    if os.environ.get("STEPCACHE_REQUIRE_SGLANG") == "1":
        raise RuntimeError("STEPCACHE_REQUIRE_SGLANG=1 but sglang is not installed")
    collect_ignore_glob = ["test_*.py", "passes.py"]
else:
    with warnings.catch_warnings():  # SGLang warns at import about CPU-only kernels
        warnings.simplefilter("ignore")
        import sglang.srt.batch_overlap.two_batch_overlap  # noqa: F401
        import sglang.srt.layers.attention.linear.gdn_backend  # noqa: F401
        import sglang.srt.layers.attention.minimax_sparse_backend  # noqa: F401
        import sglang.srt.layers.attention.tbo_backend  # noqa: F401
        import sglang.srt.mem_cache.memory_pool  # noqa: F401
        import sglang.srt.model_executor.forward_batch_info  # noqa: F401
        import sglang.srt.model_executor.model_runner  # noqa: F401

    from stepcache.integrations import sglang as plugin


class Counting(torch.overrides.TorchFunctionMode):
    """Counts the torch calls made inside it, by name (``gt``, ``item``...)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: dict[str, int] = {}

    def __torch_function__(
        self,
        func: Callable[..., Any],
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        name = getattr(func, "__name__", str(func))
        self.calls[name] = self.calls.get(name, 0) + 1
        return func(*args, **(kwargs or {}))

    def syncs(self) -> int:
        """The host syncs counted: ``.item()``, ``.tolist()``, ``.cpu()``."""
        return sum(self.calls.get(n, 0) for n in ("item", "tolist", "cpu"))


@pytest.fixture
def sglang_plugin(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """The plugin, unregistered and its switch unset; unregistered after."""
    monkeypatch.delenv(plugin.ENV, raising=False)
    monkeypatch.delenv(plugin.SKIP_ENV, raising=False)
    monkeypatch.delenv(plugin.ADD_ENV, raising=False)
    plugin.unregister()
    plugin.reset_counters()
    yield plugin
    plugin.unregister()


@pytest.fixture
def boundary(monkeypatch: pytest.MonkeyPatch) -> types.SimpleNamespace:
    """What a server publishes and a GPU runs, faked: the conv kernel records its
    arguments; the device is the CPU; one attention-TP rank; the global attention
    backend a two-batch-overlap one."""
    from sglang.srt.batch_overlap import two_batch_overlap as tbo
    from sglang.srt.layers.attention.linear import gdn_backend
    from sglang.srt.layers.attention.tbo_backend import TboAttnBackend

    seen: list[dict[str, Any]] = []

    def conv(x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        seen.append(kwargs)
        return x

    monkeypatch.setattr(gdn_backend, "causal_conv1d_fn", conv)
    monkeypatch.setattr(tbo, "get_device", lambda: types.SimpleNamespace(device="cpu"))
    monkeypatch.setattr(
        tbo,
        "get_parallel",
        lambda: types.SimpleNamespace(attn_tp_size=1, moe_dense_tp_size=1),
    )
    backend = TboAttnBackend.__new__(TboAttnBackend)
    monkeypatch.setattr(tbo, "get_attn_backend", lambda: backend)
    return types.SimpleNamespace(conv_calls=seen)
