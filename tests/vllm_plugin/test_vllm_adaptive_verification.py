# SPDX-License-Identifier: Apache-2.0
"""The request index where the device boundaries differ from the host copy's.

Adaptive verification trims each request's drafts on the device: the device
``query_start_loc`` then holds the per-request boundaries, and the host copy keeps the
drafts spread evenly (the right total, not the right boundaries; vLLM's
``AttentionBackend.supports_device_cpu_query_lens_mismatch``). vLLM 0.33 and 0.34
compute the request index from the device boundaries, with their Triton kernel (in
Triton's interpreter here). The plugin must give stock's rows, in production and in
every debug mode, inside a build's scope and outside one.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

import stepcache
from benchmarks import vllm_builders as real_builders

pytestmark = pytest.mark.vllm

#: (host boundaries: drafts spread evenly; device boundaries: as trimmed; rows)
LAYOUTS = {
    # three requests verifying 3 drafts each; the device kept 1, 3 and 2
    "trimmed": ([0, 4, 8, 12], [0, 2, 6, 9], 12),
    # the same total on both, other boundaries
    "moved": ([0, 4, 8, 12], [0, 2, 7, 12], 12),
}
#: (STEPCACHE_VLLM, stepcache's debug mode): production, and each debug mode
MODES = [("1", "off"), ("1", "checks"), ("1", "verify"), ("verify", "off")]


def metadata(host: list[int], device: list[int], rows: int) -> Any:
    """A ``CommonAttentionMetadata`` whose device and host layouts differ, made under
    inference mode as a step makes it."""
    from tests.vllm_plugin.conftest import layout_metadata

    with torch.inference_mode():
        lens = [b - a for a, b in zip(host, host[1:], strict=False)]
        cam = layout_metadata(lens, pad_to=rows)
        cam.query_start_loc = torch.tensor(device, dtype=torch.int32)
        cam.query_start_loc_cpu = torch.tensor(host, dtype=torch.int32)
    return cam


def rows(cam: Any) -> list[int]:
    out: list[int] = cam.token_to_req_indices(
        torch.full((16,), -1, dtype=torch.int32)
    ).tolist()
    return out


@pytest.fixture(params=list(LAYOUTS))
def layout(request: pytest.FixtureRequest) -> tuple[list[int], list[int], int]:
    return LAYOUTS[request.param]


@pytest.fixture
def stock_rows(
    stock: None, stock_kernel: None, layout: tuple[list[int], list[int], int]
) -> list[int]:
    """Stock vLLM's rows (the plugin off): the device boundaries'."""
    return rows(metadata(*layout))


def test_stock_vllm_indexes_by_the_device_boundaries(
    layout: tuple[list[int], list[int], int], stock_rows: list[int]
) -> None:
    _host, device, _rows = layout
    by_device = [
        i for i in range(len(device) - 1) for _ in range(device[i + 1] - device[i])
    ]
    assert stock_rows[: len(by_device)] == by_device


@pytest.mark.parametrize("scoped", [False, True], ids=["no-scope", "in-scope"])
@pytest.mark.parametrize(
    ("mode", "debug"), MODES, ids=["production", "checks", "verify", "plugin-verify"]
)
def test_the_plugin_gives_stocks_rows(
    layout: tuple[list[int], list[int], int],
    stock_rows: list[int],
    register_plugin: Any,
    mode: str,
    debug: str,
    scoped: bool,
) -> None:
    register_plugin(mode)
    with stepcache.debug(debug), real_builders.maybe_scope(scoped):
        cam = metadata(*layout)
        assert rows(cam) == stock_rows
        assert rows(cam) == stock_rows  # the cached rows, as a second builder gets
