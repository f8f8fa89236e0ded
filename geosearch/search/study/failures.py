"""Why a trial failed, and which failures run their point again.

A trial fails because of its ENVIRONMENT (the GPU ran out of memory, a CUDA or NCCL
runtime error, the host ran out of memory or disk, the storage's database failed), because
of the run's SETTINGS (what the trainer refuses before it trains, whatever the assignment:
a device or precision the machine lacks, a batch that does not split into ``grad_accum``
micro-batches, an unknown tracker, the data, the model: a
:class:`~geosearch.util.errors.SettingsError`), or because of the ASSIGNMENT it trains (anything
else: a setting the assignment does not fit, an error in the model's training, a ValueError
from the optimizer). :func:`failure_kind` tells them apart, from the exception or from the
``"TypeName: message"`` line the trainer keeps of one it caught. An environment failure
runs its point again, up to ``--max-retries`` times in a row (:func:`earlier_retries`
counts them along the ``retry_of`` chain); an assignment failure stays failed
(:func:`failed_attrs`); a settings failure is not the point's: the trial loop records the
trial as interrupted, queues its point again and stops the search with the error. :func:`requeue_failed` is ``--retry-failed``: the
failed points, once each. A worker that is killed or crashes mid-trial is an environment
failure too; the stale-trial recovery of :mod:`geosearch.search.runtime.liveness` queues its
point again. Torch-free: the exception types are recognised by name. The rules are in
``docs/design.md`` ("Failures and retries").

Dead-trial recovery (:func:`recover_stale`): fail the RUNNING trials whose worker died
(:func:`geosearch.search.runtime.liveness.dead_reason`: its lock released, or its heartbeat
stale) and settle their points (:func:`settle_dead`); every worker recovers before it asks
for a trial (``docs/design.md``, "Stale trials").
"""

from __future__ import annotations

import errno
import re
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState, create_trial

from geosearch.util.errors import ConfigError
from geosearch.search.study.queue import enqueue, retried_numbers, trial_key, trial_params
from geosearch.search.records import (
    ASSIGNMENT,
    BASELINE,
    BUDGET_STEPS,
    COMPLETED,
    FAIL_REASON,
    FAILED,
    FAILURE_KIND,
    INTERRUPTED,
    NUM_PROCESSES,
    QUEUED_PARAMS,
    RETRIED,
    RETRIES,
    RETRY_OF,
    RUNG_INDICES,
    RUNNING,
    SEED_OF,
    SEEDS,
    STATUS,
    STEP_FACTOR,
    TRIAL_DIR,
    PRUNED,
    UNSTABLE,
    trial_status,
)
from pathlib import Path
from typing import NamedTuple


from geosearch.search.records import HEARTBEAT, WORKER
from geosearch.search.runtime.backup import TrialBackup
from geosearch.search.runtime.liveness import Owner, dead_reason, fcntl, live_processes
from geosearch.search.runtime.locks import asked_in, dead_ask, lock_files, lock_held
from geosearch.search.runtime.storage import DB_FILE, JOURNAL_FILE

__all__ = ["ASSIGNMENT_FAILURE", "DEFAULT_MAX_RETRIES", "ENVIRONMENT_FAILURE", "Recovered",
           "SETTINGS_FAILURE", "earlier_retries", "failed_attrs", "failure_kind",
           "recover_stale", "recovered_line", "requeue_failed", "settings_line", "settle_dead",
           "worker_died"]

ENVIRONMENT_FAILURE = "environment"
"""``failure_kind`` of a trial that failed because of the machine or the storage."""
ASSIGNMENT_FAILURE = "assignment"
"""``failure_kind`` of a trial that failed because of what it trains."""
SETTINGS_FAILURE = "settings"
"""``failure_kind`` of a trial stopped because the run's settings fail every trial alike
(a :class:`~geosearch.util.errors.SettingsError`): not the point's failure; its point is
queued again and the search stops."""
DEFAULT_MAX_RETRIES = 2
"""Times in a row an environment failure runs its point again (``--max-retries``)."""

# Exception types of the environment, by name (any class in the exception's MRO): torch's
# out-of-memory and accelerator errors, torch.distributed's, the host's memory, the storage's.
_ENVIRONMENT_TYPES = frozenset({
    "OutOfMemoryError", "AcceleratorError", "DistError", "DistBackendError", "DistNetworkError",
    "DistStoreError", "MemoryError", "OperationalError", "InterfaceError", "DisconnectionError",
    "TimeoutError", "StorageInternalError", "ConnectionError", "ConnectionResetError",
    "ConnectionRefusedError", "ConnectionAbortedError", "BrokenPipeError",
})
# OSErrors that name a path the run was given: the setting's problem, not the machine's.
_PATH_ERRORS = frozenset({errno.ENOENT, errno.EISDIR, errno.ENOTDIR, errno.EACCES, errno.EPERM})
_PATH_TYPES = frozenset({"FileNotFoundError", "IsADirectoryError", "NotADirectoryError",
                         "PermissionError"})
# Messages of the environment, whatever the type (CUDA/NCCL runtime errors are RuntimeErrors).
_ENVIRONMENT_TEXT = re.compile(
    r"out of memory|CUDA error|CUDA driver|cuDNN error|CUBLAS_STATUS|NCCL|No space left on device|"
    r"Disk quota exceeded|Input/output error|Cannot allocate memory|database is locked|"
    r"server closed the connection|connection .*(?:reset|refused|closed)", re.IGNORECASE)
# ... except a device-side assert: an index out of range in the trial's own tensors, every time.
_ASSIGNMENT_TEXT = re.compile(r"device-side assert", re.IGNORECASE)
_NAMED = re.compile(r"^(?P<type>[A-Za-z_][\w.]*): ")


def failure_kind(error: BaseException | str) -> str:
    """Whether a trial's failure comes from its environment, the run's settings or its
    assignment.

    Args:
        error: the exception the trial raised, or the ``"TypeName: message"`` reason the
            trainer recorded for an exception it caught (``TrainResult.reason``).

    Returns:
        :data:`ENVIRONMENT_FAILURE` (out of memory, a CUDA/NCCL runtime error, an OSError
        such as a full disk, a storage or connection error), :data:`SETTINGS_FAILURE` (a
        :class:`~geosearch.util.errors.SettingsError`, unless an environment failure caused it:
        a model factory out of memory) or :data:`ASSIGNMENT_FAILURE` (everything else).

    Example:
        >>> failure_kind(MemoryError())
        'environment'
        >>> failure_kind("ValueError: expected a finite spectral_lr")
        'assignment'
        >>> from geosearch.util.errors import SettingsError
        >>> failure_kind(SettingsError("does not split", key="grad_accum"))
        'settings'
    """
    if isinstance(error, BaseException):
        names = {c.__name__ for c in type(error).__mro__}
        code = error.errno if isinstance(error, OSError) else None
        text = str(error)
    else:
        match = _NAMED.match(error)
        names = {match["type"].rsplit(".", 1)[-1]} if match else set()
        code = None
        text = error
    if "SettingsError" in names:
        cause = _first_cause(error) if isinstance(error, BaseException) else None
        return ENVIRONMENT_FAILURE if cause is not None and failure_kind(cause) == ENVIRONMENT_FAILURE \
            else SETTINGS_FAILURE
    if "GeosearchError" in names or _ASSIGNMENT_TEXT.search(text):  # a setting's, said as such
        return ASSIGNMENT_FAILURE
    if names & _ENVIRONMENT_TYPES or _ENVIRONMENT_TEXT.search(text):
        return ENVIRONMENT_FAILURE
    if "OSError" in names or "IOError" in names:
        return ASSIGNMENT_FAILURE if code in _PATH_ERRORS or names & _PATH_TYPES else ENVIRONMENT_FAILURE
    return ASSIGNMENT_FAILURE


def _first_cause(error: BaseException) -> BaseException | None:
    """The first exception behind ``error`` (``raise ... from``) that is not a geosearch
    error: what a wrapped error of the user's code really was."""
    seen = {id(error)}
    cause = error.__cause__
    while cause is not None and id(cause) not in seen:
        if "GeosearchError" not in {c.__name__ for c in type(cause).__mro__}:
            return cause
        seen.add(id(cause))
        cause = cause.__cause__
    return None


def worker_died(trial: FrozenTrial) -> bool:
    """Whether the worker of a trial left unfinished died while training it (killed,
    crashed, out of memory) rather than stopping on a Ctrl-C.

    A process stopped by Ctrl-C (or SIGTERM) records ``status: interrupted`` itself
    before it tells; a dead worker leaves the status the trial loop writes when training
    starts (``running``; ``completed`` or ``unstable`` when it died while telling), or,
    killed between the loop's first two writes, a ``fail_reason`` alone. A trial whose
    worker died before signing it (while asking) has neither: its point did not kill it.
    """
    ua = trial.user_attrs
    status = ua.get(STATUS)
    return status in (RUNNING, COMPLETED, UNSTABLE, PRUNED) or (status is None and FAIL_REASON in ua)


def _retry_row(study: optuna.Study, trial: FrozenTrial | optuna.Trial) -> list[FrozenTrial]:
    """The environment failures of this trial's point in a row before it, latest first:
    along ``retry_of``, each ``retried`` trial and each interrupted one whose worker died;
    a Ctrl-C is passed over; anything else ends the row."""
    by_number = {t.number: t for t in study.get_trials(deepcopy=False)}
    row: list[FrozenTrial] = []
    seen = {trial.number}
    previous = trial.user_attrs.get(RETRY_OF)
    while isinstance(previous, int) and previous not in seen and previous in by_number:
        seen.add(previous)
        t = by_number[previous]
        status = trial_status(t)
        if status == RETRIED or (status == INTERRUPTED and worker_died(t)):
            row.append(t)
        elif status != INTERRUPTED:
            break
        previous = t.user_attrs.get(RETRY_OF)
    return row


def earlier_retries(study: optuna.Study, trial: FrozenTrial | optuna.Trial) -> int:
    """How many environment failures of this trial's point, in a row, it retries.

    Follows ``retry_of`` back from ``trial``: each ``retried`` trial counts, and so does
    each interrupted one whose worker died (:func:`worker_died`); one stopped by Ctrl-C is
    passed over without counting; anything else (a ``failed`` trial that
    ``--retry-failed`` queued again, or no earlier trial) ends the row, so an on-demand
    retry starts with the full ``--max-retries``.
    """
    return len(_retry_row(study, trial))


def failed_attrs(study: optuna.Study, trial: FrozenTrial | optuna.Trial, message: str, kind: str,
                 max_retries: int) -> dict[str, Any]:
    """The ``status``, ``fail_reason``, ``failure_kind`` and ``retries`` of a failed trial.

    A failure of the environment after fewer than ``max_retries`` :func:`earlier_retries`
    is ``retried`` (the caller queues its point again; it does not count towards the
    budget); any other failure is ``failed`` and counts, its reason saying how often an
    environment failure was retried.
    """
    retries = earlier_retries(study, trial) if kind == ENVIRONMENT_FAILURE else 0
    attrs: dict[str, Any] = {STATUS: FAILED, FAIL_REASON: message, FAILURE_KIND: kind,
                             RETRIES: retries}
    if kind == ENVIRONMENT_FAILURE and retries < max_retries:
        attrs[STATUS] = RETRIED
        attrs[FAIL_REASON] = (f"{RETRIED} (a failure of the environment; retry {retries + 1} of "
                              f"{max_retries} queued): {message}")
    elif kind == ENVIRONMENT_FAILURE:
        attrs[FAIL_REASON] = f"{message} (a failure of the environment; " + (
            f"retried {retries} time{'s' if retries > 1 else ''})" if retries
            else "not retried: --max-retries 0)")
    return attrs


# What a point's failed verdict keeps of the trial whose worker died last.
_POINT_ATTRS = (ASSIGNMENT, BUDGET_STEPS, SEEDS, RUNG_INDICES, TRIAL_DIR,
                NUM_PROCESSES, QUEUED_PARAMS, SEED_OF, BASELINE, STEP_FACTOR)


def settle_dead(study: optuna.Study, trial: FrozenTrial, max_retries: int) -> str:
    """Decide what becomes of the point of a trial the caller just failed because its
    worker was found dead (:func:`geosearch.search.study.failures.recover_stale`).

    A death while training (:func:`worker_died`) is a failure of the environment: the
    point is queued again (``retry_of``) while fewer than ``max_retries`` such failures
    (deaths or ``retried`` exceptions, :func:`earlier_retries`) precede it in a row;
    after that the point stays failed: a FAIL trial is added in its name (``status``
    ``failed``, ``failure_kind`` ``environment``, ``retry_of`` the dead trial), which
    counts towards the budget and which ``--retry-failed`` queues again. A trial stopped
    by Ctrl-C, or one whose worker died before signing it, is queued again without
    using up a retry.

    Returns:
        What became of the point, in words (the end of the line the search prints).
    """
    params = trial_params(trial)
    if not params:
        return "marked failed"
    if not worker_died(trial):
        enqueue(study, params, retry_of=trial.number)
        return "marked failed and queued again"
    row = _retry_row(study, trial)
    if len(row) < max_retries:
        enqueue(study, params, retry_of=trial.number)
        return f"marked failed and queued again (retry {len(row) + 1} of {max_retries})"
    deaths = 1 + sum(worker_died(t) for t in row)
    others = len(row) + 1 - deaths
    reason = (f"its worker died {'once' if deaths == 1 else f'{deaths} times'} while training "
              "this point (killed, crashed or out of memory)"
              + (f", after {others} other failure{'s' if others > 1 else ''} of the environment"
                 if others else "")
              + ("; not retried: --max-retries 0" if max_retries == 0 else "")
              + "; rerun with --retry-failed to try again")
    ua = trial.user_attrs
    study.add_trial(create_trial(
        state=TrialState.FAIL, params=dict(trial.params), distributions=dict(trial.distributions),
        user_attrs={**{k: ua[k] for k in _POINT_ATTRS if k in ua}, STATUS: FAILED,
                    FAIL_REASON: reason, FAILURE_KIND: ENVIRONMENT_FAILURE, RETRIES: len(row),
                    RETRY_OF: trial.number}))
    return f"marked failed; its point stays failed: {reason}"


def requeue_failed(study: optuna.Study) -> list[int]:
    """Queue the study's failed points again, once each (``--retry-failed``).

    A point is queued when its latest trial with a verdict failed and no trial of it is
    completed, unstable, queued or running. The new trial's ``retry_of`` names the failed
    one, which then no longer counts towards the budget
    (:func:`~geosearch.search.study.queue.counted`).

    Returns:
        The numbers of the failed trials whose points were queued.
    """
    trials = study.get_trials(deepcopy=False)
    rerun = retried_numbers(trials)
    busy = {trial_key(t) for t in trials
            if t.state in (TrialState.COMPLETE, TrialState.PRUNED, TrialState.RUNNING,
                           TrialState.WAITING)}
    latest: dict[str, FrozenTrial] = {}
    for t in trials:
        key = trial_key(t)
        if (key is not None and key not in busy and t.number not in rerun
                and t.state == TrialState.FAIL and t.user_attrs.get(STATUS) == FAILED):
            latest[key] = t  # trials come in order: the last one wins
    for t in latest.values():
        enqueue(study, trial_params(t), retry_of=t.number)
    return sorted(t.number for t in latest.values())


def settings_line(error: BaseException, space_source: str) -> str:
    """A settings error (``failure_kind`` ``settings``) in the space's words: a proxy run's
    key (``TrainConfig: grad_accum``) is the space's ``proxy.grad_accum`` (of the space file
    ``space_source``)."""
    if isinstance(error, ConfigError) and error.source in (None, "TrainConfig") and error.key:
        return str(ConfigError(error.problem, source=space_source, key=f"proxy.{error.key}",
                               allowed=error.allowed))
    return str(error)


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
