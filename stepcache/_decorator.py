# SPDX-License-Identifier: Apache-2.0
"""``@step_cached``: a decoration checked once, and the slow path behind its
generated call (`stepcache._codegen`)."""

from __future__ import annotations

import difflib
import functools
import inspect
import keyword
import types
from collections.abc import Callable, Container, Hashable, Iterator, Mapping, Sequence
from typing import Any, Final, ParamSpec, TypeVar

from stepcache import _debug, _registry
from stepcache._bypass import BYPASS
from stepcache._codegen import Compiled
from stepcache._entry import Entry
from stepcache._errors import (
    CacheValidationError,
    OwnerError,
    StaleCacheError,
    StepCacheError,
)
from stepcache._kinds import Print, fingerprint
from stepcache._owners import held, mark_class
from stepcache._scope import Scope, cache_of, innermost
from stepcache._spec import Arg, Spec, TensorSpec, check, of_args
from stepcache._store import NO_KEY, NO_STORE, StepCache
from stepcache._switches import Switches

P = ParamSpec("P")
R = TypeVar("R")
Expect = TensorSpec | tuple[TensorSpec | None, ...] | None
KeyArg = Callable[..., Hashable] | str | Sequence[str] | None
Only = Mapping[str, Container[object]]  # only=: the values of each parameter to cache
Args = tuple[object, ...]  # a call's arguments: each parameter's value, in order
Problems = Iterator[tuple[str, str]]  # what is wrong with a decoration, and its fix
#: ``call()``'s key before it is known (``NO_KEY``: the function has none)
UNKNOWN: Final = object()
_STARS = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)


def _names(value: str | Sequence[str]) -> tuple[str, ...]:
    return (value,) if isinstance(value, str) else tuple(value)


class CachedFunction:
    """Everything stepcache knows about one decorated function, and its slow path.

    Its call is generated (`stepcache._codegen`); every call that code does not
    finish lands in :meth:`call`, which finds a hit or a miss once. A call's
    arguments travel as ``a``, the parameters' values in order. Debug modes watch
    this path through the hooks of `stepcache._debug` (`hit`, `compute`, ...).
    """

    def __init__(
        self,
        fn: Callable[..., object],
        key: KeyArg,
        owner: str | None,
        depends_on: Sequence[str],
        expect: Expect,
        name: str | None,
        guard_result: bool = False,
        only: Mapping[str, Container[object]] | None = None,
        ignore: Sequence[str] = (),
    ) -> None:
        self.name: str = name or str(getattr(fn, "__qualname__", repr(fn)))
        self.keyed = key is not None
        if not callable(fn) or isinstance(fn, (staticmethod, classmethod, property)):
            raise self.error(
                f"@step_cached decorates plain functions and methods (got {fn!r})",
                "put @step_cached under @staticmethod/@classmethod/@property, not "
                "above; without parentheses, write @step_cached()",
            )
        self.fn, self.guard, self.expect = fn, guard_result, expect
        self.fid = _registry.new_id()
        self.counts = _registry.Counts()
        try:
            self.signature = inspect.signature(fn)
        except (TypeError, ValueError) as exc:
            raise self.error(
                f"cannot read its signature ({exc})", "decorate a Python function"
            ) from exc
        self.params = tuple(self.signature.parameters.values())
        self.names = [p.name for p in self.params]
        self.index = {n: i for i, n in enumerate(self.names)}
        plain = [p.name for p in self.params if p.kind not in _STARS]
        self.owner_name = (plain or [""])[0] if owner is None else owner
        self.key_fn = key if callable(key) else None
        names: Sequence[str] = () if key is None or callable(key) else key
        names = (names,) if isinstance(names, str) else names
        self.dep_names, self.ignored = _names(depends_on), _names(ignore)
        specs = expect if isinstance(expect, tuple) else (expect,)
        # what `expect` reads (an item that is no spec is refused below)
        refs = [r for s in specs if isinstance(s, TensorSpec) for r in s.refs()]
        #: the parameters `expect` reads (`Arg`): a hit checks the cached value against
        #: the caller's, as the value was checked against the computing call's
        self.arg_refs = tuple(dict.fromkeys(r.name for r in refs if type(r) is Arg))
        for what, fix in self._problems(key, names, plain, only):
            raise self.error(what, fix)  # the first problem
        self.owner_index = self.index[self.owner_name]
        self.key_names: tuple[str, ...] = tuple(names)
        self.of_args: Spec | None = of_args(expect) if self.arg_refs else None
        loose = sorted({r.name for r in refs if type(r) is not Arg} - {*self.dep_names})
        #: the owner attributes only `expect` reads (debug mode checks them again)
        self.refs_of: Callable[[object], Args] = lambda o: tuple(
            [getattr(o, n, None) for n in loose]
        )
        self.only: dict[str, Container[object]] = dict(only or {})
        #: the user's function called with a call's arguments: the one place it runs
        self.run: Callable[[Args], object] = functools.partial(self._bound_call, fn)
        if all(p.kind < p.VAR_POSITIONAL for p in self.params):
            self.run = lambda a: fn(*a)  # no binding to do
        self.compiled = Compiled(self)
        self.wrapper = functools.update_wrapper(self.compiled.wrapper, fn)
        setattr(self.wrapper, "__stepcache__", self)  # noqa: B010
        with _registry.lock:  # what a switch flipped meanwhile finds it
            _registry.by_id[self.fid] = self
            self.compiled.use(Switches.variant())

    # -- errors -------------------------------------------------------------------------
    def where(self, key: object = NO_KEY) -> str:
        """How messages name this function (and the entry's key, when it has one)."""
        # (`call` resolves an `UNKNOWN` key before any message names it)
        shown = f" (key={key!r})" if self.keyed and key is not NO_KEY else ""
        return f"step_cached function '{self.name}'{shown}"

    def error(self, what: str, fix: str) -> StepCacheError:
        """The error of a misuse: what is wrong, and the fix."""
        return StepCacheError(f"{self.where()}: {what}. Fix: {fix}.")

    def _problems(
        self, key: KeyArg, names: Sequence[str], plain: list[str], only: Only | None
    ) -> Problems:
        """What makes the decoration unworkable, and its fix, in order (the first is
        raised; later checks may assume the earlier ones passed)."""
        listing = f"(parameters: {', '.join(self.names)})"

        def unknown(said: str, name: str, where: str, owner: bool = True) -> Problems:
            """The problem, if ``name`` (named as ``said`` formats it) is no parameter
            (besides the owner, unless ``owner``)."""
            if name not in self.index or (not owner and name == self.owner_name):
                others = [n for n in self.names if owner or n != self.owner_name]
                tail = listing if owner else f"besides the owner {listing}"
                what = f"{said.format(name)}, which is not a parameter {tail}"
                yield what, _did_you_mean(name, others, where)

        if any(n.startswith("_sc_") for n in self.names):
            yield "parameter names starting with '_sc_' are reserved", "rename them"
        if inspect.isgeneratorfunction(self.fn) or inspect.isasyncgenfunction(self.fn):
            yield (
                "it is a generator function: its cached value would be a generator, "
                "exhausted after the first caller",
                "return a list or tuple",
            )
        if inspect.iscoroutinefunction(self.fn):
            yield (
                "it is an async function: its cached value would be a coroutine, "
                "awaitable once",
                "cache a plain function that the coroutine calls",
            )
        if not plain:
            yield (
                "it has no owner parameter (its first, or the one named by owner=)",
                "take the step's metadata object as the first parameter",
            )
        if self.owner_name not in plain:
            yield (
                f"owner={self.owner_name!r} is not a parameter {listing}",
                "name the parameter that holds the step's metadata object",
            )
        if not (isinstance(names, Sequence) and all(isinstance(k, str) for k in names)):
            yield (
                f"key must be a callable, a parameter name or a tuple of parameter "
                f"names (got {key!r})",
                "pass key='kind' or key=('kind', 'device'), or a function",
            )
        if not names and self.keyed and not callable(key):
            yield "key=() names no parameter", "leave key out for one entry per owner"
        for k in names:
            yield from unknown("key names {!r}", k, "key")
        for d in self.dep_names:
            if not isinstance(d, str) or not d.isidentifier() or keyword.iskeyword(d):
                yield (
                    f"depends_on takes attribute or parameter names (got {d!r})",
                    "pass a tuple of names, such as depends_on=('query_start_loc',)",
                )
            if d == self.owner_name:
                yield (
                    f"depends_on names the owner {d!r} itself",
                    "name the owner's attributes that the value is computed from",
                )
        for n in self.ignored:
            yield from unknown("ignore= names {!r}", n, "ignore=", owner=False)
            if n in names or n in self.dep_names:
                yield (
                    f"ignore= names {n!r}, which key= or depends_on names too",
                    f"leave {n!r} out of ignore=",
                )
        specs = self.expect if isinstance(self.expect, tuple) else (self.expect,)
        if not all(s is None or isinstance(s, TensorSpec) for s in specs):
            yield (
                f"expect must be a TensorSpec or a tuple of them (got {self.expect!r})",
                "pass expect=stepcache.TensorSpec(...)",
            )
        for n in self.arg_refs:
            yield from unknown("expect refers to Arg({!r})", n, "Arg()")
        if not isinstance(self.guard, bool):
            yield (
                f"guard_result must be True or False (got {self.guard!r})",
                "pass guard_result=True",
            )
        if only is not None and not isinstance(only, Mapping):
            yield (
                f"only= takes a mapping of parameter names to collections (got "
                f"{only!r})",
                "pass only={'kind': frozenset({...})}",
            )
        for n, values in (only or {}).items():
            yield from unknown("only= names {!r}", n, "only=", owner=False)
            if isinstance(values, (str, bytes)) or not hasattr(values, "__contains__"):
                yield (
                    f"only={{{n!r}: ...}} must be a collection of the values to cache "
                    f"(got {values!r})",
                    "pass a frozenset of the values",
                )
        covered = {self.owner_name, *names, *self.dep_names, *self.ignored}
        for n in [] if callable(key) else [n for n in self.names if n not in covered]:
            yield (
                f"parameter {n!r} is in neither key= nor depends_on, so every call "
                f"would share one cached value whatever {n!r} is",
                "add it to key= (one entry per value), or name it in ignore= if "
                "it does not change the result (an output buffer, say)",
            )

    def owner_error(self, exc: OwnerError) -> StepCacheError:
        """``exc`` (what is wrong with an owner) naming this function's owner."""
        return StepCacheError(
            f"{self.where()}: its owner parameter {self.owner_name!r} {exc}"
        )

    def key_error(self, exc: Exception) -> StepCacheError:
        """The error of a key function that raised ``exc``."""
        return self.error(
            f"its key function raised {type(exc).__name__}: {exc}",
            "make the key function return a hashable for every call (the exception "
            "above is its own)",
        )

    # -- the pieces of a call -----------------------------------------------------------
    def _bound_call(self, fn: Callable[..., object], a: Args) -> object:
        """``fn`` called with ``a`` as the decorated signature binds it (``*args``,
        keyword-only parameters, ``**kwargs``)."""
        arguments = dict(zip(self.names, a, strict=True))
        bound = inspect.BoundArguments(self.signature, arguments)
        return fn(*bound.args, **bound.kwargs)

    def key_of(self, a: Args) -> object:
        """The call's key (`BYPASS` for a call that ``only=`` leaves out); `NO_KEY`
        for an unkeyed function."""
        try:
            if any(a[self.index[n]] not in allowed for n, allowed in self.only.items()):
                return BYPASS
        except Exception as exc:
            raise self.error(
                f"its only= test raised {type(exc).__name__}: {exc}",
                "pass only= collections that can hold every value of their parameter",
            ) from exc
        if self.key_fn is not None:
            try:
                return self._bound_call(self.key_fn, a)
            except Exception as exc:
                raise self.key_error(exc) from exc
        if len(self.key_names) == 1:
            return a[self.index[self.key_names[0]]]
        return tuple([a[self.index[n]] for n in self.key_names]) or NO_KEY

    def deps_of(self, a: Args, owner: object) -> Args:
        """The call's dependencies, in `depends_on` order."""
        names, pos = self.dep_names, self.index  # a parameter, else the owner's
        try:
            deps = tuple(a[pos[d]] if d in pos else getattr(owner, d) for d in names)
        except AttributeError as exc:
            gone = [d for d in names if d not in pos and not hasattr(owner, d)]
            missing = gone[0] if gone else str(exc)
            try:  # the owner's attributes, for the fix (a dir() may raise)
                have = [n for n in dir(owner) if not n.startswith("__")]
            except Exception:
                have = []
            raise self.error(
                f"depends_on names {missing!r}, an attribute the owner "
                f"{type(owner).__qualname__} does not have",
                _did_you_mean(missing, have, "depends_on"),
            ) from None
        return deps

    def fingerprint(self, i: int, x: object, store: StepCache) -> Print:
        """The fingerprint of dependency ``i``, ``x``, for an entry of ``store``, as
        the generated miss takes it where ``x`` is not a tensor with a version
        counter; a method is refused (a new object on every access: never reused)."""
        if isinstance(x, types.MethodType | types.BuiltinMethodType):
            raise self.error(
                f"depends_on names {self.dep_names[i]!r}, a method: a bound method is "
                "a new object on every access, so the entry would never be reused",
                "name the attributes the method reads instead",
            )
        return fingerprint(x, scoped=store.scope is not None)

    def violation(self, value: object, a: Args, spec: Expect = None) -> str | None:
        """What ``value`` breaks of ``spec`` (default: ``expect``), as ``": result
        ..."``, or ``None``."""
        try:
            if (spec := spec or self.expect) is not None:
                check(spec, value, (a, self.index, a[self.owner_index]))
        except CacheValidationError as exc:
            return f": {exc}"
        return None

    def validate(self, value: object, a: Args, key: object) -> None:
        """Raise `CacheValidationError` where a computed ``value`` breaks ``expect``."""
        if (wrong := self.violation(value, a)) is not None:
            if Switches.mode != "off":  # a detection of debug mode
                raise _debug.detect("validation", self, key, wrong[2:])
            raise CacheValidationError(f"{self.where(key)}{wrong}")

    def args_ok(self, value: object, a: Args) -> bool:
        """Whether a cached ``value`` meets what `expect` reads of the caller's
        arguments ``a`` (another buffer: on its device, of its dtype, long enough);
        the rest of it held when the value was stored."""
        return self.violation(value, a, self.of_args) is None

    # -- the slow path ------------------------------------------------------------------
    def call(self, a: Args, key: object = UNKNOWN) -> object:
        """Every call the generated code did not finish: the first of an owner that
        the slow path must place, a bypass, and every call while caching is off or
        debug mode is on."""
        debugging = Switches.mode != "off"
        if Switches.disabled:  # caching off: every call a bypass, unobserved
            key, debugging = BYPASS, False
        elif key is UNKNOWN:
            key = self.key_of(a)
        if key is BYPASS:  # computed, uncached (a `BYPASS` key, only=, caching off)
            if debugging:
                _debug.bypassed(self, a)
            self.counts.bypasses += 1
            return self.run(a)
        owner = a[self.owner_index]
        store = self.place_of(owner, key, debugging)
        deps = self.deps_of(a, owner)
        try:
            found = store.lookup(self.fid, key)
        except TypeError as exc:  # the lookup hashes every key
            named = f"parameter {self.key_names[0]!r}" if self.key_names else ""
            raise self.error(
                f"the key {key!r} is unhashable ({exc})",
                f"pass a hashable value for key {named} (a tuple, not a list)"
                if named
                else "return a tuple of ints/strings from the key function (e.g. "
                "tuple(values) instead of a list)",
            ) from None
        if found is not None and found.serves(owner, deps):  # a hit
            if debugging:
                return _debug.hit(self, a, key, found, store)
            if self.arg_refs and (wrong := self.violation(found.value, a)):
                raise CacheValidationError(
                    f"{self.where(key)}: on a hit, the cached value does not meet "
                    f"expect for this call's arguments{wrong}"
                )
            self.counts.hits += 1
            return found.value
        # a miss: compute, validate and store the value (in place of `found`, stale)
        # flat, as an entry keeps them (o0, v0, o1, v1, ...), each taken as the
        # generated miss takes those it does not inline
        fps: list[object] = []
        for i, x in enumerate(deps):
            fps += self.fingerprint(i, x, store)
        if debugging:
            value, info = _debug.compute(self, a, key, store, deps)
        else:
            value, info = self.run(a), None
        if self.expect is not None:
            self.validate(value, a, key)
        args = tuple([a[self.index[n]] for n in self.arg_refs]) or None
        try:
            entry = Entry(value, owner, tuple(fps), self.guard, info, args)
        except OwnerError as exc:
            raise self.owner_error(exc) from None
        if store.put(self.fid, key, entry, found):
            self.counts.invalidations += 1
        self.counts.misses += 1
        return _debug.hand_out(self, key, entry, store) if debugging else value

    def place_of(self, owner: object, key: object, debugging: bool) -> StepCache:
        """Where a call looks and stores, as the generated code decides: the owner's
        own store, the open scope's (read, not joined), else `cache_of`'s; the typed
        error of an owner that cannot have one (debug mode records it)."""
        own, inner = held(owner), innermost()
        if own is None and isinstance(inner, Scope) and inner.table is not None:
            mark_class(owner)
            return inner.store
        if own is not None and own.made_by(owner) and inner is NO_STORE:
            return own
        try:  # its store, made or joined to the open scope (`cache_of`)
            return cache_of(owner)
        except StaleCacheError as exc:
            if not debugging:
                raise exc from None
            raise _debug.detect("use-after-close", self, key, str(exc)) from None
        except OwnerError as exc:
            raise self.owner_error(exc) from None


def _did_you_mean(name: str, choices: Sequence[str], where: str) -> str:
    """A fix that names the closest of ``choices`` to ``name``."""
    if close := difflib.get_close_matches(name, list(choices), n=3, cutoff=0.6):
        return f"did you mean {' or '.join(repr(c) for c in close)}? Name it in {where}"
    return f"name one of {', '.join(map(repr, choices))} in {where}"


def generated_source(fn: Callable[..., Any]) -> str:
    """Return the source stepcache generated for a decorated function's call.

    It is production's code: a hit, and a miss that stores a new entry; every other
    call goes to the slow path. While caching is off or debug mode is on, every call
    goes to the slow path.

    Raises:
        StepCacheError: ``fn`` is not a step-cached function.

    Examples:
        >>> import stepcache
        >>> class Meta:
        ...     n = 2
        ...     @stepcache.step_cached(depends_on=("n",))
        ...     def rows(self):
        ...         return list(range(self.n))
        >>> print(stepcache.generated_source(Meta.rows).splitlines()[0])
        def rows(self):
    """
    cached = getattr(fn, "__stepcache__", None)
    if not isinstance(cached, CachedFunction):
        raise StepCacheError(
            f"generated_source() takes a step_cached function (got {fn!r}). Fix: pass "
            "the function or method that @stepcache.step_cached decorated."
        )
    return cached.compiled.source


def step_cached(
    key: KeyArg = None,
    *,
    owner: str | None = None,
    depends_on: Sequence[str] = (),
    expect: Expect = None,
    name: str | None = None,
    guard_result: bool = False,
    only: Mapping[str, Container[object]] | None = None,
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
        return CachedFunction(
            fn, key, owner, depends_on, expect, name, guard_result, only, ignore
        ).wrapper

    return decorate
