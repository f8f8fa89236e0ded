"""The numbers the report shows beside the ranking: importance, stability, cost, Pareto.

Pure functions of the loaded run (:mod:`geosearch.report.load`), so tests can check each
number. :func:`geometry_importances` asks Optuna's PED-ANOVA which module type's geometry
separates the best assignments from the rest, one value per point of the space (its seeds
merged; baselines not counted), each parameter with its factor's main effects so that the
report names a factor as mattering only when the main effects find it beyond seed noise;
:func:`peak_layers` names the layer holding each run's largest attention logit;
:func:`stability_table` counts, per
geometry, how many trials ended unstable or failed; :func:`cost_table` gives step time and
throughput as ratios to an AdamW or Muon baseline; :func:`pareto_front` and
:func:`pareto_trials` find the completed trials no other beats on both loss and time. The
ranking and its verdict are not here: they are the search's own
(:func:`geosearch.search.stats.study_ranking.rank_study`), so the report and the search agree.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna
from optuna.distributions import CategoricalDistribution
from optuna.trial import FrozenTrial

from geosearch.report.load import TrialRecord, as_finite, mean_finite, read_metrics
from geosearch.search.records import FINISHED
from geosearch.search.stats.pooled import main_effects
from geosearch.search.stats.scores import MainEffect, Score
from geosearch.search.stats.trials import point_scores, step_cost, trial_factors

__all__ = [
    "CostRow",
    "CostTable",
    "Importance",
    "PeakLayer",
    "cost_table",
    "geometry_importances",
    "layer_logits",
    "pareto_front",
    "pareto_trials",
    "peak_layers",
    "stability_table",
]


@dataclass
class Importance:
    """Importance of each geometry parameter for the final val loss, over the assignments.

    Attributes:
        values: parameter -> normalised importance, largest first; ``None`` when it could
            not be computed (``note`` says why).
        note: how it was computed, or why not.
        effects: parameter -> its factor's main effects (each pair of levels), the ones the
            ranking's verdict judges against seed noise; a parameter without a matched pair
            of points has none.
        points: how many assignments (points of the space) it was computed on.
    """

    values: dict[str, float] | None
    note: str
    effects: dict[str, tuple[MainEffect, ...]] = field(default_factory=dict)
    points: int = 0

    @property
    def top(self) -> str | None:
        """The parameter with the largest importance (``None`` without values)."""
        return next(iter(self.values)) if self.values else None

    def decisive(self, param: str) -> bool | None:
        """Whether ``param``'s factor has a main effect beyond noise (any pair of its levels,
        :attr:`MainEffect.decisive`); ``None`` when it has no main effect to judge by."""
        effects = self.effects.get(param)
        return any(e.decisive for e in effects) if effects else None


def geometry_importances(study: optuna.Study, effects: Iterable[MainEffect] | None = None) -> Importance:
    """Optuna's PED-ANOVA importance of the categorical geometry parameters, over the
    assignments' scores.

    One value per point of the space: its merged score over all its seeds
    (:func:`geosearch.search.stats.trials.point_scores`: its adaptive-seed trials, whose
    params repeat the point, join it instead of counting again), in an in-memory study of
    one trial per point. Baselines (no params) and unstable or failed trials are not
    counted (they are in the Baselines and stability tables). PED-ANOVA
    (``optuna.importance.PedAnovaImportanceEvaluator``) handles categorical parameters and
    needs no extra package; it asks which parameter values are over-represented among the
    best points, the top quantile set to hold at least two points when there are enough.
    It does not know the seed noise, so each parameter is given its factor's main effects
    (``effects``: the ranking's, e.g. ``rank_study(study).effects``; computed from the
    same scores when ``None``), which say whether it matters beyond noise.
    """
    trials = study.get_trials(deepcopy=False)
    scores = point_scores(trials)
    points = [(t, scores[t.number]) for t in sorted(trials, key=lambda t: t.number)
              if t.number in scores and scores[t.number].n]
    if effects is None:
        effects = main_effects((trial_factors(t), s) for t, s in points)
    by_param: dict[str, tuple[MainEffect, ...]] = {}
    for e in effects:
        by_param[f"geometry.{e.factor}"] = (*by_param.get(f"geometry.{e.factor}", ()), e)

    def result(values: dict[str, float] | None, note: str) -> Importance:
        return Importance(values, note, by_param, len(points))

    if len(points) < 2:
        return result(None, f"not enough completed assignments ({len(points)}; need at least 2).")
    cats = sorted({n for t, _ in points for n, d in t.distributions.items()
                   if isinstance(d, CategoricalDistribution)})
    params = [p for p in cats if p.startswith("geometry.")] or cats
    if not params:
        return result(None, "the study has no categorical geometry parameters.")
    if len({s.mean for _, s in points}) == 1:
        return result(None, "every completed assignment has the same val loss: no geometry made a difference.")
    if all(len({t.params.get(p) for t, _ in points}) == 1 for p in params):
        return result(None, "every completed assignment used the same geometries: nothing to compare.")
    quantile = min(0.5, max(0.1, 2.0 / len(points)))
    evaluator = optuna.importance.PedAnovaImportanceEvaluator(target_quantile=quantile)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # small-sample warnings; the note below says it instead
        raw = optuna.importance.get_param_importances(
            _point_study(points, params), evaluator=evaluator, params=params, normalize=False
        )
    total = sum(raw.values())
    if not total > 0:  # Optuna would normalise all-zero importances to equal shares
        return result(None, "no geometry parameter separates the best assignments from the rest.")
    values = dict(sorted(((p, v / total) for p, v in raw.items()), key=lambda kv: (-kv[1], kv[0])))
    note = (
        f"Optuna PED-ANOVA importance (target quantile {quantile:.2f}) over the {len(points)} "
        "completed assignments, one value each (its mean val loss over all its seeds, adaptive "
        "seeds merged); baselines, unstable and failed trials are not counted."
    )
    if len(points) < 10:
        note += f" With {len(points)} assignments this is a rough guide."
    return result(values, note)


def _point_study(points: Sequence[tuple[FrozenTrial, Score]], params: Sequence[str]) -> optuna.Study:
    """An in-memory study of one COMPLETE trial per point: its ``params`` (each with the
    union of the points' choices, so that every point is in one regime) and its merged
    score's mean as the value."""
    choices: dict[str, dict[Any, None]] = {p: {} for p in params}
    for t, _ in points:
        for p in params:
            d = t.distributions.get(p)
            if isinstance(d, CategoricalDistribution):
                choices[p].update(dict.fromkeys(d.choices))
    dists = {p: CategoricalDistribution(list(c)) for p, c in choices.items() if c}
    verbosity = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.WARNING)  # no "A new study created in memory"
    try:
        study = optuna.create_study(direction="minimize")
    finally:
        optuna.logging.set_verbosity(verbosity)
    for t, s in points:
        have = {p: t.params[p] for p in dists if p in t.params}
        study.add_trial(optuna.trial.create_trial(
            params=have, distributions={p: dists[p] for p in have}, value=s.mean))
    return study


@dataclass(frozen=True)
class PeakLayer:
    """The layer that holds a run's largest attention logit at its last probe.

    Attributes:
        trial: the trial (its first seed, at the last rung it reached).
        layer: the layer's index (0 = nearest the embedding).
        value: its max logit there.
        step: the probe's step.
    """

    trial: TrialRecord
    layer: int
    value: float
    step: float


def layer_logits(t: TrialRecord) -> list[tuple[float, list[float | None]]]:
    """``(step, max logit of each layer)`` of every probe of the trial's first seed at the
    last rung it reached (``max_logit_per_layer`` in its metrics.jsonl; a non-finite value
    is ``None``); ``[]`` when its metrics record no per-layer values (a study from before them)."""
    rows = []
    for r in t.metrics[0] if t.metrics else []:
        step, layers = as_finite(r.get("step")), r.get("max_logit_per_layer")
        if step is not None and isinstance(layers, list) and layers:
            rows.append((step, [as_finite(v) for v in layers]))
    return rows


def head_logits(run_dir: Path,
                t: TrialRecord) -> tuple[str, float, list[list[float | None]]] | None:
    """``(where, step, max logit of each layer's heads)`` at the trial's last probe with
    per-head values (``max_logit_per_head``) of its stability rung (``trials/<n>/stability``,
    one seed): ``where`` is ``"stability rung"``; without one, of its first seed at the
    last rung it reached (``"top rung"``). ``None`` when neither records per-head values."""
    stability = read_metrics(run_dir / "trials" / str(t.number) / "stability" / "metrics.jsonl")
    top = t.metrics[0] if t.metrics else []
    for where, records in (("stability rung", stability), ("top rung", top)):
        for r in reversed(records):
            step, heads = as_finite(r.get("step")), r.get("max_logit_per_head")
            if step is not None and heads and all(isinstance(h, list) for h in heads):
                return where, step, [[as_finite(v) for v in layer] for layer in heads]
    return None


def peak_layers(trials: Sequence[TrialRecord]) -> list[PeakLayer]:
    """For each trial with per-layer values (:func:`layer_logits`), the layer holding the
    largest max logit at its last probe with a finite one (the lower layer on a tie), in
    the trials' order."""
    out = []
    for t in trials:
        for step, values in reversed(layer_logits(t)):
            finite = [(v, i) for i, v in enumerate(values) if v is not None]
            if finite:
                value, layer = max(finite, key=lambda vi: (vi[0], -vi[1]))
                out.append(PeakLayer(t, layer, value, step))
                break
    return out


def stability_table(trials: Sequence[TrialRecord]) -> list[dict[str, Any]]:
    """Per geometry parameter and value: trials finished, unstable, failed, best val loss.

    Returns:
        Rows ``{"param", "value", "trials", "unstable", "failed", "best"}`` sorted by
        parameter then value.
    """
    counts: dict[tuple[str, str], dict[str, Any]] = {}
    for t in trials:
        if t.status not in FINISHED:
            continue
        for p, v in t.geometry_params.items():
            row = counts.setdefault(
                (p, v), {"param": p, "value": v, "trials": 0, "unstable": 0, "failed": 0, "best": math.nan}
            )
            row["trials"] += 1
            if t.status in ("unstable", "failed"):
                row[t.status] += 1
            elif t.loss.n and (math.isnan(row["best"]) or t.loss.mean < row["best"]):
                row["best"] = t.loss.mean
    return [counts[k] for k in sorted(counts)]


@dataclass
class CostRow:
    """One trial's cost: step time, throughput, their ratios to the baseline, training time."""

    trial: TrialRecord
    step_ms: float | None
    step_ratio: float | None  # step time / baseline step time
    tokens_per_s: float | None
    tokens_ratio: float | None  # throughput / baseline throughput
    time_s: float | None


@dataclass
class CostTable:
    """Cost per trial as a ratio to a baseline.

    Attributes:
        baseline: what the ratios are relative to, in words.
        baseline_trials: the trial numbers averaged into the baseline.
        rows: one per completed or unstable trial with a recorded step time, fastest first.
    """

    baseline: str
    baseline_trials: list[int]
    rows: list[CostRow]


def cost_table(trials: Sequence[TrialRecord]) -> CostTable:
    """ms/step and tokens/s of completed and unstable trials, as ratios to the AdamW or Muon baseline.

    The baseline and the ms/step ratios are :func:`geosearch.search.stats.trials.step_cost`'s
    (the mean over trials whose assignment is all-``adamw``, else all-``euclidean``; without
    either, the fastest trial, and the text says so); tokens/s over the same trials.
    """
    timed = [t for t in trials if t.status in ("completed", "unstable") and t.mean_step_ms is not None]
    cost = step_cost((t.number, _uniform(t), t.label, t.mean_step_ms) for t in timed)
    if not timed or cost.ms is None:
        return CostTable("no trial recorded its step time", [], [])
    base_tps = mean_finite(t.tokens_per_s for t in timed if t.number in cost.trials)
    rows = [
        CostRow(
            trial=t,
            step_ms=t.mean_step_ms,
            step_ratio=cost.ratios.get(t.number),
            tokens_per_s=t.tokens_per_s,
            tokens_ratio=t.tokens_per_s / base_tps if (base_tps and t.tokens_per_s is not None) else None,
            time_s=t.time_s(),
        )
        for t in sorted(timed, key=lambda t: (t.mean_step_ms, t.number))
    ]
    return CostTable(cost.baseline, list(cost.trials), rows)


def _uniform(t: TrialRecord) -> str | None:
    geos = set(t.assignment.values()) or set(t.geometry_params.values())
    return next(iter(geos)) if len(geos) == 1 else None


def pareto_front(points: Sequence[tuple[float, float]]) -> list[int]:
    """Indices of the points no other point dominates, minimising both coordinates.

    A point dominates another when it is no worse in both coordinates and better in one.
    Points with a non-finite coordinate are never on the front. Equal points are all kept.

    Returns:
        Indices sorted by the first coordinate (then the second).

    Example:
        >>> pareto_front([(1.0, 3.0), (2.0, 2.0), (3.0, 2.5), (4.0, 1.0)])
        [0, 1, 3]
    """
    ok = [i for i, (x, y) in enumerate(points) if math.isfinite(x) and math.isfinite(y)]
    front = [
        i
        for i in ok
        if not any(
            points[j][0] <= points[i][0]
            and points[j][1] <= points[i][1]
            and (points[j][0] < points[i][0] or points[j][1] < points[i][1])
            for j in ok
        )
    ]
    return sorted(front, key=lambda i: (points[i][0], points[i][1], i))


def pareto_trials(trials: Sequence[TrialRecord]) -> tuple[list[TrialRecord], list[int]]:
    """Completed trials with a val loss and a time, and the indices of those on the Pareto front.

    Returns:
        (the trials, :func:`pareto_front` of their (time, mean val loss) points).
    """
    pts = [t for t in trials if t.status == "completed" and t.loss.n and t.time_s() is not None]
    front = pareto_front([(t.time_s(), t.loss.mean) for t in pts])  # type: ignore[misc]
    return pts, front

