"""Sphere: fixed Frobenius norm, ``‖W‖_F = √n`` (that of a Stiefel matrix)."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from geosearch.manifolds.base import Manifold

__all__ = ["Sphere"]


def _trace(S: Tensor) -> Tensor:
    return torch.diagonal(S, dim1=-2, dim2=-1).sum(dim=-1)


class Sphere(Manifold):
    """Frobenius sphere: ``‖W‖_F² = tr(WᵀW) = n`` with ``n`` the small dimension.

    The radius ``√n`` is the Frobenius norm of a Stiefel matrix, so it fits the Gram
    framework with ``P(S) = tr(S)/n · I`` (a self-adjoint projector: ``P(WᵀW − I) = 0``
    says exactly ``tr(WᵀW) = n``). Only the overall scale is constrained.

    * project / retract: ``W·√n/‖W‖_F`` (the zero matrix goes to the padded identity).
    * tangent space ``{A : ⟨W, A⟩ = 0}``; projection ``G − W·⟨W, G⟩/‖W‖_F²``.
    * constraint error ``|‖W‖_F²/n − 1|``.
    """

    name = "sphere"
    equation = "‖W‖_F² = n"
    error_text = "|‖W‖_F²/n − 1|"
    warm_retraction = True  # the same map as project but for the zero matrix

    def gram_projector(self, S: Tensor) -> Tensor:
        n = S.shape[-1]
        eye = torch.eye(n, dtype=S.dtype, device=S.device)
        return (_trace(S) / n)[..., None, None] * eye

    def _project(self, W: Tensor, exact: bool) -> Tensor:
        n = W.shape[-1]
        # accumulate in float64: a float32 sum over millions of entries is off by ~1e-5
        norm = torch.linalg.vector_norm(W, dim=(-2, -1), keepdim=True, dtype=torch.float64)
        zero = norm == 0
        if bool(zero.any()):
            W = torch.where(zero, torch.eye(*W.shape[-2:], dtype=W.dtype, device=W.device), W)
            norm = torch.where(zero, torch.full_like(norm, math.sqrt(n)), norm)
        return (W * (math.sqrt(n) / norm)).to(W.dtype)

    def _retract_fixed(self, W: Tensor) -> Tensor:
        # no zero branch: a step of size η < 1 cannot take a point of norm √n to zero
        norm = torch.linalg.vector_norm(W, dim=(-2, -1), keepdim=True, dtype=torch.float64)
        norm = norm.clamp_min(torch.finfo(torch.float64).tiny)
        return (W * (math.sqrt(W.shape[-1]) / norm)).to(W.dtype)

    def _coefficient(self, W: Tensor, G: Tensor) -> Tensor:
        num = (W * G).sum(dim=(-2, -1), keepdim=True)
        return num / (W * W).sum(dim=(-2, -1), keepdim=True).clamp_min(torch.finfo(W.dtype).tiny)

    def _normal_coefficients(self, W: Tensor, G: Tensor) -> Tensor:
        eye = torch.eye(W.shape[-1], dtype=W.dtype, device=W.device)
        return self._coefficient(W, G) * eye

    def _to_tangent(self, W: Tensor, G: Tensor) -> Tensor:
        return G - W * self._coefficient(W, G)

    def solve_normal(self, W: Tensor, H: Tensor) -> Tensor:
        # P(WᵀW·sI + sI·WᵀW) = 2s·tr(WᵀW)/n · I
        n = W.shape[-1]
        sq = (W * W).sum(dim=(-2, -1)).clamp_min(torch.finfo(W.dtype).tiny)[..., None, None]
        return H * (n / (2 * sq))

    def apply_normal(self, W: Tensor, S: Tensor) -> Tensor:
        return W * S[..., :1, :1]

    def tangent_residual(self, W: Tensor, A: Tensor) -> Tensor:
        n = W.shape[-1]
        eye = torch.eye(n, dtype=W.dtype, device=W.device)
        return (2 * (W * A).sum(dim=(-2, -1)) / n)[..., None, None] * eye

    def _constraint_error(self, W: Tensor) -> Tensor:
        n = W.shape[-1]
        return ((W * W).sum(dim=(-2, -1)) / n - 1).abs()
