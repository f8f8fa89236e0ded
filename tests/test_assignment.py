"""Assignments: shorthands, parsing, validation messages and the YAML round trip."""

from __future__ import annotations

import copy
import dataclasses
import pickle
import textwrap

import pytest
import torch
import yaml

import geosearch
from geosearch.assignment import Assignment, geometry_names, load_assignment
import geosearch.manifolds as registry
from geosearch.util.errors import ConfigError
from geosearch.manifolds import get_manifold, manifold_names, register_manifold
from geosearch.rules.modules import ModuleRule


def test_geometries_come_from_the_manifold_registry():
    # Allowed geometries = every registered manifold + "adamw" (so a new manifold is
    # accepted everywhere at once).
    assert geometry_names() == [*manifold_names(), "adamw"]
    assert {"stiefel", "dgram", "euclidean"} <= set(geometry_names())


def test_shorthands_cover_their_family_and_per_type_entries_win():
    a = Assignment({"attn": "stiefel", "mlp": "dgram", "attn_out": "euclidean"})
    assert a.resolve() == {"attn_qkv": "stiefel", "attn_out": "euclidean", "mlp_in": "dgram", "mlp_out": "dgram"}
    s = Assignment({"attn": "stiefel", "attn_k": "dgram", "mlp": "adamw"}, rules="nanogpt_split")
    assert s.resolve() == {"attn_q": "stiefel", "attn_k": "dgram", "attn_v": "stiefel", "attn_out": "stiefel",
                           "mlp_in": "adamw", "mlp_out": "adamw"}


def test_shorthand_options_merge_key_by_key():
    a = Assignment({"attn": "stiefel", "mlp": "dgram", "attn_out": "adamw"},
                   options={"attn": {"lr": 0.01, "solver": "dual"}, "attn_qkv": {"lr": 0.05}})
    opts = a.resolve_options()
    # Per-type keys win; the shorthand's other keys still reach the type.
    assert opts["attn_qkv"] == {"lr": 0.05, "solver": "dual"}
    # A shorthand option that the type's geometry does not take is not applied to it.
    assert opts["attn_out"] == {"lr": 0.01}
    assert opts["mlp_in"] == {}


def test_parse_geometries_and_options():
    a = Assignment.parse(" attn=stiefel , mlp=dgram, attn.lr=0.01, mlp.solver=dual, mlp_out.nesterov=false")
    assert a.geometry == {"attn": "stiefel", "mlp": "dgram"}
    assert a.options == {"attn": {"lr": 0.01}, "mlp": {"solver": "dual"}, "mlp_out": {"nesterov": False}}
    assert Assignment.parse("attn_q=stiefel,attn_k=dgram,attn_v=stiefel,attn_out=stiefel,mlp=dgram",
                            rules="nanogpt_split").resolve()["attn_k"] == "dgram"


@pytest.mark.parametrize("text, expected", [
    # typo in a geometry: names the item and lists every allowed geometry
    ("attn=stiefle,mlp=dgram", ["--assign: attn: unknown geometry 'stiefle'", "stiefel", "dgram", "adamw"]),
    ("attn_x=stiefel,mlp=dgram", ["attn_x: unknown module type 'attn_x' for rule set 'nanogpt'",
                                  "attn_qkv, attn_out, mlp_in, mlp_out, attn, mlp"]),
    ("attn stiefel", ["expected 'type=geometry' or 'type.option=value', got 'attn stiefel'"]),
    ("attn=stiefel,attn=dgram", ["'attn' is given twice"]),
    ("attn=stiefel", ["no geometry for module type(s) mlp_in, mlp_out of rule set 'nanogpt'"]),
    ("attn=stiefel,mlp=dgram,mlp.foo=1", ["--assign: mlp.foo: unknown option 'foo' for family 'mlp'", "solver"]),
    ("attn=stiefel,mlp=dgram,mlp.lr=fast", ["--assign: mlp.lr: expected a number > 0, got 'fast'"]),
    ("", ["no 'type=geometry' item"]),
])
def test_parse_errors(text, expected):
    with pytest.raises(ConfigError) as e:
        Assignment.parse(text)
    for part in expected:
        assert part in str(e.value)


def test_constructor_validates_and_copies():
    with pytest.raises(ConfigError, match="geometry.mlp: unknown geometry 'dgarm'"):
        Assignment({"attn": "stiefel", "mlp": "dgarm"})
    d = {"version": 1, "geometry": {"attn": "stiefel", "mlp": "dgram"}, "options": {"mlp": {"lr": "6e-4"}}}
    a = Assignment.from_dict(d)
    # PyYAML reads 6e-4 as a string; a number-looking string is taken as the number.
    assert a.options == {"mlp": {"lr": 6e-4}}
    assert d["options"]["mlp"]["lr"] == "6e-4"  # the caller's data is left alone


def test_frozen_once_checked():
    a = Assignment({"attn": "stiefel", "mlp": "dgram"}, options={"attn": {"lr": 0.01}},
                   provenance={"trials": [1, 2], "proxy": {"steps": 200}})
    # Rule: nothing can be changed after the one validation, not even inside a mapping.
    with pytest.raises(TypeError):
        a.geometry["mlp"] = "hyperbolic"
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.geometry = {"attn": "stiefel", "mlp": "hyperbolic"}
    with pytest.raises(TypeError):
        a.provenance["proxy"]["steps"] = 1
    with pytest.raises(TypeError):
        a.options["attn"]["lr"] = 1.0
    # Rule: what the checks catch is caught at construction, with the same messages.
    with pytest.raises(ConfigError, match="geometry.mlp: unknown geometry 'hyperbolic'.*stiefel.*adamw"):
        dataclasses.replace(a, geometry={"attn": "stiefel", "mlp": "hyperbolic"})
    with pytest.raises(ConfigError, match="geometry.attn_q: unknown module type 'attn_q' for rule set 'nanogpt'; "
                                          "expected one of: attn_qkv, attn_out, mlp_in, mlp_out"):
        Assignment({"attn": "stiefel", "mlp": "dgram", "attn_q": "stiefel"})
    # Rule: a frozen assignment still pickles and copies (workers, deep copies), and to_dict is plain.
    assert pickle.loads(pickle.dumps(a)) == a == copy.deepcopy(a)
    assert type(a.to_dict()["geometry"]) is dict and a.to_dict()["provenance"] == {"trials": [1, 2],
                                                                                  "proxy": {"steps": 200}}


def test_global_settings_are_checked_and_saved(tmp_path):
    a = Assignment({"attn": "stiefel", "mlp": "dgram"}, settings={"spectral_lr": "5e-2", "betas": [0.9, 0.99]})
    # Rule: settings are normalised through the catalog (the YAML "5e-2" string quirk included).
    assert a.settings == {"spectral_lr": 0.05, "betas": (0.9, 0.99)}
    assert a.to_dict()["settings"] == {"spectral_lr": 0.05, "betas": [0.9, 0.99]}
    assert load_assignment(a.save(tmp_path / "a.yaml")) == a
    # Rule: files without settings (schema version 1, before they existed) load with none.
    old = tmp_path / "old.yaml"
    old.write_text(GOOD)
    assert load_assignment(old).settings == {} and "settings" not in load_assignment(old).to_dict()


def test_a_geometry_registered_later_is_accepted(monkeypatch):
    class Scaled(type(get_manifold("stiefel"))):
        name = "scaled_stiefel"

    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))  # undone after the test
    register_manifold(Scaled)
    # Rule: the names come from the registry at each call, so a new geometry is accepted at once.
    assert "scaled_stiefel" in geometry_names()
    assert Assignment({"attn": "scaled_stiefel", "mlp": "dgram"}).resolve()["attn_out"] == "scaled_stiefel"


def custom_rules():
    return [
        ModuleRule("attn_qkv", r"(^|\.)attn\.c_attn\.weight$", "attn", split=("attn_q", "attn_k", "attn_v"),
                   layout="in_out"),
        ModuleRule("mlp_in", r"(^|\.)mlp\.c_fc\.weight$", "mlp", layout="in_out"),
    ]


@pytest.mark.parametrize("assignment", [
    Assignment({"attn": "stiefel", "mlp": "dgram"}),
    Assignment({"attn": "stiefel", "attn_k": "dgram", "mlp": "adamw"}, rules="nanogpt_split",
               options={"attn": {"lr": 0.01, "solver": "dual", "warm_start": True},
                        "mlp_out": {"betas": [0.9, 0.99], "weight_decay": 0.0}},
               provenance={"study": "default", "score": 3.3544, "trials": [1, 2, 3],
                           "proxy": {"preset": "tiny", "steps": 200}, "note": None}),
    Assignment({"attn_q": "stiefel", "attn_k": "dgram", "attn_v": "euclidean", "mlp_in": "oblique"},
               rules=custom_rules(), options={"attn_v": {"ns_steps": 7}}),
], ids=["plain", "split-options-provenance", "custom-rules"])
def test_yaml_round_trip_is_lossless(tmp_path, assignment):
    path = assignment.save(tmp_path / "sub" / "best.yaml")
    loaded = geosearch.load_assignment(path)
    assert loaded == assignment
    assert loaded.resolve() == assignment.resolve()
    assert loaded.resolve_options() == assignment.resolve_options()
    # ...and saving again writes the same bytes.
    assert loaded.to_yaml(path) == path.read_text()


def test_saved_file_is_readable_and_says_how_to_load_it(tmp_path):
    path = tmp_path / "best.yaml"
    Assignment({"attn": "stiefel", "mlp": "dgram"}, provenance={"score": 3.35}).save(path)
    text = path.read_text()
    assert text.startswith("# geosearch assignment")
    assert f"geosearch.load_assignment('{path}')" in text
    body = [line for line in text.splitlines() if not line.startswith("#")]
    assert body == ["version: 1", "rules: nanogpt", "geometry:", "  attn: stiefel", "  mlp: dgram",
                    "provenance:", "  score: 3.35"]


def test_provenance_must_be_plain_data():
    a = Assignment({"attn": "stiefel", "mlp": "dgram"}, provenance={"score": torch.tensor(3.5), "t": (1, 2)})
    assert a.to_dict()["provenance"] == {"score": 3.5, "t": [1, 2]}  # scalars and tuples made YAML-safe
    with pytest.raises(ConfigError, match=r"provenance.extra.obj: cannot be saved as YAML: object"):
        Assignment({"attn": "stiefel", "mlp": "dgram"}, provenance={"extra": {"obj": object()}})


GOOD = """\
version: 1
rules: nanogpt
geometry: {attn: stiefel, mlp: dgram}
"""


# (case id, file text, substrings the message must contain: key path, problem, allowed values)
BAD_YAML = [
    ("unknown-top-key", GOOD + "geometri: {}\n",
     ["geometri: unknown key 'geometri'", "version, rules, geometry, options, provenance"]),
    ("bad-version", GOOD.replace("version: 1", "version: 2"),
     ["version: unsupported schema version 2", "expected one of: 1"]),
    ("missing-version", GOOD.replace("version: 1\n", ""), ["version: missing schema version", "expected one of: 1"]),
    ("missing-geometry", "version: 1\n", ["geometry: missing key"]),
    ("unknown-module-type", GOOD.replace("mlp: dgram", "mlp: dgram, attn_qq: stiefel"),
     ["geometry.attn_qq: unknown module type 'attn_qq'", "attn_qkv, attn_out, mlp_in, mlp_out, attn, mlp"]),
    ("split-type-on-fused-rules", GOOD.replace("mlp: dgram", "mlp: dgram, attn_q: stiefel"),
     ["geometry.attn_q: unknown module type 'attn_q' for rule set 'nanogpt'"]),
    ("unknown-geometry", GOOD.replace("mlp: dgram", "mlp: dgarm"),
     ["geometry.mlp: unknown geometry 'dgarm'", "stiefel", "dgram", "adamw"]),
    ("unknown-option", GOOD + "options: {attn_qkv: {lrr: 0.1}}\n",
     ["options.attn_qkv.lrr: unknown option 'lrr' for 'attn_qkv' (stiefel)",
      "lr, momentum, nesterov, solver, dual_steps, dual_lr, dual_tol, warm_start, ns_steps"]),
    ("option-of-other-geometry", GOOD.replace("mlp: dgram", "mlp: adamw") + "options: {mlp_in: {solver: dual}}\n",
     ["options.mlp_in.solver: unknown option 'solver' for 'mlp_in' (adamw)", "lr, betas, eps, weight_decay"]),
    ("no-decay-on-manifold", GOOD + "options: {attn: {weight_decay: 0.1}}\n",
     ["options.attn.weight_decay: unknown option 'weight_decay' for family 'attn'"]),
    ("no-muon-scale-on-manifold", GOOD + "options: {attn: {muon_scale: none}}\n",
     ["options.attn.muon_scale: unknown option 'muon_scale' for family 'attn'"]),
    ("option-type", GOOD + "options: {attn_qkv: {lr: fast}}\n", ["options.attn_qkv.lr: expected a number > 0, got 'fast'"]),
    ("option-range", GOOD + "options: {mlp: {momentum: 1.5}}\n", ["options.mlp.momentum: expected a number in [0, 1)"]),
    ("option-bool", GOOD + "options: {mlp: {nesterov: 1}}\n", ["options.mlp.nesterov: expected true or false"]),
    ("option-count", GOOD + "options: {mlp: {dual_steps: 2.5}}\n", ["options.mlp.dual_steps: expected a whole number"]),
    ("option-solver", GOOD + "options: {mlp: {solver: newton}}\n",
     ["options.mlp.solver: expected a solver name, got 'newton'", "expected one of: project, dual"]),
    ("options-not-mapping", GOOD + "options: {mlp: 0.1}\n", ["options.mlp: expected a mapping of option -> value"]),
    ("unknown-rule-set", GOOD.replace("rules: nanogpt", "rules: llama2"),
     ["rules: unknown rule set 'llama2'", "nanogpt, nanogpt_split"]),
    ("rule-bad-layout", GOOD.replace("rules: nanogpt", "rules: [{type: t, pattern: x, family: attn, layout: oi}]"),
     ["rules[0].layout: unknown layout 'oi'", "out_in, in_out"]),
    ("rule-unknown-key", GOOD.replace("rules: nanogpt", "rules: [{type: t, pattern: x, family: attn, splitt: []}]"),
     ["rules[0].splitt: unknown key 'splitt'", "type, pattern, family, split, layout"]),
    ("rule-bad-regex", GOOD.replace("rules: nanogpt", "rules: [{type: t, pattern: 'x(', family: attn}]"),
     ["rules[0].pattern: rule 't': pattern 'x(' is not a regular expression"]),
    ("rule-missing-family", GOOD.replace("rules: nanogpt", "rules: [{type: t, pattern: x}]"),
     ["rules[0].family: missing, or not a string"]),
    ("missing-types", GOOD.replace("mlp: dgram", "mlp_in: dgram"),
     ["geometry: no geometry for module type(s) mlp_out of rule set 'nanogpt'"]),
    ("provenance-not-mapping", GOOD + "provenance: [1, 2]\n", ["provenance: expected a mapping"]),
    ("unknown-setting", GOOD + "settings: {learning_rate: 0.1}\n",
     ["settings.learning_rate: unknown setting 'learning_rate'", "lr, spectral_lr, betas, eps, weight_decay"]),
    ("setting-range", GOOD + "settings: {momentum: 1.5}\n", ["settings.momentum: expected a number in [0, 1)"]),
    ("layout-is-no-setting", GOOD + "settings: {split: 3}\n", ["settings.split: unknown setting 'split'"]),
    ("settings-not-mapping", GOOD + "settings: [lr]\n", ["settings: expected a mapping of setting -> value"]),
    ("alias-bomb", "a: &a [x, x, x, x, x, x, x, x, x, x]\nb: &b [" + ", ".join(["*a"] * 10) + "]\nc: ["
     + ", ".join(["*b"] * 10) + "]\nd: [" + ", ".join(["*b"] * 90) + "]\n",
     ["malformed YAML at line 4, column", "more than 100 aliases"]),
    ("not-a-mapping", "- attn\n- stiefel\n", ["expected a mapping with keys version, rules, geometry"]),
    ("empty", "", ["empty file"]),
    ("malformed", "version: 1\ngeometry: {attn: stiefel\nrules: nanogpt\n", ["malformed YAML at line 3, column"]),
    ("tab-indent", "version: 1\ngeometry:\n\tattn: stiefel\n", ["malformed YAML at line 3"]),
]


@pytest.mark.parametrize("text, expected", [c[1:] for c in BAD_YAML], ids=[c[0] for c in BAD_YAML])
def test_bad_yaml_messages_name_file_key_and_allowed(tmp_path, text, expected):
    path = tmp_path / "assignment.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as e:
        load_assignment(path)
    msg = str(e.value)
    assert msg.startswith(f"{path}: "), msg  # every message names the file first
    for part in expected:
        assert part in msg, msg


def test_missing_file(tmp_path):
    with pytest.raises(ConfigError, match=r"nope\.yaml: file not found"):
        load_assignment(tmp_path / "nope.yaml")


def test_good_yaml_written_by_hand(tmp_path):
    path = tmp_path / "a.yaml"
    path.write_text(textwrap.dedent("""\
        version: 1
        rules: nanogpt_split
        geometry:
          attn: stiefel
          attn_k: dgram
          mlp: dgram
        options:
          attn: {lr: 6e-3}
        """))
    a = load_assignment(path)
    assert a.resolve()["attn_k"] == "dgram" and a.resolve()["attn_q"] == "stiefel"
    assert a.resolve_options()["attn_v"] == {"lr": 6e-3}
    assert yaml.safe_load(a.to_yaml())["options"] == {"attn": {"lr": 6e-3}}


def test_a_rule_default_fills_a_type_the_assignment_does_not_name(tmp_path):
    # Rule: routers (family routing, default adamw) keep AdamW under attn=/mlp=, and can be named;
    # the default survives a custom rule list's round trip through YAML.
    a = Assignment.parse("attn=stiefel,mlp=dgram", rules="mixtral")
    assert a.resolve()["router"] == "adamw" and a.resolve()["moe_gate"] == "dgram"
    assert Assignment.parse("attn=stiefel,mlp=dgram,router=stiefel", rules="mixtral").resolve()["router"] == "stiefel"
    assert Assignment.parse("attn=stiefel,mlp=dgram,routing=oblique", rules="mixtral").resolve()["router"] == "oblique"
    rules = (ModuleRule("mlp_in", r"fc\.weight$", "mlp"), ModuleRule("router", r"gate\.weight$", "routing",
                                                                       default="adamw"))
    loaded = load_assignment(Assignment({"mlp": "dgram"}, rules=rules).save(tmp_path / "a.yaml"))
    assert loaded.rules == rules and loaded.resolve() == {"mlp_in": "dgram", "router": "adamw"}
    with pytest.raises(ConfigError, match="unknown default geometry 'sgd'"):
        Assignment({"mlp": "dgram"}, rules=(rules[0], ModuleRule("router", r"g$", "routing", default="sgd")))
