"""``geosearch report``: report.md and plots for a run directory."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from geosearch.report import ReportFiles


def add(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", metavar="RUN_DIR", help="a run directory, e.g. runs/default")
    p.add_argument("--study", metavar="NAME",
                   help="the study to report (default: the only study in the storage)")
    p.add_argument("--storage", metavar="URL",
                   help="storage URL or journal file instead of RUN_DIR/study.db or journal.log")
    p.add_argument("--no-plots", action="store_true", help="write report.md without plots")


def run(args: argparse.Namespace) -> int:
    from geosearch.report import write_report

    files = write_report(args.run_dir, study_name=args.study, storage=args.storage,
                         plots=not args.no_plots)
    print_report_files(files)
    return 0


def print_report_files(files: ReportFiles) -> None:
    """The files written, as ``geosearch report`` (and ``search``, at its end) prints them."""
    print(f"report: {files.report}")
    if files.plots:
        print(f"plots:  {files.report.parent / 'plots'} ({', '.join(p.name for p in files.plots.values())})")
    if files.plots_note:
        print(files.plots_note)
