"""The matrix sign (polar factor) ``msign(G) = U Vᵀ`` and an accurate polar factor.

``msign`` is what Muon applies to a momentum matrix: the steepest-descent direction
under the spectral norm. It runs Newton–Schulz: the input is divided by its Frobenius
norm (×1.01 for Polar Express) so every singular value lies in (0, 1], then each
iteration applies an odd quintic ``p_k(x) = a_k x + b_k x³ + c_k x⁵`` to every singular
value, on the wide orientation (the Gram ``X Xᵀ`` is the small one). Two coefficient
sets, by name (:data:`NS_COEFFICIENTS`):

* ``"polar_express"`` (the default): one triple per iteration (Amsel, Persson, Musco,
  Gower, arXiv 2505.16932, Algorithm 1), converging to 1 as iterations are added;
* ``"quintic"``: Keller Jordan's fixed (3.4445, −4.7750, 2.0315) at every iteration, the
  input divided by ‖G‖_F alone, as in his Muon and ``torch.optim.Muon``. It does not
  converge: singular values settle in about [0.68, 1.2] however many iterations run
  (five bring σ ≥ 1e-3·‖G‖_F into [0.47, 1.2]).

With Polar Express, five iterations give a direction: every singular value
σ ≥ 1e-3·‖G‖_F ends in [0.84, 1.13], enough for an optimizer step; eight bring those to 1
to float32 rounding. The range is relative to the
Frobenius norm the input is divided by, not to σ_max: ‖G‖_F is up to √rank·σ_max, so
for a spectrum with many comparable singular values it is narrower relative to the
largest (flat 768-square spectrum: 1e-3·‖G‖_F is 0.028·σ_max, and a singular value at
1e-3·σ_max comes out at about 0.035 after five iterations).

``polar`` is the accurate version used to put matrices *on* a manifold: it polishes with
the classical cubic Newton–Schulz iteration, which converges quadratically when the
input is already close to orthonormal (the usual case after a small optimizer step: one
or two iterations) and runs Polar Express first otherwise. On a tall matrix (at least twice
as many rows as columns) those Polar Express iterations run on the small ``n × n`` Gram
matrix: ``msign(Y) = Y·r(YᵀY)`` for the composed polynomial ``r``, so ``r(YᵀY)`` costs
``n³`` products per iteration instead of ``m·n²`` (:func:`_far`). It decides per matrix (checks
on the data), so it cannot be captured whole by ``torch.compile``; ``polar_fixed`` runs a
fixed number of iterations with no data-dependent control flow (the warm retraction, and
the fixed-iteration mode of the optimizer).

Precision: the iteration runs in float32 on CPU (and on CUDA unless ``bf16=True``);
``polar`` runs in the input's precision when that is float64. ``exact=True`` uses an SVD
in float64 (a reference, and for tests).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = [
    "NS_COEFFICIENTS", "POLAR_EXPRESS_COEFFS", "QUINTIC_COEFFS", "msign", "polar", "polar_fixed",
    "gram_error",
]

# Polar Express degree-5 coefficients (a, b, c), one triple per iteration, as published
# in arXiv 2505.16932 (Algorithm 1); iterations past the list reuse the last triple
# (the classical quintic Newton–Schulz 15/8, -10/8, 3/8, to which the sequence converges).
_POLAR_EXPRESS_RAW: tuple[tuple[float, float, float], ...] = (
    (8.28721201814563, -23.595886519098837, 17.300387312530933),
    (4.107059111542203, -2.9478499167379106, 0.5448431082926601),
    (3.9486908534822946, -2.908902115962949, 0.5518191394370137),
    (3.3184196573706015, -2.488488024314874, 0.51004894012372),
    (2.300652019954817, -1.6689039845747493, 0.4188073119525673),
    (1.891301407787398, -1.2679958271945868, 0.37680408948524835),
    (1.8750014808534479, -1.2500016453999487, 0.3750001645474248),
    (1.875, -1.25, 0.375),
)
# The paper's safety factor: p(x) -> p(x / 1.01) for all but the last polynomial, so
# rounding that pushes a singular value slightly above 1 cannot make it blow up.
_SAFETY = 1.01
POLAR_EXPRESS_COEFFS: tuple[tuple[float, float, float], ...] = tuple(
    (a / _SAFETY, b / _SAFETY**3, c / _SAFETY**5) for a, b, c in _POLAR_EXPRESS_RAW[:-1]
) + (_POLAR_EXPRESS_RAW[-1],)
# Keller Jordan's quintic (Muon, 2024; torch.optim.Muon's default ns_coefficients): chosen for
# a steep slope at 0 (3.4445) while iterates stay within about [0.68, 1.2].
QUINTIC_COEFFS: tuple[float, float, float] = (3.4445, -4.7750, 2.0315)


@dataclass(frozen=True)
class _Schedule:
    """One Newton–Schulz coefficient set: a triple per iteration (the last one repeats
    past the list) and the margin the input's Frobenius norm is multiplied by."""

    coeffs: tuple[tuple[float, float, float], ...]
    margin: float

    def triples(self, steps: int) -> list[tuple[float, float, float]]:
        head = list(self.coeffs[:steps])
        return head + list(itertools.repeat(self.coeffs[-1], steps - len(head)))


NS_COEFFICIENTS: dict[str, _Schedule] = {
    # 1.01: the Frobenius norm bounds σ_max; the margin absorbs rounding in low precision.
    "polar_express": _Schedule(POLAR_EXPRESS_COEFFS, _SAFETY),
    # Divided by ‖G‖_F alone, as Keller Jordan's and torch's Muon do.
    "quintic": _Schedule((QUINTIC_COEFFS,), 1.0),
}
"""The coefficient sets :func:`msign` takes by name (the settings catalog's ``ns_coefficients``)."""

# Polar Express iterations `polar` runs before polishing an input far from orthonormal.
_POLAR_FAR_STEPS = 8
# Stop polishing once max|XᵀX - I| is below this many units of the working precision.
_POLISH_TOL_ULPS = 64
# An input counts as "near" when ||XᵀX - I||_F < this: then every singular value lies in
# (sqrt(1/2), sqrt(3/2)), inside the cubic iteration's basin (0, sqrt(3)).
_NEAR = 0.5
_MAX_POLISH = 8
# Above this max|XᵀX - I| after polishing, `polar` gives up on Newton–Schulz (SVD instead).
_FALLBACK = 1e-4
# A tall matrix with at least this many rows per column takes the far iterations on its Gram
# matrix (four n³ products per iteration against two m·n² and one n³: fewer from 1.5).
_GRAM_ROWS = 2


def _fma(C: Tensor, A: Tensor, B: Tensor, beta: float, alpha: float = 1.0) -> Tensor:
    """``beta·C + alpha·A@B`` with one fused kernel for 2-D and 3-D operands."""
    if C.ndim == 2:
        return torch.addmm(C, A, B, beta=beta, alpha=alpha)
    if C.ndim == 3:
        return torch.baddbmm(C, A, B, beta=beta, alpha=alpha)
    return beta * C + alpha * (A @ B)


def _mm(A: Tensor, B: Tensor) -> Tensor:
    """``A @ B``; for 3-D operands ``bmm`` itself (one operation where ``@`` dispatches a few
    reshapes around it: on a GPU each is a launch)."""
    return torch.bmm(A, B) if A.ndim == 3 and B.ndim == 3 else A @ B


def _svd_sign(G: Tensor) -> Tensor:
    """U·sign(Σ)·Vᵀ in float64: singular values at rounding level map to 0, like NS does."""
    X = G.to(torch.float64)
    U, S, Vh = torch.linalg.svd(X, full_matrices=False)
    cutoff = S.amax(dim=-1, keepdim=True) * (max(X.shape[-2:]) * torch.finfo(X.dtype).eps)
    keep = (S > cutoff).to(X.dtype)
    return ((U * keep.unsqueeze(-2)) @ Vh).to(G.dtype)


def _svd_polar(X: Tensor) -> Tensor:
    """U Vᵀ from a float64 SVD; always orthonormal, also for rank-deficient X."""
    U, _, Vh = torch.linalg.svd(X.to(torch.float64), full_matrices=False)
    return (U @ Vh).to(X.dtype)


def msign(G: Tensor, steps: int = 5, exact: bool = False, bf16: bool = False,
          coefficients: str = "polar_express") -> Tensor:
    """Approximate polar factor ``U Vᵀ`` of the last two dims of ``G`` (``G = U Σ Vᵀ``).

    Args:
        G: ``(m, n)`` or batched ``(..., m, n)``; any real dtype, any device.
        steps: Newton–Schulz iterations (Polar Express: 5 for an optimizer direction, 8
            converge in float32).
        exact: use an SVD in float64 instead (zero singular values map to zero).
        bf16: on CUDA, iterate in bfloat16 (the paper's speed setting); ignored on CPU.
        coefficients: a name of :data:`NS_COEFFICIENTS`: ``"polar_express"`` or
            ``"quintic"`` (module docstring).

    Returns:
        A tensor of ``G``'s shape and dtype. Singular vectors are ``G``'s; singular
        values are ``p(σ/(margin·‖G‖_F))`` for the composed polynomial ``p`` (≈ 1;
        margin 1.01 for Polar Express, 1 for the quintic).
        ``msign(c·G) = msign(G)`` for every ``c > 0``.

    Example:
        >>> A = msign(torch.randn(64, 16))
        >>> bool(torch.linalg.matrix_norm(A, 2) < 1.3)
        True
    """
    if G.ndim < 2:
        raise ValueError(f"msign needs a matrix or a batch of matrices, got shape {tuple(G.shape)}")
    schedule = NS_COEFFICIENTS.get(coefficients)
    if schedule is None:
        raise ValueError(f"unknown Newton–Schulz coefficients {coefficients!r}; expected one of: "
                         f"{', '.join(NS_COEFFICIENTS)}")
    if exact:
        return _svd_sign(G)
    work = torch.bfloat16 if (bf16 and G.is_cuda) else torch.float32
    X = G.to(work)
    tall = X.shape[-2] > X.shape[-1]
    if tall:  # iterate on the wide orientation: the Gram X Xᵀ is min(m, n) square
        X = X.mT
    X = X / (torch.linalg.vector_norm(X, dim=(-2, -1), keepdim=True) * schedule.margin + 1e-30)
    for a, b, c in schedule.triples(steps):
        A = _mm(X, X.mT)  # (.., k, k), k = min(m, n)
        B = _fma(A, A, A, beta=b, alpha=c)  # bA + cA²
        X = _fma(X, B, X, beta=a)  # aX + bX³ + cX⁵
    if tall:
        X = X.mT
    return X.to(G.dtype)


def _far(Y: Tensor, steps: int) -> Tensor:
    """``msign(Y, steps)`` (Polar Express) for a tall ``Y`` in its own dtype (float32 or 64).

    With ``m ≥ 2n`` rows the iterations run on the Gram matrix: each step of ``msign``,
    ``X ← X·p(XᵀX)``, keeps ``X = Y·R`` with ``R`` a polynomial in ``M = YᵀY``, so
    ``R ← R·p(S)`` and ``S = XᵀX ← p(S)·S·p(S)`` need only ``n × n`` products; the result
    ``Y·R`` has ``Y``'s singular vectors exactly (``R`` commutes with ``M``), the polish that
    follows in :func:`polar` and :func:`polar_fixed` takes it to the polar factor."""
    m, n = Y.shape[-2:]
    if m < _GRAM_ROWS * n:
        return msign(Y, steps=steps).to(Y.dtype)
    schedule = NS_COEFFICIENTS["polar_express"]
    M = _mm(Y.mT, Y)
    scale = torch.linalg.vector_norm(Y, dim=(-2, -1), keepdim=True) * schedule.margin + 1e-30
    eye = torch.eye(n, dtype=Y.dtype, device=Y.device)
    R, S = None, M / scale.square()
    for a, b, c in schedule.triples(steps):
        P = _fma(torch.add(eye, S, alpha=b / a), S, S, beta=a, alpha=c)  # a + bS + cS²
        R = P if R is None else _mm(R, P)
        S = _mm(P, _mm(S, P))
    return Y / scale if R is None else _mm(Y, R / scale)


def gram_error(X: Tensor) -> Tensor:
    """``max|XᵀX - I|`` per matrix over the small Gram (shape = batch dims)."""
    gram = X.mT @ X if X.shape[-2] >= X.shape[-1] else X @ X.mT
    eye = torch.eye(gram.shape[-1], dtype=gram.dtype, device=gram.device)
    return (gram - eye).abs().amax(dim=(-2, -1))


def polar(X: Tensor, exact: bool = False) -> Tensor:
    """Accurate orthonormal polar factor of ``X`` (for projections and retractions).

    Near-orthonormal inputs (``‖XᵀX − I‖_F < 0.5``, e.g. a Stiefel point after a small
    step) are polished with the cubic Newton–Schulz iteration ``X ← X(3I − XᵀX)/2``,
    which converges quadratically (one or two iterations after a step of 0.02), until
    ``max|XᵀX − I|`` is within 64 ulps, then takes one more step to the rounding floor.
    Inputs further away first get 8 Polar Express iterations.
    Inputs that still have not converged (rank-deficient, or a smallest singular value
    below about 2e-5 of the Frobenius norm) fall back to the SVD, so the result always
    has orthonormal columns (rows, if wide): unlike :func:`msign`, zero singular values
    are completed to an orthonormal frame.

    Args:
        X: ``(m, n)`` or ``(..., m, n)``.
        exact: SVD in float64 instead.

    Returns:
        ``U Vᵀ`` with ``X = U Σ Vᵀ`` (full-rank ``X``), same shape and dtype as ``X``:
        orthonormal to the working precision; equal to ``U Vᵀ`` to working precision for
        near inputs and to float32 accuracy (≈1e-6) for far ones.
    """
    if exact:
        return _svd_polar(X)
    work = torch.promote_types(X.dtype, torch.float32)
    wide = X.shape[-2] < X.shape[-1]
    Xt = X.mT if wide else X
    Y = Xt.to(work).reshape(-1, *Xt.shape[-2:])  # (batch, m, n), m >= n
    eye = torch.eye(Y.shape[-1], dtype=work, device=Y.device)
    tol = _POLISH_TOL_ULPS * torch.finfo(work).eps
    E = Y.mT @ Y - eye
    # Each matrix takes its own path, so a batch gives what a loop would.
    far = ~(torch.linalg.matrix_norm(E) < _NEAR)
    if bool(far.any()):
        Y = torch.where(far[:, None, None], _far(Y, _POLAR_FAR_STEPS), Y)
        E = Y.mT @ Y - eye
    for _ in range(_MAX_POLISH):
        todo = E.abs().amax(dim=(-2, -1)) > tol  # NaN compares False: stops, passes through
        if not bool(todo.any()):
            break
        Y = torch.where(todo[:, None, None], Y - 0.5 * (Y @ E), Y)  # Y (3I − YᵀY) / 2
        E = Y.mT @ Y - eye
    # One last correction with the Gram already at hand: it takes the error from the
    # stopping tolerance to the rounding floor (quadratic convergence) for one product.
    Y = Y - 0.5 * (Y @ E)
    failed = E.abs().amax(dim=(-2, -1)) > _FALLBACK
    if bool(failed.any()):  # not converged (rank-deficient or very ill-conditioned): SVD
        Y = torch.where(failed[:, None, None], _svd_polar(Xt.reshape(Y.shape).to(work)), Y)
    Y = Y.reshape(Xt.shape)
    return (Y.mT if wide else Y).to(X.dtype)


def polar_fixed(X: Tensor, polish: int, far: int = 0) -> Tensor:
    """Polar factor by a fixed number of iterations: no data-dependent control flow.

    ``far`` Polar Express iterations (for inputs far from orthonormal; 0 for a warm start),
    then ``polish`` cubic Newton–Schulz iterations ``Y ← Y − ½·Y(YᵀY − I)``. From a point
    with singular values ``1 ± ε`` one iteration leaves about ``1.5ε²``: after a step of
    spectral size 0.02 from an orthonormal matrix, two reach float32 rounding. Nothing
    is checked (no SVD fallback), so ``torch.compile`` captures it whole; the caller
    chooses it where the input is known to be near (a retraction after a small step).

    Args:
        X: ``(m, n)`` or ``(..., m, n)``.
        polish: cubic iterations.
        far: Polar Express iterations first.

    Returns:
        The approximate ``U Vᵀ``, ``X``'s shape and dtype (computed in at least float32).
    """
    work = torch.promote_types(X.dtype, torch.float32)
    wide = X.shape[-2] < X.shape[-1]
    Y = (X.mT if wide else X).to(work)
    if far:
        Y = _far(Y, far)
    eye = torch.eye(Y.shape[-1], dtype=work, device=Y.device).expand(*Y.shape[:-2], -1, -1)
    for _ in range(polish):
        E = _fma(eye, Y.mT, Y, beta=-1.0)  # YᵀY − I
        Y = _fma(Y, Y, E, beta=1.0, alpha=-0.5)  # Y (3I − YᵀY) / 2
    return (Y.mT if wide else Y).to(X.dtype)
