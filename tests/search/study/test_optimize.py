"""Tests of Optuna's API into geosearch: ``geosearch.objective`` for ``study.optimize``,
Optuna objects handed to ``run_search``, each trial's files as Optuna artifacts, and the
``geosearch search`` flags spelled in Optuna's words.

``train`` is replaced by a fake (tests/_search_helpers.py) except where the artifacts of
real runs are checked.
"""

from __future__ import annotations

import io
import math

import optuna
import pytest
from _search_helpers import FakeTrain, make_space, search, trials_of, use_train
from optuna.artifacts import FileSystemArtifactStore, download_artifact, get_all_artifact_meta
from optuna.trial import TrialState

import geosearch
from geosearch.cli import build_parser
from geosearch.util.errors import ConfigError, GeosearchError
from geosearch.search.runtime.backup import upload_trial_files
from geosearch.report import write_report
from geosearch.search.horizon.pruner import LogitGrowthPruner
from geosearch.search.records import trial_status
from geosearch.search.stats.trials import trial_line

optuna.logging.set_verbosity(optuna.logging.ERROR)

# attrs that name the process, the moment, the trial's number or the search's queue
_BOOKKEEPING = {"worker", "heartbeat", "trial_dir", "queued", "queued_params"}


def _grid(space):
    """A sampler that proposes each point of ``space`` once, in order."""
    return optuna.samplers.GridSampler({f"geometry.{k}": list(v) for k, v in space.geometries.items()},
                                       seed=0)


class WritingTrain(FakeTrain):
    """A :class:`FakeTrain` that also writes a run's files, as the real trainer does."""

    def __call__(self, config, assignment, callback=None, out_dir=None, **kw):
        result = super().__call__(config, assignment, callback=callback, out_dir=out_dir, **kw)
        if out_dir is not None:
            out_dir.mkdir(parents=True, exist_ok=True)
            (out_dir / "config.yaml").write_text(f"seed: {config.seed}\n")
            (out_dir / "metrics.jsonl").write_text("".join(f'{{"step": {m["step"]}}}\n'
                                                           for m in result.history))
        return result


def _optimize(space, tmp_path, n_trials, **study_kw):
    study = optuna.create_study(study_name="t", **study_kw)
    study.optimize(geosearch.objective(space, runs_dir=tmp_path / "runs", echo=lambda line: None),
                   n_trials=n_trials)
    return study


@pytest.mark.slow
def test_objective_trains_a_trial_as_the_search_does(fake, tmp_path):
    space = make_space()  # attn in {adamw, euclidean}, mlp adamw: two points
    search(space, tmp_path / "search")
    by_search = {t.params["geometry.attn"]: t for t in trials_of(tmp_path / "search")}
    study = _optimize(space, tmp_path / "optimize", 2, sampler=_grid(space),
                      pruner=space.make_pruner())
    assert len(study.trials) == 2
    for t in study.trials:
        twin = by_search[t.params["geometry.attn"]]
        # Rule: a trial run by study.optimize has the search's state, value and user attrs.
        assert t.state == twin.state == TrialState.COMPLETE and t.value == twin.value
        ours = {k: v for k, v in t.user_attrs.items() if k not in _BOOKKEEPING}
        theirs = {k: v for k, v in twin.user_attrs.items() if k not in _BOOKKEEPING}
        assert ours == theirs and t.user_attrs["trial_dir"] == f"trials/{t.number}"
        assert t.intermediate_values == twin.intermediate_values
    # Rule: the study carries the space like a search's, so export and report read it.
    assert study.user_attrs["space"]["geometries"] == space.to_dict()["geometries"]
    assert (tmp_path / "optimize/runs/t/space.yaml").is_file()


def test_unstable_trials_are_pruned_with_their_reason(monkeypatch, tmp_path):
    use_train(monkeypatch, FakeTrain(logits=lambda key, seed: 5e3 if "attn=euclidean" in key else 10.0))
    space = make_space()
    study = _optimize(space, tmp_path, 2, sampler=_grid(space),
                      pruner=space.make_pruner())
    by_attn = {t.params["geometry.attn"]: t for t in study.trials}
    pruned = by_attn["euclidean"]
    # Rule: the logit-growth verdict prunes the trial (Optuna's PRUNED) and keeps its reason.
    assert pruned.state == TrialState.PRUNED and pruned.user_attrs["status"] == "unstable"
    assert pruned.user_attrs["prune_reason"] == "max logit 5e+03 at step 5 > threshold 80 (10 × d/√d_head 8)"
    assert by_attn["adamw"].state == TrialState.COMPLETE


@pytest.mark.slow
@pytest.mark.parametrize("wrapped", [False, True])
def test_a_loss_pruners_prune_is_pruned_with_its_reason_not_unstable(monkeypatch, tmp_path, wrapped):
    # the first point trains at val loss 3, the second at 4: MedianPruner (one startup
    # trial) stops the second at its first report; its logits are low, so it is no instability
    first = []
    losses = lambda key, seed: 3.0 if first.append(key) or first[0] == key else 4.0  # noqa: E731
    use_train(monkeypatch, FakeTrain(losses=losses))
    space = make_space()
    median = optuna.pruners.MedianPruner(n_startup_trials=1, n_warmup_steps=0)
    pruner = LogitGrowthPruner(median) if wrapped else median
    (tmp_path / "runs" / "t").mkdir(parents=True)
    study = _optimize(space, tmp_path, 2, sampler=_grid(space), pruner=pruner,
                      storage=f"sqlite:///{tmp_path}/runs/t/study.db")
    done, stopped = study.trials
    assert done.state == TrialState.COMPLETE
    assert stopped.state == TrialState.PRUNED and trial_status(stopped) == "pruned"
    assert stopped.user_attrs["status"] == "pruned"
    assert "MedianPruner" in stopped.user_attrs["prune_reason"]
    assert "loss pruner, not unstable" in trial_line(stopped)
    text = write_report(tmp_path / "runs" / "t", plots=False).report.read_text()
    assert "1 completed, 0 unstable, 1 pruned" in text and "Pruned by the loss pruner" in text


def test_a_failed_trial_does_not_stop_optimize_but_five_in_a_row_do(monkeypatch, tmp_path):
    use_train(monkeypatch, FakeTrain(raises=lambda key, seed: RuntimeError("boom") if "euclidean" in key else None))
    space = make_space()
    study = _optimize(space, tmp_path, 2, sampler=_grid(space))
    by_attn = {t.params["geometry.attn"]: t for t in study.trials}
    # Rule: a trial whose run raised is failed with its message; the next trial still runs.
    assert by_attn["euclidean"].state == TrialState.FAIL
    assert by_attn["euclidean"].user_attrs["fail_reason"] == "RuntimeError: boom"
    assert by_attn["adamw"].state == TrialState.COMPLETE

    use_train(monkeypatch, FakeTrain(raises=lambda key, seed: RuntimeError("no GPU")))
    space = make_space({"attn": ["adamw", "euclidean", "oblique"], "mlp": ["adamw", "euclidean"]})
    with pytest.raises(GeosearchError, match="5 trials in a row failed"):
        _optimize(space, tmp_path / "again", 6, sampler=_grid(space))


def test_scored_points_are_not_trained_again_and_optimize_stops_when_all_are(tmp_path):
    calls = []

    class Counting(FakeTrain):
        def __call__(self, config, assignment, **kw):
            calls.append(assignment.resolve()["attn_qkv"])
            return super().__call__(config, assignment, **kw)

    import geosearch.search.study.trial_loop as trial_loop

    mp = pytest.MonkeyPatch()
    mp.setattr(trial_loop, "train", Counting())
    try:
        study = _optimize(make_space(), tmp_path, 30, sampler=optuna.samplers.RandomSampler(seed=0))
    finally:
        mp.undo()
    # Rule: each of the two points is trained once; repeats are duplicates, not runs ...
    assert sorted(calls) == ["adamw", "euclidean"]
    statuses = [trial_status(t) for t in study.trials]
    assert statuses.count("completed") == 2 and set(statuses) <= {"completed", "duplicate"}
    # ... and optimize stops once every point is scored instead of using all 30 trials.
    assert len(study.trials) < 30


def test_objective_refuses_a_study_that_maximises(fake, tmp_path):
    with pytest.raises(ConfigError, match="maximises"):
        _optimize(make_space(), tmp_path, 1, direction="maximize")


def test_objective_refuses_a_study_of_another_space(fake, tmp_path):
    storage = optuna.storages.InMemoryStorage()
    _optimize(make_space(), tmp_path, 1, storage=storage)
    other = make_space(proxy={**make_space().to_dict()["proxy"], "steps": 20})
    study = optuna.create_study(study_name="t", storage=storage, load_if_exists=True)
    with pytest.raises(ConfigError, match="proxy.steps"):
        study.optimize(geosearch.objective(other, runs_dir=tmp_path / "runs"), n_trials=1)


@pytest.mark.slow
def test_trial_files_are_optuna_artifacts_of_their_trial(monkeypatch, tmp_path):
    use_train(monkeypatch, WritingTrain())
    out = search(make_space(repeats=2), tmp_path)
    assert out.counts == {"completed": 2}
    run_dir = tmp_path / "runs" / "t"
    storage = optuna.storages.get_storage(f"sqlite:///{run_dir.resolve() / 'study.db'}")
    store = FileSystemArtifactStore(run_dir / "artifacts")
    for t in optuna.load_study(study_name="t", storage=storage).get_trials():
        metas = {m.filename: m for m in get_all_artifact_meta(t, storage=storage)}
        # Rule: every file of the trial's folder is an artifact of that trial; a seed's
        # sub-folder is part of the name; the trial's own rung_probes.json and probes.json
        # (its probes, kept out of its user attrs) are too.
        files = {f"seed{s}-{f}" for s in (0, 1) for f in ("config.yaml", "metrics.jsonl")}
        assert set(metas) == files | {"rung_probes.json", "probes.json"}
        copy = tmp_path / f"{t.number}.jsonl"
        download_artifact(artifact_store=store, file_path=str(copy),
                          artifact_id=metas["seed1-metrics.jsonl"].artifact_id)
        assert copy.read_text() == \
            (run_dir / "trials" / str(t.number) / "seed1" / "metrics.jsonl").read_text()
        assert metas["seed0-config.yaml"].mimetype == "application/yaml"


@pytest.mark.slow
def test_real_runs_store_config_metrics_and_result_as_artifacts(tmp_path):
    # the real trainer, one step budget of the tiny proxy, through study.optimize
    space = make_space({"attn": ["euclidean"], "mlp": ["adamw"]})
    store_dir = tmp_path / "store"
    store_dir.mkdir()
    store = FileSystemArtifactStore(store_dir)
    storage = optuna.storages.InMemoryStorage()
    study = optuna.create_study(study_name="t", storage=storage, pruner=space.make_pruner())
    study.optimize(geosearch.objective(space, runs_dir=tmp_path / "runs", artifact_store=store), n_trials=1)
    t = study.trials[0]
    assert t.state == TrialState.COMPLETE and math.isfinite(t.value)
    names = {m.filename for m in get_all_artifact_meta(t, storage=storage)}
    # Rule: the trial's config, metrics and result reach the store given.
    assert {"config.yaml", "metrics.jsonl", "result.json"} <= names
    assert len(list(store_dir.iterdir())) == len(names)


@pytest.mark.slow
def test_a_failing_artifact_store_warns_and_the_trial_stands(monkeypatch, tmp_path):
    use_train(monkeypatch, WritingTrain())

    class Broken(FileSystemArtifactStore):
        def write(self, artifact_id, content_body):
            raise OSError("disk full")

    out = io.StringIO()
    from geosearch.search.study.run import run_search

    outcome = run_search(make_space(), runs_dir=tmp_path / "runs", out=out, progress=False,
                         artifact_store=Broken(tmp_path))
    # Rule: a store that fails costs a warning line, not the trial.
    assert outcome.counts == {"completed": 2}
    assert "were not stored as artifacts (OSError: disk full)" in out.getvalue()


def test_run_search_takes_a_study_sampler_and_pruner(fake, tmp_path):
    class PruneAll(optuna.pruners.BasePruner):
        def prune(self, study, trial):
            return True

    space = make_space()
    study = optuna.create_study(study_name="mine")
    out = search(space, tmp_path, study=study, pruner=PruneAll(), sampler=_grid(space))
    # Rule: the given study is the one run (its name names the run directory) ...
    assert out.study_name == "mine" and out.run_dir == tmp_path / "runs" / "mine"
    assert (out.run_dir / "space.yaml").is_file()
    # ... with the given pruner (it prunes at the first report) and sampler (no queued grid).
    assert {t.state for t in study.trials} == {TrialState.PRUNED}
    assert {t.user_attrs["prune_reason"] for t in study.trials} == {"pruned by PruneAll at step 5"}
    # ... and a prune that is no instability is recorded as pruned, not unstable
    assert {trial_status(t) for t in study.trials} == {"pruned"}
    assert not any(t.user_attrs.get("queued") for t in study.trials)
    assert isinstance(study.sampler, optuna.samplers.GridSampler)


def test_run_search_takes_a_storage_object(fake, tmp_path):
    storage = optuna.storages.InMemoryStorage()
    out = search(make_space(), tmp_path, storage=storage)
    assert out.counts == {"completed": 2} and out.storage == "the given InMemoryStorage"
    # Rule: the trials are in the storage given, not in the run directory.
    assert len(optuna.load_study(study_name="t", storage=storage).trials) == 2
    assert not (tmp_path / "runs/t/study.db").exists()


@pytest.mark.parametrize("kw, key", [
    ({"workers": 2, "sampler": optuna.samplers.RandomSampler()}, "sampler"),
    ({"workers": 2, "storage": optuna.storages.InMemoryStorage()}, "storage"),
    ({"study": "made below", "storage": "sqlite:///x.db"}, "storage"),
])
def test_run_search_refuses_objects_that_cannot_go_together(fake, tmp_path, kw, key):
    if kw.get("study") == "made below":
        kw["study"] = optuna.create_study()
    with pytest.raises(ConfigError) as e:
        search(make_space(), tmp_path, **kw)
    # Rule: the error names the argument at fault.
    assert e.value.key == key


def test_upload_of_a_missing_folder_uploads_nothing(tmp_path):
    study = optuna.create_study()
    trial = study.ask()
    assert upload_trial_files(FileSystemArtifactStore(tmp_path), trial, tmp_path / "none") == []


def test_search_flags_take_optunas_names():
    parser = build_parser()
    ours = parser.parse_args(["search", "--study", "s", "--trials", "3"])
    optunas = parser.parse_args(["search", "--study-name", "s", "--n-trials", "3"])
    # Rule: --study-name and --n-trials are the same flags as --study and --trials.
    assert (optunas.study, optunas.trials) == (ours.study, ours.trials) == ("s", 3)


def test_objective_is_public():
    assert geosearch.objective is geosearch.search.objective
    assert "objective" in geosearch.__all__ and "objective" in geosearch.search.__all__
