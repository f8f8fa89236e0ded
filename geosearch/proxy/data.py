"""Corpora for the proxy runs, and reproducible batches from them.

Three sources, all offline (nothing is ever downloaded):

* **Default** (``path=None``): the ``.py`` sources of the running interpreter's own
  standard library, byte-level (vocab 256) or tokenized (below). Found with
  ``sysconfig.get_paths()["stdlib"]``; ``site-packages``/``dist-packages`` and test
  directories (``test``, ``tests``, ``idle_test``: large, full of odd fixtures) are left
  out. At most ``max_bytes`` (4 MiB by default: loads in well under a second, more
  tokens than a proxy trial reads) are taken: files are picked in the order of the
  SHA-1 of their path relative to the stdlib (so the pick is spread over the whole
  library and the same on every machine with the same Python version), then
  concatenated in sorted path order. The corpus therefore depends on the Python
  version; :attr:`Corpus.source` names it.
* **Text**: one text file, or a directory of them (every non-hidden file below it, in
  sorted path order), read as bytes (vocab 256) or tokenized (below).
* **Tokens**: a directory holding nanoGPT's ``train.bin`` and ``val.bin`` (token ids,
  native byte order, ``uint16`` unless a meta file says ``"dtype": "uint32"``, which
  vocabularies above 65,536 need), memory-mapped. The vocabulary size comes from the
  ``vocab_size`` argument (``--vocab-size``, ``proxy.vocab_size``), else the tokenizer's,
  else the first meta file next to them (:data:`~geosearch.proxy.meta.META_FILES`: ``meta.json`` / ``meta.yaml``
  ``{"vocab_size": 50257, "dtype": "uint16"}``, or nanoGPT's ``meta.pkl``; :data:`~geosearch.proxy.meta.META_FIELDS`:
  ``vocab_size`` a whole number >= 1, ``dtype`` one of :data:`TOKEN_DTYPES`, other keys
  ignored), else the model's (``model_vocab_size``: ``model_args.vocab_size``). A bare
  directory as nanoGPT's ``openwebtext`` writes it (GPT-2 ids, no meta file) thus loads with
  ``--vocab-size 50257`` or ``--model-arg vocab_size=50304`` (the padded size nanoGPT
  trains). The files are read once at load to check that every id is below the vocabulary
  size.
* ``meta.pkl`` (nanoGPT's character-level sets: ``{"vocab_size": 65, "itos": {...},
  "stoi": {...}}``) is unpickled by :class:`~geosearch.proxy.meta._PlainUnpickler`, which builds plain data only
  (dicts, lists, tuples, sets, strings, bytes, numbers, booleans, None): a pickle that names
  any class or function (``os.system``, a numpy array) is refused before anything in it
  runs. ``itos`` / ``stoi`` are loaded as plain data and not used (geosearch decodes nothing).

Every file is read as a user's file (:mod:`geosearch.util.files`): a named pipe, a device or a
socket is refused before it is opened; a meta file may hold 1 MiB, a ``tokenizer.json``
128 MiB, a text corpus 2 GiB in all (it is read into memory; token files are memory-mapped
and not bounded); ``meta.json``, ``meta.yaml`` and ``tokenizer.json`` must be UTF-8.

**Identity** (:meth:`Corpus.digest`): the SHA-256 of every file a corpus was read from (the
text files, the standard library's picked files, ``train.bin`` / ``val.bin`` and the meta
file that was read) and of the tokenizer, streamed 1 MiB at a time (about 2 GB/s, faster
than the id check every load already does), for the study to record: a study refuses to
resume on data whose contents changed (:mod:`geosearch.search.study.resume`).

**Tokenizer** (``tokenizer=PATH``: a Hugging Face ``tokenizer.json``, or a directory
holding one; ``pip install 'geosearch[tokenizers]'``): text (the default corpus included)
is decoded as UTF-8 and each file encoded with the tokenizer as it is configured (its
post-processor adds special tokens where it says so); the vocabulary size is the
tokenizer's (added tokens included).

Train/validation split (the two never share a byte):

* several files (default corpus, text directory): whole files go to validation, spread
  evenly over the sorted list: file ``i`` is held out when ``floor((i+1)·f) >
  floor(i·f)``, which is every 10th file for ``f = 0.1``. No file straddles the split.
  When that would leave one side without a file, the directory is split like one file.
* one file: the last ``f`` of its bytes (of its tokens, with a tokenizer) are validation.
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
import os
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from geosearch.util.checks import is_int, shown
from geosearch.util.errors import ConfigError
from geosearch.util.files import (
    TEXT_CORPUS_LIMIT,
    check_user_file,
    size_text,
)
from geosearch.models.specs import MODEL_SIZE
from geosearch.proxy.meta import META_FILES, read_meta
from geosearch.proxy.reading import (
    Tokenizer,
    check_ids,
    file_stamps,
    files_digest,
    n_held_out,
    reader_of,
    split_files,
    walk_files,
)

if TYPE_CHECKING:  # pragma: no cover
    from geosearch.proxy.config import TrainConfig

DEFAULT_MAX_BYTES = 4 * 2**20  # cap on the default corpus (train + validation)
TOKEN_FILES = ("train.bin", "val.bin")
TOKEN_DTYPES: dict[str, torch.dtype] = {"uint16": torch.uint16, "uint32": torch.uint32}
"""``dtype`` values of a meta file (:data:`~geosearch.proxy.meta.TOKEN_DTYPE_NAMES`) -> how
``train.bin`` / ``val.bin`` are read (default uint16)."""


@dataclass(frozen=True)
class Corpus:
    """A tokenised corpus split into training and validation streams.

    Attributes:
        train: 1-D tensor of token ids (uint8 for bytes; uint16 or uint32 for token files
            and tokenized text).
        val: 1-D tensor of token ids; shares no byte with ``train``.
        vocab_size: number of token ids (256 for bytes).
        source: where it came from, e.g. ``"python3.11 stdlib /usr/lib/python3.11
            (251 files, 4194101 bytes)"``; recorded with each run.
        files: the files the ids were read from, and the meta file that said how
            (:meth:`digest`).
        root: what :meth:`digest` names ``files`` relative to (the corpus's directory, the
            standard library).
        tokenizer: the ``tokenizer.json`` that encoded the text, or None.
    """

    train: torch.Tensor
    val: torch.Tensor
    vocab_size: int
    source: str
    files: tuple[Path, ...] = ()
    root: Path | None = None
    tokenizer: Path | None = None

    def digest(self) -> dict[str, Any]:
        """The identity of the contents, JSON-safe, for a study to record: ``{"data": PART,
        "tokenizer": PART or None}``. A PART is ``{"sha256", "files", "bytes", "source",
        "root", "each"}``: the SHA-256 over each file's name, size and SHA-256 (every file
        streamed whole, :data:`DIGEST_CHUNK` bytes at a time), the file and byte counts, what
        it is in words, the directory the names are relative to, and each file's SHA-256 by
        name (None for more than :data:`~geosearch.proxy.reading.DIGEST_NAMED_FILES` files). Computed on each call
        (about 2 GB/s): call it once per command.

        Raises:
            ConfigError: a file that can no longer be read, naming it.
        """
        tok = self.tokenizer
        return {"data": files_digest(self.files, self.root, self.source),
                "tokenizer": None if tok is None else files_digest((tok,), tok.parent, str(tok))}

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
    tokenizer: str | os.PathLike | None = None,
    model_vocab_size: int | None = None,
) -> Corpus:
    """Load (or fetch from the per-process cache) a corpus.

    Args:
        path: None for the standard-library sources; a text file; a directory of text
            files; or a directory with ``train.bin`` and ``val.bin``.
        val_fraction: share held out for validation, in (0, 1); ignored for token files.
        vocab_size: vocabulary of token files (else the tokenizer's, else read from
            a meta file, else ``model_vocab_size``); must be None or the text's (256, or the
            tokenizer's) for text.
        max_bytes: cap on the default corpus; ignored for user data.
        block_size: when given, check that both splits hold at least one sample.
        tokenizer: a ``tokenizer.json`` (or a directory holding one) to encode text with,
            and the vocabulary size of token files.
        model_vocab_size: the model's vocabulary (``model_args.vocab_size``): that of
            token files nothing else gives one (capped at what their dtype holds); unused
            for text, whose vocabulary the model may exceed.

    Raises:
        ConfigError: missing, empty or too short data, bad metadata or arguments, a token
            id not below the vocabulary size, a tokenizer that cannot be read; the message
            names the path and what was expected.
    """
    if not 0.0 < val_fraction < 1.0:
        raise ConfigError(f"must be strictly between 0 and 1 but got {val_fraction!r}",
                          source="load_corpus", key="val_fraction")
    tok = Tokenizer.load(tokenizer) if tokenizer is not None else None
    if path is None:
        _check_text_vocab(vocab_size, tok, "the built-in text (the standard library's sources)")
        corpus = _load_stdlib(val_fraction, max_bytes, tok)
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
            corpus = _load_tokens(p, vocab_size, tok, model_vocab_size)
        else:
            _check_text_vocab(vocab_size, tok, str(p))
            corpus = _load_text(p, val_fraction, tok)
    if block_size is not None:
        corpus.check_block_size(block_size)
    return corpus


def config_corpus(config: TrainConfig) -> Corpus:
    """The corpus a run of ``config`` trains on (:func:`load_corpus` of its ``data``,
    ``tokenizer`` and ``vocab_size``; its ``model_args.vocab_size`` for token files that name
    no vocabulary). Every place that loads a run's data goes through here."""
    return load_corpus(config.data, tokenizer=config.tokenizer, vocab_size=config.vocab_size,
                       model_vocab_size=config.model_args.get("vocab_size"))


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
def _check_text_vocab(vocab_size: int | None, tok: Tokenizer | None, source: str) -> None:
    """Refuse a ``vocab_size`` that is not the text's: 256 for bytes, the tokenizer's."""
    if tok is None and vocab_size not in (None, 256):
        raise ConfigError(f"text is read as bytes (vocab 256) but vocab_size={vocab_size}; give "
                          "256 or none, or --tokenizer FILE for another vocabulary", source=source,
                          key="vocab_size")
    if tok is not None and vocab_size not in (None, tok.vocab_size):
        raise ConfigError(f"text is encoded by {tok.path} (vocab {tok.vocab_size}) but "
                          f"vocab_size={vocab_size}", source=source, key="vocab_size")


def _load_stdlib(val_fraction: float, max_bytes: int, tok: Tokenizer | None) -> Corpus:
    root = Path(sysconfig.get_paths()["stdlib"])
    key = ("stdlib", str(root), val_fraction, max_bytes, tok and tok.stamp())
    if key in _CACHE:
        return _CACHE[key]
    files = [f for f in walk_files(root, stdlib=True) if f.suffix == ".py"]
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
    read, vocab, unit = reader_of(tok)
    train, val = split_files(picked, val_fraction, str(root), read)
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    source = f"{version} stdlib {root} ({len(picked)} files, {total} bytes)"
    if tok is not None:
        source += f" as {len(train) + len(val)} {unit}"
    corpus = Corpus(train=train, val=val, vocab_size=vocab, source=source, files=tuple(picked), root=root,
                    tokenizer=tok and tok.path)
    _CACHE[key] = corpus
    return corpus


def _load_text(p: Path, val_fraction: float, tok: Tokenizer | None) -> Corpus:
    if not p.is_dir():  # a pipe or a device would be read forever
        check_user_file(p, what="a text file, a directory of text files, or a directory with "
                        "train.bin and val.bin")
    files = [p] if not p.is_dir() else walk_files(p, stdlib=False)
    key = ("text", str(p.resolve()), val_fraction, tok and tok.stamp(), *file_stamps(files))
    if key in _CACHE:
        return _CACHE[key]
    if not files:
        raise ConfigError("the directory holds no files; expected text files (or train.bin and "
                          "val.bin)", source=str(p))
    total = sum(size for _, size, _ in file_stamps(files))
    if total > TEXT_CORPUS_LIMIT:
        raise ConfigError(f"{size_text(total)} of text, more than the {size_text(TEXT_CORPUS_LIMIT)} "
                          "a text corpus may hold (it is read into memory); write larger data as "
                          "train.bin and val.bin token files, which are memory-mapped", source=str(p))
    read, vocab, unit = reader_of(tok)
    n_val = n_held_out(len(files), val_fraction)
    if 0 < n_val < len(files):
        train, val = split_files(files, val_fraction, str(p), read)
    else:  # one file (or too few to split by file): the last val_fraction of the ids
        data = read(files, str(p))
        n_train = len(data) - max(1, round(val_fraction * len(data)))
        train, val = data[:n_train], data[n_train:]
    kind = "text file" if p.is_file() else f"text directory ({len(files)} files)"
    corpus = Corpus(train=train, val=val, vocab_size=vocab, source=f"{kind} {p} ({len(train) + len(val)} {unit})",
                    files=tuple(files), root=p if p.is_dir() else p.parent, tokenizer=tok and tok.path)
    _CACHE[key] = corpus
    return corpus


def _load_tokens(p: Path, vocab_size: int | None, tok: Tokenizer | None,
                 model_vocab_size: int | None) -> Corpus:
    paths = [p / name for name in TOKEN_FILES]
    for f in paths:
        check_user_file(f, what="a file of token ids", source=str(p) if not f.exists() else None,
                        missing=f"{f.name} is missing; a token directory needs both train.bin and "
                                "val.bin (token ids)")
    key = ("tokens", str(p.resolve()), vocab_size, model_vocab_size, tok and tok.stamp(),
           *file_stamps(paths + [p / m for m in META_FILES]))
    if key in _CACHE:
        return _CACHE[key]
    meta, meta_path = read_meta(p)
    dtype_name = meta.get("dtype", "uint16")  # a name of TOKEN_DTYPES: read_meta checked it
    dtype, limit = TOKEN_DTYPES[dtype_name], 2 ** (8 * TOKEN_DTYPES[dtype_name].itemsize)
    where = str(p)  # what a bad vocabulary's message names
    if vocab_size is None and tok is not None:
        vocab_size = tok.vocab_size
    elif vocab_size is None and "vocab_size" in meta:
        vocab_size, where = meta["vocab_size"], str(meta_path)
    elif vocab_size is None and model_vocab_size is not None:
        value, problem = MODEL_SIZE.check(model_vocab_size)
        if problem is not None:
            raise ConfigError(problem, source=str(p), key="model_args.vocab_size")
        vocab_size = min(value, limit)  # the model's may pad past what the files can hold
    elif vocab_size is None:
        lacking = f"{meta_path.name} has no 'vocab_size'" if meta_path else "nanoGPT's token ids carry none"
        raise ConfigError(f"no vocabulary size for train.bin and val.bin ({lacking}); give it with "
                          "--vocab-size N (proxy.vocab_size in a space, vocab_size in a train config), "
                          "--model-arg vocab_size=N, --tokenizer FILE, or meta.json {\"vocab_size\": N}",
                          source=str(meta_path or p), key="vocab_size")
    if not is_int(vocab_size) or not 1 <= vocab_size <= limit:
        hint = ' (a larger vocabulary needs "dtype": "uint32" in meta.json)' if dtype_name == "uint16" else ""
        raise ConfigError(f"vocab_size must be an integer in [1, {limit}] for {dtype_name} tokens but got "
                          f"{shown(vocab_size)}{hint}", source=where, key="vocab_size")
    splits = []
    for f in paths:
        n_bytes, width = f.stat().st_size, dtype.itemsize
        if n_bytes == 0 or n_bytes % width:
            raise ConfigError(f"has {n_bytes} bytes; expected a non-empty array of {dtype_name} token "
                              f"ids (a multiple of {width} bytes)", source=str(f))
        # memory-mapped copy-on-write: pages are read when a batch touches them
        data = torch.from_file(str(f), shared=False, size=n_bytes // width, dtype=dtype)
        check_ids(data, vocab_size, str(f))
        splits.append(data)
    corpus = Corpus(train=splits[0], val=splits[1], vocab_size=vocab_size,
                    source=f"token files {p} ({len(splits[0])} + {len(splits[1])} {dtype_name} tokens)",
                    files=tuple(paths) + ((meta_path,) if meta_path else ()), root=p,
                    tokenizer=tok and tok.path)
    _CACHE[key] = corpus
    return corpus


