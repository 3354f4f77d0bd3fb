# SPDX-License-Identifier: Apache-2.0
"""What integrations build on besides `step_cached` and `scope`: reads that debug
mode does not watch, whether production's code runs, a tensor's `place` (a key part
for a value that depends on where a tensor lies, not on its contents), and functions
written as source text (a patch's wrapper with the target's own signature).

An engine's integration (``stepcache.integrations``) imports only this module and
the names of ``stepcache`` itself.
"""

from __future__ import annotations

from stepcache._codegen import defaults, method, passed, signature
from stepcache._kinds import place
from stepcache._recorder import unrecorded
from stepcache._switches import Switches


def production() -> bool:
    """Whether decorated functions run production's code: caching on, debug mode off.

    Examples:
        >>> import stepcache, stepcache.kit
        >>> with stepcache.debug():
        ...     stepcache.kit.production()
        False
    """
    return Switches.variant() == "production"


__all__ = [
    "defaults",
    "method",
    "passed",
    "place",
    "production",
    "signature",
    "unrecorded",
]
