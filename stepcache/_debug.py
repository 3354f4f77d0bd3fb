# SPDX-License-Identifier: Apache-2.0
"""Debug mode: find stale caches at the line that causes them.

docs/debug.md describes each check of ``checks`` and ``verify``. Not thread-safe:
recording the attributes a function reads patches the owner's class for the call.
"""

from __future__ import annotations

import copy
import dataclasses
import re
import threading
import types
import weakref
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, overload

import numpy as np
import torch

from stepcache import _fingerprint as fp
from stepcache import _state
from stepcache._errors import CacheValidationError, StaleCacheError
from stepcache._spec import normalize_device
from stepcache._state import BYPASS
from stepcache._store import StepCache, closed_error, found

if TYPE_CHECKING:
    from stepcache._decorator import CachedFunction
    from stepcache._hit import Entry

Args = tuple[Any, ...]
_MAX_REPORT = 10_000
_MISSING = object()
#: CPU tensors and numpy arrays up to this many elements have their contents compared
DEEP_CONTENT_LIMIT = 4096
#: the integer dtype of each size, to read a tensor's bits through numpy
_BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
_DEVICE_TEXT = re.compile(r"(cpu|cuda|xpu|mps|hip|npu|meta)(:\d+)?")


@dataclasses.dataclass(frozen=True)
class Detection:
    """One problem debug mode found.

    Attributes:
        kind: A kind of the [debug mode guide](../debug.md): `dependency-changed`, ...
        function: The decorated function's label.
        key: The `repr` of the entry's key.
        message: The message of the error that was raised.

    Examples:
        >>> import stepcache
        >>> stepcache.Detection("use-after-close", "Meta.index", "None", "...").kind
        'use-after-close'
    """

    kind: str
    function: str
    key: str
    message: str


@dataclasses.dataclass(frozen=True)
class DebugReport(Sequence[Detection]):
    """Every detection of the process so far, oldest first.

    A sequence of [`Detection`][stepcache.Detection]; `str()` renders a numbered list.

    Examples:
        >>> import stepcache
        >>> d = stepcache.Detection("validation", "f", "None", "f: it broke")
        >>> report = stepcache.DebugReport((d,))
        >>> len(report), report[0].kind
        (1, 'validation')
        >>> print(report)
        stepcache debug report: 1 detection(s)
        1. [validation] f: it broke
    """

    detections: tuple[Detection, ...]
    #: the detections since the last clear, counting those not kept (past 10,000)
    total: int = -1

    def __post_init__(self) -> None:
        if self.total < 0:
            object.__setattr__(self, "total", len(self.detections))

    @property
    def dropped(self) -> int:
        """Detections made but not kept (past the first 10,000)."""
        return self.total - len(self.detections)

    def __len__(self) -> int:
        return len(self.detections)

    @overload
    def __getitem__(self, i: int) -> Detection: ...
    @overload
    def __getitem__(self, i: slice) -> tuple[Detection, ...]: ...
    def __getitem__(self, i: int | slice) -> Detection | tuple[Detection, ...]:
        return self.detections[i]

    def __str__(self) -> str:
        if not self.detections:
            return "stepcache debug report: nothing detected"
        more = f" ({self.dropped} more not kept)" if self.dropped else ""
        lines = [f"stepcache debug report: {len(self)} detection(s){more}"]
        lines += (f"{i}. [{d.kind}] {d.message}" for i, d in enumerate(self, 1))
        return "\n".join(lines)


_report: list[Detection] = []
_report_lock = threading.Lock()
_total = 0


def debug_report() -> DebugReport:
    """Return every detection of debug mode in this process so far.

    Detections are kept (at most 10,000) even when the error they raised was caught.

    Examples:
        >>> import contextlib, stepcache, torch
        >>> class Meta:
        ...     @stepcache.step_cached(name="ex.lens")
        ...     def lens(self):
        ...         return torch.tensor([2, 1])
        >>> stepcache.clear_debug_report()
        >>> with stepcache.debug("checks"):
        ...     m = Meta()
        ...     stepcache.cache_of(m).close()
        ...     with contextlib.suppress(stepcache.StaleCacheError):  # caught, yet kept
        ...         m.lens()  # used after its step
        >>> [d.kind for d in stepcache.debug_report()]
        ['use-after-close']
        >>> stepcache.clear_debug_report()
    """
    with _report_lock:
        return DebugReport(tuple(_report), _total)


def clear_debug_report() -> None:
    """Forget every detection recorded so far.

    Examples:
        >>> import stepcache
        >>> stepcache.clear_debug_report()
        >>> print(stepcache.debug_report())
        stepcache debug report: nothing detected
    """
    global _total
    with _report_lock:
        _report.clear()
        _total = 0


#: why a dependency-changed write went unseen: a path around the version counter, or
#: an inference tensor, which has none
_UNSEEN = (
    "It was changed through a path that does not bump the version counter (a write "
    "through .numpy(), .data assignment, a kernel writing through data_ptr(), or an "
    "in-place change of a numpy array). Fix: change it with torch in-place ops or "
    "assign a new object.",
    "It is an inference tensor (made under torch.inference_mode()), which has no "
    "version counter: outside debug mode no in-place write to it is seen. Fix: assign "
    "a new tensor instead of writing into this one.",
)

#: each kind's message, for `_detect` to fill in
_MESSAGES: dict[str, str] = {
    "use-after-close": "this value was handed out by a step cache that has since been "
    "closed (the step is over), and it was used again. Fix: finish using step values "
    "within the step, or keep a copy with .clone().",
    "buffer-overwritten": "the cached tensor {tensor} was overwritten after it was "
    "stored ({change}): another step's build wrote the same persistent "
    "buffer, or a consumer mutated the cached value in place. Fix: one step at a time "
    "per buffer (close the old step first), or clone() values that must outlive the "
    "step.",
    "dependency-changed": "dependency '{dep}' changed without the cache noticing: "
    "{diff} (now {now}). {why}",
    "undeclared-input": "owner attribute {names} changed since the entry was stored, "
    "and the function reads it, but neither the key nor depends_on names it; the "
    "cached value is stale: {diff}. Fix: add {names} to depends_on.",
    "validation": "on a hit, the cached value no longer matches expect{error}",
    "key-too-coarse": "the cached value differs from a fresh computation: {diff}. The "
    "key or depends_on misses an input. {fix}",
    "device-alias": "the key {key!r} and the cached key {cached!r} name the same "
    "device two ways (cuda and cuda:N of the current device), so one step computes "
    "and holds the value twice. Fix: normalise devices in the key "
    "(stepcache.normalize_device) or key by the device index.",
    "key-reads-undeclared": "the key function reads owner attribute(s) {names} that "
    "depends_on does not name: an in-place change that keeps the key equal would not "
    "be noticed. Fix: add {names} to depends_on.",
    "builder-mutates-dependency": "the function itself changed its declared "
    "dependency '{dep}' ({diff}), so the entry could never be reused. Fix: remove it "
    "from depends_on (validate an output buffer with "
    "expect=TensorSpec(device=Arg(...)) instead).",
}


def _detect(
    kind: str, fn: CachedFunction, key: Any, text: str = "", **fields: Any
) -> StaleCacheError | CacheValidationError:
    """Record a detection; return its error (message: ``text``, else the kind's)."""
    global _total
    text = f"{fn.where(key)}: {text or _MESSAGES[kind].format(key=key, **fields)}"
    with _report_lock:
        if len(_report) < _MAX_REPORT:
            _report.append(Detection(kind, fn.name, repr(key), text))
        _total += 1
    return (CacheValidationError if kind == "validation" else StaleCacheError)(text)


@dataclasses.dataclass
class _Info:
    """What debug mode records of an entry when it is stored (``Entry.info``)."""

    deps: tuple[tuple[Any, Any], ...]  # (`_view`, `_deep`) of each dependency
    versions: list[tuple[torch.Tensor, Any]]  # each tensor of the value, its `_tag`
    watched: dict[str, tuple[Any, Any]]  # fingerprints of undeclared owner attributes
    value: Any
    #: what calls through each store hand out: the value, its tensors guarded
    handed: weakref.WeakKeyDictionary[StepCache, Any] = dataclasses.field(
        default_factory=weakref.WeakKeyDictionary
    )


def _view(x: Any) -> Any:
    """A numpy array sharing the memory of ``x``, a small CPU tensor or numpy array
    (else ``None``), through which its contents are read again."""
    if isinstance(x, np.ndarray):
        return x if x.size <= DEEP_CONTENT_LIMIT else None
    if not isinstance(x, torch.Tensor) or not fp.strided(x) or not x.is_cpu:
        return None  # sparse and nested tensors: no plain memory to read
    if x.numel() > DEEP_CONTENT_LIMIT:
        return None
    try:  # a real dtype as its bits: numpy lacks some (bfloat16)
        t = x.detach()
        return t.numpy() if t.is_complex() else t.view(_BITS[t.itemsize]).numpy()
    except Exception:  # not on the CPU, not strided, a conjugate view: not read
        return None


def _deep(x: Any, view: Any) -> tuple[Any, ...]:
    """What a write behind the version counter changes in dependency ``x``: shape,
    dtype, address and contents (read through ``view``), or a container's snapshot."""
    contents = None if view is None else view.tobytes()
    if isinstance(x, torch.Tensor):
        if not fp.strided(x):  # no data pointer, no contents to read: its tag
            return (fp.tag(x),)
        return x.shape, x.dtype, x.data_ptr(), contents
    if isinstance(x, np.ndarray):
        return x.shape, x.dtype, None, contents
    return (fp.snapshot(x),)


def _check_deps(
    kind: str, fn: CachedFunction, key: Any, deps: Args, recorded: Any
) -> None:
    """Raise ``kind`` for the first dependency whose `_deep` state is not ``recorded``."""
    for dep, x, (view, before) in zip(fn.dep_names, deps, recorded, strict=True):
        if (after := _deep(x, view)) != before:
            diff, now = _deep_difference(before, after), _describe(x)
            why = _UNSEEN[isinstance(x, torch.Tensor) and x.is_inference()]
            raise _detect(kind, fn, key, dep=dep, diff=diff, now=now, why=why)


def _deep_difference(before: tuple[Any, ...], after: tuple[Any, ...]) -> str:
    if len(before) == 1:  # snapshots, shown as the values they were of; tags
        b, a = (_shown(s[0]) for s in (before, after))
        return f"expected {b!r:.80}, actual {a!r:.80}"
    for name, b, a in zip(("shape", "dtype", "address"), before, after, strict=False):
        if b != a:
            return f"{name} mismatch. expected {b}, actual {a}"
    dtype, b, a = before[1], before[3], after[3]  # the first element whose bytes differ
    j = next(i for i, (p, q) in enumerate(zip(b, a, strict=True)) if p != q)
    j //= dtype.itemsize
    if isinstance(dtype, torch.dtype):
        b, a = (torch.frombuffer(bytearray(c), dtype=dtype) for c in (b, a))
    else:
        b, a = (np.frombuffer(c, dtype) for c in (b, a))
    return f"contents mismatch at flat index {j}. expected {b[j].item()}, actual {a[j].item()}"


def _tag(t: torch.Tensor) -> Any:
    """Debug mode's tag of a cached tensor: its tag, and for an inference tensor
    (written in place without a trace) its contents, where `_view` reads them."""
    if not t.is_inference():
        return fp.tag(t)
    view = _view(t)
    return fp.tag(t), None if view is None else view.tobytes()


def _shown(v: Any) -> Any:
    """A snapshot (a pair) as the value it was taken of; a tag as it is."""
    return fp.unsnapshot(v) if v.__class__ is tuple and len(v) == 2 else v


def _check_tags(
    fn: CachedFunction, key: Any, tagged: Iterable[tuple[torch.Tensor, Any]]
) -> None:
    """Raise buffer-overwritten for the first tensor whose `_tag` is not the one paired."""
    for t, old in tagged:
        if (new := _tag(t)) != old:
            if old.__class__ is int:
                change = f"version {old} -> {new}"
            elif old[0] != new[0]:
                change = f"an inference tensor, moved: {old[0]} -> {new[0]}"
            else:
                change = "an inference tensor, its contents written in place"
            tensor = _describe(t)
            raise _detect("buffer-overwritten", fn, key, tensor=tensor, change=change)


def _describe(x: Any) -> str:
    """A short description of a value, for messages."""
    if isinstance(x, torch.Tensor):
        state = "inference tensor" if x.is_inference() else f"version={x._version}"
        shape = "nested" if x.is_nested else list(x.shape)
        text = f"tensor(shape={shape}, dtype={x.dtype}, device={x.device}, "
        text, small = text + state, fp.strided(x) and x.is_cpu and x.numel() <= 16
    elif isinstance(x, np.ndarray):
        text, small = f"ndarray(shape={list(x.shape)}, dtype={x.dtype}", x.size <= 16
    else:
        return r if len(r := repr(x)) <= 80 else r[:77] + "..."
    return f"{text}, id=0x{id(x):x}" + (f", values={x.tolist()}" if small else "") + ")"


#: class -> its own ``__getattribute__`` (or ``None``) and the (owner, names read)
#: of each miss recording now: one patch per class, undone by the last miss out
_patched: dict[type, tuple[Any, list[tuple[object, set[str]]]]] = {}
_patch_lock = threading.Lock()


def _patch(cls: Any) -> list[tuple[object, set[str]]] | None:
    """Patch a recording ``__getattribute__`` into ``cls`` unless it is already; its
    recorders (``None``: a built-in class cannot be patched)."""
    if cls in _patched:
        return _patched[cls][1]
    own, original = cls.__dict__.get("__getattribute__"), cls.__getattribute__
    recorders: list[tuple[object, set[str]]] = []

    def recording(obj: Any, name: str) -> Any:
        if not name.startswith("__"):
            for owner, names in tuple(recorders):
                if obj is owner:
                    names.add(name)
        return original(obj, name)

    try:
        cls.__getattribute__ = recording
    except (TypeError, AttributeError):
        return None
    _patched[cls] = (own, recorders)
    return recorders


def _reads(
    fn: CachedFunction, owner: object, work: Callable[[], Any]
) -> tuple[Any, list[str]]:
    """``work()`` and the data attributes of ``owner`` it read that ``fn`` does not
    depend on, recorded by a ``__getattribute__`` patched into the owner's class."""
    cls, names = type(owner), set[str]()
    with _patch_lock:
        recorders = _patch(cls)
        if recorders is not None:
            recorders.append((owner, names))
    if recorders is None:
        return work(), []
    try:
        value = work()
    finally:
        with _patch_lock:
            recorders[:] = [r for r in recorders if r[1] is not names]
            if not recorders:  # the last miss out restores the class
                own = _patched.pop(cls)[0]
                if own is not None:
                    cls.__getattribute__ = own  # type: ignore[method-assign]
                else:
                    del cls.__getattribute__
    names -= {*fn.dep_names, "_stepcache"}
    data = (n for n in names if not callable(getattr(owner, n, _MISSING)))
    return value, sorted(n for n in data if hasattr(owner, n))


class GuardedTensor(torch.Tensor):
    """A tensor handed out by a cache in debug mode, guarded against stale reads.

    Every torch operation on it first checks that its cache is open and its storage
    unwritten since, else raises [`StaleCacheError`][stepcache.StaleCacheError]; its
    results and a `clone()` taken in time are plain tensors.

    Examples:
        >>> import stepcache, torch
        >>> class Meta:
        ...     @stepcache.step_cached(name="ex.guarded")
        ...     def lens(self):
        ...         return torch.tensor([2, 1])
        >>> with stepcache.debug("checks"):
        ...     m = Meta()
        ...     lens = m.lens()
        ...     kept = lens.clone()
        >>> stepcache.cache_of(m).close()
        >>> type(lens).__name__, kept
        ('GuardedTensor', tensor([2, 1]))
        >>> lens + 1
        Traceback (most recent call last):
          ...
        stepcache.StaleCacheError: step_cached function 'ex.guarded': this value was handed out by a step cache that has since been closed (the step is over), and it was used again. Fix: finish using step values within the step, or keep a copy with .clone().
        >>> stepcache.clear_debug_report()
    """

    #: (function, key, the entry's _Info, index into info.versions, the store)
    _sc_guard: tuple[CachedFunction, Any, _Info, int, weakref.ref[StepCache]]

    @classmethod
    def __torch_function__(
        cls, func: Any, types: Any, args: Args = (), kwargs: Any = None
    ) -> Any:
        kwargs = kwargs or {}
        with torch._C.DisableTorchFunctionSubclass():
            for arg in (*args, *kwargs.values()):
                for t in arg if isinstance(arg, (tuple, list)) else (arg,):
                    if isinstance(t, GuardedTensor):
                        t._sc_check()
            return func(*args, **kwargs)

    def _sc_check(self) -> None:
        """Raise unless this view's cache is open and its storage unwritten since."""
        if "_sc_guard" in self.__dict__:
            fn, key, info, i, ref = self._sc_guard
            if (store := ref()) is not None and store.closed:
                raise _detect("use-after-close", fn, key)
            _check_tags(fn, key, [(self, info.versions[i][1])])

    # a copy, a deep copy or a pickle is of the plain tensor, once the guard passed: a
    # copy made in time is not the cache's (nor can its guard be pickled)
    def _sc_plain(self) -> torch.Tensor:
        with torch._C.DisableTorchFunctionSubclass():
            self._sc_check()
            return self.as_subclass(torch.Tensor)

    def __deepcopy__(self, memo: dict[int, Any]) -> torch.Tensor:
        return copy.deepcopy(self._sc_plain(), memo)

    def __reduce_ex__(self, protocol: Any) -> Any:
        plain: Any = self._sc_plain()
        return plain.__reduce_ex__(protocol)


def _recompute(fn: CachedFunction, a: Args, entry: Entry) -> str | None:
    """Where a fresh computation differs from the entry's value (``None``: nowhere).
    An equal one written into the cached buffers moves their tags on, and the result
    guard's: the entry and its views stay valid."""
    with torch._C.DisableTorchFunctionSubclass():
        before = fp.walk(entry.value, lambda t: t.detach().clone())
    difference = first_difference(before, fn.invoke(a))
    if difference is None and entry.info is not None:
        entry.info.versions[:] = [(t, _tag(t)) for t, _ in entry.info.versions]
    if difference is None and entry.guard is not None:
        entry.gtag = entry.guard._version
    return difference


def first_difference(
    expected: Any,
    actual: Any,
    path: str = "result",
    seen: frozenset[tuple[int, int]] = frozenset(),
) -> str | None:
    """Where ``actual`` first differs from ``expected`` (``None``: they are equal):
    tensors by device, dtype, shape and values (NaN equals NaN), tuples, lists and
    dicts item by item, dataclass and attrs objects field by field, objects compared
    by identity attribute by attribute, anything else by type and ``==``.

    >>> first_difference((1, torch.tensor([1, 2])), (1, torch.tensor([1, 3])))
    "tensor 'result[1]' value mismatch at flat index 1. expected 2, actual 3"
    >>> first_difference([1.0], (1.0,))
    "'result': expected [1.0], actual (1.0,)"
    """
    if isinstance(expected, torch.Tensor) and isinstance(actual, torch.Tensor):
        with torch._C.DisableTorchFunctionSubclass():
            for what in ("device", "dtype", "layout", "is_nested", "ndim"):
                if (e := getattr(expected, what)) != (a := getattr(actual, what)):
                    return f"tensor '{path}' {what} mismatch. expected {e}, actual {a}"
            if expected.is_nested:  # compared component by component
                return first_difference(expected.unbind(), actual.unbind(), path, seen)
            for i, (n, m) in enumerate(zip(expected.shape, actual.shape, strict=True)):
                if n != m:
                    return f"tensor '{path}' size mismatch at index {i}. expected {n}, actual {m}"
            if expected.is_meta:  # no data: equal place and shape is all there is
                return None
            e, a = (t.detach().cpu().to_dense().reshape(-1) for t in (expected, actual))
            same = (e == a) | ((e != e) & (a != a))
            if bool(same.all()):
                return None
            i = int((~same).nonzero()[0])
            return f"tensor '{path}' value mismatch at flat index {i}. expected {e[i].item()}, actual {a[i].item()}"
    mismatch = f"'{path}': expected {_describe(expected)}, actual {_describe(actual)}"
    if type(expected) is not type(actual):
        return mismatch
    if isinstance(expected, dict) and expected.keys() != actual.keys():
        keys = [sorted(map(repr, d)) for d in (expected, actual)]
        return f"'{path}' keys mismatch. expected {keys[0]}, actual {keys[1]}"
    if isinstance(expected, (tuple, list, dict)):
        if len(expected) != len(actual):
            return f"'{path}' length mismatch. expected {len(expected)}, actual {len(actual)}"
        for k in expected if isinstance(expected, dict) else range(len(expected)):
            found = first_difference(expected[k], actual[k], f"{path}[{k!r}]", seen)
            if found:
                return found
        return None
    pair = (id(expected), id(actual))
    if pair in seen:  # a cycle: these two are compared further up
        return None
    if (fields := _fields(expected)) is not None:  # field by field, as a tuple is
        if (other := _fields(actual)) is None or other.keys() != fields.keys():
            names = [sorted(f or ()) for f in (fields, other)]
            return f"'{path}' fields mismatch. expected {names[0]}, actual {names[1]}"
        for k, e in fields.items():
            if found := first_difference(e, other[k], f"{path}.{k}", seen | {pair}):
                return found
        return None
    try:
        if isinstance(expected, np.ndarray):
            nan = expected.dtype.kind in "fc"  # equal_nan raises for other dtypes
            return None if np.array_equal(expected, actual, equal_nan=nan) else mismatch
        if isinstance(expected, float) and expected != expected:
            return None if actual != actual else mismatch  # NaN equals NaN, as above
        return None if bool(expected == actual) else mismatch
    except Exception:  # an == that does not give a bool
        return None if expected is actual else mismatch


def _fields(x: Any) -> dict[str, Any] | None:
    """The fields of a dataclass or attrs object, or the attributes of an object
    compared by identity (a fresh one never equals the cached one); else ``None``."""
    cls: Any = type(x)
    if dataclasses.is_dataclass(x):  # the fields its == compares
        names = [f.name for f in dataclasses.fields(x) if f.compare]
    elif hasattr(cls, "__attrs_attrs__"):
        names = [a.name for a in cls.__attrs_attrs__ if a.eq]
    elif cls.__eq__ is object.__eq__ and _plain_object(x):
        names = list(vars(x))
    else:
        return None
    return {n: getattr(x, n, _MISSING) for n in names if n != "_stepcache"}


def _plain_object(x: Any) -> bool:
    """An instance with a ``__dict__`` that is data: not a class, module or function."""
    data = not callable(x) and not isinstance(x, types.ModuleType)
    return data and isinstance(getattr(x, "__dict__", None), dict)


def _canonical(key: Any) -> Any:
    """``key`` with each device in it (a `torch.device` or a string) normalised."""
    if isinstance(key, tuple):
        return tuple(_canonical(k) for k in key)
    named = isinstance(key, str) and _DEVICE_TEXT.fullmatch(key)
    if isinstance(key, torch.device) or named:
        return ("device", normalize_device(key))
    return key


def check_open(fn: CachedFunction, a: Args) -> None:
    """Raise use-after-close for a bypassed call whose owner's store was closed. As in
    production, a bypass makes no store."""
    owner = a[fn.owner_index]
    store = found(owner)
    if store is not None and store.closed and store.belongs_to(owner):
        raise _detect("use-after-close", fn, BYPASS, str(closed_error(owner)))


def call(fn: CachedFunction, a: Args, key: Any) -> Any:
    """A call of ``fn`` with the key ``key`` (not a bypass) in checks or verify mode."""
    try:
        owner, store, deps, entry = fn.find(a, key)
    except StaleCacheError as exc:  # the owner's store was closed
        raise _detect("use-after-close", fn, key, str(exc)) from None
    if entry is None:
        return _miss(fn, a, key, owner, store, deps)
    value, info = entry.value, entry.info  # info is None if stored in production
    if info is not None:
        _check_deps("dependency-changed", fn, key, deps, info.deps)
        _check_tags(fn, key, info.versions)
        changed = [
            name
            for name, (o, v) in info.watched.items()
            if not fp.matches(getattr(owner, name, _MISSING), o, v)
        ]
        if changed and (diff := _recompute(fn, a, entry)):
            names = ", ".join(f"'{n}'" for n in changed)
            raise _detect("undeclared-input", fn, key, names=names, diff=diff)
        info.watched.update((n, fp.fingerprint(getattr(owner, n))) for n in changed)
    if (error := fn.violation(value, a)) is not None:
        raise _detect("validation", fn, key, error=error)
    if _state.switches[1] == "verify" and (diff := _recompute(fn, a, entry)):
        raise _detect("key-too-coarse", fn, key, diff=diff, fix=_fix(fn, info))
    fn.count_hit()
    return value if info is None else _hand_out(fn, key, info, store)


def _fix(fn: CachedFunction, info: _Info | None) -> str:
    """The fix a key-too-coarse message suggests: the inputs nothing declares."""
    declared = {*fn.dep_names, *fn.key_names, fn.owner_name}
    params = () if fn.key_fn else fn.names  # a key function's inputs are unknown
    found = [f"parameter '{n}'" for n in params if n not in declared]
    found += [f"owner attribute '{n}'" for n in sorted(info.watched if info else ())]
    if found:
        return (
            f"Candidates: {', '.join(found)}. Fix: add the one that distinguishes "
            "these calls to key= (parameters) or depends_on= (owner attributes)."
        )
    return "Fix: add the input that distinguishes these calls to key= or depends_on=."


def _miss(
    fn: CachedFunction, a: Args, key: Any, owner: object, store: StepCache, deps: Args
) -> Any:
    canonical = _canonical(key)
    for cached in store.keys(fn.fid) if fn.keyed else ():
        if cached != key and _canonical(cached) == canonical:
            raise _detect("device-alias", fn, key, cached=cached)
    fps = fp.fingerprints(deps)
    recorded = tuple((v := _view(x), _deep(x, v)) for x in deps)
    value, read = _reads(fn, owner, lambda: fn.invoke(a))
    key_reads = fn.key_fn is not None and fn.dep_names
    if key_reads and (names := _reads(fn, owner, lambda: fn.key_of(a))[1]):
        raise _detect("key-reads-undeclared", fn, key, names=names)
    _check_deps("builder-mutates-dependency", fn, key, deps, recorded)
    if (error := fn.violation(value, a)) is not None:
        raise _detect("validation", fn, key, error[2:])
    watched = {name: fp.fingerprint(getattr(owner, name)) for name in read}
    versions = [(t, _tag(t)) for t in fp.tensors(value)]
    info = _Info(recorded, versions, watched, value)
    fn.store(store, key, owner, fps, value, info)
    return _hand_out(fn, key, info, store)


def _hand_out(fn: CachedFunction, key: Any, info: _Info, store: StepCache) -> Any:
    """What a call through ``store`` hands out: the value, its tensors as guarded views
    that check ``store`` (a copied owner's store serves the original's entries), made
    once per store."""
    if not info.versions or not _state.STEPCACHE_DEBUG_GUARD:
        return info.value
    if (handed := info.handed.get(store)) is not None:
        return handed
    index = {id(t): i for i, (t, _) in enumerate(info.versions)}
    ref = weakref.ref(store)

    def guarded(t: torch.Tensor) -> torch.Tensor:
        if isinstance(t, GuardedTensor) or not fp.strided(t):  # no view of those
            return t
        view = t.as_subclass(GuardedTensor)
        view.__dict__["_sc_guard"] = (fn, key, info, index[id(t)], ref)
        return view

    handed = info.handed[store] = fp.walk(info.value, guarded)
    return handed
