"""The adaptive-seed plan: which assignments of a ranked study should run one more seed.

Once every point has trained its ``repeats`` seeds, the best assignment and every one
still within noise of it get one more seed per round (:func:`seed_plan`, pure), up to the
space's ``max_repeats``, less the (point, seed) pairs a seed trial already tried
(:func:`study_seed_plan`). :mod:`geosearch.search.study.extras` queues the seed trials;
:func:`geosearch.search.stats.study_ranking.rank_study` says in its verdict how seeding stands.
Torch-free. The rules are in ``docs/design.md`` ("Adaptive seeds").
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Protocol

import optuna

from geosearch.search.records import FINISHED, SEED_OF, SEEDS, SPACE, trial_status

__all__ = ["SeedPlan", "max_seeds", "seed_plan", "study_seed_plan"]


class Ranked(Protocol):
    """What a plan reads of a ranking (:class:`geosearch.search.stats.ranking.Ranking`, which
    :mod:`~geosearch.search.stats.study_ranking` passes): its rows, best first, each with
    ``number``, ``score`` and ``versus_best``."""

    rows: list[Any]


@dataclass(frozen=True)
class SeedPlan:
    """Which assignments should run one more seed.

    Attributes:
        rerun: trial numbers to give one more seed: the best and every assignment still
            within noise of it (tie or unknown), best first; empty when ``stop``.
        next_seed: trial number -> the seed it should run next (``None`` when the trial
            recorded no seeds): the first seed another contender ran and it did not, else
            one past the largest seed any contender ran, so the new runs stay paired.
        stop: True when no more seeds are needed or allowed.
        reason: why, in words.
    """

    rerun: list[int]
    next_seed: dict[int, int | None]
    stop: bool
    reason: str


def seed_plan(ranking: Ranked, max_seeds: int) -> SeedPlan:
    """Decide the next round of adaptive seeds from a ranking (pure: runs nothing).

    Once every point of the space has trained its ``repeats`` seeds, the trial loop
    (:meth:`geosearch.search.study.trial_loop.Searcher.run`, through :func:`study_seed_plan`)
    queues one trial per ``n`` in ``plan.rerun``: the same point with user attrs
    ``seed_of = n`` and ``seeds = [plan.next_seed[n]]``, trained at the ladder's top rung
    only (where the ranking is read). A finished Optuna trial takes no new attrs, so the
    seed is a trial of its own; :func:`~geosearch.search.stats.trials.point_scores` merges it into trial ``n``'s
    :class:`~geosearch.search.stats.scores.Score`. When no seed trial is queued or running, the loop ranks again and plans
    the next round, until ``plan.stop``. Separated assignments get no more seeds: only the
    best and those within noise of it.

    Args:
        ranking: the current ranking (:func:`~geosearch.search.stats.study_ranking.rank_study`).
        max_seeds: the most seeds any assignment may run (the budget).

    Returns:
        ``stop`` when the best is separated from every other assignment, when every
        contender has ``max_seeds`` seeds, or when nothing completed.
    """
    if not ranking.rows:
        return SeedPlan([], {}, True, "no trial completed")
    contenders = [r for r in ranking.rows if r.versus_best in ("best", "tie", "unknown")]
    if len(contenders) == 1:
        why = ("separated: every other assignment is worse beyond noise" if len(ranking.rows) > 1
               else "only one assignment completed")
        return SeedPlan([], {}, True, why)
    want = [r for r in contenders if r.score.n < max_seeds]
    if not want:
        return SeedPlan([], {}, True, f"budget spent: {len(contenders)} assignments are still within "
                                      f"noise of each other after {max_seeds} seeds each")
    ran = sorted({s for r in contenders for s in (r.score.seeds or ())})
    nxt: dict[int, int | None] = {}
    for r in want:
        own = r.score.seeds
        missing = [s for s in ran if own is not None and s not in own]
        nxt[r.number] = None if own is None else (missing[0] if missing else max(ran) + 1)
    return SeedPlan([r.number for r in want], nxt, False,
                    f"{len(contenders) - 1} assignment(s) within noise of the best: one more seed "
                    f"for trials {', '.join(str(r.number) for r in want)}")


def max_seeds(study: optuna.Study) -> int | None:
    """The space's ``max_repeats`` (else its ``repeats``) as the study recorded it."""
    space = study.user_attrs.get(SPACE)
    if not isinstance(space, dict):
        return None
    most = space.get("max_repeats") or space.get("repeats")
    return most if isinstance(most, int) else None


def study_seed_plan(study: optuna.Study, ranking: Ranked) -> SeedPlan | None:
    """The next round of adaptive seeds of ``study``, whose ranking is ``ranking``
    (:func:`~geosearch.search.stats.study_ranking.rank_study`): :func:`seed_plan` at the space's
    ``max_repeats``, less the (point, seed) pairs a seed trial already tried (one that ended
    unstable or failed is not run again); ``None`` when the space asks for no more seeds
    than its ``repeats``."""
    space = study.user_attrs.get(SPACE)
    most = max_seeds(study)
    if most is None or most <= (space.get("repeats") or 1):
        return None
    plan = seed_plan(ranking, most)
    if plan.stop:
        return plan
    tried = {(t.user_attrs.get(SEED_OF), s) for t in study.get_trials(deepcopy=False)
             if SEED_OF in t.user_attrs and trial_status(t) in FINISHED
             for s in (t.user_attrs.get(SEEDS) or [])}
    rerun = [n for n in plan.rerun if (n, plan.next_seed[n]) not in tried and plan.next_seed[n] is not None]
    if not rerun:
        return SeedPlan([], {}, True, f"the next seed of trial(s) {', '.join(map(str, plan.rerun))} "
                                      "was tried and did not complete")
    return dataclasses.replace(plan, rerun=rerun, next_seed={n: plan.next_seed[n] for n in rerun})
