"""msign (Polar Express Newton–Schulz) and polar (accurate polar factor)."""

from __future__ import annotations

import pytest
import torch

from geosearch.manifolds.msign import (
    NS_COEFFICIENTS, POLAR_EXPRESS_COEFFS, QUINTIC_COEFFS, gram_error, msign, polar, polar_fixed,
)


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _exact_polar(G: torch.Tensor) -> torch.Tensor:
    U, _, Vh = torch.linalg.svd(G.to(torch.float64), full_matrices=False)
    return U @ Vh


SHAPES = [(32, 12), (12, 32), (16, 16), (3, 20, 7), (2, 7, 20)]


def test_coefficients_compose_to_sign_on_published_interval():
    # Rule: the published schedule (with the 1.01 safety factor) maps every normalised
    # singular value in [1e-3, 1] to within 1e-4 of 1 after 8 iterations, and the
    # first five already bring [1e-3, 1] within 0.25 of 1.
    x0 = torch.logspace(-3, 0, 4001, dtype=torch.float64) / 1.01
    x = x0.clone()
    for k, (a, b, c) in enumerate(POLAR_EXPRESS_COEFFS):
        x = a * x + b * x**3 + c * x**5
        if k == 4:
            assert (x - 1).abs().max() < 0.25
    assert (x - 1).abs().max() < 1e-4


def _composed(coefficients: str, steps: int, x: torch.Tensor) -> torch.Tensor:
    """The scalar map msign applies to each singular value x = σ/‖G‖_F, in float64, from the
    published numbers: Polar Express divides by 1.01‖G‖_F and takes one triple per iteration
    (the last repeating); the quintic divides by ‖G‖_F and takes Keller Jordan's triple."""
    if coefficients == "polar_express":
        x = x / 1.01
        triples = [POLAR_EXPRESS_COEFFS[min(k, len(POLAR_EXPRESS_COEFFS) - 1)] for k in range(steps)]
    else:
        triples = [(3.4445, -4.7750, 2.0315)] * steps
    for a, b, c in triples:
        x = a * x + b * x**3 + c * x**5
    return x


@pytest.mark.parametrize("coefficients", list(NS_COEFFICIENTS))
@pytest.mark.parametrize("steps", [1, 3, 5, 10])
@pytest.mark.parametrize("shape", [(32, 12), (12, 32)])
def test_msign_applies_the_named_polynomial_to_each_singular_value(coefficients, steps, shape):
    G = torch.randn(*shape, dtype=torch.float64, generator=_gen(10))
    U, S, Vh = torch.linalg.svd(G, full_matrices=False)
    want = (U * _composed(coefficients, steps, S / torch.linalg.matrix_norm(G))) @ Vh
    # Rule: msign(G) = U p(σ/(margin·‖G‖_F)) Vᵀ for the named coefficient set, to float32 accuracy.
    assert (msign(G, steps=steps, coefficients=coefficients) - want).abs().max() < 1e-5


def test_quintic_is_keller_jordans_and_does_not_converge():
    assert QUINTIC_COEFFS == (3.4445, -4.7750, 2.0315)
    G = torch.randn(48, 16, dtype=torch.float64, generator=_gen(11))
    quintic = [torch.linalg.svdvals(msign(G, steps=k, coefficients="quintic")) for k in (5, 12)]
    polar_express = torch.linalg.svdvals(msign(G, steps=12))
    # Rule: Polar Express converges to σ = 1; Keller Jordan's quintic keeps its singular values
    # spread inside about [0.68, 1.2] however many iterations run.
    assert (polar_express - 1).abs().max() < 1e-5
    for sv in quintic:
        assert 0.6 < sv.min() and sv.max() < 1.21 and sv.max() - sv.min() > 0.1
    # Rule: both keep msign's scale invariance.
    assert torch.allclose(msign(1e3 * G, coefficients="quintic"), msign(G, coefficients="quintic"), atol=1e-6)


def test_unknown_coefficients_name_the_allowed_ones():
    with pytest.raises(ValueError, match="unknown Newton–Schulz coefficients 'cubic'; expected one of: "
                                         "polar_express, quintic"):
        msign(torch.ones(3, 2), coefficients="cubic")


def test_exact_path_is_the_polar_factor():
    G = torch.randn(20, 6, dtype=torch.float64, generator=_gen())
    # Rule: exact msign = U Vᵀ of the SVD to float64 precision.
    assert torch.allclose(msign(G, exact=True), _exact_polar(G), atol=1e-12)


@pytest.mark.parametrize("shape", SHAPES)
def test_newton_schulz_converges_to_polar_factor(shape):
    G = torch.randn(*shape, dtype=torch.float64, generator=_gen(1))
    # Rule: 8 Polar Express iterations (float32) reach the polar factor to 1e-3 for a
    # well-conditioned Gaussian matrix; 5 iterations keep every singular value near 1.
    assert (msign(G, steps=8) - _exact_polar(G)).abs().max() < 1e-3
    sv = torch.linalg.svdvals(msign(G, steps=5))
    assert sv.min() > 0.7 and sv.max() < 1.3


@pytest.mark.parametrize("shape", [(32, 12), (12, 32)])
def test_same_singular_vectors_as_input(shape):
    G = torch.randn(*shape, dtype=torch.float64, generator=_gen(2))
    U, _, Vh = torch.linalg.svd(G, full_matrices=False)
    core = U.mT @ msign(G, steps=5) @ Vh.mT
    # Rule: msign only changes singular values: Uᵀ msign(G) V is diagonal.
    off = core - torch.diag_embed(torch.diagonal(core))
    assert off.abs().max() < 1e-5


@pytest.mark.parametrize("scale", [1e-3, 1.0, 1e3])
def test_scale_invariant(scale):
    G = torch.randn(24, 10, generator=_gen(3))
    # Rule: msign(cG) = msign(G) for c > 0 (Frobenius normalisation first).
    assert torch.allclose(msign(scale * G), msign(G), atol=1e-5)


def test_batched_equals_looped_and_dtype_kept():
    G = torch.randn(4, 18, 9, dtype=torch.float64, generator=_gen(4))
    batched = msign(G)
    # Rule: the batch dims are independent; the output keeps the input dtype.
    assert batched.dtype == torch.float64
    assert torch.allclose(batched, torch.stack([msign(g) for g in G]), atol=1e-6)
    assert msign(G[0].to(torch.bfloat16)).dtype == torch.bfloat16


def test_zero_matrix_maps_to_zero():
    # Rule: sign(0) = 0, with no NaN from the normalisation.
    assert torch.equal(msign(torch.zeros(5, 3)), torch.zeros(5, 3))
    assert torch.equal(msign(torch.zeros(5, 3), exact=True), torch.zeros(5, 3))


def test_rejects_vectors():
    with pytest.raises(ValueError, match="matrix"):
        msign(torch.ones(3))


@pytest.mark.parametrize("dtype, tol", [(torch.float64, 1e-12), (torch.float32, 1e-5)])
def test_polar_polishes_a_near_orthonormal_matrix(dtype, tol):
    Q = torch.linalg.qr(torch.randn(40, 16, dtype=torch.float64, generator=_gen(5)))[0]
    X = (Q + 0.02 * torch.randn(40, 16, dtype=torch.float64, generator=_gen(6))).to(dtype)
    P = polar(X)
    # Rule: the result is orthonormal to rounding level and equals the SVD polar factor.
    assert P.dtype == dtype
    assert gram_error(P).item() < tol * 10
    assert (P.to(torch.float64) - _exact_polar(X)).abs().max() < 1e-4


def test_polar_far_from_orthonormal_and_batched():
    X = torch.randn(3, 30, 10, dtype=torch.float64, generator=_gen(7)) * 5.0
    P = polar(X)
    # Rule: far inputs are handled too (Polar Express in float32 first, then polished in
    # float64): orthonormal to float64 rounding, the polar factor to float32 accuracy.
    assert gram_error(P).max() < 1e-10
    assert torch.allclose(P, _exact_polar(X), atol=1e-5)


def test_polar_completes_rank_deficient_input():
    X = torch.zeros(6, 4, dtype=torch.float64)
    X[:, 0] = 1.0  # rank one
    # Rule: unlike msign, polar always returns orthonormal columns.
    assert gram_error(polar(X)).item() < 1e-10
    assert gram_error(polar(torch.zeros(3, 5))).item() < 1e-6


def test_five_steps_resolve_singular_values_relative_to_the_frobenius_norm():
    # 63 singular values 1 and one small one, on known singular vectors.
    U = torch.linalg.qr(torch.randn(64, 64, dtype=torch.float64, generator=_gen(8)))[0]
    V = torch.linalg.qr(torch.randn(64, 64, dtype=torch.float64, generator=_gen(9)))[0]

    def small_output(small: float) -> float:
        s = torch.ones(64, dtype=torch.float64)
        s[-1] = small
        G = (U * s) @ V.mT
        out = U.mT @ msign(G, steps=5).double() @ V  # diagonal: msign keeps singular vectors
        return float(out[-1, -1]), float(torch.linalg.matrix_norm(G))

    frob = small_output(1.0)[1]  # ‖G‖_F ≈ √63 ≈ 7.9 σ_max
    # Rule: a singular value of 2e-3·‖G‖_F (above the documented 1e-3·‖G‖_F) ends in
    # [0.84, 1.13] after five iterations, like every larger one.
    assert 0.84 <= small_output(2e-3 * frob)[0] <= 1.13
    # Rule: the guarantee is not relative to σ_max: 2e-3·σ_max (= 2.5e-4·‖G‖_F here) is
    # far from 1 after five iterations.
    assert small_output(2e-3)[0] < 0.5


def test_polar_fixed_polishes_a_stepped_point_to_rounding_in_two_iterations():
    gen = torch.Generator().manual_seed(3)
    Q = polar(torch.randn(4, 48, 16, generator=gen))
    X = Q - 0.02 * msign(torch.randn(4, 48, 16, generator=gen))  # one optimizer step away
    # Rule: from singular values 1 ± 0.03 two cubic iterations reach float32 rounding, and
    # the result is the polar factor the checked `polar` computes.
    assert float(gram_error(X).max()) > 1e-2
    Y = polar_fixed(X, 2)
    assert float(gram_error(Y).max()) < 2e-6
    assert torch.allclose(Y, polar(X), atol=2e-6)
    # wide inputs: orthonormal rows; far inputs need Polar Express first
    assert float(gram_error(polar_fixed(X.mT, 2)).max()) < 2e-6
    far = torch.randn(48, 16, generator=gen)
    assert float(gram_error(polar_fixed(far, 2, far=8))) < 2e-6


@pytest.mark.parametrize("shape", [(3, 96, 16), (2, 40, 20), (1, 30, 16)])
def test_far_iterations_on_the_gram_matrix_equal_msign(shape):
    from geosearch.manifolds.msign import _GRAM_ROWS, _far

    gen = torch.Generator().manual_seed(11)
    m, n = shape[-2:]
    # spread singular values (column norms 1 to 50, as DGram weights have)
    Q = torch.linalg.qr(torch.randn(*shape, dtype=torch.float64, generator=gen))[0]
    Y = Q * torch.logspace(0, 1.7, n, dtype=torch.float64) @ polar(
        torch.randn(n, n, dtype=torch.float64, generator=gen))
    # Rule: tall matrices take the Gram form, and it is msign's map to float64 rounding.
    assert (m >= _GRAM_ROWS * n) == (shape != (1, 30, 16))
    assert torch.allclose(_far(Y, 8), msign(Y.float(), steps=8).double(), atol=2e-6)
    assert (_far(Y, 8) - _svd_polar_ref(Y)).abs().max() < 5e-2  # 8 iterations: not converged yet
    # Rule: polar and polar_fixed reach the polar factor from it (float32: to ~1e-6).
    for out in (polar(Y.float()), polar_fixed(Y.float(), 2, far=8)):
        assert float(gram_error(out).max()) < 2e-6
        assert (out.double() - _svd_polar_ref(Y)).abs().max() < 2e-5
    # Rule: in float64 the Gram form iterates in float64 (msign in float32): float64 accuracy.
    tol = 1e-10 if m >= _GRAM_ROWS * n else 1e-5
    assert (polar(Y) - _svd_polar_ref(Y)).abs().max() < tol


def _svd_polar_ref(Y: torch.Tensor) -> torch.Tensor:
    U, _, Vh = torch.linalg.svd(Y, full_matrices=False)
    return U @ Vh
