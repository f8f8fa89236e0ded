"""Where ``train``, ``export`` and ``report`` write is checked before any work: one line,
exit code 2, nothing written; export and report read the study without changing a byte."""

from __future__ import annotations

import pytest

import hashlib
import shutil
from pathlib import Path

from _report_study import add, new_study
from _small_fs import read_only_filesystem

from geosearch.cli import main


def _state(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def _one_line(capsys, command: str) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"geosearch {command}: error: ") and "Traceback" not in err
    return err.strip()


@pytest.mark.slow
def test_export_and_report_leave_the_study_byte_identical(finished, capsys):
    db = finished / "study.db"
    before = hashlib.sha256(db.read_bytes()).hexdigest()
    # Rule: the read-only commands open the storage read-only: their own files are written,
    # the study is not touched (no -journal file either).
    assert main(["report", str(finished), "--no-plots"]) == 0
    assert main(["export", str(finished), "-o", str(finished / "best.yaml")]) == 0
    assert hashlib.sha256(db.read_bytes()).hexdigest() == before
    assert not Path(f"{db}-journal").exists()


@pytest.mark.slow
def test_an_output_of_the_wrong_kind_is_refused_before_any_work(finished, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "afile").write_text("x")
    (tmp_path / "adir").mkdir()
    before = _state(tmp_path)
    # Rule: train --out names a directory; a file there is refused before the model is built.
    assert main(["train", "--assign", "attn=adamw,mlp=adamw", "--model", "tiny", "--out", "afile"]) == 2
    assert _one_line(capsys, "train") == "geosearch train: error: --out: 'afile' is a file, expected a directory"
    # Rule: export -o names a file (with --top 1); a directory there is refused before the study is read.
    assert main(["export", str(finished), "-o", "adir"]) == 2
    assert _one_line(capsys, "export") == (
        "geosearch export: error: -o: 'adir' is a directory, expected a file (--top K > 1 writes one "
        "file per rank into a directory)")
    assert main(["export", str(finished), "-o", "afile", "--top", "2"]) == 2
    assert _one_line(capsys, "export") == "geosearch export: error: -o: 'afile' is a file, expected a directory"
    assert _state(tmp_path) == before


@pytest.mark.slow
def test_a_read_only_mount_is_one_line_for_train_export_and_report(tmp_path, capsys):
    made = tmp_path / "made"  # made elsewhere: an open database keeps the mount busy
    add(new_study(made), made, "stiefel", "dgram", [3.3, 3.31])
    with read_only_filesystem(tmp_path / "ro", "4m", prepare=lambda ro: shutil.copytree(made, ro / "run")) as ro:
        run = ro / "run"
        before = _state(ro)
        # Rule: each command names what it cannot write and why, before any work
        # (train --out and export -o on a read-only mount raised OSError's traceback).
        assert main(["train", "--assign", "attn=adamw,mlp=adamw", "--model", "tiny", "--out",
                     str(ro / "out")]) == 2
        assert _one_line(capsys, "train").endswith(f"--out: '{ro / 'out'}' cannot be written ('{ro}' is on a "
                                                   "read-only file system)")
        assert main(["export", str(run), "-o", str(ro / "best.yaml")]) == 2
        assert "-o: " in _one_line(capsys, "export")
        assert main(["export", str(run)]) == 2  # the default, run/best_assignment.yaml
        assert _one_line(capsys, "export").endswith(f"'{run}' cannot be written ('{run}' is on a read-only "
                                                    "file system)")
        assert main(["report", str(run)]) == 2
        assert _one_line(capsys, "report").endswith(f"'{run}' cannot be written ('{run}' is on a read-only "
                                                    "file system)")
        # the study can still be exported elsewhere
        assert main(["export", str(run), "-o", str(tmp_path / "best.yaml")]) == 0
        assert _state(ro) == before
