"""``geosearch recover``: rebuild a damaged study storage from the run directory's backup.

A truncated or scribbled ``study.db``, or a ``journal.log`` garbled or cut short, can no
longer be read (or silently lacks trials), while the run directory still holds the
study's backup (:mod:`geosearch.search.runtime.backup`: ``study.json`` and each told
trial's ``trials/<n>/trial.json``). :func:`recover_run` checks the storage; when it is
damaged it builds a fresh storage of the same kind next to it, holding the study (its
name, direction, metric names and user attrs) and every recorded trial under its own
number (state, value, params with their distributions, user attrs, intermediate values,
constraints, times), then moves the damaged file aside (``study.db.damaged-<time>``,
never deleted) and puts the new one in its place. A number with no record (a trial that
was never told, or told by a process that died before writing its record; or one the
user removed) becomes a FAIL trial that counts for nothing (``skipped``, or
``interrupted`` when its folder exists), so the numbers, and every ``retry_of``,
``seed_of`` and ``trial_dir`` naming them, stay right, and the next search trains its
point again. A healthy storage is left untouched. The command holds the study's command
lock, as a search does. Only the public Optuna API is used. See ``docs/reliability.md``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sqlite3
import tempfile
import time
import urllib.parse
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import optuna
from optuna.storages.journal import JournalFileBackend
from optuna.trial import FrozenTrial, TrialState, create_trial

from geosearch.util.errors import ConfigError
from geosearch.search.records import (
    FAIL_REASON,
    INTERRUPTED,
    SKIPPED,
    STATUS,
    TRIAL_DIR,
    trial_status,
)
from geosearch.search.runtime.backup import (
    STUDY_FILE,
    TRIAL_FILE,
    TRIALS_DIR,
    StudyRecord,
    folder_number,
    read_study_record,
    read_trial_records,
    recorded_trial,
    trial_record,
    write_record,
)
from geosearch.search.runtime.integrity import TrialsCheck, check_trials, other_study_problem
from geosearch.search.runtime.liveness import check_no_other_run
from geosearch.search.runtime.locks import CommandLock
from geosearch.search.runtime.storage import DB_FILE, JOURNAL_FILE, open_storage

__all__ = ["DAMAGED_SUFFIX", "Recovery", "recover_run", "storage_problem"]

DAMAGED_SUFFIX = ".damaged-"
"""A damaged storage file is kept as ``<name>.damaged-<YYYYmmddTHHMMSS>``."""
_SQLITE_SIDECARS = ("-journal", "-wal", "-shm")  # SQLite's files beside a database


@dataclass
class Recovery:
    """What :func:`recover_run` did.

    Attributes:
        run_dir: the run directory.
        storage: the storage file (``study.db`` or ``journal.log``).
        problem: what was wrong with it; ``None`` when it was healthy (nothing was done).
        kept: where the damaged file now is.
        counts: trials per outcome word in the rebuilt study.
        recovered: how many trials came from their records.
        placeholders: the numbers with no record, added as trials that count for nothing.
        skipped: one line per record that was left out (unreadable, another study's).
        rewritten: records that failed their checksum, rewritten from the storage's copy.
        from_storage: trials without a usable record, taken from the readable storage.
    """

    run_dir: Path
    storage: Path
    problem: str | None = None
    kept: Path | None = None
    counts: dict[str, int] = field(default_factory=dict)
    recovered: int = 0
    placeholders: list[int] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    rewritten: list[int] = field(default_factory=list)
    from_storage: list[int] = field(default_factory=list)

    def lines(self) -> list[str]:
        """What the command prints."""
        name = self.storage.name
        fixed = [f"the records of trials {_numbers(self.rewritten)} ({TRIALS_DIR}/<n>/"
                 f"{TRIAL_FILE}) did not read or failed their checksums: rewritten from {name}, "
                 "the intact copy"] if self.rewritten else []
        if self.problem is None:
            return fixed or [f"{self.storage} reads and holds every trial recorded in "
                             f"{self.run_dir / TRIALS_DIR}: nothing to recover, nothing was "
                             "changed"]
        out = [*fixed, f"{self.storage}: {self.problem}",
               f"rebuilt {name} from {self.run_dir / STUDY_FILE} and {self.recovered} trial records "
               f"({', '.join(f'{k} {v}' for k, v in self.counts.items()) or 'no trials'}); "
               f"the damaged file is kept as {self.kept}"]
        if self.from_storage:
            out.append(f"trials {_numbers(self.from_storage)} had no record: taken from the "
                       f"damaged {name}, which still read")
        if self.placeholders:
            out.append(f"trials {_numbers(self.placeholders)} had no record ({TRIALS_DIR}/<n>/{TRIAL_FILE}): "
                       "added as placeholders that count for nothing; their points train again")
        out += [f"left out: {line}" for line in self.skipped]
        out.append("rerun the same `geosearch search` command to resume: it trains only what is missing")
        return out


def _numbers(ns: list[int]) -> str:
    shown = ", ".join(map(str, ns[:20]))
    return shown + (f" and {len(ns) - 20} more" if len(ns) > 20 else "")


def _storage_file(run_dir: Path) -> Path:
    """The run directory's own storage file.

    Raises:
        ConfigError: not a run directory (no storage file), or both files.
    """
    if not run_dir.is_dir():
        raise ConfigError("no such run directory" if not run_dir.exists() else
                          "is a file, expected a run directory (runs/<study>)", source=str(run_dir))
    db, journal = run_dir / DB_FILE, run_dir / JOURNAL_FILE
    if db.is_file() and journal.is_file():
        raise ConfigError(f"holds both {DB_FILE} and {JOURNAL_FILE}; move the one that is not "
                          "current aside, then rerun", source=str(run_dir))
    if not (db.is_file() or journal.is_file()):
        raise ConfigError(f"not a run directory: no study storage here ({DB_FILE} or {JOURNAL_FILE})",
                          source=str(run_dir))
    return db if db.is_file() else journal


def _read_only(path: Path, scratch: Path) -> optuna.storages.BaseStorage:
    """The storage in ``path`` opened so that reading it writes nothing there: an SQLite
    file read-only (a damaged or empty file is not given a fresh schema), or, when SQLite
    files of an unfinished transaction lie beside it (a hot ``-journal``), a copy of them in
    ``scratch``, where SQLite rolls the transaction back as any reader of the file would."""
    if path.name != DB_FILE:
        return optuna.storages.JournalStorage(JournalFileBackend(str(path)))
    sides = [s for s in _SQLITE_SIDECARS if path.with_name(path.name + s).exists()]
    if sides:
        for name in [path.name, *(path.name + s for s in sides)]:
            shutil.copy2(path.with_name(name), scratch / name)
        path, query = scratch / path.name, ""
    else:
        query = "?mode=ro"
    uri = "file:" + urllib.parse.quote(str(path.resolve()))
    with contextlib.closing(sqlite3.connect(uri + query, uri=True)) as con:
        rows = con.execute("PRAGMA quick_check").fetchall()
    if [r[0] for r in rows] != ["ok"]:
        raise sqlite3.DatabaseError("integrity check: " + "; ".join(str(r[0]) for r in rows[:3]))
    return optuna.storages.RDBStorage(f"sqlite:///{uri}{query}{'&' if query else '?'}uri=true")


@dataclass
class _Look:
    """What reading the storage found: the problem, the study names it holds (``None``: it
    does not read), the comparison with the records, its finished trials."""

    problem: str | None
    names: list[str] | None = None
    check: TrialsCheck = field(default_factory=TrialsCheck)
    finished: dict[int, FrozenTrial] = field(default_factory=dict)


def _look(run_dir: Path, study: StudyRecord) -> _Look:
    """Read the run directory's storage, writing nothing there (see :func:`storage_problem`)."""
    path = _storage_file(run_dir)
    with tempfile.TemporaryDirectory(prefix="geosearch-recover-") as scratch:
        backend, names = None, None
        try:
            backend = _read_only(path, Path(scratch))
            names = [s.study_name for s in optuna.get_all_study_summaries(backend, include_best_trial=False)]
            if study.name not in names:
                only = f" (only {', '.join(map(repr, names))})" if names else ""
                return _Look(f"holds no study {study.name!r}{only}", names)
            loaded = optuna.load_study(study_name=study.name, storage=backend)
            dict(loaded.user_attrs)
            check = check_trials(run_dir, loaded)
            finished = {t.number: t for t in loaded.get_trials() if t.state.is_finished()}
        except Exception as e:  # noqa: BLE001 - a damaged file fails in many ways
            first = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
            return _Look(f"cannot be read ({type(e).__name__}: {first})", names)
        finally:
            if hasattr(backend, "remove_session"):
                backend.remove_session()
    look = _Look(None, names, check, finished)
    if check.changed:
        first = check.changed[0]
        look.problem = (f"holds trials {_numbers(check.changed)} other than their records in "
                        f"{TRIALS_DIR}/, whose checksums hold ({check.what[first]} of trial "
                        f"{first} differs): the stored copies were changed")
    elif check.lost:
        look.problem = (f"lacks trials {_numbers(check.lost)}, which {TRIALS_DIR}/ records as "
                        "finished (the file lost them: cut short, or an older copy)")
    return look


def storage_problem(run_dir: str | os.PathLike, study: StudyRecord) -> str | None:
    """What is wrong with the run directory's storage, or ``None`` when it reads, holds the
    study of ``study.json`` and every trial its records hold, each equal to its record
    (:func:`~geosearch.search.runtime.integrity.check_trials`). Nothing is written there."""
    return _look(Path(run_dir), study).problem


def _copy(trial: FrozenTrial) -> FrozenTrial:
    """A finished trial of the storage as a trial to add (its record's fields)."""
    return recorded_trial(trial_record(trial, "", ""))


def _placeholder(run_dir: Path, number: int, kept: str) -> FrozenTrial:
    """A FAIL trial for a number without a record: ``interrupted`` when its folder exists (it
    began training), else ``skipped``; neither counts, and neither is a point."""
    folder = run_dir / TRIALS_DIR / str(number)
    attrs = {STATUS: INTERRUPTED if folder.is_dir() else SKIPPED,
             FAIL_REASON: f"not recovered: the damaged storage ({kept}) held this trial, and "
                          f"{TRIALS_DIR}/{number}/{TRIAL_FILE} does not (never told, or told by a "
                          "process that died before writing it); its point trains again"}
    if folder.is_dir():
        attrs[TRIAL_DIR] = f"{TRIALS_DIR}/{number}"
    return create_trial(state=TrialState.FAIL, user_attrs=attrs)


STRAY_SLACK = 1000
"""How far past the count of records and trial folders a trial folder's number may lie: the
trials of a study are numbered 0, 1, ... and each one told has a record, each one that
trained a folder, so only trials asked and never started (one per process that died then)
lack both."""


def _trial_folders(run_dir: Path, recorded: dict[int, FrozenTrial]) -> tuple[list[int], list[str]]:
    """The numbers of the trial folders of ``trials/`` without a record, and one note per
    stray entry left out: a name that is no trial number (``trials/²``), a file, an empty
    folder numbered past every record, a number past the study's trials by more than
    :data:`STRAY_SLACK` (an empty
    ``trials/3000000`` would otherwise add three million placeholders)."""
    folder = run_dir / TRIALS_DIR
    numbers: list[int] = []
    notes: list[str] = []
    entries = sorted(folder.iterdir()) if folder.is_dir() else []
    last = max(recorded, default=-1)
    for entry in entries:
        n = folder_number(entry.name)
        if n is not None and n in recorded:
            continue
        why = ("its name is not a trial number" if n is None else
               "not a folder" if not entry.is_dir() or entry.is_symlink() else
               "an empty folder past the last record" if n > last and not any(entry.iterdir())
               else None)
        if why is None:
            numbers.append(n)  # type: ignore[arg-type]
        else:
            notes.append(f"{entry}: {why}, ignored")
    bound = len(recorded) + len(numbers) + STRAY_SLACK
    notes += [f"{folder / str(n)}: numbered past the study's {bound - STRAY_SLACK} trials by "
              f"more than {STRAY_SLACK}, ignored" for n in numbers if n >= bound]
    return [n for n in numbers if n < bound], notes


def _aside(path: Path, stamp: str) -> Path:
    """A free name for the damaged ``path``: ``<name>.damaged-<stamp>`` (``-2``, ... if taken)."""
    k, candidate = 1, path.with_name(f"{path.name}{DAMAGED_SUFFIX}{stamp}")
    while candidate.exists() or any(candidate.with_name(candidate.name + s).exists() for s in _SQLITE_SIDECARS):
        k += 1
        candidate = path.with_name(f"{path.name}{DAMAGED_SUFFIX}{stamp}-{k}")
    return candidate


def _build(run_dir: Path, target: Path, study: StudyRecord,
           trials: list[FrozenTrial]) -> list[FrozenTrial]:
    """Write a new storage of ``target``'s kind into ``target`` (a file that does not exist
    yet) holding ``study`` and ``trials`` (numbered 0, 1, ... in order); returns the trials
    as stored."""
    storage = f"sqlite:///{target.resolve()}" if target.name.startswith(DB_FILE) else str(target)
    backend, _ = open_storage(run_dir, storage)
    created = optuna.create_study(study_name=study.name, storage=backend,
                                  directions=[d.lower() for d in study.directions])
    for key, value in study.user_attrs.items():
        created.set_user_attr(key, value)
    if study.metric_names is not None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            created.set_metric_names(list(study.metric_names))
    created.add_trials(trials)
    stored = created.get_trials(deepcopy=False)
    if [t.number for t in stored] != list(range(len(trials))):
        raise RuntimeError(f"the rebuilt study numbered its trials {[t.number for t in stored][:10]}..., "
                           f"expected 0..{len(trials) - 1}")
    if hasattr(backend, "remove_session"):  # RDBStorage: close its connections
        backend.remove_session()
    return stored


def recover_run(run_dir: str | os.PathLike, *, echo: Callable[[str], None] | None = None) -> Recovery:
    """Rebuild the run directory's storage from its backup when it is damaged.

    Args:
        run_dir: ``<runs-dir>/<study>`` holding ``study.db`` or ``journal.log``.
        echo: prints a line while waiting for workers of a dead run to stop.

    Returns:
        A :class:`Recovery`; its ``problem`` is ``None`` when the storage was healthy and
        nothing was changed.

    Raises:
        ConfigError: not a run directory, no ``study.json``, both storage files.
        GeosearchError: a process of this machine runs the study.
    """
    run_dir = Path(run_dir)
    path = _storage_file(run_dir)
    study = read_study_record(run_dir)
    if study is None:
        raise ConfigError(f"no {STUDY_FILE} here: the study has no backup to rebuild it from (a "
                          "study run by geosearch before backups were kept)", source=str(run_dir))
    check_no_other_run(run_dir, study.name, echo)
    with CommandLock(run_dir, study.name):
        look = _look(run_dir, study)
        other = other_study_problem(run_dir, study, look.names)
        if other is not None:
            raise ConfigError(f"{other}: the backup of another study, from which a rebuild would "
                              f"drop every trial; put back this study's own {STUDY_FILE} (nothing "
                              "was changed)", source=str(run_dir / STUDY_FILE))
        outcome = Recovery(run_dir, path, problem=look.problem)
        for n in look.check.damaged:  # the storage's copy is the intact one
            write_record(run_dir, look.check.stored[n], study)
            outcome.rewritten.append(n)
        if outcome.problem is None:
            return outcome
        recorded, outcome.skipped = read_trial_records(run_dir, study)
        for n in look.check.changed:  # equal to its record: the stored copy was changed
            look.finished.pop(n, None)
        outcome.from_storage = sorted(set(look.finished) - set(recorded))
        recorded.update({n: _copy(look.finished[n]) for n in outcome.from_storage})
        stamp = time.strftime("%Y%m%dT%H%M%S")
        aside = _aside(path, stamp)
        folders, stray = _trial_folders(run_dir, recorded)
        outcome.skipped += stray
        top = max(max(recorded, default=-1), max(folders, default=-1))
        trials = [recorded[n] if n in recorded else _placeholder(run_dir, n, aside.name)
                  for n in range(top + 1)]
        outcome.placeholders = [n for n in range(top + 1) if n not in recorded]
        outcome.recovered = len(recorded) - len(outcome.from_storage)

        temp = path.with_name(path.name + ".recovering")
        temp.unlink(missing_ok=True)  # left by a recover that was stopped: ours
        try:
            stored = _build(run_dir, temp, study, trials)
        except BaseException:
            temp.unlink(missing_ok=True)
            raise
        for t in stored:
            word = trial_status(t)
            outcome.counts[word] = outcome.counts.get(word, 0) + 1

        # Keep the damaged file under its new name, then put the rebuilt one in its place in
        # one rename: the run directory always holds a study.db (or journal.log).
        try:
            os.link(path, aside)
        except OSError:  # a file system without hard links
            shutil.copy2(path, aside)
        for suffix in _SQLITE_SIDECARS:  # a hot journal must not meet the new database
            side = path.with_name(path.name + suffix)
            if side.exists():
                os.replace(side, aside.with_name(aside.name + suffix))
        os.replace(temp, path)
        outcome.kept = aside
        return outcome
