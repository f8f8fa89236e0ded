"""The one reader of a user's files (type and size before opening, UTF-8) and the checks of
where a command writes (nothing written, one line)."""

from __future__ import annotations

import os
import socket

import pytest
from _small_fs import read_only_filesystem

from geosearch.util import files
from geosearch.util.errors import ConfigError
from geosearch.util.files import (
    CONFIG_LIMIT,
    check_dir,
    check_out_file,
    check_user_file,
    read_user_bytes,
    read_user_text,
    size_text,
)


def test_sizes_are_said_in_exact_binary_units_or_rounded_decimal_ones():
    assert [size_text(n) for n in (0, 999, 1024, CONFIG_LIMIT, 128 * 2**20, 2 * 2**30)] == [
        "0 bytes", "999 bytes", "1 KiB", "1 MiB", "128 MiB", "2 GiB"]
    assert size_text(41_943_041) == "41.9 MB" and size_text(1500) == "1.5 kB"


def test_a_regular_file_within_its_limit_is_read(tmp_path):
    path = tmp_path / "a.yaml"
    path.write_bytes("\ufeffname: é\n".encode())
    # Rule: UTF-8, a leading byte-order mark dropped; bytes as they are.
    assert read_user_text(path, what="a YAML file") == "name: é\n"
    assert read_user_bytes(path, what="x", limit=100) == path.read_bytes()
    path.write_bytes(b"x" * CONFIG_LIMIT)  # exactly the limit is fine
    assert len(read_user_text(path, what="a YAML file")) == CONFIG_LIMIT
    link = tmp_path / "link.yaml"
    link.symlink_to(path)
    assert check_user_file(link, what="x").st_size == CONFIG_LIMIT  # a link is followed


def _kinds(tmp_path):
    """(path, its kind in words) for every kind of non-regular file a test can make."""
    os.mkfifo(tmp_path / "fifo")
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(tmp_path / "sock"))
    (tmp_path / "dir").mkdir()
    return sock, [(tmp_path / "fifo", "a named pipe (FIFO)"), (tmp_path / "sock", "a socket"),
                  (tmp_path / "dir", "a directory"), ("/dev/null", "a character device")]


def test_pipes_devices_sockets_and_directories_are_refused_before_they_are_opened(tmp_path, monkeypatch):
    opened = []
    monkeypatch.setattr(files, "open", lambda *a, **k: opened.append(a[0]), raising=False)
    sock, kinds = _kinds(tmp_path)
    try:
        for path, kind in kinds:
            with pytest.raises(ConfigError) as e:
                read_user_text(path, what="a search-space YAML file")
            # Rule: one line naming the file and what it is; a FIFO is never opened (that
            # would block until a writer comes).
            assert str(e.value) == f"{path}: is {kind}, expected a search-space YAML file"
    finally:
        sock.close()
    assert opened == []


def test_missing_oversized_and_non_utf8_files_are_one_line_naming_the_file(tmp_path):
    with pytest.raises(ConfigError, match=rf"^{tmp_path / 'nope'}: no such file$"):
        read_user_text(tmp_path / "nope", what="x")
    with pytest.raises(ConfigError, match=r"^nope: no such shipped thing; expected one of: a, b$"):
        check_user_file(tmp_path / "nope", what="x", source="nope", missing="no such shipped thing",
                        allowed=["a", "b"])
    (tmp_path / "f").write_text("")
    with pytest.raises(ConfigError, match=r"^f/g: no such file$"):  # below a file: missing too
        check_user_file(tmp_path / "f" / "g", what="x", source="f/g")
    big = tmp_path / "big.yaml"
    big.write_bytes(b"a: 1\n" + b"#" * (40 * 10**6))
    # Rule: a size over the limit is said from os.stat, before reading (a 40 MB space file
    # took 46 s to parse).
    with pytest.raises(ConfigError, match=rf"^{big}: is 40.0 MB \(40000005 bytes\), more than the 1 MiB "
                                          "a search-space YAML file may hold$"):
        read_user_text(big, what="a search-space YAML file")
    bad = tmp_path / "bad.yaml"
    bad.write_bytes(b"name: caf\xe9\n")
    with pytest.raises(ConfigError, match=rf"^{bad}: is not UTF-8 text \(byte 0xe9 at offset 9\); expected a "
                                          "YAML file$"):
        read_user_text(bad, what="a YAML file")


def test_output_checks_write_nothing_and_name_the_flag(tmp_path):
    (tmp_path / "afile").write_text("x")
    (tmp_path / "adir").mkdir()
    os.mkfifo(tmp_path / "pipe")
    # Rule: a directory is expected where a command writes its files (train --out) ...
    with pytest.raises(ConfigError, match=r"^--out: '.*afile' is a file, expected a directory$"):
        check_dir(tmp_path / "afile", source="--out")
    with pytest.raises(ConfigError, match=r"^--out: '.*afile/sub' is below the file '.*afile', expected a directory"):
        check_dir(tmp_path / "afile" / "sub", source="--out")
    with pytest.raises(ConfigError, match=r"^--out: '.*pipe' is a named pipe \(FIFO\), expected a directory$"):
        check_dir(tmp_path / "pipe", source="--out")
    # ... and a file where it writes one (export -o).
    with pytest.raises(ConfigError, match=r"^-o: '.*adir' is a directory, expected a file \(hint\)$"):
        check_out_file(tmp_path / "adir", source="-o", hint=" (hint)")
    with pytest.raises(ConfigError, match=r"^-o: '.*pipe' is a named pipe \(FIFO\), expected a file$"):
        check_out_file(tmp_path / "pipe", source="-o")
    with pytest.raises(ConfigError, match=r"^'.*afile' is a file, expected a directory$"):  # no flag: no prefix
        check_out_file(tmp_path / "afile" / "x.yaml", source=None)
    before = sorted(p.name for p in tmp_path.iterdir())
    check_dir(tmp_path / "new" / "deeper", source="--out")
    check_out_file(tmp_path / "new" / "best.yaml", source="-o")
    check_out_file(tmp_path / "afile", source="-o")  # an existing file is overwritten
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # checked, not made


def test_a_read_only_mount_is_refused_for_every_output(tmp_path):
    def prepare(ro):
        (ro / "out").mkdir()
        (ro / "best.yaml").write_text("x")

    with read_only_filesystem(tmp_path / "ro", prepare=prepare) as ro:
        # Rule: a read-only file system is said as such, even to root (who passes every
        # permission check).
        for check, path in ((check_dir, ro / "out"), (check_dir, ro / "new" / "dir"),
                            (check_out_file, ro / "best.yaml"), (check_out_file, ro / "new.yaml")):
            with pytest.raises(ConfigError, match=r"^--x: '.*' cannot be written \('.*ro.*' is on a read-only "
                                                  r"file system\)$"):
                check(path, source="--x")
