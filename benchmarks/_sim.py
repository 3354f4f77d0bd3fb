# SPDX-License-Identifier: Apache-2.0
"""The stepcache integrations the benchmarks use, importable by Python and by mypy.

Installed, the checkout's ``integrations/`` folder is the package
``stepcache.integrations`` (a setuptools package-dir mapping, which an editable
install implements with an import hook). mypy cannot follow that hook, so it checks the
same files from the checkout under their folder's name; Python imports the package.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from integrations import demo, dsv4_sim, request_index, sparse_index
else:
    from stepcache.integrations import demo, dsv4_sim, request_index, sparse_index

__all__ = ["demo", "dsv4_sim", "request_index", "sparse_index"]
