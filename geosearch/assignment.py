"""Assignments: which geometry each module type is trained with.

An :class:`Assignment` maps module types (``attn_qkv``, ``mlp_in``... see
:mod:`geosearch.rules.modules`) to geometries (a manifold name, or ``"adamw"``), with optional
per-type optimizer options, global optimizer settings, the name rules that find each
type's weights, and free-form provenance (the study, proxy and score it came from). It is
what a search exports and what :func:`geosearch.build_optimizer` reads: the file alone
rebuilds the optimizer.

The shorthands ``attn``, ``mlp`` and ``routing`` stand for every module type of that
family, the roles ``attn_qk`` and ``attn_vo`` for Q and K, V and the output projection
(:mod:`geosearch.rules.roles`); a per-type entry wins over its role's, which wins over its
family's (for options: key by key). A type
whose rule has a ``default`` (a mixture-of-experts ``router``: ``adamw``) takes it when
the assignment names neither the type nor its family.

The YAML form (schema version 1), written by :meth:`Assignment.save`::

    version: 1
    rules: nanogpt                       # a rule-set name, or a list of rules (see below)
    geometry: {attn: stiefel, mlp: dgram}
    options: {attn_qkv: {lr: 0.01}}      # optional, per type
    settings: {spectral_lr: 0.05}        # optional, global (geosearch.optim.settings)
    provenance: {study: default, score: 3.35}   # optional, free-form

Files without ``settings`` (written before it existed) load unchanged.

A rules list has entries ``{type, pattern, family, split, layout}`` (the fields of
:class:`geosearch.rules.modules.ModuleRule`; ``split`` and ``layout`` optional).

Example:
    >>> a = Assignment.parse("attn=stiefel,mlp=dgram")
    >>> a.resolve()["attn_qkv"], a.resolve()["mlp_out"]
    ('stiefel', 'dgram')
"""

from __future__ import annotations

import datetime as _dt
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from geosearch.util.errors import ConfigError
from geosearch.util.frozen import FrozenMap, freeze, thaw
from geosearch.rules.modules import (
    PER_MATRIX,
    STACKED,
    ModuleRule,
    attention_layout,
    check_rules,
    family_types,
    get_rule_set,
    module_types,
    rule_from_mapping,
    rule_set_names,
    rule_to_mapping,
)
from geosearch.rules.roles import HEAD_TYPES, ROLES, role_of, role_problem, role_types, rules_for_roles
from geosearch.optim import settings as catalog
from geosearch.optim.settings import option_keys
from geosearch.util.yaml_io import load_yaml, parse_yaml

__all__ = ["Assignment", "SCHEMA_VERSION", "geometry_names", "load_assignment"]


def geometry_names() -> list[str]:
    """Every geometry a module type can take: the registered manifolds, then ``"adamw"``.

    Read from the manifold registry at each call (so later registrations count); the
    registry holds torch classes, so it is imported here, when a name is first checked,
    and importing this module stays torch-free.
    """
    from geosearch import manifolds

    return manifolds.geometry_names()

SCHEMA_VERSION = 1
TOP_KEYS = ("version", "rules", "geometry", "options", "provenance", "settings")


@dataclass(frozen=True)
class Assignment:
    """Module type -> geometry, with per-type options, global settings, name rules and provenance.

    Constructing one validates it once and normalises it (option and setting values
    checked against :mod:`geosearch.optim.settings`); it cannot be changed afterwards
    (its mappings are read-only; use :func:`dataclasses.replace` for a changed copy).
    Errors are :class:`~geosearch.util.errors.ConfigError` naming the key path and the
    allowed values.

    Attributes:
        geometry: module type (or family shorthand ``attn``/``mlp``) -> geometry name.
            Every module type of the rule set must be covered.
        options: module type (or shorthand) -> options for that type, e.g. ``{"lr": 0.01}``
            (see :func:`option_keys`). They override every global setting.
        rules: a rule-set name (see :mod:`geosearch.rules.modules`) or a tuple of rules.
        provenance: free-form plain data (strings, numbers, lists, mappings): study, proxy,
            score, date... (read-only: mappings and tuples).
        settings: global optimizer settings (names of
            ``geosearch.optim.settings.names("global")``: ``lr``, ``spectral_lr``,
            ``momentum``...), e.g. the ones a search tuned. ``build_optimizer`` applies
            them over the catalog defaults; its keyword overrides and the per-type
            ``options`` win over them.

    Example:
        >>> a = Assignment({"attn": "stiefel", "mlp_in": "dgram", "mlp_out": "adamw"},
        ...                options={"attn": {"lr": 0.01}}, settings={"spectral_lr": 0.05})
        >>> a.resolve()
        {'attn_qkv': 'stiefel', 'attn_out': 'stiefel', 'mlp_in': 'dgram', 'mlp_out': 'adamw'}
        >>> a.resolve_options()["attn_out"]
        {'lr': 0.01}
    """

    geometry: Mapping[str, str]
    options: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    rules: str | tuple[ModuleRule, ...] = "nanogpt"
    provenance: Mapping[str, Any] = field(default_factory=dict)
    settings: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        rules = _check_rules_field(self.rules, None)
        keys = [*(self.geometry if isinstance(self.geometry, Mapping) else ()),
                *(self.options if isinstance(self.options, Mapping) else ())]
        rules = rules_for_roles(rules, keys)  # a role on nanogpt: nanogpt_split
        object.__setattr__(self, "rules", rules)
        resolved = self._check_geometry()
        options = self._check_options(resolved)
        values = self._check_settings()
        if not isinstance(self.provenance, Mapping):
            raise ConfigError("expected a mapping", key="provenance")
        provenance = _plain(dict(self.provenance), None, "provenance")
        for name, value in (("geometry", FrozenMap(self.geometry)), ("options", freeze(options)),
                            ("settings", FrozenMap(values)), ("provenance", freeze(provenance)),
                            ("_resolved", FrozenMap(resolved))):
            object.__setattr__(self, name, value)
        object.__setattr__(self, "_resolved_options", freeze(self._merge_options()))

    # ------------------------------------------------------------------ views
    def rule_set(self) -> tuple[ModuleRule, ...]:
        """The rules as a tuple (a named rule set is looked up in the registry)."""
        return get_rule_set(self.rules) if isinstance(self.rules, str) else self.rules

    @property
    def rules_label(self) -> str:
        """How error messages name the rules: ``"rule set 'nanogpt'"`` or ``"custom rules"``."""
        return f"rule set {self.rules!r}" if isinstance(self.rules, str) else "custom rules"

    def resolve(self) -> dict[str, str]:
        """Every module type of the rule set -> its geometry (shorthands expanded)."""
        return dict(self._resolved)

    def resolve_options(self) -> dict[str, dict[str, Any]]:
        """Every module type -> its options: the family shorthand's options that apply to
        the type's geometry, overlaid key by key with the type's own options."""
        return {t: dict(o) for t, o in self._resolved_options.items()}

    def with_rules(self, rules: str | Sequence[ModuleRule]) -> Assignment:
        """This assignment for another rule set, e.g. a proxy's answer (``nanogpt``) for a
        Hugging Face model (``gpt2``, ``llama``): each new module type takes its
        counterpart's geometry and options (:mod:`geosearch.rules.retarget`); settings are kept
        and the provenance records the rules it came from.

        Example:
            >>> a = Assignment({"attn": "stiefel", "mlp_in": "dgram", "mlp_out": "adamw"})
            >>> a.with_rules("llama").resolve()["mlp_gate"]
            'dgram'

        Raises:
            ConfigError: an unknown rule set, a new type without a counterpart, or one
                that stands for old types of different geometries or options.
        """
        from geosearch.rules.retarget import retarget

        target = _check_rules_field(rules if isinstance(rules, str) else tuple(rules), None)
        label = f"rule set {target!r}" if isinstance(target, str) else "the custom rules"
        new_rules = get_rule_set(target) if isinstance(target, str) else target
        geometry, options = retarget(self.resolve(), self.resolve_options(), self._families(), new_rules, label)
        provenance = {**thaw(self.provenance), "rules_from": self.to_dict()["rules"]}
        return Assignment(geometry=geometry, options=options, rules=target, provenance=provenance,
                          settings=thaw(self.settings))

    # ------------------------------------------------------------------ validation
    def _families(self) -> dict[str, str]:
        return {t: rule.family for rule in self.rule_set() for t in rule.types}

    def _keys(self) -> list[str]:
        """The keys geometry and options take: module types, roles, family shorthands."""
        rules = self.rule_set()
        return module_types(rules) + list(role_types(rules)) + list(family_types(rules))

    def _unknown(self, t: str, key: str) -> ConfigError:
        why = role_problem(self.rule_set(), t)
        return ConfigError(f"unknown module type {t!r} for {self.rules_label}{why}", key=key,
                           allowed=self._keys())

    def _check_geometry(self) -> dict[str, str]:
        """Check ``geometry``; return every module type -> its geometry."""
        rules = self.rule_set()
        keys = self._keys()
        known = geometry_names()
        if not isinstance(self.geometry, Mapping):
            raise ConfigError("expected a mapping of module type -> geometry", key="geometry")
        if not self.geometry:
            raise ConfigError("no module type has a geometry", key="geometry", allowed=keys)
        for t, geo in self.geometry.items():
            if t not in keys:
                raise self._unknown(t, f"geometry.{t}")
            if geo not in known:
                raise ConfigError(f"unknown geometry {geo!r}", key=f"geometry.{t}", allowed=known)
        family, role = self._families(), role_of(rules)
        defaults = {t: rule.default for rule in rules for t in rule.types}
        for t, geo in defaults.items():
            if geo is not None and geo not in known:
                raise ConfigError(f"rule {t!r}: unknown default geometry {geo!r}", key="rules", allowed=known)
        g = self.geometry  # a type's own entry, then its role's, then its family's
        resolved = {t: g.get(t, g.get(role.get(t, ""), g.get(family[t], defaults[t])))
                    for t in module_types(rules)}
        missing = [t for t, geo in resolved.items() if geo is None]
        if missing:
            raise ConfigError(f"no geometry for module type(s) {', '.join(missing)} of {self.rules_label}; "
                              "give each one (or its family shorthand) a geometry", key="geometry", allowed=keys)
        return resolved

    def _check_options(self, resolved: dict[str, str]) -> dict[str, dict[str, Any]]:
        """Check ``options`` against the geometries they apply to; return them normalised."""
        rules = self.rule_set()
        families = {**family_types(rules), **role_types(rules)}  # keys standing for several types
        keys = self._keys()
        if not isinstance(self.options, Mapping):
            raise ConfigError("expected a mapping of module type -> options", key="options")
        checked: dict[str, dict[str, Any]] = {}
        for t, opts in self.options.items():
            if t not in keys:
                raise self._unknown(t, f"options.{t}")
            # A type takes the options of its geometry; a shorthand, those of any of its types.
            geos = sorted({resolved[x] for x in families[t]}) if t in families else [resolved[t]]
            accepted = _in_catalog_order(option_keys(g) for g in geos)
            if not isinstance(opts, Mapping):
                raise ConfigError("expected a mapping of option -> value", key=f"options.{t}", allowed=accepted)
            kind = "role" if t in ROLES else "family"
            what = f"{kind} {t!r}" if t in families else f"{t!r} ({resolved[t]})"
            checked[t] = {}
            for k, v in opts.items():
                if k not in accepted:
                    raise ConfigError(f"unknown option {k!r} for {what}", key=f"options.{t}.{k}", allowed=accepted)
                geo = next(g for g in geos if k in option_keys(g))
                checked[t][k] = catalog.check(catalog.option_setting(k, geo).name, v, key=f"options.{t}.{k}")
        return checked

    def _check_settings(self) -> dict[str, Any]:
        """Check ``settings`` against the catalog's global settings; return them normalised."""
        allowed = catalog.names("global")
        if not isinstance(self.settings, Mapping):
            raise ConfigError("expected a mapping of setting -> value", key="settings", allowed=allowed)
        out = {}
        for k, v in self.settings.items():
            if k not in allowed:
                raise ConfigError(f"unknown setting {k!r}", key=f"settings.{k}", allowed=allowed)
            out[k] = catalog.check(k, v, key=f"settings.{k}")
        return out

    def _merge_options(self) -> dict[str, dict[str, Any]]:
        family, role = self._families(), role_of(self.rule_set())
        out = {}
        for t, geo in self._resolved.items():
            # a shorthand's per_head reaches the types cut into heads only (Q, K, V)
            accepted = [k for k in option_keys(geo) if k != "per_head" or t in HEAD_TYPES]
            merged = {k: v for k, v in self.options.get(family[t], {}).items() if k in accepted}
            by_role = self.options.get(role.get(t, ""), {})
            merged.update((k, v) for k, v in by_role.items() if k in accepted)
            merged.update(self.options.get(t, {}))
            out[t] = merged
        return out

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
                    options[t][opt] = parse_yaml(value, source=source)
                except ConfigError:
                    options[t][opt] = value
            else:
                if key in geometry:
                    raise ConfigError(f"{key!r} is given twice", source=source, key=key)
                geometry[key] = value
        if not geometry:
            raise ConfigError(f"no 'type=geometry' item in {text!r}", source=source)
        try:
            return cls(geometry=geometry, options=options, rules=rules if isinstance(rules, str) else tuple(rules))
        except ConfigError as e:
            # Name the item as typed: "mlp.lr", not the YAML key path "options.mlp.lr".
            key = re.sub(r"^(geometry|options)\.?", "", e.key or "") or None
            raise ConfigError(e.problem, source=source, key=key, allowed=e.allowed) from None

    def to_dict(self) -> dict[str, Any]:
        """Plain data (dicts, lists) for YAML/JSON (schema version 1); empty options,
        settings and provenance left out."""
        rules: Any = self.rules
        if not isinstance(rules, str):
            rules = [rule_to_mapping(r) for r in rules]
        out: dict[str, Any] = {"version": SCHEMA_VERSION, "rules": rules, "geometry": dict(self.geometry)}
        for name in ("options", "settings", "provenance"):
            if getattr(self, name):
                out[name] = thaw(getattr(self, name))
        return out

    @classmethod
    def from_dict(cls, d: Any, source: str | None = None) -> Assignment:
        """An assignment from :meth:`to_dict`'s format.

        Raises:
            ConfigError: an unknown top-level key, a missing or unsupported ``version``, or
                any field error (see the class docstring); the message names ``source``.
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
        optional = {k: d[k] for k in ("options", "provenance", "settings") if d.get(k) is not None}
        try:
            return cls(geometry=d["geometry"], rules=d.get("rules", "nanogpt"), **optional)
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
            "# Shorthands 'attn' and 'mlp' cover every type of that family, 'attn_qk' Q and K,\n"
            "# 'attn_vo' V and the output projection; per-type entries win.\n"
        )
        layout = attention_layout(self.rule_set())
        if layout is not None:
            header += f"# Attention: {layout} ({_LAYOUT_NOTES[layout]}).\n"
        return header + yaml.dump(self.to_dict(), Dumper=_Dumper, sort_keys=False, default_flow_style=False,
                                  allow_unicode=True, width=100)

    def save(self, path: str | os.PathLike) -> Path:
        """Write the assignment as YAML (see the module docstring); returns the path."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(self.to_yaml(path), encoding="utf-8")
        return path


_LAYOUT_NOTES = {
    STACKED: "the attention geometry holds for the fused [Q; K; V] matrix as one: under stiefel "
             "QᵀQ + KᵀK + VᵀV = I, each block's singular values about 1/√3",
    PER_MATRIX: "the attention geometry holds for Q, K and V each: under stiefel QᵀQ = KᵀK = VᵀV = I",
}


def load_assignment(path: str | os.PathLike) -> Assignment:
    """Read an assignment saved by :meth:`Assignment.save` (or written by hand).

    Raises:
        ConfigError: the file is missing or unreadable, is not valid YAML (with the line and
            column), or fails validation; the message names the file and the key path.
    """
    data = load_yaml(path, what=f"a mapping with keys {', '.join(TOP_KEYS)}")
    return Assignment.from_dict(data, source=os.fspath(path))


# --------------------------------------------------------------------------- helpers
class _Dumper(yaml.SafeDumper):
    """SafeDumper writing lists of scalars on one line (``split: [attn_q, attn_k, attn_v]``)."""

    def represent_list(self, data):
        flow = all(not isinstance(x, (list, tuple, dict)) for x in data)
        return self.represent_sequence("tag:yaml.org,2002:seq", data, flow_style=flow)


_Dumper.add_representer(list, _Dumper.represent_list)


def _check_rules_field(rules: Any, source: str | None) -> str | tuple[ModuleRule, ...]:
    """A rule-set name, checked against the registry, or a tuple of rules built from
    ``ModuleRule``s or mappings; errors carry the key path (``rules[1].layout``)."""
    if isinstance(rules, str):
        if rules not in rule_set_names():
            raise ConfigError(f"unknown rule set {rules!r}", source=source, key="rules", allowed=rule_set_names())
        return rules
    if isinstance(rules, Mapping) or not isinstance(rules, Sequence):
        raise ConfigError("expected a rule-set name or a list of rules", source=source, key="rules",
                          allowed=rule_set_names())
    out = [rule_from_mapping(r, source=source, key=f"rules[{i}]") for i, r in enumerate(rules)]
    check_rules(out, source=source)
    return tuple(out)


def _in_catalog_order(groups: Iterable[Iterable[str]]) -> list[str]:
    """The union of option-key lists, in the order of the settings catalog."""
    keys = set().union(*groups)
    return [k for k in dict.fromkeys(s.group_key for s in catalog.SETTINGS.values()) if k in keys]


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
