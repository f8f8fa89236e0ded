"""Tests of geosearch.search.stats.trials: a trial read as a score (its adaptive-seed trials
merged in), a point and a line. The ranking of what is read here is tested in
tests/search/stats/test_ranking.py.
"""

from __future__ import annotations

import pytest


def test_point_scores_merge_seed_trials_each_seed_once_and_skip_baselines():
    from optuna.distributions import CategoricalDistribution
    from optuna.trial import TrialState, create_trial

    from geosearch.search.stats.trials import point_scores

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


def test_every_ms_per_step_ratio_is_to_one_stated_baseline():
    from geosearch.search.stats.trials import step_cost

    # AdamW first (the mean of the all-adamw runs), else Muon, else the fastest trial
    both = step_cost([(0, "stiefel", "a", 30.0), (1, "adamw", "b", 10.0), (2, "adamw", "c", 20.0),
                      (3, "euclidean", "d", 5.0)])
    assert (both.name, both.trials, both.ms) == ("AdamW", (1, 2), 15.0)
    assert both.ratios == {0: 2.0, 1: 10 / 15, 2: 20 / 15, 3: 5 / 15}
    muon = step_cost([(0, None, "a", 30.0), (3, "euclidean", "d", 10.0)])
    assert (muon.name, muon.ratios[0]) == ("Muon", 3.0)
    none = step_cost([(0, None, "a", 30.0), (1, None, "b", 20.0), (2, None, "c", float("nan"))])
    assert none.name == "trial 1" and none.baseline.startswith("the fastest trial (b, trial 1)")
    assert none.ratios == {0: 1.5, 1: 1.0}
    assert step_cost([]).ms is None
