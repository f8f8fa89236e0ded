"""The baselines a space may name (:data:`BASELINES`): the optimizers people use today, trained
beside the assignments and never exported (``docs/design.md``, "Baselines").

``adamw`` gives every module type the space assigns the geometry ``adamw`` (plain AdamW at the
proxy's ``lr``), ``muon`` gives them ``euclidean`` (unconstrained Muon at the proxy's
``spectral_lr``, with the proxy's ``muon_scale``, ``ns_coefficients`` and ``ns_steps``) and
``muon_qkclip`` the same with Kimi K2's QK-clip (the proxy's ``qk_clip`` at τ = 100). With a
step grid (``hyperparams.step_grid``) each is trained at every factor of it too, as the
assignments are: AdamW at ``lr`` × the factor, Muon at ``spectral_lr`` × the factor
(:func:`baseline_factors`, :func:`baseline_step`); without one, at the proxy's steps only.
This module reads a space's ``baselines:`` and ``max_repeats:``, plans the steps they take
and says how each trained (:func:`training_text`); the study queues and scores them
(:mod:`geosearch.search.study.baselines`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from geosearch.util.checks import Range, is_whole
from geosearch.search.horizon.ladder import Rung
from geosearch.search.horizon.target import rung_seeds
from geosearch.search.stats.trials import proxy_settings, step_text

if TYPE_CHECKING:  # pragma: no cover
    from geosearch.search.space.spec import SearchSpace

__all__ = ["BASELINES", "KIMI_QK_CLIP", "REPEATS", "BaselineSpec", "baseline_factors", "baseline_rungs",
           "baseline_step", "parse_extras", "plan_line", "training_text"]

REPEATS = Range(1, 100, whole=True)
"""Seeds per assignment (``repeats``, and ``max_repeats`` with adaptive seeds)."""
KIMI_QK_CLIP = 100.0
"""Kimi K2's τ: the cap on each head's max attention logit that QK-clip enforces."""


@dataclass(frozen=True)
class BaselineSpec:
    """One baseline: the geometry every assigned module type gets, the proxy fields it
    changes, and whether it trains at rung 0 only (no spectral step, so no Σ η)."""

    geometry: str
    train_overrides: dict[str, float] = field(default_factory=dict)
    rung0_only: bool = False
    text: str = ""


BASELINES: dict[str, BaselineSpec] = {
    "adamw": BaselineSpec("adamw", rung0_only=True, text="AdamW (every assigned type adamw)"),
    "muon": BaselineSpec("euclidean", text="Muon (every assigned type euclidean)"),
    "muon_qkclip": BaselineSpec("euclidean", {"qk_clip": KIMI_QK_CLIP},
                                text=f"Muon with QK-clip (euclidean, qk_clip {KIMI_QK_CLIP:g})"),
}
"""The baselines a space may name, by name."""


class _Parser(Protocol):
    """What :func:`parse_extras` needs of the schema's parser."""

    def error(self, key: str, problem: str, allowed: Iterable[object] | None = None) -> None: ...


def parse_extras(parser: _Parser, max_repeats: Any, repeats: Any,
                 baselines: Any) -> tuple[int | None, tuple[str, ...]]:
    """A space's ``max_repeats`` (null, or a whole number of :data:`REPEATS` >= ``repeats``) and ``baselines``
    (names of :data:`BASELINES`; null = none), read for the schema's parser
    (:mod:`geosearch.search.space.schema`); problems go to ``parser``."""
    max_repeats, problem = dataclasses.replace(REPEATS, null=True).check(max_repeats)
    if problem is not None:
        parser.error("max_repeats", problem)
        max_repeats = None
    elif max_repeats is not None and is_whole(repeats) and max_repeats < repeats:
        parser.error("max_repeats", f"expected at least repeats ({repeats}), got {max_repeats}")
        max_repeats = None
    names = list(BASELINES)
    items = [] if baselines is None else [baselines] if isinstance(baselines, str) else baselines
    if not isinstance(items, Sequence):
        parser.error("baselines", f"expected a list of baselines, got {baselines!r}", names)
        return max_repeats, ()
    bad = [b for b in items if not isinstance(b, str) or b not in BASELINES]
    if bad:
        parser.error("baselines", f"unknown baseline(s) {', '.join(map(repr, bad))}", names)
    elif len(set(items)) != len(items):
        parser.error("baselines", "a baseline is listed twice", names)
    return max_repeats, tuple(b for b in items if isinstance(b, str) and b in BASELINES)


def baseline_rungs(name: str, rungs: Sequence[Rung]) -> list[Rung]:
    """The rungs baseline ``name`` trains: rung 0 only for AdamW, else every rung."""
    return list(rungs[:1]) if BASELINES[name].rung0_only else list(rungs)


def baseline_factors(space: SearchSpace) -> tuple[float | None, ...]:
    """The factors each baseline trains at: the space's step grid, else ``(None,)`` (the
    proxy's steps, no factor recorded)."""
    grid = space.hyperparams.step_grid
    return tuple(float(f) for f in grid) if grid else (None,)


def baseline_step(name: str, proxy: Mapping[str, Any], spectral_lr: float | None = None,
                  factor: float | None = None) -> str:
    """The step baseline ``name`` trained at, in words: ``"lr 0.0012"`` for AdamW (it takes
    no spectral step), ``"spectral step 0.04"`` for Muon; ``factor`` (a step grid's) times
    the proxy's (``spectral_lr``: the rung's peak spectral step, default the proxy's).

    Example:
        >>> baseline_step("adamw", {"lr": 0.0006}, factor=2)
        'lr 0.0012'
    """
    return step_text(1.0 if factor is None else factor, proxy, adamw=BASELINES[name].geometry == "adamw",
                     spectral_lr=spectral_lr)


_SCALE_TEXT = {"keller": "× √max(1, fan_out/fan_in)", "none": "with no shape scale"}


def training_text(name: str, proxy: Mapping[str, Any], spectral_lr: float | None = None,
                  factor: float | None = None) -> str:
    """How baseline ``name`` trained the module types it took over: its optimizer, the step and,
    for Muon, the shape convention, the msign and the weight decay, read from a study's
    ``proxy`` record (``TrainConfig`` fields; a setting it lacks has the catalog's default).

    Args:
        name: a key of :data:`BASELINES`.
        proxy: the proxy run's fields, as a study records them.
        spectral_lr: the peak spectral step of the rung compared at (default: the proxy's).
        factor: the step grid's factor it trained at (``None``: no grid, the proxy's steps).

    Example:
        >>> training_text("muon", {"spectral_lr": 0.02, "optimizer_args": {"muon_scale": "none"}})
        'Muon: spectral step 0.02 with no shape scale (muon_scale none), msign 5 × polar_express, no weight decay'
    """
    values, spec = proxy_settings(proxy), BASELINES[name]
    if spec.geometry == "adamw":
        lr = f"lr {values['lr']:g}" if factor is None else baseline_step(name, proxy, factor=factor)
        return f"AdamW: {lr}, weight decay {values['weight_decay']:g}"
    step = values["spectral_lr"] if spectral_lr is None else spectral_lr
    step_text = f"spectral step {step:g}" if factor is None else baseline_step(name, proxy, step, factor)
    scale = values["muon_scale"]
    text = (f"Muon: {step_text} {_SCALE_TEXT.get(scale, '')} (muon_scale {scale}), "
            f"msign {values['ns_steps']} × {values['ns_coefficients']}, no weight decay")
    if "qk_clip" in spec.train_overrides:
        text += f", QK-clip τ {spec.train_overrides['qk_clip']:g}"
    return text


def plan_line(space: SearchSpace, rungs: Sequence[Rung]) -> str:
    """One line of the search header: what the study trains and its steps in total, worst
    case with adaptive seeds (every point given ``max_repeats`` seeds at the top rung); with
    a step grid each baseline counts once per factor."""
    size = space.grid_size()
    points = space.budget.trials if space.budget.trials is not None and space.budget.trials < size else size
    seeds = space.repeats
    lower = space.ladder.lower_seeds

    def steps(own: Sequence[Rung]) -> int:  # one trial's, each rung with its seeds
        return sum(r.steps * len(rung_seeds(range(seeds), r, rungs[-1], lower)) for r in own)

    stability = space.ladder.stability_steps or 0  # the stability rung: one seed, before the ladder
    if space.hyperparams.step_grid and space.hyperparams.step_halving and points != math.inf:
        return _halving_plan(space, rungs, int(points), stability)
    each = steps(rungs) + stability
    known = points != math.inf
    below = "" if len(rungs) == 1 or lower is None or lower >= seeds else f", {lower} below the top"
    first = f" + the stability rung ({stability:,} steps, 1 seed)" if stability else ""
    what = "points (assignment x step)" if space.hyperparams.step_grid else "assignments"
    parts = [f"{int(points) if known else 'N'} {what} x {seeds} seed(s){below} x {len(rungs)} "
             f"rung(s){first} ({each:,} steps each)"]
    fixed, runs, factors = 0, [], len(baseline_factors(space))
    for name in space.baselines:  # AdamW: no Σ η² clock, so no stability rung
        one = steps(baseline_rungs(name, rungs)) + (0 if BASELINES[name].rung0_only else stability)
        fixed += factors * one
        runs.append(f"{name} {factors * one:,}" + (f" ({factors} x {one:,})" if factors > 1 else ""))
    if runs:
        grid = f", each at the {factors} steps of the grid" if factors > 1 else ""
        parts.append(f"baselines (reported, never exported{grid}) {', '.join(runs)}")
    extra = max(0, (space.max_repeats or seeds) - seeds) * rungs[-1].steps
    if not known:
        total = f"{each:,} steps an assignment + {fixed:,}"
        worst = f" (+{extra:,} an assignment with adaptive seeds)" if extra else ""
        return f"  trains: {' + '.join(parts)} = {total} steps{worst}; N is set by budget.timeout"
    total = int(points) * each + fixed
    worst = (f"; up to {total + int(points) * extra:,} with adaptive seeds (max_repeats "
             f"{space.max_repeats}, at the top rung)" if extra else "")
    return f"  trains: {' + '.join(parts)} = {total:,} steps{worst}"


def _halving_plan(space: SearchSpace, rungs: Sequence[Rung], points: int, stability: int) -> str:
    """:func:`plan_line` of a step grid searched by successive halving: every seed at the
    shared step, one seed at the others, the rest at the top rung for each assignment's
    (and baseline's) best step where that is not the shared one (the first "up to"); the
    stability rung at the largest step, the smaller ones training their own only where a
    larger one fails it (the second)."""
    factors = len(baseline_factors(space))
    assignments = math.ceil(points / factors)
    seeds, lower = space.repeats, space.ladder.lower_seeds
    full = sum(r.steps * len(rung_seeds(range(seeds), r, rungs[-1], lower)) for r in rungs)
    one = sum(r.steps for r in rungs)  # a point's first seed, every rung
    promote = (seeds - 1) * rungs[-1].steps
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
        b_full = sum(r.steps * len(rung_seeds(range(seeds), r, rungs[-1], lower)) for r in own)
        b = b_full + (factors - 1) * sum(r.steps for r in own) + stab
        total += b
        best += (seeds - 1) * own[-1].steps
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
    extra = max(0, (space.max_repeats or seeds) - seeds) * rungs[-1].steps
    if extra:
        more.append(f"+ up to {assignments * extra:,} with adaptive seeds (max_repeats {space.max_repeats}, "
                    "at the top rung)")
    return (f"  trains: {' + '.join(parts)} = {total:,} steps (step halving)"
            + (f"; {'; '.join(more)}" if more else ""))
