# SPDX-License-Identifier: Apache-2.0
"""The ``@step_cached`` decorator and the slow path behind every decorated function."""

from __future__ import annotations

import functools
import inspect
import threading
import weakref
from collections.abc import Callable, Container, Hashable, Mapping, Sequence
from typing import Any, Final, ParamSpec, TypeVar

import torch

from stepcache import (
    _debug,
    _fingerprint,
    _registry,
    _store,
    _switches,
    _tables,
    _walk,
)
from stepcache._codegen import Dep, Layout, generate
from stepcache._errors import CacheValidationError, StepCacheError
from stepcache._spec import Arg, Attr, TensorSpec, validate
from stepcache._speccheck import Quick, compile_check, inline_check
from stepcache._store import StepCache, store_for

__all__ = ["BYPASS", "CachedFunction", "step_cached"]

P = ParamSpec("P")
R = TypeVar("R")


class _Bypass:
    """The key that means "compute, don't cache"."""

    _instance: _Bypass | None = None

    def __new__(cls) -> _Bypass:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "stepcache.BYPASS"

    def __reduce__(self) -> str:
        return "BYPASS"


#: Returned by a key function: compute the value and do not cache it.
BYPASS: Final = _Bypass()
"""Returned by a key function: compute the value and do not cache it.

A call whose key is `BYPASS` runs the function every time and counts as a *bypass* in
[`stats()`][stepcache.stats]. Use it for the calls whose value must not be shared:
DeepSeek V4's C4A layers read their own top-k indices, so their sparse indices are
built per layer, while the SWA-only and C128A layers share one build per step.

Examples:
    >>> import stepcache
    >>> def kind_or_bypass(md, kind):
    ...     return stepcache.BYPASS if kind == "c4a" else kind
    >>> @stepcache.step_cached(key=kind_or_bypass, owner="md", name="ex.sparse")
    ... def sparse_index(md, kind):
    ...     print("building", kind)
    ...     return kind.upper()
    >>> class SWAMetadata: pass
    >>> md = SWAMetadata()
    >>> sparse_index(md, "c128a")
    building c128a
    'C128A'
    >>> sparse_index(md, "c128a")
    'C128A'
    >>> sparse_index(md, "c4a")
    building c4a
    'C4A'
    >>> sparse_index(md, "c4a")
    building c4a
    'C4A'
    >>> stepcache.stats()["ex.sparse"].bypasses
    2
"""

Expect = TensorSpec | tuple[TensorSpec | None, ...] | None
KeyArg = Callable[..., Hashable] | str | Sequence[str] | None

_MISS, _BYPASS_COUNT, _INVALIDATION = 0, 1, 2
#: ``where()`` without a key: the key is unknown (or the function has none)
_NO_KEY: Final = object()


class CachedFunction:
    """Everything stepcache knows about one decorated function.

    The generated fast code handles hits; every other call lands in :meth:`miss`
    (production) or :meth:`slow` (disabled or debug mode).
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
    ) -> None:
        if not callable(fn) or isinstance(fn, (staticmethod, classmethod, property)):
            raise StepCacheError(
                f"@step_cached decorates plain functions and methods (got {fn!r}); "
                "put it under @staticmethod/@classmethod/@property, not above. "
                "(Wrote @step_cached without parentheses? Use @step_cached().)"
            )
        self.fn = fn
        self.name: str = name or str(getattr(fn, "__qualname__", repr(fn)))
        self.fid = _registry.new_id()
        self.lock = threading.Lock()
        self.misses = 0
        self._bypasses = 0
        self.invalidations = 0
        try:
            sig = inspect.signature(fn)
        except (TypeError, ValueError) as exc:
            raise StepCacheError(
                f"{self.name}: cannot read its signature ({exc})"
            ) from exc
        params = tuple(sig.parameters.values())
        for p in params:
            if p.name.startswith("_sc_"):
                raise StepCacheError(
                    f"{self.name}: parameter names starting with '_sc_' are reserved"
                )
        names = [p.name for p in params]
        plain = [
            p.name
            for p in params
            if p.kind
            not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
        ]
        if not plain:
            raise StepCacheError(
                f"{self.name}: a step-cached function needs an owner parameter "
                "(its first parameter, or the one named by owner=)"
            )
        self.owner_name = owner if owner is not None else plain[0]
        if self.owner_name not in plain:
            raise StepCacheError(
                f"{self.name}: owner={self.owner_name!r} is not a parameter "
                f"(parameters: {', '.join(names)})"
            )
        self.owner_index = names.index(self.owner_name)
        layout_key: tuple[str, ...] | str | None
        self.key_fn: Callable[..., Hashable] | None = None
        if key is None:
            layout_key = None
        elif isinstance(key, str) or (
            isinstance(key, Sequence) and all(isinstance(k, str) for k in key)
        ):
            layout_key = (key,) if isinstance(key, str) else tuple(key)
            if not layout_key:
                raise StepCacheError(f"{self.name}: key=() names no parameter")
            for k in layout_key:
                if k not in names:
                    raise StepCacheError(
                        f"{self.name}: key names {k!r}, which is not a parameter "
                        f"(parameters: {', '.join(names)})"
                    )
        elif callable(key):
            layout_key = "callable"
            self.key_fn = key
        else:
            raise StepCacheError(
                f"{self.name}: key must be a callable, a parameter name or a tuple of "
                f"parameter names (got {key!r})"
            )
        self.keyed = layout_key is not None
        # its entries in a store are a {key: entry} dict if it is keyed: in the
        # placeholder store, the empty slot (see _tables)
        _tables.register(self.fid, self.keyed)
        self.key_names: tuple[str, ...] = (
            layout_key if isinstance(layout_key, tuple) else ()
        )

        if isinstance(depends_on, str):
            depends_on = (depends_on,)
        deps: list[Dep] = []
        for d in depends_on:
            if not isinstance(d, str) or not d.isidentifier():
                raise StepCacheError(
                    f"{self.name}: depends_on takes attribute or parameter names "
                    f"(got {d!r})"
                )
            if d == self.owner_name:
                raise StepCacheError(
                    f"{self.name}: depends_on names the owner {d!r} itself; name its "
                    "attributes instead"
                )
            deps.append(Dep(d, d in names))
        self.deps = tuple(deps)

        well_formed = (
            expect is None
            or isinstance(expect, TensorSpec)
            or (
                isinstance(expect, tuple)
                and all(e is None or isinstance(e, TensorSpec) for e in expect)
            )
        )
        if not well_formed:
            raise StepCacheError(
                f"{self.name}: expect must be a TensorSpec or a tuple of them "
                f"(got {expect!r})"
            )
        self.expect = expect
        for spec in (expect,) if isinstance(expect, TensorSpec) else (expect or ()):
            for ref in spec.refs() if spec is not None else ():
                if isinstance(ref, Arg) and ref.name not in names:
                    raise StepCacheError(
                        f"{self.name}: expect refers to Arg({ref.name!r}), which is not "
                        f"a parameter (parameters: {', '.join(names)})"
                    )
        #: the compiled check of expect: a value it passes needs no validate()
        index_of = {n: i for i, n in enumerate(names)}
        self.quick: Quick | None = (
            None
            if expect is None
            else compile_check(expect, index_of, self.owner_index, self.name)
        )
        check, check_consts = (
            ((), ())
            if expect is None
            else inline_check(expect, index_of, self.owner_index)
        )

        if not isinstance(guard_result, bool):
            raise StepCacheError(
                f"{self.name}: guard_result must be True or False (got {guard_result!r})"
            )
        self.guard = guard_result
        self.only = self._check_only(only, names)
        layout = Layout(
            params,
            self.owner_name,
            layout_key,
            self.deps,
            guard_result,
            tuple(self.only),
            check,
        )
        self.source = generate(layout)
        ns: dict[str, Any] = {"__builtins__": __builtins__}
        exec(compile(self.source, f"<stepcache {self.name}>", "exec"), ns)
        defaults = [
            p.default for p in params if p.default is not inspect.Parameter.empty
        ]
        (
            wrapper,
            switched,
            checks,
            self.invoke,
            self.keyof,
            self.depvals,
            self._counts_get,
            self._hits_add,
            self.miss,
        ) = ns["_sc_factory"](
            self.fid,
            fn,
            self.key_fn,
            (
                self,
                _NO_KEY,
                store_for,
                StepCache,
                torch.Tensor,
                _fingerprint.VALUE_CLASSES,
                _fingerprint.fingerprint,
                _walk.result_guard,
                weakref.ref,
                check_consts,
                torch.device,
                _tables.ABSENT,
                _store.new_store,
                _store.NO_STORE,
                _store._side,
                _tables.EMPTY_SLOT,
            ),
            self.slow,
            _fingerprint.VAL,
            _fingerprint.SNAP,
            _fingerprint.snapshot,
            functools.partial(_debug.on_hit, self),
            (_switches, self.quick, _debug._Info),
            BYPASS,
            *defaults,
            *self.only.values(),
        )
        self.codes = {
            "fast": wrapper.__code__,
            "switched": switched.__code__,
            "checks": checks.__code__,
        }
        if len({c.co_freevars for c in self.codes.values()}) != 1:
            raise AssertionError(f"stepcache internal error: {self.name} cells differ")
        functools.update_wrapper(wrapper, fn)
        wrapper.__stepcache__ = self
        self.wrapper = wrapper
        _registry.register(self)
        self.use_code(_switches.code_name())

    def _check_only(
        self, only: Mapping[str, Container[Any]] | None, names: list[str]
    ) -> dict[str, Container[Any]]:
        if only is None:
            return {}
        if not isinstance(only, Mapping):
            raise StepCacheError(
                f"{self.name}: only= takes a mapping of parameter names to collections "
                f"(got {only!r})"
            )
        for name, allowed in only.items():
            if name not in names or name == self.owner_name:
                raise StepCacheError(
                    f"{self.name}: only= names {name!r}, which is not a parameter "
                    f"besides the owner (parameters: {', '.join(names)})"
                )
            if isinstance(allowed, (str, bytes)) or not hasattr(
                allowed, "__contains__"
            ):
                raise StepCacheError(
                    f"{self.name}: only={{{name!r}: ...}} must be a collection of the "
                    f"values to cache, such as a frozenset (got {allowed!r})"
                )
        return dict(only)

    # -- counters -----------------------------------------------------------------------
    @property
    def hits(self) -> int:
        return int(self._counts_get()[0])

    @property
    def bypasses(self) -> int:
        """Bypasses counted by the fast code and by the slow paths."""
        return int(self._counts_get()[1]) + self._bypasses

    def reset_counts(self) -> None:
        with self.lock:
            self._hits_add(0)
            self.misses = self._bypasses = self.invalidations = 0

    def _count(self, store: StepCache | None, which: int) -> None:
        # Counters are statistics: like the hit counter, not atomic across threads.
        if which == _MISS:
            self.misses += 1
        elif which == _BYPASS_COUNT:
            self._bypasses += 1
        else:
            self.invalidations += 1
        if store is not None:
            store.count(self.fid, which)

    def count_hit(self) -> None:
        # like the fast path's own increment: not atomic across threads
        self._hits_add(1)

    def use_code(self, which: str) -> None:
        """Run the ``fast``, ``checks`` or ``switched`` code from now on."""
        self.wrapper.__code__ = self.codes[which]

    # -- the pieces of a call -----------------------------------------------------------
    def where(self, key: Any = _NO_KEY) -> str:
        """How messages name this function (and the entry's key, when it has one)."""
        if self.keyed and key is not _NO_KEY:
            return f"step_cached function '{self.name}' (key={key!r})"
        return f"step_cached function '{self.name}'"

    def key_of(self, a: tuple[Any, ...]) -> Any:
        if not self.keyed and not self.only:
            return None
        try:
            key = self.keyof(a)
        except Exception as exc:
            what = "its key function" if self.key_fn is not None else "its only= test"
            raise StepCacheError(
                f"{self.where()}: {what} raised {type(exc).__name__}: {exc}"
            ) from exc
        return self.checked(key)

    def checked(self, key: Any) -> Any:
        """``key``, if it can key a dict; else a typed error naming the function."""
        if key is BYPASS or key is None:
            return key
        try:
            hash(key)
        except TypeError as exc:
            raise StepCacheError(
                f"{self.where()}: the key {key!r} is unhashable ({exc}). Fix: return a "
                "tuple of ints/strings (e.g. tuple(values) instead of a list)."
            ) from None
        return key

    def dep_values(self, a: tuple[Any, ...], key: Any = None) -> tuple[Any, ...]:
        try:
            values: tuple[Any, ...] = self.depvals(a)
            return values
        except AttributeError as exc:
            owner = a[self.owner_index]
            raise StepCacheError(
                f"{self.where(key)}: depends_on names an attribute the owner "
                f"{type(owner).__qualname__} does not have ({exc})"
            ) from exc

    def resolver(self, a: tuple[Any, ...]) -> Callable[[Arg | Attr], Any]:
        index = self.index_of

        def resolve(ref: Arg | Attr) -> Any:
            if isinstance(ref, Arg):
                return a[index[ref.name]]
            return getattr(a[self.owner_index], ref.name)

        return resolve

    @functools.cached_property
    def names(self) -> list[str]:
        return list(inspect.signature(self.fn).parameters)

    @functools.cached_property
    def index_of(self) -> dict[str, int]:
        return {name: i for i, name in enumerate(self.names)}

    def lookup(self, store: StepCache, key: Any) -> tuple[Any, ...] | None:
        slot = store._e.get(self.fid)
        if slot is None:
            return None
        if self.keyed:
            entry: tuple[Any, ...] | None = slot.get(key)
            return entry
        return slot  # type: ignore[no-any-return]

    def matches(
        self, entry: tuple[Any, ...], owner: object, deps: tuple[Any, ...]
    ) -> bool:
        if not self.deps:
            return bool(entry[1]() is owner) and self.result_unchanged(entry)
        for i, x in enumerate(deps):
            if not _fingerprint.matches(x, entry[2 + 2 * i], entry[3 + 2 * i]):
                return False
        return self.result_unchanged(entry)

    def result_unchanged(self, entry: tuple[Any, ...]) -> bool:
        """With ``guard_result``: no tensor of the value was written since it was
        stored."""
        if not self.guard:
            return True
        g = 2 + 2 * len(self.deps)
        return bool(entry[g]._version == entry[g + 1])

    def make_entry(
        self, value: Any, owner: object, fps: list[tuple[Any, Any]]
    ) -> tuple[Any, ...]:
        flat: list[Any] = [value, None if fps else weakref.ref(owner)]
        for fp in fps:
            flat += fp
        if self.guard:
            flat += _walk.result_guard(value)
        return tuple(flat)

    def insert(self, store: StepCache, key: Any, entry: tuple[Any, ...]) -> None:
        # No lock (as in the generated miss): each write is one dict operation, and a
        # store closed meanwhile, by another thread, is emptied again.
        if self.keyed:
            slot = store._e.get(self.fid)
            if slot is None:
                slot = store._e.setdefault(self.fid, {})
            slot[key] = entry
        else:
            store._e[self.fid] = entry
        if store._closed:
            store.clear()

    # -- the slow paths -----------------------------------------------------------------
    # -- the generated miss's rare paths -------------------------------------------------
    # (``self.miss(a, key)``, the production miss, is generated for each function
    # beside its hit: see ``_codegen._miss_source``)
    def settle(
        self, entry: tuple[Any, ...], a: tuple[Any, ...], key: Any, store: StepCache
    ) -> bool:
        """A miss found ``entry`` already there: True (a hit, counted) if it still
        matches; else count the invalidation (the miss goes on to recompute)."""
        owner = a[self.owner_index]
        deps = self.dep_values(a, key) if self.deps else ()
        if self.matches(entry, owner, deps):
            self.count_hit()
            return True
        if self.deps or not self.result_unchanged(entry):
            self._count(store, _INVALIDATION)
        return False

    def reject(self, value: Any, a: tuple[Any, ...], key: Any) -> None:
        """The compiled check did not pass ``value``: raise what ``validate()`` finds
        wrong (nothing, if the check could not read a valid value)."""
        violation = self.validation_error(value, a)
        if violation is not None:
            # the message names the function only when it is needed
            raise CacheValidationError(f"{self.where(key)}{violation}")

    def bypass(self, a: tuple[Any, ...]) -> Any:
        """A call the key (or ``only=``) leaves out of the cache."""
        self._count(None, _BYPASS_COUNT)
        return self.invoke(a)

    def expect_violation(self, value: Any, a: tuple[Any, ...]) -> str | None:
        """``None`` if ``value`` meets ``expect``; else what is wrong, as
        :func:`validate` says it (``": result ..."``, without the function's name).

        The compiled check answers for a valid value; ``validate()`` runs only when
        it says no (it may say no to a valid value it does not know how to read)."""
        if self.quick is None:
            return None
        try:
            if self.quick(value, a):
                return None
        except Exception:
            pass
        return self.validation_error(value, a)

    def validation_error(self, value: Any, a: tuple[Any, ...]) -> str | None:
        """What :func:`validate` finds wrong with ``value`` (``None``: nothing), for a
        value the compiled check did not pass."""
        if self.expect is None:
            return None
        try:
            validate(value, self.expect, self.resolver(a), "")
        except CacheValidationError as exc:
            return str(exc)
        return None

    def slow(self, a: tuple[Any, ...]) -> Any:
        """Disabled or debug mode."""
        if _switches.get_disabled():
            self._count(None, _BYPASS_COUNT)
            return self.invoke(a)
        if _switches.get_debug() == "off":
            return self.miss(a)
        return _debug.call(self, a)


def step_cached(
    key: KeyArg = None,
    *,
    owner: str | None = None,
    depends_on: Sequence[str] = (),
    expect: Expect = None,
    name: str | None = None,
    guard_result: bool = False,
    only: Mapping[str, Container[Any]] | None = None,
) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """Cache a function's result in the step's metadata object that owns it.

    The first call for an owner (and key) computes the value and stores it in the
    owner's [`StepCache`][stepcache.StepCache]; later calls return the same object while
    every declared dependency is unchanged. A changed dependency means a recomputation
    (counted as an *invalidation*), never a stale hit. A function that raises caches
    nothing: the next call computes again.

    Args:
        key: Which entry a call uses: a callable that takes the function's own
            arguments and returns a hashable, a parameter name or a tuple of parameter
            names as a shorthand, or `None` (one entry per function and owner). A key
            that is [`BYPASS`][stepcache.BYPASS] computes without caching. An
            unhashable key, or a key function that raises, is a
            [`StepCacheError`][stepcache.StepCacheError] that names the function.
        owner: The parameter whose object holds the cache; the entries live exactly as
            long as that object. Default: the first parameter (`self` of a method).
        depends_on: The owner's attributes (or the function's parameters) the value is
            computed from. An entry is reused only while each one is unchanged: a
            tensor must be the same object with the same in-place version counter;
            anything else must be equal and of the same type. Entries with declared
            dependencies may be shared with copies of the owner (they are re-checked on
            every hit); an entry with no dependencies is bound to the owner object.
        expect: A [`TensorSpec`][stepcache.TensorSpec], or for a tuple result a tuple
            of them (`None` skips an item), checked whenever a value is stored (and on
            every hit in debug mode); a violation raises
            [`CacheValidationError`][stepcache.CacheValidationError].
        name: The label in [`stats()`][stepcache.stats] and in error messages.
            Default: the function's qualified name.
        guard_result: Re-check, on every hit, that no tensor of the cached value was
            written since it was stored (one version-counter read per tensor). For a
            value that is a view into a persistent buffer that later builds of the
            step may rewrite: such a write invalidates the entry instead of handing
            out the new rows as the old ones.
        only: Cache only the calls whose named arguments are in the given collections
            (`{"kind": frozenset({"swa_only", "c128a"})}`); any other call computes
            without caching and counts as a bypass. The declarative form of a key
            function that returns [`BYPASS`][stepcache.BYPASS], tested inline on
            every call instead of calling a function.

    Returns:
        The decorator. The decorated function keeps its signature, for type checkers
            too (`ParamSpec`).

    Raises:
        StepCacheError: At decoration, for a configuration that cannot work: an
            `owner`, `key` or `depends_on` entry that names no parameter, a malformed
            `expect`, or `@step_cached` written without parentheses.

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
        >>> @stepcache.step_cached(key="kind", owner="step")
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
            fn, key, owner, depends_on, expect, name, guard_result, only
        ).wrapper
        return wrapper

    return decorate
