"""Tests of the runs' experiment trackers (geosearch/proxy/trackers.py, ``--log-with``)."""

from __future__ import annotations

import importlib.machinery
import io
import json
import sys
import types

import pytest
import yaml

import geosearch.proxy.train as train_mod
from geosearch.assignment import Assignment
from geosearch.cli import main
from geosearch.util.errors import ConfigError
from geosearch.proxy import trackers as trackers_mod
from geosearch.proxy.config import TrainConfig
from geosearch.proxy.train import train
from geosearch.search.space.spec import apply_overrides
from geosearch.search.study.run import run_search

from _search_helpers import make_space

pytestmark = pytest.mark.usefixtures("no_plots")  # no test here checks a plot: tests/_no_plots.py

MIXED = "attn=stiefel,mlp=dgram"
MIXED_A = Assignment.parse(MIXED)


def _events(log_dir):
    """The TensorBoard event files directly in ``log_dir`` (not its sub-directories), read back."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(log_dir))
    events.Reload()
    return events


def _scalars(log_dir) -> dict[str, list[tuple[int, float]]]:
    """Every scalar of the TensorBoard event files in ``log_dir``, read back."""
    events = _events(log_dir)
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)]
            for tag in events.Tags()["scalars"]}


def _hparams_session(log_dir) -> tuple[list[str], dict, str]:
    """The HParams plugin's data in ``log_dir``'s own event files: the experiment's metric
    tags, the session's hyperparameters and its end status."""
    from google.protobuf.json_format import MessageToDict
    from tensorboard.plugins.hparams import api_pb2, metadata

    content = _events(log_dir).PluginTagToContent(metadata.PLUGIN_NAME)
    experiment = metadata.parse_experiment_plugin_data(content[metadata.EXPERIMENT_TAG])
    start = metadata.parse_session_start_info_plugin_data(content[metadata.SESSION_START_INFO_TAG])
    end = metadata.parse_session_end_info_plugin_data(content[metadata.SESSION_END_INFO_TAG])
    return ([m.name.tag for m in experiment.metric_infos],
            {k: MessageToDict(v) for k, v in start.hparams.items()}, api_pb2.Status.Name(end.status))


def _tiny(steps: int = 10, **kw) -> TrainConfig:
    return TrainConfig(model="tiny", steps=steps, batch_size=4, eval_every=5, eval_batches=1,
                       probe_every=5, probe_batch_size=2, device="cpu", **kw)


@pytest.mark.slow
def test_tensorboard_run_holds_the_probes_as_scalars(tmp_path):
    train(_tiny(log_with=["tensorboard"]), Assignment.parse(MIXED), out_dir=tmp_path, project="study",
          run_name="trial 0 seed 0")
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    scalars = _scalars(tmp_path / "tensorboard")
    for key in ("train_loss", "val_loss", "max_logit", "min_entropy", "grad_norm", "lr"):
        assert scalars[key] == [(m["step"], pytest.approx(m[key], rel=1e-6)) for m in records], key
    # Rule: each record's step time, throughput and per-layer max logit, as metrics.jsonl has them
    for key, tag in (("step_ms", "time/step_ms"), ("tokens_per_s", "throughput/tokens_per_s")):
        assert scalars[tag] == [(m["step"], pytest.approx(m[key], rel=1e-6)) for m in records], tag
        assert all(m[key] > 0 for m in records)
    layers = len(records[0]["max_logit_per_layer"])
    assert layers == 2 and {t for t in scalars if t.startswith("max_logit/")} == {"max_logit/layer_0", "max_logit/layer_1"}
    for i in range(layers):
        assert scalars[f"max_logit/layer_{i}"] == [
            (m["step"], pytest.approx(m["max_logit_per_layer"][i], rel=1e-6)) for m in records]
    assert set(records[0]["sigma_max"]) == {"attn_qkv", "attn_out", "mlp_in", "mlp_out"}
    for key in ("sigma_max", "constraint_error"):  # per module type
        for t in records[0][key]:
            assert scalars[f"{key}/{t}"] == [(m["step"], pytest.approx(m[key][t], rel=1e-6)) for m in records]
    hparams = [yaml.safe_load(p.read_text()) for p in (tmp_path / "tensorboard").rglob("hparams.yml")]
    assert len(hparams) == 1 and hparams[0]["run"] == "trial 0 seed 0"
    assert hparams[0]["geometry.attn_qkv"] == "stiefel" and hparams[0]["geometry.mlp_in"] == "dgram"
    assert hparams[0]["mixed_precision"] == "no"
    assert hparams[0]["train.steps"] == 10


def test_tensorboard_hparams_session_holds_the_final_metrics_in_the_runs_own_directory(tmp_path):
    result = train(_tiny(log_with=["tensorboard"]), MIXED_A, out_dir=tmp_path, run_name="trial 0 seed 0")
    log_dir = tmp_path / "tensorboard"
    # Rule: one event directory per run, no timestamped sub-run (Accelerate's add_hparams makes one)
    assert [p.name for p in log_dir.iterdir() if p.is_dir()] == []
    metrics, hparams, end = _hparams_session(log_dir)
    assert hparams["run"] == "trial 0 seed 0" and hparams["geometry.attn_qkv"] == "stiefel"
    assert hparams["train.steps"] == 10 and hparams["status"] == "completed" and end == "STATUS_SUCCESS"
    assert set(metrics) == set(trackers_mod.FINAL)
    # Rule: every metric the experiment lists is a scalar of the same directory, at the last step
    scalars = _scalars(log_dir)
    last = result.history[-1]
    assert scalars["final/val_loss"] == [(10, pytest.approx(result.final_val_loss, rel=1e-6))]
    assert scalars["final/best_val_loss"] == [(10, pytest.approx(result.best_val_loss, rel=1e-6))]
    assert scalars["final/max_logit"] == [(10, pytest.approx(last["max_logit"], rel=1e-6))]
    assert scalars["final/step_ms"] == [(10, pytest.approx(result.mean_step_ms, rel=1e-6))]
    assert scalars["final/tokens_per_s"] == [(10, pytest.approx(result.tokens_per_s, rel=1e-6))]
    assert set(metrics) <= set(scalars)


def test_an_interrupted_run_still_ends_its_tensorboard_session(tmp_path):
    def interrupt(step, metrics):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        train(_tiny(log_with=["tensorboard"]), MIXED_A, callback=interrupt, out_dir=tmp_path)
    # Rule: what it measured before the interrupt, and its status, are readable
    metrics, hparams, end = _hparams_session(tmp_path / "tensorboard")
    assert hparams["status"] == "interrupted" and end == "STATUS_UNKNOWN"
    record = json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[-1])
    scalars = _scalars(tmp_path / "tensorboard")
    assert scalars["final/val_loss"] == [(5, pytest.approx(record["val_loss"], rel=1e-6))]
    assert scalars["final/step"] == [(5, 5.0)]
    assert not (tmp_path / "result.json").exists()


def _fake_mlflow(monkeypatch) -> list[tuple]:
    """An ``mlflow`` module recording the calls Accelerate's MLflowTracker and geosearch
    make (mlflow is not installed); returns the list of calls."""
    calls: list[tuple] = []
    experiments: dict[str, str] = {}
    mlflow = types.ModuleType("mlflow")
    mlflow.__spec__ = importlib.machinery.ModuleSpec("mlflow", None)  # found by check_trackers
    mlflow.utils = types.SimpleNamespace(validation=types.SimpleNamespace(
        MAX_PARAM_VAL_LENGTH=6000, MAX_PARAMS_TAGS_PER_BATCH=100))
    mlflow.set_tracking_uri = lambda uri: calls.append(("set_tracking_uri", uri))
    mlflow.search_experiments = lambda filter_string: [
        types.SimpleNamespace(experiment_id=i) for n, i in experiments.items() if f"'{n}'" in filter_string]

    def create_experiment(name, artifact_location=None, tags=None):
        calls.append(("create_experiment", name, artifact_location))
        experiments[name] = str(len(experiments))
        return experiments[name]

    mlflow.create_experiment = create_experiment
    mlflow.start_run = lambda **kw: calls.append(("start_run", kw["experiment_id"], kw["run_name"]))
    mlflow.log_params = lambda params: calls.append(("log_params", params))
    mlflow.log_metrics = lambda metrics, step=None: calls.append(("log_metrics", step, metrics))
    mlflow.end_run = lambda status="FINISHED": calls.append(("end_run", status))
    monkeypatch.setitem(sys.modules, "mlflow", mlflow)
    return calls


@pytest.mark.slow
def test_mlflow_store_is_a_sqlite_file_in_the_run_directory(monkeypatch, tmp_path):
    calls = _fake_mlflow(monkeypatch)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.chdir(tmp_path)
    run = tmp_path / "run"
    result = train(_tiny(log_with="mlflow"), MIXED_A, out_dir=run, project="study", run_name="trial 0 seed 0")
    # Rule: MLflow's store and artifacts under the run directory, not the working directory's mlflow.db
    assert calls[0] == ("set_tracking_uri", f"sqlite:///{run.resolve().as_posix()}/mlflow.db")
    assert calls[1] == ("create_experiment", "study", str(run.resolve() / "mlartifacts"))
    assert calls[2] == ("start_run", "0", "trial 0 seed 0")
    logged = {step: m for name, step, m in (c for c in calls if c[0] == "log_metrics")}
    assert logged[5]["time/step_ms"] > 0 and "max_logit/layer_1" in logged[5]
    assert logged[10]["final/val_loss"] == pytest.approx(result.final_val_loss)
    assert ("log_params", {"status": "completed"}) in calls and calls[-1] == ("end_run", "FINISHED")
    # Rule: a search's runs share one store, in the study's directory
    calls.clear()
    train(_tiny(steps=2, log_with="mlflow"), MIXED_A, out_dir=tmp_path / "study/trials/0", project="study",
          run_name="trial 0 seed 0", store_dir=tmp_path / "study")
    assert calls[0] == ("set_tracking_uri", f"sqlite:///{(tmp_path / 'study').resolve().as_posix()}/mlflow.db")


def test_mlflow_tracking_uri_the_user_set_is_kept(monkeypatch, tmp_path):
    calls = _fake_mlflow(monkeypatch)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://localhost:5000")

    def interrupt(step, metrics):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        train(_tiny(log_with="mlflow"), MIXED_A, callback=interrupt, out_dir=tmp_path, project="p")
    # Rule: the user's store (MLflow reads the variable), its own artifact location; a run cut
    # short ends KILLED
    assert not any(c[0] == "set_tracking_uri" for c in calls)
    assert ("create_experiment", "p", None) in calls and calls[-1] == ("end_run", "KILLED")


@pytest.mark.slow
def test_search_logs_one_run_per_trial_and_seed_in_the_studys_project(monkeypatch, tmp_path):
    opened = []
    real = train_mod.Trackers

    def spy(names, out_dir, **kw):
        opened.append((out_dir, kw["project"], kw["run_name"], kw["store_dir"]))
        return real(names, out_dir, **kw)

    monkeypatch.setattr(train_mod, "Trackers", spy)
    space = make_space({"attn": ["adamw"], "mlp": ["adamw"]}, repeats=2)
    space = apply_overrides(space, [], log_with="tensorboard", trials=1)
    assert space.proxy.log_with == ["tensorboard"]
    out = io.StringIO()
    run_search(space, runs_dir=tmp_path / "runs", out=out, progress=False)
    # Rule: the terminal gets one line per tracker, once a search, saying where its runs are
    trials = (tmp_path / "runs/t/trials").as_posix()
    assert [ln for ln in out.getvalue().splitlines() if "tensorboard" in ln] == [
        f"tensorboard: events under {trials}/ (view: tensorboard --logdir {trials})"]
    trial = tmp_path / "runs/t/trials/0"
    study = tmp_path / "runs/t"  # MLflow's store: the study's directory
    assert opened == [(trial / "seed0", "t", "trial 0 seed 0", study), (trial / "seed1", "t", "trial 0 seed 1", study)]
    for seed in (0, 1):
        assert [s for s, _ in _scalars(trial / f"seed{seed}/tensorboard")["val_loss"]] == [5, 10]


def test_one_line_per_tracker_says_where_its_runs_are(tmp_path, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    lines = trackers_mod.tracker_lines(["tensorboard", "mlflow", "wandb", "comet_ml"], "r/trials",
                                       project="s", store_dir=tmp_path)
    uri = f"sqlite:///{(tmp_path / 'mlflow.db').resolve().as_posix()}"
    assert lines == [
        "tensorboard: events under r/trials/ (view: tensorboard --logdir r/trials)",
        f"mlflow: experiment s in {uri} (view: mlflow ui --backend-store-uri {uri})",
        "wandb: project s, offline; files under r/trials/ (upload: wandb sync DIR)",
        "comet_ml: project s; files under r/trials/"]
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://mlflow:5000")  # the user's store is named
    assert trackers_mod.tracker_lines(["mlflow"], "r", project="s", store_dir=tmp_path) == [
        "mlflow: experiment s in http://mlflow:5000 (view: mlflow ui --backend-store-uri "
        "http://mlflow:5000)"]
    assert trackers_mod.tracker_lines([], "r", project="s", store_dir=tmp_path) == []


@pytest.mark.slow
def test_train_prints_one_line_per_tracker_and_nothing_of_its_own(tmp_path, capsys):
    out = tmp_path / "run"
    code = main(["train", "--model", "tiny", "--assign", MIXED, "--device", "cpu", "--quiet",
                 "--steps", "2", "--eval-every", "1", "--log-with", "tensorboard",
                 "--out", str(out)])
    captured = capsys.readouterr()
    # Rule: the terminal gets one line for TensorBoard (where, how to view), then the summary
    lines = [ln for ln in (captured.err + captured.out).splitlines() if "tensorboard" in ln.lower()]
    assert code == 0 and lines == [f"tensorboard: events under {out.as_posix()}/ (view: "
                                   f"tensorboard --logdir {out.as_posix()})"]
    assert any((out / "tensorboard").iterdir())


def test_unknown_or_missing_trackers_are_refused_before_training(monkeypatch):
    with pytest.raises(ConfigError, match=r"log_with: unknown tracker 'tensorbord'.*tensorboard"):
        train(TrainConfig(model="tiny", steps=2, device="cpu", log_with="tensorbord"), MIXED_A)
    # Rule: the search names its own key (its preflight checks before any trial)
    with pytest.raises(ConfigError, match=r"^s.yaml: proxy.log_with: unknown tracker 'x'; expected one of: .*tensorboard"):
        trackers_mod.check_trackers(["x"], source="s.yaml", key="proxy.log_with")
    monkeypatch.setattr(trackers_mod.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ConfigError, match=r"log_with: tracker 'wandb' needs the package wandb"):
        trackers_mod.check_trackers(["wandb"])


def test_cli_log_with_needs_a_run_directory(capsys):
    code = main(["train", "--model", "tiny", "--assign", MIXED, "--device", "cpu", "--quiet",
                 "--log-with", "tensorboard"])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1 and "--log-with" in err and "--out" in err


def test_search_tracker_error_names_the_flag_or_the_space_files_key(tmp_path, capsys):
    space = tmp_path / "s.yaml"
    space.write_text(yaml.safe_dump({
        "version": 1, "geometries": {"attn": ["adamw"], "mlp": ["adamw"]}, "baselines": [],
        "proxy": {"model": "tiny", "steps": 2, "device": "cpu", "log_with": "nosuch"}}))
    runs = tmp_path / "runs"
    # Rule: what the user typed is named: the flag, else the file and its key; before any study
    for flag, where in ((["--log-with", "tensorbord"], "--log-with: unknown tracker 'tensorbord'"),
                        ([], f"{space}: proxy.log_with: unknown tracker 'nosuch'")):
        code = main(["search", "--space", str(space), "--runs-dir", str(runs), *flag])
        err = capsys.readouterr().err.strip().splitlines()
        assert code == 2 and len(err) == 1 and err[0].startswith(f"geosearch search: error: {where}; expected one of"), err
    assert not runs.exists()


def test_search_takes_the_training_flags(monkeypatch):
    import geosearch.search.study.run

    seen = {}

    class Stop(Exception):
        pass

    def fake_run_search(space, options=None, /, **kwargs):
        seen["proxy"] = space.proxy
        raise Stop

    monkeypatch.setattr(geosearch.search.study.run, "run_search", fake_run_search)
    with pytest.raises(Stop):
        main(["search", "--mixed-precision", "bf16", "--grad-accum", "2", "--compile",
              "--log-with", "tensorboard"])
    # Rule: each flag sets the proxy field of the same name; unset ones keep the space's.
    proxy = seen["proxy"]
    assert (proxy.mixed_precision, proxy.grad_accum, proxy.compile, proxy.log_with) == \
        ("bf16", 2, True, ["tensorboard"])
    with pytest.raises(Stop):
        main(["search"])
    assert (seen["proxy"].mixed_precision, seen["proxy"].grad_accum, seen["proxy"].compile,
            seen["proxy"].log_with) == (None, 1, False, [])


@pytest.mark.slow
def test_sigterm_of_train_ends_its_tensorboard_session_and_says_what_a_rerun_does(tmp_path):
    import os
    import signal
    import subprocess
    import time

    out = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "-m", "geosearch", "train", "--assign", "attn=adamw,mlp=adamw",
         "--model", "tiny",
         "--device", "cpu", "--steps", "100000", "--batch-size", "2", "--eval-every", "5",
         "--log-with", "tensorboard", "--out", str(out), "--quiet"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"})
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not (out / "metrics.jsonl").is_file():
        time.sleep(0.2)
    time.sleep(0.5)
    proc.send_signal(signal.SIGTERM)  # what timeout, SLURM and docker stop send
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130 and err.strip().splitlines()[-1] == (
        "geosearch train: interrupted; train does not resume: rerunning the same command trains "
        "from step 0")
    metrics, hparams, end = _hparams_session(out / "tensorboard")
    assert hparams["status"] == "interrupted" and end == "STATUS_UNKNOWN"
    assert "final/val_loss" in metrics


@pytest.mark.slow
def test_what_a_tracker_prints_goes_to_the_runs_trackers_log(monkeypatch, tmp_path, capfd):
    import os

    calls = _fake_mlflow(monkeypatch)
    start_run, end_run = sys.modules["mlflow"].start_run, sys.modules["mlflow"].end_run

    def loud_start(**kw):  # as alembic's INFO lines of a new store, and wandb's banner
        print("INFO  [alembic.runtime.migration] Context impl SQLiteImpl.")
        os.write(2, b"wandb: Tracking run with wandb version 0.19\n")
        return start_run(**kw)

    def loud_end(status="FINISHED"):
        print("View run trial 0 seed 0")
        return end_run(status)

    monkeypatch.setattr(sys.modules["mlflow"], "start_run", loud_start)
    monkeypatch.setattr(sys.modules["mlflow"], "end_run", loud_end)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    run = tmp_path / "run"
    train(_tiny(steps=2, log_with="mlflow"), MIXED_A, out_dir=run, project="s",
          run_name="trial 0 seed 0")
    terminal = capfd.readouterr()
    shown = terminal.out + terminal.err
    assert "alembic" not in shown and "wandb" not in shown
    log = (run / trackers_mod.TRACKERS_LOG).read_text()
    assert "Context impl SQLiteImpl" in log and "wandb: Tracking run" in log and "View run" in log
    assert calls[-1] == ("end_run", "FINISHED")
