"""Plots and a markdown report of one run directory.

``geosearch report runs/<study>`` reads only the run directory: the Optuna storage
(``study.db`` or ``journal.log``, opened as ``geosearch export`` opens it, see
:mod:`geosearch.search.runtime.storage`) and the per-trial ``metrics.jsonl`` files. It writes
``report.md`` and, when matplotlib is installed (``pip install 'geosearch[report]'``),
``plots/*.png`` (the baselines drawn beside the assignments). The ranking and its verdict
are the search's own
(:mod:`geosearch.search.stats.ranking`: mean ± std over seeds, ties by a paired t-test on shared seeds at 5%), so
the report and the ranking printed after ``geosearch search`` always agree. Trials that
never trained (``duplicate`` and ``skipped`` bookkeeping trials) are left out; a trial whose
worker died or was stopped shows as ``interrupted``. The work is split into pure steps so
tests can check numbers; :func:`write_report` does all of it, and importing this package
does not import torch::

    run = load_run("runs/default")          # storage + trial files -> RunData   (load)
    ranking = rank_study(run.study)          # the search's ranking and verdict
    importance = geometry_importances(run.study, ranking.effects)  # over the points (analysis)
    cost = cost_table(run.trials)            # ms/step, tokens/s, ratio to a baseline
    front = pareto_front([(t, loss), ...])   # loss-versus-time front (indices)
    text = render_markdown(run, ...)         # the report                          (markdown)
    make_plots(run, "runs/default/plots")    # needs matplotlib                     (plots)
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from geosearch.util.errors import ConfigError
from geosearch.util.files import check_dir, check_out_file
from geosearch.report.analysis import (
    CostRow,
    CostTable,
    Importance,
    PeakLayer,
    cost_table,
    geometry_importances,
    layer_logits,
    pareto_front,
    pareto_trials,
    peak_layers,
    stability_table,
)
from geosearch.report.load import RunData, TrialRecord, load_run, read_metrics
from geosearch.report.markdown import dashboard_paragraph, render_markdown
from geosearch.report.plots import PLOT_NAMES, PLOTS_HINT, make_plots
from geosearch.search.runtime.storage import check_outside_study
from geosearch.search.study.baseline_trials import baseline_table
from geosearch.search.study.export import study_verdict
from geosearch.search.stats.study_ranking import rank_study

__all__ = [
    "CostRow",
    "CostTable",
    "Importance",
    "PeakLayer",
    "ReportFiles",
    "RunData",
    "TrialRecord",
    "PLOT_NAMES",
    "PLOTS_HINT",
    "cost_table",
    "dashboard_paragraph",
    "geometry_importances",
    "layer_logits",
    "load_run",
    "make_plots",
    "pareto_front",
    "pareto_trials",
    "peak_layers",
    "read_metrics",
    "render_markdown",
    "stability_table",
    "write_report",
]


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

    Raises:
        ConfigError: no such run directory; ``report.md`` or ``plots/`` cannot be written
            there, or would be inside a study's files or a finished run (checked before the
            study is read); what :func:`load_run` raises. The
            storage is opened read-only: a refused report writes and changes nothing.
    """
    run_dir = Path(run_dir)
    if storage is None and not run_dir.is_dir():
        raise ConfigError("no such run directory", source=str(run_dir))
    check_outside_study(run_dir / "report.md", source=None)  # never over a study's files
    check_out_file(run_dir / "report.md", source=None)
    if plots:
        check_dir(run_dir / "plots", source=None)
    run = load_run(run_dir, study_name=study_name, storage=storage)
    ranking = rank_study(run.study)
    importance = geometry_importances(run.study, ranking.effects)
    cost = cost_table(run.trials + run.baselines)
    written: dict[str, Path] = {}
    note: str | None = None
    if plots:
        try:
            written, skipped = make_plots(run, run.run_dir / "plots", importance)
        except ImportError:
            note = f"No plots: {PLOTS_HINT}."
        else:
            if skipped:
                note = "Plots not drawn: " + "; ".join(s.rstrip(".") for s in skipped) + "."
    else:
        note = "Plots were not requested (--no-plots)."
    rel = {name: path.relative_to(run.run_dir).as_posix() for name, path in written.items()}
    text = render_markdown(run, ranking, importance, cost, rel, note,
                           baselines=baseline_table(run.study, ranking),
                           verdict=study_verdict(run.study, ranking, run.run_dir))
    report = run.run_dir / "report.md"
    report.parent.mkdir(parents=True, exist_ok=True)  # a new directory for --storage's report
    report.write_text(text, encoding="utf-8")
    return ReportFiles(report, written, note)
