"""``geosearch export``: the best assignment(s) of a run directory as YAML."""

from __future__ import annotations

import argparse


def add(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", metavar="RUN_DIR", help="a run directory, e.g. runs/default")
    p.add_argument("-o", "--out", metavar="FILE",
                   help="output file (default RUN_DIR/best_assignment.yaml); with --top K > 1 a "
                        "directory (default RUN_DIR/top) that gets one file per rank")
    p.add_argument("--top", type=int, default=1, metavar="K", help="export the K best assignments")
    p.add_argument("--rules", metavar="NAME",
                   help="write the answer for another rule set, e.g. gpt2 or llama for a Hugging Face "
                        "model (each module type takes its counterpart's geometry; see docs/design.md, "
                        "\"Moving an answer to another model\")")
    p.add_argument("--study", metavar="NAME", help="the study (default: the only one in the storage)")
    p.add_argument("--storage", metavar="URL",
                   help="storage URL or journal file instead of RUN_DIR/study.db or journal.log")


def run(args: argparse.Namespace) -> int:
    import optuna

    from geosearch.search.study.export import export_best, export_summary

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    paths = export_best(args.run_dir, args.out, top=args.top, study_name=args.study,
                        storage=args.storage, rules=args.rules)
    print(export_summary(paths))
    return 0
