# SPDX-License-Identifier: Apache-2.0
"""vLLM's ``split_decodes_and_prefills``, computed once per layout and thresholds.

Nearly every attention metadata builder calls it on the step's metadata (DeepSeek V4's
sparse-SWA, sparse-MLA C128A and indexer builders among them), each time reading the
host ``query_start_loc_cpu`` again. It is a pure function of that layout and its own
parameters.

Where the name is bound: about 26 modules do ``from vllm.v1.attention.backends.utils
import split_decodes_and_prefills``, each binding the function in its own namespace.
The patch replaces it in ``vllm.v1.attention.backends.utils`` itself, so every module
imported afterwards binds the decorated function, and rebinds it in every module
already imported that bound vLLM's. A module that keeps the function somewhere else
(a default argument, a dict) keeps calling vLLM's, uncached but correct.
"""

from __future__ import annotations

import sys
from types import ModuleType
from typing import Any

import stepcache

from ._vllm_patch import (
    MARK,
    REQUIRED,
    Undo,
    expect_function,
    marked,
)

__all__ = ["SPLIT_NAME", "apply_split", "split_decodes_and_prefills"]

SPLIT_NAME = "vllm.split_decodes_and_prefills"
_ATTR = "split_decodes_and_prefills"

_original: dict[str, Any] = {}


@stepcache.step_cached(
    key=("decode_threshold", "require_uniform", "treat_short_extends_as_decodes"),
    owner="common_attn_metadata",
    depends_on=(
        "query_start_loc_cpu",
        "num_reqs",
        "num_actual_tokens",
        "max_query_len",
        "is_prefilling",
    ),
    name=SPLIT_NAME,
)
def split_decodes_and_prefills(
    common_attn_metadata: Any,
    decode_threshold: int = 1,
    require_uniform: bool = False,
    treat_short_extends_as_decodes: bool = True,
) -> tuple[int, int, int, int]:
    """vLLM's ``split_decodes_and_prefills``, once per layout and parameters."""
    result: tuple[int, int, int, int] = _original["split"](
        common_attn_metadata,
        decode_threshold,
        require_uniform,
        treat_short_extends_as_decodes,
    )
    return result


def apply_split(module: ModuleType) -> Undo:
    """Install the decorated function in ``module`` (vLLM's attention utils) and in
    every imported vLLM module that bound vLLM's."""
    original = expect_function(
        module,
        _ATTR,
        (
            ("common_attn_metadata", REQUIRED),
            ("decode_threshold", 1),
            ("require_uniform", False),
            ("treat_short_extends_as_decodes", True),
        ),
    )
    _original["split"] = original
    ours = marked(split_decodes_and_prefills, SPLIT_NAME)
    for mod in _vllm_modules():
        if mod.__dict__.get(_ATTR) is original:
            setattr(mod, _ATTR, ours)

    def undo() -> None:
        # Modules imported while the patch was on bound ours too: restore them all.
        for mod in _vllm_modules():
            if getattr(mod.__dict__.get(_ATTR), MARK, None) == SPLIT_NAME:
                setattr(mod, _ATTR, original)

    return undo


def _vllm_modules() -> list[ModuleType]:
    return [
        m
        for name, m in list(sys.modules.items())
        if isinstance(m, ModuleType) and (name == "vllm" or name.startswith("vllm."))
    ]
