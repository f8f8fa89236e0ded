"""Rules read off module names (geosearch/rules/inference.py): types, layouts, splits, patterns."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from geosearch.rules.modules import ModuleRule, get_rule_set, match_parameters, module_types
from geosearch.models.model import GPT, make_config
from geosearch.rules.inference import infer_rules, model_rules, rules_fit

HF_REASON = "Hugging Face transformers is not installed (pip install 'geosearch[hf]')"
SMALL = dict(num_hidden_layers=2, hidden_size=32, num_attention_heads=4, intermediate_size=48)


def meta(spec: str, **args) -> nn.Module:
    pytest.importorskip("transformers", reason=HF_REASON)
    from geosearch.models.zoo import build_meta_model

    return build_meta_model(spec, vocab_size=256, model_args=args).model


def typed(model: nn.Module, rules) -> dict[str, tuple[str, ...]]:
    """parameter name -> the module types the rules give it (one per block)."""
    return {m.name: m.types for m in match_parameters(model, rules).matched}


# --------------------------------------------------------------------------- agreement
@pytest.mark.parametrize(("spec", "registered", "args"), [
    ("hf:llama", "llama", dict(SMALL, num_key_value_heads=2)),
    ("hf:gpt2", "gpt2_split", dict(n_layer=2, n_embd=32, n_head=4)),
])
def test_inferred_rules_agree_with_the_registered_sets(spec, registered, args):
    model = meta(spec, **args)
    inferred = infer_rules(model)
    # Rule: read off the names, LLaMA's weights get the llama set's types and GPT-2's fused
    # Conv1D c_attn (Q, K, V equally wide) the gpt2_split blocks: parameter by parameter.
    assert typed(model, inferred) == typed(model, registered)
    assert module_types(inferred) == module_types(get_rule_set(registered))
    layouts = {r.layout for r in inferred}
    assert layouts == ({"in_out"} if spec == "hf:gpt2" else {"out_in"})
    # Rule: the inferred rules fit (every hidden weight matched, every rule used).
    assert rules_fit(model, inferred)


def test_phi3_fused_weights_split_only_into_equal_blocks():
    mha = infer_rules(meta("hf:phi3", **SMALL, num_key_value_heads=4))
    # Rule: qkv_proj of equally wide Q, K, V splits in three; gate_up_proj in two, gate first.
    assert {r.type: r.split for r in mha} == {
        "attn_qkv": ("attn_q", "attn_k", "attn_v"), "attn_out": (), "mlp_gate_up": ("mlp_gate", "mlp_in"),
        "mlp_out": ()}
    gqa_model = meta("hf:phi3", **SMALL, num_key_value_heads=1)
    gqa = infer_rules(gqa_model)
    # Rule: under grouped-query attention K and V are narrower: qkv_proj stays one type.
    assert {r.type: r.split for r in gqa}["attn_qkv"] == ()
    assert rules_fit(gqa_model, gqa) and rules_fit(meta("hf:phi3", **SMALL, num_key_value_heads=4), mha)


def test_per_head_interleaved_qkv_stays_whole():
    model = meta("hf:gpt_neox", **SMALL)
    rules = infer_rules(model)
    # Rule: GPT-NeoX's query_key_value interleaves q, k, v per head: one type, no split;
    # its dense (inside attention), dense_h_to_4h and dense_4h_to_h get their types.
    assert [(r.type, r.split) for r in rules] == [("attn_qkv", ()), ("attn_out", ()), ("mlp_in", ()),
                                                  ("mlp_out", ())]
    assert rules_fit(model, rules)


# --------------------------------------------------------------------------- names and patterns
class _Toy(nn.Module):
    """A stack whose names need context (wo in attention vs MLP) and one unknown weight."""

    def __init__(self, n: int = 2, d: int = 8) -> None:
        super().__init__()
        self.embed = nn.Embedding(16, d)
        self.attn = nn.ModuleList(nn.ModuleDict(dict(wq=nn.Linear(d, d), wk=nn.Linear(d, d), wv=nn.Linear(d, d),
                                                     wo=nn.Linear(d, d))) for _ in range(n))
        self.ffn = nn.ModuleList(nn.ModuleDict(dict(w1=nn.Linear(d, 2 * d), w3=nn.Linear(d, 2 * d),
                                                    w2=nn.Linear(2 * d, d), wo=nn.Linear(d, d)))
                                 for _ in range(n))
        self.mixer = nn.Linear(d, d)  # no known name
        self.head = nn.Linear(d, 16)


def test_names_in_context_and_whole_name_patterns():
    model = _Toy()
    rules = infer_rules(model)
    types = typed(model, rules)
    # Rule: wq/wk/wv and w1/w3/w2 (LLaMA's reference names) are known anywhere; wo is the
    # attention output inside attention and the MLP output inside the MLP.
    assert types["attn.0.wq.weight"] == ("attn_q",) and types["ffn.1.w1.weight"] == ("mlp_gate",)
    assert types["attn.1.wo.weight"] == ("attn_out",) and types["ffn.0.wo.weight"] == ("mlp_out",)
    assert types["ffn.0.w2.weight"] == ("mlp_out",) and types["ffn.0.w3.weight"] == ("mlp_in",)
    # Rule: both wo weights end in "wo.weight": their patterns fall back to whole names with
    # \d+ for the layer index, so each matches its own weights only.
    by_type = {r.type: r for r in rules}
    assert by_type["attn_out"].pattern == r"^attn\.\d+\.wo\.weight$"
    assert by_type["mlp_out"].pattern == r"^(ffn\.\d+\.w2\.weight|ffn\.\d+\.wo\.weight)$"
    assert by_type["attn_q"].pattern == r"(^|\.)wq\.weight$"
    match = match_parameters(model, rules)
    # Rule: an unknown name is left to AdamW and reported; embeddings and head are not rules'.
    assert match.unmatched_hidden == ["mixer.weight"] and not match.empty_rules
    assert "head.weight" in match.embeddings and not rules_fit(model, rules)


def test_nothing_known_gives_no_rules_and_model_rules_prefers_registered_sets():
    # Rule: a model with no known name gets no rules (and no default rules).
    bare = nn.Sequential(nn.Embedding(10, 4), nn.Linear(4, 4), nn.Linear(4, 10))
    assert infer_rules(bare) == () and model_rules(bare) is None
    # Rule: a model a registered set fits gets that set's name (the first, by name).
    torch.manual_seed(0)
    assert model_rules(GPT(make_config("tiny"))) == "nanogpt"
    assert model_rules(meta("hf:mistral", **SMALL)) == "llama"
    # Rule: otherwise the inferred rules, which are ModuleRules a search space can carry.
    rules = model_rules(meta("hf:phi3", **SMALL))
    assert isinstance(rules, tuple) and all(isinstance(r, ModuleRule) for r in rules)


def test_experts_routers_and_their_layouts_are_read_off_a_mixture_of_experts():
    from test_build import MoE

    from geosearch.rules.modules import match_parameters as match

    rules = {r.type: r for r in infer_rules(MoE())}
    # Rule: a 3-D expert stack cut by .chunk(2, dim=-1) is [gate | up] per expert; the router
    # is its own type of family routing, AdamW unless named.
    assert rules["moe_gate_up"].split == ("moe_gate", "moe_in") and rules["moe_gate_up"].family == "mlp"
    assert rules["moe_out"].layout == "out_in" and rules["moe_out"].split == ()
    assert (rules["router"].family, rules["router"].default) == ("routing", "adamw")
    result = match(MoE(), tuple(rules.values()))
    assert not result.unmatched_hidden and not result.empty_rules
    assert {m.name for m in result.matched} == {"mlp.gate.weight", "mlp.experts.gate_up_proj",
                                               "mlp.experts.down_proj"}
