"""DGram: mutually orthogonal columns with free norms, ``Off(WᵀW) = 0``."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from geosearch.manifolds.base import Manifold
from geosearch.manifolds.msign import polar, polar_fixed

__all__ = ["DGram", "off_diagonal"]

# The fixed retraction's Polar Express and cubic iterations: column norms may be spread,
# so it cannot start warm from the stepped point (the adaptive path takes Polar Express too).
FIXED_FAR, FIXED_POLISH = 8, 2


def off_diagonal(S: Tensor) -> Tensor:
    """``S`` with its diagonal (last two dims) set to zero."""
    return S - torch.diag_embed(torch.diagonal(S, dim1=-2, dim2=-1))


class DGram(Manifold):
    """Orthogonal columns, norms free: ``Off(WᵀW) = 0`` (diagonal Gram matrix).

    On the tall orientation ``W = Q·diag(d)`` with ``QᵀQ = I`` and column norms ``d``
    in any order; the singular values are the column norms, so they are not bounded.
    Gram projector ``P(S) = S − diag(S)`` (zero the diagonal).

    * project / retract: ``Q·diag(colsum(Q ∘ W))`` with ``Q = polar(W)``, the polar
      factor of ``W`` itself (:func:`~geosearch.manifolds.msign.polar`). Every point of
      the set is fixed, whatever the order or spread of its column norms (for
      ``W = U·diag(d)``: ``Q = U`` and ``colsum(U ∘ W) = d``); the reference
      ``U Vᵀ·diag(σ)`` from an SVD is not (it re-sorts the norms).
    * why ``polar(W)`` and not the polar factor of ``W`` with normalised columns (a
      retraction with the same fixed points): the polar factor weighs each column by its
      norm, so when the norms are spread the small columns follow the large ones. With
      normalised columns all weigh the same, and a small column, which one step of size η
      turns by up to η/‖w_j‖, drags the large ones along. With the small proxy's DGram
      weights re-spread to column norms 0.02–1.1 (DGram attention's ``c_proj`` after 2,000
      steps), one ``project`` step of spectral size η moved ``W`` by up to 8.6η that way
      and by 1.75η with ``polar(W)`` (``benchmarks/direction_quality.py``). Bound: with
      ``W' = W − ηA = Q'P'`` the result is ``W' − Q'·Off(P')``, and ``Off(P') =
      Off(P' − |W|)`` as ``|W| = diag(d)``; since ``‖|W'| − |W|‖_F ≤ √2·‖W' − W‖_F``
      (Araki–Yamagami), a step moves ``W`` by at most ``(1 + √2)·‖ηA‖_F`` in Frobenius
      norm whatever the norms. In spectral norm, measured: at most about ``2·‖ηA‖_2``
      (``tests/manifolds/test_dgram.py`` checks ≤ 2.2 with norms spread 50×).
    * cost and fallback: ``W`` is first scaled to unit RMS column norm (the polar factor
      does not change), so a point with (nearly) equal norms takes ``polar``'s
      near-orthonormal path (one or two Newton–Schulz iterations); spread norms take
      its Polar Express path. When Newton–Schulz stalls (rank-deficient ``W``, a zero
      column, or norms spread over more than about 3e4) ``polar`` falls back to a float64
      SVD, and ``exact=True`` always uses it.
    * fixed retraction (``retract(fixed=True)``): the same map by ``FIXED_FAR`` Polar
      Express and ``FIXED_POLISH`` cubic iterations, nothing checked (compilable).
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
        # polar(c·W) = polar(W); unit RMS column norm lets equal norms take the near path
        rms = torch.linalg.vector_norm(W, dim=(-2, -1), keepdim=True) / math.sqrt(W.shape[-1])
        Q = polar(W / rms.clamp_min(torch.finfo(W.dtype).tiny), exact=exact)
        return Q * (Q * W).sum(dim=-2, keepdim=True)  # Q·diag(colsum(Q ∘ W))

    def _retract_fixed(self, W: Tensor) -> Tensor:
        rms = torch.linalg.vector_norm(W, dim=(-2, -1), keepdim=True) / math.sqrt(W.shape[-1])
        Q = polar_fixed(W / rms.clamp_min(torch.finfo(W.dtype).tiny), FIXED_POLISH, far=FIXED_FAR)
        return Q * (Q * W).sum(dim=-2, keepdim=True)

    def _normal_coefficients(self, W: Tensor, G: Tensor) -> Tensor:
        WG = W.mT @ G
        return self.solve_normal(W, WG + WG.mT)

    def solve_normal(self, W: Tensor, H: Tensor) -> Tensor:
        # WᵀW = diag(d²): (WᵀW S + S WᵀW)_ij = (d_i² + d_j²) S_ij
        d2 = (W * W).sum(dim=-2)  # (..., n) squared column norms
        denom = (d2.unsqueeze(-1) + d2.unsqueeze(-2)).clamp_min(torch.finfo(W.dtype).tiny)
        return off_diagonal(H / denom)
