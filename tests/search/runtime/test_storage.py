"""Tests of geosearch.search.runtime.storage: which storage a run directory uses, and its errors.

PostgreSQL is tested in tests/search/runtime/test_postgres.py.
"""

from __future__ import annotations

import subprocess

import pytest
from _small_fs import small_filesystem

from geosearch.errors import ConfigError
from geosearch.search.runtime.storage import (
    MAX_STUDY_NAME,
    check_dir,
    make_dir,
    open_storage,
    study_name_problem,
)


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
    ro = tmp_path / "ro"
    mounted = small_filesystem(ro, "1m")
    try:
        mounted.__enter__()
    except OSError as e:
        pytest.skip(f"{e} (needs root on Linux)")
    try:
        subprocess.run(["mount", "-o", "remount,ro", str(ro)], check=True, capture_output=True)
        with pytest.raises(ConfigError, match=r"--runs-dir: '.*ro/runs' cannot be written"):
            check_dir(ro / "runs", source="--runs-dir")
        with pytest.raises(ConfigError, match="cannot create the directory"):
            make_dir(ro / "runs")
    finally:
        mounted.__exit__(None, None, None)
    check_dir(tmp_path / "new" / "runs", source="--runs-dir")
    assert not (tmp_path / "new").exists()  # checked, not made
