"""The Optuna side of geosearch, in rooms of one job each (``docs/design.md``, "Layers").

- :mod:`geosearch.search.records`: the names of the attrs a study writes (the vocabulary).
- :mod:`geosearch.search.stats`: scores, paired tests, main effects, the ranking, the seed plan.
- :mod:`geosearch.search.horizon`: Σ η, the ladder, the forecast, the logit-growth pruner,
  stability at the target.
- :mod:`geosearch.search.space`: the search-space file (space, schema, sections).
- :mod:`geosearch.search.runtime`: storage, journal, locks, heartbeats, interrupts, workers.
- :mod:`geosearch.search.study`: the study itself (run, ask → tell loop, queue, export).

Example:
    >>> import optuna
    >>> from geosearch.search import load_space
    >>> space = load_space("default")
    >>> study = optuna.create_study(sampler=space.make_sampler(), pruner=space.make_pruner())

Every name below is imported on first use, so importing a room (the statistics, say) loads
neither Optuna's storages nor torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from geosearch.util.lazy import lazy_getattr

_EXPORTS = {
    "Budget": "geosearch.search.space.sections",
    "Hyperparams": "geosearch.search.space.sections",
    "LogRange": "geosearch.search.space.sections",
    "LogitGrowthPruner": "geosearch.search.horizon.pruner",
    "LossPrunerSpec": "geosearch.search.space.sections",
    "PrunerSpec": "geosearch.search.space.sections",
    "Ranking": "geosearch.search.stats.ranking",
    "SamplerSpec": "geosearch.search.space.sections",
    "Score": "geosearch.search.stats.scores",
    "SearchSpace": "geosearch.search.space.spec",
    "SearchSpaceError": "geosearch.search.space.reader",
    "Suggestion": "geosearch.search.space.spec",
    "apply_overrides": "geosearch.search.space.spec",
    "export_best": "geosearch.search.study.export",
    "load_space": "geosearch.search.space.spec",
    "objective": "geosearch.search.study.optimize",
    "open_run_study": "geosearch.search.runtime.storage",
    "rank_study": "geosearch.search.stats.study_ranking",
    "run_search": "geosearch.search.study.run",
    "space_names": "geosearch.search.space.spec",
}

__all__ = sorted(_EXPORTS)

__getattr__ = lazy_getattr(__name__, _EXPORTS)


if TYPE_CHECKING:  # pragma: no cover
    from geosearch.search.horizon.pruner import LogitGrowthPruner
    from geosearch.search.runtime.storage import open_run_study
    from geosearch.search.space.sections import Budget, Hyperparams, LogRange, LossPrunerSpec, PrunerSpec, SamplerSpec
    from geosearch.search.space.reader import SearchSpaceError
    from geosearch.search.space.spec import SearchSpace, Suggestion, apply_overrides, load_space, space_names
    from geosearch.search.stats.ranking import Ranking
    from geosearch.search.stats.study_ranking import rank_study
    from geosearch.search.stats.scores import Score
    from geosearch.search.study.export import export_best
    from geosearch.search.study.optimize import objective
    from geosearch.search.study.run import run_search
