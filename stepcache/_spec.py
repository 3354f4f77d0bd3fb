# SPDX-License-Identifier: Apache-2.0
"""Declared expectations of a cached value (`TensorSpec`) and their validation."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import torch

from stepcache._errors import CacheValidationError, StepCacheError


@dataclasses.dataclass(frozen=True)
class _Ref:
    name: str

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"


class Arg(_Ref):
    """A value taken from the decorated call's argument `name`, for a TensorSpec.

    Use it in a [`TensorSpec`][stepcache.TensorSpec]. A tensor argument stands for its device (as `device`), its dtype (as `dtype`) and
    its first dim (as a size).

    Examples:
        >>> import stepcache, torch
        >>> spec = stepcache.TensorSpec(device=stepcache.Arg("buffer"))
        >>> @stepcache.step_cached(expect=spec)
        ... def head(self, buffer):
        ...     return buffer[:2]
        >>> class Meta: pass
        >>> head(Meta(), torch.arange(4))
        tensor([0, 1])
    """


class Attr(_Ref):
    """A value taken from the owner's attribute `name`, for a TensorSpec.

    Use it in a [`TensorSpec`][stepcache.TensorSpec]. It is read on every check, so it follows the owner as the owner changes.

    Examples:
        >>> import stepcache, torch
        >>> class Meta:
        ...     num_actual_tokens = 3
        ...     @stepcache.step_cached(
        ...         expect=stepcache.TensorSpec(shape=(stepcache.Attr("num_actual_tokens"),))
        ...     )
        ...     def index(self):
        ...         return torch.zeros(3, dtype=torch.int32)
        >>> Meta().index()
        tensor([0, 0, 0], dtype=torch.int32)
    """


Dim = int | None | Arg | Attr


def _current_index(device_type: str) -> int:
    """The current device index of ``device_type`` (tests replace this on CPU)."""
    module = getattr(torch, device_type, None)
    if module is not None and hasattr(module, "is_available") and module.is_available():
        return int(module.current_device())
    return 0


def normalize_device(device: torch.device | str | int) -> torch.device:
    """Return `device` as a `torch.device`, with the current device's index filled in.

    `cuda` and `cuda:N` of the current device become the same device. Use it in keys that include a device: `cuda` and `cuda:0` are different keys
    (two entries, two buffers) although they name one device. Debug mode reports such
    keys as `device-alias`.

    Examples:
        >>> from stepcache import normalize_device
        >>> normalize_device("cpu")
        device(type='cpu')
        >>> normalize_device("cuda:1")
        device(type='cuda', index=1)
        >>> normalize_device("cuda") == normalize_device("cuda:0")  # device 0 is current
        True
    """
    d = device if isinstance(device, torch.device) else torch.device(device)
    if d.index is not None or d.type == "cpu":
        return d
    return torch.device(d.type, _current_index(d.type))


def _check_dims(name: str, dims: Sequence[Dim] | None) -> tuple[Dim, ...] | None:
    if dims is None:
        return None
    out = tuple(dims)
    for d in out:
        if not (d is None or isinstance(d, (int, Arg, Attr))) or isinstance(d, bool):
            raise StepCacheError(
                f"TensorSpec {name} entries must be int, None, Arg or Attr (got {d!r})"
            )
    return out


@dataclasses.dataclass(frozen=True, repr=False)
class TensorSpec:
    """What a cached tensor must look like: the `expect=` of a step-cached function.

    See [`step_cached`][stepcache.step_cached]. A spec is checked whenever a value is stored (and on every hit in debug mode); a
    violation raises [`CacheValidationError`][stepcache.CacheValidationError], whose
    message names the function, the key, what was expected and what was found. Each
    item is a fixed value or a reference resolved at call time: [`Arg`][stepcache.Arg]
    (the call's argument) or [`Attr`][stepcache.Attr] (the owner's attribute). Devices
    are compared normalised ([`normalize_device`][stepcache.normalize_device]).
    Unset items (`None`) are not checked.

    Attributes:
        device: The device, or a reference to a tensor (its device) or a device.
        dtype: The dtype, or a reference to a tensor (its dtype) or a dtype.
        ndim: The exact number of dims.
        shape: Exact sizes of the leading dims (`None` skips a dim); a reference to a
            tensor stands for its first dim.
        min_shape: Lower bounds for the leading dims, as in `shape`.

    Examples:
        >>> import stepcache, torch
        >>> from stepcache import Arg, Attr, TensorSpec
        >>> spec = TensorSpec(
        ...     device=Arg("buffer"),
        ...     dtype=torch.int32,
        ...     min_shape=(Attr("num_actual_tokens"),),
        ... )
        >>> spec
        TensorSpec(device=Arg('buffer'), dtype=torch.int32, min_shape=(Attr('num_actual_tokens'),))
        >>> class Meta:
        ...     num_actual_tokens = 4
        ...     @stepcache.step_cached(expect=spec)
        ...     def index(self, buffer):
        ...         return buffer[:3]  # BUG: one row short
        >>> Meta().index(torch.zeros(8, dtype=torch.int32))
        Traceback (most recent call last):
          ...
        stepcache.CacheValidationError: step_cached function 'Meta.index': result size mismatch at index 0. expected at least 4 (from owner attribute 'num_actual_tokens'), actual 3 (shape [3])
    """

    device: torch.device | str | Arg | Attr | None = None
    dtype: torch.dtype | Arg | Attr | None = None
    ndim: int | None = None
    shape: tuple[Dim, ...] | None = None
    min_shape: tuple[Dim, ...] | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "shape", _check_dims("shape", self.shape))
        object.__setattr__(self, "min_shape", _check_dims("min_shape", self.min_shape))
        if isinstance(self.device, (str, torch.device)):
            torch.device(self.device)  # raises on a malformed device string
        if not (self.dtype is None or isinstance(self.dtype, (torch.dtype, Arg, Attr))):
            raise StepCacheError(
                f"TensorSpec dtype must be a torch.dtype (got {self.dtype!r})"
            )

    def refs(self) -> list[Arg | Attr]:
        """Every reference this spec resolves at call time."""
        dims = list(self.shape or ()) + list(self.min_shape or ())
        items = [self.device, self.dtype, *dims]
        return [r for r in items if isinstance(r, (Arg, Attr))]

    def __repr__(self) -> str:
        parts = [
            f"{f.name}={getattr(self, f.name)!r}"
            for f in dataclasses.fields(TensorSpec)
            if getattr(self, f.name) is not None
        ]
        return f"TensorSpec({', '.join(parts)})"


Resolver = Callable[[Arg | Attr], Any]


def _label(ref: object) -> str:
    if not isinstance(ref, _Ref):
        return ""
    return (
        f" (from {'argument' if type(ref) is Arg else 'owner attribute'} '{ref.name}')"
    )


_REFS = (Arg, Attr)
#: what references usually resolve to: answered without torch's slow isinstance()
_PLAIN = frozenset({int, torch.device, torch.dtype, str})


def _resolve(ref: Arg | Attr, resolve: Resolver, attr: str) -> Any:
    """What ``ref`` refers to, where a tensor stands for its ``attr``."""
    value = resolve(ref)
    if value.__class__ in _PLAIN or not isinstance(value, torch.Tensor):
        return value
    return getattr(value, attr)


def validate(
    value: Any,
    expect: TensorSpec | tuple[TensorSpec | None, ...],
    resolve: Resolver,
    where: str,
) -> None:
    """Raise :class:`CacheValidationError` if ``value`` breaks ``expect``.

    ``where`` names the function and key for the message.
    """
    if isinstance(expect, TensorSpec):
        _validate_one(value, expect, resolve, where, "result")
        return
    if not isinstance(value, (tuple, list)) or len(value) != len(expect):
        raise CacheValidationError(
            f"{where}: expected a tuple of {len(expect)} values, got {_kind(value)}. "
            "Fix: return a tuple that matches `expect`, or change `expect`."
        )
    for i, (item, spec) in enumerate(zip(value, expect, strict=True)):
        if spec is not None:
            _validate_one(item, spec, resolve, where, f"result[{i}]")


def _kind(value: Any) -> str:
    if isinstance(value, (tuple, list)):
        return f"a {type(value).__name__} of {len(value)}"
    return f"{value!r:.60} that is a {type(value)!r}"


def _validate_one(
    value: Any, spec: TensorSpec, resolve: Resolver, where: str, what: str
) -> None:
    # reads each item of the spec once, and resolves only references: a store's
    # cost, paid on every miss
    if value.__class__ is not torch.Tensor and not isinstance(value, torch.Tensor):
        raise CacheValidationError(
            f"{where}: {what} must be a torch.Tensor (got {_kind(value)})"
        )
    device, dtype, ndim, shape, min_shape = (
        spec.device,
        spec.dtype,
        spec.ndim,
        spec.shape,
        spec.min_shape,
    )
    if device is not None:
        want: Any = (
            _resolve(device, resolve, "device") if device.__class__ in _REFS else device
        )
        got = value.device
        # equal as given needs no normalisation (cuda and cuda:N of the current
        # device are the same device: only a difference is looked at twice)
        if not (want.__class__ is torch.device and got == want):
            want = normalize_device(want)
            if normalize_device(got) != want:
                raise CacheValidationError(
                    f"{where}: {what} device mismatch. expected {want}"
                    f"{_label(device)}, actual {normalize_device(got)}. Fix: compute "
                    f"into a buffer on {want}, or key the cache by device."
                )
    if dtype is not None:
        want = _resolve(dtype, resolve, "dtype") if dtype.__class__ in _REFS else dtype
        if value.dtype != want:
            raise CacheValidationError(
                f"{where}: {what} dtype mismatch. expected {want}"
                f"{_label(dtype)}, actual {value.dtype}"
            )
    got_shape = value.shape
    if ndim is not None and len(got_shape) != ndim:
        raise CacheValidationError(
            f"{where}: {what} ndim mismatch. expected {ndim}, actual {len(got_shape)} "
            f"(shape {list(got_shape)})"
        )
    for dims, exact in ((shape, True), (min_shape, False)):
        if dims is None:
            continue
        if len(dims) > len(got_shape):
            raise CacheValidationError(
                f"{where}: {what} has {len(got_shape)} dims (shape {list(got_shape)}), "
                f"the spec describes {len(dims)}"
            )
        for i, d in enumerate(dims):
            if d is None:
                continue
            want_n: Any = _resolve(d, resolve, "shape") if d.__class__ in _REFS else d
            if want_n.__class__ is not int:  # a tensor stands for its first dim
                want_n = int(want_n[0] if want_n.__class__ is torch.Size else want_n)
            got_n = got_shape[i]
            if (got_n != want_n) if exact else (got_n < want_n):
                rel = "" if exact else "at least "
                raise CacheValidationError(
                    f"{where}: {what} size mismatch at index {i}. expected {rel}{want_n}"
                    f"{_label(d)}, actual {got_n} (shape {list(got_shape)})"
                )
