# SPDX-License-Identifier: Apache-2.0
"""Shared fixtures: every test starts with stepcache's switches off and counters zero;
`step_mode` runs a test as written and again inside ``torch.inference_mode()``."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator

import pytest
import torch

import stepcache


@pytest.fixture(autouse=True)
def _clean_switches() -> Iterator[None]:
    stepcache.set_disabled(False)
    stepcache.set_debug("off")
    stepcache.reset_stats()
    yield
    stepcache.set_disabled(False)
    stepcache.set_debug("off")


@pytest.fixture(params=["eager", "inference"])
def step_mode(request: pytest.FixtureRequest) -> Iterator[str]:
    """The test runs twice: as written, and inside ``torch.inference_mode()``, as
    every vLLM step runs (the tensors made there are inference tensors, which have no
    version counter). The core's and debug mode's tests use it for every test."""
    if request.param == "eager":
        yield "eager"
        return
    with torch.inference_mode():
        yield "inference"


def _persistent(t: torch.Tensor) -> torch.Tensor:
    with torch.inference_mode(False):
        return t.clone()


@pytest.fixture
def persistent() -> Callable[[torch.Tensor], torch.Tensor]:
    """A copy of a tensor made outside inference mode: what vLLM's persistent buffers
    are (allocated at start-up), and so what its in-place writes bump the version
    counter of."""
    return _persistent


@pytest.fixture
def plugin_log(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    """``caplog`` listening on the vLLM plugin's logger, at DEBUG: vLLM's logging
    setup stops "vllm.*" records at its own logger."""
    from stepcache.integrations import vllm as plugin

    logger = plugin.logger
    old = logger.level, logger.propagate
    logger.addHandler(caplog.handler)
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    yield caplog
    logger.removeHandler(caplog.handler)
    logger.level, logger.propagate = old
