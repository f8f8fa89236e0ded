"""The Optuna side of geosearch: search spaces, the logit-growth pruner, the study.

Example:
    >>> import optuna
    >>> from geosearch.search import load_space
    >>> space = load_space("default")
    >>> study = optuna.create_study(sampler=space.make_sampler(), pruner=space.make_pruner())
"""

from geosearch.search.pruners import LogitGrowthPruner
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

__all__ = [
    "Budget",
    "Hyperparams",
    "LogRange",
    "LogitGrowthPruner",
    "LossPrunerSpec",
    "PrunerSpec",
    "SamplerSpec",
    "SearchSpace",
    "SearchSpaceError",
    "Suggestion",
    "apply_overrides",
    "load_space",
    "space_names",
]
