"""Tests of geosearch.rules.retarget and Assignment.with_rules: an answer moved to another rule set."""

from __future__ import annotations

import pytest

from geosearch.assignment import Assignment
from geosearch.util.errors import ConfigError
from geosearch.rules.modules import ModuleRule, get_rule_set, module_types
from geosearch.rules.retarget import counterparts


def test_each_new_type_takes_its_counterparts_geometry_and_options():
    proxy = Assignment({"attn_qkv": "stiefel", "attn_out": "oblique", "mlp_in": "dgram", "mlp_out": "adamw"},
                       options={"attn_qkv": {"lr": 0.01}}, settings={"spectral_lr": 0.05},
                       provenance={"study": "s"})
    llama = proxy.with_rules("llama")
    assert llama.rules == "llama"
    assert llama.resolve() == {"attn_q": "stiefel", "attn_k": "stiefel", "attn_v": "stiefel",
                               "attn_out": "oblique", "mlp_gate": "dgram", "mlp_in": "dgram", "mlp_out": "adamw"}
    opts = llama.resolve_options()
    assert opts["attn_q"] == opts["attn_k"] == opts["attn_v"] == {"lr": 0.01} and opts["attn_out"] == {}
    assert dict(llama.settings) == {"spectral_lr": 0.05}
    assert llama.provenance["study"] == "s" and llama.provenance["rules_from"] == "nanogpt"
    # and back: the split q/k/v agree, so they make one fused attn_qkv again
    assert llama.with_rules("gpt2").resolve() == {"attn_qkv": "stiefel", "attn_out": "oblique",
                                                  "mlp_in": "dgram", "mlp_out": "adamw"}


def test_a_family_said_by_its_shorthand_stays_so():
    moved = Assignment({"attn": "stiefel", "mlp": "dgram"}).with_rules("gpt2_split")
    assert dict(moved.geometry) == {"attn": "stiefel", "mlp": "dgram"}
    assert set(moved.resolve()) == set(module_types(get_rule_set("gpt2_split")))


def test_types_that_differ_cannot_become_one_and_the_message_names_them():
    split = Assignment({"attn_q": "stiefel", "attn_k": "dgram", "attn_v": "stiefel", "attn_out": "stiefel",
                        "mlp": "dgram"}, rules="nanogpt_split")
    with pytest.raises(ConfigError, match=r"'attn_qkv' of rule set 'gpt2' stands for attn_q=stiefel, "
                                          r"attn_k=dgram, attn_v=stiefel, which differ") as e:
        split.with_rules("gpt2")
    assert e.value.key == "rules"
    assert split.with_rules("llama").resolve()["attn_k"] == "dgram"  # llama keeps them apart
    with pytest.raises(ConfigError, match="unknown rule set 'nosuch'"):
        split.with_rules("nosuch")


def test_custom_rules_take_the_geometry_of_their_family():
    rules = (ModuleRule("mixer", r"\.mix\.weight$", "attn"), ModuleRule("ff", r"\.ff\.weight$", "mlp"))
    moved = Assignment({"attn": "stiefel", "mlp_in": "dgram", "mlp_out": "dgram"}).with_rules(rules)
    assert moved.resolve() == {"mixer": "stiefel", "ff": "dgram"}
    assert counterparts("ff", "mlp", {"mlp_in": "mlp", "mlp_out": "mlp", "attn_qkv": "attn"}) == ["mlp_in", "mlp_out"]
    with pytest.raises(ConfigError, match="'ff' of the custom rules stands for mlp_in=dgram, mlp_out=adamw, which differ; give"):
        Assignment({"attn": "stiefel", "mlp_in": "dgram", "mlp_out": "adamw"}).with_rules(rules)
