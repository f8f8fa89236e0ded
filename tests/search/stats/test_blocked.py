"""Tests of geosearch.search.stats.blocked: the blocked (assignment + seed) noise model, its
df, contrasts and the comparisons made with it (and the fallbacks when it cannot be used).

Known cases are checked against hand-computed values; calibration (false-positive rate)
against seeded simulations of the model the statistics assume.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from geosearch.search.stats.blocked import blocked_fit
from geosearch.search.stats.scores import Score, compare, t_quantile


def _table(assignments: int, seeds: int, rng: np.random.Generator, gap: float = 0.0) -> np.ndarray:
    """loss[a, s] = 3 + gap·a + seed effect (sd 0.3, shared) + run noise (sd 0.01)."""
    return (3 + gap * np.arange(assignments)[:, None] + rng.normal(0, 0.3, (1, seeds))
            + rng.normal(0, 0.01, (assignments, seeds)))


def _scores(y: np.ndarray) -> list[Score]:
    return [Score(tuple(row), tuple(range(y.shape[1]))) for row in y]


@pytest.mark.parametrize(("assignments", "seeds", "df"), [(4, 2, 3), (4, 3, 6), (2, 2, 1), (3, 3, 4)])
def test_blocked_df_of_a_balanced_table_is_the_two_way_anova_one(assignments, seeds, df):
    y = _table(assignments, seeds, np.random.default_rng(assignments * 10 + seeds))
    fit = blocked_fit(_scores(y))
    assert fit.df == df == (assignments - 1) * (seeds - 1) and fit.cells == assignments * seeds
    # σ is the two-way ANOVA residual mean square Σ(y − ȳ_a − ȳ_s + ȳ)² / ((A−1)(S−1))
    resid = y - y.mean(1, keepdims=True) - y.mean(0, keepdims=True) + y.mean()
    assert fit.sd == pytest.approx(math.sqrt((resid ** 2).sum() / df), rel=1e-9)
    # every contrast of two: the difference of means, with se σ·√(2/S)
    for i in range(assignments):
        for j in range(assignments):
            if i != j:
                diff, se = fit.contrast({j: 1.0, i: -1.0})
                assert diff == pytest.approx(y[j].mean() - y[i].mean(), abs=1e-12)
                assert se == pytest.approx(fit.sd * math.sqrt(2 / seeds), rel=1e-9)


def test_blocked_fit_of_an_unbalanced_table():
    rng = np.random.default_rng(5)
    y = _table(4, 3, rng)
    # 4 × 2, plus seed 2 on assignments 0 and 1 (adaptive seeds): 10 cells; parameters
    # μ, 3 α contrasts, 2 β contrasts: rank 6, df 4
    scores = [Score(tuple(y[a, :3 if a < 2 else 2]), (0, 1, 2) if a < 2 else (0, 1)) for a in range(4)]
    fit = blocked_fit(scores)
    assert (fit.cells, fit.df) == (10, 4)
    # by hand: the least-squares residual of the 10 cells over the same dummy design
    rows = [(a, s) for a in range(4) for s in range(3 if a < 2 else 2)]
    x = np.array([[1.0] + [a == k for k in range(4)] + [s == k for k in range(3)] for a, s in rows])
    v = np.array([y[a, s] for a, s in rows])
    rss = float(np.sum((v - x @ np.linalg.lstsq(x, v, rcond=None)[0]) ** 2))
    assert np.linalg.matrix_rank(x) == 6 and fit.sd == pytest.approx(math.sqrt(rss / 4), rel=1e-9)
    # seed 2 on one assignment only: its seed effect absorbs the cell, which adds no df
    # (9 cells, rank 6: df 3, as 4 × 2) and does not move the contrasts
    balanced = [Score(tuple(y[a, :2]), (0, 1)) for a in range(4)]
    one = blocked_fit([Score(tuple(y[0]), (0, 1, 2))] + balanced[1:])
    assert (one.cells, one.df) == (9, 3) and one.sd == pytest.approx(blocked_fit(balanced).sd, rel=1e-9)
    diff, _ = one.contrast({1: 1.0, 0: -1.0})
    assert diff == pytest.approx(np.mean(y[1, :2] - y[0, :2]), abs=1e-12)


def test_blocked_contrast_of_unlinked_or_unfitted_scores_falls_back():
    y = _table(3, 2, np.random.default_rng(2))
    scores = _scores(y) + [Score((3.0, 3.1), (7, 8)), Score((3.2, 3.3))]
    fit = blocked_fit(scores)
    assert fit.df == 2 and fit.positions == (0, 1, 2, 3, None)
    # seeds 7 and 8 are shared with no one: α₃ − α₀ is not estimable, nor a lone α
    assert fit.contrast({3: 1.0, 0: -1.0}) is None and fit.contrast({1: 1.0}) is None
    assert fit.contrast({4: 1.0, 0: -1.0}) is None  # no seeds recorded: not in the fit
    assert compare(scores[0], scores[3], blocked=fit).test == "welch"
    assert compare(scores[0], scores[4], blocked=fit).test == "welch"
    assert compare(scores[0], scores[1], blocked=fit).test == "blocked"


def test_blocked_fit_needs_residual_df_and_else_falls_back():
    # one seed each, or one assignment: no residual degree of freedom, so no fit
    assert blocked_fit([Score((3.0,), (0,)), Score((3.1,), (0,)), Score((3.3,), (0,))]) is None
    assert blocked_fit([Score((3.0, 3.2, 3.1), (0, 1, 2))]) is None
    assert blocked_fit([Score((3.0, 3.2)), Score((3.1, 3.4))]) is None  # no seeds recorded
    assert blocked_fit([]) is None
    # ... and compare falls back to today's tests: unknown with one seed, paired, Welch
    assert compare(Score((3.0,), (0,)), Score((3.1,), (0,)), blocked=None).verdict == "unknown"
    a, b = Score((3.0, 3.2, 3.1), (0, 1, 2)), Score((3.1, 3.3, 3.15), (0, 1, 2))
    assert compare(a, b, blocked=blocked_fit([a])) == compare(a, b)
    assert compare(a, b).test == "paired"


def test_blocked_test_separates_what_one_pair_with_df_1_cannot():
    # the case: 4 assignments × 2 seeds, each seed moving every assignment alike
    # (offsets 0 and +0.4), assignments 0.03 apart with run noise ~0.005: every gap keeps its
    # sign in both seeds, but a paired t-test of one pair has df 1 (t₀.₉₇₅ = 12.7)
    y = np.array([[3.000, 3.404], [3.034, 3.430], [3.058, 3.465], [3.093, 3.488]])
    scores = _scores(y)
    fit = blocked_fit(scores)
    assert fit.df == 3 and fit.sd < 0.006
    paired = compare(scores[0], scores[1])
    blocked = compare(scores[0], scores[1], blocked=fit)
    assert (paired.test, paired.df, paired.verdict) == ("paired", 1, "tie")
    assert (blocked.test, blocked.df, blocked.verdict) == ("blocked", 3, "separated")
    assert blocked.diff == pytest.approx(paired.diff) and blocked.threshold < paired.threshold / 3
    assert blocked.se == pytest.approx(fit.sd) and blocked.n == 2  # σ·√(2/2)
    lo, hi = blocked.interval
    assert lo > 0 and hi - lo == pytest.approx(2 * t_quantile(3) * fit.sd)


@pytest.mark.slow
def test_blocked_test_rejects_an_equal_pair_five_percent_of_the_time():
    # under the null of the model (four equal assignments, big shared seed effect, 2 seeds),
    # the blocked test of assignments 0 and 1 at df 3 rejects in 5% of studies
    rng = np.random.default_rng(11)
    hits, sims = 0, 3000
    for _ in range(sims):
        scores = _scores(_table(4, 2, rng))
        c = compare(scores[0], scores[1], blocked=blocked_fit(scores))
        hits += abs(c.diff) > c.threshold
    assert 0.04 < hits / sims < 0.06
