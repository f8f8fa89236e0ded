"""Euclidean: no constraint (plain Muon, or the weights AdamW trains)."""

from __future__ import annotations

import torch
from torch import Tensor

from geosearch.manifolds.base import Manifold

__all__ = ["Euclidean"]


class Euclidean(Manifold):
    """Unconstrained matrices: every ``W`` is on the set (defining equation: none).

    ``project``, ``retract`` and ``to_tangent`` are the identity and the constraint
    error is 0. A manifold-Muon step on it is a plain Muon step.
    """

    name = "euclidean"
    equation = "no constraint"
    error_text = "error"
    warm_retraction = True  # nothing to retract

    def _project(self, W: Tensor, exact: bool) -> Tensor:
        return W

    def _to_tangent(self, W: Tensor, G: Tensor) -> Tensor:
        return G

    def _constraint_error(self, W: Tensor) -> Tensor:
        return torch.zeros(W.shape[:-2], dtype=W.dtype, device=W.device)
