"""Where a run directory keeps its Optuna study, and how to open it.

A run directory ``<runs-dir>/<study>/`` holds one storage: ``study.db`` (SQLite, one
worker) or ``journal.log`` (a journal file, ``--workers N``); a rerun uses whichever exists,
and one holding both is refused since which one is current cannot be told. ``--storage``
names any Optuna RDB URL (``postgresql://...``) or journal path instead. Beside it lie
``space.yaml`` (the resolved search space) and ``best_assignment.yaml`` (the exported
winner). Search, export and report all open a run through :func:`open_run_study`, so they
read the same storage the same way; this module imports neither torch nor the trainer.
"""

from __future__ import annotations

import os
import random
import re
import time
from pathlib import Path
from typing import Any

import optuna

from geosearch.errors import ConfigError

__all__ = [
    "BEST_FILE",
    "DB_FILE",
    "JOURNAL_FILE",
    "SPACE_FILE",
    "mask_url",
    "open_run_study",
    "open_storage",
    "resolve_storage",
]

DB_FILE = "study.db"
JOURNAL_FILE = "journal.log"
BEST_FILE = "best_assignment.yaml"
SPACE_FILE = "space.yaml"


def mask_url(url: str) -> str:
    """A storage URL with its password masked, fit to print: ``postgresql://me:***@db/x``."""
    return re.sub(r"(://[^:/@]*):[^@/]*@", r"\1:***@", url)


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
    run_dir: str | os.PathLike, storage: str | None = None, *, workers: int = 1, create: bool = True
) -> tuple[optuna.storages.BaseStorage, str]:
    """The Optuna storage of a run directory.

    Args:
        run_dir: ``<runs-dir>/<study>``.
        storage: an Optuna RDB URL (``sqlite:///...``, ``postgresql://...``) or the path of
            a journal file; ``None`` = the run directory's ``journal.log`` or ``study.db``,
            whichever exists, else a new one (journal for several workers, SQLite for one).
        workers: processes that will share it (picks the kind of a new storage).
        create: whether a missing run-directory storage may be created.

    Returns:
        The storage and a description for messages (URL with the password masked, or
        ``"journal file PATH"``).

    Raises:
        ConfigError: the URL cannot be opened; both storage files exist; none exists and
            ``create`` is false.
    """
    if storage is None and create:
        Path(run_dir).mkdir(parents=True, exist_ok=True)
    storage = resolve_storage(run_dir, storage, workers=workers, create=create)
    if "://" not in storage:
        path = Path(storage)
        if not path.is_file() and not create:
            raise ConfigError("journal file not found", source=storage)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            backend = optuna.storages.journal.JournalFileBackend(str(path))
            journal = optuna.storages.JournalStorage(backend)  # replays the file
        except Exception as e:  # noqa: BLE001 - OSError, or a corrupt or foreign file
            first = (str(e).strip().splitlines() or [type(e).__name__])[0]
            raise ConfigError(f"cannot read the journal file: {first}", source=storage) from None
        return journal, f"journal file {path}"
    kwargs: dict[str, Any] = {}
    if storage.startswith("sqlite"):
        # several processes on one SQLite file wait for each other's writes
        kwargs["engine_kwargs"] = {"connect_args": {"timeout": 60}}
    elif storage.startswith(("postgresql", "mysql")):
        # a trial can outlast a server's or a firewall's idle timeout: test connections
        # before use instead of failing on a dropped one
        kwargs["engine_kwargs"] = {"pool_pre_ping": True}
    url = _with_installed_driver(storage)
    for attempt in range(3):
        try:
            return optuna.storages.RDBStorage(url, **kwargs), mask_url(storage)
        except ImportError:
            raise ConfigError(f"cannot open the storage {mask_url(storage)!r}: its database driver "
                              "is not installed (PostgreSQL: pip install 'geosearch[postgres]')",
                              source="--storage") from None
        except Exception as e:  # noqa: BLE001 - SQLAlchemy/driver errors of many kinds
            # Two processes creating the schema of a new database at once: one of them
            # fails on the version table (IntegrityError) or a lock (OperationalError).
            # (PostgreSQL: ProgrammingError "relation already exists")
            if attempt < 2 and type(e).__name__ in ("IntegrityError", "OperationalError",
                                                    "ProgrammingError"):
                time.sleep(0.5 + random.random())
                continue
            first = (str(e).strip().splitlines() or [type(e).__name__])[0]
            raise ConfigError(f"cannot open the storage {mask_url(storage)!r}: {first}",
                              source="--storage") from None
    raise AssertionError("unreachable")  # pragma: no cover


def _with_installed_driver(url: str) -> str:
    """``postgresql://`` with the driver that is installed: SQLAlchemy 2.1 takes it as
    psycopg 3, 2.0 as psycopg2 (``geosearch[postgres]`` installs psycopg2-binary)."""
    import importlib.util

    if not url.startswith("postgresql://"):
        return url
    for module, scheme in (("psycopg", "postgresql+psycopg"), ("psycopg2", "postgresql+psycopg2")):
        if importlib.util.find_spec(module) is not None:
            return scheme + url[len("postgresql"):]
    return url


def open_run_study(
    run_dir: str | os.PathLike, *, study_name: str | None = None, storage: str | None = None
) -> optuna.Study:
    """Load the study of an existing run directory (for export, report, inspection).

    Raises:
        ConfigError: no storage, no study, or several studies and no ``study_name``.
    """
    run_dir = Path(run_dir)
    if storage is None and not run_dir.is_dir():
        raise ConfigError("no such run directory", source=str(run_dir))
    backend, desc = open_storage(run_dir, storage, create=False)
    names = [s.study_name for s in optuna.get_all_study_summaries(backend, include_best_trial=False)]
    if not names:
        raise ConfigError(f"{desc} holds no study", source=str(run_dir))
    if study_name is None:
        if len(names) > 1:
            raise ConfigError(f"{desc} holds {len(names)} studies; pick one with --study",
                              source=str(run_dir), allowed=sorted(names))
        study_name = names[0]
    elif study_name not in names:
        raise ConfigError(f"no study {study_name!r} in {desc}", source=str(run_dir),
                          allowed=sorted(names))
    return optuna.load_study(study_name=study_name, storage=backend)
