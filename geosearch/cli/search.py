"""``geosearch search``: an Optuna study of which geometry each module type should use
(:func:`geosearch.search.study.run.run_search`), then its report."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from geosearch.cli._args import (
    MODEL_ARG_HELP,
    MODEL_HELP,
    RULES_DEFAULT,
    TOKENIZER_HELP,
    VOCAB_HELP,
    add_knobs,
    key_values,
)
from geosearch.util.errors import GeosearchError

if TYPE_CHECKING:  # pragma: no cover
    from geosearch.search.space.spec import SearchSpace


def add(p: argparse.ArgumentParser) -> None:
    p.epilog = ("Rerun the same command to resume: finished trials are kept and count towards "
                "--trials; a trial cut short by Ctrl-C or a crash runs again, and so does one that "
                "failed because of its environment (out of memory, CUDA, disk, storage; "
                "--max-retries). At the end the "
                "search exports DIR/<study>/best_assignment.yaml and writes DIR/<study>/report.md "
                "(as `geosearch report` does). Data-parallel trials (each trial on N processes, "
                "rank 0 runs the study): torchrun --nproc_per_node N -m geosearch search ... (CPU); "
                "accelerate launch --multi_gpu --num_processes N -m geosearch search ... (GPUs). "
                "Several machines: the same --study and --storage postgresql://... on each.")
    _add_proxy(p)
    _add_study(p)
    _add_target(p)
    p.add_argument("--seed", type=int, metavar="S", help="sampler seed")
    p.add_argument("--sampler", help="auto, grid, tpe, random or gp")
    p.add_argument("--device", help="auto, cpu or cuda")
    add_knobs(p)
    _add_workers(p)
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override any key of the space, e.g. proxy.eval_every=25 (repeatable)")
    p.add_argument("--worker-index", type=int, help=argparse.SUPPRESS)


def _add_proxy(p: argparse.ArgumentParser) -> None:
    """--space and what the proxy trains: --model, --data, --tokenizer, --vocab-size, --model-arg."""
    p.add_argument("--space", default="default", metavar="FILE|NAME",
                   help="search-space YAML, or a shipped space: default, paper, full, llama, moe, "
                        "roles (default: default); a shipped name always means the shipped space: "
                        "write ./NAME for a file of that name")
    p.add_argument("--model", metavar="SPEC",
                   help=MODEL_HELP + " (default: the space's; a space that names no rules takes the "
                        f"model's: {RULES_DEFAULT})")
    p.add_argument("--data", metavar="PATH", help="corpus file or directory (default: the space's)")
    p.add_argument("--tokenizer", metavar="PATH", help=TOKENIZER_HELP + " (default: the space's)")
    p.add_argument("--vocab-size", type=int, metavar="N", help=VOCAB_HELP + "; sets proxy.vocab_size")
    p.add_argument("--model-arg", action="append", default=[], metavar="KEY=VALUE",
                   help=MODEL_ARG_HELP + "; sets proxy.model_args.KEY")


def _add_study(p: argparse.ArgumentParser) -> None:
    """The study's name, directory and size, and each proxy run's."""
    p.add_argument("--study", "--study-name", metavar="NAME", help="study name (default: the space's name)")
    p.add_argument("--runs-dir", default="runs", metavar="DIR",
                   help="the study runs in DIR/<study>/ (default: runs)")
    p.add_argument("--trials", "--n-trials", type=int, metavar="N",
                   help="total trials of the study, earlier runs included")
    p.add_argument("--timeout", type=float, metavar="SECONDS", help="stop starting trials after this long")
    p.add_argument("--steps", type=int, metavar="N", help="training steps of each proxy run")
    p.add_argument("--batch-size", type=int, metavar="N", help="proxy batch in sequences")
    p.add_argument("--repeats", type=int, metavar="N", help="seeds per assignment (mean and spread)")


def _add_target(p: argparse.ArgumentParser) -> None:
    """The training run the ranking is for: --target-steps, --target-spectral-lr, --target-model."""
    p.add_argument("--target-steps", type=int, metavar="N",
                   help="steps of the training run you will do: the ranking is given for its "
                        "cumulative spectral step Σ η (default: the space's target)")
    p.add_argument("--target-spectral-lr", type=float, metavar="X",
                   help="its peak spectral step size (default: the proxy's)")
    p.add_argument("--target-model", metavar="SPEC",
                   help="its model, for the logit scale d/√d_head the pruner's forecast uses "
                        "(default: the proxy's)")


def _add_workers(p: argparse.ArgumentParser) -> None:
    """Where the study is stored and who runs its trials: storage, workers, retries."""
    p.add_argument("--storage", metavar="URL",
                   help="Optuna storage URL (e.g. postgresql://...) or journal file, instead of "
                        "DIR/<study>/study.db (one worker) or journal.log (several)")
    p.add_argument("--workers", type=int, metavar="N",
                   help="worker processes on this machine, one GPU each (else a share of the CPU); "
                        "not with torchrun/accelerate launch (default: on a CPU, one single-thread "
                        "worker per core when the grid has a point for each and OMP_NUM_THREADS "
                        "is not set, else one process)")
    p.add_argument("--stale-after", type=float, metavar="SECONDS",
                   help="a trial whose worker (on another machine) sent no heartbeat for this long "
                        "is taken as dead and run again (default: 300; give every machine the same)")
    p.add_argument("--max-retries", type=int, default=2, metavar="N",
                   help="run a point again up to N times in a row when its trial fails because of "
                        "the environment (out of memory, CUDA, disk, storage); a failure of the "
                        "assignment itself is not retried (default: 2)")
    p.add_argument("--threads", type=int, metavar="N",
                   help="torch threads of the search and of each worker (default: a worker's "
                        "share of the cores; one process: OMP_NUM_THREADS, else every core)")
    p.add_argument("--retry-failed", action="store_true",
                   help="queue the study's failed points again, once each, and run them")


def run(args: argparse.Namespace) -> int:
    import optuna

    from geosearch.search.runtime.distributed import leave_together
    from geosearch.search.runtime.interrupts import output_guard
    from geosearch.search.runtime.storage import check_dir
    from geosearch.util.urls import redact
    from geosearch.search.runtime.workers import follow_parent, sigterm_as_ctrl_c
    from geosearch.search.study.options import SearchOptions
    from geosearch.search.study.run import run_search

    if args.worker_index is not None:
        follow_parent()  # a worker stops with its --workers parent, however that ends
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    check_dir(args.runs_dir, source="--runs-dir")
    space = _space(args)
    if args.worker_index is None:  # the flags, named before the study (the preflight names the space's keys)
        if args.device is not None:
            from geosearch.proxy.accelerator import check_device

            check_device(args.device, source="--device", key=None)
        if args.log_with is not None:  # the flag's trackers are the space's proxy.log_with now
            from geosearch.proxy.trackers import check_trackers

            check_trackers(space.proxy.log_with, source="--log-with", key=None)
    try:
        # a SIGTERM'd search records its trial as interrupted, like Ctrl-C
        with sigterm_as_ctrl_c(), output_guard():  # `search | head` ends as a Ctrl-C
            outcome = run_search(space, SearchOptions(
                runs_dir=args.runs_dir, storage=args.storage, export=False, workers=args.workers,
                worker_index=args.worker_index, max_retries=args.max_retries,
                retry_failed=args.retry_failed, threads=args.threads,
                **({} if args.stale_after is None else {"stale_after": args.stale_after})))
    except optuna.exceptions.StorageInternalError as e:  # e.g. a database connection dropped
        cause = str(e.__cause__ or e).strip().splitlines() or [type(e).__name__]
        raise GeosearchError(f"the storage failed ({redact(cause[0], args.storage)[:200]}); what it "
                             "holds is kept: rerun the same command to resume") from None
    try:
        if outcome.rank:  # a data-parallel rank other than 0: rank 0 reports
            return 0
        if args.worker_index is None:
            _export_and_report(outcome, args.storage)
    finally:
        leave_together()  # data-parallel ranks wait for rank 0's report, then exit together
    if args.worker_index is not None or outcome.ranking.rows:
        return 0
    print(f"geosearch search: no trial completed in {outcome.run_dir}; nothing exported",
          file=sys.stderr)
    return 1


def _space(args: argparse.Namespace) -> SearchSpace:
    """The space of ``--space`` with ``--set``, ``--model-arg`` and the other flags over it."""
    from geosearch.search.space.spec import CLI_FLAGS, apply_overrides, load_space

    key_values(args.model_arg, "--model-arg")  # checked here: the message names the flag
    model_args = [f"proxy.model_args.{item.strip()}" for item in args.model_arg]
    # every flag of CLI_FLAGS is an argument of the same name; --study sets the name
    flags = {f: getattr(args, "study" if f == "name" else f) for f in CLI_FLAGS}
    return apply_overrides(load_space(args.space), [*args.set, *model_args], **flags)


def _export_and_report(outcome, storage: str | None) -> None:
    """Export the best assignment, write the report, then say where both are in one line
    (:func:`~geosearch.search.study.export.where_line`)."""
    from geosearch.search.study.export import export_best, where_line

    exported = (export_best(outcome.run_dir, study_name=outcome.study_name, storage=storage)[0]
                if outcome.ranking.rows else None)
    outcome.exported = exported
    files = _report_after_search(outcome.run_dir, outcome.study_name, storage)
    line = where_line(exported, files.report if files else None, bool(files and files.plots))
    if line:
        print(line)
    if files is not None and files.plots_note:
        print(files.plots_note)


def _report_after_search(run_dir: Path, study_name: str, storage: str | None):
    """Write report.md (and plots, when matplotlib is installed) for the finished search;
    its files, ``None`` when it failed.

    The study is already saved: a report that fails costs one warning line, not the search.
    """
    from geosearch.report import write_report
    from geosearch.util.urls import redact

    try:
        files = write_report(run_dir, study_name=study_name, storage=storage)
    except Exception as e:  # noqa: BLE001 - any failure here must leave the search's result alone
        first = redact((str(e).strip().splitlines() or [""])[0], storage)
        print(f"warning: the search is saved, but its report failed ({type(e).__name__}: {first}); "
              f"retry with: geosearch report {run_dir}", file=sys.stderr)
        return None
    return files
