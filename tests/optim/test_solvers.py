"""Direction solvers: dual ascent (scale-free step) and the one-msign projection."""

from __future__ import annotations

import pytest
import torch

from geosearch.manifolds import get_manifold, manifold_names, msign
from geosearch.optim.solvers import (
    batched_update, dual_ascent_direction, manifold_muon_update, project_direction,
)

GRAM = [n for n in manifold_names() if get_manifold(n).is_gram]




def _randn(shape, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def _point(name: str, shape, seed: int = 0) -> torch.Tensor:
    if name != "dgram":
        return get_manifold(name).project(_randn(shape, seed), exact=True)
    # DGram: orthonormal columns (rows, if wide) with free, unsorted norms in [0.2, 2]
    Q = get_manifold("stiefel").project(_randn(shape, seed), exact=True)
    k = min(shape)
    order = torch.randperm(k, generator=torch.Generator().manual_seed(1))
    norms = torch.linspace(0.2, 2.0, k, dtype=torch.float64)[order]
    return Q * norms if shape[0] >= shape[1] else Q * norms[:, None]


def _residual(name: str, W: torch.Tensor, A: torch.Tensor) -> float:
    M = get_manifold(name)
    if W.shape[-2] < W.shape[-1]:
        W, A = W.mT, A.mT
    H = M.tangent_residual(W, A)
    return float(H.norm() / H.shape[-1])


@pytest.mark.parametrize("name", GRAM)
@pytest.mark.parametrize("shape", [(24, 8), (8, 24)], ids=["tall", "wide"])
@pytest.mark.parametrize("scale", [1e-3, 1.0, 1e3])
def test_dual_ascent_meets_its_tolerance_at_every_gradient_scale(name, shape, scale):
    W = _point(name, shape)
    G = scale * _randn(shape, 2)
    tol = 1e-3
    A, lam, residual = dual_ascent_direction(get_manifold(name), W, G, steps=50, dual_lr=0.1, tol=tol,
                                             exact=True)
    # Rule: the returned direction is tangent to the tolerance, for ‖G‖ = 1e-3, 1 and 1e3
    # alike (the dual step does not depend on the scale of G), and the reported residual
    # is that of the returned direction.
    assert residual < tol
    assert abs(_residual(name, W, A) - residual) < 1e-12
    # Rule: the direction lies in the unit spectral-norm ball.
    assert torch.linalg.matrix_norm(A, 2) < 1 + 1e-9
    # Rule: it is a descent direction: ⟨G, A⟩ > 0 (the step is W − ηA).
    assert float((G * A).sum()) > 0
    assert lam is not None and lam.shape == (min(shape), min(shape))


@pytest.mark.parametrize("name", GRAM)
def test_dual_ascent_result_is_scale_equivariant(name):
    M, W, G = get_manifold(name), _point(name, (20, 6)), _randn((20, 6), 3)
    A1, lam1, r1 = dual_ascent_direction(M, W, G, steps=10, tol=0.0)
    A2, lam2, r2 = dual_ascent_direction(M, W, 1e3 * G, steps=10, tol=0.0)
    # Rule: scaling G scales Λ and leaves the direction unchanged (NS path, float32).
    assert (A1 - A2).abs().max() < 1e-5
    assert torch.allclose(lam2, 1e3 * lam1, rtol=1e-4, atol=1e-8)
    assert abs(r1 - r2) < 1e-5


def test_fixed_published_step_stalls_at_small_gradients_where_ours_does_not():
    M, W, G = get_manifold("stiefel"), _point("stiefel", (24, 8)), 1e-3 * _randn((24, 8), 4)
    lam = -0.25 * (W.mT @ G + G.mT @ W)  # published: fixed α = 0.1, G not rescaled
    for k in range(20):
        A = msign(G + 2 * W @ lam, exact=True)
        H = W.mT @ A + A.mT @ W
        lam = lam - 0.1 * (1 - k / 20) * H
    published = float(H.norm() / 8)
    _, _, ours = dual_ascent_direction(M, W, G, steps=20, tol=0.0, exact=True)
    # Rule: at ‖G‖ ~ 1e-3 the unscaled step overshoots and the residual stays large;
    # the scale-free step converges (this is why the step is measured in G's scale).
    assert published > 0.1 > 10 * ours


@pytest.mark.parametrize("n", [6, 8])
def test_square_stiefel_matches_the_closed_form(n):
    M = get_manifold("stiefel")
    W, G = M.project(_randn((n, n), 5), exact=True), _randn((n, n), 6)
    B = W.mT @ G
    closed = W @ msign((B - B.mT) / 2, exact=True)  # W·msign(skew(WᵀG))
    A_dual, _, residual = dual_ascent_direction(M, W, G, steps=20, tol=1e-10, exact=True)
    # Rule: for square orthogonal W the tangent steepest direction is W·msign(skew(WᵀG)),
    # which both solvers reach (the dual ascent from its first iterate).
    assert residual < 1e-10
    assert torch.allclose(A_dual, closed, atol=1e-10)
    assert torch.allclose(project_direction(M, W, G, exact=True), closed, atol=1e-10)
    # Rule: it is optimal: no feasible direction has a larger ⟨G, A⟩ (here vs. a random one).
    K = _randn((n, n), 7)
    other = W @ msign(K - K.mT, exact=True)
    assert float((G * closed).sum()) >= float((G * other).sum())


@pytest.mark.parametrize("name", GRAM)
def test_project_solver_is_close_to_the_dual_solution(name):
    M, W, G = get_manifold(name), _point(name, (32, 8)), _randn((32, 8), 8)
    A_dual, _, residual = dual_ascent_direction(M, W, G, steps=50, tol=1e-4, exact=True)
    A_proj = project_direction(M, W, G, exact=True)
    cosine = float((A_dual * A_proj).sum() / (A_dual.norm() * A_proj.norm()))
    # Rule: the one-msign direction is a close approximation of the tangent optimum, and
    # the dual ascent (which starts from it) is at least as tangent.
    assert cosine > 0.98
    assert residual <= _residual(name, W, A_proj) + 1e-12


@pytest.mark.parametrize("name", GRAM)
def test_newton_schulz_dual_ascent_stays_near_the_unit_ball(name):
    M, W, G = get_manifold(name), _point(name, (24, 8)), _randn((24, 8), 9)
    A, _, residual = dual_ascent_direction(M, W, G, steps=20, tol=1e-3)
    # Rule: with 5 Newton–Schulz iterations ‖A‖_2 ≤ 1 up to the iteration's error (< 0.3),
    # and the residual is still small.
    assert torch.linalg.matrix_norm(A, 2) < 1.3
    assert residual < 2e-2


def test_warm_start_resumes_from_the_returned_dual_variable():
    M, W, G = get_manifold("dgram"), _point("dgram", (24, 8)), 5.0 * _randn((24, 8), 10)
    A1, lam, r1 = dual_ascent_direction(M, W, G, steps=50, tol=1e-4, exact=True)
    A2, lam2, r2 = dual_ascent_direction(M, W, G, steps=50, tol=1e-4, lam0=lam, exact=True)
    # Rule: Λ is returned in G's units; starting from it, the first iterate is the answer.
    assert torch.allclose(A1, A2, atol=1e-12) and abs(r2 - r1) < 1e-12
    assert torch.allclose(lam, lam2)


@pytest.mark.parametrize("name", [n for n in manifold_names() if not get_manifold(n).is_gram])
def test_sets_without_gram_projector_use_plain_msign(name):
    M, W, G = get_manifold(name), 0.1 * _randn((12, 5), 11), _randn((12, 5), 12)
    A, lam, residual = dual_ascent_direction(M, W, G)
    # Rule: no dual problem: A = msign(G) (= the projection solver), Λ None, residual 0.
    assert torch.allclose(A, msign(G)) and lam is None and residual == 0.0
    assert torch.allclose(project_direction(M, W, G), msign(G))


def test_batched_dual_ascent_equals_looped():
    M = get_manifold("stiefel")
    W = torch.stack([_point("stiefel", (16, 6), s) for s in range(3)])
    G = _randn((3, 16, 6), 13)
    A, lam, residual = dual_ascent_direction(M, W, G, steps=15, tol=0.0, exact=True)
    looped = [dual_ascent_direction(M, w, g, steps=15, tol=0.0, exact=True) for w, g in zip(W, G)]
    # Rule: batched blocks are independent problems; the residual is the worst block's.
    assert torch.allclose(A, torch.stack([x[0] for x in looped]), atol=1e-10)
    assert abs(residual - max(x[2] for x in looped)) < 1e-12


@pytest.mark.parametrize("solver", ["project", "dual"])
@pytest.mark.parametrize("name", manifold_names())
def test_one_update_stays_on_the_manifold_and_descends(name, solver):
    M = get_manifold(name)
    W = _point(name, (20, 6)) if name != "spectral_ball" else M.project(_randn((20, 6), 0))
    G = _randn((20, 6), 14)
    new, lam, residual = manifold_muon_update(M, W, G, 0.05, solver=solver)
    # Rule: the update lands on the manifold, moves against G, and reports the dual's
    # results only for the dual solver.
    assert M.constraint_error(new) < 1e-5
    assert float((G * (new - W)).sum()) < 0
    assert (residual is None) == (solver == "project")


@pytest.mark.slow
@pytest.mark.parametrize("solver", ["project", "dual"])
@pytest.mark.parametrize("name", manifold_names())
def test_fixed_iteration_step_compiles_in_one_graph(name, solver):
    import torch._dynamo

    M = get_manifold(name)
    W = M.project(torch.randn(2, 8, 4, generator=torch.Generator().manual_seed(0)))
    G = torch.randn(2, 8, 4, generator=torch.Generator().manual_seed(1))

    def step(W, G, fixed):
        return batched_update(M, W, G, 0.02, solver=solver, dual_steps=3, fixed_iterations=fixed)

    torch._dynamo.reset()
    explained = torch._dynamo.explain(lambda W, G: step(W, G, True))(W, G)
    # Rule: no data-dependent control flow in the fixed-iteration mode: one graph, no break.
    assert explained.graph_break_count == 0 and explained.graph_count == 1, explained.break_reasons
    if solver == "dual" and M.is_gram:
        # the tolerance-stopped loop asks the data whether to go on: that is a graph break
        torch._dynamo.reset()
        assert torch._dynamo.explain(lambda W, G: step(W, G, False))(W, G).graph_break_count > 0
    # and the fixed mode steps as the default does (the same map to float rounding)
    new, _, _ = step(W, G, True)
    ref, _, _ = step(W, G, False)
    assert torch.allclose(new, ref, atol=1e-5)
