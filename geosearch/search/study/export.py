"""What a search hands out: the best assignments as YAML files, and the ranking as a table.

:func:`export_best` writes the winner (or the ``top`` best) of a study as assignment files
that :func:`geosearch.load_assignment` and :func:`geosearch.build_optimizer` read, each with
its provenance (study, proxy, target, score and spread, tie verdict, the ladder's reading
towards the target, date, version); :func:`format_ranking` is the table the search prints
at its end. Export reads what the study stored and runs no user code (a ``py:`` model is
not imported). Torch-free until an
assignment is built. The ranking rules are in ``docs/design.md`` ("The study").
"""

from __future__ import annotations

import datetime as _dt
import os
import textwrap
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import optuna
from optuna.trial import TrialState

from geosearch.util.version import __version__
from geosearch.util.errors import ConfigError, GeosearchError
from geosearch.util.files import check_dir, check_out_file
from geosearch.search.study.baseline_trials import baseline_table, baselines_lines
from geosearch.search.horizon.outlook import stability_lines, stability_record, stability_rows
from geosearch.search.study.queue import done_count
from geosearch.search.stats.ranking import RankedTrial, Ranking
from geosearch.search.stats.study_ranking import rank_study
from geosearch.search.stats.trials import study_step_cost, trial_line
from geosearch.search.stats.verdict import (
    WIDTH,
    BaselineGap,
    StabilityAt,
    Verdict,
    clip,
    verdict_lines,
    verdict_of,
    verdict_record,
)
from geosearch.search.records import (
    ASSIGNMENT,
    BASELINE,
    NOT_RUN,
    PROXY,
    RULES,
    SEED_OF,
    SEEDS,
    SPACE,
    STEP_FACTOR,
    TARGET,
    UNSTABLE,
    is_extra,
    trial_status,
)
from geosearch.search.space.spec import SearchSpace, Suggestion, study_pruner
from geosearch.search.records import read_probes_file
from geosearch.search.runtime.storage import BEST_FILE, TOP_DIR, check_outside_study, open_run_study
from geosearch.search.horizon.reading import (
    horizon_lines,
    horizon_note,
    horizon_verdict,
    reading_record,
    study_reading,
)

if TYPE_CHECKING:  # pragma: no cover
    from geosearch.assignment import Assignment

__all__ = ["export_best", "export_summary", "format_ranking", "study_verdict", "where_line"]


def study_verdict(study: optuna.Study, ranking: Ranking | None = None,
                  run_dir: str | os.PathLike | None = None) -> Verdict:
    """The :class:`~geosearch.search.stats.verdict.Verdict` of ``study``: its ranking (as
    :func:`~geosearch.search.stats.study_ranking.rank_study` judges it), with the stability at the
    target of the ranked, baseline and unstable trials, the winner against each baseline,
    its ms/step ratio to the cost baseline and the ladder's reading towards the target. The
    stability reads the trials' probes in ``run_dir`` (``None``: their user attrs)."""
    ranking = ranking or rank_study(study)
    reading = study_reading(study)
    trials = study.get_trials(deepcopy=False)
    unstable = [t.number for t in trials
                if trial_status(t) == UNSTABLE and t.state == TrialState.PRUNED]
    rows = stability_rows(study, outlook_numbers(study, ranking) + unstable, study_pruner(study),
                          _probes(run_dir))
    stability = tuple(_stability_at(r, r.number in unstable) for r in rows)
    top = ranking.rows[0].number if ranking.rows else None
    table = baseline_table(study, ranking)
    baselines = []
    for name, b in table.baselines.items():
        row = next((r for r in table.rows.get(name, []) if r.number == top), None)
        word = ("no spread" if row is None or row.interval is None else
                "better" if row.delta < -row.interval else "worse" if row.delta > row.interval else
                "within noise")
        mean = b["score"].mean if b["score"] else None
        baselines.append(BaselineGap(name, b["trial"], b["status"], mean,
                                     row.delta if row else None, row.interval if row else None,
                                     row.test if row else None, word))
    cost = study_step_cost(trials)
    target = study.user_attrs.get(TARGET) or {}
    note = horizon_note(reading)
    return verdict_of(
        ranking, sentence=horizon_verdict(ranking.verdict, reading), stability=stability,
        baselines=tuple(baselines), step_ratio=cost.ratios.get(top) if top is not None else None,
        ratio_to=cost.name,
        ranked_sum_eta=reading.rungs[-1].sum_eta if reading and reading.rungs else None,
        target_sum_eta=target.get("sum_eta") if isinstance(target, dict) else None,
        order_measured=None if reading is None else note is None, order_note=note,
        ranked_by=None if reading is None else reading.rule)


def _stability_at(row: Any, unstable: bool) -> StabilityAt:
    m, o = row.measured, row.outlook
    if m is not None:
        return StabilityAt(row.number, row.label, "measured", m.verdict, m.final, m.threshold,
                           m.crossed_at, unstable)
    if o is not None:
        return StabilityAt(row.number, row.label, "forecast", o.verdict, o.forecast.value,
                           o.threshold, None, unstable)
    return StabilityAt(row.number, row.label, "none", None, row.max_logit, None, None, unstable)


def _probes(run_dir: str | os.PathLike | None):
    """The reader of the trials' probe files in ``run_dir``; ``None``: their user attrs."""
    return partial(read_probes_file, Path(run_dir)) if run_dir is not None else None


def where_line(exported: Path | None, report: Path | None = None, plots: bool = False) -> str:
    """The last line a search prints: where the answer is, and its reasoning
    (``"best assignment: runs/default/best_assignment.yaml (report.md, plots/ beside it)"``)."""
    if report is None:
        return f"best assignment: {exported}" if exported is not None else ""
    files = "report.md, plots/" if plots else "report.md"
    if exported is None:
        return f"report: {report}" + (", plots/ beside it" if plots else "")
    if Path(report).parent == Path(exported).parent:
        return f"best assignment: {exported} ({files} beside it)"
    return f"best assignment: {exported}; report: {report}"


def format_ranking(study: optuna.Study, ranking: Ranking | None = None,
                   run_dir: str | os.PathLike | None = None, *, details: bool = False) -> str:
    """What the search prints at its end: the ranked table of completed trials (with a step
    grid: each assignment at its own best step, then the points at the shared step), the
    pruned/failed ones, then the verdict in four lines of at most 100 columns
    (:func:`~geosearch.search.stats.verdict.verdict_lines`). ``details``: then the one-line
    verdict, the ladder's reading, the stability of every trial and the baselines' table
    (each assignment's Δ loss and ms/step ratio), as ``report.md`` gives them in tables.
    The stability reads the trials' probes in ``run_dir`` (``None``: their user attrs)."""
    ranking = ranking or rank_study(study)
    proxy = study.user_attrs.get(PROXY)
    lines = _ranking_table(ranking.rows)
    if ranking.steps is not None and ranking.rows:
        shared = ranking.steps.shared_step
        lines.insert(0, "each assignment at its own best step (the exported answer):")
        lines += [f"at the shared step {f'{shared:g}' if shared else '(x1)'}:",
                  *(_ranking_table(ranking.steps.shared.rows) or ["  no point completed at the shared step"])]
    others = [t for t in study.get_trials(deepcopy=False)
              if t.state in (TrialState.PRUNED, TrialState.FAIL) and trial_status(t) not in NOT_RUN]
    if others:
        lines.append("not ranked:")
        lines += ["  " + trial_line(t, proxy) for t in others]
    lines += [w for line in optuna_best_note(study, ranking)
              for w in textwrap.wrap(line, WIDTH, subsequent_indent="  ")]
    lines += verdict_lines(study_verdict(study, ranking, run_dir))
    if not details:
        return "\n".join(lines)
    reading = study_reading(study)
    outlook = stability_lines(stability_rows(study, outlook_numbers(study, ranking),
                                             study_pruner(study), _probes(run_dir)))
    lines.append(f"verdict: {horizon_verdict(ranking.verdict, reading)}")
    return "\n".join(lines + horizon_lines(reading) + outlook
                     + baselines_lines(baseline_table(study, ranking)))


def _record_words(record: Any) -> str:
    """A stored verdict's kind and winner in words (``"winner: attn=dgram, mlp=dgram
    (trial 3)"``)."""
    if not isinstance(record, dict):
        return str(record)
    head = {"winner": "winner", "tie": "no single winner, lowest",
            "unknown": "lowest (gap not judged)",
            "single": "the only completed"}.get(record.get("kind"), str(record.get("kind")))
    close = ", ".join(map(str, record.get("within_noise") or []))
    return (f"{head}: {record.get('winner')} (trial {record.get('trial')})"
            + (f"; within noise or not judged: trials {close}" if close else ""))


def _ranking_table(rows: list[RankedTrial]) -> list[str]:
    """The ranked rows as a text table of at most 100 columns (labels cut to fit; nothing
    without rows)."""
    if not rows:
        return []
    vs = [_versus(r) for r in rows]
    loss = max(26, *(len(r.score.text()) for r in rows))  # today's column
    room = WIDTH - (4 + 2 + 5 + 2 + 2 + loss + 2 + max(7, *map(len, vs)))
    width = max(10, min(room, max(len(r.label) for r in rows)))
    lines = [f"{'rank':>4}  {'trial':>5}  {'assignment':<{width}}  {'val loss':<{loss}}  vs best"]
    for r, v in zip(rows, vs):
        label = clip(r.label, width)
        score = r.score.text()
        lines.append(clip(f"{r.rank:>4}  {r.number:>5}  {label:<{width}}  {score:<{loss}}  {v}"))
    return lines


def _versus(r: RankedTrial) -> str:
    """The table's last column for one row."""
    if r.versus_best == "best":
        return "best"
    if r.versus_best == "unknown":
        return f"{r.gap:+.4f} (no spread: can't judge)"
    if r.threshold is None:  # identical losses: a tie without a noise estimate
        return f"{r.gap:+.4f}: tie"
    return (f"{r.gap:+.4f} {'<' if r.versus_best == 'tie' else '>'} noise "
            f"{r.threshold:.4f}: {'tie' if r.versus_best == 'tie' else 'worse'}")


def optuna_best_note(study: optuna.Study, ranking: Ranking) -> list[str]:
    """Lines for the views whose best trial is not the ranking's winner, nothing otherwise.

    Optuna's own (``study.best_trial``, ``optuna best-trial``) skips baselines and
    adaptive-seed trials, which are infeasible there
    (:func:`~geosearch.search.study.extras.mark_extra`), but a point's Optuna value is the
    mean of its own seeds, which cannot change once told, while the ranking merges the
    adaptive seeds a point got later. optuna-dashboard's "Best Trial" is the lowest value of
    every completed trial (it reads no constraints), so it can be a baseline or a seed trial:
    their dashboard notes say what they are."""
    if not ranking.rows:
        return []
    top = ranking.rows[0]
    lines = []
    try:
        best = study.best_trial
    except ValueError:  # no feasible completed trial
        best = None
    if best is not None and best.number != top.number:
        lines.append(f"note: Optuna's best_trial (optuna best-trial) is trial {best.number}, "
                     f"by the mean of its own seeds ({best.value:.4f}); the ranking merges the "
                     "adaptive "
                     f"seeds each point got later, which put trial {top.number} first "
                     f"({top.score.mean:.4f})")
    done = [t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
            if t.value is not None]
    lowest = min(done, key=lambda t: t.value, default=None)
    if lowest is not None and is_extra(lowest) and lowest.number != top.number:
        what = (f"baseline {lowest.user_attrs[BASELINE]}" if BASELINE in lowest.user_attrs
                else f"a seed of trial {lowest.user_attrs.get(SEED_OF)}")
        lines.append(f"note: optuna-dashboard's Best Trial is trial {lowest.number} ({what}, "
                     f"{lowest.value:.4f}): it counts every completed trial; the answer is trial "
                     f"{top.number}, as exported")
    return lines


def outlook_numbers(study: optuna.Study, ranking: Ranking) -> list[int]:
    """The trials whose stability outlook is shown: the ranked ones, then the completed
    baselines (not their step halving's seed trials: their stability is the baseline's)."""
    baselines = [t.number for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
                 if t.user_attrs.get(BASELINE) and SEED_OF not in t.user_attrs]
    return [r.number for r in ranking.rows] + baselines


def _export_assignment(study: optuna.Study, row: RankedTrial, ranking: Ranking,
                       run_dir: Path, verdict: dict[str, Any]) -> Assignment:
    """The Assignment of one ranked trial, with provenance."""
    from geosearch.assignment import Assignment

    trial = next(t for t in study.get_trials(deepcopy=False) if t.number == row.number)
    attrs = study.user_attrs
    suggestion: Suggestion | None = None
    settings: dict[str, Any] = {}
    space = SearchSpace.from_stored(attrs.get(SPACE), f"{run_dir} (study attrs)")
    if space is not None:
        try:
            suggestion = space.suggest(optuna.trial.FixedTrial(dict(trial.params)))
            # every global optimizer setting the trial trained with, searched ones included:
            # build_optimizer(model, load_assignment(file)) then builds the trial's optimizer
            settings = space.train_config(suggestion).optimizer_settings()
        except (ConfigError, ValueError):
            suggestion = None
    score = row.score
    reading = study_reading(study)
    provenance: dict[str, Any] = {
        "study": study.study_name,
        "run_dir": str(run_dir),
        "trial": row.number,
        "rank": row.rank,
        "score": {"metric": "final validation loss (mean over seeds)", "mean": score.mean,
                  "std": score.std, "n_seeds": score.n, "values": list(score.values),
                  "seeds": list(score.seeds) if score.seeds is not None else trial.user_attrs.get(SEEDS)},
        "tied_with": [n for n in ranking.tied if n != row.number] if row.number in ranking.tied else [],
        "verdict": verdict,
        "proxy": attrs.get(PROXY),
        "target": attrs.get(TARGET),
        "horizon": reading_record(reading) if reading is not None else None,
        "stability": stability_record(stability_rows(study, [row.number], study_pruner(study),
                                                     partial(read_probes_file, run_dir))[0]),
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "geosearch_version": __version__,
        "trials": {"completed": len(ranking.rows), "total": done_count(study)},
    }
    if STEP_FACTOR in trial.params:  # a step grid: the answer at each one's own best step
        factor = float(trial.params[STEP_FACTOR])
        shared = (attrs.get(PROXY) or {}).get("spectral_lr")
        provenance["step"] = {
            "spectral_lr": settings.get("spectral_lr", shared * factor if shared else None),
            "factor": factor, "shared_spectral_lr": shared,
            "grid": list(space.hyperparams.step_grid or ()) if space is not None else None,
            "answer": "each assignment at its own best step"}
    if suggestion is not None:
        return suggestion.assignment(provenance, settings=settings)
    geometry = trial.user_attrs.get(ASSIGNMENT) or {}
    return Assignment(geometry=dict(geometry), rules=attrs.get(RULES, "nanogpt"),
                      provenance=provenance)


def export_best(
    run_dir: str | os.PathLike,
    out: str | os.PathLike | None = None,
    *,
    top: int = 1,
    study: optuna.Study | None = None,
    study_name: str | None = None,
    storage: str | None = None,
    rules: str | None = None,
) -> list[Path]:
    """Write the best (or the ``top`` best) assignments of a run as YAML.

    ``top == 1`` writes one file, ``out`` or ``<run_dir>/best_assignment.yaml``. ``top > 1``
    writes one file per rank, ``rank<k>-trial<n>.yaml``, into the directory ``out`` (default
    ``<run_dir>/top``): each loads with :func:`geosearch.load_assignment`. Each file's
    provenance holds the study, proxy, score with its spread, the tie verdict, date and
    geosearch version. ``rules`` writes each for another rule set
    (:meth:`~geosearch.assignment.Assignment.with_rules`), e.g. a proxy's answer for a
    Hugging Face model.

    The output is checked before the study is read (:func:`geosearch.util.files.check_out_file`,
    :func:`~geosearch.util.files.check_dir`; never inside a study's files or a finished run,
    :func:`~geosearch.search.runtime.storage.check_outside_study`), and the study is opened
    read-only: a refused export writes nothing and changes nothing.

    Raises:
        GeosearchError: no trial completed.
        ConfigError: no study in ``run_dir`` (or ``storage``), a storage that is not an
            Optuna storage; ``out`` is a directory (``top == 1``) or a file (``top > 1``),
            or cannot be written, or would write over a study's files or a finished run.
    """
    run_dir = Path(run_dir)
    if top < 1:
        raise ConfigError(f"expected a whole number >= 1, got {top}", source="--top")
    target = Path(out) if out is not None else run_dir / (BEST_FILE if top == 1 else TOP_DIR)
    if study is None and storage is None and not run_dir.is_dir():
        raise ConfigError("no such run directory", source=str(run_dir))
    flag = "-o" if out is not None else None  # the CLI's flag (--out too)
    check_outside_study(target, source=flag, folder=top > 1)  # never over a study's files
    if top == 1:  # checked before the study is read: nothing is written when it cannot be
        check_out_file(target, source=flag, hint=" (--top K > 1 writes one file per rank into a directory)")
    else:
        check_dir(target, source=flag)
    study = study or open_run_study(run_dir, study_name=study_name, storage=storage, read_only=True)
    ranking = rank_study(study)
    if not ranking.rows:
        raise GeosearchError(f"{run_dir}: no trial of study {study.study_name!r} completed, so "
                             "there is nothing to export")
    rows = ranking.rows[:top]
    verdict = verdict_record(study_verdict(study, ranking, run_dir))
    answers = [_export_assignment(study, r, ranking, run_dir, verdict) for r in rows]
    if rules is not None:
        try:
            answers = [a.with_rules(rules) for a in answers]
        except ConfigError as e:
            raise ConfigError(e.problem, source="--rules", allowed=e.allowed) from None
    if top == 1:
        return [answers[0].save(target)]
    return [a.save(target / f"rank{r.rank}-trial{r.number}.yaml") for a, r in zip(answers, rows)]


def export_summary(paths: list[Path]) -> str:
    """What ``geosearch export`` prints: a line per file (trial, score, geometry) and the verdict."""
    from geosearch.assignment import load_assignment

    lines = []
    for path in paths:
        a = load_assignment(path)
        score = a.provenance.get("score", {})
        spread = f" ± {score['std']:.4f}" if score.get("std") is not None else " (one seed)"
        moved = (f" (rule set {a.rules!r}, moved from {a.provenance['rules_from']!r})"
                 if isinstance(a.provenance.get("rules_from"), str) and isinstance(a.rules, str) else "")
        lines.append(f"{path}: trial {a.provenance.get('trial')}, val loss {score.get('mean'):.4f}{spread}, "
                     + ", ".join(f"{t}={g}" for t, g in a.geometry.items()) + moved)
    first = load_assignment(paths[0])
    lines.append(f"verdict: {_record_words(first.provenance.get('verdict'))}")
    if first.settings:
        lines.append("the file holds the trial's optimizer settings too: build_optimizer(model, "
                     "load_assignment(file)) builds the optimizer the trial trained with")
    return "\n".join(lines)
