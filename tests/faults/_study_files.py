"""Faults against the study's own files: one byte changed in a stored value, commands whose
output names a study's file, and a one-process search started together with a ``--workers``
search on one run directory. Each returns a :class:`_harness.Result`, as the scenarios of
``_harness`` do; ``test_study_files.py`` runs them once, ``benchmarks/chaos.py`` loops them.

Invariants, beside those of :func:`_harness.violations`:

* a changed byte is never read as valid: ``export`` refuses the study in one line naming
  the trial and ``geosearch recover`` (0 undetected); ``recover`` repairs the changed copy
  from the intact one, saying which, and the study and its records are then as they were;
* an output inside a study's files or a finished run is refused in one line, exit 2, and
  no file of the run directory changes (0 overwritten);
* of two starts on one new run directory, one trains, the other is refused in one line
  naming the first's pid and created no file (never ``study.db`` beside ``journal.log``).
"""

from __future__ import annotations

import hashlib
import random
import shutil
import sys
from pathlib import Path

from _harness import (
    REFUSED,
    Result,
    _search_args,
    run,
    start_two,
    study_trials,
    violations,
    write_space,
)

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: _flips
from _flips import flip  # noqa: E402

KINDS = {"sqlite": ("study.db", ["--workers", "1"]), "journal": ("journal.log", ["--workers", "2"])}


def _files(run_dir: Path) -> dict[str, str]:
    """Every file of the run directory but its locks, by its SHA-256."""
    return {
        str(p.relative_to(run_dir)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(run_dir.rglob("*"))
        if p.is_file() and ".locks" not in p.parts
    }


def _searched(tmp: Path, kind: str) -> tuple[Path, list[str]]:
    """A finished 4-point search of ``kind`` in ``tmp``: its run directory and its command."""
    args = _search_args(write_space(tmp, kind), *KINDS[kind][1])
    code, out = run(args, tmp, tmp / f"{kind}.log")
    assert code == 0, out[-2000:]
    return tmp / "runs" / kind, args


def flipped_bytes(tmp: Path, rng: random.Random, kind: str, flips: int) -> Result:
    """One search on ``kind``, then ``flips`` times: a copy of its run directory gets one byte
    changed inside a number a completed trial stores (an attr's digit, the value), in the
    storage or in the trial's record (alternately); export and recover checked each time,
    the rerun after the first two."""
    run_dir, args = _searched(tmp, kind)
    name = KINDS[kind][0]
    before = {t.number: t.value for t in study_trials(run_dir)}
    found, undetected, repaired, where_said = [], 0, 0, set()
    for i in range(flips):
        copy = tmp / f"copy{i}"
        shutil.copytree(
            run_dir.parent.parent, copy, ignore=shutil.ignore_patterns(".locks", "copy*")
        )
        run_copy = copy / "runs" / kind
        files = _files(run_copy)
        where = name if i % 2 == 0 else "trial.json"
        changed = flip(run_copy, where, rng)
        code, out = run(
            ["export", str(run_copy), "-o", str(copy / "best.yaml")], copy, copy / "export.log"
        )
        lines = out.strip().splitlines()
        if code == 0:
            undetected += 1
            found.append(
                f"flip {i}: {changed.what} of trial {changed.trial} in {where} read as valid"
            )
            continue
        if (
            code != 2
            or len(lines) != 1
            or f"trial {changed.trial}" not in lines[0]
            or f"geosearch recover {run_copy}" not in lines[0]
        ):
            found.append(f"flip {i}: export exited {code}: {lines[-1:]}")
        code, out = run(["recover", str(run_copy)], copy, copy / "recover.log")
        said = out.strip().splitlines()
        intact = (
            f"rewritten from {name}, the intact copy"
            if where == "trial.json"
            else f"rebuilt {name} from"
        )
        if code != 0 or not any(intact in line for line in said):
            found.append(
                f"flip {i}: recover exited {code} without saying the intact copy: {said[:2]}"
            )
            continue
        where_said.add(intact.split(",")[0])
        now = _files(run_copy)
        records = {k: v for k, v in now.items() if k.endswith("trial.json")}
        if records != {k: v for k, v in files.items() if k.endswith("trial.json")}:
            found.append(f"flip {i}: the records differ from those before the flip")
        if {t.number: t.value for t in study_trials(run_copy)} != before:
            found.append(f"flip {i}: the recovered study's values differ")
        else:
            repaired += 1
        if i < 2:  # the rerun after the first flip of each place: it trains nothing
            code, out = run(
                [a.replace(str(tmp), str(copy)) for a in args], copy, copy / "rerun.log"
            )
            if code != 0 or "\ntrial " in out:
                found.append(f"flip {i}: the rerun exited {code} or trained again")
        found += [f"flip {i}: {v}" for v in violations(run_copy, before)]
        shutil.rmtree(copy, ignore_errors=True)
    return Result(
        f"one byte changed in {name} or a record",
        found,
        True,
        [
            f"{flips} flips: {flips - undetected} refused, {repaired} repaired, "
            f"{undetected} undetected"
        ],
    )


def overwrites(tmp: Path, rng: random.Random) -> Result:
    """After a search: ``export -o`` onto each of the study's files (and a trial's folder with
    ``--top 2``), ``report`` into a trial's folder, ``train --out`` onto a trial's folder
    and onto a finished train run's; each must be refused in one line, nothing changed."""
    run_dir, _ = _searched(tmp, "sqlite")
    (tmp / "done").mkdir()
    (tmp / "done" / "result.json").write_text("{}", encoding="utf-8")
    n = rng.randrange(4)
    train = ["train", "--assign", "attn=adamw,mlp=adamw", "--model", "tiny", "--steps", "2"]
    commands = [
        ["export", str(run_dir), "-o", str(run_dir / f)]
        for f in (
            "study.db",
            "study.json",
            "space.yaml",
            f"trials/{n}/trial.json",
            f"trials/{n}/result.json",
        )
    ]
    commands += [
        ["export", str(run_dir), "--top", "2", "-o", str(run_dir / "trials" / str(n))],
        ["report", str(run_dir / "trials" / str(n)), "--storage", str(run_dir / "study.db")],
        [*train, "--out", str(run_dir / "trials" / str(n))],
        [*train, "--out", str(tmp / "done")],
        ["export", str(run_dir), "-o", str(tmp / "done" / "result.json")],
    ]
    before = {**_files(run_dir), **{f"done/{k}": v for k, v in _files(tmp / "done").items()}}
    found, refused = [], 0
    for i, command in enumerate(commands):
        code, out = run(command, tmp, tmp / f"out{i}.log")
        lines = out.strip().splitlines()
        if code == 2 and len(lines) == 1 and "would write over the" in lines[0]:
            refused += 1
        else:
            found.append(f"`{' '.join(command[:1] + command[2:])}` exited {code}: {lines[-1:]}")
    after = {**_files(run_dir), **{f"done/{k}": v for k, v in _files(tmp / "done").items()}}
    overwritten = sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))
    if overwritten:
        found.append(f"files changed: {overwritten[:5]}")
    found += violations(run_dir, {t.number: t.value for t in study_trials(run_dir)})
    return Result(
        "outputs onto the study's files",
        found,
        True,
        [f"{refused} of {len(commands)} refused, {len(overwritten)} files changed"],
    )


def mixed_start(tmp: Path, rng: random.Random, runs: int) -> Result:
    """A one-process search and a ``--workers 2`` search of one new study started 0-50 ms
    apart (a seeded order), ``runs`` times: one trains every point, the other is refused in
    one line naming its pid, having created no file."""
    found, refused = [], 0
    for i in range(runs):
        name = f"mix{i}"
        space = write_space(tmp, name)
        pair = [_search_args(space, "--workers", "1"), _search_args(space, "--workers", "2")]
        rng.shuffle(pair)
        cmds, codes = start_two(pair[0], pair[1], tmp, name, rng)
        run_dir = tmp / "runs" / name
        if (run_dir / "study.db").exists() and (run_dir / "journal.log").exists():
            found.append(f"run {i}: study.db and journal.log side by side")
        for cmd, other, code in zip(cmds, cmds[::-1], codes):
            lines = cmd.output().strip().splitlines()
            if (
                code == 2
                and len(lines) == 1
                and REFUSED in lines[0]
                and f"(pid {other.pid})" in lines[0]
            ):
                refused += 1
            elif code != 0:
                found.append(f"run {i}: a command exited {code}: {lines[-1:]}")
        if sorted(codes) != [0, 2]:
            found.append(f"run {i}: exit codes {codes}, not one 0 and one 2")
        found += [f"run {i}: {v}" for v in violations(run_dir, {}, None, [])]
    return Result(
        "a one-process and a --workers search started at once",
        found,
        True,
        [f"one command refused in {refused} of {runs} runs"],
    )
