"""Tests of geosearch.search.study.run: a whole search, resume, and the package's API.

The rooms of the study have their own files: tests/search/runtime/ (storage, liveness),
tests/search/test_records.py, test_queue, test_trial_loop, test_export; the ranking it prints
is tested in tests/search/stats/ (test_ranking, test_scores), and the report in tests/report/.
"""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest
import torch
from _search_helpers import TINY_PROXY, make_space, search, trials_of

from geosearch.assignment import load_assignment
from geosearch.errors import ConfigError, SettingsError
from geosearch.build import build_optimizer
from geosearch.models.model import GPT, make_config
from geosearch.search.stats.ranking import rank_study
from geosearch.search.study.run import preflight, run_search

optuna.logging.set_verbosity(optuna.logging.WARNING)


# --------------------------------------------------------------------------- a whole search
def test_the_value_is_named_for_optunas_own_tools(fake, tmp_path):
    # the dashboard and `optuna` CLI show "val_loss", not "Objective 0"; a resume keeps it
    search(make_space(), tmp_path)
    search(make_space(), tmp_path)
    study = optuna.load_study(study_name="t", storage=f"sqlite:///{tmp_path}/runs/t/study.db")
    assert study.metric_names == ["val_loss"]


def test_resume_with_other_proxy_settings_is_refused(fake, tmp_path):
    search(make_space(), tmp_path)
    changed = make_space(proxy={**TINY_PROXY, "steps": 20})
    with pytest.raises(ConfigError, match=r"proxy\.steps=10, not 20"):
        search(changed, tmp_path)


def test_a_search_keeps_the_studys_backup_and_a_resume_completes_it(fake, tmp_path):
    # Rule: study.json and every told trial's trials/<n>/trial.json are written (what
    # `geosearch recover` rebuilds a damaged storage from); a resumed study that has none
    # (a study of a version that kept no backup) gets them when the search starts.
    search(make_space(), tmp_path)
    run = tmp_path / "runs" / "t"
    records = sorted(run.glob("trials/*/trial.json"))
    assert len(records) == 2 and (run / "study.json").is_file()
    for path in [*records, run / "study.json"]:
        path.unlink()
    search(make_space(), tmp_path)
    assert sorted(run.glob("trials/*/trial.json")) == records and (run / "study.json").is_file()
    assert len(fake.calls) == 2  # nothing trained again


def test_end_to_end_search_exports_an_assignment_that_builds_an_optimizer(tmp_path):
    space = make_space({"attn": ["adamw", "oblique"], "mlp": ["adamw", "euclidean"]})
    out = search(space, tmp_path)
    reasons = [t.user_attrs.get("fail_reason") for t in trials_of(tmp_path)]
    assert out.counts == {"completed": 4}, reasons
    run = tmp_path / "runs" / "t"
    for t in trials_of(tmp_path):
        lines = (run / t.user_attrs["trial_dir"] / "metrics.jsonl").read_text().splitlines()
        assert len(lines) == 2  # steps 5 and 10
        assert (run / t.user_attrs["trial_dir"] / "config.yaml").is_file()
    assert out.exported == run / "best_assignment.yaml"
    a = load_assignment(out.exported)
    best = out.ranking.rows[0]
    assert a.provenance["trial"] == best.number and a.provenance["score"]["mean"] == pytest.approx(best.score.mean)
    assert a.provenance["study"] == "t" and a.provenance["proxy"]["steps"] == 10
    assert {"date", "geosearch_version", "verdict"} <= set(a.provenance)

    torch.manual_seed(0)
    model = GPT(make_config("tiny"))
    opt = build_optimizer(model, a, verbose=False)
    x = torch.randint(256, (2, 16))
    before = [p.detach().clone() for p in model.parameters()]
    model(x, x)[1].backward()
    opt.step()
    assert any(not torch.equal(b, p) for b, p in zip(before, model.parameters()))


USER_MODEL = Path(__file__).resolve().parents[2] / "_user_model.py"
USER_RULES = [{"type": "attn_qkv", "pattern": r"\.mix\.qkv\.weight$", "family": "attn"},
              {"type": "attn_out", "pattern": r"\.mix\.out\.weight$", "family": "attn"},
              {"type": "mlp_in", "pattern": r"\.ff\.up\.weight$", "family": "mlp"},
              {"type": "mlp_out", "pattern": r"\.ff\.down\.weight$", "family": "mlp"}]


def test_preflight_splits_the_batch_over_the_processes_of_a_launch():
    preflight(make_space(proxy={**TINY_PROXY, "batch_size": 4, "grad_accum": 2}), processes=2)
    # Rule: each process's rows must split into grad_accum micro-batches.
    with pytest.raises(SettingsError, match=r"^test space: proxy.grad_accum: global batch 4 does not split "
                                            r"over 2 processes x 4 micro-batches; expected one of: 1, 2$"):
        preflight(make_space(proxy={**TINY_PROXY, "batch_size": 4, "grad_accum": 4}), processes=2)


def test_preflight_runs_a_py_model_for_real_when_its_forward_cannot_run_on_the_meta_device():
    def space(factory):
        return make_space(rules=USER_RULES, proxy={**TINY_PROXY, "model": f"py:{USER_MODEL}:{factory}"})

    preflight(space("checked"))  # keeps the contract: built for real on the CPU, it passes
    # Rule: a py: model whose logits are not the data's vocabulary is refused before any
    # trial, naming the space's key, even when only a real forward can show it.
    with pytest.raises(SettingsError, match=r"^test space: proxy.model: model 'py:.*checked_ignores_vocab': "
                                            r"forward\(idx\) returned logits of shape \(2, 128, 100\), "
                                            r"expected \(2, 128, 256\)"):
        preflight(space("checked_ignores_vocab"))


def test_search_package_exports_its_public_api():
    import geosearch.search as search_pkg

    # every name in __all__ resolves (study's names are imported on first use)
    for name in search_pkg.__all__:
        assert getattr(search_pkg, name) is not None, name
    assert search_pkg.run_search is run_search and search_pkg.rank_study is rank_study
    with pytest.raises(AttributeError):
        search_pkg.no_such_name  # noqa: B018
