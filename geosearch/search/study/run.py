"""Run a geometry search: start or resume the study of a space, run its trials, export the best.

One trial = one point of a :class:`~geosearch.search.space.spec.SearchSpace` (an assignment of
geometries to module types, plus any searched hyperparameters) trained as a short proxy
run, once per seed. :func:`run_search` checks what would fail every trial, opens or
resumes the study in ``<runs-dir>/<study>/`` (a resumed study must measure the same
thing: :mod:`~geosearch.search.study.resume`), queues the points of an exhaustive space, runs
the trials here (:mod:`~geosearch.search.study.trial_loop`), in ``--workers N`` processes
(:mod:`~geosearch.search.runtime.workers`) or data parallel on every rank of a distributed launch
(:mod:`~geosearch.search.runtime.distributed`), prints the ranking and exports the winner
(:mod:`~geosearch.search.study.export`). Optuna's own objects plug in: an ``optuna.Study``, a
storage, a sampler, a pruner, an artifact store for each trial's files
(:mod:`~geosearch.search.runtime.backup`); :mod:`~geosearch.search.study.optimize` offers the same
trial to ``study.optimize``. The run directory, the trial records, outcomes, budget and
liveness rules are described in ``docs/design.md`` ("The study").
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna
import yaml
from optuna.trial import FrozenTrial

from geosearch.util.version import __version__
from geosearch.util.errors import ConfigError, GeosearchError
from geosearch.proxy.accelerator import get_accelerator
from geosearch.proxy.config import check_batch_split
from geosearch.proxy.train import train
from geosearch.proxy.trackers import tracker_lines
from geosearch.search.runtime.backup import TrialFiles, default_store
from geosearch.search.runtime.distributed import RankGroup, follow, launch_world
from geosearch.search.study.export import export_best, format_ranking, where_line
from geosearch.search.study.failures import recover_stale, recovered_line, requeue_failed
from geosearch.search.study.options import SearchOptions
from geosearch.search.runtime.liveness import Owner, check_no_other_run
from geosearch.search.runtime.integrity import backup_error, check_trials
from geosearch.search.runtime.locks import CommandLock, early_lock
from geosearch.search.study.queue import done_count, done_reason, resolve_budget, top_up_queue
from geosearch.search.stats.ranking import Ranking
from geosearch.search.stats.study_ranking import rank_study
from geosearch.search.stats.trials import trial_line
from geosearch.search.records import (DATA_DIGEST, GEOSEARCH_VERSION, NOT_RUN, PROXY, RULES,
                                      SPACE, trial_status)
from geosearch.search.study.resume import data_digest, preflight
from geosearch.search.study.resume import check_data, check_identity
from geosearch.search.space.spec import SearchSpace, apply_overrides, load_space
from geosearch.search.runtime.backup import (
    STUDY_FILE,
    TrialBackup,
    read_study_record,
    read_trial_records,
    save_study_record,
)
from geosearch.search.runtime.storage import (
    SPACE_FILE,
    TRIALS_DIR,
    has_storage,
    open_storage,
    own_file,
    storage_error,
)
from geosearch.search.space.plan import StudyPlan, plan_study
from geosearch.search.study.trial_loop import Searcher
from geosearch.search.runtime.workers import process_count, run_workers, share_cpu

__all__ = ["METRIC_NAME", "SearchOutcome", "bind_study", "run_search", "write_space_file"]

METRIC_NAME = "val_loss"
"""The name of a trial's value (``study.metric_names``): its assignment's mean final
validation loss over the seeds at the ranked rung."""



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


def _study_attrs(space: SearchSpace, digest: dict[str, Any] | None,
                 plan: StudyPlan) -> dict[str, Any]:
    """The study attrs of a new study: its space, version, rules, proxy run, its plan's
    target, rungs and stability rung, and the digest of its data (when given)."""
    d = space.to_dict()
    proxy = dict(d["proxy"])
    proxy.update(repeats=space.repeats, seeds=list(plan.seeds))
    attrs = {SPACE: d, GEOSEARCH_VERSION: __version__, RULES: d["rules"], PROXY: proxy,
             **plan.record()}
    if digest is not None:
        attrs[DATA_DIGEST] = digest
    return attrs


def bind_study(study: optuna.Study, space: SearchSpace, run_dir: Path, source: str,
               digest: dict[str, Any] | None = None, plan: StudyPlan | None = None) -> list[str]:
    """Make ``study`` the study of ``space``: it must minimise and, when it already holds
    a space, measure the same thing on the same data; a new one gets the space's study attrs.

    Args:
        study, space, run_dir: the study, its space and its run directory.
        source: the storage in words, for a message.
        digest: the data's :func:`data_digest`: recorded by a new study, compared on resume
            (:func:`~geosearch.search.study.resume.check_data`); None: neither (a worker).
        plan: the study's plan (:func:`~geosearch.search.space.plan.plan_study` of ``space``
            when not given), recorded by a new study.

    Returns:
        One note per run-time setting (:data:`RUN_TIME_KEYS`) that differs from the study's.

    Raises:
        ConfigError: the study maximises, or was created with other settings or on data
            whose contents have changed since.
    """
    if study.direction != optuna.study.StudyDirection.MINIMIZE:
        raise ConfigError(f"study {study.study_name!r} maximises; geosearch studies minimise the val "
                          "loss", source=source)
    notes = check_identity(study, space, run_dir) + check_data(study, digest, run_dir)
    new = SPACE not in study.user_attrs
    if new:
        for k, v in _study_attrs(space, digest, plan or plan_study(space)).items():
            study.set_user_attr(k, v)
    if study.metric_names is None:  # the dashboard and `optuna` CLI name the value by it
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            study.set_metric_names([METRIC_NAME])
    try:  # the backup `geosearch recover` rebuilds a damaged storage from
        save_study_record(run_dir, study, new=new)
    except OSError as e:
        notes.append(f"warning: the study's backup {run_dir / STUDY_FILE} was not written "
                     f"({e.strerror or e}); `geosearch recover` needs it")
    return notes


def write_space_file(space: SearchSpace, run_dir: Path) -> None:
    """Write the resolved space the study runs to ``<run_dir>/space.yaml``."""
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / SPACE_FILE).write_text(yaml.safe_dump(space.to_dict(), sort_keys=False),
                                      encoding="utf-8")


def _start_study(space: SearchSpace, plan: StudyPlan, run_dir: Path,
                 sampler: optuna.samplers.BaseSampler, options: SearchOptions) -> tuple[optuna.Study, str, bool, list[str]]:
    """Create or load the study of ``space`` (or take the given one, with the given sampler
    and pruner if any): ``(study, storage in words, whether it existed, notes on its changed
    run-time settings)``. A command (not a worker) hashes the data first (:func:`data_digest`)."""
    digest = data_digest(space) if options.worker_index is None else None
    pruner = options.pruner
    own = run_dir if options.study is None and options.storage is None else None
    if options.study is not None:
        study, desc = options.study, "the given study's storage"
        existed = SPACE in study.user_attrs or bool(study.get_trials(deepcopy=False))
        if options.sampler is not None:
            study.sampler = options.sampler
        if pruner is not None:
            study.pruner = pruner
    else:
        storage = options.storage
        if isinstance(storage, optuna.storages.BaseStorage):
            backend, desc = storage, f"the given {type(storage).__name__}"
        else:
            backend, desc = open_storage(run_dir, storage, workers=options.workers)
        try:
            existed = space.name in [s.study_name for s in
                                     optuna.get_all_study_summaries(backend, include_best_trial=False)]
        except Exception as e:  # noqa: BLE001 - a damaged file fails in many ways
            raise storage_error(e, desc, own) from None
        if not existed and options.worker_index is None:
            _check_no_backup(run_dir, space.name, desc if own is None else own_file(run_dir))
        try:
            study = optuna.create_study(study_name=space.name, storage=backend, sampler=sampler,
                                        pruner=pruner or space.make_pruner(), direction="minimize",
                                        load_if_exists=True)
        except Exception as e:  # noqa: BLE001
            raise storage_error(e, desc, own) from None
    try:
        notes = bind_study(study, space, run_dir, desc, digest, plan)
        check = check_trials(run_dir, study) if options.worker_index is None else None  # all trials
    except GeosearchError:
        raise
    except Exception as e:  # noqa: BLE001 - a damaged file fails in many ways
        raise storage_error(e, desc, own) from None
    if check:
        raise backup_error(run_dir, desc if own is None else own_file(run_dir), check)
    return study, desc, existed, notes


def _check_no_backup(run_dir: Path, name: str, desc: str) -> None:
    """Refuse to create study ``name`` in a run directory whose backup records finished
    trials of a study of that name: its storage lost the study (a damaged or emptied file),
    and new trials would write over the old ones' folders."""
    try:
        record = read_study_record(run_dir)
    except ConfigError:
        return
    if record is None or record.name != name:
        return
    recorded, _ = read_trial_records(run_dir, record)
    if recorded:
        raise ConfigError(
            f"{desc} holds no study {name!r}, but this run directory's backup records "
            f"{len(recorded)} finished trials of it: `geosearch recover {run_dir}` rebuilds the "
            f"study from it (to start a new study here instead, move {STUDY_FILE} and "
            f"{TRIALS_DIR}/ aside)", source=str(run_dir))


def run_search(space: SearchSpace | str | os.PathLike, options: SearchOptions | None = None,
               /, **fields: Any) -> SearchOutcome:
    """Run (or resume) the study of ``space`` and export its best assignment.

    Every setting (study name = ``space.name``, proxy, repeats, budget, pruner, sampler)
    comes from the space, unless given as an Optuna object below: apply command-line flags with
    :func:`~geosearch.search.space.spec.apply_overrides` first. Rerunning with the same space
    resumes the study (``docs/design.md`` says what counts towards the budget).

    Args:
        space: the search space, or its file / shipped name.
        options: how to run it (:class:`~geosearch.search.study.options.SearchOptions`);
            or its fields as keywords (``run_search(space, runs_dir="runs", workers=2)``):
        runs_dir: parent of the run directory ``<runs_dir>/<space.name>``.
        storage: an Optuna storage URL, a journal file path or an
            ``optuna.storages.BaseStorage`` instead of the run directory's own.
        workers: processes on this machine, at most its cores (GPUs: one each;
            :func:`~geosearch.search.runtime.workers.cap_workers` says a cut in a line);
            more than one starts worker processes (``python -m geosearch search ...
            --worker-index i``), each on a GPU or a share of the CPU threads, this process
            only watching. ``None``: :func:`~geosearch.search.runtime.workers.auto_workers`.
        worker_index: set in those worker processes (not by users).
        stale_after: seconds without a heartbeat after which a trial of a worker on
            another host is taken as dead (its worker writes one every
            ``min(30, stale_after / 4)`` s). Use the same value on every machine.
        export: write ``best_assignment.yaml`` at the end (not in worker processes).
        out: where progress lines go (default stdout).
        progress: a progress bar on stderr (default: when stderr is a terminal).
        study: run this ``optuna.Study`` (its storage, name, sampler and pruner) instead
            of the space's; the run directory is ``<runs_dir>/<study.study_name>``. It
            must minimise; a study holding another space's trials is refused.
        sampler: an Optuna sampler instead of the space's; it proposes every point (a
            grid space's points are then not queued).
        pruner: an Optuna pruner instead of the space's ``LogitGrowthPruner`` (wrap a
            loss pruner in ``LogitGrowthPruner(loss_pruner=...)`` to keep the logit checks).
        artifact_store: where each trial's files go as Optuna artifacts (default: an
            ``optuna.artifacts.FileSystemArtifactStore`` in ``<run_dir>/artifacts``).
        max_retries: times in a row a trial that failed because of its environment (out
            of memory, CUDA, disk, storage: :mod:`~geosearch.search.study.failures`) runs its
            point again; it counts towards the budget only once it stays failed.
        retry_failed: first queue the study's failed points again, once each.
        threads: torch threads here and in each worker (``--threads``; default: a share).

    Objects (a study, a storage object, a sampler, a pruner, an artifact store) live in
    this process: with ``workers`` > 1 pass a storage URL and the space's settings instead.

    Under ``torchrun`` / ``accelerate launch`` (``WORLD_SIZE`` > 1) every process trains
    each trial on its share of the batch and rank 0 alone runs the study
    (:mod:`geosearch.search.runtime.distributed`); ``workers`` must then be 1.

    Returns:
        A :class:`SearchOutcome`.

    Raises:
        ConfigError: bad space, data, storage URL, or a resumed study created with other
            settings; ``workers`` > 1 in a distributed launch or with Optuna objects; both
            ``study`` and ``storage``; a ``study`` that maximises.
        GeosearchError: several trials in a row failed (likely a problem every trial has);
            on ranks other than 0: rank 0 stopped with an error.
        KeyboardInterrupt: Ctrl-C; the interrupted trial is failed and queued again.
    """
    if not isinstance(space, SearchSpace):
        space = load_space(space)
    options = dataclasses.replace(options or SearchOptions(), **fields)
    options.check()
    workers, worker_index = options.workers, options.worker_index
    if options.study is not None:
        space = apply_overrides(space, name=options.study.study_name)
    world = launch_world()[1]
    if world == 1:
        return _search(space, options)

    # Data parallel: checked on every rank before any message, so all stop alike.
    if (workers or 1) > 1 or worker_index is not None:
        raise ConfigError(
            f"--workers {workers} runs that many one-process trials at once, while this "
            f"distributed launch ({world} processes) runs each trial on all of them: pick one "
            "(drop --workers, or start `geosearch search --workers N` without torchrun/accelerate "
            "launch)", source="--workers")
    check_batch_split(space.proxy.batch_size, space.proxy.grad_accum, world,
                      source=space.source or "search space", prefix="proxy.")
    group = RankGroup(get_accelerator(space.proxy.device, space.proxy.mixed_precision))
    if group.rank != 0:
        stopped = follow(group, train)
        return SearchOutcome(space.name, Path(options.runs_dir) / space.name, "the storage of rank 0",
                             stopped, Ranking([], [], "ranked by rank 0"), {}, rank=group.rank)
    try:
        outcome = _search(space, options, group)
    except Exception as e:
        group.fail(e)  # the other ranks end with the same message
        raise
    group.stop(outcome.stopped)
    return outcome


def _processes(space: SearchSpace, options: SearchOptions, run_dir: Path, points: int | None,
               group: RankGroup | None) -> tuple[int, str | None]:
    """How many processes run the search, and the line that says why (or ``None``)."""
    local = group is None and not (options.study or options.sampler or options.pruner
                                   or options.artifact_store)
    return process_count(space, run_dir, options.storage, options.workers, points,
                         threads=options.threads, auto=local,
                         cap=options.worker_index is None and group is None)


def _search(space: SearchSpace, options: SearchOptions, group: RankGroup | None = None) -> SearchOutcome:
    """:func:`run_search` in one process, or on rank 0 of a distributed launch. A command
    (not one of its workers) checks what would fail every trial first, then holds the
    study's :class:`~geosearch.search.runtime.locks.CommandLock` (``early_lock``: from before
    a new storage is created, else from when it opened: a bad one writes nothing) to its end."""
    out = options.out or sys.stdout
    workers, worker_index = options.workers, options.worker_index

    def echo(line: str) -> None:
        print(line, file=out, flush=True)

    run_dir = Path(options.runs_dir) / space.name
    if worker_index is None:  # its command holds the lock
        check_no_other_run(run_dir, space.name, echo)  # at once, before the preflight's work
        preflight(space, group.world if group is not None else 1, echo)  # before the storage opens
    plan = plan_study(space)
    exhaustive = options.sampler is None and space.sampler_type() == "grid"
    budget = resolve_budget(space, exhaustive)
    workers, note = _processes(space, options, run_dir, budget if exhaustive else None, group)
    options = dataclasses.replace(options, workers=workers)
    if worker_index is not None:
        share_cpu(workers, options.threads)
    with contextlib.ExitStack() as held:
        new = not (options.study or options.storage or has_storage(run_dir))  # one creates it
        lock = None if worker_index is not None else early_lock(held, run_dir, space.name, new)
        study, desc, existed, notes = _start_study(space, plan, run_dir,
                                                   _sampler(space, options, exhaustive), options)
        if worker_index is None:
            lock = lock or held.enter_context(CommandLock(run_dir, space.name))  # of two, one runs
            check_no_other_run(run_dir, space.name, echo)  # workers of a dead command stopping
            _prepare(study, space, plan, options, run_dir, notes, echo)
            if exhaustive:
                top_up_queue(study, space, budget)
            _retry_failed(study, options, echo)
            done = done_count(study)
            echo(f"study {space.name!r} in {desc}: "
                 + (f"resuming, {done} trials done" if existed else "new")
                 + (f", budget {budget} trials" if budget is not None else "")
                 + (f", timeout {space.budget.timeout:g} s" if space.budget.timeout else "")
                 + (f"; each trial on {group.world} processes (data parallel)" if group else ""))
            if note is not None:
                echo(note)

        bar = _TrialBar(budget, study, enabled=options.progress if options.progress is not None else
                        (sys.stderr.isatty() and worker_index is None), echo=echo)

        proxy = space.to_dict()["proxy"]  # as the study records it: a step grid's steps in words

        def on_trial(t: FrozenTrial) -> None:
            if trial_status(t) not in NOT_RUN:
                bar.write(trial_line(t, proxy))
            bar.update()

        try:
            if workers > 1 and worker_index is None:
                stopped = run_workers(space, run_dir, options.storage, workers, study, on_trial,
                                      echo, options.stale_after, max_retries=options.max_retries,
                                      threads=options.threads)
                stopped = done_reason(study, budget, exhaustive, space.grid_size()) or stopped
            else:
                store = options.artifact_store or default_store(run_dir)
                searcher = Searcher(space, study, run_dir, exhaustive=exhaustive, budget=budget,
                                    stale_after=options.stale_after, echo=echo, group=group,
                                    store_files=TrialFiles(store, echo), plan=plan,
                                    max_retries=options.max_retries)
                stopped = searcher.run(space.budget.timeout, on_trial)
        finally:
            bar.close()
        outcome = SearchOutcome(space.name, run_dir, desc, stopped, rank_study(study),
                                _status_counts(study))
        return _conclude(study, options, outcome, echo)


def _sampler(space: SearchSpace, options: SearchOptions, exhaustive: bool) -> optuna.samplers.BaseSampler:
    """The given sampler, else the space's (a worker's seed offset by its index). Exhaustive:
    points come from the queue; the sampler only fills a trial asked for in a race on the
    last point (and that trial is not run). See docs/design.md."""
    seed = space.sampler.seed
    if options.worker_index is not None:
        seed = None if seed is None else seed + options.worker_index
    if options.sampler is not None:
        return options.sampler
    return optuna.samplers.RandomSampler(seed=seed) if exhaustive else space.make_sampler(seed)


def _prepare(study: optuna.Study, space: SearchSpace, plan: StudyPlan, options: SearchOptions,
             run_dir: Path, notes: list[str], echo: Callable[[str], None]) -> None:
    """A command's start: write ``space.yaml``, print the space and the notes, recover the
    trials of dead workers, back up the finished trials that have no ``trial.json`` yet."""
    write_space_file(space, run_dir)
    echo(space.summary(plan.header_lines()))
    for note in notes + tracker_lines(space.proxy.log_with, run_dir / TRIALS_DIR,
                                      project=study.study_name, store_dir=run_dir):
        echo(note)  # the notes, then one line per tracker
    owner = Owner(run_dir)
    try:
        for recovered in recover_stale(study, owner, options.stale_after, options.max_retries):
            echo(recovered_line(*recovered))
    finally:
        owner.close()
    TrialBackup(run_dir, echo).sync(study)  # trials told without a record (a full disk)


def _retry_failed(study: optuna.Study, options: SearchOptions, echo: Callable[[str], None]) -> None:
    """``--retry-failed``: queue the failed points again, once each, and say which."""
    if not options.retry_failed:
        return
    again = requeue_failed(study)
    echo(f"--retry-failed: the points of failed trials {', '.join(map(str, again))} are "
         "queued again" if again else "--retry-failed: no failed point to queue again")


def _status_counts(study: optuna.Study) -> dict[str, int]:
    """Trials per ``status`` word, in the order the statuses first occur."""
    counts: dict[str, int] = {}
    for t in study.get_trials(deepcopy=False):
        s = trial_status(t)
        counts[s] = counts.get(s, 0) + 1
    return counts


def _conclude(study: optuna.Study, options: SearchOptions, outcome: SearchOutcome,
              echo: Callable[[str], None]) -> SearchOutcome:
    """A command's end: print why it stopped and the ranking, export the best assignment."""
    if options.worker_index is None:
        echo(f"stopped: {outcome.stopped}")
        echo(format_ranking(study, outcome.ranking, outcome.run_dir))
        if options.export and outcome.ranking.rows:
            outcome.exported = export_best(outcome.run_dir, study=study)[0]
            echo(where_line(outcome.exported))
    return outcome


class _TrialBar:
    """A tqdm bar over counted trials (an Optuna dependency), or plain lines."""

    def __init__(self, budget: int | None, study: optuna.Study, enabled: bool,
                 echo: Callable[[str], None]) -> None:
        self.bar = None
        self.study, self.echo = study, echo
        if enabled:
            from tqdm import tqdm

            self.bar = tqdm(total=budget, initial=done_count(study), unit="trial",
                            dynamic_ncols=True, file=sys.stderr)

    def write(self, line: str) -> None:
        if self.bar is not None:
            with self.bar.external_write_mode():
                self.echo(line)
        else:
            self.echo(line)

    def update(self) -> None:
        if self.bar is not None:
            self.bar.update(max(0, done_count(self.study) - self.bar.n))

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
