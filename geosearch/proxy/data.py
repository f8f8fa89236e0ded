"""Corpora for the proxy runs, and reproducible batches from them.

Three sources, all offline (nothing is ever downloaded):

* **Default** (``path=None``): the ``.py`` sources of the running interpreter's own
  standard library, byte-level (vocab 256). Found with
  ``sysconfig.get_paths()["stdlib"]``; ``site-packages``/``dist-packages`` and test
  directories (``test``, ``tests``, ``idle_test``: large, full of odd fixtures) are left
  out. At most ``max_bytes`` (4 MiB by default: loads in well under a second, more
  tokens than a proxy trial reads) are taken: files are picked in the order of the
  SHA-1 of their path relative to the stdlib (so the pick is spread over the whole
  library and the same on every machine with the same Python version), then
  concatenated in sorted path order. The corpus therefore depends on the Python
  version; :attr:`Corpus.source` names it.
* **Text**: one text file, or a directory of them (every non-hidden file below it, in
  sorted path order), read as bytes (vocab 256).
* **Tokens**: a directory holding nanoGPT's ``train.bin`` and ``val.bin`` (uint16 token
  ids, native byte order), memory-mapped, never read whole. The vocabulary size comes
  from the ``vocab_size`` argument or from ``meta.json`` / ``meta.yaml`` next to them
  (``{"vocab_size": 50257}``). nanoGPT's ``meta.pkl`` is not read: unpickling runs
  arbitrary code.

Train/validation split (the two never share a byte):

* several files (default corpus, text directory): whole files go to validation, spread
  evenly over the sorted list: file ``i`` is held out when ``floor((i+1)·f) >
  floor(i·f)``, which is every 10th file for ``f = 0.1``. No file straddles the split.
  When that would leave one side without a file, the directory is split like one file.
* one file: the last ``f`` of its bytes are validation.
* token files: ``train.bin`` / ``val.bin`` as given.

Loaded corpora are cached per process (a study runs many trials in one process); the
cache key holds the path, the arguments and each file's size and mtime.
Treat the returned tensors as read-only.

Example:
    >>> corpus = load_corpus()                       # stdlib sources, vocab 256
    >>> g = torch.Generator().manual_seed(0)
    >>> x, y = get_batch(corpus.train, 16, 128, g)   # (16, 128) int64 each
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import torch
import yaml

from geosearch.errors import ConfigError

DEFAULT_MAX_BYTES = 4 * 2**20  # cap on the default corpus (train + validation)
EXCLUDED_STDLIB_DIRS = frozenset({"site-packages", "dist-packages", "test", "tests", "idle_test",
                                  "__pycache__"})
TOKEN_FILES = ("train.bin", "val.bin")
META_FILES = ("meta.json", "meta.yaml", "meta.yml")


@dataclass(frozen=True)
class Corpus:
    """A tokenised corpus split into training and validation streams.

    Attributes:
        train: 1-D tensor of token ids (uint8 for bytes, uint16 for token files).
        val: 1-D tensor of token ids; shares no byte with ``train``.
        vocab_size: number of token ids (256 for bytes).
        source: where it came from, e.g. ``"python3.11 stdlib /usr/lib/python3.11
            (251 files, 4194101 bytes)"``; recorded with each run.
    """

    train: torch.Tensor
    val: torch.Tensor
    vocab_size: int
    source: str

    def check_block_size(self, block_size: int) -> None:
        """Raise a ConfigError naming the source if a split is too short for one sample.

        A sample needs ``block_size + 1`` tokens (inputs and the shifted targets).
        """
        for split, data in (("train", self.train), ("val", self.val)):
            if len(data) < block_size + 1:
                raise ConfigError(
                    f"the {split} split has {len(data)} tokens but a context of {block_size} "
                    f"needs at least {block_size + 1}; give more data or a smaller block_size",
                    source=self.source)


_CACHE: dict[tuple, Corpus] = {}


def clear_corpus_cache() -> None:
    """Forget every corpus loaded in this process."""
    _CACHE.clear()


def load_corpus(
    path: str | os.PathLike | None = None,
    val_fraction: float = 0.1,
    *,
    vocab_size: int | None = None,
    max_bytes: int = DEFAULT_MAX_BYTES,
    block_size: int | None = None,
) -> Corpus:
    """Load (or fetch from the per-process cache) a corpus.

    Args:
        path: None for the standard-library sources; a text file; a directory of text
            files; or a directory with ``train.bin`` and ``val.bin``.
        val_fraction: share held out for validation, in (0, 1); ignored for token files.
        vocab_size: vocabulary of token files (else read from ``meta.json``/``meta.yaml``);
            must be 256 or None for text.
        max_bytes: cap on the default corpus; ignored for user data.
        block_size: when given, check that both splits hold at least one sample.

    Raises:
        ConfigError: missing, empty or too short data, bad metadata or arguments; the
            message names the path and what was expected.
    """
    if not 0.0 < val_fraction < 1.0:
        raise ConfigError(f"must be strictly between 0 and 1 but got {val_fraction!r}",
                          source="load_corpus", key="val_fraction")
    if path is None:
        corpus = _load_stdlib(val_fraction, max_bytes)
    else:
        p = Path(path).expanduser()
        if not p.exists():
            raise ConfigError("no such file or directory; expected a text file, a directory of "
                              "text files, or a directory with train.bin and val.bin",
                              source=str(p))
        if p.name in TOKEN_FILES:
            raise ConfigError("a token file on its own; pass the directory that holds train.bin "
                              "and val.bin", source=str(p))
        if p.is_dir() and any((p / name).exists() for name in TOKEN_FILES):
            corpus = _load_tokens(p, vocab_size)
        else:
            if vocab_size not in (None, 256):
                raise ConfigError(f"text is read as bytes (vocab 256) but vocab_size={vocab_size}",
                                  source=str(p), key="vocab_size")
            corpus = _load_text(p, val_fraction)
    if block_size is not None:
        corpus.check_block_size(block_size)
    return corpus


def get_batch(
    data: torch.Tensor,
    batch_size: int,
    block_size: int,
    generator: torch.Generator,
    device: torch.device | str | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Random contiguous windows of ``data`` and the same windows shifted by one.

    The start offsets come from ``generator`` only, so a seeded generator gives the
    same batches on every run.

    Args:
        data: 1-D token tensor (a split of a :class:`Corpus`).
        batch_size: B, number of windows.
        block_size: T, window length.
        generator: a CPU ``torch.Generator``.
        device: where to put the result (pinned and copied asynchronously on CUDA).

    Returns:
        ``(x, y)``, each (B, T) int64, with ``y[:, t] == x[:, t + 1]`` inside a window.
    """
    if len(data) < block_size + 1:
        raise ConfigError(f"data has {len(data)} tokens but a context of {block_size} needs at "
                          f"least {block_size + 1}", source="get_batch", key="block_size")
    ix = torch.randint(len(data) - block_size, (batch_size,), generator=generator)  # (B,)
    offsets = ix[:, None] + torch.arange(block_size + 1)  # (B, T+1) positions in data
    chunk = data[offsets].to(torch.int64)  # (B, T+1)
    x, y = chunk[:, :-1], chunk[:, 1:]  # (B, T) each
    if device is not None and torch.device(device).type == "cuda":
        x = x.pin_memory().to(device, non_blocking=True)
        y = y.pin_memory().to(device, non_blocking=True)
    elif device is not None:
        x, y = x.to(device), y.to(device)
    return x.contiguous(), y.contiguous()


# --------------------------------------------------------------------------- sources
def _load_stdlib(val_fraction: float, max_bytes: int) -> Corpus:
    root = Path(sysconfig.get_paths()["stdlib"])
    key = ("stdlib", str(root), val_fraction, max_bytes)
    if key in _CACHE:
        return _CACHE[key]
    files = [f for f in _walk(root, stdlib=True) if f.suffix == ".py"]
    if not files:
        raise ConfigError("found no .py files in the standard library directory; "
                          "pass a corpus path instead", source=str(root))
    # pick files in hash order of their relative path until the cap; read them in path order
    sizes = {f: f.stat().st_size for f in files}
    picked, total = [], 0
    def pick_order(f: Path) -> bytes:
        return hashlib.sha1(f.relative_to(root).as_posix().encode()).digest()

    for f in sorted(files, key=pick_order):
        if total + sizes[f] <= max_bytes:
            picked.append(f)
            total += sizes[f]
    picked.sort(key=lambda f: f.relative_to(root).parts)
    if len(picked) < 2:
        raise ConfigError(f"max_bytes={max_bytes} keeps {len(picked)} standard-library file(s); "
                          "at least 2 are needed for a train/validation split",
                          source="load_corpus", key="max_bytes")
    train, val = _split_files(picked, val_fraction, str(root))
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    source = f"{version} stdlib {root} ({len(picked)} files, {total} bytes)"
    corpus = Corpus(train=train, val=val, vocab_size=256, source=source)
    _CACHE[key] = corpus
    return corpus


def _load_text(p: Path, val_fraction: float) -> Corpus:
    files = [p] if p.is_file() else _walk(p, stdlib=False)
    key = ("text", str(p.resolve()), val_fraction, *_stamps(files))
    if key in _CACHE:
        return _CACHE[key]
    if not files:
        raise ConfigError("the directory holds no files; expected text files (or train.bin and "
                          "val.bin)", source=str(p))
    n_val = _n_held_out(len(files), val_fraction)
    if 0 < n_val < len(files):
        train, val = _split_files(files, val_fraction, str(p))
    else:  # one file (or too few to split by file): the last val_fraction of the bytes
        data = _read_bytes(files, str(p))
        n_train = len(data) - max(1, round(val_fraction * len(data)))
        train, val = data[:n_train], data[n_train:]
    kind = "text file" if p.is_file() else f"text directory ({len(files)} files)"
    corpus = Corpus(train=train, val=val, vocab_size=256,
                    source=f"{kind} {p} ({len(train) + len(val)} bytes)")
    _CACHE[key] = corpus
    return corpus


def _load_tokens(p: Path, vocab_size: int | None) -> Corpus:
    paths = [p / name for name in TOKEN_FILES]
    for f in paths:
        if not f.is_file():
            raise ConfigError(f"{f.name} is missing; a token directory needs both train.bin and "
                              "val.bin (uint16 token ids)", source=str(p))
    key = ("tokens", str(p.resolve()), vocab_size, *_stamps(paths + [p / m for m in META_FILES]))
    if key in _CACHE:
        return _CACHE[key]
    if vocab_size is None:
        vocab_size = _read_vocab_size(p)
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) \
            or not 1 <= vocab_size <= 2**16:
        raise ConfigError(f"vocab_size must be an integer in [1, 65536] for uint16 tokens but got "
                          f"{vocab_size!r}", source=str(p), key="vocab_size")
    splits = []
    for f in paths:
        n_bytes = f.stat().st_size
        if n_bytes == 0 or n_bytes % 2:
            raise ConfigError(f"has {n_bytes} bytes; expected a non-empty array of uint16 token "
                              "ids (an even number of bytes)", source=str(f))
        # memory-mapped copy-on-write: pages are read when a batch touches them
        splits.append(torch.from_file(str(f), shared=False, size=n_bytes // 2, dtype=torch.uint16))
    corpus = Corpus(train=splits[0], val=splits[1], vocab_size=vocab_size,
                    source=f"token files {p} ({len(splits[0])} + {len(splits[1])} tokens)")
    _CACHE[key] = corpus
    return corpus


# --------------------------------------------------------------------------- helpers
def _walk(root: Path, stdlib: bool) -> list[Path]:
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


def _stamps(files: list[Path]) -> list[tuple]:
    """(path, size, mtime) of each existing file, so an edited file is reloaded."""
    return [(str(f), s.st_size, s.st_mtime_ns) for f in files if f.exists() for s in [f.stat()]]


def _n_held_out(n_files: int, val_fraction: float) -> int:
    return sum(_held_out(i, val_fraction) for i in range(n_files))


def _held_out(i: int, val_fraction: float) -> bool:
    """File i goes to validation when it crosses the next multiple of 1/val_fraction."""
    return int((i + 1) * val_fraction) > int(i * val_fraction)


def _split_files(files: list[Path], val_fraction: float,
                 source: str) -> tuple[torch.Tensor, torch.Tensor]:
    train = [f for i, f in enumerate(files) if not _held_out(i, val_fraction)]
    val = [f for i, f in enumerate(files) if _held_out(i, val_fraction)]
    return _read_bytes(train, source), _read_bytes(val, source)


def _read_bytes(files: list[Path], source: str) -> torch.Tensor:
    data = b"".join(f.read_bytes() for f in files)
    if not data:
        raise ConfigError("the text is empty; expected at least one non-empty file", source=source)
    return torch.frombuffer(bytearray(data), dtype=torch.uint8)  # (N,) byte ids


def _read_vocab_size(p: Path) -> int:
    for name in META_FILES:
        meta_path = p / name
        if not meta_path.is_file():
            continue
        text = meta_path.read_text()
        try:
            meta = json.loads(text) if name == "meta.json" else yaml.safe_load(text)
        except (ValueError, yaml.YAMLError) as e:
            raise ConfigError(f"cannot parse it: {e}", source=str(meta_path)) from None
        if not isinstance(meta, dict) or "vocab_size" not in meta:
            raise ConfigError("expected a mapping with a 'vocab_size' key", source=str(meta_path))
        return meta["vocab_size"]
    pkl = ""
    if (p / "meta.pkl").exists():
        pkl = " (meta.pkl is not read: unpickling can run arbitrary code)"
    raise ConfigError("no vocabulary size: write meta.json with {\"vocab_size\": N} next to "
                      f"train.bin, or pass vocab_size{pkl}", source=str(p))
