"""Number checks, one function per concept, for values read from YAML, JSON, flags or attrs.

A bool is an ``int`` to Python (``isinstance(True, int)``), never a number to a config, so
every check here rejects ``True`` and ``False``. Two families of types:

- *real* / *whole*: :class:`numbers.Real` / :class:`numbers.Integral` (int, float, numpy
  scalars, ``Fraction``), for values computed or stored by the package (attrs, probes);
- *int*: a Python ``int`` only, for fields typed ``int`` (a config's sizes and counts).

Strings count as numbers only in the two parsers: YAML 1.1 reads ``1e-4`` (no dot) as a
string. Imports nothing of geosearch, and nothing heavier than :mod:`numbers`.

Example:
    >>> is_number(0.5), is_number(True), is_whole(3), is_whole(3.0), is_int(True)
    (True, False, True, False, False)
    >>> finite_or_none(float("inf")), parse_number("1e-4"), parse_decimal("1_000")
    (None, 0.0001, None)
"""

from __future__ import annotations

import math
import numbers
import re

__all__ = ["finite_or_none", "is_int", "is_number", "is_positive", "is_whole", "parse_decimal", "parse_number"]


def is_number(v: object) -> bool:
    """Whether ``v`` is a real number (:class:`numbers.Real`, not a bool); NaN and ±inf are."""
    return isinstance(v, numbers.Real) and not isinstance(v, bool)


def is_whole(v: object) -> bool:
    """Whether ``v`` is a whole number (:class:`numbers.Integral`, numpy's too; not a bool)."""
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


def is_int(v: object) -> bool:
    """Whether ``v`` is a Python ``int`` (not a bool, not a numpy integer)."""
    return isinstance(v, int) and not isinstance(v, bool)


def is_positive(v: object) -> bool:
    """Whether ``v`` is a finite real number > 0 (not a bool)."""
    return is_number(v) and math.isfinite(v) and v > 0  # type: ignore[arg-type, operator]


def finite_or_none(v: object) -> float | None:
    """``v`` as a float when it is a finite real number (not a bool), else ``None``."""
    return float(v) if is_number(v) and math.isfinite(v) else None  # type: ignore[arg-type]


def parse_number(v: object) -> float | None:
    """A finite float from a real number or from a string ``float()`` reads (``"1e-4"``,
    ``" 2 "``, ``"1_000"``); ``None`` for anything else, a bool, NaN or ±inf."""
    if isinstance(v, bool) or not isinstance(v, (numbers.Real, str)):
        return None
    try:
        x = float(v)
    except ValueError:
        return None
    return x if math.isfinite(x) else None


_DECIMAL = re.compile(r"^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?$")


def parse_decimal(v: object) -> float | None:
    """A finite float from an ``int`` or a ``float`` (not a bool), or from a decimal literal
    string (``"6e-4"``, ``" .5 "``: digits, an optional point and exponent); ``None`` for
    anything else: ``"1_000"``, ``"nan"``, ``Fraction``, numpy integers. Stricter than
    :func:`parse_number`; the optimizer settings' catalog reads its numbers with it."""
    if isinstance(v, bool):
        return None
    if isinstance(v, str) and _DECIMAL.match(v.strip()):
        v = float(v)
    if isinstance(v, (int, float)) and math.isfinite(v):
        return float(v)
    return None
