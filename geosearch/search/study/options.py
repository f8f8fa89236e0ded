"""How :func:`~geosearch.search.study.run.run_search` runs a study: where, on what storage,
in how many processes, and the Optuna objects handed in (``None``: the space's own).

Everything about *what* is searched lives in the space; these are the run-time settings
that may change between runs of one study (``docs/design.md``, "The study").
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TextIO

import optuna

from geosearch.util.checks import is_int, is_positive, shown
from geosearch.util.errors import ConfigError
from geosearch.search.runtime.backup import ArtifactStore
from geosearch.search.runtime.rdb import in_memory
from geosearch.search.runtime.liveness import STALE_AFTER
from geosearch.search.study.failures import DEFAULT_MAX_RETRIES

__all__ = ["SearchOptions"]


@dataclass(frozen=True)
class SearchOptions:
    """The run-time options of :func:`~geosearch.search.study.run.run_search` (its
    docstring says what each one does). :meth:`check` raises on a bad value or on objects
    that do not go together."""

    runs_dir: str | os.PathLike = "runs"
    storage: str | optuna.storages.BaseStorage | None = None
    workers: int | None = 1
    worker_index: int | None = None
    stale_after: float = STALE_AFTER
    export: bool = True
    out: TextIO | None = None
    progress: bool | None = None
    study: optuna.Study | None = None
    sampler: optuna.samplers.BaseSampler | None = None
    pruner: optuna.pruners.BasePruner | None = None
    artifact_store: ArtifactStore | None = None
    max_retries: int = DEFAULT_MAX_RETRIES
    retry_failed: bool = False
    threads: int | None = None

    def check(self) -> None:
        """Raise a :class:`~geosearch.util.errors.ConfigError` naming the flag or argument at
        fault: a bad number, both a study and a storage, or process-local objects with
        ``workers`` > 1."""
        if self.workers is not None and self.workers < 1:
            raise ConfigError(f"expected a whole number >= 1, got {self.workers}", source="--workers")
        if self.threads is not None and (not is_int(self.threads) or self.threads < 1):
            raise ConfigError(f"expected a whole number >= 1, got {self.threads!r}",
                              source="--threads")
        retries = self.max_retries
        if not is_int(retries) or retries < 0:
            raise ConfigError(f"expected a whole number >= 0, got {retries!r}", source="--max-retries")
        if not is_positive(self.stale_after):  # NaN and inf too: a trial never taken for dead
            raise ConfigError(f"expected a positive number of seconds, got {self.stale_after}",
                              source="--stale-after")
        if isinstance(self.storage, str) and in_memory(self.storage):
            raise ConfigError(f"{shown(self.storage)} is a database in memory, lost when this "
                              "process ends (and unseen by workers): a search would train and "
                              "keep nothing; name a file (sqlite:///runs/study.db) or a server",
                              source="--storage")
        if self.study is not None and self.storage is not None:
            raise ConfigError("pass either a study (which has its storage) or a storage, not both",
                              source="run_search", key="storage")
        given = {"study": self.study, "sampler": self.sampler, "pruner": self.pruner,
                 "artifact_store": self.artifact_store,
                 "storage": None if isinstance(self.storage, str) else self.storage}
        named = [k for k, v in given.items() if v is not None]
        if (self.workers or 1) > 1 and named:
            raise ConfigError(f"{named[0]}= is an object of this process, which the {self.workers} "
                              "worker processes cannot share; with workers > 1 pass a storage URL and "
                              "put the sampler and pruner in the search space",
                              source="run_search", key=named[0])
