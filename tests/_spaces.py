"""Helpers shared by the search-space tests (test_space.py, test_space_schema.py)."""

from __future__ import annotations

import textwrap

from geosearch.search import SearchSpace

MINIMAL = {"version": 1, "geometries": {"attn": ["stiefel", "dgram"], "mlp": ["stiefel", "dgram"]}}


def write(tmp_path, text, name="space.yaml"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def problems(excinfo):
    """{key path: ConfigError} of a SearchSpaceError."""
    return {p.key: p for p in excinfo.value.problems}


def space(**changes):
    return SearchSpace.from_dict({**MINIMAL, **changes}, source="inline")


def header(space):
    """The search header of ``space``: its summary with its study plan's lines, each line a
    key's whole (the header wraps them at 100 columns, checked here, indenting the rest)."""
    from geosearch.search.space.plan import plan_study

    text = space.summary(plan_study(space).header_lines())
    assert max(map(len, text.splitlines())) <= 100, text
    return text.replace("\n    ", " ")
