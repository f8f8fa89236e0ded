"""Tests for geosearch.report.load: reading a run directory's storage and trial files.

Also: the report package imports no torch, and the CLI's errors for a run directory it
cannot read are one line.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import optuna
import pytest
from _report_study import DISTS, add, new_study, row
from optuna.trial import TrialState, create_trial

from geosearch import report as rp
from geosearch.cli import main
from geosearch.util.errors import GeosearchError
from geosearch.util.urls import mask_url

REPO = Path(__file__).resolve().parents[2]


def test_importing_the_report_does_not_import_torch() -> None:
    # a fresh interpreter: this one has torch already from other tests
    code = "import sys, geosearch.report; assert 'torch' not in sys.modules, 'torch was imported'"
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr


def test_pruned_trial_shows_reason_and_step_from_attrs_or_storage(tmp_path: Path) -> None:
    run = tmp_path / "r"
    s = new_study(run)
    add(s, run, "stiefel", "stiefel", [3.4])
    # no stop_step attr: the step comes from the last intermediate value the pruner saw
    n = add(s, run, "dgram", "dgram", state=TrialState.PRUNED, attrs={"prune_reason": "entropy collapse"})
    text = rp.write_report(run, plots=False).report.read_text()
    assert row(text, n, "attn=dgram, mlp=dgram", 40, "entropy collapse")
    assert "Unstable trials (pruned)" in text


def test_bookkeeping_trials_are_hidden_and_interrupted_ones_named(tmp_path: Path) -> None:
    run = tmp_path / "book"
    s = new_study(run)
    add(s, run, "stiefel", "dgram", [3.3, 3.31])
    # study.py's FAIL trials that never trained: a raced grid point, a repeated proposal
    add(s, run, "stiefel", "dgram", state=TrialState.FAIL, metrics=False,
        attrs={"status": "duplicate", "fail_reason": "same point as trial 0", "duplicate_of": 0})
    add(s, run, "dgram", "dgram", state=TrialState.FAIL, metrics=False,
        attrs={"status": "skipped", "fail_reason": "the budget of 1 trials was taken by other workers"})
    # a worker killed mid-trial (status left "running"), and a Ctrl-C (status "interrupted")
    killed = add(s, run, "dgram", "stiefel", state=TrialState.FAIL, attrs={
        "status": "running", "fail_reason": "interrupted before it finished (its worker was killed or crashed)"})
    stopped = add(s, run, "adamw", "adamw", state=TrialState.FAIL, metrics=False, attrs={
        "status": "interrupted", "fail_reason": "interrupted (Ctrl-C); queued again"})
    failed = add(s, run, "euclidean", "euclidean", state=TrialState.FAIL, metrics=False,
                 attrs={"fail_reason": "RuntimeError: boom"})
    loaded = rp.load_run(run)
    assert {t.number: t.status for t in loaded.trials} == {
        0: "completed", killed: "interrupted", stopped: "interrupted", failed: "failed"}
    assert loaded.not_run == 2
    text = rp.write_report(run, plots=False).report.read_text()
    assert "same point as trial 0" not in text and "taken by other workers" not in text
    assert "- trials: 4 (1 completed, 0 unstable, 1 failed, 2 interrupted)" in text
    assert "not shown: 2 duplicate or skipped trials" in text
    assert row(text, killed, "attn=dgram, mlp=stiefel", "interrupted",
                "interrupted before it finished (its worker was killed or crashed)")
    assert row(text, stopped, "attn=adamw, mlp=adamw", "interrupted", "interrupted (Ctrl-C); queued again")
    # only the real failure is in the failed table (and counted as failed for stability)
    assert row(text, failed, "attn=euclidean, mlp=euclidean", "RuntimeError: boom")
    assert {(r["value"], r["failed"]) for r in rp.stability_table(loaded.trials) if r["param"] == "attn"} \
        == {("stiefel", 0), ("euclidean", 1)}


def test_journal_storage_and_study_choice(tmp_path: Path) -> None:
    run = tmp_path / "j"
    run.mkdir()
    storage = optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(str(run / "journal.log")))
    for name in ("a", "b"):
        st = optuna.create_study(storage=storage, study_name=name)
        st.add_trial(create_trial(params={"geometry.attn": "stiefel"},
                                  distributions={"geometry.attn": DISTS["geometry.attn"]}, value=3.0))
    # two studies and no --study: the error lists them instead of guessing
    with pytest.raises(GeosearchError, match="pick one with --study; expected one of: a, b"):
        rp.load_run(run)
    loaded = rp.load_run(run, study_name="b")
    assert loaded.study_name == "b" and [t.label for t in loaded.trials] == ["attn=stiefel"]
    with pytest.raises(GeosearchError, match="no study 'c'"):
        rp.load_run(run, study_name="c")


def test_storage_errors_are_one_line_user_errors(finished: Path) -> None:
    (finished / "journal.log").write_text("")
    # both storages present: say so instead of guessing which one is current
    with pytest.raises(GeosearchError, match="both study.db and journal.log; pass --storage"):
        rp.load_run(finished)
    assert rp.load_run(finished, storage=f"sqlite:///{finished}/study.db").study_name == "demo"
    # a password in a storage URL never reaches the report or an error message
    assert mask_url("postgresql://me:s3cret@db:5432/x") == "postgresql://me:***@db:5432/x"
    assert mask_url("sqlite:////runs/a:b@c/study.db") == "sqlite:////runs/a:b@c/study.db"  # a path, no password


def test_cli_missing_dir_is_one_line_exit_2(tmp_path: Path, capsys) -> None:
    code = main(["report", str(tmp_path / "nope")])
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1 and "nope: no such run directory" in err and "Traceback" not in err


def test_cli_dir_without_storage(tmp_path: Path, capsys) -> None:
    assert main(["report", str(tmp_path)]) == 2
    assert "no study storage here (study.db or journal.log)" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.parametrize("factor", [None, 5.0])
def test_the_threshold_drawn_is_the_one_the_pruner_judged_with(tmp_path: Path, factor) -> None:
    # trials that store the proxy's d/√d_head (8 here) were judged at max_logit_factor × 8,
    # not at the absolute max_logit (1000) the report drew before
    from _spaces import space

    run = tmp_path / "scaled"
    stored = space(pruner={} if factor is None else {"max_logit_factor": factor}).to_dict()
    s = new_study(run, space=stored)
    add(s, run, "stiefel", "dgram", [3.3], attrs={"logit_scale": 8.0})
    add(s, run, "dgram", "dgram", [3.4], attrs={"logit_scale": 8.0})
    loaded = rp.load_run(run)
    expected = 8.0 * (factor or 10.0)
    assert loaded.threshold == pytest.approx(expected)
    assert f"{factor or 10:g} × d/√d_head 8" in loaded.threshold_source
