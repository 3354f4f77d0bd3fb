# SPDX-License-Identifier: Apache-2.0
"""The CPU time of each per-step metadata build, read in the worker.

A build is what the plugin's scope wraps: V1's ``GPUModelRunner._build_attention_metadata``,
and V2's model state's ``prepare_attn`` (``build_attn_metadata`` and the few reads that
prepare its arguments). The timer is an attribute of the runner (or model state)
object, which calls its class's method as it is at that moment: the plugin, switched
on and off between ``generate()`` calls, patches the class, and the timer times
whichever runs. ``time.thread_time_ns``: the building thread's CPU time, which other
processes on a shared machine move less than wall time.

Within each build, the GDN builder's ``build`` (Qwen3-Next: one per KV-cache group)
is timed too, call by call: what the plugin's layout caches change is there (the
first group computes, the others hit), and it says which group pays and which saves.
The plugin does not patch that method, so the same timer times both sides.

Each build is also marked, after its timing, as one with a prefill (more tokens than
requests: the runs that are timed have no speculation) or of decodes only: the
plugin's layout caches serve only the first kind.
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


def _has_prefill(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """Whether a build of these arguments schedules more tokens than requests."""
    if args and hasattr(args[0], "num_reqs"):  # V2's prepare_attn(input_batch, ...)
        return bool(args[0].num_tokens > args[0].num_reqs)
    # V1's _build_attention_metadata(num_tokens, num_reqs, ...)
    tokens = args[0] if args else kwargs["num_tokens"]
    reqs = args[1] if len(args) > 1 else kwargs["num_reqs"]
    return bool(tokens > reqs)


def _time_group_builds(current: list[list[int] | None]) -> None:
    """Time each call of the GDN builder's ``build`` into ``current[0]``, the calls of
    the build under way (none outside a timed build); nothing where vLLM has no GDN
    builder."""
    try:
        from vllm.v1.attention.backends import gdn_attn
    except ImportError:
        return
    cls = gdn_attn.GDNAttentionMetadataBuilder
    build = cls.build

    def timed_group(*args: Any, **kwargs: Any) -> Any:
        start = time.thread_time_ns()
        try:
            return build(*args, **kwargs)
        finally:
            calls = current[0]
            if calls is not None:
                calls.append(time.thread_time_ns() - start)

    cls.build = timed_group  # type: ignore[method-assign]


def install_build_timer(worker: Any) -> int:
    """Time every build of this worker from now on (and the GDN builder's calls in
    each); returns the pid."""
    target, attr = _target(worker)
    times = worker._stepcache_build_ns = []
    prefills = worker._stepcache_build_prefill = []
    groups = worker._stepcache_group_ns = []
    current: list[list[int] | None] = [None]

    def timed(*args: Any, **kwargs: Any) -> Any:
        method = getattr(type(target), attr)  # the class's, as patched right now
        current[0] = calls = []
        start = time.thread_time_ns()
        try:
            return method(target, *args, **kwargs)
        finally:
            times.append(time.thread_time_ns() - start)
            current[0] = None
            groups.append(calls)
            prefills.append(_has_prefill(args, kwargs))

    setattr(target, attr, timed)
    _time_group_builds(current)
    return os.getpid()


def _taken(items: list[Any]) -> list[Any]:
    """What ``items`` holds, emptied (a build's list of calls is complete once it is
    in there: a copy of the outer list is enough)."""
    taken = list(items)
    items.clear()
    return taken


def take_build_times(worker: Any) -> list[int]:
    """The CPU ns of each build since the last call (and forget them)."""
    return _taken(worker._stepcache_build_ns)


def take_build_prefills(worker: Any) -> list[bool]:
    """Whether each build since the last call had a prefill (and forget them)."""
    return _taken(worker._stepcache_build_prefill)


def take_group_times(worker: Any) -> list[list[int]]:
    """The CPU ns of each GDN builder call, build by build, since the last call (and
    forget them)."""
    return _taken(worker._stepcache_group_ns)
