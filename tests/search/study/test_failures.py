"""Tests of geosearch.search.study.failures: environment, settings or assignment, retries, --retry-failed.

The retries in a whole search (the trial loop queueing a point again) are tested in
test_trial_loop.py; here the classification and the bookkeeping on hand-made trials.
"""

from __future__ import annotations

import errno

import optuna
import pytest
import sqlalchemy.exc
import torch
from optuna.trial import TrialState, create_trial

from geosearch.util.errors import ConfigError, SettingsError
from geosearch.search.study.failures import (
    ASSIGNMENT_FAILURE,
    ENVIRONMENT_FAILURE,
    SETTINGS_FAILURE,
    earlier_retries,
    failed_attrs,
    failure_kind,
    requeue_failed,
    settle_dead,
    worker_died,
)
from geosearch.search.study.queue import done_count, twin_of

optuna.logging.set_verbosity(optuna.logging.WARNING)

ENV, ASSIGN = ENVIRONMENT_FAILURE, ASSIGNMENT_FAILURE


@pytest.mark.parametrize(("error", "kind"), [
    (torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"), ENV),
    (RuntimeError("CUDA error: an illegal memory access was encountered"), ENV),
    (RuntimeError("NCCL communicator was aborted on rank 1"), ENV),
    (MemoryError(), ENV),
    (OSError(errno.ENOSPC, "No space left on device"), ENV),
    (sqlalchemy.exc.OperationalError("INSERT ...", {}, Exception("database is locked")), ENV),
    (optuna.exceptions.StorageInternalError("connection dropped"), ENV),
    (ConnectionResetError(errno.ECONNRESET, "reset by peer"), ENV),
    # the assignment's own: a setting, the model, a missing path, a deterministic assert
    (ConfigError("must be positive", source="TrainConfig", key="lr"), ASSIGN),
    (ValueError("expected a finite spectral_lr"), ASSIGN),
    (RuntimeError("boom"), ASSIGN),
    (FileNotFoundError(errno.ENOENT, "No such file", "data.txt"), ASSIGN),
    (RuntimeError("CUDA error: device-side assert triggered"), ASSIGN),
    (ZeroDivisionError("division by zero"), ASSIGN),
])
def test_failure_kind_of_an_exception(error, kind):
    assert failure_kind(error) == kind


def _raised(error, cause):
    try:
        raise error from cause
    except Exception as e:  # noqa: BLE001 - the exception with its cause, as a trial sees it
        return e


def test_a_settings_error_is_the_runs_failure_unless_the_environment_caused_it():
    # Rule: what the trainer refuses whatever the assignment is the run's settings' failure.
    assert failure_kind(SettingsError("global batch 4 does not split", key="grad_accum")) == SETTINGS_FAILURE
    assert failure_kind("SettingsError: TrainConfig: log_with: unknown tracker 'x'") == SETTINGS_FAILURE
    # Rule: a settings error that wraps a failure of the environment (a model factory out of
    # memory, said as a ConfigError, then as the data's or model's settings error) is that.
    factory = _raised(ConfigError("model 'py:m:f': f() raised MemoryError"), MemoryError())
    assert failure_kind(_raised(SettingsError.of(factory), factory)) == ENVIRONMENT_FAILURE
    wrapped = _raised(ConfigError("model 'py:m:f': f() raised ValueError: bad"), ValueError("bad"))
    assert failure_kind(_raised(SettingsError.of(wrapped), wrapped)) == SETTINGS_FAILURE
    # ... while a plain ConfigError stays the assignment's, as before
    assert failure_kind(factory) == ASSIGNMENT_FAILURE


@pytest.mark.parametrize(("reason", "kind"), [
    # the trainer keeps "TypeName: message" of an exception it caught in its loop
    ("OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB", ENV),
    ("torch.OutOfMemoryError: oh no", ENV),
    ("OSError: [Errno 28] No space left on device", ENV),
    ("RuntimeError: cuDNN error: CUDNN_STATUS_INTERNAL_ERROR", ENV),
    ("ValueError: not enough values to unpack", ASSIGN),
    ("RuntimeError: mat1 and mat2 shapes cannot be multiplied", ASSIGN),
    ("failed", ASSIGN),
])
def test_failure_kind_of_a_recorded_reason(reason, kind):
    assert failure_kind(reason) == kind


def _study(*trials):
    study = optuna.create_study()
    for t in trials:
        study.add_trial(t)
    return study


def _fail(point, status, **attrs):
    return create_trial(state=TrialState.FAIL, params={"geometry.attn": point},
                        distributions={"geometry.attn": optuna.distributions.CategoricalDistribution(
                            ["adamw", "oblique"])},
                        user_attrs={"status": status, **attrs})


def test_earlier_retries_count_the_retried_trials_in_a_row_and_pass_over_interruptions():
    study = _study(
        _fail("adamw", "retried"),                               # 0: out of memory
        _fail("adamw", "interrupted", retry_of=0),               # 1: Ctrl-C during the retry
        _fail("adamw", "retried", retry_of=1),                   # 2: out of memory again
        _fail("adamw", "failed", retry_of=2),                    # 3: failed for good
        _fail("adamw", "retried", retry_of=3),                   # 4: --retry-failed's rerun
    )
    trials = study.get_trials()
    assert [earlier_retries(study, t) for t in trials] == [0, 1, 1, 2, 0]
    new = create_trial(state=TrialState.FAIL, user_attrs={"retry_of": 4})
    new.number = 5
    assert earlier_retries(study, new) == 1  # the failed trial 3 ends the row


def test_a_dead_worker_counts_as_an_environment_failure_and_a_ctrl_c_does_not():
    # a dead worker leaves the status it trained under; a Ctrl-C is recorded by the process
    reason = {"fail_reason": "interrupted before it finished (its worker was killed or crashed)"}
    study = _study(
        _fail("adamw", "running"),                               # 0: killed while training
        _fail("adamw", "interrupted", retry_of=0),               # 1: Ctrl-C
        _fail("adamw", "retried", retry_of=1),                   # 2: out of memory
        _fail("adamw", None, retry_of=2, **reason),              # 3: killed between two writes
        _fail("adamw", "completed", retry_of=3),                 # 4: killed while telling
    )
    trials = study.get_trials()
    assert [worker_died(t) for t in trials] == [True, False, False, True, True]
    assert [earlier_retries(study, t) for t in trials] == [0, 1, 1, 2, 3]
    asked = create_trial(state=TrialState.FAIL, user_attrs={})  # died while asking: not the point's doing
    assert not worker_died(asked)
    # a death with retries left queues the point again; over them, the point stays failed
    running = create_trial(state=TrialState.FAIL, params=trials[0].params,
                           distributions=trials[0].distributions,
                           user_attrs={"status": "running", "retry_of": 4})
    running.number = 5
    assert settle_dead(study, running, 5) == "marked failed and queued again (retry 5 of 5)"
    assert study.get_trials(states=(TrialState.WAITING,))[0].user_attrs["retry_of"] == 5
    assert done_count(study) == 0
    said = settle_dead(study, running, 4)
    assert said.startswith("marked failed; its point stays failed: its worker died 4 times while "
                           "training this point (killed, crashed or out of memory), after 1 other "
                           "failure of the environment;")
    verdict = study.get_trials()[-1]
    assert (verdict.user_attrs["status"], verdict.user_attrs["retries"], verdict.user_attrs["retry_of"]) \
        == ("failed", 4, 5)
    assert done_count(study) == 1


def test_failed_attrs_retry_an_environment_failure_until_max_retries():
    study = _study(_fail("adamw", "retried"), _fail("adamw", "retried", retry_of=0))
    first, second = study.get_trials()
    a = failed_attrs(study, first, "MemoryError: ", ENV, 2)
    assert a["status"] == "retried" and a["retries"] == 0 and a["failure_kind"] == ENV
    assert a["fail_reason"].startswith("retried (a failure of the environment; retry 1 of 2")
    b = failed_attrs(study, second, "MemoryError: ", ENV, 1)  # one retry already done
    assert b["status"] == "failed" and b["fail_reason"].endswith("retried 1 time)")
    c = failed_attrs(study, first, "MemoryError: ", ENV, 0)
    assert c["status"] == "failed" and "not retried: --max-retries 0" in c["fail_reason"]
    d = failed_attrs(study, first, "ValueError: x", ASSIGN, 2)
    assert d == {"status": "failed", "fail_reason": "ValueError: x", "failure_kind": ASSIGN,
                 "retries": 0}


def test_requeue_failed_queues_each_failed_point_once_and_the_budget_counts_it_once():
    done = create_trial(state=TrialState.COMPLETE, value=3.0, params={"geometry.attn": "oblique"},
                        distributions={"geometry.attn": optuna.distributions.CategoricalDistribution(
                            ["adamw", "oblique"])}, user_attrs={"status": "completed"})
    study = _study(_fail("adamw", "failed"), _fail("oblique", "failed"), done,
                   _fail("adamw", "retried"))
    assert done_count(study) == 3  # two failed, one completed; the retried one does not count
    assert requeue_failed(study) == [0]  # oblique has a completed trial: not queued
    waiting = study.get_trials(states=(TrialState.WAITING,))
    assert len(waiting) == 1 and waiting[0].user_attrs["queued_params"] == {"geometry.attn": "adamw"}
    assert waiting[0].user_attrs["retry_of"] == 0
    # the failed trial leaves its place to the rerun: not counted, and not a twin of it
    assert done_count(study) == 2
    assert twin_of(study, waiting[0].number, {"geometry.attn": "adamw"}) is None
    assert requeue_failed(study) == []  # queued already: not twice
