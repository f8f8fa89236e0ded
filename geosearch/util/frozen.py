"""Read-only plain data: a mapping that cannot be changed, and the way back to plain data.

Frozen dataclasses (:class:`~geosearch.assignment.Assignment`, the rows of
:class:`~geosearch.plan.Plan`) hold their mappings as :class:`FrozenMap` and their lists
as tuples (:func:`freeze`), so a value checked at construction stays checked;
:func:`thaw` turns them back into the dicts and lists that YAML and JSON write. Unlike
``types.MappingProxyType``, a :class:`FrozenMap` can be pickled and deep-copied.

Example:
    >>> m = freeze({"lr": 0.01, "betas": [0.9, 0.95]})
    >>> m["betas"], m == {"lr": 0.01, "betas": (0.9, 0.95)}
    ((0.9, 0.95), True)
    >>> thaw(m)
    {'lr': 0.01, 'betas': [0.9, 0.95]}
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

__all__ = ["FrozenMap", "freeze", "thaw"]


class FrozenMap(Mapping):
    """An immutable mapping that compares equal to a dict with the same items."""

    __slots__ = ("_data",)

    def __init__(self, data: Mapping[Any, Any] | None = None) -> None:
        object.__setattr__(self, "_data", dict(data or {}))

    def __getitem__(self, key: Any) -> Any:
        return self._data[key]

    def __iter__(self) -> Iterator[Any]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"{type(self).__name__} is read-only")

    def __repr__(self) -> str:
        return repr(self._data)

    def __reduce__(self) -> tuple:
        return (FrozenMap, (self._data,))


def freeze(value: Any) -> Any:
    """``value`` with every mapping made a :class:`FrozenMap` and every list a tuple."""
    if isinstance(value, Mapping):
        return FrozenMap({k: freeze(v) for k, v in value.items()})
    if isinstance(value, (list, tuple)):
        return tuple(freeze(v) for v in value)
    return value


def thaw(value: Any) -> Any:
    """The plain-data form of :func:`freeze`'s output: dicts and lists."""
    if isinstance(value, Mapping):
        return {k: thaw(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [thaw(v) for v in value]
    return value
