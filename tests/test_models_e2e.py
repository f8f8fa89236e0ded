"""Hugging Face GPT-2 and LLaMA through the whole tool: ``inspect``, ``search`` (two trials,
exported assignment), ``train``; each on a tiny configuration (2 layers, width 32, context
32, 10 steps of batch 4) on CPU, in-process.
"""

from __future__ import annotations

import json
import math

import pytest
import torch
import yaml

pytest.importorskip("transformers", reason="Hugging Face transformers is not installed (pip install 'geosearch[hf]')")

from geosearch.assignment import load_assignment  # noqa: E402
from geosearch.cli import main  # noqa: E402
from geosearch.modules import get_rule_set, match_parameters, module_types  # noqa: E402
from geosearch.optim import build_optimizer  # noqa: E402
from geosearch.proxy.zoo import build_model, lm_loss  # noqa: E402

T = 32
TINY = {  # model_args of each family: 2 layers, width 32, context 32
    "hf:gpt2": {"n_layer": 2, "n_embd": 32, "n_head": 2, "block_size": T},
    "hf:llama": {"num_hidden_layers": 2, "hidden_size": 32, "num_attention_heads": 2,
                 "num_key_value_heads": 1, "intermediate_size": 64, "block_size": T},
}
RULES = {"hf:gpt2": "gpt2", "hf:llama": "llama"}
RUN = {"batch_size": 4, "eval_every": 5, "probe_every": 5, "eval_batches": 1, "probe_batch_size": 2,
       "device": "cpu"}


def model_args_flags(spec: str) -> list[str]:
    return [a for k, v in TINY[spec].items() for a in ("--model-arg", f"{k}={v}")]


def built(spec: str):
    return build_model(spec, vocab_size=256, model_args=TINY[spec])


# --------------------------------------------------------------------------- inspect
@pytest.mark.parametrize("spec", ["hf:gpt2", "hf:llama"])
def test_inspect_gives_every_hidden_weight_a_module_type(spec, capsys):
    assert main(["inspect", "--model", spec, *model_args_flags(spec)]) == 0
    out, err = capsys.readouterr()
    rows = {line.split()[0]: line.split()[2] for line in out.splitlines()
            if line.split() and "." in line.split()[0] and len(line.split()) >= 3}
    model = built(spec).model
    match = match_parameters(model, RULES[spec])
    hidden = [m.name for m in match.matched]
    # Rule: every hidden 2-D weight (not embedding or head) is listed with its module type
    # from the family's rule set, and no 2-D weight is left unmatched (no warning).
    assert hidden and not match.unmatched_hidden and "matches no rule" not in err
    types = set(module_types(get_rule_set(RULES[spec])))
    assert all(rows[name] in types for name in hidden), out
    assert {rows[name] for name in hidden} == types  # every type of the rule set occurs
    # Rule: the output names the rule set used and the registered rule sets that fit.
    assert f"module types by rule set {RULES[spec]!r} (the model's)" in out
    fit = next(line for line in out.splitlines() if line.startswith("rule sets that fit this model:"))
    assert RULES[spec] in fit.split(": ")[1].split(", ")


# --------------------------------------------------------------------------- search
@pytest.mark.parametrize("spec", ["hf:gpt2", "hf:llama"])
def test_two_trial_search_exports_an_assignment_that_builds_for_the_model(spec, tmp_path, capsys, monkeypatch):
    import geosearch.cli

    # the report and its plots take longer than the search itself; tests/test_report.py has them
    monkeypatch.setattr(geosearch.cli, "_report_after_search", lambda *args: None)
    # A space written for the proxy preset, with no rules: --model and the model_args
    # override move it to the Hugging Face model, whose rule set it then takes.
    space = tmp_path / "s.yaml"
    space.write_text(yaml.safe_dump({
        "version": 1, "geometries": {"attn": ["stiefel", "dgram"], "mlp": ["stiefel"]},
        "proxy": {"model": "tiny", "steps": 10, **RUN}}), encoding="utf-8")
    runs = tmp_path / "runs"
    rc = main(["search", "--space", str(space), "--runs-dir", str(runs), "--study", "s", "--model", spec,
               "--set", "proxy.model_args=" + json.dumps(TINY[spec])])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert out.count("\ntrial ") + out.startswith("trial ") == 2  # two assignments, two trials
    assignment = load_assignment(runs / "s" / "best_assignment.yaml")
    # Rule: the exported assignment carries the model's rule set and its module types.
    assert assignment.rules == RULES[spec]
    resolved = assignment.resolve()
    assert set(resolved) == set(module_types(get_rule_set(RULES[spec])))
    assert {g for t, g in resolved.items() if t.startswith("mlp")} == {"stiefel"}
    # Rule: it builds an optimizer for a fresh model of the same spec, which then trains.
    torch.manual_seed(0)
    model = built(spec).model
    opt = build_optimizer(model, assignment, verbose=False)
    geometries = {g["geometry"] for g in opt.param_groups}
    assert "stiefel" in geometries
    x = torch.randint(0, 256, (2, T))
    loss = lm_loss(model, x[:, :-1], x[:, 1:])
    loss.backward()
    opt.step()
    assert math.isfinite(lm_loss(model, x[:, :-1], x[:, 1:]).item())


# --------------------------------------------------------------------------- train
def test_train_hf_llama_writes_metrics_with_finite_max_logit(tmp_path, capsys):
    out = tmp_path / "run"
    rc = main(["train", "--model", "hf:llama", *model_args_flags("hf:llama"), "--assign", "attn=stiefel,mlp=dgram",
               "--steps", "10", "--batch-size", "4", "--eval-every", "5", "--probe-every", "5",
               "--device", "cpu", "--out", str(out), "--quiet"])
    captured = capsys.readouterr()
    assert rc == 0, captured.out + captured.err
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    # Rule: every probe step reports a finite max attention logit per layer (2 layers).
    assert [m["step"] for m in records] == [5, 10]
    assert all(math.isfinite(m["max_logit"]) and len(m["max_logit_per_layer"]) == 2 for m in records)
    config = yaml.safe_load((out / "config.yaml").read_text())
    # Rule: --assign is read with LLaMA's rule set; config.yaml records the built model.
    assert config["assignment"]["rules"] == "llama"
    assert config["geometry"] == {"attn_q": "stiefel", "attn_k": "stiefel", "attn_v": "stiefel",
                                  "attn_out": "stiefel", "mlp_gate": "dgram", "mlp_in": "dgram",
                                  "mlp_out": "dgram"}
    model = config["model"]
    assert (model["spec"], model["class"], model["rules"], model["qk_source"], model["block_size"]) == (
        "hf:llama", "LlamaForCausalLM", "llama", "llama", T)
    assert model["config"]["num_hidden_layers"] == 2
