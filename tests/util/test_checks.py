"""The number checks: one function per concept, bools never numbers."""

from __future__ import annotations

import math
import subprocess
import sys
from fractions import Fraction

import numpy as np
import pytest

from geosearch.util.checks import (
    SEED,
    STEPS,
    Range,
    finite_or_none,
    is_int,
    is_number,
    is_positive,
    is_whole,
    parse_decimal,
    parse_number,
)


def test_a_bool_is_never_a_number():
    for check in (is_number, is_whole, is_int, is_positive):
        assert not check(True) and not check(False)
    for parse in (finite_or_none, parse_number, parse_decimal):
        assert parse(True) is None and parse(False) is None


@pytest.mark.parametrize("v, number, whole, int_", [
    (3, True, True, True), (3.0, True, False, False), (np.int64(3), True, True, False),
    (np.float32(0.5), True, False, False), (Fraction(1, 2), True, False, False),
    (math.nan, True, False, False), ("3", False, False, False), (None, False, False, False),
])
def test_real_whole_and_int_are_three_type_checks(v, number, whole, int_):
    # Rule: real = numbers.Real, whole = numbers.Integral (numpy's too), int = Python int only.
    assert (is_number(v), is_whole(v), is_int(v)) == (number, whole, int_)


def test_positive_and_finite_or_none():
    assert is_positive(0.1) and is_positive(np.int64(2))
    assert not any(is_positive(v) for v in (0, -1, math.inf, math.nan, "1"))
    assert finite_or_none(np.float32(0.5)) == 0.5 and finite_or_none(2) == 2.0
    assert finite_or_none(math.inf) is None and finite_or_none("1") is None and finite_or_none(None) is None


@pytest.mark.parametrize("v, number, decimal", [
    ("1e-4", 1e-4, 1e-4), (" .5 ", 0.5, 0.5), (2, 2.0, 2.0), ("1_000", 1000.0, None),
    (np.int64(3), 3.0, None), (Fraction(1, 4), 0.25, None), ("nan", None, None),
    ("inf", None, None), (math.inf, None, None), ("x", None, None), ([1], None, None),
])
def test_the_two_parsers_differ_only_where_documented(v, number, decimal):
    # Rule: parse_number reads what float() reads; parse_decimal only int/float and decimal literals.
    assert parse_number(v) == number and parse_decimal(v) == decimal


def test_the_module_imports_nothing_of_geosearch():
    # Rule: beyond what `import geosearch` itself loads, only geosearch.util.checks.
    code = ("import sys, geosearch; before = set(sys.modules); import geosearch.util.checks; "
            "print(sorted(m for m in set(sys.modules) - before if m.startswith('geosearch')))")
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert loaded.stdout.strip() == "['geosearch.util.checks']"


@pytest.mark.parametrize("allowed, value, out, problem", [
    (Range(0, 1), 0.5, 0.5, None),
    (Range(0, 1), "1e-1", 0.1, None),  # YAML 1.1 reads 1e-1 as a string
    (Range(0, 1), 1, 1.0, None),
    (Range(0, 1), math.nan, math.nan, "expected a number in [0, 1], got nan"),
    (Range(0, 1), "nan", "nan", "expected a number in [0, 1], got 'nan'"),
    (Range(0, 1), True, True, "expected a number in [0, 1], got True"),
    (Range(0, open_low=True), 0, 0, "expected a number > 0, got 0"),
    (Range(0, open_low=True), math.inf, math.inf, "expected a number > 0, got inf"),
    (Range(0, 1, open_low=True, open_high=True, null=True), None, None, None),
    (Range(0, 1, open_low=True, open_high=True, null=True), 1.0, 1.0, "expected a number in (0, 1) or null, got 1.0"),
    (STEPS, np.int64(7), 7, None),
    (STEPS, 7.0, 7.0, "expected a whole number in [1, 10,000,000], got 7.0"),
    (STEPS, 10**30, 10**30, "expected a whole number in [1, 10,000,000], got 1000000000000000000000000000000"),
    (STEPS, None, None, "expected a whole number in [1, 10,000,000], got None"),
    (SEED, -1, -1, "expected a whole number in [0, 2,147,483,647], got -1"),
    (Range(0, 1), "x" * 100, "x" * 100, "expected a number in [0, 1], got '" + "x" * 56 + "..."),
])
def test_a_range_refuses_nan_inf_bools_and_out_of_range_in_words(allowed, value, out, problem):
    got, why = allowed.check(value)
    # Rule: one rule for numbers: NaN, ±inf and bools are in no range; the message gives the
    # range in words and the value (cut to 60 characters); a valid value comes back normalised.
    assert why == problem
    assert (got is out or got == out or (math.isnan(got) and math.isnan(out))) and type(got) is type(out)


def test_a_whole_range_is_bounded_and_decimal_reading_is_the_callers_choice():
    with pytest.raises(ValueError, match="finite bounds"):
        Range(1, whole=True)
    # Rule: the settings catalog reads decimals strictly ("1_000" is no decimal literal).
    assert Range(0).check("1_000") == (1000.0, None)
    assert Range(0).check("1_000", read=parse_decimal)[1] == "expected a number >= 0, got '1_000'"


def test_shown_is_bounded_whatever_the_value():
    from geosearch.util.checks import shown

    shared: list = []
    for _ in range(80):  # 2**80 items in a full repr: must not hang
        shared = [shared, shared]
    assert shown(shared).startswith("[[[[") and len(shown(shared)) == 60
    itself: list = []
    itself.append(itself)
    assert shown(itself) == "[[...]]"  # as repr() says it
    assert shown(10**5000) == "a whole number of about 5,001 digits"  # repr() refuses it
    deep: list = []
    for _ in range(100_000):
        deep = [deep]
    assert shown(deep) == "[" * 21 + "..." + "]" * 21
    value = {"a": (1,), "b": set(), "c": {1}, "d": "x" * 10}
    assert shown(value, 100) == repr(value)  # what fits is repr's
    assert shown("y" * 1000, 12) == "'yyyyyyyy..."
