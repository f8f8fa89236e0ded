"""Optimizers: manifold Muon (with AdamW groups) and ``build_optimizer``.

Example::

    import geosearch
    opt = geosearch.build_optimizer(model, geosearch.Assignment.parse("attn=stiefel,mlp=dgram"))
"""

from geosearch.optim.build import build_optimizer, optimizer_summary
from geosearch.optim.muon import ManifoldMuon

__all__ = ["ManifoldMuon", "build_optimizer", "optimizer_summary"]
