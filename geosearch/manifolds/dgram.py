"""DGram: mutually orthogonal columns with free norms, ``Off(WᵀW) = 0``."""

from __future__ import annotations

import torch
from torch import Tensor

from geosearch.manifolds.base import Manifold
from geosearch.manifolds.msign import polar

__all__ = ["DGram", "off_diagonal"]


def off_diagonal(S: Tensor) -> Tensor:
    """``S`` with its diagonal (last two dims) set to zero."""
    return S - torch.diag_embed(torch.diagonal(S, dim1=-2, dim2=-1))


class DGram(Manifold):
    """Orthogonal columns, norms free: ``Off(WᵀW) = 0`` (diagonal Gram matrix).

    On the tall orientation ``W = Q·diag(d)`` with ``QᵀQ = I`` and column norms ``d``
    in any order; the singular values are the column norms, so they are not bounded.
    Gram projector ``P(S) = S − diag(S)`` (zero the diagonal).

    * project / retract: ``Q·diag(colsum(Q ∘ W))`` with ``Q`` the polar factor of ``W``
      with its columns normalised, ``Q = msign(W·diag(1/‖w_j‖))``. Every point of the
      set is fixed, whatever the order of its column norms (for ``W = U·diag(d)``:
      ``Q = U`` and ``colsum(U ∘ W) = d``); the reference ``U Vᵀ·diag(σ)`` from an SVD
      is not (it re-sorts the norms). Normalising the columns before the polar factor
      (rather than ``Q = msign(W)``, which has the same fixed points and also lands on
      the set) keeps ``Q``'s input near-orthonormal after a small step, so Newton–Schulz
      converges in one or two iterations however spread the norms are (``msign(W)``
      needs 8 or more, and fails to converge for columns below ~1e-3 of ‖W‖_F);
      ``colsum(Q ∘ W)`` puts the norms back.
    * tangent space ``{A : Off(WᵀA + AᵀW) = 0}``; projection ``G − W·S`` with
      ``S_ij = (WᵀG + GᵀW)_ij / (d_i² + d_j²)`` off the diagonal and ``S_ii = 0``.
    * constraint error ``max|Off(WᵀW)|``.

    Zero columns are orthogonal to everything: they stay zero under ``project``.
    """

    name = "dgram"
    equation = "Off(WᵀW) = 0"
    error_text = "max|Off(WᵀW)|"

    def gram_projector(self, S: Tensor) -> Tensor:
        return off_diagonal(S)

    def _project(self, W: Tensor, exact: bool) -> Tensor:
        norms = torch.linalg.vector_norm(W, dim=-2, keepdim=True)  # (..., 1, n)
        tiny = torch.finfo(W.dtype).tiny
        Q = polar(W / norms.clamp_min(tiny), exact=exact)
        return Q * (Q * W).sum(dim=-2, keepdim=True)

    def _normal_coefficients(self, W: Tensor, G: Tensor) -> Tensor:
        WG = W.mT @ G
        return self.solve_normal(W, WG + WG.mT)

    def solve_normal(self, W: Tensor, H: Tensor) -> Tensor:
        # WᵀW = diag(d²): (WᵀW S + S WᵀW)_ij = (d_i² + d_j²) S_ij
        d2 = (W * W).sum(dim=-2)  # (..., n) squared column norms
        denom = (d2.unsqueeze(-1) + d2.unsqueeze(-2)).clamp_min(torch.finfo(W.dtype).tiny)
        return off_diagonal(H / denom)
