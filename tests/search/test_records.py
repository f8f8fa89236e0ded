"""Tests of geosearch.search.records: the attr names, defined once, and a trial's outcome word."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import optuna
import pytest
from _search_helpers import FakeTrain, make_space, search, trials_of, use_train
from optuna.trial import TrialState, create_trial

from geosearch.search import records
from geosearch.search.stats.trials import trial_line
from geosearch.search.records import NOT_RUN, STATUSES, STUDY_ATTRS, TRIAL_ATTRS, trial_status
from geosearch.search.runtime.storage import open_run_study

REPO = Path(__file__).resolve().parents[2]
optuna.logging.set_verbosity(optuna.logging.WARNING)


def test_storage_and_records_import_without_torch():
    # reading a run directory (report, export) must not pull in the trainer
    code = ("import sys, geosearch.search.runtime.storage, geosearch.search.records; "
            "assert 'torch' not in sys.modules, 'torch was imported'")
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_each_attr_name_is_one_constant_named_as_its_value():
    names = STUDY_ATTRS + TRIAL_ATTRS
    assert len(set(names)) == len(names)  # no attr listed twice
    for name in names:
        assert getattr(records, name.upper()) == name  # VAL_LOSSES = "val_losses"
    assert len(set(STATUSES)) == len(STATUSES) and set(NOT_RUN) <= set(STATUSES)


@pytest.mark.slow
def test_a_search_writes_only_attrs_that_records_names(monkeypatch, tmp_path):
    # completed, pruned on a later seed, failed, and duplicate trials: every attr written
    # on any of them must be a records constant, so readers can rely on the names
    use_train(monkeypatch, FakeTrain(
        logits=lambda key, seed: 5e3 if ("euclidean" in key and seed == 1) else 10.0,
        raises=lambda key, seed: RuntimeError("boom") if "oblique" in key else None))
    space = make_space({"attn": ["adamw", "euclidean", "oblique"], "mlp": ["adamw"]}, repeats=2,
                       sampler="random", budget={"trials": 6})
    search(space, tmp_path)
    trials = trials_of(tmp_path)
    assert {trial_status(t) for t in trials} >= {"completed", "unstable", "failed", "duplicate"}
    written = set().union(*(t.user_attrs for t in trials))
    assert written <= set(TRIAL_ATTRS), written - set(TRIAL_ATTRS)
    assert set(open_run_study(tmp_path / "runs" / "t").user_attrs) == set(STUDY_ATTRS)


def test_the_design_doc_has_a_row_for_every_attr():
    text = (REPO / "docs" / "design.md").read_text(encoding="utf-8")
    rows = [line for line in text.splitlines() if line.startswith("| `")]
    for name in STUDY_ATTRS + TRIAL_ATTRS:
        assert any(row.startswith(f"| `{name}`") for row in rows), name


@pytest.mark.parametrize(("attrs", "word"), [
    ({"status": "failed", "fail_reason": "RuntimeError: boom"}, "failed"),
    ({"status": "duplicate", "fail_reason": "same point as trial 0"}, "duplicate"),
    ({"status": "running"}, "interrupted"),  # its worker died mid-trial
    ({"fail_reason": "interrupted (Ctrl-C)"}, "interrupted"),  # no status: the reason tells
    # signed or queued, then failed by the recovery before its worker set a status
    ({"worker": {"host": "h", "pid": 1}, "heartbeat": 1.0}, "interrupted"),
    ({"queued": True, "queued_params": {"geometry.attn": "adamw"}}, "interrupted"),
    ({}, "failed"),  # a FAIL trial geosearch never touched (a study of its own)
])
def test_a_failed_trial_gets_the_word_of_its_status(attrs, word):
    trial = create_trial(state=TrialState.FAIL, user_attrs=attrs)
    assert trial_status(trial) == word
    # the printed line says why it did not complete
    assert ("not run" in trial_line(trial)) == (word in NOT_RUN)
