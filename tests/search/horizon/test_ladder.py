"""The Σ η ladder: rung planning and what the rungs say about the target."""

from __future__ import annotations

import math

import pytest

from geosearch.search.horizon.ladder import Rung, plan_ladder, read_ladder, spearman


def _flat(steps: int) -> float:
    """A constant schedule: Σ η = peak · steps."""
    return float(steps)


def test_ladder_reaches_the_target_by_step_size_when_allowed():
    rungs = plan_ladder(200, 0.02, 40.0, rungs=3, schedule_sum=_flat, max_spectral_lr=1.0, max_steps=200)
    # rung 0 is the proxy run itself; the top rung sits on the target's Σ η
    assert rungs[0] == Rung(0, 200, 0.02, 4.0)
    assert [r.steps for r in rungs] == [200, 200, 200]
    assert rungs[-1].sum_eta == pytest.approx(40.0)
    # evenly spaced in log Σ η: the middle rung is the geometric mean
    assert rungs[1].sum_eta == pytest.approx(math.sqrt(4.0 * 40.0))


def test_ladder_takes_more_steps_past_the_step_size_cap_and_stops_at_its_limits():
    rungs = plan_ladder(100, 0.02, 100.0, rungs=3, schedule_sum=_flat, max_spectral_lr=0.1, max_steps=400)
    assert all(r.spectral_lr <= 0.1 + 1e-12 for r in rungs)
    # the top rung cannot reach Σ η 100 within 400 steps at η 0.1: it stops at 40
    assert rungs[-1].steps == 400 and rungs[-1].sum_eta == pytest.approx(40.0)
    assert all(a.sum_eta < b.sum_eta for a, b in zip(rungs, rungs[1:]))


def test_ladder_is_one_rung_when_the_target_is_no_longer_than_the_proxy():
    rungs = plan_ladder(200, 0.02, 3.0, rungs=4, schedule_sum=_flat, max_spectral_lr=1.0, max_steps=200)
    assert len(rungs) == 1 and rungs[0].sum_eta == pytest.approx(4.0)


def test_spearman_known_values():
    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    # the case: the same winner, the other three reordered -> 0.4
    assert spearman([1, 2, 3, 4], [1, 4, 2, 3]) == pytest.approx(0.4)
    assert math.isnan(spearman([1, 1, 1], [1, 2, 3]))


def test_reading_names_the_lead_change_and_the_top_rung_order():
    rungs = [Rung(0, 200, 0.02, 2.0), Rung(1, 200, 0.06, 6.0), Rung(2, 200, 0.2, 20.0)]
    losses = {"A": [2.25, 1.80, 1.20], "B": [2.20, 1.82, 1.25], "C": [2.40, 1.95, 1.30]}
    h = read_ladder(rungs, losses, target_sum_eta=20.0)
    assert h.leaders == ["B", "A", "A"]
    assert h.lead_changes == [(2.0, 6.0, "B", "A")]
    assert not h.stable and not h.extrapolated
    assert h.forecast_order == ["A", "B", "C"]
    assert any("the lead changed between Σ η 2 and 6" in line for line in h.lines)
    measured = [(c.first, c.second) for c in h.crossings if c.measured]
    assert measured == [("B", "A")]
    # the crossing lies between the two rungs where the gap changed sign
    assert 2.0 < h.crossings[0].sum_eta < 6.0


def test_reading_forecasts_a_crossing_beyond_the_top_rung():
    # gap A - B shrinks linearly in log Σ η: +0.10 at Σ η 1, +0.05 at e; zero at e², past the top
    rungs = [Rung(0, 100, 0.01, 1.0), Rung(1, 100, 0.0272, math.e)]
    losses = {"A": [2.10, 1.95], "B": [2.00, 1.90]}
    h = read_ladder(rungs, losses, target_sum_eta=math.e ** 3)
    assert h.extrapolated and h.leaders == ["B", "B"]
    forecast = [c for c in h.crossings if not c.measured]
    assert [(c.first, c.second) for c in forecast] == [("B", "A")]
    assert forecast[0].sum_eta == pytest.approx(math.e ** 2, rel=1e-6)
    assert h.forecast_order == ["A", "B"] and not h.stable
    assert any("extrapolation" in line for line in h.lines)


def test_reading_skips_assignments_missing_a_rung():
    rungs = [Rung(0, 100, 0.02, 2.0), Rung(1, 100, 0.2, 20.0)]
    h = read_ladder(rungs, {"A": [2.0, 1.5], "B": [2.1, float("nan")], "C": [2.2]}, 20.0)
    assert h.leaders == ["A", "A"] and h.forecast_order == ["A"] and h.stable
