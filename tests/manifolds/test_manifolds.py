"""Geometries: one contract test over every registered manifold, then specifics.

Adding a geometry to the registry adds it to every test parametrised over NAMES; the
fixtures below build on-manifold points for the known geometries independently of
``project`` and fall back to ``project(random, exact=True)`` for new ones.
"""

from __future__ import annotations

import pytest
import torch

import geosearch.manifolds as registry
from geosearch.manifolds import (
    Manifold,
    UnknownManifoldError,
    geometry_names,
    get_manifold,
    manifold_names,
    msign,
    register_manifold,
)
from geosearch.manifolds.spectral_ball import _msign_cap

NAMES = manifold_names()
SHAPES = {
    "tall": (12, 5),
    "wide": (5, 12),
    "square": (6, 6),
    "batched": (3, 12, 5),
    "batched_wide": (2, 5, 9),
}
# Unsorted column norms: a retraction that re-sorts them moves these points.
DGRAM_NORMS = [0.5, 2.0, 0.1, 1.3, 0.8, 1.7, 0.3, 1.1, 0.6]




def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _randn(shape, seed: int, dtype=torch.float64) -> torch.Tensor:
    return torch.randn(*shape, generator=_gen(seed), dtype=torch.float64).to(dtype)


def _tall(shape) -> tuple[tuple[int, ...], bool]:
    *batch, m, n = shape
    return (*batch, max(m, n), min(m, n)), m < n


def on_manifold(name: str, shape, seed: int = 0, interior: bool = False) -> torch.Tensor:
    """A float64 point of the geometry, built from its definition (not from project)."""
    tall_shape, wide = _tall(shape)
    *batch, m, n = tall_shape
    X = _randn(tall_shape, seed)
    Q = torch.linalg.qr(X)[0]  # orthonormal columns
    if name == "euclidean":
        W = X
    elif name == "stiefel":
        W = Q
    elif name == "dgram":
        W = Q * torch.tensor(DGRAM_NORMS[:n], dtype=torch.float64)
    elif name == "oblique":
        W = X / torch.linalg.vector_norm(X, dim=-2, keepdim=True)
    elif name == "sphere":
        W = X * (n**0.5 / torch.linalg.vector_norm(X, dim=(-2, -1), keepdim=True))
    elif name == "spectral_ball":
        V = torch.linalg.qr(_randn((*batch, n, n), seed + 1))[0]
        sigma = torch.linspace(0.1, 0.9 if interior else 1.0, n, dtype=torch.float64)
        W = (Q * sigma) @ V.mT  # singular values in [0.1, 1]: σ_max = 1 on the boundary
    else:  # a geometry registered later: trust its exact projection
        W = get_manifold(name).project(X, exact=True)
    return W.mT if wide else W


def tangency_defect(M: Manifold, W: torch.Tensor, T: torch.Tensor, t: float = 1e-4) -> float:
    """Constraint error after a move of length t along T, over t²: bounded iff T is tangent."""
    return float(M.constraint_error(W + t * T).max()) / t**2


# ------------------------------------------------------------------ contract tests
@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("shape", list(SHAPES.values()), ids=list(SHAPES))
def test_project_lands_on_manifold(name, shape):
    M = get_manifold(name)
    W = 3.0 * _randn(shape, 1)
    exact = M.project(W, exact=True)
    # Rule: the exact (SVD, float64) projection satisfies the equation to 1e-5.
    assert M.constraint_error(exact).max() < 1e-5
    assert M.check(exact, atol=1e-5)[0]
    # Rule: the Newton–Schulz projection of a float32 matrix satisfies it to 1e-3.
    ns = M.project(W.float())
    assert ns.dtype == torch.float32 and ns.shape == W.shape
    assert M.constraint_error(ns).max() < 1e-3


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("shape", list(SHAPES.values()), ids=list(SHAPES))
def test_project_is_idempotent(name, shape):
    M = get_manifold(name)
    W = _randn(shape, 2)
    once = M.project(W, exact=True)
    # Rule: projecting a projected point changes nothing (exact path, float64).
    assert torch.allclose(M.project(once, exact=True), once, atol=1e-10)
    once32 = M.project(W.float())
    # Rule: the same for the Newton–Schulz path in float32, to 1e-4.
    assert (M.project(once32) - once32).abs().max() < 1e-4


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("shape", list(SHAPES.values()), ids=list(SHAPES))
def test_points_on_manifold_are_fixed(name, shape):
    M = get_manifold(name)
    X = on_manifold(name, shape)
    # Rule: the fixture satisfies the defining equation (DGram: unsorted norms).
    assert M.check(X, atol=1e-10)[0], M.check(X, atol=1e-10)[1]
    # Rule: project and retract return on-manifold points unchanged, both paths.
    assert torch.allclose(M.project(X, exact=True), X, atol=1e-10)
    assert torch.allclose(M.retract(X, exact=True), X, atol=1e-10)
    assert (M.project(X) - X).abs().max() < 1e-5
    assert (M.retract(X) - X).abs().max() < 1e-5


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("shape", list(SHAPES.values()), ids=list(SHAPES))
def test_to_tangent_is_tangent_orthogonal_and_idempotent(name, shape):
    M = get_manifold(name)
    X = on_manifold(name, shape, interior=True)
    G = _randn(shape, 3)
    T = M.to_tangent(X, G)
    # Rule: a move of length t along T violates the equation only at order t².
    assert tangency_defect(M, X, T) < 10 * (1 + float(T.square().sum()))
    if M.is_gram:
        # Rule (makes the line above able to fail): along raw G the violation is order t.
        assert tangency_defect(M, X, G) > 1e3
    # Rule: projecting twice is projecting once.
    assert torch.allclose(M.to_tangent(X, T), T, atol=1e-10)
    # Rule: the projection is orthogonal: the removed part G − T is orthogonal to T.
    assert abs(float(((G - T) * T).sum())) < 1e-10 * (1 + float(G.square().sum()))


@pytest.mark.parametrize("name", NAMES)
def test_wide_is_the_transposed_tall_problem(name):
    M = get_manifold(name)
    W, G = _randn((5, 11), 4), _randn((5, 11), 5)
    X = on_manifold(name, (5, 11))
    # Rule: a wide weight is transposed in and out.
    assert torch.allclose(M.project(W, exact=True), M.project(W.mT, exact=True).mT, atol=1e-12)
    assert torch.allclose(M.project(W), M.project(W.mT).mT, atol=1e-12)
    assert torch.allclose(M.to_tangent(X, G), M.to_tangent(X.mT, G.mT).mT, atol=1e-12)
    assert torch.allclose(M.constraint_error(W), M.constraint_error(W.mT))


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("shape", [SHAPES["batched"], SHAPES["batched_wide"]], ids=["tall", "wide"])
def test_batched_equals_looped(name, shape):
    M = get_manifold(name)
    W, G = _randn(shape, 6), _randn(shape, 7)
    X = on_manifold(name, shape, interior=True)
    # Rule: every method treats the leading dims as independent matrices (to float64
    # rounding on the exact path, to float32 rounding where Newton–Schulz runs).
    for exact, atol in ((True, 1e-10), (False, 1e-5)):
        looped = torch.stack([M.project(w, exact=exact) for w in W])
        assert torch.allclose(M.project(W, exact=exact), looped, atol=atol)
    looped_t = torch.stack([M.to_tangent(x, g) for x, g in zip(X, G)])
    assert torch.allclose(M.to_tangent(X, G), looped_t, atol=1e-12)
    errors = M.constraint_error(W)
    assert errors.shape == shape[:1]
    assert torch.allclose(errors, torch.stack([M.constraint_error(w) for w in W]))


@pytest.mark.parametrize("name", NAMES)
def test_check_names_the_failed_equation(name):
    M = get_manifold(name)
    X = on_manifold(name, (9, 4))
    ok, reason = M.check(X)
    # Rule: an on-manifold point passes and the reason states the equation.
    assert ok and M.equation in reason
    bad = torch.full_like(X, float("nan"))
    # Rule: non-finite entries never pass.
    assert M.check(bad) == (False, f"{name}: W has non-finite entries")
    if name == "euclidean":
        return
    ok, reason = M.check(2.0 * X + 0.3, atol=1e-5)
    # Rule: a point off the set fails, naming the equation, the error and the tolerance.
    assert not ok
    assert M.equation in reason and "atol 1e-05" in reason and M.error_text in reason
    ok, reason = M.check(torch.stack([X, 2.0 * X + 0.3]), atol=1e-5)
    # Rule: in a batch, the worst matrix is named.
    assert not ok and "batch index (1,)" in reason


@pytest.mark.parametrize("name", NAMES)
def test_gram_projector_is_a_self_adjoint_projector(name):
    M = get_manifold(name)
    S, T = _randn((5, 5), 8), _randn((5, 5), 9)
    S, T = S + S.mT, T + T.mT
    PS = M.gram_projector(S)
    if not M.is_gram:
        # Rule: sets that are not {P(WᵀW − I) = 0} have no projector.
        assert PS is None
        assert M.normal_coefficients(on_manifold(name, (9, 5)), _randn((9, 5), 10)) is None
        return
    # Rule: P is idempotent and self-adjoint on symmetric matrices.
    assert torch.allclose(M.gram_projector(PS), PS, atol=1e-12)
    assert torch.allclose((PS * T).sum(), (S * M.gram_projector(T)).sum(), atol=1e-10)
    # Rule: the defining equation is P(WᵀW − I) = 0 at on-manifold points.
    X = on_manifold(name, (9, 5))
    assert M.gram_projector(X.mT @ X - torch.eye(5, dtype=X.dtype)).abs().max() < 1e-12


@pytest.mark.parametrize("name", [n for n in NAMES if get_manifold(n).is_gram])
@pytest.mark.parametrize("shape", [(9, 5), (5, 9)], ids=["tall", "wide"])
def test_normal_coefficients_give_the_tangent_projection(name, shape):
    M = get_manifold(name)
    X, G = on_manifold(name, shape), _randn(shape, 11)
    S = M.normal_coefficients(X, G)
    normal = X @ S if shape[0] >= shape[1] else S @ X
    # Rule: to_tangent(W, G) = G − W S (tall), G − S W (wide), with S = P(S) symmetric.
    assert torch.allclose(M.to_tangent(X, G), G - normal, atol=1e-12)
    assert torch.allclose(S, S.mT) and torch.allclose(M.gram_projector(S), S, atol=1e-12)
    Xt = X if shape[0] >= shape[1] else X.mT
    gram = Xt.mT @ Xt
    # Rule: solve_normal inverts S ↦ P(WᵀW S + S WᵀW).
    assert torch.allclose(M.solve_normal(Xt, M.gram_projector(gram @ S + S @ gram)), S, atol=1e-10)


# ----------------------------------------------------------------------- registry
def test_unknown_name_lists_known_geometries():
    with pytest.raises(UnknownManifoldError) as info:
        get_manifold("stiefle")
    # Rule: the error is a KeyError and a ValueError and names every known geometry.
    assert isinstance(info.value, KeyError) and isinstance(info.value, ValueError)
    assert "'stiefle'" in str(info.value)
    assert all(n in str(info.value) for n in NAMES)


def test_registry_names_and_registration():
    # Rule: the six documented geometries are registered; "adamw" is not a manifold.
    assert set(NAMES) >= {"euclidean", "stiefel", "dgram", "oblique", "sphere", "spectral_ball"}
    assert geometry_names() == NAMES + ["adamw"]
    # Rule: registering a taken name or "adamw" is refused.
    with pytest.raises(ValueError, match="already registered"):
        register_manifold(type(get_manifold("stiefel")))

    class AdamW(Manifold):
        name = "adamw"

    with pytest.raises(ValueError, match="adamw"):
        register_manifold(AdamW)


class _Doubled(Manifold):
    """A test geometry: Stiefel scaled by 2 (WᵀW = 4I)."""

    name = "doubled_stiefel"

    def _project(self, W, exact):
        return 2 * get_manifold("stiefel").project(W, exact)

    def _to_tangent(self, W, G):
        return get_manifold("stiefel").to_tangent(W / 2, G)

    def _constraint_error(self, W):
        return get_manifold("stiefel").constraint_error(W / 2)


def test_geometry_names_follow_later_registrations(monkeypatch):
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))  # undone after the test
    register_manifold(_Doubled)
    # Rule: the names are read from the registry at each call, never from a stale snapshot.
    assert "doubled_stiefel" in manifold_names() and "doubled_stiefel" in geometry_names()
    assert geometry_names()[-1] == "adamw"
    W = get_manifold("doubled_stiefel").project(torch.randn(8, 4, dtype=torch.float64))
    assert torch.allclose(W.mT @ W, 4 * torch.eye(4, dtype=torch.float64), atol=1e-10)


def test_base_class_methods_are_abstract():
    class NoProjection(Manifold):
        name = "no_projection"

    # Rule: a geometry without _project can be neither instantiated nor registered.
    with pytest.raises(TypeError, match="_project"):
        NoProjection()
    with pytest.raises(ValueError, match="does not define _project"):
        register_manifold(NoProjection)

    class NoConstraint(Manifold):
        name = "no_constraint"

        def _project(self, W, exact):
            return W

    # Rule: a set that is not a Gram manifold must measure its own constraint, not report 0.
    with pytest.raises(NotImplementedError, match="_constraint_error"):
        NoConstraint().constraint_error(torch.randn(4, 2))


# ---------------------------------------------------------------- per geometry
@pytest.mark.parametrize("exact", [True, False])
def test_dgram_retraction_keeps_unsorted_norms_where_the_svd_reference_does_not(exact):
    M = get_manifold("dgram")
    X = on_manifold("dgram", (12, 6))
    norms = torch.linalg.vector_norm(X, dim=0)
    # Rule: the fixture's column norms are not sorted.
    assert not torch.equal(norms, norms.sort(descending=True).values)
    # Rule: our retraction Q·diag(colsum(Q∘W)) keeps the point (and its norm order).
    assert torch.allclose(M.retract(X, exact=exact), X, atol=1e-6)
    U, sigma, Vh = torch.linalg.svd(X, full_matrices=False)
    reference = U @ Vh * sigma  # the published U Vᵀ·diag(σ): norms re-sorted
    # Rule: the SVD reference moves the same point, so the assert above can fail.
    assert (reference - X).abs().max() > 0.1


def test_dgram_tangent_matches_the_formula_and_guards_zero_columns():
    M = get_manifold("dgram")
    X, G = on_manifold("dgram", (10, 4)), _randn((10, 4), 12)
    d2 = X.square().sum(0)
    N = X.mT @ G + G.mT @ X
    S = N / (d2[:, None] + d2[None, :])
    S.fill_diagonal_(0)
    # Rule: proj = G − W·S, S_ij = (WᵀG+GᵀW)_ij/(d_i²+d_j²) off the diagonal, S_ii = 0.
    assert torch.allclose(M.to_tangent(X, G), G - X @ S, atol=1e-12)
    X0 = X.clone()
    X0[:, 1] = 0
    # Rule: a zero column gives finite results (no division by zero).
    assert torch.isfinite(M.to_tangent(X0, G)).all()
    assert torch.isfinite(M.project(X0)).all() and M.check(M.project(X0), atol=1e-6)[0]


def test_stiefel_projection_is_the_polar_factor_and_tangent_formula():
    M = get_manifold("stiefel")
    W, G = _randn((10, 4), 13), _randn((10, 4), 14)
    U, _, Vh = torch.linalg.svd(W, full_matrices=False)
    # Rule: project = U Vᵀ, the nearest orthonormal matrix.
    assert torch.allclose(M.project(W), U @ Vh, atol=1e-6)
    Q = M.project(W, exact=True)
    A = Q.mT @ G
    # Rule: proj_T(G) = G − W·sym(WᵀG).
    assert torch.allclose(M.to_tangent(Q, G), G - Q @ (A + A.mT) / 2, atol=1e-12)


def test_sphere_radius_is_sqrt_of_small_dim():
    M = get_manifold("sphere")
    for shape, n in (((10, 4), 4), ((4, 10), 4)):
        P = M.project(_randn(shape, 15))
        # Rule: ‖W‖_F = √n with n = min(rows, cols), the norm of a Stiefel matrix.
        assert torch.allclose(P.norm(), torch.tensor(n**0.5, dtype=P.dtype))
    # Rule: the zero matrix still lands on the sphere.
    assert M.check(M.project(torch.zeros(6, 3)), atol=1e-6)[0]


def test_oblique_has_unit_columns_even_from_zero_columns():
    M = get_manifold("oblique")
    W = _randn((7, 3), 16)
    W[:, 2] = 0
    P = M.project(W)
    # Rule: every column of the tall orientation has norm 1 (a zero column included).
    assert torch.allclose(P.norm(dim=0), torch.ones(3, dtype=P.dtype))
    # Rule: nonzero columns keep their direction.
    assert torch.allclose(P[:, 0], W[:, 0] / W[:, 0].norm())


@pytest.mark.parametrize("shape", [(12, 5), (5, 12)])
def test_spectral_ball_clips_singular_values_at_one(shape):
    M = get_manifold("spectral_ball")
    W = _randn(shape, 17) * 0.4  # some singular values above 1, some below
    sigma = torch.linalg.svdvals(W)
    assert sigma.max() > 1 > sigma.min()
    expected = sigma.clamp_max(1)
    # Rule: exact projection = SVD clip σ ↦ min(σ, 1) with the same singular vectors.
    assert torch.allclose(torch.linalg.svdvals(M.project(W, exact=True)), expected, atol=1e-12)
    capped = M.project(W)
    # Rule: the CPU path (eigendecomposition of WᵀW) is the same clip to rounding.
    assert (capped - M.project(W, exact=True)).abs().max() < 1e-10
    hardcap = _msign_cap(W)
    # Rule: the CUDA path (msign-based cap, no decomposition) gives the same matrix to
    # Newton–Schulz accuracy.
    assert (hardcap - M.project(W, exact=True)).abs().max() < 1e-3
    assert M.constraint_error(hardcap) < 1e-4
    inside = 0.5 * W / torch.linalg.matrix_norm(W, 2)
    # Rule: points of the ball come back bit-for-bit (only σ > 1 directions change).
    assert torch.equal(M.project(inside), inside)
    # Rule: the ball is a convex set with interior: the tangent projection is the identity.
    G = _randn(shape, 18)
    assert torch.equal(M.to_tangent(capped, G), G)


def test_euclidean_is_the_identity():
    M = get_manifold("euclidean")
    W, G = _randn((6, 4), 19), _randn((6, 4), 20)
    # Rule: no constraint: project, retract and to_tangent change nothing.
    assert torch.equal(M.project(W), W) and torch.equal(M.retract(W), W)
    assert torch.equal(M.to_tangent(W, G), G)
    assert float(M.constraint_error(W)) == 0.0 and M.check(W * 1e6)[0]


def test_rejects_vectors():
    with pytest.raises(ValueError, match="matrix"):
        get_manifold("stiefel").project(torch.ones(4))


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_fixed_retraction_keeps_the_constraint_over_many_steps(name):
    M = get_manifold(name)
    gen = torch.Generator().manual_seed(0)
    W = M.project(torch.randn(6, 24, 8, generator=gen))
    V = W.clone()
    for _ in range(150):
        G = torch.randn(6, 24, 8, generator=gen)
        A = msign(M.to_tangent(W, G))
        W = M.retract(W - 0.02 * A, fixed=True)
        V = M.retract(V - 0.02 * msign(M.to_tangent(V, G)))
    # Rule: the fixed-iteration (warm) retraction holds the constraint at the adaptive one's
    # level step after step (benchmarks/optimizer_step.py --retraction runs 2,000 steps).
    fixed, adaptive = float(M.constraint_error(W).max()), float(M.constraint_error(V).max())
    assert fixed <= max(1e-5, 2 * adaptive), (name, fixed, adaptive)
