"""The trials after the space's points: baselines, then rounds of adaptive seeds.

Once every point of the space has trained its ``repeats`` seeds (the queue holds no point,
the budget is reached), the trial loop calls :func:`queue_extras`: it queues the space's
baselines (:mod:`geosearch.search.study.baselines`) and, when no trial is queued or running,
ranks the study and queues one round of adaptive seeds
(:func:`geosearch.search.stats.seeding.study_seed_plan`): for each contender ``n`` the same point
with the attrs ``seed_of = n``, ``seeds = [s]``. A seed trial trains that one seed at the
ladder's top rung only, where the ranking is read (:func:`extra_plan`); its value merges
into trial ``n``'s score. Every step is keyed, so a rerun, a second process or a resumed
study queues nothing twice, and a (point, seed) that two processes queued at once trains
once (:func:`seed_twin_of`). The rules are in ``docs/design.md`` ("Adaptive seeds").
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import optuna
from optuna.trial import TrialState

from geosearch.search.space.baselines import baseline_rungs
from geosearch.search.study.baselines import queue_baselines
from geosearch.search.horizon.ladder import Rung
from geosearch.search.study.queue import enqueue
from geosearch.search.stats.ranking import rank_study
from geosearch.search.records import (
    BASELINE,
    SEED_OF,
    SEEDS,
    FINISHED,
    is_extra,
    trial_status,
)
from geosearch.search.stats.seeding import study_seed_plan

if TYPE_CHECKING:  # pragma: no cover
    from geosearch.search.space.spec import SearchSpace

__all__ = ["NOT_A_POINT", "extra_plan", "mark_extra", "queue_extras", "seed_twin_of"]

NOT_A_POINT = "not_a_point"
"""The Optuna constraint that makes a baseline or an adaptive-seed trial infeasible."""


def mark_extra(trial: optuna.Trial) -> None:
    """Make a baseline or an adaptive-seed trial infeasible in Optuna's sense (the constraint
    ``not_a_point`` = 1; a trial is feasible when every constraint is <= 0), so that
    ``study.best_trial``, ``optuna best-trial`` and the dashboard's best trial, which choose
    among feasible trials, only ever name a point of the space: a baseline is a reference,
    and a seed trial's value is one seed, not its point's score. Samplers ignore constraints
    unless given a ``constraints_func``, so the search itself is unchanged."""
    trial.set_constraint(NOT_A_POINT, 1.0)


def queue_extras(study: optuna.Study, space: SearchSpace, echo: Callable[[str], None]) -> bool:
    """Queue what the study trains after its points; whether an extra trial now waits.

    A waiting baseline or seed trial is trained first; missing baselines are queued next;
    a round of seeds is planned only when nothing is queued or running (a seed trial or a
    point training elsewhere: whoever finishes last plans the next round).
    """
    trials = study.get_trials(deepcopy=False)
    if any(t.state == TrialState.WAITING and is_extra(t) for t in trials):
        return True
    queued = queue_baselines(study, space)
    if queued:
        echo(f"baselines queued (reported, never exported): {', '.join(queued)}")
        return True
    if any(t.state == TrialState.RUNNING for t in trials):
        return False
    plan = study_seed_plan(study, rank_study(study))
    if plan is None or plan.stop:
        return False
    points = {t.number: dict(t.params) for t in trials}
    for n in plan.rerun:
        enqueue(study, points[n], marks={SEED_OF: n, SEEDS: [plan.next_seed[n]]})
    echo(f"adaptive seeds: {plan.reason} (seeds "
         + ", ".join(f"{plan.next_seed[n]} for trial {n}" for n in plan.rerun) + ")")
    return True


def extra_plan(trial: optuna.Trial, seeds: list[int],
               rungs: Sequence[Rung]) -> tuple[list[int], list[Rung]]:
    """The seeds and rungs ``trial`` trains, given the study's: a seed trial its one seed
    at the top rung, a baseline its rungs (:func:`~geosearch.search.study.baselines.baseline_rungs`),
    a point of the space all of them."""
    ua = trial.user_attrs
    if SEED_OF in ua:
        return [int(s) for s in ua[SEEDS]], list(rungs[-1:])
    if BASELINE in ua:
        return list(seeds), baseline_rungs(ua[BASELINE], rungs)
    return list(seeds), list(rungs)


def seed_twin_of(study: optuna.Study, trial: optuna.Trial) -> int | None:
    """An earlier seed trial of the same (point, seed) that trained or is training, or
    ``None``: ``trial`` then trains (two processes may queue one round at once)."""
    ua = trial.user_attrs
    key = (ua.get(SEED_OF), tuple(ua.get(SEEDS) or ()))
    for t in study.get_trials(deepcopy=False):
        if t.number < trial.number and (t.user_attrs.get(SEED_OF), tuple(t.user_attrs.get(SEEDS) or ())) == key \
                and (t.state == TrialState.RUNNING or trial_status(t) in FINISHED):
            return t.number
    return None
