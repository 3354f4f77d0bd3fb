# SPDX-License-Identifier: Apache-2.0
"""Debug mode (placeholder until the debug issue lands)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from stepcache._decorator import CachedFunction
    from stepcache._store import StepCache


def call(fn: CachedFunction, a: tuple[Any, ...]) -> Any:
    return fn.miss(a)


def on_close(store: StepCache) -> None:
    return None


def debug_report() -> list[str]:
    return []
