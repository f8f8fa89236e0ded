"""The run directory's storage: its file names, and opening the Optuna storage and study in it.

A study lives in ``<runs-dir>/<study>/``: an SQLite file (``study.db``, one worker) or an
Optuna journal file (``journal.log``, several workers), or any storage URL given with
``--storage`` (PostgreSQL for workers on several machines). This module names those files,
picks the storage a run directory uses, opens it (with the retries that processes racing
to create one need) and loads its study for export, report and inspection; it checks
study names (a safe alphabet and length, since each names a directory); a storage URL's
secrets are kept out of what it says by :mod:`geosearch.util.urls`. Torch-free. The layout of a run directory is in
``docs/design.md`` ("The study").
"""

from __future__ import annotations

import importlib.util
import inspect
import os
import random
import re
import time
from pathlib import Path
from typing import Any

import optuna

from geosearch.util.errors import ConfigError
from geosearch.util.files import check_dir
from geosearch.search.runtime.backup import ARTIFACTS_DIR, STUDY_FILE, TRIALS_DIR
from geosearch.search.runtime.integrity import backup_error, check_trials
from geosearch.search.runtime.journal import check_journal_file, open_journal
from geosearch.search.runtime.rdb import check_rdb, read_only_engine_kwargs, sqlite_file
from geosearch.util.urls import (
    mask_url,
    raw_at_in_password,
    redact,
    storage_url,
)

__all__ = [
    "BEST_FILE",
    "MAX_STUDY_NAME",
    "DB_FILE",
    "JOURNAL_FILE",
    "LOCKS_DIR",
    "SPACE_FILE",
    "TOP_DIR",
    "TRACEBACK_FILE",
    "WORKERS_DIR",
    "check_dir",
    "check_outside_study",
    "has_storage",
    "make_dir",
    "open_run_study",
    "open_storage",
    "own_file",
    "recover_hint",
    "resolve_storage",
    "storage_error",
    "study_name_problem",
]

DB_FILE = "study.db"
"""The SQLite storage of a study run by one worker."""
JOURNAL_FILE = "journal.log"
"""The journal-file storage of a study run by ``--workers N``."""
BEST_FILE = "best_assignment.yaml"
"""The exported winner (``load_assignment`` / ``build_optimizer`` read it)."""
SPACE_FILE = "space.yaml"
"""The resolved search space the study runs."""
TRACEBACK_FILE = "traceback.txt"
"""In a failed trial's folder: the traceback of its exception."""
LOCKS_DIR = ".locks"
"""One lock file per live worker process (see :mod:`geosearch.search.runtime.liveness`)."""
WORKERS_DIR = "workers"
"""``workers/worker<i>.log``: the output of each ``--workers N`` process."""
TOP_DIR = "top"
"""Where ``geosearch export --top K`` writes by default."""
MAX_STUDY_NAME = 100
"""The longest study name (it names the run directory)."""
_STUDY_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+-]*")
_SHOWN = 40  # characters of a refused name shown in its message


def study_name_problem(name: object) -> str | None:
    """What is wrong with a study name, or ``None``: letters, digits, ``_ . + -``, not
    starting with ``.``, ``+`` or ``-``, at most :data:`MAX_STUDY_NAME` characters."""
    if not isinstance(name, str) or not name:
        return f"expected a study name, got {name!r}"[:2 * _SHOWN]
    shown = repr(name if len(name) <= _SHOWN else name[:_SHOWN] + "...")
    if len(name) > MAX_STUDY_NAME:
        return f"a study name has at most {MAX_STUDY_NAME} characters, got {len(name)} ({shown})"
    if not _STUDY_NAME.fullmatch(name):
        return (f"expected a study name of letters, digits and _ . + - (not first: . + -), "
                f"got {shown}")
    return None


def recover_hint(run_dir: str | os.PathLike) -> str:
    """The end of the one line refusing a run directory's storage that does not read: the
    command that rebuilds it (:mod:`geosearch.search.runtime.rebuild`); nothing when the run
    directory holds no backup to rebuild from."""
    if not (Path(run_dir) / STUDY_FILE).is_file():
        return ""
    return f"; `geosearch recover {os.fspath(run_dir)}` rebuilds a damaged study from its backup"


def _clause(problem: str, limit: int = 120) -> str:
    """The first clause of a message (up to its first ``"; "``), cut to ``limit``: what went
    wrong, without the advice the recover hint replaces (a message names the run directory
    twice then, and stays within one line of 400 characters)."""
    return problem.split("; ", 1)[0][:limit]


def _first_line(e: BaseException, limit: int) -> str:
    """The first line of an error's message, or of its root cause's (Optuna's
    ``StorageInternalError`` wraps the driver's error in a message of its own)."""
    while e.__cause__ is not None and isinstance(e, optuna.exceptions.StorageInternalError):
        e = e.__cause__
    return (str(e).strip().splitlines() or [type(e).__name__])[0][:limit]


def storage_error(e: BaseException, desc: str, run_dir: str | os.PathLike | None) -> ConfigError:
    """The one line for a storage that fails while its study is read. ``run_dir``: the
    storage is that run directory's own file (``geosearch recover`` can rebuild it),
    ``None``: a ``--storage``."""
    if run_dir is None:
        return ConfigError(f"cannot read the study in {desc}: {_first_line(e, 200)}", source="--storage")
    return ConfigError(f"cannot read the study in {own_file(run_dir)}: {_first_line(e, 160)}"
                       f"{recover_hint(run_dir)}", source=os.fspath(run_dir))


def own_file(run_dir: str | os.PathLike) -> str:
    """The name of the run directory's own storage file, for messages that name the run
    directory already: ``journal.log`` when it exists, else ``study.db``."""
    return JOURNAL_FILE if (Path(run_dir) / JOURNAL_FILE).is_file() else DB_FILE


_RESULT_FILE = "result.json"  # what a finished proxy run leaves in its folder (proxy.rundir)


def _study_part(name: str) -> str | None:
    """What the entry ``name`` of a run directory is to its study, when a command writing
    there would destroy it; ``None`` for the commands' own outputs (``best_assignment.yaml``,
    ``top/``, ``report.md``, ``plots/``)."""
    if name.startswith((DB_FILE, JOURNAL_FILE)):  # with SQLite's -journal, -wal, a .damaged- copy
        return "its storage"
    parts = {STUDY_FILE: "its backup", SPACE_FILE: "its search space",
             TRIALS_DIR: "its trials' files", WORKERS_DIR: "its workers' logs",
             LOCKS_DIR: "its locks", ARTIFACTS_DIR: "its artifacts"}
    return parts.get(name)


def check_outside_study(path: str | os.PathLike, *, source: str | None,
                        folder: bool = False) -> None:
    """Refuse, writing nothing, an output path that would write over a study or a finished
    run: inside a run directory's storage, backup, space or folders (``trials/<n>/``...), or
    inside the folder of a finished proxy run (one that holds ``result.json``) below the
    nearest run directory above ``path`` (``folder``: ``path`` itself counts), symbolic links
    followed.

    Raises:
        ConfigError: one line naming ``source`` (the flag, or ``None``), the path and what
            it would write over.
    """
    real = Path(os.path.realpath(path))
    shown, finished = os.fspath(path), None
    for parent in ([real] if folder else []) + list(real.parents):
        if not parent.is_dir():
            continue
        if has_storage(parent) or (parent / STUDY_FILE).is_file():  # the nearest run directory
            rel = real.relative_to(parent).parts
            part = _study_part(rel[0]) if rel else None
            if part is not None:
                raise ConfigError(f"{shown!r} would write over the study in {os.fspath(parent)} "
                                  f"({rel[0]}: {part}); write it elsewhere", source=source)
            break
        if finished is None and (parent / _RESULT_FILE).is_file():
            finished = parent
    if finished is not None:
        raise ConfigError(f"{shown!r} would write over the finished run in {os.fspath(finished)} "
                          f"(it holds {_RESULT_FILE}); write it elsewhere", source=source)


def has_storage(run_dir: str | os.PathLike) -> bool:
    """Whether the run directory holds a storage file of its own (``study.db``, ``journal.log``)."""
    return any((Path(run_dir) / name).exists() for name in (DB_FILE, JOURNAL_FILE))


def resolve_storage(
    run_dir: str | os.PathLike, storage: str | None = None, *, workers: int = 1, create: bool = True
) -> str:
    """The storage URL or journal file path a run directory uses (nothing is opened).

    Args:
        run_dir: ``<runs-dir>/<study>``.
        storage: an explicit URL or journal path: returned as is.
        workers: processes that will share a new storage (several: a journal file).
        create: whether a storage that does not exist yet may be named.

    Raises:
        ConfigError: both storage files exist (which one is current cannot be told); none
            exists and ``create`` is false.
    """
    if storage is not None:
        return storage
    run_dir = Path(run_dir)
    db, journal = run_dir / DB_FILE, run_dir / JOURNAL_FILE
    if db.is_file() and journal.is_file():
        raise ConfigError(f"holds both {DB_FILE} and {JOURNAL_FILE}; pass --storage with the "
                          "one to use", source=str(run_dir))
    if journal.is_file() or (not db.is_file() and workers > 1):
        return str(journal)
    if db.is_file() or create:
        return f"sqlite:///{db.resolve()}"
    raise ConfigError(f"no study storage here ({DB_FILE} or {JOURNAL_FILE})", source=str(run_dir))


def open_storage(
    run_dir: str | os.PathLike,
    storage: str | None = None,
    *,
    workers: int = 1,
    create: bool = True,
    read_only: bool = False,
) -> tuple[optuna.storages.BaseStorage, str]:
    """The Optuna storage of a run directory.

    Args:
        run_dir: ``<runs-dir>/<study>``.
        storage: an Optuna RDB URL (``sqlite:///...``, ``postgresql://...``; its masked
            form opens the full URL of :data:`~geosearch.util.urls.STORAGE_ENV`, see :func:`~geosearch.util.urls.storage_url`) or the
            path of a journal file; ``None`` = the run directory's ``journal.log`` or ``study.db``,
            whichever exists, else a new one (journal for several workers, SQLite for one).
        workers: processes that will share it (picks the kind of a new storage).
        create: whether a missing run-directory storage may be created.
        read_only: open it for reading only (export, report): it must exist and be an
            Optuna storage already, an SQLite file is opened read-only and a journal file
            for reading (nothing is created or written); implies ``create=False``.

    Returns:
        The storage and a description for messages (the URL masked by :func:`~geosearch.util.urls.mask_url`,
        or ``"journal file PATH"``).

    Raises:
        ConfigError: the storage cannot be opened, or an ``@`` follows its password's (a
            raw ``@`` in the password); it is not an Optuna storage (an empty SQLite file or
            one without Optuna's tables, read-only; another application's SQLite database,
            always: :func:`geosearch.search.runtime.rdb.check_rdb`); a damaged journal
            (naming the line); both storage files exist; none exists and ``create`` is
            false. A message names ``--storage`` only when ``storage`` was given, else the
            run directory's file.
    """
    flag = "--storage" if storage is not None else None
    shown = None if storage is not None else os.fspath(Path(run_dir) / DB_FILE)  # as the user named it
    create = create and not read_only
    if storage is None and create:
        make_dir(run_dir)
    own = storage is None  # the run directory's own file: `geosearch recover` can rebuild it
    storage = resolve_storage(run_dir, storage, workers=workers, create=create)
    if "://" not in storage:
        return _open_journal_file(Path(storage), run_dir if own else None, create, read_only)
    full, masked = storage_url(storage), mask_url(storage)  # a worker is given `masked`
    if raw_at_in_password(full):  # SQLAlchemy would take the password's end for the host's
        raise ConfigError(f"cannot open the storage {masked!r}: more than one '@' follows its user "
                          "name; write an '@' of the password (or of the host, database or query) "
                          "URL-encoded, as %40", source="--storage")
    return _open_rdb(full, masked, flag=flag, read_only=read_only, shown=shown,
                     own=run_dir if own else None), masked


def _rdb_kwargs(storage: str, read_only: bool) -> dict[str, Any]:
    """``RDBStorage``'s keyword arguments for the URL ``storage``."""
    if storage.startswith("sqlite"):
        path = sqlite_file(storage)
        if read_only and path is not None:
            kwargs: dict[str, Any] = {"engine_kwargs": read_only_engine_kwargs(path)}
            if "skip_table_creation" in inspect.signature(optuna.storages.RDBStorage).parameters:
                kwargs["skip_table_creation"] = True  # where Optuna has it; the tables were checked
            return kwargs
        # several processes on one SQLite file wait for each other's writes
        return {"engine_kwargs": {"connect_args": {"timeout": 60}}}
    if storage.startswith(("postgresql", "mysql")):
        # a trial can outlast a server's or a firewall's idle timeout: test connections
        # before use instead of failing on a dropped one
        return {"engine_kwargs": {"pool_pre_ping": True}}
    return {}


def _open_rdb(full: str, masked: str, *, flag: str | None, read_only: bool,
              shown: str | None = None, own: str | os.PathLike | None = None) -> optuna.storages.RDBStorage:
    """The RDB storage at the URL ``full`` (``masked`` in messages), once :func:`check_rdb`
    has looked at it (``own``: the run directory it is the storage of, whose backup
    ``geosearch recover`` rebuilds it from)."""
    kwargs = _rdb_kwargs(full, read_only)
    url = _with_installed_driver(full)
    for attempt in range(3):
        try:
            check_rdb(url, read_only=read_only, source=flag, engine_kwargs=kwargs.get("engine_kwargs", {}),
                      shown=shown)
            return optuna.storages.RDBStorage(url, **kwargs)
        except ConfigError as e:
            if own is not None and recover_hint(own):  # not an Optuna storage now; a backup exists
                raise ConfigError(f"{DB_FILE}: {_clause(e.problem)}{recover_hint(own)}",
                                  source=os.fspath(own)) from None
            raise
        except ImportError:
            raise ConfigError(f"cannot open the storage {masked!r}: its database driver "
                              "is not installed (PostgreSQL: pip install 'geosearch[postgres]')",
                              source=flag) from None
        except Exception as e:  # noqa: BLE001 - SQLAlchemy/driver errors of many kinds
            # Two processes creating the schema of a new database at once: one of them
            # fails on the version table (IntegrityError) or a lock (OperationalError).
            # (PostgreSQL: ProgrammingError "relation already exists")
            if attempt < 2 and type(e).__name__ in ("IntegrityError", "OperationalError",
                                                    "ProgrammingError"):
                time.sleep(0.5 + random.random())
                continue
            first = redact((str(e).strip().splitlines() or [type(e).__name__])[0], full)[:200]
            if own is not None:
                raise ConfigError(f"cannot open {DB_FILE}: {first[:160]}{recover_hint(own)}",
                                  source=os.fspath(own)) from None
            raise ConfigError(f"cannot open the storage {masked!r}: {first}", source=flag) from None
    raise AssertionError("unreachable")  # pragma: no cover


def _open_journal_file(path: Path, own: str | os.PathLike | None, create: bool,
                       read_only: bool) -> tuple[optuna.storages.BaseStorage, str]:
    """:func:`open_storage` of a journal file (``own``: the run directory it is the storage
    of, whose backup ``geosearch recover`` rebuilds it from)."""
    if not path.is_file() and not create:
        raise ConfigError("journal file not found", source=str(path))
    try:
        check_journal_file(path)
        if not read_only:
            make_dir(path.parent)
        return open_journal(path, read_only=read_only), f"journal file {path}"  # replays the file
    except ConfigError as e:
        if own is None or not recover_hint(own):
            raise
        raise ConfigError(f"cannot read {JOURNAL_FILE}: {_clause(e.problem)}{recover_hint(own)}",
                          source=os.fspath(own)) from None
    except Exception as e:  # noqa: BLE001 - OSError, or a corrupt file
        if own is not None:
            raise ConfigError(f"cannot read {JOURNAL_FILE}: {_first_line(e, 160)}{recover_hint(own)}",
                              source=os.fspath(own)) from None
        raise ConfigError(f"cannot read the journal file: {_first_line(e, 200)}", source=str(path)) from None


def make_dir(path: str | os.PathLike) -> None:
    """``mkdir -p path``, or a one-line error when it is a file or cannot be written.

    Raises:
        ConfigError: naming the path and the reason.
    """
    try:
        Path(path).mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise ConfigError("is a file, expected a directory", source=os.fspath(path)) from None
    except OSError as e:
        raise ConfigError(f"cannot create the directory ({e.strerror or e})",
                          source=os.fspath(path)) from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise ConfigError("the directory is not writable", source=os.fspath(path))


def _with_installed_driver(url: str) -> str:
    """``postgresql://`` with the driver that is installed: SQLAlchemy 2.1 takes it as
    psycopg 3, 2.0 as psycopg2 (``geosearch[postgres]`` installs psycopg2-binary)."""
    if not url.startswith("postgresql://"):
        return url
    for module, scheme in (("psycopg", "postgresql+psycopg"), ("psycopg2", "postgresql+psycopg2")):
        if importlib.util.find_spec(module) is not None:
            return scheme + url[len("postgresql"):]
    return url


def open_run_study(
    run_dir: str | os.PathLike,
    *,
    study_name: str | None = None,
    storage: str | None = None,
    read_only: bool = False,
) -> optuna.Study:
    """Load the study of an existing run directory (for export, report, inspection).

    Its trials are read once here: a storage that fails then, that lacks trials the run
    directory's backup records, or whose trials and records disagree (a byte changed in
    either: :func:`~geosearch.search.runtime.integrity.check_trials`), is refused with one
    line naming the trial and ``geosearch recover``.

    Args:
        read_only: open the storage for reading only (:func:`open_storage`): export and
            report, which must leave what they read as it was.

    Raises:
        ConfigError: no storage, not an Optuna storage, no study, or several studies and no
            ``study_name``; a storage that does not read or lost trials.
    """
    run_dir = Path(run_dir)
    if storage is None and not run_dir.is_dir():
        raise ConfigError("no such run directory", source=str(run_dir))
    backend, desc = open_storage(run_dir, storage, create=False, read_only=read_only)
    own = run_dir if storage is None else None
    try:
        names = [s.study_name for s in optuna.get_all_study_summaries(backend, include_best_trial=False)]
    except Exception as e:  # noqa: BLE001 - a damaged file fails in many ways
        raise storage_error(e, desc, own) from None
    if not names:
        hint = recover_hint(run_dir) if own is not None and (run_dir / STUDY_FILE).is_file() else ""
        raise ConfigError(f"{own_file(run_dir) if hint else desc} holds no study{hint}", source=str(run_dir))
    if study_name is None:
        if len(names) > 1:
            raise ConfigError(f"{desc} holds {len(names)} studies; pick one with --study",
                              source=str(run_dir), allowed=sorted(names))
        study_name = names[0]
    elif study_name not in names:
        raise ConfigError(f"no study {study_name!r} in {desc}", source=str(run_dir),
                          allowed=sorted(names))
    try:
        study = optuna.load_study(study_name=study_name, storage=backend)
        dict(study.user_attrs)
        check = check_trials(run_dir, study)  # reads every trial
    except Exception as e:  # noqa: BLE001 - a damaged file fails in many ways
        raise storage_error(e, desc, own) from None
    if check:
        raise backup_error(run_dir, desc if own is None else own_file(run_dir), check)
    return study

