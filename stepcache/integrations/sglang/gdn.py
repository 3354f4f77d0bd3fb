# SPDX-License-Identifier: Apache-2.0
"""What SGLang's GDN backend computes again in every gated delta-net layer.

``GDNAttnBackend._convolve_prefill`` (``layers/attention/linear/gdn_backend.py``, read
in SGLang 0.5.23) runs once per GDN layer of an extend pass, and each time passes the
causal convolution ``has_initial_state=forward_batch.extend_prefix_lens > 0``: a new
device tensor per layer, from a tensor that no layer writes. Qwen3-Next's 36 GDN layers
compute it 36 times per pass; the plugin computes it once per ``ForwardBatch`` (the
pass's own object, made anew each pass), depending on ``extend_prefix_lens``.

The stand-in makes the convolution's call as SGLang's method does (the same
arguments, the conv kernel looked up in SGLang's module at each call) with that one
argument from the cache. In verify mode it compares the cached mask with the one
stock SGLang computes, and leaves the convolution alone: running it twice would
update the conv states twice.
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import Any

import torch

import stepcache

from ..patching import REQUIRED, SkipPatch, StockCheck, Target, expect_function

__all__ = ["INITIAL_STATE_NAME", "MODULE", "find_convolve_prefill", "initial_state"]

MODULE = "sglang.srt.layers.attention.linear.gdn_backend"
INITIAL_STATE_NAME = "sglang.gdn.has_initial_state"

#: ``_convolve_prefill``'s parameters in 0.5.23
_PARAMS = (
    ("self", REQUIRED),
    ("layer", REQUIRED),
    ("forward_batch", REQUIRED),
    ("mixed_qkv", REQUIRED),
    ("conv_states", REQUIRED),
    ("cache_indices", REQUIRED),
)


@stepcache.step_cached(depends_on=("extend_prefix_lens",), name=INITIAL_STATE_NAME)
def initial_state(forward_batch: Any) -> torch.Tensor:
    """Which requests of the pass resume a cached prefix: one flag per request."""
    mask: torch.Tensor = forward_batch.extend_prefix_lens > 0
    return mask


def _stand_in(
    module: ModuleType, stock_check: Callable[[], StockCheck | None]
) -> Callable[..., Any]:
    def convolve_prefill(
        self: Any,
        layer: Any,
        forward_batch: Any,
        mixed_qkv: torch.Tensor,
        conv_states: torch.Tensor,
        cache_indices: torch.Tensor,
    ) -> torch.Tensor:
        metadata = self.forward_metadata
        mask = initial_state(forward_batch)
        check = stock_check()
        if check is not None:
            check(INITIAL_STATE_NAME, mask, forward_batch.extend_prefix_lens > 0)
        table = metadata.conv_block_table
        out: torch.Tensor = module.causal_conv1d_fn(
            mixed_qkv.transpose(0, 1),
            layer.conv_weights,
            layer.bias,
            activation=layer.activation,
            conv_states=conv_states,
            has_initial_state=mask,
            cache_indices=cache_indices,
            query_start_loc=metadata.query_start_loc,
            seq_lens_cpu=forward_batch.extend_seq_lens_cpu,
            **({} if table is None else {"block_table": table}),
        )
        return out.transpose(0, 1)[: mixed_qkv.shape[0]]

    return convolve_prefill


def find_convolve_prefill(
    stock_check: Callable[[], StockCheck | None],
) -> Callable[[ModuleType], Target]:
    """The patch's ``find``: ``GDNAttnBackend._convolve_prefill`` of 0.5.23's shape;
    ``stock_check`` gives verify mode's comparison at each call."""

    def find(module: ModuleType) -> Target:
        cls = getattr(module, "GDNAttnBackend", None)
        if not isinstance(cls, type):
            raise SkipPatch(f"{module.__name__}.GDNAttnBackend is absent")
        if not callable(getattr(module, "causal_conv1d_fn", None)):
            raise SkipPatch(f"{module.__name__}.causal_conv1d_fn is absent")
        original = expect_function(cls, "_convolve_prefill", _PARAMS)
        return Target(
            cls, "_convolve_prefill", original, _stand_in(module, stock_check)
        )

    return find
