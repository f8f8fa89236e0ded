"""geosearch: find which weight-space geometry each transformer module type should use.

Public API::

    import geosearch
    assignment = geosearch.load_assignment("runs/default/best_assignment.yaml")
    optimizer = geosearch.build_optimizer(model, assignment)
    study.optimize(geosearch.objective("default"), n_trials=4)   # an Optuna study
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from geosearch.util.lazy import lazy_getattr
from geosearch.util.version import __version__

# name -> module that defines it; imported on first use so `geosearch --help` stays fast
# and importing the package does not pull in torch until it is needed.
_EXPORTS = {
    "Assignment": "geosearch.assignment",
    "load_assignment": "geosearch.assignment",
    "build_optimizer": "geosearch.build",
    "ManifoldMuon": "geosearch.optim",
    "get_manifold": "geosearch.manifolds",
    "manifold_names": "geosearch.manifolds",
    "GeosearchError": "geosearch.util.errors",
    "ConfigError": "geosearch.util.errors",
    "objective": "geosearch.search.study.optimize",
}

__all__ = sorted(_EXPORTS) + ["__version__"]


__getattr__ = lazy_getattr(__name__, _EXPORTS)


if TYPE_CHECKING:  # pragma: no cover
    from geosearch.assignment import Assignment, load_assignment
    from geosearch.util.errors import ConfigError, GeosearchError
    from geosearch.manifolds import get_manifold, manifold_names
    from geosearch.build import build_optimizer
    from geosearch.optim import ManifoldMuon
    from geosearch.search.study.optimize import objective
