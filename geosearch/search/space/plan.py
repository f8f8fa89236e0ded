"""The study plan: what a study of a space trains, worked out once from the space and the flags.

:func:`plan_study` resolves the space's ``target:`` and ``ladder:`` against the proxy (the
target's Σ η and Σ η², the rungs, the stability rung and its step), its seeds, baselines and
step grid, and the study's cost in steps, into one frozen :class:`StudyPlan`. The search
prints it (:meth:`StudyPlan.header_lines`), the study records it (:meth:`StudyPlan.record`),
and the trial loop, the report and the export read it instead of working it out again.

Example:
    >>> from geosearch.search.space.spec import load_space
    >>> plan = plan_study(load_space("default"))
    >>> round(plan.target.sum_eta, 1), [r.steps for r in plan.rungs], plan.stability.steps
    (21.8, [400], 200)
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from geosearch.search.horizon.ladder import Rung
from geosearch.search.horizon.stability import StabilityRung, plan_stability, stability_clause
from geosearch.search.horizon.target import (
    Target,
    ladder_record,
    plan_rungs,
    resolve_target,
    run_steps,
    rung_seeds,
)
from geosearch.search.records import LADDER, STABILITY, TARGET
from geosearch.search.space.baseline_specs import BASELINES, baseline_factors, baseline_rungs
from geosearch.search.space.spec import SearchSpace

__all__ = ["StudyPlan", "plan_study"]


@dataclass(frozen=True)
class StudyPlan:
    """What a study trains (:func:`plan_study`)."""

    target: Target
    """The user's run, resolved against the proxy: steps, peak spectral step, model, Σ η and
    Σ η²."""
    rungs: tuple[Rung, ...]
    """The ladder's rungs, rung 0 (the proxy run) first; the value is read at the top one."""
    stability: StabilityRung | None
    """The stability rung, trained first with the first seed; ``None``: none."""
    seeds: tuple[int, ...]
    """The seeds each point trains at the top rung: ``proxy.seed + r`` for each repeat."""
    lower_seeds: int | None
    """Seeds each rung below the top trains (the first of the trial's); ``None``: all."""
    baselines: tuple[str, ...]
    """The baselines trained beside the points, reported and never exported."""
    step_grid: tuple[float, ...] | None
    """The step grid's factors of ``proxy.spectral_lr``; ``None``: every point at the shared
    step."""
    halving: bool
    """Whether the step grid is searched by successive halving."""
    least_steps: int | None
    """Training steps of the study as planned; ``None`` when a timeout sets its points."""
    most_steps: int | None
    """Training steps at most (adaptive seeds, step halving's promotions); ``None`` likewise."""
    lines: tuple[str, ...]
    """The header's lines on the target, the ladder and the cost (:meth:`header_lines`)."""

    @property
    def top(self) -> Rung:
        """The rung the ranking is read at."""
        return self.rungs[-1]

    def rung_seeds(self, seeds: Sequence[int], rung: Rung) -> list[int]:
        """The seeds of ``seeds`` (a trial's) that train at ``rung``."""
        return rung_seeds(seeds, rung, self.top, self.lower_seeds)

    def header_lines(self) -> list[str]:
        """The search header's lines on the plan: the target and the ladder, and what the
        study trains with its cost in steps."""
        return list(self.lines)

    def record(self) -> dict[str, Any]:
        """The study attrs that record the plan: ``target``, ``ladder``, ``stability``."""
        return {TARGET: self.target.record(), LADDER: ladder_record(self.rungs),
                STABILITY: None if self.stability is None else self.stability.record()}


def plan_study(space: SearchSpace) -> StudyPlan:
    """The plan of a study of ``space`` (flags already applied to it: apply_overrides)."""
    proxy = space.proxy
    target = resolve_target(proxy, space.target)
    rungs = plan_rungs(proxy, space.ladder, target.sum_eta)
    stability = plan_stability(proxy, target, space.ladder.stability_steps)
    trains, least, most = _cost(space, rungs)
    grid = space.hyperparams.step_grid
    return StudyPlan(
        target=target, rungs=tuple(rungs), stability=stability,
        seeds=tuple(proxy.seed + r for r in range(space.repeats)),
        lower_seeds=space.ladder.lower_seeds,
        baselines=tuple(space.baselines), step_grid=None if grid is None else tuple(grid),
        halving=bool(grid) and space.hyperparams.step_halving, least_steps=least, most_steps=most,
        lines=(_target_line(space, target, rungs, stability), trains))


def _target_line(space: SearchSpace, t: Target, rungs: Sequence[Rung],
                 stab: StabilityRung | None) -> str:
    """The header's line on the target, its Σ η, and the ladder's rungs."""
    base = rungs[0].sum_eta
    if t.sum_eta <= base * 1.1:
        return (f"  target: the proxy run itself (Σ η {base:.3g}); --target-steps N ranks for "
                "a longer run")
    if len(rungs) > 1:
        ladder = f"{len(rungs)} rungs at Σ η " + ", ".join(f"{r.sum_eta:.3g}" for r in rungs)
    elif space.ladder.rungs > 1:  # rungs take the proxy's step, and no more steps than it
        ladder = (f"1 rung, the proxy run: the ladder's limits reach no further (ladder.max_steps "
                  f"> proxy.steps {space.proxy.steps} ranks closer to it)")
    else:
        ladder = "1 rung, the proxy run (ladder.rungs >= 2 ranks closer to it)"
    if rungs[-1].cooldown is not None:
        ladder += (f", each a cooldown ({space.ladder.cooldown:.0%} of its steps) branched off one "
                   f"constant-step run, the trunk, to {rungs[-1].branch_point} steps")
    if stab is not None:
        ladder += stability_clause(stab)
    return (f"  target: {t.steps} steps at spectral_lr {t.spectral_lr:g}, model {t.model}: "
            f"Σ η {t.sum_eta:.3g} (the proxy's {base:.3g}); ladder: {ladder}")


def _cost(space: SearchSpace, rungs: Sequence[Rung]) -> tuple[str, int | None, int | None]:
    """The header's line on what the study trains, and its cost in steps: the least (every
    trial as planned) and the most (with adaptive seeds, every point given ``max_repeats``
    seeds at the top rung; with step halving, every best step away from the shared one and
    every stability rung failed at a larger step); both ``None`` when the number of points
    is not known (a timeout ends the study). With a step grid each baseline counts once per
    factor."""
    size = space.grid_size()
    points = space.budget.trials if space.budget.trials is not None and space.budget.trials < size else size
    seeds = space.repeats
    lower = space.ladder.lower_seeds

    def steps(own: Sequence[Rung]) -> int:  # one trial's, each rung with its seeds
        return sum(run_steps([r for r in own if s in rung_seeds(range(seeds), r, rungs[-1], lower)])
                   for s in range(seeds))

    stability = space.ladder.stability_steps or 0  # the stability rung: one seed, before the ladder
    if space.hyperparams.step_grid and space.hyperparams.step_halving and points != math.inf:
        return _halving_cost(space, rungs, int(points), stability)
    each = steps(rungs) + stability
    known = points != math.inf
    below = "" if len(rungs) == 1 or lower is None or lower >= seeds else f", {lower} below the top"
    first = f" + the stability rung ({stability:,} steps, 1 seed)" if stability else ""
    what = "points (assignment x step)" if space.hyperparams.step_grid else "assignments"
    parts = [f"{int(points) if known else 'N'} {what} x {seeds} seed(s){below} x {len(rungs)} "
             f"rung(s){first} ({each:,} steps each)"]
    fixed, runs, factors = 0, [], len(baseline_factors(space.hyperparams.step_grid))
    for name in space.baselines:  # AdamW: no Σ η² clock, so no stability rung
        one = steps(baseline_rungs(name, rungs)) + (0 if BASELINES[name].rung0_only else stability)
        fixed += factors * one
        runs.append(f"{name} {factors * one:,}" + (f" ({factors} x {one:,})" if factors > 1 else ""))
    if runs:
        grid = f", each at the {factors} steps of the grid" if factors > 1 else ""
        parts.append(f"baselines (reported, never exported{grid}) {', '.join(runs)}")
    extra = max(0, (space.max_repeats or seeds) - seeds) * run_steps(rungs[-1:])
    if not known:
        total = f"{each:,} steps an assignment + {fixed:,}"
        worst = f" (+{extra:,} an assignment with adaptive seeds)" if extra else ""
        return f"  trains: {' + '.join(parts)} = {total} steps{worst}; N is set by budget.timeout", None, None
    total = int(points) * each + fixed
    worst = (f"; up to {total + int(points) * extra:,} with adaptive seeds (max_repeats "
             f"{space.max_repeats}, at the top rung)" if extra else "")
    return f"  trains: {' + '.join(parts)} = {total:,} steps{worst}", total, total + int(points) * extra


def _halving_cost(space: SearchSpace, rungs: Sequence[Rung], points: int,
                  stability: int) -> tuple[str, int, int]:
    """:func:`_cost` of a step grid searched by successive halving: every seed at the
    shared step, one seed at the others, the rest at the top rung for each assignment's
    (and baseline's) best step where that is not the shared one (the first "up to"); the
    stability rung at the largest step, the smaller ones training their own only where a
    larger one fails it (the second)."""
    factors = len(baseline_factors(space.hyperparams.step_grid))
    assignments = math.ceil(points / factors)
    seeds, lower = space.repeats, space.ladder.lower_seeds
    full = sum(run_steps([r for r in rungs if s in rung_seeds(range(seeds), r, rungs[-1], lower)])
               for s in range(seeds))
    one = run_steps(rungs)  # a point's first seed, every rung
    promote = (seeds - 1) * run_steps(rungs[-1:])
    parts = [f"{assignments} points at the shared step x {seeds} seed(s) ({full:,} steps each)",
             f"{points - assignments} at the other steps x 1 seed ({one:,} each)"]
    if stability:
        parts.append(f"the stability rung at each assignment's largest step ({stability:,} steps, 1 seed)")
    total = assignments * (full + stability) + (points - assignments) * one
    best, spare = assignments * promote, (points - assignments) * stability
    runs = []
    for name in space.baselines:
        own = baseline_rungs(name, rungs)
        stab = 0 if BASELINES[name].rung0_only else stability
        b_full = sum(run_steps([r for r in own
                                if s in rung_seeds(range(seeds), r, rungs[-1], lower)])
                     for s in range(seeds))
        b = b_full + (factors - 1) * run_steps(own) + stab
        total += b
        best += (seeds - 1) * run_steps(own[-1:])
        spare += (factors - 1) * stab
        runs.append(f"{name} {b:,}")
    if runs:
        parts.append(f"baselines (reported, never exported; halved over the {factors} steps as the "
                     f"points) {', '.join(runs)}")
    more = []
    if best and seeds > 1:
        more.append(f"+ up to {best:,} where a best step is not the shared one (its other {seeds - 1} "
                    f"seed(s) at the top rung)")
    if spare:
        more.append(f"+ up to {spare:,} where a larger step fails the stability rung")
    extra = max(0, (space.max_repeats or seeds) - seeds) * run_steps(rungs[-1:])
    if extra:
        more.append(f"+ up to {assignments * extra:,} with adaptive seeds (max_repeats {space.max_repeats}, "
                    "at the top rung)")
    line = (f"  trains: {' + '.join(parts)} = {total:,} steps (step halving)"
            + (f"; {'; '.join(more)}" if more else ""))
    return line, total, total + (best if seeds > 1 else 0) + spare + assignments * extra
