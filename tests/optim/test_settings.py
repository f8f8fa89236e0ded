"""The settings catalog: one table that the optimizer, build_optimizer and assignments read."""

from __future__ import annotations

import inspect
import subprocess
import sys
from dataclasses import replace

import pytest
import torch
from torch import nn

from geosearch.assignment import Assignment
from geosearch.util.errors import ConfigError
from geosearch.manifolds import ADAMW, manifold_names
from geosearch.build import build_optimizer
from geosearch.optim import ManifoldMuon
from geosearch.optim import settings
from geosearch.build import DEFAULTS
from geosearch.optim.muon import ADAMW_DEFAULTS, MUON_DEFAULTS, SOLVERS
from geosearch.optim.solvers import manifold_muon_update

# (setting, a bad value, words of the message)
BAD = [
    ("lr", 0, "expected a number > 0, got 0"),
    ("lr", "fast", "expected a number > 0, got 'fast'"),
    # Rule: NaN and inf are in no range, and the message gives the range.
    ("spectral_lr", float("nan"), "expected a number > 0, got nan"),
    ("eps", float("inf"), "expected a number > 0, got inf"),
    ("weight_decay", ".nan", "expected a number >= 0, got '.nan'"),
    ("momentum", 1.0, "expected a number in [0, 1), got 1.0"),
    ("nesterov", 1, "expected true or false"),
    ("dual_steps", 2.0, "expected a whole number in [1, 10,000], got 2.0"),
    ("ns_steps", True, "expected a whole number in [1, 10,000]"),
    # Rule: a count has an upper bound (10**12 Newton-Schulz steps ran out of memory).
    ("ns_steps", 10**12, "expected a whole number in [1, 10,000], got 1000000000000"),
    ("dual_tol", -1e-3, "expected a number >= 0"),
    ("betas", [0.9], "expected two numbers in [0, 1)"),
    ("betas", [0.9, 1.0], "expected two numbers in [0, 1)"),
    ("betas", "0.9,0.95", "expected two numbers in [0, 1)"),
    ("solver", "newton", "expected a solver name, got 'newton'; expected one of: project, dual"),
    ("ns_coefficients", "keller", "expected a coefficient set, got 'keller'; expected one of: polar_express, quintic"),
    ("muon_scale", None, "expected a shape scale, got None; expected one of: keller, none"),
    ("muon_scale", "original", "expected a shape scale, got 'original'; expected one of: keller, none"),
    ("split_dim", 2, "expected 0 or 1, got 2; expected one of: 0, 1"),
]


def test_every_default_is_a_valid_value_of_its_kind():
    for s in settings.SETTINGS.values():
        # Rule: the catalog's own defaults pass its checks unchanged (numbers as floats).
        assert settings.check(s.name, s.default) == s.default, s.name
        assert s.kind in settings.KINDS and set(s.scope) <= set(settings.SCOPES) and s.doc, s.name
        assert (s.kind == "choice") == bool(s.choices), s.name


@pytest.mark.parametrize("name, value, words", BAD, ids=[f"{n}={v!r}" for n, v, _ in BAD])
def test_bad_values_name_the_key_and_what_was_expected(name, value, words):
    with pytest.raises(ConfigError) as e:
        settings.check(name, value, source="run.yaml", key=f"settings.{name}")
    # Rule: one line naming the file, the key path, what was expected and what was given.
    assert str(e.value).startswith(f"run.yaml: settings.{name}: ") and words in str(e.value)


def test_values_are_normalised():
    # Rule: PyYAML reads 6e-4 as a string; a number-looking string is the number.
    assert settings.check("lr", "6e-4") == pytest.approx(6e-4) and isinstance(settings.check("lr", 1), float)
    assert settings.check("betas", [0.9, "0.99"]) == (0.9, 0.99)
    assert settings.check("solver", "dual") == "dual" and settings.check("dual_steps", 7) == 7


def test_optimizer_and_build_optimizer_read_the_catalog():
    # Rule: the solver list, the group defaults and the global settings are the catalog's.
    assert SOLVERS == settings.SETTINGS["solver"].choices == ("project", "dual")
    assert MUON_DEFAULTS == settings.group_defaults("muon") and ADAMW_DEFAULTS == settings.group_defaults("adamw")
    assert DEFAULTS == settings.defaults("global") and list(DEFAULTS) == list(settings.names("global"))
    # spectral_lr is the manifold groups' lr; bare groups get no weight decay, build_optimizer 0.1.
    assert MUON_DEFAULTS["lr"] == DEFAULTS["spectral_lr"] and ADAMW_DEFAULTS["lr"] == DEFAULTS["lr"]
    assert MUON_DEFAULTS["weight_decay"] == ADAMW_DEFAULTS["weight_decay"] == 0.0 and DEFAULTS["weight_decay"] == 0.1
    # Rule: the keys passed on to the solver are manifold-group keys the solver takes.
    assert set(settings.solver_keys()) <= set(MUON_DEFAULTS)
    assert set(settings.solver_keys()) <= set(inspect.signature(manifold_muon_update).parameters)
    # Rule: the catalog's names are the ones msign and the optimizer know (the catalog stays torch-free).
    from geosearch.manifolds.msign import NS_COEFFICIENTS
    from geosearch.optim.muon import MUON_SCALES
    assert settings.SETTINGS["ns_coefficients"].choices == tuple(NS_COEFFICIENTS)
    assert settings.SETTINGS["muon_scale"].choices == tuple(MUON_SCALES)
    # Layout keys are set from the rules, never by users.
    assert not {"split", "split_dim"} & set(DEFAULTS)
    assert settings.ADAMW == ADAMW and settings.EUCLIDEAN in manifold_names()


def test_option_keys_per_geometry():
    adamw, stiefel, euclid = (set(settings.option_keys(g)) for g in ("adamw", "stiefel", "euclidean"))
    # Rule: every type takes lr; AdamW types take AdamW's keys; manifold types the Muon keys.
    assert adamw == {"lr", "betas", "eps", "weight_decay"}
    # Rule: ... and per_head, a per-type option of manifold types only (the plan makes it heads).
    assert stiefel == set(settings.group_values("muon", settings.defaults())) - {"muon_scale"} | {"per_head"}
    assert "per_head" not in settings.names("global") and "per_head" not in settings.group_defaults("muon")
    assert settings.option_setting("per_head", "euclidean").kind == "bool"
    # Rule: weight decay applies to adamw and euclidean types only; Muon's shape scale,
    # though a global setting every manifold group holds, is an option of euclidean types only.
    assert euclid == stiefel | {"weight_decay", "muon_scale"} and not {"weight_decay", "muon_scale"} & stiefel
    assert "muon_scale" in settings.names("global") and "muon_scale" in settings.group_defaults("muon")
    # Rule: an option names the param-group key; a manifold type's lr is the spectral step size.
    assert settings.option_setting("lr", "dgram").name == "spectral_lr"
    assert settings.option_setting("lr", "adamw").name == "lr"
    with pytest.raises(KeyError):
        settings.option_setting("momentum", "adamw")


def test_names_and_help_for_other_layers():
    assert settings.names("muon")[0] == "spectral_lr" and "momentum" in settings.names("muon")
    assert settings.names("adamw") == ("lr", "betas", "eps", "weight_decay")
    assert set(settings.names()) == (set(settings.names("global")) | set(settings.names("layout"))
                                     | set(settings.names("type")))
    assert settings.names("type") == ("per_head",)
    with pytest.raises(ValueError, match="unknown scope"):
        settings.names("sgd")
    for name in settings.names():
        text = settings.help(name)
        # Rule: each help line gives the doc and the default, and the choices of a choice.
        assert text.startswith(settings.SETTINGS[name].doc) and "default: " in text, text
    assert "one of: project, dual; default: project" in settings.help("solver")
    assert "default: [0.9, 0.95]" in settings.help("betas") and "default: true" in settings.help("nesterov")


def test_catalog_imports_without_torch():
    code = "import sys, geosearch.optim.settings; assert 'torch' not in sys.modules, sorted(sys.modules)"
    # Rule: config, schema and CLI layers can read the catalog without loading torch.
    subprocess.run([sys.executable, "-c", code], check=True)


def test_a_new_setting_is_one_row(monkeypatch):
    """A new solver option added to the table reaches assignments, build_optimizer and the groups."""
    row = settings.Setting("dual_decay", "unit", 0.5, "a new dual-ascent option", (settings.MUON,))
    table = settings._TABLE + (row,)
    monkeypatch.setattr(settings, "_TABLE", table)
    monkeypatch.setattr(settings, "SETTINGS", {s.name: s for s in table})
    model = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 8))
    rules = [{"type": "mlp_in", "pattern": r"^0\.weight$", "family": "mlp"},
             {"type": "mlp_out", "pattern": r"^1\.weight$", "family": "mlp"}]
    a = Assignment({"mlp": "stiefel"}, options={"mlp_out": {"dual_decay": 0.25}}, rules=rules)
    groups = {g["name"]: g for g in build_optimizer(model, a, verbose=False, dual_decay=0.75).param_groups}
    # Rule: global value, per-type option and check all come from the one row.
    assert groups["mlp_in"]["dual_decay"] == 0.75 and groups["mlp_out"]["dual_decay"] == 0.25
    with pytest.raises(ConfigError, match=r"options.mlp.dual_decay: expected a number in \[0, 1\)"):
        replace(a, options={"mlp": {"dual_decay": 2}})
    with pytest.raises(ConfigError, match="dual_decay must be a number in"):
        ManifoldMuon([{"params": [nn.Parameter(torch.randn(4, 4))], "geometry": "stiefel", "dual_decay": -1}])


def test_the_adamw_geometry_has_one_name_in_both_homes():
    # Rule: geosearch.manifolds (which imports nothing else) and the torch-free settings, where
    # every layer above the optimizer reads it, name the AdamW geometry alike.
    import geosearch.manifolds

    assert settings.ADAMW == geosearch.manifolds.ADAMW == ADAMW == "adamw"
