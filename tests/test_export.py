"""Tests of geosearch.search.export: the exported assignment files.

The end-to-end test in tests/test_study.py builds an optimizer from an exported winner.
"""

from __future__ import annotations

import optuna
from _search_helpers import fake, make_space, search  # noqa: F401

from geosearch.assignment import load_assignment
from geosearch.search.export import export_best

optuna.logging.set_verbosity(optuna.logging.WARNING)


def test_export_top_k_writes_one_loadable_file_per_rank(fake, tmp_path):
    search(make_space({"attn": ["adamw", "euclidean", "oblique"], "mlp": ["adamw"]}), tmp_path)
    paths = export_best(tmp_path / "runs" / "t", top=2)
    assert [p.name.split("-")[0] for p in paths] == ["rank1", "rank2"]
    loaded = [load_assignment(p) for p in paths]
    assert [a.provenance["rank"] for a in loaded] == [1, 2]
    assert loaded[0].provenance["score"]["mean"] <= loaded[1].provenance["score"]["mean"]
    single = export_best(tmp_path / "runs" / "t", tmp_path / "best.yaml")
    assert single == [tmp_path / "best.yaml"] and load_assignment(single[0]).provenance["rank"] == 1
