"""Tests of the proxy run's settings and result (geosearch/proxy/config.py)."""

from __future__ import annotations

import pytest
import yaml

from geosearch.util.errors import ConfigError, SettingsError
from geosearch.proxy.config import TrainConfig, TrainResult, check_batch_split


def test_config_errors_name_the_key_and_the_allowed_values():
    with pytest.raises(ConfigError, match=r"space.yaml: proxy: stepz: unknown key; expected one of: .*steps"):
        TrainConfig.from_dict({"stepz": 3}, source="space.yaml: proxy")
    with pytest.raises(ConfigError, match=r"mixed_precision: .*'fp8'.*expected one of: no, bf16, fp16"):
        TrainConfig.from_dict({"mixed_precision": "fp8"})
    with pytest.raises(ConfigError, match=r"batch_size: expected a whole number in \[1, 100,000\], got 0"):
        TrainConfig(batch_size=0)
    with pytest.raises(ConfigError, match="betas"):
        TrainConfig(betas=(0.9, 1.5))
    # YAML 1.1 reads 6e-4 as a string: numeric strings are taken as numbers
    # and a bare `no` as false
    config = TrainConfig.from_dict(yaml.safe_load("lr: 6e-4\nbetas: [0.9, 0.99]\nmixed_precision: no"))
    assert config.lr == 6e-4 and config.betas == (0.9, 0.99) and config.mixed_precision == "no"
    assert TrainConfig.from_dict(config.to_dict()) == config  # round trip


@pytest.mark.parametrize(("key", "value", "words"), [
    # Rule: NaN and inf are refused with the key and the range (min_lr_ratio NaN was a traceback
    # in the schedule's sum, grad_clip NaN trained as no clip).
    ("min_lr_ratio", float("nan"), "min_lr_ratio: expected a number in [0, 1], got nan"),
    ("min_lr_ratio", "nan", "min_lr_ratio: expected a number in [0, 1], got 'nan'"),
    ("min_lr_ratio", 1.5, "min_lr_ratio: expected a number in [0, 1], got 1.5"),
    ("grad_clip", float("nan"), "grad_clip: expected a number >= 0, got nan (0: no clipping)"),
    ("grad_clip", float("inf"), "grad_clip: expected a number >= 0, got inf"),
    ("qk_clip", float("nan"), "qk_clip: expected a number > 0 or null, got nan (the cap"),
    ("lr", float("nan"), "lr: expected a number >= 0, got nan"),  # a peak lr of 0 is allowed
    ("momentum", float("inf"), "momentum: expected a number in [0, 1), got inf"),
    # Rule: every count is bounded (steps: 10**30 promised a run that never ends).
    ("steps", 10**30, "steps: expected a whole number in [1, 10,000,000], got 10000000000000000000"),
    ("warmup_steps", -1, "warmup_steps: expected a whole number in [0, 10,000,000] or null, got -1"),
    ("eval_every", 10**8, "eval_every: expected a whole number in [1, 10,000,000]"),
    ("eval_batches", 10**5, "eval_batches: expected a whole number in [1, 10,000]"),
    ("grad_accum", 0, "grad_accum: expected a whole number in [1, 10,000], got 0"),
    ("probe_batch_size", 2.0, "probe_batch_size: expected a whole number in [1, 10,000], got 2.0"),
    # Rule: a seed numpy and Accelerate take, with room for the seeds a study adds.
    ("seed", -1, "seed: expected a whole number in [0, 2,147,483,647], got -1"),
    ("optimizer_args", {"ns_steps": 10**12}, "optimizer_args.ns_steps: expected a whole number in [1, 10,000]"),
])
def test_every_number_is_refused_out_of_its_range_with_the_range(key, value, words):
    with pytest.raises(ConfigError) as e:
        TrainConfig.from_dict({key: value}, source="c.yaml")
    assert str(e.value).startswith(f"c.yaml: {words}"), str(e.value)


def test_every_number_field_has_a_range_and_its_bounds_are_kept():
    import dataclasses

    from geosearch.proxy.config import LIMITS, OPTIMIZER_FIELDS

    numbers = {f.name for f in dataclasses.fields(TrainConfig)
               if f.type in ("int", "float", "int | None", "float | None")}
    # Rule: every number field is checked by one rule: a Range of LIMITS, or the settings catalog.
    assert numbers == set(LIMITS) | (numbers & set(OPTIMIZER_FIELDS)) and numbers & set(OPTIMIZER_FIELDS)
    c = TrainConfig(steps=10**7, min_lr_ratio=1, grad_clip=0, seed=2**31 - 1, qk_clip="1e2")
    assert (c.steps, c.min_lr_ratio, c.grad_clip, c.seed, c.qk_clip) == (10**7, 1.0, 0.0, 2**31 - 1, 100.0)


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
