"""Tests of geosearch.search.storage: which storage a run directory uses, and its errors.

PostgreSQL is tested in tests/test_postgres.py.
"""

from __future__ import annotations

import pytest

from geosearch.errors import ConfigError
from geosearch.search.storage import open_storage


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
