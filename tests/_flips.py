"""One byte changed inside a value a run directory stores: in ``study.db``, ``journal.log``
or a trial's record ``trials/<n>/trial.json``.

:func:`flip` picks, with a seeded generator, a completed trial and one of the numbers it
stores (an entry of ``val_losses``, another float user attr, or, in a storage, the trial's
value), finds the bytes that hold it in the file (its JSON text: one digit of its fraction,
so the file stays valid JSON; in SQLite, a value's 8-byte double: one of its bytes), changes
that one byte, and checks that the file now reads as a different number (a copy left in a
page SQLite no longer uses changes nothing: the next place is tried). The run directory's
integrity checks must then refuse the study, and ``geosearch recover`` repair it.
"""

from __future__ import annotations

import json
import math
import random
import shutil
import struct
import tempfile
from dataclasses import dataclass
from pathlib import Path

import optuna

FILES = ("study.db", "journal.log", "trial.json")
"""Where a byte can be flipped: a storage, or a trial's record."""


@dataclass
class Flip:
    """One changed byte."""

    file: Path
    trial: int
    what: str
    """``user attr 'val_losses'``, ``value``."""
    offset: int
    old: bytes
    new: bytes

    def undo(self) -> None:
        with open(self.file, "r+b") as f:
            f.seek(self.offset)
            f.write(self.old)


def _stored(run_dir: Path, file: str) -> dict[int, tuple[float | None, dict]]:
    """``{number: (value, user attrs)}`` of the completed trials, read from a copy of the
    storage ``file`` (reading never touches the original), or from the trials' records."""
    if file == "trial.json":
        out = {}
        for path in sorted((run_dir / "trials").glob("*/trial.json")):
            data = json.loads(path.read_text(encoding="utf-8"))
            if data.get("state") == "COMPLETE":
                out[data["number"]] = (data["value"], data["user_attrs"])
        return out
    with tempfile.TemporaryDirectory(prefix="flip-") as tmp:
        copy = Path(tmp) / file
        shutil.copyfile(run_dir / file, copy)
        storage = (
            optuna.storages.RDBStorage(f"sqlite:///{copy}")
            if file == "study.db"
            else optuna.storages.JournalStorage(
                optuna.storages.journal.JournalFileBackend(str(copy))
            )
        )
        try:
            name = optuna.get_all_study_names(storage)[0]
            trials = optuna.load_study(study_name=name, storage=storage).get_trials()
        finally:
            if hasattr(storage, "remove_session"):
                storage.remove_session()
        return {
            t.number: (t.value, dict(t.user_attrs))
            for t in trials
            if t.state == optuna.trial.TrialState.COMPLETE
        }


def _text(stored: dict) -> str:
    return json.dumps(stored, sort_keys=True)


def _numbers(value: float | None, attrs: dict, with_value: bool) -> list[tuple[str, float, list]]:
    """``(what, number, the attr's whole value)`` of each float a trial stores."""
    out = [("value", value, [value])] if with_value and isinstance(value, float) else []
    for key, v in sorted(attrs.items()):
        items = v if isinstance(v, list) else [v]
        for x in items:
            if isinstance(x, float) and math.isfinite(x) and "." in repr(x) and "e" not in repr(x):
                out.append((f"user attr {key!r}", x, v))
    return out


def _places(
    data: bytes, what: str, number: float, whole: object, file: str
) -> list[tuple[int, int]]:
    """``(offset, how many bytes may change from there)`` of each place that may hold ``number``:
    a digit of its fraction in the text of its attr (after the attr's name), or in SQLite a
    byte of the trial value's double."""
    if file == "study.db" and what == "value":
        needle = struct.pack(">d", number)
        return [(i, len(needle)) for i in _find_all(data, needle)]
    text = repr(number).encode()
    point = text.index(b".") + 1  # the digits after the point: valid JSON whatever they become
    keys = (
        [(what.split("'")[1], whole)]
        if what != "value"
        else [("value", number), ("values", [number])]
    )
    out = []
    for key, value in keys:
        for start, context in _after_key(data, key, value):
            for i in _find_all(context, text):
                out.append((start + i + point, len(text) - point))
    return out


def _after_key(data: bytes, key: str, value: object) -> list[tuple[int, bytes]]:
    """Each place where ``key``'s name is followed (within 4 bytes: ``": "``) by the JSON
    text of ``value`` (with or without spaces)."""
    texts = {json.dumps(value).encode(), json.dumps(value, separators=(",", ":")).encode()}
    out = []
    for k in _find_all(data, key.encode()):
        end = k + len(key)
        for skip in range(4):
            out += [(end + skip, t) for t in texts if data.startswith(t, end + skip)]
    return out


def _find_all(data: bytes, needle: bytes) -> list[int]:
    out, i = [], data.find(needle)
    while i >= 0:
        out.append(i)
        i = data.find(needle, i + 1)
    return out


def flip(run_dir: Path, file: str, rng: random.Random, only_val_losses: bool = False) -> Flip:
    """Change one byte of a number a completed trial stores in ``file`` (one of :data:`FILES`;
    ``trial.json``: the trial's record); the change is checked to be read.

    Args:
        run_dir: the run directory.
        file: where.
        rng: picks the trial, the number and the byte.
        only_val_losses: change an entry of ``val_losses`` (else any float attr, or the value).

    Raises:
        AssertionError: no place found whose change is read.
    """
    before = _stored(run_dir, file)
    numbers = [
        (n, *x)
        for n, (value, attrs) in sorted(before.items())
        for x in _numbers(value, attrs, with_value=file != "trial.json")
    ]
    if only_val_losses:
        numbers = [x for x in numbers if x[1] == "user attr 'val_losses'"]
    rng.shuffle(numbers)
    for n, what, number, whole in numbers:
        path = (
            run_dir / "trials" / str(n) / "trial.json" if file == "trial.json" else run_dir / file
        )
        data = path.read_bytes()
        places = _places(data, what, number, whole, file)
        rng.shuffle(places)
        for offset, span in places:
            at = offset + rng.randrange(span)
            old = data[at : at + 1]
            new = (
                bytes([ord("0") + (old[0] - ord("0") + rng.randrange(1, 10)) % 10])
                if old.isdigit()
                else bytes([old[0] ^ (1 << rng.randrange(8))])
            )
            with open(path, "r+b") as f:
                f.seek(at)
                f.write(new)
            after = _stored(run_dir, file)
            # the trial whose number changed: the same value (a constant every trial stores,
            # such as the target's logit scale) sits in other trials' rows too
            hit = [m for m in before if _text(after.get(m)) != _text(before[m])]
            result = Flip(path, hit[0] if len(hit) == 1 else n, what, at, old, new)
            if _text(after) != _text(before):
                return result
            result.undo()  # a stale copy (a page SQLite does not use): try the next place
    raise AssertionError(f"no stored number of {file} in {run_dir} could be changed by one byte")
