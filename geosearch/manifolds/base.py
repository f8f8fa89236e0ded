"""The small base class every geometry implements.

A geometry is a set of weight matrices. Everything is done on the *tall* orientation
(``m >= n``): a wide matrix is transposed on the way in and back on the way out, so the
constraint always lives on the small ``n × n`` Gram matrix ``WᵀW``. Most geometries
here are "Gram manifolds" ``{W : P(WᵀW − I) = 0}`` for a self-adjoint projector ``P`` on
symmetric ``n × n`` matrices; their tangent space at ``W`` is
``{A : P(WᵀA + AᵀW) = 0}`` and their normal space is ``{W S : S = P(S) symmetric}``.
Subclasses implement the tall-orientation hooks (``_project``, ``_normal_coefficients``,
``_constraint_error``, ...); the public methods handle orientation and batching. The base
is an ``abc.ABC``: a geometry without ``_project`` cannot be instantiated.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable

import torch
from torch import Tensor

__all__ = ["Manifold"]


def _is_wide(W: Tensor) -> bool:
    return W.shape[-2] < W.shape[-1]


def sym(S: Tensor) -> Tensor:
    """Symmetric part ``(S + Sᵀ)/2`` of the last two dims."""
    return 0.5 * (S + S.mT)


class Manifold(ABC):
    """A set of matrices with a projection, a tangent projection and a check.

    Every method accepts ``(m, n)`` or batched ``(..., m, n)`` tensors of either
    orientation. Subclasses set ``name``, ``equation`` (the defining equation on the
    tall orientation, e.g. ``"WᵀW = I"``) and ``error_text`` (what
    :meth:`constraint_error` measures), and implement the tall hooks: ``_project``
    always (abstract), and either ``gram_projector`` (a Gram manifold: the tangent
    projection, the constraint error and the dual solver follow from it) or
    ``_to_tangent`` and ``_constraint_error``.
    """

    name: str = ""
    equation: str = ""
    error_text: str = ""
    # Whether the optimizer's retraction "auto" takes the fixed (warm) retraction: only where
    # it was measured to keep the constraint error at the adaptive one's level (docs/design.md).
    warm_retraction: bool = False

    # ------------------------------------------------------------------ public API
    def project(self, W: Tensor, exact: bool = False) -> Tensor:
        """Map any matrix onto the manifold; points already on it come back unchanged.

        Args:
            W: ``(..., m, n)``.
            exact: use SVDs in float64 instead of Newton–Schulz (reference path).
        """
        return self._oriented(lambda X: self._project(X, exact), W)

    def retract(self, W: Tensor, exact: bool = False, fixed: bool = False) -> Tensor:
        """Retraction applied after an optimizer step ``W − ηA`` (default: project).

        ``fixed=True``: the geometry's fixed-iteration retraction, with no data-dependent
        control flow (``torch.compile`` captures it whole), meant for a point a small step
        away from the set; geometries whose projection is closed-form use it unchanged.
        """
        if fixed:
            return self._oriented(self._retract_fixed, W)
        return self._oriented(lambda X: self._retract(X, exact), W)

    def to_tangent(self, W: Tensor, G: Tensor) -> Tensor:
        """Orthogonal (Frobenius) projection of ``G`` onto the tangent space at ``W``."""
        if _is_wide(W):
            return self._to_tangent(W.mT, G.mT).mT
        return self._to_tangent(W, G)

    @property
    def is_gram(self) -> bool:
        """Whether the set is ``{P(WᵀW − I) = 0}`` (the subclass defines ``P``)."""
        return type(self).gram_projector is not Manifold.gram_projector

    def gram_projector(self, S: Tensor) -> Tensor | None:
        """The projector ``P`` on symmetric ``n × n`` matrices (n = small dim).

        ``None`` for sets that are not of the form ``{P(WᵀW − I) = 0}``.
        """
        return None

    def normal_coefficients(self, W: Tensor, G: Tensor) -> Tensor | None:
        """Symmetric ``S = P(S)`` (``n × n``) with ``to_tangent(W, G) = G − W S``.

        For a wide ``W`` the identity reads ``to_tangent(W, G) = G − S W``. ``None`` for
        sets that are not Gram manifolds. The dual-ascent solver starts from ``Λ = −S/2``.
        """
        if _is_wide(W):
            return self._normal_coefficients(W.mT, G.mT)
        return self._normal_coefficients(W, G)

    def constraint_error(self, W: Tensor) -> Tensor:
        """Per-matrix violation of the defining equation (shape = batch dims); 0 on it."""
        return self._constraint_error(W.mT if _is_wide(W) else W)

    def check(self, W: Tensor, atol: float = 1e-5) -> tuple[bool, str]:
        """Whether ``W`` satisfies the defining equation to ``atol``.

        Returns:
            ``(ok, reason)``; ``reason`` names the equation, the measured error and the
            tolerance (and the worst batch index), or says all is well.
        """
        if W.ndim < 2:
            return False, f"{self.name}: expected a matrix, got shape {tuple(W.shape)}"
        if not bool(torch.isfinite(W).all()):
            return False, f"{self.name}: W has non-finite entries"
        err = self.constraint_error(W).to(torch.float64)
        worst = float(err.max()) if err.numel() else 0.0
        where = ""
        if err.ndim > 0 and err.numel() > 1:
            idx = tuple(int(i) for i in torch.unravel_index(err.argmax(), err.shape))
            where = f" (worst matrix at batch index {idx})"
        if worst > atol:
            return False, (
                f"{self.name}: {self.equation} violated: {self.error_text} = {worst:.3e} "
                f"> atol {atol:g}{where}"
            )
        return True, f"{self.name}: {self.equation} holds: {self.error_text} = {worst:.3e} <= atol {atol:g}"

    # ------------------------------------------------ helpers the solvers use (tall W)
    def apply_normal(self, W: Tensor, S: Tensor) -> Tensor:
        """``W S`` for tall ``W`` (geometries with diagonal ``S`` override it cheaply)."""
        return W @ S

    def solve_normal(self, W: Tensor, H: Tensor) -> Tensor:
        """For tall ``W``: the ``S = P(S)`` with ``P(WᵀW·S + S·WᵀW) = H`` (``H = P(H)``).

        This is the linear map behind the tangent projection (``S`` of ``G`` is
        ``solve_normal(W, P(WᵀG + GᵀW))``); the dual-ascent solver uses it as the
        preconditioner of its step, which makes the step independent of ``W``'s scale
        (DGram column norms are free).
        """
        raise NotImplementedError(f"{self.name} is not a Gram manifold")

    def tangent_residual(self, W: Tensor, A: Tensor) -> Tensor:
        """``P(WᵀA + AᵀW)`` for tall ``W``: zero exactly when ``A`` is tangent."""
        WA = W.mT @ A
        out = self.gram_projector(WA + WA.mT)
        if out is None:
            raise NotImplementedError(f"{self.name} is not a Gram manifold")
        return out

    # ---------------------------------------------------- hooks (tall orientation)
    @abstractmethod
    def _project(self, W: Tensor, exact: bool) -> Tensor:
        """The nearest point of the set to a tall ``W`` (``exact``: SVD-based reference)."""

    def _retract(self, W: Tensor, exact: bool) -> Tensor:
        return self._project(W, exact)

    def _retract_fixed(self, W: Tensor) -> Tensor:
        return self._project(W, False)

    def _to_tangent(self, W: Tensor, G: Tensor) -> Tensor:
        S = self._normal_coefficients(W, G)
        return G if S is None else G - self.apply_normal(W, S)

    def _normal_coefficients(self, W: Tensor, G: Tensor) -> Tensor | None:
        return None

    def _constraint_error(self, W: Tensor) -> Tensor:
        gram = W.mT @ W
        eye = torch.eye(gram.shape[-1], dtype=gram.dtype, device=gram.device)
        P = self.gram_projector(gram - eye)
        if P is None:
            raise NotImplementedError(f"{type(self).__name__} is not a Gram manifold: it must define "
                                      "_constraint_error")
        return P.abs().amax(dim=(-2, -1))

    # ------------------------------------------------------------------- plumbing
    @staticmethod
    def _oriented(fn: Callable[[Tensor], Tensor], W: Tensor) -> Tensor:
        if W.ndim < 2:
            raise ValueError(f"expected a matrix or a batch of matrices, got shape {tuple(W.shape)}")
        return fn(W.mT).mT if _is_wide(W) else fn(W)

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"
