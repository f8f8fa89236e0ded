"""The proxy GPT: shapes, initial loss, presets and overrides, nanoGPT names, the attention path."""

import math

import pytest
import torch
import torch.nn.functional as F

from geosearch.util.errors import ConfigError
from geosearch.models.model import GPT, GPTConfig, make_config
from geosearch.models.specs import PRESETS


@pytest.fixture(scope="module")
def tiny():
    torch.manual_seed(0)
    return GPT(make_config("tiny")).eval()


def test_forward_shapes_and_initial_loss(tiny):
    g = torch.Generator().manual_seed(0)
    idx, targets = torch.randint(256, (2, 4, 32), generator=g)
    logits, loss = tiny(idx, targets)
    # Rule: logits are (B, T, vocab); the loss is a scalar.
    assert logits.shape == (4, 32, 256)
    assert loss.dim() == 0
    # Rule: GPT-2 init (std 0.02) gives near-uniform predictions, loss ≈ ln 256 = 5.545
    # (random targets: with targets == inputs the tied embedding would favour them).
    assert abs(loss.item() - math.log(256)) < 0.05
    # Rule: without targets there is no loss.
    assert tiny(idx)[1] is None


def test_presets_and_overrides():
    # Rule: each preset has the sizes the docs give; vocab comes from the data (default 256).
    assert (make_config("tiny").n_layer, make_config("tiny").n_embd) == (2, 32)
    small = make_config("small")
    assert (small.n_layer, small.n_head, small.n_embd, small.block_size) == (4, 4, 128, 128)
    gpt2 = make_config("gpt2", vocab_size=50304)
    assert (gpt2.n_layer, gpt2.n_head, gpt2.n_embd, gpt2.block_size, gpt2.vocab_size) == \
        (12, 12, 768, 1024, 50304)
    assert make_config("gpt2").vocab_size == 256
    # Rule: an override replaces one field and keeps the others from the preset.
    c = make_config("tiny", n_layer=3, bias=False)
    assert (c.n_layer, c.n_embd, c.bias) == (3, 32, False)
    assert set(PRESETS) == {"tiny", "mini", "small", "gpt2"}


def test_bad_preset_and_field_are_named():
    # Rule: an unknown preset names itself and lists the presets.
    with pytest.raises(ConfigError, match=r"preset 'huge'; expected one of: tiny, mini, small, gpt2"):
        make_config("huge")
    # Rule: an unknown field names itself and lists the fields.
    with pytest.raises(ConfigError, match=r"n_layers.*expected one of:.*n_layer"):
        make_config("tiny", n_layers=3)
    # Rule: a width that does not split into heads is refused, naming n_embd.
    with pytest.raises(ConfigError, match=r"n_embd=30 is not a multiple of n_head=4"):
        make_config("tiny", n_embd=30, n_head=4)
    with pytest.raises(ConfigError, match=r"block_size: expected a whole number in \[1, 16,777,216\], got 0"):
        GPTConfig(block_size=0)
    # Rule: a depth no machine could build is refused before a layer is made.
    with pytest.raises(ConfigError, match=r"n_layer: expected a whole number in \[1, 1,024\], got 10{21}"):
        make_config("tiny", n_layer=10**21)


def test_nanogpt_parameter_names():
    names = [n for n, _ in GPT(make_config("tiny")).named_parameters()]
    # Rule: nanoGPT's exact names, one tied embedding/head tensor listed once as wte.
    for expected in ["transformer.wte.weight", "transformer.wpe.weight",
                     "transformer.h.1.ln_1.weight", "transformer.h.0.attn.c_attn.weight",
                     "transformer.h.0.attn.c_proj.weight", "transformer.h.0.ln_2.bias",
                     "transformer.h.1.mlp.c_fc.weight", "transformer.h.1.mlp.c_proj.weight",
                     "transformer.ln_f.weight"]:
        assert expected in names
    assert "lm_head.weight" not in names
    # Rule: untied, the head is its own parameter.
    untied = GPT(make_config("tiny", tie_weights=False))
    assert "lm_head.weight" in dict(untied.named_parameters())
    assert untied.lm_head.weight is not untied.transformer.wte.weight


def test_init_scales_residual_projections():
    torch.manual_seed(0)
    model = GPT(make_config("small"))
    std = {n: p.std().item() for n, p in model.named_parameters()}
    # Rule: N(0, 0.02) weights, residual projections N(0, 0.02/sqrt(2 n_layer)), zero biases.
    assert abs(std["transformer.h.0.mlp.c_fc.weight"] - 0.02) < 1e-3
    assert abs(std["transformer.h.0.attn.c_proj.weight"] - 0.02 / math.sqrt(8)) < 5e-4
    assert abs(std["transformer.h.3.mlp.c_proj.weight"] - 0.02 / math.sqrt(8)) < 5e-4
    assert model.transformer.h[0].attn.c_attn.bias.abs().max() == 0


def manual_forward(model: GPT, idx: torch.Tensor) -> torch.Tensor:
    """The same network written out with an explicit masked softmax (no SDPA)."""
    cfg = model.config
    T, C, nh = idx.size(1), cfg.n_embd, cfg.n_head
    x = model.transformer.wte(idx) + model.transformer.wpe(torch.arange(T))
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    for block in model.transformer.h:
        h = F.layer_norm(x, (C,), block.ln_1.weight, block.ln_1.bias)
        q, k, v = (h @ block.attn.c_attn.weight.T + block.attn.c_attn.bias).split(C, dim=2)
        q, k, v = (t.view(*t.shape[:2], nh, C // nh).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1) / math.sqrt(C // nh)).masked_fill(~mask, float("-inf"))
        y = (att.softmax(-1) @ v).transpose(1, 2).reshape(x.shape)
        x = x + y @ block.attn.c_proj.weight.T + block.attn.c_proj.bias
        h = F.layer_norm(x, (C,), block.ln_2.weight, block.ln_2.bias)
        x = x + F.gelu(h @ block.mlp.c_fc.weight.T + block.mlp.c_fc.bias) @ block.mlp.c_proj.weight.T \
            + block.mlp.c_proj.bias
    x = F.layer_norm(x, (C,), model.transformer.ln_f.weight, model.transformer.ln_f.bias)
    return x @ model.lm_head.weight.T


def test_sdpa_matches_manual_attention_and_recording_changes_nothing():
    torch.manual_seed(0)
    model = GPT(make_config("tiny")).double()
    # larger weights than at init, so attention is far from uniform and errors would show
    with torch.no_grad():
        for block in model.transformer.h:
            block.attn.c_attn.weight.mul_(20)
    idx = torch.randint(256, (3, 32), generator=torch.Generator().manual_seed(1))
    logits = model(idx)[0]
    # Rule: the SDPA path equals the explicit causal-softmax network (float64).
    torch.testing.assert_close(logits, manual_forward(model, idx), rtol=1e-9, atol=1e-9)
    attns = [b.attn for b in model.transformer.h]
    for a in attns:
        a.record_qk = True
    recorded = model(idx)[0]
    # Rule: recording q and k leaves the output bit-identical and stores (B, nh, T, hs).
    assert torch.equal(recorded, logits)
    assert attns[0].last_q.shape == attns[0].last_k.shape == (3, 2, 32, 16)
    assert not attns[0].last_q.requires_grad


def test_normal_path_records_nothing(tiny):
    tiny(torch.zeros(1, 8, dtype=torch.long))
    # Rule: record_qk is off by default and nothing is kept between steps.
    assert all(b.attn.record_qk is False and b.attn.last_q is None for b in tiny.transformer.h)


def test_sequence_longer_than_context_is_refused(tiny):
    # Rule: T > block_size is an error, not a silent position-embedding overflow.
    with pytest.raises(ValueError, match="exceeds block_size 32"):
        tiny(torch.zeros(1, 33, dtype=torch.long))
