"""Reading a corpus's files: the walk, the train/validation split by whole files, bytes or
a tokenizer's ids, the token-id range check, and the SHA-256 digest of what was read.

Nothing here knows what a :class:`~geosearch.proxy.data.Corpus` is: these functions take
paths and return tensors or records; :mod:`geosearch.proxy.data` assembles corpora from them.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from geosearch.util.errors import ConfigError
from geosearch.util.files import TOKENIZER_LIMIT, read_user_text

EXCLUDED_STDLIB_DIRS = frozenset({"site-packages", "dist-packages", "test", "tests", "idle_test",
                                  "__pycache__"})
TOKENIZER_FILE = "tokenizer.json"
ID_SCAN_CHUNK = 2**24  # token ids converted at a time when checking their range
DIGEST_CHUNK = 2**20  # bytes read at a time when hashing a file
DIGEST_NAMED_FILES = 16
"""A corpus of at most this many files records each file's SHA-256 by name in its
:meth:`Corpus.digest` (so that a changed file can be named); larger ones only the total."""


# --------------------------------------------------------------------------- tokenizer
class Tokenizer:
    """A Hugging Face ``tokenizers.Tokenizer`` read from a local file, and where it came from."""

    def __init__(self, tokenizer: Any, path: Path) -> None:
        self.tokenizer, self.path = tokenizer, path
        self.vocab_size: int = tokenizer.get_vocab_size(with_added_tokens=True)

    @classmethod
    def load(cls, path: str | os.PathLike) -> Tokenizer:
        """Read ``path`` (a ``tokenizer.json`` or a directory holding one).

        Raises:
            ConfigError: no such file, not a regular file, more than :data:`TOKENIZER_LIMIT`
                bytes, not UTF-8, ``tokenizers`` not installed, or not a tokenizer.
        """
        p = Path(path).expanduser()
        if p.is_dir():
            p = p / TOKENIZER_FILE
        what = f"a Hugging Face {TOKENIZER_FILE} or a directory holding one"
        text = read_user_text(p, what=what, limit=TOKENIZER_LIMIT, missing=f"no such file; expected {what}",
                              source=f"{p}: tokenizer")
        try:
            from tokenizers import Tokenizer
        except ImportError:
            raise ConfigError("reading a tokenizer needs Hugging Face tokenizers, which is not "
                              "installed; install it with: pip install 'geosearch[tokenizers]'",
                              source=str(p), key="tokenizer") from None
        try:
            return cls(Tokenizer.from_str(text), p)
        except Exception as e:  # noqa: BLE001 - the Rust side raises plain Exceptions
            first = (str(e).strip().splitlines() or [""])[0]
            raise ConfigError(f"cannot read it as a Hugging Face tokenizer ({first})",
                              source=str(p), key="tokenizer") from None

    def stamp(self) -> tuple:
        """The file's identity for the corpus cache."""
        return tuple(file_stamps([self.path]))

    def read(self, files: list[Path], source: str) -> torch.Tensor:
        """The files' text (UTF-8, bad bytes replaced) encoded one file at a time, concatenated."""
        texts = [f.read_bytes().decode("utf-8", errors="replace") for f in files]
        encoded = self.tokenizer.encode_batch(texts)
        dtype = np.uint16 if self.vocab_size <= 2**16 else np.uint32
        ids = np.concatenate([np.asarray(e.ids, dtype=dtype) for e in encoded]) if encoded else []
        if len(ids) == 0:
            raise ConfigError("the text is empty; expected at least one non-empty file", source=source)
        data = torch.from_numpy(ids)  # (N,) token ids
        check_ids(data, self.vocab_size, str(self.path))
        return data


Reader = Callable[[list[Path], str], torch.Tensor]
"""Files -> one 1-D tensor of ids: :func:`read_bytes` or :meth:`Tokenizer.read`."""


def reader_of(tok: Tokenizer | None) -> tuple[Reader, int, str]:
    """How text is read: the reader, its vocabulary size, and a phrase for the source."""
    if tok is None:
        return read_bytes, 256, "bytes"
    return tok.read, tok.vocab_size, f"tokens of {tok.path}"



# --------------------------------------------------------------------------- helpers
def walk_files(root: Path, stdlib: bool) -> list[Path]:
    """Regular files below root in sorted path order (by path components), skipping the
    excluded directories (stdlib) or hidden files and directories (user data)."""
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        if stdlib:
            dirnames[:] = [d for d in dirnames if d not in EXCLUDED_STDLIB_DIRS]
        else:
            dirnames[:] = [d for d in dirnames if not d.startswith(".")]
            filenames = [f for f in filenames if not f.startswith(".")]
        out.extend(Path(dirpath) / f for f in filenames)
    return sorted((f for f in out if f.is_file()), key=lambda f: f.relative_to(root).parts)


def file_stamps(files: list[Path]) -> list[tuple]:
    """(path, size, mtime) of each existing file, so an edited file is reloaded."""
    return [(str(f), s.st_size, s.st_mtime_ns) for f in files if f.exists() for s in [f.stat()]]


def n_held_out(n_files: int, val_fraction: float) -> int:
    return sum(held_out(i, val_fraction) for i in range(n_files))


def held_out(i: int, val_fraction: float) -> bool:
    """File i goes to validation when it crosses the next multiple of 1/val_fraction."""
    return int((i + 1) * val_fraction) > int(i * val_fraction)


def split_files(files: list[Path], val_fraction: float, source: str,
                 read: Reader) -> tuple[torch.Tensor, torch.Tensor]:
    train = [f for i, f in enumerate(files) if not held_out(i, val_fraction)]
    val = [f for i, f in enumerate(files) if held_out(i, val_fraction)]
    return read(train, source), read(val, source)


def read_bytes(files: list[Path], source: str) -> torch.Tensor:
    data = b"".join(f.read_bytes() for f in files)
    if not data:
        raise ConfigError("the text is empty; expected at least one non-empty file", source=source)
    return torch.frombuffer(bytearray(data), dtype=torch.uint8)  # (N,) byte ids


def check_ids(data: torch.Tensor, vocab_size: int, source: str) -> None:
    """Raise a ConfigError naming ``source`` when an id of ``data`` is ``>= vocab_size``.

    Read in chunks (``uint16``/``uint32`` tensors have no ``max`` of their own), so a
    memory-mapped file is paged through, not copied whole.
    """
    largest = max(int(data[i:i + ID_SCAN_CHUNK].to(torch.int64).max())
                  for i in range(0, len(data), ID_SCAN_CHUNK))
    if largest >= vocab_size:
        raise ConfigError(f"holds token id {largest} but the vocabulary has {vocab_size} ids "
                          f"(0..{vocab_size - 1}); give the data's vocabulary (--vocab-size, "
                          "meta.json) or tokenizer", source=source, key="vocab_size")


def files_digest(files: tuple[Path, ...], root: Path | None, source: str) -> dict[str, Any]:
    """One part of :meth:`Corpus.digest`: every file streamed through SHA-256.

    Raises:
        ConfigError: a file that cannot be read, naming it.
    """
    total, each, n_bytes = hashlib.sha256(), {}, 0
    buffer = bytearray(DIGEST_CHUNK)
    view = memoryview(buffer)
    for f in files:
        name = f.relative_to(root).as_posix() if root is not None else f.name
        h, size = hashlib.sha256(), 0
        try:
            with open(f, "rb") as fh:
                while n := fh.readinto(buffer):
                    h.update(view[:n])
                    size += n
        except OSError as e:
            raise ConfigError(f"cannot read the file to hash it ({e.strerror or e})", source=str(f)) from None
        total.update(os.fsencode(name) + b"\0" + str(size).encode() + b"\0" + h.hexdigest().encode() + b"\n")
        each[name] = h.hexdigest()
        n_bytes += size
    return {"sha256": total.hexdigest(), "files": len(files), "bytes": n_bytes, "source": source,
            "root": None if root is None else str(root), "each": each if len(files) <= DIGEST_NAMED_FILES else None}
