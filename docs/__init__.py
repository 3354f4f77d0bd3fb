# SPDX-License-Identifier: Apache-2.0
"""The documentation site; a package only so that pytest imports its conftest.py as
``docs.conftest``, apart from ``tests/conftest.py``."""
