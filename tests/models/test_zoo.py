"""Model specs: the proxy presets, Hugging Face GPT-2 / LLaMA, other Hugging Face model types
and config directories (``hf:<model_type>``, ``hf:PATH``), and a user's own model."""

from __future__ import annotations

import logging
import math
import os
import socket
import sys
from pathlib import Path

import pytest
import torch

from geosearch.assignment import Assignment
from geosearch.util.errors import ConfigError, SettingsError
from geosearch.inspect import describe_parameters, fitting_rule_sets
from geosearch.rules.modules import get_rule_set, match_parameters, module_types
from geosearch.build import build_optimizer
from geosearch.models.model import GPT, make_config
from geosearch.proxy.probes import WeightProbe, attention_stats
from geosearch.rules.inference import infer_rules
from geosearch.models.lm import lm_logits, lm_loss
from geosearch.models.specs import model_spec_names
from geosearch.models.zoo import (
    BuiltModel,
    build_meta_model,
    build_model,
    check_logits,
    check_model_spec,
    default_rules,
)

HF_REASON = "Hugging Face transformers is not installed (pip install 'geosearch[hf]')"
TESTS = Path(__file__).resolve().parents[1]
T = 16
TINY = {
    "hf:gpt2": dict(n_layer=2, n_head=2, n_embd=32),
    "hf:llama": dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                     intermediate_size=96),
}
# hf:<model_type> beyond the two registered families: 2 layers, width 64, 4 heads
TYPES = {
    f"hf:{t}": dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, num_key_value_heads=kv,
                    intermediate_size=96)
    for t, kv in (("mistral", 2), ("qwen2", 2), ("gemma", 1), ("phi3", 4))
}
LLAMA_TYPES = ["attn_q", "attn_k", "attn_v", "attn_out", "mlp_gate", "mlp_in", "mlp_out"]
ASSIGN = "attn=stiefel,mlp=dgram"


@pytest.fixture
def hf():
    return pytest.importorskip("transformers", reason=HF_REASON)


@pytest.fixture
def user_model(monkeypatch):
    monkeypatch.syspath_prepend(str(TESTS))
    import _user_model

    return _user_model


def _batch(n: int = 4, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(256, (n, T), generator=g), torch.randint(256, (n, T), generator=g)


def _tiny(spec: str, **extra) -> BuiltModel:
    torch.manual_seed(0)
    return build_model(spec, vocab_size=256, block_size=T, model_args={**{**TINY, **TYPES}[spec], **extra})


def _offline(monkeypatch) -> None:
    def no_network(*args, **kwargs):
        raise OSError("network access attempted while building a model")

    monkeypatch.setattr(socket.socket, "connect", no_network)
    monkeypatch.setattr(socket, "create_connection", no_network)


# --------------------------------------------------------------------------- Hugging Face
@pytest.mark.parametrize("spec", list(TINY))
def test_hf_models_build_offline_and_start_at_uniform_loss(spec, hf, monkeypatch):
    _offline(monkeypatch)
    built = _tiny(spec)
    family = spec.split(":")[1]
    # Rule: the family's rule set and qk source, the data's vocabulary and context length.
    assert (built.family, built.rules, built.qk_source) == (family, family, "attention_interface")
    assert built.vocab_size == 256 and built.block_size == T
    assert built.model.config.vocab_size == 256 and not built.model.config.use_cache
    x, y = _batch()
    logits = lm_logits(built.model, x)
    assert logits.shape == (4, T, 256)
    # Rule: at a small random init the model predicts ~uniformly: loss ≈ ln 256.
    assert lm_loss(built.model, x, y).item() == pytest.approx(math.log(256), abs=0.1)
    # Rule: describe() is YAML-safe and names the spec, class and sizes.
    import yaml

    d = yaml.safe_load(yaml.safe_dump(built.describe()))
    assert d["spec"] == spec and d["class"] == type(built.model).__name__ and d["parameters"] > 0


def test_hf_defaults_are_the_small_proxy_size(hf):
    gpt2 = build_model("hf:gpt2", vocab_size=256, block_size=None, model_args={}).model.config
    llama = build_model("hf:llama", vocab_size=256, block_size=None, model_args={}).model.config
    # Rule: width 128, 4 layers, 4 heads, T=128 (the `small` preset); LLaMA with 2 KV heads.
    assert (gpt2.n_embd, gpt2.n_layer, gpt2.n_head, gpt2.n_positions) == (128, 4, 4, 128)
    assert (llama.hidden_size, llama.num_hidden_layers, llama.num_attention_heads,
            llama.num_key_value_heads, llama.intermediate_size, llama.max_position_embeddings) == (
        128, 4, 4, 2, 344, 128)
    # Rule: dropout off for proxy runs.
    assert gpt2.resid_pdrop == gpt2.embd_pdrop == gpt2.attn_pdrop == 0.0


def test_block_size_and_aliases(hf):
    # Rule: `block_size` in model_args sets the HF context-length field; aliases resolve.
    built = build_model("hf:gpt2", vocab_size=256, block_size=64,
                        model_args={"block_size": 16, "num_hidden_layers": 1, "hidden_size": 32, "n_head": 2})
    cfg = built.model.config
    assert (built.block_size, cfg.n_positions, cfg.n_layer, cfg.n_embd) == (16, 16, 1, 32)
    # Rule: the block_size argument is the default when model_args do not set it.
    assert build_model("hf:llama", vocab_size=256, block_size=48, model_args=TINY["hf:llama"]).block_size == 48
    # Rule: a larger vocab_size may be asked for, a smaller one is an error.
    assert _tiny("hf:gpt2", vocab_size=300).vocab_size == 300
    with pytest.raises(ConfigError, match="smaller than the data's 256"):
        _tiny("hf:gpt2", vocab_size=100)


@pytest.mark.parametrize("spec", list(TINY))
def test_hf_rules_cover_every_hidden_weight_and_the_optimizer_keeps_constraints(spec, hf):
    built = _tiny(spec)
    model = built.model
    match = match_parameters(model, built.rules)
    # Rule: every 2-D hidden weight has a module type; every rule finds weights.
    assert match.unmatched_hidden == [] and match.empty_rules == []
    assert len(match.matched) == 2 * (4 if spec == "hf:gpt2" else 7)
    _check_training_keeps_constraints(built)


def _check_training_keeps_constraints(built: BuiltModel) -> None:
    model = built.model
    assignment = Assignment.parse(ASSIGN, rules=built.rules)
    opt = build_optimizer(model, assignment, verbose=False)
    # Rule: every parameter is in exactly one group.
    grouped = [id(p) for g in opt.param_groups for p in g["params"]]
    assert len(grouped) == len(set(grouped)) == len(list(model.parameters()))
    probe = WeightProbe.from_assignment(model, assignment)
    x, y = _batch()
    losses = []
    for _ in range(5):
        loss = lm_loss(model, x, y)
        losses.append(loss.item())
        opt.zero_grad()
        loss.backward()
        opt.step()
    # Rule: after the steps every constrained type is still on its manifold ...
    errors = probe.measure()["constraint_error"]
    assert set(errors) == set(assignment.resolve()) and max(errors.values()) < 1e-3, errors
    # ... and the loss on the repeated batch went down.
    assert losses[-1] < losses[0]


# --------------------------------------------------------------------------- hf:<model_type>, hf:PATH
@pytest.mark.parametrize("spec", list(TYPES))
def test_hf_model_types_build_offline_with_rules_probes_and_constraints(spec, hf, monkeypatch):
    _offline(monkeypatch)
    built = _tiny(spec)
    model_type = spec.split(":")[1]
    # Rule: the family is the model type; the data's vocabulary and context; no KV cache.
    assert built.family == model_type and built.model.config.model_type == model_type
    assert built.vocab_size == built.model.config.vocab_size == 256 and built.block_size == T
    assert not built.model.config.use_cache
    # Rule: LLaMA-like families take the registered llama rule set; Phi-3 (fused qkv_proj and
    # gate_up_proj) gets rules read off its names with the same module types, split blocks.
    if model_type == "phi3":
        assert isinstance(built.rules, tuple) and module_types(built.rules) == LLAMA_TYPES
        assert {r.type: r.split for r in built.rules if r.split} == {
            "attn_qkv": ("attn_q", "attn_k", "attn_v"), "mlp_gate_up": ("mlp_gate", "mlp_in")}
    else:
        assert built.rules == "llama"
    # Rule: their attention is probed (q, k captured), so no warning is attached.
    assert built.qk_source == "attention_interface" and built.warnings == []
    stats = attention_stats(built.model, _batch()[0], built.qk_source)
    assert len(stats["max_logit_per_layer"]) == 2 and math.isfinite(stats["max_logit"])
    import yaml

    d = yaml.safe_load(yaml.safe_dump(built.describe()))  # Rule: describe() stays YAML-safe
    assert d["family"] == model_type and d["warnings"] == []
    _check_training_keeps_constraints(built)


def test_hf_model_type_defaults_are_small_with_the_familys_ratios(hf):
    def config(spec):
        return build_meta_model(spec, vocab_size=256).model.config

    mistral, phi3, gemma, opt = (config(f"hf:{t}") for t in ("mistral", "phi3", "gemma", "opt"))
    # Rule: the small proxy's width, depth, heads and context; the data's vocabulary.
    for c in (mistral, phi3, gemma):
        assert (c.hidden_size, c.num_hidden_layers, c.num_attention_heads, c.max_position_embeddings,
                c.vocab_size) == (128, 4, 4, 128, 256)
    # Rule: key-value heads and MLP width keep the family's ratios: Mistral 8 of 32 heads and
    # 14336 / 4096; Phi-3 all heads and 8192 / 3072 (341, rounded up to a multiple of 16: 352);
    # Gemma's head_dim follows the width.
    assert (mistral.num_key_value_heads, mistral.intermediate_size) == (1, 448)
    assert (phi3.num_key_value_heads, phi3.intermediate_size) == (4, 352)
    assert gemma.head_dim == 32 and gemma.intermediate_size == 1024
    # Rule: dropout off (OPT's default is 0.1), no token ids, no KV cache.
    assert opt.dropout == 0.0 and mistral.bos_token_id is None and mistral.eos_token_id is None
    assert not mistral.use_cache
    # Rule: what model_args set wins, and the ratios follow it.
    c = build_meta_model("hf:mistral", vocab_size=256, model_args={"hidden_size": 64, "num_attention_heads": 8}).model.config
    assert (c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.head_dim, c.intermediate_size) == (
        64, 8, 2, 8, 224)


def test_hf_path_builds_the_config_json_as_written(hf, tmp_path, monkeypatch):
    _offline(monkeypatch)
    hf.Qwen2Config(hidden_size=48, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                   intermediate_size=80, vocab_size=300, max_position_embeddings=512).save_pretrained(tmp_path)
    spec = f"hf:{tmp_path}"
    built = build_model(spec, vocab_size=256)
    c = built.model.config
    # Rule: the architecture is the file's (width 48, vocabulary 300), random weights.
    assert (built.family, type(built.model).__name__) == ("qwen2", "Qwen2ForCausalLM")
    assert (c.hidden_size, c.num_hidden_layers, c.num_key_value_heads, c.intermediate_size, c.vocab_size) == (
        48, 2, 2, 80, 300)
    # Rule: the model reaches 512 positions; the proxy trains on the default context (128).
    assert c.max_position_embeddings == 512 and built.block_size == 128
    assert built.rules == "llama" and built.qk_source == "attention_interface"
    # Rule: model_args override the file; block_size sets both the field and the context.
    other = build_model(spec, vocab_size=256, model_args={"num_hidden_layers": 1, "block_size": 64})
    assert (other.model.config.num_hidden_layers, other.model.config.max_position_embeddings,
            other.block_size) == (1, 64, 64)
    # Rule: the data's vocabulary must fit the file's.
    with pytest.raises(ConfigError, match="vocab_size 300 is smaller than the data's 512"):
        build_model(spec, vocab_size=512)
    # Rule: a directory without config.json, or of a model that is no causal LM, is named.
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match=r"no config.json in .*empty; hf:PATH takes a directory"):
        check_model_spec(f"hf:{tmp_path / 'empty'}")
    (tmp_path / "bert").mkdir()
    (tmp_path / "bert" / "config.json").write_text('{"model_type": "bert"}')
    with pytest.raises(ConfigError, match="has model_type 'bert', which is not a decoder-only causal LM"):
        check_model_spec(f"hf:{tmp_path / 'bert'}")
    # Rule: config.json is read as a user's config: a pipe is refused unopened, bytes that are
    # not UTF-8 are named.
    (tmp_path / "pipe").mkdir()
    os.mkfifo(tmp_path / "pipe" / "config.json")
    with pytest.raises(ConfigError, match=r"config.json: is a named pipe \(FIFO\), expected a Hugging Face config"):
        check_model_spec(f"hf:{tmp_path / 'pipe'}")
    (tmp_path / "bert" / "config.json").write_bytes(b'{"model_type": "\xff"}')
    with pytest.raises(ConfigError, match=r"config.json: is not UTF-8 text \(byte 0xff at offset 16\)"):
        check_model_spec(f"hf:{tmp_path / 'bert'}")


def test_hf_path_warns_when_its_vocabulary_is_far_from_the_datas(hf, tmp_path, caplog, monkeypatch):
    _offline(monkeypatch)
    for name, tied in (("tied", True), ("untied", False)):
        hf.Qwen2Config(hidden_size=48, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
                       intermediate_size=80, vocab_size=5000, tie_word_embeddings=tied).save_pretrained(tmp_path / name)
    spec = f"hf:{tmp_path / 'tied'}"
    with caplog.at_level(logging.WARNING, logger="geosearch"):
        built = build_meta_model(spec, vocab_size=256)
        again = build_meta_model(spec, vocab_size=256)
    line = (f"model {spec!r}: its config's vocab_size 5,000 is 19x the data's 256: the embedding, shared with "
            "the output head, holds 4,744 rows of width 48 (227,712 parameters) the data never uses, paid in "
            "memory and time every step; --model-arg vocab_size=256 (proxy.model_args.vocab_size) builds it "
            "for the data")
    # Rule: a checkpoint's vocabulary more than 4x and more than 1,024 ids above the data's is
    # one warning line, logged once, kept with the model (config.yaml); it says the cost and the fix.
    assert built.warnings == again.warnings == [line] and len(line) <= 400
    assert [r.getMessage() for r in caplog.records if r.name == "geosearch"] == [line]
    assert built.model.config.vocab_size == 5000  # a warning: the model is built as written
    # Rule: an untied head counts twice.
    untied = build_meta_model(f"hf:{tmp_path / 'untied'}", vocab_size=256).warnings[0]
    assert "the embedding and the output head hold 4,744 rows each of width 48 (455,424 parameters)" in untied
    # Rule: not far: at most 4x (5,000 on 1,250), or at most 1,024 ids more; nor when
    # model_args set the vocabulary (the user asked for it, or the fix was taken).
    assert build_meta_model(spec, vocab_size=1250).warnings == []
    assert build_meta_model(spec, vocab_size=1251).warnings == []
    assert len(build_meta_model(spec, vocab_size=1249).warnings) == 1
    assert build_meta_model(spec, vocab_size=256, model_args={"vocab_size": 256}).warnings == []
    assert build_meta_model(spec, vocab_size=256, model_args={"vocab_size": 8000}).warnings == []
    # Rule: a stand-in vocabulary (no data: geosearch inspect, the rules a space takes from the
    # model) is warned about by nobody.
    assert build_meta_model(spec, vocab_size=256, for_data=False).warnings == []
    assert default_rules(spec) == "llama"
    assert [r.getMessage() for r in caplog.records].count(line) == 1


def test_unknown_and_encoder_decoder_types_are_refused(hf):
    # Rule: a near miss names the close model types.
    with pytest.raises(ConfigError, match=r"unknown Hugging Face model 'hf:mistrall' \(did you mean hf:mistral"):
        check_model_spec("hf:mistrall")
    # Rule: unknown fields list the config's own fields, as for the registered families.
    with pytest.raises(ConfigError, match=r"unknown field 'n_layers' for model 'hf:qwen2' \(Qwen2Config\)") as e:
        check_model_spec("hf:qwen2", {"n_layers": 2})
    assert "num_hidden_layers" in e.value.allowed and "block_size" in e.value.allowed
    with pytest.raises(ConfigError, match="num_key_value_heads=3; it must divide the heads"):
        check_model_spec("hf:mistral", {"num_key_value_heads": 3})


def test_a_model_the_probes_cannot_capture_is_built_with_a_warning_that_says_why(hf, caplog, monkeypatch):
    from geosearch.models import zoo

    monkeypatch.setattr(zoo, "_WARNED", set())  # as in a fresh process
    args = dict(n_layer=1, hidden_size=32, n_head=2)
    with caplog.at_level(logging.WARNING, logger="geosearch"):
        first = build_model("hf:bloom", vocab_size=256, block_size=T, model_args=args)
        again = build_meta_model("hf:bloom", vocab_size=256, block_size=T, model_args=args)
    # Rule: BLOOM computes its attention logits itself: no q/k capture, and one warning line
    # per process that says why and what is lost; the built model carries it (config.yaml
    # records it).
    assert first.qk_source is None and again.qk_source is None
    lines = [r.getMessage() for r in caplog.records if r.name == "geosearch"]
    assert len(lines) == 1 and "\n" not in lines[0]
    assert ("cannot capture the queries and keys of BloomForCausalLM: its BloomAttention computes the "
            "attention logits inside its own forward") in lines[0]
    assert "logit-growth pruner has no signal" in lines[0]
    assert first.warnings == again.warnings == lines and first.describe()["warnings"] == lines


def test_gemma2_opt_and_gpt_bigcode_are_probed(hf):
    # Rule: soft-capped Gemma 2, OPT's learned positions and GPT-BigCode's multi-query c_attn
    # reach the probes through AttentionInterface: a finite max logit per layer, no warning.
    small = dict(num_hidden_layers=2, hidden_size=32, num_attention_heads=2)
    for spec, args in (("hf:gemma2", dict(small, num_key_value_heads=1, intermediate_size=64)),
                       ("hf:opt", dict(small, ffn_dim=64)), ("hf:gpt_bigcode", {"n_layer": 2, "n_embd": 32})):
        torch.manual_seed(0)
        built = build_model(spec, vocab_size=256, block_size=T, model_args=args)
        assert built.qk_source == "attention_interface" and built.warnings == [], spec
        stats = attention_stats(built.model, _batch()[0], built.qk_source)
        assert len(stats["max_logit_per_layer"]) == 2 and math.isfinite(stats["max_logit"]), spec
        assert ("raw_max_logit" in stats) == (spec == "hf:gemma2"), spec


@pytest.mark.parametrize("multi_query", [True, False])
def test_gpt_bigcode_c_attn_is_never_cut_into_equal_thirds(hf, multi_query):
    built = build_meta_model("hf:gpt_bigcode", vocab_size=256, model_args={"n_layer": 2, "multi_query": multi_query})
    model = built.model
    # Rule: c_attn is Q (128 rows) then K and V (32 each: one key/value head) under multi-query
    # attention, q, k, v interleaved head by head without it; neither splits into equal thirds,
    # so nanogpt_split does not fit and the default rules keep c_attn one type ...
    assert fitting_rule_sets(model) == ["nanogpt"] and built.rules == "nanogpt"
    assert all(not r.split for r in infer_rules(model))
    # ... and naming the split rules anyway is refused in one line that names the shapes.
    if multi_query:
        problem = (r"rule 'attn_qkv' cuts 'transformer\.h\.0\.attn\.c_attn\.weight' \(192 outputs\) into 3 "
                   r"equal blocks of 64, but it holds Q in 128 rows \(4 heads × 32\) and K, V in 32 each "
                   r"\(1 key/value head\)")
    else:
        problem = r"\(384 outputs\) into 3 equal blocks of 128, but it holds q, k and v interleaved head by head"
    with pytest.raises(ConfigError, match=problem + ".*keep it one module type") as e:
        match_parameters(model, "nanogpt_split")
    assert "\n" not in str(e.value)
    # Rule: rules whose split is right for the model still bind: nanogpt's proxy, GPT-2.
    assert match_parameters(GPT(make_config("tiny")), "nanogpt_split").matched
    assert match_parameters(build_meta_model("hf:gpt2", vocab_size=256).model, "gpt2_split").matched


def test_default_rules_of_hf_model_types(hf):
    # Rule: registered families answer without building; others are built on the meta device.
    assert default_rules("hf:llama") == "llama" and default_rules("hf:mistral") == "llama"
    phi3 = default_rules("hf:phi3")
    assert module_types(phi3) == LLAMA_TYPES
    # Rule: grouped-query Phi-3 keeps qkv_proj whole (K, V narrower than Q): one type, attn_qkv.
    gqa = default_rules("hf:phi3", {"num_key_value_heads": 2})
    assert module_types(gqa) == ["attn_qkv", "attn_out", "mlp_gate", "mlp_in", "mlp_out"]
    assert default_rules("hf:no_such_type") is None
    assert module_types(get_rule_set(default_rules("hf:qwen2"))) == LLAMA_TYPES


def test_nanogpt_rules_refuse_hf_gpt2_conv1d(hf):
    built = _tiny("hf:gpt2")
    # Rule: the nn.Linear rule set on Conv1D weights is an error naming the layout problem.
    with pytest.raises(ConfigError, match="Conv1D.*'in_out'"):
        match_parameters(built.model, "nanogpt")


# --------------------------------------------------------------------------- Conv1D orientation
def _proxy_and_hf_twins():
    """The proxy GPT and HF GPT-2 computing the same function (HF Conv1D = Linear weight ᵀ)."""
    torch.manual_seed(0)
    proxy = GPT(make_config("tiny", block_size=T)).double()
    hf = build_model("hf:gpt2", vocab_size=256, block_size=T,
                     model_args={**TINY["hf:gpt2"], "activation_function": "gelu"}).model.double()
    src = dict(proxy.named_parameters())
    modules = dict(hf.named_modules())
    with torch.no_grad():
        for name, p in hf.named_parameters():
            conv = type(modules[name.rpartition(".")[0]]).__name__ == "Conv1D" and p.dim() == 2
            p.copy_(src[name].mT if conv else src[name])
    return proxy, hf


def _hidden(model, rules):
    return {m.name: m.param for m in match_parameters(model, rules).matched}


@pytest.mark.parametrize("split", [False, True], ids=["fused", "split"])
def test_conv1d_weights_are_constrained_like_the_proxy_linear_ones(split, hf):
    proxy, hf_model = _proxy_and_hf_twins()
    x, y = _batch()
    torch.testing.assert_close(lm_logits(hf_model, x), lm_logits(proxy, x))  # the same function
    if split:
        rules = ("nanogpt_split", "gpt2_split")
        text = "attn_q=stiefel,attn_k=dgram,attn_v=oblique,attn_out=dgram,mlp_in=oblique,mlp_out=stiefel"
    else:
        rules = ("nanogpt", "gpt2")
        text = "attn_qkv=stiefel,attn_out=dgram,mlp_in=oblique,mlp_out=stiefel"
    opts = [build_optimizer(m, Assignment.parse(text, rules=r), verbose=False)
            for m, r in zip((proxy, hf_model), rules)]
    a, b = _hidden(proxy, rules[0]), _hidden(hf_model, rules[1])
    assert a.keys() == b.keys()
    # Rule: placing the weights on their manifolds gives the HF weights = the proxy's ᵀ,
    # including square DGram blocks (attn_out), whose Gram matrix is orientation-sensitive.
    for name in a:
        torch.testing.assert_close(b[name].detach().mT, a[name].detach(), rtol=0, atol=1e-6)
    # Rule: Stiefel c_attn: WᵀW = I on the proxy's (out, in) weight, W Wᵀ = I on HF's (in, out).
    C = 32
    c_attn = "transformer.h.0.attn.c_attn.weight"
    W_proxy, W_hf = a[c_attn].detach(), b[c_attn].detach()  # (3C, C) and (C, 3C)
    q_proxy, q_hf = (W_proxy[:C], W_hf[:, :C]) if split else (W_proxy, W_hf)  # attn_q block / whole
    eye = torch.eye(C, dtype=torch.float64)
    torch.testing.assert_close(q_proxy.mT @ q_proxy, eye, atol=1e-5, rtol=0)
    torch.testing.assert_close(q_hf @ q_hf.mT, eye, atol=1e-5, rtol=0)
    for _ in range(3):  # the same batch and steps on both
        losses = []
        for model, opt in zip((proxy, hf_model), opts):
            loss = lm_loss(model, x, y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
        assert losses[0] == pytest.approx(losses[1], rel=1e-6)
    # Rule: the two layouts follow one trajectory.
    for name in a:
        torch.testing.assert_close(b[name].detach().mT, a[name].detach(), rtol=0, atol=1e-5)
    # Rule: the weight probe measures the same σ_max and constraint errors on both.
    geometry_p = WeightProbe.from_assignment(proxy, Assignment.parse(text, rules=rules[0])).measure()
    geometry_h = WeightProbe.from_assignment(hf_model, Assignment.parse(text, rules=rules[1])).measure()
    assert geometry_h["sigma_max"] == pytest.approx(geometry_p["sigma_max"], rel=1e-5)
    assert max(geometry_h["constraint_error"].values()) < 1e-4
    assert geometry_h["constraint_error"] == pytest.approx(geometry_p["constraint_error"], abs=1e-6)


# --------------------------------------------------------------------------- presets, py:
def test_presets_build_the_proxy():
    torch.manual_seed(0)
    built = build_model("tiny", vocab_size=256, block_size=None, model_args={"n_layer": 1})
    # Rule: a preset gives the proxy GPT with the nanogpt rules and its own block size.
    assert isinstance(built.model, GPT) and built.rules == "nanogpt" and built.qk_source == "nanogpt"
    assert built.block_size == 32 and built.model.config.n_layer == 1
    assert built.config["n_embd"] == 32
    x, y = _batch()
    # Rule: lm_loss is the proxy's own loss.
    assert lm_loss(built.model, x, y).item() == pytest.approx(built.model(x, y)[1].item())


def test_user_factory_model(user_model):
    torch.manual_seed(0)
    built = build_model("py:_user_model:make_model", vocab_size=256, block_size=T, model_args={"width": 48})
    # Rule: the factory got vocab_size, block_size and the model args; no default rules;
    # the record_qk protocol is detected for the attention probes.
    assert isinstance(built.model, user_model.TinyLM) and built.model.embed.weight.shape == (256, 48)
    assert (built.family, built.rules, built.qk_source, built.block_size) == ("py", None, "nanogpt", T)
    assert built.config == {"factory": "_user_model:make_model",
                            "kwargs": {"vocab_size": 256, "block_size": T, "width": 48}}
    x, y = _batch()
    assert lm_loss(built.model, x, y).item() == pytest.approx(math.log(256), abs=0.1)
    stats = attention_stats(built.model, x, built.qk_source)
    assert len(stats["max_logit_per_layer"]) == 2 and math.isfinite(stats["max_logit"])
    # Rule: rules come from the user (a list, as in a YAML file), and then everything works.
    with pytest.raises(ConfigError, match="no default rule set"):
        describe_parameters(built)
    assignment = Assignment.parse(ASSIGN, rules=user_model.RULES)
    opt = build_optimizer(built.model, assignment, verbose=False)
    loss = lm_loss(built.model, x, y)
    loss.backward()
    opt.step()
    assert max(WeightProbe.from_assignment(built.model, assignment).measure()["constraint_error"].values()) < 1e-3


def test_user_factory_from_a_file_path():
    spec = f"py:{TESTS / '_user_model.py'}:make_model"
    built = build_model(spec, vocab_size=256, block_size=T, model_args={})
    assert type(built.model).__name__ == "TinyLM" and built.qk_source == "nanogpt"


def test_lm_logits_rejects_outputs_without_logits():
    class Bad(torch.nn.Module):
        def forward(self, idx):
            return idx.float()  # (B, T): no vocabulary dimension

    # Rule: a forward that breaks the contract is a TypeError that states the contract.
    with pytest.raises(TypeError, match=r"must return logits of shape \(B, T, V\)"):
        lm_logits(Bad(), torch.zeros(2, 3, dtype=torch.long))


# --------------------------------------------------------------------------- one forward pass
def test_check_logits_passes_the_models_that_keep_the_contract(user_model):
    for spec in ("tiny", "small", "py:_user_model:make_model"):
        # Rule: on the meta device the forward costs nothing and gives the logits' shape.
        assert check_logits(build_meta_model(spec, vocab_size=256, block_size=T), 256) is True
    # Rule: a vocabulary raised by model_args.vocab_size is the one the logits must have.
    wide = build_model("py:_user_model:make_model", vocab_size=256, block_size=T, model_args={"vocab_size": 300})
    assert check_logits(wide, 256) is True


def test_check_logits_refuses_logits_that_are_not_the_models_vocabulary(user_model):
    for build in (build_meta_model, build_model):
        built = build("py:_user_model:ignores_vocab", vocab_size=256, block_size=T)
        # Rule: a factory whose logits are not the vocabulary it was asked for is a settings
        # error naming the spec, the shapes and the vocabulary (meta or real alike).
        with pytest.raises(SettingsError) as e:
            check_logits(built, 256, source="s.yaml", key="proxy.model")
        assert str(e.value) == (
            f"s.yaml: proxy.model: model 'py:_user_model:ignores_vocab': forward(idx) returned logits of "
            f"shape (2, {T}, 100), expected (2, {T}, 256): their last dimension must be the vocabulary it "
            "was built for (vocab_size=256, the data's)")


def test_check_logits_of_a_forward_that_cannot_run_on_the_meta_device(user_model):
    # Rule: on the meta device it cannot tell (False); built for real, it checks.
    assert check_logits(build_meta_model("py:_user_model:checked", vocab_size=256, block_size=T), 256) is False
    assert check_logits(build_model("py:_user_model:checked", vocab_size=256, block_size=T), 256) is True
    narrow = "py:_user_model:checked_ignores_vocab"
    assert check_logits(build_meta_model(narrow, vocab_size=256, block_size=T), 256) is False
    with pytest.raises(SettingsError, match=r"returned logits of shape \(2, 16, 100\), expected \(2, 16, 256\)"):
        check_logits(build_model(narrow, vocab_size=256, block_size=T), 256)


def test_check_logits_of_a_forward_that_raises_keeps_the_models_mode_and_the_random_state():
    class Draws(torch.nn.Module):
        def __init__(self, fail):
            super().__init__()
            self.head, self.fail = torch.nn.Embedding(256, 256), fail

        def forward(self, idx):
            noise = torch.rand(())  # draws from the CPU generator
            if self.fail:
                raise RuntimeError("mat1 and mat2 shapes cannot be multiplied\n(second line)")
            return self.head(idx) + noise

    for fail in (False, True):
        model = Draws(fail)
        built = BuiltModel(model, "py:m:f", "py", None, 8, 256, None)
        torch.manual_seed(0)
        if fail:
            # Rule: a forward that raises on real tensors is one line naming the spec.
            with pytest.raises(SettingsError) as e:
                check_logits(built, 256)
            assert str(e.value) == ("--model: model: model 'py:m:f': its forward(idx) on a batch of shape "
                                    "(2, 8) raised RuntimeError: mat1 and mat2 shapes cannot be "
                                    "multiplied (second line)")
        else:
            assert check_logits(built, 256) is True
        # Rule: the run's random stream and the model's training mode are as they were.
        assert torch.rand(()) == torch.rand((), generator=torch.Generator().manual_seed(0))
        assert model.training


# --------------------------------------------------------------------------- errors
def test_unknown_specs_list_the_allowed_ones():
    for spec in ("huge", "hf:bert", "py:no_colon"):
        with pytest.raises(ConfigError) as e:
            check_model_spec(spec)
        # Rule: the message names the spec and lists the allowed specs.
        assert repr(spec) in str(e.value) and "hf:llama" in str(e.value) and "py:MODULE:FACTORY" in str(e.value)
    assert model_spec_names() == ["tiny", "mini", "small", "gpt2", "hf:gpt2", "hf:llama", "py:MODULE:FACTORY"]


def test_missing_transformers_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "transformers", None)  # `import transformers` fails
    with pytest.raises(ConfigError, match=r"needs Hugging Face transformers.*pip install 'geosearch\[hf\]'"):
        build_model("hf:gpt2", vocab_size=256, block_size=None, model_args={})


def test_bad_model_args(hf):
    # Rule: an unknown field names the spec and lists the config's fields.
    with pytest.raises(ConfigError, match="unknown field 'n_layers' for model 'hf:gpt2'") as e:
        check_model_spec("hf:gpt2", {"n_layers": 2})
    assert "n_layer" in e.value.allowed and e.value.key == "model_args.n_layers"
    with pytest.raises(ConfigError, match="model 'tiny': unknown model field 'layers'"):
        check_model_spec("tiny", {"layers": 2})
    # Rule: sizes are checked before anything is built.
    with pytest.raises(ConfigError, match="num_key_value_heads=3"):
        check_model_spec("hf:llama", {"num_key_value_heads": 3})
    with pytest.raises(ConfigError, match="width 30 is not a multiple of 4 heads"):
        check_model_spec("hf:gpt2", {"n_embd": 30})
    with pytest.raises(ConfigError, match=r"n_layer: expected a whole number in \[1, 1,024\], got 0"):
        check_model_spec("hf:gpt2", {"n_layer": 0})
    with pytest.raises(ConfigError, match=r"n_embd: expected a whole number in \[1, 16,777,216\], got 33554432"):
        check_model_spec("hf:gpt2", {"n_embd": 2**25, "n_head": 1})
    with pytest.raises(ConfigError, match="block_size=16 and n_positions=32 disagree"):
        check_model_spec("hf:gpt2", {"block_size": 16, "n_positions": 32})


def test_bad_user_factories(user_model):
    # Rule: each mistake names the spec; a missing factory lists the module's callables.
    with pytest.raises(ConfigError, match="cannot import module 'no_such_pkg.models'"):
        check_model_spec("py:no_such_pkg.models:make")
    with pytest.raises(ConfigError, match="module '_user_model' has no factory 'make'") as e:
        check_model_spec("py:_user_model:make")
    assert "make_model" in e.value.allowed
    with pytest.raises(ConfigError, match=r"make_model\(\) does not take the arguments") as e:
        check_model_spec("py:_user_model:make_model", {"colour": "red"})
    assert e.value.allowed == ["vocab_size", "block_size", "width", "depth", "heads"]
    with pytest.raises(ConfigError, match=r"not_a_model\(\) returned a str, not a torch.nn.Module"):
        build_model("py:_user_model:not_a_model", vocab_size=256, block_size=T, model_args={})
    with pytest.raises(ConfigError, match="no file"):
        check_model_spec("py:/nonexistent/m.py:make")


def test_a_config_class_that_raises_at_its_defaults_is_one_line_naming_the_model(monkeypatch):
    """transformers' own config code (a validator, a per-layer attribute read) raising while
    geosearch reads a type's defaults is a ConfigError naming the spec, not a traceback."""
    pytest.importorskip("transformers")
    import geosearch.models.zoo as zoo

    def boom(*args, **kwargs):
        raise RuntimeError("validate_architecture: hidden_size_per_layer_input must be 0\nmore")

    monkeypatch.setattr(zoo, "hf_source", boom)
    with pytest.raises(ConfigError) as e:
        zoo.build_meta_model("hf:mistral", vocab_size=256)
    text = str(e.value)
    assert "'hf:mistral' cannot be configured: RuntimeError: validate_architecture" in text
    assert "\n" not in text and e.value.key == "model"
