"""Tests of geosearch.search.runtime.storage: which storage a run directory uses, its errors,
and the masking of a storage URL's secrets.

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

from geosearch.errors import ConfigError
from geosearch.search.runtime import storage as storage_module
from geosearch.search.runtime.rdb import REQUIRED_TABLES, sqlite_tables
from geosearch.search.runtime.storage import (
    MAX_STUDY_NAME,
    STORAGE_ENV,
    check_dir,
    hide_secrets,
    make_dir,
    mask_argv,
    mask_url,
    open_run_study,
    open_storage,
    redact,
    storage_url,
    study_name_problem,
)

optuna.logging.set_verbosity(optuna.logging.WARNING)


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


@pytest.mark.parametrize("form", [*FORMS, RAW_AT], ids=lambda f: f.form)
def test_mask_url_hides_a_secret_in_every_form(form):
    url = form.url(ABSENT)
    shown = mask_url(url)
    assert form.leaks(shown) == [] and "***" in shown
    assert shown.startswith("postgresql://me") and "127.0.0.1:9/x" in shown  # the rest stays
    assert mask_url(shown) == shown  # masking twice changes nothing
    assert mask_argv(["geosearch", "--storage", url]) == ["geosearch", "--storage", shown]
    assert mask_argv([f"--storage={url}"]) == [f"--storage={shown}"]


def test_mask_url_renders_with_sqlalchemy_and_leaves_the_rest_alone():
    assert mask_url("postgresql://me:s3cret@db:5432/x") == "postgresql://me:***@db:5432/x"
    assert mask_url("postgresql://me:a/b@db/x") == "postgresql://me:***@db/x"
    assert mask_url("mysql+pymysql://me:p%40ss@db/x") == "mysql+pymysql://me:***@db/x"
    assert (mask_url("postgresql://me@db/x?sslmode=require&password=a%2Fb")
            == "postgresql://me@db/x?password=***&sslmode=require")
    for key in ("PassWord", "passwd", "sslpassword", "pwd", "pass%77ord"):  # any case; decoded
        assert "zz9" not in mask_url(f"postgresql://me@db/x?{key}=zz9"), key
    assert mask_url("postgresql://me@corp:pw9@db/x") == "postgresql://me%40corp:***@db/x"
    # no secret: as given, not re-rendered (SQLAlchemy would quote ':' and '@' of the path)
    for same in ("sqlite:////runs/a:b@c/study.db", "sqlite:///rel/my db.db", "bogus://nowhere",
                 "postgresql://me@db:5432/x?sslmode=require", "runs/x/journal.log", "journal.log",
                 "C:/runs/x/password=1", ""):
        assert mask_url(same) == same


def test_a_url_sqlalchemy_cannot_parse_is_masked_conservatively():
    # a port that is no number: SQLAlchemy refuses it (ValueError)
    assert (mask_url("postgresql://me:zz9@db:port/x?password=yy8&a=1")
            == "postgresql://me:***@db:port/x?password=***&a=1")
    # a raw '@' in the password: masked up to the last '@', whatever SQLAlchemy makes of it
    assert mask_url("postgresql://me:zz9@yy8@db/x") == "postgresql://me:***@db/x"
    assert mask_url("postgresql://me:zz9@y/y8@db/x") == "postgresql://me:***@db/x"
    # a scheme SQLAlchemy does not take (a '.'): every password-like parameter is masked too
    assert (mask_url("my.db://me:zz9@db/x?a=1;password=yy8&PWD=xx7")
            == "my.db://me:***@db/x?a=1;password=***&PWD=***")


def test_redact_masks_every_secret_of_the_storage_in_a_message():
    url = FORMS[-2].url(ABSENT)  # "all": / : @ %
    text = f"FATAL: password {FORMS[-2].secret!r} for 'me' refused (dsn {url}); spelled {FORMS[-2].spelled}"
    shown = redact(text, url)
    assert FORMS[-2].leaks(shown) == [] and shown.startswith("FATAL: password '***' for 'me' refused")
    assert mask_url(url) in shown
    query = FORMS[-1].url(ABSENT)
    assert FORMS[-1].leaks(redact(f"bad password {FORMS[-1].secret}", query)) == []
    # any URL in the text is masked, even without the storage; other text stays
    assert redact("at postgresql://u:zz9@h/x: refused.", None) == "at postgresql://u:***@h/x: refused."
    assert redact("cannot open 'sqlite:///a:b@c.db': bad", "sqlite:///a:b@c.db") == \
        "cannot open 'sqlite:///a:b@c.db': bad"


@pytest.mark.parametrize("form", FORMS, ids=lambda f: f.form)
def test_a_worker_gets_the_full_url_in_its_environment_and_its_masked_form_on_its_command_line(
        form, monkeypatch):
    url = form.url(ABSENT)
    shown, env = hide_secrets(url)
    assert shown == mask_url(url) and env == {STORAGE_ENV: url}
    monkeypatch.setenv(STORAGE_ENV, url)
    assert storage_url(shown) == url  # what the worker opens
    assert form.leaks(redact(f"the driver said {form.secret}", shown)) == []  # its messages too
    assert storage_url("postgresql://me:***@other/x") == "postgresql://me:***@other/x"  # not its form
    assert storage_url("sqlite:///x.db") == "sqlite:///x.db"
    monkeypatch.delenv(STORAGE_ENV)
    assert storage_url(shown) == shown
    assert hide_secrets("sqlite:///x.db") == ("sqlite:///x.db", {})  # no secret: no environment
    assert hide_secrets("journal.log") == ("journal.log", {})


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
    assert storage_module._ambiguous(FORMS[2].url(ABSENT)) is False  # the same, URL-encoded


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
