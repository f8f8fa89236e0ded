"""Tests of the proxy trainer (geosearch/proxy/train.py) and ``geosearch train``.

Every run here is the ``tiny`` preset (2 layers, width 32, context 32) on CPU for a few
dozen steps, so the file takes well under a minute on two cores.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import yaml

import geosearch.proxy.train as train_mod
import geosearch.models.zoo as zoo_mod
from geosearch.assignment import Assignment
from geosearch.cli import main
from geosearch.util.errors import ConfigError, SettingsError
from geosearch.proxy.accelerator import get_accelerator
from geosearch.proxy.config import TrainConfig, TrainResult
from geosearch.proxy.train import train

REPO = Path(__file__).resolve().parents[2]
MIXED = "attn=stiefel,mlp=dgram"
METRIC_KEYS = {
    "step", "train_loss", "val_loss", "grad_norm", "lr", "step_ms", "tokens_per_s",
    "max_logit", "max_logit_per_layer", "max_logit_per_head", "min_entropy", "mean_entropy",
    "sigma_max",
    "constraint_error", "dual_residual",
}


def tiny(**kw) -> TrainConfig:
    base = dict(model="tiny", steps=40, batch_size=8, eval_every=20, eval_batches=2,
                probe_every=10, probe_batch_size=4, lr=3e-3, device="cpu", seed=0)
    return TrainConfig(**{**base, **kw})


@pytest.fixture(scope="module")
def mixed_run(tmp_path_factory) -> tuple[TrainResult, Path]:
    out = tmp_path_factory.mktemp("run")
    return train(tiny(), Assignment.parse(MIXED), out_dir=out), out


# --------------------------------------------------------------------------- one run
@pytest.mark.slow
def test_tiny_run_completes_and_lowers_the_loss(mixed_run):
    result, _ = mixed_run
    assert result.status == "completed" and result.reason is None and result.stop_step is None
    # the loss starts near ln(256) ≈ 5.55 (uniform prediction of bytes): 40 steps must
    # get the validation loss clearly below it, and the training loss must fall
    assert result.final_val_loss < math.log(256) - 1.0
    assert result.history[-1]["train_loss"] < result.history[0]["train_loss"]
    assert result.best_val_loss <= result.final_val_loss
    assert result.mean_step_ms > 0 and result.tokens_per_s > 0


@pytest.mark.slow
def test_records_at_eval_and_probe_steps_with_the_contract_keys(mixed_run):
    result, _ = mixed_run
    # probe_every=10, eval_every=20, steps=40: records at 10, 20, 30, 40
    assert [m["step"] for m in result.history] == [10, 20, 30, 40]
    for m in result.history:
        assert set(m) == METRIC_KEYS
        assert (m["val_loss"] is not None) == (m["step"] % 20 == 0)  # eval steps only
        assert m["max_logit"] == max(m["max_logit_per_layer"])  # probe on every record here
        assert len(m["max_logit_per_layer"]) == 2  # one per layer
        assert m["min_entropy"] <= m["mean_entropy"]
        # the hidden weights were placed on Stiefel (attention) and DGram (MLP): the
        # constraint errors stay small; attention σ_max is 1 on Stiefel
        assert set(m["sigma_max"]) == {"attn_qkv", "attn_out", "mlp_in", "mlp_out"}
        assert max(m["constraint_error"].values()) < 1e-2
        assert m["sigma_max"]["attn_qkv"] == pytest.approx(1.0, abs=1e-2)
    assert [m["step"] for m in result.probe_history] == [10, 20, 30, 40]


def test_run_directory_records_what_produced_it(mixed_run):
    result, out = mixed_run
    lines = (out / "metrics.jsonl").read_text().splitlines()
    # one JSON object per record, equal to the in-memory history
    assert [json.loads(line) for line in lines] == json.loads(json.dumps(result.history))
    config = yaml.safe_load((out / "config.yaml").read_text())
    assert config["num_processes"] == 1 and config["seed"] == 0
    assert config["train"]["steps"] == 40 and config["train"]["warmup_steps"] == 4  # 10%
    assert config["model_config"]["n_layer"] == 2
    assert config["geometry"]["attn_qkv"] == "stiefel" and config["geometry"]["mlp_in"] == "dgram"
    assert Assignment.from_dict(config["assignment"]).resolve() == Assignment.parse(MIXED).resolve()
    assert set(config["versions"]) >= {"geosearch", "torch", "accelerate", "optuna"}
    assert config["device"] == "cpu" and config["hostname"] and config["date"]
    assert config == json.loads(json.dumps(result.config))  # the result carries the same
    saved = json.loads((out / "result.json").read_text())
    assert saved["status"] == "completed" and saved["final_val_loss"] == result.final_val_loss


@pytest.mark.slow
def test_same_seed_same_losses():
    # seeded init and batches: a rerun reproduces the losses exactly
    a = train(tiny(steps=10), Assignment.parse(MIXED))
    b = train(tiny(steps=10), Assignment.parse(MIXED))
    assert [m["train_loss"] for m in a.history] == [m["train_loss"] for m in b.history]
    assert a.final_val_loss == b.final_val_loss


# --------------------------------------------------------------------------- probes
@pytest.mark.slow
def test_probed_max_logit_equals_a_recomputation_from_q_and_k(monkeypatch):
    """max_logit_per_layer equals max over heads, causal (i, j) of q_i·k_j/√hs on the probe batch."""
    models, inputs, checked = [], {}, []
    original_gpt = zoo_mod.GPT  # build_model makes the presets with the zoo's GPT

    def gpt_with_hooks(config):
        model = original_gpt(config)
        for i, block in enumerate(model.transformer.h):
            def keep_input(module, args, i=i):
                if module.record_qk:  # the probe forward, not training or evaluation
                    inputs[i] = args[0].detach().clone()
            block.attn.register_forward_pre_hook(keep_input)
        models.append(model)
        return model

    def recompute(step, metrics):
        model = models[-1]  # the one trained (a meta-device copy is built first, to size it)
        expected, expected_entropy = [], []
        for i, block in enumerate(model.transformer.h):
            x = inputs[i]  # (B, T, C), the attention input of the probe batch
            B, T, C = x.shape
            nh = block.attn.n_head
            q, k, _ = block.attn.c_attn(x).split(C, dim=2)
            q = q.view(B, T, nh, C // nh).transpose(1, 2)  # (B, nh, T, hs)
            k = k.view(B, T, nh, C // nh).transpose(1, 2)
            logits = q @ k.transpose(-2, -1) / math.sqrt(C // nh)  # (B, nh, T, T)
            causal = torch.ones(T, T, dtype=torch.bool).tril()
            expected.append(logits.masked_fill(~causal, -math.inf).amax().item())
            # entropy of each softmax row; a head's entropy is its mean over rows 1..T-1
            # (row 0 sees one key) and the batch; min_entropy is the lowest head
            p = logits.masked_fill(~causal, -math.inf).softmax(-1)
            entropy = -(p * p.clamp_min(1e-30).log()).sum(-1)  # (B, nh, T)
            expected_entropy.append(entropy[..., 1:].mean(dim=(0, 2)).min().item())
        assert metrics["max_logit_per_layer"] == pytest.approx(expected, rel=1e-5, abs=1e-6)
        assert metrics["max_logit"] == pytest.approx(max(expected), rel=1e-5)
        assert metrics["min_entropy"] == pytest.approx(min(expected_entropy), rel=1e-4, abs=1e-6)
        checked.append(step)

    monkeypatch.setattr(zoo_mod, "GPT", gpt_with_hooks)
    # a large AdamW lr so the logits move well away from their tiny initial values
    result = train(tiny(steps=20, eval_every=20, lr=1e-2), Assignment.parse("attn=adamw,mlp=adamw"),
                   callback=recompute)
    assert result.status == "completed", result.reason
    assert checked == [10, 20]  # the check ran at every probe step


@pytest.mark.slow
def test_dual_solver_reports_its_residual():
    # the project solver has no residual (None); the dual solver's is a finite float
    result = train(tiny(steps=10, solver="dual", optimizer_args={"dual_steps": 3}),
                   Assignment.parse(MIXED))
    assert result.status == "completed", result.reason
    residual = result.history[-1]["dual_residual"]
    assert isinstance(residual, float) and math.isfinite(residual) and residual >= 0
    assert result.config["train"]["optimizer_args"] == {"dual_steps": 3}


# --------------------------------------------------------------------------- stopping
def test_non_finite_loss_ends_unstable_without_raising(tmp_path):
    # AdamW at lr 1e6 with weight decay multiplies the matrices by (1 - lr·wd) = -99999
    # per step: the loss overflows to inf/NaN within a few steps
    config = tiny(steps=40, lr=1e6, warmup_steps=0)
    result = train(config, Assignment.parse("attn=adamw,mlp=adamw"), out_dir=tmp_path)
    assert result.status == "unstable"
    assert "non-finite" in result.reason
    assert 1 <= result.stop_step < 40
    last = result.history[-1]  # the step that went non-finite is recorded
    assert last["step"] == result.stop_step and not math.isfinite(last["train_loss"]
                                                                   * last["grad_norm"])
    saved = json.loads((tmp_path / "result.json").read_text())
    assert saved["status"] == "unstable" and saved["stop_step"] == result.stop_step


@pytest.mark.slow
def test_callback_sees_every_record_and_can_stop_the_run():
    seen = []

    def stop_at_20(step, metrics):
        seen.append(step)
        return "enough at 20" if step == 20 else None

    result = train(tiny(steps=40), Assignment.parse(MIXED), callback=stop_at_20)
    assert seen == [10, 20]  # called after each record, and no more once stopped
    assert result.status == "unstable" and result.reason == "enough at 20"
    assert result.stop_step == 20 and result.history[-1]["step"] == 20


@pytest.mark.slow
def test_an_error_in_the_loop_ends_failed_but_ctrl_c_propagates(monkeypatch, tmp_path):
    def broken(*args, **kwargs):
        raise RuntimeError("probe broke")

    monkeypatch.setattr(train_mod.WeightProbe, "measure", broken)
    result = train(tiny(steps=20), Assignment.parse(MIXED), out_dir=tmp_path)
    assert result.status == "failed" and result.reason == "RuntimeError: probe broke"
    assert result.stop_step == 10  # the first probe step
    assert "probe broke" in (tmp_path / "traceback.txt").read_text()

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(train_mod.WeightProbe, "measure", interrupted)
    with pytest.raises(KeyboardInterrupt):
        train(tiny(steps=20), Assignment.parse(MIXED))


@pytest.mark.slow
def test_an_exception_of_the_callback_propagates():
    # the caller's exceptions (e.g. optuna.TrialPruned) are not the run's failure
    class Pruned(Exception):
        pass

    def prune(step, metrics):
        raise Pruned(f"pruned at {step}")

    with pytest.raises(Pruned, match="pruned at 10"):
        train(tiny(steps=20), Assignment.parse(MIXED), callback=prune)


# --------------------------------------------------------------------------- schedule
@pytest.mark.slow
def test_one_schedule_scales_adamw_and_spectral_groups_alike(monkeypatch):
    """Every group's lr is its peak × (warmup, then cosine to min_lr_ratio)."""
    optimizers = []
    real_build = train_mod.optimizer_from_plan

    def keep(*args, **kwargs):
        optimizers.append(real_build(*args, **kwargs))
        return optimizers[-1]

    ratios = []

    def look(step, metrics):
        groups = optimizers[0].param_groups
        ratios.append({g["geometry"] if isinstance(g["geometry"], str) else "split":
                       g["lr"] / g["initial_lr"] for g in groups})

    monkeypatch.setattr(train_mod, "optimizer_from_plan", keep)
    config = tiny(steps=20, probe_every=5, eval_every=20, warmup_steps=5, min_lr_ratio=0.1)
    result = train(config, Assignment.parse(MIXED), callback=look)
    peaks = {g["geometry"]: g["initial_lr"] for g in optimizers[0].param_groups}
    assert peaks["adamw"] == pytest.approx(3e-3) and peaks["stiefel"] == pytest.approx(0.02)
    for r in ratios:  # one multiplier for every group
        assert max(r.values()) == pytest.approx(min(r.values()))
    # after 5 steps warmup is done (factor 1); after 20 the cosine reached min_lr_ratio
    assert ratios[0]["adamw"] == pytest.approx(1.0) and ratios[-1]["adamw"] == pytest.approx(0.1)
    # the recorded lr is the AdamW lr of the step: 3e-3·(s+1)/5 in warmup
    assert result.history[0]["lr"] == pytest.approx(3e-3 * 1.0)  # step 5 used factor(4) = 1


# --------------------------------------------------------------------------- processes
TWO_RANKS = textwrap.dedent("""
    import json, sys
    from geosearch.assignment import Assignment
    from geosearch.util.errors import ConfigError
    from geosearch.proxy.config import TrainConfig
    from geosearch.proxy.train import train
    config = TrainConfig(**json.loads(sys.argv[1]))
    try:  # a global batch of 7 does not split over 2 ranks
        train(TrainConfig(**{**json.loads(sys.argv[1]), "batch_size": 7}), Assignment.parse(sys.argv[2]))
        sys.exit("batch 7 over 2 ranks was accepted")
    except ConfigError as e:
        assert "batch_size" in str(e) and "2 processes" in str(e), e
    result = train(config, Assignment.parse(sys.argv[2]), out_dir=sys.argv[3])
    if result.config["num_processes"] != 2:
        sys.exit("expected 2 processes")
""")


@pytest.mark.slow
def test_two_gloo_processes_match_one_process(tmp_path):
    """Same global batch and seed: 2 ranks (each half the batch) give 1 rank's losses."""
    fields = dict(model="tiny", steps=6, batch_size=8, eval_every=3, eval_batches=2,
                  probe_every=3, lr=3e-3, device="cpu")
    script = tmp_path / "two_ranks.py"
    script.write_text(TWO_RANKS)
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
         str(script), json.dumps(fields), MIXED, str(tmp_path / "out")],
        env=env, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[:3000] + "\n...\n" + proc.stderr[-2000:]
    two = [json.loads(line) for line in (tmp_path / "out/metrics.jsonl").read_text().splitlines()]
    assert yaml.safe_load((tmp_path / "out/config.yaml").read_text())["num_processes"] == 2

    one = train(TrainConfig(**fields), Assignment.parse(MIXED)).history
    assert [m["step"] for m in two] == [m["step"] for m in one] == [3, 6]
    for a, b in zip(one, two):
        # equal up to float summation order (measured: ~5e-7)
        assert b["train_loss"] == pytest.approx(a["train_loss"], abs=2e-5)
        assert b["val_loss"] == pytest.approx(a["val_loss"], abs=2e-5)
        assert b["max_logit"] == pytest.approx(a["max_logit"], rel=2e-5)


# --------------------------------------------------------------------------- CLI
@pytest.mark.slow
def test_cli_train_writes_its_files_and_exits_0(tmp_path, capsys):
    out = tmp_path / "cli"
    code = main(["train", "--model", "tiny", "--assign", MIXED, "--steps", "10",
                 "--batch-size", "8", "--eval-every", "5", "--probe-every", "5", "--device", "cpu",
                 "--model-arg", "n_layer=1", "--out", str(out)])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert "status      completed" in captured.out and "ms/step" in captured.out
    # stderr is not a terminal here: progress is one log line per evaluation
    assert [line.split(":")[0] for line in captured.err.splitlines() if line.startswith("step ")] \
        == ["step 5", "step 10"]
    assert len((out / "metrics.jsonl").read_text().splitlines()) == 2
    config = yaml.safe_load((out / "config.yaml").read_text())
    assert config["model_config"]["n_layer"] == 1 and config["train"]["steps"] == 10


def test_cli_unstable_run_exits_1_with_the_summary(tmp_path, capsys):
    code = main(["train", "--model", "tiny", "--assign", "attn=adamw,mlp=adamw", "--steps", "30",
                 "--lr", "1e6", "--device", "cpu", "--quiet"])
    assert code == 1
    assert "status      unstable at step" in capsys.readouterr().out


@pytest.mark.parametrize("argv, where", [
    (["--assign", "attn=stiefle"], "stiefle"),
    (["--assign", MIXED, "--model-arg", "n_layer"], "--model-arg"),
    (["--assign", MIXED, "--mixed-precision", "fp8"], "mixed_precision"),
])
def test_cli_bad_input_is_one_line_and_exit_2(argv, where, capsys):
    code = main(["train", "--model", "tiny", "--device", "cpu", "--quiet", *argv])
    err = capsys.readouterr().err
    assert code == 2
    assert len(err.strip().splitlines()) == 1 and where in err


USER_MODEL = REPO / "tests" / "_user_model.py"


@pytest.mark.slow
@pytest.mark.parametrize("fields, expected", [
    ({"batch_size": 4, "grad_accum": 3}, "TrainConfig: grad_accum: global batch 4 does not split over 1 process x 3"),
    ({"log_with": "nosuchtracker"}, "TrainConfig: log_with: unknown tracker 'nosuchtracker'"),
    ({"data": "no/such/corpus.txt"}, "no/such/corpus.txt: no such file or directory"),
    ({"model": f"py:{USER_MODEL}:ignores_vocab"}, "TrainConfig: model: model 'py:"),
])
def test_settings_every_run_would_fail_on_are_refused_before_training(fields, expected, monkeypatch):
    # Rule: what fails whatever the assignment is a SettingsError, raised before step 1 (the
    # search stops on one instead of failing each trial).
    monkeypatch.setattr(train_mod._Run, "run", lambda *a, **k: pytest.fail("it trained"))
    with pytest.raises(SettingsError) as e:
        train(tiny(**fields), Assignment.parse(MIXED))
    assert str(e.value).startswith(expected), e.value
    if "model" in fields:  # a py: factory's logits must be the data's vocabulary
        assert "returned logits of shape (2, 128, 100), expected (2, 128, 256)" in str(e.value)


def test_a_setting_the_assignment_does_not_fit_is_not_a_settings_error():
    # Rule: QK-clip refuses constrained attention: the assignment's failure, not the run's.
    with pytest.raises(ConfigError) as e:
        train(tiny(qk_clip=100.0), Assignment.parse(MIXED))
    assert not isinstance(e.value, SettingsError)


# --------------------------------------------------------------------------- knobs
def _first_step_weights(**kw) -> dict[str, torch.Tensor]:
    """The weights after one optimizer step of a tiny run."""
    config = tiny(steps=1, eval_every=1, probe_every=1, **kw).resolved()
    run = train_mod._Run(config, Assignment.parse(MIXED), get_accelerator("cpu"), None)
    assert run.run(None, False).status == "completed"
    return {k: v.detach().clone() for k, v in run.raw_model.state_dict().items()}


def test_grad_accum_takes_the_same_step_as_the_whole_batch(monkeypatch):
    rows = []  # the batch rows of every loss the trainer computes
    lm_loss = train_mod.lm_loss
    monkeypatch.setattr(train_mod, "lm_loss", lambda m, x, y: rows.append(len(x)) or lm_loss(m, x, y))
    whole = _first_step_weights()
    assert rows[0] == 8
    rows.clear()
    split = _first_step_weights(grad_accum=2)
    assert rows[:2] == [4, 4]  # the step's batch of 8 went through in two micro-batches
    before = train_mod._Run(tiny(steps=1).resolved(), Assignment.parse(MIXED),
                            get_accelerator("cpu"), None).raw_model.state_dict()
    moved = [k for k in whole if not torch.equal(whole[k], before[k])]
    assert len(moved) > len(whole) // 2  # the step moved the weights...
    for k in whole:  # ...and two micro-batches of 4 move them as one batch of 8 does
        torch.testing.assert_close(split[k], whole[k], rtol=1e-5, atol=2e-6, msg=k)


@pytest.mark.slow
def test_grad_accum_run_lowers_the_loss():
    result = train(tiny(grad_accum=2), Assignment.parse(MIXED))
    assert result.status == "completed"
    assert result.history[-1]["train_loss"] < result.history[0]["train_loss"] - 0.3
    # the key to change is grad_accum (the batch is what a search measures), with its values
    with pytest.raises(SettingsError, match=r"grad_accum: .*3 micro-batches; expected one of: 1, 2, 4, 8$"):
        train(tiny(grad_accum=3), Assignment.parse(MIXED))


@pytest.mark.slow
def test_compile_flag_compiles_the_training_model(monkeypatch):
    compiled = []

    def compile_eager(model, **kw):
        # The eager backend: Dynamo captures the graphs, no C++ code generation (Inductor
        # takes about a minute for a 1-layer model on a 2-core CPU).
        compiled.append(model)
        return torch_compile(model, backend="eager", **kw)

    torch_compile = torch.compile
    monkeypatch.setattr(torch, "compile", compile_eager)
    cfg = dict(steps=4, eval_every=2, probe_every=2, model_args={"n_layer": 1})
    plain_run = train(tiny(**cfg), Assignment.parse(MIXED))
    assert not compiled  # off by default
    compiled_run = train(tiny(compile=True, **cfg), Assignment.parse(MIXED))
    assert len(compiled) == 1 and compiled_run.status == "completed"
    for a, b in zip(plain_run.history, compiled_run.history):
        assert b["train_loss"] == pytest.approx(a["train_loss"], abs=1e-5)
