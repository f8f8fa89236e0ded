"""Search spaces (geosearch/search/space/spec.py): the shipped files, loading, overrides, sampler/pruner/suggest."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import optuna
import pytest
from _spaces import header, problems, space, write

from geosearch.util.errors import ConfigError
from geosearch.search import (
    LogitGrowthPruner,
    SearchSpace,
    SearchSpaceError,
    apply_overrides,
    load_space,
    space_names,
)

optuna.logging.set_verbosity(optuna.logging.WARNING)

REPO = Path(__file__).resolve().parents[3]


# ---------------------------------------------------------------------- shipped spaces
def test_shipped_spaces_load_by_name():
    # Rule: every shipped space loads by name and the names are listed.
    assert space_names() == ["default", "full", "llama", "moe", "paper", "roles"]
    default, paper, full = load_space("default"), load_space("paper"), load_space("full")
    # Rule: default and paper are attention x MLP over {stiefel, dgram}, searched exhaustively;
    # paper also at each assignment's own step (a grid around the study's shared one, halved).
    four = {"geometry.attn": ["stiefel", "dgram"], "geometry.mlp": ["stiefel", "dgram"]}
    assert default.categorical_choices() == four and default.grid_size() == 4
    assert paper.categorical_choices() == four | {"step_factor": [0.5, 1.0, 2.0]} and paper.grid_size() == 12
    assert paper.hyperparams.step_halving and {default.sampler_type(), paper.sampler_type()} == {"grid"}
    # Rule: the default space is CPU-sized: the mini proxy, two seeds (a spread), a few hundred steps.
    assert default.proxy.model == "mini" and default.repeats == 2
    assert 150 <= default.proxy.steps <= 500 and default.name == "default"
    # Rule: default and paper name no rules: they take the model's (nanogpt for the presets).
    assert default.rules == paper.rules == "nanogpt" and default.rules_from_model
    # Rule: paper.yaml carries the study's shared settings.
    p = paper.proxy
    assert (p.spectral_lr, p.momentum, p.lr, p.betas, p.weight_decay, p.grad_clip) == (
        0.02, 0.95, 6e-4, (0.9, 0.95), 0.1, 1.0)
    # Rule: ... and runs them as the study did where geosearch can (docs/design.md, "paper.yaml
    # as the study ran it"): 10 Polar Express iterations, 2% warmup, K = 20 to the published
    # tolerance, and a Muon baseline whose step is η on every matrix (no shape scale).
    args = p.optimizer_args
    assert (args["ns_steps"], args["ns_coefficients"], args["muon_scale"]) == (10, "polar_express", "none")
    assert (p.solver, args["dual_steps"], args["dual_tol"]) == ("dual", 20, 1e-6)
    assert p.resolved().warmup_steps == p.steps // 50 and "muon" in paper.baselines
    # Rule: full.yaml searches every split module type over every geometry, plus step sizes.
    assert full.rules == "nanogpt_split" and full.proxy.model == "gpt2"
    assert list(full.geometries) == ["attn_q", "attn_k", "attn_v", "attn_out", "mlp_in", "mlp_out"]
    from geosearch.assignment import geometry_names
    assert all(sorted(v) == sorted(geometry_names()) for v in full.geometries.values())
    assert full.grid_size() == math.inf and full.sampler_type() == "tpe"


def test_llama_space():
    pytest.importorskip("transformers", reason="llama.yaml's proxy is hf:llama (Hugging Face transformers)")
    llama, default = load_space("llama"), load_space("default")
    # Rule: llama.yaml is attention x MLP over {stiefel, dgram} like default, searched exhaustively.
    assert llama.categorical_choices() == default.categorical_choices() and llama.sampler_type() == "grid"
    # Rule: it trains the LLaMA proxy at the CPU default's size, at most its steps, with
    # LLaMA's rules.
    assert (llama.proxy.model, llama.rules) == ("hf:llama", "llama")
    assert llama.proxy.model_args["hidden_size"] == 128 and llama.proxy.steps <= default.proxy.steps


def test_moe_space():
    pytest.importorskip("transformers", reason="moe.yaml's proxy is hf:mixtral (Hugging Face transformers)")
    moe, default = load_space("moe"), load_space("default")
    # Rule: moe.yaml searches attention x experts like default, and the routers (AdamW or not).
    assert moe.categorical_choices() == default.categorical_choices() | {"geometry.router": ["adamw", "stiefel"]}
    assert (moe.proxy.model, moe.rules, moe.grid_size(), moe.sampler_type()) == ("hf:mixtral", "mixtral", 8, "grid")
    assert moe.proxy.model_args["num_local_experts"] == 4


def test_roles_space():
    from geosearch.search.space.plan import plan_study

    roles, default = load_space("roles"), load_space("default")
    # Rule: roles.yaml is QK x VO x MLP over {stiefel, dgram}: 8 points, one categorical per role.
    both = ["stiefel", "dgram"]
    assert roles.categorical_choices() == {f"geometry.{k}": both for k in ("attn_qk", "attn_vo", "mlp")}
    assert roles.grid_size() == 8 and roles.sampler_type() == "grid"
    # Rule: the model's rules with Q, K and V apart; default's proxy, stability rung and baselines.
    assert (roles.rules, roles.rules_from_model) == ("nanogpt_split", True)
    assert roles.proxy == default.proxy and roles.baselines == default.baselines
    plan, base = plan_study(roles), plan_study(default)
    assert plan.stability == base.stability and plan.stability is not None
    assert "8 assignments" in plan.header_lines()[1]
    # Rule: another model's rules follow, their Q/K/V apart too (gpt2 -> gpt2_split).
    assert apply_overrides(roles, model="hf:gpt2").rules == "gpt2_split"
    # Rule: a role on rules that cannot cut Q from K is one problem naming the key.
    with pytest.raises(SearchSpaceError, match="geometries.attn_qk") as e:
        SearchSpace.from_dict({"version": 1, "rules": "deepseek", "geometries": {
            "attn_qk": "stiefel", "attn_vo": "dgram", "mlp": "dgram"}}, source="x.yaml")
    assert "role 'attn_qk' stands for attn_q, attn_k" in str(e.value)


def needs_models(name: str) -> None:
    if name in ("llama", "moe"):
        pytest.importorskip("transformers", reason="llama.yaml's proxy is hf:llama (Hugging Face transformers)")


@pytest.mark.parametrize("name", ["default", "paper", "full", "llama", "moe", "roles"])
def test_repo_search_spaces_are_the_shipped_files(name):
    needs_models(name)
    repo_file = REPO / "search_spaces" / f"{name}.yaml"
    shipped = REPO / "geosearch" / "search" / "space" / "spaces" / f"{name}.yaml"
    # Rule: search_spaces/ at the repo top shows the packaged files, not copies of them.
    assert repo_file.resolve() == shipped.resolve()
    # Rule: every shipped YAML starts with a comment showing the command that uses it.
    assert repo_file.read_text().startswith("# geosearch search")
    # Rule: loading by path gives the same space as by name.
    assert load_space(repo_file).to_dict() == load_space(name).to_dict()


@pytest.mark.parametrize("name", ["default", "paper", "full", "llama", "moe", "roles"])
def test_to_dict_round_trips(name):
    needs_models(name)
    s = load_space(name)
    # Rule: from_dict(to_dict()) rebuilds the same space.
    assert SearchSpace.from_dict(s.to_dict(), source="x").to_dict() == s.to_dict()


# ---------------------------------------------------------------------- files
def test_file_errors(tmp_path):
    # Rule: a missing file says so and lists the shipped names.
    with pytest.raises(ConfigError, match=r"nowhere\.yaml: no such file.*default, full, llama, moe, paper"):
        load_space(tmp_path / "nowhere.yaml")
    # Rule: malformed YAML gives the line and column.
    bad = write(tmp_path, "version: 1\ngeometries: {attn: [stiefel\n")
    with pytest.raises(ConfigError, match=r"malformed YAML at line 3, column 1"):
        load_space(bad)
    # Rule: version is required and must be 1.
    with pytest.raises(SearchSpaceError, match=r"version: missing schema version"):
        load_space(write(tmp_path, "geometries: {attn: stiefel, mlp: dgram}\n"))
    with pytest.raises(SearchSpaceError, match=r"version: unsupported schema version 2; expected one of: 1"):
        load_space(write(tmp_path, "version: 2\ngeometries: {attn: stiefel, mlp: dgram}\n"))
    # Rule: geometries are required.
    with pytest.raises(SearchSpaceError, match=r"geometries: missing"):
        load_space(write(tmp_path, "version: 1\n"))


# ---------------------------------------------------------------------- suggest
def test_suggest_with_per_geometry_step_sizes():
    s = space(hyperparams={"spectral_lr": {"stiefel": [0.01, 0.04], "dgram": [0.001, 0.004]},
                           "lr": [1e-4, 1e-3]}, budget={"trials": 8})
    trial = optuna.trial.FixedTrial({"geometry.attn": "stiefel", "geometry.mlp": "stiefel",
                                     "spectral_lr.stiefel": 0.02, "lr": 5e-4})
    sug = s.suggest(trial)
    # Rule: one categorical per key; a per-geometry step size is suggested only for
    # geometries the trial uses and becomes the `lr` option of the keys that use it.
    assert sug.geometry == {"attn": "stiefel", "mlp": "stiefel"}
    assert sug.options == {"attn": {"lr": 0.02}, "mlp": {"lr": 0.02}}
    # Rule: the AdamW lr becomes a TrainConfig override.
    assert sug.train_overrides == {"lr": 5e-4}
    config = s.train_config(sug, repeat=2)
    assert (config.lr, config.seed) == (5e-4, s.proxy.seed + 2)
    # Rule: the suggestion is a valid assignment of the space's rules.
    resolved = sug.assignment().resolve()
    assert resolved == {"attn_qkv": "stiefel", "attn_out": "stiefel", "mlp_in": "stiefel",
                        "mlp_out": "stiefel"}


# ---------------------------------------------------------------------- sampler
def test_grid_visits_every_assignment_once_and_stops():
    s = load_space("default")
    study = optuna.create_study(sampler=s.make_sampler(), pruner=s.make_pruner())
    seen = []
    study.optimize(lambda t: seen.append(tuple(s.suggest(t).geometry.values())) or 0.0,
                   n_trials=10)
    # Rule: the grid sampler covers categorical_choices exactly, then ends the study.
    assert sorted(seen) == sorted((a, m) for a in ("stiefel", "dgram") for m in ("stiefel", "dgram"))


def test_sampler_choice():
    # Rule: auto is a grid when the trial budget covers the space, TPE otherwise.
    assert isinstance(space().make_sampler(), optuna.samplers.GridSampler)
    assert isinstance(space(budget={"trials": 3}).make_sampler(), optuna.samplers.TPESampler)
    # Rule: explicit choices are honoured.
    assert isinstance(space(sampler="random", budget={"trials": 5}).make_sampler(),
                      optuna.samplers.RandomSampler)
    assert isinstance(space(sampler={"type": "tpe", "n_startup_trials": 3},
                            budget={"timeout": 60}).make_sampler(), optuna.samplers.TPESampler)
    # Rule: a search that never ends by itself needs a budget.
    with pytest.raises(SearchSpaceError, match=r"budget: a tpe search never ends by itself"):
        space(sampler="tpe")
    # Rule: n_startup_trials belongs to model-based samplers only.
    with pytest.raises(SearchSpaceError, match=r"sampler.n_startup_trials: the grid sampler"):
        space(sampler={"type": "grid", "n_startup_trials": 3})


def test_gp_sampler_names_its_extra_dependency():
    s = space(sampler="gp", budget={"trials": 20})
    if importlib.util.find_spec("scipy") is not None:
        # Rule: with scipy installed, gp is Optuna's GPSampler.
        assert isinstance(s.make_sampler(), optuna.samplers.GPSampler)
        return
    # Rule: without scipy the error names the missing package and the other samplers.
    with pytest.raises(ConfigError, match=r"sampler.type: Optuna's GPSampler needs scipy.*"
                                          r"pip install scipy.*expected one of: auto, grid, tpe"):
        s.make_sampler()


# ---------------------------------------------------------------------- pruner
def test_make_pruner_with_a_wrapped_loss_pruner():
    s = space(pruner={"max_logit": "2e3", "min_entropy": None, "window": 4,
                      "loss": {"type": "percentile", "percentile": 25, "n_startup_trials": 2}})
    pruner = s.make_pruner()
    # Rule: the pruner is a LogitGrowthPruner wrapping the configured loss pruner.
    assert isinstance(pruner, LogitGrowthPruner)
    assert isinstance(pruner.wrapped, optuna.pruners.PercentilePruner)
    # Rule: YAML 1.1's string "2e3" is read as a number; null turns a rule off.
    assert s.pruner.max_logit == 2e3 and s.pruner.min_entropy is None
    # Rule: the defaults are the pruner's own.
    assert space().pruner.max_logit == 1e3 and space().pruner.loss.type == "none"
    assert space(pruner={"loss": "median"}).make_pruner().wrapped.__class__ is optuna.pruners.MedianPruner


# ---------------------------------------------------------------------- overrides
def test_cli_flags_and_dotted_overrides():
    base = load_space("default")
    s = apply_overrides(base, ["proxy.eval_every=25", "hyperparams.lr=[1e-4, 1e-3]"],
                        trials=12, steps=100, model="tiny", data=None, seed=None)
    # Rule: flags map to their key paths; None means "flag not given".
    assert (s.budget.trials, s.proxy.steps, s.proxy.model, s.proxy.data) == (12, 100, "tiny", None)
    assert s.sampler.seed == base.sampler.seed
    # Rule: dotted key=value overrides are read as YAML values.
    assert s.proxy.eval_every == 25 and s.hyperparams.lr.high == 1e-3
    # Rule: the original space is unchanged.
    assert base.proxy.steps == 400 and base.hyperparams.lr is None
    # Rule: overrides that change the space change auto's choice (now continuous: TPE).
    assert s.sampler_type() == "tpe"
    # Rule: a mapping of dotted keys works too.
    assert apply_overrides(base, {"proxy.model_args.n_layer": 2}).proxy.model_args == {"n_layer": 2}


def test_bad_overrides_name_the_override():
    base = load_space("default")
    with pytest.raises(SearchSpaceError) as e:
        apply_overrides(base, ["proxy.stepz=5"], trials=0)
    # Rule: errors in overrides name them as the source, with key path and allowed keys; of
    # several, the first in the schema's order is said, in one line (flags: one at a time).
    assert str(e.value).startswith("overrides of ")
    assert "default.yaml: proxy.stepz: unknown key" in str(e.value)
    assert set(problems(e)) == {"proxy.stepz"} and "\n" not in str(e.value)
    # Rule: an item that is not key=value is rejected in words.
    with pytest.raises(ConfigError, match=r"expected 'key=value'"):
        apply_overrides(base, ["proxy.steps"])
    # Rule: a key path through a non-mapping value is rejected.
    with pytest.raises(ConfigError, match=r"cannot set 'repeats.x': repeats is not a mapping"):
        apply_overrides(base, ["repeats.x=1"])
    # Rule: an unknown flag is a programming error.
    with pytest.raises(TypeError, match=r"unexpected flag 'stepz'"):
        apply_overrides(base, stepz=5)


def test_summary_mentions_what_is_searched():
    text = header(load_space("default"))
    # Rule: the summary names the space, the choices and the sampler.
    assert "search space 'default'" in text and "attn, mlp in {stiefel, dgram}" in text
    assert "= 4 assignments" in text and "sampler: grid" in text
    # Rule: it is a few lines.
    assert len(text.splitlines()) <= 6
