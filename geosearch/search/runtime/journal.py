"""The journal file of a study run by ``--workers N``, kept readable through a full disk.

Optuna's ``JournalFileBackend`` appends one JSON line per operation. Its reader skips a
last line with no newline (a record being written, or torn), but its writer appends after
it: a record torn by a full disk or a killed process gets the next record glued to it,
and the file no longer reads (every later read fails on that line). :class:`SafeJournalFile`
writes under Optuna's own lock and (1) cuts a torn last record off before it appends, and
(2) rolls the file back to its size before the append when the append fails part way
(``ENOSPC``). A torn record was never read by anyone (readers skip a line without its
newline), so cutting it loses nothing that was stored. :func:`check_journal_file` refuses
a ``--storage`` path that exists but is not an Optuna journal, before anything is written
to it. See ``docs/design.md`` ("The study").
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import optuna
from optuna.storages.journal import JournalFileBackend, JournalFileSymlinkLock

from geosearch.errors import ConfigError
from geosearch.search.runtime.interrupts import signals_held

__all__ = ["SafeJournalFile", "check_journal_file", "open_journal", "repair_torn_tail"]

_CHUNK = 1 << 16


def check_journal_file(path: str | os.PathLike) -> None:
    """Refuse a path that exists and is not an Optuna journal (nothing is written to it).

    A missing or empty file is a new journal. Otherwise its first line must be a journal
    record (a JSON object with an ``op_code``).

    Raises:
        ConfigError: a directory, an unreadable file, or a file of something else (an SQLite
            database, a text file).
    """
    source = os.fspath(path)
    p = Path(path)
    if p.is_dir():
        raise ConfigError("is a directory, expected a journal file (a new file name or an "
                          "existing journal)", source=source)
    if not p.exists() or p.stat().st_size == 0:
        return
    try:
        with open(p, "rb") as f:
            first = f.readline(_CHUNK)
    except OSError as e:
        raise ConfigError(f"cannot read the journal file ({e.strerror or e})", source=source) from None
    if not first.endswith(b"\n") and first.startswith(b'{"op_code":'):
        return  # its first record, being written by another process (or torn)
    try:
        record = json.loads(first)
    except (ValueError, UnicodeDecodeError):
        record = None
    if not (isinstance(record, dict) and "op_code" in record):
        hint = " (an SQLite file is given as sqlite:///PATH)" if first.startswith(b"SQLite format") else ""
        raise ConfigError("exists and is not an Optuna journal file; name a new file or an "
                          f"existing journal{hint}", source=source)


def repair_torn_tail(path: str | os.PathLike) -> int:
    """Cut an unfinished last record (no closing newline) off the file; returns the new size.

    Call with the journal's lock held: a writer that holds it is not torn, only unfinished.
    """
    with open(path, "rb+") as f:
        size = f.seek(0, os.SEEK_END)
        if size == 0:
            return 0
        f.seek(size - 1)
        if f.read(1) == b"\n":
            return size
        end = size
        while end > 0:  # the last newline, read backwards
            start = max(0, end - _CHUNK)
            f.seek(start)
            at = f.read(end - start).rfind(b"\n")
            if at >= 0:
                keep = start + at + 1
                break
            end = start
        else:
            keep = 0
        f.truncate(keep)
        return keep


class SafeJournalFile(JournalFileBackend):
    """Optuna's journal file backend whose appends are whole records or nothing.

    Args:
        path: the journal file (created when missing).
    """

    def __init__(self, path: str | os.PathLike) -> None:
        # absolute: the lock is a symlink to this path, and Optuna frees a lock left by a
        # killed writer (its grace period) only when the link resolves; a relative target
        # would resolve from the link's own directory, dangle, and stall every writer
        self.path = os.path.abspath(os.fspath(path))
        self.lock = JournalFileSymlinkLock(self.path)  # the lock Optuna's writers take
        super().__init__(self.path, lock_obj=self.lock)

    def append_logs(self, logs: list[dict[str, Any]]) -> None:
        """Append ``logs`` as JSON lines under the journal's lock: a torn last record is
        cut off first, a failed append leaves the file as it was, and a signal that comes
        meanwhile is delivered once the lock is released."""
        data = ("\n".join(json.dumps(log, separators=(",", ":")) for log in logs) + "\n").encode()
        with signals_held():  # a Ctrl-C or SIGTERM comes after the lock is released
            self._append(data)

    def _append(self, data: bytes) -> None:
        self.lock.acquire()
        try:
            size = repair_torn_tail(self.path)
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND)
            try:
                written = 0
                try:
                    while written < len(data):
                        written += os.write(fd, data[written:])
                except BaseException:
                    os.ftruncate(fd, size)  # shrinking needs no space: the record is undone
                    raise
                os.fsync(fd)
            finally:
                os.close(fd)
        finally:
            self.lock.release()


def open_journal(path: str | os.PathLike) -> optuna.storages.JournalStorage:
    """The journal storage in ``path``, replayed (see :class:`SafeJournalFile`)."""
    return optuna.storages.JournalStorage(SafeJournalFile(path))
