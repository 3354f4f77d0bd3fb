# SPDX-License-Identifier: Apache-2.0
"""Typing: the decorator keeps the signature (ParamSpec) under ``mypy --strict``."""

from __future__ import annotations

from pathlib import Path

import pytest

mypy_api = pytest.importorskip("mypy.api")

EXAMPLE = Path(__file__).parent.parent / "typing_example.py"


def _mypy(*paths: str) -> tuple[str, int]:
    out, err, status = mypy_api.run(["--strict", *paths])
    return out + err, status


def test_example_module_passes_mypy_strict() -> None:
    out, status = _mypy(str(EXAMPLE))
    assert status == 0, out


def test_a_wrong_call_is_still_caught(tmp_path: Path) -> None:
    bad = tmp_path / "bad_call.py"
    bad.write_text(
        EXAMPLE.read_text()
        + "\n\ndef wrong() -> None:\n"
        + "    m = Meta(torch.tensor([0, 2]), 2)\n"
        + '    m.index("not a tensor")\n'
        + "    sparse(m, 3, 3)\n"
    )
    out, status = _mypy(str(bad))
    assert status == 1
    assert 'Argument 1 to "index" of "Meta" has incompatible type "str"' in out
    assert 'Argument 2 to "sparse" has incompatible type "int"' in out
