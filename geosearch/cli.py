"""The ``geosearch`` command.

Each subcommand is a pair of functions, ``_add_<name>(parser)`` declaring its flags and
``_run_<name>(args) -> int`` handing them to the module that does the work
(:func:`geosearch.commands.train_once`, :func:`geosearch.inspect.inspect_model`, ...),
listed once in ``_COMMANDS``. User errors
(:class:`geosearch.errors.GeosearchError`) end as one line on stderr with exit code 2;
Ctrl-C ends with exit code 130 and nothing lost (studies resume on rerun).
"""

from __future__ import annotations

import argparse
import errno
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from geosearch import __version__
from geosearch.errors import GeosearchError

if TYPE_CHECKING:  # pragma: no cover
    from geosearch.report import ReportFiles


_MODEL_HELP = ("the model: a proxy preset (tiny, small, gpt2), hf:gpt2, hf:llama, hf:MODEL_TYPE (e.g. "
               "hf:mistral, hf:qwen2, hf:gemma, hf:phi3) or hf:PATH (a directory with config.json) (Hugging Face, "
               "random weights, no download), or py:MODULE:FACTORY (your own nn.Module)")
_MODEL_ARG_HELP = ("override a model field, e.g. n_layer=2 (presets, hf:gpt2), num_hidden_layers=2 "
                   "(hf:llama), block_size=64 (any); repeatable")
_RULES_DEFAULT = ("nanogpt for the presets, gpt2 for hf:gpt2, llama for hf:llama; for other hf: models the "
                  "registered rule set that fits, else rules read off their module names")
_TOKENIZER_HELP = ("a Hugging Face tokenizer.json (or a directory holding one) to encode the text with; "
                   "the vocabulary size is then the tokenizer's")


def _key_values(items: Sequence[str], flag: str) -> dict:
    """``KEY=VALUE`` flags as a dict, each value read as YAML (numbers, booleans, null;
    :func:`geosearch.yaml_io.parse_value`)."""
    from geosearch.errors import ConfigError
    from geosearch.yaml_io import parse_value

    out = {}
    for item in items:
        key, eq, value = item.partition("=")
        if not eq or not key.strip():
            raise ConfigError(f"expected KEY=VALUE but got {item!r}", source=flag)
        out[key.strip()] = parse_value(value, source=f"{flag} {key.strip()}")
    return out


# --------------------------------------------------------------------------- geometries
def _add_geometries(p: argparse.ArgumentParser) -> None:
    pass


def _run_geometries(args: argparse.Namespace) -> int:
    from geosearch.manifolds import get_manifold, manifold_names

    for name in manifold_names():
        doc = (get_manifold(name).__class__.__doc__ or "").strip().splitlines()
        print(f"{name:14s} {doc[0] if doc else ''}")
    print(f"{'adamw':14s} not a manifold: the weights are trained with AdamW")
    return 0


# --------------------------------------------------------------------------- train
def _add_train(p: argparse.ArgumentParser) -> None:
    p.epilog = ("Several processes, same global batch: "
                "accelerate launch --multi_gpu --num_processes N -m geosearch train ... (GPUs); "
                "torchrun --nproc_per_node N -m geosearch train --device cpu ... (CPU).")
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--assign", metavar="TEXT",
                       help='geometries inline, e.g. "attn=stiefel,mlp=dgram"')
    which.add_argument("--assignment", metavar="FILE", help="an assignment YAML file")
    p.add_argument("--config", metavar="FILE",
                   help="YAML of TrainConfig fields; the flags below override it")
    p.add_argument("--model", metavar="SPEC", help=_MODEL_HELP + " (default: small)")
    p.add_argument("--model-arg", action="append", default=[], metavar="KEY=VALUE", help=_MODEL_ARG_HELP)
    p.add_argument("--rules", metavar="NAME",
                   help=f"the rule set --assign's module types refer to (default: the model's: {_RULES_DEFAULT}; "
                        "nanogpt for py: models)")
    p.add_argument("--data", metavar="PATH", help="corpus file or directory (default: built-in text)")
    p.add_argument("--tokenizer", metavar="PATH", help=_TOKENIZER_HELP + " (default: bytes, vocab 256)")
    p.add_argument("--steps", type=int)
    p.add_argument("--batch-size", type=int, help="global batch in sequences")
    p.add_argument("--lr", type=float, help="AdamW learning rate (default 6e-4)")
    p.add_argument("--spectral-lr", type=float, help="manifold Muon step size (default 0.02)")
    p.add_argument("--solver", help="manifold Muon direction: project (default) or dual")
    p.add_argument("--eval-every", type=int)
    p.add_argument("--probe-every", type=int)
    p.add_argument("--seed", type=int)
    p.add_argument("--device", help="auto (default), cpu or cuda")
    _add_knobs(p)
    p.add_argument("--out", metavar="DIR", help="write config.yaml, metrics.jsonl, result.json here")
    p.add_argument("--quiet", action="store_true", help="no progress display")


_TRAIN_FIELDS = ("model", "data", "tokenizer", "steps", "batch_size", "lr", "spectral_lr", "solver",
                 "eval_every", "probe_every", "seed", "device", "mixed_precision", "grad_accum",
                 "compile", "log_with")
"""Flags of ``geosearch train`` that set the TrainConfig field of the same name."""


def _add_knobs(p: argparse.ArgumentParser) -> None:
    """The training flags ``train`` and ``search`` share (TrainConfig fields)."""
    p.add_argument("--mixed-precision", metavar="{no,bf16,fp16}",
                   help="default: Accelerate's configuration (accelerate launch --mixed_precision, "
                        "accelerate config), else no; fp16 needs CUDA")
    p.add_argument("--grad-accum", type=int, metavar="N",
                   help="split the global batch into N micro-batches per optimizer step (default 1)")
    p.add_argument("--compile", action="store_true", default=None,
                   help="torch.compile the model for the training steps")
    p.add_argument("--log-with", metavar="TRACKER[,TRACKER]",
                   help="log each run's records to Accelerate trackers (tensorboard, wandb, mlflow, "
                        "...), offline, under the run directory")


def _run_train(args: argparse.Namespace) -> int:
    from geosearch.commands import train_once

    return train_once(
        config_file=args.config,
        fields={f: getattr(args, f) for f in _TRAIN_FIELDS if getattr(args, f) is not None},
        model_args=_key_values(args.model_arg, "--model-arg"), assign=args.assign,
        assignment_file=args.assignment, rules=args.rules, out=args.out, progress=not args.quiet)


# --------------------------------------------------------------------------- report
def _add_report(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", metavar="RUN_DIR", help="a run directory, e.g. runs/default")
    p.add_argument("--study", metavar="NAME",
                   help="the study to report (default: the only study in the storage)")
    p.add_argument("--storage", metavar="URL",
                   help="storage URL or journal file instead of RUN_DIR/study.db or journal.log")
    p.add_argument("--no-plots", action="store_true", help="write report.md without plots")


def _run_report(args: argparse.Namespace) -> int:
    from geosearch.report import write_report

    files = write_report(args.run_dir, study_name=args.study, storage=args.storage,
                         plots=not args.no_plots)
    _print_report_files(files)
    return 0


def _print_report_files(files: ReportFiles) -> None:
    print(f"report: {files.report}")
    if files.plots:
        print(f"plots:  {files.report.parent / 'plots'} ({', '.join(p.name for p in files.plots.values())})")
    if files.plots_note:
        print(files.plots_note)


# --------------------------------------------------------------------------- search
def _add_search(p: argparse.ArgumentParser) -> None:
    p.epilog = ("Rerun the same command to resume: finished trials are kept and count towards "
                "--trials; a trial cut short by Ctrl-C or a crash runs again, and so does one that "
                "failed because of its environment (out of memory, CUDA, disk, storage; "
                "--max-retries). At the end the "
                "search exports DIR/<study>/best_assignment.yaml and writes DIR/<study>/report.md "
                "(as `geosearch report` does). Data-parallel trials (each trial on N processes, "
                "rank 0 runs the study): torchrun --nproc_per_node N -m geosearch search ... (CPU); "
                "accelerate launch --multi_gpu --num_processes N -m geosearch search ... (GPUs). "
                "Several machines: the same --study and --storage postgresql://... on each.")
    p.add_argument("--space", default="default", metavar="FILE|NAME",
                   help="search-space YAML, or a shipped space: default, paper, full, llama (default: "
                        "default); a shipped name always means the shipped space: write ./NAME for a "
                        "file of that name")
    p.add_argument("--model", metavar="SPEC",
                   help=_MODEL_HELP + " (default: the space's; a space that names no rules takes the "
                        f"model's: {_RULES_DEFAULT})")
    p.add_argument("--data", metavar="PATH", help="corpus file or directory (default: the space's)")
    p.add_argument("--tokenizer", metavar="PATH", help=_TOKENIZER_HELP + " (default: the space's)")
    p.add_argument("--model-arg", action="append", default=[], metavar="KEY=VALUE",
                   help=_MODEL_ARG_HELP + "; sets proxy.model_args.KEY")
    p.add_argument("--study", "--study-name", metavar="NAME", help="study name (default: the space's name)")
    p.add_argument("--runs-dir", default="runs", metavar="DIR",
                   help="the study runs in DIR/<study>/ (default: runs)")
    p.add_argument("--trials", "--n-trials", type=int, metavar="N",
                   help="total trials of the study, earlier runs included")
    p.add_argument("--timeout", type=float, metavar="SECONDS", help="stop starting trials after this long")
    p.add_argument("--steps", type=int, metavar="N", help="training steps of each proxy run")
    p.add_argument("--batch-size", type=int, metavar="N", help="proxy batch in sequences")
    p.add_argument("--repeats", type=int, metavar="N", help="seeds per assignment (mean and spread)")
    p.add_argument("--target-steps", type=int, metavar="N",
                   help="steps of the training run you will do: the ranking is given for its "
                        "cumulative spectral step Σ η (default: the space's target)")
    p.add_argument("--target-spectral-lr", type=float, metavar="X",
                   help="its peak spectral step size (default: the proxy's)")
    p.add_argument("--target-model", metavar="SPEC",
                   help="its model, for the logit scale d/√d_head the pruner's forecast uses "
                        "(default: the proxy's)")
    p.add_argument("--seed", type=int, metavar="S", help="sampler seed")
    p.add_argument("--sampler", help="auto, grid, tpe, random or gp")
    p.add_argument("--device", help="auto, cpu or cuda")
    _add_knobs(p)
    p.add_argument("--storage", metavar="URL",
                   help="Optuna storage URL (e.g. postgresql://...) or journal file, instead of "
                        "DIR/<study>/study.db (one worker) or journal.log (several)")
    p.add_argument("--workers", type=int, default=1, metavar="N",
                   help="worker processes on this machine, one GPU each (else a share of the CPU); "
                        "not with torchrun/accelerate launch")
    p.add_argument("--stale-after", type=float, metavar="SECONDS",
                   help="a trial whose worker (on another machine) sent no heartbeat for this long "
                        "is taken as dead and run again (default: 300; give every machine the same)")
    p.add_argument("--max-retries", type=int, default=2, metavar="N",
                   help="run a point again up to N times in a row when its trial fails because of "
                        "the environment (out of memory, CUDA, disk, storage); a failure of the "
                        "assignment itself is not retried (default: 2)")
    p.add_argument("--retry-failed", action="store_true",
                   help="queue the study's failed points again, once each, and run them")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override any key of the space, e.g. proxy.eval_every=25 (repeatable)")
    p.add_argument("--worker-index", type=int, help=argparse.SUPPRESS)


def _run_search(args: argparse.Namespace) -> int:
    import optuna

    from geosearch.search.distributed import leave_together
    from geosearch.search.space import apply_overrides, load_space
    from geosearch.search.storage import check_dir, mask_url
    from geosearch.search.study import run_search
    from geosearch.search.workers import follow_parent, sigterm_as_ctrl_c

    if args.worker_index is not None:
        follow_parent()  # a worker stops with its --workers parent, however that ends
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    check_dir(args.runs_dir, source="--runs-dir")
    _key_values(args.model_arg, "--model-arg")  # checked here: the message names the flag
    model_args = [f"proxy.model_args.{item.strip()}" for item in args.model_arg]
    space = apply_overrides(
        load_space(args.space), [*args.set, *model_args], trials=args.trials, timeout=args.timeout,
        tokenizer=args.tokenizer, steps=args.steps, model=args.model, data=args.data, batch_size=args.batch_size,
        device=args.device, mixed_precision=args.mixed_precision, grad_accum=args.grad_accum,
        compile=args.compile, log_with=args.log_with, repeats=args.repeats, seed=args.seed, sampler=args.sampler,
        name=args.study, target_steps=args.target_steps,
        target_spectral_lr=args.target_spectral_lr, target_model=args.target_model)
    if args.device is not None and args.worker_index is None:  # the flag, named before the study
        from geosearch.proxy.accelerator import check_device

        check_device(args.device, source="--device", key=None)
    try:
        with sigterm_as_ctrl_c():  # a SIGTERM'd search records its trial as interrupted, like Ctrl-C
            outcome = run_search(space, runs_dir=args.runs_dir, storage=args.storage,
                                 workers=args.workers, worker_index=args.worker_index,
                                 max_retries=args.max_retries, retry_failed=args.retry_failed,
                                 **({} if args.stale_after is None else {"stale_after": args.stale_after}))
    except optuna.exceptions.StorageInternalError as e:  # e.g. a database connection dropped
        cause = str(e.__cause__ or e).strip().splitlines() or [type(e).__name__]
        raise GeosearchError(f"the storage failed ({mask_url(cause[0])[:200]}); what it holds is "
                             "kept: rerun the same command to resume") from None
    try:
        if outcome.rank:  # a data-parallel rank other than 0: rank 0 reports
            return 0
        if args.worker_index is None:
            _report_after_search(outcome.run_dir, outcome.study_name, args.storage)
    finally:
        leave_together()  # data-parallel ranks wait for rank 0's report, then exit together
    if args.worker_index is not None or outcome.ranking.rows:
        return 0
    print(f"geosearch search: no trial completed in {outcome.run_dir}; nothing exported",
          file=sys.stderr)
    return 1


def _report_after_search(run_dir: Path, study_name: str, storage: str | None) -> None:
    """Write report.md (and plots, when matplotlib is installed) for the finished search.

    The study is already saved: a report that fails costs one warning line, not the search.
    """
    from geosearch.report import write_report

    try:
        files = write_report(run_dir, study_name=study_name, storage=storage)
    except Exception as e:  # noqa: BLE001 - any failure here must leave the search's result alone
        first = (str(e).strip().splitlines() or [""])[0]
        print(f"warning: the search is saved, but its report failed ({type(e).__name__}: {first}); "
              f"retry with: geosearch report {run_dir}", file=sys.stderr)
        return
    _print_report_files(files)


# --------------------------------------------------------------------------- export
def _add_export(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", metavar="RUN_DIR", help="a run directory, e.g. runs/default")
    p.add_argument("-o", "--out", metavar="FILE",
                   help="output file (default RUN_DIR/best_assignment.yaml); with --top K > 1 a "
                        "directory (default RUN_DIR/top) that gets one file per rank")
    p.add_argument("--top", type=int, default=1, metavar="K", help="export the K best assignments")
    p.add_argument("--study", metavar="NAME", help="the study (default: the only one in the storage)")
    p.add_argument("--storage", metavar="URL",
                   help="storage URL or journal file instead of RUN_DIR/study.db or journal.log")


def _run_export(args: argparse.Namespace) -> int:
    import optuna

    from geosearch.search.export import export_best, export_summary

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    paths = export_best(args.run_dir, args.out, top=args.top, study_name=args.study,
                        storage=args.storage)
    print(export_summary(paths))
    return 0


# --------------------------------------------------------------------------- inspect
def _add_inspect(p: argparse.ArgumentParser) -> None:
    p.epilog = ("The model is built on the meta device (no memory, no initialisation), with the "
                "byte-level vocabulary (256) unless --model-arg vocab_size=N says otherwise.")
    p.add_argument("--model", metavar="SPEC", help=_MODEL_HELP + " (default: the space's)")
    p.add_argument("--model-arg", action="append", default=[], metavar="KEY=VALUE", help=_MODEL_ARG_HELP)
    p.add_argument("--space", metavar="FILE|NAME", help="show each type's candidate geometries from this space")
    p.add_argument("--rules", metavar="NAME",
                   help=f"rule set (default: the space's, else the model's: {_RULES_DEFAULT})")
    p.add_argument("--assign", metavar="ASSIGNMENT|FILE",
                   help="also show the plan of this assignment (e.g. attn=stiefel,mlp=dgram, or a "
                        "YAML file): each module type's geometry, blocks, step size and options")


def _run_inspect(args: argparse.Namespace) -> int:
    from geosearch.inspect import inspect_model

    inspect_model(args.model, model_args=_key_values(args.model_arg, "--model-arg"),
                  space=args.space, rules=args.rules, assign=args.assign)
    return 0


# --------------------------------------------------------------------------- registry
_COMMANDS: list[tuple[str, str, Callable, Callable]] = [
    ("geometries", "list the geometries a module type can take", _add_geometries, _run_geometries),
    ("train", "train the proxy once with one assignment and report", _add_train, _run_train),
    ("report", "write report.md and plots for a run directory", _add_report, _run_report),
    ("search", "search which geometry each module type should use (an Optuna study)", _add_search,
     _run_search),
    ("export", "write the best assignment(s) of a run directory as YAML", _add_export, _run_export),
    ("inspect", "list a model's parameters, their module types and candidate geometries",
     _add_inspect, _run_inspect),
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="geosearch",
        description="Find which weight-space geometry each transformer module type should use.",
    )
    parser.add_argument("--version", action="version", version=f"geosearch {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, help_, add, run in _COMMANDS:
        p = sub.add_parser(name, help=help_, description=help_)
        add(p)
        p.set_defaults(_run=run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if any("://" in a and "@" in a for a in sys.argv):  # a run's config.yaml records sys.argv
        from geosearch.search.storage import mask_url

        sys.argv[:] = [mask_url(a) for a in sys.argv]
    if not hasattr(args, "_run"):
        parser.print_help()
        return 2
    try:
        return int(args._run(args) or 0)
    except GeosearchError as e:
        print(f"geosearch {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"geosearch {args.command}: interrupted; rerun the same command to resume", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `geosearch inspect | head`: the reader left; not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except OSError as e:
        if e.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        # a full disk: what is stored is whole (see docs/reliability.md), the rerun resumes
        where = f" ({e.filename})" if e.filename else ""
        print(f"geosearch {args.command}: error: {e.strerror}{where}; free some space, then rerun "
              "the same command to resume", file=sys.stderr)
        return 2




def entry() -> None:
    """The ``geosearch`` command (and ``python -m geosearch``): :func:`main`, then exit.

    After a Ctrl-C whose KeyboardInterrupt Python swallowed somewhere it runs code of its
    own (an import lock's or a weakref's callback), CPython still ends the process by
    SIGINT at exit, whatever :func:`main` returned; the interruption was recorded and its
    line printed, so exit with the 130 that says so.
    """
    code = main()
    if code == 130:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(130)
    raise SystemExit(code)

