"""Tests of the curve law on the Σ η clock (geosearch/search/horizon/curve.py)."""

from __future__ import annotations

import math
import random

import pytest

from geosearch.search.horizon.curve import fit_law, forecast_law, law_forecast, ranking_rule

SUMS = [1.5, 3.0, 4.5, 7.0, 11.0, 16.0]


def law(s, l_inf=2.1, a=1.4, alpha=0.7):
    return l_inf + a * s**-alpha


@pytest.mark.parametrize("params", [(2.1, 1.4, 0.7), (3.0, 0.5, 0.25), (1.2, 4.0, 1.8)])
def test_the_law_recovers_a_known_curves_parameters(params):
    fit = fit_law(SUMS, [law(s, *params) for s in SUMS])
    assert (fit.l_inf, fit.a, fit.alpha) == pytest.approx(params, rel=1e-4, abs=1e-6)
    assert fit.at(40.0) == pytest.approx(law(40.0, *params), rel=1e-6)


def test_too_few_points_fit_nothing_and_three_give_no_interval():
    assert fit_law([1.0, 2.0], [3.0, 2.5]) is None
    assert fit_law([1.0, 1.0, 2.0], [3.0, 3.0, 2.5]) is None  # two distinct Σ η
    f = forecast_law(fit_law(SUMS[:3], [law(s) for s in SUMS[:3]]), 20.0)
    assert f.value == pytest.approx(law(20.0), rel=1e-3) and math.isnan(f.low)


def test_the_interval_covers_about_as_often_as_it_says():
    rng = random.Random(7)
    covered, n = 0, 400
    for _ in range(n):
        ys = [law(s) + rng.gauss(0, 0.01) for s in SUMS]
        f = forecast_law(fit_law(SUMS, ys), 20.0)
        covered += f.low <= law(20.0) + rng.gauss(0, 0.01) <= f.high
    assert 0.8 <= covered / n <= 0.99  # nominal 90%, a linearised interval


def test_seeds_combine_into_the_t_interval_of_their_mean():
    seeds = [[(s, law(s, l_inf=c)) for s in SUMS] for c in (2.0, 2.1, 2.2)]
    f = law_forecast(seeds, 20.0)
    assert f.seeds == 3 and f.value == pytest.approx(law(20.0, l_inf=2.1), rel=1e-4)
    half = 2.919986 * 0.1 / math.sqrt(3)  # t(0.95, 2) × sd / √n
    assert (f.high - f.low) / 2 == pytest.approx(half, rel=1e-3)
    assert law_forecast([[(1.0, 3.0)]], 20.0) is None


def test_the_rule_says_which_order_ranked():
    assert ranking_rule(4.4, 21.8, False) == "the top rung's completed runs (Σ η 4.4)"
    text = ranking_rule(8.8, 21.8, True)
    assert (
        text
        == "the longest completed branch (Σ η 8.8); the curve law at Σ η 21.8 is not benchmarked"
    )
