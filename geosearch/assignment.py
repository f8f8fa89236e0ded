"""Assignments: which geometry each module type is trained with.

An :class:`Assignment` maps module types (``attn_qkv``, ``mlp_in``... see
:mod:`geosearch.modules`) to geometries (a manifold name, or ``"adamw"``), with optional
per-type optimizer options, the name rules that find each type's weights, and free-form
provenance (the study, proxy and score it came from). It is what a search exports and
what :func:`geosearch.build_optimizer` reads.

Two shorthands, ``attn`` and ``mlp``, stand for every module type of that family; a
per-type entry wins over its family's shorthand (for options: key by key).

The YAML form (schema version 1), written by :meth:`Assignment.save`::

    version: 1
    rules: nanogpt                       # a rule-set name, or a list of rules (see below)
    geometry: {attn: stiefel, mlp: dgram}
    options: {attn_qkv: {lr: 0.01}}      # optional
    provenance: {study: default, score: 3.35}   # optional, free-form

A rules list has entries ``{type, pattern, family, split, layout}`` (the fields of
:class:`geosearch.modules.ModuleRule`; ``split`` and ``layout`` optional).

Example:
    >>> a = Assignment.parse("attn=stiefel,mlp=dgram")
    >>> a.resolve()["attn_qkv"], a.resolve()["mlp_out"]
    ('stiefel', 'dgram')
"""

from __future__ import annotations

import datetime as _dt
import math
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from geosearch.errors import ConfigError
from geosearch.modules import (
    FAMILIES,
    LAYOUTS,
    ModuleRule,
    check_rules,
    family_types,
    get_rule_set,
    module_types,
    rule_set_names,
)

SCHEMA_VERSION = 1
ADAMW = "adamw"
TOP_KEYS = ("version", "rules", "geometry", "options", "provenance")
RULE_KEYS = ("type", "pattern", "family", "split", "layout")

# option -> kind of value. Which options a type takes depends on its geometry:
# see `option_keys`.
OPTION_KINDS: dict[str, str] = {
    "lr": "positive",
    "momentum": "unit",
    "nesterov": "bool",
    "solver": "solver",
    "dual_steps": "count",
    "dual_lr": "positive",
    "dual_tol": "nonnegative",
    "warm_start": "bool",
    "weight_decay": "nonnegative",
    "ns_steps": "count",
    "betas": "betas",
    "eps": "positive",
}
MUON_OPTIONS = ("lr", "momentum", "nesterov", "solver", "dual_steps", "dual_lr", "dual_tol",
                "warm_start", "ns_steps")
ADAMW_OPTIONS = ("lr", "betas", "eps", "weight_decay")


def geometry_names() -> list[str]:
    """Every geometry a module type can take: the registered manifolds, then ``"adamw"``."""
    from geosearch import manifolds

    names = getattr(manifolds, "geometry_names", None)
    return list(names()) if callable(names) else [*manifolds.manifold_names(), ADAMW]


def option_keys(geometry: str) -> tuple[str, ...]:
    """The per-type options a module type with this geometry accepts.

    ``lr`` is the AdamW step size for ``adamw`` types and the spectral step size for
    manifold types. Weight decay applies to ``adamw`` and ``euclidean`` types only:
    constrained weights are not decayed.
    """
    if geometry == ADAMW:
        return ADAMW_OPTIONS
    return MUON_OPTIONS + (("weight_decay",) if geometry == "euclidean" else ())


def check_option(name: str, value: Any, *, source: str | None, key: str) -> Any:
    """Check one option value and return it normalised (floats as float, betas as a tuple).

    Raises:
        ConfigError: the value has the wrong type or is out of range.
    """
    kind = OPTION_KINDS[name]

    def bad(expected: str, allowed=None) -> ConfigError:
        return ConfigError(f"expected {expected}, got {value!r}", source=source, key=key, allowed=allowed)

    if kind == "bool":
        if not isinstance(value, bool):
            raise bad("true or false")
        return value
    if kind == "solver":
        from geosearch.optim.muon import SOLVERS  # here: geosearch.optim imports this module

        if value not in SOLVERS:
            raise bad("a solver name", SOLVERS)
        return value
    if kind == "count":
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise bad("a whole number >= 1")
        return value
    if kind == "betas":
        if isinstance(value, (str, bytes)) or not isinstance(value, Sequence) or len(value) != 2:
            raise bad("two numbers in [0, 1), e.g. [0.9, 0.95]")
        return tuple(check_option("momentum", b, source=source, key=key) for b in value)
    x = _number(value)
    if x is None:
        raise bad("a number")
    ranges = {"positive": (x > 0, "a number > 0"), "nonnegative": (x >= 0, "a number >= 0"),
              "unit": (0 <= x < 1, "a number in [0, 1)")}
    ok, expected = ranges[kind]
    if not ok:
        raise bad(expected)
    return x


_NUMBER = re.compile(r"^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?$")


def _number(value: Any) -> float | None:
    """A finite float from an int/float, or from a string like ``"6e-4"`` (PyYAML reads
    exponents without a dot as strings); None otherwise."""
    if isinstance(value, bool):
        return None
    if isinstance(value, str) and _NUMBER.match(value.strip()):
        value = float(value)
    if isinstance(value, (int, float)) and math.isfinite(value):
        return float(value)
    return None


@dataclass
class Assignment:
    """Module type -> geometry, with per-type options, name rules and provenance.

    Constructing one validates it (and normalises option values); errors are
    :class:`~geosearch.errors.ConfigError` naming the key path and the allowed values.

    Attributes:
        geometry: module type (or family shorthand ``attn``/``mlp``) -> geometry name.
            Every module type of the rule set must be covered.
        options: module type (or shorthand) -> options for that type, e.g. ``{"lr": 0.01}``
            (see :func:`option_keys`). They override the global ``build_optimizer`` settings.
        rules: a rule-set name (see :mod:`geosearch.modules`) or an explicit list of rules.
        provenance: free-form plain data (strings, numbers, lists, mappings): study, proxy,
            score, date...

    Example:
        >>> a = Assignment({"attn": "stiefel", "mlp_in": "dgram", "mlp_out": "adamw"},
        ...                options={"attn": {"lr": 0.01}})
        >>> a.resolve()
        {'attn_qkv': 'stiefel', 'attn_out': 'stiefel', 'mlp_in': 'dgram', 'mlp_out': 'adamw'}
        >>> a.resolve_options()["attn_out"]
        {'lr': 0.01}
    """

    geometry: dict[str, str]
    options: dict[str, dict[str, Any]] = field(default_factory=dict)
    rules: str | list[ModuleRule] = "nanogpt"
    provenance: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.validate()

    # ------------------------------------------------------------------ views
    def rule_set(self) -> tuple[ModuleRule, ...]:
        """The rules as a tuple (a named rule set is looked up in the registry)."""
        return get_rule_set(self.rules) if isinstance(self.rules, str) else tuple(self.rules)

    @property
    def rules_label(self) -> str:
        """How error messages name the rules: ``"rule set 'nanogpt'"`` or ``"custom rules"``."""
        return f"rule set {self.rules!r}" if isinstance(self.rules, str) else "custom rules"

    def resolve(self) -> dict[str, str]:
        """Every module type of the rule set -> its geometry (shorthands expanded)."""
        rules = self.rule_set()
        family = {t: rule.family for rule in rules for t in rule.types}
        return {t: self.geometry.get(t, self.geometry.get(family[t])) for t in module_types(rules)}

    def resolve_options(self) -> dict[str, dict[str, Any]]:
        """Every module type -> its options: the family shorthand's options that apply to
        the type's geometry, overlaid key by key with the type's own options."""
        rules = self.rule_set()
        family = {t: rule.family for rule in rules for t in rule.types}
        out = {}
        for t, geo in self.resolve().items():
            accepted = option_keys(geo)
            merged = {k: v for k, v in self.options.get(family[t], {}).items() if k in accepted}
            merged.update(self.options.get(t, {}))
            out[t] = merged
        return out

    # ------------------------------------------------------------------ validation
    def validate(self, source: str | None = None) -> None:
        """Check every field; copy the mappings and normalise option values in place.

        Called on construction; call it again after changing fields by hand.

        Args:
            source: where the values came from (a file name), for error messages.

        Raises:
            ConfigError: naming ``source``, the key path and the allowed values.
        """
        self.rules = _check_rules_field(self.rules, source)
        rules = self.rule_set()
        types = module_types(rules)
        families = family_types(rules)
        keys = types + list(families)
        allowed_geo = geometry_names()

        if not isinstance(self.geometry, Mapping):
            raise ConfigError("expected a mapping of module type -> geometry", source=source, key="geometry")
        if not self.geometry:
            raise ConfigError("no module type has a geometry", source=source, key="geometry", allowed=keys)
        self.geometry = dict(self.geometry)
        for t, geo in self.geometry.items():
            if t not in keys:
                raise ConfigError(f"unknown module type {t!r} for {self.rules_label}", source=source,
                                  key=f"geometry.{t}", allowed=keys)
            if geo not in allowed_geo:
                raise ConfigError(f"unknown geometry {geo!r}", source=source, key=f"geometry.{t}",
                                  allowed=allowed_geo)
        resolved = self.resolve()
        missing = [t for t, geo in resolved.items() if geo is None]
        if missing:
            raise ConfigError(f"no geometry for module type(s) {', '.join(missing)} of {self.rules_label}; "
                              "give each one (or its family shorthand) a geometry", source=source,
                              key="geometry", allowed=keys)

        if not isinstance(self.options, Mapping):
            raise ConfigError("expected a mapping of module type -> options", source=source, key="options")
        checked: dict[str, dict[str, Any]] = {}
        for t, opts in self.options.items():
            if t not in keys:
                raise ConfigError(f"unknown module type {t!r} for {self.rules_label}", source=source,
                                  key=f"options.{t}", allowed=keys)
            if not isinstance(opts, Mapping):
                raise ConfigError("expected a mapping of option -> value", source=source, key=f"options.{t}",
                                  allowed=sorted(OPTION_KINDS))
            # A type takes the options of its geometry; a shorthand, those of any of its types.
            geos = {resolved[x] for x in families[t]} if t in families else {resolved[t]}
            accepted = [k for k in OPTION_KINDS if any(k in option_keys(g) for g in geos)]
            what = f"family {t!r}" if t in families else f"{t!r} ({resolved[t]})"
            checked[t] = {}
            for k, v in opts.items():
                if k not in accepted:
                    raise ConfigError(f"unknown option {k!r} for {what}", source=source,
                                      key=f"options.{t}.{k}", allowed=accepted)
                checked[t][k] = check_option(k, v, source=source, key=f"options.{t}.{k}")
        self.options = checked

        if not isinstance(self.provenance, Mapping):
            raise ConfigError("expected a mapping", source=source, key="provenance")
        self.provenance = _plain(dict(self.provenance), source, "provenance")

    # ------------------------------------------------------------------ text forms
    @classmethod
    def parse(cls, text: str, rules: str | Sequence[ModuleRule] = "nanogpt", *,
              source: str = "--assign") -> Assignment:
        """An assignment from ``"type=geometry,..."``, as typed on a command line.

        Keys are module types or the shorthands ``attn``/``mlp``; ``type.option=value``
        sets an option (value read as YAML, so numbers and ``true``/``false`` work).

        Example:
            >>> Assignment.parse("attn=stiefel,mlp=dgram,attn.lr=0.01").options
            {'attn': {'lr': 0.01}}

        Raises:
            ConfigError: an item is not ``key=value``, a key is given twice, or validation
                fails (unknown type, geometry or option).
        """
        geometry: dict[str, str] = {}
        options: dict[str, dict[str, Any]] = {}
        for item in (s.strip() for s in text.split(",")):
            if not item:
                continue
            key, eq, value = (s.strip() for s in item.partition("="))
            if not eq or not key or not value:
                raise ConfigError(f"expected 'type=geometry' or 'type.option=value', got {item!r}",
                                  source=source)
            t, dot, opt = key.partition(".")
            if dot:
                if opt in options.setdefault(t, {}):
                    raise ConfigError(f"{key!r} is given twice", source=source, key=key)
                try:
                    options[t][opt] = yaml.safe_load(value)
                except yaml.YAMLError:
                    options[t][opt] = value
            else:
                if key in geometry:
                    raise ConfigError(f"{key!r} is given twice", source=source, key=key)
                geometry[key] = value
        if not geometry:
            raise ConfigError(f"no 'type=geometry' item in {text!r}", source=source)
        try:
            return cls(geometry=geometry, options=options, rules=rules if isinstance(rules, str) else list(rules))
        except ConfigError as e:
            # Name the item as typed: "mlp.lr", not the YAML key path "options.mlp.lr".
            key = re.sub(r"^(geometry|options)\.?", "", e.key or "") or None
            raise ConfigError(e.problem, source=source, key=key, allowed=e.allowed) from None

    def to_dict(self) -> dict[str, Any]:
        """Plain data for YAML/JSON (schema version 1); empty options/provenance left out."""
        rules: Any = self.rules
        if not isinstance(rules, str):
            rules = [{"type": r.type, "pattern": r.pattern, "family": r.family, "split": list(r.split),
                      "layout": r.layout} for r in rules]
        out: dict[str, Any] = {"version": SCHEMA_VERSION, "rules": rules, "geometry": dict(self.geometry)}
        if self.options:
            out["options"] = {t: {k: list(v) if isinstance(v, tuple) else v for k, v in o.items()}
                              for t, o in self.options.items()}
        if self.provenance:
            out["provenance"] = self.provenance
        return out

    @classmethod
    def from_dict(cls, d: Any, source: str | None = None) -> Assignment:
        """An assignment from :meth:`to_dict`'s format.

        Raises:
            ConfigError: an unknown top-level key, a missing or unsupported ``version``, or
                any field error (see :meth:`validate`); the message names ``source``.
        """
        if not isinstance(d, Mapping):
            raise ConfigError(f"expected a mapping with keys {', '.join(TOP_KEYS)}, got "
                              f"{type(d).__name__}", source=source)
        for k in d:
            if k not in TOP_KEYS:
                raise ConfigError(f"unknown key {k!r}", source=source, key=str(k), allowed=TOP_KEYS)
        if "version" not in d:
            raise ConfigError("missing schema version (add 'version: 1')", source=source, key="version",
                              allowed=[SCHEMA_VERSION])
        if d["version"] != SCHEMA_VERSION or isinstance(d["version"], bool):
            raise ConfigError(f"unsupported schema version {d['version']!r}", source=source, key="version",
                              allowed=[SCHEMA_VERSION])
        if "geometry" not in d:
            raise ConfigError("missing key (module type -> geometry)", source=source, key="geometry")
        options = d.get("options")
        provenance = d.get("provenance")
        try:
            return cls(geometry=d["geometry"], options={} if options is None else options,
                       rules=d.get("rules", "nanogpt"), provenance={} if provenance is None else provenance)
        except ConfigError as e:
            if source is None or e.source is not None:
                raise
            raise ConfigError(e.problem, source=source, key=e.key, allowed=e.allowed) from None

    def to_yaml(self, path: str | os.PathLike | None = None) -> str:
        """The YAML text :meth:`save` writes, header comment included."""
        shown = os.fspath(path) if path is not None else "assignment.yaml"
        header = (
            f"# geosearch assignment (schema version {SCHEMA_VERSION}): the weight-space geometry of each\n"
            "# module type. Load it with:\n"
            "#     import geosearch\n"
            f"#     optimizer = geosearch.build_optimizer(model, geosearch.load_assignment({shown!r}))\n"
            f"# Geometries: {', '.join(geometry_names())} ('adamw' = plain AdamW, no manifold).\n"
            "# Shorthands 'attn' and 'mlp' cover every type of that family; per-type entries win.\n"
        )
        return header + yaml.dump(self.to_dict(), Dumper=_Dumper, sort_keys=False, default_flow_style=False,
                                  allow_unicode=True, width=100)

    def save(self, path: str | os.PathLike) -> Path:
        """Write the assignment as YAML (see the module docstring); returns the path."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(self.to_yaml(path), encoding="utf-8")
        return path


def load_assignment(path: str | os.PathLike) -> Assignment:
    """Read an assignment saved by :meth:`Assignment.save` (or written by hand).

    Raises:
        ConfigError: the file is missing or unreadable, is not valid YAML (with the line and
            column), or fails validation; the message names the file and the key path.
    """
    source = os.fspath(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError("file not found", source=source) from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"cannot read the file ({getattr(e, 'strerror', None) or e})", source=source) from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(e, "problem", None) or str(e)
        raise ConfigError(f"malformed YAML{where}: {problem}", source=source) from None
    if data is None:
        raise ConfigError(f"empty file; expected a mapping with keys {', '.join(TOP_KEYS)}", source=source)
    return Assignment.from_dict(data, source=source)


# --------------------------------------------------------------------------- helpers
class _Dumper(yaml.SafeDumper):
    """SafeDumper writing lists of scalars on one line (``split: [attn_q, attn_k, attn_v]``)."""

    def represent_list(self, data):
        flow = all(not isinstance(x, (list, tuple, dict)) for x in data)
        return self.represent_sequence("tag:yaml.org,2002:seq", data, flow_style=flow)


_Dumper.add_representer(list, _Dumper.represent_list)


def _check_rules_field(rules: Any, source: str | None) -> str | list[ModuleRule]:
    """A rule-set name, checked against the registry, or a list of rules built from
    ``ModuleRule``s or mappings; errors carry the key path (``rules[1].layout``)."""
    if isinstance(rules, str):
        if rules not in rule_set_names():
            raise ConfigError(f"unknown rule set {rules!r}", source=source, key="rules", allowed=rule_set_names())
        return rules
    if isinstance(rules, Mapping) or not isinstance(rules, Sequence):
        raise ConfigError("expected a rule-set name or a list of rules", source=source, key="rules",
                          allowed=rule_set_names())
    out = []
    for i, r in enumerate(rules):
        if isinstance(r, ModuleRule):
            out.append(r)
            continue
        key = f"rules[{i}]"
        if not isinstance(r, Mapping):
            raise ConfigError(f"expected a mapping with keys {', '.join(RULE_KEYS)}", source=source, key=key)
        for k in r:
            if k not in RULE_KEYS:
                raise ConfigError(f"unknown key {k!r}", source=source, key=f"{key}.{k}", allowed=RULE_KEYS)
        for k in ("type", "pattern", "family"):
            if not isinstance(r.get(k), str) or not r[k]:
                raise ConfigError("missing, or not a string", source=source, key=f"{key}.{k}")
        if r.get("family") not in FAMILIES:
            raise ConfigError(f"unknown family {r['family']!r}", source=source, key=f"{key}.family",
                              allowed=FAMILIES)
        if r.get("layout", "out_in") not in LAYOUTS:
            raise ConfigError(f"unknown layout {r['layout']!r}", source=source, key=f"{key}.layout",
                              allowed=LAYOUTS)
        split = r.get("split") or []
        if isinstance(split, str) or not isinstance(split, Sequence) or not all(isinstance(s, str) for s in split):
            raise ConfigError("expected a list of module type names", source=source, key=f"{key}.split")
        try:
            out.append(ModuleRule(r["type"], r["pattern"], r["family"], tuple(split), r.get("layout", "out_in")))
        except ConfigError as e:  # bad regex or a one-block split
            raise ConfigError(e.problem, source=source, key=f"{key}.{e.key}", allowed=e.allowed) from None
    check_rules(out, source=source)
    return out


def _plain(value: Any, source: str | None, key: str) -> Any:
    """``value`` as YAML-safe plain data (tuples become lists, numpy/torch scalars Python
    numbers); anything else is a ConfigError naming the key path."""
    if value is None or isinstance(value, (bool, int, float, str, _dt.date)):
        return value
    if isinstance(value, Mapping):
        out = {}
        for k, v in value.items():
            if not isinstance(k, (str, int)) or isinstance(k, bool):
                raise ConfigError(f"keys must be strings, got {k!r}", source=source, key=key)
            out[k] = _plain(v, source, f"{key}.{k}")
        return out
    if isinstance(value, (list, tuple)):
        return [_plain(v, source, f"{key}[{i}]") for i, v in enumerate(value)]
    item = getattr(value, "item", None)
    if callable(item) and getattr(value, "ndim", 0) == 0:
        return _plain(item(), source, key)
    raise ConfigError(f"cannot be saved as YAML: {type(value).__name__}", source=source, key=key)
