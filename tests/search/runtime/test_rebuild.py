"""Tests of geosearch.search.runtime.rebuild: a damaged storage rebuilt from the backup.

The searches here train with the fake trainer (tests/_search_helpers.py), so every kind of
trial (completed, unstable, failed, a baseline with its constraint) is made in
milliseconds; tests/cli/test_recover.py damages the storages of real searches.
"""

from __future__ import annotations

import os
import re
import shutil

import optuna
import pytest
from _search_helpers import FakeTrain, make_space, search, use_train

from geosearch.util.errors import ConfigError
from geosearch.search.records import trial_status
from geosearch.search.runtime.backup import STUDY_FILE, TRIAL_FILE
from geosearch.search.runtime.rebuild import recover_run
from geosearch.search.runtime.storage import open_run_study
from geosearch.search.study.export import export_best

optuna.logging.set_verbosity(optuna.logging.WARNING)

GRID = {"attn": ["adamw", "euclidean"], "mlp": ["adamw", "euclidean"]}
FIELDS = ("number", "state", "value", "params", "distributions", "user_attrs", "intermediate_values",
          "constraints", "datetime_start", "datetime_complete")


def every_kind(monkeypatch) -> FakeTrain:
    """A trainer under which one point fails, one is unstable, the others complete."""
    return use_train(monkeypatch, FakeTrain(
        raises=lambda key, seed: ValueError("bad point") if key == "attn=adamw,mlp=euclidean" else None,
        logits=lambda key, seed: 1e6 if key == "attn=euclidean,mlp=euclidean" else 10.0))


def space(**extra):
    return make_space(GRID, **{"baselines": ["adamw"], **extra})


def snapshot(run_dir):
    return [{f: getattr(t, f) for f in FIELDS} for t in open_run_study(run_dir).get_trials()]


def truncate(path):
    os.truncate(path, path.stat().st_size // 2)


@pytest.mark.slow
def test_every_kind_of_trial_comes_back_as_it_was(monkeypatch, tmp_path):
    every_kind(monkeypatch)
    search(space(), tmp_path)
    run = tmp_path / "runs" / "t"
    before = snapshot(run)
    words = sorted(trial_status(t) for t in open_run_study(run).get_trials())
    assert words == ["completed", "completed", "completed", "failed", "unstable"]  # 4 points, 1 baseline
    attrs = dict(open_run_study(run).user_attrs)
    truncate(run / "study.db")

    outcome = recover_run(run)
    assert outcome.problem.startswith("cannot be read (DatabaseError")
    assert outcome.recovered == 5 and outcome.placeholders == [] and outcome.skipped == []
    assert outcome.kept.name.startswith("study.db.damaged-") and outcome.kept.is_file()
    assert snapshot(run) == before  # state, value, params, attrs, reports, constraints, times
    study = open_run_study(run)
    assert dict(study.user_attrs) == attrs and study.metric_names == ["val_loss"]
    baseline = next(t for t in study.get_trials() if "baseline" in t.user_attrs)
    assert baseline.constraints == {"not_a_point": 1.0}  # never Optuna's best
    assert study.best_trial.user_attrs["status"] == "completed" and "baseline" not in study.best_trial.user_attrs


@pytest.mark.slow
def test_a_rerun_after_recovery_trains_nothing_more(monkeypatch, tmp_path):
    every_kind(monkeypatch)
    search(space(), tmp_path)
    run = tmp_path / "runs" / "t"
    with open(run / "study.db", "r+b") as f:  # garbage in the middle
        f.seek((run / "study.db").stat().st_size // 2)
        f.write(b"\xa5" * 8192)
    recover_run(run)
    again = every_kind(monkeypatch)
    out = search(space(), tmp_path)
    assert again.calls == [] and len(open_run_study(run).get_trials()) == 5
    assert out.exported is not None


@pytest.mark.slow
def test_trials_without_a_record_become_placeholders_and_only_their_points_train_again(monkeypatch, tmp_path):
    every_kind(monkeypatch)
    search(space(), tmp_path)
    run = tmp_path / "runs" / "t"
    trials = open_run_study(run).get_trials()
    gone = {1: dict(trials[1].params), 2: dict(trials[2].params)}
    (run / "trials" / "1" / TRIAL_FILE).unlink()  # told, but its record lost: its folder stays
    shutil.rmtree(run / "trials" / "2")  # removed by hand
    truncate(run / "study.db")

    outcome = recover_run(run)
    assert outcome.placeholders == [1, 2] and outcome.recovered == 3
    study = open_run_study(run)
    assert [t.number for t in study.get_trials()] == [0, 1, 2, 3, 4]  # numbers kept
    assert [trial_status(t) for t in study.get_trials()[1:3]] == ["interrupted", "skipped"]
    assert study.trials[1].user_attrs["trial_dir"] == "trials/1" and study.trials[1].params == {}
    assert "not recovered" in study.trials[2].user_attrs["fail_reason"]
    assert any("had no record" in line for line in outcome.lines())

    again = use_train(monkeypatch, FakeTrain())
    search(space(), tmp_path)
    trained = [t for t in open_run_study(run).get_trials() if t.number > 4]
    assert len(again.calls) == 2 and sorted(map(str, (t.params for t in trained))) == sorted(map(str, gone.values()))
    assert all(trial_status(t) == "completed" for t in trained)


@pytest.mark.slow
def test_a_healthy_storage_is_left_untouched(fake, tmp_path):
    search(space(), tmp_path)
    run = tmp_path / "runs" / "t"
    db = run / "study.db"
    data, mtime = db.read_bytes(), db.stat().st_mtime_ns
    files = sorted(p.name for p in run.iterdir())
    outcome = recover_run(run)
    assert outcome.problem is None and outcome.kept is None
    assert outcome.lines() == [f"{db} reads and holds every trial recorded in {run / 'trials'}: nothing "
                               "to recover, nothing was changed"]
    assert db.read_bytes() == data and db.stat().st_mtime_ns == mtime
    assert sorted(p.name for p in run.iterdir()) == files


@pytest.mark.slow
def test_a_healthy_database_beside_a_leftover_journal_is_left_untouched(fake, tmp_path):
    # SQLite refuses a read-only open beside a -journal file it would roll back: the check
    # reads a copy of both instead, so the files stay as they are and nothing is rebuilt
    search(space(), tmp_path)
    run = tmp_path / "runs" / "t"
    (run / "study.db-journal").write_bytes(b"left by a process that died mid-transaction")
    data = (run / "study.db").read_bytes()
    assert recover_run(run).problem is None
    assert (run / "study.db").read_bytes() == data
    assert (run / "study.db-journal").read_bytes() == b"left by a process that died mid-transaction"


@pytest.mark.slow
def test_an_older_copy_of_the_storage_is_refused_then_rebuilt(fake, tmp_path):
    # a storage that reads but lost trials (a journal cut short, a restored copy): search,
    # export and report refuse it, naming recover, which rebuilds it
    search(space(budget={"trials": 2}, baselines=[]), tmp_path)
    run = tmp_path / "runs" / "t"
    shutil.copy(run / "study.db", tmp_path / "older.db")
    search(space(baselines=[]), tmp_path)
    before = snapshot(run)
    shutil.copy(tmp_path / "older.db", run / "study.db")
    with pytest.raises(ConfigError, match=rf"^{re.escape(str(run))}: study.db lacks trials 2, 3, which "
                                          r"trials/ records as finished .*`geosearch recover .*` rebuilds") as e:
        search(space(baselines=[]), tmp_path)
    assert len(str(e.value)) <= 400
    with pytest.raises(ConfigError, match="lacks trials 2, 3"):
        export_best(run)
    outcome = recover_run(run)
    assert outcome.problem.startswith("lacks trials 2, 3") and snapshot(run) == before


@pytest.mark.slow
def test_a_study_lost_with_its_storage_is_not_created_again_over_its_backup(fake, tmp_path):
    search(space(), tmp_path)
    run = tmp_path / "runs" / "t"
    (run / "study.db").unlink()
    with pytest.raises(ConfigError, match=r"holds no study 't', but this run directory's backup records "
                                          r"5 finished trials of it: `geosearch recover"):
        search(space(), tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("damage", ["truncated", "garbage"])
def test_search_and_export_refuse_a_damaged_storage_naming_recover(fake, tmp_path, damage):
    search(space(), tmp_path)
    run = tmp_path / "runs" / "t"
    db = run / "study.db"
    if damage == "truncated":
        truncate(db)
    else:
        with open(db, "r+b") as f:
            f.seek(db.stat().st_size // 2)
            f.write(b"\x00garbage" * 1024)
    for call in (lambda: search(space(), tmp_path), lambda: export_best(run)):
        with pytest.raises(ConfigError) as e:
            call()
        line = str(e.value)
        assert "\n" not in line and len(line) <= 400
        assert line.startswith(f"{run}: ") and f"`geosearch recover {run}` rebuilds a damaged study" in line


@pytest.mark.slow
def test_sqlites_journal_of_the_damaged_file_goes_aside_with_it(fake, tmp_path):
    search(space(), tmp_path)
    run = tmp_path / "runs" / "t"
    truncate(run / "study.db")
    (run / "study.db-journal").write_bytes(b"a hot journal of the damaged file")
    outcome = recover_run(run)
    assert not (run / "study.db-journal").exists()
    assert (run / f"{outcome.kept.name}-journal").read_bytes() == b"a hot journal of the damaged file"
    assert len(open_run_study(run).get_trials()) == 5


@pytest.mark.slow
def test_what_is_not_a_run_directory_with_a_backup_is_one_line(fake, tmp_path):
    with pytest.raises(ConfigError, match=r"nope: no such run directory$"):
        recover_run(tmp_path / "nope")
    with pytest.raises(ConfigError, match=r"not a run directory: no study storage here \(study.db or journal.log\)"):
        recover_run(tmp_path)
    search(space(), tmp_path)
    run = tmp_path / "runs" / "t"
    (run / STUDY_FILE).unlink()
    with pytest.raises(ConfigError, match=r"no study.json here: the study has no backup"):
        recover_run(run)
    (run / "journal.log").touch()
    with pytest.raises(ConfigError, match="holds both study.db and journal.log"):
        recover_run(run)


@pytest.mark.slow
def test_stray_entries_of_trials_are_left_out_with_a_note(fake, tmp_path):
    search(space(), tmp_path)
    run = tmp_path / "runs" / "t"
    (run / "trials" / "²").mkdir()  # str.isdigit() says yes, int() refuses it
    (run / "trials" / "3000000").mkdir()  # empty: would add three million placeholders
    (run / "trials" / "007").mkdir()
    (run / "trials" / "notes.txt").write_text("mine\n", encoding="utf-8")
    (run / "trials" / "90000").mkdir()  # holds a file, but far past the study's 5 trials
    (run / "trials" / "90000" / "metrics.jsonl").write_text("{}\n", encoding="utf-8")
    truncate(run / "study.db")
    outcome = recover_run(run)
    assert outcome.placeholders == [] and outcome.recovered == 5
    assert [t.number for t in open_run_study(run).get_trials()] == [0, 1, 2, 3, 4]
    notes = [line for line in outcome.lines() if line.startswith("left out: ")]
    names = sorted(n.split(": ")[1].rsplit("/", 1)[1] for n in notes)
    assert names == ["007", "3000000", "90000", "notes.txt", "²"]
    assert any("numbered past the study's" in n for n in notes)


@pytest.mark.slow
def test_a_study_json_that_is_a_named_pipe_is_refused_not_waited_on(fake, tmp_path):
    search(space(), tmp_path)
    run = tmp_path / "runs" / "t"
    (run / STUDY_FILE).unlink()
    os.mkfifo(run / STUDY_FILE)
    truncate(run / "study.db")
    with pytest.raises(ConfigError,
                       match=r"study.json: is a named pipe \(FIFO\), expected the study's backup"):
        recover_run(run)
