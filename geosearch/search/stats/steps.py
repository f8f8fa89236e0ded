"""The two answers of a space with a step grid: at the shared step, and each assignment at
its own best step.

:func:`step_ranking` is how :func:`geosearch.search.stats.study_ranking.rank_study` ranks a study
whose points carry a ``step_factor`` (``hyperparams.step_grid``): the points at the shared
step ranked as without a grid, and each assignment at the step of its lowest mean final
val loss on the seeds all its steps ran, both by
:func:`~geosearch.search.stats.ranking.rank_scores`; :class:`StepAnswers` holds the two and
says whether each main effect survives the tuning. The rules are in ``docs/design.md``
("Ranking", "Each assignment at its own step").
"""

from __future__ import annotations

import dataclasses
from collections.abc import Hashable, Mapping
from typing import Any

import optuna
from optuna.trial import FrozenTrial

from geosearch.search.records import PROXY, STEP_FACTOR, UNSTABLE, is_extra, trial_status
from geosearch.search.stats.ranking import Ranking, StepAnswers, rank_scores
from geosearch.search.stats.scores import Point, Score, best_on_shared_seeds
from geosearch.search.stats.trials import trial_factors, trial_label

__all__ = ["step_ranking"]


def step_ranking(study: optuna.Study, trials: list[FrozenTrial], done: list[FrozenTrial],
                  scores: Mapping[int, Score]) -> Ranking:
    """The two answers of a step grid (:class:`StepAnswers`): the points at the shared step
    (factor 1) ranked as without a grid, and each assignment at its own best step (the
    factor of lowest mean final val loss among its completed points, on the seeds they all
    ran: :func:`~geosearch.search.stats.scores.best_on_shared_seeds`) ranked by the same
    rule, its main effects matched across steps; the verdict gives both, the main effects
    side by side, the assignments unstable at the shared step and stable at their own, and
    which answer is exported (the own-step one)."""
    points = {t.number: trial_factors(t) for t in done}
    factors = {t.number: float(t.params.get(STEP_FACTOR, 1.0)) for t in done}
    shared_lr = (study.user_attrs.get(PROXY) or {}).get("spectral_lr")
    shared_lr = float(shared_lr) if isinstance(shared_lr, (int, float)) and shared_lr > 0 else None
    groups: dict[Hashable, list[FrozenTrial]] = {}
    for t in done:
        groups.setdefault(_assignment_key(points[t.number]), []).append(t)
    # the best step on the seeds all its steps ran: a step given more seeds afterwards
    # (successive halving's promotion, adaptive seeds) keeps the choice they were given for
    chosen = {k: best_on_shared_seeds((t.number, scores[t.number]) for t in ts) for k, ts in groups.items()}
    best = {k: next(t for t in ts if t.number == chosen[k]) for k, ts in groups.items()}
    answers = StepAnswers(shared_lr, Ranking([], [], ""), factors, tuple(sorted(set(factors.values()))))
    shared = rank_scores([(t.number, trial_label(t, hyperparams=False), scores[t.number])
                          for t in done if factors[t.number] == 1],
                         {t.number: points[t.number] for t in done}, state_effects=False)
    own = rank_scores(
        [(t.number, f"{trial_label(t, hyperparams=False)} at step {answers.step(t.number)}", scores[t.number])
         for t in best.values()],
        {t.number: Point(points[t.number].levels, _assignment_key(points[t.number])[1]) for t in best.values()},
        state_effects=False)
    unstable = []
    for t in trials:  # unstable at the shared step (a loss pruner's prune is not), completed at another
        if t.params.get(STEP_FACTOR) in (1, 1.0) and not is_extra(t) and trial_status(t) == UNSTABLE:
            key = _assignment_key(trial_factors(t))
            other = best.get(key)
            if other is not None and all(factors[x.number] != 1 for x in groups[key]):
                unstable.append((trial_label(t, hyperparams=False), t.number, other.number))
    matched = {(e.factor, frozenset((e.better, e.worse))): e for e in shared.effects}
    effects = tuple((e.factor, matched.get((e.factor, frozenset((e.better, e.worse)))), e) for e in own.effects)
    answers = dataclasses.replace(answers, shared=shared, unstable_shared=tuple(unstable), effects=effects)
    at = f"the shared step {shared_lr:g}" if shared_lr else "the shared step (x1)"
    parts = [f"at {at}: {shared.verdict}", f"each assignment at its own best step: {own.verdict}"]
    ends = [r for r in own.rows if answers.at_the_end(r.number)]
    if ends:
        parts.append("best at the grid's end, so not bracketed (a step past it may be better): "
                     + ", ".join(f"trial {r.number} ({answers.step(r.number)})" for r in ends))
    parts += [f"{label}: unstable at the shared step (trial {n}), stable at its own (step "
              f"{answers.step(m)}, trial {m})" for label, n, m in unstable]
    parts += answers.effect_lines()
    parts.append("exported: the answer at each assignment's own best step, with that step "
                 "(its spectral_lr) in the file's settings")
    return dataclasses.replace(own, verdict="; ".join(parts), steps=answers)


def _assignment_key(point: Point) -> tuple[tuple[tuple[str, str], ...], tuple[Any, ...]]:
    """An assignment of a step grid's point: its geometries and any other searched value,
    the step factor left out."""
    rest = tuple(kv for kv in point.rest if kv[0] != STEP_FACTOR) if isinstance(point.rest, tuple) else point.rest
    return tuple(sorted(point.levels.items())), rest
