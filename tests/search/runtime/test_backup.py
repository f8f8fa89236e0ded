"""Tests of geosearch.search.runtime.backup: study.json and trials/<n>/trial.json.

The rebuild that reads them is tested in test_rebuild.py (a fake trainer) and
tests/cli/test_recover.py (real searches whose storage is damaged).
"""

from __future__ import annotations

import json
import math

import optuna
import pytest
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution
from optuna.trial import TrialState, create_trial

from geosearch.util.errors import ConfigError
from geosearch.search.runtime.integrity import check_trials
from geosearch.search.runtime.backup import CHECKSUM, STUDY_FILE, TRIAL_FILE, TrialBackup, read_study_record, read_trial_records, record_checksum, record_intact, recorded_trial, save_study_record, trial_record
from geosearch.search.records import read_probes_file, write_probes_file

optuna.logging.set_verbosity(optuna.logging.WARNING)

FIELDS = ("number", "state", "value", "params", "distributions", "user_attrs", "intermediate_values",
          "constraints", "datetime_start", "datetime_complete")


def fields(t):
    return {f: getattr(t, f) for f in FIELDS}


def study_with_trials(tmp_path, name="s"):
    """A study in ``tmp_path/s.db`` holding a COMPLETE, a PRUNED and a FAIL trial."""
    study = optuna.create_study(study_name=name, storage=f"sqlite:///{tmp_path / (name + '.db')}")
    study.set_user_attr("space", {"geometries": {"attn": ["stiefel", "dgram"]}, "nan": math.nan})
    dists = {"geometry.attn": CategoricalDistribution(["stiefel", "dgram"]),
             "spectral_lr": FloatDistribution(1e-3, 1e-1, log=True), "k": IntDistribution(1, 4)}
    study.add_trial(create_trial(
        value=3.25, params={"geometry.attn": "dgram", "spectral_lr": 0.02, "k": 3}, distributions=dists,
        user_attrs={"status": "completed", "val_losses": [3.25], "sigma_max": {"attn_qkv": 1.5},
                    "val_loss_std": None}, intermediate_values={5: 3.5, 10: 3.25},
        constraints={"not_a_point": 1.0}))
    study.add_trial(create_trial(
        state=TrialState.PRUNED, value=9.0, params={"geometry.attn": "stiefel", "spectral_lr": 0.05, "k": 1},
        distributions=dists, user_attrs={"status": "unstable", "prune_reason": "max logit 1e4"},
        intermediate_values={5: 9.0, 10: math.inf}))
    study.add_trial(create_trial(state=TrialState.FAIL, user_attrs={"status": "failed",
                                                                   "fail_reason": "ValueError: x"}))
    return study


def test_a_trial_record_gives_back_the_trial_as_stored(tmp_path):
    # Rule: what a study can rebuild from trial.json is the stored trial, field by field
    # (params with their distributions, intermediate values with inf, constraints, times).
    study = study_with_trials(tmp_path)
    copy = optuna.create_study(study_name="s", storage=f"sqlite:///{tmp_path / 'copy.db'}")
    for t in study.get_trials():
        text = json.dumps(trial_record(t, "s", "u1"))  # through a file's text
        copy.add_trial(recorded_trial(json.loads(text)))
    for a, b in zip(study.get_trials(), copy.get_trials(), strict=True):
        assert fields(a) == fields(b)
    assert copy.trials[0].constraints == {"not_a_point": 1.0}
    assert copy.trials[1].intermediate_values[10] == math.inf


def test_a_record_of_an_unfinished_trial_or_another_kind_of_file_is_refused(tmp_path):
    t = study_with_trials(tmp_path).get_trials()[0]
    record = trial_record(t, "s", "u1")
    with pytest.raises(ValueError, match="RUNNING is not a finished trial"):
        recorded_trial({**record, "state": "RUNNING"})
    with pytest.raises(ValueError, match="not a geosearch trial record"):
        recorded_trial({**record, "kind": "something else"})


def test_a_new_study_gets_a_new_uid_and_a_resumed_one_keeps_its_own(tmp_path):
    study = study_with_trials(tmp_path)
    save_study_record(tmp_path, study, new=True)
    first = read_study_record(tmp_path)
    assert first.name == "s" and first.directions == ("MINIMIZE",)
    assert first.user_attrs["space"]["geometries"] == {"attn": ["stiefel", "dgram"]}
    assert math.isnan(first.user_attrs["space"]["nan"])
    save_study_record(tmp_path, study, new=False)  # a resume
    assert read_study_record(tmp_path).uid == first.uid
    study.set_user_attr("extra", 1)  # updated attrs are written, under the same uid
    save_study_record(tmp_path, study, new=False)
    assert read_study_record(tmp_path).user_attrs["extra"] == 1
    assert read_study_record(tmp_path).uid == first.uid
    save_study_record(tmp_path, study, new=True)  # a study created again under the name
    assert read_study_record(tmp_path).uid != first.uid


def test_a_damaged_study_json_is_one_line_naming_it(tmp_path):
    (tmp_path / STUDY_FILE).write_text("{not json", encoding="utf-8")
    with pytest.raises(ConfigError, match=rf"{STUDY_FILE}: cannot read the study's backup \(JSONDecodeError"):
        read_study_record(tmp_path)
    (tmp_path / STUDY_FILE).write_text("[1, 2]", encoding="utf-8")
    with pytest.raises(ConfigError, match="expected a geosearch study backup"):
        read_study_record(tmp_path)
    assert read_study_record(tmp_path / "none") is None


def test_records_are_written_only_under_a_study_json_and_only_for_finished_trials(tmp_path):
    study = study_with_trials(tmp_path)
    live = study.ask()  # RUNNING: no record
    backup = TrialBackup(tmp_path)
    backup.save(study, [0, 1])
    assert not (tmp_path / "trials").exists()  # no study.json: its uid is unknown
    save_study_record(tmp_path, study, new=True)
    backup.save(study, [0, live.number])
    assert sorted(p.parent.name for p in (tmp_path / "trials").glob(f"*/{TRIAL_FILE}")) == ["0"]
    backup.sync(study)  # every finished trial without one
    assert sorted(p.parent.name for p in (tmp_path / "trials").glob(f"*/{TRIAL_FILE}")) == ["0", "1", "2"]
    recorded, skipped = read_trial_records(tmp_path, read_study_record(tmp_path))
    assert sorted(recorded) == [0, 1, 2] and skipped == []


def test_a_record_that_cannot_be_written_is_a_warning(tmp_path):
    study = study_with_trials(tmp_path)
    save_study_record(tmp_path, study, new=True)
    (tmp_path / "trials").write_text("a file where the folder goes", encoding="utf-8")
    lines = []
    TrialBackup(tmp_path, lines.append).save(study, [0])
    assert len(lines) == 1 and lines[0].startswith("warning: trial 0's backup") and "was not written" in lines[0]


@pytest.mark.slow
def test_records_of_another_study_or_garbled_ones_are_left_out_and_named(tmp_path):
    study = study_with_trials(tmp_path)
    save_study_record(tmp_path, study, new=True)
    TrialBackup(tmp_path).sync(study)
    uid = read_study_record(tmp_path).uid
    (tmp_path / "trials" / "1" / TRIAL_FILE).write_text("{torn", encoding="utf-8")
    other = json.loads((tmp_path / "trials" / "2" / TRIAL_FILE).read_text())
    trials = tmp_path / "trials"
    (trials / "2" / TRIAL_FILE).write_text(json.dumps(sealed({**other, "study_uid": "old"})))
    (tmp_path / "trials" / "7").mkdir()
    (trials / "7" / TRIAL_FILE).write_text(json.dumps(sealed({**other, "study_uid": uid})))
    (tmp_path / "trials" / "8").mkdir()  # a digit changed in a value, the checksum kept
    (trials / "8" / TRIAL_FILE).write_text(json.dumps({**other, "number": 8, "value": 9.5}))
    recorded, skipped = read_trial_records(tmp_path, read_study_record(tmp_path))
    assert sorted(recorded) == [0]
    assert [s.split(": ", 1)[1] for s in skipped] == ["unreadable", "of another study ('s', uid 'old')",
                                                      "records trial 2, not 7",
                                                      "fails its checksum (the file was changed)"]


def sealed(record):
    """A record changed by hand, with its checksum made to match again."""
    return {**record, CHECKSUM: record_checksum(record)}


def test_a_record_carries_the_checksum_of_its_fields(tmp_path):
    # Rule: the checksum covers every field and attr the record holds; one changed digit
    # (in a value, an attr, the study's uid) or a changed checksum no longer matches.
    record = trial_record(study_with_trials(tmp_path).get_trials()[0], "s", "u1")
    text = json.dumps(record)
    assert record_intact(json.loads(text)) and record[CHECKSUM] == record_checksum(record)
    assert '"val_losses": [3.25]' in text
    for old, new in (('"val_losses": [3.25]', '"val_losses": [3.35]'),
                     ('"value": 3.25', '"value": 3.26'),
                     ('"u1"', '"u2"'), (record[CHECKSUM][:8], "0" * 8)):
        assert not record_intact(json.loads(text.replace(old, new, 1))), old
    # a record of a build that kept no checksum is taken as it is
    assert record_intact({k: v for k, v in record.items() if k != CHECKSUM})


def test_lost_trials_are_the_recorded_ones_the_storage_lacks(tmp_path):
    study = study_with_trials(tmp_path)
    save_study_record(tmp_path, study, new=True)
    TrialBackup(tmp_path).sync(study)
    assert check_trials(tmp_path, study).lost == []
    # an older copy of the storage: the same study before its last two trials were told
    older = optuna.create_study(study_name="s", storage=f"sqlite:///{tmp_path / 'older.db'}")
    older.add_trial(study.trials[0])
    assert check_trials(tmp_path, older).lost == [1, 2]
    # records of an earlier study of the same name (another uid) are not this one's
    save_study_record(tmp_path, older, new=True)
    assert check_trials(tmp_path, older).lost == []


def test_a_lost_study_json_is_written_again_with_the_uid_of_the_studys_records(tmp_path):
    study = study_with_trials(tmp_path)
    save_study_record(tmp_path, study, new=True)
    TrialBackup(tmp_path).sync(study)
    uid = read_study_record(tmp_path).uid
    (tmp_path / STUDY_FILE).unlink()
    save_study_record(tmp_path, study, new=False)  # a resume finds no study.json
    assert read_study_record(tmp_path).uid == uid
    other = optuna.create_study(study_name="s", storage=f"sqlite:///{tmp_path / 'other.db'}")
    other.add_trial(create_trial(value=1.0))  # another study of the name: its trials are not these
    (tmp_path / STUDY_FILE).unlink()
    save_study_record(tmp_path, other, new=False)
    assert read_study_record(tmp_path).uid != uid


def test_a_trials_probe_rows_are_read_back_from_its_folder(tmp_path):
    rows = {"probe_history": [{"step": 5, "max_logit": 2.5}], "stability_probes": []}
    t = create_trial(state=TrialState.COMPLETE, value=1.0, user_attrs={"trial_dir": "trials/3"})
    # Rule: nothing written, or a file that is not a mapping of rows, reads as no rows.
    assert read_probes_file(tmp_path, t) == {}
    write_probes_file(tmp_path / "trials" / "3", rows)
    # Rule: the rows are found in the trial's trial_dir under the run directory.
    assert read_probes_file(tmp_path, t) == rows
    (tmp_path / "trials" / "3" / "probes.json").write_text("[1, 2]")
    assert read_probes_file(tmp_path, t) == {}
