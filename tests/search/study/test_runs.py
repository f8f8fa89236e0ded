"""Tests of geosearch.search.study.runs with ``ladder.branches``: each rung a cooldown
branched off one constant-step trunk, trained for real on the tiny proxy."""

from __future__ import annotations

import dataclasses

import pytest
from _search_helpers import make_space, search, trials_of
from optuna.trial import TrialState

from geosearch.assignment import Assignment
from geosearch.proxy.state import state_path
from geosearch.proxy.train import train
from geosearch.search.horizon.reading import study_reading
from geosearch.search.horizon.target import probe_sum_eta
from geosearch.search.runtime.storage import open_run_study
from geosearch.search.space.plan import plan_study
from geosearch.search.space.spec import Suggestion
from geosearch.search.study.runs import rung_run, trunk_dir

BRANCHES = {"rungs": 2, "max_steps": 20, "branches": True, "cooldown": 0.2}


def test_branch_rungs_are_planned_with_the_trunk_and_their_cooldowns_counted():
    space = make_space(ladder=BRANCHES, target={"steps": 40})
    plan = plan_study(space)
    assert [(r.steps, r.cooldown, r.branch_point) for r in plan.rungs] == [(10, 2, 8), (20, 4, 16)]
    # the trunk to step 16 and the two cooldowns: 22 steps an assignment (2 assignments)
    assert plan.least_steps == 2 * 22
    assert "branched off one constant-step run" in plan.header_lines()[0]
    suggestion = Suggestion({"attn": "stiefel", "mlp": "adamw"}, {}, {}, space.rules)
    config, _ = rung_run(space, suggestion, 0, plan.rungs[1])
    assert (config.steps, config.cooldown_steps, config.warmup_steps) == (20, 4, 1)
    # its probes' Σ η is the warmup-stable-decay schedule's, the same as the rung's
    assert probe_sum_eta(config, suggestion.assignment())(20) == pytest.approx(
        plan.rungs[1].sum_eta
    )
    assert probe_sum_eta(config, suggestion.assignment())(16) == pytest.approx(
        sum(config.lr_factor(t) for t in range(16)) * config.spectral_lr
    )


@pytest.mark.slow
def test_a_search_with_branches_ranks_completed_runs_off_one_trunk(tmp_path):
    space = make_space(
        geometries={"attn": ["adamw", "stiefel"], "mlp": ["adamw"]},
        ladder=BRANCHES,
        target={"steps": 40},
    )
    out = search(space, tmp_path)
    assert out.counts == {"completed": 2}
    t = next(t for t in trials_of(tmp_path) if t.params["geometry.attn"] == "stiefel")
    assert t.state == TrialState.COMPLETE and len(t.user_attrs["rung_losses"]) == 2
    here = trunk_dir(tmp_path / "runs" / "t" / "trials" / str(t.number), 0, 1)
    assert state_path(here, 8).is_file() and state_path(here, 16).is_file()
    # the top rung's loss is that of the 20-step warmup-stable-decay run from scratch
    config, assignment = (
        dataclasses.replace(space.proxy.resolved(), steps=20, warmup_steps=1, cooldown_steps=4),
        Assignment.parse("attn=stiefel,mlp=adamw"),
    )
    scratch = train(config, assignment)
    assert t.value == pytest.approx(scratch.final_val_loss, rel=1e-6, abs=1e-6)
    # the reading says which order ranked; two branches are too few for the curve law
    reading = study_reading(open_run_study(tmp_path / "runs" / "t"))
    assert reading.rule.startswith("the longest completed branch (Σ η")
    assert "curve law: needs 3 branches a seed (ladder.rungs >= 3); not fitted" in reading.lines
