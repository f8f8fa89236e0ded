"""The files a user hands the tool, and the places it writes to: checked before use.

Every reader of a user's file goes through :func:`check_user_file` (the file's type and
size, from ``os.stat``, before it is opened) and :func:`read_user_text` /
:func:`read_user_bytes` (read with that limit, text strictly UTF-8): a named pipe, a device
or a directory where a file is expected would block the process or read forever, and a
config of many megabytes takes minutes to parse. Every command that writes checks where
first, writing nothing (:func:`check_dir`, :func:`check_out_file`): a path that is a file
where a directory is expected, or the reverse, or a directory this process cannot write
to (permissions, a read-only mount), is one line before any work. Each check raises a
one-line :class:`~geosearch.util.errors.ConfigError` naming the file.

The limits (``docs/reliability.md``, "Bad inputs"):

* :data:`CONFIG_LIMIT`, 1 MiB: search spaces, assignments, ``train --config``,
  ``meta.json`` / ``meta.yaml`` / ``meta.pkl`` of token files, ``config.json`` of ``hf:PATH``
  models;
* :data:`TOKENIZER_LIMIT`, 128 MiB: ``tokenizer.json`` (the largest common ones are
  tens of MB);
* :data:`TEXT_CORPUS_LIMIT`, 2 GiB: a text corpus, which is read into memory (larger
  data goes into ``train.bin`` / ``val.bin`` token files, which are memory-mapped).

Example:
    >>> text = read_user_text("space.yaml", what="a search-space YAML file")  # doctest: +SKIP
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable
from pathlib import Path

from geosearch.util.errors import ConfigError

__all__ = ["CONFIG_LIMIT", "TEXT_CORPUS_LIMIT", "TOKENIZER_LIMIT", "check_dir", "check_out_file",
           "check_user_file", "file_kind", "read_user_bytes", "read_user_text", "size_text"]

CONFIG_LIMIT = 2**20
"""The largest YAML or JSON config a user may give (search space, assignment, train config,
a token directory's meta file, a model's ``config.json``): 1 MiB, far above any real one."""
TOKENIZER_LIMIT = 128 * 2**20
"""The largest ``tokenizer.json``: 128 MiB."""
TEXT_CORPUS_LIMIT = 2 * 2**30
"""The most bytes of text a corpus may hold (it is read into memory): 2 GiB."""

_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a named pipe (FIFO)"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
          (stat.S_ISSOCK, "a socket"), (stat.S_ISREG, "a regular file"))


def file_kind(mode: int) -> str:
    """What ``st_mode`` says a path is, in words: ``"a named pipe (FIFO)"``, ``"a directory"``..."""
    return next((word for test, word in _KINDS if test(mode)), "not a regular file")


def size_text(n: int) -> str:
    """A size in words: ``"1 MiB"``, ``"41.9 MB"`` (exact binary units, else decimal)."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale} {unit}"
    for unit, scale in (("GB", 10**9), ("MB", 10**6), ("kB", 10**3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} bytes"


def check_user_file(
    path: str | os.PathLike,
    *,
    what: str,
    limit: int | None = None,
    source: str | None = None,
    missing: str = "no such file",
    allowed: Iterable[object] | None = None,
) -> os.stat_result:
    """Check, without opening it, that ``path`` is a regular file of at most ``limit`` bytes.

    Args:
        path: the file (a symbolic link is followed).
        what: what it should be, for the message: ``"a search-space YAML file"``.
        limit: the most bytes it may hold; ``None``: any size.
        source: what to name in the message (default: the path).
        missing: the problem said when it does not exist.
        allowed: listed after a missing file's or a directory's problem (e.g. shipped names).

    Returns:
        Its ``os.stat`` result.

    Raises:
        ConfigError: it does not exist, cannot be looked at, is a directory, a named pipe,
            a device or a socket, or is larger than ``limit``.
    """
    src = source or os.fspath(path)
    try:
        st = os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        raise ConfigError(missing, source=src, allowed=allowed) from None
    except OSError as e:
        raise ConfigError(f"cannot read the file ({e.strerror or e})", source=src) from None
    if not stat.S_ISREG(st.st_mode):
        raise ConfigError(f"is {file_kind(st.st_mode)}, expected {what}", source=src,
                          allowed=allowed if stat.S_ISDIR(st.st_mode) else None)
    if limit is not None and st.st_size > limit:
        exact = "" if size_text(st.st_size) == f"{st.st_size} bytes" else f" ({st.st_size} bytes)"
        raise ConfigError(f"is {size_text(st.st_size)}{exact}, more than the {size_text(limit)} "
                          f"{what} may hold", source=src)
    return st


def read_user_bytes(
    path: str | os.PathLike,
    *,
    what: str,
    limit: int,
    source: str | None = None,
    missing: str = "no such file",
    allowed: Iterable[object] | None = None,
) -> bytes:
    """The bytes of a user's file, checked by :func:`check_user_file` first (same arguments).

    Raises:
        ConfigError: as :func:`check_user_file`; it cannot be read; it grew past ``limit``
            while being read.
    """
    src = source or os.fspath(path)
    check_user_file(path, what=what, limit=limit, source=source, missing=missing, allowed=allowed)
    try:
        with open(path, "rb") as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):  # replaced since it was checked
                raise ConfigError(f"is no longer a regular file, expected {what}", source=src)
            data = f.read(limit + 1)
    except OSError as e:
        raise ConfigError(f"cannot read the file ({e.strerror or e})", source=src) from None
    if len(data) > limit:
        raise ConfigError(f"is more than the {size_text(limit)} {what} may hold", source=src)
    return data


def read_user_text(
    path: str | os.PathLike,
    *,
    what: str,
    limit: int = CONFIG_LIMIT,
    source: str | None = None,
    missing: str = "no such file",
    allowed: Iterable[object] | None = None,
) -> str:
    """The text of a user's file (UTF-8; a leading byte-order mark is dropped), read by
    :func:`read_user_bytes` (same arguments; ``limit`` defaults to :data:`CONFIG_LIMIT`).

    Raises:
        ConfigError: as :func:`read_user_bytes`; the bytes are not UTF-8 (naming the first
            bad byte and its offset).
    """
    data = read_user_bytes(path, what=what, limit=limit, source=source, missing=missing,
                           allowed=allowed)
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise ConfigError(f"is not UTF-8 text (byte 0x{data[e.start]:02x} at offset {e.start}); "
                          f"expected {what}", source=source or os.fspath(path)) from None


# --------------------------------------------------------------------------- output
def _read_only_fs(path: str | os.PathLike) -> bool:
    try:
        return bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except (OSError, AttributeError):  # no statvfs (Windows)
        return False


def _not_writable(path: Path) -> str:
    """Why this process cannot write into the existing ``path``, in words."""
    if _read_only_fs(path):
        return f"{os.fspath(path)!r} is on a read-only file system"
    return f"{os.fspath(path)!r} is read-only to this user"


def check_dir(path: str | os.PathLike, *, source: str | None) -> None:
    """Check, writing nothing, that ``path`` is or can be made a writable directory: it, or
    its nearest existing ancestor, is a directory this process may write to.

    Raises:
        ConfigError: naming ``source`` (the flag, or ``None``) and the path.
    """
    if not os.fspath(path):  # Path("") is the working directory: say what was given
        raise ConfigError("an empty path, expected a directory", source=source)
    p = Path(path)
    while not p.exists():
        if p.is_symlink():  # a dangling link
            raise ConfigError(f"{os.fspath(p)!r} is a broken symbolic link", source=source)
        if p.parent == p:
            break
        p = p.parent
    if p.exists() and not p.is_dir():
        what = "is a file" if os.fspath(p) == os.fspath(path) else f"is below the file {os.fspath(p)!r}"
        if os.fspath(p) == os.fspath(path) and not p.is_file():
            what = f"is {file_kind(p.stat().st_mode)}"
        raise ConfigError(f"{os.fspath(path)!r} {what}, expected a directory", source=source)
    if not os.access(p, os.W_OK | os.X_OK) or _read_only_fs(p):
        raise ConfigError(f"{os.fspath(path)!r} cannot be written ({_not_writable(p)})", source=source)


def check_out_file(path: str | os.PathLike, *, source: str | None, hint: str = "") -> None:
    """Check, writing nothing, that a file can be written at ``path``: it is not a directory
    (nor a pipe or a device), it is writable when it exists, and its folder is or can be
    made a writable directory (:func:`check_dir`).

    Args:
        path: the file to be written.
        source: the flag that named it (``"-o"``), or ``None``.
        hint: appended to the message about a directory (``"; --top K > 1 writes one"``).

    Raises:
        ConfigError: naming ``source`` and the path.
    """
    p = Path(path)
    if p.exists():
        mode = p.stat().st_mode
        if not stat.S_ISREG(mode):
            raise ConfigError(f"{os.fspath(path)!r} is {file_kind(mode)}, expected a file{hint}",
                              source=source)
        if not os.access(p, os.W_OK) or _read_only_fs(p):
            raise ConfigError(f"{os.fspath(path)!r} cannot be written ({_not_writable(p)})",
                              source=source)
    check_dir(p.parent, source=source)
