"""The trials after the space's points: baselines, then rounds of adaptive seeds.

Once every point of the space has trained its ``repeats`` seeds (the queue holds no point,
the budget is reached), the trial loop calls :func:`queue_extras`: it queues the space's
baselines (:mod:`geosearch.search.study.baseline_trials`) and, when no trial is queued or running,
ranks the study and queues one round of adaptive seeds
(:func:`geosearch.search.stats.seeding.study_seed_plan`): for each contender ``n`` the same point
with the attrs ``seed_of = n``, ``seeds = [s]``. A seed trial trains that one seed at the
ladder's top rung only, where the ranking is read (:func:`extra_plan`); its value merges
into trial ``n``'s score. Every step is keyed, so a rerun, a second process or a resumed
study queues nothing twice, and a (point, seed) that two processes queued at once trains
once (:func:`seed_twin_of`). With a step grid searched by successive halving
(``hyperparams.step_halving``), a round of promotions comes first (:func:`queue_halving`):
every point and tuned baseline trained one seed away from the shared step, and the best
step of each assignment (and of each baseline) gets the rest of ``repeats``, as seed trials; a trial's stability rung is
taken from a larger step of the same assignment that passed it (:func:`passed_above`). The
rules are in ``docs/design.md`` ("Adaptive seeds", "Step halving").
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import optuna
from optuna.trial import TrialState

from geosearch.search.space.baseline_specs import baseline_rungs
from geosearch.search.study.baseline_trials import queue_baselines
from geosearch.search.horizon.ladder import Rung
from geosearch.search.study.queue import enqueue, param_key, trial_params
from geosearch.search.stats.study_ranking import rank_study
from geosearch.search.stats.scores import best_on_shared_seeds
from geosearch.search.stats.trials import trial_score
from geosearch.search.records import (
    BASELINE,
    COMPLETED,
    FINISHED,
    RUNNING,
    SEED_OF,
    SEEDS,
    STABILITY_PASSED_AT,
    STEP_FACTOR,
    WAITING,
    is_extra,
    trial_status,
)
from geosearch.search.stats.seeding import study_seed_plan

if TYPE_CHECKING:  # pragma: no cover
    from geosearch.search.space.spec import SearchSpace

__all__ = ["NOT_A_POINT", "extra_note", "extra_plan", "halving", "mark_extra", "passed_above",
           "queue_extras",
           "queue_halving", "seed_twin_of"]

NOT_A_POINT = "not_a_point"
"""The Optuna constraint that makes a baseline or an adaptive-seed trial infeasible."""


def mark_extra(trial: optuna.Trial) -> None:
    """Make a baseline or an adaptive-seed trial infeasible in Optuna's sense (the constraint
    ``not_a_point`` = 1; a trial is feasible when every constraint is <= 0), so that
    ``study.best_trial`` and ``optuna best-trial``, which choose among feasible trials, only
    ever name a point of the space: a baseline is a reference, and a seed trial's value is
    one seed, not its point's score. Samplers ignore constraints unless given a
    ``constraints_func``, so the search itself is unchanged. optuna-dashboard's "Best Trial"
    reads no constraints (the lowest completed value); with it installed, the trial gets a
    note saying what it is (:func:`extra_note`), which its trial page shows, and the
    search's summary names its best trial when that is not the winner
    (:func:`~geosearch.search.study.export.optuna_best_note`)."""
    trial.set_constraint(NOT_A_POINT, 1.0)
    try:
        from optuna_dashboard import save_note  # the optional `dashboard` extra
    except ImportError:
        return
    save_note(trial, extra_note(trial.user_attrs))


def extra_note(attrs: dict) -> str:
    """What a baseline or an adaptive-seed trial is, in one line (its dashboard note), from
    its user attrs: ``"baseline muon at step x2: a reference, not a point of the space; never
    exported"``, ``"seed 2 of trial 5: more seeds of its point, merged into that trial's
    score; not a point of its own, never exported"``."""
    factor = attrs.get(STEP_FACTOR)
    at = f" at step x{float(factor):g}" if isinstance(factor, (int, float)) else ""
    seeds = ", ".join(str(s) for s in attrs.get(SEEDS) or [])
    seed_word = "seeds" if "," in seeds else "seed"
    if SEED_OF in attrs and BASELINE in attrs:
        return (f"{seed_word} {seeds} of baseline {attrs[BASELINE]}{at} (trial {attrs[SEED_OF]}): "
                f"merged into that trial's score; a reference, never exported")
    if SEED_OF in attrs:
        return (f"{seed_word} {seeds} of trial {attrs[SEED_OF]}: more seeds of its point, merged "
                f"into that trial's score; not a point of its own, never exported")
    return (f"baseline {attrs.get(BASELINE)}{at}: a reference, not a point of the space; "
            "never exported")


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
    promoted = queue_halving(study, space)
    if promoted:
        echo("step halving: the other seed(s) for each best step that is not the shared one: "
             + ", ".join(promoted))
        return True
    plan = study_seed_plan(study, rank_study(study))
    if plan is None or plan.stop:
        return False
    points = {t.number: dict(t.params) for t in trials}
    for n in plan.rerun:
        enqueue(study, points[n], marks={SEED_OF: n, SEEDS: [plan.next_seed[n]]})
    echo(f"adaptive seeds: {plan.reason} (seeds "
         + ", ".join(f"{plan.next_seed[n]} for trial {n}" for n in plan.rerun) + ")")
    return True


def extra_plan(trial: optuna.Trial, seeds: list[int], rungs: Sequence[Rung], *,
               halving: bool = False) -> tuple[list[int], list[Rung]]:
    """The seeds and rungs ``trial`` trains, given the study's: a seed trial its seeds at
    its top rung, a baseline its rungs
    (:func:`~geosearch.search.space.baseline_specs.baseline_rungs`),
    a point of the space all of them; with ``halving`` (:func:`halving`) a point or a
    baseline away from the shared step (step factor 1) trains the first seed only
    (:func:`queue_halving` gives the best step the rest)."""
    ua = trial.user_attrs
    if SEED_OF in ua:
        own = baseline_rungs(ua[BASELINE], rungs) if BASELINE in ua else rungs
        return [int(s) for s in ua[SEEDS]], list(own[-1:])
    factor = float(trial.params.get(STEP_FACTOR, ua.get(STEP_FACTOR, 1.0)))
    first = list(seeds[:1]) if halving and factor != 1 else list(seeds)
    if BASELINE in ua:
        return first, baseline_rungs(ua[BASELINE], rungs)
    return first, list(rungs)


def halving(space: SearchSpace) -> bool:
    """Whether ``space`` searches its step grid by successive halving
    (``hyperparams.step_grid`` with ``step_halving``, the default)."""
    return bool(space.hyperparams.step_grid) and space.hyperparams.step_halving


def _step_group(trial: optuna.Trial | optuna.trial.FrozenTrial) -> tuple[str, object]:
    """What a trial is apart from its step: its point without the step factor (a baseline:
    none), and its baseline's name (a point: ``None``)."""
    params = {k: v for k, v in (trial_params(trial) or {}).items() if k != STEP_FACTOR}
    return param_key(params), trial.user_attrs.get(BASELINE)


def passed_above(study: optuna.Study, trial: optuna.Trial, factor: float) -> int | None:
    """Step halving: a trial of the same assignment (or baseline) at a step factor above
    ``factor`` that passed its stability rung (attr ``stability_passed_at``), whose pass then
    stands for this smaller step, or ``None``. The smaller step's run ends at a smaller Σ η²
    (by the factors' ratio squared), and the max logit grows with Σ η² (docs/design.md,
    "Step halving", checked on the stored long runs)."""
    group = _step_group(trial)
    for t in study.get_trials(deepcopy=False):
        at = t.user_attrs.get(STABILITY_PASSED_AT)
        if (t.number != trial.number and isinstance(at, (int, float)) and at > factor
                and SEED_OF not in t.user_attrs and _step_group(t) == group):
            return t.number
    return None


def queue_halving(study: optuna.Study, space: SearchSpace) -> list[str]:
    """Step halving's promotions: once every point and baseline has trained its first seed
    at each step (every seed at the shared step, whose answer keeps its intervals), queue
    the seeds it lacks (one seed trial, attrs ``seed_of``, ``seeds``) for the best completed
    step of each assignment and of each baseline, the best on the seed they share
    (:func:`~geosearch.search.stats.scores.best_on_shared_seeds`): nothing when that is the
    shared step. A step whose promotion is queued, running or done is not promoted again.

    Returns:
        What was promoted, in words (``"trial 7 (x0.5)"``); empty when nothing was.
    """
    every = [space.proxy.seed + r for r in range(space.repeats)]
    if not halving(space) or len(every) < 2:
        return []
    trials = study.get_trials(deepcopy=False)
    promoted = {t.user_attrs.get(SEED_OF) for t in trials
                if SEED_OF in t.user_attrs and trial_status(t) in (*FINISHED, RUNNING, WAITING)}
    groups: dict[tuple[str, object], list] = {}
    for t in trials:
        if trial_status(t) == COMPLETED and SEED_OF not in t.user_attrs and (
                not is_extra(t) or BASELINE in t.user_attrs):
            groups.setdefault(_step_group(t), []).append(t)
    out = []
    for ts in groups.values():
        best = best_on_shared_seeds((t.number, trial_score(t)) for t in ts)
        if best is None or best in promoted:
            continue
        t = next(x for x in ts if x.number == best)
        rest = [seed for seed in every if seed not in (t.user_attrs.get(SEEDS) or [])]
        if not rest:  # the shared step: trained with every seed
            continue
        marks = {SEED_OF: best, SEEDS: rest}
        if BASELINE in t.user_attrs:
            marks |= {BASELINE: t.user_attrs[BASELINE], STEP_FACTOR: t.user_attrs.get(STEP_FACTOR)}
        enqueue(study, dict(t.params), marks=marks)
        factor = t.params.get(STEP_FACTOR, t.user_attrs.get(STEP_FACTOR))
        out.append(f"trial {best}" + (f" (x{float(factor):g})" if factor is not None else ""))
    return out


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
