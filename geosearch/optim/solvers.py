"""Manifold-Muon direction solvers: pure functions, tensors in, tensors out.

Given a point ``W`` of a geometry and a momentum ``G``, manifold Muon steps along the
direction ``A`` that solves (Bernstein 2025, with the Gram projector ``P`` inserted)::

    max ⟨G, A⟩  subject to  ‖A‖_2 ≤ 1  and  P(WᵀA + AᵀW) = 0   (A tangent at W)

and then retracts ``W − ηA`` onto the set. Two solvers:

* :func:`project_direction` (one ``msign``): ``A = msign(to_tangent(W, G))`` solves the
  *relaxed* problem ``max ⟨to_tangent(W, G), A⟩`` s.t. ``‖A‖_2 ≤ 1``, without asking ``A``
  to be tangent. Exact for square Stiefel (where it equals ``W·msign(skew(WᵀG))``);
  elsewhere the retraction removes ``A``'s normal part, and the tangent part ``T`` that
  stays has ``‖T‖_2 > 1``: the step goes past η along the manifold. On the small proxy's
  momenta (``benchmarks/direction_quality.py``) ``‖T‖_2`` was 1.12–1.27 for Stiefel and
  1.28–1.59 for DGram (22% and 45% past η on average), and scaled back into the unit
  ball ``T`` kept 87% (Stiefel) and 80% (DGram) of the optimal objective.
* :func:`dual_ascent_direction` (up to K+1 ``msign``): subgradient ascent on the dual
  variable ``Λ = P(Λ)``: ``A = msign(G + 2WΛ)``, ``H = P(WᵀA + AᵀW)``,
  ``Λ ← Λ − α(1 − k/K)·2L⁻¹(H)``, stopping once ``‖H‖_F/√numel(H) < tol``. On the same
  momenta K = 20 kept 88% (Stiefel) and 85% (DGram) of the optimum, cosine 0.97 and 0.94
  to it, but its residual stayed at 2–3e-2, never reaching the default ``tol`` 1e-3;
  K = 5 hardly moved from the projection's direction. Neither is the exact optimum, so
  a speed ratio to another solver means something only at equal direction quality.

Scale-free dual step. ``msign`` is scale-invariant, so the direction problem for ``cG``
is that for ``G`` with ``Λ`` scaled by ``c``; but a fixed dual step ``α`` is not (``H`` is
O(1) whatever ``‖G‖``), which is why the published ``α = 0.1`` stalls when gradients are
small and overshoots when they are large. Two changes make the step scale-free:

1. ``G`` is divided by its RMS singular value ``‖G‖_F/√min(m, n)`` (free to compute,
   equal to the spectral norm for a flat spectrum) before the ascent, so ``α`` means the
   same at every gradient scale; ``Λ`` is returned (and accepted for warm starts) in
   ``G``'s units.
2. ``H`` is preconditioned by ``L(S) = P(WᵀW·S + S·WᵀW)``, the map that turns a change
   of ``Λ`` into a change of ``H`` were ``msign`` the identity; ``2L⁻¹(H) = H`` for
   Stiefel, Oblique and Sphere points (the published step), while for DGram it divides
   entry ``ij`` by ``(d_i² + d_j²)/2``, so free column norms ``d`` do not change the
   step either (without it the ascent stalls once norms reach a few units).

The ascent starts from ``Λ = −S/2`` with ``to_tangent(W, G) = G − W S`` (for Stiefel
that is the published ``−¼(WᵀG + GᵀW)``), i.e. from the projection solver's direction,
and returns the iterate with the smallest residual, so it is never less tangent than
that direction. For ill-conditioned (low-rank) ``G`` a subgradient method converges
slowly: the residual may stay above ``tol``; it is reported.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from geosearch.manifolds.base import Manifold, sym
from geosearch.manifolds.msign import msign

__all__ = [
    "project_direction", "dual_ascent_direction", "dual_ascent", "manifold_muon_update",
    "batched_update",
]


def project_direction(
    manifold: Manifold, W: Tensor, G: Tensor, ns_steps: int = 5, *, exact: bool = False,
    ns_coefficients: str = "polar_express",
) -> Tensor:
    """One-``msign`` direction: ``msign(to_tangent(W, G))``.

    Args:
        manifold: the geometry ``W`` lies on.
        W: the point, ``(..., m, n)``.
        G: the momentum / gradient, same shape.
        ns_steps: Newton–Schulz iterations of the ``msign``.
        exact: SVD-based ``msign`` (float64 reference).
        ns_coefficients: the ``msign``'s Newton–Schulz coefficients, ``"polar_express"``
            or ``"quintic"`` (:data:`geosearch.manifolds.msign.NS_COEFFICIENTS`).

    Returns:
        ``A`` with ``‖A‖_2 ≤ 1`` (up to Newton–Schulz error); the step is ``W − ηA``.
    """
    return msign(manifold.to_tangent(W, G), steps=ns_steps, exact=exact, coefficients=ns_coefficients)


def dual_ascent_direction(
    manifold: Manifold,
    W: Tensor,
    G: Tensor,
    steps: int = 20,
    dual_lr: float = 0.1,
    tol: float = 1e-3,
    lam0: Tensor | None = None,
    *,
    ns_steps: int = 5,
    exact: bool = False,
    ns_coefficients: str = "polar_express",
    fixed_iterations: bool = False,
) -> tuple[Tensor, Tensor | None, float]:
    """Tangent steepest-descent direction under the spectral norm, by dual ascent.

    Args:
        manifold: the geometry ``W`` lies on (a Gram manifold; otherwise this returns
            ``msign(G)``, which is then exact).
        W: the point, ``(..., m, n)``.
        G: the momentum / gradient, same shape.
        steps: K, the most dual updates (the loop calls ``msign`` at most K+1 times).
        dual_lr: α, the dual step for ``G`` scaled to unit RMS singular value; the
            update at iteration k is ``Λ ← Λ − α(1 − k/K)·2L⁻¹(H)`` (module docstring).
        tol: a matrix stops once its ``‖H‖_F/√numel(H) < tol``; in a batch the others go on
            and the stopped ones are frozen, so each gets what it would alone.
        lam0: warm start for ``Λ`` (``(..., n, n)``, n = small dim, ``G``'s units),
            e.g. the ``lam`` this function returned at the previous optimizer step.
        ns_steps: Newton–Schulz iterations per ``msign``.
        exact: SVD-based ``msign`` (float64 reference).
        ns_coefficients: the ``msign``'s Newton–Schulz coefficients (see
            :func:`project_direction`).
        fixed_iterations: run all K updates (stopped matrices frozen, the same result)
            instead of leaving the loop once every matrix is below ``tol``: no
            data-dependent control flow, so ``torch.compile`` captures it whole.

    Returns:
        ``(A, lam, residual)``: the direction with the smallest residual seen, the dual
        variable that produced it (``None`` when there is no dual problem), and that
        residual ``‖P(WᵀA + AᵀW)‖_F/√numel`` (the largest over a batch), a float.
    """
    A, lam, r = dual_ascent(manifold, W, G, steps, dual_lr, tol, lam0, ns_steps=ns_steps,
                            exact=exact, ns_coefficients=ns_coefficients,
                            fixed_iterations=fixed_iterations)
    return A, lam, float(r.max()) if r.numel() else 0.0


def dual_ascent(
    manifold: Manifold, W: Tensor, G: Tensor, steps: int, dual_lr: float, tol: float,
    lam0: Tensor | None, *, ns_steps: int, exact: bool = False,
    ns_coefficients: str = "polar_express", fixed_iterations: bool = False,
) -> tuple[Tensor, Tensor | None, Tensor]:
    """:func:`dual_ascent_direction` with the residual per matrix (a tensor of the batch
    shape, zeros when there is no dual problem) and no host synchronisation in
    ``fixed_iterations`` mode."""
    if not manifold.is_gram:
        A = msign(G, steps=ns_steps, exact=exact, coefficients=ns_coefficients)
        return A, None, G.new_zeros(G.shape[:-2])
    wide = W.shape[-2] < W.shape[-1]
    if wide:
        W, G = W.mT, G.mT
    k_dim = W.shape[-1]
    # RMS singular value of G per matrix: the unit α is measured in.
    scale = torch.linalg.vector_norm(G, dim=(-2, -1), keepdim=True) / math.sqrt(k_dim)
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    G_hat = G / scale
    if lam0 is None:
        lam = -0.5 * manifold.normal_coefficients(W, G_hat)
    else:
        lam = manifold.gram_projector(sym(lam0.to(G.dtype))) / scale

    def evaluate(lam: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        A = msign(G_hat + 2 * manifold.apply_normal(W, lam), steps=ns_steps, exact=exact,
                  coefficients=ns_coefficients)
        H = manifold.tangent_residual(W, A)
        return A, H, torch.linalg.vector_norm(H, dim=(-2, -1)) / k_dim  # ‖H‖_F/√(n²)

    A, H, r = evaluate(lam)
    best_A, best_lam, best_r = A, lam, r
    active = r >= tol  # a matrix stops for good once below tol (NaN: stops)
    for k in range(steps):
        if not fixed_iterations and not bool(active.any()):
            break
        # preconditioned: the change of 2WΛ that would cancel H to first order if msign
        # were linear; for Stiefel this is the published Λ ← Λ − α(1 − k/K)·H
        step = lam - (2 * dual_lr * (1 - k / steps)) * manifold.solve_normal(W, H)
        lam = torch.where(active[..., None, None], step, lam)
        A, H, r_new = evaluate(lam)  # a frozen matrix's H is not used again
        better = active & (r_new < best_r)
        best_A = torch.where(better[..., None, None], A, best_A)
        best_lam = torch.where(better[..., None, None], lam, best_lam)
        best_r = torch.where(better, r_new, best_r)
        r = torch.where(active, r_new, r)
        active = active & (r >= tol)
    A = best_A.mT if wide else best_A
    return A, best_lam * scale, best_r


def manifold_muon_update(
    manifold: Manifold,
    W: Tensor,
    G: Tensor,
    lr: float,
    *,
    solver: str = "project",
    ns_steps: int = 5,
    ns_coefficients: str = "polar_express",
    dual_steps: int = 20,
    dual_lr: float = 0.1,
    dual_tol: float = 1e-3,
    lam0: Tensor | None = None,
    weight_decay: float = 0.0,
    scale: float = 1.0,
    retraction: str = "adaptive",
    fixed_iterations: bool = False,
) -> tuple[Tensor, Tensor | None, float | None]:
    """One manifold-Muon step of one matrix (or a batch of equal-shape matrices).

    ``W ← retract((1 − lr·weight_decay)·W − lr·scale·A)`` with ``A`` from ``solver``
    (``"project"``: :func:`project_direction`; ``"dual"``: :func:`dual_ascent_direction`).

    Args:
        manifold: the geometry of ``W``.
        W: the current point, ``(..., m, n)``.
        G: the (Nesterov) momentum, same shape.
        lr: the spectral step size η: ``‖ηA‖_2 ≈ η`` before the retraction (up to the
            Newton–Schulz error, ≤ 1.13η with 5 Polar Express iterations, ≤ 1.2η with the
            quintic); see the module docstring for how far ``"project"`` goes along the manifold.
        solver, ns_steps, ns_coefficients, dual_steps, dual_lr, dual_tol, lam0: see the two
            solvers.
        weight_decay: decoupled weight decay (meant for the unconstrained geometry).
        scale: extra factor on the step (plain Muon's shape scale).
        retraction: ``"adaptive"`` (the geometry's checked retraction), ``"fixed"`` (its
            fixed-iteration one) or ``"auto"`` (fixed where the geometry's
            ``warm_retraction`` says it holds the constraint, else adaptive).
        fixed_iterations: no data-dependent control flow: the dual loop runs all its
            iterations and the retraction is the fixed one (``torch.compile``).

    Returns:
        ``(W_new, lam, residual)``; ``lam``/``residual`` are ``None`` for ``"project"``.
    """
    new, lam, r = batched_update(
        manifold, W, G, lr, solver=solver, ns_steps=ns_steps, ns_coefficients=ns_coefficients,
        dual_steps=dual_steps, dual_lr=dual_lr, dual_tol=dual_tol, lam0=lam0,
        weight_decay=weight_decay, scale=scale, retraction=retraction,
        fixed_iterations=fixed_iterations)
    residual = None if r is None else (float(r.max()) if r.numel() else 0.0)
    return new, lam, residual


def batched_update(
    manifold: Manifold, W: Tensor, G: Tensor, lr: float, *, solver: str = "project",
    ns_steps: int = 5, ns_coefficients: str = "polar_express", dual_steps: int = 20,
    dual_lr: float = 0.1, dual_tol: float = 1e-3, lam0: Tensor | None = None,
    weight_decay: float = 0.0, scale: float = 1.0, retraction: str = "adaptive",
    fixed_iterations: bool = False,
) -> tuple[Tensor, Tensor | None, Tensor | None]:
    """:func:`manifold_muon_update` with the dual residual per matrix (a tensor of ``W``'s
    batch shape; ``None`` for ``"project"``): the optimizer's grouped step calls it on a
    ``(n, rows, cols)`` stack of matrices of one shape and geometry, each stepped as if
    alone (up to the summation order of batched products)."""
    if solver == "dual":
        A, lam, r = dual_ascent(
            manifold, W, G, dual_steps, dual_lr, dual_tol, lam0, ns_steps=ns_steps,
            ns_coefficients=ns_coefficients, fixed_iterations=fixed_iterations)
    else:
        A = project_direction(manifold, W, G, ns_steps, ns_coefficients=ns_coefficients)
        lam, r = None, None
    if weight_decay:
        W = W * (1 - lr * weight_decay)
    fixed = (fixed_iterations or retraction == "fixed"
             or (retraction == "auto" and manifold.warm_retraction))
    return manifold.retract(W - (lr * scale) * A, fixed=fixed), lam, r
