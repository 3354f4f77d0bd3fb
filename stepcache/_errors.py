# SPDX-License-Identifier: Apache-2.0
"""The typed errors stepcache raises."""

from __future__ import annotations


class StepCacheError(Exception):
    """Base class of every error stepcache raises on purpose.

    Raised as such for a misuse (a decoration that cannot work, an unhashable key, a
    missing `depends_on` attribute); the message names the function and the fix.

    Examples:
        >>> import stepcache
        >>> @stepcache.step_cached(key="layer")
        ... def index(self, kind):
        ...     return kind
        Traceback (most recent call last):
        stepcache.StepCacheError: step_cached function 'index': key names 'layer', which is not a parameter (parameters: self, kind). Fix: name one of 'self', 'kind' in key.
    """


class CacheValidationError(StepCacheError, AssertionError):
    """A cached value does not match its declared `expect` spec.

    Also an `AssertionError`, for code that used to `assert` the same facts; raised
    explicitly, so `python -O` cannot remove it.

    Examples:
        >>> import stepcache, torch
        >>> @stepcache.step_cached(expect=stepcache.TensorSpec(dtype=torch.int32))
        ... def index(self):
        ...     return torch.zeros(2)  # BUG: float32
        >>> class Meta: pass
        >>> index(Meta())
        Traceback (most recent call last):
        stepcache.CacheValidationError: step_cached function 'index': result dtype mismatch. expected torch.int32, actual torch.float32
    """


class StaleCacheError(StepCacheError):
    """A cache would hand out (or has handed out) data that no longer matches its inputs.

    Raised when a closed step cache is used again, and by debug mode's stale-cache
    detections (see [`debug_report()`][stepcache.debug_report]).

    Examples:
        >>> import stepcache
        >>> class Meta:
        ...     @stepcache.step_cached()
        ...     def value(self):
        ...         return 1
        >>> m = Meta()
        >>> stepcache.cache_of(m).close()
        >>> m.value()
        Traceback (most recent call last):
        stepcache.StaleCacheError: the step cache of this Meta was closed (the step is over), and it was used again. Fix: build a new metadata object for the new step, or call clear() instead of close() if the object is meant to be reused.
    """


class OwnerError(StepCacheError):
    """An object that cannot be an owner (private: the decorator raises it as a
    `StepCacheError` that names its function and owner parameter)."""


# Tracebacks name the errors where users import them from.
for _error in (StepCacheError, CacheValidationError, StaleCacheError):
    _error.__module__ = "stepcache"
