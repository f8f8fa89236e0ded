"""Tests of the proxy run's settings and result (geosearch/proxy/config.py)."""

from __future__ import annotations

import pytest
import yaml

from geosearch.errors import ConfigError, SettingsError
from geosearch.proxy.config import TrainConfig, TrainResult, check_batch_split


def test_config_errors_name_the_key_and_the_allowed_values():
    with pytest.raises(ConfigError, match=r"space.yaml: proxy: stepz: unknown key; expected one of: .*steps"):
        TrainConfig.from_dict({"stepz": 3}, source="space.yaml: proxy")
    with pytest.raises(ConfigError, match=r"mixed_precision: .*'fp8'.*expected one of: no, bf16, fp16"):
        TrainConfig.from_dict({"mixed_precision": "fp8"})
    with pytest.raises(ConfigError, match="batch_size: must be a positive integer"):
        TrainConfig(batch_size=0)
    with pytest.raises(ConfigError, match="betas"):
        TrainConfig(betas=(0.9, 1.5))
    # YAML 1.1 reads 6e-4 as a string: numeric strings are taken as numbers
    # and a bare `no` as false
    config = TrainConfig.from_dict(yaml.safe_load("lr: 6e-4\nbetas: [0.9, 0.99]\nmixed_precision: no"))
    assert config.lr == 6e-4 and config.betas == (0.9, 0.99) and config.mixed_precision == "no"
    assert TrainConfig.from_dict(config.to_dict()) == config  # round trip


def test_summary_names_the_stop_the_peak_logit_and_its_layer():
    def record(step, logits):
        return {"step": step, "max_logit": max(logits), "max_logit_per_layer": logits,
                "sigma_max": {"attn": 1.0}, "dual_residual": None}

    result = TrainResult(status="unstable", reason="logit growth", stop_step=20, final_val_loss=3.25,
                         best_val_loss=3.0, history=[record(10, [5.0, 90.0]), record(20, [40.0, 7.0])],
                         mean_step_ms=4.0, tokens_per_s=1000.0, config={"train": {"steps": 40}})
    lines = result.summary().splitlines()
    # Rule: an unstable run says where and why it stopped.
    assert lines[0] == "status      unstable at step 20: logit growth"
    assert lines[1] == "val loss    final 3.25  best 3"
    # Rule: the max logit line gives the last probe's value and layer, and the peak's step.
    assert lines[2] == "max logit   40 at step 20 (layer 0); peak 90 at step 10"
    # Rule: the probed steps are the ones the pruner reads, with its keys.
    assert [m["step"] for m in result.probe_history] == [10, 20]
    assert set(result.to_dict()) == {"status", "reason", "stop_step", "final_val_loss", "best_val_loss",
                                     "mean_step_ms", "tokens_per_s"}


def test_the_batch_must_split_over_the_processes_then_the_micro_batches():
    check_batch_split(8, 4, 2)  # 4 rows per process, in 4 micro-batches of 1
    # Rule: processes that do not divide the batch name batch_size (grad_accum cannot help).
    with pytest.raises(SettingsError) as e:
        check_batch_split(7, 1, 2, source="s.yaml", prefix="proxy.")
    assert str(e.value) == "s.yaml: proxy.batch_size: global batch 7 does not split over the 2 processes of this launch"
    # Rule: micro-batches that do not divide a process's rows name grad_accum and list the
    # values that do.
    with pytest.raises(SettingsError) as e:
        check_batch_split(8, 3, 2)
    assert str(e.value) == ("TrainConfig: grad_accum: global batch 8 does not split over 2 processes x 3 "
                            "micro-batches; expected one of: 1, 2, 4")
    with pytest.raises(SettingsError, match=r"over 1 process x 7 micro-batches; expected a divisor of 720$"):
        check_batch_split(720, 7)  # 30 divisors: named, not listed
