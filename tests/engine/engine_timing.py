# SPDX-License-Identifier: Apache-2.0
"""The CPU time of each per-step metadata build, read in the worker.

A build is what the plugin's scope wraps: V1's ``GPUModelRunner._build_attention_metadata``,
and V2's model state's ``prepare_attn`` (``build_attn_metadata`` and the few reads that
prepare its arguments). The timer is an attribute of the runner (or model state)
object, which calls its class's method as it is at that moment: the plugin, switched
on and off between ``generate()`` calls, patches the class, and the timer times
whichever runs. ``time.thread_time_ns``: the building thread's CPU time, which other
processes on a shared machine move less than wall time.
"""

from __future__ import annotations

import os
import time
from typing import Any


def _target(worker: Any) -> tuple[Any, str]:
    runner = worker.model_runner
    state = getattr(runner, "model_state", None)
    if state is not None and hasattr(state, "prepare_attn"):  # Model Runner V2
        return state, "prepare_attn"
    return runner, "_build_attention_metadata"


def install_build_timer(worker: Any) -> int:
    """Time every build of this worker from now on; returns the pid."""
    target, attr = _target(worker)
    times = worker._stepcache_build_ns = []

    def timed(*args: Any, **kwargs: Any) -> Any:
        method = getattr(type(target), attr)  # the class's, as patched right now
        start = time.thread_time_ns()
        try:
            return method(target, *args, **kwargs)
        finally:
            times.append(time.thread_time_ns() - start)

    setattr(target, attr, timed)
    return os.getpid()


def take_build_times(worker: Any) -> list[int]:
    """The CPU ns of each build since the last call (and forget them)."""
    times: list[int] = worker._stepcache_build_ns
    taken = list(times)
    times.clear()
    return taken
