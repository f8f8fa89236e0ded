"""``geosearch train``: one proxy run with one assignment, summarised.

:func:`train_once` builds the :class:`~geosearch.proxy.config.TrainConfig` from a YAML file
and the command-line fields over it, reads the assignment (inline, in the module types of
the model's rule set, or from a file), trains once and prints the run's summary; its return
value is the command's exit code. :func:`run` only hands it the parsed flags.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from geosearch.cli._args import (
    MODEL_ARG_HELP,
    MODEL_HELP,
    RULES_DEFAULT,
    TOKENIZER_HELP,
    VOCAB_HELP,
    add_knobs,
    key_values,
)

if TYPE_CHECKING:  # pragma: no cover
    from geosearch.assignment import Assignment
    from geosearch.proxy.config import TrainConfig


def add(p: argparse.ArgumentParser) -> None:
    p.epilog = ("Several processes, same global batch: "
                "accelerate launch --multi_gpu --num_processes N -m geosearch train ... (GPUs); "
                "torchrun --nproc_per_node N -m geosearch train --device cpu ... (CPU).")
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--assign", metavar="TEXT",
                       help='geometries inline, e.g. "attn=stiefel,mlp=dgram"')
    which.add_argument("--assignment", metavar="FILE", help="an assignment YAML file")
    p.add_argument("--config", metavar="FILE",
                   help="YAML of TrainConfig fields; the flags below override it")
    p.add_argument("--model", metavar="SPEC", help=MODEL_HELP + " (default: small)")
    p.add_argument("--model-arg", action="append", default=[], metavar="KEY=VALUE", help=MODEL_ARG_HELP)
    p.add_argument("--rules", metavar="NAME",
                   help=f"the rule set --assign's module types refer to (default: the model's: {RULES_DEFAULT}; "
                        "nanogpt for py: models)")
    p.add_argument("--data", metavar="PATH", help="corpus file or directory (default: built-in text)")
    p.add_argument("--tokenizer", metavar="PATH", help=TOKENIZER_HELP + " (default: bytes, vocab 256)")
    p.add_argument("--vocab-size", type=int, metavar="N", help=VOCAB_HELP)
    p.add_argument("--steps", type=int)
    p.add_argument("--batch-size", type=int, help="global batch in sequences")
    p.add_argument("--lr", type=float, help="AdamW learning rate (default 6e-4)")
    p.add_argument("--spectral-lr", type=float, help="manifold Muon step size (default 0.02)")
    p.add_argument("--solver", help="manifold Muon direction: project (default) or dual")
    p.add_argument("--eval-every", type=int)
    p.add_argument("--probe-every", type=int)
    p.add_argument("--seed", type=int)
    p.add_argument("--device", help="auto (default), cpu or cuda")
    add_knobs(p)
    p.add_argument("--threads", type=int, metavar="N",
                   help="torch threads of the run (default: OMP_NUM_THREADS, else every core)")
    p.add_argument("--out", metavar="DIR", help="write config.yaml, metrics.jsonl, result.json here")
    p.add_argument("--quiet", action="store_true", help="no progress display")


_FIELDS = ("model", "data", "tokenizer", "vocab_size", "steps", "batch_size", "lr", "spectral_lr", "solver",
           "eval_every", "probe_every", "seed", "device", "mixed_precision", "grad_accum",
           "compile", "log_with")
"""Flags of ``geosearch train`` that set the TrainConfig field of the same name."""


def run(args: argparse.Namespace) -> int:
    from geosearch.search.runtime.workers import sigterm_as_ctrl_c

    with sigterm_as_ctrl_c():  # SIGTERM (timeout, SLURM, docker stop) ends the trackers' runs too
        return train_once(
            config_file=args.config,
            fields={f: getattr(args, f) for f in _FIELDS if getattr(args, f) is not None},
            model_args=key_values(args.model_arg, "--model-arg"), assign=args.assign,
            assignment_file=args.assignment, rules=args.rules, out=args.out,
            progress=not args.quiet, threads=args.threads)


def train_once(*, config_file: str | os.PathLike | None, fields: Mapping[str, Any],
               model_args: Mapping[str, Any], assign: str | None, assignment_file: str | None,
               rules: str | None, out: str | None, progress: bool,
               threads: int | None = None) -> int:
    """Train the proxy once, as ``geosearch train`` does, and print the summary.

    Args:
        config_file: YAML of :class:`~geosearch.proxy.config.TrainConfig` fields, or None.
        fields: TrainConfig fields given on the command line; they override the file's.
        model_args: model fields (``--model-arg``), merged over the file's ``model_args``.
        assign: an inline assignment (``"attn=stiefel,mlp=dgram"``), or None.
        assignment_file: an assignment YAML file, when ``assign`` is None.
        rules: the rule set ``assign``'s module types refer to; None = the model's
            (``nanogpt`` for ``py:`` models). Only with ``assign``.
        out: the run directory, or None.
        progress: show progress on stderr.
        threads: torch threads of the run (``--threads``), or None for torch's.

    Returns:
        0 when the run completed, 1 when it ended unstable or failed.

    Raises:
        ConfigError: an unreadable config file, a bad field, an unknown module type or
            geometry, ``rules`` with an assignment file, an ``out`` that is a file, cannot
            be written, or would write over a study's files or a finished run (before
            anything is trained).
    """
    from geosearch.util.errors import ConfigError
    from geosearch.util.files import check_dir
    from geosearch.models.memory import (check_fits, matmul_rate, parameter_count,
                                         probe_logit_bytes, step_flops, time_note)
    from geosearch.models.zoo import build_meta_model
    from geosearch.proxy.accelerator import check_device
    from geosearch.proxy.accelerator import get_accelerator
    from geosearch.proxy.data import config_corpus
    from geosearch.proxy.trackers import check_trackers, tracker_lines
    from geosearch.proxy.train import train
    from geosearch.search.runtime.storage import check_outside_study
    from geosearch.search.runtime.workers import share_cpu, thread_note

    if threads is not None and threads < 1:
        raise ConfigError(f"expected a whole number >= 1, got {threads}", source="--threads")
    config = _config(config_file, fields, model_args)
    if out:  # a file there, or a directory that cannot be written: said before any work
        check_dir(out, source="--out")
        check_outside_study(out, source="--out", folder=True)  # not over a study or a run
    if config.log_with and not out:
        raise ConfigError("the trackers write their files under the run directory: add --out DIR",
                          source="--log-with")
    assignment, source = _assignment(config, assign, assignment_file, rules)
    assignment.resolve()  # unknown types or geometries fail here, before any work

    def named(key: str) -> dict[str, str | None]:
        """Where ``key`` was set: its flag, else the config file's key (or the default's)."""
        if key in fields:
            return {"source": "--" + key.replace("_", "-"), "key": None}
        return {"source": os.fspath(config_file or "--config"), "key": key}

    check_device(config.device, **named("device"))
    check_trackers(config.log_with, **named("log_with"))  # the error names --log-with
    # bad data (a pipe, meta.json, a tokenizer) is one line before the run says it starts;
    # the corpus is cached for the run
    corpus = config_corpus(config)
    # a model too large for this machine is one line, not an allocator's traceback
    built = build_meta_model(config.model, vocab_size=corpus.vocab_size, model_args=config.model_args)
    check_fits(built.model, config.model, check_device(config.device),
               **({"source": "--model-arg", "key": None} if model_args else named("model_args")),
               probe_bytes=probe_logit_bytes(built.config, built.block_size,
                                             config.probe_batch_size))
    flops = step_flops(parameter_count(built.model), built.config, built.block_size,
                       config.batch_size)
    del built
    if threads is not None:  # every process of a launch: --threads each
        share_cpu(1, threads)
    accelerator = get_accelerator(config.device, config.mixed_precision)
    main_process = accelerator.is_main_process
    if main_process:  # a run of an hour or more is said (memory.time_note)
        slow = time_note(config.model, flops, config.steps,
                         matmul_rate(accelerator.device) * accelerator.num_processes)
        print(f"training {config.model} with {source}: "
              + ", ".join(f"{t}={g}" for t, g in assignment.resolve().items()), file=sys.stderr)
        note = thread_note() if check_device(config.device) == "cpu" else None
        lines = [x for x in (note, slow) if x]  # then one line per tracker: where its run is
        lines += tracker_lines(config.log_with, out or ".", project="geosearch",
                               store_dir=out or ".")
        for line in lines:
            print(line, file=sys.stderr)
    result = train(config, assignment, out_dir=out, progress=progress)
    if not main_process:
        return 0 if result.status == "completed" else 1
    print(result.summary())
    if out:
        print(f"files       {out}/config.yaml, metrics.jsonl, result.json")
    return 0 if result.status == "completed" else 1


def _assignment(config: TrainConfig, assign: str | None, assignment_file: str | None,
                rules: str | None) -> tuple[Assignment, str | None]:
    """The assignment to train, and what to call where it came from (``--assign`` or the file)."""
    from geosearch.assignment import Assignment, load_assignment
    from geosearch.util.errors import ConfigError
    from geosearch.models.zoo import default_rules

    if assign is not None:
        # the module types of --assign are the model's (hf:llama: attn_q, ..., mlp_gate)
        assignment = Assignment.parse(assign, rules=rules or default_rules(config.model, config.model_args) or "nanogpt")
        return assignment, "--assign"
    if rules is not None:
        raise ConfigError("--rules goes with --assign; an assignment file names its own rules",
                          source="--rules")
    return load_assignment(assignment_file), assignment_file


def _config(config_file: str | os.PathLike | None, fields: Mapping[str, Any],
            model_args: Mapping[str, Any]) -> TrainConfig:
    """The file's fields, the command line's over them."""
    from geosearch.proxy.config import TrainConfig
    from geosearch.util.yaml_io import load_yaml

    merged: Any = {}
    if config_file:
        merged = load_yaml(config_file, what="a mapping of TrainConfig fields", default={})
    source = os.fspath(config_file) if config_file else "command line"
    if not isinstance(merged, dict):
        return TrainConfig.from_dict(merged, source=source)  # says it must be a mapping
    merged.update(fields)
    if model_args:
        merged["model_args"] = {**(merged.get("model_args") or {}), **model_args}
    return TrainConfig.from_dict(merged, source=source)
