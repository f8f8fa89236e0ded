"""Tests of geosearch.search.stats.ranking: the ranked table, its one-line verdict (the one the
search prints, the export records and report.md shows), and the adaptive-seed plan made
from it (``geosearch.search.stats.seeding.seed_plan``, tested here on these rankings).

The statistics underneath (paired/Welch tests, main effects, detectable gap) are tested in
tests/search/stats/test_scores.py, the blocked assignment + seed fit in test_blocked.py and
the reading of trials in test_trials.py; here, that the ranking uses them and says so.
"""

from __future__ import annotations

import math

import optuna
import pytest
from optuna.distributions import CategoricalDistribution

from geosearch.search.stats.blocked import blocked_fit
from geosearch.search.stats.ranking import compare_scores, rank_scores
from geosearch.search.stats.study_ranking import rank_study
from geosearch.search.stats.track import ORDER_RECORD
from geosearch.search.stats.seeding import seed_plan
from geosearch.search.stats.pooled import seed_noise
from geosearch.search.stats.scores import Point, Score, detectable_gap, t_quantile
from geosearch.search.stats.trials import trial_factors, trial_score

optuna.logging.set_verbosity(optuna.logging.WARNING)

# 2×2 study, 2 seeds (seed 1 adds 0.4 to every assignment): attention Stiefel is ahead by
# 0.08 and 0.07-0.08 in both seeds of both pairs, the MLP's geometry barely matters. As a
# 4 × 2 table its residual σ is 0.0106 at df 3 (y − ȳ_a − ȳ_s + ȳ = ±0.00625 twice, ±0.00375
# and ±0.00875: Σ of squares 3.375e-4)
TWO_BY_TWO = {
    ("stiefel", "stiefel"): (3.00, 3.41),
    ("stiefel", "dgram"): (3.02, 3.41),
    ("dgram", "stiefel"): (3.08, 3.49),
    ("dgram", "dgram"): (3.10, 3.48),
}


def _entries():
    entries, points = [], {}
    for n, ((attn, mlp), values) in enumerate(TWO_BY_TWO.items()):
        entries.append((n, f"attn={attn}, mlp={mlp}", Score(values, (0, 1))))
        points[n] = Point({"attn": attn, "mlp": mlp})
    return entries, points


def _study() -> optuna.Study:
    study = optuna.create_study()
    dists = {k: CategoricalDistribution(["stiefel", "dgram"]) for k in ("geometry.attn", "geometry.mlp")}
    for (attn, mlp), values in TWO_BY_TWO.items():
        study.add_trial(optuna.trial.create_trial(
            value=sum(values) / 2, params={"geometry.attn": attn, "geometry.mlp": mlp}, distributions=dists,
            user_attrs={"val_losses": list(values), "seeds": [0, 1]}))
    return study


# --------------------------------------------------------------------------- the verdict
def test_compare_scores_is_a_welch_t_test():
    best = Score((3.00, 3.02, 2.98))
    # Δ = 0.01, se = 0.01155 each: threshold = t(df=4)=2.776 * sqrt(2)*0.01155 = 0.0453 → tie
    verdict, threshold = compare_scores(best, Score((3.01, 3.03, 2.99)))
    assert verdict == "tie" and threshold == pytest.approx(2.776 * math.sqrt(2) * 0.02 / math.sqrt(3), rel=1e-3)
    # Δ = 0.1 is far beyond the same threshold → separated
    assert compare_scores(best, Score((3.10, 3.12, 3.08)))[0] == "separated"
    # Δ = 0.04 would pass a plain 2·SE rule (0.0327) but not the t-test at 2+2 dof (0.0453)
    assert compare_scores(best, Score((3.04, 3.06, 3.02)))[0] == "tie"
    # one seed on either side: the spread is unknown, so no verdict
    assert compare_scores(best, Score((3.4,))) == ("unknown", None)
    assert compare_scores(Score((3.0,)), Score((3.1,))) == ("unknown", None)
    # seeds that agree exactly: any gap is separated, and the verdict still reads (no 0/0)
    exact = rank_scores([(0, "attn=stiefel", Score((3.3,) * 3)), (1, "attn=dgram", Score((3.4,) * 3))])
    assert [r.versus_best for r in exact.rows] == ["best", "separated"] and exact.tied == [0]
    assert exact.verdict.startswith("winner: attn=stiefel") and "every seed of both agrees exactly" in exact.verdict


def test_ranking_names_ties_and_refuses_to_judge_without_spread():
    study = optuna.create_study()
    for losses in ([3.00, 3.02, 2.98], [3.01, 3.03, 2.99], [3.5, 3.52, 3.48]):
        study.add_trial(optuna.trial.create_trial(
            value=sum(losses) / 3, params={"geometry.attn": "x"},
            distributions={"geometry.attn": optuna.distributions.CategoricalDistribution(["x"])},
            user_attrs={"val_losses": losses}))
    r = rank_study(study)
    assert [row.number for row in r.rows] == [0, 1, 2]
    assert [row.versus_best for row in r.rows] == ["best", "tie", "separated"]
    assert r.tied == [0, 1] and r.verdict.startswith("no single winner")

    one_seed = optuna.create_study()
    for v in (3.0, 3.1):
        one_seed.add_trial(optuna.trial.create_trial(value=v, user_attrs={"val_losses": [v]}))
    verdict = rank_study(one_seed).verdict
    assert "cannot be judged" in verdict and "--repeats" in verdict  # no false winner

    # the runner-up is beaten beyond noise, but a one-seed trial further back has no spread:
    # its gap cannot be judged either, so still no winner is named
    mixed = rank_scores([(0, "a", Score((3.00, 3.02, 2.98))), (1, "b", Score((3.50, 3.52, 3.48))),
                         (2, "c", Score((3.6,)))])
    assert [r.versus_best for r in mixed.rows] == ["best", "separated", "unknown"]
    assert "cannot be judged" in mixed.verdict and not mixed.verdict.startswith("winner:")


def test_verdict_is_blocked_and_names_the_main_effect_and_the_detectable_gap():
    entries, points = _entries()
    r = rank_scores(entries, points)
    sigma = math.sqrt(3.375e-4 / 3)
    assert r.noise.df == 3 and r.noise.sd == pytest.approx(sigma)
    # blocked, df 3: threshold t(3)·σ·√(2/2) = 0.0338; trial 1 (+0.010) ties, trials 2 and 3
    # (+0.080, +0.085) are separated
    assert [row.versus_best for row in r.rows] == ["best", "tie", "separated", "separated"]
    assert all(row.comparison.test == "blocked" and row.comparison.df == 3 for row in r.rows[1:])
    assert [row.gap for row in r.rows[1:]] == pytest.approx([0.01, 0.08, 0.085])
    assert r.rows[1].threshold == pytest.approx(t_quantile(3) * sigma)
    assert r.verdict.startswith("no single winner: attn=stiefel, mlp=stiefel (trial 0")
    assert "blocked t-test (loss = assignment + seed + noise, df 3), 5%" in r.verdict
    # attention: (0.08 + 0.075)/2 = 0.0775 ± t(3)·σ/√2, the contrast of the same fit
    attn = next(e for e in r.effects if e.factor == "attn")
    assert attn.blocked and attn.half_width == pytest.approx(t_quantile(3) * sigma / math.sqrt(2))
    assert attn.decisive and attn.text() == ("attention's geometry: stiefel better than dgram by "
                                             "0.0775 ± 0.0239 (95% CI, 2 seeds × 2 pairs)")
    assert attn.text() in r.verdict
    # the MLP's effect is within noise: listed in effects, left out of the verdict
    mlp = next(e for e in r.effects if e.factor == "mlp")
    assert not mlp.decisive and "MLP" not in r.verdict
    # the smallest detectable gap: the blocked se of best vs runner-up, σ·√(2/2), at df 3
    gap = detectable_gap(sigma, 3)
    assert r.sensitivity.gap == pytest.approx(gap) and r.sensitivity.seeds == 2
    assert r.sensitivity.gap < detectable_gap(sigma, 1) / 3.5
    assert f"gaps below {gap:.4f} could not be reliably detected with 2 seeds" in r.verdict
    # one line: the CLI prints it after "verdict: " and report.md after "**Verdict:**"
    assert "\n" not in r.verdict


def test_paired_df_1_ties_what_the_blocked_model_separates():
    entries, points = _entries()
    blocked, paired = rank_scores(entries, points), rank_scores(entries, points, blocked=False)
    # without the fit: one pair's paired t-test at df 1 (t₀.₉₇₅ = 12.7) ties trial 3, 0.085
    # behind in both seeds, and states the detectable gap at df 1
    assert [row.versus_best for row in paired.rows] == ["best", "tie", "separated", "tie"]
    assert all(row.comparison.test == "paired" and row.comparison.df == 1 for row in paired.rows[1:])
    assert "paired t-test on the seeds both ran, 5%" in paired.verdict and paired.noise is None
    assert blocked.rows[3].versus_best == "separated" and blocked.rows[3].gap == pytest.approx(paired.rows[3].gap)
    assert paired.sensitivity.gap == pytest.approx(detectable_gap(seed_noise([s for _, _, s in entries]).sd, 1))
    assert blocked.sensitivity.gap < paired.sensitivity.gap / 3.5
    # the matched-pairs main effect, as before the fit: pairs (0.08, 0.08) and (0.08, 0.07)
    attn = next(e for e in paired.effects if e.factor == "attn")
    assert not attn.blocked and attn.text() == ("attention's geometry: stiefel better than dgram by "
                                                "0.0775 ± 0.0108 (95% CI, 2 seeds × 2 pairs)")


def test_verdict_gives_each_adjacent_pair_with_its_interval_and_the_benchmark_record():
    entries, points = _entries()
    r = rank_scores(entries, points)
    # down to the last contender (#2, tied with the best) and the one after it
    assert [(p.rank, p.upper, p.lower) for p in r.pairs] == [(1, 0, 1), (2, 1, 2)]
    first, second = r.pairs
    assert first.comparison.verdict == "tie" and second.comparison.verdict == "separated"
    half = t_quantile(3) * math.sqrt(3.375e-4 / 3)
    assert second.comparison.interval == pytest.approx((0.07 - half, 0.07 + half))
    assert first.text() == ("#1 trial 0 vs #2 trial 1: gap 0.0100 (< 0.02: in the benchmark such gaps "
                            "kept their order at 2,000 steps 4 of 9 times), 95% CI [-0.0238, 0.0438], "
                            "not separated")
    assert second.text() == ("#2 trial 1 vs #3 trial 2: gap 0.0700 (≥ 0.02: in the benchmark such gaps "
                             "kept their order at 2,000 steps 13 of 15 times), 95% CI [0.0362, 0.1038], "
                             "separated")
    assert f"ranked pairs: {first.text()}; {second.text()}" in r.verdict
    # the benchmark's record is one constant: pairs ≥ 0.02 apart kept their order 13 of 15 times
    assert (ORDER_RECORD.at, ORDER_RECORD.far, ORDER_RECORD.near) == (0.02, (13, 15), (4, 9))
    assert ORDER_RECORD.text(-0.031).startswith("≥ 0.02") and ORDER_RECORD.text(0.0199).startswith("< 0.02")
    # a clear winner: the one pair below it, separated; one seed each: no interval, not judged
    far = rank_scores([(0, "a", Score((3.0, 3.1, 3.05), (0, 1, 2))), (1, "b", Score((3.5, 3.62, 3.55), (0, 1, 2))),
                       (2, "c", Score((3.9, 4.0, 3.97), (0, 1, 2)))])
    assert len(far.pairs) == 1 and far.pairs[0].comparison.verdict == "separated"
    one = rank_scores([(0, "a", Score((3.0,), (0,))), (1, "b", Score((3.1,), (0,)))])
    assert one.noise is None and one.pairs[0].text().endswith("not judged (no spread for a 95% interval)")
    # twelve within noise of each other: every pair in Ranking.pairs, the first 8 in the
    # one-line verdict
    many = rank_scores([(n, f"p{n}", Score((3.0 + 0.001 * n, 3.4 + 0.02 * (n % 3)), (0, 1))) for n in range(12)])
    assert len(many.pairs) == 11 and many.verdict.count(" vs #") == 8
    assert "3 more adjacent pairs down to the last contender, not listed" in many.verdict


def test_one_seed_each_falls_back_and_judges_nothing():
    r = rank_scores([(n, f"p{n}", Score((3.0 + 0.1 * n,), (0,))) for n in range(4)])
    assert r.noise is None and blocked_fit([row.score for row in r.rows]) is None
    assert [row.versus_best for row in r.rows] == ["best", "unknown", "unknown", "unknown"]
    assert all(row.comparison.test == "none" for row in r.rows[1:])
    assert "cannot be judged" in r.verdict and r.sensitivity is None
    # compare_scores takes the fit by keyword and keeps its meaning without it
    a, b, c = Score((3.0, 3.4), (0, 1)), Score((3.03, 3.43), (0, 1)), Score((3.1, 3.5), (0, 1))
    fit = blocked_fit([a, b, c])
    assert fit is not None and fit.sd == 0  # the same gap in both seeds, up to rounding
    assert compare_scores(a, b, blocked=fit) == ("separated", 0.0)
    assert compare_scores(a, b)[0] == "separated"


def test_a_constant_per_seed_gap_is_a_winner_and_says_why():
    noise = (0.0, 0.3, -0.2)  # the seed's effect, common to both
    r = rank_scores([(0, "a", Score(tuple(3.0 + x for x in noise), (0, 1, 2))),
                     (1, "b", Score(tuple(3.05 + x for x in noise), (0, 1, 2)))])
    assert r.verdict.startswith("winner: a") and "by the same amount in every seed" in r.verdict


# --------------------------------------------------------------------------- trials
def test_rank_study_pairs_seeds_and_reads_the_factors_of_each_trial():
    entries, points = _entries()
    # the study ranks, pairs and contrasts exactly as the hand-made entries
    assert rank_study(_study()).verdict == rank_scores(entries, points).verdict
    study = optuna.create_study()
    study.add_trial(optuna.trial.create_trial(value=3.1, user_attrs={
        "val_losses": [3.0, float("nan"), 3.2], "seeds": [4, 5, 6],
        "assignment": {"attn_qkv": "stiefel", "attn_out": "stiefel", "mlp_in": "dgram",
                       "mlp_out": "oblique", "embed": "euclidean"}}))
    trial = study.trials[0]
    # a non-finite seed is dropped with its seed
    assert trial_score(trial) == Score((3.0, 3.2), (4, 6))
    # factors from the assignment when no geometry.* params: each family, mixed spelled out
    assert trial_factors(trial).levels == {"attn": "stiefel", "mlp": "mixed: in=dgram,out=oblique",
                                         "embed": "euclidean"}


# --------------------------------------------------------------------------- adaptive seeds
def test_seed_plan_gives_seeds_to_the_contenders_until_separated_or_budget_spent():
    entries, points = _entries()
    plan = seed_plan(rank_scores(entries, points), max_seeds=4)
    # the best and the one within noise of it get seed 2; the separated ones get none
    assert not plan.stop and plan.rerun == [0, 1] and plan.next_seed == {0: 2, 1: 2}
    # paired per pair (df 1), trial 3 is still within noise and would get a seed too
    assert seed_plan(rank_scores(entries, points, blocked=False), max_seeds=4).rerun == [0, 1, 3]
    # at the budget: stop, and say that they are still tied
    assert seed_plan(rank_scores(entries, points), max_seeds=2).stop
    assert "budget spent: 2 assignments" in seed_plan(rank_scores(entries, points), max_seeds=2).reason
    # separated from all: stop
    far = rank_scores([(0, "a", Score((3.0, 3.1), (0, 1))), (1, "b", Score((4.0, 4.1), (0, 1)))])
    assert far.rows[1].versus_best == "separated"
    done = seed_plan(far, max_seeds=5)
    assert done.stop and done.rerun == [] and done.reason.startswith("separated")
    # a contender that missed a seed the others ran gets that one first, so runs stay paired;
    # one seed is "unknown", hence still a contender
    uneven = rank_scores([(0, "a", Score((3.0, 3.1, 3.0), (0, 1, 2))), (1, "b", Score((3.05,), (0,)))])
    assert seed_plan(uneven, max_seeds=3).next_seed == {1: 1}
    assert seed_plan(rank_scores([]), max_seeds=3).stop


def test_the_gap_shown_is_the_one_the_paired_test_judged():
    # The best has a third (adaptive) seed; the runner-up shares seeds 0 and 1 with it.
    best = Score((2.4223 - 0.01, 2.4223 + 0.01, 2.4615), (0, 1, 2))
    other = Score((2.4675 - 0.005, 2.4675 + 0.005), (0, 1))
    ranking = rank_scores([(0, "best", best), (1, "other", other)])
    row = ranking.rows[1]
    # Rule: the gap is the one the test judged: the blocked contrast, which for two
    # assignments is the mean per-seed difference on the shared seeds (0.0452; the seed only
    # the best ran is absorbed by its seed effect), not the difference of means over
    # unequal seed sets (0.0322), so it is comparable with the threshold printed beside it.
    assert row.comparison.test == "blocked" and row.comparison.df == 1
    assert row.gap == pytest.approx(0.0452) and row.gap != pytest.approx(other.mean - best.mean)
    paired = rank_scores([(0, "best", best), (1, "other", other)], blocked=False).rows[1]
    assert paired.comparison.test == "paired" and paired.gap == pytest.approx(row.gap)
    assert paired.threshold == pytest.approx(row.threshold)  # two assignments: the same test

