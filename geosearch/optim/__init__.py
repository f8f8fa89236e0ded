"""Optimizers: the settings catalog, manifold Muon (with AdamW groups) and ``build_optimizer``.

Names are imported on first use, so ``geosearch.optim.settings`` (the torch-free catalog)
can be read without loading torch or the optimizer.

Example::

    import geosearch
    opt = geosearch.build_optimizer(model, geosearch.Assignment.parse("attn=stiefel,mlp=dgram"))
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from geosearch.lazy import lazy_getattr

_EXPORTS = {
    "ManifoldMuon": "geosearch.optim.muon",
    "block_view": "geosearch.optim.blocks",
    "build_optimizer": "geosearch.optim.build",
    "optimizer_from_plan": "geosearch.optim.build",
    "optimizer_summary": "geosearch.optim.build",
}

__all__ = sorted(_EXPORTS)


__getattr__ = lazy_getattr(__name__, _EXPORTS)


if TYPE_CHECKING:  # pragma: no cover
    from geosearch.optim.blocks import block_view
    from geosearch.optim.build import build_optimizer, optimizer_from_plan, optimizer_summary
    from geosearch.optim.muon import ManifoldMuon
