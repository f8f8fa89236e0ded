"""Tests of ``geosearch recover``: real searches whose storage is then damaged.

Two tiny searches train for real (the tiny proxy, 10 steps, a 4-point grid): one in one
process (``study.db``), one with ``--workers 2`` (``journal.log``). Each case copies one,
damages its storage (cut in the middle, or garbage written into the middle), checks that
``export`` refuses it with one line naming ``recover``, recovers it, and compares the
rebuilt study trial by trial with the study read before the damage; then ``report`` and
``export`` read it, and a rerun of the same search trains nothing, or exactly the point
whose record was removed. The rebuild itself is tested with a fake trainer in
tests/search/runtime/test_rebuild.py.
"""

from __future__ import annotations

import os
import random
import shutil
from pathlib import Path

import optuna
import pytest
import yaml
from _flips import flip
from _no_plots import leave_out_plots

from geosearch.cli import main
from geosearch.search.runtime.storage import open_run_study

pytestmark = pytest.mark.usefixtures("no_plots")  # no test here checks a plot: tests/_no_plots.py

optuna.logging.set_verbosity(optuna.logging.WARNING)

REPO = Path(__file__).resolve().parents[2]
PROXY = {"model": "tiny", "batch_size": 2, "eval_batches": 1, "probe_batch_size": 1, "device": "cpu",
         "steps": 10, "eval_every": 5, "probe_every": 5}
GRID = {"attn": ["adamw", "euclidean"], "mlp": ["adamw", "euclidean"]}
FIELDS = ("number", "state", "value", "params", "distributions", "user_attrs", "intermediate_values",
          "constraints", "datetime_start", "datetime_complete")
KINDS = {"sqlite": ("study.db", []), "journal": ("journal.log", ["--workers", "2"])}


def search_args(folder: Path, name: str, kind: str) -> list[str]:
    space = folder / f"{name}.yaml"
    space.write_text(yaml.safe_dump({"version": 1, "name": name, "geometries": GRID, "proxy": PROXY,
                                     "baselines": []}), encoding="utf-8")
    return ["search", "--space", str(space), "--runs-dir", str(folder / "runs"), *KINDS[kind][1]]


def snapshot(run_dir: Path) -> list[dict]:
    return [{f: getattr(t, f) for f in FIELDS} for t in open_run_study(run_dir).get_trials()]


@pytest.fixture(scope="module")
def searched(tmp_path_factory):
    """``{kind: (folder, run dir, search args, the study's trials)}`` of the two real searches."""
    out = {}
    with pytest.MonkeyPatch.context() as mp:  # --workers start this checkout's geosearch
        mp.setenv("PYTHONPATH", str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
        mp.setenv("OMP_NUM_THREADS", "1")
        mp.setenv("MPLBACKEND", "Agg")
        leave_out_plots(mp)  # no test here checks a plot
        for kind in KINDS:
            folder = tmp_path_factory.mktemp(kind)
            args = search_args(folder, "s", kind)
            assert main(args) == 0
            run = folder / "runs" / "s"
            assert (run / KINDS[kind][0]).is_file()
            trials = snapshot(run)
            assert [t["state"] for t in trials] == [optuna.trial.TrialState.COMPLETE] * 4
            out[kind] = (folder, run, args, trials)
    return out


def copy_of(searched, kind: str, tmp_path: Path) -> tuple[Path, list[str]]:
    """A copy of the search of ``kind`` in ``tmp_path``: its run dir and its search args."""
    folder, run, args, _ = searched[kind]
    shutil.copytree(run, tmp_path / "runs" / "s", ignore=shutil.ignore_patterns(".locks"))
    (tmp_path / "s.yaml").write_bytes((folder / "s.yaml").read_bytes())
    moved = [a.replace(str(folder), str(tmp_path)) for a in args]
    return tmp_path / "runs" / "s", moved


def damage(path: Path, how: str) -> bytes:
    size = path.stat().st_size
    if how == "truncated":
        os.truncate(path, size // 2)
    else:
        with open(path, "r+b") as f:
            f.seek(size // 2)
            f.write(b"\x00scribbled\x07" * 400)
    return path.read_bytes()


def one_line(capsys, command: str) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith(f"geosearch {command}: error: ") and len(err[0]) <= 400 + 40
    return err[0]


@pytest.mark.slow
@pytest.mark.parametrize("kind", sorted(KINDS))
@pytest.mark.parametrize("how", ["truncated", "garbage"])
def test_a_damaged_storage_is_rebuilt_trial_by_trial(searched, kind, how, tmp_path, capsys):
    run, _ = copy_of(searched, kind, tmp_path)
    storage = run / KINDS[kind][0]
    damaged = damage(storage, how)
    capsys.readouterr()

    assert main(["export", str(run)]) == 2
    line = one_line(capsys, "export")
    assert f"geosearch recover {run}" in line  # cut short, a journal still reads: it lacks trials
    assert main(["recover", str(run)]) == 0
    said = capsys.readouterr().out
    assert f"rebuilt {storage.name} from" in said and "4 trial records (completed 4)" in said

    assert snapshot(run) == searched[kind][3]
    kept = [p for p in run.iterdir() if p.name.startswith(f"{storage.name}.damaged-")]
    assert len(kept) == 1 and kept[0].read_bytes() == damaged  # kept aside, as it was
    assert main(["report", str(run), "--no-plots"]) == 0
    assert main(["export", str(run), "-o", str(tmp_path / "best.yaml")]) == 0
    assert yaml.safe_load((tmp_path / "best.yaml").read_text())["provenance"]["study"] == "s"


@pytest.mark.slow
def test_the_rerun_after_recovery_trains_nothing(searched, tmp_path, capsys):
    run, args = copy_of(searched, "sqlite", tmp_path)
    damage(run / "study.db", "truncated")
    assert main(["recover", str(run)]) == 0
    capsys.readouterr()
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "resuming, 4 trials done" in out and "\ntrial " not in out
    assert snapshot(run) == searched["sqlite"][3]


@pytest.mark.slow
def test_the_rerun_after_recovery_trains_exactly_the_removed_point(searched, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    run, args = copy_of(searched, "journal", tmp_path)
    before = searched["journal"][3]
    shutil.rmtree(run / "trials" / "2")  # its record and files, gone
    damage(run / "journal.log", "garbage")
    assert main(["recover", str(run)]) == 0
    assert "trials 2 had no record" in capsys.readouterr().out
    assert main(args) == 0  # --workers 2, as before
    after = snapshot(run)
    assert after[:2] == before[:2] and after[3] == before[3]  # the recovered ones, unchanged
    assert after[2]["state"] == optuna.trial.TrialState.FAIL and after[2]["user_attrs"]["status"] == "skipped"
    new = after[4:]  # the queued point; a worker that asked as the queue emptied records a skip
    trained = [t for t in new if t["state"] == optuna.trial.TrialState.COMPLETE]
    assert len(trained) == 1 and trained[0]["params"] == before[2]["params"]  # the removed point, once
    assert all(t["user_attrs"]["status"] in ("completed", "skipped") for t in new)


@pytest.mark.slow
def test_recover_on_a_healthy_storage_changes_nothing(searched, tmp_path, capsys):
    run, _ = copy_of(searched, "journal", tmp_path)
    journal = run / "journal.log"
    data, mtime = journal.read_bytes(), journal.stat().st_mtime_ns
    assert main(["recover", str(run)]) == 0
    assert "nothing to recover, nothing was changed" in capsys.readouterr().out
    assert journal.read_bytes() == data and journal.stat().st_mtime_ns == mtime
    assert not [p for p in run.iterdir() if ".damaged-" in p.name or ".recovering" in p.name]


def test_recover_of_what_is_not_a_run_directory_is_one_line(tmp_path, capsys):
    assert main(["recover", str(tmp_path)]) == 2
    assert one_line(capsys, "recover").endswith(f"{tmp_path}: not a run directory: no study storage "
                                                "here (study.db or journal.log)")
    assert main(["recover", str(tmp_path / "nope")]) == 2
    assert one_line(capsys, "recover").endswith("nope: no such run directory")
    (tmp_path / "afile").write_text("x")
    assert main(["recover", str(tmp_path / "afile")]) == 2
    assert "is a file, expected a run directory" in one_line(capsys, "recover")


@pytest.mark.slow
@pytest.mark.parametrize("kind", sorted(KINDS))
@pytest.mark.parametrize("where", ["storage", "record"])
def test_one_byte_changed_in_a_stored_value_is_refused_and_repaired_from_the_intact_copy(
        searched, kind, where, tmp_path, capsys):
    # Rule: a digit of a val_losses entry changed in study.db or journal.log (or in the
    # trial's record) is never read as valid: export and the search's rerun refuse it in
    # one line naming the trial and `geosearch recover`, which repairs the changed copy
    # from the intact one and says which; the study is then the study before the change.
    run, args = copy_of(searched, kind, tmp_path)
    name = KINDS[kind][0]
    records = {p: p.read_bytes() for p in run.glob("trials/*/trial.json")}
    place = name if where == "storage" else "trial.json"
    changed = flip(run, place, random.Random(0), only_val_losses=True)
    capsys.readouterr()
    for command in (["export", str(run), "-o", str(tmp_path / "best.yaml")], args):
        assert main(command) == 2
        line = one_line(capsys, command[0])
        n = changed.trial
        assert f"trial {n}" in line and f"trials/{n}/trial.json" in line
        assert f"geosearch recover {run}" in line
    assert not (tmp_path / "best.yaml").exists()
    assert main(["recover", str(run)]) == 0
    said = capsys.readouterr().out
    if where == "storage":
        assert f"{name}: holds trials {changed.trial} other than their records" in said
        assert f"rebuilt {name} from" in said and "4 trial records (completed 4)" in said
    else:
        assert said.startswith(f"the records of trials {changed.trial} (trials/<n>/trial.json) did "
                               f"not read or failed their checksums: rewritten from {name}, the "
                               "intact copy")
    assert snapshot(run) == searched[kind][3]
    assert {p: p.read_bytes() for p in run.glob("trials/*/trial.json")} == records
    assert main(["recover", str(run)]) == 0
    assert "nothing to recover" in capsys.readouterr().out


@pytest.mark.slow
def test_recover_refuses_the_study_json_of_another_study(searched, tmp_path, capsys):
    # Rule: a study.json of another study (another name, or the same name and another uid)
    # would drop every trial in a rebuild: refused in one line, nothing changed.
    run, _ = copy_of(searched, "sqlite", tmp_path)
    damage(run / "study.db", "truncated")
    other = searched["journal"][1] / "study.json"  # study 's' too, another uid
    shutil.copy(other, run / "study.json")
    files = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    capsys.readouterr()
    assert main(["recover", str(run)]) == 2
    line = one_line(capsys, "recover")
    assert f"{run / 'study.json'}: records study 's' (uid " in line
    assert "the backup of another study" in line
    after = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    assert {p: b for p, b in after.items() if ".locks" not in p.parts} == {
        p: b for p, b in files.items() if ".locks" not in p.parts}
