# SPDX-License-Identifier: Apache-2.0
"""The demo's tests of real vLLM (its metadata in .venv, its engine in .venv-engine):
``STEPCACHE_REQUIRE_VLLM=1`` (the test command sets it) turns their skips into
failures, as in tests/vllm_plugin and tests/engine."""

from __future__ import annotations

from require_vllm import skip_fails

pytest_runtest_makereport = skip_fails(
    "demo", "(scripts/test.sh builds .venv and .venv-engine; see scripts/setup_env.sh)"
)
