"""The fault scenarios' commands write their reports without plots (``tests/_no_plots.py``):
no invariant reads a plot; the report's tables are still written and read back."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _without_plots(no_plots):
    pass
