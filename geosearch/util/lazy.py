"""Packages that import their modules on first use: ``geosearch``, ``geosearch.optim``,
``geosearch.proxy``. Importing the package stays cheap (no torch until a name needs it) and
its ``__all__`` still lists the public names."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_getattr(package: str, exports: Mapping[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` that imports ``exports[name]`` (a module path) on first use.

    Example::

        _EXPORTS = {"ManifoldMuon": "geosearch.optim.muon"}
        __getattr__ = lazy_getattr(__name__, _EXPORTS)
    """

    def __getattr__(name: str) -> Any:
        if name in exports:
            return getattr(importlib.import_module(exports[name]), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return __getattr__
