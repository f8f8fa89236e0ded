"""Tests of geosearch.search.study: a whole search, resume, and the package's API.

The ranking statistics (geosearch.search.ranking) are tested here too: the search prints
that ranking, and the report (tests/test_report.py) renders it. The rooms of the study
have their own files: test_storage, test_records, test_liveness, test_queue,
test_trial_loop, test_export.
"""

from __future__ import annotations

import math

import optuna
import pytest
import torch
from _search_helpers import TINY_PROXY, fake, make_space, search, trials_of  # noqa: F401

from geosearch.assignment import load_assignment
from geosearch.errors import ConfigError
from geosearch.optim import build_optimizer
from geosearch.proxy.model import GPT, make_config
from geosearch.search import export, storage
from geosearch.search.ranking import Score, compare_scores, rank_scores, rank_study
from geosearch.search.study import export_best, open_run_study, run_search

optuna.logging.set_verbosity(optuna.logging.WARNING)


# --------------------------------------------------------------------------- statistics
def test_score_mean_std_and_se():
    s = Score((3.0, 3.2, 3.4))
    assert s.mean == pytest.approx(3.2)
    assert s.std == pytest.approx(0.2)  # sample std, ddof=1
    assert s.se == pytest.approx(0.2 / math.sqrt(3))
    assert Score((3.0,)).std is None and Score((3.0,)).se is None  # one seed: no spread, not zero
    # non-finite or missing seeds are dropped, not averaged in
    kept = Score.of([3.0, 3.2, 3.1, float("nan"), None])
    assert kept.n == 3 and kept.mean == pytest.approx(3.1) and kept.std == pytest.approx(0.1)
    assert Score.of([]).n == 0 and Score.of([]).text() == "—"


def test_compare_scores_is_a_welch_t_test():
    best = Score((3.00, 3.02, 2.98))
    # Δ = 0.01, se = 0.01155 each: threshold = t(df=4)=2.776 * sqrt(2)*0.01155 = 0.0453 → tie
    verdict, threshold = compare_scores(best, Score((3.01, 3.03, 2.99)))
    assert verdict == "tie" and threshold == pytest.approx(2.776 * math.sqrt(2) * 0.02 / math.sqrt(3), rel=1e-3)
    # Δ = 0.1 is far beyond the same threshold → separated
    assert compare_scores(best, Score((3.10, 3.12, 3.08)))[0] == "separated"
    # Δ = 0.04 would pass a plain 2·SE rule (0.0327) but not the t-test at 2+2 dof (0.0453)
    assert compare_scores(best, Score((3.04, 3.06, 3.02)))[0] == "tie"
    # one seed on either side: the spread is unknown, so no verdict
    assert compare_scores(best, Score((3.4,))) == ("unknown", None)
    assert compare_scores(Score((3.0,)), Score((3.1,))) == ("unknown", None)
    # seeds that agree exactly: any gap is separated, and the verdict still reads (no 0/0)
    exact = rank_scores([(0, "attn=stiefel", Score((3.3,) * 3)), (1, "attn=dgram", Score((3.4,) * 3))])
    assert [r.versus_best for r in exact.rows] == ["best", "separated"] and exact.tied == [0]
    assert exact.verdict.startswith("winner: attn=stiefel") and "every seed of both agrees exactly" in exact.verdict


def test_ranking_names_ties_and_refuses_to_judge_without_spread():
    study = optuna.create_study()
    for losses in ([3.00, 3.02, 2.98], [3.01, 3.03, 2.99], [3.5, 3.52, 3.48]):
        study.add_trial(optuna.trial.create_trial(
            value=sum(losses) / 3, params={"geometry.attn": "x"},
            distributions={"geometry.attn": optuna.distributions.CategoricalDistribution(["x"])},
            user_attrs={"val_losses": losses}))
    r = rank_study(study)
    assert [row.number for row in r.rows] == [0, 1, 2]
    assert [row.versus_best for row in r.rows] == ["best", "tie", "separated"]
    assert r.tied == [0, 1] and r.verdict.startswith("no single winner")

    one_seed = optuna.create_study()
    for v in (3.0, 3.1):
        one_seed.add_trial(optuna.trial.create_trial(value=v, user_attrs={"val_losses": [v]}))
    verdict = rank_study(one_seed).verdict
    assert "cannot be judged" in verdict and "--repeats" in verdict  # no false winner

    # the runner-up is beaten beyond noise, but a one-seed trial further back has no spread:
    # its gap cannot be judged either, so still no winner is named
    mixed = rank_scores([(0, "a", Score((3.00, 3.02, 2.98))), (1, "b", Score((3.50, 3.52, 3.48))),
                         (2, "c", Score((3.6,)))])
    assert [r.versus_best for r in mixed.rows] == ["best", "separated", "unknown"]
    assert "cannot be judged" in mixed.verdict and not mixed.verdict.startswith("winner:")


# --------------------------------------------------------------------------- a whole search
def test_resume_with_other_proxy_settings_is_refused(fake, tmp_path):
    search(make_space(), tmp_path)
    changed = make_space(proxy={**TINY_PROXY, "steps": 20})
    with pytest.raises(ConfigError, match=r"proxy\.steps=10, not 20"):
        search(changed, tmp_path)


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


def test_study_still_offers_what_the_cli_and_report_import():
    # the CLI and the report import these three from study.py; they live in their rooms
    assert export_best is export.export_best and open_run_study is storage.open_run_study
