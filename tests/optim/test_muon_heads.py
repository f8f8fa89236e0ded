"""Per-head geometry in ManifoldMuon: each head's rows a matrix on the manifold, stepped as one
batch over heads, equal to stepping each head's matrix alone."""

from __future__ import annotations

import pytest
import torch

from geosearch.manifolds import get_manifold
from geosearch.optim.muon import ManifoldMuon
from geosearch.optim.solvers import manifold_muon_update
from geosearch.util.errors import ConfigError

LR, BETA, D, HD = 0.05, 0.95, 12, 4  # width 12, head size 4: 3 query heads


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _head_blocks(p: torch.Tensor, heads: tuple[int, ...], geos: tuple[str, ...]):
    """(geometry, (rows, in) view) of every head's matrix of a fused (out, in) weight."""
    out = []
    for block, h, g in zip(p.chunk(len(heads), dim=0), heads, geos):
        out.extend((g, m) for m in block.chunk(h, dim=0))
    return out


@pytest.mark.parametrize("solver", ["project", "dual"])
def test_per_head_step_equals_each_head_alone(solver):
    # A fused [Q; K; V] (3 x 12 rows) with Q and K per head (3 heads of 4 rows), V whole, and a
    # grouped-query K projection (2 key/value heads of 4 rows) per head.
    fused = torch.nn.Parameter(torch.randn(3 * D, D, generator=_gen(1)) / 3)
    k_gqa = torch.nn.Parameter(torch.randn(2 * HD, D, generator=_gen(2)) / 3)
    common = {"lr": LR, "momentum": BETA, "solver": solver, "dual_steps": 6, "dual_tol": 3e-2,
              "warm_start": solver == "dual"}
    fused_geos = ("stiefel", "stiefel", "dgram")
    opt = ManifoldMuon([
        {"params": [fused], "geometry": fused_geos, "split": 3, "heads": (3, 3, 1), **common},
        {"params": [k_gqa], "geometry": "stiefel", "heads": 2, **common},
    ])
    layouts = [(fused, (3, 3, 1), fused_geos), (k_gqa, (2,), ("stiefel",))]
    ref = [p.detach().clone() for p in (fused, k_gqa)]
    # Rule: the weights are placed on the manifold head by head when the group is added.
    for (p, heads, geos) in layouts:
        for g, W in _head_blocks(p.detach(), heads, geos):
            assert get_manifold(g).constraint_error(W).max() < 1e-5
    bufs, lams = [torch.zeros_like(r) for r in ref], {}
    for step in range(3):
        grads = [torch.randn(r.shape, generator=_gen(50 + 10 * step + j)) for j, r in enumerate(ref)]
        for p, g in zip((fused, k_gqa), grads):
            p.grad = g.clone()
        opt.step()
        with torch.no_grad():  # each head's matrix alone: momentum, then its own update
            for j, (r, (_, heads, geos)) in enumerate(zip(ref, layouts)):
                bufs[j].lerp_(grads[j], 1 - BETA)
                U = torch.lerp(grads[j], bufs[j], BETA)
                pairs = zip(_head_blocks(r, heads, geos), _head_blocks(U, heads, geos))
                for b, ((g, w), (_, u)) in enumerate(pairs):
                    new, lam, _ = manifold_muon_update(get_manifold(g), w, u, LR, solver=solver, dual_steps=6,
                                                       dual_tol=3e-2, lam0=lams.get((j, b)))
                    w.copy_(new)
                    if lam is not None:
                        lams[(j, b)] = lam
    for (p, heads, geos), r in zip(layouts, ref):
        # Rule: one batched step over heads equals each head's step (float32 summation order).
        assert torch.allclose(p.detach(), r, atol=2e-5), (p - r).abs().max()
        # Rule: every head's matrix stays on its manifold.
        for g, W in _head_blocks(p.detach(), heads, geos):
            assert get_manifold(g).constraint_error(W).max() < 1e-5
    # Rule: per-head Stiefel constrains each head, not the whole Q block (heads are not orthogonal).
    Q = fused.detach()[:D]
    assert (Q @ Q.T - torch.eye(D)).abs().max() > 1e-2


def test_per_head_conv1d_layout_steps_the_same_heads():
    # Rule: an (in, out) weight (GPT-2's Conv1D) cuts the same heads out of its columns.
    w = torch.randn(D, 3 * D, generator=_gen(3)) / 3
    a, b = torch.nn.Parameter(w.clone()), torch.nn.Parameter(w.T.contiguous())
    common = {"geometry": "stiefel", "split": 3, "heads": 3, "lr": LR}
    opt = ManifoldMuon([{"params": [a], "split_dim": 1, **common}, {"params": [b], **common}])
    g = torch.randn(D, 3 * D, generator=_gen(4))
    a.grad, b.grad = g.clone(), g.T.contiguous()
    opt.step()
    assert torch.allclose(a.detach().T, b.detach(), atol=1e-6)
    for head in b.detach().chunk(9, dim=0):
        assert (head @ head.T - torch.eye(HD)).abs().max() < 1e-5


@pytest.mark.parametrize("group, match", [
    ({"heads": 5}, "do not cut into heads=5"),
    ({"heads": (3, 3)}, "one count per block"),
    ({"heads": 0}, "heads must be"),
])
def test_bad_heads_name_the_key(group, match):
    p = torch.nn.Parameter(torch.randn(3 * D, D))
    with pytest.raises(ConfigError, match=match) as e:
        ManifoldMuon([{"params": [p], "geometry": "stiefel", "split": 3, **group}])
    assert e.value.key == "heads"
