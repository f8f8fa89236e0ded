"""Attention roles: attn_qk and attn_vo expand to the right types on fused and separate layouts."""

from __future__ import annotations

import pytest

from geosearch.assignment import Assignment
from geosearch.plan import bind
from geosearch.rules.modules import ModuleRule
from geosearch.rules.roles import role_types, rules_for_roles
from geosearch.util.errors import ConfigError

QK_VO = {"attn_qk": ["attn_q", "attn_k"], "attn_vo": ["attn_v", "attn_out"]}


@pytest.mark.parametrize("rules", ["nanogpt_split", "gpt2_split", "llama", "mixtral", "gpt_oss"])
def test_roles_of_layouts_with_q_k_v_apart(rules):
    # Rule: a rule set with Q, K, V as types has both roles, each standing for its two types.
    assert role_types(rules) == QK_VO


@pytest.mark.parametrize("stacked, split", [("nanogpt", "nanogpt_split"), ("gpt2", "gpt2_split")])
def test_a_role_on_a_fused_stack_takes_the_split_twin(stacked, split):
    # Rule: the fused stack has no roles; naming one takes the per-matrix twin (Q/K/V blocks).
    assert role_types(stacked) == {}
    assert rules_for_roles(stacked, ["attn_qk", "mlp"]) == split
    assert rules_for_roles(stacked, ["attn", "mlp"]) == stacked  # no role named: unchanged
    a = Assignment.parse("attn_qk=stiefel,attn_vo=dgram,mlp=euclidean", rules=stacked)
    assert a.rules == split
    assert a.resolve() == {"attn_q": "stiefel", "attn_k": "stiefel", "attn_v": "dgram", "attn_out": "dgram",
                           "mlp_in": "euclidean", "mlp_out": "euclidean"}


def test_roles_on_separate_projections_and_precedence():
    a = Assignment.parse("attn_qk=stiefel,attn_vo=dgram,attn_k=euclidean,attn=adamw,mlp=dgram,"
                         "attn_qk.lr=0.01,attn.lr=0.1", rules="llama")
    geo = a.resolve()
    # Rule: a type's own entry wins over its role's, which wins over its family's.
    assert (geo["attn_q"], geo["attn_k"], geo["attn_v"], geo["attn_out"]) == ("stiefel", "euclidean", "dgram",
                                                                              "dgram")
    assert geo["mlp_gate"] == "dgram" and a.rules == "llama"
    # Rule: a role's options reach its types, over the family's.
    opts = a.resolve_options()
    assert opts["attn_q"]["lr"] == 0.01 and opts["attn_k"]["lr"] == 0.01 and opts["attn_v"]["lr"] == 0.1


def test_role_errors_name_the_key():
    # Rule: a role on rules without Q and K apart (latent attention) names the role and why.
    with pytest.raises(ConfigError, match="attn_qk.*attn_q, attn_k") as e:
        Assignment.parse("attn_qk=stiefel,attn_vo=dgram,mlp=dgram", rules="deepseek")
    assert e.value.key == "attn_qk"
    # Rule: custom rules keeping a fused weight whole cannot take a role.
    fused = (ModuleRule("attn_qkv", r"c_attn\.weight$", "attn"), ModuleRule("mlp_in", r"c_fc\.weight$", "mlp"))
    with pytest.raises(ConfigError, match="split"):
        Assignment({"attn_qk": "stiefel", "attn": "dgram", "mlp": "dgram"}, rules=fused)


def test_role_assignment_binds_blocks_of_the_fused_weight():
    from geosearch.models.zoo import build_model

    model = build_model("tiny", vocab_size=64).model
    plan = bind(model, Assignment.parse("attn_qk=stiefel,attn_vo=dgram,mlp=dgram"))
    c_attn = next(r for r in plan.matched if r.name.endswith("c_attn.weight"))
    # Rule: on nanogpt, Q and K blocks of c_attn take the QK geometry, V the VO one.
    assert c_attn.types == ("attn_q", "attn_k", "attn_v")
    assert c_attn.geometries == ("stiefel", "stiefel", "dgram")
    assert plan.assignment.to_dict()["geometry"] == {"attn_qk": "stiefel", "attn_vo": "dgram", "mlp": "dgram"}
