"""The trial loop of one process: ask for a trial, guard it, train each rung and seed, tell.

:class:`Searcher` asks the study for a trial, skips it when the budget is taken or it
repeats a scored point, trains the proxy run once per seed at each rung of the Σ η ladder
(the study's plan: :mod:`geosearch.search.space.plan`; one rung unless the space asks for
more), after the stability rung (:mod:`geosearch.search.horizon.stability`), reporting
validation losses, recording probes with their Σ η and asking the pruner at each record,
and tells the study the outcome with its user attrs; a trial's exception fails that
trial, not the search: a failure of the environment (out of memory, CUDA, disk, storage:
:mod:`geosearch.search.study.failures`) queues its point again up to ``max_retries`` times in a
row. Once the space's points are done it trains the baselines and the rounds of adaptive
seeds (:mod:`geosearch.search.study.extras`), which never count. A Ctrl-C fails the trial and
queues its point again (:mod:`geosearch.search.runtime.interrupts` keeps the signal). Trial
outcomes, repeats and the ladder are described in ``docs/design.md`` ("The study").
"""

from __future__ import annotations

import math
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

import optuna
from optuna.trial import FrozenTrial, TrialState

from geosearch.util.errors import GeosearchError
from geosearch.proxy.config import TrainResult
from geosearch.proxy.train import train
from geosearch.search.space.baseline_specs import BASELINES
from geosearch.search.study.baseline_trials import baseline_suggestion
from geosearch.search.runtime.backup import TrialBackup
from geosearch.search.runtime.distributed import RankGroup
from geosearch.search.study.extras import extra_plan, mark_extra, queue_extras, seed_twin_of
from geosearch.search.study.failures import (
    DEFAULT_MAX_RETRIES,
    SETTINGS_FAILURE,
    failed_attrs,
    failure_kind,
    settings_line,
)
from geosearch.search.runtime.interrupts import ctrl_c_latch, sigint_deferred
from geosearch.search.study.failures import recover_stale, recovered_line
from geosearch.search.runtime.liveness import HEARTBEAT_EVERY, Heartbeat, Owner, TrialLost
from geosearch.search.study.queue import (
    budget_taken,
    done_reason,
    enqueue,
    redundant_waiting,
    top_up_queue,
    trial_params,
    twin_of,
)
from geosearch.search.stats.scores import Score
from geosearch.search.records import (
    ASSIGNMENT,
    BASELINE,
    BUDGET_STEPS,
    COMPLETED,
    DUPLICATE,
    DUPLICATE_OF,
    FAIL_REASON,
    FAILURE_KIND,
    HEARTBEAT,
    INTERRUPTED,
    LOGIT_SCALE,
    NUM_PROCESSES,
    PROBE_HISTORY,
    PRUNE_REASON,
    PRUNED_RUNG,
    PRUNED_SEED,
    QUEUED,
    RETRIED,
    RUNG_INDICES,
    RUNNING,
    SEED_OF,
    SEEDS,
    STEP_FACTOR,
    SKIPPED,
    STATUS,
    STOP_STEP,
    TARGET_LOGIT_SCALE,
    TARGET_STEPS,
    TARGET_SUM_ETA,
    TRIAL_DIR,
    PRUNED,
    UNSTABLE,
    VAL_LOSSES,
    WORKER,
    is_extra,
    json_safe,
)
from geosearch.search.study.runs import TrialRuns, run_attrs, store_probes, stopped_attrs
from geosearch.search.space.plan import StudyPlan, plan_study
from geosearch.search.space.spec import SearchSpace, Suggestion
from geosearch.search.runtime.backup import TRIALS_DIR
from geosearch.search.runtime.storage import TRACEBACK_FILE
from geosearch.search.horizon.scale import model_logit_scale
from geosearch.search.horizon.stability import stability_prefix

__all__ = ["MAX_DUPLICATES_IN_A_ROW", "MAX_FAILURES_IN_A_ROW", "Searcher", "StopSearch"]

MAX_FAILURES_IN_A_ROW = 5
"""Failed trials in a row after which the search stops (the problem is not the point)."""
MAX_DUPLICATES_IN_A_ROW = 100
"""Already scored proposals in a row after which the space is taken as exhausted."""


class StopSearch(Exception):
    """Ends the trial loop with a reason (not an error): raised by :meth:`Searcher.run_trial`
    when the space looks exhausted; its message is why the search stopped."""


class Searcher:
    """The trial loop of one process: ask, guard, train each seed, tell.

    Args:
        space: the search space (points, proxy run, seeds).
        study: the study, opened by this process.
        run_dir: ``<runs-dir>/<study>``; trials write into ``trials/<n>/``.
        exhaustive: points come from the queue only (a grid space).
        budget: counted trials to run to, ``None`` for no limit.
        stale_after: seconds without a heartbeat after which another host's trial is dead.
        echo: prints one line.
        group: in a data-parallel launch, the ranks that train each run with this one.
        store_files: called with each trained trial and its folder before its outcome is
            told (:class:`~geosearch.search.runtime.backup.TrialFiles` stores them as artifacts).
        max_retries: times in a row a failure of the environment queues its point again.
        plan: the study's plan (:func:`~geosearch.search.space.plan.plan_study` of ``space``
            when not given).
    """

    def __init__(self, space: SearchSpace, study: optuna.Study, run_dir: Path, *, exhaustive: bool,
                 budget: int | None, stale_after: float, echo: Callable[[str], None],
                 group: RankGroup | None = None,
                 store_files: Callable[[optuna.Trial, Path], None] | None = None,
                 max_retries: int = DEFAULT_MAX_RETRIES, plan: StudyPlan | None = None) -> None:
        self.space, self.study, self.run_dir = space, study, run_dir
        self.exhaustive, self.budget, self.stale_after = exhaustive, budget, stale_after
        self.echo = echo
        self.group = group  # data parallel: the other ranks train each run with this one
        self.store_files = store_files
        self.max_retries = max_retries
        self.grid_size = space.grid_size()
        self.failures_in_a_row = 0
        self.duplicates_in_a_row = 0
        self.drained = False  # the queued twins were announced
        self.owner = Owner(run_dir)
        self.backup = TrialBackup(run_dir, echo)
        self.plan = plan = plan if plan is not None else plan_study(space)
        self.runs = TrialRuns(space, plan, study, run_dir, self._train, self._pruned_by)
        target, proxy = plan.target, space.proxy
        # what the pruner's forecast reads on each trial (geosearch.search.horizon.pruner); the
        # model is built on the meta device once, twice only for another target model
        scale = model_logit_scale(proxy.model, proxy.model_args)
        same = target.model == proxy.model and target.model_args == dict(proxy.model_args)
        self.target_attrs = {
            TARGET_SUM_ETA: target.sum_eta, TARGET_STEPS: target.steps, LOGIT_SCALE: scale,
            TARGET_LOGIT_SCALE: scale if same else model_logit_scale(target.model,
                                                                     target.model_args)}

    # ------------------------------------------------------------------ loop
    def run(self, timeout: float | None, on_trial: Callable[[FrozenTrial], None]) -> str:
        """Run trials until the budget, the space or ``timeout`` (seconds) is used up.

        Args:
            timeout: seconds for this call; ``None`` = no limit.
            on_trial: called with each trial this process trained, once it is told.

        Returns:
            Why the loop stopped, in words.
        """
        start = time.monotonic()
        with ctrl_c_latch():
            try:
                while True:
                    if timeout is not None and time.monotonic() - start >= timeout:
                        return f"timeout of {timeout:g} s reached"
                    why = self._should_stop()
                    if why and not queue_extras(self.study, self.space, self.echo):
                        return why
                    trial = self.owner.ask(self.study)  # one asker of this machine at a time
                    try:
                        number = self.run_trial(trial)
                    except KeyboardInterrupt:
                        self._interrupted(trial)
                        raise
                    except StopSearch as e:
                        return str(e)
                    except (TrialLost, optuna.exceptions.UpdateFinishedTrialError):
                        self.echo(f"trial {trial.number} was taken for dead by another worker (no "
                                  f"heartbeat for {self.stale_after:g} s?), which queued its point "
                                  "again: this worker drops it")
                        continue
                    if number is not None:
                        on_trial(self._frozen(number))
            finally:
                self.owner.close()

    def _should_stop(self) -> str | None:
        for recovered in recover_stale(self.study, self.owner, self.stale_after, self.max_retries):
            self.echo(recovered_line(*recovered))
        why = done_reason(self.study, self.budget, self.exhaustive, self.grid_size)
        if why is not None and self.exhaustive and self.budget is not None:
            # the queue is empty: every point of the grid must have a verdict by now
            added = top_up_queue(self.study, self.space, self.budget)
            if added:
                self.echo(f"{added} point(s) of the grid had no verdict and none queued: queued again")
                why = done_reason(self.study, self.budget, self.exhaustive, self.grid_size)
        if why is not None:
            twins = redundant_waiting(self.study)
            if twins:  # popped and recorded as duplicates before the search stops
                if not self.drained:
                    self.echo(f"{twins} point(s) queued twice (another command queued the "
                              "grid at the same time): recorded as duplicates")
                self.drained = True
                return None
        return why

    def _frozen(self, number: int) -> FrozenTrial:
        return next(t for t in self.study.get_trials(deepcopy=False) if t.number == number)

    # ------------------------------------------------------------------ one trial
    def run_trial(self, trial: optuna.Trial) -> int | None:
        """Guard, train and tell one asked trial; returns its number if it was trained. The seam
        ``objective`` runs a trial through; raises :class:`StopSearch` on a run of duplicates."""
        attrs = trial.user_attrs
        trial.set_user_attr(WORKER, self.owner.attr())
        trial.set_user_attr(HEARTBEAT, time.time())
        if self.exhaustive and not attrs.get(QUEUED):
            self._not_run(trial, SKIPPED, "the queue was empty when this worker asked (another "
                                          "worker took the last point)")
            return None
        if is_extra(trial):
            return self._run_extra(trial)
        suggestion = self.space.suggest(trial)
        # a twin first: a point queued twice (two commands that queued the grid at once) is a
        # duplicate, not a point to queue again once the budget is taken
        twin = twin_of(self.study, trial.number, trial.params)
        if twin is not None:
            self._not_run(trial, DUPLICATE, f"same point as trial {twin}", duplicate_of=twin)
            self.duplicates_in_a_row += 1
            if self.duplicates_in_a_row >= MAX_DUPLICATES_IN_A_ROW:
                raise StopSearch(f"the sampler proposed {MAX_DUPLICATES_IN_A_ROW} already scored "
                                 "points in a row; the space looks exhausted")
            return None
        why = budget_taken(self.study, self.budget, trial.number)
        if why:
            self._not_run(trial, SKIPPED, why, requeue=bool(attrs.get(QUEUED)))
            return None
        self.duplicates_in_a_row = 0
        return self._train_trial(trial, suggestion)

    def _interrupted(self, trial: optuna.Trial, reason: str = "interrupted (Ctrl-C); queued "
                     "again: rerun the same command to resume", kind: str | None = None) -> None:
        """Record a Ctrl-C (or SIGTERM) that landed anywhere between ``ask`` and ``tell``, or
        the run's settings stopping the search (``kind`` ``settings``): fail the trial as
        ``interrupted`` (it does not count, uses up no retry) and queue its point again
        (``retry_of``), so that a rerun trains it. A trial already told, or failed by a
        worker that took it for dead, is left as it is. torchrun sends every rank a second
        SIGINT: it waits until this is stored. The point is queued before the trial is told
        (:meth:`_fail`)."""
        with sigint_deferred():
            if self._frozen(trial.number).state != TrialState.RUNNING:
                return
            try:
                trial.set_user_attr(STATUS, INTERRUPTED)
                if kind is not None:
                    trial.set_user_attr(FAILURE_KIND, kind)
                trial.set_user_attr(FAIL_REASON, reason)
                point = trial_params(trial)
                if point:
                    enqueue(self.study, point, retry_of=trial.number)
                self._tell(trial, TrialState.FAIL)
            except (ValueError, RuntimeError, optuna.exceptions.UpdateFinishedTrialError):
                return  # failed meanwhile by a worker that took it for dead

    def _raised(self, trial: optuna.Trial, error: Exception, trial_dir: Path) -> int:
        """Fail a trial whose runs raised ``error`` (its traceback kept in the trial's
        folder), as :func:`failure_kind` sorts it; a settings error stops the search."""
        message = (str(error) if isinstance(error, GeosearchError)
                   else f"{type(error).__name__}: {error}")
        trial_dir.mkdir(parents=True, exist_ok=True)
        (trial_dir / TRACEBACK_FILE).write_text(traceback.format_exc(), encoding="utf-8")
        kind = failure_kind(error)
        if kind == SETTINGS_FAILURE:  # every trial would fail alike: not this point's failure
            self._stop_on_settings(trial, error)
        return self._fail(trial, message, kind, {})

    def _stop_on_settings(self, trial: optuna.Trial, error: BaseException) -> NoReturn:
        """A run of the trial refused the run's settings (a
        :class:`~geosearch.util.errors.SettingsError`: ``failure_kind`` ``settings``), which every
        trial shares: not the point's failure. The trial is recorded as interrupted and its
        point queued again (:meth:`_interrupted`); the search stops with the error, and the
        rerun with the setting fixed trains the point.

        Raises:
            GeosearchError: the setting's line, and what became of the trial.
        """
        line = settings_line(error, self.space.source or "the search space")
        self._interrupted(trial, f"interrupted: the run's settings fail every trial ({line}); "
                                 "queued again: fix them, then rerun", SETTINGS_FAILURE)
        raise GeosearchError(f"{line}; every trial would fail alike, so the search stops: "
                             f"trial {trial.number} is not counted and its point is queued again; "
                             "fix the setting, then rerun the same command to resume") from None

    def _run_extra(self, trial: optuna.Trial) -> int | None:
        """Train a baseline or an adaptive seed (queued by :func:`queue_extras`): never
        budget-checked, never a duplicate of a point, never Optuna's best; a (point, seed)
        trains once."""
        mark_extra(trial)
        ua = trial.user_attrs
        if ua.get(BASELINE) is not None:
            if ua[BASELINE] not in BASELINES:
                self._not_run(trial, SKIPPED, f"unknown baseline {ua[BASELINE]!r}")
                return None
            factor = ua.get(STEP_FACTOR)  # a step grid's, else None: the proxy's steps
            return self._train_trial(trial, baseline_suggestion(
                self.space, ua[BASELINE], None if factor is None else float(factor)))
        suggestion = self.space.suggest(trial)  # the point's params, fixed when queued
        twin = seed_twin_of(self.study, trial)
        if twin is not None:
            self._not_run(trial, DUPLICATE, f"seed {ua.get(SEEDS)} of trial {ua.get(SEED_OF)} "
                                            f"is trial {twin}'s", duplicate_of=twin)
            return None
        return self._train_trial(trial, suggestion)

    def _plan_of(self, trial: optuna.Trial) -> tuple[list[int], list]:
        """The seeds and rungs ``trial`` trains (:func:`extra_plan`)."""
        return extra_plan(trial, list(self.plan.seeds), self.plan.rungs, halving=self.plan.halving)

    def _not_run(self, trial: optuna.Trial, status: str, why: str, *, requeue: bool = False,
                 duplicate_of: int | None = None) -> None:
        """Fail a trial that is not trained (skipped, a duplicate). With ``requeue``, its
        point is queued again (``retry_of`` this trial) before the trial is told, as
        :meth:`_fail` does, so a process killed in between leaves a queued point, which
        recovery does not queue twice, never a lost one."""
        trial.set_user_attr(STATUS, status)
        trial.set_user_attr(FAIL_REASON, why)
        if duplicate_of is not None:
            trial.set_user_attr(DUPLICATE_OF, duplicate_of)
        params = trial_params(trial)
        if requeue and params:
            enqueue(self.study, params, retry_of=trial.number)
        self._tell(trial, TrialState.FAIL)

    def _train_trial(self, trial: optuna.Trial, suggestion: Suggestion) -> int:
        n, self.loss_pruned = trial.number, False
        resolved = suggestion.assignment().resolve()
        seeds, rungs = self._plan_of(trial)
        trial_dir = self.run_dir / TRIALS_DIR / str(n)
        for key, value in {
            # the reason first: a worker killed between the two writes leaves a reason
            FAIL_REASON: "interrupted before it finished (its worker was killed or crashed); "
                         "rerun the same command to run this point again",
            STATUS: RUNNING,
            ASSIGNMENT: resolved,
            BUDGET_STEPS: self.space.proxy.steps,
            SEEDS: seeds, RUNG_INDICES: [r.index for r in rungs],
            TRIAL_DIR: f"{TRIALS_DIR}/{n}",
            NUM_PROCESSES: self.group.world if self.group else 1,
            **self.target_attrs,
            # a step grid's point trains for the user's run at its own step: Σ η scales with it
            # (the stability rung's η' and its clock scale by themselves: rung_run multiplies
            # the point's step by the rung's factor, and Σ η² ratios do not change)
            TARGET_SUM_ETA: self.target_attrs[TARGET_SUM_ETA] * suggestion.step_factor,
        }.items():
            trial.set_user_attr(key, value)

        heartbeat = Heartbeat(trial, min(HEARTBEAT_EVERY, self.stale_after / 4))
        stability_rows: list[dict] = []  # the stability rung's probes, if it trains
        try:
            with heartbeat:
                args = (trial, suggestion, seeds, rungs, trial_dir, heartbeat, stability_rows)
                stability = self.runs.stability(*args)
                if stability is None or stability.status == "completed":
                    results, probes = self.runs.ladder(*args)
            if heartbeat.lost.is_set():
                raise TrialLost
        except TrialLost:
            raise
        except Exception as e:  # noqa: BLE001 - a trial's error must not end the search
            return self._raised(trial, e, trial_dir)
        if stability is not None and stability.status != "completed":
            return self._stability_stopped(trial, stability, stability_rows)

        last, rung, seed = results[-1][-1], rungs[len(results) - 1], seeds[len(results[-1]) - 1]
        where = ([f"rung {rung.index} (Σ η {rung.sum_eta:.3g})"] if len(rungs) > 1 else []) + (
            [f"seed {seed}"] if len(seeds) > 1 else [])
        prefix = ", ".join(where) + ": " if where else ""
        common = run_attrs(results, probes, stability_rows)
        if last.status == "unstable":
            if len(seeds) > 1:
                common[PRUNED_SEED] = seed
            if len(rungs) > 1:
                common[PRUNED_RUNG] = rung.index
            common[PROBE_HISTORY] = probes[-1][-1]  # the pruned run's
            self._finish(trial, TrialState.PRUNED, {
                STATUS: PRUNED if self.loss_pruned else UNSTABLE, STOP_STEP: last.stop_step,
                PRUNE_REASON: prefix + (last.reason or "unstable"), **common})
            self.failures_in_a_row = 0
            return n
        if last.status == "failed":
            return self._fail(trial, prefix + (last.reason or "failed"), failure_kind(
                last.reason or ""), {STOP_STEP: last.stop_step, **common})
        losses = [r.final_val_loss for r in results[-1]]  # the top rung's
        if any(v is None or not math.isfinite(v) for v in losses):
            self._finish(trial, TrialState.PRUNED, {
                STATUS: UNSTABLE, PRUNE_REASON: "no finite final validation loss", **common})
            return n
        score = Score(tuple(float(v) for v in losses))
        self._finish(trial, TrialState.COMPLETE, {
            STATUS: COMPLETED, VAL_LOSSES: list(score.values), **common}, value=score.mean)
        self.failures_in_a_row = 0
        return n

    def _stability_stopped(self, trial: optuna.Trial, result: TrainResult, rows: list[dict]) -> int:
        """Tell a trial whose stability rung did not complete: unstable at the target (the
        pruner's reason, or a non-finite run), or failed."""
        prefix = stability_prefix(self.plan.stability)
        attrs = stopped_attrs(result, rows)
        if result.status == "failed":
            return self._fail(trial, prefix + (result.reason or "failed"),
                              failure_kind(result.reason or ""), attrs)
        self._finish(trial, TrialState.PRUNED, {
            STATUS: PRUNED if self.loss_pruned else UNSTABLE,
            PRUNE_REASON: prefix + (result.reason or "unstable"), **attrs})
        self.failures_in_a_row = 0
        return trial.number

    def _fail(self, trial: optuna.Trial, message: str, kind: str, attrs: dict[str, Any]) -> int:
        """Fail a trained trial; a failure of the environment with retries left is ``retried``:
        its point is queued again (:func:`~geosearch.search.study.failures.failed_attrs`), before
        the trial is told, so that a process killed in between (torchrun stopping rank 0
        once a peer died) leaves a RUNNING trial whose retry is queued, which the next run
        fails without queueing it twice (:func:`~geosearch.search.study.failures.settle_dead`),
        never a failed trial whose point is lost."""
        attrs = {**failed_attrs(self.study, trial, message, kind, self.max_retries), **attrs}
        params = trial_params(trial)
        if attrs[STATUS] == RETRIED and params:
            enqueue(self.study, params, retry_of=trial.number)
        self._finish(trial, TrialState.FAIL, attrs)
        return self._after_failure(trial.number, message)

    def _after_failure(self, number: int, message: str) -> int:
        self.failures_in_a_row += 1
        if self.failures_in_a_row >= MAX_FAILURES_IN_A_ROW:
            raise GeosearchError(
                f"{MAX_FAILURES_IN_A_ROW} trials in a row failed, the last (trial {number}) with: "
                f"{message}; see {self.run_dir / TRIALS_DIR / str(number)}")
        return number

    def _finish(self, trial: optuna.Trial, state: TrialState, attrs: dict[str, Any], *,
                value: float | None = None) -> None:
        """Write a trained trial's final attrs and tell its outcome; a ``prune_reason`` or
        ``stop_step`` of ``None`` is left out, a ``fail_reason`` clears the placeholder."""
        unset = (PRUNE_REASON, STOP_STEP)  # None: left out
        attrs = {k: v for k, v in attrs.items() if v is not None or k not in unset}
        if state != TrialState.FAIL:
            attrs.setdefault(FAIL_REASON, None)
        trial_dir = self.run_dir / TRIALS_DIR / str(trial.number)
        try:
            store_probes(trial_dir, attrs)  # files, not attrs
            if self.store_files is not None:
                self.store_files(trial, trial_dir)
            for key, v in attrs.items():
                trial.set_user_attr(key, json_safe(v))
            self._tell(trial, state, value)
        except (ValueError, optuna.exceptions.UpdateFinishedTrialError):
            if self._frozen(trial.number).state != TrialState.RUNNING:
                raise TrialLost from None  # failed meanwhile by a worker that took it for dead
            raise

    def _tell(self, trial: optuna.Trial, state: TrialState, value: float | None = None) -> None:
        """Tell the study how ``trial`` ended (``study.optimize``'s objective records it instead).

        A sampler that has run out of points (Optuna's grid and brute-force samplers) calls
        ``study.stop()``, which raises outside ``study.optimize`` once the trial is stored:
        the loop's own stopping rules end the search then. The trial, read back as stored, is
        then copied to ``trials/<n>/trial.json``
        (:class:`~geosearch.search.runtime.backup.TrialBackup`).
        """
        try:
            self.study.tell(trial, value, state=state)
        except RuntimeError as e:
            if "Study.stop" not in str(e):
                raise
        self.backup.save(self.study, [trial.number])  # the trial as stored, for `geosearch recover`

    def _train(self, config: Any, assignment: Any, **kwargs: Any) -> TrainResult:
        """One proxy run: here, or on every rank of a distributed launch."""
        if self.group is not None:
            return self.group.train(train, config, assignment, **kwargs)
        return train(config, assignment, **kwargs)

    def _pruned_by(self, unstable: bool) -> None:
        """Record whether the run's prune was an instability (else a loss pruner's)."""
        self.loss_pruned = not unstable
