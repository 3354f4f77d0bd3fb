# SPDX-License-Identifier: Apache-2.0
"""The repository's demo (``bash scripts/demo.sh``); not part of the installed package."""
