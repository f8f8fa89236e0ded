"""Tests of geosearch.search.export: the exported assignment files.

The end-to-end test in tests/test_study.py builds an optimizer from an exported winner.
"""

from __future__ import annotations

from pathlib import Path

import optuna
from _search_helpers import TINY_PROXY, fake, make_space, search  # noqa: F401

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


def test_export_and_report_run_no_user_code(fake, tmp_path):
    """A study of a ``py:`` model: exporting and reporting it read what the trials stored;
    the model's module (which writes a file when imported) is not imported again."""
    from _user_model import RULES

    from geosearch.report import write_report

    source = (Path(__file__).parent / "_user_model.py").read_text(encoding="utf-8")
    marker = tmp_path / "imported"
    module = tmp_path / "mymodel.py"
    module.write_text(source + f"\nopen({str(marker)!r}, 'a').write('imported\\n')\n", encoding="utf-8")
    rules = [{"type": r.type, "pattern": r.pattern, "family": r.family} for r in RULES]
    space = make_space({"attn": ["adamw", "euclidean"], "mlp": ["adamw"]}, rules=rules,
                       proxy={**TINY_PROXY, "model": f"py:{module}:make_model"})
    search(space, tmp_path)
    assert marker.exists()  # the search itself checks and builds the model
    marker.unlink()
    run_dir = tmp_path / "runs" / "t"
    best = load_assignment(export_best(run_dir)[0])
    assert set(best.geometry) == {"attn", "mlp"} and best.provenance["proxy"]["model"].startswith("py:")
    write_report(run_dir, plots=False)
    assert not marker.exists()
