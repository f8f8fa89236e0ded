"""The study's backup in its run directory: ``study.json`` and ``trials/<n>/trial.json``.

The Optuna storage (``study.db``, ``journal.log``) is the only place that holds a trial's
state, value, params with their distributions, user attrs, intermediate values and
constraints; the trial folders hold its files (config, metrics, result). So that a
damaged storage can be rebuilt (``geosearch recover``,
:mod:`geosearch.search.runtime.rebuild`), the run directory keeps a copy of what the
storage holds, written through the public API only:

* ``study.json``: the study's name, directions, metric names and user attrs (the space,
  target, ladder, ...), and ``uid``, a random id a new study gets. It is written when the
  search binds the study (created, or resumed without one).
* ``trials/<n>/trial.json``: trial ``n`` as the storage holds it once told (the stored
  :class:`~optuna.trial.FrozenTrial`, read back after ``tell``, so it never says more than
  the storage did), with the ``uid`` of its study. Written for every trial the trial loop
  tells (trained or not), every trial the dead-trial recovery fails or adds, and, when a
  search starts, every finished trial that has none yet (:meth:`TrialBackup.sync`).

The ``uid`` keeps a study's records apart from those of an earlier study of the same name
whose storage was deleted: a new study gets a new ``uid``, and records of another ``uid``
are ignored. Records are whole files or none (written aside, then renamed). Torch-free.
The run directory's layout is in ``docs/design.md`` ("The run directory").

Each trial's files also go to an Optuna artifact store as artifacts of their trial
(:class:`TrialFiles`), when one is given.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import mimetypes
import os
import shutil
import tempfile
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Protocol

import optuna
from optuna.artifacts import FileSystemArtifactStore, upload_artifact
from optuna.distributions import distribution_to_json, json_to_distribution
from optuna.trial import FrozenTrial, TrialState, create_trial

from geosearch.util.checks import shown
from geosearch.util.errors import ConfigError
from geosearch.util.files import read_user_text
from geosearch.search.records import json_safe

__all__ = ["ARTIFACTS_DIR", "ArtifactStore", "CHECKSUM", "FINISHED_STATES", "FORMAT",
           "STUDY_FILE", "StudyRecord", "TRIAL_FILE", "TRIALS_DIR", "TrialBackup",
           "TrialFiles", "default_store", "folder_number",
           "read_record", "read_study_record", "read_trial_records",
           "record_checksum", "record_intact", "record_paths", "recorded_trial",
           "save_study_record", "trial_record", "upload_trial_files",
           "write_record"]

STUDY_FILE = "study.json"
"""``<run-dir>/study.json``: the study's name, directions, metric names, user attrs and uid."""
RECORD_LIMIT = 256 * 2**20
"""The largest ``study.json`` or ``trial.json`` read back (a named pipe or a device there is
refused too): 256 MiB, far above a real one (a trial's attrs are kilobytes)."""
TRIAL_FILE = "trial.json"
"""``trials/<n>/trial.json``: trial ``n`` as the storage holds it once told."""
FORMAT = 1
"""The version of both files' layout."""
CHECKSUM = "sha256"
"""In ``trial.json``: the SHA-256 of the record's other fields (:func:`record_checksum`)."""

TRIALS_DIR = "trials"
"""``trials/<n>/``: config, metrics (and per-seed folders) of trial ``n``, and its record."""
FINISHED_STATES = ("COMPLETE", "PRUNED", "FAIL")
"""The states a record holds (a trial's record is written once it is told)."""


@dataclass(frozen=True)
class StudyRecord:
    """What ``study.json`` holds."""

    name: str
    uid: str
    directions: tuple[str, ...]
    metric_names: tuple[str, ...] | None
    user_attrs: dict[str, Any]


# --------------------------------------------------------------------------- writing
def _write_json(path: Path, data: dict[str, Any]) -> None:
    """Write ``data`` to ``path`` whole or not at all: aside, flushed, then renamed."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(temp, "w", encoding="utf-8") as f:
            json.dump(data, f, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        os.replace(temp, path)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise


def save_study_record(run_dir: str | os.PathLike, study: optuna.Study, *, new: bool) -> None:
    """Write ``study.json`` for ``study`` (``new``: just created, so it gets a new uid; else
    the uid of the file, when it names this study, is kept, or, the file lost, the uid of
    the records of its trials). Unchanged content is not rewritten.

    Raises:
        OSError: the file could not be written.
    """
    path = Path(run_dir) / STUDY_FILE
    old = None if new else _read_study_quietly(Path(run_dir))
    if old is not None and old.name == study.study_name:
        uid = old.uid
    else:
        uid = (None if new else _uid_of_records(Path(run_dir), study)) or uuid.uuid4().hex
    data = {"format": FORMAT, "kind": "geosearch study", "name": study.study_name, "uid": uid,
            "directions": [d.name for d in study.directions],
            "metric_names": study.metric_names, "user_attrs": json_safe(dict(study.user_attrs))}
    if old is not None and not new:
        try:
            if json.loads(path.read_text(encoding="utf-8")) == json.loads(json.dumps(data)):
                return
        except (OSError, ValueError):
            pass
    _write_json(path, data)


def read_study_record(run_dir: str | os.PathLike) -> StudyRecord | None:
    """``study.json`` of a run directory; ``None`` when there is none.

    Raises:
        ConfigError: the file cannot be read or is not a study record.
    """
    path = Path(run_dir) / STUDY_FILE
    if not (path.exists() or path.is_symlink()):
        return None
    text = read_user_text(path, what="the study's backup, a JSON file", limit=RECORD_LIMIT)
    try:
        data = json.loads(text)
    except (OSError, ValueError) as e:
        raise ConfigError(f"cannot read the study's backup ({type(e).__name__}: "
                          f"{str(e).splitlines()[0][:120] if str(e) else ''})", source=str(path)) from None
    try:
        if data.get("kind") != "geosearch study" or data.get("format") != FORMAT:
            raise ValueError
        names = data["metric_names"]
        return StudyRecord(name=str(data["name"]), uid=str(data["uid"]),
                           directions=tuple(str(d) for d in data["directions"]),
                           metric_names=tuple(names) if names is not None else None,
                           user_attrs=dict(data["user_attrs"]))
    except (AttributeError, KeyError, TypeError, ValueError):
        raise ConfigError(f"expected a geosearch study backup (format {FORMAT}: name, uid, "
                          "directions, metric_names, user_attrs)", source=str(path)) from None


def _uid_of_records(run_dir: Path, study: optuna.Study) -> str | None:
    """The uid of the records that are this study's trials (the same number and start time
    as a stored trial), for a study whose ``study.json`` was lost; ``None`` when none are."""
    starts = {t.number: t.datetime_start.isoformat() for t in study.get_trials(deepcopy=False)
              if t.datetime_start is not None}
    for n, path in sorted(record_paths(run_dir).items(), reverse=True):
        data = read_record(path)
        if (data is not None and data.get("study") == study.study_name and isinstance(data.get("study_uid"), str)
                and data.get("datetime_start") is not None and data.get("datetime_start") == starts.get(n)):
            return data["study_uid"]
    return None


def _read_study_quietly(run_dir: Path) -> StudyRecord | None:
    try:
        return read_study_record(run_dir)
    except ConfigError:
        return None


def trial_record(trial: FrozenTrial, study_name: str, uid: str) -> dict[str, Any]:
    """A finished trial as ``trial.json`` holds it."""
    def when(t: datetime.datetime | None) -> str | None:
        return t.isoformat() if t is not None else None

    record = {
        "format": FORMAT, "kind": "geosearch trial", "study": study_name, "study_uid": uid,
        "number": trial.number, "state": trial.state.name, "value": trial.value,
        "params": json_safe(dict(trial.params)),
        "distributions": {k: json.loads(distribution_to_json(d)) for k, d in trial.distributions.items()},
        "user_attrs": json_safe(dict(trial.user_attrs)),
        "intermediate_values": [[step, v] for step, v in sorted(trial.intermediate_values.items())],
        "constraints": dict(trial.constraints),
        "datetime_start": when(trial.datetime_start),
        "datetime_complete": when(trial.datetime_complete),
    }
    record = json.loads(json.dumps(record))  # as the file will hold it: keys strings, tuples lists
    return {**record, CHECKSUM: record_checksum(record)}


def write_record(run_dir: str | os.PathLike, trial: FrozenTrial, study: StudyRecord) -> Path:
    """Write trial ``trial``'s ``trials/<n>/trial.json`` for ``study`` (whole or not at all);
    returns its path.

    Raises:
        OSError: it could not be written.
    """
    path = Path(run_dir) / TRIALS_DIR / str(trial.number) / TRIAL_FILE
    _write_json(path, trial_record(trial, study.name, study.uid))
    return path


def record_checksum(data: dict[str, Any]) -> str:
    """The SHA-256 of a ``trial.json`` record's fields but :data:`CHECKSUM` (whatever fields
    and user attrs it holds), in their JSON text with sorted keys: a byte changed in the file
    (a digit of a value) no longer matches it."""
    body = {k: v for k, v in data.items() if k != CHECKSUM}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), allow_nan=True)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def record_intact(data: dict[str, Any]) -> bool:
    """Whether a record read from ``trial.json`` matches its :data:`CHECKSUM` (a record
    written before records had one is taken as it is)."""
    return CHECKSUM not in data or data[CHECKSUM] == record_checksum(data)


class TrialBackup:
    """Writes the ``trial.json`` of the trials a process tells (see the module docstring).

    Nothing is written while the run directory has no ``study.json`` (a study bound
    without one: its uid is unknown). A record that cannot be written is reported to
    ``warn`` and skipped: it is a copy, and the trial's outcome stands.

    Args:
        run_dir: ``<runs-dir>/<study>``.
        warn: prints one line.
    """

    def __init__(self, run_dir: str | os.PathLike, warn: Any = None) -> None:
        self.run_dir = Path(run_dir)
        self.warn = warn

    def save(self, study: optuna.Study, numbers: Iterable[int]) -> None:
        """Write the records of trials ``numbers`` of ``study``, read back from its storage
        (trials not finished are left out)."""
        wanted = set(numbers)
        if not wanted:
            return
        self._write(study, [t for t in study.get_trials(deepcopy=False) if t.number in wanted])

    def sync(self, study: optuna.Study) -> None:
        """Write the record of every finished trial of ``study`` that has none: trials failed
        or added by the dead-trial recovery, a record that could not be written (a full
        disk), trials told by a version of geosearch that kept no backup. A record, written
        after its trial's ``tell``, never goes stale: one that exists is not read again."""
        self._write(study, [t for t in study.get_trials(deepcopy=False)
                            if t.state.is_finished() and not self._path(t.number).is_file()])

    def _path(self, number: int) -> Path:
        return self.run_dir / TRIALS_DIR / str(number) / TRIAL_FILE

    def _write(self, study: optuna.Study, trials: list[FrozenTrial]) -> None:
        trials = [t for t in trials if t.state.is_finished()]
        if not trials:
            return
        try:
            record = read_study_record(self.run_dir)
        except ConfigError:
            record = None
        if record is None or record.name != study.study_name:
            return
        for t in trials:
            try:
                _write_json(self._path(t.number), trial_record(t, study.study_name, record.uid))
            except OSError as e:
                if self.warn is not None:
                    self.warn(f"warning: trial {t.number}'s backup {self._path(t.number)} was not "
                              f"written ({e.strerror or e}); the trial is stored in the study")


# --------------------------------------------------------------------------- reading
def read_record(path: Path) -> dict[str, Any] | None:
    """The JSON object a ``trial.json`` holds; ``None`` when it does not read as one."""
    try:  # a regular file of at most RECORD_LIMIT bytes (a ConfigError is a ValueError)
        data = json.loads(read_user_text(path, what="a trial record", limit=RECORD_LIMIT))
    except (OSError, ValueError, RecursionError):
        return None
    return data if isinstance(data, dict) else None


def record_paths(run_dir: str | os.PathLike) -> dict[int, Path]:
    """``{n: trials/<n>/trial.json}`` of the records that exist."""
    folder = Path(run_dir) / TRIALS_DIR
    out = {}
    if folder.is_dir():
        for sub in folder.iterdir():
            n = folder_number(sub.name)
            if n is not None and (sub / TRIAL_FILE).is_file():
                out[n] = sub / TRIAL_FILE
    return out


def folder_number(name: str) -> int | None:
    """The trial number a folder of ``trials/`` is named by (``"12"``), else ``None``: only
    ASCII digits without a leading zero name one (``"²"`` and ``"007"`` do not)."""
    if name.isascii() and name.isdigit() and len(name) < 19 and (name == "0" or name[0] != "0"):
        return int(name)
    return None


def recorded_trial(data: dict[str, Any]) -> FrozenTrial:
    """The trial a ``trial.json`` record holds, to add to a study (``study.add_trial``):
    its state, value, params and distributions, user attrs, intermediate values,
    constraints and times.

    Raises:
        ValueError: the record is not a finished geosearch trial.
    """
    if data.get("kind") != "geosearch trial" or data.get("format") != FORMAT:
        raise ValueError(f"not a geosearch trial record of format {FORMAT}")
    state = TrialState[data["state"]]
    if not state.is_finished():
        raise ValueError(f"state {state.name} is not a finished trial's")
    trial = create_trial(
        state=state, value=data["value"], params=dict(data["params"]),
        distributions={k: json_to_distribution(json.dumps(v)) for k, v in data["distributions"].items()},
        user_attrs=dict(data["user_attrs"]),
        intermediate_values={int(step): float(v) for step, v in data["intermediate_values"]},
        constraints={str(k): float(v) for k, v in data["constraints"].items()})
    for name in ("datetime_start", "datetime_complete"):
        if data.get(name):
            setattr(trial, name, datetime.datetime.fromisoformat(data[name]))
    return trial


def read_trial_records(run_dir: str | os.PathLike,
                       study: StudyRecord) -> tuple[dict[int, FrozenTrial], list[str]]:
    """The trials recorded in ``trials/<n>/trial.json`` for ``study`` (its name and uid).

    Returns:
        ``{number: trial}``, and one line per record that was left out (unreadable, of
        another study, or not matching its folder), naming its file.
    """
    trials: dict[int, FrozenTrial] = {}
    skipped: list[str] = []
    for n, path in sorted(record_paths(Path(run_dir)).items()):
        data = read_record(path)
        if data is None:
            skipped.append(f"{path}: unreadable")
            continue
        if not record_intact(data):
            skipped.append(f"{path}: fails its checksum (the file was changed)")
            continue
        if data.get("study") != study.name or data.get("study_uid") != study.uid:
            skipped.append(f"{path}: of another study ({shown(data.get('study'))}, "
                           f"uid {shown(data.get('study_uid'))})")
            continue
        if data.get("number") != n:
            skipped.append(f"{path}: records trial {shown(data.get('number'))}, not {n}")
            continue
        try:
            trials[n] = recorded_trial(data)
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            skipped.append(f"{path}: {type(e).__name__}: {e}"[:300])
    return trials, skipped


ARTIFACTS_DIR = "artifacts"
"""``<run-dir>/artifacts/``: the default artifact store of a study's trial files."""

# Types Python's mimetypes does not know, so optuna-dashboard previews them as text.
_MIMETYPES = {".jsonl": "application/jsonl", ".yaml": "application/yaml", ".yml": "application/yaml",
              ".txt": "text/plain", ".log": "text/plain"}


class ArtifactStore(Protocol):
    """What an Optuna artifact store offers (``FileSystemArtifactStore``, ``Boto3ArtifactStore``...)."""

    def open_reader(self, artifact_id: str) -> BinaryIO: ...

    def write(self, artifact_id: str, content_body: BinaryIO) -> None: ...

    def remove(self, artifact_id: str) -> None: ...


def default_store(run_dir: str | os.PathLike) -> FileSystemArtifactStore:
    """The file-system artifact store in ``<run_dir>/artifacts/`` (created)."""
    path = Path(run_dir) / ARTIFACTS_DIR
    path.mkdir(parents=True, exist_ok=True)
    return FileSystemArtifactStore(path)


def upload_trial_files(store: ArtifactStore, trial: optuna.Trial, trial_dir: Path) -> list[str]:
    """Upload every file under ``trial_dir`` as an artifact of ``trial`` (a running trial).

    Args:
        store: the artifact store.
        trial: the trial the files belong to; it must not be finished yet.
        trial_dir: its folder (missing: nothing is uploaded).

    Returns:
        The artifact file names, in upload order (``config.yaml``, ``seed1-metrics.jsonl``...).
    """
    if not trial_dir.is_dir():
        return []
    names = []
    with tempfile.TemporaryDirectory(prefix="geosearch-artifact-") as tmp:
        for path in sorted(p for p in trial_dir.rglob("*") if p.is_file()):
            rel = path.relative_to(trial_dir)
            name = "-".join(rel.parts)
            if len(rel.parts) > 1:  # upload_artifact names an artifact after its file
                path = Path(shutil.copyfile(path, Path(tmp) / name))
            mimetype = _MIMETYPES.get(path.suffix) or mimetypes.guess_type(name)[0]
            upload_artifact(artifact_store=store, file_path=str(path), study_or_trial=trial,
                            mimetype=mimetype)
            names.append(name)
    return names


class TrialFiles:
    """The trial loop's hook: upload a finished trial's folder, warn instead of failing.

    Args:
        store: the artifact store.
        echo: prints a warning line when an upload fails (the trial's outcome stands).
    """

    def __init__(self, store: ArtifactStore, echo: Callable[[str], None]) -> None:
        self.store, self.echo = store, echo

    def __call__(self, trial: optuna.Trial, trial_dir: Path) -> None:
        try:
            upload_trial_files(self.store, trial, trial_dir)
        except optuna.exceptions.UpdateFinishedTrialError:
            raise  # the trial was failed meanwhile by a worker that took it for dead
        except Exception as e:  # noqa: BLE001 - a store that is down must not fail the trial
            self.echo(f"warning: trial {trial.number}'s files were not stored as artifacts "
                      f"({type(e).__name__}: {e}); they are in {trial_dir}")
