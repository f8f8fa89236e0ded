"""Each stored trial checked against its backup, so that one changed byte is never read as valid.

A trial's two copies, the storage's (``study.db``, ``journal.log``) and its record
``trials/<n>/trial.json`` (:mod:`geosearch.search.runtime.backup`), are the same trial as
stored once told, and the record carries the SHA-256 of its own fields
(:func:`~geosearch.search.runtime.backup.record_checksum`). A byte changed in either is
found when a study is read (:func:`check_trials`: export, report, a search's start):

* in the storage: the trial no longer equals its record, whose checksum holds (the record
  is the intact copy);
* in the record: its checksum no longer holds (the storage's copy is the intact one);
* a trial the record holds as finished and the storage lacks: the storage lost it.

Each is refused in one line naming the trial and ``geosearch recover``
(:func:`backup_error`), which repairs the copy that changed from the intact one
(:mod:`geosearch.search.runtime.rebuild`). A trial told by a process that died before it
wrote its record has one copy only, and is not checked. Only the public Optuna API is used.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Any

import optuna
from optuna.trial import FrozenTrial

from geosearch.util.errors import ConfigError
from geosearch.search.runtime.backup import (
    CHECKSUM,
    FINISHED_STATES,
    TRIAL_FILE,
    TRIALS_DIR,
    StudyRecord,
    read_record,
    read_study_record,
    record_intact,
    record_paths,
    trial_record,
)

__all__ = ["TrialsCheck", "backup_error", "check_trials", "other_study_problem"]


@dataclass
class TrialsCheck:
    """What :func:`check_trials` found; every list is of trial numbers, in order.

    Attributes:
        lost: finished in their records, lacking or unfinished in the storage.
        changed: the storage's copy differs from the record, whose checksum holds.
        what: for each of ``changed``, the first field that differs (``user attr 'val_losses'``).
        damaged: records that do not read or fail their checksum, of trials the storage holds
            finished (``stored`` holds those copies).
        stored: the storage's copies of the ``damaged`` records' trials.
    """

    lost: list[int] = field(default_factory=list)
    changed: list[int] = field(default_factory=list)
    what: dict[int, str] = field(default_factory=dict)
    damaged: list[int] = field(default_factory=list)
    stored: dict[int, FrozenTrial] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.lost or self.changed or self.damaged)


def _same(a: Any, b: Any) -> bool:
    """Equal as JSON values (``1`` equals ``1.0``, NaN equals NaN)."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    numbers = (int, float)
    if isinstance(a, numbers) and isinstance(b, numbers) and not isinstance(a, bool) \
            and not isinstance(b, bool):
        return a == b or (math.isnan(a) and math.isnan(b))
    return type(a) is type(b) and a == b


def _first_difference(stored: dict[str, Any], record: dict[str, Any]) -> str | None:
    """The first field of a trial that differs between its two copies, in words; ``None``."""
    for key in sorted(set(stored) | set(record)):
        if key == CHECKSUM or _same(stored.get(key), record.get(key)):
            continue
        a, b = stored.get(key), record.get(key)
        if key in ("user_attrs", "params") and isinstance(a, dict) and isinstance(b, dict):
            for sub in sorted(set(a) | set(b)):
                if sub not in a or sub not in b or not _same(a[sub], b[sub]):
                    return f"{'user attr' if key == 'user_attrs' else 'param'} {sub[:60]!r}"
        return key
    return None


def check_trials(run_dir: str | os.PathLike, study: optuna.Study) -> TrialsCheck:
    """Compare ``study``'s stored trials with the run directory's records (those of the
    study of ``study.json``: its name and uid). Nothing when there is no backup.

    The records are listed before the storage is read, so a trial told meanwhile (its
    record is written after its ``tell``) is never taken for lost or changed.
    """
    out = TrialsCheck()
    try:
        backup = read_study_record(run_dir)
    except ConfigError:
        return out
    if backup is None or backup.name != study.study_name:
        return out
    paths = record_paths(run_dir)
    if not paths:
        return out
    stored = {t.number: t for t in study.get_trials(deepcopy=False)}
    for n, path in sorted(paths.items()):
        data = read_record(path)
        trial = stored.get(n)
        finished = trial is not None and trial.state.is_finished()
        if data is None or not record_intact(data):
            if finished:
                out.damaged.append(n)
                out.stored[n] = trial
            continue
        if data.get("study") != backup.name or data.get("study_uid") != backup.uid \
                or data.get("number") != n or data.get("state") not in FINISHED_STATES:
            continue  # an earlier study's record, or a moved one
        if not finished:
            out.lost.append(n)
            continue
        what = _first_difference(trial_record(trial, backup.name, backup.uid), data)
        if what is not None:
            out.changed.append(n)
            out.what[n] = what
    return out


def _shown(numbers: list[int]) -> str:
    more = f" and {len(numbers) - 10} more" if len(numbers) > 10 else ""
    return ", ".join(map(str, numbers[:10])) + more


def backup_error(run_dir: str | os.PathLike, desc: str, check: TrialsCheck) -> ConfigError:
    """The one line refusing a study whose stored trials and records disagree (``desc``:
    the storage, ``study.db``): the first of a changed trial, lost trials, a damaged record."""
    run = os.fspath(run_dir)
    recover = f"`geosearch recover {run}`"
    if check.changed:
        n = check.changed[0]
        more = f" (and trials {_shown(check.changed[1:])})" if len(check.changed) > 1 else ""
        problem = (f"{desc} holds trial {n} other than its backup {TRIALS_DIR}/{n}/{TRIAL_FILE}, "
                   f"whose checksum holds ({check.what[n]} differs){more}: the stored copy was "
                   f"changed; {recover} repairs it from the intact copy")
    elif check.lost:
        problem = (f"{desc} lacks trials {_shown(check.lost)}, which {TRIALS_DIR}/ records as "
                   f"finished (the file lost them: cut short, or an older copy); {recover} "
                   "rebuilds the study from its backup")
    else:
        n = check.damaged[0]
        rest = check.damaged[1:]
        more = f" (and those of trials {_shown(rest)})" if rest else ""
        problem = (f"{TRIALS_DIR}/{n}/{TRIAL_FILE}, the backup of trial {n}, does not read or "
                   f"fails its checksum{more}: the file was changed; {recover} rewrites it "
                   f"from {desc}, the intact copy")
    return ConfigError(problem, source=run)


def other_study_problem(run_dir: str | os.PathLike, study: StudyRecord,
                        names: list[str] | None) -> str | None:
    """Why ``study.json`` is not the backup of the study in the run directory, or ``None``:
    the readable storage holds studies, none of its name (``names``; ``None``: the storage
    does not read), or ``trials/`` records trials (intact records), none of its name and uid.
    A rebuild from it would drop every trial."""
    if names and study.name not in names:
        held = ", ".join(map(repr, names[:3]))
        return f"records study {study.name!r}, but the storage holds {held}"
    others: set[tuple[Any, Any]] = set()
    for path in record_paths(run_dir).values():
        data = read_record(path)
        if data is None or not record_intact(data) or CHECKSUM not in data:
            continue
        if data.get("study") == study.name and data.get("study_uid") == study.uid:
            return None
        others.add((data.get("study"), data.get("study_uid")))
    if not others:
        return None
    name, uid = sorted(others, key=str)[0]
    return (f"records study {study.name!r} (uid {study.uid[:12]}), but the trials in "
            f"{TRIALS_DIR}/ are of study {str(name)[:60]!r} (uid {str(uid)[:12]})")
