"""The ``geosearch`` command.

Each subcommand is a pair of functions, ``_add_<name>(parser)`` declaring its flags and
``_run_<name>(args) -> int`` doing the work, listed once in ``_COMMANDS``. User errors
(:class:`geosearch.errors.GeosearchError`) end as one line on stderr with exit code 2;
Ctrl-C ends with exit code 130 and nothing lost (studies resume on rerun).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from geosearch import __version__
from geosearch.errors import GeosearchError


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


# --------------------------------------------------------------------------- registry
_COMMANDS: list[tuple[str, str, Callable, Callable]] = [
    ("geometries", "list the geometries a module type can take", _add_geometries, _run_geometries),
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


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
