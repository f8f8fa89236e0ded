"""The grouped step: matrices of one shape and geometry stepped as one batch equal each
matrix stepped alone, for every geometry and both solvers, in fewer operations."""

from __future__ import annotations

import math

import pytest
import torch

from geosearch.manifolds import get_manifold, manifold_names
from geosearch.optim.blocks import block_view
from geosearch.optim.muon import ManifoldMuon
from geosearch.optim.solvers import dual_ascent, manifold_muon_update

LR, BETA = 0.05, 0.95


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _weights() -> list[torch.Tensor]:
    """Three (12, 5) weights and one wide (5, 12), batched with them on the tall orientation
    (the fused weight of the tests, (36, 5) in three blocks, joins the same batch)."""
    shapes = [(12, 5), (12, 5), (12, 5), (5, 12)]
    return [torch.randn(*s, generator=_gen(i)) / 3 for i, s in enumerate(shapes)]


def _groups(ws, fused, geometry, solver, **extra):
    common = {"geometry": geometry, "lr": LR, "momentum": BETA, "solver": solver, "dual_tol": 3e-2,
              "dual_steps": 6, **extra}
    return [{"params": ws[:2], **common}, {"params": ws[2:], **common},
            {"params": [fused], "split": 3, **common}]


def _reference_step(params_blocks, bufs, grads, geometry, solver, lams, warm=False):
    """Each matrix alone: Nesterov momentum, then manifold_muon_update per block (euclidean:
    with Keller Jordan's shape scale, the default ``muon_scale``)."""
    M = get_manifold(geometry)
    for j, (p, split) in enumerate(params_blocks):
        bufs[j].lerp_(grads[j], 1 - BETA)
        update = torch.lerp(grads[j], bufs[j], BETA)
        W, U = block_view(p, split), block_view(update, split)
        Ws, Us = (W.unbind(0), U.unbind(0)) if split > 1 else ([W], [U])
        for b, (w, u) in enumerate(zip(Ws, Us)):
            scale = math.sqrt(max(1.0, w.shape[0] / w.shape[1])) if geometry == "euclidean" else 1.0
            new, lam, _ = manifold_muon_update(M, w, u, LR, solver=solver, dual_tol=3e-2,
                                               dual_steps=6, lam0=lams.get((j, b)), scale=scale)
            w.copy_(new)
            if lam is not None and warm:
                lams[(j, b)] = lam


@pytest.mark.parametrize("solver", ["project", "dual"])
@pytest.mark.parametrize("geometry", manifold_names())
def test_grouped_step_equals_the_per_matrix_step(geometry, solver):
    ws = [torch.nn.Parameter(w) for w in _weights()]
    fused = torch.nn.Parameter(torch.randn(36, 5, generator=_gen(9)) / 3)
    opt = ManifoldMuon(_groups(ws, fused, geometry, solver))
    ref = [p.detach().clone() for p in ws + [fused]]  # placed on the manifold already
    splits = [1, 1, 1, 1, 3]
    bufs = [torch.zeros_like(r) for r in ref]
    for step in range(3):
        grads = [torch.randn(r.shape, generator=_gen(100 + 10 * step + j))
                 for j, r in enumerate(ref)]
        for p, g in zip(ws + [fused], grads):
            p.grad = g.clone()
        opt.step()
        with torch.no_grad():
            _reference_step(list(zip(ref, splits)), bufs, grads, geometry, solver, {})
    # Rule: batching changes only the summation order of the products (float32 rounding).
    for p, r in zip(ws + [fused], ref):
        assert torch.allclose(p.detach(), r, atol=2e-5), (geometry, solver, (p - r).abs().max())


@pytest.mark.parametrize("geometry", ["stiefel", "dgram"])
def test_grouped_dual_warm_start_equals_the_per_matrix_step(geometry):
    ws = [torch.nn.Parameter(w) for w in _weights()]
    fused = torch.nn.Parameter(torch.randn(36, 5, generator=_gen(9)) / 3)
    opt = ManifoldMuon(_groups(ws, fused, geometry, "dual", warm_start=True))
    ref = [p.detach().clone() for p in ws + [fused]]
    bufs, lams = [torch.zeros_like(r) for r in ref], {}
    for step in range(3):
        grads = [torch.randn(r.shape, generator=_gen(200 + 10 * step + j))
                 for j, r in enumerate(ref)]
        for p, g in zip(ws + [fused], grads):
            p.grad = g.clone()
        opt.step()
        with torch.no_grad():
            _reference_step(list(zip(ref, [1, 1, 1, 1, 3])), bufs, grads, geometry, "dual", lams,
                            warm=True)
    for p, r in zip(ws + [fused], ref):
        assert torch.allclose(p.detach(), r, atol=2e-5)
    # Rule: the dual state keeps its per-parameter shape: (k, k) whole, (split, k, k) blocks.
    assert opt.state[ws[0]]["dual"].shape == (5, 5) and opt.state[fused]["dual"].shape == (3, 5, 5)


def test_dual_on_ill_conditioned_matrices_amplifies_rounding():
    # Why the tests above use tall matrices: on square DGram blocks far from convergence the
    # dual ascent amplifies a relative change of 1e-7 in G to ~1e-2 in the direction in six
    # updates, so a batch (another summation order) agrees with a loop only in exact arithmetic.
    M = get_manifold("dgram")
    W = M.project(torch.randn(3, 5, 5, generator=_gen(0), dtype=torch.float64))
    G = torch.randn(3, 5, 5, generator=_gen(1), dtype=torch.float64)
    A = dual_ascent(M, W, G, 6, 0.1, 0.0, None, ns_steps=5, exact=True)[0]
    for i in range(3):
        alone = dual_ascent(M, W[i], G[i], 6, 0.1, 0.0, None, ns_steps=5, exact=True)[0]
        assert torch.allclose(A[i], alone, atol=1e-12)


def _dual_case(seed: int):
    M = get_manifold("dgram")
    W = M.project(torch.randn(16, 6, generator=_gen(seed), dtype=torch.float64))
    return M, W, torch.randn(16, 6, generator=_gen(seed + 50), dtype=torch.float64)


@pytest.mark.parametrize("fixed", [False, True])
def test_dual_stops_each_matrix_at_its_own_tolerance(fixed):
    cases = [_dual_case(s) for s in range(4)]
    M = cases[0][0]
    kw = {"ns_steps": 5, "exact": True}  # exact arithmetic: the comparison is of the logic
    first = [float(dual_ascent(M, W, G, 0, 0.1, 0.0, None, **kw)[2]) for _, W, G in cases]
    tol = sorted(first)[1] * 1.0001  # one matrix starts below it, the others do not
    alone = [dual_ascent(M, W, G, 8, 0.1, tol, None, **kw) for _, W, G in cases]
    W = torch.stack([c[1] for c in cases])
    G = torch.stack([c[2] for c in cases])
    A, lam, r = dual_ascent(M, W, G, 8, 0.1, tol, None, fixed_iterations=fixed, **kw)
    # Rule: a matrix that meets the tolerance is frozen while the others go on, so the batch
    # (and the fixed-iteration mode, which never leaves the loop early) gives each its own result.
    for i, (a, la, ra) in enumerate(alone):
        assert torch.allclose(A[i], a, atol=1e-10) and torch.allclose(lam[i], la, atol=1e-10)
        assert abs(float(r[i]) - float(ra)) < 1e-12
    # and the tolerance did separate them: some stopped at once, some went on
    assert min(first) < tol < max(first)


def _count_ops(opt, params) -> int:
    from torch.utils._python_dispatch import TorchDispatchMode

    class Counter(TorchDispatchMode):
        n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            Counter.n += 1
            return func(*args, **(kwargs or {}))

    for i, p in enumerate(params):
        p.grad = torch.randn(p.shape, generator=_gen(i))
    with Counter():
        opt.step()
    return Counter.n


def test_grouping_cuts_the_operations_per_step():
    params = [torch.nn.Parameter(torch.randn(16, 8, generator=_gen(i))) for i in range(8)]
    copies = [torch.nn.Parameter(p.detach().clone()) for p in params]
    grouped = ManifoldMuon([{"params": params, "geometry": "stiefel"}])
    alone = ManifoldMuon([{"params": copies, "geometry": "stiefel", "retraction": "adaptive"}],
                         grouped=False)
    # Rule: eight matrices of one shape cost about one matrix's operations, not eight.
    assert _count_ops(alone, copies) >= 4 * _count_ops(grouped, params)


@pytest.mark.parametrize("geometry", ["stiefel", "dgram"])
def test_a_split_stack_of_experts_steps_every_block_of_every_expert_on_its_manifold(geometry):
    # Rule: a (experts, 2·out, in) stack cut into two blocks of one geometry (gate and up of
    # an MoE layer) is stepped block by block, and each expert's block stays on the manifold.
    torch.manual_seed(0)
    experts, out, inn = 3, 8, 6
    p = torch.nn.Parameter(torch.randn(experts, 2 * out, inn))
    opt = ManifoldMuon([dict(params=[p], geometry=geometry, split=2, split_dim=0, lr=0.02)])
    for _ in range(3):
        p.grad = torch.randn_like(p)
        opt.step()
    manifold = get_manifold(geometry)
    for e in range(experts):
        for b in range(2):
            ok, why = manifold.check(p.data[e, b * out:(b + 1) * out], atol=1e-5)
            assert ok, (e, b, why)
