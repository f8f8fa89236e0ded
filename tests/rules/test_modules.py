"""Name rules: rule-set registry, matching, orientation and fused splits."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from geosearch.util.errors import ConfigError
from geosearch.rules.modules import (
    RULE_SETS,
    ModuleRule,
    check_rules,
    family_types,
    get_rule_set,
    match_parameters,
    module_types,
    register_rule_set,
    rule_set_names,
)

V, T, D = 32, 8, 16  # vocab, context, width


class Conv1D(nn.Module):
    """Hugging Face's Conv1D layout: weight is (in, out)."""

    def __init__(self, n_in: int, n_out: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(n_in, n_out) * 0.02)
        self.bias = nn.Parameter(torch.zeros(n_out))


class Block(nn.Module):
    def __init__(self, mlp: bool = True, extra: bool = False, conv: bool = False) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(D)
        self.attn = nn.Module()
        self.attn.c_attn = Conv1D(D, 3 * D) if conv else nn.Linear(D, 3 * D)
        self.attn.c_proj = nn.Linear(D, D)
        if mlp:
            self.mlp = nn.Module()
            self.mlp.c_fc = nn.Linear(D, 4 * D)
            self.mlp.c_proj = nn.Linear(4 * D, D)
            if extra:  # a hidden weight the nanogpt rules do not know; out = vocab size, like
                # a head, yet inside the layer stack, so it must be reported as hidden
                self.mlp.gate = nn.Linear(D, V, bias=False)


class TinyGPT(nn.Module):
    """nanoGPT names; lm_head tied to wte unless ``tied=False`` (then named ``head_name``)."""

    def __init__(self, n_layer: int = 2, tied: bool = True, head_name: str = "lm_head", **block_kw) -> None:
        super().__init__()
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(V, D), wpe=nn.Embedding(T, D),
            h=nn.ModuleList(Block(**block_kw) for _ in range(n_layer)), ln_f=nn.LayerNorm(D)))
        head = nn.Linear(D, V, bias=False)
        if tied:
            head.weight = self.transformer.wte.weight
        setattr(self, head_name, head)


HIDDEN = ["attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight"]


def test_registry_lists_known_names_on_unknown():
    # STYLE #5: an unknown name is an error listing the known ones.
    with pytest.raises(ConfigError) as e:
        get_rule_set("llama7")
    assert "unknown rule set 'llama7'" in str(e.value)
    assert "nanogpt, nanogpt_split" in str(e.value)
    assert {"nanogpt", "nanogpt_split"} <= set(rule_set_names())


def test_module_types_and_families():
    assert module_types(get_rule_set("nanogpt")) == ["attn_qkv", "attn_out", "mlp_in", "mlp_out"]
    # A split rule contributes its block types instead of the fused type.
    assert module_types(get_rule_set("nanogpt_split")) == ["attn_q", "attn_k", "attn_v", "attn_out",
                                                           "mlp_in", "mlp_out"]
    assert family_types(get_rule_set("nanogpt_split")) == {
        "attn": ["attn_q", "attn_k", "attn_v", "attn_out"], "mlp": ["mlp_in", "mlp_out"]}


def test_nanogpt_matches_hidden_weights_only():
    model = TinyGPT()
    res = match_parameters(model, "nanogpt")
    # Every hidden weight of every layer is matched, to the right type; no bias is.
    assert [m.name for m in res.matched] == [f"transformer.h.{i}.{n}" for i in range(2) for n in HIDDEN]
    assert [m.rule.type for m in res.matched[:4]] == ["attn_qkv", "attn_out", "mlp_in", "mlp_out"]
    assert res.unmatched_hidden == [] and res.empty_rules == []
    # Embeddings are recognised; the tied head is the same tensor, seen once.
    assert res.embeddings == ["transformer.wte.weight", "transformer.wpe.weight"]
    rest = [n for n, _ in res.rest]
    assert "lm_head.weight" not in rest
    assert all(p.dim() < 2 for n, p in res.rest if n not in res.embeddings)
    # Matched + rest is every parameter exactly once.
    ids = [id(m.param) for m in res.matched] + [id(p) for _, p in res.rest]
    assert len(ids) == len(set(ids)) == len(list(model.parameters()))


@pytest.mark.parametrize("head_name", ["lm_head", "decoder"])
def test_untied_head_is_not_a_hidden_weight(head_name):
    # An untied head is found by module type and shape (out = vocab, outside the layer
    # stack), so even an unusual name does not make it an "unassigned hidden weight".
    res = match_parameters(TinyGPT(tied=False, head_name=head_name), "nanogpt")
    assert f"{head_name}.weight" in res.embeddings
    assert res.unmatched_hidden == []


def test_unmatched_hidden_weights_and_empty_rules_are_reported():
    res = match_parameters(TinyGPT(extra=True), "nanogpt")
    assert res.unmatched_hidden == ["transformer.h.0.mlp.gate.weight", "transformer.h.1.mlp.gate.weight"]
    res = match_parameters(TinyGPT(mlp=False), "nanogpt")
    assert [r.type for r in res.empty_rules] == ["mlp_in", "mlp_out"]


def test_rule_matching_a_bias_is_an_error():
    rules = (ModuleRule("attn_qkv", r"c_attn", "attn"),)
    with pytest.raises(ConfigError, match=r"2-D weights only.*\\.weight\$"):
        match_parameters(TinyGPT(), rules)


def test_parameter_matching_two_rules_is_an_error():
    rules = (ModuleRule("attn_qkv", r"c_attn\.weight$", "attn"), ModuleRule("attn_any", r"attn\..*weight$", "attn"))
    with pytest.raises(ConfigError, match="matches several rules: attn_qkv"):
        match_parameters(TinyGPT(), rules)


def test_layout_must_agree_with_the_module_class():
    # nanogpt rules say nn.Linear (out, in); a Conv1D c_attn is (in, out).
    with pytest.raises(ConfigError, match=r"belongs to a Conv1D, whose weight is 'in_out'"):
        match_parameters(TinyGPT(conv=True), "nanogpt")
    rules = (ModuleRule("attn_qkv", r"c_attn\.weight$", "attn", split=("attn_q", "attn_k", "attn_v"),
                        layout="in_out"),)
    res = match_parameters(TinyGPT(conv=True), rules)
    assert res.matched[0].rule.split_dim == 1 and res.matched[0].param.shape == (D, 3 * D)


def test_split_must_divide_the_output_dim():
    rules = (ModuleRule("attn_qkv", r"c_attn\.weight$", "attn", split=("a", "b", "c", "d", "e")),)
    with pytest.raises(ConfigError, match=r"48 outputs \(dim 0\).*5 equal blocks"):
        match_parameters(TinyGPT(), rules)


@pytest.mark.parametrize("kw, message", [
    (dict(family="conv"), "unknown family 'conv'; expected one of: attn, mlp"),
    (dict(layout="oi"), "unknown layout 'oi'; expected one of: out_in, in_out"),
    (dict(pattern="c_attn("), "not a regular expression"),
    (dict(split=("only",)), "split needs at least 2 block types"),
])
def test_module_rule_validation(kw, message):
    args = dict(type="t", pattern=r"x\.weight$", family="attn") | kw
    with pytest.raises(ConfigError) as e:
        ModuleRule(**args)
    assert message in str(e.value)


def test_check_rules_rejects_duplicate_types():
    with pytest.raises(ConfigError, match=r"rules\[1\].*'mlp_in' is defined twice"):
        check_rules([ModuleRule("mlp_in", "a", "mlp"), ModuleRule("mlp_in", "b", "mlp")])
    with pytest.raises(ConfigError, match="clashes with the family shorthand"):
        check_rules([ModuleRule("attn", "a", "attn")])


def test_adding_a_rule_set_is_one_entry():
    rules = (ModuleRule("attn_qkv", r"c_attn\.weight$", "attn"), ModuleRule("mlp_in", r"c_fc\.weight$", "mlp"))
    try:
        register_rule_set("test_partial", rules)
        assert get_rule_set("test_partial") == rules
        assert "test_partial" in rule_set_names()
        with pytest.raises(ConfigError, match="already registered"):
            register_rule_set("test_partial", rules)
    finally:
        RULE_SETS.pop("test_partial", None)
