"""Dead-trial recovery: fail the RUNNING trials whose worker died and queue their points again.

What makes a trial dead is :func:`geosearch.search.runtime.liveness.dead_reason` (its
worker's lock released, or its heartbeat stale); what becomes of its point is
:func:`geosearch.search.study.failures.settle_dead`. Every worker recovers before it asks
for a trial (``docs/design.md``, "Stale trials").
"""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

import optuna
from optuna.trial import TrialState

from geosearch.search.records import HEARTBEAT, WORKER
from geosearch.search.runtime.backup import TrialBackup
from geosearch.search.runtime.liveness import Owner, dead_reason, fcntl, live_processes
from geosearch.search.runtime.locks import asked_in, dead_ask, lock_files, lock_held
from geosearch.search.runtime.storage import DB_FILE, JOURNAL_FILE
from geosearch.search.study.failures import DEFAULT_MAX_RETRIES, settle_dead
from geosearch.search.study.queue import retried_numbers

__all__ = ["Recovered", "recover_stale", "recovered_line"]


class Recovered(NamedTuple):
    """A trial :func:`recover_stale` failed: its number, why its worker was taken as dead,
    and what became of its point (``"marked failed and queued again ..."``)."""

    number: int
    why: str
    outcome: str


def recover_stale(study: optuna.Study, owner: Owner, stale_after: float,
                  max_retries: int = DEFAULT_MAX_RETRIES) -> list[Recovered]:
    """Fail the RUNNING trials whose worker died and queue their points again, up to
    ``max_retries`` deaths in a row while training a point, after which the point stays
    failed (:func:`~geosearch.search.study.failures.settle_dead`); then remove the released
    lock files of this host that no RUNNING trial names.

    Telling the trial FAIL is the claim: when two workers find the same dead trial, only
    the one whose ``tell`` succeeds settles its point. The trials it fails or adds are
    backed up (``trials/<n>/trial.json``, :class:`~geosearch.search.runtime.backup.TrialBackup`).

    Returns:
        Each trial recovered.
    """
    recovered = _recover(study, owner, stale_after, max_retries)
    if recovered:  # the failed trials, and any point failed in their name, as stored
        TrialBackup(owner.run_dir).sync(study)
    if owner.lock:
        _prune_locks(Path(owner.lock).parent, study)
    return recovered


def _recover(study: optuna.Study, owner: Owner, stale_after: float,
             max_retries: int) -> list[Recovered]:
    recovered = []
    alone: bool | None = None
    ask_record = dead_ask(Path(owner.lock).parent) if owner.lock else None
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        why = None if owner.owns(t) else dead_reason(t, stale_after)
        unsigned = WORKER not in t.user_attrs and HEARTBEAT not in t.user_attrs
        if why is None and unsigned and asked_in(t, ask_record):
            why = "a process on this machine died or failed while it asked for it"
        if why is None and unsigned:
            # asked, then its worker died before it could sign it
            alone = _alone(owner) if alone is None else alone
            why = "no other process on this machine runs the study" if alone else None
        if why is None:
            continue
        try:
            study.tell(t.number, state=TrialState.FAIL)
        except (ValueError, RuntimeError):  # finished meanwhile, e.g. by another worker
            continue
        if t.number in retried_numbers(study.get_trials(deepcopy=False)):
            # its worker queued the point before it could tell (Searcher._fail): once is enough
            recovered.append(Recovered(t.number, why, "marked failed; its point was already queued again"))
            continue
        recovered.append(Recovered(t.number, why, settle_dead(study, t, max_retries)))
    return recovered


def _alone(owner: Owner) -> bool:
    """Whether ``owner`` is the only process that can be running its study: the storage is
    the run directory's own file, no other process of this host holds a lock there, and no
    other host left a lock file there (a run directory shared over the network)."""
    if fcntl is None or not owner.lock:
        return False
    folder = Path(owner.lock).parent
    run_dir = folder.parent
    if not ((run_dir / DB_FILE).is_file() or (run_dir / JOURNAL_FILE).is_file()):
        return False  # --storage: other machines may share it
    here = {p for p, _ in lock_files(folder)}
    if any(p not in here for p in folder.glob("*.lock")):
        return False
    return not live_processes(run_dir)


def _prune_locks(folder: Path, study: optuna.Study) -> None:
    """Remove the released lock files of this host that no RUNNING trial names."""
    if fcntl is None:
        return
    released = [p for p, _ in lock_files(folder) if not lock_held(str(p))]
    if not released:
        return
    named = set()
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        worker = t.user_attrs.get(WORKER)
        if isinstance(worker, dict) and worker.get("lock"):
            named.add(str(worker["lock"]))
    for p in released:
        if str(p.resolve()) not in named:
            p.unlink(missing_ok=True)


def recovered_line(number: int, why: str, outcome: str = "marked failed and queued again") -> str:
    """What the search prints about a trial :func:`recover_stale` recovered (called with
    the fields of a :class:`Recovered`)."""
    return f"trial {number} was left running by a worker that died ({why}): {outcome}"
