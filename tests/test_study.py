"""Tests of geosearch.search.study: the objective, budget, resume, ranking and export.

The ranking the search prints is tested in tests/test_ranking.py, its statistics in
tests/test_stats.py, and the report that renders it in tests/test_report.py.

Most tests replace ``train`` by a fake that calls the callback with synthetic metrics and
returns a TrainResult, so the study logic is tested in milliseconds; the end-to-end test
and the forced-instability test train the tiny proxy for real.
"""

from __future__ import annotations

import dataclasses
import io
import math
import os

import optuna
import pytest
import torch
from optuna.trial import TrialState

import geosearch.search.study as study_mod
from geosearch.assignment import load_assignment
from geosearch.errors import ConfigError
from geosearch.optim import build_optimizer
from geosearch.proxy.model import GPT, make_config
from geosearch.proxy.train import TrainResult
from geosearch.search.ranking import rank_study
from geosearch.search.space import SearchSpace
from geosearch.search.study import (
    export_best,
    open_run_study,
    open_storage,
    run_search,
)

optuna.logging.set_verbosity(optuna.logging.WARNING)

TINY_PROXY = {"model": "tiny", "steps": 10, "batch_size": 2, "eval_every": 5, "eval_batches": 1,
              "probe_every": 5, "probe_batch_size": 1, "device": "cpu"}


def make_space(geometries=None, **extra) -> SearchSpace:
    d = {"version": 1, "name": "t", "proxy": dict(TINY_PROXY),
         "geometries": geometries or {"attn": ["adamw", "euclidean"], "mlp": ["adamw"]}}
    d.update(extra)
    return SearchSpace.from_dict(d, source="test space")


def search(space, tmp_path, **kw):
    return run_search(space, runs_dir=tmp_path / "runs", out=io.StringIO(), progress=False, **kw)


def trials_of(tmp_path, name="t"):
    return open_run_study(tmp_path / "runs" / name).get_trials()


class FakeTrain:
    """Stands in for geosearch.proxy.train.train: two probe/eval steps (5, 10).

    ``losses(key, seed)`` gives the val loss, ``logits(key, seed)`` the max logit, where
    ``key`` is "attn=...,mlp=..." (the resolved family geometries).
    """

    def __init__(self, losses=None, logits=None, raises=None):
        self.losses = losses or (lambda key, seed: 3.0 + 0.1 * len(key))
        self.logits = logits or (lambda key, seed: 10.0)
        self.raises = raises or (lambda key, seed: None)
        self.calls: list[tuple[str, int]] = []

    def __call__(self, config, assignment, callback=None, out_dir=None, **kw):
        g = assignment.resolve()
        key = f"attn={g['attn_qkv']},mlp={g['mlp_in']}"
        self.calls.append((key, config.seed))
        exc = self.raises(key, config.seed)
        if exc is not None:
            raise exc
        history = []
        for step in (5, 10):
            loss = self.losses(key, config.seed)
            m = {"step": step, "train_loss": loss, "val_loss": loss, "max_logit": self.logits(key, config.seed),
                 "min_entropy": 1.0, "sigma_max": {"attn_qkv": 1.0}, "step_ms": 1.0}
            history.append(m)
            stop = callback(step, m) if callback else None
            if stop:
                return TrainResult("unstable", stop, step, loss, loss, history, 1.0, 1e3, {})
        return TrainResult("completed", None, None, loss, loss, history, 1.0, 1e3, {})




@pytest.fixture
def fake(monkeypatch):
    f = FakeTrain()
    monkeypatch.setattr(study_mod, "train", f)
    return f


# --------------------------------------------------------------------------- the objective
def test_trial_attrs_follow_the_storage_conventions(fake, tmp_path):
    out = search(make_space(), tmp_path)
    assert out.counts == {"completed": 2} and out.stopped == "every assignment of the space has been tried"
    study = open_run_study(tmp_path / "runs" / "t")
    assert set(study.user_attrs) >= {"space", "geosearch_version", "rules", "proxy"}
    for t in study.get_trials():
        ua = t.user_attrs
        assert t.state == TrialState.COMPLETE and ua["status"] == "completed"
        assert ua["assignment"]["attn_qkv"] == t.params["geometry.attn"]
        assert ua["assignment_key"] == ",".join(f"{k}={v}" for k, v in sorted(ua["assignment"].items()))
        assert ua["budget_steps"] == 10 and ua["seeds"] == [0] and ua["trial_dir"] == f"trials/{t.number}"
        assert [p["step"] for p in ua["probe_history"]] == [5, 10]
        assert ua["val_losses"] == [t.value] and ua["val_loss_std"] is None  # one seed: no spread
        assert ua["prune_reason"] is None and ua["fail_reason"] is None
        assert t.intermediate_values == {5: t.value, 10: t.value}  # reported at each eval step


def test_pruner_verdict_stops_the_run_and_prunes_with_its_reason(monkeypatch, tmp_path):
    # dgram attention's logits explode: the LogitGrowthPruner must stop it at the first probe
    f = FakeTrain(logits=lambda key, seed: 5e3 if "attn=euclidean" in key else 10.0)
    monkeypatch.setattr(study_mod, "train", f)
    search(make_space(), tmp_path)
    by_attn = {t.params["geometry.attn"]: t for t in trials_of(tmp_path)}
    pruned = by_attn["euclidean"]
    assert pruned.state == TrialState.PRUNED and pruned.user_attrs["status"] == "unstable"
    assert pruned.user_attrs["prune_reason"] == "max logit 5e+03 at step 5 > max_logit 1e+03"
    assert pruned.user_attrs["stop_step"] == 5  # stopped early, not at step 10
    assert by_attn["adamw"].state == TrialState.COMPLETE  # the study went on


def test_non_finite_validation_loss_is_pruned_not_failed(monkeypatch, tmp_path):
    f = FakeTrain(losses=lambda key, seed: math.nan if "euclidean" in key else 3.0)
    monkeypatch.setattr(study_mod, "train", f)
    search(make_space(), tmp_path)
    t = next(t for t in trials_of(tmp_path) if t.params["geometry.attn"] == "euclidean")
    assert t.state == TrialState.PRUNED  # pruned so that TPE learns the region is bad
    assert "non-finite" in t.user_attrs["prune_reason"]


def test_exception_fails_the_trial_with_its_message_and_the_study_goes_on(monkeypatch, tmp_path):
    f = FakeTrain(raises=lambda key, seed: RuntimeError("boom") if "euclidean" in key else None)
    monkeypatch.setattr(study_mod, "train", f)
    out = search(make_space(), tmp_path)
    by_attn = {t.params["geometry.attn"]: t for t in trials_of(tmp_path)}
    failed = by_attn["euclidean"]
    assert failed.state == TrialState.FAIL and failed.user_attrs["status"] == "failed"
    assert failed.user_attrs["fail_reason"] == "RuntimeError: boom"
    assert "RuntimeError: boom" in (tmp_path / "runs/t/trials" / str(failed.number) / "traceback.txt").read_text()
    assert by_attn["adamw"].state == TrialState.COMPLETE
    assert out.counts == {"completed": 1, "failed": 1}  # the failure counts towards the budget


def test_repeated_failures_end_the_search_with_one_message(monkeypatch, tmp_path):
    f = FakeTrain(raises=lambda key, seed: RuntimeError("no GPU"))
    monkeypatch.setattr(study_mod, "train", f)
    space = make_space({"attn": ["adamw", "euclidean", "oblique"], "mlp": ["adamw", "euclidean"]},
                       sampler="grid")
    with pytest.raises(study_mod.GeosearchError, match="5 trials in a row failed.*no GPU"):
        search(space, tmp_path)
    assert len(f.calls) == 5  # it stopped instead of failing all 6


def test_repeats_keep_mean_and_spread_and_a_late_unstable_seed_prunes(monkeypatch, tmp_path):
    noise = {0: 0.0, 1: 0.02, 2: -0.02}
    f = FakeTrain(losses=lambda key, seed: (3.0 if "attn=adamw" in key else 3.01) + noise[seed],
                  logits=lambda key, seed: 5e3 if ("oblique" in key and seed == 1) else 10.0)
    monkeypatch.setattr(study_mod, "train", f)
    out = search(make_space({"attn": ["adamw", "euclidean", "oblique"], "mlp": ["adamw"]}, repeats=3),
                 tmp_path)
    trials = {t.params["geometry.attn"]: t for t in trials_of(tmp_path)}
    a = trials["adamw"].user_attrs
    assert a["seeds"] == [0, 1, 2] and a["val_losses"] == pytest.approx([3.0, 3.02, 2.98])
    assert a["val_loss_mean"] == pytest.approx(3.0) and a["val_loss_std"] == pytest.approx(0.02)
    # intermediate values are the first seed's only
    assert trials["adamw"].intermediate_values == {5: 3.0, 10: 3.0}
    # the oblique point is stable on seed 0 and explodes on seed 1: pruned, seed named
    ob = trials["oblique"]
    assert ob.state == TrialState.PRUNED and ob.user_attrs["prune_reason"].startswith("seed 1: max logit")
    assert ob.user_attrs["pruned_seed"] == 1 and ("attn=oblique,mlp=adamw", 2) not in f.calls
    # adamw and euclidean differ by 0.01 in every seed: the seed's own effect (0, +0.02, -0.02)
    # is common to both (same seeds), so the paired test separates them and adamw wins
    assert out.ranking.tied == [trials["adamw"].number]
    assert out.ranking.verdict.startswith("winner: attn=adamw")


# --------------------------------------------------------------------------- budget, resume
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


def test_sampler_duplicates_are_not_trained(fake, tmp_path):
    # a random sampler on a 2-point space with a budget of 6 proposes duplicates
    out = search(make_space(sampler="random", budget={"trials": 6}), tmp_path)
    assert sorted(fake.calls) == [("attn=adamw,mlp=adamw", 0), ("attn=euclidean,mlp=adamw", 0)]
    assert out.stopped == "every one of the 2 assignments of the space has been scored"
    dups = [t for t in trials_of(tmp_path) if t.user_attrs.get("status") == "duplicate"]
    assert all(t.state == TrialState.FAIL and "same point as trial" in t.user_attrs["fail_reason"] for t in dups)


def test_resume_with_other_proxy_settings_is_refused(fake, tmp_path):
    search(make_space(), tmp_path)
    changed = make_space(proxy={**TINY_PROXY, "steps": 20})
    with pytest.raises(ConfigError, match=r"proxy\.steps=10, not 20"):
        search(changed, tmp_path)


def test_trial_of_a_dead_worker_is_failed_and_its_point_run_again(fake, tmp_path, running_trial):
    import socket

    space = make_space(sampler="random", budget={"trials": 2})
    search(make_space(sampler="random", budget={"trials": 1}), tmp_path)
    done = {c[0] for c in fake.calls}
    params = {"geometry.attn": "euclidean" if "attn=adamw,mlp=adamw" in done else "adamw", "geometry.mlp": "adamw"}
    lock = tmp_path / "dead.lock"
    lock.touch()  # a killed worker leaves its lock file behind, no longer locked
    dead = {"host": socket.gethostname(), "pid": 999999, "lock": str(lock)}
    n = running_trial(tmp_path, params, dead)
    out = search(space, tmp_path)
    trials = {t.number: t for t in trials_of(tmp_path)}
    assert trials[n].state == TrialState.FAIL  # the dead worker's trial
    retry = [t for t in trials.values() if t.user_attrs.get("retry_of") == n]
    assert len(retry) == 1 and retry[0].state == TrialState.COMPLETE and retry[0].params == params
    assert out.counts["completed"] == 2  # budget: the dead trial did not count


@pytest.mark.skipif(os.name != "posix", reason="worker locks are POSIX flocks")
def test_trial_of_a_live_worker_is_left_alone_and_holds_its_budget_slot(fake, tmp_path, running_trial):
    import fcntl
    import socket

    search(make_space(sampler="random", budget={"trials": 1}), tmp_path)
    lock = tmp_path / "alive.lock"
    fd = os.open(lock, os.O_CREAT | os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX)  # a live worker holds its lock
    try:
        live = {"host": socket.gethostname(), "pid": 1, "lock": str(lock)}
        n = running_trial(tmp_path, {"geometry.attn": "adamw", "geometry.mlp": "adamw"}, live)
        calls = len(fake.calls)
        out = search(make_space(sampler="random", budget={"trials": 2}), tmp_path)
        assert len(fake.calls) == calls  # 1 done + 1 running = the budget of 2
        assert "still running elsewhere" in out.stopped
        assert next(t for t in trials_of(tmp_path) if t.number == n).state == TrialState.RUNNING
    finally:
        os.close(fd)


def test_ctrl_c_fails_the_trial_queues_it_and_a_rerun_finishes_it(monkeypatch, tmp_path):
    f = FakeTrain(raises=lambda key, seed: KeyboardInterrupt() if len(f.calls) == 2 else None)
    monkeypatch.setattr(study_mod, "train", f)
    with pytest.raises(KeyboardInterrupt):
        search(make_space(), tmp_path)
    interrupted = [t for t in trials_of(tmp_path) if t.state == TrialState.FAIL]
    assert len(interrupted) == 1 and interrupted[0].user_attrs["status"] == "interrupted"
    out = search(make_space(), tmp_path)
    retry = [t for t in trials_of(tmp_path) if t.user_attrs.get("retry_of") == interrupted[0].number]
    assert retry[0].state == TrialState.COMPLETE and retry[0].params == interrupted[0].params
    assert out.counts == {"completed": 2, "interrupted": 1}


# --------------------------------------------------------------------------- storage
def test_bad_storage_url_is_one_config_error(tmp_path):
    with pytest.raises(ConfigError, match=r"^--storage: cannot open the storage 'bogus://x'"):
        open_storage(tmp_path, "bogus://x")
    with pytest.raises(ConfigError, match=r"'postgresql://me:\*\*\*@db/x'"):  # password masked
        open_storage(tmp_path, "postgresql://me:secret@db/x")


def test_storage_kind_follows_workers_and_what_exists(tmp_path):
    _, desc = open_storage(tmp_path / "a", workers=1)
    assert desc.startswith("sqlite:///") and desc.endswith("a/study.db")
    _, desc = open_storage(tmp_path / "b", workers=3)
    assert desc == f"journal file {tmp_path / 'b' / 'journal.log'}"
    (tmp_path / "b" / "journal.log").touch()
    assert open_storage(tmp_path / "b", workers=1)[1].startswith("journal file")  # a rerun keeps it


# --------------------------------------------------------------------------- real proxy runs
def test_end_to_end_search_exports_an_assignment_that_builds_an_optimizer(tmp_path):
    space = make_space({"attn": ["adamw", "oblique"], "mlp": ["adamw", "euclidean"]})
    out = search(space, tmp_path)
    reasons = [t.user_attrs.get("fail_reason") for t in trials_of(tmp_path)]
    assert out.counts == {"completed": 4}, reasons
    run = tmp_path / "runs" / "t"
    for t in trials_of(tmp_path):
        lines = (run / t.user_attrs["trial_dir"] / "metrics.jsonl").read_text().splitlines()
        assert len(lines) == 2  # steps 5 and 10
        assert (run / t.user_attrs["trial_dir"] / "config.yaml").is_file()
    assert out.exported == run / "best_assignment.yaml"
    a = load_assignment(out.exported)
    best = out.ranking.rows[0]
    assert a.provenance["trial"] == best.number and a.provenance["score"]["mean"] == pytest.approx(best.score.mean)
    assert a.provenance["study"] == "t" and a.provenance["proxy"]["steps"] == 10
    assert {"date", "geosearch_version", "verdict"} <= set(a.provenance)

    torch.manual_seed(0)
    model = GPT(make_config("tiny"))
    opt = build_optimizer(model, a, verbose=False)
    x = torch.randint(256, (2, 16))
    before = [p.detach().clone() for p in model.parameters()]
    model(x, x)[1].backward()
    opt.step()
    assert any(not torch.equal(b, p) for b, p in zip(before, model.parameters()))


def test_forced_unstable_run_is_pruned_by_the_real_pruner(monkeypatch, tmp_path):
    real = study_mod.train

    def absurd_lr_for_adamw_attention(config, assignment, callback=None, out_dir=None, **kw):
        if assignment.resolve()["attn_qkv"] == "adamw":
            config = dataclasses.replace(config, lr=10.0)  # AdamW step 10: logits explode
        return real(config, assignment, callback=callback, out_dir=out_dir, **kw)

    monkeypatch.setattr(study_mod, "train", absurd_lr_for_adamw_attention)
    search(make_space({"attn": ["adamw", "oblique"], "mlp": ["adamw"]}), tmp_path)
    by_attn = {t.params["geometry.attn"]: t for t in trials_of(tmp_path)}
    pruned = by_attn["adamw"]
    assert pruned.state == TrialState.PRUNED
    assert pruned.user_attrs["prune_reason"].startswith("max logit") and pruned.user_attrs["stop_step"] == 5
    assert by_attn["oblique"].state == TrialState.COMPLETE


def test_export_top_k_writes_one_loadable_file_per_rank(fake, tmp_path):
    search(make_space({"attn": ["adamw", "euclidean", "oblique"], "mlp": ["adamw"]}), tmp_path)
    paths = export_best(tmp_path / "runs" / "t", top=2)
    assert [p.name.split("-")[0] for p in paths] == ["rank1", "rank2"]
    loaded = [load_assignment(p) for p in paths]
    assert [a.provenance["rank"] for a in loaded] == [1, 2]
    assert loaded[0].provenance["score"]["mean"] <= loaded[1].provenance["score"]["mean"]
    single = export_best(tmp_path / "runs" / "t", tmp_path / "best.yaml")
    assert single == [tmp_path / "best.yaml"] and load_assignment(single[0]).provenance["rank"] == 1


def test_search_package_exports_its_public_api():
    import geosearch.search as search_pkg

    # every name in __all__ resolves (study's names are imported on first use)
    for name in search_pkg.__all__:
        assert getattr(search_pkg, name) is not None, name
    assert search_pkg.run_search is run_search and search_pkg.rank_study is rank_study
    with pytest.raises(AttributeError):
        search_pkg.no_such_name  # noqa: B018
