"""The baselines a space may name (:data:`BASELINES`): the optimizers people use today, trained
beside the assignments and never exported (``docs/design.md``, "Baselines").

``adamw`` gives every module type the space assigns the geometry ``adamw`` (plain AdamW at the
proxy's ``lr``), ``muon`` gives them ``euclidean`` (unconstrained Muon at the proxy's
``spectral_lr``, with the proxy's ``muon_scale``, ``ns_coefficients`` and ``ns_steps``) and
``muon_qkclip`` the same with Kimi K2's QK-clip (the proxy's ``qk_clip`` at τ = 100). With a
step grid (``hyperparams.step_grid``) each is trained at every factor of it too, as the
assignments are: AdamW at ``lr`` × the factor, Muon at ``spectral_lr`` × the factor
(:func:`baseline_factors`, :func:`baseline_step`); without one, at the proxy's steps only.
This module reads a space's ``baselines:`` and ``max_repeats:`` and says how each trained
(:func:`training_text`); the study's plan counts their steps (:mod:`geosearch.search.space.plan`),
the study queues and scores them (:mod:`geosearch.search.study.baseline_trials`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from geosearch.util.checks import Range, is_whole
from geosearch.search.horizon.ladder import Rung
from geosearch.search.stats.trials import proxy_settings, step_text

__all__ = ["BASELINES", "KIMI_QK_CLIP", "REPEATS", "BaselineSpec", "baseline_factors", "baseline_rungs",
           "baseline_step", "parse_extras", "training_text"]

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


def baseline_factors(grid: Sequence[float] | None) -> tuple[float | None, ...]:
    """The factors each baseline trains at: the space's step grid
    (``hyperparams.step_grid``), else ``(None,)`` (the proxy's steps, no factor recorded)."""
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
