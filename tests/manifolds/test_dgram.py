"""DGram retraction ``Q·diag(colsum(Q ∘ W))`` with ``Q = polar(W)``: fixed points, landing
on the set, and how far one manifold-Muon step moves a weight, with spread column norms."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from geosearch.manifolds import get_manifold, polar
from geosearch.optim.solvers import manifold_muon_update, project_direction

M = get_manifold("dgram")


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def dgram_point(shape, spread: float, base: float = 1.0, seed: int = 0, dtype=torch.float64) -> torch.Tensor:
    """Orthonormal columns (rows, if wide) times norms log-spaced over ``base·[1, spread]``,
    shuffled so they are not sorted."""
    *batch, m, n = shape
    tall, k = (max(m, n), min(m, n)), min(m, n)
    Q = torch.linalg.qr(torch.randn(*batch, *tall, generator=_gen(seed), dtype=torch.float64))[0]
    d = base * torch.logspace(0, math.log10(spread), k, dtype=torch.float64)
    W = Q * d[torch.randperm(k, generator=_gen(seed + 1))]
    return (W if m >= n else W.mT).to(dtype)


def _tall(X: torch.Tensor) -> torch.Tensor:
    return X.mT if X.shape[-2] < X.shape[-1] else X


def _relative_gram_error(W: torch.Tensor) -> float:
    """max|Off(WᵀW)| over the largest squared column norm (the set's equation, scale-free)."""
    X = _tall(W).double()
    return float(M.constraint_error(X).max() / (X * X).sum(dim=-2).max())


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("spread", [1, 50, 1e3, 1e6])
@pytest.mark.parametrize("shape", [(40, 12), (12, 40), (16, 16), (3, 30, 8)],
                         ids=["tall", "wide", "square", "batched"])
def test_points_of_the_set_are_fixed_whatever_their_norms(shape, spread, dtype):
    W = dgram_point(shape, spread, dtype=dtype)
    X = _tall(W).double()
    norms = torch.linalg.vector_norm(X, dim=-2)
    first = norms.reshape(-1, norms.shape[-1])[0]
    # Rule: the fixture's column norms are spread as asked and (when not all equal) unsorted.
    assert float(first.max() / first.min()) == pytest.approx(spread, rel=1e-3)
    assert spread == 1 or not torch.equal(first, first.sort(descending=True).values)
    for exact in (False, True):
        R = _tall(M.retract(W, exact=exact)).double()
        # Rule: retract (and project) leave points of the set where they are, every column to
        # 1e-5 of its own norm: small columns are kept as exactly as large ones. Norms spread
        # beyond what Newton–Schulz resolves (1e6 here) go through the SVD fallback.
        col_error = torch.linalg.vector_norm(R - X, dim=-2) / norms
        assert float(col_error.max()) < 1e-5
        assert torch.allclose(M.project(W, exact=exact), M.retract(W, exact=exact))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("scales", ["equal", "spread 50x", "zero column"])
def test_retraction_lands_on_the_set(scales, dtype):
    W = torch.randn(3, 30, 10, generator=_gen(2), dtype=torch.float64)
    if scales == "spread 50x":
        norms = torch.logspace(0, math.log10(50), 10, dtype=torch.float64)
        W = W * norms[torch.randperm(10, generator=_gen(3))]
    if scales == "zero column":
        W[:, :, 4] = 0
    R = M.retract(W.to(dtype))
    # Rule: any matrix lands on the set to 1e-5 relative to its largest squared column norm
    # (a zero column is rank deficiency: the SVD fallback handles it and the column stays 0).
    assert _relative_gram_error(R) < 1e-5
    assert R.dtype == dtype and torch.isfinite(R).all()
    if scales == "zero column":
        assert float(R[:, :, 4].abs().max()) == 0.0


def _column_normalised_retract(W: torch.Tensor) -> torch.Tensor:
    """The previous retraction (polar factor of W with normalised columns), for tall W:
    only here to show that the step bound below can fail."""
    Q = polar(W / torch.linalg.vector_norm(W, dim=-2, keepdim=True))
    return Q * (Q * W).sum(dim=-2, keepdim=True)


def test_one_step_moves_a_weight_by_at_most_twice_the_step():
    # Random DGram weights (equal norms, or norms spread 50×; overall scale 0.02 like
    # GPT-2's init, or 1), momenta Gaussian, rank one, or rank one weighted towards the
    # large or the small columns, spectral steps 0.02 and 0.1, tall / square / wide.
    worst, worst_fro, worst_previous = 0.0, 0.0, 0.0
    cases = itertools.product([(96, 32), (32, 32), (24, 64)], [1, 50], [0.02, 1.0],
                              ["gaussian", "rank one", "towards large", "towards small"], [0.02, 0.1])
    for seed, (shape, spread, base, kind, eta) in enumerate(cases):
        W = dgram_point(shape, spread, base, seed=seed, dtype=torch.float32)
        X = _tall(W)
        g = _gen(1000 + seed)
        if kind == "gaussian":
            G = torch.randn(X.shape, generator=g)
        else:
            G = torch.randn(X.shape[0], 1, generator=g) @ torch.randn(1, X.shape[1], generator=g)
            norms = torch.linalg.vector_norm(X, dim=0)
            G = G * norms if kind == "towards large" else G / norms if kind == "towards small" else G
        G = G if W.shape == X.shape else G.mT
        new, _, _ = manifold_muon_update(M, W, G, eta, solver="project")
        A = project_direction(M, W, G)  # the direction that update stepped along
        step = eta * float(torch.linalg.matrix_norm(A.double(), 2))  # ‖ηA‖₂ ≈ 1.1η (5 NS steps)
        # Rule: the step lands on the set.
        assert _relative_gram_error(new) < 1e-5
        move = (new - W).double()
        worst = max(worst, float(torch.linalg.matrix_norm(move, 2)) / step)
        worst_fro = max(worst_fro, float(move.norm()) / (eta * float(A.double().norm())))
        previous = _column_normalised_retract(X - eta * _tall(A)) - X
        worst_previous = max(worst_previous, float(torch.linalg.matrix_norm(previous.double(), 2)) / step)
    # Rule: one step moves W by at most 2.2·‖ηA‖₂ in spectral norm. Why about 2: the move is
    # the step ηA plus the retraction's correction Q'·Off(|W'|), W' = W − ηA, which is the
    # off-diagonal part of |W'| − |W| and so about as large as the step itself (the nearest
    # point of the set is within ‖ηA‖ of W'). Measured over these 96 cases: at most 1.8;
    # over wider searches (128×128, norms spread 1000×): 2.17.
    assert worst <= 2.2
    # Rule: in Frobenius norm the bound is a theorem, whatever the column norms:
    # ‖R(W') − W‖_F ≤ ‖ηA‖_F + ‖|W'| − |W|‖_F ≤ (1 + √2)·‖ηA‖_F.
    assert worst_fro <= 1 + math.sqrt(2)
    # Rule: the bound is not vacuous: the previous, column-normalised retraction breaks it
    # on the same steps (small columns drag the large ones along).
    assert worst_previous > 5
