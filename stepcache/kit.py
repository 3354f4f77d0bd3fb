# SPDX-License-Identifier: Apache-2.0
"""What integrations build on besides `step_cached` and `scope`: reads that debug
mode does not watch, a tensor's `place` (a key part for a value that depends on
where a tensor lies, not on its contents), and functions written as source text (a
patch's wrapper with the target's own signature).

An engine's integration (``stepcache.integrations``) imports only this module and
the names of ``stepcache`` itself.
"""

from __future__ import annotations

from stepcache._codegen import defaults, method, passed, signature
from stepcache._kinds import place
from stepcache._watch import unrecorded

__all__ = ["defaults", "method", "passed", "place", "signature", "unrecorded"]
