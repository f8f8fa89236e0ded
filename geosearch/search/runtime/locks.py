"""The file locks of a study's run directory on this machine (``.locks/``).

A command holds the study's :class:`CommandLock` (an ``flock`` on
``.locks/<host>.command``: of two commands started at once, exactly one gets it). The
processes of a host ask for trials one at a time under the ask lock
(``.locks/<host>.ask``), whose file records an ask until its trial is signed:
:func:`dead_ask` reads the record a process left when it died in between, and
:func:`asked_in` tells which trial it was asking for. :func:`lock_held` and
:func:`lock_files` read the lock files of worker processes, which
:mod:`geosearch.search.runtime.liveness` takes and judges. Advisory locks are POSIX: elsewhere
no lock is taken. The rules are in ``docs/design.md`` ("Stale trials").
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import json
import os
import socket
import time
from pathlib import Path
from typing import Any

from optuna.trial import FrozenTrial

from geosearch.util.errors import GeosearchError
from geosearch.search.runtime.storage import LOCKS_DIR, make_dir

try:  # POSIX advisory locks
    import fcntl
except ImportError:  # pragma: no cover - Windows: no locks
    fcntl = None  # type: ignore[assignment]

__all__ = ["ASK_LOCK", "CommandLock", "asked_in", "busy_error", "dead_ask", "early_lock",
           "local_now",
           "lock_files", "lock_held", "open_lock", "read_record", "rewrite"]

ASK_LOCK = "{host}.ask"
"""In ``.locks/``: held while a process of this host asks for a trial."""
_COMMAND_LOCK = "{host}.command"  # in .locks/: held by the command running the study here
_HOLDER_WAIT = 2.0  # seconds to wait for a command lock's holder to write its pid


def lock_held(path: str) -> bool:
    """Whether a live process holds the ``flock`` of the lock file at ``path`` (a missing
    file is not held)."""
    try:
        fd = os.open(path, os.O_RDWR)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return True
    else:
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    finally:
        os.close(fd)


def open_lock(path: Path) -> int:
    """Open (create) a lock file for reading and writing; the caller closes the fd."""
    return os.open(path, os.O_CREAT | os.O_RDWR, 0o644)


def local_now() -> str:
    """This machine's naive local time, as Optuna stores a trial's ``datetime_start``."""
    return _dt.datetime.now().isoformat()


def rewrite(fd: int, record: dict[str, Any] | None) -> None:
    """Replace the content of a held lock file with ``record`` (``None``: empty)."""
    os.ftruncate(fd, 0)
    if record is not None:
        os.pwrite(fd, json.dumps(record).encode(), 0)


def read_record(fd: int) -> dict[str, Any]:
    """The JSON object a lock file holds (``{}`` when empty or unreadable)."""
    try:
        data = json.loads(os.pread(fd, 4096, 0) or b"{}")
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


def dead_ask(folder: Path) -> dict[str, Any] | None:
    """The record an asker of this host left when it died or failed before it signed the
    trial it asked for (see :meth:`geosearch.search.runtime.liveness.Owner.ask`), cleared; ``None`` when there is none."""
    if fcntl is None or not folder.is_dir():
        return None
    fd = open_lock(folder / ASK_LOCK.format(host=socket.gethostname()))
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # no live asker: a record left now is a dead one's
        record = read_record(fd)
        if not record:
            return None
        rewrite(fd, None)
        return record
    finally:
        os.close(fd)


def asked_in(trial: FrozenTrial, record: dict[str, Any] | None) -> bool:
    """Whether ``trial`` is the one a dead asker's ``record`` was asking for: the trial it
    names, or, when it died inside ``ask()``, the trial started while it asked (Optuna
    stores the asking machine's local time, this machine's for a trial asked here)."""
    if not record:
        return False
    if "trial" in record:
        return record["trial"] == trial.number
    start = trial.datetime_start
    try:
        since = _dt.datetime.fromisoformat(record["since"])
        until = _dt.datetime.fromisoformat(record.get("until") or local_now())
    except (KeyError, TypeError, ValueError):
        return False
    return start is not None and since <= start <= until


def lock_files(folder: Path) -> list[tuple[Path, dict[str, Any]]]:
    """The lock files of this host in ``folder``, each with what it says (host, pid, parent)."""
    host = socket.gethostname()
    out = []
    for path in sorted(folder.glob("*.lock")) if folder.is_dir() else []:
        try:
            info = json.loads(path.read_text(encoding="utf-8") or "{}")
        except (OSError, ValueError):
            info = {}
        if not isinstance(info, dict):
            info = {}
        if info.get("host", host if path.name.startswith(f"{host}-") else None) == host:
            out.append((path, info))
    return out


def busy_error(run_dir: Path, study_name: str, shown: str) -> GeosearchError:
    """The one line refusing a command of a study that the process(es) ``shown`` run."""
    return GeosearchError(
        f"study {study_name!r} in {run_dir} is being run by another process on this "
        f"machine (pid {shown}): wait for it to finish, or stop it (kill {shown}), then rerun")


class CommandLock:
    """The hold of one command (``geosearch search``, not its workers) on a study's run
    directory on this machine: an ``flock`` on ``.locks/<host>.command``, taken at once or
    refused, so that of two commands started together exactly one runs the study.

    The file holds the holder's pid and is never removed (removing a lock file others may
    have open would let two processes lock two files of one name). The kernel releases
    the lock when its process ends, however it ends. Machines sharing a run directory over
    the network lock files of their own host names: they may run one study together.

    Args:
        run_dir: ``<runs-dir>/<study>``.
        study_name: the study, for the message.

    Raises:
        GeosearchError: another process of this machine holds it (naming its pid).
    """

    def __init__(self, run_dir: Path, study_name: str) -> None:
        self._fd: int | None = None
        if fcntl is None:
            return
        folder = run_dir / LOCKS_DIR
        make_dir(folder)
        fd = open_lock(folder / _COMMAND_LOCK.format(host=socket.gethostname()))
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            deadline = time.monotonic() + _HOLDER_WAIT  # the holder writes its pid just after
            while "pid" not in read_record(fd) and time.monotonic() < deadline:
                time.sleep(0.05)
            pid = read_record(fd).get("pid", "unknown")
            os.close(fd)
            raise busy_error(run_dir, study_name, str(pid)) from None
        rewrite(fd, {"pid": os.getpid()})
        self._fd = fd

    def close(self) -> None:
        """Release the lock (the file stays)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> CommandLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def early_lock(held: contextlib.ExitStack, run_dir: Path, study_name: str,
               new: bool) -> CommandLock | None:
    """A command's hold on its study before its storage is opened. ``new`` (the run
    directory has no storage yet): the :class:`CommandLock` is taken now, into ``held``, so
    that of two commands started together on one directory (one process and ``--workers``:
    an SQLite file and a journal) the one refused creates no file. Else, writing nothing, a
    command lock a live process holds is refused now, before the storage is read (the lock
    itself is taken once it has opened).

    Raises:
        GeosearchError: another process of this machine holds it (naming its pid).
    """
    if new:
        return held.enter_context(CommandLock(run_dir, study_name))
    path = run_dir / LOCKS_DIR / _COMMAND_LOCK.format(host=socket.gethostname())
    if fcntl is not None and lock_held(str(path)):
        try:
            pid = json.loads(path.read_text(encoding="utf-8") or "{}").get("pid", "unknown")
        except (OSError, ValueError, AttributeError):
            pid = "unknown"
        raise busy_error(run_dir, study_name, str(pid))
    return None
