"""Tests of a run's saved state (geosearch/proxy/state.py) and the warmup-stable-decay
schedule: a cooldown branched off a constant-step trunk is the run of that length trained
from scratch, and a branch killed mid-cooldown resumes on its own."""

from __future__ import annotations

import math

import pytest

from geosearch.assignment import Assignment
from geosearch.util.errors import ConfigError
from geosearch.proxy.config import TrainConfig
from geosearch.proxy.state import state_path
from geosearch.proxy.train import train

MIXED = Assignment.parse("attn=stiefel,mlp=dgram")


def tiny(**kw) -> TrainConfig:
    base = dict(
        model="tiny",
        steps=24,
        batch_size=4,
        eval_every=6,
        eval_batches=1,
        probe_every=6,
        probe_batch_size=2,
        lr=3e-3,
        device="cpu",
        seed=3,
        warmup_steps=4,
        cooldown_steps=8,
    )
    return TrainConfig(**{**base, **kw})


def test_wsd_schedule_is_constant_then_falls_linearly_to_the_floor():
    c = tiny(min_lr_ratio=0.1)
    f = [c.lr_factor(s) for s in range(24)]
    assert f[:4] == [0.25, 0.5, 0.75, 1.0] and f[4:16] == [1.0] * 12
    assert f[-1] == pytest.approx(0.1) and all(a > b for a, b in zip(f[15:], f[16:]))
    # the same run up to its cooldown whatever its length
    longer = tiny(steps=40, cooldown_steps=8)
    assert [longer.lr_factor(s) for s in range(16)] == f[:16]
    with pytest.raises(ConfigError, match="cooldown_steps"):
        tiny(cooldown_steps=21)


@pytest.mark.slow
def test_a_branch_equals_the_run_trained_from_scratch(tmp_path):
    scratch = train(tiny(), MIXED)
    # the trunk: constant step after the warmup, its state saved where the branch's
    # cooldown starts (step 16), run on past it
    trunk = train(
        tiny(steps=20, cooldown_steps=0), MIXED, out_dir=tmp_path / "trunk", save_at=(16,)
    )
    assert trunk.status == "completed" and state_path(tmp_path / "trunk", 16).is_file()
    branch = train(
        tiny(), MIXED, out_dir=tmp_path / "branch", start_from=state_path(tmp_path / "trunk", 16)
    )
    assert branch.status == "completed"
    assert branch.final_val_loss == pytest.approx(scratch.final_val_loss, rel=1e-6, abs=1e-6)
    assert [m["step"] for m in branch.history] == [m["step"] for m in scratch.history]
    for a, b in zip(branch.history, scratch.history):
        assert a["lr"] == pytest.approx(b["lr"], rel=1e-12)
        if b["val_loss"] is not None:
            assert a["val_loss"] == pytest.approx(b["val_loss"], rel=1e-6, abs=1e-6)
    # a state of another run is refused, naming the field
    with pytest.raises(ConfigError, match="seed"):
        train(
            tiny(seed=4),
            MIXED,
            out_dir=tmp_path / "other",
            start_from=state_path(tmp_path / "trunk", 16),
        )


@pytest.mark.slow
def test_a_branch_killed_mid_cooldown_resumes_on_its_own(tmp_path):
    trunk = train(
        tiny(steps=16, cooldown_steps=0), MIXED, out_dir=tmp_path / "trunk", save_at=(16,)
    )
    start = state_path(tmp_path / "trunk", 16)
    whole = train(tiny(), MIXED, out_dir=tmp_path / "whole", start_from=start)

    def kill(step, metrics):
        if step == 24:  # after its state at step 18 was kept
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        train(tiny(), MIXED, out_dir=tmp_path / "killed", start_from=start, callback=kill)
    assert state_path(tmp_path / "killed").is_file()  # its own state at step 18
    seen = []
    resumed = train(
        tiny(),
        MIXED,
        out_dir=tmp_path / "killed",
        start_from=start,
        callback=lambda step, m: seen.append(step),
    )
    assert trunk.status == resumed.status == "completed"
    assert seen == [24]  # from its own state at step 18, not the trunk's at 16
    assert math.isclose(resumed.final_val_loss, whole.final_val_loss, rel_tol=1e-6, abs_tol=1e-6)
