"""Probes: attention max logit and entropy checked by hand, σ_max and constraint errors."""

import math

import pytest
import torch

from geosearch.assignment import Assignment
from geosearch.util.errors import ConfigError
from geosearch.manifolds import get_manifold
from geosearch.build import optimizer_from_plan
from geosearch.plan import bind
from geosearch.models.model import GPT, make_config
from geosearch.proxy.probes import (
    ProbedWeight,
    WeightProbe,
    attention_stats,
    causal_logits,
    layer_attention_stats,
    recording_qk,
    row_entropy,
    weight_stats,
)


def tiny_model(seed=0, attn_scale=10.0, **overrides):
    """A tiny GPT whose attention weights are scaled up so the logits are far from 0."""
    torch.manual_seed(seed)
    model = GPT(make_config("tiny", **overrides))
    with torch.no_grad():
        for block in model.transformer.h:
            block.attn.c_attn.weight.mul_(attn_scale)
    return model


def probe_batch(seed=1, B=4, T=32):
    return torch.randint(256, (B, T), generator=torch.Generator().manual_seed(seed))


# --------------------------------------------------------------------------- attention
def test_max_logit_equals_recomputation_from_ln1_outputs():
    model, x = tiny_model(), probe_batch()
    C, nh = model.config.n_embd, model.config.n_head
    hs = C // nh
    ln1_out = []
    hooks = [b.ln_1.register_forward_hook(lambda mod, inp, out: ln1_out.append(out.detach()))
             for b in model.transformer.h]
    stats = attention_stats(model, x)
    for h in hooks:
        h.remove()
    T = x.size(1)
    unmasked_max = []
    for layer, (block, h) in enumerate(zip(model.transformer.h, ln1_out)):
        # by hand: q, k from c_attn's rows [0:C) and [C:2C) applied to ln_1's output
        W, b = block.attn.c_attn.weight.detach(), block.attn.c_attn.bias.detach()
        q = (h @ W[:C].T + b[:C]).view(-1, T, nh, hs)  # (B, T, nh, hs)
        k = (h @ W[C:2 * C].T + b[C:2 * C]).view(-1, T, nh, hs)
        z = torch.einsum("bihd,bjhd->bhij", q, k) / math.sqrt(hs)  # (B, nh, T, T)
        causal = [z[..., i, : i + 1].max() for i in range(T)]
        expected = max(v.item() for v in causal)
        # Rule: the probed max logit is the max of q·k/√hs over heads and causal pairs.
        assert stats["max_logit_per_layer"][layer] == pytest.approx(expected, rel=1e-5)
        # Rule: each head's is the max over its own causal pairs.
        heads = [max(z[:, n, i, : i + 1].max().item() for i in range(T)) for n in range(nh)]
        assert stats["max_logit_per_head"][layer] == pytest.approx(heads, rel=1e-5)
        # Rule: the largest head's equals the layer's, exactly.
        assert max(stats["max_logit_per_head"][layer]) == stats["max_logit_per_layer"][layer]
        unmasked_max.append(z.max().item())
    # The batch is one where including future positions would have changed a layer's max,
    # so the equality above also checks that they are excluded.
    assert any(u > m + 1e-3 for u, m in zip(unmasked_max, stats["max_logit_per_layer"]))
    # Rule: the overall max is the max over layers, and it is a plain float.
    assert stats["max_logit"] == max(stats["max_logit_per_layer"])
    assert isinstance(stats["max_logit"], float) and len(stats["min_entropy_per_layer"]) == 2


def test_future_positions_never_count():
    q, k = torch.zeros(1, 1, 4, 2), torch.zeros(1, 1, 4, 2)
    q[0, 0, 0] = torch.tensor([100.0, 0.0])  # query 0 ...
    k[0, 0, 1] = torch.tensor([100.0, 0.0])  # ... would match key 1, which is in its future
    k[0, 0, 0] = torch.tensor([0.0, 3.0])
    q[0, 0, 2] = torch.tensor([0.0, 2.0])  # query 2 · key 0 = 6, the largest causal logit
    max_logit, _, _ = layer_attention_stats(q, k)
    # Rule: the max runs over j ≤ i only: 6/√2, not the future logit 1e4/√2.
    assert max_logit == pytest.approx(6 / math.sqrt(2))


def test_entropy_of_uniform_attention_is_log_of_row_length():
    T = 16
    q, k = torch.zeros(2, 3, T, 8), torch.randn(2, 3, T, 8)
    H = row_entropy(causal_logits(q, k))  # (2, 3, T)
    # Rule: q = 0 gives uniform attention; row i sees i + 1 keys, so H_i = ln(i + 1).
    torch.testing.assert_close(H, torch.log(torch.arange(1, T + 1.0)).expand(2, 3, T))
    max_logit, min_entropy, mean_entropy = layer_attention_stats(q, k)
    expected = torch.log(torch.arange(2, T + 1.0)).mean().item()  # rows 1..T-1
    # Rule: head entropy averages rows 1..T-1 (row 0 is always 0); all heads equal here.
    assert min_entropy == pytest.approx(expected) and mean_entropy == pytest.approx(expected)
    assert max_logit == 0.0


def test_entropy_of_a_known_row_and_min_over_heads():
    q = torch.zeros(1, 2, 2, 1)
    k = torch.zeros(1, 2, 2, 1)
    q[0, 1, 1, 0], k[0, 1, 1, 0] = 1.0, math.log(3.0)  # head 1, row 1: logits [0, ln 3]
    H = row_entropy(causal_logits(q, k))
    p = torch.tensor([0.25, 0.75])
    # Rule: row 1 of head 1 is softmax([0, ln 3]) = [1/4, 3/4], entropy -Σ p ln p.
    assert H[0, 1, 1].item() == pytest.approx(-(p * p.log()).sum().item())
    _, min_entropy, mean_entropy = layer_attention_stats(q, k)
    # Rule: min over heads (head 1, sharper), mean over heads.
    assert min_entropy == pytest.approx(H[0, 1, 1].item())
    assert mean_entropy == pytest.approx((math.log(2) + H[0, 1, 1].item()) / 2)


def test_uniform_attention_in_the_model():
    model, x = tiny_model(attn_scale=1.0), probe_batch(T=20)
    C = model.config.n_embd
    with torch.no_grad():
        for block in model.transformer.h:  # zero queries: every logit is 0
            block.attn.c_attn.weight[:C].zero_()
            block.attn.c_attn.bias[:C].zero_()
    stats = attention_stats(model, x)
    expected = torch.log(torch.arange(2, 21.0)).mean().item()
    # Rule: end to end, zero queries give uniform attention and max logit 0 in every layer.
    assert stats["min_entropy_per_layer"] == pytest.approx([expected] * 2)
    assert stats["mean_entropy"] == pytest.approx(expected)
    assert stats["max_logit_per_layer"] == [0.0, 0.0]


def test_probe_forward_leaves_the_model_as_it_was():
    model, x = tiny_model(dropout=0.1), probe_batch()
    model.train()
    a = attention_stats(model, x)
    b = attention_stats(model, x)
    # Rule: the probe runs in eval mode (dropout off: repeatable) and restores train mode.
    assert a == b and model.training
    # Rule: recording is off again and no q/k tensors are kept.
    assert all(not blk.attn.record_qk and blk.attn.last_q is None for blk in model.transformer.h)
    # Rule: no gradient graph is built by the probe.
    assert all(p.grad is None for p in model.parameters())


def test_non_finite_weights_give_non_finite_stats():
    model, x = tiny_model(), probe_batch()
    with torch.no_grad():
        model.transformer.h[1].attn.c_attn.weight[0, 0] = float("nan")
    stats = attention_stats(model, x)
    # Rule: a NaN layer makes the overall max logit and min entropy NaN (the pruner's signal).
    assert math.isnan(stats["max_logit"]) and math.isnan(stats["min_entropy"])
    assert math.isfinite(stats["max_logit_per_layer"][0])


def test_recording_needs_attention_layers():
    # Rule: probing a model without CausalSelfAttention is an error, not an empty result.
    with pytest.raises(ValueError, match="no CausalSelfAttention"):
        with recording_qk(torch.nn.Linear(2, 2)):
            pass


# --------------------------------------------------------------------------- weights
def blocks_by_type(model, split):
    """Module type -> list of weights, cut by hand from the nanoGPT parameters."""
    out = {}
    for block in model.transformer.h:
        W = block.attn.c_attn.weight.detach()
        if split:
            for t, part in zip(("attn_q", "attn_k", "attn_v"), W.chunk(3, dim=0)):
                out.setdefault(t, []).append(part)
        else:
            out.setdefault("attn_qkv", []).append(W)
        out.setdefault("attn_out", []).append(block.attn.c_proj.weight.detach())
        out.setdefault("mlp_in", []).append(block.mlp.c_fc.weight.detach())
        out.setdefault("mlp_out", []).append(block.mlp.c_proj.weight.detach())
    return out


@pytest.mark.parametrize("rules", ["nanogpt", "nanogpt_split"])
def test_sigma_max_and_constraint_error_per_type(rules):
    model = tiny_model(seed=2, attn_scale=3.0)
    assignment = Assignment({"attn": "stiefel", "mlp_in": "dgram", "mlp_out": "adamw"}, rules=rules)
    stats = WeightProbe.from_assignment(model, assignment).measure()
    expected = blocks_by_type(model, split=rules == "nanogpt_split")
    geometry = assignment.resolve()
    # Rule: one entry per module type, split blocks separately.
    assert set(stats["sigma_max"]) == set(expected)
    for t, mats in expected.items():
        sigma = max(torch.linalg.matrix_norm(W, ord=2).item() for W in mats)
        # Rule: σ_max is the max over layers of the spectral norm, within 1e-3 relative.
        assert stats["sigma_max"][t] == pytest.approx(sigma, rel=1e-3)
        if geometry[t] == "adamw":
            # Rule: AdamW-trained types have no constraint to measure.
            assert t not in stats["constraint_error"]
        else:
            err = max(get_manifold(geometry[t]).constraint_error(W).item() for W in mats)
            # Rule: the constraint error is the manifold's own, max over layers (off-manifold here).
            assert stats["constraint_error"][t] == pytest.approx(err, rel=1e-4) and err > 1e-3
    # Rule: the one-off weight_stats gives the same numbers.
    assert weight_stats(model, assignment) == stats


def test_on_manifold_weights_have_zero_error_and_unit_sigma():
    model = tiny_model(seed=3)
    stiefel = get_manifold("stiefel")
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("c_attn.weight", "c_proj.weight", "c_fc.weight")):
                p.copy_(stiefel.project(p.double(), exact=True))
    stats = weight_stats(model, Assignment({"attn": "stiefel", "mlp": "stiefel"}))
    # Rule: Stiefel points have all singular values 1 and constraint error ~0.
    for t, s in stats["sigma_max"].items():
        assert s == pytest.approx(1.0, abs=1e-5), t
        assert stats["constraint_error"][t] < 1e-5, t


def test_power_iteration_is_a_lower_bound_that_converges_with_warm_starts():
    torch.manual_seed(0)
    mats = [torch.randn(48, 16) * 0.1 for _ in range(3)]
    weights = [ProbedWeight(f"w{i}", W, ("mlp_in",), ("euclidean",)) for i, W in enumerate(mats)]
    exact = max(torch.linalg.matrix_norm(W, ord=2).item() for W in mats)
    probe = WeightProbe(weights, sigma="power", power_iters=2)
    values = [probe.measure()["sigma_max"]["mlp_in"] for _ in range(40)]
    # Rule: ‖W v‖ with unit v never exceeds σ_max.
    assert all(v <= exact * (1 + 1e-6) for v in values)
    # Rule: warm starts accumulate iterations: the estimate converges to σ_max.
    assert values[-1] == pytest.approx(exact, rel=1e-3)
    assert abs(values[-1] - exact) <= abs(values[0] - exact)
    # Rule: the exact method agrees.
    exact_probe = WeightProbe(weights)
    assert exact_probe.measure()["sigma_max"]["mlp_in"] == pytest.approx(exact, rel=1e-5)


@pytest.mark.parametrize("sigma", ["exact", "power"])
def test_a_type_of_two_shapes_is_measured_over_both(sigma):
    torch.manual_seed(0)
    gate, shared = torch.randn(4, 16) * 0.1, torch.randn(1, 16)  # Qwen2-MoE's two routers
    weights = [ProbedWeight("gate", gate, ("router",), ("stiefel",)),
               ProbedWeight("shared", shared, ("router",), ("stiefel",))]
    stats = WeightProbe(weights, sigma=sigma, power_iters=20).measure()
    # Rule: the matrices of one type need not share a shape; each number is the max over all.
    exact = max(torch.linalg.matrix_norm(W, ord=2).item() for W in (gate, shared))
    assert stats["sigma_max"]["router"] == pytest.approx(exact, rel=1e-4)
    stiefel = get_manifold("stiefel")
    error = max(stiefel.constraint_error(W).item() for W in (gate, shared))
    assert stats["constraint_error"]["router"] == pytest.approx(error, rel=1e-5)


def test_fused_in_out_layout_is_cut_along_dim_1():
    torch.manual_seed(0)
    W = torch.randn(8, 24)  # HF Conv1D: (in, out), blocks along the columns
    W[:, 8:16] *= 5  # make the middle block (k) the largest
    probe = WeightProbe([ProbedWeight("c_attn", W, ("attn_q", "attn_k", "attn_v"),
                                      ("stiefel", "stiefel", "adamw"), split_dim=1)])
    stats = probe.measure()
    # Rule: block i of an in_out weight is columns [i·n, (i+1)·n).
    for t, block in zip(("attn_q", "attn_k", "attn_v"), W.chunk(3, dim=1)):
        assert stats["sigma_max"][t] == pytest.approx(torch.linalg.matrix_norm(block, ord=2).item(),
                                                      rel=1e-4)
    assert set(stats["constraint_error"]) == {"attn_q", "attn_k"}


@pytest.mark.parametrize("sigma", ["exact", "power"])
def test_non_finite_weights_are_reported_not_raised(sigma):
    W, V = torch.randn(8, 4), torch.randn(8, 4)
    W[2, 1] = float("nan")
    probe = WeightProbe([ProbedWeight("a", W, ("mlp_in",), ("spectral_ball",)),
                         ProbedWeight("b", V, ("mlp_out",), ("stiefel",))], sigma=sigma)
    stats = probe.measure()
    # Rule: a non-finite weight gives NaN for its type (eigensolvers would raise), others unharmed.
    assert math.isnan(stats["sigma_max"]["mlp_in"]) and math.isnan(stats["constraint_error"]["mlp_in"])
    assert stats["sigma_max"]["mlp_out"] == pytest.approx(torch.linalg.matrix_norm(V, ord=2).item(),
                                                           rel=1e-3 if sigma == "exact" else 0.2)


def test_weight_probe_bad_arguments():
    W = torch.randn(4, 4)
    # Rule: an unknown geometry names itself and lists the known ones.
    with pytest.raises(ConfigError, match=r"unknown geometry 'stiefle'.*stiefel"):
        WeightProbe([ProbedWeight("w", W, ("attn_out",), ("stiefle",))])
    # Rule: an unknown σ method lists the methods.
    with pytest.raises(ConfigError, match=r"sigma: unknown sigma method 'svd'.*exact, power"):
        WeightProbe([], sigma="svd")
    with pytest.raises(ConfigError, match=r"power_iters: must be a positive integer but got 0"):
        WeightProbe([], sigma="power", power_iters=0)
    # Rule: one module type cannot carry two geometries.
    with pytest.raises(ValueError, match="two geometries"):
        WeightProbe([ProbedWeight("a", W, ("mlp_in",), ("stiefel",)),
                     ProbedWeight("b", W, ("mlp_in",), ("dgram",))])


def test_probe_from_plan_watches_the_blocks_the_optimizer_steps():
    model = tiny_model(seed=4)
    a = Assignment({"attn_q": "stiefel", "attn_k": "dgram", "attn_v": "euclidean", "attn_out": "stiefel",
                    "mlp": "adamw"}, rules="nanogpt_split")
    plan = bind(model, a)
    optimizer_from_plan(plan, verbose=False)  # places the weights on their manifolds
    stats = WeightProbe.from_plan(plan).measure()
    # Rule: one entry per module type of the plan, split blocks separately.
    assert set(stats["sigma_max"]) == {"attn_q", "attn_k", "attn_v", "attn_out", "mlp_in", "mlp_out"}
    # Rule: the blocks measured are the ones the optimizer constrained: on their manifolds.
    assert stats["constraint_error"]["attn_q"] < 1e-4 and stats["constraint_error"]["attn_k"] < 1e-4
    assert stats["sigma_max"]["attn_q"] == pytest.approx(1.0, abs=1e-4)
    assert set(stats["constraint_error"]) == {"attn_q", "attn_k", "attn_v", "attn_out"}
    # Rule: the (model, assignment) entry point binds the same plan.
    assert WeightProbe.from_assignment(model, a).measure() == stats
