# SPDX-License-Identifier: Apache-2.0
"""The SGLang plugin: stepcache's caches in front of some of SGLang's per-pass work.

A declaration on the engine-neutral kit (:class:`~stepcache.integrations.plugin.
EnginePlugin`), nothing more: the switch ``STEPCACHE_SGLANG`` (unset or ``0``: the
plugin does nothing; ``1``, ``verify``, ``force`` as for every engine), the SGLang
release series it was tested against (0.5, read and tested in 0.5.23), and the patch
table. Its lifecycle is the kit's: :data:`register`, :data:`unregister`,
:data:`status`, :data:`counters` are :class:`~stepcache.integrations.plugin.
PluginFunctions` calling :data:`PLUGIN`.
``STEPCACHE_SGLANG_SKIP`` names patches to leave out, separated by commas;
``STEPCACHE_SGLANG_ADD`` the patches off by default to apply (``all``: every one).

The caches live in SGLang's ``ForwardBatch``, the object every forward pass makes
anew and hands to each layer's backend: a value cached there dies with the pass, and no
scope is needed. The patches:

* :data:`~.gdn.INITIAL_STATE_NAME`: GDN's ``has_initial_state`` mask, once per pass
  instead of once per GDN layer (:mod:`.gdn`);
* :data:`~.tbo.SPLIT_TOKEN_NAME`: two-batch overlap's split token, once per parent
  batch instead of three times (:mod:`.tbo`);
* off by default, for an FP4 KV cache with FlashInfer's decode:
  :data:`~.scopes.FORWARD_NAME`, a scope around each forward pass (:mod:`.scopes`),
  and :data:`~.fp4.HOST_ROWS_NAME`, the pass's request rows and lengths read to the
  host once per pass instead of once per layer (:mod:`.fp4`). Both apply together
  (``STEPCACHE_SGLANG_ADD=all``): the scope costs every pass a few microseconds, and
  only that decode path has something to share in it.

>>> PLUGIN.parse_mode("verify"), PLUGIN.supports("sglang", "0.5.23")
('verify', True)
>>> [patch.name for patch in PATCHES]  # doctest: +NORMALIZE_WHITESPACE
['sglang.gdn.has_initial_state', 'sglang.tbo.split_token_index',
 'sglang.ModelRunner.forward', 'sglang.MHATokenToKVPool._to_cpu_int_list']
"""

from __future__ import annotations

import logging
from typing import Final

from ..patching import InScope, Patch, StockCheck, Verify
from ..plugin import EnginePlugin, PluginFunctions
from . import fp4, gdn, scopes, tbo

__all__ = [
    "ADD_ENV",
    "ENV",
    "PATCHES",
    "PLUGIN",
    "SKIP_ENV",
    "SUPPORTED",
    "active_mode",
    "counters",
    "register",
    "reset_counters",
    "status",
    "unregister",
]

#: Under SGLang's logger, so the lines appear in its log.
logger = logging.getLogger("sglang.stepcache")

ENV: Final = "STEPCACHE_SGLANG"
SKIP_ENV: Final = "STEPCACHE_SGLANG_SKIP"
ADD_ENV: Final = "STEPCACHE_SGLANG_ADD"
SUPPORTED: Final = (("sglang", (0, 5)),)


def _stock_check() -> StockCheck | None:
    return PLUGIN.stock_check


PATCHES: tuple[Patch, ...] = (
    # the stand-in compares the mask itself in verify mode (the convolution writes
    # the conv states: it must not run twice)
    Patch(
        gdn.INITIAL_STATE_NAME,
        gdn.MODULE,
        gdn.find_convolve_prefill(_stock_check),
        Verify(when=lambda *args, **kwargs: False),
    ),
    Patch(tbo.SPLIT_TOKEN_NAME, tbo.MODULE, tbo.find_split_token_index, Verify()),
    # off by default: the scope costs every pass, and only an FP4 KV cache's decode
    # shares a value in it
    Patch(
        scopes.FORWARD_NAME, scopes.MODULE, scopes.find_forward, InScope(), opt_in=True
    ),
    Patch(fp4.HOST_ROWS_NAME, fp4.MODULE, fp4.find_host_rows, Verify(), opt_in=True),
)

PLUGIN: Final = EnginePlugin(
    engine="SGLang",
    package="sglang",
    env=ENV,
    supported=SUPPORTED,
    patches=PATCHES,
    logger=logger,
    distributions=("sglang",),
    skip_env=SKIP_ENV,
    add_env=ADD_ENV,
)

#: The lifecycle, the kit's functions (each calls :data:`PLUGIN`): ``register``
#: applies the patches once per process if ``STEPCACHE_SGLANG`` asks for it;
#: ``unregister`` undoes them; ``status`` each patch's state; ``counters`` this
#: process's counts by patch (the caches count in :func:`stepcache.stats`);
#: ``reset_counters`` zeroes them.
_functions = PluginFunctions(__name__)
register = _functions.register
unregister = _functions.unregister
active_mode = _functions.active_mode
status = _functions.status
counters = _functions.counters
reset_counters = _functions.reset_counters
