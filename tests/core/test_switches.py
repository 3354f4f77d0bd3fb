# SPDX-License-Identifier: Apache-2.0
"""Switches: disabled() calls straight through (counted as bypasses), nestably; the
STEPCACHE_DISABLE and STEPCACHE_DEBUG variables; functions decorated while a switch is on."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

import stepcache
from stepcache import step_cached


class Meta:
    def __init__(self) -> None:
        self.calls = 0

    @step_cached()
    def value(self) -> int:
        self.calls += 1
        return self.calls


def test_disabled_calls_straight_through_and_counts_bypasses() -> None:
    m = Meta()
    m.value()
    with stepcache.disabled():
        assert stepcache.get_disabled()
        assert m.value() == 2 and m.value() == 3
        with stepcache.disabled():
            assert m.value() == 4
        assert stepcache.get_disabled()
    assert not stepcache.get_disabled()
    assert m.value() == 1  # the cached entry from before is still there
    row = stepcache.stats()["Meta.value"]
    assert (row.misses, row.bypasses, row.hits) == (1, 3, 1)


def test_functions_decorated_while_disabled_start_switched() -> None:
    with stepcache.disabled():

        @step_cached()
        def f(self: Meta) -> int:
            self.calls += 1
            return self.calls

        m = Meta()
        assert f(m) == 1 and f(m) == 2
    assert f(m) == 3 and f(m) == 3


def test_set_disabled_takes_a_bool() -> None:
    with pytest.raises(TypeError, match="bool"):
        stepcache.set_disabled(1)  # type: ignore[arg-type]


def test_set_debug_rejects_unknown_modes() -> None:
    with pytest.raises(ValueError, match="checks"):
        stepcache.set_debug("loud")


def _run(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_environment_variables_are_read_at_import() -> None:
    code = "import stepcache; print(stepcache.get_disabled(), stepcache.get_debug())"
    assert _run(code, STEPCACHE_DISABLE="1").stdout.split() == ["True", "off"]
    assert _run(code, STEPCACHE_DEBUG="1").stdout.split() == ["False", "checks"]
    assert _run(code, STEPCACHE_DEBUG="verify").stdout.split() == ["False", "verify"]
    bad = _run(code, STEPCACHE_DEBUG="loud")
    assert bad.returncode != 0 and "STEPCACHE_DEBUG" in bad.stderr
