"""Tests of geosearch.search.study.extras: adaptive seeds wired into the trial loop.

``train`` is the fake of tests/_search_helpers.py with controlled losses per point and seed.
"""

from __future__ import annotations

import io
import json

import optuna
import pytest
from _search_helpers import FakeTrain, make_space, search, trials_of, use_train
from optuna.trial import TrialState

from geosearch.search.study.extras import extra_note, queue_extras
from geosearch.search.study.queue import done_count, enqueue
from geosearch.search.records import SEED_OF, SEEDS, is_extra
from geosearch.search.study.export import export_best, optuna_best_note
from geosearch.search.records import read_probes_file
from geosearch.search.runtime.storage import open_run_study
from geosearch.search.space.plan import plan_study

optuna.logging.set_verbosity(optuna.logging.WARNING)

GRID = {"attn": ["adamw", "euclidean", "oblique"], "mlp": ["adamw"]}
# adamw and euclidean within noise of each other at every number of seeds; oblique far behind
NOISE = {"attn=adamw": [0.0, 0.02, -0.01, 0.01, 0.0],
         "attn=euclidean": [0.01, 0.0, 0.0, 0.02, 0.01]}


def tied_losses(key, seed, *config):
    family = key.split(",")[0]
    return 3.5 + 0.01 * seed if family == "attn=oblique" else 3.0 + NOISE[family][seed]


@pytest.mark.slow
def test_contenders_get_seeds_at_the_top_rung_merged_into_their_score(monkeypatch, tmp_path):
    f = use_train(monkeypatch, FakeTrain(losses=tied_losses, with_config=True))
    space = make_space(GRID, repeats=2, max_repeats=4, target={"steps": 40}, ladder={"rungs": 2, "max_steps": 20})
    top = plan_study(space).rungs[-1]
    assert top.index == 1
    out = search(space, tmp_path)
    trials = trials_of(tmp_path)
    seed_trials = [t for t in trials if SEED_OF in t.user_attrs]
    by_number = {t.number: t for t in trials}
    # the two contenders got seeds 2 and 3, the separated oblique point none
    got = sorted((by_number[t.user_attrs[SEED_OF]].params["geometry.attn"], t.user_attrs[SEEDS][0])
                 for t in seed_trials)
    assert got == [("adamw", 2), ("adamw", 3), ("euclidean", 2), ("euclidean", 3)]
    assert all(t.state == TrialState.COMPLETE for t in seed_trials)
    # each seed trial trained its one seed at the top rung only
    seed_runs = [c for c in f.configs if c.seed >= 2]
    assert len(seed_runs) == 4 and all(c.steps == top.steps and c.spectral_lr == pytest.approx(top.spectral_lr)
                                       for c in seed_runs)
    assert all(t.user_attrs["rung_indices"] == [1] for t in seed_trials)
    # seed trials never count, and the ranking merges them into their point's score
    assert done_count(open_run_study(tmp_path / "runs" / "t")) == 3
    rows = {r.label.split(",")[0]: r for r in out.ranking.rows}
    assert rows["attn=adamw"].score.seeds == (0, 1, 2, 3) and rows["attn=oblique"].score.n == 2
    assert rows["attn=adamw"].score.values == pytest.approx([3.0 + v for v in NOISE["attn=adamw"][:4]])
    assert [r.number for r in out.ranking.rows] == [r.number for r in out.ranking.rows if SEED_OF not in
                                                    by_number[r.number].user_attrs]
    assert "adaptive seeds (up to 4 per assignment) stopped: budget spent" in out.ranking.verdict
    assert "seeds per contender: trial" in out.ranking.verdict and ": 4" in out.ranking.verdict
    # the export is the point trial, with every seed of its score
    best = export_best(tmp_path / "runs" / "t")[0].read_text()
    assert "n_seeds: 4" in best


@pytest.mark.slow
def test_a_separated_pair_gets_no_extra_seed(monkeypatch, tmp_path):
    f = use_train(monkeypatch, FakeTrain(losses=lambda key, seed: (3.0 if "attn=adamw" in key else 3.5) + 0.01 * seed))
    out = search(make_space(repeats=2, max_repeats=4), tmp_path)
    assert sorted(c[1] for c in f.calls) == [0, 0, 1, 1]
    assert not any(SEED_OF in t.user_attrs for t in trials_of(tmp_path))
    assert "adaptive seeds (up to 4 per assignment) stopped: separated" in out.ranking.verdict


@pytest.mark.slow
def test_resume_after_an_interrupted_seed_trial_trains_no_point_and_seed_twice(monkeypatch, tmp_path):
    state = {"raised": False}

    def interrupt_first_extra_seed(key, seed):
        if seed == 2 and not state["raised"]:
            state["raised"] = True
            return KeyboardInterrupt()
        return None

    f = use_train(monkeypatch, FakeTrain(losses=tied_losses, raises=interrupt_first_extra_seed))
    space = make_space(GRID, repeats=2, max_repeats=3)
    with pytest.raises(KeyboardInterrupt):
        search(space, tmp_path)
    study = open_run_study(tmp_path / "runs" / "t")
    waiting = [t for t in study.get_trials() if t.state == TrialState.WAITING]
    assert len(waiting) == 2 and all(SEED_OF in t.user_attrs for t in waiting)
    # planning again while seed trials wait queues nothing
    assert queue_extras(study, space, io.StringIO().write) is True
    assert queue_extras(study, space, io.StringIO().write) is True
    assert len(study.get_trials()) == len(waiting) + sum(t.state != TrialState.WAITING for t in study.get_trials())
    # two processes planning one round at once: the same (point, seed) queued twice trains once
    twin = waiting[0]
    enqueue(study, dict(twin.params), marks={SEED_OF: twin.user_attrs[SEED_OF], SEEDS: twin.user_attrs[SEEDS]})
    search(space, tmp_path)
    dup = [t for t in trials_of(tmp_path) if t.user_attrs.get("status") == "duplicate"]
    assert len(dup) == 1 and dup[0].user_attrs[SEED_OF] == twin.user_attrs[SEED_OF]
    trained = f.calls[:]
    trained.remove(next(c for c in f.calls if c[1] == 2))  # the interrupted attempt
    assert len(trained) == len(set(trained))  # no (point, seed) trained twice
    done = [(t.user_attrs[SEED_OF], t.user_attrs[SEEDS][0]) for t in trials_of(tmp_path)
            if SEED_OF in t.user_attrs and t.state == TrialState.COMPLETE]
    assert sorted(done) == sorted(set(done)) and len(done) == 2  # both contenders, seed 2 each
    # the interrupted seed trial was queued again with its marks, not as a plain point
    retried = [t for t in trials_of(tmp_path) if t.user_attrs.get("retry_of") is not None]
    assert retried and all(SEED_OF in t.user_attrs for t in retried)


@pytest.mark.slow
def test_planning_is_keyed_so_a_second_call_queues_nothing(monkeypatch, tmp_path):
    use_train(monkeypatch, FakeTrain(losses=tied_losses))
    space = make_space(GRID, repeats=2, max_repeats=3)
    search(space, tmp_path)
    study = open_run_study(tmp_path / "runs" / "t")
    before = len(study.get_trials())
    assert queue_extras(study, space, io.StringIO().write) is False  # stopped: budget spent
    assert len(study.get_trials()) == before


# the muon baseline (every type euclidean) and one adaptive seed have the lowest values of
# the study; adamw leads euclidean within noise at two seeds and ahead at three
def baseline_lowest_losses(key, seed, *config):
    if key == "attn=euclidean,mlp=euclidean":
        return 2.0  # the muon baseline
    if key.startswith("attn=oblique"):
        return 3.5 + 0.01 * seed
    if key.startswith("attn=adamw"):
        return 3.0 + [0.0, 0.0, -0.3][seed]  # its third seed: 2.7, a seed trial's value
    return 3.0 + [0.01, 0.0, 0.0][seed]


@pytest.mark.slow
def test_baselines_and_seed_trials_are_never_optunas_best(monkeypatch, tmp_path):
    use_train(monkeypatch, FakeTrain(losses=baseline_lowest_losses, with_config=True))
    space = make_space(GRID, repeats=2, max_repeats=3, baselines=["muon"])
    out = search(space, tmp_path)
    study = open_run_study(tmp_path / "runs" / "t")
    trials = study.get_trials()
    assert any(SEED_OF in t.user_attrs for t in trials)
    assert min(t.value for t in trials if t.value is not None) < out.ranking.rows[0].score.mean
    # Rule: Optuna's best trial (study.best_trial, the optuna CLI, the dashboard) is the
    # ranking's and the export's winner: baselines and seed trials are infeasible there.
    winner = out.ranking.rows[0].number
    assert study.best_trial.number == winner
    assert all(t.constraints == {"not_a_point": 1.0} for t in trials
               if (SEED_OF in t.user_attrs or "baseline" in t.user_attrs) and t.state == TrialState.COMPLETE)
    best = export_best(tmp_path / "runs" / "t")[0].read_text()
    assert f"trial: {winner}" in best


def dashboard_get(app, path: str) -> dict:
    """GET ``path`` from optuna-dashboard's WSGI app, in-process; the JSON it answers."""
    from wsgiref.util import setup_testing_defaults

    environ: dict = {"PATH_INFO": path, "REQUEST_METHOD": "GET"}
    setup_testing_defaults(environ)
    status: list[str] = []
    body = b"".join(app(environ, lambda s, headers, exc_info=None: status.append(s)))
    assert status[0].startswith("200"), (path, status, body[:200])
    return json.loads(body)


@pytest.mark.slow
def test_the_dashboard_shows_what_each_extra_trial_is_and_the_summary_names_its_best(
        monkeypatch, tmp_path):
    dashboard = pytest.importorskip("optuna_dashboard")
    use_train(monkeypatch, FakeTrain(losses=baseline_lowest_losses, with_config=True))
    out = search(make_space(GRID, repeats=2, max_repeats=3, baselines=["muon"]), tmp_path)
    run = tmp_path / "runs" / "t"
    study = open_run_study(run)
    winner = out.ranking.rows[0].number
    app = dashboard.wsgi(f"sqlite:///{run / 'study.db'}")
    (summary,) = dashboard_get(app, "/api/studies")["study_summaries"]
    detail = dashboard_get(app, f"/api/studies/{summary['study_id']}")
    shown = {t["number"]: t for t in detail["trials"]}
    trials = {t.number: t for t in study.get_trials()}
    extras = [n for n, t in trials.items() if is_extra(t)]
    assert {trials[n].user_attrs.get("baseline") for n in extras} >= {"muon", None}
    # Rule: every baseline and seed trial carries a note the dashboard shows, saying what
    # it is; a point of the space none.
    for n, t in trials.items():
        assert shown[n]["note"]["body"] == (extra_note(t.user_attrs) if n in extras else "")
    muon = next(n for n in extras if trials[n].user_attrs.get("baseline") == "muon")
    assert shown[muon]["note"]["body"] == ("baseline muon: a reference, not a point of the "
                                           "space; never exported")
    seed = next(n for n in extras if SEED_OF in trials[n].user_attrs)
    of = trials[seed].user_attrs[SEED_OF]
    assert shown[seed]["note"]["body"].startswith(f"seed 2 of trial {of}: ")
    # The dashboard's Best Trial is the lowest completed value (it reads no constraints):
    # here the muon baseline, not the winner that best_assignment.yaml and Optuna's own
    # best_trial name; the search's summary says so, naming the answer.
    (best,) = detail["best_trials"]
    assert best["number"] == muon != winner == study.best_trial.number
    assert f"trial: {winner}" in export_best(run)[0].read_text()
    assert optuna_best_note(study, out.ranking) == [
        f"note: optuna-dashboard's Best Trial is trial {muon} (baseline muon, 2.0000): it counts "
        f"every completed trial; the answer is trial {winner}, as exported"]


@pytest.mark.slow
def test_optunas_best_that_the_merged_seeds_overturn_is_named(monkeypatch, tmp_path):
    use_train(monkeypatch, FakeTrain(losses=tied_losses, with_config=True))
    buf = io.StringIO()
    from geosearch.search.study.run import run_search

    out = run_search(make_space(GRID, repeats=2, max_repeats=4), runs_dir=tmp_path / "runs", out=buf,
                     progress=False)
    study = open_run_study(tmp_path / "runs" / "t")
    # euclidean's own two seeds (3.005) beat adamw's (3.01); adamw's four (3.005) beat
    # euclidean's (3.0075): the views cannot agree, and the summary says why.
    assert out.ranking.rows[0].label.startswith("attn=adamw")
    assert study.best_trial.params["geometry.attn"] == "euclidean"
    assert (f"note: Optuna's best_trial (optuna best-trial) is trial {study.best_trial.number}, "
            "by the mean of its own seeds (3.0050)") in " ".join(buf.getvalue().split())  # wrapped


@pytest.mark.slow
def test_a_seed_trial_does_not_train_the_stability_rung(monkeypatch, tmp_path):
    f = use_train(monkeypatch, FakeTrain(losses=tied_losses, with_config=True))
    # one rung: a seed trial's rung is rung 0, as a point's, but its point measured stability
    space = make_space(GRID, repeats=2, max_repeats=3, target={"steps": 40},
                       ladder={"rungs": 1, "stability_steps": 10})
    search(space, tmp_path)
    seed_trials = [t for t in trials_of(tmp_path) if SEED_OF in t.user_attrs]
    assert seed_trials
    # Rule: only the points' first seed trains the stability rung (its larger step): the
    # euclidean and oblique points (the adamw point's queries and keys take no spectral step).
    stab_runs = [c for c in f.configs if c.spectral_lr > 0.021]
    assert len(stab_runs) == 2 and all(c.seed == 0 for c in stab_runs)
    assert all(read_probes_file(tmp_path / "runs" / "t", t)["stability_probes"] == []
               for t in seed_trials)
