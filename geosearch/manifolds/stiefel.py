"""Stiefel: orthonormal columns, ``WᵀW = I``."""

from __future__ import annotations

from torch import Tensor

from geosearch.manifolds.base import Manifold, sym
from geosearch.manifolds.msign import polar, polar_fixed

__all__ = ["Stiefel"]

# Cubic Newton–Schulz iterations of the warm (fixed) retraction: from singular values
# 1 ± ε after a step, one leaves about 1.5ε², two reach float32 rounding for ε ≤ 0.03.
WARM_POLISH = 2


class Stiefel(Manifold):
    """Orthonormal columns: ``WᵀW = I`` on the tall orientation (all σ = 1).

    Gram projector ``P = identity``. A wide weight has orthonormal rows instead.

    * project / retract: the polar factor ``msign(W) = U Vᵀ`` (the nearest point in
      Frobenius norm), polished by Newton–Schulz to rounding level.
    * tangent space ``{A : WᵀA + AᵀW = 0}``; projection ``G − W·sym(WᵀG)``.
    * constraint error ``max|WᵀW − I|``.
    * fixed (warm) retraction: ``WARM_POLISH`` cubic Newton–Schulz iterations from the
      stepped point, nothing checked (:func:`~geosearch.manifolds.msign.polar_fixed`).

    Example:
        >>> import torch
        >>> W = Stiefel().project(torch.randn(8, 3, dtype=torch.float64))
        >>> Stiefel().check(W)[0]
        True
    """

    name = "stiefel"
    equation = "WᵀW = I"
    error_text = "max|WᵀW − I|"

    def gram_projector(self, S: Tensor) -> Tensor:
        return S

    def _project(self, W: Tensor, exact: bool) -> Tensor:
        return polar(W, exact=exact)

    def _retract_fixed(self, W: Tensor) -> Tensor:
        return polar_fixed(W, WARM_POLISH)

    def _normal_coefficients(self, W: Tensor, G: Tensor) -> Tensor:
        return sym(W.mT @ G)

    def solve_normal(self, W: Tensor, H: Tensor) -> Tensor:
        return 0.5 * H  # WᵀW = I
