"""Number checks, one function per concept, for values read from YAML, JSON, flags or attrs.

A bool is an ``int`` to Python (``isinstance(True, int)``), never a number to a config, so
every check here rejects ``True`` and ``False``. Two families of types:

- *real* / *whole*: :class:`numbers.Real` / :class:`numbers.Integral` (int, float, numpy
  scalars, ``Fraction``), for values computed or stored by the package (attrs, probes);
- *int*: a Python ``int`` only, for fields typed ``int`` (a config's sizes and counts).

Strings count as numbers only in the two parsers: YAML 1.1 reads ``1e-4`` (no dot) as a
string. Imports nothing of geosearch, and nothing heavier than :mod:`numbers`.

:class:`Range` is the one rule for a number a user sets (a field of ``TrainConfig``, an
optimizer setting, a key of a search space): NaN, ±inf and bools are never in a range, and
a value out of it is refused with the range in words ("expected a number in [0, 1], got
nan"). Every whole count has an upper bound, so that a typo (``steps: 1e30`` written as an
integer) is refused instead of promising a run that never ends; :data:`STEPS` and
:data:`SEED` are the bounds several sections share.

Example:
    >>> is_number(0.5), is_number(True), is_whole(3), is_whole(3.0), is_int(True)
    (True, False, True, False, False)
    >>> finite_or_none(float("inf")), parse_number("1e-4"), parse_decimal("1_000")
    (None, 0.0001, None)
    >>> Range(0, 1).check(float("nan"))
    (nan, 'expected a number in [0, 1], got nan')
    >>> STEPS.check(10**30)[1]
    'expected a whole number in [1, 10,000,000], got 1000000000000000000000000000000'
"""

from __future__ import annotations

import math
import numbers
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["MAX_STEPS", "SEED", "STEPS", "Range", "finite_or_none", "is_int", "is_number", "is_positive",
           "is_whole", "parse_decimal", "parse_number", "shown"]


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


# --------------------------------------------------------------------------- ranges
@dataclass(frozen=True)
class Range:
    """The values a number a user sets may take: from ``low`` to ``high``, each end included
    unless ``open_low`` / ``open_high``; whole numbers only when ``whole``; ``None`` too when
    ``null``. NaN, ±inf and bools are in no range.

    Attributes:
        low: the smallest value (``-inf``: no lower bound).
        high: the largest value (``inf``: no upper bound; a whole number always has one).
        whole: a whole number (:func:`is_whole`; a float such as ``3.0`` is not one).
        open_low: ``low`` itself is out (``> 0`` rather than ``>= 0``).
        open_high: ``high`` itself is out.
        null: ``None`` is allowed (the key's "off" or "default").

    Example:
        >>> Range(0, open_low=True).text, Range(1, 100, whole=True, null=True).text
        ('a number > 0', 'a whole number in [1, 100] or null')
    """

    low: float = -math.inf
    high: float = math.inf
    whole: bool = False
    open_low: bool = False
    open_high: bool = False
    null: bool = False

    def __post_init__(self) -> None:
        if self.whole and not (math.isfinite(self.low) and math.isfinite(self.high)):
            raise ValueError(f"a whole-number range needs finite bounds, got [{self.low}, {self.high}]")

    def contains(self, x: float) -> bool:
        """Whether the (already finite) number ``x`` is in the range."""
        above = x > self.low if self.open_low else x >= self.low
        below = x < self.high if self.open_high else x <= self.high
        return above and below

    def check(self, value: Any, *, read: Callable[[Any], float | None] | None = None) -> tuple[Any, str | None]:
        """``(value normalised, None)`` when ``value`` is in the range (a whole number as an
        ``int``, any other as a ``float``), else ``(value, "expected <text>, got <value>")``.

        Args:
            value: the value as given (YAML, a flag, a keyword).
            read: how a number that is not whole is read (default :func:`parse_number`, which
                takes numeric strings too: YAML 1.1 reads ``1e-4`` as one); the optimizer
                settings pass :func:`parse_decimal`.
        """
        if value is None and self.null:
            return None, None
        if self.whole:
            x: float | None = int(value) if is_whole(value) else None
        else:
            x = (read or parse_number)(value)
        if x is None or not self.contains(x):
            return value, f"expected {self.text}, got {shown(value)}"
        return x, None

    @property
    def text(self) -> str:
        """The range in words: ``a whole number in [1, 10,000,000]``, ``a number > 0``, ``a
        number in [0, 1)``, with ``or null`` when ``None`` is allowed."""
        kind = "a whole number" if self.whole else "a number"
        if math.isinf(self.high) and math.isinf(self.low):
            words = kind
        elif math.isinf(self.high):
            words = f"{kind} {'>' if self.open_low else '>='} {_num(self.low)}"
        elif math.isinf(self.low):
            words = f"{kind} {'<' if self.open_high else '<='} {_num(self.high)}"
        else:
            words = (f"{kind} in {'(' if self.open_low else '['}{_num(self.low)}, {_num(self.high)}"
                     f"{')' if self.open_high else ']'}")
        return words + (" or null" if self.null else "")


def _num(x: float) -> str:
    """A bound in words: whole numbers with thousands separators, others as ``%g``."""
    return f"{int(x):,}" if float(x).is_integer() else f"{x:g}"


def shown(value: Any, limit: int = 60) -> str:
    """``repr(value)`` for a message, cut to ``limit`` characters, in time and memory bounded by
    ``limit`` whatever the value: a container is walked to :data:`_SHOWN_DEPTH` levels and
    stops once ``limit`` characters are out (a pickle of 500 bytes can hold a list that
    contains itself 80 levels deep, whose full repr has 2**80 items), a string or bytes is
    cut before its repr, and a whole number too long for ``repr`` (over 4,300 digits) is
    named by its length.

    Example:
        >>> shown(["uint16"]), shown(10**5000), shown("a" * 100, 12)
        ("['uint16']", 'a whole number of about 5,001 digits', "'aaaaaaaa...")
    """
    parts: list[str] = []
    room = [limit + 1]  # characters still wanted: one more than fits says "cut"

    def out(text: str) -> None:
        parts.append(text[: room[0]])
        room[0] -= len(parts[-1])
        if room[0] <= 0:
            raise _Full

    def walk(v: Any, depth: int, path: set[int]) -> None:
        brackets = _BRACKETS.get(type(v))
        if brackets is None:
            out(_scalar(v, room[0]))
            return
        if id(v) in path or depth >= _SHOWN_DEPTH:
            out(brackets[0] + "..." + brackets[1])
            return
        out(brackets[0] if v or not isinstance(v, (set, frozenset)) else f"{type(v).__name__}(")
        items = v.items() if isinstance(v, dict) else v
        for i, item in enumerate(items):
            if i:
                out(", ")
            if isinstance(v, dict):
                walk(item[0], depth + 1, path | {id(v)})
                out(": ")
                item = item[1]
            walk(item, depth + 1, path | {id(v)})
        out("," + brackets[1] if isinstance(v, tuple) and len(v) == 1 else
            brackets[1] if v or not isinstance(v, (set, frozenset)) else ")")

    try:
        walk(value, 0, set())
    except _Full:
        pass
    text = "".join(parts)
    return text if len(text) <= limit else text[: max(limit - 3, 0)] + "..."


class _Full(Exception):
    """:func:`shown` has its ``limit``: stop walking."""


_SHOWN_DEPTH = 20
"""The levels of a container :func:`shown` walks into; deeper ones show as ``[...]``."""
_BRACKETS = {list: "[]", tuple: "()", dict: "{}", set: "{}", frozenset: "{}"}


def _scalar(v: Any, room: int) -> str:
    """The repr of a value :func:`shown` does not walk into, at most about ``room`` characters."""
    if isinstance(v, int) and not isinstance(v, bool) and v.bit_length() > 10_000:
        return f"a whole number of about {int(v.bit_length() * 0.30103) + 1:,} digits"
    if isinstance(v, (str, bytes)) and len(v) > room:
        v = v[:room]
    try:
        return repr(v)
    except Exception:  # noqa: BLE001 - a value whose repr fails is named by its type
        return f"a {type(v).__name__}"


MAX_STEPS = 10_000_000
"""The most optimizer steps of one run geosearch trains (a proxy run, a rung, the stability
rung), and of a step count of such a run (warmup, eval and probe intervals)."""
STEPS = Range(1, MAX_STEPS, whole=True)
"""A step count of a run geosearch trains."""
SEED = Range(0, 2**31 - 1, whole=True)
"""A seed: numpy and Accelerate take 0 to 2³² − 1; half that leaves room for the seeds a
study adds to it (one per repeat, one per worker)."""
