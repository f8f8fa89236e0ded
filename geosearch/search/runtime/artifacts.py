"""Each trial's files as Optuna artifacts, so optuna-dashboard shows them from any machine.

A trial writes its files into ``<run-dir>/trials/<n>/`` on the machine that trained it
(``config.yaml``, ``metrics.jsonl``, ``result.json``; ``traceback.txt`` when it failed;
one ``seed<s>/`` folder per seed when it has several). :class:`TrialFiles`, called by the
trial loop once a trial's runs are over and before its outcome is told, uploads each of
them to an Optuna artifact store with :func:`optuna.artifacts.upload_artifact`, linked to
the trial: a file in a sub-folder is uploaded under its path with ``-`` for ``/``
(``seed1-metrics.jsonl``). The store defaults to
``optuna.artifacts.FileSystemArtifactStore`` in ``<run-dir>/artifacts/``
(``optuna-dashboard STORAGE --artifact-dir runs/<study>/artifacts``); a shared store
(``Boto3ArtifactStore``, ``GCSArtifactStore``) serves every machine of a study.
"""

from __future__ import annotations

import mimetypes
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO, Protocol

import optuna
from optuna.artifacts import FileSystemArtifactStore, upload_artifact

__all__ = ["ARTIFACTS_DIR", "ArtifactStore", "TrialFiles", "default_store", "upload_trial_files"]

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
