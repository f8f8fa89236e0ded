"""Reading a study's ladder back: each rung's ranking over the completed trials, whether the
order held up to the target (:func:`study_reading`), and how that is said (:func:`horizon_note`,
:func:`horizon_lines`) and recorded (:func:`reading_record`)."""

from __future__ import annotations

import math
from typing import Any

import optuna
from optuna.trial import TrialState

from geosearch.util.checks import is_number
from geosearch.search.horizon.curve import law_forecast, ranking_rule
from geosearch.search.horizon.ladder import HorizonReading, Rung, read_ladder
from geosearch.search.horizon.target import ladder_record
from geosearch.search.stats.trials import trial_label
from geosearch.search.records import LADDER, RUNG_LOSSES, TARGET, is_extra

__all__ = ["horizon_lines", "horizon_note", "horizon_verdict", "law_lines", "reading_record",
           "rung_means",
           "study_reading"]


def rung_means(value: Any) -> list[float] | None:
    """Each rung's mean final val loss over its seeds (NaN where none is finite) from a
    ``rung_losses`` attr, or ``None`` when it is not a list of lists."""
    if not isinstance(value, list) or not all(isinstance(v, list) for v in value):
        return None
    out = []
    for losses in value:
        finite = [float(x) for x in losses if is_number(x) and math.isfinite(x)]
        out.append(sum(finite) / len(finite) if finite and len(finite) == len(losses) else math.nan)
    return out


def study_reading(study: optuna.Study) -> HorizonReading | None:
    """The ladder's reading over the completed trials of ``study`` (labelled by their
    points), or ``None`` when there is nothing to read: a study from before targets, or
    one rung whose Σ η is the target's (within 10%)."""
    attrs = study.user_attrs
    ladder, target = attrs.get(LADDER), attrs.get(TARGET)
    if not (isinstance(ladder, list) and ladder and isinstance(target, dict)
            and is_number(target.get("sum_eta")) and target["sum_eta"] > 0):
        return None
    rungs = [Rung(**r) for r in ladder]
    losses: dict[str, list[float]] = {}
    for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        if is_extra(t):  # baselines and adaptive seeds are not points of the ladder's reading
            continue
        means = rung_means(t.user_attrs.get(RUNG_LOSSES))
        if means is not None and len(means) == len(rungs):
            label = trial_label(t)
            losses[label if label not in losses else f"{label} (trial {t.number})"] = means
    reading = read_ladder(rungs, losses, float(target["sum_eta"]))
    if rungs[-1].cooldown is not None:  # branches: the law's forecast, and which order ranked
        reading.rule = ranking_rule(rungs[-1].sum_eta, reading.target_sum_eta, branches=True)
        reading.lines.extend(law_lines(study, rungs, reading.target_sum_eta))
    return reading if len(rungs) > 1 or reading.extrapolated else None


def law_lines(study: optuna.Study, rungs: list[Rung], target_sum_eta: float) -> list[str]:
    """The curve law's forecast at the target for each completed trial
    (:func:`~geosearch.search.horizon.curve.law_forecast`, fitted per seed to its branches'
    completed losses), best first; a line saying why when no trial has three branches."""
    out = []
    for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        value = t.user_attrs.get(RUNG_LOSSES)
        if is_extra(t) or rung_means(value) is None:
            continue
        seeds = max((len(v) for v in value), default=0)
        per_seed = [[(r.sum_eta, float(v[j])) for r, v in zip(rungs, value)
                     if j < len(v) and is_number(v[j])] for j in range(seeds)]
        f = law_forecast(per_seed, target_sum_eta)
        if f is not None:
            out.append((f.value, f"{trial_label(t)}: {f.text()}"))
    if not out:
        return ["curve law: needs 3 branches a seed (ladder.rungs >= 3); not fitted"]
    return ["curve law L∞ + A·Σ η^−α, fitted per seed to the branches, at your target (90% "
            "interval; not ranked on):", *(f"  {line}" for _, line in sorted(out))]


def horizon_note(reading: HorizonReading | None) -> str | None:
    """What the verdict must add about the target: ``None`` when the ladder's order held
    up to the target, else why the ranking is not known to hold there."""
    if reading is None or not reading.leaders:
        return None
    target = f"your target is Σ η {reading.target_sum_eta:.3g}"
    if len(reading.rungs) == 1:
        return (f"ranked at Σ η {reading.rungs[0].sum_eta:.3g} only; {target}: the order there is "
                "not measured (ladder.rungs >= 2 ranks closer to it)")
    if reading.stable:
        return None
    if reading.lead_changes:
        lo, hi, _, _ = reading.lead_changes[-1]
        why = f"the lead changed between Σ η {lo:.3g} and {hi:.3g}"
    else:
        c = next(c for c in reading.crossings if not c.measured)
        why = f"{c.second} is forecast to overtake {c.first} near Σ η {c.sum_eta:.3g}"
    return f"not yet stable: {why}; {target}"


def horizon_verdict(verdict: str, reading: HorizonReading | None) -> str:
    """A ranking's verdict, marked with :func:`horizon_note` when it may not hold at the
    target (``"... (not yet stable: the lead changed ...)"``)."""
    note = horizon_note(reading)
    return verdict if note is None else f"{verdict} ({note})"


def horizon_lines(reading: HorizonReading | None) -> list[str]:
    """The reading as the search prints it: a heading and its lines, or nothing."""
    if reading is None:
        return []
    return ["horizon (the ranking at each rung of the Σ η ladder, towards your target):",
            *(f"  {line}" for line in reading.lines)]


def reading_record(reading: HorizonReading) -> dict[str, Any]:
    """The reading as an exported assignment's provenance records it (YAML-safe)."""
    return {
        "target_sum_eta": reading.target_sum_eta,
        "rungs": ladder_record(reading.rungs),
        "leaders": list(reading.leaders),
        "lead_changes": [{"from_sum_eta": lo, "to_sum_eta": hi, "from": a, "to": b}
                         for lo, hi, a, b in reading.lead_changes],
        "spearman_ends": reading.spearman_ends if math.isfinite(reading.spearman_ends) else None,
        "stable": reading.stable and len(reading.rungs) > 1,
        "extrapolated": reading.extrapolated,
        "lines": list(reading.lines),
        **({"ranked_by": reading.rule} if reading.rule else {}),
    }
