"""The search's trial as an Optuna objective, for ``study.optimize``.

``geosearch.objective(space)`` returns a callable that runs one trial of the space exactly
as :func:`~geosearch.search.study.run.run_search` does (the trial loop's
:class:`~geosearch.search.study.trial_loop.Searcher`: one proxy run per seed, reports, probes,
pruning, the same user attrs, the trial's files in ``<runs_dir>/<study>/trials/<n>/`` and
as Optuna artifacts), but leaves asking and telling to Optuna: a completed trial returns
its mean final validation loss, an unstable one raises ``optuna.TrialPruned`` with the
prune reason, and a failed one (or a point already scored, which is not trained again)
returns NaN, which Optuna records as a failed trial. As in the search, a Ctrl-C queues the
trial's point again, and five failures in a row end the optimisation with an error.
"""

from __future__ import annotations

import math
import os
import sys
import threading
import weakref
from collections.abc import Callable
from pathlib import Path

import optuna
from optuna.trial import TrialState

from geosearch.util.errors import GeosearchError
from geosearch.search.runtime.backup import ArtifactStore, TrialFiles, default_store
from geosearch.search.runtime.liveness import STALE_AFTER
from geosearch.search.study.queue import done_reason
from geosearch.search.records import FAIL_REASON, PRUNE_REASON
from geosearch.search.space.spec import SearchSpace, apply_overrides, load_space
from geosearch.search.study.resume import data_digest, preflight
from geosearch.search.study.run import bind_study, write_space_file
from geosearch.search.study.trial_loop import Searcher, StopSearch

__all__ = ["Objective", "objective"]


def objective(space: SearchSpace | str | os.PathLike, *, runs_dir: str | os.PathLike = "runs",
              artifact_store: ArtifactStore | None = None,
              echo: Callable[[str], None] | None = None) -> Objective:
    """An objective for ``study.optimize`` that trains one point of ``space`` per trial.

    Args:
        space: the search space, or its file / shipped name. Its proxy run, seeds and
            searched hyperparameters are used; the sampler, pruner and trial budget are
            the study's and ``optimize``'s.
        runs_dir: trials write into ``<runs_dir>/<study name>/trials/<n>/``.
        artifact_store: where each trial's files go as Optuna artifacts (default:
            ``FileSystemArtifactStore`` in ``<runs_dir>/<study name>/artifacts``).
        echo: prints a line about a trial that was not trained or failed (default: stderr).

    Returns:
        An :class:`Objective`.

    Example:
        >>> import optuna, geosearch
        >>> space = geosearch.search.load_space("default")
        >>> study = optuna.create_study(study_name="mine", sampler=space.make_sampler(),
        ...                             pruner=space.make_pruner())
        >>> study.optimize(geosearch.objective(space), n_trials=4)  # doctest: +SKIP
    """
    if not isinstance(space, SearchSpace):
        space = load_space(space)
    return Objective(space, Path(runs_dir), artifact_store, echo or _stderr)


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


class Objective:
    """``objective(trial) -> float``: one trial of a space, as the search trains it.

    The first trial of each study checks the space (data, model, rules), records it on
    the study (a study holding another space's trials is refused, as a resumed search
    would be) and writes ``space.yaml`` to the study's run directory.

    Args:
        space: the search space.
        runs_dir: the parent of each study's run directory.
        artifact_store: the store of the trials' files, ``None`` for each run directory's own.
        echo: prints one line.
    """

    def __init__(self, space: SearchSpace, runs_dir: Path, artifact_store: ArtifactStore | None,
                 echo: Callable[[str], None]) -> None:
        self.space, self.runs_dir, self.echo = space, runs_dir, echo
        self.artifact_store = artifact_store
        self._searchers: dict[str, _OptimizeSearcher] = {}
        self._lock = threading.Lock()  # study.optimize(n_jobs=...) calls from several threads
        self._checked = False

    def __call__(self, trial: optuna.Trial) -> float:
        searcher = self._searcher(trial.study)
        try:
            number = searcher.run_trial(trial)
        except StopSearch as e:
            raise GeosearchError(str(e)) from None
        state, value = searcher.outcomes.pop(trial.number, (TrialState.FAIL, None))
        attrs = trial.user_attrs
        if number is not None and state == TrialState.COMPLETE and value is not None:
            return value
        if state == TrialState.PRUNED:
            raise optuna.TrialPruned(attrs.get(PRUNE_REASON) or "unstable")
        if number is None:  # not trained: a point already scored
            self.echo(f"trial {trial.number} not run: {attrs.get(FAIL_REASON)}")
            self._stop_when_done(searcher)
        else:
            self.echo(f"trial {trial.number} failed: {attrs.get(FAIL_REASON)} "
                      f"(see {searcher.run_dir / 'trials' / str(trial.number)})")
        return math.nan

    def _searcher(self, study: optuna.Study) -> _OptimizeSearcher:
        """The trial loop of ``study``, set up on its first trial."""
        with self._lock:
            searcher = self._searchers.get(study.study_name)
            if searcher is not None:
                return searcher
            if not self._checked:
                preflight(self.space)
                self._checked = True
            space = apply_overrides(self.space, name=study.study_name)
            run_dir = self.runs_dir / space.name
            for note in bind_study(study, space, run_dir, source=f"study {study.study_name!r}",
                                   digest=data_digest(space)):
                self.echo(note)
            write_space_file(space, run_dir)
            store = self.artifact_store or default_store(run_dir)
            searcher = _OptimizeSearcher(space, study, run_dir, exhaustive=False, budget=None,
                                         stale_after=STALE_AFTER, echo=self.echo,
                                         store_files=TrialFiles(store, self.echo))
            self._searchers[study.study_name] = searcher
            return searcher

    def _stop_when_done(self, searcher: _OptimizeSearcher) -> None:
        """Stop ``study.optimize`` once every point of a finite space has been scored."""
        why = done_reason(searcher.study, None, False, searcher.grid_size)
        if why is None:
            return
        self.echo(f"stopping: {why}")
        try:
            searcher.study.stop()
        except RuntimeError:  # called outside study.optimize (ask-and-tell by hand)
            pass


class _OptimizeSearcher(Searcher):
    """The trial loop's trial, with the outcome recorded for Optuna to tell."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.outcomes: dict[int, tuple[TrialState, float | None]] = {}
        weakref.finalize(self, self.owner.close)  # the search's loop closes it when it ends

    def _tell(self, trial: optuna.Trial, state: TrialState, value: float | None = None) -> None:
        self.outcomes[trial.number] = (state, value)
