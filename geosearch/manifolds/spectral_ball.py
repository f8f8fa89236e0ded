"""Spectral ball: ``σ_max(W) ≤ 1`` (a convex set with interior, not a manifold)."""

from __future__ import annotations

import torch
from torch import Tensor

from geosearch.manifolds.base import Manifold, sym
from geosearch.manifolds.msign import msign

__all__ = ["SpectralBall"]

# Polar Express iterations of the msign-based cap: 8 for msign(W), 12 for the sign of the
# small symmetric matrix (cheap, and it decides how close to 1 a σ is still clipped).
_CAP_STEPS, _CAP_SIGN_STEPS = 8, 12


class SpectralBall(Manifold):
    """Spectral-norm ball: ``σ_max(W) ≤ 1`` (every singular value at most 1).

    A convex set with non-empty interior, not a manifold: at an interior point every
    direction is feasible, so ``to_tangent`` is the identity (also on the boundary,
    where the tangent *cone* is not a subspace; feasibility is restored by the
    projection after the step). It is not a Gram manifold: ``gram_projector`` is None,
    and the dual-ascent solver reduces to plain ``msign(G)``. So a manifold-Muon step on
    the ball is plain Muon followed by clipping: ``W ← clip(W − η·msign(G))``, both
    solvers alike; nothing in the direction knows about the constraint, which acts only
    through the clip (on the boundary, the step's outward part is cut off afterwards).

    * project / retract: clip the singular values at 1 (the nearest point of the ball,
      in Frobenius and spectral norm). Only directions with ``σ > 1`` change, so points
      of the ball are returned unchanged.

      - ``exact=True``: from an SVD in float64.
      - CPU: from the eigendecomposition of the small Gram ``WᵀW = V diag(σ²) Vᵀ``
        (float64 ``eigh``): ``W ← W·(I − V·diag(max(0, 1 − 1/σ))·Vᵀ)``; exact up to the
        rounding of the Gram, and on CPU several times cheaper than the cap below.
      - CUDA: without any decomposition (the "spectral hardcap" of Su, You and
        Leloykun): with ``Q = msign(W)`` on the tall orientation,
        ``W ← ½·[Q + W − (Q − W)·msign(I − sym(WᵀQ))]`` maps each σ to
        ``½(1 + σ − |1 − σ|) = min(σ, 1)``. Singular values within about 1e-4 of 1,
        which Newton–Schulz cannot tell apart from 1, move by less than their distance
        to 1, so the violation left is of that order.
    * constraint error ``max(σ_max − 1, 0)``.
    """

    name = "spectral_ball"
    equation = "σ_max(W) ≤ 1"
    error_text = "max(σ_max − 1, 0)"

    def _project(self, W: Tensor, exact: bool) -> Tensor:
        if exact:
            U, S, Vh = torch.linalg.svd(W.to(torch.float64), full_matrices=False)
            return ((U * S.clamp_max(1).unsqueeze(-2)) @ Vh).to(W.dtype)
        if W.is_cuda:
            return _msign_cap(W)
        return _gram_clip(W)

    def _retract_fixed(self, W: Tensor) -> Tensor:
        return _msign_cap(W)  # fixed iterations on every device

    def _to_tangent(self, W: Tensor, G: Tensor) -> Tensor:
        return G

    def _constraint_error(self, W: Tensor) -> Tensor:
        gram = (W.mT @ W).to(torch.promote_types(W.dtype, torch.float32))
        sigma_max = torch.linalg.eigvalsh(gram)[..., -1].clamp_min(0).sqrt()
        return (sigma_max - 1).clamp_min(0).to(W.dtype)


def _gram_clip(W: Tensor) -> Tensor:
    """Clip σ at 1 from ``eigh(WᵀW)``; matrices with σ_max ≤ 1 are returned as they are."""
    work = torch.promote_types(W.dtype, torch.float32)
    gram = (W.mT @ W).to(torch.float64)
    lam, V = torch.linalg.eigh(gram)  # σ² ascending, (..., n), (..., n, n)
    shrink = (1 - lam.clamp_min(1).rsqrt())  # 1 − 1/σ where σ > 1, else 0
    inside = ~(shrink > 0).any(dim=-1)
    if bool(inside.all()):
        return W
    eye = torch.eye(W.shape[-1], dtype=torch.float64, device=W.device)
    B = (eye - (V * shrink.unsqueeze(-2)) @ V.mT).to(work)
    out = (W.to(work) @ B).to(W.dtype)
    return torch.where(inside[..., None, None], W, out)


def _msign_cap(W: Tensor) -> Tensor:
    Q = msign(W, steps=_CAP_STEPS)
    eye = torch.eye(W.shape[-1], dtype=W.dtype, device=W.device)
    sign = msign(eye - sym(W.mT @ Q), steps=_CAP_SIGN_STEPS)  # V·sign(1 − σ)·Vᵀ
    return 0.5 * (Q + W - (Q - W) @ sign)
