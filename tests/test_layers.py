"""The layers of ``docs/design.md`` ("Layers"), read off the package's own imports.

Every ``import`` of a geosearch module (at the top of a module or inside a function; type-only
imports under ``if TYPE_CHECKING:`` excepted) must point at a layer below its own, or at its
own layer. A new upward import fails here, naming the file, the line and both layers. No two
modules may import each other, directly or round a longer loop, even within one layer and
even for types only: a cycle fails here, naming its modules.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import geosearch

PACKAGE = Path(geosearch.__file__).parent

LAYERS: tuple[tuple[str, ...], ...] = (
    # lowest first; a module belongs to the longest prefix listed
    ("geosearch.util",),
    ("geosearch.manifolds",),
    ("geosearch.rules",),
    ("geosearch.models",),
    ("geosearch.optim",),
    ("geosearch.assignment",),
    ("geosearch.plan",),
    ("geosearch.build",),
    ("geosearch.proxy",),
    ("geosearch.search.records",),
    ("geosearch.search.runtime",),
    ("geosearch.search.stats",),
    ("geosearch.search.horizon",),
    ("geosearch.search.space",),
    ("geosearch.search.study",),
    ("geosearch.report",),
    ("geosearch.inspect",),
    ("geosearch.cli", "geosearch.__main__"),
)
"""The layers, lowest first. Packages whose ``__init__`` only lists names (``geosearch``,
``geosearch.search``) import their modules lazily, by name, and belong to no layer."""

SCIENCE = ("geosearch.search.stats", "geosearch.search.horizon")
"""The answer's science: beside each other above the runtime, importing none of it."""


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _layer(name: str) -> int | None:
    best, rank = -1, None
    for i, prefixes in enumerate(LAYERS):
        for p in prefixes:
            if (name == p or name.startswith(p + ".")) and len(p) > best:
                best, rank = len(p), i
    return rank


def _type_only(tree: ast.Module) -> set[int]:
    """Line numbers of imports under ``if TYPE_CHECKING:``."""
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for sub in node.body:
                for n in ast.walk(sub):
                    if isinstance(n, (ast.Import, ast.ImportFrom)):
                        lines.add(n.lineno)
    return lines


def _imports(path: Path, types: bool = False) -> list[tuple[int, str]]:
    """(line, imported geosearch module) of every runtime import in ``path`` (with ``types``,
    of the type-only ones too). ``from geosearch.x import y`` names ``geosearch.x.y`` when
    that is a module."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skip = set() if types else _type_only(tree)
    found = []
    for node in ast.walk(tree):
        if getattr(node, "lineno", None) in skip:
            continue
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if a.name.startswith("geosearch.")]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module == "geosearch":
                found += [(node.lineno, f"geosearch.{a.name}") for a in node.names
                          if (PACKAGE / a.name).with_suffix(".py").exists() or (PACKAGE / a.name).is_dir()]
            elif node.module.startswith("geosearch."):
                base = PACKAGE.parent.joinpath(*node.module.split("."))
                subs = [f"{node.module}.{a.name}" for a in node.names
                        if base.joinpath(a.name).with_suffix(".py").exists()]
                found += [(node.lineno, m) for m in subs] or [(node.lineno, node.module)]
    return found


def _edges(types: bool = False) -> list[tuple[str, int, str]]:
    """(importing module, line, imported module) for every module of the package."""
    return [(_module_name(p), line, target)
            for p in sorted(PACKAGE.rglob("*.py")) for line, target in _imports(p, types)]


def cycles(edges: list[tuple[str, int, str]]) -> list[list[str]]:
    """The import cycles among ``edges``: each group of modules that reach one another
    (a strongly connected component of more than one module, or a module importing
    itself), sorted. A package's ``__init__`` that only lists names imports nothing."""
    graph: dict[str, set[str]] = {}
    for source, _, target in edges:
        graph.setdefault(source, set()).add(target)
        graph.setdefault(target, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's algorithm
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                group.append(w)
                if w == v:
                    break
            if len(group) > 1 or v in graph[v]:
                found.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def back_edges(edges: list[tuple[str, int, str]]) -> list[str]:
    """The imports that point up the layers, one line each."""
    bad = []
    for source, line, target in edges:
        a, b = _layer(source), _layer(target)
        if a is not None and b is not None and b > a:
            bad.append(f"{source}:{line} imports {target} ({LAYERS[b][0]} is above {LAYERS[a][0]})")
    return bad


def test_every_module_has_a_layer():
    lazy = {"geosearch", "geosearch.search"}
    missing = sorted({_module_name(p) for p in PACKAGE.rglob("*.py")} - lazy
                     - {m for m in (_module_name(p) for p in PACKAGE.rglob("*.py")) if _layer(m) is not None})
    assert missing == [], f"modules in no layer of LAYERS (add them, and to docs/design.md): {missing}"


@pytest.mark.slow
def test_imports_only_point_down_the_layers():
    assert back_edges(_edges()) == []


def test_an_upward_import_is_caught():
    edges = [("geosearch.search.stats.scores", 3, "geosearch.search.study.run"),
             ("geosearch.manifolds.base", 7, "geosearch.optim.muon"),
             ("geosearch.search.study.run", 9, "geosearch.search.stats.scores")]
    assert back_edges(edges) == [
        "geosearch.search.stats.scores:3 imports geosearch.search.study.run "
        "(geosearch.search.study is above geosearch.search.stats)",
        "geosearch.manifolds.base:7 imports geosearch.optim.muon "
        "(geosearch.optim is above geosearch.manifolds)",
    ]


@pytest.mark.slow
def test_no_import_cycles():
    assert cycles(_edges(types=True)) == []


def test_a_cycle_is_caught():
    edges = [("geosearch.search.space.spec", 3, "geosearch.search.space.schema"),
             ("geosearch.search.space.schema", 5, "geosearch.search.space.baseline_specs"),
             ("geosearch.search.space.baseline_specs", 7, "geosearch.search.space.spec"),
             ("geosearch.search.space.plan", 9, "geosearch.search.space.spec"),
             ("geosearch.util.files", 2, "geosearch.util.files")]
    assert cycles(edges) == [
        ["geosearch.search.space.baseline_specs", "geosearch.search.space.schema",
         "geosearch.search.space.spec"],
        ["geosearch.util.files"],
    ]


@pytest.mark.slow
def test_the_science_imports_no_runtime_and_no_study():
    forbidden = ("geosearch.search.runtime", "geosearch.search.space", "geosearch.search.study")
    bad = [f"{s}:{line} imports {t}" for s, line, t in _edges()
           if s.startswith(SCIENCE) and t.startswith(forbidden)]
    assert bad == []


@pytest.mark.slow
def test_the_runtime_knows_nothing_of_what_a_trial_trains():
    allowed = ("geosearch.util", "geosearch.search.records", "geosearch.search.runtime")
    bad = [f"{s}:{line} imports {t}" for s, line, t in _edges()
           if s.startswith("geosearch.search.runtime") and not t.startswith(allowed)]
    assert bad == []


@pytest.mark.slow
def test_manifolds_import_nothing_of_the_rest():
    bad = [f"{s}:{line} imports {t}" for s, line, t in _edges()
           if s.startswith("geosearch.manifolds") and not t.startswith("geosearch.manifolds")]
    assert bad == []


@pytest.mark.slow
@pytest.mark.parametrize("module, absent", [
    ("geosearch.search.stats", ("torch", "optuna")),
    ("geosearch.search.stats.scores", ("torch", "optuna")),
    ("geosearch.search.stats.blocked", ("torch", "optuna")),
    ("geosearch.search.horizon.ladder", ("torch", "optuna")),
    ("geosearch.search.horizon.forecast", ("torch", "optuna")),
    ("geosearch.search.stats.ranking", ("torch",)),
    ("geosearch.search.stats.trials", ("torch",)),
    ("geosearch.search.horizon.pruner", ("torch",)),
    ("geosearch.search.horizon.target", ("torch",)),
    ("geosearch.search.horizon.stability", ("torch",)),
    ("geosearch.search.horizon.reading", ("torch",)),
    ("geosearch.search.space.plan", ("torch",)),
    ("geosearch.search.horizon.outlook", ("torch",)),
    ("geosearch.search.space.spec", ("torch",)),
])
def test_importing_the_science_loads_neither_torch_nor_optunas_storages(module, absent):
    code = (f"import sys, {module}; "
            f"print(sorted({{m.split('.')[0] for m in sys.modules}} & set({absent!r})))")
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert loaded.stdout.strip() == "[]", f"import {module} loads {loaded.stdout.strip()}"
