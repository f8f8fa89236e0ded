"""The Optuna side of geosearch: search spaces, the logit-growth pruner, the study.

Example:
    >>> import optuna
    >>> from geosearch.search import load_space
    >>> space = load_space("default")
    >>> study = optuna.create_study(sampler=space.make_sampler(), pruner=space.make_pruner())

``run_search`` lives in :mod:`geosearch.search.study` and ``objective`` (for
``study.optimize``) in :mod:`geosearch.search.optimize`; both import the proxy trainer
(and so torch): they are imported on first use, so that reading a space, ranking or exporting
a study stays light. The study's rooms (storage, records, liveness, queue, trial loop,
workers, export) are listed in ``docs/design.md`` ("The study").
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from geosearch.search.export import export_best
from geosearch.search.pruners import LogitGrowthPruner
from geosearch.search.ranking import Ranking, Score, rank_study
from geosearch.search.space import (
    Budget,
    Hyperparams,
    LogRange,
    LossPrunerSpec,
    PrunerSpec,
    SamplerSpec,
    SearchSpace,
    SearchSpaceError,
    Suggestion,
    apply_overrides,
    load_space,
    space_names,
)
from geosearch.search.storage import open_run_study

_LAZY = {"run_search": "geosearch.search.study", "objective": "geosearch.search.optimize"}

__all__ = [
    "Budget",
    "Hyperparams",
    "LogRange",
    "LogitGrowthPruner",
    "LossPrunerSpec",
    "PrunerSpec",
    "Ranking",
    "SamplerSpec",
    "Score",
    "SearchSpace",
    "SearchSpaceError",
    "Suggestion",
    "apply_overrides",
    "export_best",
    "load_space",
    "objective",
    "open_run_study",
    "rank_study",
    "run_search",
    "space_names",
]


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'geosearch.search' has no attribute {name!r}")


if TYPE_CHECKING:  # pragma: no cover
    from geosearch.search.optimize import objective
    from geosearch.search.study import run_search
