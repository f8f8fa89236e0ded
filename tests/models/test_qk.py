"""Queries and keys captured for the probes are the ones the model's attention kernel gets."""

from __future__ import annotations

import sys

import pytest
import torch
from torch import nn

import geosearch.models.qk as qk
from geosearch.models.model import GPT, make_config
from geosearch.models.qk import (
    QK_SOURCES,
    LayerQK,
    attention_layers,
    detect_qk_source,
    llama_rotary,
    qk_capture,
    why_no_qk_source,
)
from geosearch.proxy.probes import attention_stats, causal_logits, recording_qk, row_entropy

HF_REASON = "Hugging Face transformers is not installed (pip install 'geosearch[hf]')"
T = 16

# Tiny Hugging Face models: 2 layers, width 32-64; the families of README's model table.
_GQA = dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, num_key_value_heads=2, intermediate_size=96)
HF_ARGS = {
    "hf:gpt2": dict(n_layer=2, n_head=2, n_embd=32),
    "hf:gpt2-inverse-layer-scale": dict(n_layer=2, n_head=2, n_embd=32, scale_attn_by_inverse_layer_idx=True),
    "hf:llama": _GQA,  # grouped-query attention
    "hf:mistral": _GQA,
    "hf:mistral-sliding-window": dict(_GQA, sliding_window=4),  # keys further back than 4 masked
    "hf:qwen2": _GQA,  # q/k/v biases
    "hf:gemma": dict(_GQA, num_key_value_heads=1),  # multi-query
    "hf:gemma2-softcap": dict(_GQA, attn_logit_softcapping=0.005),  # logits soft-capped at 0.005
    "hf:phi3": _GQA,  # fused qkv_proj [Q | K | V], K and V narrower
    "hf:qwen3": _GQA,  # q_norm / k_norm per head
    "hf:olmo2": _GQA,  # q_norm / k_norm over the whole width
    "hf:olmo-clip": dict(_GQA, clip_qkv=0.05),  # q, k clamped
    "hf:cohere-qk-norm": dict(_GQA, use_qk_norm=True),  # (nh, hd) norm weights, interleaved rotary
    "hf:phi-qk-layernorm": dict(_GQA, num_key_value_heads=4, qk_layernorm=True),  # partial rotary
    "hf:gpt_neox": dict(_GQA, num_key_value_heads=None),  # fused query_key_value per head, partial rotary
    "hf:smollm3-nope": dict(_GQA, no_rope_layers=[1, 0]),  # layer 1 without rotary embeddings
    "hf:opt": dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, ffn_dim=96),  # learned positions
    "hf:gptj": dict(n_layer=2, n_embd=64, n_head=4, rotary_dim=8),  # rotary on 8 dims, GPT-J's own function
    "hf:gpt_bigcode": dict(n_layer=2, n_embd=64, n_head=4),  # multi-query c_attn [Q | K | V], 128+16+16 rows
    "hf:gpt_bigcode-mha": dict(n_layer=2, n_embd=64, n_head=4, multi_query=False),  # c_attn per head
}
HF_ARGS = {k: {a: v for a, v in args.items() if v is not None} for k, args in HF_ARGS.items()}
HOOKED = {"hf:gpt2": "gpt2", "hf:gpt2-inverse-layer-scale": "gpt2", "hf:llama": "llama", "hf:mistral": "llama",
          "hf:qwen2": "llama", "hf:gemma": "llama"}
"""The families the forward hooks of an older transformers still follow, and their source."""
OLD = "transformers 4.45.0 has no AttentionInterface"


@pytest.fixture(scope="module")
def recorder():
    """An attention implementation that records what the model hands its attention kernel
    (queries after rotary embeddings, keys before the GQA repeat, the scale, the soft cap),
    then runs the model's own eager attention with the eager mask: the reference the
    capture is checked against."""
    transformers = pytest.importorskip("transformers", reason=HF_REASON)
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface

    calls: list[tuple[torch.Tensor, torch.Tensor, float, float | None]] = []

    def recording(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
        calls.append((query.detach(), key.detach(), scaling, kwargs.get("softcap")))
        eager = sys.modules[type(module).__module__].eager_attention_forward
        return eager(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kwargs)

    transformers.AttentionInterface.register("geosearch_test_recording", recording)
    AttentionMaskInterface.register("geosearch_test_recording", ALL_MASK_ATTENTION_FUNCTIONS["eager"])
    return calls


def _hf(key: str, **extra):
    from geosearch.models.zoo import build_model

    spec = key.split("-")[0]
    torch.manual_seed(0)
    built = build_model(spec, vocab_size=256, block_size=T, model_args={**HF_ARGS[key], **extra})
    built.model.eval()
    return built


def _batch(n: int = 3) -> torch.Tensor:
    return torch.randint(256, (n, T), generator=torch.Generator().manual_seed(1))


def _check_equal_to_kernel_inputs(key: str, layers: list[LayerQK], calls: list) -> None:
    assert len(layers) == len(calls) == 2
    for i, (layer, (query, key_, scaling, softcap)) in enumerate(zip(layers, calls)):
        n_rep = query.size(1) // key_.size(1)
        reference_k = key_.repeat_interleave(n_rep, dim=1)  # (B, nh, T, hs), GQA heads shared
        # Rule: q and k have the (B, nh, T, hs) shape of the attention's own query heads ...
        assert layer.q.shape == query.shape == layer.k.shape
        # ... equal the tensors the kernel received (rotary embeddings applied, GQA repeated) ...
        torch.testing.assert_close(layer.q, query, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(layer.k, reference_k, rtol=1e-5, atol=1e-6)
        # ... and the scale and soft cap are the model's own (1/√hs, over layer_idx+1 for the
        # inverse-layer GPT-2 option; Gemma 2's cap).
        assert layer.scale == pytest.approx(scaling if scaling is not None else query.size(-1) ** -0.5)
        assert layer.softcap == softcap
        if "inverse" in key:
            assert layer.scale == pytest.approx(layer.q.size(-1) ** -0.5 / (i + 1))
        # Rule: the max logit from the capture equals the max of the kernel's own logits.
        direct = (query.float() @ reference_k.float().transpose(-2, -1)) * layer.scale
        if softcap is not None:
            direct = softcap * torch.tanh(direct / softcap)
        direct = direct.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
        assert causal_logits(layer.q, layer.k, layer.scale, softcap=layer.softcap).amax().item() == pytest.approx(
            direct.amax().item(), rel=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("key", list(HF_ARGS))
def test_captured_qk_equal_what_the_attention_kernel_gets(key, recorder):
    built = _hf(key, attn_implementation="geosearch_test_recording")
    # Rule: every family of the table is captured through transformers' AttentionInterface.
    assert built.qk_source == "attention_interface" and built.warnings == []
    x = _batch()
    recorder.clear()
    with torch.no_grad(), qk_capture(built.model, built.qk_source) as capture:
        built.model(x)
        layers = capture.layers()
    # Rule: the forward still ran the kernel the model was configured with, once per layer.
    _check_equal_to_kernel_inputs(key, layers, recorder)
    assert built.model.config._attn_implementation == "geosearch_test_recording"
    if key == "hf:gemma2-softcap":  # Rule: Gemma 2's cap is on, and it bites
        assert layers[0].softcap == 0.005
        assert causal_logits(layers[0].q, layers[0].k, layers[0].scale).amax() > 0.01


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
        # Rule: the probe's attention entropy is that of the model's own softmax (capped
        # logits for Gemma 2, the sliding window's mask for Mistral).
        assert stats["min_entropy_per_layer"][i] == pytest.approx(head_entropy.min().item(), rel=1e-5)
        assert stats["mean_entropy_per_layer"][i] == pytest.approx(head_entropy.mean().item(), rel=1e-5)
    with torch.no_grad(), qk_capture(built.model, built.qk_source) as capture:
        built.model(x)
        layers = capture.layers()
    for layer, p in zip(layers, probs):
        # Rule: softmax of the captured logits reproduces every attention probability.
        z = causal_logits(layer.q, layer.k, layer.scale, softcap=layer.softcap, allowed=layer.allowed)
        torch.testing.assert_close(torch.softmax(z, -1), p.float(), rtol=1e-4, atol=1e-6)
    if key == "hf:gemma2-softcap":
        # Rule: soft-capped logits are reported as the kernel sees them (at most the cap),
        # and the raw ones too.
        assert stats["max_logit"] <= 0.005 < 0.01 < stats["raw_max_logit"]
        assert len(stats["raw_max_logit_per_layer"]) == 2
    else:
        assert "raw_max_logit" not in stats
    if key == "hf:mistral-sliding-window":  # Rule: the window's mask reached the capture
        assert layers[0].allowed is not None and not layers[0].allowed[..., T - 1, 0].any()


@pytest.mark.parametrize("key", ["hf:llama", "hf:mistral-sliding-window"])
def test_attention_stats_matches_across_sdpa_and_eager(key):
    pytest.importorskip("transformers", reason=HF_REASON)
    x = _batch()
    sdpa = attention_stats(_hf(key, attn_implementation="sdpa").model, x, "attention_interface")
    eager = attention_stats(_hf(key, attn_implementation="eager").model, x, "attention_interface")
    # Rule: the probe does not depend on the attention kernel the model runs with.
    assert sdpa["max_logit_per_layer"] == pytest.approx(eager["max_logit_per_layer"], rel=1e-5)
    assert sdpa["min_entropy"] == pytest.approx(eager["min_entropy"], rel=1e-5)


@pytest.mark.parametrize("key", ["hf:llama", "hf:gpt_bigcode", "hf:gemma2-softcap"])
def test_capture_leaves_the_forward_and_its_gradients_as_they_were(key):
    pytest.importorskip("transformers", reason=HF_REASON)
    built = _hf(key)
    model, x = built.model.train(), _batch()
    implementation = model.config._attn_implementation

    def run() -> tuple[torch.Tensor, list[torch.Tensor]]:
        model.zero_grad()
        logits = model(x).logits
        logits.square().mean().backward()
        return logits.detach(), [p.grad.clone() for p in model.parameters() if p.grad is not None]

    plain_logits, plain_grads = run()
    seen: list[int] = []
    with qk_capture(model, on_layer=lambda i, t: seen.append(i)):  # streaming, as QK-clip does
        captured_logits, captured_grads = run()
    # Rule: the capture sees every layer of a training forward, and the forward computes
    # exactly what it computes without it: same logits, same gradients.
    assert seen == [0, 1]
    assert torch.equal(captured_logits, plain_logits)
    assert all(torch.equal(a, b) for a, b in zip(captured_grads, plain_grads))
    # Rule: afterwards the config names the model's own kernel again, and no module keeps state.
    assert model.config._attn_implementation == implementation
    assert not any(qk._STATE in m.__dict__ for m in model.modules())


def test_the_kernel_is_named_again_when_the_forward_fails():
    pytest.importorskip("transformers", reason=HF_REASON)
    model = _hf("hf:llama").model
    with pytest.raises(IndexError):
        with qk_capture(model):
            model(torch.full((1, T), 10_000))  # beyond the vocabulary
    # Rule: a failed forward leaves the model as it was: its kernel, no capture state.
    assert model.config._attn_implementation == "sdpa"
    assert not any(qk._STATE in m.__dict__ for m in model.modules())
    with qk_capture(model) as capture, torch.no_grad():
        # Rule: captures do not nest (the inner one would lose the outer one's layers).
        with pytest.raises(RuntimeError, match="already being captured"):
            with qk_capture(model):
                pass
        model(_batch(1))
        assert len(capture.layers()) == 2


def test_models_that_compute_their_logits_themselves_say_why_in_one_line():
    pytest.importorskip("transformers", reason=HF_REASON)
    from geosearch.models.zoo import build_meta_model

    # Rule: a family whose attention never calls transformers' attention functions (BLOOM,
    # GPT-Neo, MPT) has no source, and the reason names its attention and says why.
    for spec, args in (("hf:bloom", {"n_layer": 1, "hidden_size": 32, "n_head": 2}),
                       ("hf:gpt_neo", {"num_layers": 1, "hidden_size": 32, "num_heads": 2,
                                       "attention_types": [[["global"], 1]]}),
                       ("hf:mpt", {"n_layers": 1, "d_model": 32, "n_heads": 2})):
        model = build_meta_model(spec, vocab_size=256, model_args=args).model
        assert detect_qk_source(model) is None, spec
        reason = why_no_qk_source(model)
        assert "computes the attention logits inside its own forward" in reason and "\n" not in reason
        with pytest.raises(ValueError, match=f"cannot capture the queries and keys of {type(model).__name__}: its"):
            with qk_capture(model):
                pass


FALCON = {  # rotary; multi-query (one key head); grouped-query (new decoder architecture)
    "multi_query": dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=4),
    "grouped": dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, num_kv_heads=2,
                    new_decoder_architecture=True),
}


@pytest.mark.parametrize("layout", list(FALCON))
def test_falcon_is_captured_from_transformers_5_25_and_said_why_not_before(layout, recorder):
    transformers = pytest.importorskip("transformers", reason=HF_REASON)
    from packaging.version import Version

    from geosearch.models.zoo import build_model

    torch.manual_seed(0)
    if Version(transformers.__version__) < Version("5.25"):  # its own attention classes
        built = build_model("hf:falcon", vocab_size=256, block_size=T, model_args=FALCON[layout])
        # Rule: before 5.25 Falcon computes its logits itself: no source, the reason says so.
        assert built.qk_source is None
        assert "computes the attention logits inside its own forward" in why_no_qk_source(built.model)
        return
    built = build_model("hf:falcon", vocab_size=256, block_size=T,
                        model_args=dict(FALCON[layout], attn_implementation="geosearch_test_recording"))
    # Rule: from 5.25 Falcon's attention calls AttentionInterface: captured as the kernel gets
    # its queries and keys (the interleaved or grouped query_key_value cut by Falcon itself).
    assert built.qk_source == "attention_interface" and built.warnings == []
    recorder.clear()
    with torch.no_grad(), qk_capture(built.model.eval(), built.qk_source) as capture:
        built.model(_batch())
        layers = capture.layers()
    _check_equal_to_kernel_inputs("hf:falcon", layers, recorder)


def _falcon_by_hand(model: nn.Module, x: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per layer of a multi-query Falcon with ALiBi, from its own weights: the logits
    ``q·kᵀ/√hd`` (B, nh, T, T) and ALiBi's bias (nh, 1, T): ``slope_h · j / √hd`` for key
    j, slopes ``2^(-8h/nh)`` (h = 1..nh), the future masked out of neither."""
    inputs: list[torch.Tensor] = []
    attentions = [block.self_attention for block in model.transformer.h]
    hooks = [m.register_forward_pre_hook(lambda _m, a: inputs.append(a[0])) for m in attentions]
    try:
        with torch.no_grad():
            model(x)
    finally:
        for h in hooks:
            h.remove()
    out = []
    for m, h in zip(attentions, inputs):
        nh, hd = m.num_heads, m.head_dim
        qkv = m.query_key_value
        fused = nn.functional.linear(h, qkv.weight, qkv.bias).unflatten(-1, (nh + 2, hd))  # Q|K|V
        q, k = fused[:, :, :nh].transpose(1, 2), fused[:, :, nh:nh + 1].transpose(1, 2)
        z = (q @ k.transpose(-2, -1)) / hd ** 0.5  # (B, nh, T, T), the one key head shared
        slopes = 2.0 ** (-8.0 * torch.arange(1, nh + 1) / nh)  # (nh,)
        out.append((z, (slopes[:, None, None] * torch.arange(T)) / hd ** 0.5))  # (nh, 1, T)
    return out


def test_falcon_alibi_probe_measures_q_k_and_the_softmax_the_model_computes():
    transformers = pytest.importorskip("transformers", reason=HF_REASON)
    from packaging.version import Version

    from geosearch.models.zoo import build_model

    args = dict(FALCON["multi_query"], alibi=True, attn_implementation="eager")
    torch.manual_seed(0)
    built = build_model("hf:falcon", vocab_size=256, block_size=T, model_args=args)
    if Version(transformers.__version__) < Version("5.25"):  # its own attention classes
        # Rule: before 5.25 Falcon (ALiBi too) computes its logits itself: no source, and why.
        assert built.qk_source is None
        reason = why_no_qk_source(built.model)
        assert "computes the attention logits inside its own forward" in reason
        return
    model, x = built.model.eval(), _batch()
    assert built.qk_source == "attention_interface" and model.config.alibi
    with torch.no_grad():
        probs = model(x, output_attentions=True).attentions  # per layer (B, nh, T, T)
    stats = attention_stats(model, x, built.qk_source)
    future = torch.ones(T, T, dtype=torch.bool).triu(1)
    for i, ((z, bias), p) in enumerate(zip(_falcon_by_hand(model, x), probs)):
        # The hand-made bias is ALiBi's as Falcon adds it: softmax(q·k + bias) is the model's own.
        seen = (z + bias).masked_fill(future, float("-inf"))
        torch.testing.assert_close(torch.softmax(seen, -1), p.float(), rtol=1e-4, atol=1e-6)
        # Rule: the max logit is the scaled q·k of the model's own q and k, ALiBi's bias
        # left out (with it the max would be larger: the bias is positive and grows with j) ...
        plain = z.masked_fill(future, float("-inf"))
        assert stats["max_logit_per_layer"][i] == pytest.approx(plain.amax().item(), rel=1e-5)
        heads = plain.amax(dim=(0, 2, 3)).tolist()
        assert stats["max_logit_per_head"][i] == pytest.approx(heads, rel=1e-5)
        assert seen.amax().item() > plain.amax().item() + 0.1
        # ... and the entropies are those of the softmax the model computes, bias included.
        head_entropy = torch.special.entr(p.float()).sum(-1)[..., 1:].mean(dim=(0, 2))  # (nh,)
        lo, mean = head_entropy.min().item(), head_entropy.mean().item()
        assert stats["min_entropy_per_layer"][i] == pytest.approx(lo, rel=1e-5)
        assert stats["mean_entropy_per_layer"][i] == pytest.approx(mean, rel=1e-5)
        without = torch.special.entr(torch.softmax(plain, -1)).sum(-1)[..., 1:].mean(dim=(0, 2))
        assert abs(without.mean().item() - mean) > 1e-3  # the bias matters
    # Rule: sdpa gets the same bias in its float mask: the same statistics.
    sdpa = build_model("hf:falcon", vocab_size=256, block_size=T,
                       model_args=dict(args, attn_implementation="sdpa"))
    sdpa.model.load_state_dict(model.state_dict())
    other = attention_stats(sdpa.model, x, sdpa.qk_source)
    assert other["max_logit_per_layer"] == pytest.approx(stats["max_logit_per_layer"], rel=1e-5)
    entropies = stats["mean_entropy_per_layer"]
    assert other["mean_entropy_per_layer"] == pytest.approx(entropies, rel=1e-5)


# --------------------------------------------------------------------------- older transformers
@pytest.fixture
def old_transformers(monkeypatch):
    """A transformers without AttentionInterface: the hooks are all there is."""
    monkeypatch.setattr(qk, "interface_missing", lambda: OLD)


@pytest.mark.parametrize("key", list(HF_ARGS))
def test_hooks_of_older_transformers_follow_gpt2_and_llama_and_say_why_not_the_rest(key, recorder, old_transformers):
    built = _hf(key, attn_implementation="geosearch_test_recording")
    source = detect_qk_source(built.model)
    # Rule: without AttentionInterface, GPT-2 and plain LLaMA-style attention are hooked ...
    assert source == HOOKED.get(key)
    if source is None:
        # ... and any other family has no source, and the reason says what is missing and
        # what the hooks cannot follow.
        reason = why_no_qk_source(built.model)
        assert reason.startswith(OLD + " (install a newer transformers") and "forward hooks cannot follow" in reason
        return
    x = _batch()
    recorder.clear()
    with torch.no_grad(), qk_capture(built.model, source) as capture:
        built.model(x)
        layers = capture.layers()
    # Rule: what the hooks capture is what the kernel got.
    _check_equal_to_kernel_inputs(key, layers, recorder)


def test_hook_reasons_name_what_the_attention_does(old_transformers):
    pytest.importorskip("transformers", reason=HF_REASON)
    expected = {"hf:qwen3": "applies q/k norms", "hf:olmo-clip": "clamps q, k and v",
                "hf:phi-qk-layernorm": "applies q/k norms", "hf:gpt_neox": "no separate q_proj and k_proj",
                "hf:smollm3-nope": "layers without rotary embeddings", "hf:gemma2-softcap": "soft-capped logits"}
    for key, words in expected.items():
        # Rule: the line says what the attention does that the hooks do not follow.
        assert words in why_no_qk_source(_hf(key).model), key


def test_built_in_proxies_and_py_models_are_captured_without_transformers(old_transformers, monkeypatch):
    monkeypatch.syspath_prepend(str(__import__("pathlib").Path(__file__).resolve().parents[1]))
    from geosearch.models.zoo import build_model

    # Rule: the proxies' and a py: model's record_qk protocol needs nothing of transformers.
    for spec, args in (("tiny", {}), ("py:_user_model:make_model", {"width": 32})):
        torch.manual_seed(0)
        built = build_model(spec, vocab_size=256, block_size=T, model_args=args)
        assert built.qk_source == "nanogpt" and built.warnings == [], spec
        stats = attention_stats(built.model, _batch(), built.qk_source)
        assert len(stats["max_logit_per_layer"]) == len(attention_layers(built.model, "nanogpt"))


def test_interface_capture_equals_the_hooks_where_both_apply():
    pytest.importorskip("transformers", reason=HF_REASON)
    for key, source in (("hf:gpt2", "gpt2"), ("hf:llama", "llama"), ("hf:gemma", "llama")):
        built = _hf(key)
        x = _batch()
        got = {}
        for s in ("attention_interface", source):
            with torch.no_grad(), qk_capture(built.model, s) as capture:
                built.model(x)
                got[s] = capture.layers()
        # Rule: two independent ways to the same q and k: the kernel's arguments, and the
        # projections with the rotary embeddings applied again.
        for a, b in zip(got["attention_interface"], got[source]):
            torch.testing.assert_close(a.q, b.q, rtol=1e-5, atol=1e-6)
            torch.testing.assert_close(a.k, b.k, rtol=1e-5, atol=1e-6)
            assert a.scale == pytest.approx(b.scale)


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


# --------------------------------------------------------------------------- every source
def test_hooks_are_removed_and_tensors_dropped():
    pytest.importorskip("transformers", reason=HF_REASON)
    for key, source in (("hf:gpt2", "gpt2"), ("hf:llama", "llama"), ("hf:llama", None)):
        built = _hf(key)
        with qk_capture(built.model, source) as capture:  # None: detected
            assert capture.source == (source or built.qk_source)
            # Rule: reading before a forward is an error, not empty data.
            with pytest.raises(RuntimeError, match="run a forward pass"):
                capture.layers()
            with torch.no_grad():
                built.model(_batch(1))
        # Rule: after the block no hook is left on any module, and nothing is kept.
        assert all(not m._forward_hooks and not m._forward_pre_hooks for m in built.model.modules())
        assert all(not raw for raw in capture.raw)
        with pytest.raises(RuntimeError, match="run a forward pass"):
            capture.layers()


@pytest.mark.parametrize("key", ["nanogpt", "hf:gpt2", "hf:llama", "hf:phi3", "hf:gpt_bigcode"])
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
        with pytest.raises(RuntimeError, match="run a forward pass"):
            capture.layers()
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
        assert layer.scale == q.size(-1) ** -0.5 and layer.softcap is None and layer.allowed is None
    # Rule: the switch is off again afterwards.
    assert not any(getattr(m, "record_qk", False) for m in model.modules())
    # Rule: the probe's statistics are those of the captured logits.
    zs = [causal_logits(t.q, t.k, t.scale) for t in layers]
    stats = attention_stats(model, x)
    assert stats["max_logit_per_layer"] == pytest.approx([z.amax().item() for z in zs])
    assert stats["min_entropy_per_layer"] == pytest.approx(
        [row_entropy(z)[..., 1:].mean(dim=(0, 2)).min().item() for z in zs])


def test_detection_and_errors():
    torch.manual_seed(0)
    model = GPT(make_config("tiny"))
    # Rule: the proxy is found as the nanogpt source; a model without attention as none.
    assert detect_qk_source(model) == "nanogpt"
    mlp = nn.Sequential(nn.Embedding(10, 8), nn.Linear(8, 10))
    assert detect_qk_source(mlp) is None
    with pytest.raises(ValueError, match="cannot capture the queries and keys of Sequential: it has no attention layer"):
        with qk_capture(mlp):
            pass
    with pytest.raises(ValueError, match="no 'gpt2' attention layer"):
        with qk_capture(model, "gpt2"):
            pass
    with pytest.raises(ValueError, match="unknown qk source 'bert'"):
        attention_layers(model, "bert")
    assert QK_SOURCES == ("nanogpt", "attention_interface", "gpt2", "llama")
    assert LayerQK._fields == ("q", "k", "scale", "softcap", "allowed", "bias")
