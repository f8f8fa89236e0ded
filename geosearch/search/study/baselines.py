"""Baselines: the optimizers people use today, trained beside the assignments, never exported.

A space's ``baselines:`` names them (:data:`BASELINES`). ``adamw`` gives every module type the
space assigns the geometry ``adamw`` (plain AdamW at the proxy's ``lr``), ``muon`` gives them
``euclidean`` (unconstrained Muon at the proxy's ``spectral_lr``) and ``muon_qkclip`` the
same with Kimi K2's QK-clip (the proxy's ``qk_clip`` at τ = 100); none is tuned separately.
Each is a trial of its own with the ``baseline`` attr, queued once the space's points are
done (:func:`queue_baselines`), trained with the study's seeds at every rung of the Σ η ladder
(a Muon step moves σ by at most η too, so Σ η means the same) or, for AdamW, which takes no
spectral step, at rung 0 only. :func:`baseline_table` compares each ranked assignment with
each baseline at the baseline's top rung: Δ loss (negative: the assignment is better) with
the 95% interval of the paired test on shared seeds, and the ms/step ratio; and it says how
each baseline trained (its step, and Muon's shape convention and msign). Torch-free.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import optuna
from optuna.trial import FrozenTrial

from geosearch.checks import finite_or_none
from geosearch.search.study.queue import enqueue
from geosearch.search.stats.ranking import Ranking, rank_study
from geosearch.search.stats.scores import Score
from geosearch.search.stats.trials import trial_score
from geosearch.search.records import (
    BASELINE,
    COMPLETED,
    FINISHED,
    LADDER,
    MEAN_STEP_MS,
    PROXY,
    PRUNE_REASON,
    FAIL_REASON,
    RUNG_INDICES,
    RUNG_LOSSES,
    RUNNING,
    SEEDS,
    WAITING,
    trial_status,
)
from geosearch.search.stats.scores import compare
from geosearch.search.space.baselines import BASELINES, training_text
from geosearch.search.space.spec import SearchSpace, Suggestion


__all__ = ["BaselineRow", "BaselineTable", "baseline_suggestion", "baseline_table", "baselines_lines",
           "queue_baselines", "rung_score"]

def baseline_suggestion(space: SearchSpace, name: str) -> Suggestion:
    """The run of baseline ``name``: every key of the space's ``geometries`` gets the
    baseline's geometry, the proxy's settings otherwise (not a point of the space)."""
    spec = BASELINES[name]
    return Suggestion({k: spec.geometry for k in space.geometries}, {}, dict(spec.train_overrides),
                      space.rules)


def queue_baselines(study: optuna.Study, space: SearchSpace) -> list[str]:
    """Queue each baseline of ``space`` that no trial has run, is running or waits for
    (keyed by name, so calling it again queues nothing twice).

    Returns:
        The names queued.
    """
    have = {t.user_attrs.get(BASELINE) for t in study.get_trials(deepcopy=False)
            if trial_status(t) in (*FINISHED, RUNNING, WAITING)}
    queued = [name for name in space.baselines if name not in have]
    for name in queued:
        enqueue(study, {}, marks={BASELINE: name})
    return queued


# --------------------------------------------------------------------------- reading
def rung_score(trial: FrozenTrial, rung: int) -> Score | None:
    """A trial's final val losses at ladder rung ``rung`` with their seeds (``rung_losses``,
    ``rung_indices``, ``seeds``), ``None`` when it did not train that rung."""
    losses, seeds = trial.user_attrs.get(RUNG_LOSSES), trial.user_attrs.get(SEEDS)
    if not isinstance(losses, list):
        return None
    indices = trial.user_attrs.get(RUNG_INDICES) or list(range(len(losses)))
    if rung not in indices or not isinstance(losses[indices.index(rung)], list):
        return None
    values = losses[indices.index(rung)]
    seeds = seeds[:len(values)] if isinstance(seeds, list) else None
    return Score.of(values, seeds)


@dataclass(frozen=True)
class BaselineRow:
    """One assignment against one baseline at the baseline's top rung.

    Attributes:
        number, label: the ranked assignment.
        delta: its mean loss minus the baseline's (paired: the mean per-seed difference);
            negative = the assignment is better.
        interval: half-width of the 95% interval of ``delta`` (``None``: no spread).
        test: ``"paired"``, ``"welch"`` or ``"none"``.
        step_ratio: its ms/step over the baseline's (``None``: not recorded).
    """

    number: int
    label: str
    delta: float
    interval: float | None
    test: str
    step_ratio: float | None

    def text(self) -> str:
        """``"-0.0312 ± 0.0100 (paired), better"``."""
        if self.interval is None:
            return f"{self.delta:+.4f} (no spread)"
        word = ("better" if self.delta < -self.interval else
                "worse" if self.delta > self.interval else "within noise")
        return f"{self.delta:+.4f} ± {self.interval:.4f} ({self.test}), {word}"


@dataclass(frozen=True)
class BaselineTable:
    """Per baseline: its outcome, the rung it is compared at, and one row per assignment.

    Attributes:
        baselines: name -> ``{"trial", "status", "rung", "sum_eta", "score", "step_ms",
            "reason", "trained"}`` (the latest trial of that baseline; ``trained``: how it
            trained, :func:`~geosearch.search.space.baselines.training_text`, ``None``
            without the study's proxy record).
        rows: name -> the :class:`BaselineRow` of each ranked assignment (best first);
            empty when the baseline did not complete.
    """

    baselines: dict[str, dict[str, Any]]
    rows: dict[str, list[BaselineRow]]


def baseline_table(study: optuna.Study, ranking: Ranking | None = None) -> BaselineTable:
    """Compare every ranked assignment of ``study`` with each baseline it trained."""
    ranking = ranking or rank_study(study)
    trials = {t.number: t for t in study.get_trials(deepcopy=False)}
    ladder = study.user_attrs.get(LADDER)
    top = len(ladder) - 1 if isinstance(ladder, list) and ladder else 0
    latest: dict[str, FrozenTrial] = {}
    for t in sorted(trials.values(), key=lambda t: t.number):
        if BASELINE in t.user_attrs and trial_status(t) in FINISHED:
            latest[t.user_attrs[BASELINE]] = t
    proxy = study.user_attrs.get(PROXY)
    info: dict[str, dict[str, Any]] = {}
    rows: dict[str, list[BaselineRow]] = {}
    for name, b in latest.items():
        indices = b.user_attrs.get(RUNG_INDICES) or list(range(len(b.user_attrs.get(RUNG_LOSSES) or [1])))
        rung = indices[-1]
        status = trial_status(b)
        score = trial_score(b) if status == COMPLETED else None
        step_ms = finite_or_none(b.user_attrs.get(MEAN_STEP_MS))
        entry = ladder[rung] if isinstance(ladder, list) and rung < len(ladder) else {}
        sum_eta = entry.get("sum_eta")
        trained = training_text(name, proxy, entry.get("spectral_lr")) \
            if isinstance(proxy, dict) and name in BASELINES else None
        info[name] = {"trial": b.number, "status": status, "rung": rung, "sum_eta": sum_eta,
                      "score": score, "step_ms": step_ms,
                      "reason": b.user_attrs.get(PRUNE_REASON) or b.user_attrs.get(FAIL_REASON),
                      "trained": trained}
        rows[name] = []
        if score is None or not score.n:
            continue
        for r in ranking.rows:
            mine = r.score if rung == top else rung_score(trials[r.number], rung)
            if mine is None or not mine.n:
                continue
            c = compare(score, mine)
            ms = finite_or_none(trials[r.number].user_attrs.get(MEAN_STEP_MS))
            rows[name].append(BaselineRow(r.number, r.label, c.diff, c.threshold, c.test,
                                          ms / step_ms if ms is not None and step_ms else None))
    return BaselineTable(info, rows)


def baselines_lines(table: BaselineTable) -> list[str]:
    """The table as the search prints it under the ranking (nothing without baselines)."""
    if not table.baselines:
        return []
    lines = ["baselines (reported, never exported; Δ = assignment - baseline at the baseline's "
             "rung, negative = the assignment is better; 95% interval; ms/step ratio):"]
    for name, b in table.baselines.items():
        where = f"rung {b['rung']}" + (f", Σ η {b['sum_eta']:.3g}" if b["sum_eta"] is not None else "")
        trained = [f"    trained as {b['trained']}"] if b["trained"] else []
        if b["status"] != COMPLETED:
            lines += [f"  {name} (trial {b['trial']}, {where}): {b['status']}: {b['reason']}", *trained]
            continue
        ms = f", {b['step_ms']:.1f} ms/step" if b["step_ms"] is not None else ""
        lines += [f"  {name} (trial {b['trial']}, {where}): val {b['score'].text()}{ms}", *trained]
        for r in table.rows[name]:
            ratio = f"  {r.step_ratio:.2f}x ms/step" if r.step_ratio is not None else ""
            lines.append(f"    {r.label} (trial {r.number}): Δ {r.text()}{ratio}")
    return lines
