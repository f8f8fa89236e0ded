"""The shrinker keeps each family's constraints: per-layer lists, rotary and latent sizes."""

from __future__ import annotations

import pytest

from geosearch.models.hf_shrink import (
    MAX_EXPERTS,
    MAX_TOP_K,
    family_fields,
    fit_layers,
    round_width,
)


def test_fit_layers_keeps_every_kind_of_layer():
    hybrid = ["linear_attention"] * 3 + ["full_attention"]  # attention every 4th layer
    assert fit_layers(hybrid * 12, 4) == hybrid
    assert fit_layers(["a", "a", "a", "a", "b", "c"], 3) == ["a", "c", "b"]
    assert fit_layers(["sliding", "full"] * 10, 4) == ["sliding", "full"] * 2
    assert fit_layers(["x"] * 8, 2) == ["x", "x"]


@pytest.mark.parametrize("value, want", [(1, 16), (16, 16), (17, 32), (328.9, 336)])
def test_widths_round_up_to_sixteen(value, want):
    assert round_width(value) == want


def _fields(defaults, set_=None, args=None, names=None):
    names = names or {}
    return family_fields(
        defaults,
        lambda std: names.get(std, std if std in defaults else None),
        set_ or {},
        args or {},
    )


def test_gptj_rotary_dim_follows_the_head_size():
    # GPT-J: width 4096, 16 heads (head 256), rotary on 64 dims; shrunk to 128 / 4 heads (head 32)
    defaults = {"n_embd": 4096, "n_head": 16, "n_layer": 28, "rotary_dim": 64}
    names = {
        "hidden_size": "n_embd",
        "num_attention_heads": "n_head",
        "num_hidden_layers": "n_layer",
    }
    out = _fields(defaults, {"n_embd": 128, "n_head": 4, "n_layer": 4}, names=names)
    assert out["rotary_dim"] == 8  # a quarter of each head, as at full size


def test_gpt_neo_attention_types_follow_the_depth():
    defaults = {
        "hidden_size": 2048,
        "num_heads": 16,
        "num_layers": 24,
        "attention_types": [[["global", "local"], 12]],
    }
    names = {"num_attention_heads": "num_heads", "num_hidden_layers": "num_layers"}
    out = _fields(defaults, {"hidden_size": 128, "num_heads": 4, "num_layers": 4}, names=names)
    assert out["attention_types"] == [[["global", "local"], 2]]


def test_experts_top_k_groups_and_latent_sizes_are_shrunk():
    defaults = {
        "hidden_size": 7168,
        "num_attention_heads": 128,
        "num_hidden_layers": 61,
        "head_dim": 64,
        "n_routed_experts": 256,
        "num_experts_per_tok": 8,
        "n_group": 8,
        "topk_group": 4,
        "first_k_dense_replace": 3,
        "moe_intermediate_size": 2048,
        "q_lora_rank": 1536,
        "kv_lora_rank": 512,
        "qk_rope_head_dim": 64,
        "qk_nope_head_dim": 128,
        "v_head_dim": 128,
    }
    out = _fields(defaults, {"hidden_size": 128, "num_attention_heads": 4, "num_hidden_layers": 4})
    assert out["n_routed_experts"] == MAX_EXPERTS and out["num_experts_per_tok"] == MAX_TOP_K
    assert out["n_group"] == out["topk_group"] == 1 and out["first_k_dense_replace"] == 1
    assert out["moe_intermediate_size"] % 16 == 0 and out["kv_lora_rank"] % 16 == 0
    assert (
        out["qk_rope_head_dim"],
        out["qk_nope_head_dim"],
        out["v_head_dim"],
        out["head_dim"],
    ) == (16, 16, 32, 16)


def test_user_arguments_win():
    defaults = {
        "hidden_size": 4096,
        "num_attention_heads": 32,
        "num_local_experts": 8,
        "num_experts_per_tok": 2,
    }
    out = _fields(
        defaults, {"hidden_size": 128, "num_attention_heads": 4}, args={"num_local_experts": 8}
    )
    assert "num_local_experts" not in out and out["num_experts_per_tok"] == 2
