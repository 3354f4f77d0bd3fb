# SPDX-License-Identifier: Apache-2.0
"""The redundancy profiler: find the next per-step cache to add.

``with stepcache.profile(targets) as report:`` wraps the targets while the block runs,
records for each step the calls that repeat an earlier call of the same step (identical
arguments, or equal results), and ranks the functions by the time those calls took,
with a suggested owner, key and ``depends_on`` and a ready ``@stepcache.step_cached``
line. ``python -m stepcache profile MODULE:CALLABLE`` does the same from the command
line. See docs/profiler.md.
"""

from __future__ import annotations

from stepcache.profiler._cli import main
from stepcache.profiler._errors import (
    ProfilerError,
    TargetError,
    TargetNotCallableError,
    TargetNotFoundError,
)
from stepcache.profiler._infer import Suggestion
from stepcache.profiler._profile import Profile, profile
from stepcache.profiler._report import FunctionReport, ProfileReport

__all__ = [
    "FunctionReport",
    "Profile",
    "ProfileReport",
    "ProfilerError",
    "Suggestion",
    "TargetError",
    "TargetNotCallableError",
    "TargetNotFoundError",
    "main",
    "profile",
]
