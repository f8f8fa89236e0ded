"""What a study records: the names of its study and trial user attrs, and a trial's outcome.

Every user attr the search writes and every reader of a run directory uses the constants
below instead of string literals; each is defined once, named as its attr upper-cased
(``VAL_LOSSES = "val_losses"``). :func:`trial_status` turns a trial into one word of
its outcome (:func:`geosearch.search.stats.trials.trial_line` is the line the search
prints). Torch-free: reading a study needs no trainer. The meaning of each attr, and the
outcomes, are in ``docs/design.md`` ("The study").
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from optuna.trial import FrozenTrial, TrialState


__all__ = [
    "ASSIGNMENT", "BUDGET_STEPS", "DUPLICATE_OF", "FAILURE_KIND", "FAIL_REASON",
    "DATA_DIGEST", "GEOSEARCH_VERSION", "HEARTBEAT", "LADDER", "LOGIT_SCALE", "MAX_LOGIT",
    "MEAN_STEP_MS", "NUM_PROCESSES", "PROBE_HISTORY", "PROXY", "PRUNED_RUNG", "PRUNED_SEED",
    "PRUNE_REASON", "QUEUED", "QUEUED_PARAMS", "RETRIES", "RETRY_OF", "RULES", "RUNG_LOSSES",
    "RUNG_PROBES", "SEEDS",
    "SPACE", "STATUS", "STEP_FACTOR", "STOP_STEP", "TARGET", "TARGET_LOGIT_SCALE",
    "TARGET_STEPS", "TARGET_SUM_ETA", "TOKENS_PER_S", "TRIAL_DIR", "VAL_LOSSES",
    "WORKER", "SEED_OF", "BASELINE", "RUNG_INDICES",
    "STABILITY", "STABILITY_RUN", "STABILITY_PROBES", "STABILITY_PASSED_AT", "STABILITY_FROM",
    "STUDY_ATTRS", "TRIAL_ATTRS", "PROBE_FIELDS",
    "COMPLETED", "UNSTABLE", "PRUNED", "FAILED", "INTERRUPTED", "RETRIED", "RUNNING", "WAITING",
    "DUPLICATE", "SKIPPED", "STATUSES", "STATE_WORDS", "NOT_RUN", "FINISHED",
    "PROBES_FILE", "RUNG_PROBES_FILE", "is_extra", "json_safe", "read_probes_file",
    "read_rung_probes", "trial_status", "write_probes_file", "write_rung_probes",
]

# --------------------------------------------------------------------------- trial params
STEP_FACTOR = "step_factor"
"""The Optuna parameter of a space's step grid (``hyperparams.step_grid``): the factor of
``proxy.spectral_lr`` a point trains at (a param; docs/design.md, "Ranking"). A baseline,
which has no params, records the factor it trains at as a user attr of this name (AdamW's
``lr``, Muon's ``spectral_lr`` times it; docs/design.md, "Baselines")."""

# --------------------------------------------------------------------------- study attrs
SPACE = "space"
GEOSEARCH_VERSION = "geosearch_version"
RULES = "rules"
PROXY = "proxy"
TARGET = "target"
LADDER = "ladder"
STABILITY = "stability"  # the stability rung, or None (docs/design.md, "The stability rung")
# the data's and tokenizer's SHA-256 (geosearch.proxy.data.Corpus.digest)
DATA_DIGEST = "data_digest"
STUDY_ATTRS = (SPACE, GEOSEARCH_VERSION, RULES, PROXY, TARGET, LADDER, STABILITY, DATA_DIGEST)

# --------------------------------------------------------------------------- trial attrs
ASSIGNMENT = "assignment"
BUDGET_STEPS = "budget_steps"
SEEDS = "seeds"
TRIAL_DIR = "trial_dir"
PROBE_HISTORY = "probe_history"  # rows in the trial's probes.json, no attr
NUM_PROCESSES = "num_processes"
STATUS = "status"
PRUNE_REASON = "prune_reason"
FAIL_REASON = "fail_reason"
# environment / settings / assignment (geosearch.search.study.failures)
FAILURE_KIND = "failure_kind"
RETRIES = "retries"  # environment failures of the point, in a row, before this trial
STOP_STEP = "stop_step"
PRUNED_SEED = "pruned_seed"
VAL_LOSSES = "val_losses"  # their mean is the trial's value; no attr holds it or their spread
MEAN_STEP_MS = "mean_step_ms"
TOKENS_PER_S = "tokens_per_s"
MAX_LOGIT = "max_logit"  # the last probed; the rows (and their peak) are in probes.json
# the target and the ladder (docs/design.md, "Horizon")
TARGET_SUM_ETA = "target_sum_eta"
TARGET_STEPS = "target_steps"
LOGIT_SCALE = "logit_scale"
TARGET_LOGIT_SCALE = "target_logit_scale"
RUNG_LOSSES = "rung_losses"
# per rung, the first seed's rows: the trial's rung_probes.json, no attr
RUNG_PROBES = "rung_probes"
PRUNED_RUNG = "pruned_rung"
STABILITY_RUN = "stability_run"  # true while the stability rung trains: judged at the target
STABILITY_PROBES = "stability_probes"  # the stability rung's rows (probes.json, no attr)
# the step factor whose stability rung this trial passed
STABILITY_PASSED_AT = "stability_passed_at"
# step halving: the trial at a larger step whose pass stands for this one
STABILITY_FROM = "stability_from"
# bookkeeping
WORKER = "worker"
HEARTBEAT = "heartbeat"
QUEUED = "queued"
QUEUED_PARAMS = "queued_params"
RETRY_OF = "retry_of"
DUPLICATE_OF = "duplicate_of"
# trials that are not points of the space (docs/design.md, "Adaptive seeds", "Baselines")
SEED_OF = "seed_of"
BASELINE = "baseline"
RUNG_INDICES = "rung_indices"
TRIAL_ATTRS = (ASSIGNMENT, BUDGET_STEPS, SEEDS, TRIAL_DIR, PROBE_HISTORY,
               NUM_PROCESSES, STATUS, PRUNE_REASON, FAIL_REASON, STOP_STEP, PRUNED_SEED,
               VAL_LOSSES, MEAN_STEP_MS, TOKENS_PER_S, MAX_LOGIT,
               TARGET_SUM_ETA, TARGET_STEPS, LOGIT_SCALE, TARGET_LOGIT_SCALE,
               RUNG_LOSSES, PRUNED_RUNG, WORKER, HEARTBEAT, QUEUED, QUEUED_PARAMS,
               RETRY_OF, DUPLICATE_OF, FAILURE_KIND, RETRIES, SEED_OF, BASELINE, RUNG_INDICES,
               STABILITY_RUN, STABILITY_PROBES, STABILITY_PASSED_AT, STABILITY_FROM,
               STEP_FACTOR)

PROBE_FIELDS = ("step", "max_logit", "min_entropy", "train_loss", "sigma_max", "sum_eta")
"""The keys of one ``probe_history`` row: metrics of the proxy run at a probe step, and Σ η
after that step (``geosearch.search.horizon.probe_rows.probe_row`` builds one)."""

# --------------------------------------------------------------------------- outcomes
COMPLETED = "completed"
UNSTABLE = "unstable"
PRUNED = "pruned"  # by a loss pruner (MedianPruner, ...): not an instability
FAILED = "failed"
INTERRUPTED = "interrupted"
RETRIED = "retried"
RUNNING = "running"
WAITING = "waiting"
DUPLICATE = "duplicate"
SKIPPED = "skipped"
STATUSES = (COMPLETED, UNSTABLE, PRUNED, FAILED, INTERRUPTED, RETRIED, RUNNING, WAITING,
            DUPLICATE, SKIPPED)
STATE_WORDS = {TrialState.COMPLETE: COMPLETED, TrialState.PRUNED: UNSTABLE,
               TrialState.RUNNING: RUNNING, TrialState.WAITING: WAITING}
"""The outcome word of a trial in each Optuna state but FAIL (whose word is in ``status``)."""
NOT_RUN = (DUPLICATE, SKIPPED)
"""FAIL trials that never trained: bookkeeping, not results."""
FINISHED = (COMPLETED, UNSTABLE, PRUNED, FAILED)
"""Trials with a verdict: the ones the budget counts and the report shows as results."""


def trial_status(trial: FrozenTrial) -> str:
    """What became of a trial, in one word (see "Trial outcomes" in ``docs/design.md``).

    ``completed``, ``unstable`` (pruned as unstable), ``pruned`` (by a loss pruner),
    ``failed``, ``interrupted`` (a FAIL trial whose worker died or was stopped: its point
    is queued again), ``retried`` (a failure of the environment whose point is queued
    again), ``duplicate`` or ``skipped`` (FAIL bookkeeping trials that never trained),
    ``running`` or ``waiting`` (queued).
    """
    ua = trial.user_attrs
    if trial.state == TrialState.FAIL:
        status = ua.get(STATUS)
        if status in (*NOT_RUN, FAILED, RETRIED):
            return status
        reason = ua.get(FAIL_REASON)
        # its worker died before tell
        if status in (RUNNING, INTERRUPTED, COMPLETED, UNSTABLE, PRUNED) or (
                status is None and isinstance(reason, str) and reason.startswith(INTERRUPTED)):
            return INTERRUPTED
        if status is None and reason is None and (WORKER in ua or HEARTBEAT in ua or QUEUED in ua):
            # signed or queued by geosearch, then failed by the stale-trial recovery before its
            # worker set a status (it died, or its storage failed, right after the ask)
            return INTERRUPTED
        return FAILED
    if trial.state == TrialState.PRUNED and ua.get(STATUS) == PRUNED:
        return PRUNED
    return STATE_WORDS.get(trial.state, trial.state.name.lower())


def is_extra(trial: FrozenTrial | Any) -> bool:
    """Whether a trial (frozen or live) is not a point of the space: an adaptive seed of a
    point (``seed_of``) or a baseline (``baseline``). Such trials never count towards the
    budget, are never duplicates of a point and are never exported."""
    ua = trial.user_attrs
    return SEED_OF in ua or BASELINE in ua


def json_safe(v: Any) -> Any:
    """A value as Optuna stores a user attr (JSON): NaN/inf stay floats (its storages
    accept them), tuples become lists, dict keys strings."""
    if isinstance(v, (tuple, list)):
        return [json_safe(x) for x in v]
    if isinstance(v, dict):
        return {str(k): json_safe(x) for k, x in v.items()}
    return v


# --------------------------------------------------------------------------- probe files
RUNG_PROBES_FILE = "rung_probes.json"
"""A trained trial's probe rows per rung reached (its first seed's), in its folder: the
report's max logit against Σ η. Kept as a file, not a user attr."""

PROBES_FILE = "probes.json"
"""A trained trial's ``probe_history`` and ``stability_probes`` rows, in its folder: what
the pruner judged and the outlook reads. A file, not user attrs, so that a trial's attrs
fit a screen (they keep the last max logit)."""


def write_probes_file(trial_dir: Path, rows: dict[str, list[dict]]) -> None:
    """Write ``rows`` (name -> probe rows) to the trial's :data:`PROBES_FILE`."""
    trial_dir.mkdir(parents=True, exist_ok=True)
    (trial_dir / PROBES_FILE).write_text(json.dumps(json_safe(rows)), encoding="utf-8")


def read_probes_file(run_dir: Path, trial: FrozenTrial) -> dict[str, Any]:
    """The :data:`PROBES_FILE` of ``trial`` (in its ``trial_dir`` under ``run_dir``,
    :func:`write_probes_file`); ``{}`` when the file is missing or does not read as a dict."""
    trial_dir = Path(run_dir) / str(trial.user_attrs.get(TRIAL_DIR) or f"trials/{trial.number}")
    try:
        rows = json.loads((trial_dir / PROBES_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return rows if isinstance(rows, dict) else {}


def write_rung_probes(trial_dir: Path, rungs: list[list[dict]]) -> None:
    """Write ``rungs`` (per rung, the probe rows) to the trial's :data:`RUNG_PROBES_FILE`."""
    trial_dir.mkdir(parents=True, exist_ok=True)
    (trial_dir / RUNG_PROBES_FILE).write_text(json.dumps(json_safe(rungs)), encoding="utf-8")


def read_rung_probes(trial_dir: Path) -> list[list[dict]]:
    """The trial's probe rows per rung (:func:`write_rung_probes`); ``[]`` when the file is
    missing or does not read as a list of lists of rows."""
    try:
        rungs = json.loads((trial_dir / RUNG_PROBES_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []
    if not isinstance(rungs, list):
        return []
    return [[r for r in rung if isinstance(r, dict)] for rung in rungs if isinstance(rung, list)]
