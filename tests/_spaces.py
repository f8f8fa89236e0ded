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
    """The search header of ``space``: its summary with its study plan's lines."""
    from geosearch.search.space.plan import plan_study

    return space.summary(plan_study(space).header_lines())
