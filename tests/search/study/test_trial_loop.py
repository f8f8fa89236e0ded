"""Tests of geosearch.search.study.trial_loop: what each trial records, and how it ends.

``train`` is replaced by a fake (tests/_search_helpers.py) except in the forced-instability
test, which trains the tiny proxy for real and lets the real pruner stop it.
"""

from __future__ import annotations

import dataclasses
import json
import math
import sys
from pathlib import Path

import optuna
import optuna.cli
import pytest
import torch
import yaml
from _search_helpers import FakeTrain, make_space, search, trials_of, use_train
from optuna.trial import TrialState

from geosearch.cli import main
from geosearch.util.errors import GeosearchError
from geosearch.proxy.config import TrainResult
from geosearch.search.study import trial_loop
from geosearch.search.study.queue import done_count
from geosearch.search.records import read_probes_file
from geosearch.search.runtime.storage import open_run_study

pytestmark = pytest.mark.usefixtures("no_plots")  # no test here checks a plot: tests/_no_plots.py

optuna.logging.set_verbosity(optuna.logging.WARNING)


@pytest.mark.slow
def test_trial_attrs_follow_the_storage_conventions(fake, tmp_path):
    out = search(make_space(), tmp_path)
    assert out.counts == {"completed": 2} and out.stopped == "every assignment of the space has been tried"
    study = open_run_study(tmp_path / "runs" / "t")
    assert set(study.user_attrs) >= {"space", "geosearch_version", "rules", "proxy"}
    for t in study.get_trials():
        ua = t.user_attrs
        assert t.state == TrialState.COMPLETE and ua["status"] == "completed"
        assert ua["assignment"]["attn_qkv"] == t.params["geometry.attn"]
        # the assignment once (no "assignment_key" string beside it), the last probe's sigma_max
        # in its probes.json row, not an attr
        assert "assignment_key" not in ua and "sigma_max" not in ua
        assert ua["budget_steps"] == 10 and ua["seeds"] == [0] and ua["trial_dir"] == f"trials/{t.number}"
        rows = read_probes_file(tmp_path / "runs" / "t", t)["probe_history"]  # a file, no attr
        assert [p["step"] for p in rows] == [5, 10] and "probe_history" not in ua
        # the value is the losses' mean: no attr repeats it or their spread; a prune reason
        # and a stop step of None are not written, the placeholder fail reason is cleared
        assert ua["val_losses"] == [t.value] and not {"val_loss_mean", "val_loss_std"} & set(ua)
        assert "prune_reason" not in ua and "stop_step" not in ua and ua["fail_reason"] is None
        assert t.intermediate_values == {5: t.value, 10: t.value}  # reported at each eval step


@pytest.mark.slow
def test_pruner_verdict_stops_the_run_and_prunes_with_its_reason(monkeypatch, tmp_path):
    # dgram attention's logits explode: the LogitGrowthPruner must stop it at the first probe
    f = FakeTrain(logits=lambda key, seed: 5e3 if "attn=euclidean" in key else 10.0)
    use_train(monkeypatch, f)
    search(make_space(), tmp_path)
    by_attn = {t.params["geometry.attn"]: t for t in trials_of(tmp_path)}
    pruned = by_attn["euclidean"]
    assert pruned.state == TrialState.PRUNED and pruned.user_attrs["status"] == "unstable"
    # the threshold is in the proxy model's unit: 10 × d/√d_head, 8 for tiny (32 wide, 2 heads)
    assert pruned.user_attrs["prune_reason"] == "max logit 5e+03 at step 5 > threshold 80 (10 × d/√d_head 8)"
    assert pruned.user_attrs["stop_step"] == 5  # stopped early, not at step 10
    assert by_attn["adamw"].state == TrialState.COMPLETE  # the study went on


@pytest.mark.slow
def test_non_finite_validation_loss_is_pruned_not_failed(monkeypatch, tmp_path):
    f = FakeTrain(losses=lambda key, seed: math.nan if "euclidean" in key else 3.0)
    use_train(monkeypatch, f)
    search(make_space(), tmp_path)
    t = next(t for t in trials_of(tmp_path) if t.params["geometry.attn"] == "euclidean")
    assert t.state == TrialState.PRUNED  # pruned so that TPE learns the region is bad
    assert "non-finite" in t.user_attrs["prune_reason"]


@pytest.mark.slow
def test_exception_fails_the_trial_with_its_message_and_the_study_goes_on(monkeypatch, tmp_path):
    f = FakeTrain(raises=lambda key, seed: RuntimeError("boom") if "euclidean" in key else None)
    use_train(monkeypatch, f)
    out = search(make_space(), tmp_path)
    by_attn = {t.params["geometry.attn"]: t for t in trials_of(tmp_path)}
    failed = by_attn["euclidean"]
    assert failed.state == TrialState.FAIL and failed.user_attrs["status"] == "failed"
    assert failed.user_attrs["fail_reason"] == "RuntimeError: boom"
    assert "RuntimeError: boom" in (tmp_path / "runs/t/trials" / str(failed.number) / "traceback.txt").read_text()
    assert by_attn["adamw"].state == TrialState.COMPLETE
    assert out.counts == {"completed": 1, "failed": 1}  # the failure counts towards the budget


@pytest.mark.slow
def test_repeated_failures_end_the_search_with_one_message(monkeypatch, tmp_path):
    f = FakeTrain(raises=lambda key, seed: RuntimeError("no GPU"))
    use_train(monkeypatch, f)
    space = make_space({"attn": ["adamw", "euclidean", "oblique"], "mlp": ["adamw", "euclidean"]},
                       sampler="grid")
    with pytest.raises(GeosearchError, match="5 trials in a row failed.*no GPU"):
        search(space, tmp_path)
    assert len(f.calls) == 5  # it stopped instead of failing all 6


@pytest.mark.slow
def test_repeats_keep_mean_and_spread_and_a_late_unstable_seed_prunes(monkeypatch, tmp_path):
    noise = {0: 0.0, 1: 0.02, 2: -0.02}
    f = FakeTrain(losses=lambda key, seed: (3.0 if "attn=adamw" in key else 3.01) + noise[seed],
                  logits=lambda key, seed: 5e3 if ("oblique" in key and seed == 1) else 10.0)
    use_train(monkeypatch, f)
    out = search(make_space({"attn": ["adamw", "euclidean", "oblique"], "mlp": ["adamw"]}, repeats=3),
                 tmp_path)
    trials = {t.params["geometry.attn"]: t for t in trials_of(tmp_path)}
    a = trials["adamw"].user_attrs
    assert a["seeds"] == [0, 1, 2] and a["val_losses"] == pytest.approx([3.0, 3.02, 2.98])
    assert trials["adamw"].value == pytest.approx(3.0)  # the mean: the trial's value
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


@pytest.mark.slow
def test_ctrl_c_fails_the_trial_queues_it_and_a_rerun_finishes_it(monkeypatch, tmp_path):
    f = FakeTrain(raises=lambda key, seed: KeyboardInterrupt() if len(f.calls) == 2 else None)
    use_train(monkeypatch, f)
    with pytest.raises(KeyboardInterrupt):
        search(make_space(), tmp_path)
    interrupted = [t for t in trials_of(tmp_path) if t.state == TrialState.FAIL]
    assert len(interrupted) == 1 and interrupted[0].user_attrs["status"] == "interrupted"
    out = search(make_space(), tmp_path)
    retry = [t for t in trials_of(tmp_path) if t.user_attrs.get("retry_of") == interrupted[0].number]
    assert retry[0].state == TrialState.COMPLETE and retry[0].params == interrupted[0].params
    assert out.counts == {"completed": 2, "interrupted": 1}



@pytest.mark.slow
@pytest.mark.parametrize("at", ["status", "num_processes"])
def test_ctrl_c_while_the_trial_records_its_start_is_recorded_and_queued(monkeypatch, fake, tmp_path, at):
    # A Ctrl-C can land between ask and training (the trial's attrs are being written, one
    # storage write each): the trial is still failed as interrupted and its point queued.
    real = optuna.Trial.set_user_attr
    hit = []

    def set_user_attr(self, key, value):
        if key == at and not hit and (key != "status" or value == "running"):
            hit.append(self.number)
            raise KeyboardInterrupt
        return real(self, key, value)

    monkeypatch.setattr(optuna.Trial, "set_user_attr", set_user_attr)
    with pytest.raises(KeyboardInterrupt):
        search(make_space(), tmp_path)
    trials = trials_of(tmp_path)
    stopped = next(t for t in trials if t.number == hit[0])
    assert stopped.state == TrialState.FAIL and stopped.user_attrs["status"] == "interrupted"
    assert fake.calls == []  # it never trained
    queued = [t for t in trials if t.user_attrs.get("retry_of") == hit[0]]
    assert len(queued) == 1 and queued[0].state == TrialState.WAITING
    assert queued[0].user_attrs["queued_params"] == stopped.params
    monkeypatch.setattr(optuna.Trial, "set_user_attr", real)
    out = search(make_space(), tmp_path)  # the rerun trains it
    assert out.counts == {"completed": 2, "interrupted": 1}

@pytest.mark.slow
def test_a_point_the_budget_took_is_queued_again_before_its_trial_is_told(monkeypatch, fake, tmp_path):
    # Another worker took the budget while this one asked for a queued point: the trial is
    # skipped and the point queued again, before the tell, so a kill in between loses nothing.
    taken = "the budget of 1 trials was taken by other workers"
    monkeypatch.setattr(trial_loop, "budget_taken", lambda study, budget, number: taken if number == 1 else None)
    real_tell = trial_loop.Searcher._tell
    queued_at_tell = {}

    def tell(self, trial, state, value=None):
        waiting = [t for t in self.study.get_trials(deepcopy=False) if t.state == TrialState.WAITING]
        queued_at_tell[trial.number] = [t.user_attrs.get("retry_of") for t in waiting]
        return real_tell(self, trial, state, value)

    monkeypatch.setattr(trial_loop.Searcher, "_tell", tell)
    search(make_space(), tmp_path)
    skipped = next(t for t in trials_of(tmp_path) if t.number == 1)
    assert skipped.state == TrialState.FAIL and skipped.user_attrs["status"] == "skipped"
    assert skipped.user_attrs["fail_reason"] == taken
    assert 1 in queued_at_tell[1]  # queued (retry_of 1) before trial 1 was told
    retry = [t for t in trials_of(tmp_path) if t.user_attrs.get("retry_of") == 1]
    assert len(retry) == 1 and retry[0].user_attrs["queued_params"] == skipped.params
    assert retry[0].state == TrialState.COMPLETE  # the same run went on to train it


@pytest.mark.slow
def test_forced_unstable_run_is_pruned_by_the_real_pruner(monkeypatch, tmp_path):
    real = trial_loop.train

    def absurd_lr_for_adamw_attention(config, assignment, callback=None, out_dir=None, **kw):
        if assignment.resolve()["attn_qkv"] == "adamw":
            config = dataclasses.replace(config, lr=10.0)  # AdamW step 10: logits explode
        return real(config, assignment, callback=callback, out_dir=out_dir, **kw)

    use_train(monkeypatch, absurd_lr_for_adamw_attention)
    search(make_space({"attn": ["adamw", "oblique"], "mlp": ["adamw"]}), tmp_path)
    by_attn = {t.params["geometry.attn"]: t for t in trials_of(tmp_path)}
    pruned = by_attn["adamw"]
    assert pruned.state == TrialState.PRUNED
    assert pruned.user_attrs["prune_reason"].startswith("max logit") and pruned.user_attrs["stop_step"] == 5
    assert by_attn["oblique"].state == TrialState.COMPLETE


# --------------------------------------------------------------------------- failures and retries
def _first_call_raises(error):
    """A FakeTrain whose first run raises ``error``, every later one trains."""
    f = FakeTrain(raises=lambda key, seed: error if len(f.calls) == 1 else None)
    return f


def _verdicts(tmp_path):
    """``{point: [status of each trial with a verdict or a retry]}``."""
    out = {}
    for t in trials_of(tmp_path):
        out.setdefault(t.params["geometry.attn"], []).append(t.user_attrs["status"])
    return out


@pytest.mark.slow
def test_an_environment_failure_is_retried_and_every_point_completes_once(monkeypatch, tmp_path):
    f = use_train(monkeypatch, _first_call_raises(
        torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")))
    out = search(make_space(), tmp_path)
    assert out.counts == {"completed": 2, "retried": 1} and len(f.calls) == 3
    assert out.stopped == "every assignment of the space has been tried"
    trials = trials_of(tmp_path)
    retried = next(t for t in trials if t.user_attrs["status"] == "retried")
    assert retried.user_attrs["failure_kind"] == "environment" and retried.user_attrs["retries"] == 0
    assert "retry 1 of 2 queued" in retried.user_attrs["fail_reason"]
    rerun = next(t for t in trials if t.user_attrs.get("retry_of") == retried.number)
    assert rerun.state == TrialState.COMPLETE and rerun.params == retried.params
    # each point completed exactly once, and the budget (both points) is met
    assert sorted(_verdicts(tmp_path).values()) == [["completed"], ["retried", "completed"]]
    assert search(make_space(), tmp_path).counts == out.counts and len(f.calls) == 3  # done


@pytest.mark.slow
def test_an_environment_failure_the_trainer_caught_is_retried_too(monkeypatch, tmp_path):
    fake = FakeTrain()

    def oom_inside_the_loop(config, assignment, **kw):
        if not fake.calls:  # the trainer turns an exception of its loop into a failed run
            fake.calls.append(("oom", config.seed))
            return TrainResult("failed", "OutOfMemoryError: CUDA out of memory", 3, None, None,
                               [], 1.0, 1e3, {})
        return fake(config, assignment, **kw)

    use_train(monkeypatch, oom_inside_the_loop)
    out = search(make_space(), tmp_path)
    assert out.counts == {"completed": 2, "retried": 1}


@pytest.mark.slow
def test_an_environment_failure_stays_failed_after_its_retries(monkeypatch, tmp_path):
    use_train(monkeypatch, FakeTrain(raises=lambda key, seed: MemoryError() if "euclidean" in key else None))
    out = search(make_space(), tmp_path)
    assert out.counts == {"completed": 1, "retried": 2, "failed": 1}  # the failure counts once
    statuses = _verdicts(tmp_path)["euclidean"]
    assert statuses == ["retried", "retried", "failed"]
    last = next(t for t in trials_of(tmp_path) if t.user_attrs["status"] == "failed")
    assert last.user_attrs["fail_reason"] == "MemoryError:  (a failure of the environment; retried 2 times)"
    assert last.user_attrs["retries"] == 2


@pytest.mark.slow
def test_max_retries_0_retries_nothing(monkeypatch, tmp_path):
    f = use_train(monkeypatch, _first_call_raises(OSError(28, "No space left on device")))
    out = search(make_space(), tmp_path, max_retries=0)
    assert out.counts == {"completed": 1, "failed": 1} and len(f.calls) == 2
    failed = next(t for t in trials_of(tmp_path) if t.state == TrialState.FAIL)
    assert failed.user_attrs["failure_kind"] == "environment"
    assert failed.user_attrs["fail_reason"].endswith("(a failure of the environment; not retried: "
                                                    "--max-retries 0)")


@pytest.mark.slow
def test_an_assignment_failure_is_not_retried(monkeypatch, tmp_path):
    f = use_train(monkeypatch, FakeTrain(
        raises=lambda key, seed: ValueError("bad shape") if "euclidean" in key else None))
    out = search(make_space(), tmp_path)
    assert out.counts == {"completed": 1, "failed": 1} and len(f.calls) == 2
    failed = next(t for t in trials_of(tmp_path) if t.state == TrialState.FAIL)
    assert failed.user_attrs["failure_kind"] == "assignment"
    assert failed.user_attrs["fail_reason"] == "ValueError: bad shape"


@pytest.mark.slow
def test_a_settings_error_in_a_trial_stops_the_search_and_leaves_its_point_queued(monkeypatch, tmp_path,
                                                                                 capsys):
    # What the preflight cannot see (a setting that goes bad mid-search: here the real
    # trainer given 3 micro-batches of a batch of 2) fails every trial alike: it is the
    # run's failure, not the point's.
    real, fake = trial_loop.train, FakeTrain()

    def second_run_refused(config, assignment, **kw):
        if fake.calls:
            return real(dataclasses.replace(config, grad_accum=3), assignment, **kw)
        return fake(config, assignment, **kw)

    use_train(monkeypatch, second_run_refused)
    path = tmp_path / "space.yaml"
    path.write_text(yaml.safe_dump(make_space().to_dict()), encoding="utf-8")
    command = ["search", "--space", str(path), "--runs-dir", str(tmp_path / "runs")]
    # Rule: the search stops with one line, exit 2, naming the space's key.
    assert main(command) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        f"geosearch search: error: {path}: proxy.grad_accum: global batch 2 does not split over 1 "
        "process x 3 micro-batches; expected one of: 1, 2; every trial would fail alike, so the "
        "search stops: trial 1 is not counted and its point is queued again")
    # Rule: the trial is not the point's verdict: interrupted, kind "settings", no retry used,
    # nothing counted; its point waits in the queue.
    study = open_run_study(tmp_path / "runs" / "t")
    stopped = next(t for t in study.get_trials() if t.state == TrialState.FAIL)
    assert stopped.user_attrs["status"] == "interrupted" and stopped.user_attrs["failure_kind"] == "settings"
    assert stopped.user_attrs["fail_reason"].startswith("interrupted: the run's settings fail every trial (")
    queued = study.get_trials(states=(TrialState.WAITING,))
    assert len(queued) == 1 and queued[0].user_attrs["retry_of"] == stopped.number
    assert queued[0].user_attrs["queued_params"] == stopped.params and done_count(study) == 1
    # ... so the corrected rerun trains it, and the budget counts each point once.
    fixed = use_train(monkeypatch, FakeTrain())
    assert main(command) == 0
    assert len(fixed.calls) == 1 and done_count(open_run_study(tmp_path / "runs" / "t")) == 2
    assert sorted(_verdicts(tmp_path).values()) == [["completed"], ["interrupted", "completed"]]


@pytest.mark.slow
def test_retry_failed_runs_the_failed_points_again_once(monkeypatch, tmp_path):
    broken = FakeTrain(raises=lambda key, seed: ValueError("bad") if "euclidean" in key else None)
    use_train(monkeypatch, broken)
    search(make_space(), tmp_path)
    failed = next(t for t in trials_of(tmp_path) if t.state == TrialState.FAIL)
    fixed = use_train(monkeypatch, FakeTrain())
    assert search(make_space(), tmp_path).counts == {"completed": 1, "failed": 1}
    assert fixed.calls == []  # a plain rerun leaves the failed point alone
    out = search(make_space(), tmp_path, retry_failed=True)
    assert fixed.calls == [("attn=euclidean,mlp=adamw", 0)]
    assert out.counts == {"completed": 2, "failed": 1}
    rerun = next(t for t in trials_of(tmp_path) if t.user_attrs.get("retry_of") == failed.number)
    assert rerun.state == TrialState.COMPLETE and rerun.params == failed.params
    assert done_count(open_run_study(tmp_path / "runs" / "t")) == 2  # the point counts once
    search(make_space(), tmp_path, retry_failed=True)  # nothing failed is left to run
    assert len(fixed.calls) == 1


# The user attrs as a person meets them: optuna-dashboard's trial page lists one per row
# (name, JSON value), `optuna best-trial -f yaml` one per line. A row within the project's
# 100 columns fits beside the page's other panes; 30 rows fit one screen of a terminal or a
# browser. The assignment is the exception: one `type: geometry` pair per module type of the
# model (4 here, 7 for Llama), so its width is the model's: each pair within 30 columns.
# Optuna's table form (`optuna best-trial`'s default) puts all of the best trial's attrs
# into one cell of one row, beside ~175 fixed columns (number, value, times, params): it
# fits no screen, but it is kept from growing: no attr repeats another stored value (the
# mean of val_losses is the value; the peak max logit is probes.json's); prune_reason and
# stop_step are left out when None. Here it is 928 columns
# (the lock's path and the host counted out), 1,112 before those went; the bound leaves
# room for longer floats and pids.
ATTR_COLUMNS, ATTR_ROWS, BEST_TRIAL_COLUMNS = 100, 30, 960


@pytest.mark.slow
def test_a_trials_user_attrs_fit_a_screen_one_row_each(tmp_path, monkeypatch, capsys):
    # a real tiny search (real floats, speeds, a stability rung and a baseline), not a fake
    space = make_space({"attn": ["euclidean"], "mlp": ["adamw"]}, target={"steps": 40},
                       ladder={"rungs": 1, "stability_steps": 10}, baselines=["muon"])
    out = search(space, tmp_path)
    assert out.counts == {"completed": 2}  # the point and the baseline
    run = tmp_path / "runs" / "t"
    for t in trials_of(tmp_path):
        ua = dict(t.user_attrs)
        # the lock file's absolute path is as long as the run directory's: shown relative
        ua["worker"] = {**ua["worker"], "lock": str(Path(ua["worker"]["lock"]).relative_to(run))}
        pairs = [f"{k}: {json.dumps(v)}" for k, v in ua.pop("assignment").items()]
        rows = [f"{k}: {json.dumps(v)}" for k, v in sorted(ua.items())]
        assert len(rows) + 1 <= ATTR_ROWS and max(map(len, rows)) <= ATTR_COLUMNS, (t.number, rows)
        assert len(pairs) == 4 and max(map(len, pairs)) <= 30, pairs
        # the probe histories live in the trial's files, read back whole
        held = read_probes_file(run, t)
        assert held["probe_history"] and held["probe_history"][-1]["sigma_max"]
    # Optuna's own CLI formats the table; the lock's absolute path and the host name are
    # the machine's, counted out
    monkeypatch.setattr(sys, "argv", ["optuna", "best-trial", "--study-name", "t",
                                      "--storage", f"sqlite:///{run / 'study.db'}"])
    capsys.readouterr()
    assert optuna.cli.main() == 0
    table = capsys.readouterr().out.splitlines()
    worker = open_run_study(run).best_trial.user_attrs["worker"]
    own = len(repr(worker["lock"])) + len(repr(worker["host"]))
    assert max(map(len, table)) - own <= BEST_TRIAL_COLUMNS, table
