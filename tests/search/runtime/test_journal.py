"""The journal file keeps reading through a full disk and a torn record; foreign files are
refused before anything is written to them."""

from __future__ import annotations

import os
from pathlib import Path

import optuna
import pytest
from _small_fs import fill, small_filesystem

from geosearch.util.errors import ConfigError
from geosearch.search.runtime.journal import SafeJournalFile, check_journal_file, open_journal, repair_torn_tail
from geosearch.search.runtime.storage import open_storage

optuna.logging.set_verbosity(optuna.logging.WARNING)
BIG = "x" * 20_000  # a record longer than the pages a full tmpfs still has room in


def _study(path: Path) -> optuna.Study:
    return optuna.create_study(study_name="j", storage=open_journal(path), load_if_exists=True)


def _read(path: Path) -> optuna.Study:
    backend = optuna.storages.journal.JournalFileBackend(str(path))  # Optuna's own reader
    return optuna.load_study(study_name="j", storage=optuna.storages.JournalStorage(backend))


@pytest.fixture
def small_fs(tmp_path):
    """A real 1 MB file system (tmpfs), as full disks happen; skipped where it cannot be mounted."""
    mounted = small_filesystem(tmp_path / "fs", "1m")
    try:
        where = mounted.__enter__()
    except OSError as e:
        pytest.skip(f"{e} (needs root on Linux)")
    yield where
    mounted.__exit__(None, None, None)


def test_a_full_disk_fails_the_write_and_leaves_the_journal_whole(small_fs):
    path = small_fs / "journal.log"
    study = _study(path)
    study.set_user_attr("small", 1)
    size = path.stat().st_size
    filler = fill(small_fs)
    with pytest.raises(OSError):
        study.set_user_attr("big", BIG)  # torn part way by ENOSPC, then rolled back
    assert path.stat().st_size == size and path.read_bytes().endswith(b"\n")
    filler.unlink()
    study.set_user_attr("after", 2)  # the rerun the README recommends
    assert _read(path).user_attrs == {"small": 1, "after": 2}


def test_optuna_alone_tears_the_journal_on_a_full_disk(small_fs):
    """Why SafeJournalFile exists (checked against the installed Optuna): its reader skips a
    torn last line, but the next append glues its record to it (that record is lost) and the
    one after makes the file unreadable."""
    path = small_fs / "journal.log"
    plain = optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(str(path)))
    study = optuna.create_study(study_name="j", storage=plain)
    filler = fill(small_fs)
    with pytest.raises(OSError):
        study.set_user_attr("big", BIG)
    assert not path.read_bytes().endswith(b"\n")  # torn
    filler.unlink()
    try:
        study.set_user_attr("after", 2)
        study.set_user_attr("later", 3)
        attrs = _read(path).user_attrs
    except Exception:  # noqa: BLE001 - the corruption this module prevents
        return
    assert attrs != {"after": 2, "later": 3}, \
        "Optuna's journal survived a torn record: SafeJournalFile may no longer be needed"


def test_a_torn_last_record_is_cut_before_the_next_append(tmp_path):
    path = tmp_path / "journal.log"
    _study(path).set_user_attr("kept", 1)
    whole = path.read_bytes()
    with open(path, "ab") as f:  # a writer killed mid-record, by an older version
        f.write(b'{"op_code":8,"worker_id":"w","trial_id":0,"user_a')
    assert repair_torn_tail(path) == len(whole) and path.read_bytes() == whole
    with open(path, "ab") as f:
        f.write(b'{"op_code":8,"wor')
    storage, _ = open_storage(tmp_path, str(path))
    optuna.load_study(study_name="j", storage=storage).set_user_attr("next", 2)
    assert _read(path).user_attrs == {"kept": 1, "next": 2}
    no_newline = tmp_path / "one.log"
    no_newline.write_bytes(b'{"op_code":0')
    assert repair_torn_tail(no_newline) == 0 and no_newline.read_bytes() == b""


@pytest.mark.parametrize("content, expected", [
    (b"my notes\n", "exists and is not an Optuna journal file"),
    (b"SQLite format 3\x00" + bytes(50), "(an SQLite file is given as sqlite:///PATH)"),
    (b"[1, 2]\n", "exists and is not an Optuna journal file"),
])
def test_a_file_that_is_not_a_journal_is_refused_and_left_alone(tmp_path, content, expected):
    path = tmp_path / "notes.txt"
    path.write_bytes(content)
    with pytest.raises(ConfigError, match=expected):
        open_storage(tmp_path, str(path))
    assert path.read_bytes() == content
    assert not (tmp_path / "notes.txt.lock").exists()


def test_new_empty_and_real_journals_are_accepted(tmp_path):
    check_journal_file(tmp_path / "new.log")
    (tmp_path / "empty.log").write_bytes(b"")
    check_journal_file(tmp_path / "empty.log")
    _study(tmp_path / "real.log")
    check_journal_file(tmp_path / "real.log")
    with pytest.raises(ConfigError, match="is a directory"):
        check_journal_file(tmp_path)
    assert isinstance(open_storage(tmp_path, str(tmp_path / "real.log"))[0], optuna.storages.JournalStorage)
    assert isinstance(SafeJournalFile(tmp_path / "real.log"), optuna.storages.journal.JournalFileBackend)
    assert os.path.getsize(tmp_path / "real.log") > 0


def test_a_journal_whose_first_record_is_being_written_is_accepted(tmp_path):
    path = tmp_path / "journal.log"
    path.write_bytes(b'{"op_code":0,"worker_id":"w","study_na')  # another process is writing it
    check_journal_file(path)
    path.write_bytes(b"hello")  # a file of something else, without a newline
    with pytest.raises(ConfigError, match="not an Optuna journal"):
        check_journal_file(path)


def test_the_lock_of_a_journal_named_by_a_relative_path_resolves(monkeypatch, tmp_path):
    # A writer killed while holding the lock leaves its symlink; Optuna frees it after its
    # grace period by the mtime of what the link points to, so the link must resolve
    # (`geosearch search --runs-dir runs` names the journal relative to the working directory).
    (tmp_path / "runs" / "s").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    journal = SafeJournalFile(os.path.join("runs", "s", "journal.log"))
    journal.lock.acquire()  # as the killed writer left it
    try:
        link = tmp_path / "runs" / "s" / "journal.log.lock"
        assert link.is_symlink() and link.resolve() == (tmp_path / "runs" / "s" / "journal.log").resolve()
        assert os.stat(link).st_mtime > 0  # what the grace period reads: no OSError
    finally:
        journal.lock.release()


def _lines(path: Path) -> list[bytes]:
    return path.read_bytes().splitlines(keepends=True)


@pytest.mark.parametrize("bad, message", [
    (b"garbage\n", r"line 2: not a JSON record \(Expecting value at column 1\); an Optuna journal holds one "
                   r"JSON record per line"),
    (b"\xff\xfe\n", r"line 2: not UTF-8 text \(byte 0xff at column 1\)"),
    (b"[1, 2]\n", r"line 2: not a journal record \(a JSON list, expected an object\)"),
    (b'{"op_code": "x"}\n', r"line 2: not a journal record \(no whole-number op_code\)"),
    (b"\n", r"line 2: not a JSON record \(Expecting value at column 1\)"),
])
def test_a_damaged_line_is_named_by_its_number_before_optuna_reads_the_journal(tmp_path, bad, message):
    path = tmp_path / "journal.log"
    study = _study(path)
    study.set_user_attr("a", 1)
    study.set_user_attr("b", 2)
    lines = _lines(path)
    path.write_bytes(lines[0] + bad + b"".join(lines[1:]))
    content = path.read_bytes()
    # Rule: the first bad line is named (Optuna said "Expecting value: line 1 column 1 (char 0)"
    # of no line of the file), for a search as for a read-only command; nothing is written.
    for read_only in (False, True):
        with pytest.raises(ConfigError, match=rf"^{path}: {message}"):
            open_journal(path, read_only=read_only)
    assert path.read_bytes() == content and sorted(os.listdir(tmp_path)) == ["journal.log"]


@pytest.mark.parametrize("record, problem", [
    (b'{"op_code": 99, "worker_id": "w"}\n', "op_code 99: an operation it does not know"),
    (b'{"op_code": 2, "worker_id": "w"}\n', "op_code 2: no 'study_id' field"),
])
def test_a_record_optunas_replay_fails_on_is_named_by_its_line_never_should_not_reach(tmp_path, record, problem):
    path = tmp_path / "journal.log"
    _study(path).set_user_attr("a", 1)
    n = len(_lines(path))
    with open(path, "ab") as f:
        f.write(record)
    # Rule: Optuna's own words ("Should not reach.", a KeyError) become the line and the record.
    with pytest.raises(ConfigError) as e:
        open_journal(path, read_only=True)
    assert str(e.value) == f"{path}: line {n + 1}: Optuna cannot replay this record ({problem})"
    assert "Should not reach" not in str(e.value)


def test_a_journal_opened_read_only_is_never_written_locked_or_created(tmp_path):
    path = tmp_path / "journal.log"
    _study(path).set_user_attr("a", 1)
    with open(path, "ab") as f:
        f.write(b'{"op_code":8,"wor')  # a torn last record: only a writer cuts it
    content = path.read_bytes()
    storage = open_journal(path, read_only=True)
    study = optuna.load_study(study_name="j", storage=storage)
    # Rule: the study reads back; the torn tail stays; no lock file appears; a write is refused.
    assert study.user_attrs == {"a": 1}
    with pytest.raises(RuntimeError, match="opened for reading only"):
        study.set_user_attr("b", 2)
    assert path.read_bytes() == content and sorted(os.listdir(tmp_path)) == ["journal.log"]
    with pytest.raises(ConfigError, match=r"nope.log: journal file not found"):
        open_journal(tmp_path / "nope.log", read_only=True)
    assert not (tmp_path / "nope.log").exists()


def test_a_pipe_given_as_a_journal_is_refused_without_being_opened(tmp_path):
    os.mkfifo(tmp_path / "pipe.log")
    # Rule: reading a named pipe's first line would block until a writer comes.
    with pytest.raises(ConfigError, match=r"pipe.log: is a named pipe \(FIFO\), expected a journal file"):
        open_storage(tmp_path, str(tmp_path / "pipe.log"))
