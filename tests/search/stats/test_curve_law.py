"""The curve law's coverage and the branch ladder's cost (benchmarks/curve_law.py), on
hand-made cells and on the default space's plan."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

from geosearch.search.horizon.curve import LawForecast

BENCHMARKS = Path(__file__).resolve().parents[3] / "benchmarks"


@pytest.fixture
def law(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    sys.modules.pop("curve_law", None)
    import curve_law

    return curve_law


def _cell(value, low, high, truth, longest):
    return {"forecast": LawForecast(value, low, high, 40.0, 2), "truth": truth, "longest": longest}


def test_coverage_and_the_two_orders_on_hand_made_cells(law):
    cells = [
        _cell(1.0, 0.9, 1.1, 1.05, 2.0),  # covered
        _cell(2.0, 1.9, 2.1, 1.5, 1.0),  # the truth below the interval
        _cell(3.0, math.nan, math.nan, 3.0, 3.0),  # no interval: one seed fits exactly
    ]
    assert [law.covered(c) for c in cells] == [True, False, None]
    assert law.covered(dict(cells[0], forecast=None)) is None
    scores = law.order_scores(cells)  # truth order: 0, 1, 2
    assert scores["law"] == (pytest.approx(1.0), True)
    assert scores["longest"] == (pytest.approx(0.5), False)  # 1, 0, 2: the best swapped


def test_a_branch_seed_costs_its_trunk_and_every_cooldown(law):
    grid = {"ladder.rungs": (3,), "proxy.steps": (400,), "ladder.max_steps": (2000,),
            "ladder.lower_seeds": (None,), "ladder.cooldown": (0.2,),
            "ladder.stability_steps": (200,)}
    (row,) = law.cost_rows(grid)
    steps = [n for n, _ in row["rungs"]]
    cooldowns = [round(0.2 * n) for n in steps]
    trunk = steps[-1] - cooldowns[-1]
    assert row["steps"] == 4 * (2 * (trunk + sum(cooldowns)) + 200)
    assert row["share"] == pytest.approx(row["steps"] / (4 * 2 * 2000))
    assert row["rungs"][-1][1] == pytest.approx(21.8, abs=0.05)  # the top branch at the target
