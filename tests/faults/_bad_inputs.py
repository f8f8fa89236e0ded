"""Bad inputs a new user may give, each of which must end as one bounded line, exit code 2.

Each case writes its inputs into an empty scratch directory (the working directory while it
runs) and returns the command line. :func:`run_case` runs it in-process through
``geosearch.cli.main`` and reports what a user would see and what it wrote: the contract
(checked by ``tests/faults/test_bad_inputs.py``, tabled by ``benchmarks/chaos.py --inputs``
into ``docs/reliability.md``) is exit code 2, exactly one line on stderr starting with
``geosearch <command>: error:``, at most :data:`MAX_LINE` characters, nothing written or
changed in the scratch directory, and no password from a storage URL in the output.
"""

from __future__ import annotations

import array
import contextlib
import io
import json
import os
import pickle
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import yaml

MAX_LINE = 400
"""The longest error line a bad input may produce."""
SECRET = "s3cret-pw"
"""The password in the storage URLs of the cases: it must show nowhere."""

PROXY = {"model": "tiny", "steps": 4, "batch_size": 2, "eval_every": 2, "eval_batches": 1,
         "probe_every": 2, "probe_batch_size": 1, "device": "cpu"}
GRID = {"attn": ["adamw"], "mlp": ["adamw", "euclidean"]}
USER_RULES = [{"type": "attn_qkv", "pattern": r"\.mix\.qkv\.weight$", "family": "attn"},
              {"type": "mlp_in", "pattern": r"\.ff\.up\.weight$", "family": "mlp"}]


@dataclass(frozen=True)
class Case:
    """One bad input: what it is, and how to make it in a scratch directory."""

    what: str
    """The input, in words (the first column of the table)."""
    make: Callable[[Path], list[str]]
    """Writes the case's files into the directory; returns the command line."""
    volatile: bool = False
    """The message quotes a library or the OS (wording varies by version), or this machine
    (its memory): the table's message is compared by its first words only."""
    cpu_only: bool = False
    """The case is a bad input only on a machine without CUDA (``--device cuda``)."""


@dataclass
class Outcome:
    """What running a case did."""

    argv: list[str]
    code: int
    stderr: str
    stdout: str
    changed: list[str]

    @property
    def line(self) -> str:
        return self.stderr.strip().splitlines()[0] if self.stderr.strip() else ""

    def problems(self) -> list[str]:
        """Every way the outcome breaks the contract (empty: it keeps it)."""
        command = self.argv[0]
        out = []
        lines = self.stderr.strip().splitlines()
        if self.code != 2:
            out.append(f"exit code {self.code}, not 2")
        if len(lines) != 1:
            out.append(f"{len(lines)} lines on stderr, not 1")
        elif not lines[0].startswith(f"geosearch {command}: error: " if command in _commands()
                                     else "geosearch: error: "):
            out.append("the line does not start with 'geosearch <command>: error:'")
        if self.stdout.strip():
            out.append("output before the error")
        if any(len(ln) > MAX_LINE for ln in lines):
            out.append(f"a line longer than {MAX_LINE} characters")
        if "Traceback" in self.stderr:
            out.append("a traceback")
        if SECRET in self.stderr + self.stdout:
            out.append("the password shows")
        if self.changed:
            out.append("wrote " + ", ".join(self.changed[:3]))
        return out


def _commands() -> list[str]:
    from geosearch.cli import _COMMANDS

    return [name for name, _, _ in _COMMANDS]


def _space(d: Path, file: str = "s.yaml", **extra) -> str:
    data = {"version": 1, "geometries": GRID, "proxy": dict(PROXY), **extra}
    (d / file).write_text(yaml.safe_dump(data), encoding="utf-8")
    return file


def _file(d: Path, name: str, text: str | bytes) -> str:
    path = d / name
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text, encoding="utf-8")
    return name


def _laughs(top: str = "") -> str:
    """The "billion laughs": 90 aliases that stand for 10^10 values."""
    lines = ['l0: &l0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    lines += [f"l{i}: &l{i} [" + ",".join([f"*l{i - 1}"] * 10) + "]" for i in range(1, 10)]
    return top + "\n".join(lines) + "\n"


def _flow_laughs() -> str:
    """:func:`_laughs` on one line, for a ``--set KEY=VALUE``: 10^10 values."""
    levels = ["&l0 [" + ",".join(["lol"] * 10) + "]"]
    levels += [f"&l{i} [" + ",".join([f"*l{i - 1}"] * 10) + "]" for i in range(1, 10)]
    return "[" + ", ".join(levels) + "]"


def _existing_study(d: Path) -> None:
    """An empty study ``s`` in ``runs/s/study.db``, as a first run leaves it."""
    import optuna

    (d / "runs" / "s").mkdir(parents=True)
    optuna.create_study(study_name="s", storage=f"sqlite:///{d / 'runs' / 's' / 'study.db'}")


def _fifo(d: Path, name: str) -> str:
    """A named pipe: opening it for reading would block until a writer comes."""
    os.mkfifo(d / name)
    return name


def _tokens(d: Path, meta: bytes, name: str = "tok") -> str:
    """A token directory (``train.bin``, ``val.bin`` of uint16 ids) with ``meta`` as its meta.json."""
    (d / name).mkdir()
    for split in ("train.bin", "val.bin"):
        (d / name / split).write_bytes(bytes(range(64)) * 4)  # ids below 16,192
    (d / name / "meta.json").write_bytes(meta)
    return name


def _bare_tokens(d: Path, meta_pkl: bytes | None = None, name: str = "tok") -> str:
    """A token directory as nanoGPT writes it: ``train.bin`` and ``val.bin`` of uint16 ids
    below 64, no meta file (``openwebtext``), or ``meta_pkl`` as its ``meta.pkl``."""
    (d / name).mkdir()
    for split in ("train.bin", "val.bin"):
        (d / name / split).write_bytes(array.array("H", list(range(64)) * 4).tobytes())
    if meta_pkl is not None:
        (d / name / "meta.pkl").write_bytes(meta_pkl)
    return name


def _shared_list_pickle() -> bytes:
    """A 510-byte ``meta.pkl`` whose ``vocab_size`` is a list holding one list twice, 80
    levels deep: its full repr has 2**80 items (a message that calls ``repr()`` on it hangs)."""
    x: list = []
    for _ in range(80):
        x = [x, x]
    return pickle.dumps({"vocab_size": x})


def _long_int_pickle(key: str) -> bytes:
    """A ``meta.pkl`` whose ``key`` is a whole number of 5,001 digits (``repr()`` refuses
    more than 4,300); written by hand, as ``pickle.dumps`` would need ``repr`` too."""
    n = 10**5000
    body = n.to_bytes((n.bit_length() + 8) // 8, "little", signed=True)
    name = key.encode()
    return (b"\x80\x02}X" + len(name).to_bytes(4, "little") + name
            + b"\x8b" + len(body).to_bytes(4, "little") + body + b"s.")


def _nested_list_pickle(depth: int = 200_000) -> bytes:
    """A ``meta.pkl`` whose ``vocab_size`` is a list nested ``depth`` levels deep."""
    return (b"\x80\x02}X\x0a\x00\x00\x00vocab_size" + b"]" * depth + b"a" * (depth - 1) + b"s.")


def _recover_fifo(d: Path) -> list[str]:
    """A run directory whose ``study.json`` is a named pipe (``recover`` read it, waiting for
    a writer for ever)."""
    _existing_study(d)
    _fifo(d, "runs/s/study.json")
    return ["recover", "runs/s"]


class _RunsACommand:
    """Pickled, it runs ``touch PWNED`` when a plain ``pickle.load`` reads it (in the scratch
    directory, where the case would see the file written); made here, it runs nothing."""

    def __reduce__(self):
        return (os.system, ("touch PWNED",))


def _train(*extra: str) -> list[str]:
    return ["train", "--assign", "attn=adamw,mlp=adamw", "--model", "tiny", "--device", "cpu", *extra]


def _foreign_db(d: Path, name: str) -> str:
    """Another application's SQLite database (one table of its own)."""
    import sqlite3

    (d / name).parent.mkdir(parents=True, exist_ok=True)
    con = sqlite3.connect(d / name)
    con.execute("CREATE TABLE notes (body TEXT)")
    con.execute("INSERT INTO notes VALUES ('mine')")
    con.commit()
    con.close()
    return name


def _journal(d: Path, extra: bytes, at: int | None = None) -> None:
    """``run/journal.log``: a study's journal with ``extra`` put after its line ``at`` (None: appended)."""
    import optuna

    (d / "run").mkdir()
    path = d / "run" / "journal.log"
    backend = optuna.storages.journal.JournalFileBackend(str(path))
    optuna.create_study(study_name="s", storage=optuna.storages.JournalStorage(backend)).set_user_attr("a", 1)
    lines = path.read_bytes().splitlines(keepends=True)
    at = len(lines) if at is None else at
    path.write_bytes(b"".join(lines[:at]) + extra + b"".join(lines[at:]))


def _created_study(d: Path, **flags) -> None:
    """The study ``s`` of ``s.yaml`` (with the command-line ``flags`` over it) in
    ``runs/s/study.db``, created with the space's attrs and its data's digest as a first run
    leaves it (no trial yet): a rerun that changes its space resumes it."""
    import optuna

    from geosearch.search.space.spec import apply_overrides, load_space
    from geosearch.search.study.run import bind_study, data_digest

    run_dir = d / "runs" / "s"
    run_dir.mkdir(parents=True)
    study = optuna.create_study(study_name="s", storage=f"sqlite:///{run_dir / 'study.db'}")
    space = apply_overrides(load_space(str(d / "s.yaml")), **flags)
    bind_study(study, space, run_dir, "study.db", data_digest(space))


def _resumed_on_changed_data(d: Path) -> list[str]:
    """A study created on the token directory ``tok``, one of whose ids was edited since."""
    data = _bare_tokens(d)
    command = _search(d, "--data", data, "--vocab-size", "64")
    _created_study(d, data=data, vocab_size=64)
    ids = array.array("H", (d / data / "val.bin").read_bytes())
    ids[0] = 63
    (d / data / "val.bin").write_bytes(ids.tobytes())
    return command


def _resumed(d: Path, *extra: str) -> list[str]:
    """``_search`` of a study created from the same space before, with ``extra`` flags."""
    command = _search(d, *extra)
    _created_study(d)
    return command


_TWICE = ("version: 1\ngeometries: {attn: [adamw], mlp: [adamw, euclidean]}\n"
          "proxy: {model: tiny, steps: 4, batch_size: 2, eval_every: 2, eval_batches: 1, probe_every: 2,\n"
          "        probe_batch_size: 1, device: cpu}\n"
          "repeats: 1\nproxy: {model: tiny, steps: 4}\n")


def _search(d: Path, *extra: str) -> list[str]:
    return ["search", "--space", _space(d), "--runs-dir", "runs", *extra]


def _user_model(d: Path, body: str, name: str = "user_model.py") -> str:
    return _file(d, name, body)


_RULES = json.dumps(USER_RULES)
_RAISES = "def make_model(vocab_size, block_size):\n    raise RuntimeError('no GPU memory left')\n"
# A factory that ignores vocab_size: its logits are 100 wide, the bytes of the data are 256.
# Its attention follows the record_qk protocol, so the probes hook it (no warning line).
_NARROW = """import torch
from torch import nn


class Mix(nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(8, 8, bias=False)
        self.record_qk, self.last_q, self.last_k = False, None, None

    def forward(self, x):
        return self.qkv(x)


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.mix, self.ff = Mix(), nn.Module()
        self.ff.up = nn.Linear(8, 8, bias=False)

    def forward(self, x):
        return self.ff.up(self.mix(x))


class LM(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed, self.blocks = nn.Embedding(256, 8), nn.ModuleList([Block()])
        self.head = nn.Linear(8, 100, bias=False)

    def forward(self, idx):
        x = self.embed(idx)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def make_model(vocab_size, block_size):
    return LM()
"""
_SQLITE_HEADER = b"SQLite format 3\x00" + bytes(84)

CASES: list[Case] = [
    # --- study names
    Case("`--study` of 300 characters", lambda d: _search(d, "--study", "a" * 300)),
    Case("`--study` with a newline", lambda d: _search(d, "--study", "a\nb")),
    Case("`--study ../up` (a path)", lambda d: _search(d, "--study", "../up")),
    Case("`--study .hidden`", lambda d: _search(d, "--study", ".hidden")),
    Case("`--study 'my study'` (a space)", lambda d: _search(d, "--study", "my study")),
    Case("`--study -x` (looks like a flag)", lambda d: _search(d, "--study=-x")),
    Case("space file whose `name:` has a slash",
         lambda d: ["search", "--space", _space(d, name="a/b"), "--runs-dir", "runs"]),
    # --- storage
    Case("`--storage notes.txt`, an existing text file",
         lambda d: _search(d, "--storage", _file(d, "notes.txt", "my notes\n"))),
    Case("`--storage study.db`, an SQLite file given as a path",
         lambda d: _search(d, "--storage", _file(d, "study.db", _SQLITE_HEADER))),
    Case("`--storage` naming a directory",
         lambda d: (d / "adir").mkdir() or _search(d, "--storage", "adir")),
    Case("`--storage` of an unknown URL scheme", lambda d: _search(d, "--storage", "bogus://nowhere")),
    Case("`--storage postgresql://me:PASSWORD@...` that refuses the connection",
         lambda d: _search(d, "--storage", f"postgresql://me:{SECRET}@127.0.0.1:9/x"), volatile=True),
    Case("`--storage sqlite:///notes.txt`, a text file",
         lambda d: _search(d, "--storage", "sqlite:///" + _file(d, "notes.txt", "my notes\n"))),
    Case("`--storage sqlite:///foreign.db`, another application's SQLite database",
         lambda d: _search(d, "--storage", "sqlite:///" + _foreign_db(d, "foreign.db"))),
    Case("`--storage` naming a named pipe (FIFO)", lambda d: _search(d, "--storage", _fifo(d, "pipe.log"))),
    # --- the run directory
    Case("`--runs-dir` naming a file", lambda d: _search(d)[:-1] + [_file(d, "afile", "x\n")]),
    Case("`--runs-dir` below a file", lambda d: _search(d)[:-1] + [_file(d, "afile", "x\n") + "/sub"]),
    # --- py: models
    Case("`py:` module with a syntax error",
         lambda d: _search(d, "--model", "py:" + _user_model(d, "def make_model(:\n") + ":make_model",
                           "--set", "rules=" + _RULES), volatile=True),
    Case("`py:` module that raises on import",
         lambda d: _search(d, "--model", "py:" + _user_model(d, "import nosuchpackage_xyz\n")
                           + ":make_model", "--set", "rules=" + _RULES)),
    Case("`py:` factory that raises",
         lambda d: _search(d, "--model", "py:" + _user_model(d, _RAISES) + ":make_model",
                           "--set", "rules=" + _RULES)),
    Case("`py:` module that is not installed",
         lambda d: _search(d, "--model", "py:nosuch_module_xyz:make_model", "--set", "rules=" + _RULES)),
    Case("`py:` file without the factory",
         lambda d: _search(d, "--model", "py:" + _user_model(d, "x = 1\n") + ":make_model",
                           "--set", "rules=" + _RULES)),
    Case("`py:` spec without a factory name",
         lambda d: _search(d, "--model", "py:user_model.py", "--set", "rules=" + _RULES)),
    # --- hf: models (the model's own error first; no list of every transformers type)
    Case("`--model hf:bogus`, an unknown model type", lambda d: _search(d, "--model", "hf:bogus")),
    Case("`--model hf:./DIR` whose config.json is not a causal LM",
         lambda d: _search(d, "--model", "hf:./" + str(Path(_file(d, "bert/config.json",
                                                                   '{"model_type": "bert"}')).parent))),
    # --- search spaces
    Case("`--space` naming a directory", lambda d: (d / "spaces").mkdir() or ["search", "--space", "spaces"]),
    Case("`--space` naming a missing file", lambda d: ["search", "--space", "nope.yaml"]),
    Case("`--space` with malformed YAML",
         lambda d: ["search", "--space", _file(d, "bad.yaml", "version: 1\ngeometries: {attn: [stiefel\n")]),
    Case("`--space` with a YAML alias bomb",
         lambda d: ["search", "--space", _file(d, "bomb.yaml", _laughs("version: 1\n"))]),
    Case("`--space` holding a list", lambda d: ["search", "--space", _file(d, "list.yaml", "- 1\n- 2\n")]),
    Case("`--space` of an empty file", lambda d: ["search", "--space", _file(d, "empty.yaml", "")]),
    Case("`--space` of a binary file",
         lambda d: ["search", "--space", _file(d, "binary.yaml", b"\xff\xfe\x00\x01" * 8)]),
    Case("`--space` naming a named pipe (FIFO)", lambda d: ["search", "--space", _fifo(d, "s.yaml")]),
    Case("`--space` of 1.8 MB (more than 1 MiB)",
         lambda d: ["search", "--space", _file(d, "big.yaml", "version: 1\n" + "# filler\n" * 200_000)]),
    Case("`--space` giving a key twice (a second `proxy:`)",
         lambda d: ["search", "--space", _file(d, "s.yaml", _TWICE), "--runs-dir", "runs"]),
    Case("space file with `proxy.min_lr_ratio: .nan`",
         lambda d: ["search", "--space", _space(d, proxy={**PROXY, "min_lr_ratio": float("nan")}),
                    "--runs-dir", "runs"]),
    Case("space file with `proxy.grad_clip: .nan`",
         lambda d: ["search", "--space", _space(d, proxy={**PROXY, "grad_clip": float("nan")}),
                    "--runs-dir", "runs"]),
    Case("space file with `proxy.steps: 10^30` (a YAML int)",
         lambda d: ["search", "--space", _space(d, proxy={**PROXY, "steps": 10**30}), "--runs-dir", "runs"]),
    Case("`--set proxy.optimizer_args={ns_steps: 10^12}`",
         lambda d: _search(d, "--set", "proxy.optimizer_args={ns_steps: 1000000000000}")),
    Case("`--set proxy.seed=-1`", lambda d: _search(d, "--set", "proxy.seed=-1")),
    Case("`--set sampler.seed=-1`", lambda d: _search(d, "--set", "sampler.seed=-1")),
    Case("`--target-steps 5` on a 20-step proxy", lambda d: _search(d, "--steps", "20", "--target-steps", "5")),
    Case("a resumed study with another `pruner.max_logit_factor`",
         lambda d: _resumed(d, "--set", "pruner.max_logit_factor=20")),
    Case("a resumed study with other `baselines`", lambda d: _resumed(d, "--set", "baselines=[muon]")),
    Case("`--workers 0`", lambda d: _search(d, "--workers", "0")),
    Case("`--stale-after -1`", lambda d: _search(d, "--stale-after", "-1")),
    Case("`--set` without `=`", lambda d: _search(d, "--set", "proxy.steps")),
    Case("`--set` of an unknown key", lambda d: _search(d, "--set", "proxy.stepz=3")),
    Case("`--set` of a YAML alias bomb", lambda d: _search(d, "--set", "proxy.steps=" + _flow_laughs())),
    Case("`--model-arg` of a YAML alias bomb", lambda d: _search(d, "--model-arg", "n_layer=" + _flow_laughs())),
    Case("`--model-arg n_layer=10^21` (a depth no machine builds)",
         lambda d: _search(d, "--model-arg", "n_layer=" + "1" + "0" * 21)),
    Case("`--model-arg n_embd=10000000` (10¹⁵ parameters)",
         lambda d: _search(d, "--model-arg", "n_embd=10000000", "--model-arg", "n_head=1"), volatile=True),
    Case("`train --model-arg n_embd=10000000`",
         lambda d: _train("--model-arg", "n_embd=10000000", "--model-arg", "n_head=1"), volatile=True),
    Case("`--trials -1`", lambda d: _search(d, "--trials", "-1")),
    Case("`--device cuda` on a machine without CUDA, resuming a study",
         lambda d: _existing_study(d) or _search(d, "--device", "cuda"), cpu_only=True),
    Case("`--set proxy.device=cuda` on a machine without CUDA",
         lambda d: _search(d, "--set", "proxy.device=cuda"), cpu_only=True),
    # --- run-time settings every trial would fail on (what `train` refuses)
    Case("`--grad-accum 3` with a batch of 4", lambda d: _search(d, "--batch-size", "4", "--grad-accum", "3")),
    Case("`--grad-accum 3` with a batch of 4, resuming a study",
         lambda d: _existing_study(d) or _search(d, "--batch-size", "4", "--grad-accum", "3")),
    Case("`--mixed-precision fp16` with `proxy.device: cpu`", lambda d: _search(d, "--mixed-precision", "fp16")),
    Case("`--log-with nosuchtracker`", lambda d: _search(d, "--log-with", "nosuchtracker")),
    Case("`py:` factory whose logits are not the data's vocabulary (100 wide, not 256)",
         lambda d: _search(d, "--model", "py:" + _user_model(d, _NARROW) + ":make_model",
                           "--set", "rules=" + _RULES)),
    # --- train
    Case("`train --config` holding a list",
         lambda d: ["train", "--assign", "attn=adamw", "--config", _file(d, "c.yaml", "- 1\n- 2\n")]),
    Case("`train --config` holding a number",
         lambda d: ["train", "--assign", "attn=adamw", "--config", _file(d, "c.yaml", "42\n")]),
    Case("`train --config` with a YAML alias bomb",
         lambda d: ["train", "--assign", "attn=adamw", "--config", _file(d, "c.yaml", _laughs())]),
    Case("`train --config` giving a key twice",
         lambda d: ["train", "--assign", "attn=adamw", "--config", _file(d, "c.yaml", "steps: 4\nlr: 0.1\nsteps: 8\n")]),
    Case("`train --config` naming a missing file",
         lambda d: ["train", "--assign", "attn=adamw", "--config", "nope.yaml"]),
    Case("`train --config` naming a named pipe (FIFO)",
         lambda d: ["train", "--assign", "attn=adamw", "--config", _fifo(d, "c.yaml")]),
    Case("`train --assignment` of a file larger than 1 MiB",
         lambda d: ["train", "--assignment", _file(d, "a.yaml", "version: 1\n" + "#" * 2**20 + "\n")]),
    Case("`train --assign` with an unknown geometry", lambda d: ["train", "--assign", "attn=stiefle"]),
    Case("`train --out` naming an existing file", lambda d: _train("--out", _file(d, "afile", "x\n"))),
    Case("`train --data` naming a named pipe (FIFO)", lambda d: _train("--data", _fifo(d, "corpus.txt"))),
    Case("token directory whose `meta.json` has a list as `dtype`",
         lambda d: _train("--data", _tokens(d, b'{"vocab_size": 300, "dtype": ["uint16"]}'))),
    Case("token directory whose `meta.json` has a string as `vocab_size`",
         lambda d: _train("--data", _tokens(d, b'{"vocab_size": "300"}'))),
    Case("token directory whose `meta.json` is not UTF-8",
         lambda d: _train("--data", _tokens(d, b'{"vocab_size": 300, "note": "caf\xe9"}'))),
    Case("token directory without a meta file or a vocabulary (nanoGPT's `openwebtext`)",
         lambda d: _train("--data", _bare_tokens(d))),
    Case("token directory whose `meta.pkl` names `os.system` (a pickle that would run a command)",
         lambda d: _train("--data", _bare_tokens(d, pickle.dumps({"vocab_size": _RunsACommand()})))),
    Case("token ids at or above `--vocab-size`", lambda d: _train("--data", _bare_tokens(d), "--vocab-size", "50")),
    Case("a resumed study whose data file was edited since", _resumed_on_changed_data),
    Case("`--tokenizer` naming a named pipe (FIFO)", lambda d: _train("--tokenizer", _fifo(d, "tokenizer.json"))),
    Case("`train --device cuda` on a machine without CUDA",
         lambda d: ["train", "--assign", "attn=adamw,mlp=adamw", "--model", "tiny", "--device", "cuda"],
         cpu_only=True),
    # --- export, report, inspect
    Case("`export` of a missing run directory", lambda d: ["export", "runs/nope"]),
    Case("`export --storage notes.txt`, a text file",
         lambda d: ["export", ".", "--storage", _file(d, "notes.txt", "my notes\n")]),
    Case("`export --top 0`", lambda d: ["export", ".", "--top", "0"]),
    Case("`export -o` naming a directory", lambda d: (d / "adir").mkdir() or ["export", ".", "-o", "adir"]),
    Case("`export` of a run directory whose `study.db` is an empty file",
         lambda d: _file(d, "run/study.db", b"") and ["export", "run"]),
    Case("`export` of a run directory whose `study.db` is another application's SQLite database",
         lambda d: _foreign_db(d, "run/study.db") and ["export", "run"]),
    Case("`report --storage sqlite:///foreign.db`, another application's SQLite database",
         lambda d: (d / "run").mkdir() or ["report", "run", "--storage", "sqlite:///" + _foreign_db(d, "foreign.db")]),
    Case("`report` of a run directory whose `journal.log` has a line that is not JSON",
         lambda d: _journal(d, b"garbage\n", at=1) or ["report", "run"]),
    Case("`export` of a journal with a record of an unknown operation",
         lambda d: _journal(d, b'{"op_code": 99, "worker_id": "w"}\n') or ["export", "run"]),
    Case("`report` of a directory without a study", lambda d: (d / "run").mkdir() or ["report", "run"]),
    Case("`inspect --model py:` module with a syntax error",
         lambda d: ["inspect", "--model", "py:" + _user_model(d, "def make_model(:\n") + ":make_model"],
         volatile=True),
    # --- a meta.pkl that a message must not print whole, a run directory's own files
    Case("token directory whose `meta.pkl` holds a list shared 80 levels deep "
         "(2**80 items printed)",
         lambda d: _train("--data", _bare_tokens(d, _shared_list_pickle()))),
    Case("the same `meta.pkl`, to `search`",
         lambda d: _search(d, "--data", _bare_tokens(d, _shared_list_pickle()))),
    Case("token directory whose `meta.pkl` has a `vocab_size` of 5,001 digits",
         lambda d: _train("--data", _bare_tokens(d, _long_int_pickle("vocab_size")))),
    Case("token directory whose `meta.pkl` has a `dtype` of 5,001 digits",
         lambda d: _train("--data", _bare_tokens(d, _long_int_pickle("dtype")))),
    Case("token directory whose `meta.pkl` has a `vocab_size` nested 200,000 lists deep",
         lambda d: _train("--data", _bare_tokens(d, _nested_list_pickle()))),
    Case("`recover` of a run directory whose `study.json` is a named pipe (FIFO)", _recover_fifo),
    # --- values that were accepted and ignored, clamped or kept for ever
    Case("`--vocab-size 300` on the built-in text (bytes: 256)",
         lambda d: _search(d, "--vocab-size", "300")),
    Case("`train --vocab-size 300` on the built-in text", lambda d: _train("--vocab-size", "300")),
    Case("`--set proxy.warmup_steps=1000000` on a 4-step proxy",
         lambda d: _search(d, "--set", "proxy.warmup_steps=1000000")),
    Case("`train --config` with `warmup_steps: 1000000` and `steps: 20`",
         lambda d: _train("--config", _file(d, "c.yaml", "steps: 20\nwarmup_steps: 1000000\n"))),
    Case("`--stale-after inf`", lambda d: _search(d, "--stale-after", "inf")),
    Case("`--stale-after nan`", lambda d: _search(d, "--stale-after", "nan")),
    Case("`--runs-dir ''` (an empty path)", lambda d: _search(d)[:-1] + [""]),
    Case("`inspect --model ''`", lambda d: ["inspect", "--model", ""]),
    # --- argparse's own errors: one line, the flag and what it takes, the first problem only
    Case("`--workers x`", lambda d: _search(d, "--workers", "x")),
    Case("`--timeout 1e` (not a number)", lambda d: _search(d, "--timeout", "1e")),
    Case("`--workers` without its value", lambda d: _search(d, "--workers")),
    Case("`--wokers 2` (a misspelt flag)", lambda d: _search(d, "--wokers", "2")),
    Case("`--bogus`, an unknown flag", lambda d: _search(d, "--bogus")),
    Case("`--workers x --bogus` (two problems: the first is said)",
         lambda d: _search(d, "--workers", "x", "--bogus")),
    Case("`--steps` of 80 digits", lambda d: _search(d, "--steps", "9" * 80)),
    Case("`export` without its RUN_DIR", lambda d: ["export"]),
    Case("`export RUN_DIR EXTRA` (an argument too many)", lambda d: ["export", "runs/s", "extra"]),
    Case("an unknown command", lambda d: ["serach", "--space", _space(d)]),
    # --- what would train and keep nothing, or never end
    Case("`--storage sqlite://` (a database in memory)",
         lambda d: _search(d, "--storage", "sqlite://")),
    Case("`--storage sqlite:///:memory:`", lambda d: _search(d, "--storage", "sqlite:///:memory:")),
    Case("`--model-arg block_size=100000` (T x T attention logits of the probes)",
         lambda d: _search(d, "--model-arg", "block_size=100000"), volatile=True),
    Case("`train --model-arg block_size=100000`",
         lambda d: _train("--model-arg", "block_size=100000"), volatile=True),
    # --- torch threads
    Case("`--threads 0`", lambda d: _search(d, "--threads", "0")),
    Case("`--threads x`", lambda d: _search(d, "--threads", "x")),
    Case("`train --threads -1`", lambda d: _train("--threads", "-1")),
]


def _snapshot(d: Path) -> dict[str, tuple[int, int]]:
    out = {}
    for root, dirs, files in os.walk(d):
        for name in dirs + files:
            p = Path(root) / name
            st = p.lstat()
            out[str(p.relative_to(d))] = (st.st_size, st.st_mtime_ns)
    return out


def run_case(case: Case, scratch: Path) -> Outcome:
    """Make ``case`` in the empty directory ``scratch`` and run it there, in this process."""
    from geosearch.cli import main

    scratch.mkdir(parents=True, exist_ok=True)
    here = os.getcwd()
    os.chdir(scratch)
    sys.path.insert(0, str(scratch))  # where a `py:` module name is looked up
    try:
        argv = case.make(scratch)
        before = _snapshot(scratch)
        err, out = io.StringIO(), io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
            try:
                code = main(argv)
            except SystemExit as e:  # argparse's own errors
                code = e.code if isinstance(e.code, int) else 2
        after = _snapshot(scratch)
    finally:
        sys.path.remove(str(scratch))
        os.chdir(here)
    changed = sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))
    return Outcome(argv, code, err.getvalue(), out.getvalue(), changed)


def table(rows: list[tuple[Case, Outcome]], scratch_root: Path) -> str:
    """The markdown table of the cases: input, exit code, the line a user sees."""
    lines = ["| # | bad input | exit | what the user sees (one line) |", "|---|---|---|---|"]
    for i, (case, outcome) in enumerate(rows, 1):
        line = outcome.line.replace(str(scratch_root), "<dir>").replace("|", "\\|")
        lines.append(f"| {i} | {case.what} | {outcome.code} | `{line}` |")
    return "\n".join(lines)
