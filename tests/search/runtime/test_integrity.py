"""Tests of geosearch.search.runtime.integrity: each stored trial checked against its record.

Real searches whose files get one byte changed: tests/cli/test_recover.py and tests/faults/.
"""

from __future__ import annotations

import json
import math

import optuna
import pytest
from optuna.distributions import CategoricalDistribution
from optuna.trial import TrialState, create_trial

from geosearch.search.runtime.backup import (
    CHECKSUM,
    STUDY_FILE,
    TRIAL_FILE,
    TrialBackup,
    read_study_record,
    record_checksum,
    save_study_record,
)
from geosearch.search.runtime.integrity import backup_error, check_trials, other_study_problem

optuna.logging.set_verbosity(optuna.logging.WARNING)


def study_with_trials(tmp_path, name="s"):
    """A study with two completed trials and a failed one, backed up in ``tmp_path``."""
    study = optuna.create_study(study_name=name, storage=f"sqlite:///{tmp_path / (name + '.db')}")
    dist = {"geometry.attn": CategoricalDistribution(["stiefel", "dgram"])}
    for i, value in enumerate((3.25, 3.5)):
        study.add_trial(
            create_trial(
                value=value,
                params={"geometry.attn": ["stiefel", "dgram"][i]},
                distributions=dist,
                intermediate_values={5: value + 1.0},
                user_attrs={
                    "val_losses": [value, value + 0.125],
                    "nan": math.nan,
                    "sigma_max": {"attn": 1.5},
                },
            )
        )
    study.add_trial(create_trial(state=TrialState.FAIL, user_attrs={"status": "failed"}))
    save_study_record(tmp_path, study, new=True)
    TrialBackup(tmp_path).sync(study)
    return study


def copy_with(study, tmp_path, number, **changed):
    """The study as another storage holds it, trial ``number``'s fields ``changed``."""
    copy = optuna.create_study(
        study_name=study.study_name, storage=f"sqlite:///{tmp_path / 'copy.db'}"
    )
    for t in study.get_trials():
        fields = dict(
            state=t.state,
            value=t.value,
            params=t.params,
            distributions=t.distributions,
            user_attrs=t.user_attrs,
            intermediate_values=t.intermediate_values,
        )
        if t.number == number:
            fields.update(changed)
        made = create_trial(**fields)
        made.datetime_start, made.datetime_complete = t.datetime_start, t.datetime_complete
        copy.add_trial(made)
    return copy


def record(tmp_path, n):
    return tmp_path / "trials" / str(n) / TRIAL_FILE


def test_a_study_equal_to_its_records_passes(tmp_path):
    # Rule: NaN attrs, inf, nested dicts and a failed trial compare equal to their records.
    study = study_with_trials(tmp_path)
    assert not check_trials(tmp_path, study)
    assert not check_trials(tmp_path, copy_with(study, tmp_path, 0))


@pytest.mark.parametrize(
    ("changed", "what"),
    [
        (
            {
                "user_attrs": {
                    "val_losses": [3.25, 3.135],
                    "nan": math.nan,
                    "sigma_max": {"attn": 1.5},
                }
            },
            "user attr 'val_losses'",
        ),
        ({"value": 3.35}, "value"),
        ({"intermediate_values": {5: 4.35}}, "intermediate_values"),
        ({"params": {"geometry.attn": "dgram"}}, "param 'geometry.attn'"),
    ],
)
def test_a_stored_trial_that_differs_from_its_intact_record_is_named(tmp_path, changed, what):
    study = study_with_trials(tmp_path)
    check = check_trials(tmp_path, copy_with(study, tmp_path, 0, **changed))
    assert check.changed == [0] and check.what == {0: what} and not check.lost and not check.damaged
    line = str(backup_error(tmp_path, "study.db", check))
    assert "\n" not in line and len(line) <= 400
    assert f"study.db holds trial 0 other than its backup trials/0/{TRIAL_FILE}" in line
    assert f"({what} differs)" in line and f"`geosearch recover {tmp_path}` repairs it" in line


def test_a_record_changed_by_one_byte_is_named_and_its_stored_copy_kept(tmp_path):
    study = study_with_trials(tmp_path)
    text = record(tmp_path, 1).read_text()
    record(tmp_path, 1).write_text(text.replace("3.625", "3.725", 1))  # a digit of val_losses
    check = check_trials(tmp_path, study)
    assert check.damaged == [1] and check.stored[1].number == 1 and not check.changed
    assert "trials/1/trial.json, the backup of trial 1, does not read or fails its checksum" in str(
        backup_error(tmp_path, "study.db", check)
    )
    record(tmp_path, 1).write_text(text[:-20])  # cut short: does not read
    assert check_trials(tmp_path, study).damaged == [1]


def test_records_of_an_earlier_study_or_none_are_not_compared(tmp_path):
    study = study_with_trials(tmp_path)
    changed = copy_with(study, tmp_path, 0, value=9.0)
    data = json.loads(record(tmp_path, 0).read_text())
    data = {**data, "study_uid": "earlier"}
    record(tmp_path, 0).write_text(json.dumps({**data, CHECKSUM: record_checksum(data)}))
    assert not check_trials(
        tmp_path, changed
    )  # an earlier study's record, intact: not this trial's
    (tmp_path / STUDY_FILE).unlink()
    assert not check_trials(tmp_path, changed)  # no backup: nothing to compare with


def test_a_trial_the_storage_lost_is_named(tmp_path):
    study = study_with_trials(tmp_path)
    older = optuna.create_study(study_name="s", storage=f"sqlite:///{tmp_path / 'older.db'}")
    older.add_trial(study.trials[0])
    check = check_trials(tmp_path, older)
    assert check.lost == [1, 2] and not check.changed
    assert "lacks trials 1, 2, which trials/ records as finished" in str(
        backup_error(tmp_path, "x", check)
    )


def test_a_study_json_of_another_study_is_told_apart(tmp_path):
    study_with_trials(tmp_path)
    own = read_study_record(tmp_path)
    assert other_study_problem(tmp_path, own, ["s"]) is None
    assert "but the storage holds 'b'" in other_study_problem(tmp_path, own, ["b"])
    other = tmp_path / "other"
    other.mkdir()
    study_with_trials(other, "s")  # the same name, another uid
    foreign = read_study_record(other)
    problem = other_study_problem(tmp_path, foreign, None)  # the storage does not read
    assert problem.startswith(
        f"records study 's' (uid {foreign.uid[:12]}), but the trials in trials/ "
        f"are of study 's' (uid {own.uid[:12]})"
    )
