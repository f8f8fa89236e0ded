"""Hugging Face models through the whole tool: ``inspect``, ``search`` (two trials, exported
assignment), ``train``, for GPT-2 and LLaMA, model types (``hf:mistral``, ``hf:qwen2``,
``hf:gemma``, ``hf:phi3``: rules read off its names, ``hf:gemma2``: soft-capped logits) and a
model the probes cannot capture (``hf:bloom``), and a tokenizer of one's own (``--tokenizer``); each on a tiny
configuration (2 layers, width 32, context 32, 10 steps of batch 4) on CPU, in-process.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

pytest.importorskip("transformers", reason="Hugging Face transformers is not installed (pip install 'geosearch[hf]')")

from geosearch.assignment import load_assignment  # noqa: E402
from geosearch.cli import main  # noqa: E402
from geosearch.rules.modules import get_rule_set, match_parameters, module_types  # noqa: E402
from geosearch.build import build_optimizer  # noqa: E402
from geosearch.models.lm import lm_loss  # noqa: E402
from geosearch.models.zoo import build_model  # noqa: E402

T = 32
_SMALL = {"num_hidden_layers": 2, "hidden_size": 32, "num_attention_heads": 2, "intermediate_size": 64,
          "block_size": T}
TINY = {  # model_args of each family: 2 layers, width 32, context 32
    "hf:gpt2": {"n_layer": 2, "n_embd": 32, "n_head": 2, "block_size": T},
    "hf:llama": {**_SMALL, "num_key_value_heads": 1},
    **{f"hf:{t}": {**_SMALL, "num_key_value_heads": 1} for t in ("mistral", "qwen2", "gemma", "gemma2")},
    "hf:phi3": _SMALL,  # all heads for K and V: qkv_proj splits into equal Q, K, V blocks
    "hf:bloom": {"n_layer": 2, "hidden_size": 32, "n_head": 2, "block_size": T},  # logits computed in-module
}
RULES = {"hf:gpt2": "gpt2", "hf:llama": "llama"}
RUN = {"batch_size": 4, "eval_every": 5, "probe_every": 5, "eval_batches": 1, "probe_batch_size": 2,
       "device": "cpu"}


def model_args_flags(spec: str) -> list[str]:
    return [a for k, v in TINY[spec].items() for a in ("--model-arg", f"{k}={v}")]


def built(spec: str):
    return build_model(spec, vocab_size=256, model_args=TINY[spec])


def rule_seq(rules):
    return get_rule_set(rules) if isinstance(rules, str) else rules


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
@pytest.mark.slow
@pytest.mark.parametrize("spec", ["hf:gpt2", "hf:llama", "hf:phi3"])
def test_two_trial_search_exports_an_assignment_that_builds_for_the_model(spec, tmp_path, capsys, monkeypatch):
    import geosearch.cli.search

    # the report and its plots take longer than the search itself; tests/test_report.py has them
    monkeypatch.setattr(geosearch.cli.search, "_report_after_search", lambda *args: None)
    # A space written for the proxy preset, with no rules: --model and the model_args
    # override move it to the Hugging Face model, whose rule set it then takes.
    space = tmp_path / "s.yaml"
    space.write_text(yaml.safe_dump({
        "version": 1, "geometries": {"attn": ["stiefel", "dgram"], "mlp": ["stiefel"]}, "baselines": [],
        "proxy": {"model": "tiny", "steps": 10, **RUN}}), encoding="utf-8")
    runs = tmp_path / "runs"
    # (the model fields as one --set of the space, or as --model-arg flags: the same)
    args = model_args_flags(spec) if spec == "hf:phi3" else ["--set", "proxy.model_args=" + json.dumps(TINY[spec])]
    rc = main(["search", "--space", str(space), "--runs-dir", str(runs), "--study", "s", "--model", spec, *args])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert out.count("\ntrial ") + out.startswith("trial ") == 2  # two assignments, two trials
    assignment = load_assignment(runs / "s" / "best_assignment.yaml")
    # Rule: the exported assignment carries the model's rules (its rule set, or for Phi-3 the
    # rules read off its names, stored whole) and their module types.
    expected = RULES.get(spec) or built(spec).rules
    assert assignment.rules == expected
    resolved = assignment.resolve()
    assert set(resolved) == set(module_types(rule_seq(expected)))
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
        "hf:llama", "LlamaForCausalLM", "llama", "attention_interface", T)
    assert model["config"]["num_hidden_layers"] == 2


@pytest.mark.slow
@pytest.mark.parametrize("spec", ["hf:mistral", "hf:qwen2", "hf:gemma", "hf:phi3", "hf:gemma2"])
def test_train_hf_model_types_probe_attention_and_record_the_model(spec, tmp_path, capsys):
    out = tmp_path / "run"
    rc = main(["train", "--model", spec, *model_args_flags(spec), "--assign", "attn=stiefel,mlp=dgram",
               "--steps", "10", "--batch-size", "4", "--eval-every", "5", "--probe-every", "5",
               "--device", "cpu", "--out", str(out), "--quiet"])
    captured = capsys.readouterr()
    assert rc == 0, captured.out + captured.err
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    # Rule: the probes capture q and k: a finite max attention logit per layer at each probe
    # step; Gemma 2's soft-capped logits as its kernel sees them, and the raw ones too.
    assert all(math.isfinite(m["max_logit"]) and len(m["max_logit_per_layer"]) == 2 for m in records)
    capped = spec == "hf:gemma2"
    assert all(("raw_max_logit" in m) == capped for m in records)
    assert all(m["raw_max_logit"] >= m["max_logit"] and len(m["raw_max_logit_per_layer"]) == 2
               for m in records if capped)
    assert all(math.isfinite(m["val_loss"]) for m in records)
    config = yaml.safe_load((out / "config.yaml").read_text())
    model = config["model"]
    # Rule: config.yaml records the family, the rules --assign was read with, and no warning.
    assert (model["spec"], model["family"], model["qk_source"], model["warnings"]) == (
        spec, spec[3:], "attention_interface", [])
    assert set(config["geometry"]) == {"attn_q", "attn_k", "attn_v", "attn_out", "mlp_gate", "mlp_in", "mlp_out"}
    assert config["assignment"]["rules"] == (model["rules"] if spec == "hf:phi3" else "llama")


@pytest.mark.slow
def test_a_model_without_probes_says_so_on_stderr_and_in_config_yaml(tmp_path, capsys):
    # Rule: the command line prints one warning line on stderr (a fresh process: no handler).
    flags = model_args_flags("hf:bloom")
    proc = subprocess.run([sys.executable, "-m", "geosearch", "inspect", "--model", "hf:bloom", *flags],
                          capture_output=True, text=True, cwd=Path(__file__).resolve().parents[2])
    assert proc.returncode == 0, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if "attention probes cannot capture" in line]
    assert len(lines) == 1 and "BloomForCausalLM: its BloomAttention computes the attention logits" in lines[0]
    assert "pruner has no signal" in lines[0]
    out = tmp_path / "run"
    rc = main(["train", "--model", "hf:bloom", *flags, "--assign", "attn=stiefel,mlp=dgram",
               "--steps", "4", "--batch-size", "4", "--eval-every", "2", "--probe-every", "2",
               "--device", "cpu", "--out", str(out), "--quiet"])
    assert rc == 0, capsys.readouterr().err
    model = yaml.safe_load((out / "config.yaml").read_text())["model"]
    # Rule: the run trains, reports no attention logits, and its config.yaml keeps the warning.
    assert model["qk_source"] is None and model["warnings"] == lines
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m["max_logit"] for m in records] == [None, None] and all(math.isfinite(m["val_loss"]) for m in records)


def test_train_with_a_tokenizer_of_ones_own(tmp_path, capsys):
    tokenizers = pytest.importorskip("tokenizers")
    texts = [f"def f{i}(x):\n    return x + {i}\n" * 20 for i in range(20)]
    (tmp_path / "data").mkdir()
    for i, text in enumerate(texts):
        (tmp_path / "data" / f"m{i:02d}.py").write_text(text)
    tok = tokenizers.Tokenizer(tokenizers.models.BPE())
    tok.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.train_from_iterator(texts, tokenizers.trainers.BpeTrainer(
        vocab_size=300, show_progress=False, initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet()))
    tok.save(str(tmp_path / "tokenizer.json"))
    out = tmp_path / "run"
    rc = main(["train", "--model", "hf:llama", *model_args_flags("hf:llama"), "--data", str(tmp_path / "data"),
               "--tokenizer", str(tmp_path / "tokenizer.json"), "--assign", "attn=stiefel,mlp=dgram",
               "--steps", "4", "--batch-size", "4", "--eval-every", "2", "--probe-every", "2",
               "--device", "cpu", "--out", str(out), "--quiet"])
    assert rc == 0, capsys.readouterr().err
    config = yaml.safe_load((out / "config.yaml").read_text())
    # Rule: the model's vocabulary is the tokenizer's, and the run records where the ids came from.
    assert config["model"]["vocab_size"] == tok.get_vocab_size() > 256
    assert config["train"]["tokenizer"] == str(tmp_path / "tokenizer.json")
    assert f"tokens of {tmp_path / 'tokenizer.json'}" in config["data"]["source"]


def test_search_flags_reach_the_space(tmp_path, monkeypatch):
    import geosearch.search.study.run

    seen = {}

    class Stop(Exception):
        pass

    def fake_run_search(space, options=None, /, **kwargs):
        seen["space"] = space
        raise Stop

    monkeypatch.setattr(geosearch.search.study.run, "run_search", fake_run_search)
    with pytest.raises(Stop):
        main(["search", "--model", "hf:phi3", *model_args_flags("hf:phi3"), "--tokenizer", "tok.json"])
    proxy = seen["space"].proxy
    # Rule: --model-arg sets proxy.model_args (values read as YAML), --tokenizer proxy.tokenizer,
    # and the rules follow the new model (the default space names none).
    assert proxy.model == "hf:phi3" and proxy.model_args == TINY["hf:phi3"] and proxy.tokenizer == "tok.json"
    assert seen["space"].rules == built("hf:phi3").rules
    # Rule: a --model-arg that is not KEY=VALUE names the flag.
    assert main(["search", "--model-arg", "n_layer"]) == 2

