"""``geosearch recover``: rebuild a run directory's damaged study storage from its backup."""

from __future__ import annotations

import argparse


def add(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", metavar="RUN_DIR", help="a run directory, e.g. runs/default")


def run(args: argparse.Namespace) -> int:
    import optuna

    from geosearch.search.runtime.rebuild import recover_run

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    for line in recover_run(args.run_dir, echo=print).lines():
        print(line)
    return 0
