"""build_optimizer: groups, manifolds at init, split blocks, schedulers, Accelerate, errors."""

from __future__ import annotations

import copy
import dataclasses
import logging

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from geosearch.assignment import Assignment, load_assignment
from geosearch.util.errors import ConfigError
from geosearch.manifolds import get_manifold
from geosearch.rules.modules import ModuleRule
from geosearch.build import build_optimizer, optimizer_summary
from geosearch.optim import ManifoldMuon

V, T, D, H = 32, 8, 16, 2  # vocab, context, width, heads
ATOL = 1e-4  # float32 weights


class Conv1D(nn.Module):
    """Hugging Face's Conv1D: weight is (in, out), y = x @ W + b."""

    def __init__(self, n_in: int, n_out: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(n_in, n_out) * 0.02)
        self.bias = nn.Parameter(torch.zeros(n_out))

    def forward(self, x):
        return x @ self.weight + self.bias


class Block(nn.Module):
    def __init__(self, conv: bool = False, extra: bool = False) -> None:
        super().__init__()
        self.ln_1, self.ln_2 = nn.LayerNorm(D), nn.LayerNorm(D)
        self.attn, self.mlp = nn.Module(), nn.Module()
        self.attn.c_attn = Conv1D(D, 3 * D) if conv else nn.Linear(D, 3 * D)
        self.attn.c_proj = nn.Linear(D, D)
        self.mlp.c_fc = nn.Linear(D, 4 * D)
        self.mlp.c_proj = nn.Linear(4 * D, D)
        self.extra = nn.Linear(D, D) if extra else None

    def forward(self, x):  # (B, T, D)
        B, T_, _ = x.shape
        q, k, v = self.attn.c_attn(self.ln_1(x)).split(D, dim=2)
        q, k, v = (t.view(B, T_, H, D // H).transpose(1, 2) for t in (q, k, v))  # (B, nh, T, hs)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, T_, D)
        x = x + self.attn.c_proj(y)
        return x + self.mlp.c_proj(F.gelu(self.mlp.c_fc(self.ln_2(x))))


class TinyGPT(nn.Module):
    """nanoGPT names, lm_head tied to wte."""

    def __init__(self, n_layer: int = 2, **block_kw) -> None:
        super().__init__()
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(V, D), wpe=nn.Embedding(T, D),
            h=nn.ModuleList(Block(**block_kw) for _ in range(n_layer)), ln_f=nn.LayerNorm(D)))
        self.lm_head = nn.Linear(D, V, bias=False)
        self.lm_head.weight = self.transformer.wte.weight

    def forward(self, idx):
        x = self.transformer.wte(idx) + self.transformer.wpe(torch.arange(idx.shape[1]))
        for block in self.transformer.h:
            x = block(x)
        return self.lm_head(self.transformer.ln_f(x))


def loss_of(model, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, V, (4, T), generator=g)
    return F.cross_entropy(model(x[:, :-1]).reshape(-1, V), x[:, 1:].reshape(-1))


def train(model, opt, steps=3):
    for s in range(steps):
        opt.zero_grad(set_to_none=True)
        loss_of(model, s).backward()
        opt.step()


@pytest.fixture
def model():
    torch.manual_seed(0)
    return TinyGPT()


def by_name(opt):
    return {g["name"]: g for g in opt.param_groups}


def test_every_parameter_in_exactly_one_group(model):
    opt = build_optimizer(model, Assignment.parse("attn=stiefel,mlp=dgram"), verbose=False)
    assert isinstance(opt, ManifoldMuon)
    ids = [id(p) for g in opt.param_groups for p in g["params"]]
    unique = {id(p) for p in model.parameters()}  # the tied head/wte tensor counts once
    assert len(ids) == len(set(ids)) == len(unique)
    assert set(ids) == unique
    groups = by_name(opt)
    assert set(groups) == {"attn_qkv,attn_out", "mlp_in,mlp_out", "adamw: embeddings, head",
                           "adamw: norms, biases (no decay)"}
    assert groups["attn_qkv,attn_out"]["geometry"] == "stiefel"
    assert groups["mlp_in,mlp_out"]["geometry"] == "dgram"


def test_nanogpt_weight_decay_convention(model):
    opt = build_optimizer(model, Assignment.parse("attn=stiefel,mlp=dgram"), verbose=False)
    groups = by_name(opt)
    decay, no_decay = groups["adamw: embeddings, head"], groups["adamw: norms, biases (no decay)"]
    # Embeddings (and the head tied to wte) decay; norms and biases do not.
    assert {id(p) for p in decay["params"]} == {id(model.transformer.wte.weight), id(model.transformer.wpe.weight)}
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    assert all(p.dim() < 2 for p in no_decay["params"])
    assert decay["geometry"] == no_decay["geometry"] == "adamw"
    assert decay["lr"] == no_decay["lr"] == 6e-4 and tuple(decay["betas"]) == (0.9, 0.95)


def test_matched_weights_start_on_their_manifold(model):
    opt = build_optimizer(model, Assignment.parse("attn=stiefel,mlp=dgram"), verbose=False)
    for g in opt.param_groups:
        if g["geometry"] == "adamw":
            continue
        for p in g["params"]:
            ok, why = get_manifold(g["geometry"]).check(p.detach(), atol=ATOL)
            assert ok, why
    # And they stay there after a few steps, while the loss goes down.
    before = loss_of(model).item()
    train(model, opt, steps=3)
    assert loss_of(model).item() < before
    for g in opt.param_groups:
        if g["geometry"] != "adamw":
            for p in g["params"]:
                ok, why = get_manifold(g["geometry"]).check(p.detach(), atol=ATOL)
                assert ok, why


@pytest.mark.parametrize("conv", [False, True], ids=["linear-out_in", "conv1d-in_out"])
def test_split_blocks_each_keep_their_own_geometry(conv):
    torch.manual_seed(0)
    model = TinyGPT(conv=conv)
    if conv:  # a custom rule list: c_attn is (in, out), blocks along dim 1
        rules = [ModuleRule("attn_qkv", r"attn\.c_attn\.weight$", "attn", split=("attn_q", "attn_k", "attn_v"),
                            layout="in_out"),
                 ModuleRule("attn_out", r"attn\.c_proj\.weight$", "attn"),
                 ModuleRule("mlp_in", r"mlp\.c_fc\.weight$", "mlp"), ModuleRule("mlp_out", r"mlp\.c_proj\.weight$", "mlp")]
    else:
        rules = "nanogpt_split"
    a = Assignment({"attn_q": "stiefel", "attn_k": "dgram", "attn_v": "euclidean", "attn_out": "stiefel",
                    "mlp": "adamw"}, rules=rules)
    opt = build_optimizer(model, a, verbose=False)
    g = by_name(opt)["attn_q,attn_k,attn_v"]
    # One group holds the fused tensors, its geometry the per-block tuple.
    assert g["geometry"] == ("stiefel", "dgram", "euclidean")
    assert g["split"] == 3 and g["split_dim"] == (1 if conv else 0)
    assert len(g["params"]) == 2
    # The MLP is plain AdamW, decayed (2-D weights).
    mlp = by_name(opt)["mlp_in,mlp_out"]
    assert mlp["geometry"] == "adamw" and mlp["weight_decay"] == 0.1 and len(mlp["params"]) == 4
    train(model, opt, steps=3)
    for block in model.transformer.h:
        w = block.attn.c_attn.weight.detach()
        q, k, v = w.chunk(3, dim=g["split_dim"])
        if conv:  # a Conv1D block is constrained in the (out, in) orientation, as nn.Linear's
            q, k, v = q.mT, k.mT, v.mT
        for name, part in (("stiefel", q), ("dgram", k)):
            ok, why = get_manifold(name).check(part, atol=ATOL)
            assert ok, why
        # Q is Stiefel (all singular values 1); K is only DGram, so it is not Stiefel.
        assert not get_manifold("stiefel").check(k, atol=ATOL)[0]


def test_overrides_and_per_type_options(model):
    a = Assignment({"attn": "stiefel", "mlp": "dgram", "mlp_out": "adamw"},
                   options={"attn_qkv": {"lr": 0.01, "solver": "dual", "dual_steps": 3}, "mlp_out": {"lr": 1e-3}})
    opt = build_optimizer(model, a, verbose=False, spectral_lr=0.05, lr=3e-4, momentum=0.9)
    groups = by_name(opt)
    # Distinct options -> distinct groups; per-type options win over the overrides.
    assert groups["attn_qkv"]["lr"] == 0.01 and groups["attn_qkv"]["solver"] == "dual"
    assert groups["attn_qkv"]["dual_steps"] == 3
    assert groups["attn_out"]["lr"] == 0.05 and groups["attn_out"]["solver"] == "project"
    assert groups["attn_out"]["momentum"] == 0.9
    assert groups["mlp_in"]["lr"] == 0.05 and groups["mlp_in"]["geometry"] == "dgram"
    assert groups["mlp_out"]["geometry"] == "adamw" and groups["mlp_out"]["lr"] == 1e-3
    assert groups["adamw: embeddings, head"]["lr"] == 3e-4


def test_lambda_lr_scales_every_group(model):
    opt = build_optimizer(model, Assignment.parse("attn=stiefel,mlp=dgram"), verbose=False)
    base = [g["lr"] for g in opt.param_groups]
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 0.5 ** step)
    train(model, opt, steps=1)
    sched.step()
    train(model, opt, steps=1)
    sched.step()
    # Each group's lr = its own initial lr x the schedule factor (0.25 after two steps).
    assert [g["initial_lr"] for g in opt.param_groups] == base
    assert [g["lr"] for g in opt.param_groups] == pytest.approx([b * 0.25 for b in base])


def test_one_step_through_accelerate(model, accelerator):
    opt = build_optimizer(model, Assignment.parse("attn=stiefel,mlp=dgram"), verbose=False)
    model, opt = accelerator.prepare(model, opt)
    w0 = model.transformer.h[0].attn.c_attn.weight.detach().clone()
    opt.zero_grad()
    accelerator.backward(loss_of(model))
    opt.step()
    w1 = model.transformer.h[0].attn.c_attn.weight.detach()
    assert not torch.equal(w0, w1)  # the step happened...
    assert get_manifold("stiefel").check(w1, atol=ATOL)[0]  # ...and stayed on the manifold
    assert "stiefel" in optimizer_summary(opt)


def test_summary_lists_each_geometry_with_counts(model, capsys, caplog):
    with caplog.at_level(logging.INFO, logger="geosearch"):
        opt = build_optimizer(model, Assignment.parse("attn=stiefel,mlp=dgram,mlp_out=euclidean"))
    printed = capsys.readouterr().out
    assert printed.strip() == caplog.records[-1].getMessage().strip() == optimizer_summary(
        opt, note="rule set 'nanogpt'")
    n_unique = sum(p.numel() for p in model.parameters())  # tied tensor once
    n_tensors = len(list(model.parameters()))
    assert printed.splitlines()[0] == (f"ManifoldMuon: 5 groups, {n_tensors} tensors, {n_unique:,} parameters "
                                       "[rule set 'nanogpt']")
    rows = {line.split()[0]: line.split() for line in printed.splitlines()[2:]}
    # name, geometry, tensors, params: 2 layers of each weight
    assert rows["attn_qkv,attn_out"][1:4] == ["stiefel", "4", f"{2 * (3 * D * D + D * D):,}"]
    assert rows["mlp_in"][1:4] == ["dgram", "2", f"{2 * 4 * D * D:,}"]
    assert rows["mlp_out"][1:4] == ["euclidean", "2", f"{2 * 4 * D * D:,}"]
    # quiet mode logs but does not print
    build_optimizer(model, Assignment.parse("attn=stiefel,mlp=dgram"), verbose=False)
    assert capsys.readouterr().out == ""


def test_summary_shows_split_geometries():
    torch.manual_seed(0)
    a = Assignment({"attn_q": "stiefel", "attn_k": "dgram", "attn_v": "stiefel", "attn_out": "stiefel",
                    "mlp": "dgram"}, rules="nanogpt_split")
    text = optimizer_summary(build_optimizer(TinyGPT(), a, verbose=False))
    assert "stiefel/dgram/stiefel (split 3, dim 0)" in text


def test_loads_a_saved_assignment_and_skips_frozen_parameters(model, tmp_path, capsys):
    path = Assignment.parse("attn=stiefel,mlp=dgram").save(tmp_path / "a.yaml")
    model.transformer.wpe.weight.requires_grad_(False)
    opt = build_optimizer(model, path)
    assert "1 frozen tensor(s) left out" in capsys.readouterr().out
    ids = {id(p) for g in opt.param_groups for p in g["params"]}
    assert id(model.transformer.wpe.weight) not in ids
    assert ids == {id(p) for p in model.parameters() if p.requires_grad}


def test_all_adamw_split_weight_goes_to_adamw(model):
    a = Assignment({"attn_q": "adamw", "attn_k": "adamw", "attn_v": "adamw", "attn_out": "stiefel",
                    "mlp": "dgram"}, rules="nanogpt_split")
    g = by_name(build_optimizer(model, a, verbose=False))["attn_q,attn_k,attn_v"]
    assert g["geometry"] == "adamw" and "split" not in g


# (case id, how to build the failing call, substrings of the message)
def _missing_mlp():
    torch.manual_seed(0)
    m = TinyGPT()
    for block in m.transformer.h:
        del block.mlp.c_fc
    return m, Assignment.parse("attn=stiefel,mlp=dgram"), {}


def _extra_hidden():
    torch.manual_seed(0)
    return TinyGPT(extra=True), Assignment.parse("attn=stiefel,mlp=dgram"), {}


def _conv_with_linear_rules():
    return TinyGPT(conv=True), Assignment.parse("attn=stiefel,mlp=dgram"), {}


def _mixed_split():
    return TinyGPT(), Assignment({"attn": "stiefel", "attn_v": "adamw", "mlp": "dgram"}, rules="nanogpt_split"), {}


def _split_options():
    return TinyGPT(), Assignment({"attn": "stiefel", "mlp": "dgram"}, rules="nanogpt_split",
                                 options={"attn_q": {"lr": 0.01}}), {}


ERRORS = [
    ("rule-matches-nothing", _missing_mlp, ["rule set 'nanogpt': rule(s) matching no parameter of TinyGPT: mlp_in"]),
    ("unassigned-hidden", _extra_hidden, ["2 2-D hidden weight(s) match no rule of rule set 'nanogpt'",
                                          "transformer.h.0.extra.weight, transformer.h.1.extra.weight",
                                          "nanogpt, nanogpt_split"]),
    ("layout-contradicts-module", _conv_with_linear_rules,
     ["build_optimizer: rules: rule set 'nanogpt': rule 'attn_qkv' says layout 'out_in' but "
      "'transformer.h.0.attn.c_attn.weight' belongs to a Conv1D"]),
    ("split-mixes-adamw", _mixed_split, ["blocks attn_q, attn_k, attn_v", "must be all manifolds or all 'adamw'"]),
    ("split-options-differ", _split_options, ["so they share one step; their options differ"]),
    ("unknown-override", lambda: (TinyGPT(), Assignment.parse("attn=stiefel,mlp=dgram"), {"learning_rate": 1}),
     ["build_optimizer: learning_rate: unknown setting 'learning_rate'", "lr, spectral_lr, betas"]),
    ("bad-override", lambda: (TinyGPT(), Assignment.parse("attn=stiefel,mlp=dgram"), {"solver": "newton"}),
     ["build_optimizer: solver: expected a solver name", "project, dual"]),
    ("not-an-assignment", lambda: (TinyGPT(), {"attn": "stiefel"}, {}), ["expected an Assignment"]),
]


@pytest.mark.parametrize("make, expected", [c[1:] for c in ERRORS], ids=[c[0] for c in ERRORS])
def test_errors_are_config_errors_with_clear_messages(make, expected):
    model, assignment, overrides = make()
    with pytest.raises(ConfigError) as e:
        build_optimizer(model, assignment, verbose=False, **overrides)
    for part in expected:
        assert part in str(e.value), str(e.value)


def test_state_dict_round_trip(model):
    # Checkpoint/resume: a fresh optimizer loads the state and keeps the group keys.
    a = Assignment.parse("attn=stiefel,mlp=dgram")
    opt = build_optimizer(model, a, verbose=False)
    train(model, opt, steps=1)
    opt2 = build_optimizer(model, a, verbose=False)
    opt2.load_state_dict(opt.state_dict())
    assert [g["name"] for g in opt2.param_groups] == [g["name"] for g in opt.param_groups]
    w = model.transformer.h[0].attn.c_attn.weight
    assert torch.equal(opt2.state[w]["momentum_buffer"], opt.state[w]["momentum_buffer"])


def _comparable(opt, model):
    """Param groups with parameters named (and their values), for comparing two optimizers."""
    names = {id(p): n for n, p in model.named_parameters()}
    return [{k: ([(names[id(p)], p.detach().clone()) for p in v] if k == "params" else v) for k, v in g.items()}
            for g in opt.param_groups]


def test_saved_settings_rebuild_the_same_optimizer(tmp_path):
    plain = Assignment.parse("attn=stiefel,mlp=dgram,mlp_out=adamw,attn_out.lr=0.01")
    path = dataclasses.replace(plain, settings={"spectral_lr": 0.05, "lr": 1e-3}).save(tmp_path / "best.yaml")
    assert "settings:\n  spectral_lr: 0.05\n  lr: 0.001\n" in path.read_text()
    loaded = load_assignment(path)
    torch.manual_seed(0)
    m1 = TinyGPT()
    m2, m3 = copy.deepcopy(m1), copy.deepcopy(m1)
    from_file = _comparable(build_optimizer(m1, loaded, verbose=False), m1)
    by_hand = _comparable(build_optimizer(m2, plain, verbose=False, spectral_lr=0.05, lr=1e-3), m2)
    # Rule: the file alone rebuilds the optimizer: same groups, geometry, lr, every key, weights.
    assert len(from_file) == len(by_hand) == 6
    for a, b in zip(from_file, by_hand):
        assert a.keys() == b.keys() and all(a[k] == b[k] for k in a if k != "params"), a["name"]
        assert [n for n, _ in a["params"]] == [n for n, _ in b["params"]]
        assert all(torch.equal(x, y) for (_, x), (_, y) in zip(a["params"], b["params"]))
    # Rule: the saved settings took effect (the catalog defaults are 0.02 and 6e-4).
    assert {g["name"]: g["lr"] for g in from_file} == {
        "attn_qkv": 0.05, "attn_out": 0.01, "mlp_in": 0.05, "mlp_out": 1e-3,
        "adamw: embeddings, head": 1e-3, "adamw: norms, biases (no decay)": 1e-3}
    # Rule: explicit keywords still win over the saved settings, per-type options over both.
    over = {g["name"]: g["lr"] for g in build_optimizer(m3, loaded, verbose=False, spectral_lr=0.07).param_groups}
    assert over["attn_qkv"] == 0.07 and over["attn_out"] == 0.01 and over["mlp_out"] == 1e-3


def test_adamw_comes_first_so_a_trainer_logs_its_learning_rate(model):
    opt = build_optimizer(model, Assignment.parse("attn=stiefel,mlp=dgram"), verbose=False, lr=3e-4)
    assert opt.param_groups[0]["geometry"] == "adamw" and opt.param_groups[0]["lr"] == 3e-4
    # what Hugging Face's Trainer logs as learning_rate: the scheduler's first group
    scheduler = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 1.0)
    assert scheduler.get_last_lr()[0] == 3e-4


def test_the_group_table_is_printed_by_the_main_process_only(model, monkeypatch, capsys):
    assignment = Assignment.parse("attn=stiefel,mlp=dgram")
    monkeypatch.setenv("RANK", "1")
    build_optimizer(model, assignment)
    assert capsys.readouterr().out == ""
    monkeypatch.setenv("RANK", "0")
    build_optimizer(model, assignment)
    assert "ManifoldMuon:" in capsys.readouterr().out


# --------------------------------------------------------------------------- mixture of experts
E, I = 3, 8  # experts, expert MLP width


class Experts(nn.Module):
    """Mixtral's experts in transformers 5: [experts, out, in] stacks, gate and up stacked whole."""

    def __init__(self) -> None:
        super().__init__()
        self.gate_up_proj = nn.Parameter(torch.randn(E, 2 * I, D) * 0.2)
        self.down_proj = nn.Parameter(torch.randn(E, D, I) * 0.2)

    def forward(self, x, weights):  # x (N, D), weights (N, E): every expert, weighted
        out = 0
        for e in range(E):
            gate, up = F.linear(x, self.gate_up_proj[e]).chunk(2, dim=-1)
            out = out + weights[:, e:e + 1] * F.linear(F.silu(gate) * up, self.down_proj[e])
        return out


class MoE(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(V, D)
        self.mlp = nn.Module()
        self.mlp.gate = nn.Linear(D, E, bias=False)
        self.mlp.experts = Experts()
        self.head = nn.Linear(D, V, bias=False)

    def forward(self, idx):
        x = self.embed(idx).flatten(0, 1)  # (N, D)
        x = x + self.mlp.experts(x, self.mlp.gate(x).softmax(-1))
        return self.head(x).view(*idx.shape, V)


MOE_RULES = (
    ModuleRule("moe_gate_up", r"mlp\.experts\.gate_up_proj$", "mlp", split=("moe_gate", "moe_in")),
    ModuleRule("moe_out", r"mlp\.experts\.down_proj$", "mlp"),
    ModuleRule("router", r"mlp\.gate\.weight$", "routing", default="adamw"),
)


def _moe_loss(model: nn.Module, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    idx = torch.randint(0, V, (2, T + 1), generator=g)
    return F.cross_entropy(model(idx[:, :-1]).flatten(0, 1), idx[:, 1:].flatten())


@pytest.mark.parametrize("geometry", ["dgram", "stiefel"])
def test_each_expert_is_stepped_on_its_manifold_as_if_alone(geometry):
    torch.manual_seed(0)
    model = MoE()
    opt = build_optimizer(model, Assignment({"mlp": geometry}, rules=MOE_RULES), verbose=False)
    experts = model.mlp.experts
    groups = {id(p): g for g in opt.param_groups for p in g["params"]}
    # the same matrices, one tensor per expert, stepped by an optimizer of their own
    alone = {name: [nn.Parameter(getattr(experts, name)[e].detach().clone()) for e in range(E)]
             for name in ("gate_up_proj", "down_proj")}
    solo = ManifoldMuon([{**{k: v for k, v in groups[id(getattr(experts, name))].items() if k != "params"},
                          "params": alone[name]} for name in alone])
    manifold = get_manifold(geometry)
    for step in range(4):
        opt.zero_grad()
        _moe_loss(model, step).backward()
        for name, params in alone.items():
            for e, p in enumerate(params):
                p.grad = getattr(experts, name).grad[e].clone()
        opt.step()
        solo.step()
        for name, params in alone.items():
            stack = getattr(experts, name).detach()
            for e, p in enumerate(params):
                err = (stack[e] - p.detach()).abs().max().item()
                assert err < 1e-5, (step, name, e, err)  # float32 rounding of a batched product
    for e in range(E):  # every expert's matrix (each block of gate_up) on the manifold
        for W in (*experts.gate_up_proj.detach()[e].chunk(2, dim=0), experts.down_proj.detach()[e]):
            assert manifold.constraint_error(W).item() < 1e-5


def test_routers_default_to_adamw_and_can_be_assigned():
    model = MoE()
    opt = build_optimizer(model, Assignment({"mlp": "dgram"}, rules=MOE_RULES), verbose=False)
    (router,) = [g for g in opt.param_groups if g["name"] == "router"]
    assert router["geometry"] == "adamw" and router["params"][0] is model.mlp.gate.weight
    opt = build_optimizer(model, Assignment({"mlp": "dgram", "router": "stiefel"}, rules=MOE_RULES), verbose=False)
    (router,) = [g for g in opt.param_groups if g["name"] == "router"]
    assert router["geometry"] == "stiefel"
    assert get_manifold("stiefel").constraint_error(model.mlp.gate.weight.detach()).item() < 1e-5
    opt = build_optimizer(model, Assignment({"mlp": "dgram", "routing": "oblique"}, rules=MOE_RULES), verbose=False)
    assert [g["geometry"] for g in opt.param_groups if g["name"] == "router"] == ["oblique"]
