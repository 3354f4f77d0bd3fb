# SPDX-License-Identifier: Apache-2.0
"""Debug mode: its report of what it found, and the checks it makes as an observer of
the slow path (its hooks `bypassed`, `hit`, `compute`, `hand_out`), which find stale
caches at the line that causes them.

docs/debug.md describes each check of ``checks`` and ``verify``. Not thread-safe:
recording the attributes a function reads patches the owner's class for the call.
"""

from __future__ import annotations

import dataclasses
import functools
import operator
import re
import threading
import weakref
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, TypeAlias, cast, overload

import numpy as np
import torch

from stepcache import _kinds as fp
from stepcache._bypass import BYPASS
from stepcache._diff import MISSING, describe, first_difference
from stepcache._entry import Entry, tensors, walk
from stepcache._errors import CacheValidationError, StaleCacheError
from stepcache._guard import guarded
from stepcache._owners import closed_error, held
from stepcache._scope import Scope, open_here
from stepcache._spec import normalize_device
from stepcache._store import StepCache
from stepcache._switches import STEPCACHE_DEBUG_GUARD, Switches
from stepcache._watch import Watch, data_read, watch

if TYPE_CHECKING:
    from numpy.typing import NDArray

    from stepcache._decorator import Args
    from stepcache._decorator import CachedFunction as Cached

    #: the memory of a small CPU tensor or numpy array, read through numpy (`_view`)
    _View: TypeAlias = NDArray[np.generic]
    #: what `_deep` records of a dependency, read back by position: ``(snapshot,)``,
    #: ``(tag,)`` or ``(shape, dtype, address, contents)``
    _State: TypeAlias = tuple[Any, ...]
    #: a dependency as `compute` records it: (name, object, view, address, state); the
    #: object is a tensor, a numpy array, a list, dict or set (a tensor where
    #: ``address`` is set)
    _Dep: TypeAlias = tuple[str, Any, _View | None, int | None, _State]
    #: debug mode's `_tag` of a cached tensor: its version, or an inference tensor's
    #: (tag, contents)
    _Tag: TypeAlias = int | tuple[int | fp.Place | str, bytes | None]
    #: a cached tensor, its `_tag` and its address (`_versioned`)
    _Versioned: TypeAlias = tuple[torch.Tensor, _Tag, int | None]

_MAX_REPORT = 10_000
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
        more = f" ({self.dropped} more not kept)" if self.dropped else ""
        head = f"{len(self)} detection(s){more}" if self else "nothing detected"
        lines = (f"\n{i}. [{d.kind}] {d.message}" for i, d in enumerate(self, 1))
        return f"stepcache debug report: {head}" + "".join(lines)


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

#: each kind's message, for `detect` to fill in
_MESSAGES: dict[str, str] = {
    "use-after-close": "this value was handed out by a step cache that has since been "
    "closed (the step is over), and it was used again. Fix: finish using step values "
    "within the step, or keep a copy with .clone().",
    "buffer-overwritten": "the cached tensor {tensor} was overwritten after it was "
    "stored ({change}): another step's build wrote the same persistent buffer, or a "
    "consumer mutated the cached value in place. Fix: one step at a time per buffer "
    "(close the old step first), or clone() values that must outlive the step.",
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
    "ignored-argument": "the function's result depends on {names}, which ignore= "
    "says it does not: {diff}. Fix: add {names} to key= instead of ignore=.",
    "scope-thread": "this object joined a scope that another thread opened, and it "
    "was used here while that scope is open: the scope's entries are shared without "
    "a check. Fix: use each metadata object in the thread whose scope it joined.",
}


def detect(
    kind: str, fn: Cached, key: object, text: str = "", **fields: object
) -> StaleCacheError | CacheValidationError:
    """Record a detection of ``fn`` (a `CachedFunction`); return its error (message:
    ``text``, else the kind's)."""
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

    deps: list[_Dep]  # its tensor and array dependencies, as `compute` records them
    versions: list[_Versioned]  # each tensor of the value: `_versioned`
    watched: dict[str, fp.Print]  # fingerprints of undeclared owner attributes
    #: (position in the call, fingerprint) of each ignored argument
    ignored: tuple[tuple[int, object, object], ...]
    refs: tuple[object, ...]  # what `expect`'s references held when it was validated
    #: nothing to check on a hit in checks mode (the slow path serves it at once)
    quiet: bool
    #: what calls through each store hand out (by the store's id: its weak reference
    #: and the value, its tensors guarded)
    handed: dict[int, tuple[weakref.ref[StepCache], object]]
    #: the last of them handed out: the store a step's calls go through
    last: tuple[weakref.ref[StepCache] | None, object] = (None, None)


def _view(x: object) -> _View | None:
    """A numpy array sharing the memory of ``x``, a small CPU tensor or numpy array
    (else ``None``), through which its contents are read again."""
    # sparse and nested tensors: no plain memory to read
    if isinstance(x, torch.Tensor) and fp.strided(x) and x.is_cpu:
        try:  # a real dtype as its bits: numpy lacks some (bfloat16); no copy made
            t = x.detach()
            x = t.numpy() if t.is_complex() else t.view(_BITS[t.itemsize]).numpy()
        except Exception:  # a conjugate view: not read
            return None
    return x if isinstance(x, np.ndarray) and x.size <= DEEP_CONTENT_LIMIT else None


def _deep(x: object, view: _View | None) -> _State:
    """What a write behind the version counter changes in tensor or array ``x``:
    shape, dtype, address and contents (read through ``view``); a tensor with no
    plain memory (sparse, nested): its tag; a list, dict or set: its snapshot."""
    if not isinstance(x, (torch.Tensor, np.ndarray)):
        return (fp.snapshot(x),)
    if isinstance(x, torch.Tensor) and not fp.strided(x):
        return (fp.tag(x),)
    address = x.data_ptr() if isinstance(x, torch.Tensor) else None
    return x.shape, x.dtype, address, None if view is None else view.tobytes()


def _check_deps(kind: str, fn: Cached, key: object, records: Iterable[_Dep]) -> None:
    """Raise ``kind`` for the first recorded dependency no longer in its state (at
    its address with its contents: not read further)."""
    for name, x, view, address, before in records:
        same = address is not None and x.data_ptr() == address
        if same and (view is None or view.tobytes() == before[3]):
            continue
        if (after := _deep(x, view)) != before:
            diff, now = _deep_difference(before, after), describe(x)
            why = _UNSEEN[isinstance(x, torch.Tensor) and x.is_inference()]
            raise detect(kind, fn, key, dep=name, diff=diff, now=now, why=why)


def _deep_difference(before: _State, after: _State) -> str:
    if len(before) == 1:  # snapshots, shown as the values they were of; tags as such
        b, a = (fp.unsnapshot(s) if type(s) is tuple else s for (s,) in (before, after))
        return f"expected {b!r:.80}, actual {a!r:.80}"
    for name, b, a in zip(("shape", "dtype", "address"), before, after, strict=False):
        if b != a:
            return f"{name} mismatch. expected {b}, actual {a}"
    dtype, b, a = before[1], before[3], after[3]  # the first element whose bytes differ
    j = next(i for i in range(len(b)) if b[i] != a[i]) // dtype.itemsize
    decode = torch.frombuffer if isinstance(dtype, torch.dtype) else np.frombuffer
    b, a = (decode(bytearray(c), dtype=dtype) for c in (b, a))
    return f"contents mismatch at flat index {j}. expected {b[j].item()}, actual {a[j].item()}"


def _tag(t: torch.Tensor) -> _Tag:
    """Debug mode's tag of a cached tensor: its tag, and for an inference tensor
    (written in place without a trace) its contents, where `_view` reads them."""
    if not t.is_inference():
        return fp.version(t)
    return fp.tag(t), None if (view := _view(t)) is None else view.tobytes()


def _versioned(t: torch.Tensor) -> _Versioned:
    """A cached tensor, its `_tag` and its address, as a debug hit checks them."""
    return t, _tag(t), t.data_ptr() if fp.strided(t) else None


def _check_tag(fn: Cached, key: object, t: torch.Tensor, old: Any) -> None:
    """Raise buffer-overwritten where tensor ``t``'s `_tag` is no longer ``old`` (a
    version or a pair, told apart by its class: `Any`)."""
    new: Any = _tag(t)
    if new != old:
        if old.__class__ is int:
            change = f"version {old} -> {new}"
        elif old[0] != new[0]:
            change = f"an inference tensor, moved: {old[0]} -> {new[0]}"
        else:
            change = "an inference tensor, its contents written in place"
        raise detect("buffer-overwritten", fn, key, tensor=describe(t), change=change)


#: what else a difference inside a scope may mean
_IN_SCOPE = (
    " Inside a scope it may also be a broken promise: an input written in place "
    "while the scope is open (the scope matches inference tensors by identity)."
)


def _recheck(
    kind: str, fn: Cached, a: Args, key: object, entry: Entry, inputs: list[Any]
) -> dict[str, fp.Print] | None:
    """Where an input nothing declares (an owner attribute the function read, an
    ignored argument: each ``(name, value, fingerprint)`` of ``inputs``) no longer
    matches its fingerprint, compute again: raise ``kind`` if the value differs; each
    input's fingerprint, taken again where it changed (``None``: none changed)."""
    if not (changed := [n for n, x, (o, v) in inputs if not fp.match(x, o, v)]):
        return None
    if diff := _recompute(fn, a, entry):
        names = ", ".join(f"'{n}'" for n in changed)
        raise detect(kind, fn, key, names=names, diff=diff)
    return {n: fp.fingerprint(x) if n in changed else f for n, x, f in inputs}


def _recompute(fn: Cached, a: Args, entry: Entry) -> str | None:
    """Where a fresh computation differs from the entry's value (``None``: nowhere).
    An equal one written into the cached buffers moves their tags on, and the result
    guard's: the entry and its views stay valid."""
    with fp.plain_torch():
        before = walk(entry.value, lambda t: t.detach().clone())
    difference = first_difference(before, fn.run(a))
    if difference is None and entry.info is not None:
        entry.info.versions[:] = [_versioned(t) for t, _, _ in entry.info.versions]
    if difference is None and entry.guard is not None:
        entry.gtag = fp.version(entry.guard)
    return difference


def _fix(fn: Cached, info: _Info | None) -> str:
    """The fix a key-too-coarse message suggests: the inputs nothing declares."""
    # the parameters neither the key (a key function's inputs are unknown) nor
    # depends_on names: those ignore= names (`CachedFunction._problems`)
    found = [f"parameter '{n}'" for n in fn.names if n in fn.ignored and not fn.key_fn]
    found += [f"owner attribute '{n}'" for n in sorted(info.watched if info else ())]
    if found:
        return (
            f"Candidates: {', '.join(found)}. Fix: add the one that distinguishes "
            "these calls to key= (parameters) or depends_on= (owner attributes)."
        )
    return "Fix: add the input that distinguishes these calls to key= or depends_on=."


def _canonical(key: object) -> object:
    """``key`` with each device in it (a `torch.device` or a string) normalised."""
    if isinstance(key, tuple):
        return tuple(_canonical(k) for k in key)
    named = isinstance(key, str) and _DEVICE_TEXT.fullmatch(key)
    if isinstance(key, torch.device) or named:
        return ("device", normalize_device(cast("torch.device | str", key)))
    return key


def _reading(owner: object, call: Callable[[], object]) -> tuple[object, set[str]]:
    """``call()``, and the names of the attributes it read on ``owner``."""
    reads = watch(owner) or Watch(owner, None)
    try:
        return call(), reads.names
    finally:
        reads.stop()


# Debug mode's hooks, called by the slow path (every call takes it in debug mode):
# each checks what it can see of the call and raises a recorded detection.


def bypassed(fn: Cached, a: Args) -> None:
    """A bypassed call: use-after-close, if its owner's store was closed (as in
    production, a bypass makes no store)."""
    owner = a[fn.owner_index]
    if (store := held(owner)) is not None and store.closed and store.belongs_to(owner):
        raise detect("use-after-close", fn, BYPASS, str(closed_error(owner)))


def hit(
    fn: Cached,
    a: Args,
    key: object,
    entry: Entry,
    place: StepCache | Scope,
    moved: bool | None = None,
) -> object:
    """Check a hit found in ``place`` (where the call looked), count it; what it
    hands out. The common case (each input as it was recorded) is tested inline; a
    difference goes to the check that explains it. ``moved``: whether an ignored
    argument is another object than the one recorded, as the generated hit tested
    it (``None``: tested here)."""
    info: _Info | None = entry.info  # None if stored in production
    # served as it is where stored in checks mode with nothing to recheck
    if info is not None and info.quiet and Switches.mode == "checks":
        fn.counts.hits += 1
        return entry.value
    # the class, not isinstance(): this runs on every debug-mode hit
    store: StepCache = place.store if place.__class__ is Scope else place  # type: ignore[union-attr,assignment]
    if (scope := store.scope) is not None and scope.open and not open_here(scope):
        raise detect("scope-thread", fn, key)  # another thread's scope
    # validated when stored: again where it may fail now (or stored in production)
    recheck = info is None
    if info is not None:
        for _, x, view, address, before in info.deps:  # `_check_deps`, inline
            here = address is None or x.data_ptr() == address
            if not here or (view is not None and view.tobytes() != before[3]):
                _check_deps("dependency-changed", fn, key, info.deps)
        for t, tag, address in info.versions:
            # guard_result: the hit tested a version counter already
            if tag.__class__ is not int or (not fn.guard and fp.version(t) != tag):
                _check_tag(fn, key, t, tag)
            # its storage swapped behind its version (`.data =`)
            recheck = recheck or (address is not None and t.data_ptr() != address)
        if info.watched:
            owner = a[fn.owner_index]
            # MISSING: an owner attribute deleted since it was read
            now = [(n, getattr(owner, n, MISSING), f) for n, f in info.watched.items()]
            if prints := _recheck("undeclared-input", fn, a, key, entry, now):
                info.watched = prints
        # an ignored argument that is another object (a buffer on another device)
        if moved is None:
            moved = not all(fp.match(a[i], o, v) for i, o, v in info.ignored)
        if info.refs and not (recheck or moved):  # a reference holds another object
            refs = fn.refs_of(a[fn.owner_index])
            recheck = any(map(operator.is_not, refs, info.refs))
    if (recheck or moved) and (wrong := fn.violation(entry.value, a)):
        raise detect("validation", fn, key, error=wrong)
    if moved and info is not None:
        now = [(fn.names[j], a[j], (o, v)) for j, o, v in info.ignored]
        if prints := _recheck("ignored-argument", fn, a, key, entry, now):
            # what it remembered, for the next hit
            info.ignored = tuple((fn.index[n], *f) for n, f in prints.items())
    if Switches.mode == "verify" and (diff := _recompute(fn, a, entry)):
        fix = _fix(fn, info) + ("" if scope is None else _IN_SCOPE)
        raise detect("key-too-coarse", fn, key, diff=diff, fix=fix)
    fn.counts.hits += 1
    if not info or not info.versions or not STEPCACHE_DEBUG_GUARD:
        return entry.value  # nothing to guard: hand_out's closures not made
    ref, handed = info.last  # hand_out's, inline for a step's repeated calls
    if ref is not None and ref() is store:
        return handed
    return hand_out(fn, key, entry, store)


def compute(
    fn: Cached, a: Args, key: object, store: StepCache, deps: Args
) -> tuple[object, _Info]:
    """Compute a miss's value, checked before and after, and recording what it
    reads; what the entry's ``info`` keeps for later hits."""
    canonical = _canonical(key)
    for cached in store.keys(fn.fid) if fn.keyed else ():
        if cached != key and _canonical(cached) == canonical:
            raise detect("device-alias", fn, key, cached=cached)
    owner, skip = a[fn.owner_index], {*fn.dep_names, "_stepcache"}
    # (name, object, view, address, `_deep` state) of each tensor, numpy array, list,
    # dict or set dependency, once per object: what a write behind the cache changes
    records: dict[int, _Dep] = {}
    for name, x in zip(fn.dep_names, deps, strict=True):
        if x.__class__ is not tuple and id(x) not in records:
            before = _deep(x, view := _view(x))
            address = before[2] if len(before) == 4 else None
            if before != (None,):  # not a scalar, nor an object kept by identity
                records[id(x)] = (name, x, view, address, before)
    value, reads = _reading(owner, lambda: fn.run(a))
    if fn.key_fn is not None and fn.dep_names:
        key_reads = _reading(owner, lambda: fn.key_of(a))[1]
        if names := data_read(owner, key_reads, skip):
            raise detect("key-reads-undeclared", fn, key, names=names)
    _check_deps("builder-mutates-dependency", fn, key, records.values())
    read = data_read(owner, reads, skip)
    watched = {name: fp.fingerprint(getattr(owner, name)) for name in read}
    ignored = tuple((fn.index[n], *fp.fingerprint(a[fn.index[n]])) for n in fn.ignored)
    versions = [_versioned(t) for t in tensors(value)]
    refs = fn.refs_of(owner) if fn.expect is not None else ()
    # a hit matches tensors and arrays by identity: they are checked on hits; a list
    # or dict is matched by its contents in every mode
    kept = [d for d in records.values() if isinstance(d[1], (torch.Tensor, np.ndarray))]
    quiet = store.scope is None and not (kept or versions or watched or ignored or refs)
    # nothing handed out yet
    return value, _Info(kept, versions, watched, ignored, refs, quiet, {})


def hand_out(fn: Cached, key: object, entry: Entry, store: StepCache) -> object:
    """What a call through ``store`` hands out: the value, its tensors as guarded
    views that check ``store`` (a copied owner's store serves the original's
    entries), made once per store (`hit` returns the last store's itself)."""
    info: _Info | None = entry.info
    if info is None or not info.versions or not STEPCACHE_DEBUG_GUARD:
        return entry.value
    ref, handed = info.handed.get(id(store), (None, None))
    if ref is None or ref() is not store:  # the first call through this store
        ref = weakref.ref(store)
        index = {id(t): i for i, (t, _, _) in enumerate(info.versions)}

        def guard(i: int, view: torch.Tensor) -> None:  # of the tensor at ``i``
            if (held := ref()) is not None and held.closed:
                raise detect("use-after-close", fn, key)
            _check_tag(fn, key, view, info.versions[i][1])

        handed = guarded(entry.value, lambda t: functools.partial(guard, index[id(t)]))
        info.handed[id(store)] = ref, handed
    info.last = ref, handed
    return handed
