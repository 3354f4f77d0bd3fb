# SPDX-License-Identifier: Apache-2.0
"""`@step_cached`: hits, misses, key forms, BYPASS, signatures, owners."""

from __future__ import annotations

import inspect
from typing import Any

import pytest

import stepcache
from stepcache import BYPASS, StepCacheError, step_cached


class Counter:
    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []


class Meta:
    def __init__(self, n: int = 3) -> None:
        self.n = n
        self.log = Counter()

    @step_cached()
    def whole(self) -> list[int]:
        self.log.calls.append(("whole",))
        return list(range(self.n))

    @step_cached(key="kind")
    def by_kind(self, kind: str) -> tuple[str, int]:
        self.log.calls.append(("by_kind", kind))
        return (kind, self.n)

    @step_cached(key=("kind", "rows"))
    def by_kind_rows(self, kind: str, rows: int) -> tuple[str, int]:
        self.log.calls.append(("by_kind_rows", kind, rows))
        return (kind, rows)

    @step_cached(key=lambda self, kind, rows=0: BYPASS if kind == "c4a" else kind)
    def layer(self, kind: str, rows: int = 0) -> list[str]:
        self.log.calls.append(("layer", kind, rows))
        return [kind]


def test_second_call_is_a_hit_and_returns_the_same_object() -> None:
    m = Meta()
    first = m.whole()
    assert m.whole() is first
    assert m.log.calls == [("whole",)]
    row = stepcache.stats()["Meta.whole"]
    assert (row.hits, row.misses) == (1, 1)


def test_parameter_name_key_gives_one_entry_per_value() -> None:
    m = Meta()
    assert m.by_kind("swa_only") == ("swa_only", 3)
    assert m.by_kind("c128a") == ("c128a", 3)
    assert m.by_kind("swa_only") == ("swa_only", 3)
    assert m.log.calls == [("by_kind", "swa_only"), ("by_kind", "c128a")]
    assert len(stepcache.cache_of(m)) == 2


def test_tuple_key_separates_every_component() -> None:
    m = Meta()
    m.by_kind_rows("swa_only", 4)
    m.by_kind_rows("swa_only", 8)
    m.by_kind_rows("swa_only", 4)
    m.by_kind_rows(kind="swa_only", rows=8)
    assert m.log.calls == [
        ("by_kind_rows", "swa_only", 4),
        ("by_kind_rows", "swa_only", 8),
    ]


def test_bypass_computes_every_time_and_counts_bypasses() -> None:
    m = Meta()
    a, b = m.layer("c4a"), m.layer("c4a")
    assert a == b and a is not b
    m.layer("swa_only")
    m.layer("swa_only")
    assert [c[1] for c in m.log.calls] == ["c4a", "c4a", "swa_only"]
    row = stepcache.stats()["Meta.layer"]
    assert (row.hits, row.misses, row.bypasses) == (1, 1, 2)
    assert len(stepcache.cache_of(m)) == 1


def test_owners_do_not_share_entries() -> None:
    a, b = Meta(2), Meta(5)
    assert a.whole() == [0, 1]
    assert b.whole() == [0, 1, 2, 3, 4]
    assert a.whole() == [0, 1]


def test_owner_can_be_a_named_parameter() -> None:
    class Layer:
        def __init__(self, kind: str) -> None:
            self.kind = kind
            self.built = 0

        @step_cached(key=lambda self, md, rows: (self.kind, rows), owner="md")
        def build(self, md: Meta, rows: int) -> tuple[str, int]:
            self.built += 1
            return (self.kind, rows)

    md = Meta()
    l1, l2 = Layer("swa_only"), Layer("swa_only")
    assert l1.build(md, 4) is l2.build(md, 4)
    assert (l1.built, l2.built) == (1, 0)
    assert Layer("c128a").build(md, 4) == ("c128a", 4)
    assert len(stepcache.cache_of(md)) == 2


def test_signature_and_metadata_are_kept() -> None:
    def f(self: Meta, a: int, /, b: int = 2, *args: int, c: int = 3, **kw: int) -> int:
        """Doc."""
        return a + b + c + sum(args) + sum(kw.values())

    g = step_cached(key=lambda self, a, b=2, *args, c=3, **kw: (a, b, args, c))(f)
    assert inspect.signature(g) == inspect.signature(f)
    assert g.__doc__ == "Doc." and g.__name__ == "f" and g.__wrapped__ is f  # type: ignore[attr-defined]
    m = Meta()
    assert g(m, 1) == 6
    assert g(m, 1, 5, 7, 8, c=1, z=100) == 1 + 5 + 1 + 15 + 100
    assert g(m, 1, 5, 7, 8, c=1, z=100) == 122
    with pytest.raises(TypeError):
        g(m, a=1)  # type: ignore[call-arg]


def test_a_function_named_like_the_generated_code_s_own_names_works() -> None:
    """The generated code reads its values under ``_sc_`` names; a function that has
    one of them as its name (here the slow path's) still computes once and keeps its
    name, on the hit and through the slow path (``stats``, a miss)."""
    calls = []

    def _sc_CALL(self: Meta, n: int) -> int:  # noqa: N802 - the name is the point
        calls.append(n)
        return n * 2

    g = step_cached(key="n", name="ex.sc_named")(_sc_CALL)
    m = Meta()
    assert g(m, 3) == 6 and g(m, 3) == 6 and g(m, 4) == 8
    assert calls == [3, 4]
    assert g.__name__ == "_sc_CALL"
    row = stepcache.stats()["ex.sc_named"]
    assert (row.hits, row.misses) == (1, 2)


def test_keyword_and_positional_calls_share_an_entry() -> None:
    m = Meta()
    m.by_kind_rows("x", 1)
    m.by_kind_rows("x", rows=1)
    m.by_kind_rows(rows=1, kind="x")
    assert len(m.log.calls) == 1


def test_free_function_with_defaults() -> None:
    seen: list[int] = []

    @step_cached(key="rows")
    def build(md: Meta, rows: int = 7) -> int:
        seen.append(rows)
        return rows * 2

    md = Meta()
    assert build(md) == 14 and build(md, 7) == 14 and build(md, rows=7) == 14
    assert seen == [7]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"key": "nope"}, "key names 'nope'"),
        ({"owner": "nope"}, "owner='nope' is not a parameter"),
        ({"depends_on": ("self",)}, "names the owner"),
        ({"depends_on": ("not an id",)}, "depends_on takes"),
        ({"key": 3}, "key must be a callable"),
        ({"expect": "int32"}, "expect must be a TensorSpec"),
        (
            {"expect": stepcache.TensorSpec(device=stepcache.Arg("buf"))},
            r"Arg\('buf'\)",
        ),
    ],
)
def test_bad_decoration_is_a_typed_error(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(StepCacheError, match=message):

        @step_cached(**kwargs)
        def f(self: Meta, kind: str) -> int:
            return 1


def test_decorating_without_parentheses_says_so() -> None:
    with pytest.raises(StepCacheError, match="without parentheses"):

        class Bad:
            @step_cached  # type: ignore[arg-type]
            def f(self) -> int:
                return 1

        Bad().f()


def test_function_without_parameters_is_refused() -> None:
    with pytest.raises(StepCacheError, match="has no owner parameter"):
        step_cached()(lambda: 1)


def test_reserved_parameter_names_are_refused() -> None:
    with pytest.raises(StepCacheError, match="reserved"):
        step_cached()(lambda self, _sc_e: 1)


def test_user_parameter_names_that_look_internal_work() -> None:
    @step_cached(key=("e", "ok", "a"))
    def f(self: Meta, e: int, ok: int, a: int) -> int:
        return e + ok + a

    m = Meta()
    assert f(m, 1, 2, 3) == 6 and f(m, 1, 2, 3) == 6 and f(m, 3, 2, 1) == 6
    assert (
        stepcache.stats()[
            "test_user_parameter_names_that_look_internal_work.<locals>.f"
        ].hits
        == 1
    )


def test_name_labels_the_stats_row() -> None:
    @step_cached(name="my.builder")
    def f(self: Meta) -> int:
        return 1

    f(Meta())
    assert "my.builder" in stepcache.stats()
    assert "my.builder" in str(stepcache.stats())
