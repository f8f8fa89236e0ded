"""What a study records: the names of its study and trial user attrs, and a trial's outcome.

Every user attr the search writes and every reader of a run directory uses the constants
below instead of string literals; each is defined once, named as its attr upper-cased
(``VAL_LOSS_MEAN = "val_loss_mean"``). :func:`trial_status` turns a trial into one word of
its outcome and :func:`trial_line` into the line the search prints. Torch-free: reading a
study needs no trainer. The meaning of each attr, and the outcomes, are in
``docs/design.md`` ("The study").
"""

from __future__ import annotations

import math
from typing import Any

from optuna.trial import FrozenTrial, TrialState

from geosearch.search.ranking import trial_label, trial_score

__all__ = [
    "ASSIGNMENT", "ASSIGNMENT_KEY", "BUDGET_STEPS", "DUPLICATE_OF", "FAIL_REASON",
    "GEOSEARCH_VERSION", "HEARTBEAT", "MAX_LOGIT", "MEAN_STEP_MS", "NUM_PROCESSES",
    "PROBE_HISTORY", "PROXY", "PRUNED_SEED", "PRUNE_REASON", "QUEUED", "QUEUED_PARAMS",
    "RETRY_OF", "RULES", "SEEDS", "SIGMA_MAX", "SPACE", "STATUS", "STOP_STEP", "TOKENS_PER_S",
    "TRIAL_DIR", "VAL_LOSSES", "VAL_LOSS_MEAN", "VAL_LOSS_STD", "WORKER",
    "STUDY_ATTRS", "TRIAL_ATTRS", "PROBE_FIELDS",
    "COMPLETED", "UNSTABLE", "FAILED", "INTERRUPTED", "RUNNING", "WAITING", "DUPLICATE",
    "SKIPPED", "STATUSES", "STATE_WORDS", "NOT_RUN", "FINISHED",
    "json_safe", "trial_line", "trial_status",
]

# --------------------------------------------------------------------------- study attrs
SPACE = "space"
GEOSEARCH_VERSION = "geosearch_version"
RULES = "rules"
PROXY = "proxy"
STUDY_ATTRS = (SPACE, GEOSEARCH_VERSION, RULES, PROXY)

# --------------------------------------------------------------------------- trial attrs
ASSIGNMENT = "assignment"
ASSIGNMENT_KEY = "assignment_key"
BUDGET_STEPS = "budget_steps"
SEEDS = "seeds"
TRIAL_DIR = "trial_dir"
PROBE_HISTORY = "probe_history"
NUM_PROCESSES = "num_processes"
STATUS = "status"
PRUNE_REASON = "prune_reason"
FAIL_REASON = "fail_reason"
STOP_STEP = "stop_step"
PRUNED_SEED = "pruned_seed"
VAL_LOSSES = "val_losses"
VAL_LOSS_MEAN = "val_loss_mean"
VAL_LOSS_STD = "val_loss_std"
MEAN_STEP_MS = "mean_step_ms"
TOKENS_PER_S = "tokens_per_s"
MAX_LOGIT = "max_logit"
SIGMA_MAX = "sigma_max"
# bookkeeping
WORKER = "worker"
HEARTBEAT = "heartbeat"
QUEUED = "queued"
QUEUED_PARAMS = "queued_params"
RETRY_OF = "retry_of"
DUPLICATE_OF = "duplicate_of"
TRIAL_ATTRS = (ASSIGNMENT, ASSIGNMENT_KEY, BUDGET_STEPS, SEEDS, TRIAL_DIR, PROBE_HISTORY,
               NUM_PROCESSES, STATUS, PRUNE_REASON, FAIL_REASON, STOP_STEP, PRUNED_SEED,
               VAL_LOSSES, VAL_LOSS_MEAN, VAL_LOSS_STD, MEAN_STEP_MS, TOKENS_PER_S, MAX_LOGIT,
               SIGMA_MAX, WORKER, HEARTBEAT, QUEUED, QUEUED_PARAMS, RETRY_OF, DUPLICATE_OF)

PROBE_FIELDS = ("step", "max_logit", "min_entropy", "train_loss")
"""The keys of one ``probe_history`` row (metrics of the proxy run at a probe step)."""

# --------------------------------------------------------------------------- outcomes
COMPLETED = "completed"
UNSTABLE = "unstable"
FAILED = "failed"
INTERRUPTED = "interrupted"
RUNNING = "running"
WAITING = "waiting"
DUPLICATE = "duplicate"
SKIPPED = "skipped"
STATUSES = (COMPLETED, UNSTABLE, FAILED, INTERRUPTED, RUNNING, WAITING, DUPLICATE, SKIPPED)
STATE_WORDS = {TrialState.COMPLETE: COMPLETED, TrialState.PRUNED: UNSTABLE,
               TrialState.RUNNING: RUNNING, TrialState.WAITING: WAITING}
"""The outcome word of a trial in each Optuna state but FAIL (whose word is in ``status``)."""
NOT_RUN = (DUPLICATE, SKIPPED)
"""FAIL trials that never trained: bookkeeping, not results."""
FINISHED = (COMPLETED, UNSTABLE, FAILED)
"""Trials with a verdict: the ones the budget counts and the report shows as results."""


def trial_status(trial: FrozenTrial) -> str:
    """What became of a trial, in one word (see "Trial outcomes" in ``docs/design.md``).

    ``completed``, ``unstable`` (pruned), ``failed``, ``interrupted`` (a FAIL trial whose
    worker died or was stopped: its point is queued again), ``duplicate`` or ``skipped``
    (FAIL bookkeeping trials that never trained), ``running`` or ``waiting`` (queued).
    """
    ua = trial.user_attrs
    if trial.state == TrialState.FAIL:
        status = ua.get(STATUS)
        if status in (*NOT_RUN, FAILED):
            return status
        reason = ua.get(FAIL_REASON)
        if status in (RUNNING, INTERRUPTED, COMPLETED, UNSTABLE) or (  # its worker died before tell
                status is None and isinstance(reason, str) and reason.startswith(INTERRUPTED)):
            return INTERRUPTED
        return FAILED
    return STATE_WORDS.get(trial.state, trial.state.name.lower())


def trial_line(trial: FrozenTrial) -> str:
    """One line per finished trial: point, outcome (and why), val loss, max logit, speed."""
    ua = trial.user_attrs
    status = trial_status(trial)
    head = f"trial {trial.number:>3}  {trial_label(trial)}"
    if status == COMPLETED:
        what = f"completed  val {trial_score(trial).text()}"
    elif status == UNSTABLE:
        step = ua.get(STOP_STEP)
        what = f"PRUNED{f' at step {step}' if step is not None else ''}: {ua.get(PRUNE_REASON)}"
    elif status in NOT_RUN:
        return f"{head}  not run: {ua.get(FAIL_REASON)}"
    elif status == INTERRUPTED:
        what = ua.get(FAIL_REASON) or INTERRUPTED  # the stored reasons start with the word
    else:
        what = f"FAILED: {ua.get(FAIL_REASON) or 'no message'}"
    extra = []
    if isinstance(ua.get(MAX_LOGIT), (int, float)):
        extra.append(f"max logit {ua[MAX_LOGIT]:.3g}")
    if isinstance(ua.get(MEAN_STEP_MS), (int, float)) and math.isfinite(ua[MEAN_STEP_MS]):
        extra.append(f"{ua[MEAN_STEP_MS]:.1f} ms/step")
    return "  ".join([head, what, *extra])


def json_safe(v: Any) -> Any:
    """A value as Optuna stores a user attr (JSON): NaN/inf stay floats (its storages
    accept them), tuples become lists, dict keys strings."""
    if isinstance(v, (tuple, list)):
        return [json_safe(x) for x in v]
    if isinstance(v, dict):
        return {str(k): json_safe(x) for k, x in v.items()}
    return v
