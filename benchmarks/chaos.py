"""Fault injection outside CI: loop the faults of ``tests/faults`` N times, and table the bad inputs.

    python benchmarks/chaos.py --inputs [--write]        # every bad input: its one line
    python benchmarks/chaos.py --faults 5 [--seed 0] [--only SIGKILL] [--write]

``--faults N`` runs each fault scenario of ``tests/faults/_harness.py`` (and
``_study_files.py``: one byte changed in a stored value, outputs onto the study's files,
two kinds of start on one directory; ``_stops.py``: a search's output closed, ``train``'s
SIGTERM) N times, each with
its own seed for the moment the fault hits, on real processes (the tiny proxy; a minute or
so per run on a loaded 2-core machine), and prints the table fault × runs × invariant
violations. ``--inputs`` runs every case of ``tests/faults/_bad_inputs.py`` and prints what
the user sees. ``--write`` puts the table into ``docs/reliability.md`` (between its
``<!-- chaos:... -->`` markers), where ``tests/faults/test_bad_inputs.py`` checks the input
table against a fresh run. The full-disk faults mount a tmpfs (root); the PostgreSQL fault
starts a throwaway server as ``tests/search/runtime/test_postgres.py`` does (``initdb``); each is left out,
saying why, where it cannot run.
"""

from __future__ import annotations

import argparse
import random
import re
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests" / "faults"), str(REPO / "tests")]

import _bad_inputs  # noqa: E402
import _harness  # noqa: E402
import _stops  # noqa: E402
import _study_files  # noqa: E402

DOC = REPO / "docs" / "reliability.md"


def _scenarios(url: str | None) -> dict[str, Callable[[Path, random.Random], _harness.Result]]:
    out: dict[str, Callable[[Path, random.Random], _harness.Result]] = {
        "SIGKILL of the --workers parent": lambda t, r: _harness.signal_parent(t, r, (signal.SIGKILL,)),
        "SIGTERM of the --workers parent": lambda t, r: _harness.signal_parent(t, r, (signal.SIGTERM,)),
        "SIGKILL of a worker": lambda t, r: _harness.signal_worker(t, r, signal.SIGKILL),
        "SIGTERM of a worker": lambda t, r: _harness.signal_worker(t, r, signal.SIGTERM),
        "SIGKILL of a one-process search": lambda t, r: _harness.signal_single(t, r, signal.SIGKILL),
        "SIGTERM of a one-process search": lambda t, r: _harness.signal_single(t, r, signal.SIGTERM),
        "full file system, journal, --workers 2": lambda t, r: _harness.full_disk(t, r, 2),
        "full file system, SQLite, one process": lambda t, r: _harness.full_disk(t, r, 1),
        "a second command on a live study": _harness.second_command,
        "exceptions inside trials: out of memory (retried), ValueError (not)": _harness.trial_failures,
        "two commands started at once, SQLite": lambda t, r: _harness.simultaneous(t, r, runs=1),
        "two commands started at once, journal, --workers 2":
            lambda t, r: _harness.simultaneous(t, r, runs=1, workers=2),
        "two run directories on one journal file, started at once":
            lambda t, r: _harness.shared_storage(t, r, runs=1),
        "two run directories on one SQLite file, started at once":
            lambda t, r: _harness.shared_storage(t, r, runs=1, kind="sqlite"),
        "SIGKILL, study.db cut short, recover, rerun": lambda t, r: _harness.damaged_storage(t, r, "sqlite", "truncated"),
        "SIGKILL, garbage in study.db, recover, rerun": lambda t, r: _harness.damaged_storage(t, r, "sqlite", "garbage"),
        "SIGKILL of --workers 2, journal.log cut short, recover, rerun":
            lambda t, r: _harness.damaged_storage(t, r, "journal", "truncated"),
        "SIGKILL of --workers 2, garbage in journal.log, recover, rerun":
            lambda t, r: _harness.damaged_storage(t, r, "journal", "garbage"),
        "SIGKILL between a trial's two parameters, SQLite": lambda t, r: _harness.partial_point(t, "kill", 1),
        "Ctrl-C between a trial's two parameters, SQLite": lambda t, r: _harness.partial_point(t, "int", 1),
        "SIGKILL of a worker between a trial's two parameters, journal":
            lambda t, r: _harness.partial_point(t, "kill", 2),
        "Ctrl-C of a worker between a trial's two parameters, journal":
            lambda t, r: _harness.partial_point(t, "int", 2),
        "the --workers parent's SIGTERM between a trial's two parameters, journal":
            lambda t, r: _harness.partial_point(t, "parent-term", 2),
        "one byte changed in study.db or a trial's record, 6 flips a run":
            lambda t, r: _study_files.flipped_bytes(t, r, "sqlite", flips=6),
        "one byte changed in journal.log or a trial's record, 6 flips a run":
            lambda t, r: _study_files.flipped_bytes(t, r, "journal", flips=6),
        "export -o, report, train --out onto the study's files or a finished run": _study_files.overwrites,
        "a one-process and a --workers search started at once":
            lambda t, r: _study_files.mixed_start(t, r, runs=1),
        "stdout closed mid-search (search piped to head)": _stops.closed_output,
        "SIGTERM of train --log-with tensorboard": _stops.train_terminated,
    }
    if url is not None:
        out["PostgreSQL connections dropped mid-trial"] = lambda t, r: _harness.dropped_connection(t, r, url)
    return out


def _postgres() -> tuple[str | None, object | None, str]:
    """A throwaway server's URL, the server (to stop), or why there is none."""
    import _postgres  # tests/_postgres.py, the suite's throwaway server

    initdb, pg_ctl = _postgres._binary("initdb"), _postgres._binary("pg_ctl")
    if not (initdb and pg_ctl):
        return None, None, "no initdb/pg_ctl"
    try:
        server = _postgres._Server(initdb, pg_ctl)
    except BaseException as e:  # noqa: BLE001 - pytest.skip raises a BaseException
        return None, None, f"the server did not start: {e}"
    return server.url, server, ""


def run_faults(n: int, seed: int, only: str | None) -> str:
    """Each scenario ``n`` times; the markdown table."""
    url, server, why = _postgres()
    skipped = [] if url else [f"PostgreSQL connections dropped mid-trial: not run ({why})"]
    try:
        rows = []
        for name, scenario in _scenarios(url).items():
            if only and only.lower() not in name.lower():
                continue
            results, seconds = [], 0.0
            for i in range(n):
                tmp = Path(tempfile.mkdtemp(prefix="chaos-"))
                start = time.monotonic()
                try:
                    results.append(scenario(tmp, random.Random(seed + i)))
                except OSError as e:  # no tmpfs here
                    skipped.append(f"{name}: not run ({e})")
                    break
                finally:
                    seconds += time.monotonic() - start
                    _harness.clean(tmp)
                r = results[-1]
                print(f"{name} #{i}: {'ok' if not r.violations else r.violations} {r.notes}", file=sys.stderr)
            if results:
                rows.append((name, results, seconds / len(results)))
    finally:
        if server is not None:
            server.stop()
    lines = ["| fault | runs | fault hit mid-search | runs with violations | violations "
             "| what the first run did |", "|---|---|---|---|---|---|"]
    for name, results, _ in rows:
        bad = [r for r in results if r.violations]
        found = "; ".join(sorted({v for r in bad for v in r.violations})) or "none"
        note = re.sub(r"/tmp/\S+", "...", (results[0].notes or [""])[0]).replace("|", "\\|")
        lines.append(f"| {name} | {len(results)} | {sum(r.landed for r in results)} | {len(bad)} | "
                     f"{found} | {note} |")
    return "\n".join(lines + ([""] + [f"- {s}" for s in skipped] if skipped else []))


def run_inputs() -> str:
    """Every bad-input case; the markdown table."""
    root = Path(tempfile.mkdtemp(prefix="chaos-inputs-"))
    rows = [(case, _bad_inputs.run_case(case, root / str(i))) for i, case in enumerate(_bad_inputs.CASES)]
    broken = [(c.what, o.problems()) for c, o in rows if o.problems()]
    for what, problems in broken:
        print(f"CONTRACT BROKEN: {what}: {problems}", file=sys.stderr)
    return _bad_inputs.table(rows, root)


def write(section: str, text: str) -> None:
    """Replace the table between ``<!-- chaos:SECTION -->`` and ``<!-- /chaos:SECTION -->``."""
    doc = DOC.read_text(encoding="utf-8")
    begin, end = f"<!-- chaos:{section} -->", f"<!-- /chaos:{section} -->"
    head, rest = doc.split(begin, 1)
    _, tail = rest.split(end, 1)
    DOC.write_text(f"{head}{begin}\n{text}\n\n{end}{tail}", encoding="utf-8")


def merge(section: str, text: str) -> None:
    """Put the rows of ``text``'s table into the first table between the section's markers:
    a fault's row replaces the row of the same fault, a new fault's row goes last; the
    other rows and the prose around them stay (``--only`` reruns some scenarios)."""
    doc = DOC.read_text(encoding="utf-8")
    begin, end = f"<!-- chaos:{section} -->", f"<!-- /chaos:{section} -->"
    head, rest = doc.split(begin, 1)
    body, tail = rest.split(end, 1)
    lines = body.split("\n")
    table = [i for i, line in enumerate(lines) if line.startswith("|")]
    first = table[0]
    last = next((i for i in range(first, len(lines)) if not lines[i].startswith("|")), len(lines))
    rows = lines[first + 2:last]

    def fault(row: str) -> str:
        return row.split("|")[1].strip()

    for new in (r for r in text.splitlines()[2:] if r.startswith("|")):
        at = [i for i, row in enumerate(rows) if fault(row) == fault(new)]
        if at:
            rows[at[0]] = new
        else:
            rows.append(new)
    lines[first + 2:last] = rows
    DOC.write_text(f"{head}{begin}{chr(10).join(lines)}{end}{tail}", encoding="utf-8")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--inputs", action="store_true", help="table the bad inputs")
    p.add_argument("--faults", type=int, metavar="N", help="run each fault scenario N times")
    p.add_argument("--seed", type=int, default=0, help="seed of the first run (default 0)")
    p.add_argument("--only", metavar="TEXT", help="only the scenarios whose name contains TEXT")
    p.add_argument("--write", action="store_true",
                   help="write the table(s) into docs/reliability.md (with --only: put the rows "
                        "of those scenarios into its faults table, the others kept)")
    args = p.parse_args()
    if not args.inputs and not args.faults:
        p.error("give --inputs and/or --faults N")
    if args.inputs:
        text = run_inputs()
        print(text)
        if args.write:
            write("inputs", text)
    if args.faults:
        text = run_faults(args.faults, args.seed, args.only)
        print(text)
        if args.write and args.only:  # the rows of these scenarios, in the one table
            merge("faults", text)
        elif args.write:
            write("faults", f"Command: `python benchmarks/chaos.py --faults {args.faults} --seed {args.seed}`"
                            f"\n\n{text}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
