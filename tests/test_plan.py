"""The plan: one binding of (model, assignment, settings) that the optimizer and the probes read."""

from __future__ import annotations

import pytest
import torch
from test_build import D, TinyGPT

from geosearch.assignment import Assignment
from geosearch.util.errors import ConfigError
from geosearch.build import build_optimizer
from geosearch.optim import settings
from geosearch.plan import DECAY, NO_DECAY, RULE, bind

SPLIT = {"attn_q": "stiefel", "attn_k": "dgram", "attn_v": "euclidean", "attn_out": "stiefel", "mlp": "adamw"}


@pytest.fixture
def model():
    torch.manual_seed(0)
    return TinyGPT()


def test_every_parameter_has_one_row_with_its_role(model):
    plan = bind(model, Assignment.parse("attn=stiefel,mlp=dgram"))
    rows = {r.name: r for r in plan.params}
    # Rule: one row per parameter, tied ones once, in named_parameters() order.
    assert list(rows) == [n for n, _ in model.named_parameters()]
    for name, r in rows.items():
        if name.endswith(("c_attn.weight", "c_proj.weight", "c_fc.weight")):
            assert r.role == RULE and r.layout == "out_in" and r.split == 1
        else:  # embeddings (and the tied head) decay; norms and biases do not
            assert r.role == (DECAY if r.param.dim() == 2 else NO_DECAY) and r.geometry == "adamw", name
    assert rows["transformer.h.0.attn.c_attn.weight"].geometry == "stiefel"
    assert rows["transformer.h.1.mlp.c_proj.weight"].types == ("mlp_out",)
    assert [r.name for r in plan.rows("mlp_in")] == ["transformer.h.0.mlp.c_fc.weight", "transformer.h.1.mlp.c_fc.weight"]
    assert rows["transformer.wte.weight"].options["weight_decay"] == 0.1
    assert rows["transformer.ln_f.weight"].options["weight_decay"] == 0.0


def test_options_merge_catalog_then_assignment_then_bind_then_per_type(model):
    a = Assignment.parse("attn=stiefel,mlp=dgram,mlp_out=adamw,attn_qkv.lr=0.01,mlp_out.eps=1e-6")
    a = Assignment(a.geometry, options=a.options, settings={"spectral_lr": 0.05, "lr": 1e-3, "momentum": 0.9})
    plan = bind(model, a, {"momentum": 0.8, "lr": 2e-3})
    qkv, out, mlp_out = (plan.rows(t)[0].options for t in ("attn_qkv", "attn_out", "mlp_out"))
    decay = next(r for r in plan.params if r.role == DECAY).options
    # Rule: per-type options win over everything.
    assert qkv["lr"] == 0.01 and mlp_out["eps"] == 1e-6
    # Rule: bind's settings win over the assignment's; the assignment's over the catalog's.
    assert qkv["momentum"] == out["momentum"] == 0.8 and decay["lr"] == mlp_out["lr"] == 2e-3
    assert out["lr"] == 0.05 and decay["eps"] == settings.defaults()["eps"]
    assert plan.settings == {**settings.defaults(), "spectral_lr": 0.05, "lr": 2e-3, "momentum": 0.8}
    # Rule: the options can't be changed through the plan.
    with pytest.raises(TypeError):
        qkv["lr"] = 1.0


@pytest.mark.parametrize("conv", [False, True], ids=["linear-out_in", "conv1d-in_out"])
def test_block_view_is_out_in_and_writes_through(conv):
    torch.manual_seed(0)
    rules = "nanogpt_split" if not conv else [
        {"type": "attn_qkv", "pattern": r"attn\.c_attn\.weight$", "family": "attn",
         "split": ["attn_q", "attn_k", "attn_v"], "layout": "in_out"},
        {"type": "attn_out", "pattern": r"attn\.c_proj\.weight$", "family": "attn"},
        {"type": "mlp_in", "pattern": r"mlp\.c_fc\.weight$", "family": "mlp"},
        {"type": "mlp_out", "pattern": r"mlp\.c_proj\.weight$", "family": "mlp"}]
    model = TinyGPT(conv=conv)
    row = bind(model, Assignment(SPLIT, rules=rules)).rows("attn_k")[0]
    W = row.param.detach()
    assert row.geometry == ("stiefel", "dgram", "euclidean") and row.split == 3 and row.split_dim == int(conv)
    blocks = row.blocks()
    # Rule: block i is the i-th third of the outputs, seen (out, in) whatever the layout.
    assert blocks.shape == (3, D, D)
    for i, chunk in enumerate(W.chunk(3, dim=row.split_dim)):
        assert torch.equal(blocks[i], chunk.mT if conv else chunk)
    # Rule: it is a view: writing a block writes the weight.
    with torch.no_grad():
        row.blocks()[1].fill_(7.0)
    assert bool((W.chunk(3, dim=row.split_dim)[1] == 7.0).all())


def test_build_optimizer_groups_are_the_plans(model):
    a = Assignment(SPLIT, rules="nanogpt_split", options={"attn_out": {"lr": 0.01}})
    plan = bind(model, a, {"spectral_lr": 0.03})
    opt = build_optimizer(model, a, verbose=False, spectral_lr=0.03)
    assert len(opt.param_groups) == len(plan.param_groups())
    for mine, built in zip(plan.param_groups(), opt.param_groups):
        # Rule: the optimizer holds the plan's groups (completed with the catalog's defaults).
        assert [id(p) for p in mine["params"]] == [id(p) for p in built["params"]]
        assert all(built[k] == v for k, v in mine.items() if k != "params"), mine["name"]


def test_frozen_parameters_are_planned_but_get_no_group(model):
    model.transformer.wpe.weight.requires_grad_(False)
    model.transformer.h[0].mlp.c_fc.weight.requires_grad_(False)
    plan = bind(model, Assignment.parse("attn=stiefel,mlp=dgram"))
    grouped = {id(p) for g in plan.param_groups() for p in g["params"]}
    # Rule: frozen tensors are counted and left out of every group; the rest are all in one.
    assert plan.frozen == 2 and len(plan.params) == len(list(model.parameters()))
    assert grouped == {id(p) for p in model.parameters() if p.requires_grad}


def test_describe_shows_each_type_before_training(model):
    a = Assignment(SPLIT, rules="nanogpt_split", options={"attn_out": {"lr": 0.01}}, settings={"spectral_lr": 0.05})
    plan = bind(model, a)
    text = plan.describe()
    lines = text.splitlines()
    n = sum(p.numel() for p in model.parameters())
    assert lines[0] == (f"plan for TinyGPT [rule set 'nanogpt_split']: {len(plan.params)} tensors, {n:,} parameters; "
                        "attention per-matrix: its geometry holds for Q, K and V each")
    assert "spectral_lr=0.05" in lines[1] and "solver=project" in lines[1]
    rows = {line.split()[0]: line.split() for line in lines[3:]}
    # Rule: one row per module type, in rule order: geometry, layout, (out, in) block, tensors, params.
    assert [line.split()[0] for line in lines[3:9]] == ["attn_q", "attn_k", "attn_v", "attn_out", "mlp_in", "mlp_out"]
    assert rows["attn_k"][1:7] == ["dgram", "out_in", f"{D}x{D}", "2", f"{2 * D * D:,}", "0.05"]
    assert rows["mlp_in"][1:4] == ["adamw", "out_in", f"{4 * D}x{D}"]
    # Rule: per-type options are shown where they differ from the global settings.
    assert rows["attn_out"][6:] == ["0.01", "0", "lr=0.01"]
    assert "adamw: embeddings, head" in text and "adamw: norms, biases (no decay)" in text
    # Rule: the per-type entries count every parameter once.
    assert sum(e["params"] for e in plan.types()) == n


def test_bind_errors_name_their_source(model):
    with pytest.raises(ConfigError, match=r"^--assign: learning_rate: unknown setting 'learning_rate'"):
        bind(model, Assignment.parse("attn=stiefel,mlp=dgram"), {"learning_rate": 1}, source="--assign")
    with pytest.raises(ConfigError, match=r"^--assign: rules: 2 2-D hidden weight\(s\) match no rule"):
        bind(TinyGPT(extra=True), Assignment.parse("attn=stiefel,mlp=dgram"), source="--assign")



# --------------------------------------------------------------------------- stacked or per-matrix
def test_stacked_attention_constrains_the_stack_and_per_matrix_each_block(model, tmp_path):
    # nanogpt: Stiefel on the fused [Q; K; V] (3D x D): QᵀQ + KᵀK + VᵀV = I, so the blocks'
    # squared singular values average 1/3 (about 1/√3 each). nanogpt_split: QᵀQ = KᵀK = VᵀV = I.
    eye = torch.eye(D)
    for rules, layout in (("nanogpt", "stacked"), ("nanogpt_split", "per-matrix")):
        torch.manual_seed(0)
        m = TinyGPT()
        assignment = Assignment.parse("attn=stiefel,mlp=dgram", rules=rules)
        plan = bind(m, assignment)
        assert f"attention {layout}:" in plan.describe().splitlines()[0]
        assert f"# Attention: {layout} (" in assignment.to_yaml()
        build_optimizer(m, assignment, verbose=False)
        W = m.transformer.h[0].attn.c_attn.weight.detach()  # (3D, D): Q, K, V rows
        blocks = W.split(D, dim=0)
        sigma2 = torch.cat([torch.linalg.svdvals(B) for B in blocks]).square()
        if layout == "stacked":
            assert (W.T @ W - eye).abs().max() < 1e-5
            assert sum(B.T @ B for B in blocks).sub(eye).abs().max() < 1e-5
            assert abs(sigma2.mean().item() - 1 / 3) < 1e-5
            assert any((B.T @ B - eye).abs().max() > 0.1 for B in blocks)  # no block is itself orthogonal
        else:
            assert all((B.T @ B - eye).abs().max() < 1e-5 for B in blocks)
            assert (sigma2 - 1).abs().max() < 1e-4


def test_attention_variant_names_the_twin_or_says_why_not():
    from geosearch.rules.modules import attention_layout, attention_variant

    assert attention_variant("nanogpt", "per-matrix") == "nanogpt_split"
    assert attention_variant("gpt2_split", "stacked") == "gpt2"
    assert attention_variant("gpt2", "stacked") == "gpt2"
    assert attention_layout("llama") == "per-matrix" and attention_layout("nanogpt") == "stacked"
    with pytest.raises(ConfigError, match="'llama' has per-matrix attention and no stacked twin"):
        attention_variant("llama", "stacked")


def test_per_head_option_cuts_q_k_v_into_heads(tmp_path):
    from geosearch.models.zoo import build_model

    gpt = build_model("tiny", vocab_size=64).model  # width 32, 2 heads of 16
    a = Assignment.parse("attn_qk=stiefel,attn_qk.per_head=true,attn_vo=dgram,mlp=dgram")
    plan = bind(gpt, a)
    row = next(r for r in plan.matched if r.name.endswith("c_attn.weight"))
    # Rule: per_head on Q and K of the fused weight: 2 heads each; V stays one matrix.
    assert row.heads == (2, 2, 1) and row.group()["heads"] == (2, 2, 1)
    assert [e["block"] for e in plan.types()[:3]] == ["2x16x32", "2x16x32", "32x32"]
    # Rule: the saved assignment carries it; build_optimizer from the file builds the same groups.
    path = a.save(tmp_path / "a.yaml")
    groups = build_optimizer(gpt, str(path), verbose=False).param_groups
    assert [g.get("heads", 1) for g in groups if g["name"] == "attn_q,attn_k,attn_v"] == [(2, 2, 1)]
    # Rule: per_head applies to Q, K and V only; the error names the option's key.
    with pytest.raises(ConfigError, match="per_head applies to attn_q, attn_k, attn_v") as e:
        bind(gpt, Assignment.parse("attn=stiefel,attn_out.per_head=true,mlp=dgram", rules="nanogpt_split"))
    assert e.value.key == "options.attn_out.per_head"


def test_per_head_counts_key_value_heads_under_grouped_query_attention():
    pytest.importorskip("transformers")
    from geosearch.models.zoo import build_model

    llama = build_model("hf:llama", vocab_size=64, model_args={
        "num_hidden_layers": 1, "hidden_size": 32, "num_attention_heads": 4, "num_key_value_heads": 2,
        "intermediate_size": 64, "block_size": 16}).model
    plan = bind(llama, Assignment.parse("attn=stiefel,attn.per_head=true,mlp=dgram", rules="llama"))
    heads = {r.types[0]: r.heads for r in plan.matched if r.types[0].startswith("attn")}
    # Rule: Q has the query heads, K and V the key/value heads (8 rows each); the family's
    # per_head reaches Q, K and V only, so O stays whole.
    assert heads == {"attn_q": (4,), "attn_k": (2,), "attn_v": (2,), "attn_out": ()}
