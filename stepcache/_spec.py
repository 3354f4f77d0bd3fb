# SPDX-License-Identifier: Apache-2.0
"""Declared expectations of a cached value (`TensorSpec`) and their validation."""

from __future__ import annotations

import dataclasses
import functools
import itertools
import linecache
from collections.abc import Callable, Mapping
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
_Tensor, _Size = torch.Tensor, torch.Size


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


def _kind(value: Any) -> str:
    if isinstance(value, (tuple, list)):
        return f"a {type(value).__name__} of {len(value)}"
    return f"{value!r:.60} that is a {type(value)!r}"


def _error(where: str, what: int | None, text: str) -> CacheValidationError:
    """The error of a broken spec; ``what`` is the item of a tuple result (``None``:
    the result itself)."""
    name = "result" if what is None else f"result[{what}]"
    return CacheValidationError(f"{where}: {name} {text}")


# The errors a check raises, one per kind of item; a check calls one only on failure.
def _not_tensor(where: str, what: int | None, value: Any) -> CacheValidationError:
    return _error(where, what, f"must be a torch.Tensor (got {_kind(value)})")


def _not_tuple(where: str, n: int, value: Any) -> CacheValidationError:
    return CacheValidationError(
        f"{where}: expected a tuple of {n} values, got {_kind(value)}. Fix: return a "
        "tuple that matches `expect`, or change `expect`."
    )


def _device(where: str, what: int | None, got: Any, want: Any, label: str) -> None:
    """Raise unless ``got`` and ``want``, unequal as given, are one device normalised
    (cuda and cuda:N of the current device)."""
    want, got = normalize_device(want), normalize_device(got)
    if got != want:
        raise _error(
            where,
            what,
            f"device mismatch. expected {want}{label}, actual {got}. Fix: compute into a "
            f"buffer on {want}, or key the cache by device.",
        )


def _dtype(
    where: str, what: int | None, got: Any, want: Any, label: str
) -> CacheValidationError:
    return _error(where, what, f"dtype mismatch. expected {want}{label}, actual {got}")


def _ndim(where: str, what: int | None, value: Any, want: int) -> CacheValidationError:
    text = f"ndim mismatch. expected {want}, actual {value.ndim}"
    return _error(where, what, f"{text} (shape {list(value.shape)})")


def _rank(where: str, what: int | None, shape: Any, n: int) -> CacheValidationError:
    text = f"has {len(shape)} dims (shape {list(shape)}), the spec describes {n}"
    return _error(where, what, text)


def _size(
    where: str, what: int | None, shape: Any, i: int, want: Any, least: str, label: str
) -> CacheValidationError:
    text = f"expected {least}{want}{label}, actual {shape[i]} (shape {list(shape)})"
    return _error(where, what, f"size mismatch at index {i}. {text}")


def _item(
    spec: TensorSpec, x: str, what: int | None, consts: dict[str, Any]
) -> list[str]:
    """Source that checks the value ``x`` against ``spec``."""
    item: Any
    out = [f"if {x}.__class__ is not _Tensor and not isinstance({x}, _Tensor):"]
    out.append(f"    raise _not_tensor(where, {what}, {x})")

    def want(item: Any, attr: str) -> str:
        """A fixed value's name among the check's globals, or, for a reference, the
        local ``want`` set to it (a tensor stands for its ``attr``)."""
        if not isinstance(item, _Ref):
            consts[name := f"_w{len(consts)}"] = item
            return name
        name = item.name
        read = f"owner.{name}" if name.isidentifier() else f"getattr(owner, {name!r})"
        out.append(
            "want = " + (f"args[index[{name!r}]]" if type(item) is Arg else read)
        )
        out.append("if want.__class__ not in _PLAIN and isinstance(want, _Tensor):")
        out.append(f"    want = want.{attr}")
        return "want"

    if (item := spec.device) is not None:
        fixed = item if isinstance(item, _Ref) else torch.device(item)
        w = want(fixed, "device")
        # only a difference is normalised (cuda and cuda:N may be one device)
        out.append(f"if {x}.device != {w}:")
        out.append(f"    _device(where, {what}, {x}.device, {w}, {_label(item)!r})")
    if (item := spec.dtype) is not None:
        w = want(item, "dtype")
        out.append(f"if {x}.dtype != {w}:")
        out.append(f"    raise _dtype(where, {what}, {x}.dtype, {w}, {_label(item)!r})")
    if spec.ndim is not None:
        out.append(f"if {x}.ndim != {spec.ndim}:")
        out.append(f"    raise _ndim(where, {what}, {x}, {spec.ndim})")
    for dims, least in spec._dims:
        out += [f"shape = {x}.shape", f"if len(shape) < {len(dims)}:"]
        out.append(f"    raise _rank(where, {what}, shape, {len(dims)})")
        for i, item in enumerate(dims):
            if item is None:
                continue
            w = want(item, "shape")
            if w == "want":  # a tensor stands for its first dim
                out.append("if want.__class__ is not int:")
                out.append(
                    "    want = int(want[0] if want.__class__ is _Size else want)"
                )
            out.append(f"if shape[{i}] {'<' if least else '!='} {w}:")
            args = f"shape, {i}, {w}, {least!r}, {_label(item)!r}"
            out.append(f"    raise _size(where, {what}, {args})")
    return out


#: the globals of every check
_NAMES: dict[str, Any] = {"_Tensor": _Tensor, "_Size": _Size, "_PLAIN": _PLAIN}
_NAMES.update((f.__name__, f) for f in (_not_tensor, _not_tuple, _device, _dtype))
_NAMES.update((f.__name__, f) for f in (_ndim, _rank, _size))


_labels = itertools.count(1)


@functools.cache
def checker(expect: Spec) -> Callable[[Any, Scope, str], None]:
    """``expect`` as a function ``check(value, scope, where)`` that raises
    `CacheValidationError` if ``value`` breaks it; the message starts with ``where``.

    Written for the spec's own items (as attrs writes ``__init__``): a check runs on
    every miss, so it tests nothing the spec leaves out. Its source is in `linecache`.

    >>> import inspect
    >>> print(inspect.getsource(checker(TensorSpec(dtype=torch.int32))), end="")
    def check(value, scope, where):
        if value.__class__ is not _Tensor and not isinstance(value, _Tensor):
            raise _not_tensor(where, None, value)
        if value.dtype != _w0:
            raise _dtype(where, None, value.dtype, _w0, '')
    """
    consts: dict[str, Any] = {}
    specs = (expect,) if isinstance(expect, TensorSpec) else expect
    lines = ["def check(value, scope, where):"]
    if any(s.refs() for s in specs if s is not None):
        lines.append("args, index, owner = scope")
    if isinstance(expect, TensorSpec):
        lines += _item(expect, "value", None, consts)
    else:
        n = len(expect)
        lines.append(f"if not isinstance(value, (tuple, list)) or len(value) != {n}:")
        lines.append(f"    raise _not_tuple(where, {n}, value)")
        for i, spec in enumerate(expect):
            if spec is not None:
                lines += [f"x{i} = value[{i}]", *_item(spec, f"x{i}", i, consts)]
    text = "\n".join(lines[:1] + [f"    {line}" for line in lines[1:]]) + "\n"
    label = f"<stepcache expect {next(_labels)}>"
    linecache.cache[label] = (len(text), None, text.splitlines(True), label)
    namespace = {**_NAMES, **consts}
    exec(compile(text, label, "exec"), namespace)
    check: Callable[[Any, Scope, str], None] = namespace["check"]
    return check
