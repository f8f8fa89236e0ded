"""Tests of geosearch.util.urls: a storage URL's secrets masked in every form, in
messages and command lines, and handed to a worker through its environment.

The secrets end to end (a search, its files, its workers' command lines) are in
tests/faults/test_secrets.py; opening a masked URL in tests/search/runtime/test_storage.py.
"""

from __future__ import annotations

import pytest
from _secret_urls import ABSENT, FORMS, RAW_AT

from geosearch.util.urls import (
    STORAGE_ENV,
    hide_secrets,
    mask_argv,
    mask_url,
    redact,
    storage_url,
)


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
