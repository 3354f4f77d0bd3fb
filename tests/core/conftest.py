# SPDX-License-Identifier: Apache-2.0
"""Every core test runs as written and inside ``torch.inference_mode()``."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _every_step_mode(step_mode: str) -> str:
    return step_mode
