"""Optimizers: the settings catalog and manifold Muon (with AdamW groups).

Names are imported on first use, so ``geosearch.optim.settings`` (the torch-free catalog)
can be read without loading torch or the optimizer.

Example::

    from geosearch.optim import ManifoldMuon
    opt = ManifoldMuon([{"params": [w], "geometry": "stiefel", "lr": 0.02}])

``build_optimizer`` (a whole model, from an assignment) sits above this layer, beside the
plan it builds from: :mod:`geosearch.build`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from geosearch.util.lazy import lazy_getattr

_EXPORTS = {
    "ManifoldMuon": "geosearch.optim.muon",
    "block_view": "geosearch.optim.blocks",
}

__all__ = sorted(_EXPORTS)


__getattr__ = lazy_getattr(__name__, _EXPORTS)


if TYPE_CHECKING:  # pragma: no cover
    from geosearch.optim.blocks import block_view
    from geosearch.optim.muon import ManifoldMuon
