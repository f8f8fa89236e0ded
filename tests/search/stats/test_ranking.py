"""Tests of geosearch.search.stats.ranking: the ranked table, its one-line verdict (the one the
search prints, the export records and report.md shows), and the adaptive-seed plan made
from it (``geosearch.search.stats.seeding.seed_plan``, tested here on these rankings).

The statistics underneath (paired/Welch tests, main effects, detectable gap) are tested
in tests/search/stats/test_scores.py; here, that the ranking uses them and says so.
"""

from __future__ import annotations

import math

import optuna
import pytest
from optuna.distributions import CategoricalDistribution

from geosearch.search.stats.ranking import (
    compare_scores,
    rank_scores,
    rank_study,
    trial_factors,
    trial_score,
)
from geosearch.search.stats.seeding import seed_plan
from geosearch.search.stats.scores import Point, Score, detectable_gap, seed_noise

optuna.logging.set_verbosity(optuna.logging.WARNING)

# 2×2 study, 2 seeds (seed 1 adds 0.4 to every assignment): attention Stiefel is ahead by
# 0.08 and 0.07-0.08 in both seeds of both pairs, the MLP's geometry barely matters
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


def test_verdict_names_the_main_effect_the_cells_cannot_and_the_detectable_gap():
    entries, points = _entries()
    r = rank_scores(entries, points)
    # paired, 2 seeds (df 1): no cell is separated from the best except the one whose gap is
    # 0.08 in both seeds; the tied ones are named
    assert [row.versus_best for row in r.rows] == ["best", "tie", "separated", "tie"]
    assert all(row.comparison.test == "paired" and row.comparison.df == 1 for row in r.rows[1:])
    assert r.verdict.startswith("no single winner: attn=stiefel, mlp=stiefel (trial 0")
    assert "paired t-test on the seeds both ran, 5%" in r.verdict
    # attention: pairs (0.08, 0.08) and (0.08, 0.07): 0.0775 ± t(2)·0.0025 = 0.0108, in the verdict
    attn = next(e for e in r.effects if e.factor == "attn")
    assert attn.decisive and attn.text() == ("attention's geometry: stiefel better than dgram by "
                                             "0.0775 ± 0.0108 (95% CI, 2 seeds × 2 pairs)")
    assert attn.text() in r.verdict
    # the MLP's effect is within noise: listed in effects, left out of the verdict
    mlp = next(e for e in r.effects if e.factor == "mlp")
    assert not mlp.decisive and "MLP" not in r.verdict
    # the smallest detectable gap: paired test of the best vs the runner-up (2 seeds, df 1)
    # at the pooled trial + seed residual noise, se = sd·√(2/2)
    noise = seed_noise([s for _, _, s in entries])
    gap = detectable_gap(noise.sd, 1)
    assert r.sensitivity.gap == pytest.approx(gap) and r.sensitivity.seeds == 2
    assert f"gaps below {gap:.4f} could not be reliably detected with 2 seeds" in r.verdict
    # one line: the CLI prints it after "verdict: " and report.md after "**Verdict:**"
    assert "\n" not in r.verdict


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
    # the best and the two within noise of it get seed 2; the separated one gets none
    assert not plan.stop and plan.rerun == [0, 1, 3] and plan.next_seed == {0: 2, 1: 2, 3: 2}
    # at the budget: stop, and say that they are still tied
    assert seed_plan(rank_scores(entries, points), max_seeds=2).stop
    assert "budget spent: 3 assignments" in seed_plan(rank_scores(entries, points), max_seeds=2).reason
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


def test_point_scores_merge_seed_trials_each_seed_once_and_skip_baselines():
    from optuna.distributions import CategoricalDistribution
    from optuna.trial import TrialState, create_trial

    from geosearch.search.stats.ranking import point_scores

    dist = {"geometry.attn": CategoricalDistribution(["stiefel", "dgram"])}

    def trial(number, value, attrs, params=None, state=TrialState.COMPLETE):
        t = create_trial(state=state, value=value if state == TrialState.COMPLETE else None,
                         params=params if params is not None else {"geometry.attn": "stiefel"},
                         distributions=dist if params is None else {}, user_attrs=attrs)
        t.number = number
        return t

    point = trial(0, 3.01, {"val_losses": [3.0, 3.02], "seeds": [0, 1]})
    extra = trial(1, 2.99, {"val_losses": [2.99], "seeds": [2], "seed_of": 0})
    again = trial(2, 5.0, {"val_losses": [5.0], "seeds": [2], "seed_of": 0})  # a twin: seed 2 once
    pruned = trial(3, None, {"val_losses": [9.0], "seeds": [3], "seed_of": 0}, state=TrialState.PRUNED)
    base = trial(4, 3.5, {"val_losses": [3.5, 3.6], "seeds": [0, 1], "baseline": "adamw"}, params={})
    scores = point_scores([point, extra, again, pruned, base])
    assert set(scores) == {0}
    assert scores[0].seeds == (0, 1, 2) and scores[0].values == pytest.approx((3.0, 3.02, 2.99))


def test_the_gap_shown_is_the_one_the_paired_test_judged():
    # The best has a third (adaptive) seed; the runner-up shares seeds 0 and 1 with it.
    best = Score((2.4223 - 0.01, 2.4223 + 0.01, 2.4615), (0, 1, 2))
    other = Score((2.4675 - 0.005, 2.4675 + 0.005), (0, 1))
    ranking = rank_scores([(0, "best", best), (1, "other", other)])
    row = ranking.rows[1]
    # Rule: the gap is the mean per-seed difference on the shared seeds (0.0452), not the
    # difference of means over unequal seed sets (0.0322), so it is comparable with the
    # threshold printed beside it.
    assert row.comparison.test == "paired"
    assert row.gap == pytest.approx(0.0452) and row.gap != pytest.approx(other.mean - best.mean)
