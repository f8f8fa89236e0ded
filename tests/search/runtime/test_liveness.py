"""Stale trials across machines: heartbeats, the lock-file fast path, and lost trials.

A RUNNING trial's worker is judged by its lock file when that file is on this machine, by
its ``heartbeat`` attr otherwise (another host, or a host of the same name that does not
share this disk). ``train`` is replaced by a fake here (milliseconds per trial); the
PostgreSQL test (tests/search/runtime/test_postgres.py) kills a real worker.
"""

from __future__ import annotations

import io
import os
import re
import socket
import threading
import time
from pathlib import Path

import optuna
import pytest
from _search_helpers import make_space, trials_of, use_train
from optuna.trial import TrialState

from geosearch.util.errors import GeosearchError
from geosearch.proxy.config import TrainResult
from geosearch.search.runtime import liveness
from geosearch.search.study import failures as recovery
from geosearch.search.runtime.storage import open_storage
from geosearch.search.runtime.storage import open_run_study
from geosearch.search.study.run import run_search

optuna.logging.set_verbosity(optuna.logging.WARNING)

ADAMW = {"geometry.attn": "adamw", "geometry.mlp": "adamw"}
EUCLIDEAN = {"geometry.attn": "euclidean", "geometry.mlp": "adamw"}


def fake_train(config, assignment, callback=None, out_dir=None, **kw):
    """Two records (steps 5, 10) with a val loss that depends on the attention geometry."""
    loss = 3.0 if assignment.resolve()["attn_qkv"] == "adamw" else 3.1
    history = []
    for step in (5, 10):
        m = {"step": step, "train_loss": loss, "val_loss": loss, "max_logit": 1.0, "min_entropy": 1.0}
        history.append(m)
        if callback is not None:
            callback(step, m)
    return TrainResult("completed", None, None, loss, loss, history, 1.0, 1e3, {})


def search(tmp_path, space, **kw):
    out = io.StringIO()
    outcome = run_search(space, runs_dir=tmp_path / "runs", out=out, progress=False, **kw)
    return outcome, out.getvalue()


@pytest.fixture
def one_done(monkeypatch, tmp_path):
    """A study with one of its two points done: ``(done params, params left)``."""
    use_train(monkeypatch, fake_train)
    search(tmp_path, make_space(sampler="grid", budget={"trials": 1}))
    done = [t.params for t in open_run_study(tmp_path / "runs" / "t").get_trials()
            if t.state == TrialState.COMPLETE]
    assert len(done) == 1
    return done[0], next(p for p in (ADAMW, EUCLIDEAN) if p != done[0])


@pytest.mark.slow
def test_trial_of_a_dead_worker_is_failed_and_its_point_run_again(fake, tmp_path, running_trial):
    space = make_space(sampler="random", budget={"trials": 2})
    search(tmp_path, make_space(sampler="random", budget={"trials": 1}))
    done = {c[0] for c in fake.calls}
    params = {"geometry.attn": "euclidean" if "attn=adamw,mlp=adamw" in done else "adamw", "geometry.mlp": "adamw"}
    lock = tmp_path / "dead.lock"
    lock.touch()  # a killed worker leaves its lock file behind, no longer locked
    dead = {"host": socket.gethostname(), "pid": 999999, "lock": str(lock)}
    n = running_trial(tmp_path, params, dead)
    out, _ = search(tmp_path, space)
    trials = {t.number: t for t in trials_of(tmp_path)}
    assert trials[n].state == TrialState.FAIL  # the dead worker's trial
    retry = [t for t in trials.values() if t.user_attrs.get("retry_of") == n]
    assert len(retry) == 1 and retry[0].state == TrialState.COMPLETE and retry[0].params == params
    assert out.counts["completed"] == 2  # budget: the dead trial did not count



@pytest.mark.slow
def test_a_dead_trial_whose_worker_queued_its_retry_before_dying_is_queued_once(fake, tmp_path, running_trial):
    # TrialLoop._fail queues a retried point before it tells: a worker killed in between
    # leaves a RUNNING trial whose retry is already queued; the next run fails it, once
    from geosearch.search.study.queue import enqueue

    search(tmp_path, make_space(sampler="random", budget={"trials": 1}))
    done = {c[0] for c in fake.calls}
    params = {"geometry.attn": "euclidean" if "attn=adamw,mlp=adamw" in done else "adamw", "geometry.mlp": "adamw"}
    lock = tmp_path / "dead.lock"
    lock.touch()
    n = running_trial(tmp_path, params, {"host": socket.gethostname(), "pid": 999999, "lock": str(lock)})
    enqueue(open_run_study(tmp_path / "runs" / "t"), params, retry_of=n)
    out, printed = search(tmp_path, make_space(sampler="random", budget={"trials": 2}))
    assert f"trial {n}" in printed and "its point was already queued again" in printed
    trials = trials_of(tmp_path)
    assert next(t for t in trials if t.number == n).state == TrialState.FAIL
    retry = [t for t in trials if t.user_attrs.get("retry_of") == n]
    assert len(retry) == 1 and retry[0].state == TrialState.COMPLETE and retry[0].params == params
    assert out.counts["completed"] == 2

@pytest.mark.slow
@pytest.mark.skipif(os.name != "posix", reason="worker locks are POSIX flocks")
def test_trial_of_a_live_worker_is_left_alone_and_holds_its_budget_slot(fake, tmp_path, running_trial):
    import fcntl

    search(tmp_path, make_space(sampler="random", budget={"trials": 1}))
    lock = tmp_path / "alive.lock"
    fd = os.open(lock, os.O_CREAT | os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX)  # a live worker holds its lock
    try:
        live = {"host": socket.gethostname(), "pid": 1, "lock": str(lock)}
        n = running_trial(tmp_path, {"geometry.attn": "adamw", "geometry.mlp": "adamw"}, live)
        calls = len(fake.calls)
        out, _ = search(tmp_path, make_space(sampler="random", budget={"trials": 2}))
        assert len(fake.calls) == calls  # 1 done + 1 running = the budget of 2
        assert "still running elsewhere" in out.stopped
        assert next(t for t in trials_of(tmp_path) if t.number == n).state == TrialState.RUNNING
    finally:
        os.close(fd)


@pytest.mark.slow
def test_a_trial_whose_lock_is_not_here_is_judged_by_its_heartbeat(one_done, tmp_path, running_trial):
    done, left = one_done
    # the point left: its worker on another machine stopped beating 60 s ago
    stale = running_trial(tmp_path, left, {"host": "elsewhere", "pid": 1, "lock": "/elsewhere/w.lock"},
                          heartbeat=time.time() - 60)
    # the done point again, by a live worker on a machine of the same name: its lock file
    # is on its own disk, so only its fresh heartbeat tells
    live = running_trial(tmp_path, done, {"host": socket.gethostname(), "pid": 2,
                                          "lock": str(tmp_path / "on-another-disk.lock")},
                         heartbeat=time.time())
    # budget 3: 1 done + 1 live + the retry of the stale one
    outcome, printed = search(tmp_path, make_space(sampler="random", budget={"trials": 3}), stale_after=30)
    trials = {t.number: t for t in open_run_study(tmp_path / "runs" / "t").get_trials()}
    # the stale trial: failed, the reason printed, its point queued again and completed
    assert re.search(rf"trial {stale} was left running by a worker that died \(no heartbeat from "
                     r"elsewhere for (59|6\d) s\): marked failed and queued again", printed), printed
    assert trials[stale].state == TrialState.FAIL and outcome.counts["interrupted"] == 1
    retry = [t for t in trials.values() if t.user_attrs.get("retry_of") == stale]
    assert len(retry) == 1 and retry[0].state == TrialState.COMPLETE and retry[0].params == left
    # the live one is left alone: a missing lock file is not taken as a dead worker
    assert trials[live].state == TrialState.RUNNING
    assert "still running elsewhere" in outcome.stopped


@pytest.mark.slow
def test_a_fresh_heartbeat_of_another_host_keeps_its_trial(one_done, tmp_path, running_trial):
    n = running_trial(tmp_path, one_done[1], {"host": "elsewhere", "pid": 1, "lock": "/elsewhere/w.lock"},
                      heartbeat=time.time() - 20)
    outcome, printed = search(tmp_path, make_space(sampler="grid"), stale_after=30)  # 20 s < 30 s
    assert "left running" not in printed
    assert open_run_study(tmp_path / "runs" / "t").get_trials()[n].state == TrialState.RUNNING
    assert "(1 still running elsewhere)" in outcome.stopped


@pytest.mark.slow
def test_the_heartbeat_thread_keeps_a_long_trial_alive(monkeypatch, tmp_path):
    # a proxy run with no record for 2 s while stale_after is 1 s: only the thread's
    # heartbeats (every 0.25 s) keep it from being taken for dead
    beats, verdicts = [], []

    def slow_train(config, assignment, callback=None, out_dir=None, **kw):
        study = open_run_study(tmp_path / "runs" / "t")
        for _ in range(20):
            time.sleep(0.1)
            t = next(t for t in study.get_trials() if t.state == TrialState.RUNNING)
            beats.append(t.user_attrs["heartbeat"])
            with monkeypatch.context() as m:  # what a worker on another host concludes now
                m.setattr(socket, "gethostname", lambda: "another-host")
                verdicts.append(liveness.dead_reason(t, 1.0))
        return fake_train(config, assignment, callback, out_dir)

    use_train(monkeypatch, slow_train)
    outcome, _ = search(tmp_path, make_space(sampler="grid", budget={"trials": 1}), stale_after=1.0)
    assert outcome.counts == {"completed": 1}
    assert verdicts == [None] * 20  # never taken for dead
    assert len(set(beats)) >= 5  # the heartbeat moved while the run made no record


@pytest.mark.slow
def test_a_trial_taken_for_dead_by_another_worker_is_dropped_and_run_again(monkeypatch, tmp_path):
    calls = []

    def train_then_lose_it(config, assignment, callback=None, out_dir=None, **kw):
        calls.append(assignment.resolve()["attn_qkv"])
        if len(calls) == 1:
            # another worker, seeing no heartbeat for too long, fails this trial and queues
            # its point again, as recover_stale does
            study = open_run_study(tmp_path / "runs" / "t")
            t = next(t for t in study.get_trials() if t.state == TrialState.RUNNING)
            study.tell(t.number, state=TrialState.FAIL)
            study.enqueue_trial(dict(t.params), user_attrs={"queued": True, "queued_params": dict(t.params),
                                                            "retry_of": t.number})
        return fake_train(config, assignment, callback, out_dir)

    use_train(monkeypatch, train_then_lose_it)
    outcome, printed = search(tmp_path, make_space(sampler="grid"))
    # the first trial's report was refused: this worker dropped it and went on
    assert "trial 0 was taken for dead by another worker" in printed and "this worker drops it" in printed
    trials = open_run_study(tmp_path / "runs" / "t").get_trials()
    assert trials[0].state == TrialState.FAIL and trials[0].user_attrs["status"] == "running"
    complete = [t for t in trials if t.state == TrialState.COMPLETE]
    # each point completed once, the lost one by its retry; the loss is not a failure
    assert sorted(t.params["geometry.attn"] for t in complete) == ["adamw", "euclidean"]
    assert any(t.user_attrs.get("retry_of") == 0 for t in complete)
    assert outcome.counts == {"completed": 2, "interrupted": 1} and len(calls) == 3


# --------------------------------------------------------------------------- exit paths
def _child(code: str, **env: str):
    import subprocess
    import sys

    return subprocess.Popen([sys.executable, "-c", code], env={**os.environ, **env},
                            stdout=subprocess.PIPE, text=True)


HOLD = ("import sys, time; from pathlib import Path; from geosearch.search.runtime.liveness import Owner; "
        "o = Owner(Path(sys.argv[1]) if len(sys.argv) > 1 else Path({run!r})); print(o.pid, flush=True); "
        "time.sleep(60)")


@pytest.mark.slow
@pytest.mark.skipif(os.name != "posix", reason="worker locks are POSIX flocks")
def test_a_lock_outlives_its_process_so_its_trial_is_dead_at_once(fake, tmp_path, running_trial):
    """A process that ends by an exception (disk full) cannot tell its trial's outcome: its
    lock file stays, released, and the next run takes the trial for dead at once, not after
    ``stale_after``; lock files no RUNNING trial names are removed."""
    search(tmp_path, make_space(sampler="random", budget={"trials": 1}))
    run_dir = tmp_path / "runs" / "t"
    crashed = liveness.Owner(run_dir)
    n = running_trial(tmp_path, {"geometry.attn": "euclidean", "geometry.mlp": "adamw"}, crashed.attr())
    idle = liveness.Owner(run_dir)
    crashed.close()  # the crash's way out
    idle.close()
    assert Path(crashed.lock).exists() and Path(idle.lock).exists()
    study = open_run_study(run_dir)
    reader = liveness.Owner(run_dir)
    try:
        recovered = recovery.recover_stale(study, reader, stale_after=300)
    finally:
        reader.close()
    host = socket.gethostname()
    assert [r[:2] for r in recovered] == [(n, f"its lock on {host} is released")]
    assert recovered[0].outcome == "marked failed and queued again (retry 1 of 2)"
    assert not Path(crashed.lock).exists() and not Path(idle.lock).exists()  # named by no RUNNING trial
    assert Path(reader.lock).exists()  # released just now; the next recovery removes it


@pytest.mark.skipif(os.name != "posix", reason="worker locks are POSIX flocks")
def test_a_run_of_a_study_live_on_this_machine_is_refused(tmp_path):
    run_dir = tmp_path / "runs" / "t"
    run_dir.mkdir(parents=True)
    liveness.check_no_other_run(run_dir, "t")  # nobody: fine
    proc = _child(HOLD.format(run=str(run_dir)))
    try:
        pid = int(proc.stdout.readline())
        with pytest.raises(GeosearchError, match=rf"study 't' in .* is being run by another process on "
                                                 rf"this machine \(pid {pid}\): wait for it to finish, "
                                                 rf"or stop it \(kill {pid}\), then rerun"):
            liveness.check_no_other_run(run_dir, "t")
    finally:
        proc.kill()
        proc.wait()
    liveness.check_no_other_run(run_dir, "t")  # its lock went with it


@pytest.mark.slow
@pytest.mark.skipif(os.name != "posix", reason="worker locks are POSIX flocks")
def test_workers_whose_parent_died_are_waited_for_then_refused(tmp_path):
    run_dir = tmp_path / "runs" / "t"
    run_dir.mkdir(parents=True)
    dead = _child("pass")
    dead.wait()  # a parent pid that no longer runs
    orphan = _child(HOLD.format(run=str(run_dir)), **{liveness.PARENT_ENV: str(dead.pid)})
    said = []
    try:
        pid = int(orphan.stdout.readline())
        start = time.monotonic()
        with pytest.raises(GeosearchError, match=rf"workers of an earlier run whose parent died are "
                                                 rf"still running \(pids {pid}\); stop them"):
            liveness.check_no_other_run(run_dir, "t", said.append, wait=1.0)
        assert time.monotonic() - start >= 1.0 and len(said) == 1 and "whose parent died" in said[0]
        threading.Timer(0.5, orphan.kill).start()  # it stops while the next run waits: that run goes ahead
        liveness.check_no_other_run(run_dir, "t", said.append, wait=30.0)
    finally:
        orphan.kill()
        orphan.wait()


@pytest.mark.skipif(os.name != "posix", reason="ask records live in POSIX lock files")
def test_a_trial_whose_asker_failed_before_signing_it_is_run_again_at_once(monkeypatch, tmp_path):
    """A connection dropped inside ask(), after the storage started the trial: the trial is
    RUNNING with no worker. On a shared --storage another machine may have just asked it,
    but the ask record of this machine names the window it was asked in: the rerun fails
    it at once (no 120 s grace) and runs its point; another machine's new trial is kept."""
    use_train(monkeypatch, fake_train)
    shared = str(tmp_path / "shared.log")  # not the run directory's own: others may share it
    search(tmp_path, make_space(sampler="grid", budget={"trials": 1}), storage=shared)
    run_dir = tmp_path / "runs" / "t"
    study = optuna.load_study(study_name="t", storage=open_storage(run_dir, shared)[0])
    study.enqueue_trial(EUCLIDEAN, user_attrs={"queued": True, "queued_params": EUCLIDEAN})
    real_ask = study.ask

    def ask_then_drop(*args, **kwargs):
        real_ask(*args, **kwargs)  # the storage started it; the answer never came
        raise optuna.exceptions.StorageInternalError("server closed the connection")

    monkeypatch.setattr(study, "ask", ask_then_drop)
    asker = liveness.Owner(run_dir)
    with pytest.raises(optuna.exceptions.StorageInternalError):
        asker.ask(study)
    asker.close()
    monkeypatch.setattr(study, "ask", real_ask)
    elsewhere = study.ask()  # another machine's trial, between its ask() and its first attr
    [lost] = [t for t in study.get_trials(states=(TrialState.RUNNING,)) if t.number != elsewhere.number]
    assert "worker" not in lost.user_attrs
    reader = liveness.Owner(run_dir)
    try:
        recovered = recovery.recover_stale(study, reader, stale_after=300)
        assert recovery.recover_stale(study, reader, stale_after=300) == []  # the record is used once
    finally:
        reader.close()
    assert [r[:2] for r in recovered] == [(lost.number, "a process on this machine died or failed while it asked for it")]
    assert recovered[0].outcome == "marked failed and queued again"  # not a death while training
    by_number = {t.number: t for t in study.get_trials()}
    assert by_number[elsewhere.number].state == TrialState.RUNNING
    assert [t.user_attrs["queued_params"] for t in by_number.values() if t.state == TrialState.WAITING] \
        == [EUCLIDEAN]


def _train_then_die(study, dead, *, ctrl_c=False):
    """Pop the queued rerun of the point and leave it as its worker does: dying while it
    trains (``status: running``, the worker's lock released) or, with ``ctrl_c``, stopped
    by a Ctrl-C it recorded itself (``status: interrupted``, told FAIL, queued again)."""
    trial = study.ask()
    trial.suggest_categorical("geometry.attn", ["adamw", "euclidean"])
    trial.suggest_categorical("geometry.mlp", ["adamw"])
    trial.set_user_attr("worker", dead)
    trial.set_user_attr("status", "running")
    if ctrl_c:
        trial.set_user_attr("status", "interrupted")
        study.tell(trial, state=TrialState.FAIL)
        study.enqueue_trial(trial.params, user_attrs={"queued": True, "queued_params": trial.params,
                                                      "retry_of": trial.number})
    return trial.number


def _recover(run_dir, max_retries):
    reader = liveness.Owner(run_dir)
    try:
        return recovery.recover_stale(open_run_study(run_dir), reader, 300, max_retries)
    finally:
        reader.close()


@pytest.mark.slow
@pytest.mark.skipif(os.name != "posix", reason="worker locks are POSIX flocks")
def test_a_point_whose_worker_dies_max_retries_plus_one_times_stays_failed_and_counts(
        one_done, tmp_path, running_trial):
    """A point whose training kills its worker (the OOM killer) is an environment failure:
    queued again twice (--max-retries 2), then failed for good, counted once in the budget;
    a Ctrl-C in the row uses up no retry; --retry-failed queues it again with full retries."""
    from geosearch.search.study.failures import earlier_retries, requeue_failed
    from geosearch.search.study.queue import done_count
    from geosearch.search.records import trial_status

    left = one_done[1]
    run_dir = tmp_path / "runs" / "t"
    lock = tmp_path / "dead.lock"
    lock.touch()  # released: its process is gone
    dead = {"host": socket.gethostname(), "pid": 999999, "lock": str(lock)}
    study = open_run_study(run_dir)
    assert done_count(study) == 1
    first = running_trial(tmp_path, left, dead)
    outcomes = [_recover(run_dir, 2)]
    _train_then_die(study, dead, ctrl_c=True)  # a Ctrl-C of the rerun: no retry used
    second = _train_then_die(study, dead)
    outcomes.append(_recover(run_dir, 2))
    third = _train_then_die(study, dead)
    outcomes.append(_recover(run_dir, 2))
    assert [[(r.number, r.outcome.split(";")[0]) for r in rs] for rs in outcomes] == [
        [(first, "marked failed and queued again (retry 1 of 2)")],
        [(second, "marked failed and queued again (retry 2 of 2)")],
        [(third, "marked failed")]]
    reason = ("its worker died 3 times while training this point (killed, crashed or out of "
              "memory); rerun with --retry-failed to try again")
    assert outcomes[-1][0].outcome == f"marked failed; its point stays failed: {reason}"
    assert recovery.recovered_line(*outcomes[-1][0]).endswith(f"its point stays failed: {reason}")
    trials = open_run_study(run_dir).get_trials()
    assert not [t for t in trials if t.state in (TrialState.WAITING, TrialState.RUNNING)]
    [verdict] = [t for t in trials if trial_status(t) == "failed"]
    assert verdict.params == left and verdict.user_attrs["retry_of"] == third
    assert verdict.user_attrs["fail_reason"] == reason
    assert (verdict.user_attrs["failure_kind"], verdict.user_attrs["retries"]) == ("environment", 2)
    assert [trial_status(t) for t in trials if t.number in (first, second, third)] == ["interrupted"] * 3
    assert done_count(open_run_study(run_dir)) == 2  # the failed point counts, once
    assert requeue_failed(open_run_study(run_dir)) == [verdict.number]
    [rerun] = open_run_study(run_dir).get_trials(states=(TrialState.WAITING,))
    assert earlier_retries(open_run_study(run_dir), rerun) == 0  # a full --max-retries again


@pytest.mark.slow
@pytest.mark.skipif(os.name != "posix", reason="worker locks are POSIX flocks")
def test_max_retries_reaches_the_recovery_at_the_start_of_a_search(one_done, tmp_path, running_trial):
    """``run_search(max_retries=0)``: the dead worker's point is not run again; it is
    failed, counts towards the budget, and the search says why."""
    lock = tmp_path / "dead.lock"
    lock.touch()
    n = running_trial(tmp_path, one_done[1], {"host": socket.gethostname(), "pid": 999999,
                                            "lock": str(lock)})
    outcome, printed = search(tmp_path, make_space(sampler="grid", budget={"trials": 2}), max_retries=0)
    assert outcome.stopped == "every assignment of the space has been tried"  # 1 completed, 1 failed
    assert outcome.counts.get("completed") == 1  # the dead worker's point was not run again
    assert re.search(rf"trial {n} was left running by a worker that died \(its lock on .* is "
                     r"released\): marked failed; its point stays failed: its worker died once "
                     r"while training this point \(killed, crashed or out of memory\); not "
                     r"retried: --max-retries 0; rerun with --retry-failed", printed), printed
    assert outcome.counts["failed"] == 1 and outcome.counts["interrupted"] == 1
