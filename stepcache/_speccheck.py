# SPDX-License-Identifier: Apache-2.0
"""A declared ``expect`` compiled into one fast check of a value.

:func:`stepcache._spec.validate` explains a violation; it is general, so it is slow
(a resolver call per reference, an ``isinstance`` per item, normalised devices). The
check compiled here answers only "certainly valid?" with the fewest tensor reads,
generated once per decorated function: each tensor's device, dtype and shape are read
once, references are read straight from the call's arguments or the owner, and fixed
items are constants. It may say no to a valid value (a device given as a string, a
``cuda`` that means ``cuda:0``, a size given as a tensor): the caller then runs
``validate``, which decides and names the violation. It never says yes to an invalid
value.
"""

from __future__ import annotations

import keyword
from collections.abc import Callable
from typing import Any

import torch

from stepcache._spec import Arg, Attr, TensorSpec

__all__ = ["Quick", "compile_check"]

#: ``quick(value, args)``: True only if ``value`` certainly meets the spec
Quick = Callable[[Any, tuple[Any, ...]], bool]


class _Source:
    def __init__(self, index_of: dict[str, int], owner_index: int) -> None:
        self.index_of = index_of
        self.owner_index = owner_index
        self.consts: dict[str, Any] = {}
        self.lines: list[str] = []

    def const(self, value: Any) -> str:
        name = f"_c{len(self.consts)}"
        self.consts[name] = value
        return name

    def ref(self, ref: Arg | Attr) -> str:
        if isinstance(ref, Arg):
            return f"a[{self.index_of[ref.name]}]"
        if ref.name.isidentifier() and not keyword.iskeyword(ref.name):
            return f"a[{self.owner_index}].{ref.name}"
        return f"getattr(a[{self.owner_index}], {self.const(ref.name)})"

    def emit(self, line: str) -> None:
        self.lines.append("    " + line)


def _item(
    src: _Source,
    item: Any,
    local: str,
    attr: str,
    convert: Callable[[Any], Any] | None,
) -> str:
    """The expression of a spec item: a constant (``convert``-ed), or a reference
    read into ``local``, where a tensor stands for its ``attr``."""
    if isinstance(item, (Arg, Attr)):
        src.emit(f"{local} = {src.ref(item)}")
        src.emit(f"if isinstance({local}, _Tensor):")
        src.emit(f"    {local} = {local}.{attr}")
        return local
    return src.const(item if convert is None else convert(item))


def _tensor_checks(src: _Source, v: str, spec: TensorSpec, n: int) -> None:
    src.emit(f"if not isinstance({v}, _Tensor):")
    src.emit("    return False")
    if spec.device is not None:
        want = _item(src, spec.device, f"_w{n}d", "device", torch.device)
        if isinstance(spec.device, (Arg, Attr)):
            # a torch.device is compared as given; anything else (a string) is left
            # to validate()
            src.emit(f"if {want}.__class__ is not _device or {v}.device != {want}:")
        else:
            src.emit(f"if {v}.device != {want}:")
        src.emit("    return False")
    if spec.dtype is not None:
        want = _item(src, spec.dtype, f"_w{n}t", "dtype", None)
        src.emit(f"if {v}.dtype is not {want}:")
        src.emit("    return False")
    dims: list[tuple[int, Any, bool]] = []
    for sizes, exact in ((spec.shape, True), (spec.min_shape, False)):
        for i, d in enumerate(sizes or ()):
            if d is not None:
                dims.append((i, d, exact))
    rank = max(len(spec.shape or ()), len(spec.min_shape or ()))
    if spec.ndim is None and rank == 0:
        return
    if spec.ndim is not None and rank > spec.ndim:
        src.emit("return False  # a spec no tensor meets: validate() says why")
        return
    if not dims and rank == 0:
        # only the number of dims: .ndim, without building the shape
        src.emit(f"if {v}.ndim != {spec.ndim}:")
        src.emit("    return False")
        return
    s = f"_s{n}"
    src.emit(f"{s} = {v}.shape")
    if spec.ndim is not None:
        src.emit(f"if len({s}) != {spec.ndim}:")
    else:
        src.emit(f"if len({s}) < {rank}:")
    src.emit("    return False")
    for i, d, exact in dims:
        if isinstance(d, (Arg, Attr)):
            w = f"_w{n}s{i}"
            src.emit(f"{w} = {src.ref(d)}")
            # an int is compared; anything else (a tensor's first dim) is validate()'s
            src.emit(f"if {w}.__class__ is not int:")
            src.emit("    return False")
        else:
            w = str(int(d))
        op = "!=" if exact else "<"
        src.emit(f"if {s}[{i}] {op} {w}:")
        src.emit("    return False")


def compile_check(
    expect: TensorSpec | tuple[TensorSpec | None, ...],
    index_of: dict[str, int],
    owner_index: int,
    label: str = "expect",
) -> Quick:
    """The fast check of ``expect`` for a function whose parameters are ``index_of``.

    >>> import torch
    >>> from stepcache import Arg, TensorSpec
    >>> spec = TensorSpec(device=Arg("buf"), dtype=torch.int32, min_shape=(4,))
    >>> quick = compile_check(spec, {"md": 0, "buf": 1}, 0)
    >>> buf = torch.zeros(8, dtype=torch.int32)
    >>> quick(buf[:4], (None, buf)), quick(buf[:3], (None, buf))
    (True, False)
    """
    src = _Source(index_of, owner_index)
    if isinstance(expect, TensorSpec):
        _tensor_checks(src, "value", expect, 0)
    else:
        src.emit(f"if value.__class__ is not tuple or len(value) != {len(expect)}:")
        src.emit("    return False")
        for i, spec in enumerate(expect):
            if spec is not None:
                src.emit(f"_v{i} = value[{i}]")
                _tensor_checks(src, f"_v{i}", spec, i)
    src.emit("return True")
    text = "def quick(value, a):\n" + "\n".join(src.lines) + "\n"
    ns: dict[str, Any] = {
        "__builtins__": __builtins__,
        "_Tensor": torch.Tensor,
        "_device": torch.device,
        **src.consts,
    }
    exec(compile(text, f"<stepcache {label}>", "exec"), ns)
    quick: Quick = ns["quick"]
    return quick
