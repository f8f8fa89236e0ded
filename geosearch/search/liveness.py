"""Which trials are alive: worker lock files, the heartbeat thread, dead-trial recovery.

A worker process holds an ``flock`` on its own lock file for its lifetime and, while a
trial trains, a thread writes the trial's ``heartbeat``. A RUNNING trial is dead when its
worker, on this host, no longer holds its lock, or, when the lock file is not on this
machine, when its heartbeat is ``stale_after`` seconds old; every worker fails such trials
and queues their points again before asking for one. Why Optuna's own heartbeat is not
used, and the clock caveats, are in ``docs/design.md`` ("Stale trials").
"""

from __future__ import annotations

import datetime as _dt
import os
import socket
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from geosearch.search.queue import enqueue, trial_point
from geosearch.search.records import HEARTBEAT, WORKER
from geosearch.search.storage import LOCKS_DIR

try:  # POSIX: worker liveness through advisory locks
    import fcntl
except ImportError:  # pragma: no cover - Windows: heartbeats only
    fcntl = None  # type: ignore[assignment]

__all__ = [
    "HEARTBEAT_EVERY",
    "STALE_AFTER",
    "Heartbeat",
    "Owner",
    "TrialLost",
    "dead_reason",
    "recover_stale",
    "recovered_line",
]

STALE_AFTER = 300.0
"""Seconds without a heartbeat after which another host's RUNNING trial is stale."""
HEARTBEAT_EVERY = 30.0
"""Seconds between two heartbeats of a training trial (at most; ``stale_after / 4`` if less)."""
# A RUNNING trial with no owner yet (its worker is between ask() and the first attr).
_NEW_TRIAL_GRACE = 120.0


class Owner:
    """This process as a trial owner: host, pid and a lock file held while it lives.

    Args:
        run_dir: ``<runs-dir>/<study>``; the lock file goes into its ``.locks/``.
    """

    def __init__(self, run_dir: Path) -> None:
        self.host, self.pid = socket.gethostname(), os.getpid()
        self.lock: str | None = None
        self._fd: int | None = None
        if fcntl is not None:
            folder = run_dir / LOCKS_DIR
            folder.mkdir(parents=True, exist_ok=True)
            path = folder / f"{self.host}-{self.pid}-{uuid.uuid4().hex[:8]}.lock"
            self._fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o644)
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            self.lock = str(path.resolve())

    def attr(self) -> dict[str, Any]:
        """The ``worker`` attr of the trials this process trains."""
        return {"host": self.host, "pid": self.pid, "lock": self.lock}

    def owns(self, trial: FrozenTrial) -> bool:
        """Whether this process trains ``trial``."""
        return trial.user_attrs.get(WORKER) == self.attr()

    def close(self) -> None:
        """Release the lock and remove its file."""
        if self._fd is not None:
            os.close(self._fd)  # releases the lock
            self._fd = None
            if self.lock:
                Path(self.lock).unlink(missing_ok=True)


def _lock_held(path: str) -> bool:
    try:
        fd = os.open(path, os.O_RDWR)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return True
    fcntl.flock(fd, fcntl.LOCK_UN)
    return False


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
        return None if _lock_held(str(lock)) else f"its lock on {host} is released"
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


def recover_stale(study: optuna.Study, owner: Owner, stale_after: float) -> list[tuple[int, str]]:
    """Fail the RUNNING trials whose worker died and queue their points again.

    Telling the trial FAIL is the claim: when two workers find the same dead trial, only
    the one whose ``tell`` succeeds queues it again.

    Returns:
        ``(number, why it was taken as dead)`` of each trial recovered.
    """
    recovered = []
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        why = None if owner.owns(t) else dead_reason(t, stale_after)
        if why is None:
            continue
        try:
            study.tell(t.number, state=TrialState.FAIL)
        except (ValueError, RuntimeError):  # finished meanwhile, e.g. by another worker
            continue
        params = trial_point(t)
        if params:
            enqueue(study, params, retry_of=t.number)
        recovered.append((t.number, why))
    return recovered


def recovered_line(number: int, why: str) -> str:
    """What the search prints about a trial :func:`recover_stale` recovered."""
    return (f"trial {number} was left running by a worker that died ({why}): marked failed "
            "and queued again")


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
