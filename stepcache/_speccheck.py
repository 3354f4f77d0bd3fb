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

__all__ = ["Quick", "compile_check", "inline_check"]

#: ``quick(value, args)``: True only if ``value`` certainly meets the spec
Quick = Callable[[Any, tuple[Any, ...]], bool]


class _Source:
    """The lines of one check, written for where it runs: the function of
    `compile_check`, or inline in the generated miss (`inline_check`).

    The call's arguments tuple is ``a`` in both. Inline, the value is ``_sc_val``, a
    failed item breaks out of the miss's ``while True:``, locals start with ``_sc_q``,
    constants are items of the tuple ``_sc_QC``, and the Tensor and device classes are
    the miss's ``_sc_Tensor`` and ``_sc_device``.
    """

    def __init__(
        self, index_of: dict[str, int], owner_index: int, inline: bool
    ) -> None:
        self.index_of = index_of
        self.owner_index = owner_index
        self.inline = inline
        self.value = "_sc_val" if inline else "value"
        self.fail = "break" if inline else "return False"
        self.prefix = "_sc_q" if inline else ""
        self.tensor = "_sc_Tensor" if inline else "_Tensor"
        self.device = "_sc_device" if inline else "_device"
        self.consts: dict[str, Any] = {}
        self.lines: list[str] = []

    def const(self, value: Any) -> str:
        i = len(self.consts)
        name = f"_sc_QC[{i}]" if self.inline else f"_c{i}"
        self.consts[name] = value
        return name

    def local(self, name: str) -> str:
        return self.prefix + name

    def ref(self, ref: Arg | Attr) -> str:
        if isinstance(ref, Arg):
            return f"a[{self.index_of[ref.name]}]"
        owner = f"a[{self.owner_index}]"
        if ref.name.isidentifier() and not keyword.iskeyword(ref.name):
            return f"{owner}.{ref.name}"
        return f"getattr({owner}, {self.const(ref.name)})"

    def emit(self, line: str) -> None:
        self.lines.append("    " + line)

    def fails_if(self, condition: str) -> None:
        self.emit(f"if {condition}:")
        self.emit(f"    {self.fail}")


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
        local = src.local(local)
        src.emit(f"{local} = {src.ref(item)}")
        t = src.tensor
        src.emit(f"if {local}.__class__ is {t} or isinstance({local}, {t}):")
        src.emit(f"    {local} = {local}.{attr}")
        return local
    return src.const(item if convert is None else convert(item))


def _tensor_checks(src: _Source, v: str, spec: TensorSpec, n: int) -> None:
    # the class first: isinstance() on a tensor asks torch's metaclass (measured with
    # the caches cold, as at a step's first call: 2 us, the class test under 1)
    t = src.tensor
    src.fails_if(f"{v}.__class__ is not {t} and not isinstance({v}, {t})")
    if spec.device is not None:
        want = _item(src, spec.device, f"_w{n}d", "device", torch.device)
        if isinstance(spec.device, (Arg, Attr)):
            # a torch.device is compared as given; anything else (a string) is left
            # to validate()
            src.fails_if(
                f"{want}.__class__ is not {src.device} or {v}.device != {want}"
            )
        else:
            src.fails_if(f"{v}.device != {want}")
    if spec.dtype is not None:
        want = _item(src, spec.dtype, f"_w{n}t", "dtype", None)
        src.fails_if(f"{v}.dtype is not {want}")
    dims: list[tuple[int, Any, bool]] = []
    for sizes, exact in ((spec.shape, True), (spec.min_shape, False)):
        for i, d in enumerate(sizes or ()):
            if d is not None:
                dims.append((i, d, exact))
    rank = max(len(spec.shape or ()), len(spec.min_shape or ()))
    if spec.ndim is None and rank == 0:
        return
    if spec.ndim is not None and rank > spec.ndim:
        src.emit(f"{src.fail}  # a spec no tensor meets: validate() says why")
        return
    if not dims and rank == 0:
        # only the number of dims, without building the shape
        src.fails_if(f"{v}.dim() != {spec.ndim}")
        return
    s = src.local(f"_s{n}")
    src.emit(f"{s} = {v}.shape")
    if spec.ndim is not None:
        src.fails_if(f"len({s}) != {spec.ndim}")
    else:
        src.fails_if(f"len({s}) < {rank}")
    for i, d, exact in dims:
        if isinstance(d, (Arg, Attr)):
            w = src.local(f"_w{n}s{i}")
            src.emit(f"{w} = {src.ref(d)}")
            # an int is compared; anything else (a tensor's first dim) is validate()'s
            src.fails_if(f"{w}.__class__ is not int")
        else:
            w = str(int(d))
        op = "!=" if exact else "<"
        src.fails_if(f"{s}[{i}] {op} {w}")


def _checks(src: _Source, expect: TensorSpec | tuple[TensorSpec | None, ...]) -> None:
    if isinstance(expect, TensorSpec):
        _tensor_checks(src, src.value, expect, 0)
        return
    src.fails_if(
        f"{src.value}.__class__ is not tuple or len({src.value}) != {len(expect)}"
    )
    for i, spec in enumerate(expect):
        if spec is not None:
            v = src.local(f"_v{i}")
            src.emit(f"{v} = {src.value}[{i}]")
            _tensor_checks(src, v, spec, i)


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
    src = _Source(index_of, owner_index, inline=False)
    _checks(src, expect)
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


def inline_check(
    expect: TensorSpec | tuple[TensorSpec | None, ...],
    index_of: dict[str, int],
    owner_index: int,
) -> tuple[tuple[str, ...], tuple[Any, ...]]:
    """The same check as `compile_check`, as lines for the generated miss, and the
    constants they read from ``_sc_QC``.

    The lines check ``_sc_val`` against the call's arguments ``a`` inside a
    ``while True:`` loop, and ``break`` at the first item that fails; they set
    ``_sc_ok = True`` and break if all pass. They use ``_sc_Tensor`` and ``_sc_device``.
    Written out in the miss, the check costs no call (3 us with the caches cold,
    measured, at a step's first call).

    >>> lines, consts = inline_check(TensorSpec(ndim=2), {"x": 0}, 0)
    >>> print("\\n".join(lines))
    if _sc_val.__class__ is not _sc_Tensor and not isinstance(_sc_val, _sc_Tensor):
        break
    if _sc_val.dim() != 2:
        break
    _sc_ok = True
    break
    """
    src = _Source(index_of, owner_index, inline=True)
    _checks(src, expect)
    src.emit("_sc_ok = True")
    src.emit("break")
    return tuple(line[4:] for line in src.lines), tuple(src.consts.values())
