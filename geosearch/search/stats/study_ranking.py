"""A study's ranking read from its trials (:func:`rank_study`): the points with their adaptive
seeds merged (:func:`geosearch.search.stats.trials.point_scores`), ranked by
:func:`geosearch.search.stats.ranking.rank_scores`, or as the two answers of a step grid
(:func:`geosearch.search.stats.steps.step_ranking`), the verdict ending with how adaptive
seeding stands (:mod:`geosearch.search.stats.seeding`). The one entry point the search, the
export and the report rank a study through; it sits above every module it reads.
"""

from __future__ import annotations

import dataclasses

import optuna

from geosearch.search.records import STEP_FACTOR
from geosearch.search.stats.ranking import Ranking, rank_scores
from geosearch.search.stats.seeding import max_seeds, study_seed_plan
from geosearch.search.stats.steps import step_ranking
from geosearch.search.stats.trials import point_scores, trial_factors, trial_label

__all__ = ["rank_study"]


def rank_study(study: optuna.Study) -> Ranking:
    """Rank the completed points of ``study`` by mean final val loss, each with its adaptive
    seeds merged in (see the module docstring); with adaptive seeds on, the verdict ends
    with how many seeds each contender got and why seeding stopped (or what is pending)."""
    trials = study.get_trials(deepcopy=False)
    scores = point_scores(trials)
    done = [t for t in trials if t.number in scores]
    if any(STEP_FACTOR in t.params for t in done):
        ranking = step_ranking(study, trials, done, scores)
    else:
        ranking = rank_scores([(t.number, trial_label(t), scores[t.number]) for t in done],
                              {t.number: trial_factors(t) for t in done})
    plan = study_seed_plan(study, ranking)
    if plan is None or not ranking.rows:
        return ranking
    contenders = [r for r in ranking.rows if r.versus_best in ("best", "tie", "unknown")]
    seeds = ", ".join(f"trial {r.number}: {r.score.n}" for r in contenders)
    state = "stopped" if plan.stop else "not finished"
    note = (f"adaptive seeds (up to {max_seeds(study)} per assignment) {state}: {plan.reason}; "
            f"seeds per contender: {seeds}")
    return dataclasses.replace(ranking, verdict=f"{ranking.verdict}; {note}")
