"""The meta file of a token directory (nanoGPT's layout): ``meta.json``, ``meta.yaml`` or
``meta.pkl``, read as a user's file and checked.

``meta.json`` / ``meta.yaml`` are read as a config (:func:`geosearch.util.files.read_user_text`:
a regular file, 1 MiB at most, UTF-8); nanoGPT's ``meta.pkl`` is unpickled as plain data
only (:class:`_PlainUnpickler`: a pickle that names any class or function is refused before
anything in it runs). :data:`META_FIELDS` are checked; other keys are ignored. Torch-free.
"""

from __future__ import annotations

import io
import json
import pickle
from pathlib import Path
from typing import Any

from geosearch.util.checks import is_int, shown
from geosearch.util.errors import ConfigError
from geosearch.util.files import CONFIG_LIMIT, read_user_bytes, read_user_text
from geosearch.util.yaml_io import parse_yaml

__all__ = ["META_FIELDS", "META_FILES", "TOKEN_DTYPE_NAMES", "described", "read_meta", "type_word"]

META_FILES = ("meta.json", "meta.yaml", "meta.yml", "meta.pkl")
"""The meta files of a token directory, in the order they are looked for: the first found is read."""
TOKEN_DTYPE_NAMES = ("uint16", "uint32")
"""The ``dtype`` values of a meta file: how ``train.bin`` / ``val.bin`` are read (default uint16)."""


def read_meta(p: Path) -> tuple[dict, Path | None]:
    """The first of :data:`META_FILES` in ``p`` and its path, or ``({}, None)`` when there is
    none. ``meta.json`` / ``meta.yaml`` are read as a user's config
    (:func:`geosearch.util.files.read_user_text`: a regular file, 1 MiB at most, UTF-8),
    ``meta.pkl`` as plain data (:func:`_read_pickle`, the same size limit), and the fields
    checked (:data:`META_FIELDS`).

    Raises:
        ConfigError: naming the file (and the key): not a regular file, too large, not UTF-8,
            malformed, a pickle that names a class or function, not a mapping, or a field of
            the wrong type or value.
    """
    for name in META_FILES:
        meta_path = p / name
        if not (meta_path.exists() or meta_path.is_symlink()):
            continue
        source = str(meta_path)
        if name == "meta.pkl":
            meta = _read_pickle(meta_path)
        else:
            text = read_user_text(meta_path, what='a mapping such as {"vocab_size": 50257, "dtype": "uint16"}',
                                  limit=CONFIG_LIMIT)
            if name == "meta.json":
                try:
                    meta = json.loads(text)
                except ValueError as e:
                    where = f" at line {e.lineno}, column {e.colno}" if isinstance(e, json.JSONDecodeError) else ""
                    raise ConfigError(f"malformed JSON{where}: {getattr(e, 'msg', e)}", source=source) from None
            else:
                meta = parse_yaml(text, source=source)
        if not isinstance(meta, dict):
            raise ConfigError(f"expected a mapping with a 'vocab_size' key, got {type_word(meta)}",
                              source=source)
        _check_meta(meta, source)
        return meta, meta_path
    return {}, None


class _NotPlainData(pickle.UnpicklingError):
    """A pickle asked for a class or function (or a persistent object): what it names."""


class _PlainUnpickler(pickle.Unpickler):
    """Unpickles plain data only: dicts, lists, tuples, sets, strings, bytes, numbers,
    booleans and None, which the pickle opcodes build themselves. Every other object needs a
    class or function looked up by name (``find_class``: the ``GLOBAL`` / ``STACK_GLOBAL`` /
    ``INST`` opcodes and the extension registry), and that lookup is refused, so nothing a
    pickle names is ever imported or called."""

    def find_class(self, module: str, name: str) -> Any:
        raise _NotPlainData(f"{module}.{name}")

    def persistent_load(self, pid: Any) -> Any:
        raise _NotPlainData("a persistent object")


def _read_pickle(path: Path) -> Any:
    """nanoGPT's ``meta.pkl`` as plain data (:class:`_PlainUnpickler`), read as a user's file
    of at most :data:`CONFIG_LIMIT` bytes.

    Raises:
        ConfigError: naming the file: not a regular file, too large, a pickle that names a
            class or function (never imported or run), or not a pickle.
    """
    data = read_user_bytes(path, what="nanoGPT's meta.pkl, a pickled dict such as {'vocab_size': 65}",
                           limit=CONFIG_LIMIT)
    try:
        return _PlainUnpickler(io.BytesIO(data)).load()
    except _NotPlainData as e:
        raise ConfigError(f"names {shown(str(e))}: only plain data (dicts, lists, strings, numbers) is read "
                          "from a pickle, no class or function, and nothing in it was run; write meta.json "
                          '{"vocab_size": N} instead', source=str(path)) from None
    except Exception as e:  # noqa: BLE001 - a damaged pickle fails in many ways
        raise ConfigError(f"cannot read it as a pickle ({type(e).__name__}: {shown(str(e))}); expected "
                          "nanoGPT's meta.pkl, a pickled dict such as {'vocab_size': 65}",
                          source=str(path)) from None


META_FIELDS = {"vocab_size": "a whole number >= 1", "dtype": "uint16 or uint32"}
"""The fields of a meta file geosearch reads, and what each must be (others are ignored)."""


def _check_meta(meta: dict, source: str) -> None:
    """Raise a ConfigError naming ``source`` and the key for a field of :data:`META_FIELDS`
    of the wrong type or value."""
    if "dtype" in meta:
        dtype = meta["dtype"]
        if not isinstance(dtype, str) or dtype not in TOKEN_DTYPE_NAMES:
            what = f"unknown token dtype {shown(dtype)}" if isinstance(dtype, str) else \
                f"got {described(dtype)}, not the name of a token dtype"
            raise ConfigError(f"{what} for train.bin and val.bin", source=source, key="dtype",
                              allowed=list(TOKEN_DTYPE_NAMES))
    if "vocab_size" in meta:
        v = meta["vocab_size"]
        if not is_int(v) or v < 1:
            raise ConfigError(f"expected {META_FIELDS['vocab_size']}, got {described(v)}",
                              source=source, key="vocab_size")


def type_word(v: object) -> str:
    """``"a list"``, ``"a string"``, ``"null"``... for a message."""
    words = {type(None): "null", bool: "a boolean", str: "a string", int: "a whole number",
             float: "a number", list: "a list", dict: "a mapping"}
    return words.get(type(v), f"a {type(v).__name__}")


def described(v: object) -> str:
    """``"['uint16'] (a list)"``: a value and its type, for a message."""
    return f"{shown(v)} ({type_word(v)})"
