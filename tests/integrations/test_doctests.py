# SPDX-License-Identifier: Apache-2.0
"""The examples in stepcache.integrations' docstrings, run under their installed name."""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

import stepcache.integrations

MODULES = sorted(
    info.name
    for info in pkgutil.iter_modules(
        stepcache.integrations.__path__, "stepcache.integrations."
    )
)


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name: str) -> None:
    module = importlib.import_module(name)
    result = doctest.testmod(
        module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE
    )
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples failed"


def test_every_module_is_found() -> None:
    assert "stepcache.integrations.request_index" in MODULES
    assert "stepcache.integrations.vllm" in MODULES
