# SPDX-License-Identifier: Apache-2.0
"""Which vLLM release these tests run on, and what the plugin's patches find in it.

The test command runs this folder on vLLM 0.34 and on 0.33 (``scripts/test.sh``): a
test of a target one release lacks skips on it with a reason that starts with
"release:", which ``STEPCACHE_REQUIRE_VLLM=1`` lets through."""

from __future__ import annotations

import pytest

from stepcache.integrations import vllm as _plugin
from stepcache.integrations.vllm.scopes import (
    BUILD_V1_NAME,
    DRAFT_V1_GEMMA4_NAME,
    DRAFT_V1_NAME,
    DRAFT_V1_STEP3P5_NAME,
)

#: The installed vLLM's release series, ``(major, minor)`` (read from its metadata:
#: nothing of vLLM is imported here).
_FOUND = _plugin.installed_vllm()
SERIES = tuple(int(p) for p in _FOUND[1].split(".")[:2]) if _FOUND else (0, 0)
#: vLLM 0.34 removed the V1 model runner (``v1/worker/gpu_model_runner.py``) and the
#: V1 draft proposers (``v1/spec_decode/llm_base_proposer.py`` and its subclasses).
V1_RUNNER = SERIES < (0, 34)
#: The plugin's patches whose module the release has not (status: skipped).
GONE: tuple[str, ...] = (
    ()
    if V1_RUNNER
    else (BUILD_V1_NAME, DRAFT_V1_NAME, DRAFT_V1_STEP3P5_NAME, DRAFT_V1_GEMMA4_NAME)
)
#: For a test of the V1 model runner: it skips on a release without one.
needs_v1 = pytest.mark.skipif(
    not V1_RUNNER,
    reason=f"release: vLLM {'.'.join(map(str, SERIES))} has no V1 model runner",
)


def needs_module(name: str) -> pytest.MarkDecorator:
    """For a test of vLLM's module ``name``: it skips on a release without it."""
    from stepcache.integrations.patching import absent

    return pytest.mark.skipif(
        absent(name),
        reason=f"release: vLLM {'.'.join(map(str, SERIES))} has no {name}",
    )
