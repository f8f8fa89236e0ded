"""What the search records on a study and its trials, and how to read an outcome back.

The search writes its results as Optuna user attrs; the report, export and the progress
lines read them back. Their names are the constants below (the constant is the attribute
name upper-cased), so writer and readers cannot drift apart. A trial's outcome is one word
(:func:`trial_status`): ``completed``, ``unstable`` (pruned), ``failed``, ``interrupted``
(its worker died or was stopped; the point is queued again), ``duplicate`` or ``skipped``
(bookkeeping trials that never trained), ``running`` or ``waiting``. This module imports
neither torch nor the trainer.
"""

from __future__ import annotations

import math

from optuna.trial import FrozenTrial, TrialState

from geosearch.search.ranking import trial_label, trial_score

__all__ = [
    "FINISHED",
    "NOT_RUN",
    "trial_line",
    "trial_status",
]

# --------------------------------------------------------------------------- study attrs
SPACE = "space"  # SearchSpace.to_dict()
GEOSEARCH_VERSION = "geosearch_version"
RULES = "rules"
PROXY = "proxy"  # the proxy run: TrainConfig fields + repeats + seeds

# --------------------------------------------------------------------------- trial attrs
ASSIGNMENT = "assignment"  # module type -> geometry, resolved
ASSIGNMENT_KEY = "assignment_key"  # "attn_out=stiefel,attn_qkv=stiefel,..." sorted by type
BUDGET_STEPS = "budget_steps"
SEEDS = "seeds"
TRIAL_DIR = "trial_dir"  # relative to the run directory
PROBE_HISTORY = "probe_history"  # {step, max_logit, min_entropy, train_loss} rows
STATUS = "status"
PRUNE_REASON = "prune_reason"
FAIL_REASON = "fail_reason"
STOP_STEP = "stop_step"
VAL_LOSSES = "val_losses"
VAL_LOSS_MEAN = "val_loss_mean"
VAL_LOSS_STD = "val_loss_std"  # None with one seed
MEAN_STEP_MS = "mean_step_ms"
TOKENS_PER_S = "tokens_per_s"
MAX_LOGIT = "max_logit"
SIGMA_MAX = "sigma_max"
NUM_PROCESSES = "num_processes"  # processes that trained it: data parallel when > 1
# bookkeeping
WORKER = "worker"  # {host, pid, lock}
HEARTBEAT = "heartbeat"  # unix time
QUEUED = "queued"
QUEUED_PARAMS = "queued_params"
RETRY_OF = "retry_of"
DUPLICATE_OF = "duplicate_of"

# --------------------------------------------------------------------------- outcomes
FINISHED = ("completed", "unstable", "failed")
"""Outcomes with a verdict: they count towards the trial budget."""
NOT_RUN = ("duplicate", "skipped")
"""FAIL trials that never trained: bookkeeping, left out of reports."""
_STATE_WORDS = {TrialState.COMPLETE: "completed", TrialState.PRUNED: "unstable",
                TrialState.RUNNING: "running", TrialState.WAITING: "waiting"}


def trial_status(trial: FrozenTrial) -> str:
    """What became of a trial, in one word.

    ``completed``, ``unstable`` (pruned), ``failed``, ``interrupted`` (a FAIL trial whose
    worker died or was stopped: its point is queued again), ``duplicate`` or ``skipped``
    (FAIL bookkeeping trials that never trained), ``running`` or ``waiting`` (queued).
    """
    ua = trial.user_attrs
    if trial.state == TrialState.FAIL:
        status = ua.get(STATUS)
        if status in (*NOT_RUN, "failed"):
            return status
        reason = ua.get(FAIL_REASON)
        if status in ("running", "interrupted") or (
                status is None and isinstance(reason, str) and reason.startswith("interrupted")):
            return "interrupted"
        return "failed"
    return _STATE_WORDS.get(trial.state, trial.state.name.lower())


def trial_line(trial: FrozenTrial) -> str:
    """One line per finished trial: point, outcome (and why), val loss, max logit, speed."""
    ua = trial.user_attrs
    status = trial_status(trial)
    head = f"trial {trial.number:>3}  {trial_label(trial)}"
    if status == "completed":
        what = f"completed  val {trial_score(trial).text()}"
    elif status == "unstable":
        step = ua.get(STOP_STEP)
        what = f"PRUNED{f' at step {step}' if step is not None else ''}: {ua.get(PRUNE_REASON)}"
    elif status in NOT_RUN:
        return f"{head}  not run: {ua.get(FAIL_REASON)}"
    elif status == "interrupted":
        what = ua.get(FAIL_REASON) or "interrupted"  # the stored reasons start with the word
    else:
        what = f"FAILED: {ua.get(FAIL_REASON) or 'no message'}"
    extra = []
    if isinstance(ua.get(MAX_LOGIT), (int, float)):
        extra.append(f"max logit {ua[MAX_LOGIT]:.3g}")
    if isinstance(ua.get(MEAN_STEP_MS), (int, float)) and math.isfinite(ua[MEAN_STEP_MS]):
        extra.append(f"{ua[MEAN_STEP_MS]:.1f} ms/step")
    return "  ".join([head, what, *extra])
