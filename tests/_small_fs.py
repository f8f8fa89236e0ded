"""A real small file system for the full-disk tests: a tmpfs mounted for a test, and a
file that fills it to the last byte."""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path


@contextlib.contextmanager
def small_filesystem(where: Path, size: str = "4m") -> Iterator[Path]:
    """A tmpfs of ``size`` mounted at ``where`` (root only); unmounted at the end.

    Raises:
        OSError: it cannot be mounted here (not root, no mount permission, not Linux).
    """
    where.mkdir(parents=True, exist_ok=True)
    try:
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
                           capture_output=True, text=True)
    except FileNotFoundError as e:  # no mount command
        raise OSError(f"cannot mount a tmpfs: {e}") from None
    if r.returncode != 0:
        raise OSError(f"cannot mount a tmpfs: {(r.stderr or r.stdout).strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True)


@contextlib.contextmanager
def read_only_filesystem(where: Path, size: str = "1m",
                         prepare: Callable[[Path], None] | None = None) -> Iterator[Path]:
    """A tmpfs at ``where`` (:func:`small_filesystem`) that ``prepare`` fills, then remounted
    read-only; the test is skipped where it cannot be mounted (not root, not Linux)."""
    import pytest

    try:
        mounted = small_filesystem(where, size)
        mounted.__enter__()
    except OSError as e:
        pytest.skip(f"{e} (needs root on Linux)")
    try:
        if prepare is not None:
            prepare(where)
        subprocess.run(["mount", "-o", "remount,ro", str(where)], check=True, capture_output=True)
        yield where
    finally:
        mounted.__exit__(None, None, None)


def fill(folder: Path) -> Path:
    """Fill the file system of ``folder`` to the last byte; returns the filler file."""
    filler = folder / "filler.bin"
    with open(filler, "wb", buffering=0) as f:
        for chunk in (1 << 20, 1 << 12, 1):
            try:
                while True:
                    f.write(b"\0" * chunk)
            except OSError:
                continue
    return filler
