"""Plots and a markdown report of one run directory.

``geosearch report runs/<study>`` reads only the run directory: the Optuna storage
(``study.db`` or ``journal.log``, opened as ``geosearch export`` opens it, see the storage
conventions in ``geosearch/search/study.py``) and the per-trial ``metrics.jsonl`` files.
It writes ``report.md`` and, when matplotlib is installed
(``pip install 'geosearch[report]'``), ``plots/*.png``.

The ranking and its verdict are the search's own (:mod:`geosearch.search.ranking`: mean
± std over seeds, ties by a Welch t-test at 5%), so the report and the ranking printed
after ``geosearch search`` always agree. Trials that never trained (``duplicate`` and
``skipped`` bookkeeping trials) are left out; a trial whose worker died or was stopped
shows as ``interrupted``.

The work is split into pure steps so tests can check numbers::

    run = load_run("runs/default")          # storage + trial files -> RunData
    ranking = rank_study(run.study)          # the search's ranking and verdict
    importance = geometry_importances(run.study)
    cost = cost_table(run.trials)            # ms/step, tokens/s, ratio to a baseline
    front = pareto_front([(t, loss), ...])   # loss-versus-time front (indices)
    text = render_markdown(run, ...)         # the report
    make_plots(run, "runs/default/plots")    # needs matplotlib

:func:`write_report` does all of it.
"""

from __future__ import annotations

import inspect
import json
import math
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna
from optuna.distributions import CategoricalDistribution
from optuna.trial import FrozenTrial, TrialState

from geosearch.search.pruners import LogitGrowthPruner
from geosearch.search.ranking import (
    Ranking,
    Score,
    family_geometry,
    format_params,
    rank_study,
    trial_label,
    trial_score,
)
from geosearch.search.records import trial_status
from geosearch.search.storage import mask_url, open_run_study, resolve_storage

__all__ = [
    "CostRow",
    "CostTable",
    "Importance",
    "ReportFiles",
    "RunData",
    "TrialRecord",
    "PLOT_NAMES",
    "PLOTS_HINT",
    "cost_table",
    "dashboard_paragraph",
    "geometry_importances",
    "load_run",
    "make_plots",
    "pareto_front",
    "read_metrics",
    "render_markdown",
    "stability_table",
    "write_report",
]

#: Plot files written under ``<run>/plots/`` (name -> what it shows).
PLOT_NAMES = {
    "max_logit": "max attention logit over steps, coloured by attention geometry",
    "sigma_max": "largest singular value over steps, per module type and geometry",
    "val_loss": "validation loss over steps",
    "pareto": "final validation loss versus time, with the Pareto front",
    "importance": "importance of each module type's geometry",
}

PLOTS_HINT = "plots need matplotlib: pip install 'geosearch[report]'"

_FINISHED = ("completed", "unstable", "failed")
_NOT_RUN = ("duplicate", "skipped")  # bookkeeping trials that never trained: not shown
_BASELINES = (("adamw", "AdamW (all-adamw)"), ("euclidean", "Muon (all-euclidean)"))


# --------------------------------------------------------------------------- data
@dataclass
class TrialRecord:
    """What the report needs about one trial, read from storage and trial files.

    Attributes:
        number: Optuna trial number.
        state: "completed", "unstable" (pruned), "failed", "interrupted" (its worker died
            or was stopped; the point was queued again), "running" or "waiting"
            (:func:`geosearch.search.study.trial_status`).
        label: the searched geometries, e.g. ``"attn=stiefel, mlp=dgram"``.
        assignment: module type -> geometry (fully resolved; may be empty).
        geometry_params: the searched ``geometry.*`` parameters without the prefix.
        other_params: the non-geometry parameters (``spectral_lr``, ``lr``...).
        loss: final validation loss over seeds (``n == 0``: none recorded).
        stop_step: the step a pruned trial stopped at.
        reason: why it was pruned, the failure message, or how it was interrupted.
        steps_run: steps the trial trained (stop step, else budget, else last metrics step).
        mean_step_ms: mean wall time of one training step.
        tokens_per_s: training throughput.
        duration_s: wall time of the whole trial from the storage timestamps.
        metrics: one list of metrics.jsonl records per seed (first seed first).
        probe_history: the ``probe_history`` user attr (fallback for the logit curve).
    """

    number: int
    state: str
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
    """

    run_dir: Path
    storage: str
    study: optuna.Study
    trials: list[TrialRecord]
    threshold: float | None
    threshold_source: str
    attrs: dict[str, Any]
    not_run: int = 0

    @property
    def study_name(self) -> str:
        return self.study.study_name


# --------------------------------------------------------------------------- loading
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
    """metrics.jsonl records per seed: ``trials/<n>/metrics.jsonl`` or ``trials/<n>/seed<s>/``."""
    seed_dirs = [p for p in trial_dir.glob("seed*") if p.is_dir() and p.name[4:].isdigit()]
    if seed_dirs:
        seed_dirs.sort(key=lambda p: int(p.name[4:]))
        runs = [read_metrics(p / "metrics.jsonl") for p in seed_dirs]
        return [r for r in runs if r]
    run = read_metrics(trial_dir / "metrics.jsonl")
    return [run] if run else []


def _number(x: Any) -> float | None:
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


def _geometry_params(params: dict[str, Any]) -> dict[str, str]:
    return {k[len("geometry.") :]: str(v) for k, v in sorted(params.items()) if k.startswith("geometry.")}


def _record(trial: FrozenTrial, run_dir: Path) -> TrialRecord:
    ua = trial.user_attrs
    geo = _geometry_params(trial.params)
    other = {k: v for k, v in sorted(trial.params.items()) if not k.startswith("geometry.")}
    assignment = ua.get("assignment") if isinstance(ua.get("assignment"), dict) else {}
    assignment = {str(k): str(v) for k, v in assignment.items()}
    state = trial_status(trial)

    trial_dir = run_dir / str(ua.get("trial_dir") or f"trials/{trial.number}")
    metrics = _trial_metrics(trial_dir)
    first = metrics[0] if metrics else []

    stop_step = ua.get("stop_step")
    if stop_step is None and state == "unstable":
        # no attr: the last step the pruner saw, else the last step in metrics.jsonl
        stop_step = trial.last_step
        if stop_step is None and first:
            stop_step = first[-1].get("step")
    reason = None
    if state == "unstable":
        reason = ua.get("prune_reason") or "no reason recorded"
    elif state == "failed":
        reason = ua.get("fail_reason") or "no message recorded"
    elif state == "interrupted":
        reason = ua.get("fail_reason") or "interrupted"

    last_step = _number(first[-1].get("step")) if first else None
    budget = _number(ua.get("budget_steps"))
    if stop_step is not None:
        steps_run = int(stop_step)
    elif state == "completed" and budget is not None:
        steps_run = int(budget)
    else:
        steps_run = int(last_step) if last_step is not None else None

    mean_step_ms = _number(ua.get("mean_step_ms"))
    if mean_step_ms is None:
        mean_step_ms = _mean(r.get("step_ms") for r in first)
    tokens_per_s = _number(ua.get("tokens_per_s"))
    if tokens_per_s is None:
        tokens_per_s = _mean(r.get("tokens_per_s") for r in first)
    duration = trial.duration.total_seconds() if trial.duration is not None else None

    probe = ua.get("probe_history")
    return TrialRecord(
        number=trial.number,
        state=state,
        label=trial_label(trial, hyperparams=False),
        assignment=assignment,
        geometry_params=geo,
        other_params=other,
        loss=trial_score(trial),
        stop_step=int(stop_step) if stop_step is not None else None,
        reason=str(reason) if reason is not None else None,
        steps_run=steps_run,
        mean_step_ms=mean_step_ms,
        tokens_per_s=tokens_per_s,
        duration_s=duration,
        metrics=metrics,
        probe_history=probe if isinstance(probe, list) else [],
    )


def _mean(values: Iterable[Any]) -> float | None:
    xs = [v for v in (_number(x) for x in values) if v is not None]
    return sum(xs) / len(xs) if xs else None


def _threshold(attrs: dict[str, Any]) -> tuple[float | None, str]:
    """The max-logit threshold: study's pruner settings, else LogitGrowthPruner's default."""
    space = attrs.get("space")
    pruner = space.get("pruner") if isinstance(space, dict) else None
    found = _find_key(pruner, "max_logit") if pruner is not None else None
    if found is not None:
        return found, "the study's pruner settings"
    param = inspect.signature(LogitGrowthPruner).parameters.get("max_logit")
    default = _number(param.default) if param is not None else None
    if default is None:
        return None, "unknown (no pruner settings in the study, no LogitGrowthPruner default)"
    return default, "the LogitGrowthPruner default"


def _find_key(obj: Any, key: str) -> float | None:
    if isinstance(obj, dict):
        if key in obj and _number(obj[key]) is not None:
            return _number(obj[key])
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
        The run's data; nothing is written.

    Raises:
        ConfigError: no such directory, no storage or both storages in it, no study, or
            several studies and no ``study_name`` (see
            :func:`geosearch.search.study.open_run_study`).
    """
    run_dir = Path(run_dir)
    study = open_run_study(run_dir, study_name=study_name, storage=storage)
    where = mask_url(resolve_storage(run_dir, storage, create=False))
    attrs = dict(study.user_attrs)
    every = sorted(study.get_trials(deepcopy=False), key=lambda t: t.number)
    ran = [t for t in every if trial_status(t) not in _NOT_RUN]
    threshold, source = _threshold(attrs)
    return RunData(run_dir, where, study, [_record(t, run_dir) for t in ran], threshold, source, attrs,
                   not_run=len(every) - len(ran))


# --------------------------------------------------------------------------- importance
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
        if t.state not in ("completed", "unstable", "failed"):
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


# --------------------------------------------------------------------------- cost
@dataclass
class CostRow:
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
    base_ms = _mean(t.mean_step_ms for t in base_trials)
    base_tps = _mean(t.tokens_per_s for t in base_trials)
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


def _pareto_trials(trials: Sequence[TrialRecord]) -> tuple[list[TrialRecord], list[int]]:
    pts = [t for t in trials if t.state == "completed" and t.loss.n and t.time_s() is not None]
    front = pareto_front([(t.time_s(), t.loss.mean) for t in pts])  # type: ignore[misc]
    return pts, front


# --------------------------------------------------------------------------- markdown
def _fmt(x: float | None, spec: str = ".4f", missing: str = "—") -> str:
    return missing if x is None or not math.isfinite(x) else format(x, spec)


def _fmt_spread(s: Score) -> str:
    return f"{s.text()} (1 seed, spread unknown)" if s.n == 1 else s.text()


def _cell(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ").strip()


def _table(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return out


def dashboard_paragraph(run_dir: str | Path = "runs/<study>", storage: str | None = None) -> str:
    """How to open a run's study in optuna-dashboard (the generic text is in the README).

    Args:
        run_dir: the run directory to name in the commands.
        storage: the storage actually opened; ``None`` shows both the SQLite and the
            journal-file command.
    """
    if storage is None:
        commands = (
            f"optuna-dashboard sqlite:///{run_dir}/study.db    # one worker (SQLite)\n"
            f"optuna-dashboard {run_dir}/journal.log          # --workers > 1 (journal file)\n"
        )
    else:
        commands = f"optuna-dashboard {storage}\n"
    return (
        "Every run directory is an ordinary Optuna storage, so "
        "[optuna-dashboard](https://github.com/optuna/optuna-dashboard) can browse the same "
        "study, also while the search runs: optimisation history, parameter importances, "
        "intermediate values, and every trial's user attrs (`assignment`, `prune_reason`, "
        "`val_loss_std`, ...). Install it with `pip install 'geosearch[dashboard]'`, then run\n\n"
        f"```bash\n{commands}```\n\n"
        "and open http://127.0.0.1:8080. A study kept in PostgreSQL opens the same way with "
        "its `postgresql://...` URL."
    )


def render_markdown(
    run: RunData,
    ranking: Ranking,
    importance: Importance,
    cost: CostTable,
    plots: dict[str, str],
    plots_note: str | None = None,
) -> str:
    """The report as markdown.

    Args:
        run: the loaded run.
        ranking: from :func:`geosearch.search.ranking.rank_study` on ``run.study``.
        importance: from :func:`geometry_importances`.
        cost: from :func:`cost_table`.
        plots: plot name -> path relative to the run directory, for the plots written.
        plots_note: why some or all plots are missing (e.g. :data:`PLOTS_HINT`).
    """
    by_state: dict[str, list[TrialRecord]] = {}
    for t in run.trials:
        by_state.setdefault(t.state, []).append(t)
    sections = [
        _md_header(run, by_state),
        _md_result(ranking, by_state.get("unstable", [])),
        _md_ranking(ranking, {t.number: t for t in run.trials}),
        _md_unfinished(by_state),
        _md_importance(importance, stability_table(run.trials)),
        _md_cost(cost),
        _md_pareto(run.trials),
        _md_plots(run, plots, plots_note),
        ["## Browse this study in optuna-dashboard", "", dashboard_paragraph(run.run_dir, run.storage)],
    ]
    return "\n\n".join("\n".join(s) for s in sections) + "\n"


def _step(t: TrialRecord) -> str:
    return str(t.stop_step) if t.stop_step is not None else "?"


def _md_header(run: RunData, by_state: dict[str, list[TrialRecord]]) -> list[str]:
    lines = [f"# geosearch report: {run.study_name}", ""]
    lines.append(f"- run directory: `{run.run_dir}`; storage: `{run.storage}`")
    if run.attrs.get("geosearch_version"):
        lines.append(f"- written by geosearch {run.attrs['geosearch_version']}")
    proxy = run.attrs.get("proxy")
    if isinstance(proxy, dict) and proxy:
        lines.append("- proxy: " + ", ".join(f"{k}={json.dumps(v)}" for k, v in proxy.items()))
    counts = [f"{len(by_state.get(s, []))} {s}" for s in _FINISHED]
    counts += [f"{len(v)} {s}" for s, v in by_state.items() if s not in _FINISHED]
    lines.append(f"- trials: {len(run.trials)} ({', '.join(counts)})")
    if run.not_run:
        lines.append(f"- not shown: {run.not_run} duplicate or skipped trials (points already "
                     "scored or taken by another worker: never trained)")
    return lines


def _md_result(ranking: Ranking, unstable: list[TrialRecord]) -> list[str]:
    lines = ["## Result", "", f"**Verdict:** {ranking.verdict}."]
    if unstable:
        names = "; ".join(f"{t.label} (trial {t.number}, step {_step(t)})" for t in unstable)
        lines += ["", f"Unstable (pruned): {names}."]
    return lines


def _md_ranking(ranking: Ranking, records: dict[int, TrialRecord]) -> list[str]:
    lines = ["## Ranking (completed trials)", ""]
    if not ranking.rows:
        return lines + ["No completed trials."]
    lines += [
        "Final validation loss, mean ± sample std over seeds (n = seeds). *vs best*: `tie` = "
        "within noise of the best by a Welch t-test at 5% (|Δmean| < *noise* = "
        "t₀.₉₇₅(df)·√(se₁²+se₂²), df by Welch–Satterthwaite), `separated` = further than that, "
        "`unknown` = one seed, so no spread to judge by. The same rule as the ranking printed "
        "by `geosearch search`.",
        "",
    ]
    params = {r.number: records[r.number].other_params if r.number in records else {} for r in ranking.rows}
    has_params = any(params.values())
    header = ["rank", "trial", "assignment"] + (["params"] if has_params else [])
    header += ["val loss", "std", "n", "Δ vs best", "noise", "vs best"]
    rows = []
    for r in ranking.rows:
        label = records[r.number].label if r.number in records else r.label
        rank = "=1" if r.number in ranking.tied and len(ranking.tied) > 1 else str(r.rank)
        row = [rank, r.number, label] + ([format_params(params[r.number])] if has_params else [])
        row += [_fmt(r.score.mean), _fmt(r.score.std) if r.score.n >= 2 else "unknown", r.score.n]
        row += ["—" if r.rank == 1 else f"{r.gap:+.4f}", _fmt(r.threshold), r.versus_best]
        rows.append(row)
    return lines + _table(header, rows)


def _md_unfinished(by_state: dict[str, list[TrialRecord]]) -> list[str]:
    unstable = by_state.get("unstable", [])
    lines = ["## Unstable trials (pruned)", ""]
    if unstable:
        lines += _table(["trial", "assignment", "stopped at step", "reason"],
                        [[t.number, t.label, _step(t), t.reason] for t in unstable])
    else:
        lines.append("None.")
    failed = by_state.get("failed", [])
    if failed:
        lines += ["", "## Failed trials", ""]
        lines += _table(["trial", "assignment", "message"], [[t.number, t.label, t.reason] for t in failed])
    others = [t for s, v in by_state.items() if s not in _FINISHED for t in v]
    if others:
        lines += ["", "## Not finished", ""]
        if by_state.get("interrupted"):
            lines += ["Interrupted trials were stopped by Ctrl-C or lost their worker; their "
                      "point was queued again, and rerunning the search runs it.", ""]
        lines += _table(["trial", "assignment", "state", "note"],
                        [[t.number, t.label, t.state, t.reason or ""] for t in others])
    return lines


def _md_importance(importance: Importance, stability: list[dict[str, Any]]) -> list[str]:
    lines = ["## Which module type's geometry matters most", ""]
    if importance.values is None:
        lines.append(f"Importance: {importance.note}")
    else:
        top = next(iter(importance.values)).removeprefix("geometry.")
        lines += [f"Most important: **{top}**. {importance.note}", ""]
        lines += _table(["module type", "parameter", "importance"],
                        [[p.removeprefix("geometry."), p, f"{v:.3f}"] for p, v in importance.values.items()])
    if stability:
        lines += ["", "Stability by geometry (every finished trial, including unstable and failed ones):", ""]
        lines += _table(
            ["module type", "geometry", "trials", "unstable", "failed", "best val loss"],
            [[r["param"], r["value"], r["trials"], r["unstable"], r["failed"], _fmt(r["best"])]
             for r in stability],
        )
    return lines


def _md_cost(cost: CostTable) -> list[str]:
    lines = ["## Cost", ""]
    if not cost.rows:
        return lines + [f"No cost data: {cost.baseline}."]
    if cost.baseline.startswith("the fastest"):
        lines.append(f"Ratios are to {cost.baseline}.")
    else:
        plural = "s" if len(cost.baseline_trials) > 1 else ""
        trials = ", ".join(map(str, cost.baseline_trials))
        lines.append(f"Ratios are to the {cost.baseline} baseline (trial{plural} {trials}).")
    lines += [
        "Time = mean step time × steps run, per seed (the trial's wall time when no step time "
        "was recorded).",
        "",
    ]
    rows = [
        [c.trial.number, c.trial.label, c.trial.state, _fmt(c.step_ms, ".1f"), _fmt(c.step_ratio, ".2f"),
         _fmt(c.tokens_per_s, ",.0f"), _fmt(c.tokens_ratio, ".2f"), _fmt(c.time_s, ".1f")]
        for c in cost.rows
    ]
    header = ["trial", "assignment", "state", "ms/step", "× baseline", "tokens/s", "× baseline", "time (s)"]
    return lines + _table(header, rows)


def _md_pareto(trials: Sequence[TrialRecord]) -> list[str]:
    lines = ["## Loss versus time (Pareto front)", ""]
    pts, front = _pareto_trials(trials)
    if not front:
        return lines + ["No completed trial has both a val loss and a time."]
    lines += [
        "Completed trials no other trial beats on both final val loss and training time "
        "(both minimised), fastest first:",
        "",
    ]
    on_front = [pts[i] for i in front]
    rows = [[t.number, t.label, _fmt(t.time_s(), ".1f"), _fmt_spread(t.loss)] for t in on_front]
    return lines + _table(["trial", "assignment", "time (s)", "val loss"], rows)


def _md_plots(run: RunData, plots: dict[str, str], note: str | None) -> list[str]:
    lines = ["## Plots", ""]
    if run.threshold is not None:
        lines.append(f"Pruning threshold on the max attention logit: {run.threshold:g} "
                     f"(from {run.threshold_source}).")
    else:
        lines.append(f"Pruning threshold on the max attention logit: {run.threshold_source}.")
    for name, rel in plots.items():
        lines += ["", f"![{PLOT_NAMES.get(name, name)}]({rel})"]
    if note:
        lines += ["", note]
    return lines


# --------------------------------------------------------------------------- plots
def _import_matplotlib():
    """matplotlib's Figure class; ImportError when the ``report`` extra is missing.

    Uses the object-oriented API (no pyplot), so no GUI backend or global state is touched.
    """
    import matplotlib  # noqa: F401  (first, so a missing package fails here)
    from matplotlib.figure import Figure

    return Figure


def _palette(labels: Iterable[str]) -> dict[str, Any]:
    import matplotlib

    labels = sorted(set(labels))
    cmap = matplotlib.colormaps["tab10" if len(labels) <= 10 else "tab20"]
    return {lab: cmap(i % cmap.N) for i, lab in enumerate(labels)}


def _series(records: list[dict], key: str) -> tuple[list[float], list[float]]:
    xs, ys = [], []
    for r in records:
        x, y = _number(r.get("step")), _number(r.get(key))
        if x is not None and y is not None:
            xs.append(x)
            ys.append(y)
    return xs, ys


def _logit_series(t: TrialRecord) -> list[tuple[list[float], list[float]]]:
    runs = [_series(m, "max_logit") for m in t.metrics]
    runs = [r for r in runs if r[0]]
    if not runs and t.probe_history:
        runs = [_series(t.probe_history, "max_logit")]
    return [r for r in runs if r[0]]


def _type_geometry(t: TrialRecord, module_type: str) -> str:
    family = module_type.split("_")[0]
    return (
        t.assignment.get(module_type)
        or t.geometry_params.get(module_type)
        or t.geometry_params.get(family)
        or "?"
    )


def _legend(ax) -> None:
    handles, labels = ax.get_legend_handles_labels()
    if handles:
        seen: dict[str, Any] = {}
        for h, lab in zip(handles, labels):
            seen.setdefault(lab, h)
        ax.legend(list(seen.values())[:20], list(seen)[:20], fontsize="small")


def make_plots(
    run: RunData, plots_dir: str | Path, importance: Importance | None = None
) -> tuple[dict[str, Path], list[str]]:
    """Write the report's PNG plots.

    Args:
        run: the loaded run.
        plots_dir: where to write (created).
        importance: from :func:`geometry_importances` (computed when ``None``).

    Returns:
        (plot name -> file written, notes on plots skipped for lack of data).

    Raises:
        ImportError: matplotlib is not installed.
    """
    Figure = _import_matplotlib()
    plots_dir = Path(plots_dir)
    plots_dir.mkdir(parents=True, exist_ok=True)
    written: dict[str, Path] = {}
    skipped: list[str] = []
    trials = run.trials

    def save(fig, name: str) -> None:
        path = plots_dir / f"{name}.png"
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        written[name] = path

    # max attention logit, coloured by attention geometry, threshold drawn, log scale
    series = {t.number: _logit_series(t) for t in trials}
    if any(series.values()):
        colours = _palette(t.family_geometry("attn") for t in trials if series[t.number])
        fig = Figure(figsize=(8, 4.5))
        ax = fig.add_subplot()
        for t in trials:
            for k, (xs, ys) in enumerate(series[t.number]):
                ys = [max(y, 1e-3) for y in ys]  # log scale
                c = colours[t.family_geometry("attn")]
                ax.plot(xs, ys, color=c, alpha=0.85 if k == 0 else 0.35, lw=1.2,
                        ls="--" if t.state == "unstable" else "-", label=f"attn={t.family_geometry('attn')}")
                if t.state == "unstable" and k == 0:
                    ax.plot(xs[-1], ys[-1], "x", color=c, ms=8)
        if run.threshold is not None:
            ax.axhline(run.threshold, color="black", ls=":", lw=1.2,
                       label=f"prune threshold {run.threshold:g}")
        ax.set_yscale("log")
        ax.set_xlabel("step")
        ax.set_ylabel("max attention logit")
        ax.set_title("Max attention logit (dashed + x: pruned as unstable)")
        _legend(ax)
        save(fig, "max_logit")
    else:
        skipped.append("max_logit: no trial recorded max_logit")

    # sigma_max per module type, coloured by that type's geometry
    types = sorted({k for t in trials for m in t.metrics for r in m for k in (r.get("sigma_max") or {})})
    if types:
        colours = _palette(_type_geometry(t, ty) for t in trials for ty in types)
        ncol = min(2, len(types))
        nrow = math.ceil(len(types) / ncol)
        fig = Figure(figsize=(5 * ncol, 3.2 * nrow))
        for k, ty in enumerate(types):
            ax = fig.add_subplot(nrow, ncol, k + 1)
            for t in trials:
                g = _type_geometry(t, ty)
                for j, m in enumerate(t.metrics):
                    points = [{"step": r.get("step"), "v": (r.get("sigma_max") or {}).get(ty)} for r in m]
                    xs, ys = _series(points, "v")
                    if xs:
                        ax.plot(xs, ys, color=colours[g], alpha=0.85 if j == 0 else 0.35, lw=1.1,
                                ls="--" if t.state == "unstable" else "-", label=g)
            ax.set_yscale("log")
            ax.set_title(f"σ_max: {ty}")
            ax.set_xlabel("step")
            _legend(ax)
        save(fig, "sigma_max")
    else:
        skipped.append("sigma_max: no trial recorded sigma_max")

    # validation loss curves
    val = {t.number: [r for r in (_series(m, "val_loss") for m in t.metrics) if r[0]] for t in trials}
    if any(val.values()):
        colours = _palette(t.label for t in trials if val[t.number])
        fig = Figure(figsize=(8, 4.5))
        ax = fig.add_subplot()
        for t in trials:
            for j, (xs, ys) in enumerate(val[t.number]):
                ax.plot(xs, ys, color=colours[t.label], alpha=0.85 if j == 0 else 0.35, lw=1.2,
                        ls="--" if t.state == "unstable" else "-", label=t.label)
        ax.set_xlabel("step")
        ax.set_ylabel("validation loss")
        ax.set_title("Validation loss (dashed: pruned as unstable)")
        _legend(ax)
        save(fig, "val_loss")
    else:
        skipped.append("val_loss: no trial recorded val_loss")

    # loss versus time, Pareto front
    pts, front = _pareto_trials(trials)
    if pts:
        fig = Figure(figsize=(7, 4.5))
        ax = fig.add_subplot()
        xs = [t.time_s() for t in pts]
        ys = [t.loss.mean for t in pts]
        err = [t.loss.std if t.loss.n >= 2 else 0.0 for t in pts]
        ax.errorbar(xs, ys, yerr=err, fmt="o", color="tab:gray", alpha=0.7, label="completed trial")
        fx = [xs[i] for i in front]
        fy = [ys[i] for i in front]
        ax.step(fx, fy, where="post", color="tab:red", lw=1.5, label="Pareto front")
        ax.plot(fx, fy, "o", color="tab:red")
        for t, x, y in zip(pts, xs, ys):
            ax.annotate(str(t.number), (x, y), textcoords="offset points", xytext=(4, 4), fontsize="small")
        ax.set_xlabel("training time (s)")
        ax.set_ylabel("final validation loss")
        ax.set_title("Loss versus time (numbers: trials)")
        _legend(ax)
        save(fig, "pareto")
    else:
        skipped.append("pareto: no completed trial with a val loss and a time")

    importance = importance if importance is not None else geometry_importances(run.study)
    if importance.values:
        names = [p.removeprefix("geometry.") for p in importance.values][::-1]
        fig = Figure(figsize=(6, 0.5 * len(names) + 1.5))
        ax = fig.add_subplot()
        ax.barh(names, list(importance.values.values())[::-1], color="tab:blue")
        ax.set_xlabel("importance (PED-ANOVA, normalised)")
        ax.set_title("Which module type's geometry matters most")
        save(fig, "importance")
    else:
        skipped.append(f"importance: {importance.note}")
    for name in PLOT_NAMES.keys() - written.keys():  # a stale plot from an earlier report would mislead
        (plots_dir / f"{name}.png").unlink(missing_ok=True)
    return written, skipped


# --------------------------------------------------------------------------- entry point
@dataclass
class ReportFiles:
    """What :func:`write_report` wrote.

    Attributes:
        report: path of report.md.
        plots: plot name -> PNG path.
        plots_note: why plots are missing (matplotlib absent or no data), else ``None``.
    """

    report: Path
    plots: dict[str, Path]
    plots_note: str | None


def write_report(
    run_dir: str | Path,
    *,
    study_name: str | None = None,
    storage: str | None = None,
    plots: bool = True,
) -> ReportFiles:
    """Write ``<run_dir>/report.md`` and ``<run_dir>/plots/*.png``.

    Args:
        run_dir: ``runs/<study>``.
        study_name: the study to report; ``None`` = the only study in the storage.
        storage: storage URL or journal path overriding the run directory's own.
        plots: ``False`` writes the tables only.

    Returns:
        The files written. Without matplotlib the report is still written and says how
        to get the plots.
    """
    run = load_run(run_dir, study_name=study_name, storage=storage)
    ranking = rank_study(run.study)
    importance = geometry_importances(run.study)
    cost = cost_table(run.trials)
    written: dict[str, Path] = {}
    note: str | None = None
    if plots:
        try:
            written, skipped = make_plots(run, run.run_dir / "plots", importance)
        except ImportError:
            note = f"No plots: {PLOTS_HINT}."
        else:
            if skipped:
                note = "Plots not drawn: " + "; ".join(skipped) + "."
    else:
        note = "Plots were not requested (--no-plots)."
    rel = {name: path.relative_to(run.run_dir).as_posix() for name, path in written.items()}
    text = render_markdown(run, ranking, importance, cost, rel, note)
    report = run.run_dir / "report.md"
    report.write_text(text, encoding="utf-8")
    return ReportFiles(report, written, note)
