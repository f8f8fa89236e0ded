"""What one proxy run of a trial does to its trial: the run's callback (reports, probes, the
pruner's verdict) and the attrs a trained trial keeps of its runs. Used by
:class:`~geosearch.search.study.trial_loop.Searcher`; the attrs are described in
``docs/design.md`` ("Study and trial attributes").
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import optuna

from geosearch.proxy.config import TrainResult
from geosearch.search.horizon.probes import probe_row
from geosearch.search.horizon.pruner import prune_verdict
from geosearch.search.records import (
    MAX_LOGIT,
    MEAN_STEP_MS,
    PROBE_HISTORY,
    PRUNED_RUNG,
    RUNG_LOSSES,
    RUNG_PROBES,
    SIGMA_MAX,
    STOP_STEP,
    TOKENS_PER_S,
    json_safe,
)
from geosearch.search.runtime.interrupts import CTRL_C
from geosearch.search.runtime.liveness import Heartbeat, TrialLost

__all__ = ["run_attrs", "run_callback", "stopped_attrs"]


def run_callback(study: optuna.Study, trial: optuna.Trial, history: list[dict],
                 sum_eta: Callable[[int], float | None], heartbeat: Heartbeat, *, report: bool, judge: bool,
                 on_prune: Callable[[bool], None],
                 target_step: Callable[[int], int] | None = None) -> Callable[[int, dict], str | None]:
    """The trainer's callback for one run of ``trial``.

    It reports (``report``: the first seed at the ranked, top rung only, as Optuna keeps one
    value per step and the trial's value is read there), records probes (appended to
    ``history``, with their Σ η, and with ``target_step`` the target's step at their Σ η²)
    and asks the pruner (``judge``: the stability rung, and a rung whose spectral step is not
    above the target's; a larger step stands in for Σ η in the loss, but its logits overshoot
    the long run's at the same Σ η: ``docs/design.md``, "The ladder"). A prune calls
    ``on_prune(unstable)`` and returns the reason, which stops the run; the trainer stops a
    non-finite run at any rung.
    """
    pruner = study.pruner

    def callback(step: int, metrics: dict) -> str | None:
        if heartbeat.lost.is_set():
            raise TrialLost
        if CTRL_C.is_set():  # a Ctrl-C whose KeyboardInterrupt Python swallowed (see ctrl_c_latch)
            raise KeyboardInterrupt
        try:
            if report and metrics.get("val_loss") is not None:
                trial.report(float(metrics["val_loss"]), step)
            if metrics.get("max_logit") is not None:
                row = probe_row(metrics, sum_eta=sum_eta(step))
                if target_step is not None:
                    row["target_step"] = target_step(step)
                history.append(json_safe(row))
                trial.set_user_attr(PROBE_HISTORY, list(history))
        except optuna.exceptions.UpdateFinishedTrialError:
            raise TrialLost from None
        if not judge or not trial.should_prune():
            return None
        why, unstable = prune_verdict(pruner, study, trial, step)
        on_prune(unstable)
        return why

    return callback


def run_attrs(results: list[list[TrainResult]], probes: list[list[list[dict]]]) -> dict[str, Any]:
    """The attrs of a trained trial whatever its outcome: the first seed's probes at the
    last rung it reached (and at every rung), speed, last max logit, losses per rung."""
    first = results[-1][0]
    probed = [m for m in first.history if m.get("max_logit") is not None]
    runs = [r for rung in results for r in rung]
    speeds = [r.mean_step_ms for r in runs if math.isfinite(r.mean_step_ms)]
    tokens = [r.tokens_per_s for r in runs if math.isfinite(r.tokens_per_s)]
    return {
        PROBE_HISTORY: probes[-1][0],
        MEAN_STEP_MS: sum(speeds) / len(speeds) if speeds else None,
        TOKENS_PER_S: sum(tokens) / len(tokens) if tokens else None,
        MAX_LOGIT: probed[-1]["max_logit"] if probed else None,
        SIGMA_MAX: probed[-1].get("sigma_max") if probed else None,
        RUNG_LOSSES: [[r.final_val_loss for r in rung] for rung in results],
        RUNG_PROBES: [rung[0] for rung in probes],
    }


def stopped_attrs(result: TrainResult, rows: list[dict]) -> dict[str, Any]:
    """The attrs of a trial whose stability rung did not complete (its probe ``rows``): no
    rung of the ladder was trained."""
    last = rows[-1] if rows else {}
    return {PROBE_HISTORY: rows, PRUNED_RUNG: "stability", STOP_STEP: result.stop_step,
            MEAN_STEP_MS: result.mean_step_ms if math.isfinite(result.mean_step_ms) else None,
            MAX_LOGIT: last.get("max_logit"), SIGMA_MAX: last.get("sigma_max"), RUNG_LOSSES: [], RUNG_PROBES: []}
