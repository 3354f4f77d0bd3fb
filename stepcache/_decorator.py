# SPDX-License-Identifier: Apache-2.0
"""The ``@step_cached`` decorator, and the slow path behind every decorated function."""

from __future__ import annotations

import functools
import inspect
import keyword
import linecache
import operator
import types
import weakref
from collections.abc import Callable, Container, Hashable, Iterator, Mapping, Sequence
from typing import Any, Final, ParamSpec, TypeVar

from stepcache import _debug, _state, _store
from stepcache._entry import Entry, fingerprint, fingerprints
from stepcache._errors import (
    CacheValidationError,
    OwnerError,
    StaleCacheError,
    StepCacheError,
)
from stepcache._hit import compile_hit
from stepcache._seams import Watch
from stepcache._spec import Arg, TensorSpec, check, of_args
from stepcache._spec_code import predicate
from stepcache._state import BYPASS, Counts

P = ParamSpec("P")
R = TypeVar("R")
Expect = TensorSpec | tuple[TensorSpec | None, ...] | None
KeyArg = Callable[..., Hashable] | str | Sequence[str] | None
Args = tuple[Any, ...]
#: ``call()`` without a key: the key is not known yet (or the function has none)
NO_KEY: Final = object()
_STARS = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)


def _reader(
    deps: tuple[str, ...], index: dict[str, int]
) -> Callable[[Args, Any], Args]:
    """How a call's dependencies are read (from its arguments ``a`` and owner ``o``):
    the owner's attributes in one C call, where there are some and none is a
    parameter."""
    if not deps or any(d in index for d in deps):
        return lambda a, o: tuple(
            a[index[d]] if d in index else getattr(o, d) for d in deps
        )
    get = operator.attrgetter(*deps)
    return (lambda a, o: (get(o),)) if len(deps) == 1 else (lambda a, o: tuple(get(o)))


def _getter(names: list[str]) -> Callable[[Any], tuple[Any, ...]]:
    """The owner attributes ``names`` of an owner, as a tuple (missing: ``None``)."""
    return lambda owner: tuple([getattr(owner, n, None) for n in names])


def _forget(fid: int, label: str) -> None:
    _store.unregister(fid)
    linecache.cache.pop(label, None)


class CachedFunction:
    """Everything stepcache knows about one decorated function, and its slow path.

    Its hit is generated (`stepcache._hit`); every other call lands in :meth:`call`,
    which finds a hit or a miss once. A call's arguments travel as ``a``, the
    parameters' values in order. Debug modes watch this path through the hooks of
    `stepcache._debug.Checks`.
    """

    def __init__(
        self,
        fn: Callable[..., Any],
        key: KeyArg,
        owner: str | None,
        depends_on: Sequence[str],
        expect: Expect,
        name: str | None,
        guard_result: bool = False,
        only: Mapping[str, Container[Any]] | None = None,
        ignore: Sequence[str] = (),
    ) -> None:
        if not callable(fn) or isinstance(fn, (staticmethod, classmethod, property)):
            raise StepCacheError(
                f"@step_cached decorates plain functions and methods (got {fn!r}); "
                "put it under @staticmethod/@classmethod/@property, not above. "
                "(Wrote @step_cached without parentheses? Use @step_cached().)"
            )
        self.fn, self.guard, self.expect = fn, guard_result, expect
        self.name: str = name or str(getattr(fn, "__qualname__", repr(fn)))
        self.fid = _state.new_id()
        self.label = f"<stepcache generated hit {self.name} #{self.fid}>"
        self.counts = Counts()
        try:
            self.signature = inspect.signature(fn)
        except (TypeError, ValueError) as exc:
            raise self._error(f"cannot read its signature ({exc})") from exc
        self.params = tuple(self.signature.parameters.values())
        self.names = [p.name for p in self.params]
        self.index = {n: i for i, n in enumerate(self.names)}
        plain = [p.name for p in self.params if p.kind not in _STARS]
        self.owner_name = (plain or [""])[0] if owner is None else owner
        self.keyed = key is not None
        self.key_fn = key if callable(key) else None
        names: Any = () if key is None or callable(key) else key
        names = (names,) if isinstance(names, str) else names
        self.dep_names: tuple[str, ...] = (
            (depends_on,) if isinstance(depends_on, str) else tuple(depends_on)
        )
        self.ignored: tuple[str, ...] = (
            (ignore,) if isinstance(ignore, str) else tuple(ignore)
        )
        problems = self._problems(key, names, plain, only)
        if (problem := next(problems, None)) is not None:
            raise self._error(problem)
        self.owner_index = self.index[self.owner_name]
        self.key_names: tuple[str, ...] = tuple(names)
        specs = (expect,) if isinstance(expect, TensorSpec) else expect or ()
        # what a hit's value is validated against can change only through these:
        # every parameter is keyed, a dependency or ignored (checked on hits), and a
        # declared attribute is matched; an owner attribute only `expect` reads is not
        refs = [r for s in specs if s is not None for r in s.refs()]
        #: the parameters `expect` reads (`Arg`): a hit checks the cached value against
        #: the caller's, as the value was checked against the computing call's
        self.arg_refs: tuple[str, ...] = tuple(
            dict.fromkeys(r.name for r in refs if type(r) is Arg)
        )
        self.of_args = of_args(expect) if self.arg_refs else None
        #: `expect`'s plain case, tested before its full check (``None``: no expect)
        self.meets = (
            None if expect is None else predicate(expect, self.index, self.owner_index)
        )
        loose = sorted(
            {r.name for r in refs if type(r) is not Arg} - set(self.dep_names)
        )
        self.refs_of = _getter(loose)
        self.only: dict[str, Container[Any]] = dict(only or {})
        self._deps_checked = False
        #: the user's function called with a call's arguments: the one place it runs
        self.run: Callable[[Args], Any] = (
            (lambda a: fn(*a))
            if all(p.kind < p.VAR_POSITIONAL for p in self.params)
            else functools.partial(self._bound_call, fn)
        )
        self._deps_of = _reader(self.dep_names, self.index)
        self.absent = Entry.absent(len(self.dep_names))
        if self.keyed:  # before the hit reads it
            _store.register(self.fid, self.absent)
        self.wrapper = compile_hit(self)
        functools.update_wrapper(self.wrapper, fn)
        setattr(self.wrapper, "__stepcache__", self)  # noqa: B010
        _state.register(self)
        # a factory's functions come and go: what they left behind goes with them
        weakref.finalize(self, _forget, self.fid, self.label).atexit = False

    def _error(self, message: str) -> StepCacheError:
        return StepCacheError(f"{self.name}: {message}")

    def _problems(
        self, key: Any, names: Any, plain: list[str], only: Any
    ) -> Iterator[str]:
        """What makes the decoration unworkable, in order (the first is raised; later
        checks may assume the earlier ones passed)."""
        listing = f"(parameters: {', '.join(self.names)})"
        if any(n.startswith("_sc_") for n in self.names):
            yield "parameter names starting with '_sc_' are reserved"
        if inspect.isgeneratorfunction(self.fn) or inspect.isasyncgenfunction(self.fn):
            yield (
                "it is a generator function: its cached value would be a generator, "
                "exhausted after the first caller. Fix: return a list or tuple."
            )
        if inspect.iscoroutinefunction(self.fn):
            yield (
                "it is an async function: its cached value would be a coroutine, "
                "awaitable once. Fix: cache a plain function that the coroutine calls."
            )
        if not plain:
            yield (
                "a step-cached function needs an owner parameter (its first parameter, "
                "or the one named by owner=)"
            )
        if self.owner_name not in plain:
            yield f"owner={self.owner_name!r} is not a parameter {listing}"
        if not isinstance(names, Sequence) or not all(
            isinstance(k, str) for k in names
        ):
            yield (
                "key must be a callable, a parameter name or a tuple of parameter "
                f"names (got {key!r})"
            )
        if not names and self.keyed and not callable(key):
            yield "key=() names no parameter"
        for k in names:
            if k not in self.index:
                yield f"key names {k!r}, which is not a parameter {listing}"
        for d in self.dep_names:
            if not isinstance(d, str) or not d.isidentifier() or keyword.iskeyword(d):
                yield f"depends_on takes attribute or parameter names (got {d!r})"
            if d == self.owner_name:
                yield f"depends_on names the owner {d!r} itself; name its attributes instead"
        for n in self.ignored:
            if n not in self.index or n == self.owner_name:
                yield f"ignore= names {n!r}, which is not a parameter besides the owner {listing}"
            elif n in names or n in self.dep_names:
                yield f"ignore= names {n!r}, which key= or depends_on names too"
        specs = (self.expect,) if isinstance(self.expect, TensorSpec) else self.expect
        if not isinstance(specs, tuple | None) or not all(
            s is None or isinstance(s, TensorSpec) for s in specs or ()
        ):
            yield f"expect must be a TensorSpec or a tuple of them (got {self.expect!r})"
        for ref in (r for s in specs or () if s is not None for r in s.refs()):
            if isinstance(ref, Arg) and ref.name not in self.index:
                yield f"expect refers to Arg({ref.name!r}), which is not a parameter {listing}"
        if not isinstance(self.guard, bool):
            yield f"guard_result must be True or False (got {self.guard!r})"
        if only is not None and not isinstance(only, Mapping):
            yield f"only= takes a mapping of parameter names to collections (got {only!r})"
        for n, allowed in (only or {}).items():
            if n not in self.index or n == self.owner_name:
                yield f"only= names {n!r}, which is not a parameter besides the owner {listing}"
            if isinstance(allowed, (str, bytes)) or not hasattr(
                allowed, "__contains__"
            ):
                yield (
                    f"only={{{n!r}: ...}} must be a collection of the values to cache, "
                    f"such as a frozenset (got {allowed!r})"
                )
        covered = {self.owner_name, *names, *self.dep_names, *self.ignored}
        for n in self.names if not callable(key) else ():
            if n not in covered:
                yield (
                    f"parameter {n!r} is in neither key= nor depends_on, so every call "
                    f"would share one cached value whatever {n!r} is. Fix: add it to "
                    f"key= (one entry per value), or name it in ignore= if it does not "
                    f"change the result (an output buffer, say)."
                )

    def owner_error(self, exc: OwnerError) -> StepCacheError:
        """``exc`` (what is wrong with an owner) naming this function's owner."""
        return self._error(f"its owner parameter {self.owner_name!r} {exc}")

    # -- the pieces of a call -----------------------------------------------------------
    def where(self, key: Any = NO_KEY) -> str:
        """How messages name this function (and the entry's key, when it has one)."""
        if self.keyed and key is not NO_KEY:
            return f"step_cached function '{self.name}' (key={key!r})"
        return f"step_cached function '{self.name}'"

    def _bound_call(self, fn: Callable[..., Any], a: Args) -> Any:
        """``fn`` called with ``a`` as the decorated signature binds it (``*args``,
        keyword-only parameters, ``**kwargs``)."""
        bound = inspect.BoundArguments(
            self.signature, dict(zip(self.names, a, strict=True))
        )
        return fn(*bound.args, **bound.kwargs)

    def key_of(self, a: Args) -> Any:
        """The call's key (`BYPASS` for a call that ``only=`` leaves out); ``None``
        for an unkeyed function."""
        what = "its only= test"
        try:
            for name, allowed in self.only.items():
                if a[self.index[name]] not in allowed:
                    return BYPASS
            if self.key_fn is not None:
                what = "its key function"
                key = self._bound_call(self.key_fn, a)
            else:
                values = tuple(a[self.index[n]] for n in self.key_names)
                key = values[0] if len(values) == 1 else values or None
        except Exception as exc:
            raise StepCacheError(
                f"{self.where()}: {what} raised {type(exc).__name__}: {exc}"
            ) from exc
        return key

    def deps_of(self, a: Args, owner: object) -> Args:
        """The call's dependencies, in `depends_on` order."""
        if not self.dep_names:
            return ()
        try:
            deps = self._deps_of(a, owner)
        except AttributeError as exc:
            raise StepCacheError(
                f"{self.where()}: depends_on names an attribute the owner "
                f"{type(owner).__qualname__} does not have ({exc})"
            ) from exc
        if not self._deps_checked:  # the first call: what kinds the dependencies are
            for i, x in enumerate(deps):
                self._check_kind(i, x)
            self._deps_checked = True
        return deps

    def _check_kind(self, i: int, x: Any) -> None:
        if isinstance(x, types.MethodType | types.BuiltinMethodType):
            raise self._error(
                f"depends_on names {self.dep_names[i]!r}, a method: a bound method is "
                "a new object on every access, so the entry would never be reused. "
                "Fix: name the attributes the method reads instead."
            )

    def fingerprint(self, i: int, x: Any, store: object) -> tuple[Any, Any]:
        """The fingerprint of dependency ``i``, ``x``, for an entry of ``store`` (a
        scope's, or `stepcache._state.NO_STORE`), as the generated miss takes it
        where ``x`` is not a tensor with a version counter."""
        self._check_kind(i, x)
        return fingerprint(x, scoped=store is not _state.NO_STORE)

    def invalid(self, key: Any, wrong: str) -> CacheValidationError:
        """The error of a value that breaks `expect` (``wrong``: `violation`'s text)."""
        return CacheValidationError(f"{self.where(key)}{wrong}")

    def violation(self, value: Any, a: Args) -> str | None:
        """What ``value`` breaks of ``expect`` (``": result ..."``), or ``None``."""
        if self.expect is None or self.meets is None:
            return None
        try:
            if self.meets(value, a):  # the plain case (`stepcache._spec_code`)
                return None
        except Exception:  # noqa: S110
            pass  # the full check says what is wrong
        try:
            check(self.expect, value, (a, self.index, a[self.owner_index]))
        except CacheValidationError as exc:
            return f": {exc}"
        return None

    def args_of(self, a: Args) -> Args | None:
        """The arguments `expect` read when a value was checked (``None``: it reads
        none): a hit with the same objects needs no check."""
        return (
            tuple([a[self.index[n]] for n in self.arg_refs]) if self.arg_refs else None
        )

    def args_ok(self, value: Any, a: Args) -> bool:
        """Whether a cached ``value`` meets what `expect` reads of the caller's
        arguments ``a`` (another buffer: on its device, of its dtype, long enough);
        the rest of it held when the value was stored."""
        try:
            check(self.of_args, value, (a, self.index, a[self.owner_index]))  # type: ignore[arg-type]
        except CacheValidationError:
            return False
        return True

    # -- the slow path ------------------------------------------------------------------
    def call(self, a: Args, key: Any = NO_KEY) -> Any:
        """Every call the generated hit did not serve: a miss, a bypass (`served`
        takes a hit it found while caching is off or debug mode is on)."""
        disabled, mode = _state.switches
        if disabled:
            return self.bypass(a)
        watch = None if mode == "off" else _debug.checks
        if key is NO_KEY and (self.keyed or self.only):
            key = self.key_of(a)
        if key is BYPASS:
            if watch is not None:
                watch.bypassed(self, a)
            return self.bypass(a)
        owner = a[self.owner_index]
        store = self.store_of(owner, key, watch)
        deps = self.deps_of(a, owner)
        entry = self.find(store, key, owner, deps)
        if entry is None:
            return self.miss(a, key, owner, store, deps, watch)
        value = entry.value
        if watch is not None:
            value = watch.hit(self, a, key, owner, store, deps, entry)
        elif self.arg_refs and (wrong := self.violation(value, a)) is not None:
            raise CacheValidationError(
                f"{self.where(key)}: on a hit, the cached value does not meet expect "
                f"for this call's arguments{wrong}"
            )
        self.counts.hits += 1
        return value

    def served(self, a: Args, key: Any, entry: Entry) -> Any:
        """A hit the generated code found (every test passed) while caching is off or
        debug mode is on: debug mode checks it."""
        disabled, mode = _state.switches
        if disabled:
            return self.bypass(a)
        info = entry.info
        if mode == "off" or (info is not None and info.quiet and mode == "checks"):
            # switched off since the generated code looked, or nothing to check
            self.counts.hits += 1
            return entry.value
        owner = a[self.owner_index]
        # the generated code read owner._stepcache: its own store, or the placeholder
        # where it found the entry in the scope's table (joined by store_of)
        store = owner._stepcache
        if store.__class__ is not _store.StepCache or (
            store._first != id(owner) and not store.belongs_to(owner)
        ):
            store = self.store_of(owner, key, _debug.checks)
        # the hit matched the dependencies: debug mode reads them if it doubts
        value = _debug.checks.hit(self, a, key, owner, store, (), entry)
        self.counts.hits += 1
        return value

    def store_of(self, owner: Any, key: Any, watch: Watch | None) -> _store.StepCache:
        """`cache_of(owner)`: its store, made or joined to the open scope, or the
        typed error of an owner that cannot have one (``watch`` records it)."""
        try:
            return _store.cache_of(owner)
        except StaleCacheError as exc:
            raise exc if watch is None else watch.closed(self, key, exc) from None
        except OwnerError as exc:
            raise self.owner_error(exc) from None

    def find(
        self, store: _store.StepCache, key: Any, owner: object, deps: Args
    ) -> Entry | None:
        """The entry that serves the call (``None``: a miss); an entry that no longer
        serves its owner is counted as an invalidation."""
        try:
            entry: Entry | None = store.lookup(self.fid, self.keyed, key)
        except TypeError as exc:  # the lookup hashes every key
            raise StepCacheError(
                f"{self.where()}: the key {key!r} is unhashable ({exc}). Fix: return a "
                "tuple of ints/strings (e.g. tuple(values) instead of a list)."
            ) from None
        if entry is None or entry.serves(owner, deps):
            return entry
        # an invalidation, unless the entry is bound to another owner of the store
        if entry.bound is None or entry.bound() is owner:
            self.counts.invalidations += 1
            store.missed(self.fid, _store.INVALIDATION)
        return None

    def miss(
        self,
        a: Args,
        key: Any,
        owner: object,
        store: _store.StepCache,
        deps: Args,
        watch: Watch | None,
    ) -> Any:
        """Compute, validate and store the call's value: every miss, in every mode."""
        fps = fingerprints(deps, scoped=store.scope is not None)
        record = None if watch is None else watch.before_miss(self, a, key, store, deps)
        try:
            value = self.run(a)
        finally:
            if record is not None:
                record.stop()
        info = None if watch is None else watch.after_miss(self, record, a, key, value)
        if self.expect is not None and (wrong := self.violation(value, a)) is not None:
            raise (
                self.invalid(key, wrong)
                if watch is None
                else watch.invalid(self, key, wrong)
            )
        try:
            entry = Entry(value, owner, fps, self.guard, info, self.args_of(a))
        except OwnerError as exc:
            raise self.owner_error(exc) from None
        store.insert(self.fid, self.keyed, key, entry)
        self.counts.misses += 1
        store.missed(self.fid)
        return value if watch is None else watch.hand_out(self, key, entry, store)

    def bypass(self, a: Args) -> Any:
        """A call left out of the cache (a `BYPASS` key, only=, or caching off)."""
        self.counts.bypasses += 1
        return self.run(a)


def step_cached(
    key: KeyArg = None,
    *,
    owner: str | None = None,
    depends_on: Sequence[str] = (),
    expect: Expect = None,
    name: str | None = None,
    guard_result: bool = False,
    only: Mapping[str, Container[Any]] | None = None,
    ignore: Sequence[str] = (),
) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """Cache a function's result in the step's metadata object that owns it.

    The first call for an owner (and key) computes the value and stores it in the
    owner's [`StepCache`][stepcache.StepCache]; later calls return the same object while
    every declared dependency is unchanged. A changed dependency recomputes (an
    *invalidation*), never a stale hit. A function that raises caches nothing.

    Args:
        key: Which entry a call uses: a callable taking the function's own arguments
            and returning a hashable, a parameter name or a tuple of them, or `None`
            (one entry per owner). A [`BYPASS`][stepcache.BYPASS] key computes without
            caching.
        owner: The parameter whose object holds the cache; the entries live exactly as
            long as that object. Default: the first parameter (`self` of a method).
        depends_on: The owner's attributes (or the function's parameters) the value is
            computed from; an entry is reused only while each is unchanged (how each
            kind is compared: [concepts](../concepts.md#dependencies-and-fingerprints)).
            Entries with dependencies may serve copies of the owner; one without is
            bound to its owner.
        expect: A [`TensorSpec`][stepcache.TensorSpec], or for a tuple result a tuple
            of them (`None` skips an item), checked whenever a value is stored (and on
            every hit in debug mode).
        name: The label in [`stats()`][stepcache.stats] and in error messages.
            Default: the function's qualified name.
        guard_result: Re-check on every hit that no tensor of the value was written
            since it was stored: for a view into a persistent buffer that a later
            build may rewrite, that write invalidates the entry.
        only: Cache only the calls whose named arguments are in the given collections
            (`{"kind": frozenset({"swa_only", "c128a"})}`); other calls compute
            without caching and count as bypasses.
        ignore: Parameters that do not change the result (an output buffer the value
            is written into, a layer index): every parameter but the owner must be
            in `key`, `depends_on` or `ignore` (a key function covers them all). In
            checks mode, a call whose ignored argument differs from the one the
            entry was computed with is computed again and compared.

    Returns:
        The decorator; the decorated function keeps its signature (`ParamSpec`).

    Raises:
        StepCacheError: At decoration, for a configuration that cannot work (an
            `owner`, `key`, `depends_on` or `ignore` that names no parameter, a
            parameter none of them names, a generator or async function, a malformed
            `expect`, `@step_cached` without parentheses); at a call, for an
            unhashable key, a key function that raised or a `depends_on` that names
            a method.
        CacheValidationError: A stored value breaks `expect`.

    Examples:
        >>> import dataclasses, stepcache
        >>> @dataclasses.dataclass
        ... class Meta:
        ...     lens: tuple[int, ...]
        ...     @stepcache.step_cached(depends_on=("lens",))
        ...     def total(self) -> int:
        ...         print("computing")
        ...         return sum(self.lens)
        >>> m = Meta((3, 4))
        >>> m.total()
        computing
        7
        >>> m.total()
        7
        >>> m.lens = (5,)
        >>> m.total()
        computing
        5

        A key picks one entry per value of the named parameters:

        >>> class Step: pass
        >>> @stepcache.step_cached(key="kind", owner="step", ignore=("layer",))
        ... def rows(step, kind, layer):
        ...     print("building", kind)
        ...     return kind * 2
        >>> s = Step()
        >>> [rows(s, kind, layer) for layer, kind in enumerate("aab")]
        building a
        building b
        ['aa', 'aa', 'bb']
    """

    def decorate(fn: Callable[P, R]) -> Callable[P, R]:
        wrapper: Callable[P, R] = CachedFunction(
            fn, key, owner, depends_on, expect, name, guard_result, only, ignore
        ).wrapper
        return wrapper

    return decorate
