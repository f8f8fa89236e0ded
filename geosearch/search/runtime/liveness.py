"""Which trials are alive: worker lock files and the heartbeat thread.

A worker process holds an ``flock`` on its own lock file for its lifetime and, while a
trial trains, a thread writes the trial's ``heartbeat``. A RUNNING trial is dead when its
worker, on this host, no longer holds its lock, or, when the lock file is not on this
machine, when its heartbeat is ``stale_after`` seconds old; every worker fails such trials
before asking for one, and queues their points again up to ``--max-retries`` deaths in a
row (:mod:`geosearch.search.study.failures`, which reads :func:`dead_reason`). A lock file stays when its process
ends, however it ends (so the next run sees at once that its trials are dead), and is
removed once no RUNNING trial names it. :func:`check_no_other_run` keeps a command from
training beside live workers of an earlier one. The processes of a machine ask for
trials one at a time (:meth:`Owner.ask`, under the ask lock of
:mod:`geosearch.search.runtime.locks`, which also holds the study's command lock). Why Optuna's
own heartbeat is not used, and the clock caveats, are in ``docs/design.md`` ("Stale
trials").
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import json
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import FrozenTrial

from geosearch.util.errors import GeosearchError
from geosearch.search.runtime.locks import (
    ASK_LOCK,
    busy_error,
    local_now,
    lock_files,
    lock_held,
    open_lock,
    rewrite,
)
from geosearch.search.records import HEARTBEAT, WORKER
from geosearch.search.runtime.storage import LOCKS_DIR

try:  # POSIX: worker liveness through advisory locks
    import fcntl
except ImportError:  # pragma: no cover - Windows: heartbeats only
    fcntl = None  # type: ignore[assignment]

__all__ = [
    "HEARTBEAT_EVERY",
    "PARENT_ENV",
    "STALE_AFTER",
    "Heartbeat",
    "Owner",
    "TrialLost",
    "check_no_other_run",
    "dead_reason",
    "live_processes",
]

STALE_AFTER = 300.0
"""Seconds without a heartbeat after which another host's RUNNING trial is stale."""
HEARTBEAT_EVERY = 30.0
"""Seconds between two heartbeats of a training trial (at most; ``stale_after / 4`` if less)."""
PARENT_ENV = "GEOSEARCH_PARENT_PID"
"""Set by ``--workers N`` in its worker processes: the pid of the command that started them."""
ORPHAN_WAIT = 30.0
"""Seconds a new run waits for workers of a run whose parent died to stop."""
# A RUNNING trial with no owner yet (its worker is between ask() and the first attr).
_NEW_TRIAL_GRACE = 120.0


class Owner:
    """This process as a trial owner: host, pid and a lock file held while it lives.

    Args:
        run_dir: ``<runs-dir>/<study>``; the lock file goes into its ``.locks/``.
    """

    def __init__(self, run_dir: Path) -> None:
        self.host, self.pid = socket.gethostname(), os.getpid()
        self.run_dir = Path(run_dir)
        self.lock: str | None = None
        self._fd: int | None = None
        if fcntl is not None:
            folder = run_dir / LOCKS_DIR
            folder.mkdir(parents=True, exist_ok=True)
            path = folder / f"{self.host}-{self.pid}-{uuid.uuid4().hex[:8]}.lock"
            # locked before it shows under its name: an unlocked *.lock is a dead process's
            temp = path.with_name(f".{path.name}.new")
            self._fd = os.open(temp, os.O_CREAT | os.O_RDWR, 0o644)
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            parent = os.environ.get(PARENT_ENV)
            os.write(self._fd, json.dumps({"host": self.host, "pid": self.pid, "parent": int(parent)
                                           if parent and parent.isdigit() else None}).encode())
            os.replace(temp, path)
            self.lock = str(path.resolve())

    def attr(self) -> dict[str, Any]:
        """The ``worker`` attr of the trials this process trains."""
        return {"host": self.host, "pid": self.pid, "lock": self.lock}

    def ask(self, study: optuna.Study) -> optuna.Trial:
        """``study.ask()``, signed with this process's ``worker`` attr, while holding this
        host's ask lock.

        One process of this host asks at a time, so two cannot pop the same queued trial
        (Optuna's pop is not atomic between processes on SQLite, whose ``SELECT ... FOR
        UPDATE`` is a no-op). The lock file records the ask (its start, then the trial)
        until the trial is signed: a process that dies or fails in between leaves the
        record, and :func:`~geosearch.search.study.failures.recover_stale` fails that trial at once instead of waiting.
        """
        if fcntl is None or self.lock is None:
            trial = study.ask()
            trial.set_user_attr(WORKER, self.attr())
            return trial
        fd = open_lock(Path(self.lock).parent / ASK_LOCK.format(host=self.host))
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)  # an ask takes milliseconds
            record: dict[str, Any] = {"pid": self.pid, "since": local_now()}
            rewrite(fd, record)
            try:
                trial = study.ask()
                rewrite(fd, {**record, "trial": trial.number})
                with contextlib.suppress(optuna.exceptions.UpdateFinishedTrialError):
                    # failed meanwhile by a process that took it for dead: the loop drops it
                    trial.set_user_attr(WORKER, self.attr())
            except BaseException:
                with contextlib.suppress(OSError):
                    rewrite(fd, {**record, "until": local_now()})
                raise
            rewrite(fd, None)
            return trial
        finally:
            os.close(fd)  # releases the lock

    def owns(self, trial: FrozenTrial) -> bool:
        """Whether this process trains ``trial``."""
        return trial.user_attrs.get(WORKER) == self.attr()

    def close(self) -> None:
        """Release the lock. The file stays: a trial this process leaves RUNNING (it could
        not tell its outcome, say on a full disk) is then seen dead at once; the file goes
        when no RUNNING trial names it (:func:`~geosearch.search.study.failures.recover_stale`)."""
        if self._fd is not None:
            os.close(self._fd)  # releases the lock
            self._fd = None


def dead_reason(trial: FrozenTrial, stale_after: float) -> str | None:
    """Why a RUNNING trial's worker is taken as dead, or ``None`` while it may be alive.

    On the worker's own host, with its lock file there: dead as soon as the lock is
    released (the kernel drops a killed process's flock at once). Otherwise (another
    host, or a host of the same name that does not share this file system): dead when its
    ``heartbeat`` (unix time, written every ``stale_after / 4`` s at most by
    :class:`Heartbeat`) is ``stale_after`` seconds old. Heartbeats compare the clocks of
    two machines: keep them synchronised (NTP); ``stale_after`` is far above usual skew.
    """
    worker = trial.user_attrs.get(WORKER)
    host = worker.get("host") if isinstance(worker, dict) else None
    lock = worker.get("lock") if isinstance(worker, dict) else None
    if host == socket.gethostname() and lock and fcntl is not None and os.path.exists(lock):
        return None if lock_held(str(lock)) else f"its lock on {host} is released"
    beat = trial.user_attrs.get(HEARTBEAT)
    if isinstance(beat, (int, float)):
        age = time.time() - beat
        return f"no heartbeat from {host or 'its worker'} for {age:.0f} s" \
            if age >= stale_after else None
    start = trial.datetime_start
    if start is None:
        return None
    # A trial between ask() and its first attrs. Optuna stores the asking machine's naive
    # local time: wait long enough for a time-zone difference not to pass for an old trial.
    age = (_dt.datetime.now() - start).total_seconds()
    return f"no heartbeat since it started {age:.0f} s ago" \
        if age >= max(_NEW_TRIAL_GRACE, stale_after) else None


def live_processes(run_dir: Path) -> list[dict[str, Any]]:
    """The other processes of this host that hold a lock in ``run_dir``: each lock file's
    ``{host, pid, parent}`` (``parent``: the ``--workers`` command that started it)."""
    if fcntl is None:
        return []
    me = os.getpid()
    return [{"pid": None, "parent": None, **info} for p, info in lock_files(run_dir / LOCKS_DIR)
            if info.get("pid") != me and lock_held(str(p))]


def _alive(pid: Any) -> bool:
    if not isinstance(pid, int):
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        return True
    return True


def check_no_other_run(run_dir: Path, study_name: str, echo: Callable[[str], None] | None = None,
                       wait: float = ORPHAN_WAIT) -> None:
    """Refuse to start a run of a study that live processes on this machine are running.

    Workers whose parent died (killed) are stopping on their own (they follow their
    parent, see :mod:`geosearch.search.runtime.workers`): for them this waits up to ``wait``
    seconds, saying so with ``echo``.

    Raises:
        GeosearchError: a run of the study is live here, or orphaned workers did not stop.
    """
    live = live_processes(run_dir)
    deadline = time.monotonic() + wait
    said = False
    while live and all(p["parent"] is not None and not _alive(p["parent"]) for p in live):
        if time.monotonic() >= deadline:
            pids = " ".join(str(p["pid"]) for p in live)
            raise GeosearchError(
                f"study {study_name!r} in {run_dir}: workers of an earlier run whose parent "
                f"died are still running (pids {pids}); stop them (kill {pids}) and rerun")
        if echo is not None and not said:
            echo(f"waiting up to {wait:g} s for {len(live)} worker(s) of an earlier run of "
                 f"{study_name!r}, whose parent died, to stop")
            said = True
        time.sleep(0.2)
        live = live_processes(run_dir)
    if live:
        pids = sorted({p["parent"] if _alive(p["parent"]) else p["pid"] for p in live},
                      key=lambda x: (x is None, x))
        raise busy_error(run_dir, study_name, " ".join(str(p) for p in pids))


class TrialLost(Exception):
    """This worker's trial was finished by another worker (which took it for dead)."""


class Heartbeat:
    """Writes ``heartbeat`` (unix time) on a trial from a thread while it trains.

    A thread, not the training callback: a proxy run may go longer than ``stale_after``
    between two records. Optuna's own heartbeat (``RDBStorage(heartbeat_interval=...)``)
    is recorded by ``study.optimize`` only (see ``docs/design.md``).

    ``lost`` is set when the storage refuses the write because the trial is finished:
    another worker took it for dead and queued its point again.
    """

    def __init__(self, trial: optuna.Trial, every: float) -> None:
        self.trial, self.every = trial, every
        self.lost = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name=f"heartbeat-{trial.number}",
                                        daemon=True)

    def __enter__(self) -> Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _beat(self) -> None:
        while not self._stop.wait(self.every):
            try:
                self.trial.set_user_attr(HEARTBEAT, time.time())
            except optuna.exceptions.UpdateFinishedTrialError:
                self.lost.set()
                return
            except Exception:  # noqa: BLE001 - a storage hiccup: the next beat may pass
                continue
