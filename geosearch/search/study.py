"""Run a geometry search: the Optuna study, its objective, storage, resume, workers, export.

One trial = one point of a :class:`~geosearch.search.space.SearchSpace` (an assignment of
geometries to module types, plus any searched hyperparameters) trained as a short proxy
run by :func:`geosearch.proxy.train.train`, once per seed. Everything about the study
lives in its run directory ``<runs-dir>/<study>/``::

    study.db | journal.log   the Optuna storage (SQLite for one worker, a journal file
                             for --workers N; a rerun uses whichever exists)
    space.yaml               the resolved search space the study runs
    trials/<n>/              config.yaml + metrics.jsonl (+ result.json) of trial n;
                             trials/<n>/seed<s>/... when repeats > 1
    best_assignment.yaml     the exported winner (load_assignment / build_optimizer)
    workers/worker<i>.log    output of each worker process (--workers N)

Storage conventions (what this module writes, and what :mod:`geosearch.report` and ``export`` read):

* study user attrs: ``space`` (``SearchSpace.to_dict()``), ``geosearch_version``,
  ``rules``, ``proxy`` (the proxy run: ``TrainConfig`` fields + ``repeats`` + ``seeds``).
* trial user attrs: ``assignment`` (module type -> geometry, resolved), ``assignment_key``
  (``"attn_out=stiefel,attn_qkv=stiefel,..."`` sorted by type), ``budget_steps``, ``seeds``,
  ``trial_dir``, ``probe_history`` (``{step, max_logit, min_entropy, train_loss}`` rows,
  updated as the run goes so the pruner sees them), ``status``, ``prune_reason``,
  ``fail_reason``, ``stop_step``, ``val_losses``, ``val_loss_mean``, ``val_loss_std``
  (``None`` with one seed), ``mean_step_ms``, ``tokens_per_s``, ``max_logit``,
  ``sigma_max``, ``num_processes`` (processes that trained it: data parallel when > 1);
  bookkeeping: ``worker`` (host, pid, lock file), ``heartbeat`` (unix time),
  ``queued``/``queued_params``/``retry_of`` on queued trials, ``duplicate_of``.
* trial value: the mean final validation loss over seeds (minimised).

Trial outcomes (Optuna state / ``status`` attr):

* ``COMPLETE`` / ``completed``: every seed trained to the end.
* ``PRUNED`` / ``unstable``: the pruner fired (:class:`LogitGrowthPruner`: logit growth,
  entropy collapse, non-finite values) or the loss went non-finite; ``prune_reason`` says
  which rule. Pruned, not failed, so that TPE learns that region is bad.
* ``FAIL`` / ``failed``: an exception; ``fail_reason`` holds its message and
  ``trials/<n>/traceback.txt`` the traceback. The search goes on, unless
  ``MAX_FAILURES_IN_A_ROW`` trials in a row fail (then the problem is not the
  assignment: the search stops with the last message).
* ``FAIL`` / ``running`` or ``interrupted``: the worker died (killed, crashed) or was
  stopped with Ctrl-C mid-trial. The next run of the same command finds such trials,
  marks them failed and queues their point again (``retry_of``).
* ``FAIL`` / ``duplicate`` or ``skipped``: a trial that was never trained (a point already
  scored, the budget already taken by another worker); bookkeeping, ignore them.

The budget (``budget.trials``) counts trials with a verdict: ``completed``, ``unstable``
and ``failed`` trials, over every run of the study (a rerun continues towards the same
total). Interrupted trials do not count (their point is queued again), nor do duplicate
and skipped ones (never trained).
``budget.timeout`` is per invocation, like Optuna's ``optimize(timeout=...)``.

Exhaustive spaces (sampler ``grid``, or ``auto`` on a small finite space) put every point,
up to the budget, in Optuna's trial queue once (``study.enqueue_trial``), in a seeded
random order, and workers only consume the queue: ``ask()`` pops a waiting trial
atomically in both storages, so parallel workers never train the same point. (Optuna's
``GridSampler`` picks points itself and can hand one point to two workers, and its
``after_trial`` calls ``study.stop()``, which ask-and-tell does not allow.) Other samplers
(TPE, random, GP) propose points as usual; a proposal that repeats an already scored point
is recorded as a ``duplicate`` and not trained.

Repeats: each seed ``proxy.seed + r`` is a full proxy run (the same seeds for every point:
common random numbers make the comparison paired). The pruner is asked during every seed's
run; intermediate values (``trial.report``) are the first seed's only, since Optuna keeps
one value per step. One unstable seed prunes the trial. ``probe_history`` ends up as the
first seed's probes, or the probes of the seed that was pruned.

Ranking: completed trials by mean final val loss, ties by a Welch t-test at 5%; with one
seed per trial the ranking says that ties cannot be judged rather than naming a winner
(:mod:`geosearch.search.ranking`, which ``report.md`` uses too).

Stale trials: a RUNNING trial is dead when its worker is on this host and no longer holds
its lock file (``<run>/.locks/*.lock``, an ``flock`` held for the worker's lifetime, so
the check is immediate after a SIGKILL), or, when that lock file is not on this machine
(a worker on another host sharing a PostgreSQL storage, or on a host of the same name),
when its ``heartbeat`` is older than ``stale_after`` seconds (``--stale-after``, default
300). A thread of the worker writes the heartbeat every ``min(30, stale_after / 4)`` s
while the trial trains. Every worker looks for dead trials before each trial it asks for
and at start, fails them and queues their point again (``retry_of``); a worker whose trial
was taken for dead meanwhile (it lost its storage connection longer than ``stale_after``)
drops that trial. Optuna's own heartbeat (``RDBStorage(heartbeat_interval=...)``,
``optuna.storages.fail_stale_trials``) is not used: Optuna records it from
``study.optimize`` only, and recording it from an ask-and-tell loop would mean calling
``RDBStorage.record_heartbeat`` of ``BaseHeartbeat``, a class its documentation says "is
not supposed to be directly accessed by library users"; ``fail_stale_trials`` is
experimental; Optuna 5's ``JournalStorage`` has no heartbeat; and its grace period would
leave a trial killed on this host RUNNING on an immediate rerun. (What it would add: it
compares times on the database server's clock; ours compares the machines' clocks.)

Data parallel (``torchrun --nproc_per_node N -m geosearch search ...``, ``accelerate launch
--multi_gpu --num_processes N -m geosearch search ...``): every process trains each trial
on its share of the global batch; rank 0 alone opens the study, asks, reports, tells,
exports and prints, and sends each proxy run's config and assignment to the other ranks
(:mod:`geosearch.search.distributed`). Trials record ``num_processes``.

Workers (``--workers N``): this process creates the study (a journal file unless a
storage exists), queues the points, then starts N processes of the same command with
``--worker-index i``, each on GPU ``i mod #GPUs`` (``CUDA_VISIBLE_DEVICES``) or, without
GPUs, on ``cpu_count // N`` threads; it prints their trials as they finish, forwards
Ctrl-C once, and prints the ranking when all have exited.
"""

from __future__ import annotations

import datetime as _dt
import itertools
import json
import math
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import optuna
import yaml
from optuna.trial import FrozenTrial, TrialState

from geosearch import __version__
from geosearch.errors import ConfigError, GeosearchError
from geosearch.proxy.train import TrainResult, train
from geosearch.search.distributed import RankGroup, follow, launch_world
from geosearch.search.ranking import RankedTrial, Ranking, Score, rank_study
from geosearch.search.records import NOT_RUN, trial_line, trial_status
from geosearch.search.storage import (
    BEST_FILE,
    DB_FILE,
    JOURNAL_FILE,
    SPACE_FILE,
    mask_url,
    open_run_study,
    open_storage,
    resolve_storage,
)
from geosearch.search.space import SearchSpace, Suggestion, load_space

try:  # POSIX: worker liveness through advisory locks
    import fcntl
except ImportError:  # pragma: no cover - Windows: heartbeats only
    fcntl = None  # type: ignore[assignment]

__all__ = [
    "DB_FILE",
    "JOURNAL_FILE",
    "BEST_FILE",
    "SearchOutcome",
    "export_best",
    "format_ranking",
    "grid_points",
    "mask_url",
    "open_run_study",
    "open_storage",
    "resolve_storage",
    "run_search",
    "trial_line",
    "trial_status",
]

STALE_AFTER = 300.0
"""Seconds without a heartbeat after which another host's RUNNING trial is stale."""
HEARTBEAT_EVERY = 30.0
"""Seconds between two heartbeats of a training trial (at most; ``stale_after / 4`` if less)."""
MAX_FAILURES_IN_A_ROW = 5
MAX_DUPLICATES_IN_A_ROW = 100
# A RUNNING trial with no owner yet (its worker is between ask() and the first attr).
_NEW_TRIAL_GRACE = 120.0
# Study attrs that define what is measured: a resumed study must keep them.
_IDENTITY_KEYS = ("rules", "geometries", "hyperparams", "proxy", "repeats")
_MACHINE_KEYS = ("device",)  # proxy fields that may change between runs of one study


def _study_attrs(space: SearchSpace) -> dict[str, Any]:
    d = space.to_dict()
    proxy = dict(d["proxy"])
    proxy.update(repeats=space.repeats, seeds=_seeds(space))
    return {"space": d, "geosearch_version": __version__, "rules": d["rules"], "proxy": proxy}


def _check_identity(study: optuna.Study, space: SearchSpace, run_dir: Path) -> None:
    """A resumed study must measure the same thing: same points, same proxy."""
    old = study.user_attrs.get("space")
    if not isinstance(old, dict):
        return
    new = space.to_dict()
    for key in _IDENTITY_KEYS:
        a, b = old.get(key), new.get(key)
        if key == "proxy" and isinstance(a, dict) and isinstance(b, dict):
            a = {k: v for k, v in a.items() if k not in _MACHINE_KEYS}
            b = {k: v for k, v in b.items() if k not in _MACHINE_KEYS}
            for k in sorted(set(a) | set(b)):
                if a.get(k) != b.get(k):
                    raise ConfigError(
                        f"study {study.study_name!r} was created with proxy.{k}={a.get(k)!r}, not "
                        f"{b.get(k)!r}; rerun with the same settings to resume it, or start a new "
                        "study with --study NAME", source=str(run_dir), key=f"proxy.{k}")
        elif a != b:
            raise ConfigError(
                f"study {study.study_name!r} was created with a different {key} ({a!r}); rerun "
                "with the same search space to resume it, or start a new study with --study NAME",
                source=str(run_dir), key=key)


def _seeds(space: SearchSpace) -> list[int]:
    return [space.proxy.seed + r for r in range(space.repeats)]


# =========================================================================== liveness
class _Owner:
    """This process as a trial owner: host, pid and a lock file held while it lives."""

    def __init__(self, run_dir: Path) -> None:
        self.host, self.pid = socket.gethostname(), os.getpid()
        self.lock: str | None = None
        self._fd: int | None = None
        if fcntl is not None:
            folder = run_dir / ".locks"
            folder.mkdir(parents=True, exist_ok=True)
            path = folder / f"{self.host}-{self.pid}-{uuid.uuid4().hex[:8]}.lock"
            self._fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o644)
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            self.lock = str(path.resolve())

    def attr(self) -> dict[str, Any]:
        return {"host": self.host, "pid": self.pid, "lock": self.lock}

    def owns(self, trial: FrozenTrial) -> bool:
        return trial.user_attrs.get("worker") == self.attr()

    def close(self) -> None:
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


def _dead_reason(trial: FrozenTrial, stale_after: float) -> str | None:
    """Why a RUNNING trial's worker is taken as dead, or ``None`` while it may be alive.

    On the worker's own host, with its lock file there: dead as soon as the lock is
    released (the kernel drops a killed process's flock at once). Otherwise (another
    host, or a host of the same name that does not share this file system): dead when its
    ``heartbeat`` (unix time, written every ``stale_after / 4`` s at most by
    :class:`_Heartbeat`) is ``stale_after`` seconds old. Heartbeats compare the clocks of
    two machines: keep them synchronised (NTP); ``stale_after`` is far above usual skew.
    """
    worker = trial.user_attrs.get("worker")
    host = worker.get("host") if isinstance(worker, dict) else None
    lock = worker.get("lock") if isinstance(worker, dict) else None
    if host == socket.gethostname() and lock and fcntl is not None and os.path.exists(lock):
        return None if _lock_held(str(lock)) else f"its lock on {host} is released"
    beat = trial.user_attrs.get("heartbeat")
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


def _recover_stale(study: optuna.Study, owner: _Owner, stale_after: float) -> list[tuple[int, str]]:
    """Fail the RUNNING trials whose worker died and queue their points again.

    Telling the trial FAIL is the claim: when two workers find the same dead trial, only
    the one whose ``tell`` succeeds queues it again.

    Returns:
        ``(number, why it was taken as dead)`` of each trial recovered.
    """
    recovered = []
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        why = None if owner.owns(t) else _dead_reason(t, stale_after)
        if why is None:
            continue
        try:
            study.tell(t.number, state=TrialState.FAIL)
        except (ValueError, RuntimeError):  # finished meanwhile, e.g. by another worker
            continue
        params = dict(t.params) or t.user_attrs.get("queued_params")
        if params:
            study.enqueue_trial(params, user_attrs={"queued": True, "queued_params": params,
                                                    "retry_of": t.number})
        recovered.append((t.number, why))
    return recovered


def _recovered_line(number: int, why: str) -> str:
    return (f"trial {number} was left running by a worker that died ({why}): marked failed "
            "and queued again")


class _TrialLost(Exception):
    """This worker's trial was finished by another worker (which took it for dead)."""


class _Heartbeat:
    """Writes ``heartbeat`` (unix time) on a trial from a thread while it trains.

    A thread, not the training callback: a proxy run may go longer than ``stale_after``
    between two records. Optuna's own heartbeat (``RDBStorage(heartbeat_interval=...)``)
    is recorded by ``study.optimize`` only; see the module docstring.

    ``lost`` is set when the storage refuses the write because the trial is finished:
    another worker took it for dead and queued its point again.
    """

    def __init__(self, trial: optuna.Trial, every: float) -> None:
        self.trial, self.every = trial, every
        self.lost = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name=f"heartbeat-{trial.number}",
                                        daemon=True)

    def __enter__(self) -> _Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _beat(self) -> None:
        while not self._stop.wait(self.every):
            try:
                self.trial.set_user_attr("heartbeat", time.time())
            except optuna.exceptions.UpdateFinishedTrialError:
                self.lost.set()
                return
            except Exception:  # noqa: BLE001 - a storage hiccup: the next beat may pass
                continue


# =========================================================================== the queue
def _param_key(params: Mapping[str, Any]) -> str:
    return json.dumps({k: params[k] for k in sorted(params)}, sort_keys=True)


def _trial_key(trial: FrozenTrial) -> str | None:
    params = trial.params or trial.user_attrs.get("queued_params")
    return _param_key(params) if params else None


def _counted(trial: FrozenTrial) -> bool:
    if trial.state in (TrialState.COMPLETE, TrialState.PRUNED):
        return True
    return trial.state == TrialState.FAIL and trial.user_attrs.get("status") == "failed"


def grid_points(space: SearchSpace) -> list[dict[str, Any]]:
    """Every point of a finite space as Optuna params, in a seeded random order.

    The parameter names and choices are read from a trial the space suggests on, so they
    follow whatever names ``SearchSpace.suggest`` uses.

    Raises:
        ValueError: the space has continuous parameters.
    """
    probe = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    trial = probe.ask()
    space.suggest(trial)
    dists = trial.distributions
    if not all(isinstance(d, optuna.distributions.CategoricalDistribution) for d in dists.values()):
        raise ValueError("the space is not finite: it has continuous parameters")
    names = list(dists)
    points = [dict(zip(names, combo)) for combo in
              itertools.product(*(dists[n].choices for n in names))]
    random.Random(space.sampler.seed or 0).shuffle(points)
    return points


def _top_up_queue(study: optuna.Study, space: SearchSpace, budget: int) -> int:
    """Queue grid points not yet run, queued or running, until ``budget`` are allocated.

    Returns:
        How many points were queued.
    """
    trials = study.get_trials(deepcopy=False)
    taken = {_trial_key(t) for t in trials
             if _counted(t) or t.state in (TrialState.RUNNING, TrialState.WAITING)}
    taken.discard(None)
    allocated = len(taken)
    added = 0
    for params in grid_points(space):
        if allocated >= budget:
            break
        if _param_key(params) in taken:
            continue
        study.enqueue_trial(params, user_attrs={"queued": True, "queued_params": params})
        allocated += 1
        added += 1
    return added


# =========================================================================== the search
@dataclass
class SearchOutcome:
    """What :func:`run_search` did.

    Attributes:
        study_name: the study.
        run_dir: ``<runs-dir>/<study>``.
        storage: the storage, in words.
        stopped: why the search stopped, in words.
        ranking: the completed trials ranked (over every run of the study).
        counts: trials per ``status`` (completed, unstable, failed, interrupted...).
        exported: the best assignment file, ``None`` when no trial completed.
        rank: the process's rank in a distributed launch; on ranks other than 0 (which
            never open the study) ``ranking`` is empty and ``counts`` too.
    """

    study_name: str
    run_dir: Path
    storage: str
    stopped: str
    ranking: Ranking
    counts: dict[str, int]
    exported: Path | None = None
    rank: int = 0


class _Stop(Exception):
    """Ends the trial loop with a reason (not an error)."""


def _done_reason(study: optuna.Study, budget: int | None, exhaustive: bool,
                 grid_size: float) -> str | None:
    """Why no further trial should start, or ``None``: the budget (finished + running
    trials) is used up, the queue of an exhaustive space is empty, or every point of a
    finite space has been scored."""
    trials = study.get_trials(deepcopy=False)
    done = sum(map(_counted, trials))
    running = sum(t.state == TrialState.RUNNING for t in trials)
    if budget is not None and done + running >= budget:
        if running:
            return f"budget of {budget} trials allocated ({running} still running elsewhere)"
        if exhaustive and done >= grid_size:
            return "every assignment of the space has been tried"
        return f"budget of {budget} trials reached"
    if exhaustive:
        if not any(t.state == TrialState.WAITING for t in trials):
            return ("every assignment of the space has been tried" if running == 0 else
                    f"every assignment of the space is taken ({running} still running elsewhere)")
    elif grid_size != math.inf:
        scored = {_trial_key(t) for t in trials if _counted(t)}
        if len(scored) >= grid_size:
            return f"every one of the {int(grid_size)} assignments of the space has been scored"
    return None


class _Searcher:
    """The trial loop of one process: ask, guard, train each seed, tell."""

    def __init__(self, space: SearchSpace, study: optuna.Study, run_dir: Path, *, exhaustive: bool,
                 budget: int | None, stale_after: float, echo: Callable[[str], None],
                 group: RankGroup | None = None) -> None:
        self.space, self.study, self.run_dir = space, study, run_dir
        self.exhaustive, self.budget, self.stale_after = exhaustive, budget, stale_after
        self.echo = echo
        self.group = group  # data parallel: the other ranks train each run with this one
        self.grid_size = space.grid_size()
        self.failures_in_a_row = 0
        self.duplicates_in_a_row = 0
        self.owner = _Owner(run_dir)

    # ------------------------------------------------------------------ loop
    def run(self, timeout: float | None, on_trial: Callable[[FrozenTrial], None]) -> str:
        start = time.monotonic()
        try:
            while True:
                if timeout is not None and time.monotonic() - start >= timeout:
                    return f"timeout of {timeout:g} s reached"
                why = self._should_stop()
                if why:
                    return why
                trial = self.study.ask()
                try:
                    number = self._run_trial(trial)
                except _Stop as e:
                    return str(e)
                except (_TrialLost, optuna.exceptions.UpdateFinishedTrialError):
                    self.echo(f"trial {trial.number} was taken for dead by another worker (no "
                              f"heartbeat for {self.stale_after:g} s?), which queued its point "
                              "again: this worker drops it")
                    continue
                if number is not None:
                    on_trial(self._frozen(number))
        finally:
            self.owner.close()

    def _should_stop(self) -> str | None:
        for n, why in _recover_stale(self.study, self.owner, self.stale_after):
            self.echo(_recovered_line(n, why))
        return _done_reason(self.study, self.budget, self.exhaustive, self.grid_size)

    def _frozen(self, number: int) -> FrozenTrial:
        return next(t for t in self.study.get_trials(deepcopy=False) if t.number == number)

    # ------------------------------------------------------------------ one trial
    def _run_trial(self, trial: optuna.Trial) -> int | None:
        """Guard, train and tell one trial; returns its number if it was trained."""
        attrs = trial.user_attrs
        trial.set_user_attr("worker", self.owner.attr())
        trial.set_user_attr("heartbeat", time.time())
        if self.exhaustive and not attrs.get("queued"):
            self._not_run(trial, "skipped", "the queue was empty when this worker asked (another "
                                            "worker took the last point)")
            return None
        suggestion = self.space.suggest(trial)
        why = self._over_budget(trial.number)
        if why:
            self._not_run(trial, "skipped", why, requeue=bool(attrs.get("queued")))
            return None
        twin = self._twin(trial)
        if twin is not None:
            self._not_run(trial, "duplicate", f"same point as trial {twin}", duplicate_of=twin)
            self.duplicates_in_a_row += 1
            if self.duplicates_in_a_row >= MAX_DUPLICATES_IN_A_ROW:
                raise _Stop(f"the sampler proposed {MAX_DUPLICATES_IN_A_ROW} already scored points "
                            "in a row; the space looks exhausted")
            return None
        self.duplicates_in_a_row = 0
        return self._train_trial(trial, suggestion)

    def _over_budget(self, number: int) -> str | None:
        if self.budget is None:
            return None
        trials = self.study.get_trials(deepcopy=False)
        ahead = sum(_counted(t) or (t.state == TrialState.RUNNING and t.number < number)
                    for t in trials)
        return f"the budget of {self.budget} trials was taken by other workers" \
            if ahead >= self.budget else None

    def _twin(self, trial: optuna.Trial) -> int | None:
        key = _param_key(trial.params)
        for t in self.study.get_trials(deepcopy=False):
            if t.number == trial.number or _trial_key(t) != key:
                continue
            if _counted(t) or (t.state == TrialState.RUNNING and t.number < trial.number):
                return t.number
        return None

    def _not_run(self, trial: optuna.Trial, status: str, why: str, *, requeue: bool = False,
                 duplicate_of: int | None = None) -> None:
        trial.set_user_attr("status", status)
        trial.set_user_attr("fail_reason", why)
        if duplicate_of is not None:
            trial.set_user_attr("duplicate_of", duplicate_of)
        self.study.tell(trial, state=TrialState.FAIL)
        params = dict(trial.params) or trial.user_attrs.get("queued_params")
        if requeue and params:
            self.study.enqueue_trial(params, user_attrs={"queued": True, "queued_params": params})

    def _train_trial(self, trial: optuna.Trial, suggestion: Suggestion) -> int:
        n = trial.number
        assignment = suggestion.assignment()
        resolved = assignment.resolve()
        seeds = _seeds(self.space)
        trial_dir = self.run_dir / "trials" / str(n)
        for key, value in {
            "status": "running",
            "fail_reason": "interrupted before it finished (its worker was killed or crashed); "
                           "rerun the same command to run this point again",
            "assignment": resolved,
            "assignment_key": ",".join(f"{t}={g}" for t, g in sorted(resolved.items())),
            "budget_steps": self.space.proxy.steps,
            "seeds": seeds,
            "trial_dir": f"trials/{n}",
            "probe_history": [],
            "num_processes": self.group.world if self.group else 1,
        }.items():
            trial.set_user_attr(key, value)

        results: list[TrainResult] = []
        first_history: list[dict] = []
        heartbeat = _Heartbeat(trial, min(HEARTBEAT_EVERY, self.stale_after / 4))
        try:
            with heartbeat:
                for r, seed in enumerate(seeds):
                    out_dir = trial_dir if len(seeds) == 1 else trial_dir / f"seed{seed}"
                    config = self.space.train_config(suggestion, repeat=r)
                    result = self._train(config, assignment, callback=self._callback(trial, r, heartbeat),
                                         out_dir=out_dir)
                    results.append(result)
                    if r == 0:
                        first_history = result.probe_history
                    if result.status != "completed":
                        break
            if heartbeat.lost.is_set():
                raise _TrialLost
        except KeyboardInterrupt:
            # torchrun sends a second SIGINT to every rank on Ctrl-C: record this one first
            with _sigint_deferred():
                try:
                    trial.set_user_attr("status", "interrupted")
                    trial.set_user_attr("fail_reason", "interrupted (Ctrl-C); queued again: rerun "
                                                       "the same command to resume")
                    self.study.tell(trial, state=TrialState.FAIL)
                except (ValueError, RuntimeError):  # already failed by a worker that took it for dead
                    raise KeyboardInterrupt from None
                self.study.enqueue_trial(dict(trial.params), user_attrs={
                    "queued": True, "queued_params": dict(trial.params), "retry_of": n})
            raise
        except _TrialLost:
            raise
        except Exception as e:  # noqa: BLE001 - a trial's error must not end the search
            message = str(e) if isinstance(e, GeosearchError) else f"{type(e).__name__}: {e}"
            trial_dir.mkdir(parents=True, exist_ok=True)
            (trial_dir / "traceback.txt").write_text(traceback.format_exc(), encoding="utf-8")
            self._finish(trial, TrialState.FAIL, status="failed", fail_reason=message)
            return self._after_failure(n, message)

        last = results[-1]
        prefix = f"seed {seeds[len(results) - 1]}: " if len(seeds) > 1 else ""
        common = self._run_attrs(results, first_history)
        if last.status == "unstable":
            if len(results) > 1:
                common["pruned_seed"] = seeds[len(results) - 1]
                common["probe_history"] = last.probe_history
            self._finish(trial, TrialState.PRUNED, status="unstable",
                         prune_reason=prefix + (last.reason or "unstable"),
                         stop_step=last.stop_step, **common)
            self.failures_in_a_row = 0
            return n
        if last.status == "failed":
            message = prefix + (last.reason or "failed")
            self._finish(trial, TrialState.FAIL, status="failed", fail_reason=message,
                         stop_step=last.stop_step, **common)
            return self._after_failure(n, message)
        losses = [r.final_val_loss for r in results]
        if any(v is None or not math.isfinite(v) for v in losses):
            self._finish(trial, TrialState.PRUNED, status="unstable",
                         prune_reason="no finite final validation loss", **common)
            return n
        score = Score(tuple(float(v) for v in losses))
        self._finish(trial, TrialState.COMPLETE, value=score.mean, status="completed",
                     val_losses=list(score.values), val_loss_mean=score.mean,
                     val_loss_std=score.std, **common)
        self.failures_in_a_row = 0
        return n

    def _after_failure(self, number: int, message: str) -> int:
        self.failures_in_a_row += 1
        if self.failures_in_a_row >= MAX_FAILURES_IN_A_ROW:
            raise GeosearchError(
                f"{MAX_FAILURES_IN_A_ROW} trials in a row failed, the last (trial {number}) with: "
                f"{message}; see {self.run_dir / 'trials' / str(number)}")
        return number

    def _run_attrs(self, results: list[TrainResult], first_history: list[dict]) -> dict[str, Any]:
        first = results[0]
        probed = [m for m in first.history if m.get("max_logit") is not None]
        speeds = [r.mean_step_ms for r in results if math.isfinite(r.mean_step_ms)]
        tokens = [r.tokens_per_s for r in results if math.isfinite(r.tokens_per_s)]
        return {
            "probe_history": first_history,
            "mean_step_ms": sum(speeds) / len(speeds) if speeds else None,
            "tokens_per_s": sum(tokens) / len(tokens) if tokens else None,
            "max_logit": probed[-1]["max_logit"] if probed else None,
            "sigma_max": probed[-1].get("sigma_max") if probed else None,
        }

    def _finish(self, trial: optuna.Trial, state: TrialState, *, value: float | None = None,
                **attrs: Any) -> None:
        attrs.setdefault("prune_reason", None)
        attrs.setdefault("stop_step", None)
        if state != TrialState.FAIL:
            attrs.setdefault("fail_reason", None)
        try:
            for key, v in attrs.items():
                trial.set_user_attr(key, _json_safe(v))
            self.study.tell(trial, value, state=state)
        except (ValueError, optuna.exceptions.UpdateFinishedTrialError):
            if self._frozen(trial.number).state != TrialState.RUNNING:
                raise _TrialLost from None  # failed meanwhile by a worker that took it for dead
            raise

    def _train(self, config: Any, assignment: Any, **kwargs: Any) -> TrainResult:
        """One proxy run: here, or on every rank of a distributed launch."""
        if self.group is not None:
            return self.group.train(train, config, assignment, **kwargs)
        return train(config, assignment, **kwargs)

    def _callback(self, trial: optuna.Trial, repeat: int,
                  heartbeat: _Heartbeat) -> Callable[[int, dict], str | None]:
        """Reports, probes and the pruner's verdict for one seed's run."""
        history: list[dict] = []
        pruner = self.study.pruner

        def callback(step: int, metrics: dict) -> str | None:
            if heartbeat.lost.is_set():
                raise _TrialLost
            try:
                if repeat == 0 and metrics.get("val_loss") is not None:
                    trial.report(float(metrics["val_loss"]), step)
                if metrics.get("max_logit") is not None:
                    history.append({k: _json_safe(metrics.get(k))
                                    for k in ("step", "max_logit", "min_entropy", "train_loss")})
                    trial.set_user_attr("probe_history", list(history))
            except optuna.exceptions.UpdateFinishedTrialError:
                raise _TrialLost from None
            if not trial.should_prune():
                return None
            reason = getattr(pruner, "reason", None)
            why = reason(self.study, trial) if callable(reason) else None
            return why or f"pruned by {type(pruner).__name__} at step {step}"

        return callback


class _sigint_deferred:
    """Hold off SIGINT (main thread only) while a Ctrl-C is being recorded."""

    def __enter__(self) -> None:
        self.previous = None
        if threading.current_thread() is threading.main_thread():
            self.previous = signal.signal(signal.SIGINT, signal.SIG_IGN)

    def __exit__(self, *exc: object) -> None:
        if self.previous is not None:
            signal.signal(signal.SIGINT, self.previous)


def _json_safe(v: Any) -> Any:
    """Optuna stores user attrs as JSON: keep NaN/inf as floats (its storages accept
    them), turn tuples into lists."""
    if isinstance(v, tuple):
        return [_json_safe(x) for x in v]
    if isinstance(v, list):
        return [_json_safe(x) for x in v]
    if isinstance(v, dict):
        return {str(k): _json_safe(x) for k, x in v.items()}
    return v


# =========================================================================== entry point
def _preflight(space: SearchSpace) -> None:
    """Errors that would fail every trial, found before the study is touched: the data,
    the model (a zoo spec, built on the meta device), a context the data cannot fill, and
    rules that do not fit the model or match nothing. ``space.rules`` are the rules every
    trial's assignment carries: the space's, or the model's default rule set when the space
    names none (see :mod:`geosearch.search.space`)."""
    from geosearch.modules import get_rule_set, match_parameters
    from geosearch.proxy.data import load_corpus
    from geosearch.proxy.zoo import build_meta_model

    proxy = space.proxy
    corpus = load_corpus(proxy.data)
    built = build_meta_model(proxy.model, vocab_size=corpus.vocab_size, model_args=proxy.model_args)
    corpus.check_block_size(built.block_size)
    rules = get_rule_set(space.rules) if isinstance(space.rules, str) else space.rules
    where = space.source or "the search space"
    try:
        match = match_parameters(built.model, rules)
    except ConfigError as e:  # e.g. nanogpt's nn.Linear rules on hf:gpt2's Conv1D weights
        raise ConfigError(e.problem, source=where, key=e.key, allowed=e.allowed) from None
    if match.empty_rules:
        r = match.empty_rules[0]
        raise ConfigError(f"rule {r.type!r} (pattern {r.pattern!r}) matches no parameter of the "
                          f"{proxy.model!r} model", source=where, key="rules")


def _resolve_budget(space: SearchSpace, exhaustive: bool) -> int | None:
    trials = space.budget.trials
    if exhaustive:
        size = int(space.grid_size())
        return size if trials is None else min(trials, size)
    return trials


def _start_study(space: SearchSpace, run_dir: Path, storage: str | None, workers: int,
                 sampler: optuna.samplers.BaseSampler) -> tuple[optuna.Study, str, bool]:
    backend, desc = open_storage(run_dir, storage, workers=workers)
    existed = space.name in [s.study_name for s in
                             optuna.get_all_study_summaries(backend, include_best_trial=False)]
    study = optuna.create_study(study_name=space.name, storage=backend, sampler=sampler,
                                pruner=space.make_pruner(), direction="minimize",
                                load_if_exists=True)
    if study.direction != optuna.study.StudyDirection.MINIMIZE:
        raise ConfigError(f"study {space.name!r} maximises; geosearch studies minimise the val "
                          "loss", source=desc)
    _check_identity(study, space, run_dir)
    if "space" not in study.user_attrs:
        for k, v in _study_attrs(space).items():
            study.set_user_attr(k, v)
    return study, desc, existed


def run_search(
    space: SearchSpace | str | os.PathLike,
    *,
    runs_dir: str | os.PathLike = "runs",
    storage: str | None = None,
    workers: int = 1,
    worker_index: int | None = None,
    stale_after: float = STALE_AFTER,
    export: bool = True,
    out: TextIO | None = None,
    progress: bool | None = None,
) -> SearchOutcome:
    """Run (or resume) the study of ``space`` and export its best assignment.

    Every setting (study name = ``space.name``, proxy, repeats, budget, pruner, sampler)
    comes from the space: apply command-line flags with
    :func:`~geosearch.search.space.apply_overrides` first. Rerunning with the same space
    resumes the study (see the module docstring for what counts towards the budget).

    Args:
        space: the search space, or its file / shipped name.
        runs_dir: parent of the run directory ``<runs_dir>/<space.name>``.
        storage: an Optuna storage URL or journal file path instead of the run
            directory's own.
        workers: processes on this machine; more than one starts that many worker
            processes (``python -m geosearch search ... --worker-index i``), each on its
            own GPU when there are GPUs, else on a share of the CPU threads; this process
            then only watches and prints.
        worker_index: set in those worker processes (not by users).
        stale_after: seconds without a heartbeat after which a trial of a worker on
            another host is taken as dead (its worker writes one every
            ``min(30, stale_after / 4)`` s). Use the same value on every machine.
        export: write ``best_assignment.yaml`` at the end (not in worker processes).
        out: where progress lines go (default stdout).
        progress: a progress bar on stderr (default: when stderr is a terminal).

    Under ``torchrun`` / ``accelerate launch`` (``WORLD_SIZE`` > 1) every process trains
    each trial on its share of the batch and rank 0 alone runs the study
    (:mod:`geosearch.search.distributed`); ``workers`` must then be 1.

    Returns:
        A :class:`SearchOutcome`.

    Raises:
        ConfigError: bad space, data, storage URL, or a resumed study created with other
            settings; ``workers`` > 1 in a distributed launch.
        GeosearchError: several trials in a row failed (likely a problem every trial has);
            on ranks other than 0: rank 0 stopped with an error.
        KeyboardInterrupt: Ctrl-C; the interrupted trial is failed and queued again.
    """
    if not isinstance(space, SearchSpace):
        space = load_space(space)
    if workers < 1:
        raise ConfigError(f"expected a whole number >= 1, got {workers}", source="--workers")
    if not stale_after > 0:
        raise ConfigError(f"expected a positive number of seconds, got {stale_after}",
                          source="--stale-after")
    world = launch_world()[1]
    if world == 1:
        return _search(space, runs_dir=runs_dir, storage=storage, workers=workers,
                       worker_index=worker_index, stale_after=stale_after, export=export,
                       out=out, progress=progress)

    # Data parallel: checked on every rank before any message, so all stop alike.
    if workers > 1 or worker_index is not None:
        raise ConfigError(
            f"--workers {workers} runs that many one-process trials at once, while this "
            f"distributed launch ({world} processes) runs each trial on all of them: pick one "
            "(drop --workers, or start `geosearch search --workers N` without torchrun/accelerate "
            "launch)", source="--workers")
    if space.proxy.batch_size % world:
        raise ConfigError(f"global batch {space.proxy.batch_size} does not split over the "
                          f"{world} processes of this launch", source=space.source or "search space",
                          key="proxy.batch_size")
    from geosearch.proxy.train import get_accelerator

    group = RankGroup(get_accelerator(space.proxy.device, space.proxy.mixed_precision))
    if group.rank != 0:
        stopped = follow(group, train)
        return SearchOutcome(space.name, Path(runs_dir) / space.name, "the storage of rank 0",
                             stopped, Ranking([], [], "ranked by rank 0"), {}, rank=group.rank)
    try:
        outcome = _search(space, runs_dir=runs_dir, storage=storage, workers=workers,
                          worker_index=None, stale_after=stale_after, export=export, out=out,
                          progress=progress, group=group)
    except Exception as e:
        group.fail(e)  # the other ranks end with the same message
        raise
    group.stop(outcome.stopped)
    return outcome


def _search(space: SearchSpace, *, runs_dir: str | os.PathLike, storage: str | None,
            workers: int, worker_index: int | None, stale_after: float, export: bool,
            out: TextIO | None, progress: bool | None,
            group: RankGroup | None = None) -> SearchOutcome:
    """:func:`run_search` in one process, or on rank 0 of a distributed launch."""
    out = out or sys.stdout

    def echo(line: str) -> None:
        print(line, file=out, flush=True)

    run_dir = Path(runs_dir) / space.name
    exhaustive = space.sampler_type() == "grid"
    budget = _resolve_budget(space, exhaustive)
    seed = space.sampler.seed
    if worker_index is not None:
        seed = None if seed is None else seed + worker_index
        _share_cpu(workers)
    # exhaustive: points come from the queue; the sampler only fills a trial asked for in
    # a race on the last point (and that trial is not run). See the module docstring.
    sampler = optuna.samplers.RandomSampler(seed=seed) if exhaustive else space.make_sampler(seed)

    if worker_index is None:
        _preflight(space)
    study, desc, existed = _start_study(space, run_dir, storage, workers, sampler)
    if worker_index is None:
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / SPACE_FILE).write_text(yaml.safe_dump(space.to_dict(), sort_keys=False),
                                          encoding="utf-8")
        echo(space.summary())
        owner = _Owner(run_dir)
        try:
            for n, why in _recover_stale(study, owner, stale_after):
                echo(_recovered_line(n, why))
        finally:
            owner.close()
        if exhaustive:
            _top_up_queue(study, space, budget)
        done = sum(map(_counted, study.get_trials(deepcopy=False)))
        echo(f"study {space.name!r} in {desc}: "
             + (f"resuming, {done} trials done" if existed else "new")
             + (f", budget {budget} trials" if budget is not None else "")
             + (f", timeout {space.budget.timeout:g} s" if space.budget.timeout else "")
             + (f"; each trial on {group.world} processes (data parallel)" if group else ""))

    bar = _TrialBar(budget, study, enabled=progress if progress is not None else
                    (sys.stderr.isatty() and worker_index is None), echo=echo)
    try:
        if workers > 1 and worker_index is None:
            stopped = _run_workers(space, run_dir, storage, workers, study, bar, echo, stale_after)
            stopped = _done_reason(study, budget, exhaustive, space.grid_size()) or stopped
        else:
            searcher = _Searcher(space, study, run_dir, exhaustive=exhaustive, budget=budget,
                                 stale_after=stale_after, echo=echo, group=group)

            def on_trial(t: FrozenTrial) -> None:
                bar.write(trial_line(t))
                bar.update()

            stopped = searcher.run(space.budget.timeout, on_trial)
    finally:
        bar.close()

    ranking = rank_study(study)
    counts: dict[str, int] = {}
    for t in study.get_trials(deepcopy=False):
        s = trial_status(t)
        counts[s] = counts.get(s, 0) + 1
    outcome = SearchOutcome(space.name, run_dir, desc, stopped, ranking, counts)
    if worker_index is None:
        echo(f"stopped: {stopped}")
        echo(format_ranking(study, ranking))
        if export and ranking.rows:
            outcome.exported = export_best(run_dir, study=study)[0]
            echo(f"best assignment: {outcome.exported}")
    return outcome


def _share_cpu(workers: int) -> None:
    import torch

    torch.set_num_threads(max(1, (os.cpu_count() or 1) // workers))


class _TrialBar:
    """A tqdm bar over counted trials (an Optuna dependency), or plain lines."""

    def __init__(self, budget: int | None, study: optuna.Study, enabled: bool,
                 echo: Callable[[str], None]) -> None:
        self.bar = None
        self.study, self.echo = study, echo
        if enabled:
            from tqdm import tqdm

            done = sum(map(_counted, study.get_trials(deepcopy=False)))
            self.bar = tqdm(total=budget, initial=done, unit="trial", dynamic_ncols=True,
                            file=sys.stderr)

    def write(self, line: str) -> None:
        if self.bar is not None:
            with self.bar.external_write_mode():
                self.echo(line)
        else:
            self.echo(line)

    def update(self) -> None:
        if self.bar is not None:
            done = sum(map(_counted, self.study.get_trials(deepcopy=False)))
            self.bar.update(max(0, done - self.bar.n))

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def format_ranking(study: optuna.Study, ranking: Ranking | None = None) -> str:
    """The ranked table of completed trials, the verdict, and the pruned/failed ones."""
    ranking = ranking or rank_study(study)
    lines = []
    if ranking.rows:
        width = max(len(r.label) for r in ranking.rows)
        lines.append(f"{'rank':>4}  {'trial':>5}  {'assignment':<{width}}  {'val loss':<26}  vs best")
        for r in ranking.rows:
            if r.versus_best == "best":
                vs = "best"
            elif r.versus_best == "unknown":
                vs = f"{r.gap:+.4f} (no spread: can't judge)"
            else:
                vs = (f"{r.gap:+.4f} {'<' if r.versus_best == 'tie' else '>'} noise "
                      f"{r.threshold:.4f}: {'tie' if r.versus_best == 'tie' else 'worse'}")
            lines.append(f"{r.rank:>4}  {r.number:>5}  {r.label:<{width}}  {r.score.text():<26}  {vs}")
    others = [t for t in study.get_trials(deepcopy=False)
              if t.state in (TrialState.PRUNED, TrialState.FAIL) and trial_status(t) not in NOT_RUN]
    if others:
        lines.append("not ranked:")
        lines += ["  " + trial_line(t) for t in others]
    lines.append(f"verdict: {ranking.verdict}")
    return "\n".join(lines)


# =========================================================================== workers
def _run_workers(space: SearchSpace, run_dir: Path, storage: str | None, workers: int,
                 study: optuna.Study, bar: _TrialBar, echo: Callable[[str], None],
                 stale_after: float = STALE_AFTER) -> str:
    """Start ``workers`` processes on the study, print their trials as they finish, wait.

    Ctrl-C is forwarded once to every worker (each fails and re-queues its trial), then
    raised here.
    """
    import torch

    logs = run_dir / "workers"
    logs.mkdir(parents=True, exist_ok=True)
    gpus: list[str] = []
    if space.proxy.device != "cpu" and torch.cuda.is_available():
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        gpus = [g for g in visible.split(",") if g.strip()] if visible else \
            [str(i) for i in range(torch.cuda.device_count())]
    if gpus and workers > len(gpus):
        echo(f"note: {workers} workers share {len(gpus)} GPUs")
    cmd = [sys.executable, "-m", "geosearch", "search", "--space", str(run_dir / SPACE_FILE),
           "--study", space.name, "--runs-dir", str(run_dir.parent), "--workers", str(workers)]
    if storage is not None:
        cmd += ["--storage", storage]
    if stale_after != STALE_AFTER:
        cmd += ["--stale-after", repr(stale_after)]
    procs: list[tuple[int, subprocess.Popen, Path]] = []
    threads = max(1, (os.cpu_count() or 1) // workers)
    for i in range(workers):
        env = dict(os.environ)
        if gpus:
            env["CUDA_VISIBLE_DEVICES"] = gpus[i % len(gpus)]
        else:
            env["OMP_NUM_THREADS"] = str(threads)
        log = logs / f"worker{i}.log"
        with open(log, "w", encoding="utf-8") as f:
            # own session: a terminal's Ctrl-C reaches the parent only, which forwards it once
            p = subprocess.Popen([*cmd, "--worker-index", str(i)], stdout=f, stderr=subprocess.STDOUT,
                                 env=env, start_new_session=True)
        procs.append((i, p, log))
    echo(f"started {workers} workers ({'GPUs ' + ', '.join(gpus[:workers]) if gpus else f'{threads} CPU threads each'}); "
         f"logs in {logs}")

    seen = {t.number for t in study.get_trials(deepcopy=False) if t.state.is_finished()}
    try:
        while True:
            running = [p for _, p, _ in procs if p.poll() is None]
            for t in study.get_trials(deepcopy=False):
                if t.state.is_finished() and t.number not in seen:
                    seen.add(t.number)
                    if trial_status(t) not in NOT_RUN:
                        bar.write(trial_line(t))
                    bar.update()
            if not running:
                break
            time.sleep(0.5)
    except KeyboardInterrupt:
        for _, p, _ in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGINT)
        deadline = time.monotonic() + 60
        for _, p, _ in procs:
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
        raise
    bad = [(i, p.returncode, log) for i, p, log in procs if p.returncode not in (0,)]
    if bad:
        i, code, log = bad[0]
        tail = [ln for ln in log.read_text(encoding="utf-8", errors="replace").splitlines() if ln.strip()]
        raise GeosearchError(f"worker {i} exited with code {code}"
                             + (f": {tail[-1]}" if tail else "") + f" (log: {log})")
    return f"all {workers} workers finished"


# =========================================================================== export
def _export_assignment(study: optuna.Study, row: RankedTrial, ranking: Ranking, run_dir: Path):
    """The Assignment of one ranked trial, with provenance."""
    from geosearch.assignment import Assignment

    trial = next(t for t in study.get_trials(deepcopy=False) if t.number == row.number)
    attrs = study.user_attrs
    suggestion: Suggestion | None = None
    space_dict = attrs.get("space")
    if isinstance(space_dict, dict):
        try:
            space = SearchSpace.from_dict(space_dict, source=f"{run_dir} (study attrs)")
            suggestion = space.suggest(optuna.trial.FixedTrial(dict(trial.params)))
        except (ConfigError, ValueError):
            suggestion = None
    score = row.score
    provenance: dict[str, Any] = {
        "study": study.study_name,
        "run_dir": str(run_dir),
        "trial": row.number,
        "rank": row.rank,
        "score": {"metric": "final validation loss (mean over seeds)", "mean": score.mean,
                  "std": score.std, "n_seeds": score.n, "values": list(score.values),
                  "seeds": trial.user_attrs.get("seeds")},
        "tied_with": [n for n in ranking.tied if n != row.number] if row.number in ranking.tied else [],
        "verdict": ranking.verdict,
        "proxy": attrs.get("proxy"),
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "geosearch_version": __version__,
        "trials": {"completed": len(ranking.rows),
                   "total": sum(map(_counted, study.get_trials(deepcopy=False)))},
    }
    if suggestion is not None:
        if suggestion.train_overrides:
            # global settings an Assignment cannot hold: pass them to build_optimizer
            provenance["build_optimizer_overrides"] = dict(suggestion.train_overrides)
        return suggestion.assignment(provenance)
    geometry = trial.user_attrs.get("assignment") or {}
    return Assignment(geometry=dict(geometry), rules=attrs.get("rules", "nanogpt"),
                      provenance=provenance)


def export_best(
    run_dir: str | os.PathLike,
    out: str | os.PathLike | None = None,
    *,
    top: int = 1,
    study: optuna.Study | None = None,
    study_name: str | None = None,
    storage: str | None = None,
) -> list[Path]:
    """Write the best (or the ``top`` best) assignments of a run as YAML.

    ``top == 1`` writes one file, ``out`` or ``<run_dir>/best_assignment.yaml``. ``top > 1``
    writes one file per rank, ``rank<k>-trial<n>.yaml``, into the directory ``out`` (default
    ``<run_dir>/top``): each loads with :func:`geosearch.load_assignment`. Each file's
    provenance holds the study, proxy, score with its spread, the tie verdict, date and
    geosearch version.

    Raises:
        GeosearchError: no trial completed.
        ConfigError: no study in ``run_dir`` (or ``storage``).
    """
    run_dir = Path(run_dir)
    if top < 1:
        raise ConfigError(f"expected a whole number >= 1, got {top}", source="--top")
    study = study or open_run_study(run_dir, study_name=study_name, storage=storage)
    ranking = rank_study(study)
    if not ranking.rows:
        raise GeosearchError(f"{run_dir}: no trial of study {study.study_name!r} completed, so "
                             "there is nothing to export")
    rows = ranking.rows[:top]
    if top == 1:
        path = Path(out) if out is not None else run_dir / BEST_FILE
        return [_export_assignment(study, rows[0], ranking, run_dir).save(path)]
    folder = Path(out) if out is not None else run_dir / "top"
    return [_export_assignment(study, r, ranking, run_dir).save(folder / f"rank{r.rank}-trial{r.number}.yaml")
            for r in rows]
