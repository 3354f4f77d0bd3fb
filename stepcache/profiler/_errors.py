# SPDX-License-Identifier: Apache-2.0
"""The typed errors of the redundancy profiler."""

from __future__ import annotations

from stepcache._errors import StepCacheError

__all__ = [
    "ProfilerError",
    "TargetError",
    "TargetNotCallableError",
    "TargetNotFoundError",
]


class ProfilerError(StepCacheError):
    """The profiler was used wrongly (a report read too early, two profiles at once)."""


class TargetError(ProfilerError):
    """A target or step names nothing the profiler can wrap."""


class TargetNotFoundError(TargetError, LookupError):
    """A ``"module"`` or ``"module:attr"`` target names no importable module or
    attribute."""


class TargetNotCallableError(TargetError, TypeError):
    """A target names an attribute that is not a function, method or class."""
