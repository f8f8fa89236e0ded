"""Tests of geosearch.search.study.export: the exported assignment files.

The end-to-end test in tests/search/study/test_run.py builds an optimizer from an exported winner.
"""

from __future__ import annotations

import pytest

from pathlib import Path

import optuna
from _search_helpers import TINY_PROXY, make_space, search

from geosearch.assignment import load_assignment
from geosearch.search.study.export import export_best

optuna.logging.set_verbosity(optuna.logging.WARNING)


@pytest.mark.slow
def test_export_top_k_writes_one_loadable_file_per_rank(fake, tmp_path):
    search(make_space({"attn": ["adamw", "euclidean", "oblique"], "mlp": ["adamw"]}), tmp_path)
    paths = export_best(tmp_path / "runs" / "t", top=2)
    assert [p.name.split("-")[0] for p in paths] == ["rank1", "rank2"]
    loaded = [load_assignment(p) for p in paths]
    assert [a.provenance["rank"] for a in loaded] == [1, 2]
    assert loaded[0].provenance["score"]["mean"] <= loaded[1].provenance["score"]["mean"]
    single = export_best(tmp_path / "runs" / "t", tmp_path / "best.yaml")
    assert single == [tmp_path / "best.yaml"] and load_assignment(single[0]).provenance["rank"] == 1


def _groups(opt):
    """Every key of every param group, the parameters as their names."""
    return [{k: v for k, v in g.items() if k != "params"} for g in opt.param_groups]


@pytest.mark.slow
def test_exported_file_alone_rebuilds_the_winning_trials_optimizer(fake, tmp_path):
    import torch

    from geosearch.build import build_optimizer
    from geosearch.models.model import GPT, make_config
    from geosearch.search.runtime.storage import open_run_study

    # searched global settings (spectral_lr, lr) and proxy settings off the defaults
    space = make_space({"attn": ["stiefel", "dgram"], "mlp": ["stiefel"]},
                       hyperparams={"spectral_lr": [0.01, 0.05], "lr": [1e-4, 1e-3]},
                       budget={"trials": 2}, sampler={"type": "random", "seed": 3})
    space = type(space).from_dict({**space.to_dict(), "proxy": {**space.to_dict()["proxy"],
                                   "momentum": 0.9, "optimizer_args": {"ns_steps": 6}}}, source="t")
    search(space, tmp_path)
    best_path = tmp_path / "runs" / "t" / "best_assignment.yaml"
    exported = load_assignment(best_path)
    trial = next(t for t in open_run_study(tmp_path / "runs" / "t").get_trials()
                 if t.number == exported.provenance["trial"])
    suggestion = space.suggest(optuna.trial.FixedTrial(dict(trial.params)))
    config = space.train_config(suggestion)

    torch.manual_seed(0)
    model = GPT(make_config("tiny", vocab_size=256))
    # what the trial trained with: the suggestion's assignment and the run's settings
    trained = build_optimizer(model, suggestion.assignment(), verbose=False, **config.optimizer_settings())
    # what the user gets from the file alone
    rebuilt = build_optimizer(model, load_assignment(best_path), verbose=False)
    assert _groups(rebuilt) == _groups(trained)
    assert [[id(p) for p in g["params"]] for g in rebuilt.param_groups] == \
        [[id(p) for p in g["params"]] for g in trained.param_groups]
    # and the searched values are really in it, not the defaults
    assert exported.settings["spectral_lr"] == trial.params["spectral_lr"] != 0.02
    assert exported.settings["momentum"] == 0.9 and exported.settings["ns_steps"] == 6
    assert "build_optimizer_overrides" not in exported.provenance


@pytest.mark.slow
def test_export_and_report_run_no_user_code(fake, tmp_path):
    """A study of a ``py:`` model: exporting and reporting it read what the trials stored;
    the model's module (which writes a file when imported) is not imported again."""
    from _user_model import RULES

    from geosearch.report import write_report

    source = (Path(__file__).resolve().parents[2] / "_user_model.py").read_text(encoding="utf-8")
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


@pytest.mark.slow
def test_export_moves_the_answer_to_another_rule_set_and_the_model_builds_it(fake, tmp_path):
    import torch

    from geosearch.build import build_optimizer
    from geosearch.cli import main
    from geosearch.models.zoo import build_model

    search(make_space({"attn": ["stiefel", "dgram"], "mlp": ["dgram"]}), tmp_path)
    run_dir = tmp_path / "runs" / "t"
    [path] = export_best(run_dir, tmp_path / "llama.yaml", rules="llama")
    moved, proxy = load_assignment(path), load_assignment(run_dir / "best_assignment.yaml")
    assert moved.rules == "llama" and moved.provenance["rules_from"] == "nanogpt"
    assert moved.resolve()["attn_k"] == proxy.resolve()["attn_qkv"]
    assert moved.resolve()["mlp_gate"] == proxy.resolve()["mlp_in"]
    torch.manual_seed(0)
    model = build_model("hf:llama", vocab_size=256, model_args={
        "num_hidden_layers": 1, "hidden_size": 32, "intermediate_size": 64, "num_attention_heads": 2,
        "num_key_value_heads": 1}).model
    build_optimizer(model, path, verbose=False)
    # the command line: one line naming --rules for an unknown rule set, nothing written
    assert main(["export", str(run_dir), "--rules", "nosuch", "-o", str(tmp_path / "x.yaml")]) == 2
    assert not (tmp_path / "x.yaml").exists()


@pytest.mark.slow
def test_the_search_ends_with_its_table_four_lines_and_where_within_100_columns(fake, tmp_path):
    from geosearch.search.study.export import where_line

    space = make_space({"attn": ["adamw", "euclidean", "oblique"], "mlp": ["adamw", "oblique"]},
                       repeats=2, baselines=["adamw", "muon"], target={"steps": 40})
    out = search(space, tmp_path)
    from geosearch.search.runtime.storage import open_run_study
    from geosearch.search.study.export import format_ranking

    lines = format_ranking(open_run_study(tmp_path / "runs" / "t")).splitlines()
    # Rule: the ranked table (a header and a row per ranked point), then at most four lines
    assert lines[0].startswith("rank  trial") and len(lines) <= 1 + len(out.ranking.rows) + 4
    assert max(map(len, lines)) <= 100
    assert lines[1 + len(out.ranking.rows)].startswith("verdict: ")
    assert any(ln.startswith("vs baselines: adamw ") and "muon " in ln for ln in lines)
    assert any(ln.startswith("order at your target (Σ η ") for ln in lines)
    # the fifth line: where the answer and the report are, one line
    assert where_line(Path("runs/t/best_assignment.yaml"), Path("runs/t/report.md"), True) == \
        "best assignment: runs/t/best_assignment.yaml (report.md, plots/ beside it)"
    assert where_line(Path("a.yaml")) == "best assignment: a.yaml"
    # the stored verdict is the fields, and loading the file still works
    a = load_assignment(out.exported)
    v = a.provenance["verdict"]
    assert v["trial"] == out.ranking.rows[0].number
    assert {b["name"] for b in v["baselines"]} == {"adamw", "muon"}
