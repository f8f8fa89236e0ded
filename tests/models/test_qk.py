"""Queries and keys captured by hooks are the ones the model's attention uses."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from geosearch.models.model import GPT, make_config
from geosearch.proxy.probes import attention_stats, causal_logits, recording_qk, row_entropy
from geosearch.models.qk import QK_SOURCES, LayerQK, attention_layers, detect_qk_source, llama_rotary, qk_capture

HF_REASON = "Hugging Face transformers is not installed (pip install 'geosearch[hf]')"
T = 16

# Tiny Hugging Face models: 2 layers, width 32-64. Llama with grouped-query attention.
_GQA = dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, num_key_value_heads=2, intermediate_size=96)
HF_ARGS = {
    "hf:gpt2": dict(n_layer=2, n_head=2, n_embd=32),
    "hf:gpt2-inverse-layer-scale": dict(n_layer=2, n_head=2, n_embd=32, scale_attn_by_inverse_layer_idx=True),
    "hf:llama": _GQA,
    # hf:<model_type> families sharing LLaMA's attention path, each with what it adds:
    "hf:mistral": _GQA,
    "hf:qwen2": _GQA,  # q/k/v biases
    "hf:gemma": dict(_GQA, num_key_value_heads=1),  # multi-query
    "hf:phi3": _GQA,  # fused qkv_proj [Q | K | V], K and V narrower
    "hf:qwen3": _GQA,  # q_norm / k_norm per head
    "hf:olmo2": _GQA,  # q_norm / k_norm over the whole width
    "hf:olmo-clip": dict(_GQA, clip_qkv=0.05),  # q, k clamped
    "hf:cohere-qk-norm": dict(_GQA, use_qk_norm=True),  # (nh, hd) norm weights, interleaved rotary
    "hf:phi-qk-layernorm": dict(_GQA, num_key_value_heads=4, qk_layernorm=True),  # partial rotary
    "hf:gpt_neox": dict(_GQA, num_key_value_heads=None),  # fused query_key_value per head, partial rotary
    "hf:smollm3-nope": dict(_GQA, no_rope_layers=[1, 0]),  # layer 1 without rotary embeddings
}
HF_ARGS = {k: {a: v for a, v in args.items() if v is not None} for k, args in HF_ARGS.items()}


@pytest.fixture(scope="module")
def recorder():
    """An attention implementation that records what the model hands its attention kernel
    (queries after rotary embeddings, keys before the GQA repeat, the scale), then runs
    eager attention: the reference the hooks are checked against."""
    transformers = pytest.importorskip("transformers", reason=HF_REASON)
    from transformers.models.llama.modeling_llama import eager_attention_forward

    calls: list[tuple[torch.Tensor, torch.Tensor, float]] = []

    def recording(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
        calls.append((query.detach(), key.detach(), scaling))
        if not hasattr(module, "num_key_value_groups"):  # GPT-2: no grouped-query attention
            module.num_key_value_groups = 1
        return eager_attention_forward(module, query, key, value, attention_mask, scaling=scaling,
                                       dropout=dropout, **kwargs)

    transformers.AttentionInterface.register("geosearch_test_recording", recording)
    return calls


def test_a_family_the_hooks_do_not_follow_has_no_source():
    pytest.importorskip("transformers", reason=HF_REASON)
    from geosearch.models.zoo import build_meta_model

    small = dict(num_hidden_layers=1, hidden_size=32, num_attention_heads=2)
    # Rule: soft-capped logits (Gemma 2), rotary embeddings applied inside the module by
    # another function (GPT-J), Falcon's multi-query fused layout and absolute positions
    # (OPT) are not LLaMA's path: no source, rather than wrong logits.
    for spec, args in (("hf:gemma2", dict(small, num_key_value_heads=1)), ("hf:gptj", {"n_layer": 1}),
                       ("hf:falcon", small), ("hf:opt", dict(small, ffn_dim=64))):
        model = build_meta_model(spec, vocab_size=256, model_args=args).model
        assert detect_qk_source(model) is None, spec


def _hf(key: str, **extra):
    from geosearch.models.zoo import build_model

    spec = key.split("-")[0]
    torch.manual_seed(0)
    built = build_model(spec, vocab_size=256, block_size=T, model_args={**HF_ARGS[key], **extra})
    built.model.eval()
    return built


def _batch(n: int = 3) -> torch.Tensor:
    return torch.randint(256, (n, T), generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("key", list(HF_ARGS))
def test_hooked_qk_equal_what_the_attention_kernel_gets(key, recorder):
    built = _hf(key, attn_implementation="geosearch_test_recording")
    x = _batch()
    recorder.clear()
    with torch.no_grad(), qk_capture(built.model, built.qk_source) as capture:
        built.model(x)
        layers = capture.layers()
    assert len(layers) == len(recorder) == 2
    for i, (layer, (query, key_, scaling)) in enumerate(zip(layers, recorder)):
        n_rep = query.size(1) // key_.size(1)
        reference_k = key_.repeat_interleave(n_rep, dim=1)  # (B, nh, T, hs), GQA heads shared
        # Rule: q and k have the (B, nh, T, hs) shape of the attention's own query heads ...
        assert layer.q.shape == query.shape == layer.k.shape
        # ... equal the tensors the kernel received (rotary embeddings applied, GQA repeated) ...
        torch.testing.assert_close(layer.q, query, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(layer.k, reference_k, rtol=1e-5, atol=1e-6)
        # ... and the scale is the model's own (1/√hs, over layer_idx+1 for the inverse-layer
        # GPT-2 option).
        assert layer.scale == pytest.approx(scaling)
        if "inverse" in key:
            assert layer.scale == pytest.approx(layer.q.size(-1) ** -0.5 / (i + 1))
        # Rule: the max logit from the hooks equals the max of the kernel's own logits.
        direct = (query.float() @ reference_k.float().transpose(-2, -1)) * scaling
        direct = direct.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
        assert causal_logits(layer.q, layer.k, layer.scale).amax().item() == pytest.approx(
            direct.amax().item(), rel=1e-5)


@pytest.mark.parametrize("key", list(HF_ARGS))
def test_probe_entropy_equals_eager_attention_probabilities(key):
    pytest.importorskip("transformers", reason=HF_REASON)
    built = _hf(key, attn_implementation="eager")
    x = _batch()
    with torch.no_grad():
        probs = built.model(x, output_attentions=True).attentions  # per layer (B, nh, T, T)
    stats = attention_stats(built.model, x, built.qk_source)
    for i, p in enumerate(probs):
        # per-head entropy over rows 1..T-1 and the batch, as the probe defines it
        head_entropy = torch.special.entr(p.float()).sum(-1)[..., 1:].mean(dim=(0, 2))  # (nh,)
        # Rule: the probe's attention entropy is that of the model's own softmax.
        assert stats["min_entropy_per_layer"][i] == pytest.approx(head_entropy.min().item(), rel=1e-5)
        assert stats["mean_entropy_per_layer"][i] == pytest.approx(head_entropy.mean().item(), rel=1e-5)
    with torch.no_grad(), qk_capture(built.model, built.qk_source) as capture:
        built.model(x)
        layers = capture.layers()
    for layer, p in zip(layers, probs):
        # Rule: softmax of the hooked logits reproduces every attention probability.
        torch.testing.assert_close(torch.softmax(causal_logits(layer.q, layer.k, layer.scale), -1), p.float(),
                                   rtol=1e-4, atol=1e-6)


def test_attention_stats_matches_across_sdpa_and_eager():
    pytest.importorskip("transformers", reason=HF_REASON)
    x = _batch()
    sdpa = attention_stats(_hf("hf:llama").model, x, "llama")
    eager = attention_stats(_hf("hf:llama", attn_implementation="eager").model, x, "llama")
    # Rule: the probe does not depend on the attention kernel the model runs with.
    assert sdpa["max_logit_per_layer"] == pytest.approx(eager["max_logit_per_layer"], rel=1e-5)
    assert sdpa["min_entropy"] == pytest.approx(eager["min_entropy"], rel=1e-5)


def test_llama_rotary_fallback_equals_the_position_embeddings_the_layer_gets():
    pytest.importorskip("transformers", reason=HF_REASON)
    built = _hf("hf:llama")
    seen = {}
    attn = attention_layers(built.model, "llama")[0]
    handle = attn.register_forward_pre_hook(
        lambda m, a, kw: seen.update(pe=kw["position_embeddings"]), with_kwargs=True)
    x = _batch(2)
    with torch.no_grad():
        built.model(x)
        q = torch.zeros(2, 4, T, attn.head_dim)
        cos, sin = llama_rotary(built.model, attn, q)  # position ids arange(T)
    handle.remove()
    # Rule: recomputing cos/sin with the model's rotary_emb gives what the decoder passed.
    torch.testing.assert_close(cos.expand_as(seen["pe"][0]), seen["pe"][0])
    torch.testing.assert_close(sin.expand_as(seen["pe"][1]), seen["pe"][1])


def test_hooks_are_removed_and_tensors_dropped():
    pytest.importorskip("transformers", reason=HF_REASON)
    for key in ("hf:gpt2", "hf:llama"):
        built = _hf(key)
        with qk_capture(built.model) as capture:  # source detected
            assert capture.source == built.qk_source
            # Rule: reading before a forward is an error, not empty data.
            with pytest.raises(RuntimeError, match="run a forward pass"):
                capture.layers()
            with torch.no_grad():
                built.model(_batch(1))
        # Rule: after the block no hook is left on any module, and nothing is kept.
        assert all(not m._forward_hooks and not m._forward_pre_hooks for m in built.model.modules())
        assert all(not raw for raw in capture.raw)


@pytest.mark.parametrize("key", ["nanogpt", *HF_ARGS])
def test_streaming_hands_each_layer_over_and_keeps_nothing(key):
    if key == "nanogpt":
        torch.manual_seed(0)
        model, source = GPT(make_config("tiny", block_size=T)).eval(), "nanogpt"
    else:
        pytest.importorskip("transformers", reason=HF_REASON)
        built = _hf(key)
        model, source = built.model, built.qk_source
    x = _batch()
    with torch.no_grad(), qk_capture(model, source) as capture:
        model(x)
        expected = capture.layers()
    seen: list[tuple[int, LayerQK]] = []
    with torch.no_grad(), qk_capture(model, source, on_layer=lambda i, t: seen.append((i, t))) as capture:
        model(x)
        # Rule: nothing stays captured once a layer has been handed over ...
        assert all(not raw for raw in capture.raw)
        assert all(getattr(m, "last_q", None) is None for m in capture.modules)
    # ... and each layer was handed over once, in order, with what layers() gives.
    assert [i for i, _ in seen] == list(range(len(expected)))
    for (_, t), e in zip(seen, expected):
        assert torch.equal(t.q, e.q) and torch.equal(t.k, e.k) and t.scale == e.scale
    assert all(not m._forward_hooks for m in model.modules())


def test_nanogpt_source_equals_the_proxy_recording():
    torch.manual_seed(0)
    model = GPT(make_config("tiny", block_size=T)).eval()
    x = _batch()
    with torch.no_grad(), recording_qk(model) as mods:
        model(x)
        expected = [(m.last_q, m.last_k) for m in mods]
    with torch.no_grad(), qk_capture(model, "nanogpt") as capture:
        model(x)
        layers = capture.layers()
    # Rule: the generic capture of the proxy gives its recorded q, k and the 1/√hs scale.
    for layer, (q, k) in zip(layers, expected):
        assert torch.equal(layer.q, q) and torch.equal(layer.k, k)
        assert layer.scale == q.size(-1) ** -0.5
    # Rule: the switch is off again afterwards.
    assert not any(getattr(m, "record_qk", False) for m in model.modules())
    # Rule: the proxy's probe path and the generic path agree.
    generic = {}
    with torch.no_grad(), qk_capture(model, "nanogpt") as capture:
        model(x)
        zs = [causal_logits(t.q, t.k, t.scale) for t in capture.layers()]
    generic["max_logit_per_layer"] = [z.amax().item() for z in zs]
    generic["min_entropy_per_layer"] = [row_entropy(z)[..., 1:].mean(dim=(0, 2)).min().item() for z in zs]
    stats = attention_stats(model, x)
    assert stats["max_logit_per_layer"] == pytest.approx(generic["max_logit_per_layer"])
    assert stats["min_entropy_per_layer"] == pytest.approx(generic["min_entropy_per_layer"])


def test_detection_and_errors():
    torch.manual_seed(0)
    model = GPT(make_config("tiny"))
    # Rule: the proxy is found as the nanogpt source; a model without attention as none.
    assert detect_qk_source(model) == "nanogpt"
    mlp = nn.Sequential(nn.Embedding(10, 8), nn.Linear(8, 10))
    assert detect_qk_source(mlp) is None
    with pytest.raises(ValueError, match="no attention layer"):
        with qk_capture(mlp):
            pass
    with pytest.raises(ValueError, match="no 'gpt2' attention layer"):
        with qk_capture(model, "gpt2"):
            pass
    with pytest.raises(ValueError, match="unknown qk source 'bert'"):
        attention_layers(model, "bert")
    assert set(QK_SOURCES) == {"nanogpt", "gpt2", "llama"}
    assert LayerQK._fields == ("q", "k", "scale")
