"""Tests of geosearch.search.study.run: a whole search, resume, and the package's API.

The rooms of the study have their own files: tests/search/runtime/ (storage, liveness),
tests/search/test_records.py, test_queue, test_trial_loop, test_export; the ranking it prints
is tested in tests/search/stats/ (test_ranking, test_scores), and the report in tests/report/.
"""

from __future__ import annotations


import optuna
import pytest
import torch
from _search_helpers import TINY_PROXY, make_space, search, trials_of

from geosearch.assignment import load_assignment
from geosearch.util.errors import ConfigError
from geosearch.build import build_optimizer
from geosearch.models.model import GPT, make_config
from geosearch.search.stats.study_ranking import rank_study
from geosearch.search.study.run import run_search

optuna.logging.set_verbosity(optuna.logging.WARNING)


# --------------------------------------------------------------------------- a whole search
@pytest.mark.slow
def test_the_value_is_named_for_optunas_own_tools(fake, tmp_path):
    # the dashboard and `optuna` CLI show "val_loss", not "Objective 0"; a resume keeps it
    search(make_space(), tmp_path)
    search(make_space(), tmp_path)
    study = optuna.load_study(study_name="t", storage=f"sqlite:///{tmp_path}/runs/t/study.db")
    assert study.metric_names == ["val_loss"]


@pytest.mark.slow
def test_resume_with_other_proxy_settings_is_refused(fake, tmp_path):
    search(make_space(), tmp_path)
    changed = make_space(proxy={**TINY_PROXY, "steps": 20})
    with pytest.raises(ConfigError, match=r"proxy\.steps=10, not 20"):
        search(changed, tmp_path)


@pytest.mark.slow
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


@pytest.mark.slow
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


def test_search_package_exports_its_public_api():
    import geosearch.search as search_pkg

    # every name in __all__ resolves (study's names are imported on first use)
    for name in search_pkg.__all__:
        assert getattr(search_pkg, name) is not None, name
    assert search_pkg.run_search is run_search and search_pkg.rank_study is rank_study
    with pytest.raises(AttributeError):
        search_pkg.no_such_name  # noqa: B018


# --------------------------------------------------------------------------- the default workers
@pytest.mark.slow
def test_the_default_runs_a_worker_per_core_and_measures_what_one_process_does(tmp_path, monkeypatch):
    import io

    from geosearch.search.runtime import workers

    space = make_space({"attn": ["adamw", "euclidean"], "mlp": ["adamw", "euclidean"]})
    alone = search(space, tmp_path / "one", workers=1)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)  # the user set no threads ...
    monkeypatch.setattr(workers, "cpu_cores", lambda: 2)  # ... on a 2-core machine
    out = io.StringIO()
    shared = run_search(space, runs_dir=tmp_path / "two" / "runs", out=out, progress=False, workers=None)
    assert "workers: 2 single-thread processes (2 cores; --workers 1 for one process)" in out.getvalue()
    assert "started 2 workers" in out.getvalue()
    assert (shared.run_dir / "journal.log").is_file() and not (shared.run_dir / "study.db").exists()
    # Rule: the processes change where a trial runs, not what it measures: every point's value
    # is one process's, to the bit.
    values = {}
    for name in ("one", "two"):
        for t in trials_of(tmp_path / name):
            values.setdefault(tuple(sorted(t.params.items())), []).append(t.value)
    assert len(values) == 4 and all(len(v) == 2 and v[0] == v[1] for v in values.values()), values
    assert alone.ranking.rows and len(shared.ranking.rows) == len(alone.ranking.rows)
