# SPDX-License-Identifier: Apache-2.0
"""Debug mode: find stale caches at the line that causes them.

``checks`` adds, on every call of a decorated function:

* deep dependency fingerprints (contents of small CPU tensors and numpy arrays, shape,
  strides, data pointer), so a dependency changed behind the version counter is caught;
* a record of the owner attributes the builder and the key function read: one that
  changed since the entry was stored, and is covered by neither the key nor
  ``depends_on``, triggers a recomputation, and a different result raises;
* validation of ``expect`` on every hit, and a check that the cached tensors were not
  written since they were stored (a persistent buffer overwritten by the next step);
* guarded values: tensors handed out are views that raise when read after their cache
  was closed or after their storage was overwritten;
* keys that name one device two ways (``cuda`` and ``cuda:0``).

``verify`` adds a recomputation on every hit, compared with the cached value
(``torch.equal`` per tensor, through tuples, lists and dicts): a mismatch means the key
or ``depends_on`` misses an input. Verify mode costs one full computation per hit.

Every detection raises a typed error and is also kept in :func:`debug_report`.
Debug mode is for tests and bisecting: it is not thread-safe (attribute-read recording
patches the owner's class for the duration of one builder call).
"""

from __future__ import annotations

import dataclasses
import re
import threading
import weakref
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from stepcache import _envs, _fingerprint, _state
from stepcache._errors import CacheValidationError, StaleCacheError
from stepcache._fingerprint import fingerprints, tag
from stepcache._spec import normalize_device
from stepcache._store import StepCache, store_for

if TYPE_CHECKING:
    from stepcache._decorator import CachedFunction
    from stepcache._entry import Entry

__all__ = [
    "DebugReport",
    "Detection",
    "call",
    "clear_debug_report",
    "debug_report",
]

_MAX_REPORT = 10_000


@dataclasses.dataclass(frozen=True)
class Detection:
    """One problem debug mode found.

    An item of [`debug_report()`][stepcache.debug_report].

    Attributes:
        kind: What was found: `dependency-changed`, `undeclared-input`,
            `key-too-coarse`, `use-after-close`, `buffer-overwritten`, `validation`,
            `builder-mutates-dependency`, `device-alias` or `key-reads-undeclared`
            (the [debug mode guide](../debug.md) explains each).
        function: The decorated function's label.
        key: The `repr` of the entry's key.
        message: The message of the error that was raised.

    Examples:
        >>> import stepcache
        >>> d = stepcache.Detection("use-after-close", "Meta.index", "None", "...")
        >>> d.kind, d.function
        ('use-after-close', 'Meta.index')
    """

    #: ``dependency-changed``, ``undeclared-input``, ``key-too-coarse``,
    #: ``use-after-close``, ``buffer-overwritten``, ``validation``,
    #: ``builder-mutates-dependency``, ``device-alias``, ``key-reads-undeclared``
    kind: str
    function: str
    key: str
    message: str


@dataclasses.dataclass(frozen=True)
class DebugReport:
    """Every detection of the process so far, oldest first.

    A sequence of [`Detection`][stepcache.Detection]; `str()` renders a numbered list.

    Examples:
        >>> import stepcache
        >>> stepcache.clear_debug_report()
        >>> print(stepcache.debug_report())
        stepcache debug report: nothing detected
        >>> report = stepcache.DebugReport(
        ...     (stepcache.Detection("validation", "f", "None", "f: it broke"),)
        ... )
        >>> len(report), report[0].kind
        (1, 'validation')
        >>> print(report)
        stepcache debug report: 1 detection(s)
        1. [validation] f: it broke
    """

    detections: tuple[Detection, ...]
    #: every detection since the last clear, also those past the kept maximum
    #: (the report keeps the first 10,000)
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

    def __iter__(self) -> Iterator[Detection]:
        return iter(self.detections)

    def __getitem__(self, i: int) -> Detection:
        return self.detections[i]

    def __str__(self) -> str:
        if not self.detections:
            return "stepcache debug report: nothing detected"
        lines = [f"stepcache debug report: {len(self.detections)} detection(s)"]
        if self.dropped:
            lines[0] += f" ({self.dropped} more not kept)"
        for i, d in enumerate(self.detections, 1):
            lines.append(f"{i}. [{d.kind}] {d.message}")
        return "\n".join(lines)


_report: list[Detection] = []
_report_lock = threading.Lock()
_total = 0


def debug_report() -> DebugReport:
    """Return every detection of debug mode in this process so far.

    For a test suite's summary: print it at the end of the session (in a
    `pytest_terminal_summary` hook, say). Detections are kept even when the error they
    raised was caught; at most 10,000 are kept.

    Examples:
        >>> import stepcache, torch
        >>> class Meta:
        ...     def __init__(self):
        ...         self.qsl = torch.tensor([0, 2, 3])
        ...     @stepcache.step_cached(depends_on=("qsl",), name="ex.lens")
        ...     def lens(self):
        ...         return self.qsl.diff()
        >>> stepcache.clear_debug_report()
        >>> with stepcache.debug("checks"):
        ...     m = Meta()
        ...     lens = m.lens()
        ...     stepcache.cache_of(m).close()
        ...     try:
        ...         lens.sum()  # used after its step
        ...     except stepcache.StaleCacheError:
        ...         pass
        >>> print(stepcache.debug_report())
        stepcache debug report: 1 detection(s)
        1. [use-after-close] step_cached function 'ex.lens': this value was handed out by a step cache that has since been closed (the step is over), and it was used again. Fix: finish using step values within the step, or keep a copy with .clone().
        >>> stepcache.clear_debug_report()
    """
    with _report_lock:
        return DebugReport(tuple(_report), _total)


def clear_debug_report() -> None:
    """Forget every detection recorded so far.

    Examples:
        >>> import stepcache
        >>> stepcache.clear_debug_report()
        >>> len(stepcache.debug_report())
        0
    """
    global _total
    with _report_lock:
        _report.clear()
        _total = 0


def _detect(
    error: type[StaleCacheError] | type[CacheValidationError],
    kind: str,
    fn: CachedFunction,
    key: Any,
    message: str,
) -> StaleCacheError | CacheValidationError:
    where = fn.where(key)
    text = f"{where}: {message}"
    with _report_lock:
        if len(_report) < _MAX_REPORT:
            _report.append(Detection(kind, fn.name, repr(key), text))
        _count_detection()
    return error(text)


# -- what an entry remembers in debug mode ------------------------------------------------
@dataclasses.dataclass
class _Info:
    """Debug facts about one entry, stored as the entry's last element."""

    deep: tuple[Any, ...]
    #: (tensor, its tag at store time) for each tensor in the value
    versions: list[tuple[torch.Tensor, Any]]
    #: owner attributes read by the builder or key function but declared nowhere
    watched: dict[str, tuple[Any, Any]]
    store: weakref.ref[StepCache]
    #: what hits hand out: the value with its tensors guarded (made once, at the miss)
    handed: Any = None
    #: the dependencies whose deep fingerprint a hit compares: not those compared by
    #: value or snapshot (the lookup already found them equal), and not a repeat of
    #: an earlier dependency's object (the lookup found it identical again)
    deep_check: tuple[int, ...] = ()
    #: for each of deep_check, a numpy view of a small CPU tensor's contents (or None)
    probes: tuple[Any, ...] = ()


# -- recording which owner attributes a call reads ------------------------------------------
def _reads(owner: object, work: Callable[[], Any]) -> tuple[Any, set[str]]:
    """Run ``work()`` and return its result with the owner attributes it read.

    The owner's class gets a recording ``__getattribute__`` for the duration of the
    call (debug mode only; not thread-safe), then its own one back.
    """
    cls = type(owner)
    own = cls.__dict__.get("__getattribute__")
    original = cls.__getattribute__
    names: set[str] = set()

    def recording(obj: Any, name: str) -> Any:
        if obj is owner and not name.startswith("__"):
            names.add(name)
        return original(obj, name)

    try:
        cls.__getattribute__ = recording  # type: ignore[method-assign]
    except (TypeError, AttributeError):
        return work(), set()
    try:
        return work(), names
    finally:
        if own is not None:
            cls.__getattribute__ = own  # type: ignore[method-assign]
        else:
            del cls.__getattribute__


# -- guarded values ---------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class _Guard:
    fn_name: str
    key: str
    #: how messages name the function and key
    where: str
    #: the entry's debug facts; ``info.versions[index]`` is the version this view
    #: must still have (verify mode refreshes it after an equal recomputation)
    info: _Info
    index: int


class GuardedTensor(torch.Tensor):
    """A tensor handed out by a cache in debug mode, guarded against stale reads.

    Any torch operation on it first checks that its cache is still open and that its
    storage was not written since it was stored; if not, it raises
    [`StaleCacheError`][stepcache.StaleCacheError], in the style of CUDA Graph Trees'
    "overwritten by a subsequent run". Results of operations are plain tensors, and a
    `clone()` taken in time stays valid. `STEPCACHE_DEBUG_GUARD=0` hands out plain
    tensors instead.

    Examples:
        >>> import stepcache, torch
        >>> class Meta:
        ...     def __init__(self):
        ...         self.qsl = torch.tensor([0, 2, 3])
        ...     @stepcache.step_cached(depends_on=("qsl",), name="ex.guarded")
        ...     def lens(self):
        ...         return self.qsl.diff()
        >>> with stepcache.debug("checks"):
        ...     m = Meta()
        ...     lens = m.lens()
        ...     kept = lens.clone()
        >>> type(lens).__name__, type(kept).__name__
        ('GuardedTensor', 'Tensor')
        >>> stepcache.cache_of(m).close()
        >>> kept
        tensor([2, 1])
        >>> lens + 1
        Traceback (most recent call last):
          ...
        stepcache.StaleCacheError: step_cached function 'ex.guarded': this value was handed out by a step cache that has since been closed (the step is over), and it was used again. Fix: finish using step values within the step, or keep a copy with .clone().
        >>> stepcache.clear_debug_report()
    """

    _sc_guard: _Guard

    @classmethod
    def __torch_function__(
        cls,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        with torch._C.DisableTorchFunctionSubclass():
            for t in _guarded_in(args, kwargs):
                _check_guard(t)
            return func(*args, **(kwargs or {}))


def _guarded_in(args: tuple[Any, ...], kwargs: dict[str, Any] | None) -> Iterator[Any]:
    for a in args:
        if isinstance(a, GuardedTensor):
            yield a
        elif isinstance(a, (tuple, list)):
            yield from (x for x in a if isinstance(x, GuardedTensor))
    if kwargs:
        yield from (x for x in kwargs.values() if isinstance(x, GuardedTensor))


def _check_guard(t: GuardedTensor) -> None:
    guard = t.__dict__.get("_sc_guard")
    if guard is None:
        return
    store = guard.info.store()
    expected = guard.info.versions[guard.index][1]
    if store is not None and store._closed:
        message = (
            f"{guard.where}: this value was "
            "handed out by a step cache that has since been closed (the step is over), "
            "and it was used again. Fix: finish using step values within the step, or "
            "keep a copy with .clone()."
        )
        _record_guard("use-after-close", guard, message)
        raise StaleCacheError(message)
    now = tag(t)
    if now != expected:
        message = (
            f"{guard.where}: this tensor was "
            "overwritten by a subsequent write to its storage after the cache handed it "
            f"out (version {expected} -> {now}): the next step's build "
            "wrote the same persistent buffer, or someone mutated a cached value in "
            "place. To keep the value beyond the step, clone() it."
        )
        _record_guard("buffer-overwritten", guard, message)
        raise StaleCacheError(message)


def _record_guard(kind: str, guard: _Guard, message: str) -> None:
    with _report_lock:
        if len(_report) < _MAX_REPORT:
            _report.append(Detection(kind, guard.fn_name, guard.key, message))
        _count_detection()


def _count_detection() -> None:
    global _total
    _total += 1


def _guard(value: Any, fn: CachedFunction, key: Any, info: _Info) -> Any:
    if not _envs.STEPCACHE_DEBUG_GUARD:
        return value
    index = {id(t): i for i, (t, _) in enumerate(info.versions)}
    where = fn.where(key) if fn.keyed else fn.where()
    return _wrap(value, (fn.name, repr(key), where), info, index)


def _wrap(
    value: Any, label: tuple[str, str, str], info: _Info, index: dict[int, int]
) -> Any:
    if isinstance(value, torch.Tensor) and not isinstance(value, GuardedTensor):
        i = index.get(id(value))
        if i is None:
            return value
        guarded = value.as_subclass(GuardedTensor)
        guarded.__dict__["_sc_guard"] = _Guard(*label, info, i)
        return guarded
    if isinstance(value, tuple) and not hasattr(value, "_fields"):
        return tuple(_wrap(v, label, info, index) for v in value)
    if isinstance(value, list):
        return [_wrap(v, label, info, index) for v in value]
    return value


def _clone(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        with torch._C.DisableTorchFunctionSubclass():
            return value.detach().clone()
    if isinstance(value, tuple) and not hasattr(value, "_fields"):
        return tuple(_clone(v) for v in value)
    if isinstance(value, list):
        return [_clone(v) for v in value]
    if isinstance(value, dict):
        return {k: _clone(v) for k, v in value.items()}
    return value


def _recompute(
    fn: CachedFunction, a: tuple[Any, ...], value: Any, info: _Info | None
) -> str | None:
    """Compute afresh and compare with the cached value as it was before.

    A builder that writes into a persistent buffer rewrites the cached tensors' storage
    here; if the contents are equal, the entry and the views already handed out stay
    valid (their expected versions move on). Returns where the values differ, if they do.
    """
    before = _clone(value)
    fresh = fn.invoke(a)
    difference = first_difference(before, fresh)
    if difference is None and info is not None:
        for i, (t, _) in enumerate(info.versions):
            info.versions[i] = (t, tag(t))
    return difference


# -- comparisons -------------------------------------------------------------------------------
def first_difference(cached: Any, fresh: Any, path: str = "result") -> str | None:
    """Where two values first differ, in the style of PyTorch's guard messages."""
    if isinstance(cached, torch.Tensor) or isinstance(fresh, torch.Tensor):
        if not (isinstance(cached, torch.Tensor) and isinstance(fresh, torch.Tensor)):
            return f"{path}: expected {_short(cached)}, actual {_short(fresh)}"
        with torch._C.DisableTorchFunctionSubclass():
            if cached.shape != fresh.shape:
                for i, (n, m) in enumerate(
                    zip(cached.shape, fresh.shape, strict=False)
                ):
                    if n != m:
                        return f"tensor '{path}' size mismatch at index {i}. expected {n}, actual {m}"
                return f"tensor '{path}' ndim mismatch. expected {cached.dim()}, actual {fresh.dim()}"
            if cached.dtype != fresh.dtype:
                return f"tensor '{path}' dtype mismatch. expected {cached.dtype}, actual {fresh.dtype}"
            flat_c = cached.detach().cpu().reshape(-1)
            flat_f = fresh.detach().cpu().reshape(-1)
            if torch.equal(flat_c, flat_f):
                return None
            diff = (flat_c != flat_f).nonzero()
            i = int(diff[0]) if diff.numel() else 0
            return (
                f"tensor '{path}' value mismatch at flat index {i}. "
                f"expected {flat_c[i].item()}, actual {flat_f[i].item()}"
            )
    if isinstance(cached, np.ndarray) or isinstance(fresh, np.ndarray):
        if np.array_equal(np.asarray(cached), np.asarray(fresh)):
            return None
        return (
            f"array '{path}' differs: expected {_short(cached)}, actual {_short(fresh)}"
        )
    if isinstance(cached, (tuple, list)) and isinstance(fresh, (tuple, list)):
        if len(cached) != len(fresh):
            return (
                f"'{path}' length mismatch. expected {len(cached)}, actual {len(fresh)}"
            )
        for i, (a, b) in enumerate(zip(cached, fresh, strict=True)):
            found = first_difference(a, b, f"{path}[{i}]")
            if found:
                return found
        return None
    if isinstance(cached, dict) and isinstance(fresh, dict):
        if cached.keys() != fresh.keys():
            return f"'{path}' keys differ: expected {sorted(map(repr, cached))}, actual {sorted(map(repr, fresh))}"
        for k in cached:
            found = first_difference(cached[k], fresh[k], f"{path}[{k!r}]")
            if found:
                return found
        return None
    try:
        same = bool(cached == fresh)
    except Exception:
        same = cached is fresh
    return (
        None if same else f"'{path}': expected {_short(cached)}, actual {_short(fresh)}"
    )


def _short(x: Any) -> str:
    return _fingerprint.describe(x)


def _deep_difference(before: Any, after: Any) -> str:
    """Which part of a deep fingerprint changed."""
    names = ("kind", "shape", "dtype", "data_ptr", "contents")
    if before[0] == after[0] == "tensor":
        for i, name in enumerate(names):
            if i and before[i] != after[i]:
                if (
                    name == "contents"
                    and before[i] is not None
                    and after[i] is not None
                ):
                    pairs = zip(_flat(before[i]), _flat(after[i]), strict=False)
                    for j, (a, b) in enumerate(pairs):
                        if a != b:
                            return f"contents mismatch at flat index {j}. expected {a}, actual {b}"
                return f"{name} mismatch. expected {before[i]}, actual {after[i]}"
    if before[0] == after[0] == "ndarray":
        if before[2] != after[2]:
            return f"shape mismatch. expected {before[2]}, actual {after[2]}"
        if before[4] is not None and after[4] is not None:
            a = np.frombuffer(before[4], dtype=np.dtype(before[3]))
            b = np.frombuffer(after[4], dtype=np.dtype(after[3]))
            if a.shape == b.shape:
                j = int(np.flatnonzero(a != b)[0]) if (a != b).any() else 0
                return f"contents mismatch at flat index {j}. expected {a[j]}, actual {b[j]}"
        return "contents changed"
    return f"expected {before!r:.80}, actual {after!r:.80}"


def _flat(values: Any) -> list[Any]:
    if not isinstance(values, list):
        return [values]
    out: list[Any] = []
    for v in values:
        out.extend(_flat(v))
    return out


# -- device aliases in keys -----------------------------------------------------------------
_DEVICE_TEXT = re.compile(r"^(cpu|cuda|xpu|mps|hip|npu|meta)(:\d+)?$")


def _device_canonical(part: Any) -> Any:
    if isinstance(part, torch.device):
        return ("device", normalize_device(part))
    if isinstance(part, str) and _DEVICE_TEXT.match(part):
        return ("device", normalize_device(part))
    return part


def _canonical_key(key: Any) -> Any:
    if isinstance(key, tuple):
        return tuple(_canonical_key(k) for k in key)
    return _device_canonical(key)


def _check_device_alias(fn: CachedFunction, store: StepCache, key: Any) -> None:
    if not fn.keyed:
        return
    canon = _canonical_key(key)
    for other in store.keys(fn.fid):
        if other != key and _canonical_key(other) == canon:
            raise _detect(
                StaleCacheError,
                "device-alias",
                fn,
                key,
                f"the key {key!r} and the cached key {other!r} name the same device two "
                "ways (cuda and cuda:N of the current device), so one step computes and "
                "holds the value twice, and consumers disagree on which buffer they "
                "read. Fix: normalise devices in the key (stepcache.normalize_device) "
                "or key by the device index.",
            )


# -- the debug call -------------------------------------------------------------------------------
def call(fn: CachedFunction, a: tuple[Any, ...], key: Any) -> Any:
    """A call of ``fn`` with the key ``key`` (not a bypass) in checks or verify mode."""
    owner = a[fn.owner_index]
    try:
        store = store_for(owner)
    except StaleCacheError as exc:
        raise _detect(StaleCacheError, "use-after-close", fn, key, str(exc)) from None
    deps = fn.dep_values(a, key) if fn.dep_names else ()
    entry = store.lookup(fn.fid, fn.keyed, key)
    if entry is not None:
        if entry.matches(owner, deps):
            return _hit(fn, a, key, owner, deps, entry)
        fn.stale(entry, owner, store)
    return _miss(fn, a, key, owner, store, deps)


def _hit(
    fn: CachedFunction,
    a: tuple[Any, ...],
    key: Any,
    owner: object,
    deps: tuple[Any, ...],
    entry: Entry,
) -> Any:
    value = entry.value
    info: _Info | None = entry.info  # None: stored in production mode
    if info is not None:
        for i, probe in zip(info.deep_check, info.probes, strict=True):
            dep, x, before = fn.dep_names[i], deps[i], info.deep[i]
            if not _fingerprint.deep_unchanged(x, before, probe):
                after = _fingerprint.deep(x)
                raise _detect(
                    StaleCacheError,
                    "dependency-changed",
                    fn,
                    key,
                    f"dependency '{dep}' changed without the cache noticing: "
                    f"{_deep_difference(before, after)} (now {_short(x)}). It was "
                    "changed through a path that does not bump the version counter "
                    "(a write through .numpy(), .data assignment, a kernel writing "
                    "through data_ptr(), or an in-place change of a numpy array). "
                    "Fix: change it with torch in-place ops or assign a new object.",
                )
        # (with guard_result the lookup compared these versions already: a written
        # buffer is a recomputation there, not a detection here)
        for t, version in () if fn.guard else info.versions:
            if tag(t) != version:
                raise _detect(
                    StaleCacheError,
                    "buffer-overwritten",
                    fn,
                    key,
                    f"the cached tensor {_short(t)} was overwritten after it was "
                    f"stored (version {version} -> {tag(t)}): another step's build "
                    "wrote the same persistent buffer while this step's cache still "
                    "held a view into it, or a consumer mutated the cached value in "
                    "place. Fix: one step at a time per buffer (close the old step "
                    "first), or clone() values that must outlive the step.",
                )
        changed = (
            [
                name
                for name, (o, v) in info.watched.items()
                if not _fingerprint.matches(getattr(owner, name, _MISSING), o, v)
            ]
            if info.watched
            else None
        )
        if changed:
            difference = _recompute(fn, a, value, info)
            if difference is not None:
                names = ", ".join(f"'{n}'" for n in changed)
                raise _detect(
                    StaleCacheError,
                    "undeclared-input",
                    fn,
                    key,
                    f"owner attribute {names} changed since the entry was stored, "
                    f"and the function reads it, but neither the key nor depends_on "
                    f"names it; the cached value is stale: {difference}. Fix: add "
                    f"{names} to depends_on.",
                )
            for name in changed:
                info.watched[name] = _fingerprint.fingerprint(getattr(owner, name))
    violation = fn.violation(value, a)
    if violation is not None:
        raise _detect(
            CacheValidationError,
            "validation",
            fn,
            key,
            f"on a hit, the cached value no longer matches expect{violation}",
        )
    if _state.switches[1] == "verify":
        difference = _recompute(fn, a, value, info)
        if difference is not None:
            raise _detect(
                StaleCacheError,
                "key-too-coarse",
                fn,
                key,
                f"the cached value differs from a fresh computation: {difference}. "
                f"The key or depends_on misses an input. {_suggest(fn, info)}",
            )
    fn.count_hit()
    if info is None or not info.versions or not _envs.STEPCACHE_DEBUG_GUARD:
        return value
    if info.handed is None:
        info.handed = _guard(value, fn, key, info)
    return info.handed


_MISSING = object()


def _suggest(fn: CachedFunction, info: _Info | None) -> str:
    declared = set(fn.dep_names) | set(fn.key_names)
    candidates = []
    if fn.key_fn is None:
        candidates = [
            f"parameter '{n}'"
            for n in fn.names
            if n != fn.owner_name and n not in declared
        ]
    if info is not None:
        candidates += [f"owner attribute '{n}'" for n in sorted(info.watched)]
    if not candidates:
        return (
            "Fix: add the input that distinguishes these calls to key= or depends_on=."
        )
    return (
        "Candidates: "
        + ", ".join(candidates)
        + ". Fix: add the one that distinguishes "
        "these calls to key= (parameters) or depends_on= (owner attributes)."
    )


def _miss(
    fn: CachedFunction,
    a: tuple[Any, ...],
    key: Any,
    owner: object,
    store: StepCache,
    deps: tuple[Any, ...],
) -> Any:
    _check_device_alias(fn, store, key)
    fps = fingerprints(deps)
    deep_before = tuple(_fingerprint.deep(x) for x in deps)
    value, read = _reads(owner, lambda: fn.invoke(a))
    declared = set(fn.dep_names)
    if fn.key_fn is not None:
        _, key_read = _reads(owner, lambda: fn.key_of(a))
        undeclared = sorted(
            n
            for n in key_read
            if n not in declared and not callable(getattr(owner, n, None))
        )
        if undeclared and fn.dep_names:
            raise _detect(
                StaleCacheError,
                "key-reads-undeclared",
                fn,
                key,
                f"the key function reads owner attribute(s) {undeclared} that depends_on "
                "does not name: an in-place change that keeps the key equal would not be "
                f"noticed. Fix: add {undeclared} to depends_on.",
            )
    for dep, x, before in zip(fn.dep_names, deps, deep_before, strict=True):
        if _fingerprint.deep(x) != before:
            raise _detect(
                StaleCacheError,
                "builder-mutates-dependency",
                fn,
                key,
                f"the function itself changed its declared dependency '{dep}' "
                f"({_deep_difference(before, _fingerprint.deep(x))}), so the entry "
                "could never be reused. Fix: remove it from depends_on (validate an "
                "output buffer with expect=TensorSpec(device=Arg(...)) instead).",
            )
    violation = fn.violation(value, a)
    if violation is not None:
        raise _detect(CacheValidationError, "validation", fn, key, violation[2:])
    watched: dict[str, tuple[Any, Any]] = {}
    for name in sorted(read - declared):
        attr = getattr(owner, name, _MISSING)
        if attr is _MISSING or callable(attr) or name == "_stepcache":
            continue
        watched[name] = _fingerprint.fingerprint(attr)
    # compared deeply on a hit: not what the lookup compared by value or snapshot,
    # and not a repeat of an earlier dependency's object
    kinds = fps[1::2]
    deep_check = tuple(
        i
        for i, (x, kind) in enumerate(zip(deps, kinds, strict=True))
        if kind is not _fingerprint.VAL
        and kind is not _fingerprint.SNAP
        and not any(deps[j] is x for j in range(i))
    )
    info = _Info(
        deep_before,
        [(t, tag(t)) for t in _fingerprint.tensors(value)],
        watched,
        weakref.ref(store),
        deep_check=deep_check,
        probes=tuple(_fingerprint.content_probe(deps[i]) for i in deep_check),
    )
    fn.store(store, key, owner, fps, value, info)
    info.handed = _guard(value, fn, key, info)
    return info.handed
