"""The search-space schema (geosearch/search/space/schema.py): every problem of a file, named."""

from __future__ import annotations

import math
from pathlib import Path

import optuna
import pytest
from _spaces import header, problems, space, write

from geosearch.util.errors import ConfigError
from geosearch.rules.modules import rule_set_names
from geosearch.search import SearchSpaceError, apply_overrides, load_space
from geosearch.search.space.reader import LOSS_PRUNER_ARGS
from geosearch.search.space.plan import plan_study
from geosearch.search.space.schema import space_limits

REPO = Path(__file__).resolve().parents[3]


# ---------------------------------------------------------------------- messages
def test_one_problem_is_one_line_with_file_key_and_allowed(tmp_path):
    path = write(tmp_path, """\
        version: 1
        geometries: {attn: [stiefel, dgram], mlp: [stiefle]}
    """)
    with pytest.raises(SearchSpaceError) as e:
        load_space(path)
    msg = str(e.value)
    # Rule: the message names the file, the key path and the allowed values, on one line.
    assert msg.startswith(f"{path}: geometries.mlp: unknown geometry 'stiefle'; expected one of:")
    assert "stiefel" in msg and "adamw" in msg and "\n" not in msg
    # Rule: a SearchSpaceError is a ConfigError (the CLI prints it without a traceback).
    assert isinstance(e.value, ConfigError)


def test_all_problems_are_reported_at_once(tmp_path):
    path = write(tmp_path, """\
        version: 1
        geometries: {attn: [stiefel], mlp: [dgram]}
        proxy: {model: huge, steps: -5, lernrate: 0.1}
        repeats: 0
        pruner: {max_logit: -1, loss: {type: median, n_startup_trials: two}}
        sampler: {type: bayes}
        colour: blue
    """)
    with pytest.raises(SearchSpaceError) as e:
        load_space(path)
    found = problems(e)
    # Rule: every problem is collected before raising, each with its key path.
    assert set(found) == {"colour", "proxy.lernrate", "proxy.model", "proxy.steps", "repeats",
                          "pruner.max_logit", "pruner.loss.n_startup_trials", "sampler.type"}
    msg = str(e.value)
    # Rule: several problems make one message: a count, then one indented line each.
    assert msg.splitlines()[0] == f"{path}: 8 problems in the search space:"
    assert "  sampler.type: unknown sampler 'bayes'; expected one of: auto, grid, tpe, random, gp" in msg
    assert ("  proxy.model: unknown model 'huge'; expected one of: tiny, mini, small, gpt2, hf:gpt2, hf:llama, "
            "py:MODULE:FACTORY") in msg
    assert "  pruner.max_logit: expected a number > 0, got -1" in msg
    assert "  proxy.steps: expected a whole number in [1, 10,000,000], got -5" in msg
    # Rule: unknown keys list the allowed keys of their level.
    assert "version" in found["colour"].allowed and "steps" in found["proxy.lernrate"].allowed


# ---------------------------------------------------------------------- geometries, rules
def test_geometry_keys_are_module_types_or_shorthands():
    # Rule: per-type keys of the rule set are accepted, one categorical each.
    s = space(geometries={"attn_qkv": ["stiefel", "dgram"], "attn_out": "stiefel",
                          "mlp": ["dgram", "adamw"]})
    assert s.categorical_choices() == {"geometry.attn_qkv": ["stiefel", "dgram"], "geometry.attn_out": ["stiefel"],
                                       "geometry.mlp": ["dgram", "adamw"]}
    assert s.grid_size() == 4
    with pytest.raises(SearchSpaceError) as e:
        space(geometries={"attn_q": ["stiefel"], "mlp": ["dgram"]})
    found = problems(e)
    # Rule: a type of another rule set is unknown here; the allowed keys are listed.
    assert found["geometries.attn_q"].allowed == ["attn", "mlp", "attn_qkv", "attn_out", "mlp_in",
                                                  "mlp_out"]
    # Rule: every module type must be covered.
    assert "attn_qkv, attn_out" in found["geometries"].problem
    # Rule: the split rule set accepts q, k, v.
    split = space(rules="nanogpt_split", geometries={"attn_q": "stiefel", "attn_k": "stiefel",
                                                     "attn_v": "dgram", "attn_out": "dgram",
                                                     "mlp": "dgram"})
    assert list(split.categorical_choices()) == ["geometry." + k for k in ["attn_q", "attn_k", "attn_v", "attn_out", "mlp"]]


def test_a_module_type_is_covered_once():
    with pytest.raises(SearchSpaceError) as e:
        space(geometries={"attn": ["stiefel"], "attn_qkv": ["dgram"], "mlp": ["dgram"]})
    # Rule: a type given both by itself and by its family's shorthand is ambiguous.
    assert "'attn_qkv' is also covered by 'attn'" in problems(e)["geometries.attn_qkv"].problem


def test_a_type_with_a_rule_default_may_go_unnamed_but_not_twice():
    # Rule: a Mixtral space naming attn and mlp only is complete: the routers take their
    # rule's default (adamw) ...
    moe = space(rules="mixtral")
    assert list(moe.categorical_choices()) == ["geometry.attn", "geometry.mlp"]
    # ... a router named once is searched, and named twice is ambiguous as any type.
    named = space(rules="mixtral", geometries={"attn": "stiefel", "mlp": "dgram",
                                               "router": ["adamw", "stiefel"]})
    assert list(named.categorical_choices())[-1] == "geometry.router"
    with pytest.raises(SearchSpaceError) as e:
        space(rules="mixtral", geometries={"attn": "stiefel", "mlp": "dgram",
                                           "routing": "adamw", "router": "stiefel"})
    assert "'router' is also covered by 'routing'" in problems(e)["geometries.router"].problem


def test_rules_errors_and_custom_rules():
    with pytest.raises(SearchSpaceError) as e:
        space(rules="no_such_family")
    # Rule: an unknown rule set lists the known ones.
    assert problems(e)["rules"].allowed == sorted(rule_set_names())
    custom = [{"type": "qkv", "pattern": r"c_attn\.weight$", "family": "attn"},
              {"type": "ffn", "pattern": r"c_fc\.weight$", "family": "mlp", "colour": 1}]
    with pytest.raises(SearchSpaceError) as e:
        space(rules=custom, geometries={"qkv": "stiefel", "ffn": "dgram"})
    # Rule: rule entries are checked key by key, with their index in the path.
    assert "rules[1].colour" in problems(e)
    del custom[1]["colour"]
    s = space(rules=custom, geometries={"qkv": ["stiefel", "dgram"], "mlp": "dgram"})
    # Rule: a list of rules defines the module types; shorthands cover them by family.
    assert s.categorical_choices() == {"geometry.qkv": ["stiefel", "dgram"], "geometry.mlp": ["dgram"]}
    assert [r.type for r in s.rules] == ["qkv", "ffn"]


def test_rules_default_to_the_models_rule_set(monkeypatch):
    s = space(proxy={"model": "tiny"})
    # Rule: a space that names no rules takes its model's default rule set.
    assert (s.rules, s.rules_from_model) == ("nanogpt", True)
    # Rule: overriding the model re-derives such rules; rules the space names stay.
    assert apply_overrides(s, model="gpt2").rules == "nanogpt"
    assert apply_overrides(space(rules="nanogpt_split"), model="tiny").rules == "nanogpt_split"
    # Rule: to_dict() records the rules in use either way.
    assert s.to_dict()["rules"] == "nanogpt"
    # Rule: a py: model has no default rule set: the space must name one (listing them).
    monkeypatch.syspath_prepend(str(REPO / "tests"))
    with pytest.raises(SearchSpaceError) as e:
        space(proxy={"model": "py:_user_model:make_model"})
    assert set(problems(e)) == {"rules"} and problems(e)["rules"].allowed == sorted(rule_set_names())
    assert space(rules="nanogpt", proxy={"model": "py:_user_model:make_model"}).rules == "nanogpt"
    pytest.importorskip("transformers", reason="hf: models need Hugging Face transformers")
    # Rule: Hugging Face models are valid proxies and bring their own rule sets.
    assert space(proxy={"model": "hf:gpt2", "model_args": {"n_layer": 2}}).rules == "gpt2"
    assert apply_overrides(s, ["proxy.model_args={num_hidden_layers: 2}"], model="hf:llama").rules == "llama"
    with pytest.raises(SearchSpaceError) as e:
        space(proxy={"model": "hf:llama", "model_args": {"n_layers": 2}})
    # Rule: a bad model field is reported under proxy.model_args, listing the config's fields.
    assert "num_hidden_layers" in problems(e)["proxy.model_args.n_layers"].allowed


def test_a_wrong_model_is_its_own_problem_not_rules_missing():
    pytest.importorskip("transformers", reason="hf: models need Hugging Face transformers")
    # Rule: a space whose rules come from its model reports a wrong model (or model field)
    # once, as the model's problem; "rules: missing" would only be its consequence.
    for proxy, key in [({"model": "hf:bogus"}, "proxy.model"),
                       ({"model": "hf:mistral", "model_args": {"num_layers": 1}}, "proxy.model_args.num_layers")]:
        with pytest.raises(SearchSpaceError) as e:
            space(proxy=proxy)
        assert set(problems(e)) == {key}, str(e.value)
        assert "\n" not in str(e.value) and len(str(e.value)) <= 360


def test_a_long_list_of_allowed_values_is_cut_to_a_line_and_points_to_where_it_is_whole(tmp_path):
    pytest.importorskip("transformers", reason="hf: models need Hugging Face transformers")
    (tmp_path / "bert").mkdir()
    (tmp_path / "bert" / "config.json").write_text('{"model_type": "bert"}')
    for proxy in [{"model": f"hf:{tmp_path / 'bert'}"}, {"model": "hf:gpt2", "model_args": {"n_layers": 2}}]:
        with pytest.raises(SearchSpaceError) as e:
            space(proxy=proxy)
        msg = str(e.value)
        # Rule: at most 360 characters, so that the command's line stays within 400 (the
        # model types were a line of 1,942 characters).
        assert len(msg) <= 360 and "\n" not in msg, msg
    # Rule: the model types are not listed; the message says which command lists them ...
    with pytest.raises(SearchSpaceError) as e:
        space(proxy={"model": f"hf:{tmp_path / 'bert'}"})
    assert "(geosearch inspect --models lists them)" in str(e.value) and "afmoe" not in str(e.value)
    # ... and a long list of fields is cut, saying how many it leaves out, after a near miss.
    with pytest.raises(SearchSpaceError) as e:
        space(proxy={"model": "hf:gpt2", "model_args": {"n_layers": 2}})
    assert "(did you mean n_layer" in str(e.value) and str(e.value).endswith(" more")


# ---------------------------------------------------------------------- numbers
def _nested(path, value):
    """``{"a": {"b": value}}`` for the path ``a.b``."""
    *parents, last = path.split(".")
    d = {last: value}
    for p in reversed(parents):
        d = {p: d}
    return d


@pytest.mark.parametrize("path", sorted(space_limits()))
def test_every_number_key_refuses_nan_inf_and_out_of_range_with_the_key_and_the_range(path):
    allowed = space_limits()[path]
    changes = _nested(path, None)
    if path.startswith("pruner.loss."):  # an argument of a loss pruner that takes it
        arg = path.rsplit(".", 1)[1]
        changes["pruner"]["loss"]["type"] = next(t for t, args in LOSS_PRUNER_ARGS.items() if arg in args)
    # Rule: one rule for every number key: NaN and ±inf are never in range, and every whole
    # count has an upper bound (steps: 10**30 promised a run that never ends); the message
    # names the key and gives the range.
    for bad in ([10**30, 2.5] if allowed.whole else [math.nan, math.inf, -math.inf]):
        leaf = changes
        for part in path.split(".")[:-1]:
            leaf = leaf[part]
        leaf[path.split(".")[-1]] = bad
        with pytest.raises(SearchSpaceError) as e:
            space(**changes)
        found = problems(e)
        assert path in found, str(e.value)
        assert found[path].problem.startswith(f"expected {allowed.text}") and f"got {bad!r}" in found[path].problem


def test_every_number_field_of_every_section_has_a_range():
    import dataclasses

    from geosearch.proxy.config import TrainConfig
    from geosearch.search.space.horizon import LadderSpec, TargetSpec
    from geosearch.search.space.sections import Budget, PrunerSpec, SamplerSpec

    sections = {"proxy": TrainConfig, "target": TargetSpec, "ladder": LadderSpec, "budget": Budget,
                "pruner": PrunerSpec, "sampler": SamplerSpec}
    numbers = {f"{name}.{f.name}" for name, cls in sections.items() for f in dataclasses.fields(cls)
               if str(f.type).split(" |")[0] in ("int", "float")}
    numbers |= {f"pruner.loss.{a}" for args in LOSS_PRUNER_ARGS.values() for a in args}
    numbers |= {"repeats", "max_repeats"}
    # Rule: no number key escapes the one rule: a new field needs its range in the table.
    assert numbers <= set(space_limits()), sorted(numbers - set(space_limits()))
    assert len(numbers) > 40


def test_the_ranges_are_documented_as_the_schema_has_them():
    text = (REPO / "docs" / "design.md").read_text(encoding="utf-8")
    # Rule: docs/design.md's table of number keys is space_limits(), row for row.
    rows = [f"| `{path}` | {allowed.text} |" for path, allowed in space_limits().items()]
    start = text.index("| key | allowed values |")
    documented = text[start:].split("\n\n")[0].splitlines()[2:]
    assert documented == rows


# ---------------------------------------------------------------------- hyperparams
def test_hyperparameter_ranges():
    s = space(hyperparams={"spectral_lr": [0.005, 0.05], "lr": ["1e-4", 3.0e-3]},
              budget={"trials": 100})
    # Rule: ranges are log-uniform [low, high]; YAML 1.1's string "1e-4" is a number too.
    assert (s.hyperparams.lr.low, s.hyperparams.lr.high) == (1e-4, 3e-3)
    # Rule: continuous parameters make the space infinite and auto picks TPE.
    assert s.grid_size() == math.inf and s.sampler_type() == "tpe"
    with pytest.raises(SearchSpaceError) as e:
        space(hyperparams={"spectral_lr": [0.05, 0.005], "lr": 3e-4, "momentum": [0.9, 0.99]},
              budget={"trials": 5})
    found = problems(e)
    # Rule: low < high; a range is two numbers; only spectral_lr and lr are searchable (and
    # the step grid, finite).
    assert "0 < low < high" in found["hyperparams.spectral_lr"].problem
    assert "expected [low, high]" in found["hyperparams.lr"].problem
    assert found["hyperparams.momentum"].allowed == ["spectral_lr", "lr", "step_grid", "step_halving"]
    with pytest.raises(SearchSpaceError) as e:
        space(hyperparams={"spectral_lr": {"oblique": [0.01, 0.1]}}, budget={"trials": 5})
    # Rule: a per-geometry range needs a manifold geometry of this space.
    assert problems(e)["hyperparams.spectral_lr.oblique"].allowed == ["dgram", "stiefel"]


def test_grid_needs_a_finite_space():
    with pytest.raises(SearchSpaceError) as e:
        space(hyperparams={"lr": [1e-4, 1e-3]}, sampler={"type": "grid"})
    err = problems(e)["sampler.type"]
    # Rule: a grid over continuous parameters is an error naming them and the other samplers.
    assert "hyperparams.lr is continuous" in err.problem
    assert err.allowed == ["auto", "tpe", "random", "gp"]


# ---------------------------------------------------------------------- pruner
def test_pruner_errors():
    with pytest.raises(SearchSpaceError) as e:
        space(pruner={"max_logit": 50, "trend_min_logit": 80, "interval": 1.5,
                      "loss": {"type": "percentile"}})
    found = problems(e)
    # Rule: a key of the removed step-wise trend rule is one error saying what replaced it.
    assert "removed: the step-wise logit trend was replaced by a forecast in Σ η to the target" in found[
        "pruner.trend_min_logit"].problem
    # Rule: the forecast's interval is checked by its range, which the message gives.
    assert found["pruner.interval"].problem == "expected a number in (0, 1) or null, got 1.5"
    # Rule: the percentile pruner needs its percentile.
    assert "pruner.loss.percentile" in found
    with pytest.raises(SearchSpaceError) as e:
        space(pruner={"loss": {"type": "percentile", "percentile": 120}})
    # Rule: each argument is in its range, given in the message.
    assert problems(e)["pruner.loss.percentile"].problem == "expected a number in [0, 100], got 120"
    with pytest.raises(SearchSpaceError) as e:
        space(pruner={"loss": {"type": "successive_halving", "min_resource": "auto", "bootstrap_count": 2}})
    # Rule: Optuna's own checks come through, keyed to the loss pruner.
    assert "mutually incompatible" in problems(e)["pruner.loss"].problem
    with pytest.raises(SearchSpaceError) as e:
        space(pruner={"loss": {"type": "successive_halving", "patience": 3}})
    # Rule: each loss pruner accepts its own arguments only, listed on error.
    assert "reduction_factor" in problems(e)["pruner.loss.patience"].allowed
    with pytest.raises(SearchSpaceError) as e:
        space(pruner={"loss": "hyperband"})
    assert problems(e)["pruner.loss.type"].allowed == ["none", "median", "percentile",
                                                       "successive_halving"]


# ---------------------------------------------------------------------- proxy
def test_proxy_errors():
    with pytest.raises(SearchSpaceError) as e:
        space(proxy={"model_args": {"n_layers": 2},
                     "optimizer_args": {"lr": 0.1, "dual_step": 3, "dual_steps": 0}})
    found = problems(e)
    # Rule: model_args are GPTConfig fields, listed on error.
    assert "n_layer" in found["proxy.model_args.n_layers"].allowed
    # Rule: optimizer_args take build_optimizer settings that are not TrainConfig fields.
    assert found["proxy.optimizer_args.lr"].problem == "set it as proxy.lr"
    assert "dual_steps" in found["proxy.optimizer_args.dual_step"].allowed
    assert "proxy.optimizer_args.dual_steps" in found
    s = space(proxy={"model": "tiny", "steps": 20, "lr": "1e-3", "optimizer_args": {"dual_steps": 5}})
    # Rule: proxy is a TrainConfig (numeric strings accepted, as TrainConfig does).
    assert (s.proxy.model, s.proxy.steps, s.proxy.lr) == ("tiny", 20, 1e-3)


def test_max_repeats_and_baselines_are_checked_and_round_trip():
    from geosearch.search.space.spec import SearchSpace, apply_overrides, load_space

    base = {"version": 1, "geometries": {"attn": ["stiefel"], "mlp": ["dgram"]}, "proxy": {"model": "tiny"}}
    space = SearchSpace.from_dict({**base, "repeats": 2, "max_repeats": 3, "baselines": ["muon_qkclip"]})
    assert (space.max_repeats, space.baselines) == (3, ("muon_qkclip",))
    assert SearchSpace.from_dict(space.to_dict()) == space
    assert SearchSpace.from_dict(base).baselines == ("adamw", "muon")  # the schema's default
    with pytest.raises(ConfigError, match=r"max_repeats: expected at least repeats \(2\), got 1"):
        SearchSpace.from_dict({**base, "repeats": 2, "max_repeats": 1})
    with pytest.raises(ConfigError, match=r"baselines: a baseline is listed twice"):
        SearchSpace.from_dict({**base, "baselines": ["muon", "muon"]})
    assert apply_overrides(load_space("default"), ["baselines=[]"]).baselines == ()


def test_header_prints_the_steps_the_study_trains():
    from geosearch.search.space.spec import apply_overrides, load_space

    # 4 points x (the stability rung's 200, one seed + 2 x 400 ranked) + adamw 2 x 400 (no
    # stability rung: no spectral step) + muon 200 + 2 x 400; + 4 x 400 adaptive seeds
    text = header(load_space("default"))
    assert "the stability rung (200 steps, 1 seed) (1,000 steps each)" in text
    assert "baselines (reported, never exported) adamw 800, muon 1,000" in text
    assert "= 5,800 steps; up to 7,400 with adaptive seeds (max_repeats 3" in text
    plan = plan_study(load_space("default"))
    assert (plan.least_steps, plan.most_steps) == (5800, 7400)  # the plan holds what it prints
    off = header(apply_overrides(load_space("default"), ["baselines=[]", "max_repeats=2"]))
    assert "= 4,000 steps" in off and "adaptive" not in off
    bare = header(apply_overrides(load_space("default"), ["ladder.stability_steps=null",
                                                          "baselines=[]", "max_repeats=2"]))
    assert "= 3,200 steps" in bare and "stability" not in bare


def test_step_grid():
    s = space(hyperparams={"step_grid": [0.5, 1, "2"]})
    # Rule: a step grid is finite: every point at every factor, searched exhaustively, the
    # factor a categorical of each point; the run's spectral_lr is the proxy's × the factor.
    assert s.hyperparams.step_grid == (0.5, 1.0, 2.0)
    assert s.grid_size() == 3 * math.prod(len(v) for v in s.geometries.values())
    assert s.sampler_type() == "grid" and s.categorical_choices()["step_factor"] == [0.5, 1.0, 2.0]
    fixed = {f"geometry.{k}": v[0] for k, v in s.geometries.items()} | {"step_factor": 2.0}
    suggestion = s.suggest(optuna.trial.FixedTrial(fixed))
    assert suggestion.step_factor == 2.0
    assert s.train_config(suggestion).spectral_lr == pytest.approx(2 * s.proxy.spectral_lr)
    assert "step grid x0.5, x1, x2" in header(s)
    # Rule: it round-trips; a space without it dumps no key (stored studies read as before).
    assert type(s).from_dict(s.to_dict(), source="x").hyperparams.step_grid == (0.5, 1.0, 2.0)
    assert "step_grid" not in space().to_dict()["hyperparams"]
    # Rule: 2-5 distinct factors in [0.01, 100], 1 among them; else one line naming the key.
    for bad in ([1], [0.5, 2], [0.5, 1, 1], [1, 2, 3, 4, 5, 6], [1, 1000], [1, True], [1, "x"],
                "0.5,1", {"a": 1}):
        with pytest.raises(SearchSpaceError) as e:
            space(hyperparams={"step_grid": bad})
        assert list(problems(e)) == ["hyperparams.step_grid"], bad
        assert "\n" not in str(e.value) and "1 among them" in str(e.value)
    # Rule: with a searched spectral_lr (a range, or per geometry), or a shared step of 0, it
    # is refused in one line.
    for hp, proxy in (({"spectral_lr": [0.01, 0.1]}, {}), ({}, {"spectral_lr": 0})):
        with pytest.raises(SearchSpaceError) as e:
            space(hyperparams={"step_grid": [1, 2], **hp}, proxy=proxy, budget={"trials": 5})
        assert list(problems(e)) == ["hyperparams.step_grid"]


def test_header_counts_the_baselines_at_each_factor_of_a_step_grid():
    from geosearch.search.space.spec import apply_overrides, load_space

    # the default's steps (above) with a 3-factor full grid: 12 points x 1,000 + each
    # baseline at the 3 factors: adamw 3 x 800, muon 3 x 1,000
    text = header(apply_overrides(load_space("default"), ["hyperparams.step_grid=[0.5,1,2]",
                                                          "hyperparams.step_halving=false"]))
    assert ("baselines (reported, never exported, each at the 3 steps of the grid) adamw 2,400 (3 x 800), "
            "muon 3,000 (3 x 1,000)") in text
    assert "12 points (assignment x step)" in text and "= 17,400 steps" in text
    assert "every seed at every step" in text
    # by successive halving (the default with a grid): 4 shared-step points x 800 (both
    # seeds) + 8 others x 400 (one) + 4 stability rungs x 200; adamw 800 + 2 x 400, muon the
    # same + 200; up to 6 promotions x 400 where a best step is not the shared one, 8 + 2
    # more stability rungs where a larger step fails it; adaptive seeds: 4 x 400
    text = header(apply_overrides(load_space("default"), ["hyperparams.step_grid=[0.5,1,2]"]))
    assert "successive halving: every seed at the shared step, 1 at the others, the rest at the best" in text
    assert ("4 points at the shared step x 2 seed(s) (800 steps each) + 8 at the other steps x 1 seed "
            "(400 each)") in text
    assert "adamw 1,600, muon 1,800 = 10,600 steps (step halving)" in text
    assert "+ up to 2,400 where a best step is not the shared one" in text
    assert "+ up to 2,000 where a larger step fails the stability rung" in text
    assert "+ up to 1,600 with adaptive seeds" in text


def test_step_halving():
    # Rule: on by default with a step grid; false trains every seed at every step; it
    # round-trips, and is dumped only with a grid.
    s = space(hyperparams={"step_grid": [0.5, 1, 2]})
    assert s.hyperparams.step_halving and s.to_dict()["hyperparams"]["step_halving"] is True
    full = space(hyperparams={"step_grid": [0.5, 1, 2], "step_halving": False})
    assert type(full).from_dict(full.to_dict(), source="x").hyperparams.step_halving is False
    assert "step_halving" not in space().to_dict()["hyperparams"]
    # Rule: not a boolean: one line naming the key and the allowed values.
    with pytest.raises(SearchSpaceError) as e:
        space(hyperparams={"step_grid": [1, 2], "step_halving": "yes"})
    assert list(problems(e)) == ["hyperparams.step_halving"]
    assert problems(e)["hyperparams.step_halving"].allowed == ["true", "false"]
    # Rule: a space whose grid is removed (--set hyperparams.step_grid=null) keeps its key
    # without effect: one answer, at the shared step.
    from geosearch.search.space.spec import apply_overrides, load_space
    shared = apply_overrides(load_space("paper"), ["hyperparams.step_grid=null"])
    assert shared.grid_size() == 4 and "step_halving" not in shared.to_dict()["hyperparams"]
