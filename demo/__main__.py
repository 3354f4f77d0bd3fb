# SPDX-License-Identifier: Apache-2.0
"""``python -m demo``: the repository's demo (see :mod:`demo.demo`)."""

from __future__ import annotations

import sys

from demo.demo import main

if __name__ == "__main__":
    sys.exit(main())
