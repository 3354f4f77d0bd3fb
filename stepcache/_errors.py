# SPDX-License-Identifier: Apache-2.0
"""The typed errors stepcache raises."""

from __future__ import annotations

__all__ = ["CacheValidationError", "StaleCacheError", "StepCacheError"]


class StepCacheError(Exception):
    """Base class of every error stepcache raises on purpose."""


class CacheValidationError(StepCacheError, AssertionError):
    """A cached value does not match its declared ``expect`` spec.

    It is also an :class:`AssertionError`, so code that used to ``assert`` the same
    facts keeps catching it; it is raised explicitly, so ``python -O`` cannot remove it.
    """


class StaleCacheError(StepCacheError):
    """A cache would hand out (or has handed out) data that no longer matches its inputs."""
