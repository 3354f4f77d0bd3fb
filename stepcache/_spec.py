# SPDX-License-Identifier: Apache-2.0
"""Declared expectations of a cached value (`TensorSpec`) and their validation."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypeAlias, TypeGuard, TypeVar, cast

import torch

from stepcache._errors import CacheValidationError, StepCacheError


@dataclass(frozen=True)
class _Ref:
    name: str

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"


class Arg(_Ref):
    """A value taken from the decorated call's argument `name`, for a TensorSpec.

    A tensor stands for its device, its dtype or its first dim, as the item needs.

    Examples:
        >>> import stepcache, torch
        >>> spec = stepcache.TensorSpec(device=stepcache.Arg("buf"))
        >>> @stepcache.step_cached(expect=spec, ignore=("buf",))
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
Refs = tuple[tuple[object, ...], Mapping[str, int], object]
Spec: TypeAlias = "TensorSpec | tuple[TensorSpec | None, ...]"
_REFS = {Arg: "argument", Attr: "owner attribute"}  # as the messages name them
#: what references usually resolve to: answered without torch's slow isinstance()
_PLAIN = frozenset({int, torch.device, torch.dtype, str})
_Tensor, _Size = torch.Tensor, torch.Size
_T = TypeVar("_T")


def _current_index(device_type: str) -> int:  # tests replace it on CPU
    # torch's module of the device type (torch.cuda, torch.xpu, ...), if it has one
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


@dataclass(frozen=True, repr=False)
class TensorSpec:
    """What a cached tensor must look like: the `expect=` of a step-cached function.

    Each item is fixed, a reference ([`Arg`][stepcache.Arg], [`Attr`][stepcache.Attr])
    or `None` (not checked, nor is a reference that resolves to `None`); devices are
    compared [normalised][stepcache.normalize_device].

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
    # `device` as a torch.device where it is fixed: what `check` and `quick` compare
    fixed_device: torch.device | Arg | Attr | None = field(init=False, compare=False)

    def __post_init__(self) -> None:
        # checked here, so a wrong argument fails at decoration with its field named,
        # not on the first miss with a raw TypeError
        for name in ("shape", "min_shape"):
            if (dims := getattr(self, name)) is not None:
                object.__setattr__(self, name, _dims(name, dims))
        if self.ndim is not None and not (_is_int(self.ndim) and self.ndim >= 0):
            raise _bad("ndim", "an int >= 0 or None", self.ndim, "ndim=2")
        object.__setattr__(self, "fixed_device", _fixed_device(self.device))
        if not isinstance(self.dtype, torch.dtype | None | Arg | Attr):
            fix = _dtype_fix(self.dtype)
            raise _bad("dtype", "a torch.dtype, Arg, Attr or None", self.dtype, fix)

    def refs(self) -> list[Arg | Attr]:
        """Every reference this spec resolves at call time."""
        items = (self.device, self.dtype, *(self.shape or ()), *(self.min_shape or ()))
        return [r for r in items if isinstance(r, (Arg, Attr))]

    def check(self, x: object, scope: Refs, item: int | None = None) -> None:
        """Raise `CacheValidationError` unless ``x`` (the result, or its item ``item``)
        is a tensor that meets this spec, its references resolved in ``scope``. Runs on
        every miss: an item left unset costs one test."""
        if x.__class__ is not _Tensor and not isinstance(x, _Tensor):
            raise _fail(item, f"must be a torch.Tensor (got {_kind(x)})")
        if self.fixed_device is not None:
            want = _want(self.fixed_device, scope, "device")
            # only a difference is normalised (cuda and cuda:N may be one device)
            if (
                want is not None
                and x.device != want
                and normalize_device(x.device) != normalize_device(want)
            ):
                raise _fail(item, _device_text(self.device, scope, want, x.device))
        if self.dtype is not None:
            dtype = _want(self.dtype, scope, "dtype")
            if dtype is not None and x.dtype != dtype:
                text = f"expected {dtype}{_label(self.dtype)}, actual {x.dtype}"
                raise _fail(item, f"dtype mismatch. {text}")
        if self.ndim is not None and x.ndim != self.ndim:
            text = f"expected {self.ndim}, actual {x.ndim} (shape {list(x.shape)})"
            raise _fail(item, f"ndim mismatch. {text}")
        if self.shape is not None:
            _sizes(x.shape, self.shape, "", scope, item)
        if self.min_shape is not None:
            _sizes(x.shape, self.min_shape, "at least ", scope, item)

    def __repr__(self) -> str:
        shown = dict(vars(self), fixed_device=None)  # derived from device: not shown
        items = (f"{k}={v!r}" for k, v in shown.items() if v is not None)
        return f"TensorSpec({', '.join(items)})"


def _is_int(x: object) -> TypeGuard[int]:  # bool is an int to isinstance
    return isinstance(x, int) and x.__class__ is not bool


def _label(item: Any, note: str = "") -> str:
    # any spec item: a reference (its class in _REFS) is named, which the lookup tells
    kind = _REFS.get(item.__class__)
    return f" (from {kind} '{item.name}'{note})" if kind else ""


def _device_text(ref: Any, scope: Refs, want: torch.device, got: torch.device) -> str:
    """The text of a device mismatch, ``ref`` the spec's device. An int a reference
    resolved to is named, since torch reads an int as an accelerator's device index.
    Only on a failure: the reference is read again."""
    try:  # a fixed device is not read; a reference may fail to read this time
        raw = _read(ref, scope) if isinstance(ref, Arg | Attr) else None
    except Exception:
        raw = None
    want = normalize_device(want)
    note = f", the int {raw} read as a {want.type.upper()} device index"
    text = f"expected {want}{_label(ref, note if _is_int(raw) else '')}, actual {got}"
    fix = f"compute into a buffer on {want}, or key the cache by device."
    return f"device mismatch. {text}. Fix: {fix}"


def _bad(name: str, want: str, got: object, fix: str) -> StepCacheError:
    # ``name`` must be ``want``: ``got`` is not
    shown = f"{got!r:.60} that is a {type(got)!r}"
    return StepCacheError(f"TensorSpec {name} must be {want} (got {shown}). Fix: {fix}")


def _dims(name: str, dims: object) -> tuple[Dim, ...]:
    """``dims`` (the ``shape`` or ``min_shape`` argument) as a tuple, or a
    `StepCacheError` that says what is wrong with it."""
    if isinstance(dims, (str, bytes)) or not hasattr(dims, "__iter__"):
        one = f"Attr({dims!r})" if isinstance(dims, str) else repr(dims)
        fix = f"a tuple with one entry per leading dim, e.g. {name}=({one},)"
        raise _bad(name, "a tuple of int, None, Arg or Attr", dims, fix)
    return tuple(_dim(f"{name}[{i}]", d) for i, d in enumerate(dims))


def _dim(at: str, d: object) -> Dim:
    """``d``, the entry ``at`` of a ``shape`` or ``min_shape``, or a `StepCacheError`
    that says what is wrong with it."""
    if d.__class__ is bool or not isinstance(d, Dim):
        fix = "an int size, None to skip the dim, or Arg/Attr to read it"
        if isinstance(d, str):
            fix = f"Attr({d!r}) for the owner's attribute, Arg({d!r}) for an argument"
        raise _bad(at, "an int, None, Arg or Attr", d, fix)
    if isinstance(d, int) and d < 0:
        raise _bad(at, "a size >= 0", d, "None skips a dim")
    return d


def _fixed_device(device: object) -> torch.device | Arg | Attr | None:
    """``device`` as a `torch.device` if it is fixed (a reference as it is), or a
    `StepCacheError` that says what is wrong with it."""
    if device is None or device.__class__ in _REFS or isinstance(device, torch.device):
        return cast("torch.device | Arg | Attr | None", device)
    if not isinstance(device, str):
        fix = (
            "a device such as 'cpu', 'cuda:1' or torch.device('cuda'), or Arg('buffer')"
        )
        if _is_int(device):
            fix = f"device='cuda:{device}' (an int is not taken as a device here)"
        raise _bad("device", "a str, torch.device, Arg, Attr or None", device, fix)
    try:
        return torch.device(device)
    except (RuntimeError, ValueError) as exc:
        why = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        text = f"TensorSpec device {device!r} is not a device torch knows ({why})"
        fix = "a device string such as 'cpu', 'cuda' or 'cuda:1'"
        raise StepCacheError(f"{text}. Fix: {fix}") from None


def _dtype_fix(dtype: object) -> str:
    if isinstance(dtype, str) and isinstance(getattr(torch, dtype, None), torch.dtype):
        return f"dtype=torch.{dtype}"
    return "a dtype such as torch.int32, or Arg('buffer') for an argument's dtype"


def _fail(item: int | None, text: str) -> CacheValidationError:
    return CacheValidationError(f"result{'' if item is None else f'[{item}]'} {text}")


def _sizes(
    shape: torch.Size, dims: tuple[Dim, ...], least: str, scope: Refs, item: int | None
) -> None:
    """Check the leading sizes of ``shape`` against ``dims`` (lower bounds if ``least``)."""
    if len(shape) < len(dims):
        text = f"(shape {list(shape)}), the spec describes {len(dims)}"
        raise _fail(item, f"has {len(shape)} dims {text}")
    for i, dim in enumerate(dims):
        want = _want(dim, scope, "shape")
        if want is not None and (shape[i] < want if least else shape[i] != want):
            text = f"expected {least}{want}{_label(dim)}, actual {shape[i]}"
            text += f" (shape {list(shape)})"
            raise _fail(item, f"size mismatch at index {i}. {text}")


def _kind(value: object) -> str:
    if isinstance(value, (tuple, list)):
        return f"a {type(value).__name__} of {len(value)}"
    return f"{value!r:.60} that is a {type(value)!r}"


def _read(ref: Arg | Attr, scope: Refs) -> Any:
    """What ``ref`` holds in ``scope``: the call's argument, or the owner's attribute."""
    args, index, owner = scope
    return args[index[ref.name]] if type(ref) is Arg else getattr(owner, ref.name)


def _want(item: _T | Arg | Attr, scope: Refs, attr: str) -> _T | None:
    """A fixed item as it is; a reference resolved in ``scope`` (a tensor stands for
    its ``attr``: device, dtype, or shape, whose first dim a size stands for), of the
    fixed items' type. A reference that resolves to ``None`` gives ``None``: the item
    is not checked."""
    if not isinstance(item, (Arg, Attr)):
        return item
    try:
        # what the argument or attribute holds, read as the item needs (`Any`: it
        # is made of the fixed items' type below)
        want: Any = _read(item, scope)
        if want.__class__ not in _PLAIN and isinstance(want, _Tensor):
            want = getattr(want, attr)
        if attr == "shape" and want.__class__ is not int and want is not None:
            want = int(want[0] if want.__class__ is _Size else want)
        if attr == "device" and want.__class__ is not torch.device and want is not None:
            want = torch.device(want)
    except Exception as exc:
        why = f"{type(exc).__name__}: {exc}"
        raise CacheValidationError(f"expect's {item!r}: no {attr} ({why})") from None
    return cast("_T | None", want)


def of_args(expect: Spec | None) -> Spec | None:
    """What of ``expect`` reads the call's arguments (`Arg`), which can differ between
    calls that share a value, checked again on a hit: ``None`` where nothing does.

    >>> of_args(TensorSpec(device=Arg("buf"), dtype=torch.int32, ndim=1))
    TensorSpec(device=Arg('buf'))
    """
    if isinstance(expect, tuple):  # each spec's part (a spec gives a spec or None)
        parts = tuple(cast("TensorSpec | None", of_args(s)) for s in expect)
        return parts if any(parts) else None
    if expect is None or not any(type(r) is Arg for r in expect.refs()):
        return None

    def arg(x: object) -> Arg | None:  # an Arg as it is; other items unchecked
        return x if type(x) is Arg else None

    def dims(d: tuple[Dim, ...] | None) -> tuple[Dim, ...] | None:
        return tuple(map(arg, d)) if d and any(map(arg, d)) else None

    shape, least = dims(expect.shape), dims(expect.min_shape)
    return TensorSpec(arg(expect.device), arg(expect.dtype), None, shape, least)


def check(expect: Spec, value: object, scope: Refs) -> None:
    """Raise `CacheValidationError` if ``value`` breaks ``expect``, a spec or a tuple
    of them; ``scope`` resolves its references. Runs on every miss."""
    if isinstance(expect, TensorSpec):
        return expect.check(value, scope)
    if not isinstance(value, (tuple, list)) or len(value) != len(expect):
        text = f"expected a tuple of {len(expect)} values, got {_kind(value)}"
        fix = "return a tuple that matches `expect`, or change `expect`."
        raise CacheValidationError(f"{text}. Fix: {fix}")
    for i, (spec, x) in enumerate(zip(expect, value, strict=True)):
        if spec is not None:
            spec.check(x, scope, i)


# A spec's common case as one Python expression, which the generated call inlines.
# `check` resolves every reference and normalises devices, about a microsecond a miss;
# the expression is true only where the value plainly meets the spec (a tensor, the
# same device object, the same dtype, exact sizes), and every other case goes to
# `check`, which alone raises (the slow path calls it alone). The expression may
# raise: "not sure" too.
def quick(expect: Spec, value: str, owner: str, names: dict[str, object]) -> str:
    """An expression true only where ``value`` (an expression) meets ``expect``, in
    code where each parameter is a local and ``owner`` names the owner's (an `Arg`
    reads its parameter, an `Attr` the owner's attribute). The values it names are
    added to ``names`` (``_sc_q_`` names: globals of the code it joins)."""
    names.update(_sc_q_Tensor=torch.Tensor, _sc_q_int=int, _sc_q_tuple=tuple)

    def const(x: object) -> str:
        name = f"_sc_q_{len(names)}"
        names[name] = x
        return name

    def same(left: str, op: str, item: object, cls: str, attr: str = "") -> str:
        """``left op item``, for a fixed item (an int inline, any other a constant) or
        for a reference that holds a ``cls`` (a tensor: its ``attr``): other values
        (a tensor for a size: its first dim, None, ...) go to the full check."""
        if isinstance(item, Arg | Attr):
            r = item.name if type(item) is Arg else f"{owner}.{item.name}"
            return f"{r}.__class__ is {cls} and {left} {op} {r}{attr}"
        return f"{left} {op} {item if isinstance(item, int) else const(item)}"

    def one(spec: TensorSpec, v: str) -> str:
        parts = [f"{v}.__class__ is _sc_q_Tensor"]
        # an unindexed accelerator device equals no tensor's: the full check
        tensor = (("device", "==", spec.fixed_device), ("dtype", "is", spec.dtype))
        for attr, op, item in tensor:
            if item is not None:
                parts.append(same(f"{v}.{attr}", op, item, "_sc_q_Tensor", f".{attr}"))
        if spec.ndim is not None:
            parts.append(f"{v}.dim() == {spec.ndim}")
        for dims, op in ((spec.shape or (), "=="), (spec.min_shape or (), ">=")):
            if dims and (spec.ndim is None or spec.ndim < len(dims)):
                parts.append(f"{v}.dim() >= {len(dims)}")  # a skipped dim counts
            for i, d in enumerate(dims):
                if d is not None:
                    parts.append(same(f"{v}.shape[{i}]", op, d, "_sc_q_int"))
        return " and ".join(parts)

    if isinstance(expect, TensorSpec):
        return f"({one(expect, value)})"
    items = [one(s, f"{value}[{i}]") for i, s in enumerate(expect) if s is not None]
    head = [f"{value}.__class__ is _sc_q_tuple", f"len({value}) == {len(expect)}"]
    return f"({' and '.join(head + items)})"
