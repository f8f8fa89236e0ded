"""ManifoldMuon: constraints kept while training, groups, AdamW, state, Accelerate."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from torch import nn

from geosearch.manifolds import get_manifold, manifold_names, msign
from geosearch.optim.muon import MUON_DEFAULTS, ManifoldMuon




def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _regression(seed: int = 0, d_in: int = 16, d_out: int = 24, n: int = 128):
    """A toy linear regression whose target map has singular values around 0.5–1.5."""
    X = torch.randn(n, d_in, generator=_gen(seed))
    target = torch.randn(d_out, d_in, generator=_gen(seed + 1)) / math.sqrt(d_in)
    return X, X @ target.T


def _loss(model: nn.Module, X: torch.Tensor, Y: torch.Tensor) -> torch.Tensor:
    return (model(X) - Y).square().mean()


def _train(model, opt, X, Y, steps):
    for _ in range(steps):
        opt.zero_grad()
        _loss(model, X, Y).backward()
        opt.step()


@pytest.mark.slow
@pytest.mark.parametrize("solver", ["project", "dual"])
@pytest.mark.parametrize("geometry", manifold_names())
def test_each_geometry_keeps_its_constraint_and_lowers_the_loss(geometry, solver):
    torch.manual_seed(0)
    X, Y = _regression()
    model = nn.Linear(16, 24, bias=False)
    opt = ManifoldMuon([{"params": [model.weight], "geometry": geometry, "solver": solver, "lr": 0.02}])
    M = get_manifold(geometry)
    with torch.no_grad():
        start = float(_loss(model, X, Y))
    _train(model, opt, X, Y, 200)
    with torch.no_grad():
        end = float(_loss(model, X, Y))
    # Rule: after 200 steps the weight still satisfies its equation (error < 1e-3) ...
    assert M.constraint_error(model.weight.detach()) < 1e-3
    # ... and the loss went down (by at least a quarter).
    assert end < 0.75 * start
    # Rule: the dual solver records its last tangent residual as a float.
    assert isinstance(opt.state[model.weight].get("residual", 0.0), float)
    assert ("residual" in opt.state[model.weight]) == (solver == "dual")


@pytest.mark.parametrize("split_dim", [0, 1])
@pytest.mark.parametrize("geometry", [("stiefel", "dgram", "sphere"), "stiefel"])
def test_split_blocks_each_keep_their_own_constraint(geometry, split_dim):
    torch.manual_seed(1)
    X, Y = _regression(d_out=48)
    if split_dim == 0:  # nn.Linear layout (out, in): blocks stacked along the outputs
        model = nn.Linear(16, 48, bias=False)
        weight, forward = model.weight, model
    else:  # HF Conv1D layout (in, out): y = x @ W
        weight = nn.Parameter(torch.randn(16, 48) * 0.1)
        model = nn.Module()
        model.weight = weight
        forward = lambda x: x @ weight  # noqa: E731
    opt = ManifoldMuon([{"params": [weight], "geometry": geometry, "split": 3, "split_dim": split_dim,
                         "solver": "dual", "warm_start": True, "dual_steps": 5}])
    with torch.no_grad():
        start = float((forward(X) - Y).square().mean())
    for _ in range(30):
        opt.zero_grad()
        (forward(X) - Y).square().mean().backward()
        opt.step()
    names = geometry if isinstance(geometry, tuple) else (geometry,) * 3
    blocks = weight.detach().chunk(3, dim=split_dim)
    # Rule: each of the equal blocks along split_dim satisfies its own geometry's equation,
    # in the (out, in) orientation (a Conv1D block is constrained as its transpose).
    for name, block in zip(names, blocks):
        assert get_manifold(name).constraint_error(block.mT if split_dim else block) < 1e-3, name
    # Rule: the whole weight is NOT one Stiefel matrix (the blocks are constrained separately).
    if geometry == "stiefel":
        assert get_manifold("stiefel").constraint_error(weight.detach()) > 1e-2
    with torch.no_grad():
        assert float((forward(X) - Y).square().mean()) < start
    # Rule: with warm_start the dual variable of every block is kept, in the small dim.
    assert opt.state[weight]["dual"].shape == (3, 16, 16)


@pytest.mark.parametrize("geometry", [g for g in manifold_names() if g != "euclidean"])
def test_params_are_placed_on_their_manifold_at_construction(geometry):
    torch.manual_seed(2)
    model = nn.Linear(12, 20)
    M = get_manifold(geometry)
    model.weight.data.mul_(10)
    assert M.constraint_error(model.weight.detach()) > 1e-2
    ManifoldMuon([{"params": [model.weight], "geometry": geometry},
                  {"params": [model.bias], "geometry": "adamw"}])
    # Rule: constructing the optimizer projects manifold-group weights onto their manifold.
    assert M.constraint_error(model.weight.detach()) < 1e-5
    # Rule: weights already on their manifold are left bit-for-bit untouched.
    before = model.weight.detach().clone()
    ManifoldMuon([{"params": [model.weight], "geometry": geometry}])
    assert torch.equal(model.weight.detach(), before)


@pytest.mark.parametrize("layout", ["tall", "wide", "split"])
def test_large_dgram_weights_on_their_manifold_are_not_reprojected(layout):
    # A float32 DGram point with column norms 30-60: orthonormal columns scaled, rounded once.
    Q = torch.linalg.qr(torch.randn(256, 64, generator=_gen(5), dtype=torch.float64))[0]
    norms = 30 + 30 * torch.rand(64, generator=_gen(6), dtype=torch.float64)
    W = (Q * norms).float()
    M = get_manifold("dgram")
    # The absolute error is rounding at the norms' scale (~1e-3): above an absolute 1e-4...
    assert M.constraint_error(W) > 1e-4
    # ...while relative to ‖w_j‖² it is float32 rounding, and projecting again would move it.
    assert M.constraint_error(W) / norms.max() ** 2 < 1e-6 and not torch.equal(M.project(W), W)
    group = {"geometry": "dgram"}
    if layout == "wide":
        W = W.mT.contiguous()
    elif layout == "split":  # two stacked DGram blocks of one fused weight
        W, group = torch.cat([W, W.flip(0)]), {"geometry": ("dgram", "dgram"), "split": 2}
    weight = nn.Parameter(W.clone())
    ManifoldMuon([{"params": [weight], **group}])
    # Rule: a weight on its manifold is left bit-for-bit untouched when its group is added,
    # whatever its scale (resuming large DGram weights must not perturb them).
    assert torch.equal(weight.detach(), W)
    # Rule: one off the manifold at that scale is still projected, onto a point then kept as is.
    off = nn.Parameter(W + 0.5 * torch.randn(W.shape, generator=_gen(7)))
    ManifoldMuon([{"params": [off], **group}])
    projected = off.detach().clone()
    assert not torch.equal(projected, W + 0.5 * torch.randn(W.shape, generator=_gen(7)))
    ManifoldMuon([{"params": [off], **group}])
    assert torch.equal(off.detach(), projected)


def _model_and_groups(seed: int = 3):
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(16, 48), nn.Tanh(), nn.Linear(48, 24))

    def groups():
        return [
            {"params": [model[0].weight], "geometry": ("stiefel", "dgram", "stiefel"), "split": 3,
             "solver": "dual", "warm_start": True, "dual_steps": 4, "name": "qkv-like"},
            {"params": [model[2].weight], "geometry": "euclidean", "weight_decay": 0.1},
            {"params": [model[0].bias, model[2].bias], "geometry": "adamw", "lr": 1e-2, "weight_decay": 0.1},
        ]

    return model, groups


def test_state_dict_round_trip_continues_identically():
    X, Y = _regression()
    model, groups = _model_and_groups()
    opt = ManifoldMuon(groups())
    _train(model, opt, X, Y, 3)
    saved_model = copy.deepcopy(model.state_dict())
    saved_opt = copy.deepcopy(opt.state_dict())
    _train(model, opt, X, Y, 4)  # uninterrupted

    resumed, resumed_groups = _model_and_groups(seed=99)  # different init, then loaded
    resumed.load_state_dict(saved_model)
    opt2 = ManifoldMuon(resumed_groups())
    opt2.load_state_dict(saved_opt)
    _train(resumed, opt2, X, Y, 4)
    # Rule: training on from a saved state gives exactly the uninterrupted parameters.
    for a, b in zip(model.parameters(), resumed.parameters()):
        assert torch.equal(a, b)
    state = opt2.state[resumed[0].weight]
    # Rule: the saved state holds every documented key.
    assert {"momentum_buffer", "dual", "residual"} <= set(state)
    assert {"exp_avg", "exp_avg_sq", "step"} <= set(opt2.state[resumed[0].bias])


def test_runs_under_accelerate(accelerator):
    X, Y = _regression()
    model, groups = _model_and_groups()
    opt = ManifoldMuon(groups())
    model, opt = accelerator.prepare(model, opt)
    before = model[0].weight.detach().clone()
    opt.zero_grad()
    accelerator.backward(_loss(model, X, Y))
    opt.step()
    W = model[0].weight.detach()
    # Rule: the wrapped optimizer steps (weights move) and keeps each block on its manifold.
    assert not torch.equal(W, before)
    for name, block in zip(("stiefel", "dgram", "stiefel"), W.chunk(3, dim=0)):
        assert get_manifold(name).constraint_error(block) < 1e-4


def test_unknown_group_key_lists_the_allowed_keys():
    model = nn.Linear(8, 8)
    with pytest.raises(ValueError) as info:
        ManifoldMuon([{"params": [model.weight], "geometry": "stiefel", "betas": (0.9, 0.99)}])
    message = str(info.value)
    # Rule: the message names the bad key and lists every allowed key, in words.
    assert "unknown key(s) 'betas'" in message and "allowed keys are" in message
    assert all(k in message for k in MUON_DEFAULTS)
    with pytest.raises(ValueError, match="'momentum'.*allowed keys are.*betas"):
        ManifoldMuon([{"params": [model.bias], "geometry": "adamw", "momentum": 0.9}])


@pytest.mark.parametrize(
    "group, match",
    [
        ({}, "no 'geometry' key"),
        ({"geometry": "stiefle"}, "unknown geometry 'stiefle'.*stiefel"),
        ({"geometry": ("stiefel", "dgram"), "split": 4}, "2 geometries"),
        ({"geometry": "stiefel", "weight_decay": 0.1}, "euclidean blocks only"),
        ({"geometry": "stiefel", "split": 3}, "does not split into 3"),
        ({"geometry": "stiefel", "solver": "newton"}, "solver must be"),
        ({"geometry": "stiefel", "momentum": 1.5}, "momentum must be"),
    ],
)
def test_bad_groups_are_explained(group, match):
    weight = nn.Parameter(torch.randn(8, 4))
    # Rule: every bad group raises a ValueError that says what is wrong.
    with pytest.raises(ValueError, match=match):
        ManifoldMuon([{"params": [weight], **group}])


def test_manifold_groups_need_matrices():
    with pytest.raises(ValueError, match="2-D weights"):
        ManifoldMuon([{"params": [nn.Parameter(torch.randn(5))], "geometry": "stiefel"}])


def test_adamw_groups_match_torch_adamw():
    torch.manual_seed(4)
    X, Y = _regression()
    a, b = nn.Linear(16, 24), nn.Linear(16, 24)
    b.load_state_dict(a.state_dict())
    ours = ManifoldMuon([{"params": list(a.parameters()), "geometry": "adamw", "lr": 3e-3,
                          "betas": (0.9, 0.95), "eps": 1e-8, "weight_decay": 0.1}])
    ref = torch.optim.AdamW(b.parameters(), lr=3e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    _train(a, ours, X, Y, 5)
    _train(b, ref, X, Y, 5)
    # Rule: "adamw" groups are stepped exactly like torch.optim.AdamW.
    for p, q in zip(a.parameters(), b.parameters()):
        assert torch.allclose(p, q, atol=1e-6)


def test_euclidean_group_is_plain_muon_with_shape_scale_and_weight_decay():
    torch.manual_seed(5)
    X, Y = _regression(d_out=48)
    model = nn.Linear(16, 48, bias=False)
    W0 = model.weight.detach().clone()
    opt = ManifoldMuon([{"params": [model.weight], "geometry": "euclidean", "lr": 0.05,
                         "weight_decay": 0.1, "momentum": 0.9}])
    _loss(model, X, Y).backward()
    g = model.weight.grad.clone()
    opt.step()
    update = torch.lerp(g, 0.1 * g, 0.9)  # Nesterov: lerp(g, buf, β) with buf = (1 − β)·g
    expected = W0 * (1 - 0.05 * 0.1) - 0.05 * math.sqrt(48 / 16) * msign(update)
    # Rule: W ← (1 − lr·wd)·W − lr·sqrt(max(1, fan_out/fan_in))·msign(Nesterov momentum).
    assert torch.allclose(model.weight.detach(), expected, atol=1e-6)


@pytest.mark.parametrize("solver", ["project", "dual"])
def test_msign_coefficients_reach_every_solver_and_the_scale_only_euclidean(solver):
    from geosearch.optim.solvers import manifold_muon_update
    gen = _gen(6)
    W0, G = torch.randn(24, 8, generator=gen), torch.randn(24, 8, generator=gen)

    def step(geometry: str, **kw) -> torch.Tensor:
        p = nn.Parameter(W0.clone())
        opt = ManifoldMuon([{"params": [p], "geometry": geometry, "solver": solver, "nesterov": False,
                             "momentum": 0.0, **kw}])
        p.grad = G.clone()
        opt.step()
        return p.detach()

    M = get_manifold("stiefel")
    quintic = step("stiefel", ns_coefficients="quintic")
    want, _, _ = manifold_muon_update(M, M.project(W0), G, 0.02, solver=solver, ns_coefficients="quintic")
    # Rule: the group's ns_coefficients is the msign the solver runs ...
    assert torch.allclose(quintic, want, atol=1e-6)
    assert not torch.allclose(quintic, step("stiefel"), atol=1e-4)
    # ... and muon_scale changes euclidean steps only (constrained steps are of spectral size lr).
    assert torch.equal(step("stiefel", muon_scale="none"), step("stiefel", muon_scale="keller"))
    keller, none = step("euclidean", muon_scale="keller") - W0, step("euclidean", muon_scale="none") - W0
    assert torch.allclose(keller, math.sqrt(24 / 8) * none, atol=1e-6)


def test_step_returns_the_closure_loss_and_skips_params_without_grad():
    X, Y = _regression()
    model = nn.Linear(16, 24)
    opt = ManifoldMuon([{"params": [model.weight], "geometry": "stiefel"},
                        {"params": [model.bias], "geometry": "adamw"}])
    model.bias.requires_grad_(False)
    bias = model.bias.detach().clone()

    def closure():
        opt.zero_grad()
        loss = _loss(model, X, Y)
        loss.backward()
        return loss

    loss = opt.step(closure)
    # Rule: step(closure) returns the closure's loss; a param without grad is not touched.
    assert isinstance(loss, torch.Tensor) and torch.equal(model.bias.detach(), bias)


@pytest.mark.parametrize("split", [1, 2])
def test_in_out_layout_is_the_transpose_of_out_in(split):
    # A Conv1D weight (in, out) holds the transpose of the nn.Linear weight (out, in) of the
    # same map. Square blocks are not reoriented to tall, so without care DGram would make
    # the *output* directions orthogonal for one layout and the input ones for the other.
    torch.manual_seed(0)
    W = torch.randn(8, 8, dtype=torch.float64)
    a, b = nn.Parameter(W.clone()), nn.Parameter(W.T.clone())
    opt_a = ManifoldMuon([{"params": [a], "geometry": "dgram", "split": split, "split_dim": 0}])
    opt_b = ManifoldMuon([{"params": [b], "geometry": "dgram", "split": split, "split_dim": 1}])
    # Rule: placing the weights on the manifold commutes with the transpose ...
    torch.testing.assert_close(b.detach().mT, a.detach(), rtol=0, atol=1e-12)
    for _ in range(3):
        G = torch.randn(8, 8, dtype=torch.float64)
        a.grad, b.grad = G.clone(), G.mT.clone()
        opt_a.step()
        opt_b.step()
    # ... and so does every step: the two layouts follow one trajectory.
    torch.testing.assert_close(b.detach().mT, a.detach(), rtol=0, atol=1e-10)
    if split == 1:  # Rule: a square weight gets orthogonal *input* directions (Linear columns).
        gram = a.detach().mT @ a.detach()
        assert (gram - torch.diag(gram.diagonal())).abs().max() < 1e-8


# ------------------------------------------------------------------ torch.optim.Muon as the oracle
# torch.optim.Muon (torch >= 2.9) and the "euclidean" group share the update rule:
#   buf ← lerp(buf, g, 1 − β);  U = lerp(g, buf, β) (nesterov=True);
#   W ← (1 − lr·wd)·W − lr·sqrt(max(1, fan_out/fan_in))·NS(U)   (adjust_lr_fn="original").
# (geosearch's default muon_scale "keller"; "none" drops the scale.) They differ by default in
# NS only: torch runs Newton–Schulz in bfloat16 with one fixed quintic (a, b, c) per iteration
# (Keller Jordan's 3.4445, −4.7750, 2.0315 by default) after dividing by ‖U‖_F; ManifoldMuon
# runs it in float32 with the Polar Express coefficients (one triple per iteration) after
# dividing by 1.01·‖U‖_F, or with torch's quintic and ‖U‖_F (ns_coefficients "quintic": the
# tests at the end of this section). Both approximate U's polar factor
# P = U_svd·V_svdᵀ, so the comparison below is made on P. Tolerance: torch's bfloat16 cast
# alone moves a unit-scale matrix by up to its unit roundoff 2⁻⁸ ≈ 3.9e-3 per entry, and
# the iteration compounds it: its direction is P to about 1e-2 in spectral norm (measured
# 8.4e-3 on these shapes) while ours is P to 1e-5; we allow 2e-2 (about 5 bfloat16 units).
_BF16_TOL = 2e-2
_MUON = {"lr": 0.02, "weight_decay": 0.1, "momentum": 0.95, "nesterov": True}
_needs_torch_muon = pytest.mark.skipif(not hasattr(torch.optim, "Muon"), reason="torch.optim.Muon needs torch >= 2.9")


def _muon_pair(shape, torch_kw: dict, our_kw: dict, seed: int = 0):
    """One step of torch.optim.Muon and of a euclidean ManifoldMuon group from the same
    weight, gradient and (nonzero) momentum buffer: (W0, torch's W, ours, both optimizers)."""
    gen = _gen(seed)
    W0, G, M = (torch.randn(*shape, generator=gen) for _ in range(3))
    a, b = nn.Parameter(W0.clone()), nn.Parameter(W0.clone())
    ref = torch.optim.Muon([a], adjust_lr_fn="original", **{**_MUON, **torch_kw})
    ours = ManifoldMuon([{"params": [b], "geometry": "euclidean", **_MUON, **our_kw}])
    for opt, p in ((ref, a), (ours, b)):
        p.grad = G.clone()
        opt.state[p]["momentum_buffer"] = M.clone()  # a step from zero momentum hides Nesterov
        opt.step()
    return W0, a.detach(), b.detach(), (ref, a), (ours, b)


def _direction(W0: torch.Tensor, W: torch.Tensor) -> torch.Tensor:
    """NS(U) recovered from one step: (decayed W0 − W) / (lr · shape scale)."""
    scale = math.sqrt(max(1.0, W0.shape[0] / W0.shape[1]))
    return (W0 * (1 - _MUON["lr"] * _MUON["weight_decay"]) - W) / (_MUON["lr"] * scale)


@_needs_torch_muon
@pytest.mark.parametrize("shape", [(48, 16), (16, 48), (96, 32)])
def test_euclidean_step_matches_torch_muon_with_converged_newton_schulz(shape):
    # Settings that make both NS iterations converge to the polar factor: torch with the
    # classical quintic (15/8, −10/8, 3/8), which fixes σ = 1, for 40 iterations; ours with
    # 8 Polar Express iterations (converged in float32). Rectangular Gaussian matrices keep
    # σ_min/σ_max near 0.3, so both converge; square ones reach 0.01, where neither does.
    W0, theirs, ours, (ref, a), (opt, b) = _muon_pair(
        shape, {"ns_coefficients": (1.875, -1.25, 0.375), "ns_steps": 40}, {"ns_steps": 8})
    # Rule: the momentum buffers are bit-for-bit equal (same EMA, same lerp).
    assert torch.equal(ref.state[a]["momentum_buffer"], opt.state[b]["momentum_buffer"])
    # Rule: the whole step (decay, shape scale, Nesterov, direction) agrees to bfloat16 accuracy.
    diff = torch.linalg.matrix_norm(_direction(W0, theirs) - _direction(W0, ours), ord=2)
    assert float(diff) < _BF16_TOL
    # Control: the same comparison tells plain momentum from Nesterov (measured ≥ 0.11).
    W0, theirs, plain, _, _ = _muon_pair(
        shape, {"ns_coefficients": (1.875, -1.25, 0.375), "ns_steps": 40}, {"ns_steps": 8, "nesterov": False})
    diff = torch.linalg.matrix_norm(_direction(W0, theirs) - _direction(W0, plain), ord=2)
    assert float(diff) > 4 * _BF16_TOL


@_needs_torch_muon
@pytest.mark.parametrize("shape", [(48, 16), (16, 48)])
def test_euclidean_default_step_shares_torch_muons_singular_vectors(shape):
    # Defaults of each (5 NS iterations; Keller's coefficients vs Polar Express): the two
    # directions have different spectra by design (torch's singular values spread over
    # about 0.7–1.15, ours 0.88–1.12) but the same singular vectors, i.e. the same polar factor.
    W0, theirs, ours, _, _ = _muon_pair(shape, {}, {})
    d_theirs, d_ours = _direction(W0, theirs), _direction(W0, ours)
    P_theirs, P_ours = msign(d_theirs.double(), exact=True), msign(d_ours.double(), exact=True)
    # Rule: same polar factor, to bfloat16 accuracy ...
    assert float(torch.linalg.matrix_norm(P_theirs - P_ours, ord=2)) < _BF16_TOL
    # ... while the directions themselves differ by more than that (the NS polynomials).
    assert float(torch.linalg.matrix_norm(d_theirs - d_ours, ord=2)) > 5 * _BF16_TOL


# With Newton–Schulz the same, the whole step agrees to float32 rounding. torch's NS is
# replaced, for the step it takes, by geosearch's msign with the named coefficient set; the
# replacement first checks that torch asked for exactly that set and that many steps, so what
# is compared is everything around NS: momentum, Nesterov, weight decay, the shape scale.
# What the replacement removes, and nothing else, is the difference of precision and eps
# (docs/design.md, "msign and the manifold-Muon step"): torch casts to bfloat16 and divides
# by max(‖U‖_F, 1e-7); geosearch iterates in float32 and divides by ‖U‖_F + 1e-30 (the quintic
# takes no 1.01 margin, as torch), the same unless ‖U‖_F < 1e-7.
_STEP_TOL = 1e-5


def _torch_ns_is(monkeypatch, coefficients: str, steps: int) -> list[tuple]:
    """Replace torch.optim.Muon's Newton–Schulz by geosearch's msign with ``coefficients``;
    returns the (ns_coefficients, ns_steps, eps) of each call torch made."""
    from torch.optim import _muon

    from geosearch.manifolds.msign import NS_COEFFICIENTS
    calls: list[tuple] = []

    def ns(grad, ns_coefficients, ns_steps, eps):
        calls.append((tuple(ns_coefficients), ns_steps, eps))
        # Rule: torch asked for the named set's coefficients, with as many steps.
        assert tuple(ns_coefficients) == NS_COEFFICIENTS[coefficients].coeffs[0] and ns_steps == steps
        return msign(grad, steps=ns_steps, coefficients=coefficients)

    monkeypatch.setattr(_muon, "_zeropower_via_newtonschulz", ns)
    return calls


@_needs_torch_muon
@pytest.mark.parametrize("nesterov", [True, False])
@pytest.mark.parametrize("shape", [(48, 16), (16, 48), (96, 32)])
def test_keller_scale_is_torch_muons_original_step(monkeypatch, shape, nesterov):
    calls = _torch_ns_is(monkeypatch, "quintic", 5)
    kw = {"nesterov": nesterov}
    W0, theirs, ours, (ref, a), (opt, b) = _muon_pair(
        shape, {"ns_steps": 5, **kw}, {"ns_coefficients": "quintic", "ns_steps": 5, "muon_scale": "keller", **kw})
    # Rule: torch's defaults are Keller Jordan's quintic, which geosearch names "quintic".
    assert calls == [((3.4445, -4.7750, 2.0315), 5, 1e-7)]
    # Rule: momentum buffers bit-for-bit equal; the whole step equal to float32 rounding.
    assert torch.equal(ref.state[a]["momentum_buffer"], opt.state[b]["momentum_buffer"])
    assert float((theirs - ours).abs().max()) < _STEP_TOL
    # Control: the step is large against that tolerance, and the other scale misses it on tall weights.
    assert float((W0 - ours).abs().max()) > 100 * _STEP_TOL
    _, _, other, _, _ = _muon_pair(shape, {"ns_steps": 5, **kw},
                                   {"ns_coefficients": "quintic", "ns_steps": 5, "muon_scale": "none", **kw})
    tall = shape[0] > shape[1]
    assert (float((theirs - other).abs().max()) > 100 * _STEP_TOL) == tall


@_needs_torch_muon
@pytest.mark.parametrize("shape", [(48, 16), (16, 48), (96, 32)])
def test_no_scale_is_torch_muon_at_the_lr_divided_by_its_scale(monkeypatch, shape):
    # torch.optim.Muon has no unscaled option (adjust_lr_fn: "original" or "match_rms_adamw"),
    # and it decays by lr·wd with the unscaled lr. So: torch at lr/s and wd·s, s = the
    # "original" scale, takes (1 − lr·wd)·W − lr·NS(U): the step of muon_scale "none".
    _torch_ns_is(monkeypatch, "quintic", 5)
    s = math.sqrt(max(1.0, shape[0] / shape[1]))
    torch_kw = {"lr": _MUON["lr"] / s, "weight_decay": _MUON["weight_decay"] * s, "ns_steps": 5}
    gen = _gen(3)
    W0, G, M = (torch.randn(*shape, generator=gen) for _ in range(3))
    a, b = nn.Parameter(W0.clone()), nn.Parameter(W0.clone())
    ref = torch.optim.Muon([a], adjust_lr_fn="original", **{**_MUON, **torch_kw})
    ours = ManifoldMuon([{"params": [b], "geometry": "euclidean", **_MUON, "ns_coefficients": "quintic",
                          "ns_steps": 5, "muon_scale": "none"}])
    for opt, p in ((ref, a), (ours, b)):
        p.grad = G.clone()
        opt.state[p]["momentum_buffer"] = M.clone()
        opt.step()
    # Rule: muon_scale "none" takes a step of spectral size lr on every shape.
    assert float((a.detach() - b.detach()).abs().max()) < _STEP_TOL


@_needs_torch_muon
@pytest.mark.parametrize("shape", [(48, 16), (16, 48)])
def test_quintic_step_matches_torch_muon_in_bfloat16(shape):
    # torch's own Newton–Schulz, in bfloat16. The quintic does not converge, so it passes on
    # more of bfloat16's rounding than a converged iteration does: its direction is torch's
    # to a spectral distance of 0.026–0.054 (measured over 3 seeds of 5 shapes, square
    # included), about ten bfloat16 units; we allow 0.07. The Polar Express direction is
    # 0.34–0.44 from torch's: its polynomial maps singular values elsewhere.
    tol = 0.07
    W0, theirs, ours, _, _ = _muon_pair(shape, {}, {"ns_coefficients": "quintic"})
    _, _, polar_express, _, _ = _muon_pair(shape, {}, {"ns_coefficients": "polar_express"})
    diff = torch.linalg.matrix_norm(_direction(W0, theirs) - _direction(W0, ours), ord=2)
    # Rule: same coefficients, same step up to torch's bfloat16.
    assert float(diff) < tol
    # Control: the other coefficient set is several tolerances away.
    diff = torch.linalg.matrix_norm(_direction(W0, theirs) - _direction(W0, polar_express), ord=2)
    assert float(diff) > 4 * tol
