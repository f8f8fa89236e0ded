"""Hugging Face families at their default (shrunk) size: the listed ones build, run, probe and
step; mixture-of-experts models get their experts' geometry; the sweep keeps the list honest."""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from pathlib import Path

import pytest
import torch
import yaml

from geosearch.assignment import Assignment
from geosearch.build import build_optimizer
from geosearch.manifolds import get_manifold
from geosearch.models.lm import lm_loss
from geosearch.models.zoo import build_model
from geosearch.proxy.probes import attention_stats
from geosearch.util.errors import ConfigError

HF_REASON = "needs Hugging Face transformers (pip install 'geosearch[hf]')"
SWEEP = Path(__file__).resolve().parents[2] / "benchmarks" / "hf_families.py"


@pytest.fixture
def hf():
    return pytest.importorskip("transformers", reason=HF_REASON)


def _sweep():
    spec = importlib.util.spec_from_file_location("hf_families", SWEEP)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
@pytest.mark.parametrize("model_type, probed", [("gptj", True), ("gpt_neo", False)])
def test_gptj_and_gpt_neo_work_at_their_default_size(hf, model_type, probed):
    # GPT-J keeps rotary_dim at a quarter of its (shrunk) head; GPT-Neo's attention_types
    # follow the shrunk depth. Both were refused or failed at step 1 before.
    torch.manual_seed(0)
    built = build_model(f"hf:{model_type}", vocab_size=256, for_data=False)
    x = torch.randint(0, 256, (2, 17))
    assert math.isfinite(lm_loss(built.model, x[:, :-1], x[:, 1:]).item())
    assert (built.qk_source is not None) == probed
    if probed:
        assert (
            len(attention_stats(built.model, x[:, :-1], built.qk_source)["max_logit_per_layer"])
            == 4
        )
    opt = build_optimizer(
        built.model, Assignment.parse("attn=stiefel,mlp=dgram", rules=built.rules), verbose=False
    )
    lm_loss(built.model, x[:, :-1], x[:, 1:]).backward()
    opt.step()
    assert math.isfinite(lm_loss(built.model, x[:, :-1], x[:, 1:]).item())


@pytest.mark.slow
def test_a_family_whose_forward_fails_is_refused_in_one_line_naming_it(hf):
    # GPT-J with rotary embeddings wider than its heads: caught by the forward check at build.
    with pytest.raises(ConfigError) as e:
        build_model("hf:gptj", vocab_size=256, for_data=False, model_args={"rotary_dim": 64})
    assert "(family gptj) does not run at this size" in str(e.value) and "\n" not in str(e.value)


@pytest.mark.slow
@pytest.mark.parametrize(
    "spec, rules",
    [
        ("hf:mixtral", "mixtral"),
        ("hf:qwen2_moe", "qwen2_moe"),
        ("hf:olmoe", "mixtral"),
        ("hf:deepseek_v3", "deepseek"),
        ("hf:gpt_oss", "gpt_oss"),
    ],
)
def test_moe_families_get_rule_sets_with_experts_and_routers(hf, spec, rules):
    torch.manual_seed(0)
    built = build_model(spec, vocab_size=256, for_data=False, model_args={"num_hidden_layers": 2})
    assert built.rules == rules and built.qk_source is not None
    opt = build_optimizer(
        built.model, Assignment.parse("attn=stiefel,mlp=dgram", rules=rules), verbose=False
    )
    names = {g["name"]: g for g in opt.param_groups}
    assert names["router"]["geometry"] == "adamw"  # routers keep AdamW unless named
    stacks = {
        n: p
        for n, p in built.model.named_parameters()
        if n.endswith(("experts.down_proj", "gate_up_proj"))
    }
    stepped = {
        id(p)
        for g in opt.param_groups
        if g["geometry"] != "adamw"
        for p in g["params"]
        if p.dim() == 3
    }
    assert stacks and stepped == {
        id(p) for p in stacks.values()
    }  # every stack [experts, ., .] on a manifold
    x = torch.randint(0, 256, (2, 9))
    for _ in range(2):
        opt.zero_grad()
        lm_loss(built.model, x[:, :-1], x[:, 1:]).backward()
        opt.step()
    dgram = get_manifold("dgram")
    for name, W in stacks.items():  # every expert's matrix (each block) on its manifold, (out, in)
        view = W.detach().mT if rules == "gpt_oss" else W.detach()
        blocks = (
            view.chunk(2, dim=-2)
            if name.endswith("gate_up_proj") and rules != "gpt_oss"
            else (view,)
        )
        assert max(dgram.constraint_error(B).max().item() for B in blocks) < 1e-5, name


@pytest.mark.slow
def test_train_mixtral_from_the_command_line(hf, tmp_path, capsys):
    from geosearch.cli import main

    out = tmp_path / "run"
    rc = main(
        [
            "train",
            "--model",
            "hf:mixtral",
            "--model-arg",
            "num_hidden_layers=2",
            "--assign",
            "attn=stiefel,mlp=dgram",
            "--steps",
            "3",
            "--batch-size",
            "2",
            "--eval-every",
            "3",
            "--probe-every",
            "3",
            "--device",
            "cpu",
            "--out",
            str(out),
            "--quiet",
        ]
    )
    captured = capsys.readouterr()
    assert rc == 0, captured.out + captured.err
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert records and all(math.isfinite(m["max_logit"]) for m in records)
    config = yaml.safe_load((out / "config.yaml").read_text())
    assert config["geometry"]["moe_gate"] == config["geometry"]["moe_out"] == "dgram"
    assert config["geometry"]["router"] == "adamw"


TINY_MIXTRAL = {"num_hidden_layers": 1, "hidden_size": 32, "num_attention_heads": 2,
                "num_key_value_heads": 1, "intermediate_size": 32, "num_local_experts": 4,
                "num_experts_per_tok": 2, "block_size": 16}


@pytest.mark.slow
def test_a_moe_search_exports_the_experts_geometry_that_rebuilds(hf, tmp_path, capsys, monkeypatch):
    import geosearch.cli.search
    from geosearch.assignment import load_assignment
    from geosearch.cli import main

    monkeypatch.setattr(geosearch.cli.search, "_report_after_search", lambda *args: None)
    flags = [a for k, v in TINY_MIXTRAL.items() for a in ("--model-arg", f"{k}={v}")]
    sets = ["max_repeats=null", "baselines=[]", "ladder.stability_steps=null",
            "proxy.eval_every=2", "proxy.eval_batches=1", "proxy.probe_every=2"]
    # The default space (attn, mlp in {stiefel, dgram}) on a Mixtral: no router entry needed.
    rc = main(["search", "--model", "hf:mixtral", *flags, "--steps", "2", "--batch-size", "2",
               "--repeats", "1", "--runs-dir", str(tmp_path), "--study", "s",
               *[a for s in sets for a in ("--set", s)]])
    out = capsys.readouterr().out
    assert rc == 0 and out.count("completed") == 4, out
    assignment = load_assignment(tmp_path / "s" / "best_assignment.yaml")
    resolved = assignment.resolve()
    # Rule: the export names the experts' types, which take the searched MLP geometry, and
    # the router its rule's default (AdamW).
    assert assignment.rules == "mixtral" and resolved["router"] == "adamw"
    experts = {resolved[t] for t in ("moe_gate", "moe_in", "moe_out")}
    assert len(experts) == 1 and experts <= {"stiefel", "dgram"}
    geometry = experts.pop()
    torch.manual_seed(0)
    model = build_model("hf:mixtral", vocab_size=256, for_data=False, model_args=TINY_MIXTRAL).model
    opt = build_optimizer(model, assignment, verbose=False)
    stacks = {n: p for n, p in model.named_parameters() if ".experts." in n}
    on = {id(p) for g in opt.param_groups  # a split weight's group: one geometry per block
          if set(g["geometry"] if isinstance(g["geometry"], tuple) else [g["geometry"]]) == {geometry}
          for p in g["params"]}
    router = {id(p) for n, p in model.named_parameters() if n.endswith("mlp.gate.weight")}
    adamw = {id(p) for g in opt.param_groups if g["geometry"] == "adamw" for p in g["params"]}
    # Rule: every 3-D stack [experts, out, in] is on the exported geometry, the routers on AdamW.
    assert {p.dim() for p in stacks.values()} == {3} and {id(p) for p in stacks.values()} <= on
    assert router and router <= adamw
    x = torch.randint(0, 256, (2, 9))
    for _ in range(3):
        opt.zero_grad()
        lm_loss(model, x[:, :-1], x[:, 1:]).backward()
        opt.step()
    manifold = get_manifold(geometry)
    for name, W in stacks.items():  # each expert's matrix (each block of gate_up) on it
        blocks = W.detach().chunk(2, dim=-2) if name.endswith("gate_up_proj") else (W.detach(),)
        assert max(manifold.constraint_error(B).max().item() for B in blocks) < 1e-5, name


@pytest.mark.slow
def test_encoder_decoders_and_state_space_models_are_not_listed(hf):
    from geosearch.models.hf_configs import kind_problem, left_out_types, listed_types

    listed = set(listed_types())
    assert {"gptj", "gpt_neo", "mixtral", "llama"} <= listed
    assert kind_problem("whisper").startswith("an encoder-decoder") and "whisper" not in listed
    assert kind_problem("mamba").startswith("a state-space") and "mamba" not in listed
    assert kind_problem("llama") is None
    assert all(why for why in left_out_types().values())


@pytest.mark.slow
def test_every_listed_type_builds_runs_probes_and_steps(hf):
    from geosearch.models.hf_configs import listed_types

    sweep = _sweep()
    failed = [r for r in map(sweep.check_family, listed_types()) if not r.ok]
    assert not failed, "\n".join(f"{r.model_type}: {r.stage}: {r.reason}" for r in failed)


def test_a_composite_model_is_not_called_state_space():
    """BLT keeps its heads in four sub-configs: not a model without attention."""
    transformers = pytest.importorskip("transformers")
    from geosearch.models.hf_configs import kind_problem

    if "blt" not in transformers.CONFIG_MAPPING or "mamba" not in transformers.CONFIG_MAPPING:
        pytest.skip("this transformers has no blt or mamba")
    # Rule: the reason says what it is: a byte-latent transformer, attention in its sub-models.
    assert kind_problem("blt").startswith("a byte-latent transformer (a byte encoder, a global ")
    assert "attention only in its sub-models (" in kind_problem("blt")
    assert "global_config" in kind_problem("blt") and "state-space" not in kind_problem("blt")
    assert kind_problem("mamba") == "a state-space or recurrent model: no attention heads"
    assert kind_problem("llama") is None
