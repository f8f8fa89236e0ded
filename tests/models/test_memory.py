"""Tests of geosearch.models.memory: a model too large for the device is one line, before
any memory is taken."""

from __future__ import annotations

import pytest
import torch

from geosearch.util.errors import ConfigError
from geosearch.models import memory
from geosearch.models.memory import BYTES_PER_PARAMETER, check_fits, device_memory, parameter_count
from geosearch.models.zoo import build_meta_model


def test_the_count_takes_a_tied_embedding_once():
    built = build_meta_model("tiny", vocab_size=256)
    c = built.config
    d, layers = c["n_embd"], c["n_layer"]
    # wte (tied with the head) + wpe + per layer: 2 LayerNorms (4d), c_attn (3d² + 3d),
    # c_proj (d² + d), c_fc (4d² + 4d), mlp c_proj (4d² + d) + the final LayerNorm (2d)
    per_layer = 4 * d + 3 * d * d + 3 * d + d * d + d + 4 * d * d + 4 * d + 4 * d * d + d
    biases = all(p.ndim for p in built.model.parameters())
    expected = 256 * d + c["block_size"] * d + layers * per_layer + 2 * d
    assert biases and parameter_count(built.model) == expected


def test_the_cpu_memory_is_the_machines():
    total = device_memory("cpu")
    assert total is not None and total > 2**28  # more than 256 MB on any machine that runs this
    assert device_memory("meta") is None


def test_a_model_larger_than_the_device_is_refused_naming_the_key():
    big = build_meta_model("tiny", vocab_size=256, model_args={"n_embd": 2**20, "n_head": 1})
    count = parameter_count(big.model)
    assert count * BYTES_PER_PARAMETER > device_memory("cpu")  # 2.6·10¹³ parameters
    with pytest.raises(ConfigError, match=rf"proxy.model_args: model 'tiny' has {count:,} parameters: "
                                          r"training them needs at least 422.2 TB \(16 bytes each") as e:
        check_fits(big.model, "tiny", "cpu", source="s.yaml", key="proxy.model_args")
    assert "this machine's memory is" in str(e.value) and e.value.source == "s.yaml"


def test_a_model_that_fits_passes_and_an_unknown_memory_is_not_judged(monkeypatch):
    tiny = build_meta_model("tiny", vocab_size=256)
    check_fits(tiny.model, "tiny", "cpu", source=None, key=None)
    # the boundary: exactly the device's memory fits, a byte less does not
    need = parameter_count(tiny.model) * BYTES_PER_PARAMETER
    monkeypatch.setattr(memory, "device_memory", lambda device: need)
    check_fits(tiny.model, "tiny", "cpu", source=None, key=None)
    monkeypatch.setattr(memory, "device_memory", lambda device: need - 1)
    with pytest.raises(ConfigError, match="make it smaller"):
        check_fits(tiny.model, "tiny", torch.device("cpu"), source=None, key=None)
    monkeypatch.setattr(memory, "device_memory", lambda device: None)
    check_fits(tiny.model, "tiny", "mps", source=None, key=None)


def test_the_probes_attention_logits_count_with_the_context_length(monkeypatch):
    long = build_meta_model("tiny", vocab_size=256, model_args={"block_size": 100_000})
    probes = memory.probe_logit_bytes(long.config, long.block_size, rows=1)
    assert probes == 4 * 1 * long.config["n_head"] * 100_000**2  # 80 GB: one layer's logits
    need = parameter_count(long.model) * BYTES_PER_PARAMETER
    monkeypatch.setattr(memory, "device_memory", lambda device: need + probes)
    check_fits(long.model, "tiny", "cpu", source=None, key=None, probe_bytes=probes)  # fits exactly
    monkeypatch.setattr(memory, "device_memory", lambda device: need + probes - 1)
    with pytest.raises(ConfigError, match=r"s.yaml: proxy.model_args: model 'tiny': its attention "
                                          r"probes hold 80.0 GB of logits .* make block_size or "
                                          r"probe_batch_size"):
        check_fits(long.model, "tiny", "cpu", source="s.yaml", key="proxy.model_args",
                   probe_bytes=probes)
    assert memory.probe_logit_bytes({}, 10, rows=2) == 4 * 2 * 1 * 100  # no head count: one head


# --------------------------------------------------------------------------- time
def test_a_steps_flops_are_six_per_parameter_and_token_plus_attention():
    built = build_meta_model("tiny", vocab_size=256)
    n, c, t = parameter_count(built.model), built.config, built.block_size
    tokens = 4 * t
    attention = 12 * c["n_layer"] * c["n_embd"] * t  # logits and mixing, per token
    assert memory.step_flops(n, c, t, batch=4) == tokens * (6 * n + attention)
    # Rule: the context counts quadratically: block_size x 8 gives more than 8x the step
    long = build_meta_model("tiny", vocab_size=256, model_args={"block_size": 8 * t})
    ratio = memory.step_flops(parameter_count(long.model), long.config, 8 * t, 4) / \
        memory.step_flops(n, c, t, 4)
    assert ratio > 8
    assert memory.step_flops(10, {}, 3, 2) == 2 * 3 * 60  # no layers or width named: 6 N only


def test_the_matmul_rate_is_measured_on_the_device():
    rate = memory.matmul_rate("cpu", size=64, seconds=0.01)
    assert 1e6 < rate < 1e15  # FLOP/s of one CPU, loaded or not


def test_a_run_of_an_hour_or_more_is_said_in_one_line():
    assert memory.time_note("tiny", 1e9, 100, 1e9) is None  # 100 s
    line = memory.time_note("gpt2", 1e12, 3600, 1e12, runs=10)  # 1 h a run
    assert line == ("note: one run of 'gpt2' takes at least 1.0 h here (1e+12 FLOPs a step x 3,600 "
                    "steps at the 1e+12 FLOP/s a matrix product reaches), 10 runs 10.0 h; "
                    "Ctrl-C stops it")
    assert "2.0 days" in memory.time_note("gpt2", 1e12, 172_800, 1e12)
