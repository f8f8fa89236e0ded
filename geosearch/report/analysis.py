"""The numbers the report shows beside the ranking: importance, stability, cost, Pareto.

Pure functions of the loaded run (:mod:`geosearch.report.load`), so tests can check each
number. :func:`geometry_importances` asks Optuna's PED-ANOVA which module type's geometry
separates the best completed trials from the rest; :func:`stability_table` counts, per
geometry, how many trials ended unstable or failed; :func:`cost_table` gives step time and
throughput as ratios to an AdamW or Muon baseline; :func:`pareto_front` and
:func:`pareto_trials` find the completed trials no other beats on both loss and time. The
ranking and its verdict are not here: they are the search's own
(:func:`geosearch.search.stats.ranking.rank_study`), so the report and the search agree.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import optuna
from optuna.distributions import CategoricalDistribution
from optuna.trial import TrialState

from geosearch.report.load import TrialRecord, mean_finite
from geosearch.search.records import FINISHED

__all__ = [
    "CostRow",
    "CostTable",
    "Importance",
    "cost_table",
    "geometry_importances",
    "pareto_front",
    "pareto_trials",
    "stability_table",
]

_BASELINES = (("adamw", "AdamW (all-adamw)"), ("euclidean", "Muon (all-euclidean)"))


@dataclass
class Importance:
    """Importance of each geometry parameter for the final val loss.

    Attributes:
        values: parameter -> normalised importance, largest first; ``None`` when it could
            not be computed (``note`` says why).
        note: how it was computed, or why not.
    """

    values: dict[str, float] | None
    note: str


def geometry_importances(study: optuna.Study) -> Importance:
    """Optuna's PED-ANOVA importance over the study's categorical geometry parameters.

    PED-ANOVA (``optuna.importance.PedAnovaImportanceEvaluator``) handles categorical
    parameters and needs no extra package (fANOVA and mean-decrease-impurity need
    scikit-learn). It asks which parameter values are over-represented among the best
    trials; the top quantile is set to hold at least two trials when there are enough.
    Only completed trials count: unstable and failed ones are in :func:`stability_table`.
    """
    complete = [
        t
        for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
        if t.value is not None and math.isfinite(t.value)
    ]
    if len(complete) < 2:
        return Importance(None, f"not enough completed trials ({len(complete)}; need at least 2).")
    cats = sorted(
        {n for t in complete for n, d in t.distributions.items() if isinstance(d, CategoricalDistribution)}
    )
    params = [p for p in cats if p.startswith("geometry.")] or cats
    if not params:
        return Importance(None, "the study has no categorical geometry parameters.")
    if len({t.value for t in complete}) == 1:
        return Importance(None, "every completed trial has the same val loss: no geometry made a difference.")
    if all(len({t.params.get(p) for t in complete}) == 1 for p in params):
        return Importance(None, "every completed trial used the same geometries: nothing to compare.")
    quantile = min(0.5, max(0.1, 2.0 / len(complete)))
    evaluator = optuna.importance.PedAnovaImportanceEvaluator(target_quantile=quantile)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # small-sample warnings; the note below says it instead
        raw = optuna.importance.get_param_importances(
            study, evaluator=evaluator, params=params, normalize=False
        )
    total = sum(raw.values())
    if not total > 0:  # Optuna would normalise all-zero importances to equal shares
        return Importance(None, "no geometry parameter separates the best completed trials from the rest.")
    values = dict(sorted(((p, v / total) for p, v in raw.items()), key=lambda kv: (-kv[1], kv[0])))
    note = (
        f"Optuna PED-ANOVA importance (target quantile {quantile:.2f}) over {len(complete)} completed "
        "trials; unstable and failed trials are not counted (see the stability table)."
    )
    if len(complete) < 10:
        note += f" With {len(complete)} trials this is a rough guide."
    return Importance(values, note)


def stability_table(trials: Sequence[TrialRecord]) -> list[dict[str, Any]]:
    """Per geometry parameter and value: trials finished, unstable, failed, best val loss.

    Returns:
        Rows ``{"param", "value", "trials", "unstable", "failed", "best"}`` sorted by
        parameter then value.
    """
    counts: dict[tuple[str, str], dict[str, Any]] = {}
    for t in trials:
        if t.state not in FINISHED:
            continue
        for p, v in t.geometry_params.items():
            row = counts.setdefault(
                (p, v), {"param": p, "value": v, "trials": 0, "unstable": 0, "failed": 0, "best": math.nan}
            )
            row["trials"] += 1
            if t.state in ("unstable", "failed"):
                row[t.state] += 1
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

    The baseline is the mean over trials whose assignment is all-``adamw`` (else
    all-``euclidean``); without either, the fastest trial, and the text says so.
    """
    timed = [t for t in trials if t.state in ("completed", "unstable") and t.mean_step_ms is not None]
    if not timed:
        return CostTable("no trial recorded its step time", [], [])
    base_trials: list[TrialRecord] = []
    baseline = ""
    for geometry, name in _BASELINES:
        base_trials = [t for t in timed if _uniform(t) == geometry]
        if base_trials:
            baseline = name
            break
    if not base_trials:
        fastest = min(timed, key=lambda t: t.mean_step_ms)  # type: ignore[arg-type, return-value]
        base_trials = [fastest]
        baseline = (
            f"the fastest trial ({fastest.label}, trial {fastest.number}): "
            "the study has no all-adamw or all-euclidean baseline"
        )
    base_ms = mean_finite(t.mean_step_ms for t in base_trials)
    base_tps = mean_finite(t.tokens_per_s for t in base_trials)
    rows = [
        CostRow(
            trial=t,
            step_ms=t.mean_step_ms,
            step_ratio=t.mean_step_ms / base_ms if base_ms else None,  # type: ignore[operator]
            tokens_per_s=t.tokens_per_s,
            tokens_ratio=t.tokens_per_s / base_tps if (base_tps and t.tokens_per_s is not None) else None,
            time_s=t.time_s(),
        )
        for t in sorted(timed, key=lambda t: (t.mean_step_ms, t.number))
    ]
    return CostTable(baseline, [t.number for t in base_trials], rows)


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
    pts = [t for t in trials if t.state == "completed" and t.loss.n and t.time_s() is not None]
    front = pareto_front([(t.time_s(), t.loss.mean) for t in pts])  # type: ignore[misc]
    return pts, front

