"""The journal file of a study run by ``--workers N``, kept readable through a full disk.

Optuna's ``JournalFileBackend`` appends one JSON line per operation. Its reader skips a
last line with no newline (a record being written, or torn), but its writer appends after
it: a record torn by a full disk or a killed process gets the next record glued to it,
and the file no longer reads (every later read fails on that line). :class:`SafeJournalFile`
writes under Optuna's own lock and (1) cuts a torn last record off before it appends, and
(2) rolls the file back to its size before the append when the append fails part way
(``ENOSPC``). A torn record was never read by anyone (readers skip a line without its
newline), so cutting it loses nothing that was stored. :func:`check_journal_file` refuses
a ``--storage`` path that exists but is not an Optuna journal (or is a directory, a pipe, a
device), before anything is written to it.

:func:`open_journal` reads the file with a tolerant reader first (:func:`scan_journal`:
every whole line must be a JSON record with an ``op_code``), so that a damaged journal is
one line naming its first bad line, and names the line of a record Optuna's replay fails
on (Optuna itself says "Should not reach." or "Expecting value: line 1 column 1"); with
``read_only`` (export, report) the file is opened for reading only
(:class:`ReadOnlyJournalFile`). See ``docs/design.md`` ("The study").
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import optuna
from optuna.storages.journal import JournalFileBackend, JournalFileSymlinkLock

from geosearch.util.errors import ConfigError
from geosearch.util.files import check_user_file
from geosearch.search.runtime.interrupts import signals_held

__all__ = ["ReadOnlyJournalFile", "SafeJournalFile", "check_journal_file", "open_journal",
           "repair_torn_tail", "scan_journal"]

_CHUNK = 1 << 16


def check_journal_file(path: str | os.PathLike) -> None:
    """Refuse a path that exists and is not an Optuna journal (nothing is written to it).

    A missing or empty file is a new journal. Otherwise its first line must be a journal
    record (a JSON object with an ``op_code``).

    Raises:
        ConfigError: a directory, a pipe, a device, a broken link, an unreadable file, or a
            file of something else (an SQLite database, a text file).
    """
    source = os.fspath(path)
    p = Path(path)
    if not p.exists() and not p.is_symlink():
        return
    size = check_user_file(p, what="a journal file (a new file name or an existing journal)",
                           missing="is a broken symbolic link").st_size
    if size == 0:
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


def scan_journal(path: str | os.PathLike) -> int:
    """Read the journal with a tolerant reader: every whole line must be a JSON object with
    an integer ``op_code``. A last line without its newline (a record being written, or
    torn) is skipped, as Optuna's reader does. Returns the number of whole records.

    Raises:
        ConfigError: ``"<path>: line N: ..."`` for the first line that is not a record, or
            the file cannot be read.
    """
    source = os.fspath(path)
    n = 0
    try:
        with open(path, "rb") as f:
            for n, line in enumerate(f, 1):  # noqa: B007 - n is the count after the loop
                if not line.endswith(b"\n"):
                    return n - 1
                problem = _record_problem(line)
                if problem is not None:
                    raise ConfigError(f"line {n}: {problem}; an Optuna journal holds one JSON record "
                                      "per line, and the lines after a damaged one cannot be replayed",
                                      source=source)
    except OSError as e:
        raise ConfigError(f"cannot read the journal file ({e.strerror or e})", source=source) from None
    return n


def _record_problem(line: bytes) -> str | None:
    """What keeps one line of a journal from being a record, or ``None``."""
    try:
        record = json.loads(line.decode("utf-8"))
    except UnicodeDecodeError as e:
        return f"not UTF-8 text (byte 0x{line[e.start]:02x} at column {e.start + 1})"
    except json.JSONDecodeError as e:
        return f"not a JSON record ({e.msg} at column {e.colno})"
    if not isinstance(record, dict):
        return f"not a journal record (a JSON {type(record).__name__}, expected an object)"
    op = record.get("op_code")
    if not isinstance(op, int) or isinstance(op, bool):
        return "not a journal record (no whole-number op_code)"
    return None


class _Replayed:
    """A journal backend that remembers the last record it handed to Optuna's replay, so
    that a record the replay fails on can be named by its line."""

    last_line: int = 0
    """The line of the last record read (1-based; 0: none yet)."""
    last_record: dict[str, Any] | None = None

    def read_logs(self, log_number_from: int):  # Optuna: one record per line, numbered from 0
        for i, record in enumerate(super().read_logs(log_number_from)):  # type: ignore[misc]
            self.last_line, self.last_record = log_number_from + i + 1, record
            yield record


class SafeJournalFile(_Replayed, JournalFileBackend):
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


class ReadOnlyJournalFile(_Replayed, JournalFileBackend):
    """Optuna's journal file backend for reading only (export, report): it takes no lock and
    refuses to append.

    Args:
        path: an existing journal file.
    """

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = os.path.abspath(os.fspath(path))
        if not os.path.isfile(self.path):  # Optuna's backend would create it
            raise ConfigError("journal file not found", source=os.fspath(path))
        super().__init__(self.path)

    def append_logs(self, logs: list[dict[str, Any]]) -> None:
        raise RuntimeError(f"{self.path}: the journal was opened for reading only")


def open_journal(path: str | os.PathLike, *, read_only: bool = False) -> optuna.storages.JournalStorage:
    """The journal storage in ``path``, replayed (see :class:`SafeJournalFile`); read first by
    :func:`scan_journal`.

    Args:
        path: the journal file (created when missing, unless ``read_only``).
        read_only: open it for reading only (:class:`ReadOnlyJournalFile`).

    Raises:
        ConfigError: naming the file and the line: a line that is not a record, or a record
            Optuna's replay fails on; the file cannot be read.
    """
    source = os.fspath(path)
    try:
        backend: _Replayed = ReadOnlyJournalFile(path) if read_only else SafeJournalFile(path)
    except OSError as e:  # SafeJournalFile creates a missing file
        raise ConfigError(f"cannot create the journal file ({e.strerror or e})", source=source) from None
    scan_journal(path)
    try:
        return optuna.storages.JournalStorage(backend)  # type: ignore[arg-type]
    except OSError as e:
        raise ConfigError(f"cannot read the journal file ({e.strerror or e})", source=source) from None
    except Exception as e:  # noqa: BLE001 - whatever the replay of a bad record raises
        raise ConfigError(f"line {backend.last_line}: Optuna cannot replay this record "
                          f"({_replay_problem(e, backend.last_record)})", source=source) from None


def _replay_problem(e: Exception, record: dict[str, Any] | None) -> str:
    """Why Optuna's replay failed on ``record``, in words (never its "Should not reach.")."""
    op = record.get("op_code") if isinstance(record, dict) else None
    if isinstance(e, AssertionError):
        problem = "an operation it does not know" if "Should not reach" in str(e) else "a malformed record"
    elif isinstance(e, KeyError):
        problem = f"no {e.args[0]!r} field" if e.args else "a missing field"
    else:
        first = (str(e).strip().splitlines() or [""])[0][:120]
        problem = f"{type(e).__name__}: {first}" if first else type(e).__name__
    return f"op_code {op!r}: {problem}"
