"""Tests of geosearch.search.stats.scores: scores, exact t quantiles, paired vs Welch comparisons,
the pooled seed noise, the detectable gap and factor main effects (the blocked assignment +
seed noise model: tests/search/stats/test_blocked.py).

Known cases are checked against hand-computed values; calibration (false-positive rate,
power, interval coverage) against seeded simulations of the model the statistics assume.
"""

from __future__ import annotations

import math
import random
import re

import numpy as np
import pytest

from geosearch.search.stats.pooled import main_effects, seed_noise
from geosearch.search.stats.scores import (
    Point,
    Score,
    compare,
    detectable_gap,
    t_quantile,
    welch_df,
)


def _t_cdf(x: float, df: float, steps: int = 4000) -> float:
    """Student-t CDF by Simpson's rule on the density (independent of scipy.stats.t)."""
    log_c = math.lgamma((df + 1) / 2) - math.lgamma(df / 2) - 0.5 * math.log(df * math.pi)
    f = [math.exp(log_c - (df + 1) / 2 * math.log1p((x * i / steps) ** 2 / df)) for i in range(steps + 1)]
    simpson = f[0] + f[-1] + 4 * sum(f[1:-1:2]) + 2 * sum(f[2:-1:2])
    return 0.5 + simpson * (x / steps) / 3


# --------------------------------------------------------------------------- scores
def test_score_mean_std_and_se():
    s = Score((3.0, 3.2, 3.4))
    assert s.mean == pytest.approx(3.2)
    assert s.std == pytest.approx(0.2)  # sample std, ddof=1
    assert s.se == pytest.approx(0.2 / math.sqrt(3))
    assert Score((3.0,)).std is None and Score((3.0,)).se is None  # one seed: no spread, not zero
    # non-finite or missing seeds are dropped, not averaged in
    kept = Score.of([3.0, 3.2, 3.1, float("nan"), None])
    assert kept.n == 3 and kept.mean == pytest.approx(3.1) and kept.std == pytest.approx(0.1)
    assert Score.of([]).n == 0 and Score.of([]).text() == "—"


def test_score_keeps_each_value_with_its_seed():
    # a dropped value takes its seed with it, so the remaining pairs stay aligned
    s = Score.of([3.0, float("nan"), 3.2], seeds=[10, 11, 12])
    assert s.values == (3.0, 3.2) and s.seeds == (10, 12)
    # seeds that cannot be matched one to one with the values are not kept
    assert Score.of([3.0, 3.2], seeds=[1]).seeds is None
    assert Score.of([3.0, 3.2], seeds=[1, 1]).seeds is None
    # differences are taken at shared seeds only, in seed order, other minus self
    a = Score((3.0, 3.1, 3.2), seeds=(2, 0, 1))
    b = Score((4.0, 4.5), seeds=(1, 3))
    assert a.differences(b) == [pytest.approx(0.8)]  # seed 1 only
    assert a.differences(Score((3.0, 3.1, 3.2))) == []  # no seeds: nothing to pair


# --------------------------------------------------------------------------- quantiles
def test_t_quantile_is_exact_at_fractional_df():
    # the tabulated two-sided 95% values at integer df
    for df, t in ((1, 12.706), (2, 4.303), (3, 3.182), (4, 2.776), (30, 2.042)):
        assert t_quantile(df) == pytest.approx(t, abs=1e-3)
    assert t_quantile(math.inf) == pytest.approx(1.95996, abs=1e-5)
    # at fractional df the CDF at the quantile is 0.975 (integrated independently of scipy),
    # and the quantile lies strictly between its integer neighbours: no flooring to the lower df
    for df in (1.3, 1.7, 49 / 17, 7.5):
        q = t_quantile(df)
        assert _t_cdf(q, df) == pytest.approx(0.975, abs=1e-7)
        assert t_quantile(math.ceil(df)) < q < t_quantile(math.floor(df))
    with pytest.raises(ValueError, match="degrees of freedom must be positive but got 0"):
        t_quantile(0)


def test_welch_uses_the_exact_satterthwaite_df():
    best, other = Score((3.0, 3.2)), Score((3.1, 3.5, 3.3))
    # se² = 0.02/2 = 1/100 and 0.04/3 = 1/75: df = (7/300)² / ((1/100)²/1 + (1/75)²/2) = 49/17
    assert welch_df(best, other) == pytest.approx(49 / 17, rel=1e-12)
    c = compare(best, other)
    assert c.test == "welch" and c.df == pytest.approx(49 / 17)
    assert c.threshold == pytest.approx(t_quantile(49 / 17) * math.sqrt(1 / 100 + 1 / 75), rel=1e-12)
    # the old table floored df 2.88 to 2 (t = 4.303); the exact quantile is smaller
    assert t_quantile(49 / 17) == pytest.approx(3.2572, abs=1e-4) and t_quantile(49 / 17) < 4.303


# --------------------------------------------------------------------------- comparisons
SEED_EFFECT = (0.0, 0.5, -0.4)  # init and data order move every assignment by the same amount


def test_paired_test_separates_what_welch_cannot_when_seeds_are_shared():
    seeds = (0, 1, 2)
    best = Score(tuple(3.00 + s + e for s, e in zip(SEED_EFFECT, (0.004, -0.003, 0.001))), seeds)
    other = Score(tuple(3.05 + s + e for s, e in zip(SEED_EFFECT, (-0.002, 0.003, 0.000))), seeds)
    paired = compare(best, other)
    # per-seed differences 0.044, 0.056, 0.049: the seed effect cancels
    d = [0.044, 0.056, 0.049]
    sd = float(np.std(d, ddof=1))
    assert paired.test == "paired" and paired.n == 3 and paired.df == 2
    assert paired.diff == pytest.approx(np.mean(d)) and paired.threshold == pytest.approx(4.3027 * sd / math.sqrt(3), rel=1e-4)
    assert paired.verdict == "separated"
    # the same values without seeds: Welch counts the seed effect (sd ≈ 0.45) as noise: a tie
    welch = compare(Score(best.values), Score(other.values))
    assert welch.test == "welch" and welch.verdict == "tie" and welch.threshold > 10 * paired.threshold
    # seeds that do not match: the fallback is Welch, not a pairing of unrelated runs
    assert compare(best, Score(other.values, (3, 4, 5))).test == "welch"
    # two of three seeds shared: paired on those two (df 1)
    part = compare(best, Score(other.values, (5, 1, 2)))
    assert part.test == "paired" and part.n == 2 and part.df == 1


def test_paired_test_rejects_an_equal_pair_five_percent_of_the_time():
    # under the null (same assignment twice, big shared seed effect), |Δ| > threshold in
    # 5% of studies: the exact quantile is calibrated at 3 seeds (df 2)
    rng = random.Random(0)
    hits, sims = 0, 3000
    for _ in range(sims):
        seed = [rng.gauss(0, 0.5) for _ in range(3)]
        a = Score(tuple(3 + s + rng.gauss(0, 0.01) for s in seed), (0, 1, 2))
        b = Score(tuple(3 + s + rng.gauss(0, 0.01) for s in seed), (0, 1, 2))
        c = compare(a, b)
        hits += abs(c.diff) > c.threshold
    assert 0.04 < hits / sims < 0.06


def test_no_spread_is_unknown_and_rounding_is_not_noise():
    assert compare(Score((3.0,), (0,)), Score((3.4,), (0,))).verdict == "unknown"
    # the same gap in every seed up to float rounding: no noise, so separated at threshold 0
    noise = (0.0, 0.02, -0.02)
    c = compare(Score(tuple(3.0 + x for x in noise), (0, 1, 2)), Score(tuple(3.01 + x for x in noise), (0, 1, 2)))
    assert c.threshold == 0 and c.verdict == "separated"
    # an exact zero gap with no spread is a tie, not a separation
    assert compare(Score((3.0, 3.0), (0, 1)), Score((3.0, 3.0), (0, 1))).verdict == "tie"


# --------------------------------------------------------------------------- noise, power
def test_seed_noise_is_the_residual_of_trial_plus_seed():
    rng = np.random.default_rng(0)
    y = 3 + rng.normal(0, 0.2, (4, 1)) + rng.normal(0, 0.5, (1, 3)) + rng.normal(0, 0.01, (4, 3))
    scores = [Score(tuple(row), (0, 1, 2)) for row in y]
    # balanced two-way layout: Σ(y - ȳ_trial - ȳ_seed + ȳ)² / ((T-1)(S-1))
    resid = y - y.mean(1, keepdims=True) - y.mean(0, keepdims=True) + y.mean()
    noise = seed_noise(scores)
    assert noise.blocked and noise.df == 6
    assert noise.sd == pytest.approx(math.sqrt((resid ** 2).sum() / 6), rel=1e-9)
    assert noise.sd < 0.03  # the seed effect (sd 0.5) is not counted as noise
    # without seeds: the pooled within-trial spread, which holds the seed effect
    plain = seed_noise([Score(s.values) for s in scores])
    assert not plain.blocked and plain.df == 8
    assert plain.sd == pytest.approx(math.sqrt(np.mean(y.var(1, ddof=1))), rel=1e-9) and plain.sd > 0.2
    # unbalanced seeds still fit (a trial with one seed adds nothing to the residual)
    extra = seed_noise(scores + [Score((3.3,), (1,))])
    assert extra.df == 6 and extra.sd == pytest.approx(noise.sd)
    # one seed each: no residual degree of freedom
    assert seed_noise([Score((3.0,), (0,)), Score((3.1,), (0,))]) is None


def test_detectable_gap_has_the_stated_power():
    # many df: the normal-theory (z₀.₉₇₅ + z₀.₈)·se
    assert detectable_gap(1.0, 1e7) == pytest.approx(1.95996 + 0.84162, rel=1e-4)
    # 3 seeds, paired differences of sd 1: a true gap of that size is detected in 80% of
    # simulated studies by the paired t-test at 5%
    gap = detectable_gap(1 / math.sqrt(3), 2)
    d = np.random.default_rng(1).normal(gap, 1.0, (20000, 3))
    t = d.mean(1) / (d.std(1, ddof=1) / math.sqrt(3))
    assert np.mean(np.abs(t) > t_quantile(2)) == pytest.approx(0.80, abs=0.01)
    # more seeds, smaller detectable gap; no noise, no gap
    assert detectable_gap(1 / math.sqrt(5), 4) < gap and detectable_gap(0.0, 2) == 0.0


def test_detectable_gap_with_the_blocked_df_is_smaller():
    # 4 × 2 seeds at σ = 0.01: the same se σ·√(2/2), df 3 (blocked) against df 1 (one pair)
    blocked, paired = detectable_gap(0.01, 3), detectable_gap(0.01, 1)
    assert blocked < paired / 3.5  # the 0.044 against 0.168
    assert blocked == pytest.approx(0.0426, abs=1e-4) and paired == pytest.approx(0.1633, abs=1e-4)


# --------------------------------------------------------------------------- main effects
def _factorial(rng: random.Random, attn_effect: float, seeds: int, mlp_effect: float = 0.03):
    """A 2×2 study: loss = 3 + attn_effect·[attn=dgram] + mlp_effect·[mlp=dgram]
    + seed effect (sd 0.3, shared by all assignments) + run noise (sd 0.01)."""
    seed = [rng.gauss(0, 0.3) for _ in range(seeds)]
    cells = []
    for attn in ("dgram", "stiefel"):
        for mlp in ("dgram", "stiefel"):
            mean = 3 + attn_effect * (attn == "dgram") + mlp_effect * (mlp == "dgram")
            values = tuple(mean + s + rng.gauss(0, 0.01) for s in seed)
            cells.append((Point({"attn": attn, "mlp": mlp}), Score(values, tuple(range(seeds)))))
    return cells


def test_main_effect_on_known_pairs():
    # pair 1 (mlp=dgram): dgram - stiefel = 0.07, 0.09; pair 2 (mlp=stiefel): 0.08, 0.08
    cells = [(Point({"attn": "stiefel", "mlp": "dgram"}), Score((3.00, 3.50), (0, 1))),
             (Point({"attn": "dgram", "mlp": "dgram"}), Score((3.07, 3.59), (0, 1))),
             (Point({"attn": "stiefel", "mlp": "stiefel"}), Score((3.10, 3.60), (0, 1))),
             (Point({"attn": "dgram", "mlp": "stiefel"}), Score((3.18, 3.68), (0, 1)))]
    attn = next(e for e in main_effects(cells, blocked=False) if e.factor == "attn")
    # effect 0.08; pooled variance (0.01² + 0.01²)/2 at df 2; se = √(1e-4·(1/2 + 1/2))/2 = 0.005
    assert (attn.better, attn.worse, attn.df, attn.seeds) == ("stiefel", "dgram", 2, (2, 2))
    assert not attn.blocked
    assert attn.effect == pytest.approx(0.08) and attn.half_width == pytest.approx(4.3027 * 0.005, rel=1e-4)
    assert attn.decisive
    assert attn.text() == ("attention's geometry: stiefel better than dgram by 0.0800 ± 0.0215 "
                           "(95% CI, 2 seeds × 2 pairs)")
    # MLP: stiefel - dgram = +0.10, +0.10 and +0.11, +0.09: dgram better by 0.10
    mlp = next(e for e in main_effects(cells, blocked=False) if e.factor == "mlp")
    assert (mlp.better, mlp.worse) == ("dgram", "stiefel") and mlp.effect == pytest.approx(0.10)


def test_main_effect_is_a_contrast_of_the_blocked_fit():
    # the same cells as above, as a 4 × 2 table (rows: s/d, d/d, s/s, d/s; seed 1 adds 0.5)
    y = np.array([[3.00, 3.50], [3.07, 3.59], [3.10, 3.60], [3.18, 3.68]])
    levels = [("stiefel", "dgram"), ("dgram", "dgram"), ("stiefel", "stiefel"), ("dgram", "stiefel")]
    cells = [(Point({"attn": a, "mlp": m}), Score(tuple(row), (0, 1))) for (a, m), row in zip(levels, y)]
    attn = next(e for e in main_effects(cells) if e.factor == "attn")
    # residuals of the two-way table y − ȳ_a − ȳ_s + ȳ: ±0.0025 in three rows, ±0.0075 in
    # row d/d, so σ² = (6·0.0025² + 2·0.0075²)/3 = 5e-5 at df 3; the contrast
    # (α₂ − α₁ + α₄ − α₃)/2 has variance σ²/S·Σc² = σ²/2
    resid = y - y.mean(1, keepdims=True) - y.mean(0, keepdims=True) + y.mean()
    sigma = math.sqrt((resid ** 2).sum() / 3)
    assert sigma == pytest.approx(math.sqrt(5e-5))
    assert attn.blocked and attn.df == 3 and attn.seeds == (2, 2)
    assert attn.effect == pytest.approx(0.08) and attn.half_width == pytest.approx(t_quantile(3) * sigma / math.sqrt(2))
    assert attn.text() == ("attention's geometry: stiefel better than dgram by 0.0800 ± 0.0159 "
                           "(95% CI, 2 seeds × 2 pairs)")
    # one seed per cell: no residual df, so the matched-pairs logic (no interval) as before
    one = main_effects([(p, Score(s.values[:1], (0,))) for p, s in cells])
    assert all(not e.blocked and e.half_width is None for e in one)


def test_main_effect_pairs_only_points_that_differ_in_that_factor():
    s = (0, 1)
    cells = [(Point({"attn": "stiefel", "mlp": "dgram"}, (("lr", 0.01),)), Score((3.0, 3.1), s)),
             (Point({"attn": "dgram", "mlp": "dgram"}, (("lr", 0.02),)), Score((3.5, 3.6), s)),  # other lr
             (Point({"attn": "dgram", "mlp": "stiefel"}, (("lr", 0.01),)), Score((3.5, 3.6), s)),  # other mlp
             (Point({"attn": "euclidean", "mlp": "dgram"}, (("lr", 0.01),)), Score((3.2, 3.4), s))]
    effects = main_effects(cells)
    # only stiefel vs euclidean (same mlp, same lr) is a matched pair; mlp never varies alone
    assert [(e.factor, e.better, e.worse) for e in effects] == [("attn", "stiefel", "euclidean")]
    # one seed per pair: an estimate, but no interval
    one = main_effects([(Point({"attn": "a"}), Score((3.0,), (0,))), (Point({"attn": "b"}), Score((3.2,), (0,)))])
    assert one[0].half_width is None and not one[0].decisive and "spread unknown" in one[0].text()


@pytest.mark.parametrize("blocked", [True, False])
@pytest.mark.parametrize("truth", [0.08, 0.0])
def test_main_effect_interval_covers_the_truth(truth, blocked):
    # 300 simulated 2×2 studies with 3 seeds: the 95% interval covers the true attention
    # effect in about 95% of them (binomial sd 1.3%), whatever the seed effect, from the
    # blocked fit of all cells as from the matched pairs alone
    rng = random.Random(7)
    covered, right_sign = 0, 0
    for _ in range(300):
        effects = main_effects(_factorial(rng, truth, seeds=3), blocked=blocked)
        attn = next(e for e in effects if e.factor == "attn")
        assert attn.blocked == blocked
        signed = attn.effect if attn.better == "stiefel" else -attn.effect
        covered += abs(signed - truth) <= attn.half_width
        right_sign += attn.decisive and signed > 0
    assert 0.91 <= covered / 300 <= 0.99
    if truth:  # 0.08 is 8× the run noise: the interval excludes zero, on the right side, every time
        assert right_sign == 300


def test_main_effect_with_two_seeds_is_decisive_where_cells_tie():
    # the case: 2 seeds, attention's effect 0.08 with the same sign in both seeds
    rng = random.Random(3)
    cells = _factorial(rng, 0.08, seeds=2)
    attn = next(e for e in main_effects(cells) if e.factor == "attn")
    assert attn.decisive and attn.better == "stiefel"
    assert attn.half_width < 0.08 and re.fullmatch(
        r"attention's geometry: stiefel better than dgram by 0\.0\d{3} ± 0\.0\d{3} "
        r"\(95% CI, 2 seeds × 2 pairs\)", attn.text())
    # while the Welch comparison of the two best cells cannot separate anything at this seed spread
    ranked = sorted(cells, key=lambda c: c[1].mean)
    assert compare(Score(ranked[0][1].values), Score(ranked[-1][1].values)).verdict == "tie"
