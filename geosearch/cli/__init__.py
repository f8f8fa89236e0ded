"""The ``geosearch`` command.

Each subcommand is a module of this package (:mod:`geosearch.cli.train`,
:mod:`geosearch.cli.search`, ...) with two functions, ``add(parser)`` declaring its flags and
``run(args) -> int`` handing them to the code that does the work
(:func:`geosearch.cli.train.train_once`, :func:`geosearch.inspect.inspect_model`, ...),
listed once in ``_COMMANDS``; what several commands share is in :mod:`geosearch.cli._args`.
User errors (:class:`geosearch.util.errors.GeosearchError`) end as one line on stderr with exit
code 2; Ctrl-C ends with exit code 130 and nothing lost (studies resume on rerun).
"""

from __future__ import annotations

import argparse
import errno
import os
import sys
from collections.abc import Sequence
from types import ModuleType

from geosearch import __version__
from geosearch.cli import export, geometries, inspect, recover, report, search, train
from geosearch.util.errors import GeosearchError

_COMMANDS: list[tuple[str, str, ModuleType]] = [
    ("geometries", "list the geometries a module type can take", geometries),
    ("train", "train the proxy once with one assignment and report", train),
    ("report", "write report.md and plots for a run directory", report),
    ("search", "search which geometry each module type should use (an Optuna study)", search),
    ("export", "write the best assignment(s) of a run directory as YAML", export),
    ("inspect", "list a model's parameters, their module types and candidate geometries", inspect),
    ("recover", "rebuild a run directory's damaged study storage from its backup in trials/", recover),
]
"""The subcommands: name, one-line help, and the module with their ``add`` and ``run``."""


class _Parser(argparse.ArgumentParser):
    """An argument parser that remembers its dashed long options (``--mixed-precision``), so
    that :func:`main` also takes them spelled with underscores, as Accelerate and Hugging Face
    scripts do (``--mixed_precision``)."""

    dashed: set[str] = set()
    commands: dict[str, argparse.ArgumentParser] = {}

    def error(self, message: str):  # type: ignore[override]
        """argparse's error, as one line in the project's style, nothing before it (no usage)."""
        from geosearch.cli._args import parse_error_line

        self.exit(2, f"{self.prog}: error: {parse_error_line(message, self)}\n")

    def add_argument(self, *names: str, **kwargs):  # type: ignore[override]
        _Parser.dashed.update(n for n in names if n.startswith("--") and "-" in n[2:])
        return super().add_argument(*names, **kwargs)


def _dashes(argv: Sequence[str]) -> list[str]:
    """``argv`` with each ``--long_option`` (or ``--long_option=value``) whose dashed spelling is
    a flag of the command spelled so; everything after ``--`` left alone."""
    out = []
    for i, a in enumerate(argv):
        if a == "--":
            return out + list(argv[i:])
        name, eq, value = a.partition("=")
        dashed = name.replace("_", "-")
        out.append(dashed + eq + value if name.startswith("--") and dashed in _Parser.dashed else a)
    return out


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="geosearch",
        description="Find which weight-space geometry each transformer module type should use.",
    )
    parser.add_argument("--version", action="version", version=f"geosearch {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, help_, command in _COMMANDS:
        p = sub.add_parser(name, help=help_, description=help_)
        command.add(p)
        _Parser.commands[name] = p
        p.set_defaults(_run=command.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    for stream in (sys.stdout, sys.stderr):  # PYTHONIOENCODING=ascii, a C locale: Σ as \u03a3
        if hasattr(stream, "reconfigure") and getattr(stream, "errors", None) == "strict":
            stream.reconfigure(errors="backslashreplace")
    parser = build_parser()
    args, extra = parser.parse_known_args(_dashes(sys.argv[1:] if argv is None else argv))
    if extra:  # the first argument no flag took: one line, from the command's own parser
        from geosearch.cli._args import unknown_argument

        command = _Parser.commands.get(getattr(args, "command", None) or "", parser)
        command.exit(2, f"{command.prog}: error: {unknown_argument(extra, command)}\n")
    if any("://" in a for a in sys.argv):  # a run's config.yaml records sys.argv
        from geosearch.util.urls import mask_argv

        sys.argv[:] = mask_argv(sys.argv)
    if not hasattr(args, "_run"):
        parser.print_help()
        return 2
    try:
        return int(args._run(args) or 0)
    except GeosearchError as e:
        print(f"geosearch {args.command}: error: {_shown(e, args)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as e:
        from geosearch.search.runtime.interrupts import OutputClosed

        if isinstance(e, OutputClosed):  # `search | head`: as a Ctrl-C, said so
            print(f"geosearch {args.command}: stopped: its output was closed (the reader of the "
                  "pipe left); rerun the same command to resume", file=sys.stderr)
            return 141  # 128 + SIGPIPE, as a shell reports a process a closed pipe stopped
        print(f"geosearch {args.command}: {_interrupted(args.command)}", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `geosearch inspect | head`: the reader left; not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except OSError as e:
        if e.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        return _disk_full(args.command, e)


def _interrupted(command: str) -> str:
    """What a Ctrl-C ended, and what rerunning does: a search resumes, a run of ``train``
    starts again from step 0."""
    if command == "train":
        return "interrupted; train does not resume: rerunning the same command trains from step 0"
    return "interrupted; rerun the same command to resume"


def _shown(e: GeosearchError, args: argparse.Namespace) -> str:
    """An error's message with the secrets of the command's ``--storage`` masked wherever
    they show (the messages mask the URL already; a driver's text may quote more)."""
    storage = getattr(args, "storage", None)
    if not storage or "://" not in storage:
        return str(e)
    from geosearch.util.urls import redact

    return redact(str(e), storage)


def _disk_full(command: str, e: OSError) -> int:
    """A full disk: what is stored is whole (see docs/reliability.md), the rerun resumes."""
    where = f" ({e.filename})" if e.filename else ""
    print(f"geosearch {command}: error: {e.strerror}{where}; free some space, then rerun "
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
