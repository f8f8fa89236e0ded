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


@pytest.mark.slow
def test_an_output_inside_a_study_or_a_finished_run_is_refused_before_any_work(
        finished, tmp_path, capsys, monkeypatch):
    # Rule: export -o, report and train --out never write over a study's storage, backup or
    # trial folders, nor into a finished run's folder: one line naming the flag, the path
    # and what it would write over, exit 2, nothing written (export -o study.db wrote YAML
    # over the study and exited 0).
    monkeypatch.chdir(tmp_path)
    (finished / "study.json").write_text("{}")  # the backup a search writes
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "result.json").write_text("{}")  # a finished `train --out out`
    before = _state(tmp_path)
    run = "runs/demo"
    train = ["train", "--assign", "attn=adamw,mlp=adamw", "--model", "tiny"]
    for path, over in [("study.db", "study.db: its storage"),
                       ("study.json", "study.json: its backup"),
                       ("trials/0/trial.json", "trials: its trials' files"),
                       ("study.db-journal", "study.db-journal: its storage")]:
        assert main(["export", run, "-o", f"{run}/{path}"]) == 2
        assert _one_line(capsys, "export") == (
            f"geosearch export: error: -o: '{run}/{path}' would write over the study in {finished} "
            f"({over}); write it elsewhere")
    assert main(["export", run, "--top", "2", "-o", f"{run}/trials"]) == 2
    assert "would write over the study" in _one_line(capsys, "export")
    assert main([*train, "--out", f"{run}/trials/0"]) == 2
    assert "--out: 'runs/demo/trials/0' would write over the study" in _one_line(capsys, "train")
    assert main(["report", f"{run}/trials/0", "--storage", f"{run}/study.db", "--no-plots"]) == 2
    line = _one_line(capsys, "report")
    assert "'runs/demo/trials/0/report.md' would write over the study" in line
    assert main([*train, "--out", "out"]) == 2
    assert _one_line(capsys, "train") == (
        f"geosearch train: error: --out: 'out' would write over the finished run in "
        f"{tmp_path / 'out'} (it holds result.json); write it elsewhere")
    assert main(["export", run, "-o", "out/result.json"]) == 2
    assert "would write over the finished run" in _one_line(capsys, "export")
    assert _state(tmp_path) == before
    # its own outputs beside the study are written as before
    assert main(["export", run, "-o", f"{run}/mine.yaml"]) == 0
    assert (finished / "mine.yaml").is_file()
