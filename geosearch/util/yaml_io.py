"""Reading YAML files users write: one loader, one kind of error.

:func:`load_yaml` reads a file with PyYAML's safe loader and turns everything that can
go wrong into a one-line :class:`~geosearch.util.errors.ConfigError` naming the file: missing,
a directory, unreadable, empty, or malformed (``"malformed YAML at line L, column C:
..."``). Documents with many aliases, or whose aliases expand to a large tree, are
refused before they are built: aliases let a few lines stand for an exponentially large
tree (a "billion laughs" file: 90 aliases make 10^9 values), which every later walk over
the data, or a message printing it, would pay for. A key given twice in one mapping is
refused, naming the key and both lines: PyYAML would keep the second silently (a second
``proxy:`` would reset every proxy key the first one set). Every YAML file the tool reads
(search spaces, assignments, train configs, a corpus's ``meta.yaml``) and every
``--set KEY=VALUE`` goes through this loader.

Example:
    >>> data = load_yaml("best_assignment.yaml", what="an assignment")  # doctest: +SKIP
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import yaml

from geosearch.util.errors import ConfigError
from geosearch.util.files import CONFIG_LIMIT, read_user_text

__all__ = ["MAX_ALIASES", "MAX_VALUES", "load_yaml", "parse_value", "parse_yaml"]

MAX_ALIASES = 100
"""The most aliases (``*name``) a document may use; our files need none."""
MAX_VALUES = 100_000
"""The most values (scalars, lists, mappings) a document may hold once its aliases are
expanded."""

_MAX_PROBLEM = 200  # characters of PyYAML's own problem text kept in a message
_RAISE = object()


class _Refused(yaml.MarkedYAMLError):
    """A document the loader refuses although PyYAML would read it: too many aliases, or a
    key given twice."""


class _Loader(yaml.SafeLoader):
    """The safe loader, counting aliases as the document is composed."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._aliases = 0
        self._sizes: dict[int, int] = {}  # id(node) -> values in it, aliases expanded

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            self._aliases += 1
            if self._aliases > MAX_ALIASES:
                mark = self.peek_event().start_mark
                raise _Refused(problem=f"more than {MAX_ALIASES} aliases; write the values out",
                                  problem_mark=mark)
        node = super().compose_node(parent, index)
        if id(node) not in self._sizes:  # an alias returns its anchor's node, sized already
            children = node.value if isinstance(node, yaml.SequenceNode) else \
                [n for pair in node.value for n in pair] if isinstance(node, yaml.MappingNode) else []
            self._sizes[id(node)] = 1 + sum(self._sizes.get(id(c), 1) for c in children)
        if parent is None and self._sizes[id(node)] > MAX_VALUES:  # the whole document
            raise _Refused(problem=f"its aliases expand to more than {MAX_VALUES} values; write "
                                   "the values out", problem_mark=node.start_mark)
        return node

    def construct_mapping(self, node: Any, deep: bool = False) -> Any:
        """The mapping, once no key of it is given twice (merge keys ``<<`` may repeat keys:
        that is what they are for)."""
        if isinstance(node, yaml.MappingNode):
            first: dict[Any, Any] = {}  # key -> the node where it was first given
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    seen = first.get(key)
                except TypeError:  # an unhashable key: PyYAML's own error says so below
                    continue
                if seen is None:
                    first[key] = key_node
                else:
                    line, again = seen.start_mark.line + 1, key_node.start_mark.line + 1
                    where = f"lines {line} and {again}" if line != again else f"both on line {line}"
                    raise _Refused(problem=f"key {_short(key)} is given twice ({where}); give it once "
                                           "(the second would replace the first)",
                                   problem_mark=key_node.start_mark)
        return super().construct_mapping(node, deep=deep)


def _short(key: Any) -> str:
    """A key as a message shows it: its repr, at most 60 characters."""
    text = repr(key)
    return text if len(text) <= 60 else text[:57] + "..."


def parse_yaml(text: str, *, source: str | None = None) -> Any:
    """The data of one YAML document, safely loaded.

    Args:
        text: the YAML text.
        source: what to name in the message (a file name, ``"--assign"``...).

    Raises:
        ConfigError: ``"<source>: malformed YAML at line L, column C: <problem>"``, one line.
    """
    try:
        return yaml.load(text, Loader=_Loader)  # safe: _Loader is a SafeLoader
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = " ".join(str(getattr(e, "problem", None) or e).split())
        if len(problem) > _MAX_PROBLEM:
            problem = problem[:_MAX_PROBLEM] + "..."
        raise ConfigError(f"malformed YAML{where}: {problem}", source=source) from None


def parse_value(text: str, *, source: str | None = None) -> Any:
    """A command-line value (``--set KEY=VALUE``) read as YAML: numbers, booleans, null,
    lists, mappings; text that is not valid YAML stays the text itself; empty is ``None``.

    Raises:
        ConfigError: the value uses too many aliases, its aliases expand to too much, or a
            mapping in it gives a key twice (one line naming ``source``), as in
            :func:`parse_yaml`.
    """
    if not text.strip():
        return None
    try:
        return yaml.load(text, Loader=_Loader)  # safe: _Loader is a SafeLoader
    except _Refused:
        return parse_yaml(text, source=source)  # raises the one-line message
    except yaml.YAMLError:
        return text


def load_yaml(path: str | os.PathLike, *, what: str = "a YAML mapping", default: Any = _RAISE,
              limit: int = CONFIG_LIMIT) -> Any:
    """Read and parse the YAML file at ``path`` (:func:`geosearch.util.files.read_user_text`).

    Args:
        path: the file.
        what: what the file should hold, for the message about an empty file
            (``"empty file; expected <what>"``).
        default: returned for an empty file (no document) instead of raising.
        limit: the most bytes it may hold (1 MiB).

    Returns:
        The parsed data (dicts, lists, scalars).

    Raises:
        ConfigError: naming the file: not found, a directory, a pipe or a device, larger
            than ``limit``, unreadable (permissions, not UTF-8), malformed (line and column),
            too many aliases, or empty without a ``default``.
    """
    source = os.fspath(path)
    text = read_user_text(path, what="a YAML file", limit=limit, missing="file not found")
    data = parse_yaml(text, source=source)
    if data is None:
        if default is _RAISE:
            raise ConfigError(f"empty file; expected {what}", source=source)
        return default
    return data


def plain(x: Any) -> Any:
    """A copy ``yaml.safe_dump`` can write: mappings (keys as strings), lists, numbers,
    booleans, None and strings; tuples become lists, paths and anything else strings."""
    if isinstance(x, Mapping):
        return {str(k): plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [plain(v) for v in x]
    if x is None or isinstance(x, (bool, int, float)):
        return x
    if isinstance(x, os.PathLike):
        return os.fspath(x)
    return str(x)  # str subclasses too (torch.__version__ is a TorchVersion)

