"""What ``geosearch inspect`` shows (geosearch/inspect.py): parameter rows, fitting rule sets, the table.

Models are built on the meta device, as ``geosearch inspect`` builds them: names, shapes and
module classes without memory or initialisation.
"""

from __future__ import annotations

import pytest

from geosearch.util.errors import ConfigError
from geosearch.inspect import describe_parameters, fitting_rule_sets, inspect_model
from geosearch.models.zoo import build_meta_model

HF_REASON = "Hugging Face transformers is not installed (pip install 'geosearch[hf]')"


# --------------------------------------------------------------------------- describe_parameters
@pytest.mark.parametrize("spec", ["tiny", "hf:gpt2", "hf:llama"])
def test_describe_parameters_shows_the_rules_at_work(spec):
    if spec.startswith("hf:"):
        pytest.importorskip("transformers", reason=HF_REASON)
    built = build_meta_model(spec, vocab_size=256)
    rows = describe_parameters(built, space_geometries={"attn": ["stiefel", "dgram"], "mlp_out": ["adamw"]})
    by_role = {}
    for r in rows:
        by_role.setdefault(r.role, []).append(r)
    # Rule: one row per parameter, except one row per block of a split weight.
    assert len({r.name for r in rows}) == len(list(built.model.named_parameters()))
    # Rule: every hidden 2-D weight is matched; embeddings/head and norms/biases are AdamW.
    assert "unassigned" not in by_role
    assert all(r.geometries == ("adamw",) for role in ("embedding", "norm/bias") for r in by_role[role])
    attn = [r for r in by_role["matched"] if r.module_type.startswith("attn")]
    assert attn and all(r.geometries == ("stiefel", "dgram") for r in attn)
    assert all(r.geometries == ("adamw",) for r in by_role["matched"] if r.module_type == "mlp_out")
    layouts = {r.layout for r in by_role["matched"]}
    assert layouts == ({"in_out"} if spec == "hf:gpt2" else {"out_in"})
    if spec != "hf:llama":  # Rule: split rules give one labelled row per block.
        split = describe_parameters(built, "gpt2_split" if spec == "hf:gpt2" else "nanogpt_split")
        assert [r.label for r in split if r.name == "transformer.h.0.attn.c_attn.weight"] == [
            f"attn_{x} (block of attn_qkv)" for x in "qkv"]


# --------------------------------------------------------------------------- fitting_rule_sets
def test_fitting_rule_sets_are_the_families_own():
    pytest.importorskip("transformers", reason=HF_REASON)
    # Rule: fitting_rule_sets finds exactly the GPT-2 sets.
    assert fitting_rule_sets(build_meta_model("hf:gpt2", vocab_size=256).model) == ["gpt2", "gpt2_split"]
    assert fitting_rule_sets(build_meta_model("hf:llama", vocab_size=256).model) == ["llama"]
    # Rule: and the proxy's nn.Linear sets for the proxy GPT.
    assert fitting_rule_sets(build_meta_model("tiny", vocab_size=256).model) == ["nanogpt", "nanogpt_split"]


# --------------------------------------------------------------------------- --models
@pytest.mark.slow
def test_models_lists_the_hf_types_that_work_and_says_why_the_others_are_left_out(capsys):
    transformers = pytest.importorskip("transformers", reason=HF_REASON)
    from geosearch.cli import main
    from geosearch.models.hf_configs import LIST_HINT, causal_lm_types
    from geosearch.models.hf_configs import left_out_types, listed_types

    assert main(["inspect", "--models"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("hf:MODEL_TYPE"))
    end = next(i for i, line in enumerate(lines) if line.startswith("left out"))
    listed = {name.strip() for line in lines[start + 1:end] if line.startswith("  ") and not line.startswith("  (")
              for name in line.split(",") if name.strip()}
    left = {line.split(":")[0].strip() for line in lines[end + 1:] if line.startswith("  ") and
            not line.startswith("      ")}
    # Rule: the listed types are the ones that work; every other causal LM type is named with
    # its reason, so that messages can name this command (LIST_HINT) instead of 200 names.
    assert listed == set(listed_types()) and "mistral" in listed and "mixtral" in listed
    assert left == set(left_out_types()) and listed | left == set(causal_lm_types()) and not listed & left
    assert "whisper" in left and "musicgen" in left and "mamba" in left  # not decoder-only with attention
    assert "gptj" in listed and "gpt_neo" in listed
    assert f"transformers {transformers.__version__}" in out and LIST_HINT.startswith("geosearch inspect --models")
    # Rule: the other kinds are there too: presets, the families with rule sets, paths, py:.
    for words in ("tiny (2 layers, width 32)", "hf:gpt2, hf:llama", "hf:PATH", "py:MODULE:FACTORY"):
        assert words in out
    assert all(len(line) <= 100 for line in lines if line.startswith(("  ", "hf:", "left")))


# --------------------------------------------------------------------------- inspect_model
def test_the_table_takes_the_models_rules_and_the_spaces_candidates(capsys):
    inspect_model("tiny", space="default")
    out = capsys.readouterr().out.splitlines()
    # Rule: a space whose rules come from its model takes the named model's rules instead.
    assert out[1].startswith("module types by rule set 'nanogpt' (the model's); candidate geometries from ")
    assert out[1].endswith("default.yaml")
    rows = {line.split()[0]: line.split(None, 3)[1:] for line in out[3:] if line.startswith("transformer.")}
    # Rule: a matched weight shows its (out, in) shape, its type and the space's candidates;
    # everything else is AdamW's.
    assert rows["transformer.h.0.attn.c_attn.weight"] == ["96x32", "attn_qkv", "stiefel, dgram"]
    assert rows["transformer.h.1.mlp.c_proj.weight"] == ["32x128", "mlp_out", "stiefel, dgram"]
    assert rows["transformer.h.0.ln_1.weight"] == ["32", "norm/bias", "adamw"]
    # Rule: the counts add up: 2 layers, 4 module types, one weight each per layer.
    assert ("module types: attn_qkv (2 weights), attn_out (2 weights), mlp_in (2 weights), "
            "mlp_out (2 weights)") in out
    assert "rule sets that fit this model: nanogpt, nanogpt_split" in out


def test_rules_of_another_family_are_an_error_listing_the_fitting_ones(capsys):
    # Rule: GPT-2's Conv1D rules on the proxy's nn.Linear weights name the rule sets that fit.
    with pytest.raises(ConfigError, match=r"rule set 'gpt2': rules: .*'in_out'") as e:
        inspect_model("tiny", rules="gpt2")
    assert e.value.allowed == ["nanogpt", "nanogpt_split"]
    # Rule: a rule that matches nothing is an error after the table, with one warning per
    # weight left to AdamW.
    with pytest.raises(ConfigError, match=r"rule 'attn_q' .* matches no parameter of the 'tiny' model"):
        inspect_model("tiny", rules="llama")
    out, err = capsys.readouterr()
    assert "module types: none" in out and err.count("matches no rule of rule set 'llama'") == 8
    # Rule: without a model or a space there is nothing to inspect.
    with pytest.raises(ConfigError, match="give --model SPEC"):
        inspect_model()


def test_a_model_no_registered_set_fits_shows_the_rules_read_off_its_names(capsys):
    pytest.importorskip("transformers", reason=HF_REASON)
    import yaml

    from geosearch.assignment import Assignment
    from geosearch.rules.modules import match_parameters

    args = {"num_hidden_layers": 2, "hidden_size": 32, "num_attention_heads": 4, "intermediate_size": 48}
    inspect_model("hf:phi3", model_args=args)
    out = capsys.readouterr().out
    lines = out.splitlines()
    # Rule: the table's types come from the rules read off the module names, blocks labelled.
    assert lines[1] == "module types by the rules read off its module names (the model's)"
    rows = {line.split()[0]: line.split(None, 2)[2] for line in lines[3:] if line.startswith("model.layers.0.")}
    assert rows["model.layers.0.mlp.down_proj.weight"].startswith("mlp_out ")
    assert "rule sets that fit this model: none registered; write rules" in lines
    # Rule: those rules are printed as a search space writes them, and read back they match
    # every hidden weight of the model (nothing left to AdamW).
    text = out[out.index("rules read off the module names"):].split("\n", 1)[1]
    rules = yaml.safe_load(text)["rules"]
    assert [r["type"] for r in rules] == ["attn_qkv", "attn_out", "mlp_gate_up", "mlp_out"]
    assignment = Assignment.parse("attn=stiefel,mlp=dgram", rules=rules)
    model = build_meta_model("hf:phi3", vocab_size=256, model_args=args).model
    match = match_parameters(model, assignment.rule_set())
    assert not match.unmatched_hidden and not match.empty_rules
    assert set(assignment.resolve()) == {"attn_q", "attn_k", "attn_v", "attn_out", "mlp_gate", "mlp_in",
                                         "mlp_out"}
    # Rule: a LLaMA-like family shows the registered set that fits it, and prints no inferred rules.
    inspect_model("hf:mistral", model_args=args)
    out = capsys.readouterr().out
    assert "module types by rule set 'llama' (the model's)" in out and "read off" not in out
    assert fitting_rule_sets(build_meta_model("hf:mistral", vocab_size=256, model_args=args).model) == ["llama"]
