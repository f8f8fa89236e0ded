"""Tests of the runs' experiment trackers (geosearch/proxy/trackers.py, ``--log-with``)."""

from __future__ import annotations

import json

import pytest
import yaml

import geosearch.proxy.train as train_mod
from geosearch.assignment import Assignment
from geosearch.cli import main
from geosearch.errors import ConfigError
from geosearch.proxy import trackers as trackers_mod
from geosearch.proxy.config import TrainConfig
from geosearch.proxy.train import train
from geosearch.search.space.spec import apply_overrides

from _search_helpers import make_space, search

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


def test_search_logs_one_run_per_trial_and_seed_in_the_studys_project(monkeypatch, tmp_path):
    opened = []
    real = train_mod.Trackers

    def spy(names, out_dir, **kw):
        opened.append((out_dir, kw["project"], kw["run_name"]))
        return real(names, out_dir, **kw)

    monkeypatch.setattr(train_mod, "Trackers", spy)
    space = make_space({"attn": ["adamw"], "mlp": ["adamw"]}, repeats=2)
    space = apply_overrides(space, [], log_with="tensorboard", trials=1)
    assert space.proxy.log_with == ["tensorboard"]
    search(space, tmp_path)
    trial = tmp_path / "runs/t/trials/0"
    assert opened == [(trial / "seed0", "t", "trial 0 seed 0"), (trial / "seed1", "t", "trial 0 seed 1")]
    for seed in (0, 1):
        assert [s for s, _ in _scalars(trial / f"seed{seed}/tensorboard")["val_loss"]] == [5, 10]


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

    def fake_run_search(space, **kwargs):
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
