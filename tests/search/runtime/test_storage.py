"""Tests of geosearch.search.runtime.storage: which storage a run directory uses, and its
errors; the masking of a URL's secrets on its own is in tests/search/runtime/test_urls.py.

PostgreSQL is tested in tests/search/runtime/test_postgres.py; the secrets end to end (a
search, its files, its workers' command lines) in tests/faults/test_secrets.py.
"""

from __future__ import annotations

import hashlib
import os
import sqlite3
import subprocess
import sys

import optuna
import pytest
import yaml
from _secret_urls import ABSENT, FORMS, RAW_AT
from _small_fs import read_only_filesystem

from geosearch.util.errors import ConfigError
from geosearch.search.runtime.rdb import REQUIRED_TABLES, sqlite_tables
from geosearch.search.runtime.storage import (
    MAX_STUDY_NAME,
    check_dir,
    check_outside_study,
    make_dir,
    open_run_study,
    open_storage,
    study_name_problem,
)
from geosearch.util.urls import STORAGE_ENV, mask_url, raw_at_in_password

optuna.logging.set_verbosity(optuna.logging.WARNING)


@pytest.mark.slow
def test_bad_storage_url_is_one_config_error(tmp_path):
    with pytest.raises(ConfigError, match=r"^--storage: cannot open the storage 'bogus://x'"):
        open_storage(tmp_path, "bogus://x")
    with pytest.raises(ConfigError, match=r"'postgresql://me:\*\*\*@db/x'"):  # password masked
        open_storage(tmp_path, "postgresql://me:secret@db/x")


def test_storage_kind_follows_workers_and_what_exists(tmp_path):
    _, desc = open_storage(tmp_path / "a", workers=1)
    assert desc.startswith("sqlite:///") and desc.endswith("a/study.db")
    _, desc = open_storage(tmp_path / "b", workers=3)
    assert desc == f"journal file {tmp_path / 'b' / 'journal.log'}"
    (tmp_path / "b" / "journal.log").touch()
    assert open_storage(tmp_path / "b", workers=1)[1].startswith("journal file")  # a rerun keeps it


def test_study_names_come_from_a_safe_alphabet_and_length():
    for good in ("default", "t", "paper-1", "a.b_c+d", "x" * MAX_STUDY_NAME):
        assert study_name_problem(good) is None
    for bad in ("", ".x", "-x", "+x", "a/b", "a b", "a\nb", "é", None, 3, "x" * (MAX_STUDY_NAME + 1)):
        problem = study_name_problem(bad)
        assert problem and "\n" not in problem and len(problem) < 200


def test_a_read_only_runs_dir_is_refused_before_anything_is_written(tmp_path):
    with read_only_filesystem(tmp_path / "ro") as ro:
        with pytest.raises(ConfigError, match=r"--runs-dir: '.*ro/runs' cannot be written"):
            check_dir(ro / "runs", source="--runs-dir")
        with pytest.raises(ConfigError, match="cannot create the directory"):
            make_dir(ro / "runs")
    check_dir(tmp_path / "new" / "runs", source="--runs-dir")
    assert not (tmp_path / "new").exists()  # checked, not made


def test_open_storage_opens_the_full_url_of_a_masked_one(tmp_path, monkeypatch):
    opened = []

    def fake_rdb(url, **kwargs):
        opened.append(url)
        raise optuna.exceptions.StorageInternalError(
            f"(psycopg2.OperationalError) FATAL: password {FORMS[0].secret} refused at {url}")

    monkeypatch.setattr(optuna.storages, "RDBStorage", fake_rdb)
    url = FORMS[0].url(ABSENT)
    monkeypatch.setenv(STORAGE_ENV, url)
    with pytest.raises(ConfigError) as e:
        open_storage(tmp_path, mask_url(url))
    assert opened[0].endswith(url.split("://", 1)[1])  # the full URL (with the driver installed)
    assert FORMS[0].leaks(str(e.value)) == []
    assert str(e.value).startswith(f"--storage: cannot open the storage {mask_url(url)!r}: "
                                   "(psycopg2.OperationalError) FATAL: password *** refused at ")


def test_a_raw_at_in_the_password_is_refused_before_connecting(tmp_path, monkeypatch):
    monkeypatch.setattr(optuna.storages, "RDBStorage", lambda *a, **k: pytest.fail("connected"))
    with pytest.raises(ConfigError, match=r"^--storage: cannot open the storage "
                                          r"'postgresql://me:\*\*\*@127.0.0.1:9/x': more than one '@'"
                                          r".* as %40$") as e:
        open_storage(tmp_path, RAW_AT.url(ABSENT))
    assert RAW_AT.leaks(str(e.value)) == []
    assert "\n" not in str(e.value) and len(str(e.value)) < 400
    assert raw_at_in_password(RAW_AT.url(ABSENT)) is True
    assert raw_at_in_password(FORMS[2].url(ABSENT)) is False  # the same, URL-encoded


# --------------------------------------------------------------------------- not an Optuna storage
def _foreign(path):
    """Another application's SQLite database: one table of its own."""
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE notes (body TEXT)")
    con.execute("INSERT INTO notes VALUES ('mine')")
    con.commit()
    con.close()
    return path


def _state(folder):
    """Every file below ``folder`` with its bytes' hash: what a refused command must leave."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def test_read_only_opens_refuse_an_empty_file_or_a_foreign_database_and_change_nothing(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "study.db").write_bytes(b"")
    before = _state(tmp_path)
    # Rule: an empty study.db is not opened (Optuna would write its 13 tables into it); the
    # message names the file, not --storage, which was not given.
    with pytest.raises(ConfigError, match=rf"^{run / 'study.db'}: is an empty file, not an Optuna storage"):
        open_storage(run, read_only=True)
    foreign = _foreign(tmp_path / "foreign.db")
    before = _state(tmp_path)
    # Rule: another application's database is refused, naming --storage when it was given.
    with pytest.raises(ConfigError, match=r"^--storage: .*foreign.db: is another application's database "
                                          r"\(tables: notes\), not an Optuna storage; it is left as it is$"):
        open_storage(run, f"sqlite:///{foreign}", read_only=True)
    con = sqlite3.connect(foreign)
    con.execute("CREATE TABLE version_info (x)")  # one table of Optuna's name is not enough
    con.commit()
    con.close()
    before = _state(tmp_path)
    with pytest.raises(ConfigError, match=r"holds only part of an Optuna storage \(no table studies, trials\)"):
        open_storage(run, f"sqlite:///{foreign}", read_only=True)
    with pytest.raises(ConfigError, match=r"^--storage: .*nope.db: no such SQLite file$"):
        open_storage(run, f"sqlite:///{tmp_path / 'nope.db'}", read_only=True)
    assert _state(tmp_path) == before


def test_search_may_fill_a_new_or_empty_file_but_not_a_foreign_database(tmp_path):
    foreign = _foreign(tmp_path / "foreign.db")
    before = _state(tmp_path)
    # Rule: search refuses another application's non-empty database instead of adopting it.
    with pytest.raises(ConfigError, match=r"^--storage: .*foreign.db: is another application's database "
                                          r"\(tables: notes\), not an Optuna storage; it is left as it is: "
                                          "name a new file or an Optuna storage$"):
        open_storage(tmp_path / "run", f"sqlite:///{foreign}")
    assert _state(tmp_path) == before and not (tmp_path / "run").exists()
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "study.db").write_text("my notes\n")
    # Rule: the run directory's own file is named by its path, not as --storage.
    with pytest.raises(ConfigError, match=r"^/.*run/study.db: is not an SQLite database \(nor an Optuna storage\)$"):
        open_storage(tmp_path / "run")
    # Rule: a new file, or an empty one, becomes a new Optuna storage.
    (tmp_path / "empty.db").write_bytes(b"")
    for name in ("new.db", "empty.db"):
        storage, _ = open_storage(tmp_path, f"sqlite:///{tmp_path / name}")
        optuna.create_study(study_name="s", storage=storage)
        assert set(REQUIRED_TABLES) <= set(sqlite_tables(tmp_path / name))


def test_a_study_opened_read_only_reads_everything_and_stays_byte_identical(tmp_path):
    storage, _ = open_storage(tmp_path / "run")
    study = optuna.create_study(study_name="s", storage=storage)
    study.set_user_attr("a", 1)
    study.enqueue_trial({"x": 1.0})
    before = _state(tmp_path)
    loaded = open_run_study(tmp_path / "run", read_only=True)
    # Rule: what was stored reads back; a write through the read-only connection fails.
    assert loaded.user_attrs == {"a": 1} and len(loaded.get_trials()) == 1
    with pytest.raises(Exception, match="(?i)readonly|read-only|commit"):
        loaded.set_user_attr("b", 2)
    assert _state(tmp_path) == before


def test_a_hot_sqlite_journal_is_said_rather_than_rolled_back(tmp_path):
    storage, _ = open_storage(tmp_path / "run")
    optuna.create_study(study_name="s", storage=storage)
    db = tmp_path / "run" / "study.db"
    # a writer killed mid-transaction leaves a hot journal (its lock gone with it)
    code = ("import sqlite3, os; c = sqlite3.connect(os.environ['DB']); c.execute('PRAGMA cache_size=1'); "
            "c.execute('BEGIN'); c.execute('CREATE TABLE big (x)'); "
            "[c.execute('INSERT INTO big VALUES (?)', ('x' * 500,)) for _ in range(3000)]; os._exit(0)")
    subprocess.run([sys.executable, "-c", code], env={**os.environ, "DB": str(db)}, check=True)
    assert (tmp_path / "run" / "study.db-journal").stat().st_size > 0
    before = _state(tmp_path)
    # Rule: a read-only command cannot roll it back: it says so, and what to do.
    with pytest.raises(ConfigError, match=r"study.db: a write that was cut off left study.db-journal to roll "
                                          r"back, which a read-only command does not do; rerun the search"):
        open_run_study(tmp_path / "run", read_only=True)
    assert _state(tmp_path) == before
    assert open_run_study(tmp_path / "run").study_name == "s"  # a writer rolls it back


def test_a_foreign_database_is_byte_identical_after_export_report_and_search_refuse_it(tmp_path, monkeypatch):
    from geosearch.cli import main

    monkeypatch.chdir(tmp_path)
    (tmp_path / "s.yaml").write_text(yaml.safe_dump({
        "version": 1, "geometries": {"attn": ["adamw"], "mlp": ["adamw"]},
        "proxy": {"model": "tiny", "steps": 2, "batch_size": 2, "device": "cpu"}}))
    (tmp_path / "run").mkdir()
    _foreign(tmp_path / "run" / "study.db")
    _foreign(tmp_path / "foreign.db")
    before = _state(tmp_path)
    for argv in (["export", "run"], ["report", "run"], ["export", "run", "--storage", "sqlite:///foreign.db"],
                 ["report", "run", "--storage", "sqlite:///foreign.db"],
                 ["search", "--space", "s.yaml", "--runs-dir", "runs", "--storage", "sqlite:///foreign.db"]):
        assert main(argv) == 2, argv
        # Rule: refused before anything is opened for writing: the bytes are as they were,
        # and no file appears beside them (no -journal, no run directory).
        assert _state(tmp_path) == before, argv


def test_an_output_inside_a_study_or_a_finished_run_is_refused(tmp_path):
    # Rule: the nearest run directory above an output path decides: its storage (and
    # SQLite's side files, a damaged copy), backup, space and folders are refused, the
    # commands' own outputs are not; a finished run's folder below it is refused; links
    # are followed.
    run = tmp_path / "runs" / "s"
    (run / "trials" / "0").mkdir(parents=True)
    (run / "study.db").write_bytes(b"")
    for inside in ("study.db", "study.db-wal", "study.db.damaged-20260101T000000", "study.json",
                   "space.yaml", "trials/0/config.yaml", "trials/7", "workers/worker0.log",
                   "artifacts/x"):
        with pytest.raises(ConfigError,
                           match=r"^-o: .* would write over the study in .*; write it elsewhere$"):
            check_outside_study(run / inside, source="-o")
    for own in ("best_assignment.yaml", "top/rank1-trial0.yaml", "report.md", "plots"):
        check_outside_study(run / own, source="-o")
    (tmp_path / "link").symlink_to(run / "trials")
    with pytest.raises(ConfigError, match="trials: its trials' files"):
        check_outside_study(tmp_path / "link" / "0", source="--out", folder=True)
    done = tmp_path / "done"
    (done / "runs" / "t").mkdir(parents=True)
    (done / "result.json").write_text("{}")
    finished = r"would write over the finished run in .*done \(it holds result.json\)"
    with pytest.raises(ConfigError, match=finished):
        check_outside_study(done, source="--out", folder=True)
    (done / "runs" / "t" / "journal.log").write_text("")
    # a study inside a run's folder: its own outputs
    check_outside_study(done / "runs" / "t" / "best_assignment.yaml", source="-o")
