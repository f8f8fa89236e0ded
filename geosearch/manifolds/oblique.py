"""Oblique: unit-norm columns, ``diag(WᵀW) = 1``."""

from __future__ import annotations

import torch
from torch import Tensor

from geosearch.manifolds.base import Manifold

__all__ = ["Oblique"]


class Oblique(Manifold):
    """Unit-norm columns: ``diag(WᵀW) = 1`` on the tall orientation (angles free).

    Gram projector ``P(S) = diag(S)`` (keep the diagonal). A wide weight has unit rows.

    * project / retract: divide each column by its norm (a zero column becomes the
      unit vector ``e_(j mod m)``).
    * tangent space ``{A : colsum(W ∘ A) = 0}``; projection subtracts from each
      column ``g_j`` its component along ``w_j``.
    * constraint error ``max_j |‖w_j‖² − 1|``.
    """

    name = "oblique"
    equation = "diag(WᵀW) = 1"
    error_text = "max|‖w_j‖² − 1|"
    warm_retraction = True  # the same map as project but for zero columns

    def gram_projector(self, S: Tensor) -> Tensor:
        return torch.diag_embed(torch.diagonal(S, dim1=-2, dim2=-1))

    def _project(self, W: Tensor, exact: bool) -> Tensor:
        norms = torch.linalg.vector_norm(W, dim=-2, keepdim=True, dtype=torch.float64)
        zero = norms == 0
        if bool(zero.any()):
            m, n = W.shape[-2:]
            basis = torch.zeros(m, n, dtype=W.dtype, device=W.device)
            basis[torch.arange(n) % m, torch.arange(n)] = 1
            W = torch.where(zero, basis, W)
            norms = torch.where(zero, torch.ones_like(norms), norms)
        return (W / norms).to(W.dtype)

    def _retract_fixed(self, W: Tensor) -> Tensor:
        # no zero-column branch: a step of size η < 1 cannot take a unit column to zero
        norms = torch.linalg.vector_norm(W, dim=-2, keepdim=True, dtype=torch.float64)
        return (W / norms.clamp_min(torch.finfo(torch.float64).tiny)).to(W.dtype)

    def _coefficients(self, W: Tensor, G: Tensor) -> Tensor:
        return (W * G).sum(dim=-2) / (W * W).sum(dim=-2).clamp_min(torch.finfo(W.dtype).tiny)

    def _normal_coefficients(self, W: Tensor, G: Tensor) -> Tensor:
        return torch.diag_embed(self._coefficients(W, G))

    def _to_tangent(self, W: Tensor, G: Tensor) -> Tensor:
        return G - W * self._coefficients(W, G).unsqueeze(-2)

    def solve_normal(self, W: Tensor, H: Tensor) -> Tensor:
        d2 = (W * W).sum(dim=-2).clamp_min(torch.finfo(W.dtype).tiny)
        return torch.diag_embed(torch.diagonal(H, dim1=-2, dim2=-1) / (2 * d2))

    def apply_normal(self, W: Tensor, S: Tensor) -> Tensor:
        return W * torch.diagonal(S, dim1=-2, dim2=-1).unsqueeze(-2)

    def tangent_residual(self, W: Tensor, A: Tensor) -> Tensor:
        return torch.diag_embed(2 * (W * A).sum(dim=-2))

    def _constraint_error(self, W: Tensor) -> Tensor:
        return ((W * W).sum(dim=-2) - 1).abs().amax(dim=-1)
