"""Read a run directory into the records the report is built from.

:func:`load_run` opens the run's Optuna storage the way ``geosearch export`` does
(:func:`geosearch.search.runtime.storage.open_run_study`) and turns every trial that trained into a
:class:`TrialRecord`: its outcome word (:func:`geosearch.search.records.trial_status`), the
searched geometries, the score over seeds, the step it stopped at and why, its speed, the
``metrics.jsonl`` records of each seed (at the last rung it reached), and its losses and
probes at each rung of the Σ η ladder, whose reading towards the target
(:func:`geosearch.search.horizon.reading.study_reading`) the run keeps too. The user attrs are read
through the constants of :mod:`geosearch.search.records`; missing or truncated files give
what can be read, never an error. Duplicate and skipped bookkeeping trials are counted, not loaded;
a point's adaptive-seed trials are merged into its score, and baselines are kept apart
(``RunData.baselines``).
"""

from __future__ import annotations

import inspect
import json
import math
from functools import partial
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import FrozenTrial

from geosearch.search.horizon.ladder import HorizonReading, Rung
from geosearch.search.horizon.outlook import StabilityRow, stability_rows
from geosearch.search.space.spec import study_pruner
from geosearch.search.horizon.pruner import LogitGrowthPruner
from geosearch.search.stats.scores import Score
from geosearch.search.stats.trials import family_geometry, point_scores, trial_label, trial_score
from geosearch.search.records import (
    LOGIT_SCALE,
    ASSIGNMENT,
    BUDGET_STEPS,
    FAIL_REASON,
    LADDER,
    MEAN_STEP_MS,
    NOT_RUN,
    PROBE_HISTORY,
    PRUNE_REASON,
    RUNG_INDICES,
    RUNG_LOSSES,
    SPACE,
    STOP_STEP,
    TARGET,
    TOKENS_PER_S,
    TRIAL_DIR,
    BASELINE,
    SEED_OF,
    trial_status,
)
from geosearch.search.records import read_probes_file, read_rung_probes
from geosearch.search.runtime.storage import open_run_study, resolve_storage
from geosearch.util.urls import mask_url
from geosearch.search.horizon.reading import rung_means, study_reading

__all__ = ["RunData", "TrialRecord", "as_finite", "load_run", "mean_finite", "read_metrics"]


@dataclass
class TrialRecord:
    """What the report needs about one trial, read from storage and trial files.

    Attributes:
        number: Optuna trial number.
        status: "completed", "unstable" (pruned as unstable), "pruned" (by a loss pruner),
            "failed", "interrupted" (its worker died or was stopped; the point was queued
            again), "running" or "waiting"
            (:func:`geosearch.search.records.trial_status`).
        label: the searched geometries, e.g. ``"attn=stiefel, mlp=dgram"``.
        assignment: module type -> geometry (fully resolved; may be empty).
        geometry_params: the searched ``geometry.*`` parameters without the prefix.
        other_params: the non-geometry parameters (``spectral_lr``, ``lr``...).
        loss: final validation loss over seeds (``n == 0``: none recorded).
        stop_step: the step a pruned trial stopped at.
        reason: why it was pruned, the failure message, or how it was interrupted.
        steps_run: steps each seed trained (stop step, else budget, else last metrics step),
            the lower rungs' steps included when it trained a ladder.
        mean_step_ms: mean wall time of one training step.
        tokens_per_s: training throughput.
        duration_s: wall time of the whole trial from the storage timestamps.
        metrics: one list of metrics.jsonl records per seed (first seed first), at the
            last rung the trial reached.
        probe_history: the ``probe_history`` user attr (fallback for the logit curve).
        rung_losses: per rung reached, the mean final val loss over its seeds (NaN where a
            seed has none).
        rung_probes: per rung reached, the first seed's probe rows (each with ``sum_eta``).
        rung_indices: the ladder rung of each ``rung_losses`` entry (from ``rung_indices``,
            the rungs planned, lowest first: an AdamW baseline trains rung 0 only), else
            ``0, 1, ...``.
        baseline: a baseline trial's name (``adamw``, ``muon``, ``muon_qkclip``), else ``None``.
    """

    number: int
    status: str
    label: str
    assignment: dict[str, str]
    geometry_params: dict[str, str]
    other_params: dict[str, Any]
    loss: Score
    stop_step: int | None = None
    reason: str | None = None
    steps_run: int | None = None
    mean_step_ms: float | None = None
    tokens_per_s: float | None = None
    duration_s: float | None = None
    metrics: list[list[dict]] = field(default_factory=list)
    probe_history: list[dict] = field(default_factory=list)
    rung_losses: list[float] = field(default_factory=list)
    rung_probes: list[list[dict]] = field(default_factory=list)
    rung_indices: list[int] = field(default_factory=list)
    baseline: str | None = None

    def family_geometry(self, family: str) -> str:
        """The geometry of a module family ("attn", "mlp"), ``"mixed: ..."`` when its types differ."""
        return family_geometry(self.assignment or self.geometry_params, family)

    def time_s(self) -> float | None:
        """Training time: mean step time × steps run, else the trial's wall time."""
        if self.mean_step_ms is not None and self.steps_run:
            return self.mean_step_ms * self.steps_run / 1000.0
        return self.duration_s


@dataclass
class RunData:
    """A loaded run directory.

    Attributes:
        run_dir: the run directory.
        storage: the storage URL (password masked) or journal path that was opened.
        study: the Optuna study (for the ranking and the importance evaluator).
        trials: one record per trial, in trial-number order, without the trials that
            never trained (duplicate and skipped).
        threshold: the pruner's max-logit threshold, ``None`` when unknown.
        threshold_source: where the threshold came from, in words.
        attrs: the study's user attrs (``space``, ``proxy``, ``geosearch_version``...).
        not_run: how many duplicate and skipped trials were left out.
        target: the study's target (``{steps, spectral_lr, model, sum_eta}``), ``None``
            for a study from before targets.
        rungs: the ladder's rungs (one, the proxy run, unless the space asked for more).
        reading: the ladder's reading towards the target; ``None`` when there is nothing
            to read (the target is the proxy run).
        baselines: the baseline trials (adamw, muon, ...), never ranked.
        seed_trials: how many adaptive-seed trials were merged into their points' scores.
        stability: each completed point's and baseline's last max logit and its forecast at
            the target (:func:`geosearch.search.horizon.outlook.stability_rows`), points first.
    """

    run_dir: Path
    storage: str
    study: optuna.Study
    trials: list[TrialRecord]
    threshold: float | None
    threshold_source: str
    attrs: dict[str, Any]
    not_run: int = 0
    target: dict[str, Any] | None = None
    rungs: list[Rung] = field(default_factory=list)
    reading: HorizonReading | None = None
    baselines: list[TrialRecord] = field(default_factory=list)
    seed_trials: int = 0
    stability: list[StabilityRow] = field(default_factory=list)

    @property
    def study_name(self) -> str:
        return self.study.study_name


def read_metrics(path: str | Path) -> list[dict]:
    """Records of one ``metrics.jsonl`` (missing file → ``[]``; unreadable lines are skipped).

    A run killed mid-write leaves a truncated last line: the report shows what it can.
    """
    path = Path(path)
    if not path.is_file():
        return []
    out = []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        line = line.strip()
        if not line:
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(rec, dict):
            out.append(rec)
    return out


def _trial_metrics(trial_dir: Path) -> list[list[dict]]:
    """metrics.jsonl records per seed: ``trials/<n>/metrics.jsonl`` or ``trials/<n>/seed<s>/``,
    under the last ``rung<k>/`` the trial reached when it trained a ladder."""
    rung_dirs = [p for p in trial_dir.glob("rung*") if p.is_dir() and p.name[4:].isdigit()]
    if rung_dirs:
        trial_dir = max(rung_dirs, key=lambda p: int(p.name[4:]))
    seed_dirs = [p for p in trial_dir.glob("seed*") if p.is_dir() and p.name[4:].isdigit()]
    if seed_dirs:
        seed_dirs.sort(key=lambda p: int(p.name[4:]))
        runs = [read_metrics(p / "metrics.jsonl") for p in seed_dirs]
        return [r for r in runs if r]
    run = read_metrics(trial_dir / "metrics.jsonl")
    return [run] if run else []


def as_finite(x: Any) -> float | None:
    """``x`` as a float when it is a finite number, else ``None``."""
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


def mean_finite(values: Iterable[Any]) -> float | None:
    """Mean of the finite numbers among ``values``; ``None`` when there are none."""
    xs = [v for v in (as_finite(x) for x in values) if v is not None]
    return sum(xs) / len(xs) if xs else None


def _geometry_params(params: dict[str, Any]) -> dict[str, str]:
    return {k[len("geometry.") :]: str(v) for k, v in sorted(params.items()) if k.startswith("geometry.")}


def _record(trial: FrozenTrial, run_dir: Path, rungs: list[Rung], score: Score | None = None) -> TrialRecord:
    ua = trial.user_attrs
    geo = _geometry_params(trial.params)
    other = {k: v for k, v in sorted(trial.params.items()) if not k.startswith("geometry.")}
    assignment = ua.get(ASSIGNMENT) if isinstance(ua.get(ASSIGNMENT), dict) else {}
    assignment = {str(k): str(v) for k, v in assignment.items()}
    status = trial_status(trial)

    trial_dir = run_dir / str(ua.get(TRIAL_DIR) or f"trials/{trial.number}")
    metrics = _trial_metrics(trial_dir)
    first = metrics[0] if metrics else []

    stop_step = ua.get(STOP_STEP)
    if stop_step is None and status in ("unstable", "pruned"):
        # no attr: the last step the pruner saw, else the last step in metrics.jsonl
        stop_step = trial.last_step
        if stop_step is None and first:
            stop_step = first[-1].get("step")
    reason = None
    if status in ("unstable", "pruned"):
        reason = ua.get(PRUNE_REASON) or "no reason recorded"
    elif status == "failed":
        reason = ua.get(FAIL_REASON) or "no message recorded"
    elif status in ("interrupted", "retried"):
        reason = ua.get(FAIL_REASON) or status

    last_step = as_finite(first[-1].get("step")) if first else None
    budget = as_finite(ua.get(BUDGET_STEPS))
    if stop_step is not None:
        steps_run = int(stop_step)
    elif status == "completed" and budget is not None:
        steps_run = int(budget)
    else:
        steps_run = int(last_step) if last_step is not None else None
    reached = rung_means(ua.get(RUNG_LOSSES)) or []
    if len(rungs) > 1 and reached and steps_run is not None:  # the rungs below the last reached
        lower = sum(r.steps for r in rungs[:len(reached) - 1])
        steps_run = lower + (rungs[len(reached) - 1].steps if status == "completed" else steps_run)

    mean_step_ms = as_finite(ua.get(MEAN_STEP_MS))
    if mean_step_ms is None:
        mean_step_ms = mean_finite(r.get("step_ms") for r in first)
    tokens_per_s = as_finite(ua.get(TOKENS_PER_S))
    if tokens_per_s is None:
        tokens_per_s = mean_finite(r.get("tokens_per_s") for r in first)
    duration = trial.duration.total_seconds() if trial.duration is not None else None

    probe = read_probes_file(run_dir, trial).get(PROBE_HISTORY)
    rung_probes = read_rung_probes(trial_dir)
    indices = ua.get(RUNG_INDICES)  # the rungs planned, lowest first: those reached lead
    if isinstance(indices, list) and len(indices) >= len(reached) and all(isinstance(i, int) for i in indices):
        indices = indices[:len(reached)]
    else:
        indices = list(range(len(reached)))
    return TrialRecord(
        number=trial.number,
        status=status,
        label=trial_label(trial, hyperparams=False),
        assignment=assignment,
        geometry_params=geo,
        other_params=other,
        loss=score if score is not None else trial_score(trial),
        stop_step=int(stop_step) if stop_step is not None else None,
        reason=str(reason) if reason is not None else None,
        steps_run=steps_run,
        mean_step_ms=mean_step_ms,
        tokens_per_s=tokens_per_s,
        duration_s=duration,
        metrics=metrics,
        probe_history=probe if isinstance(probe, list) else [],
        rung_losses=reached,
        rung_probes=rung_probes,
        rung_indices=indices,
        baseline=str(ua[BASELINE]) if ua.get(BASELINE) is not None else None,
    )


def _threshold(pruner: LogitGrowthPruner, attrs: dict[str, Any],
               trials: list[FrozenTrial]) -> tuple[float | None, str]:
    """The max-logit threshold the pruner judged the trials against: its rule on the proxy's
    d/√d_head (``logit_scale``) when the trials store it, else the study's pruner settings'
    ``max_logit``, else LogitGrowthPruner's default."""
    scaled = next((t for t in trials if as_finite(t.user_attrs.get(LOGIT_SCALE)) is not None), None)
    if scaled is not None:
        value, text = pruner.max_logit_threshold(scaled)
        return value, f"the pruner's rule, {text}"
    space = attrs.get(SPACE)
    pruner = space.get("pruner") if isinstance(space, dict) else None
    found = _find_key(pruner, "max_logit") if pruner is not None else None
    if found is not None:
        return found, "the study's pruner settings"
    param = inspect.signature(LogitGrowthPruner).parameters.get("max_logit")
    default = as_finite(param.default) if param is not None else None
    if default is None:
        return None, "unknown (no pruner settings in the study, no LogitGrowthPruner default)"
    return default, "the LogitGrowthPruner default"


def _find_key(obj: Any, key: str) -> float | None:
    if isinstance(obj, dict):
        if key in obj and as_finite(obj[key]) is not None:
            return as_finite(obj[key])
        for v in obj.values():
            found = _find_key(v, key)
            if found is not None:
                return found
    elif isinstance(obj, list):
        for v in obj:
            found = _find_key(v, key)
            if found is not None:
                return found
    return None


def load_run(run_dir: str | Path, *, study_name: str | None = None, storage: str | None = None) -> RunData:
    """Read a run directory: study storage and trial files.

    Args:
        run_dir: ``runs/<study>``.
        study_name: the study to open; ``None`` = the only study in the storage.
        storage: storage URL or journal path overriding the run directory's own.

    Returns:
        The run's data; nothing is written (the storage is opened read-only).

    Raises:
        ConfigError: no such directory, no storage or both storages in it, a storage that
            is not an Optuna storage (an empty or another application's database), no study, or
            several studies and no ``study_name`` (see
            :func:`geosearch.search.runtime.storage.open_run_study`).
    """
    run_dir = Path(run_dir)
    study = open_run_study(run_dir, study_name=study_name, storage=storage, read_only=True)
    where = mask_url(resolve_storage(run_dir, storage, create=False))
    attrs = dict(study.user_attrs)
    every = sorted(study.get_trials(deepcopy=False), key=lambda t: t.number)
    ran = [t for t in every if trial_status(t) not in NOT_RUN]
    pruner = study_pruner(study)
    threshold, source = _threshold(pruner, attrs, ran)
    ladder, target = attrs.get(LADDER), attrs.get(TARGET)
    rungs = [Rung(**r) for r in ladder] if isinstance(ladder, list) else []
    scores = point_scores(every)
    points = [_record(t, run_dir, rungs, scores.get(t.number)) for t in ran
              if SEED_OF not in t.user_attrs and BASELINE not in t.user_attrs]
    baselines = [_record(t, run_dir, rungs) for t in ran  # not a step halving's seed trial of one
                 if BASELINE in t.user_attrs and SEED_OF not in t.user_attrs]
    completed = [r.number for r in points + baselines if r.status == "completed"]
    return RunData(run_dir, where, study, points, threshold, source, attrs,
                   not_run=len(every) - len(ran), target=target if isinstance(target, dict) else None,
                   rungs=rungs, reading=study_reading(study), baselines=baselines,
                   seed_trials=sum(SEED_OF in t.user_attrs for t in ran),
                   stability=stability_rows(study, completed, pruner,
                                            partial(read_probes_file, run_dir)))

