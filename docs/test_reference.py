# SPDX-License-Identifier: Apache-2.0
"""The API reference stays complete: every public name has a one-line summary and a
doctested example, is rendered on a reference page and listed in its index.

Docstrings are read the way mkdocstrings reads them (griffe, Google style), so what is
checked here is what the site shows. Functions' and classes' examples run under
``--doctest-modules``; the examples of module attributes (``BYPASS``, ``__version__``),
which doctest cannot find, run here.
"""

from __future__ import annotations

import doctest
import re
from pathlib import Path
from typing import Any

import pytest

import stepcache

griffe = pytest.importorskip("griffe")

DOCS = Path(__file__).parent
API = DOCS / "api"
LINK = re.compile(r"\[([^\]]+)\]\[[^\]]*\]")


@pytest.fixture(scope="module")
def package() -> Any:
    return griffe.load("stepcache", docstring_parser="google", resolve_aliases=True)


def _docstring(package: Any, name: str) -> Any:
    obj = package[name]
    docstring = obj.docstring
    assert docstring is not None, f"stepcache.{name} has no docstring"
    return docstring


def _summary(docstring: Any) -> str:
    return str(docstring.value).split("\n\n", 1)[0]


@pytest.mark.parametrize("name", stepcache.__all__)
def test_public_name_has_a_one_line_summary(package: Any, name: str) -> None:
    summary = _summary(_docstring(package, name))
    assert "\n" not in summary, (
        f"stepcache.{name}: the summary spans lines: {summary!r}"
    )
    assert summary.endswith("."), f"stepcache.{name}: {summary!r} is not a sentence"


@pytest.mark.parametrize("name", stepcache.__all__)
def test_public_name_has_an_example(package: Any, name: str) -> None:
    sections = _docstring(package, name).parse("google")
    examples = [s for s in sections if s.kind.value == "examples"]
    assert examples, f"stepcache.{name}: no Examples section"
    assert any(">>>" in str(part) for s in examples for part in s.value)


@pytest.mark.parametrize(
    "name", [n for n in stepcache.__all__ if not callable(getattr(stepcache, n))]
)
def test_attribute_examples_run(package: Any, name: str) -> None:
    docstring = _docstring(package, name)
    test = doctest.DocTestParser().get_doctest(
        str(docstring.value), {}, f"stepcache.{name}", None, docstring.lineno or 0
    )
    assert test.examples
    runner = doctest.DocTestRunner(
        optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE
    )
    runner.run(test, out=lambda text: pytest.fail(text, pytrace=False))
    assert runner.failures == 0


def test_every_public_name_is_rendered_and_indexed(package: Any) -> None:
    rendered = {
        m.group(1)
        for page in API.glob("*.md")
        for m in re.finditer(r"^::: stepcache\.(\w+)\s*$", page.read_text(), re.M)
    }
    assert sorted(set(stepcache.__all__) - rendered) == []
    assert sorted(rendered - set(stepcache.__all__)) == []
    index = (API / "index.md").read_text()
    for name in stepcache.__all__:
        row = re.search(
            rf"^\| \[`{re.escape(name)}`\]\[stepcache\.{re.escape(name)}\] \| (.*) \|$",
            index,
            re.M,
        )
        assert row, f"api/index.md lists no row for stepcache.{name}"
        want = LINK.sub(r"\1", _summary(_docstring(package, name)))
        assert LINK.sub(r"\1", row.group(1)) == want, f"api/index.md: {name}"
