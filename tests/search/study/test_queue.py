"""Tests of geosearch.search.study.queue: the grid queue, the budget over runs, duplicates."""

from __future__ import annotations

import pytest

import optuna
from _search_helpers import make_space, search, trials_of
from optuna.trial import TrialState

from geosearch.search.runtime.storage import open_run_study
from geosearch.search.study import run
from geosearch.search.study.queue import enqueue, grid_points, param_key, top_up_queue, trial_key, trial_params

optuna.logging.set_verbosity(optuna.logging.WARNING)


def test_grid_points_list_every_point_once_in_a_seeded_order():
    grid = {"attn": ["adamw", "euclidean", "oblique"], "mlp": ["adamw", "euclidean"]}
    points = grid_points(make_space(grid, sampler={"type": "grid", "seed": 1}))
    # every combination of the choices, each once
    assert len(points) == 6 and len({param_key(p) for p in points}) == 6
    assert {(p["geometry.attn"], p["geometry.mlp"]) for p in points} == \
        {(a, m) for a in grid["attn"] for m in grid["mlp"]}
    # the order is the sampler seed's: the same seed gives the same queue
    assert grid_points(make_space(grid, sampler={"type": "grid", "seed": 1})) == points


@pytest.mark.slow
def test_budget_counts_finished_trials_of_earlier_runs(fake, tmp_path):
    grid = {"attn": ["adamw", "euclidean"], "mlp": ["adamw", "euclidean"]}
    first = search(make_space(grid, sampler="grid", budget={"trials": 2}), tmp_path)
    assert first.counts == {"completed": 2} and first.stopped == "budget of 2 trials reached"
    second = search(make_space(grid, sampler="grid", budget={"trials": 4}), tmp_path)
    assert second.counts == {"completed": 4} and len(fake.calls) == 4
    keys = [c[0] for c in fake.calls]
    assert len(set(keys)) == 4  # the rerun trained the two remaining points only
    third = search(make_space(grid, sampler="grid", budget={"trials": 4}), tmp_path)
    assert third.stopped == "every assignment of the space has been tried" and len(fake.calls) == 4


@pytest.mark.slow
def test_sampler_duplicates_are_not_trained(fake, tmp_path):
    # a random sampler on a 2-point space with a budget of 6 proposes duplicates
    out = search(make_space(sampler="random", budget={"trials": 6}), tmp_path)
    assert sorted(fake.calls) == [("attn=adamw,mlp=adamw", 0), ("attn=euclidean,mlp=adamw", 0)]
    assert out.stopped == "every one of the 2 assignments of the space has been scored"
    dups = [t for t in trials_of(tmp_path) if t.user_attrs.get("status") == "duplicate"]
    assert all(t.state == TrialState.FAIL and "same point as trial" in t.user_attrs["fail_reason"] for t in dups)


def test_a_trial_stopped_between_two_parameters_keeps_its_whole_queued_point():
    study = optuna.create_study()
    point = {"geometry.attn": "stiefel", "geometry.mlp": "dgram"}
    study.enqueue_trial(point, user_attrs={"queued": True, "queued_params": point})
    trial = study.ask()
    trial.suggest_categorical("geometry.attn", ["stiefel", "dgram"])  # then the process died
    frozen = study.get_trials(deepcopy=False)[0]
    assert frozen.params == {"geometry.attn": "stiefel"}
    assert trial_params(frozen) == point and trial_key(frozen) == param_key(point)
    # a trial that was not queued has its own params only
    free = study.ask()
    choice = free.suggest_categorical("geometry.attn", ["stiefel", "dgram"])
    assert trial_params(study.get_trials(deepcopy=False)[1]) == {"geometry.attn": choice}


@pytest.mark.slow
def test_an_exhaustive_search_queues_a_grid_point_left_without_a_verdict(fake, tmp_path):
    # one mlp choice: a queued part of a point can only be completed into a point done
    grid = {"attn": ["adamw", "euclidean", "oblique"], "mlp": ["adamw"]}
    search(make_space(grid, sampler="grid", budget={"trials": 2}), tmp_path)
    done = trials_of(tmp_path)[0].params
    # what a rerun once queued for a trial stopped between its two parameters
    enqueue(open_run_study(tmp_path / "runs" / "t"), {"geometry.attn": done["geometry.attn"]})
    out = search(make_space(grid, sampler="grid", budget={"trials": 3}), tmp_path)
    # the part is dropped as a duplicate; the point left without a verdict is queued and trained
    assert out.counts["completed"] == 3 and len({c[0] for c in fake.calls}) == 3
    assert out.stopped == "every assignment of the space has been tried"


@pytest.mark.slow
def test_a_grid_queued_twice_at_once_leaves_nothing_waiting(fake, tmp_path, monkeypatch):
    # two run directories on one storage read the empty study at once and both queue the
    # grid: the second copy of each point must end as a duplicate, not stay WAITING
    grid = {"attn": ["adamw", "euclidean"], "mlp": ["adamw", "euclidean"]}
    space = make_space(grid, sampler="grid", baselines=["adamw"])

    def both_commands(study, space, budget):
        added = top_up_queue(study, space, budget)
        for params in grid_points(space):  # the other command's copy, queued unseen
            enqueue(study, params)
        return added

    monkeypatch.setattr(run, "top_up_queue", both_commands)
    out = search(space, tmp_path)
    trials = trials_of(tmp_path)
    assert [t.number for t in trials if t.state == TrialState.WAITING] == []
    assert len(fake.calls) == 5 and len({c[0] for c in fake.calls}) == 4  # 4 points, the adamw baseline
    dups = [t for t in trials if t.user_attrs.get("status") == "duplicate"]
    assert len(dups) == 4 and all("same point as trial" in t.user_attrs["fail_reason"] for t in dups)
    assert out.counts["completed"] == 5  # 4 points and the baseline
