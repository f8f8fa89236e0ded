"""Searches without the report's plots, for tests that check no plot.

A finished ``geosearch search`` draws its report's plots with matplotlib, about 10 s of a
loaded 2-core machine per command. Where a test checks no plot, it leaves them out as the
library does where matplotlib is not installed: in its own process through the ``no_plots``
fixture (``make_plots`` raises ImportError), in the commands it starts through
:func:`without_plots` (a ``matplotlib`` that fails to import comes first on their path).
The plots themselves are tested in ``tests/report/test_plots.py`` and by the end-to-end
tests that keep them.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

NO_MATPLOTLIB = Path(__file__).resolve().parent / "_no_matplotlib"


def without_plots(env: dict[str, str]) -> dict[str, str]:
    """``env`` (a command's environment) with the failing matplotlib first on its path."""
    path = env.get("PYTHONPATH", "")
    return {**env, "PYTHONPATH": str(NO_MATPLOTLIB) + (os.pathsep + path if path else "")}


def _no_matplotlib(*args, **kwargs):
    raise ImportError("matplotlib is left out of this test (tests/_no_plots.py)")


def leave_out_plots(mp: pytest.MonkeyPatch) -> None:
    """Through ``mp``, the searches write their reports without plots: in this process, and
    in the commands started with its environment (for a fixture of a wider scope)."""
    import geosearch.report

    mp.setattr(geosearch.report, "make_plots", _no_matplotlib)
    mp.setenv("PYTHONPATH", without_plots(dict(os.environ))["PYTHONPATH"])


@pytest.fixture
def no_plots(monkeypatch):
    """This test's searches write their reports without plots: here, and in the commands it
    starts with this process's environment."""
    leave_out_plots(monkeypatch)
