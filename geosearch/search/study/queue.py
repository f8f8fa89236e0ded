"""The study's points and budget: the grid queue, point keys, duplicates, what counts.

An exhaustive space puts its points (up to the budget) in Optuna's trial queue once, in a
seeded random order, and workers only pop from it; any other sampler proposes points and
a proposal of an already scored point is a duplicate. This module keys points, queues them
(first, or again after an interruption or a retried failure), tells which trials count
towards the budget (a failed trial queued again leaves its place to the rerun), and
says when no further trial should start. Torch-free. The budget and queueing rules are in
``docs/design.md`` ("The study").
"""

from __future__ import annotations

import itertools
import json
import math
import random
from collections.abc import Mapping
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from geosearch.search.records import (
    BASELINE,
    FAILED,
    QUEUED,
    QUEUED_PARAMS,
    RETRY_OF,
    SEED_OF,
    SEEDS,
    STATUS,
    STEP_FACTOR,
    is_extra,
)
from geosearch.search.space.spec import SearchSpace

__all__ = [
    "budget_taken",
    "counted",
    "done_count",
    "done_reason",
    "enqueue",
    "grid_points",
    "param_key",
    "redundant_waiting",
    "resolve_budget",
    "retried_numbers",
    "top_up_queue",
    "trial_key",
    "trial_params",
    "twin_of",
]


def param_key(params: Mapping[str, Any]) -> str:
    """A point's Optuna params as one comparable string."""
    return json.dumps({k: params[k] for k in sorted(params)}, sort_keys=True)


def trial_params(trial: FrozenTrial | optuna.Trial) -> dict[str, Any] | None:
    """A trial's point: the one it was queued with, completed by its own params; its own
    params alone when it was not queued; ``None`` when it has neither.

    The queued point comes first because a trial stores its params one write at a time: a
    worker killed (or interrupted) between two writes leaves part of the point, and that
    part queued again would let the sampler fill in the rest with a point already done.
    """
    queued = trial.user_attrs.get(QUEUED_PARAMS)
    point = {**queued, **trial.params} if isinstance(queued, dict) else dict(trial.params)
    return point or None


def trial_key(trial: FrozenTrial) -> str | None:
    """:func:`param_key` of a trial's point, ``None`` without a point."""
    params = trial_params(trial)
    return param_key(params) if params else None


def retried_numbers(trials: list[FrozenTrial]) -> set[int]:
    """The numbers of the trials that a later trial runs again (its ``retry_of``)."""
    return {t.user_attrs[RETRY_OF] for t in trials if isinstance(t.user_attrs.get(RETRY_OF), int)}


def counted(trial: FrozenTrial, rerun: set[int] | frozenset[int] = frozenset()) -> bool:
    """Whether a trial counts towards the budget: it is a point of the space (not an
    adaptive seed or a baseline) with a verdict (completed, unstable, failed), over every
    run of the study. A failed trial in ``rerun`` (its point queued again by
    ``--retry-failed``, see :func:`retried_numbers`) leaves its place to the rerun."""
    if is_extra(trial):
        return False
    if trial.state in (TrialState.COMPLETE, TrialState.PRUNED):
        return True
    return (trial.state == TrialState.FAIL and trial.user_attrs.get(STATUS) == FAILED
            and trial.number not in rerun)


def _counted_all(trials: list[FrozenTrial]) -> list[bool]:
    """:func:`counted` of each trial, the study's reruns taken into account."""
    rerun = retried_numbers(trials)
    return [counted(t, rerun) for t in trials]


def done_count(study: optuna.Study) -> int:
    """How many trials of the study count towards the budget."""
    return sum(_counted_all(study.get_trials(deepcopy=False)))


def enqueue(study: optuna.Study, params: dict[str, Any], *, retry_of: int | None = None,
            marks: Mapping[str, Any] | None = None) -> None:
    """Queue a point (``queued``, ``queued_params``; ``retry_of`` for the trial it reruns,
    which keeps its ``seed_of``/``seeds``/``baseline``/``step_factor`` marks; ``marks`` for a new adaptive
    seed or baseline)."""
    attrs: dict[str, Any] = {QUEUED: True, QUEUED_PARAMS: params, **(marks or {})}
    if retry_of is not None:
        attrs[RETRY_OF] = retry_of
        attrs |= _extra_marks(study, retry_of)
    study.enqueue_trial(params, user_attrs=attrs)


def _extra_marks(study: optuna.Study, number: int) -> dict[str, Any]:
    """The attrs that make trial ``number`` an adaptive seed or a baseline, for its rerun."""
    trial = next((t for t in study.get_trials(deepcopy=False) if t.number == number), None)
    if trial is None or not is_extra(trial):
        return {}
    return {k: trial.user_attrs[k] for k in (SEED_OF, SEEDS, BASELINE, STEP_FACTOR) if k in trial.user_attrs}


def grid_points(space: SearchSpace) -> list[dict[str, Any]]:
    """Every point of a finite space as Optuna params, in a seeded random order (with step
    halving, the largest step factor first).

    The parameter names and choices are read from a trial the space suggests on, so they
    follow whatever names ``SearchSpace.suggest`` uses.

    Raises:
        ValueError: the space has continuous parameters.
    """
    probe = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    trial = probe.ask()
    space.suggest(trial)
    dists = trial.distributions
    if not all(isinstance(d, optuna.distributions.CategoricalDistribution) for d in dists.values()):
        raise ValueError("the space is not finite: it has continuous parameters")
    names = list(dists)
    points = [dict(zip(names, combo)) for combo in
              itertools.product(*(dists[n].choices for n in names))]
    random.Random(space.sampler.seed or 0).shuffle(points)
    if space.hyperparams.step_grid and space.hyperparams.step_halving:
        # step halving: the largest steps first, so that a pass of their stability rung
        # stands for the smaller steps of the same assignment (the shuffle kept within a step)
        points.sort(key=lambda p: -float(p.get(STEP_FACTOR, 1.0)))
    return points


def resolve_budget(space: SearchSpace, exhaustive: bool) -> int | None:
    """The number of counted trials the study runs to (``None``: no limit); an exhaustive
    space stops at its size."""
    trials = space.budget.trials
    if exhaustive:
        size = int(space.grid_size())
        return size if trials is None else min(trials, size)
    return trials


def top_up_queue(study: optuna.Study, space: SearchSpace, budget: int) -> int:
    """Queue grid points not yet run, queued or running, until ``budget`` are allocated.

    Returns:
        How many points were queued.
    """
    trials = study.get_trials(deepcopy=False)
    taken = {trial_key(t) for t, c in zip(trials, _counted_all(trials)) if not is_extra(t)
             and (c or t.state in (TrialState.RUNNING, TrialState.WAITING))}
    taken.discard(None)
    allocated = len(taken)
    added = 0
    for params in grid_points(space):
        if allocated >= budget:
            break
        if param_key(params) in taken:
            continue
        enqueue(study, params)
        allocated += 1
        added += 1
    return added


def done_reason(study: optuna.Study, budget: int | None, exhaustive: bool,
                grid_size: float) -> str | None:
    """Why no further trial should start, or ``None``: the budget (finished + running
    trials) is used up, the queue of an exhaustive space is empty, or every point of a
    finite space has been scored."""
    trials = study.get_trials(deepcopy=False)
    done = sum(_counted_all(trials))
    running = sum(t.state == TrialState.RUNNING and not is_extra(t) for t in trials)
    if budget is not None and done + running >= budget:
        if running:
            return f"budget of {budget} trials allocated ({running} still running elsewhere)"
        if exhaustive and done >= grid_size:
            return "every assignment of the space has been tried"
        return f"budget of {budget} trials reached"
    if exhaustive:
        if not any(t.state == TrialState.WAITING and not is_extra(t) for t in trials):
            return ("every assignment of the space has been tried" if running == 0 else
                    f"every assignment of the space is taken ({running} still running elsewhere)")
    elif grid_size != math.inf:
        scored = {trial_key(t) for t, c in zip(trials, _counted_all(trials)) if c}
        if len(scored) >= grid_size:
            return f"every one of the {int(grid_size)} assignments of the space has been scored"
    return None


def redundant_waiting(study: optuna.Study) -> int:
    """How many queued points wait whose point already has a verdict or is training.

    Two commands (two run directories on one shared storage, or two machines) that read
    a new study at the same moment both queue its grid; the second copy of each point must
    be popped and recorded as a duplicate before a search stops, not left WAITING.
    """
    trials = study.get_trials(deepcopy=False)
    rerun = retried_numbers(trials)
    taken = {trial_key(t) for t in trials
             if not is_extra(t) and (counted(t, rerun) or t.state == TrialState.RUNNING)}
    taken.discard(None)
    return sum(t.state == TrialState.WAITING and not is_extra(t) and trial_key(t) in taken
               for t in trials)


def _ahead(t: FrozenTrial, number: int, rerun: set[int]) -> bool:
    """Whether trial ``t`` holds its slot before trial ``number``: counted, or running
    and asked for earlier; adaptive seeds and baselines hold none."""
    return counted(t, rerun) or (t.state == TrialState.RUNNING and t.number < number and not is_extra(t))


def budget_taken(study: optuna.Study, budget: int | None, number: int) -> str | None:
    """Why trial ``number``, just asked for, must not train because the budget is taken
    by trials ahead of it (other workers'), or ``None``."""
    if budget is None:
        return None
    trials = study.get_trials(deepcopy=False)
    rerun = retried_numbers(trials)
    ahead = sum(_ahead(t, number, rerun) for t in trials)
    return f"the budget of {budget} trials was taken by other workers" if ahead >= budget else None


def twin_of(study: optuna.Study, number: int, params: Mapping[str, Any]) -> int | None:
    """The number of a trial ahead of trial ``number`` with the same point (scored, or
    running and asked for earlier), or ``None``: trial ``number`` is then a duplicate."""
    key = param_key(params)
    trials = study.get_trials(deepcopy=False)
    rerun = retried_numbers(trials)
    for t in trials:
        if t.number != number and trial_key(t) == key and _ahead(t, number, rerun):
            return t.number
    return None
