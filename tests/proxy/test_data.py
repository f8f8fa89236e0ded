"""Corpora and batches: the stdlib default, text files and directories, token files, errors."""

import hashlib
import json
import os
import pickle
import socket
import sysconfig

import numpy as np
import pytest
import torch

from geosearch.util.errors import ConfigError
from geosearch.util.files import CONFIG_LIMIT
from geosearch.proxy import data as data_mod
from geosearch.proxy import reading
from geosearch.proxy.data import clear_corpus_cache, get_batch, load_corpus


@pytest.fixture(autouse=True)
def fresh_cache():
    clear_corpus_cache()
    yield
    clear_corpus_cache()


def as_bytes(t: torch.Tensor) -> bytes:
    return bytes(t.tolist())


# --------------------------------------------------------------------------- stdlib default
def test_default_corpus_loads_offline_and_deterministically(monkeypatch):
    def no_network(*args, **kwargs):
        raise AssertionError("load_corpus tried to open a network connection")

    monkeypatch.setattr(socket.socket, "connect", no_network)
    first = load_corpus()
    # Rule: the default is the running interpreter's stdlib, byte-level, capped at max_bytes.
    assert first.vocab_size == 256 and first.train.dtype == torch.uint8
    assert "stdlib" in first.source and sysconfig.get_paths()["stdlib"] in first.source
    n = len(first.train) + len(first.val)
    assert 1_000_000 < n <= data_mod.DEFAULT_MAX_BYTES
    # Rule: about val_fraction of the bytes are validation (whole files: not exact).
    assert 0.05 < len(first.val) / n < 0.2
    # Rule: a second load in the same process is the cached object.
    assert load_corpus() is first
    clear_corpus_cache()
    second = load_corpus()
    # Rule: loading again from disk gives identical bytes.
    assert second is not first
    assert torch.equal(first.train, second.train) and torch.equal(first.val, second.val)


def make_fake_stdlib(root, n=30):
    """n module files with unique contents, plus files that must be left out."""
    contents = {}
    for i in range(n):
        path = root / ("pkg" if i % 3 else "") / f"mod_{i:02d}.py"
        path.parent.mkdir(parents=True, exist_ok=True)
        contents[path] = f"# module {i:02d}\n" + "x = 1\n" * (10 + i)
        path.write_text(contents[path])
    for excluded in ["site-packages/foo.py", "test/test_x.py", "pkg/tests/t.py", "idle_test/i.py"]:
        (root / excluded).parent.mkdir(parents=True, exist_ok=True)
        (root / excluded).write_text("# EXCLUDED\n")
    (root / "notes.txt").write_text("# EXCLUDED not python\n")
    return contents


def test_stdlib_split_is_by_whole_files_and_excludes_site_packages_and_tests(tmp_path, monkeypatch):
    contents = make_fake_stdlib(tmp_path)
    monkeypatch.setattr(sysconfig, "get_paths", lambda: {"stdlib": str(tmp_path)})
    corpus = load_corpus(val_fraction=0.1)
    train, val = as_bytes(corpus.train).decode(), as_bytes(corpus.val).decode()
    # Rule: site-packages, test directories and non-.py files are not in the corpus.
    assert "EXCLUDED" not in train + val
    in_val = sorted(p for p, text in contents.items() if text in val)
    for p, text in contents.items():
        # Rule: every file lies whole in exactly one split (no file straddles, no overlap).
        assert (text in train) != (text in val), p
    # Rule: every 10th file (sorted path order) is held out: 3 of 30.
    assert len(in_val) == 3
    ordered = sorted(contents)
    assert in_val == [ordered[9], ordered[19], ordered[29]]
    # Rule: the splits are the files concatenated in sorted path order.
    assert train == "".join(contents[p] for p in ordered if p not in in_val)


def test_stdlib_cap_picks_files_independently_of_location(tmp_path, monkeypatch):
    for where in ("a", "b"):
        make_fake_stdlib(tmp_path / where)
    total = sum(len(t) for t in make_fake_stdlib(tmp_path / "c").values())
    corpora = []
    for where in ("a", "b"):
        monkeypatch.setattr(sysconfig, "get_paths", lambda w=where: {"stdlib": str(tmp_path / w)})
        corpora.append(load_corpus(max_bytes=total // 2))
    a, b = corpora
    # Rule: the cap holds, and the pick depends on relative paths only (same on every machine).
    assert len(a.train) + len(a.val) <= total // 2
    assert len(a.train) + len(a.val) > total // 3
    assert torch.equal(a.train, b.train) and torch.equal(a.val, b.val)


# --------------------------------------------------------------------------- batches
def test_get_batch_is_reproducible_and_shifted():
    data = torch.arange(1000, dtype=torch.int64).to(torch.uint8)  # 0..255 repeating
    x1, y1 = get_batch(data, 8, 16, torch.Generator().manual_seed(3))
    x2, y2 = get_batch(data, 8, 16, torch.Generator().manual_seed(3))
    x3, _ = get_batch(data, 8, 16, torch.Generator().manual_seed(4))
    # Rule: (B, T) int64; the same seed gives the same batch, another seed another batch.
    assert x1.shape == y1.shape == (8, 16) and x1.dtype == y1.dtype == torch.int64
    assert torch.equal(x1, x2) and torch.equal(y1, y2)
    assert not torch.equal(x1, x3)
    # Rule: each row is a contiguous window of data and y is x shifted by one token.
    assert torch.equal((x1[:, 1:] - x1[:, :-1]) % 256, torch.ones(8, 15, dtype=torch.int64))
    assert torch.equal(x1[:, 1:], y1[:, :-1])
    assert torch.equal(y1, (x1 + 1) % 256)


def test_get_batch_covers_the_last_window():
    data = torch.arange(17, dtype=torch.uint8)
    x, y = get_batch(data, 4, 16, torch.Generator().manual_seed(0))
    # Rule: with exactly block_size + 1 tokens there is one window, and it is the whole data.
    assert torch.equal(x[0], data[:16].long()) and torch.equal(y[0], data[1:].long())
    # Rule: one token fewer is an error that says what is needed.
    with pytest.raises(ConfigError, match="16 tokens but a context of 16 needs at least 17"):
        get_batch(data[:16], 4, 16, torch.Generator())


# --------------------------------------------------------------------------- user text
def test_text_file_split_by_bytes(tmp_path):
    text = bytes(range(256)) * 4  # 1024 bytes
    path = tmp_path / "corpus.txt"
    path.write_bytes(text)
    corpus = load_corpus(path, val_fraction=0.25)
    # Rule: one file: the first 75% are train, the last 25% validation, nothing lost or shared.
    assert as_bytes(corpus.train) == text[:768] and as_bytes(corpus.val) == text[768:]
    assert corpus.vocab_size == 256 and str(path) in corpus.source


def test_text_directory_split_by_files(tmp_path):
    for i in range(10):
        (tmp_path / "sub" if i % 2 else tmp_path).mkdir(exist_ok=True)
        ((tmp_path / "sub" if i % 2 else tmp_path) / f"f{i}.txt").write_text(f"<{i}>" * 20)
    (tmp_path / ".hidden").write_text("HIDDEN")
    (tmp_path / ".git").mkdir()
    (tmp_path / ".git" / "x").write_text("HIDDEN")
    corpus = load_corpus(tmp_path, val_fraction=0.2)
    train, val = as_bytes(corpus.train).decode(), as_bytes(corpus.val).decode()
    ordered = sorted((tmp_path / "sub" if i % 2 else tmp_path) / f"f{i}.txt" for i in range(10))
    held = [p for i, p in enumerate(ordered) if i in (4, 9)]
    # Rule: hidden files and directories are skipped.
    assert "HIDDEN" not in train + val
    # Rule: files 5 and 10 of the sorted list (every 5th for 0.2) are validation, whole.
    assert val == "".join(p.read_text() for p in held)
    assert train == "".join(p.read_text() for p in ordered if p not in held)


def test_directory_with_one_file_falls_back_to_byte_split(tmp_path):
    (tmp_path / "only.txt").write_bytes(b"a" * 90 + b"b" * 10)
    corpus = load_corpus(tmp_path, val_fraction=0.1)
    # Rule: too few files to split by file: the last val_fraction of the bytes.
    assert as_bytes(corpus.val) == b"b" * 10 and as_bytes(corpus.train) == b"a" * 90


def test_cache_reloads_an_edited_file(tmp_path):
    path = tmp_path / "c.txt"
    path.write_bytes(b"x" * 100)
    first = load_corpus(path)
    # Rule: same file, same arguments: the cached corpus.
    assert load_corpus(path) is first
    path.write_bytes(b"y" * 200)
    # Rule: a changed file is read again.
    assert len(load_corpus(path).train) == 180


# --------------------------------------------------------------------------- token files
def write_tokens(directory, train, val, meta=None, meta_name="meta.json", dtype=np.uint16):
    directory.mkdir(exist_ok=True)
    np.asarray(train, dtype=dtype).tofile(directory / "train.bin")
    np.asarray(val, dtype=dtype).tofile(directory / "val.bin")
    if meta is not None:
        (directory / meta_name).write_text(meta)


def test_token_files_with_meta_json(tmp_path):
    train = np.arange(0, 50257, 7)  # ids below the vocabulary size (checked at load)
    write_tokens(tmp_path, train, [50000, 3, 2, 1], json.dumps({"vocab_size": 50257}))
    corpus = load_corpus(tmp_path)
    # Rule: uint16 ids round-trip; the vocab comes from meta.json; the splits are the two files.
    assert corpus.vocab_size == 50257
    assert corpus.train.dtype == torch.uint16
    assert torch.equal(corpus.train.long(), torch.from_numpy(train))
    assert corpus.val.long().tolist() == [50000, 3, 2, 1]
    x, y = get_batch(corpus.train, 2, 8, torch.Generator().manual_seed(0))
    # Rule: batches of token files are int64 ids from the file.
    assert x.dtype == torch.int64 and int(x.max()) < 60000 and torch.equal(x[:, 1:] - x[:, :-1],
                                                                           torch.full((2, 7), 7))


def test_token_files_with_meta_yaml_or_argument(tmp_path):
    write_tokens(tmp_path, range(100), range(50), "vocab_size: 100\n", meta_name="meta.yaml")
    # Rule: meta.yaml works too; an explicit vocab_size wins over the file.
    assert load_corpus(tmp_path).vocab_size == 100
    assert load_corpus(tmp_path, vocab_size=128).vocab_size == 128


def test_a_bare_nanogpt_directory_takes_its_vocabulary_from_the_arguments(tmp_path):
    # nanoGPT's openwebtext: GPT-2 ids as uint16, no meta file at all
    write_tokens(tmp_path, [0, 50256, 7, 1] * 8, [50256, 3, 2])
    # Rule: without a vocabulary, one line naming the directory and every way to give one.
    with pytest.raises(ConfigError) as e:
        load_corpus(tmp_path)
    message = str(e.value)
    assert message.startswith(f"{tmp_path}: vocab_size: no vocabulary size for train.bin and val.bin "
                              "(nanoGPT's token ids carry none)")
    for way in ("--vocab-size N", "proxy.vocab_size", "--model-arg vocab_size=N", "--tokenizer", "meta.json"):
        assert way in message
    assert "\n" not in message and len(message) - len(str(tmp_path)) < 400
    # Rule: the data's vocabulary given: uint16 ids, checked against it.
    corpus = load_corpus(tmp_path, vocab_size=50257)
    assert corpus.vocab_size == 50257 and corpus.train.dtype == torch.uint16
    assert corpus.val.long().tolist() == [50256, 3, 2]
    # Rule: the model's vocabulary (model_args.vocab_size, nanoGPT's padded 50304) serves as the
    # data's when nothing else gives one; an explicit vocab_size wins over it.
    assert load_corpus(tmp_path, model_vocab_size=50304).vocab_size == 50304
    assert load_corpus(tmp_path, vocab_size=50257, model_vocab_size=50304).vocab_size == 50257
    # Rule: a model's vocabulary past what uint16 holds still loads uint16 files (their ids fit).
    assert load_corpus(tmp_path, model_vocab_size=100_000).vocab_size == 65_536
    # Rule: ids at or above the vocabulary given are one line naming the file.
    with pytest.raises(ConfigError) as e:
        load_corpus(tmp_path, vocab_size=50000)
    assert str(e.value).startswith(f"{tmp_path / 'train.bin'}: vocab_size: holds token id 50256 but the "
                                   "vocabulary has 50000 ids (0..49999); give the data's vocabulary (--vocab-size")
    with pytest.raises(ConfigError, match=r"model_args.vocab_size: expected a whole number in \[1, 16,777,216\], "
                                          r"got 'big'"):
        load_corpus(tmp_path, model_vocab_size="big")
    # Rule: a meta file without vocab_size (only a dtype) says so, and takes the model's too.
    (tmp_path / "meta.json").write_text(json.dumps({"dtype": "uint16"}))
    with pytest.raises(ConfigError, match=r"meta.json: vocab_size: no vocabulary size for train.bin and "
                                          r"val.bin \(meta.json has no 'vocab_size'\)"):
        load_corpus(tmp_path)
    assert load_corpus(tmp_path, model_vocab_size=50304).vocab_size == 50304


def test_nanogpt_meta_pkl_is_read_as_plain_data(tmp_path):
    chars = sorted(set("First Citizen:\nBefore we proceed any further, hear me speak.!?;'-3&$XYZ"))
    ids = np.arange(len(chars))
    write_tokens(tmp_path, np.tile(ids, 4), ids)
    meta = {"vocab_size": len(chars), "itos": dict(enumerate(chars)), "stoi": {c: i for i, c in enumerate(chars)}}
    (tmp_path / "meta.pkl").write_bytes(pickle.dumps(meta))
    # Rule: nanoGPT's char-level meta.pkl gives the vocabulary; uint16 ids as it writes them.
    corpus = load_corpus(tmp_path)
    assert corpus.vocab_size == len(chars) and corpus.train.dtype == torch.uint16
    assert corpus.val.long().tolist() == ids.tolist()
    # Rule: any protocol; a dtype in it is honoured as in meta.json.
    write_tokens(tmp_path, [70_000, 1], [2], dtype=np.uint32)
    (tmp_path / "meta.pkl").write_bytes(pickle.dumps({"vocab_size": 70_001, "dtype": "uint32"}, protocol=0))
    assert load_corpus(tmp_path).train.long().tolist() == [70_000, 1]
    # Rule: meta.json, when there is one, is read first (as before).
    (tmp_path / "meta.json").write_text(json.dumps({"vocab_size": 80_000, "dtype": "uint32"}))
    assert load_corpus(tmp_path).vocab_size == 80_000


class _Payload:
    """A pickle that runs a shell command when unpickled by a plain ``pickle.load``."""

    def __init__(self, command):
        self.command = command

    def __reduce__(self):
        return (os.system, (self.command,))


@pytest.mark.parametrize("protocol", [0, 2, pickle.HIGHEST_PROTOCOL])
def test_a_meta_pkl_that_names_a_function_is_refused_and_never_run(tmp_path, monkeypatch, protocol):
    write_tokens(tmp_path, range(10), range(10))
    pwned = tmp_path / "PWNED"
    (tmp_path / "meta.pkl").write_bytes(pickle.dumps({"vocab_size": _Payload(f"touch {pwned}")}, protocol=protocol))
    monkeypatch.chdir(tmp_path)
    # Rule: a pickle that names a class or function is one line naming the file and saying
    # only plain data is read; nothing in it runs.
    with pytest.raises(ConfigError) as e:
        load_corpus(tmp_path)
    assert str(e.value) == (f"{tmp_path / 'meta.pkl'}: names '{os.system.__module__}.system': only plain data "
                            "(dicts, lists, strings, numbers) is read from a pickle, no class or function, and "
                            'nothing in it was run; write meta.json {"vocab_size": N} instead')
    assert not pwned.exists()
    assert pickle.loads((tmp_path / "meta.pkl").read_bytes()) is not None and pwned.exists()  # it was armed


@pytest.mark.slow
def test_a_meta_pkl_is_a_bounded_regular_file_of_plain_data(tmp_path):
    write_tokens(tmp_path, range(10), range(10))
    meta = tmp_path / "meta.pkl"
    meta.write_bytes(b"not a pickle")
    # Rule: what is not a pickle is one line naming the file.
    with pytest.raises(ConfigError, match=r"meta.pkl: cannot read it as a pickle \(UnpicklingError: .*\); "
                                          r"expected nanoGPT's meta.pkl"):
        load_corpus(tmp_path)
    meta.write_bytes(pickle.dumps([1, 2]))
    with pytest.raises(ConfigError, match=r"meta.pkl: expected a mapping with a 'vocab_size' key, got a list"):
        load_corpus(tmp_path)
    meta.write_bytes(pickle.dumps({"vocab_size": "65"}))
    with pytest.raises(ConfigError, match=r"meta.pkl: vocab_size: expected a whole number >= 1, got '65'"):
        load_corpus(tmp_path)
    # Rule: a value nested past repr's reach is shown to a bounded depth and named by its
    # type (no RecursionError).
    depth = 200_000
    meta.write_bytes(b"\x80\x02}X\x0a\x00\x00\x00vocab_size" + b"]" * depth + b"a" * (depth - 1) + b"s.")
    with pytest.raises(ConfigError, match=r"vocab_size: expected a whole number >= 1, got \[{1,25}\.\.\.\]{1,25} \(a list\)$"):
        load_corpus(tmp_path)
    # Rule: the config limit (1 MiB), said before the file is read; a pipe is never opened.
    meta.write_bytes(pickle.dumps({"vocab_size": 10, "pad": "x" * CONFIG_LIMIT}))
    with pytest.raises(ConfigError, match=r"meta.pkl: is 1.0 MB \(\d+ bytes\), more than the 1 MiB"):
        load_corpus(tmp_path)
    meta.unlink()
    os.mkfifo(meta)
    with pytest.raises(ConfigError, match=r"meta.pkl: is a named pipe \(FIFO\), expected nanoGPT's meta.pkl"):
        load_corpus(tmp_path)


def test_the_digest_names_every_file_a_corpus_was_read_from(tmp_path, monkeypatch):
    write_tokens(tmp_path / "tok", range(10), range(5), json.dumps({"vocab_size": 10}))
    first = load_corpus(tmp_path / "tok").digest()
    # Rule: train.bin, val.bin and the meta file that was read, each hashed whole (SHA-256).
    part = first["data"]
    assert first["tokenizer"] is None and part["files"] == 3 and part["root"] == str(tmp_path / "tok")
    assert part["each"]["train.bin"] == hashlib.sha256((tmp_path / "tok" / "train.bin").read_bytes()).hexdigest()
    assert set(part["each"]) == {"train.bin", "val.bin", "meta.json"}
    assert part["bytes"] == 20 + 10 + len(json.dumps({"vocab_size": 10}))
    # Rule: streamed in chunks: the same hash whatever the chunk.
    monkeypatch.setattr(reading, "DIGEST_CHUNK", 3)
    assert load_corpus(tmp_path / "tok").digest() == first
    # Rule: a changed byte changes the file's hash and the total; the others keep theirs.
    write_tokens(tmp_path / "tok", [*range(9), 8], range(5))
    second = load_corpus(tmp_path / "tok").digest()["data"]
    assert second["sha256"] != part["sha256"] and second["each"]["train.bin"] != part["each"]["train.bin"]
    assert second["each"]["val.bin"] == part["each"]["val.bin"]
    # Rule: text directories by relative path; many files keep only the total.
    monkeypatch.setattr(reading, "DIGEST_NAMED_FILES", 2)
    for i in range(3):
        (tmp_path / "texts" / "sub").mkdir(parents=True, exist_ok=True)
        (tmp_path / "texts" / "sub" / f"{i}.txt").write_text("hello world " * (i + 5))
    text = load_corpus(tmp_path / "texts").digest()["data"]
    assert text["files"] == 3 and text["each"] is None and text["source"].startswith("text directory")
    # Rule: the built-in corpus is hashed by its picked files' contents.
    stdlib = load_corpus().digest()["data"]
    assert stdlib["files"] > 100 and 1_000_000 < stdlib["bytes"] <= data_mod.DEFAULT_MAX_BYTES
    assert stdlib["root"] == sysconfig.get_paths()["stdlib"]


def test_uint32_token_files_for_large_vocabularies(tmp_path):
    train = [0, 70_000, 99_999, 65_536] * 8
    write_tokens(tmp_path, train, [1, 99_999, 2], json.dumps({"vocab_size": 100_000, "dtype": "uint32"}),
                 dtype=np.uint32)
    corpus = load_corpus(tmp_path)
    # Rule: dtype uint32 in meta.json reads 4-byte ids, above 65,535, exactly.
    assert corpus.vocab_size == 100_000 and corpus.train.dtype == torch.uint32
    assert corpus.train.long().tolist() == train and corpus.val.long().tolist() == [1, 99_999, 2]
    x, y = get_batch(corpus.train, 3, 4, torch.Generator().manual_seed(0))
    # Rule: batches are int64 ids that occur in the file, shifted by one.
    assert x.dtype == torch.int64 and set(x.flatten().tolist()) <= set(train)
    assert torch.equal(x[:, 1:], y[:, :-1])


def test_token_dtype_and_vocab_limits_name_the_file(tmp_path):
    write_tokens(tmp_path, range(10), range(10), json.dumps({"vocab_size": 10, "dtype": "int64"}))
    # Rule: an unknown dtype names meta.json, the key and the allowed values.
    with pytest.raises(ConfigError) as e:
        load_corpus(tmp_path)
    assert str(e.value) == (f"{tmp_path / 'meta.json'}: dtype: unknown token dtype 'int64' for train.bin "
                            "and val.bin; expected one of: uint16, uint32")
    write_tokens(tmp_path, range(10), range(10), json.dumps({"vocab_size": 70_000}))
    # Rule: a vocabulary above 65,536 in uint16 files says which dtype it needs.
    with pytest.raises(ConfigError, match=r'in \[1, 65536\] for uint16 tokens but got 70000 .*"dtype": "uint32"'):
        load_corpus(tmp_path)
    write_tokens(tmp_path, range(10), range(9), json.dumps({"vocab_size": 10, "dtype": "uint32"}), dtype=np.uint32)
    (tmp_path / "val.bin").write_bytes(b"123456")
    # Rule: a file that is not whole uint32 values is named.
    with pytest.raises(ConfigError, match=r"val.bin: has 6 bytes; expected a non-empty array of uint32 "
                                          r"token ids \(a multiple of 4 bytes\)"):
        load_corpus(tmp_path)


def test_token_ids_are_checked_against_the_vocabulary(tmp_path):
    write_tokens(tmp_path, [1, 2, 3, 4], [5, 9, 7], json.dumps({"vocab_size": 8}))
    # Rule: an id >= vocab_size is one error naming the file, the largest id and the vocab size.
    with pytest.raises(ConfigError) as e:
        load_corpus(tmp_path)
    assert str(e.value).startswith(f"{tmp_path / 'val.bin'}: vocab_size: holds token id 9 but the "
                                   "vocabulary has 8 ids (0..7)")
    # Rule: a vocabulary that covers the largest id loads (the bound is strict: 9 < 10).
    assert load_corpus(tmp_path, vocab_size=10).vocab_size == 10
    # Rule: the scan reads in chunks and still finds the largest id in the last chunk.
    ids = torch.zeros(100, dtype=torch.int64)
    ids[-1] = 12
    monkey = pytest.MonkeyPatch()
    monkey.setattr(reading, "ID_SCAN_CHUNK", 7)
    try:
        with pytest.raises(ConfigError, match="holds token id 12 but the vocabulary has 12 ids"):
            reading.check_ids(ids.to(torch.uint16), 12, "x")
    finally:
        monkey.undo()


# --------------------------------------------------------------------------- tokenizer
def make_tokenizer(path, texts, vocab_size=300):
    """A small byte-level BPE trained on ``texts``, saved as ``path`` (nothing downloaded)."""
    tokenizers = pytest.importorskip("tokenizers")
    tok = tokenizers.Tokenizer(tokenizers.models.BPE())
    tok.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = tokenizers.decoders.ByteLevel()
    trainer = tokenizers.trainers.BpeTrainer(vocab_size=vocab_size, show_progress=False,
                                             initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer)
    tok.save(str(path))
    return tok


def test_text_encoded_with_a_tokenizer(tmp_path):
    texts = [f"def f{i}(x):\n    return x * {i}  # café\n" * 5 for i in range(10)]
    for i, t in enumerate(texts):
        (tmp_path / "corpus").mkdir(exist_ok=True)
        (tmp_path / "corpus" / f"m{i}.py").write_text(t)
    tok = make_tokenizer(tmp_path / "tokenizer.json", texts)
    corpus = load_corpus(tmp_path / "corpus", val_fraction=0.2, tokenizer=tmp_path / "tokenizer.json")
    # Rule: the vocabulary is the tokenizer's, not 256; ids are the tokenizer's, file by file.
    assert corpus.vocab_size == tok.get_vocab_size() > 256
    ordered = sorted((tmp_path / "corpus").iterdir())
    held = {4, 9}  # every 5th file for 0.2
    expect_train = [i for n, p in enumerate(ordered) if n not in held for i in tok.encode(p.read_text()).ids]
    expect_val = [i for n, p in enumerate(ordered) if n in held for i in tok.encode(p.read_text()).ids]
    assert corpus.train.long().tolist() == expect_train and corpus.val.long().tolist() == expect_val
    # Rule: decoding the ids gives the text back (UTF-8 included).
    assert tok.decode(corpus.val.long().tolist()) == "".join(ordered[n].read_text() for n in sorted(held))
    assert "tokens of" in corpus.source and str(tmp_path / "tokenizer.json") in corpus.source
    # Rule: the tokenizer is part of the corpus's identity, hashed as a file of its own.
    tokenizer_sha = hashlib.sha256((tmp_path / "tokenizer.json").read_bytes()).hexdigest()
    assert corpus.digest()["tokenizer"]["each"] == {"tokenizer.json": tokenizer_sha}
    # Rule: a directory holding tokenizer.json works as well.
    assert load_corpus(tmp_path / "corpus", val_fraction=0.2, tokenizer=tmp_path).vocab_size == corpus.vocab_size
    # Rule: one file splits by tokens: the last val_fraction of them.
    one = load_corpus(ordered[0], val_fraction=0.25, tokenizer=tmp_path / "tokenizer.json")
    ids = tok.encode(ordered[0].read_text()).ids
    assert one.train.long().tolist() + one.val.long().tolist() == ids
    assert len(one.val) == round(0.25 * len(ids))


def test_tokenizer_sets_the_vocabulary_of_token_files(tmp_path):
    make_tokenizer(tmp_path / "tokenizer.json", ["abc abd abe"] * 20)
    write_tokens(tmp_path / "tok", range(50), range(20))  # no meta.json
    # Rule: without meta.json the tokenizer gives the vocabulary size of token files.
    corpus = load_corpus(tmp_path / "tok", tokenizer=tmp_path / "tokenizer.json")
    assert corpus.vocab_size == reading.Tokenizer.load(tmp_path / "tokenizer.json").vocab_size


def test_bad_tokenizers_name_the_file(tmp_path, monkeypatch):
    (tmp_path / "c.txt").write_text("hello " * 50)
    # Rule: a missing tokenizer names the path and the expected file.
    with pytest.raises(ConfigError, match=rf"{tmp_path / 'nope.json'}: tokenizer: no such file; expected a "
                                          "Hugging Face tokenizer.json"):
        load_corpus(tmp_path / "c.txt", tokenizer=tmp_path / "nope.json")
    (tmp_path / "bad.json").write_text("{}")
    pytest.importorskip("tokenizers")
    # Rule: a file that is no tokenizer is named.
    with pytest.raises(ConfigError, match=r"bad.json: tokenizer: cannot read it as a Hugging Face tokenizer"):
        load_corpus(tmp_path / "c.txt", tokenizer=tmp_path / "bad.json")
    make_tokenizer(tmp_path / "tokenizer.json", ["hello"] * 10)
    monkeypatch.setitem(__import__("sys").modules, "tokenizers", None)  # `import tokenizers` fails
    # Rule: without the package, the error says which extra to install.
    with pytest.raises(ConfigError, match=r"pip install 'geosearch\[tokenizers\]'"):
        load_corpus(tmp_path / "c.txt", tokenizer=tmp_path / "tokenizer.json")


def test_a_tokenizer_is_read_as_a_bounded_utf8_regular_file(tmp_path, monkeypatch):
    (tmp_path / "c.txt").write_text("hello " * 50)
    tok = tmp_path / "tokenizer.json"
    os.mkfifo(tok)
    # Rule: a named pipe is refused before it is opened (the tokenizer library would block on it).
    with pytest.raises(ConfigError, match=rf"^{tok}: tokenizer: is a named pipe \(FIFO\), expected a Hugging "
                                          "Face tokenizer.json"):
        load_corpus(tmp_path / "c.txt", tokenizer=tmp_path)
    tok.unlink()
    tok.write_bytes(b'{"version": "1.0", \xff}')
    # Rule: not UTF-8 names the file and the byte.
    with pytest.raises(ConfigError, match=rf"^{tok}: tokenizer: is not UTF-8 text \(byte 0xff at offset 19\)"):
        load_corpus(tmp_path / "c.txt", tokenizer=tok)
    monkeypatch.setattr(reading, "TOKENIZER_LIMIT", 16)
    # Rule: a size limit (128 MiB), said before the file is read.
    with pytest.raises(ConfigError, match=rf"^{tok}: tokenizer: is 21 bytes, more than the 16 bytes"):
        load_corpus(tmp_path / "c.txt", tokenizer=tok)


# --------------------------------------------------------------------------- errors
def test_missing_empty_and_short_data_name_the_path(tmp_path):
    missing = tmp_path / "nope.txt"
    # Rule: a missing path is named, with what was expected.
    with pytest.raises(ConfigError, match=rf"{missing}: no such file or directory; expected a text file"):
        load_corpus(missing)
    empty = tmp_path / "empty.txt"
    empty.write_bytes(b"")
    # Rule: an empty file is named.
    with pytest.raises(ConfigError, match=rf"{empty}: the text is empty"):
        load_corpus(empty)
    (tmp_path / "emptydir").mkdir()
    with pytest.raises(ConfigError, match=r"emptydir: the directory holds no files"):
        load_corpus(tmp_path / "emptydir")
    short = tmp_path / "short.txt"
    short.write_bytes(b"x" * 200)
    # Rule: too short for one context (+1) in a split: the source names the path and the need.
    with pytest.raises(ConfigError, match=rf"{short}.*val split has 20 tokens but a context of 32 "
                                          r"needs at least 33"):
        load_corpus(short, block_size=32)
    load_corpus(short, block_size=19)  # 20 tokens: exactly one sample fits


def test_bad_token_files_name_the_file(tmp_path):
    write_tokens(tmp_path, range(10), range(10), json.dumps({"vocab_size": 10}))
    (tmp_path / "val.bin").write_bytes(b"abc")
    # Rule: a token file that is not whole uint16 values is named.
    with pytest.raises(ConfigError, match=r"val.bin: has 3 bytes; expected a non-empty array of uint16"):
        load_corpus(tmp_path)
    (tmp_path / "val.bin").unlink()
    # Rule: a missing half of the pair is named.
    with pytest.raises(ConfigError, match=r"val.bin is missing"):
        load_corpus(tmp_path)
    # Rule: pointing at a .bin file itself says to pass the directory.
    with pytest.raises(ConfigError, match=r"train.bin: a token file on its own"):
        load_corpus(tmp_path / "train.bin")
    (tmp_path / "meta.json").write_text("{not json")
    write_tokens(tmp_path, range(10), range(10))
    with pytest.raises(ConfigError, match=r"meta.json: malformed JSON at line 1, column 2: Expecting property"):
        load_corpus(tmp_path)


@pytest.mark.parametrize("meta, message", [
    ('{"vocab_size": 10, "dtype": ["uint16"]}',
     "dtype: got ['uint16'] (a list), not the name of a token dtype for train.bin and val.bin; "
     "expected one of: uint16, uint32"),
    ('{"vocab_size": 10, "dtype": 16}',
     "dtype: got 16 (a whole number), not the name of a token dtype for train.bin and val.bin; "
     "expected one of: uint16, uint32"),
    ('{"vocab_size": "10"}', "vocab_size: expected a whole number >= 1, got '10' (a string)"),
    ('{"vocab_size": true}', "vocab_size: expected a whole number >= 1, got True (a boolean)"),
    ('{"vocab_size": 10.0}', "vocab_size: expected a whole number >= 1, got 10.0 (a number)"),
    ('{"vocab_size": 0}', "vocab_size: expected a whole number >= 1, got 0 (a whole number)"),
    ('{"vocab_size": [1, 2]}', "vocab_size: expected a whole number >= 1, got [1, 2] (a list)"),
    ('[1, 2]', "expected a mapping with a 'vocab_size' key, got a list"),
    ('"vocab"', "expected a mapping with a 'vocab_size' key, got a string"),
])
def test_every_field_of_meta_json_is_type_checked(tmp_path, meta, message):
    write_tokens(tmp_path, range(10), range(10), meta)
    with pytest.raises(ConfigError) as e:
        load_corpus(tmp_path)
    # Rule: a field of the wrong type is one line naming meta.json, the key and what it must be
    # (a list as dtype raised TypeError: unhashable type).
    assert str(e.value) == f"{tmp_path / 'meta.json'}: {message}"


def test_meta_json_is_read_as_a_bounded_utf8_regular_file(tmp_path, monkeypatch):
    write_tokens(tmp_path, range(10), range(10))
    meta = tmp_path / "meta.json"
    meta.write_bytes(b'\xff\xfe{"vocab_size": 10}')
    # Rule: not UTF-8 is one line naming the file (was UnicodeDecodeError).
    with pytest.raises(ConfigError, match=rf"^{meta}: is not UTF-8 text \(byte 0xff at offset 0\)"):
        load_corpus(tmp_path)
    meta.write_text('{"vocab_size": 10}' + " " * CONFIG_LIMIT)
    # Rule: a config-sized limit (1 MiB), said before the file is read.
    with pytest.raises(ConfigError, match=rf"^{meta}: is 1.0 MB \(\d+ bytes\), more than the 1 MiB"):
        load_corpus(tmp_path)
    meta.unlink()
    os.mkfifo(meta)
    # Rule: a named pipe is refused without being opened (opening it would block).
    with pytest.raises(ConfigError, match=rf"^{meta}: is a named pipe \(FIFO\), expected a mapping"):
        load_corpus(tmp_path)
    meta.unlink()
    (tmp_path / "meta.yaml").write_text(
        'l0: &l0 [a, a, a, a, a, a, a, a, a, a]\n'
        + "".join(f"l{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * 10) + "]\n" for i in range(1, 9)))
    # Rule: meta.yaml goes through the YAML loader's alias limits.
    with pytest.raises(ConfigError, match=r"meta.yaml: malformed YAML at line \d+, column \d+: its aliases"):
        load_corpus(tmp_path)


def test_pipes_and_devices_are_refused_as_data_without_being_opened(tmp_path):
    os.mkfifo(tmp_path / "corpus.txt")
    # Rule: a text corpus that is a named pipe is refused (reading it would block for ever).
    with pytest.raises(ConfigError, match=r"corpus.txt: is a named pipe \(FIFO\), expected a text file"):
        load_corpus(tmp_path / "corpus.txt")
    with pytest.raises(ConfigError, match=r"^/dev/null: is a character device, expected a text file"):
        load_corpus("/dev/null")
    tokens = tmp_path / "tok"
    write_tokens(tokens, range(10), range(10), json.dumps({"vocab_size": 10}))
    (tokens / "val.bin").unlink()
    os.mkfifo(tokens / "val.bin")
    # Rule: a token file that is a named pipe is named as such, not as missing.
    with pytest.raises(ConfigError, match=r"val.bin: is a named pipe \(FIFO\), expected a file of token ids"):
        load_corpus(tokens)
    # Rule: in a directory of text files, pipes are skipped (only regular files are text).
    (tmp_path / "texts").mkdir()
    (tmp_path / "texts" / "a.txt").write_bytes(b"a" * 100)
    os.mkfifo(tmp_path / "texts" / "pipe.txt")
    corpus = load_corpus(tmp_path / "texts")
    assert corpus.source.startswith("text directory (1 files)") and len(corpus.train) == 90


def test_a_text_corpus_larger_than_its_limit_is_refused_before_it_is_read(tmp_path, monkeypatch):
    monkeypatch.setattr(data_mod, "TEXT_CORPUS_LIMIT", 1024)
    (tmp_path / "a.txt").write_bytes(b"a" * 600)
    (tmp_path / "b.txt").write_bytes(b"b" * 600)
    read = []
    monkeypatch.setattr(reading, "read_bytes", lambda files, source: read.append(files))
    # Rule: the text is read into memory: more than the limit (in all) is refused, and says
    # what to do instead.
    with pytest.raises(ConfigError, match=rf"^{tmp_path}: 1.2 kB of text, more than the 1 KiB a text "
                                          r"corpus may hold .* train.bin and val.bin token files"):
        load_corpus(tmp_path)
    assert read == []


def test_bad_arguments():
    # Rule: val_fraction must leave both splits something.
    for bad in (0.0, 1.0, -0.1):
        with pytest.raises(ConfigError, match="val_fraction: must be strictly between 0 and 1"):
            load_corpus(val_fraction=bad)
