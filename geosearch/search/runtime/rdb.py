"""A database storage (SQLite, PostgreSQL, MySQL) looked at before Optuna opens it.

Optuna's ``RDBStorage`` creates its tables in whatever database it is handed and stamps
its schema version there: opened on an empty file or on another application's SQLite
database, it turns it into an Optuna storage (8 KB -> 118 KB, 13 tables added) before
anyone can say that it holds no study. So the tables are read first, through a
connection that cannot write (:func:`check_rdb`):

* a read-only command (export, report) opens only a database that holds Optuna's tables
  (:data:`REQUIRED_TABLES`); an SQLite file must exist and not be empty, and it is then
  opened read-only too (:func:`read_only_engine_kwargs`: ``sqlite3.connect`` of
  ``file:PATH?mode=ro``), so that it stays byte-identical;
* ``geosearch search`` may create a new SQLite file, or fill an empty one (no tables), but
  refuses an SQLite file whose tables are none of Optuna's (:data:`OPTUNA_TABLES`): it is
  another application's. A PostgreSQL or MySQL database may hold other applications'
  tables beside Optuna's, and is not checked on that count.

The table names are Optuna's on-disk schema (``optuna.storages.RDBStorage``, version 5),
read with ``sqlite3`` or SQLAlchemy's inspector; nothing of Optuna's internals is imported.
Torch-free.
"""

from __future__ import annotations

import os
import sqlite3
import urllib.request
from pathlib import Path
from typing import Any

from geosearch.util.errors import ConfigError
from geosearch.util.files import check_user_file

__all__ = ["OPTUNA_TABLES", "REQUIRED_TABLES", "check_rdb", "in_memory", "read_only_engine_kwargs",
           "sqlite_file", "sqlite_tables"]

OPTUNA_TABLES = frozenset({
    "alembic_version", "studies", "study_directions", "study_system_attributes",
    "study_user_attributes", "trial_heartbeats", "trial_intermediate_values", "trial_params",
    "trial_system_attributes", "trial_user_attributes", "trial_values", "trials", "version_info",
})
"""Every table Optuna's RDB storage creates."""
REQUIRED_TABLES = ("studies", "trials", "version_info")
"""The tables a database must hold to be read as an Optuna storage."""

_SHOWN = 4  # table names shown in a message
_TIMEOUT = 60.0  # seconds a reader waits for a writer's lock


def sqlite_file(url: str) -> Path | None:
    """The file of an ``sqlite:///PATH`` URL; ``None`` for other URLs, an in-memory database
    or a URL in SQLite's own ``file:`` form (``?uri=true``), which is passed on as it is."""
    if not url.startswith("sqlite:"):
        return None
    from sqlalchemy.engine import make_url  # an Optuna dependency
    from sqlalchemy.exc import ArgumentError

    try:
        parsed = make_url(url)
    except ArgumentError:
        return None  # RDBStorage says what is wrong with it
    database = parsed.database
    if not database or database == ":memory:" or "uri" in parsed.query:
        return None
    return Path(database)


def in_memory(url: str) -> bool:
    """Whether ``url`` is an SQLite database in memory (``sqlite://``, ``sqlite:///:memory:``,
    ``mode=memory``): it is lost when the process ends, and no other process can see it."""
    if not url.startswith("sqlite:"):
        return False
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        parsed = make_url(url)
    except ArgumentError:
        return False
    database = parsed.database or ""
    return (database in ("", ":memory:") or parsed.query.get("mode") == "memory"
            or "mode=memory" in database)


def _ro_uri(path: Path) -> str:
    return "file:" + urllib.request.pathname2url(os.path.abspath(path)) + "?mode=ro"


def _connect_ro(path: Path) -> sqlite3.Connection:
    """A connection to the existing SQLite file ``path`` that cannot write to it."""
    return sqlite3.connect(_ro_uri(path), uri=True, timeout=_TIMEOUT, check_same_thread=False)


def read_only_engine_kwargs(path: Path) -> dict[str, Any]:
    """``engine_kwargs`` for ``optuna.storages.RDBStorage`` that open ``path`` read-only."""
    return {"creator": lambda: _connect_ro(path)}


def sqlite_tables(path: Path) -> list[str]:
    """The tables of the SQLite file ``path``, read through a read-only connection.

    Raises:
        sqlite3.DatabaseError: it is not an SQLite database, or cannot be read.
    """
    con = _connect_ro(path)
    try:
        return sorted(r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'"))
    finally:
        con.close()


def check_rdb(url: str, *, read_only: bool, source: str | None, engine_kwargs: dict[str, Any],
              shown: str | None = None) -> None:
    """Refuse, before Optuna opens it, a database that is not an Optuna storage.

    Args:
        url: the storage URL (with its password).
        read_only: the command only reads (export, report): the database must hold Optuna's
            tables already. Otherwise a new or empty SQLite database may be created.
        source: the flag that named it (``"--storage"``), or ``None`` for the run
            directory's own ``study.db``.
        engine_kwargs: what the storage's engine is made with (a database other than
            SQLite is looked at only when ``read_only``).
        shown: the SQLite file's name in messages (default: the URL's path), e.g. the run
            directory's ``study.db`` as the user named the directory.

    Raises:
        ConfigError: naming the file (or the flag): an SQLite file that is missing (read-only),
            not a regular file, empty or without tables (read-only), not an SQLite database,
            or another application's; a database without Optuna's tables (read-only).
        Exception: the database driver's own error when it cannot connect (the caller words it).
    """
    path = sqlite_file(url)
    if path is not None:
        _check_sqlite(path, read_only=read_only, source=source, name=shown or os.fspath(path))
    elif read_only and not url.startswith("sqlite"):
        _check_tables(_rdb_tables(url, engine_kwargs), read_only=True, source=source, name=None)


def _check_sqlite(path: Path, *, read_only: bool, source: str | None, name: str) -> None:
    if not path.exists() and not path.is_symlink():
        if read_only:
            raise _problem("no such SQLite file", source, name)
        return  # search creates it
    st = check_user_file(path, what="an SQLite database file", source=f"{source}: {name}" if source else name)
    if st.st_size == 0:
        if read_only:
            raise _problem("is an empty file, not an Optuna storage: no study was ever stored in it",
                           source, name)
        return  # search fills it
    try:
        tables = sqlite_tables(path)
    except sqlite3.DatabaseError as e:
        if not read_only and _hot_journal(e, path):
            return  # the search's own connection rolls the cut-off write back, then reads
        raise _problem(_sqlite_error(e, path), source, name) from None
    _check_tables(tables, read_only=read_only, source=source, name=name)


def _hot_journal(e: sqlite3.DatabaseError, path: Path) -> bool:
    """Whether ``e`` says that a write cut off left ``path``'s rollback journal, which only a
    connection that may write rolls back (SQLite: ``SQLITE_READONLY_ROLLBACK``)."""
    code = getattr(e, "sqlite_errorname", "")  # Python 3.11+
    return code == "SQLITE_READONLY_ROLLBACK" or (Path(f"{path}-journal").is_file() and "readonly" in str(e))


def _sqlite_error(e: sqlite3.DatabaseError, path: Path) -> str:
    """An SQLite error met while reading ``path``'s tables, in words."""
    if getattr(e, "sqlite_errorname", "") == "SQLITE_NOTADB" or "not a database" in str(e):
        return "is not an SQLite database (nor an Optuna storage)"
    if _hot_journal(e, path):
        return (f"a write that was cut off left {path.name}-journal to roll back, which a read-only "
                "command does not do; rerun the search's command (it rolls it back and resumes), "
                "then this one")
    return f"cannot be read as an SQLite database ({e})"


def _problem(problem: str, source: str | None, name: str) -> ConfigError:
    """The error about the database file ``name``, under the flag ``source`` if any."""
    return ConfigError(problem, source=source, key=name) if source else ConfigError(problem, source=name)


def _check_tables(tables: list[str], *, read_only: bool, source: str | None, name: str | None) -> None:
    """Refuse a database whose ``tables`` are not an Optuna storage's."""
    ours = [t for t in tables if t in OPTUNA_TABLES]
    if read_only and all(t in tables for t in REQUIRED_TABLES):
        return
    if not read_only and (ours or not tables):
        return
    if not tables:
        problem = "holds no tables, not an Optuna storage: no study was ever stored in it"
    else:
        shown = ", ".join(tables[:_SHOWN]) + (f" and {len(tables) - _SHOWN} more" if len(tables) > _SHOWN else "")
        problem = (f"is another application's database (tables: {shown}), not an Optuna storage; "
                   "it is left as it is" + ("" if read_only else ": name a new file or an Optuna storage"))
        if ours:
            missing = ", ".join(t for t in REQUIRED_TABLES if t not in tables)
            problem = f"holds only part of an Optuna storage (no table {missing}); it is left as it is"
    if name is None:
        raise ConfigError(problem, source=source)
    raise _problem(problem, source, name)


def _rdb_tables(url: str, engine_kwargs: dict[str, Any]) -> list[str]:
    """The tables of a PostgreSQL or MySQL database (SQLAlchemy's inspector: it only reads)."""
    import sqlalchemy

    engine = sqlalchemy.create_engine(url, **engine_kwargs)
    try:
        return sorted(sqlalchemy.inspect(engine).get_table_names())
    finally:
        engine.dispose()
