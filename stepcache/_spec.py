# SPDX-License-Identifier: Apache-2.0
"""Declared expectations of a cached value (`TensorSpec`) and their validation."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, TypeAlias

import torch

from stepcache._errors import CacheValidationError, StepCacheError


@dataclasses.dataclass(frozen=True)
class _Ref:
    name: str

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"


class Arg(_Ref):
    """A value taken from the decorated call's argument `name`, for a TensorSpec.

    A tensor stands for its device, its dtype or its first dim, as the item needs.

    Examples:
        >>> import stepcache, torch
        >>> @stepcache.step_cached(expect=stepcache.TensorSpec(device=stepcache.Arg("buf")))
        ... def head(self, buf):
        ...     return buf[:2]
        >>> class Meta: pass
        >>> head(Meta(), torch.arange(4))
        tensor([0, 1])
    """


class Attr(_Ref):
    """A value taken from the owner's attribute `name`, for a TensorSpec.

    Read on every check; a tensor stands for its device, dtype or first dim, as for
    [`Arg`][stepcache.Arg].

    Examples:
        >>> import stepcache, torch
        >>> class Meta:
        ...     n = 3
        ...     @stepcache.step_cached(expect=stepcache.TensorSpec(shape=(stepcache.Attr("n"),)))
        ...     def index(self):
        ...         return torch.zeros(3)
        >>> Meta().index()
        tensor([0., 0., 0.])
    """


Dim = int | None | Arg | Attr
#: where references are resolved: the call's arguments, their index by parameter
#: name, and the owner
Scope = tuple[tuple[Any, ...], Mapping[str, int], object]
Spec: TypeAlias = "TensorSpec | tuple[TensorSpec | None, ...]"
_REFS = {Arg: "argument", Attr: "owner attribute"}  # as the messages name them
#: what references usually resolve to: answered without torch's slow isinstance()
_PLAIN = frozenset({int, torch.device, torch.dtype, str})
# read on every miss: a module global is one lookup, ``torch.Tensor`` two
_Tensor, _Device, _Size = torch.Tensor, torch.device, torch.Size


def _current_index(device_type: str) -> int:  # tests replace it on CPU
    module: Any = getattr(torch, device_type, None)
    available = getattr(module, "is_available", None)
    return int(module.current_device()) if available and available() else 0


def normalize_device(device: torch.device | str | int) -> torch.device:
    """Return `device` as a `torch.device`, with the current device's index filled in.

    Use it in keys that hold a device: `cuda` and `cuda:0` would be two keys (two
    entries, two buffers) for one device, which debug mode reports as `device-alias`.

    Examples:
        >>> from stepcache import normalize_device
        >>> normalize_device("cpu"), normalize_device("cuda:1")
        (device(type='cpu'), device(type='cuda', index=1))
        >>> normalize_device("cuda") == normalize_device("cuda:0")  # device 0 is current
        True
    """
    d = device if isinstance(device, torch.device) else torch.device(device)
    if d.index is not None or d.type == "cpu":
        return d
    return torch.device(d.type, _current_index(d.type))


@dataclasses.dataclass(frozen=True, repr=False)
class TensorSpec:
    """What a cached tensor must look like: the `expect=` of a step-cached function.

    Each item is fixed, a reference ([`Arg`][stepcache.Arg], [`Attr`][stepcache.Attr])
    or `None` (not checked); devices are compared [normalised][stepcache.normalize_device].

    Attributes:
        device: The device.
        dtype: The dtype.
        ndim: The exact number of dims.
        shape: Exact sizes of the leading dims (`None` skips a dim).
        min_shape: Lower bounds for the leading dims, as in `shape`.

    Examples:
        >>> import stepcache, torch
        >>> spec = stepcache.TensorSpec(min_shape=(stepcache.Attr("n"),))
        >>> spec
        TensorSpec(min_shape=(Attr('n'),))
        >>> class Meta:
        ...     n = 4
        ...     @stepcache.step_cached(expect=spec)
        ...     def index(self):
        ...         return torch.zeros(3)  # BUG: one row short
        >>> Meta().index()
        Traceback (most recent call last):
        stepcache.CacheValidationError: step_cached function 'Meta.index': result size mismatch at index 0. expected at least 4 (from owner attribute 'n'), actual 3 (shape [3])
    """

    device: torch.device | str | Arg | Attr | None = None
    dtype: torch.dtype | Arg | Attr | None = None
    ndim: int | None = None
    shape: tuple[Dim, ...] | None = None
    min_shape: tuple[Dim, ...] | None = None
    _dims: tuple[tuple[tuple[Dim, ...], str], ...] = dataclasses.field(
        init=False, repr=False, compare=False
    )

    def __post_init__(self) -> None:
        for name in ("shape", "min_shape"):
            if getattr(self, name) is not None:
                object.__setattr__(self, name, tuple(getattr(self, name)))
            for d in getattr(self, name) or ():
                if type(d) is bool or not isinstance(d, Dim):
                    raise StepCacheError(
                        f"TensorSpec {name} entries must be int, None, Arg or Attr (got {d!r})"
                    )
        if isinstance(self.device, (str, torch.device)):
            torch.device(self.device)  # raises on a malformed device string
        if not isinstance(self.dtype, torch.dtype | None | Arg | Attr):
            raise StepCacheError(
                f"TensorSpec dtype must be a torch.dtype (got {self.dtype!r})"
            )
        # the dims to check, and how: worked out once, not on every miss
        groups = ((self.shape, ""), (self.min_shape, "at least "))
        object.__setattr__(self, "_dims", tuple(g for g in groups if g[0] is not None))

    def refs(self) -> list[Arg | Attr]:
        """Every reference this spec resolves at call time."""
        items = (self.device, self.dtype, *(self.shape or ()), *(self.min_shape or ()))
        return [r for r in items if isinstance(r, (Arg, Attr))]

    def __repr__(self) -> str:
        fields = vars(self).items()
        items = (f"{k}={v!r}" for k, v in fields if v is not None and k[0] != "_")
        return f"TensorSpec({', '.join(items)})"


def _label(item: Any) -> str:
    kind = _REFS.get(item.__class__)
    return f" (from {kind} '{item.name}')" if kind else ""


def _resolve(ref: Any, scope: Scope, attr: str) -> Any:
    """What ``ref`` refers to in ``scope``, where a tensor stands for its ``attr``."""
    args, index, owner = scope
    value = args[index[ref.name]] if ref.__class__ is Arg else getattr(owner, ref.name)
    if value.__class__ in _PLAIN or not isinstance(value, _Tensor):
        return value
    return getattr(value, attr)


def _kind(value: Any) -> str:
    if isinstance(value, (tuple, list)):
        return f"a {type(value).__name__} of {len(value)}"
    return f"{value!r:.60} that is a {type(value)!r}"


def _error(where: str, what: str | int, text: str) -> CacheValidationError:
    """The error of a broken spec; an int ``what`` is an item of a tuple result (named
    only here: an error is rare, a validation is every miss)."""
    name = what if isinstance(what, str) else f"result[{what}]"
    return CacheValidationError(f"{where}: {name} {text}")


def validate(
    value: Any, expect: Spec, scope: Scope, where: str, what: str | int = "result"
) -> None:
    """Raise `CacheValidationError` if ``value`` breaks ``expect``; the message starts
    with ``where`` and names ``value`` as ``what``."""
    if not isinstance(expect, TensorSpec):
        if not isinstance(value, (tuple, list)) or len(value) != len(expect):
            raise CacheValidationError(
                f"{where}: expected a tuple of {len(expect)} values, got "
                f"{_kind(value)}. Fix: return a tuple that matches `expect`, or change "
                "`expect`."
            )
        for i in range(len(expect)):
            if (spec := expect[i]) is not None:
                validate(value[i], spec, scope, where, i)
        return
    # paid on every miss: each item of the spec and each property of the tensor is
    # read at most once, and only references are resolved
    if value.__class__ is not _Tensor and not isinstance(value, _Tensor):
        raise _error(where, what, f"must be a torch.Tensor (got {_kind(value)})")
    item: Any
    want: Any
    got: Any
    if (item := expect.device) is not None:
        want = _resolve(item, scope, "device") if item.__class__ in _REFS else item
        # only a difference is normalised (cuda and cuda:N may be one device)
        if not (want.__class__ is _Device and value.device == want):
            want, got = normalize_device(want), normalize_device(value.device)
            if got != want:
                raise _error(
                    where,
                    what,
                    f"device mismatch. expected {want}{_label(item)}, actual {got}. "
                    f"Fix: compute into a buffer on {want}, or key the cache by device.",
                )
    if (item := expect.dtype) is not None:
        want = _resolve(item, scope, "dtype") if item.__class__ in _REFS else item
        if (got := value.dtype) != want:
            text = f"dtype mismatch. expected {want}{_label(item)}, actual {got}"
            raise _error(where, what, text)
    if expect.ndim is not None and value.ndim != expect.ndim:
        text = f"ndim mismatch. expected {expect.ndim}, actual {value.ndim}"
        raise _error(where, what, f"{text} (shape {list(value.shape)})")
    shape = value.shape if expect._dims else ()
    for dims, least in expect._dims:
        if len(dims) > len(shape):
            text = f"has {len(shape)} dims (shape {list(shape)}), the spec describes"
            raise _error(where, what, f"{text} {len(dims)}")
        for i, item in enumerate(dims):
            if item is None:
                continue
            want = _resolve(item, scope, "shape") if item.__class__ in _REFS else item
            if want.__class__ is not int:  # a tensor stands for its first dim
                want = int(want[0] if want.__class__ is _Size else want)
            if (got := shape[i]) != want and (not least or got < want):
                text = f"expected {least}{want}{_label(item)}, actual {got}"
                raise _error(
                    where,
                    what,
                    f"size mismatch at index {i}. {text} (shape {list(shape)})",
                )
