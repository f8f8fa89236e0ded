"""Tests of pyproject.toml: the default install has what the package imports.

The README's install is ``pip install -e .``: the plots of the first report (matplotlib)
and the progress bars (tqdm) must come with it, and every other third-party package the
code imports must be declared, in the core dependencies or an optional extra.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")  # Python >= 3.11

ROOT = Path(__file__).resolve().parents[1]
# import name -> distribution name, where they differ
_DISTRIBUTION = {"yaml": "pyyaml", "psycopg2": "psycopg2-binary", "optuna_dashboard": "optuna-dashboard"}


def _names(requirements: list[str]) -> set[str]:
    return {re.split(r"[<>=!~\[; ]", r, maxsplit=1)[0].strip().lower() for r in requirements}


def _project() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]


def _imports() -> dict[str, bool]:
    """Third-party top-level modules imported by geosearch/ -> whether one import of it runs
    when its module is imported (at module level, outside a try block)."""
    found: dict[str, bool] = {}
    for path in (ROOT / "geosearch").rglob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        eager = {id(n) for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))}
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                mods = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                mods = [node.module]
            else:
                continue
            for mod in mods:
                top = mod.split(".")[0]
                if top in sys.stdlib_module_names or top in ("geosearch", "__future__"):
                    continue
                found[top] = found.get(top, False) or id(node) in eager
    return found


def test_the_default_install_draws_plots_and_progress_bars():
    core = _names(_project()["dependencies"])
    # Rule: matplotlib (the report's plots) and tqdm (imported for progress) are core.
    assert {"matplotlib", "tqdm"} <= core


@pytest.mark.slow
def test_every_imported_package_is_declared():
    project = _project()
    core = _names(project["dependencies"])
    extras = set().union(*(_names(v) for v in project.get("optional-dependencies", {}).values()))
    imports = _imports()
    assert {"torch", "optuna", "yaml"} <= set(imports)  # the scan sees the package's imports
    for module, eager in sorted(imports.items()):
        dist = _DISTRIBUTION.get(module, module).lower()
        # Rule: a package imported when its module loads is a core dependency; one
        # imported on demand is at least an optional extra.
        assert dist in (core if eager else core | extras), (module, "eager" if eager else "lazy")
