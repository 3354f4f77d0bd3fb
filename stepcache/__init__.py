# SPDX-License-Identifier: Apache-2.0
"""stepcache: per-step memoization of attention metadata for LLM inference engines.

>>> import stepcache
>>> class Meta:
...     n = 4
...     @stepcache.step_cached(depends_on=("n",))
...     def squares(self) -> list[int]:
...         return [i * i for i in range(self.n)]
>>> m = Meta()
>>> m.squares() is m.squares()
True
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from stepcache._bypass import BYPASS
from stepcache._debug import DebugReport, Detection, clear_debug_report, debug_report
from stepcache._decorator import generated_source, step_cached
from stepcache._diff import first_difference
from stepcache._errors import CacheValidationError, StaleCacheError, StepCacheError
from stepcache._guard import GuardedTensor
from stepcache._owners import cache_field, dataclass_cache_field
from stepcache._scope import Scope, active_scope, attach, cache_of, scope
from stepcache._spec import Arg, Attr, TensorSpec, normalize_device
from stepcache._stats import FunctionStats, StatsTable, reset_stats, stats
from stepcache._store import StepCache
from stepcache._switches import (
    debug,
    disabled,
    get_debug,
    get_disabled,
    set_debug,
    set_disabled,
)

if TYPE_CHECKING:
    from stepcache.profiler import profile


def __getattr__(name: str) -> Any:
    # the profiler is not the core: `import stepcache` does not load it
    if name == "profile":
        from stepcache.profiler import profile

        return profile
    raise AttributeError(f"module 'stepcache' has no attribute {name!r}")


__version__ = "0.1.0"
"""The version of stepcache, as installed.

Examples:
    >>> import importlib.metadata, stepcache
    >>> stepcache.__version__ == importlib.metadata.version("stepcache")
    True
"""

# in the order of the API reference's pages
__all__ = ["step_cached", "generated_source", "BYPASS", "TensorSpec", "Arg", "Attr"]
__all__ += ["normalize_device", "StepCache", "attach", "cache_of", "cache_field"]
__all__ += ["dataclass_cache_field", "scope", "active_scope", "Scope", "StepCacheError"]
__all__ += ["CacheValidationError", "StaleCacheError", "debug", "set_debug"]
__all__ += ["get_debug", "disabled", "set_disabled", "get_disabled", "debug_report"]
__all__ += ["clear_debug_report", "DebugReport", "Detection", "GuardedTensor"]
__all__ += ["first_difference", "stats", "reset_stats", "FunctionStats", "StatsTable"]
__all__ += ["profile", "__version__"]
