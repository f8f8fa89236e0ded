"""What ``geosearch inspect`` shows: a model's parameters, their module types and geometries.

Before a search, it helps to see what the rules make of a model: which parameter each rule
matches and with which layout, which hidden weight no rule matches (it would be trained
with AdamW), which registered rule sets fit the model at all, the rules read off its module
names when none does (:mod:`geosearch.rules.inference`), and which geometries a search space
lets each module type take. :func:`describe_parameters` gives that as rows,
:func:`fitting_rule_sets` lists the rule sets, and :func:`inspect_model` prints the table of
``geosearch inspect`` for a model spec or a search space, building the model on the meta
device (no memory, no initialisation).
"""

from __future__ import annotations

import dataclasses
import os
import sys
import textwrap
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import yaml
from torch import nn

from geosearch.assignment import Assignment, geometry_names, load_assignment
from geosearch.util.errors import ConfigError
from geosearch.rules.modules import (
    empty_rule_error,
    ModuleRule,
    family_types,
    get_rule_set,
    match_parameters,
    module_types,
    rule_set_names,
)
from geosearch.plan import Plan, bind
from geosearch.models.zoo import BuiltModel, build_meta_model
from geosearch.rules.inference import infer_rules, rules_fit
from geosearch.search.space.spec import SearchSpace, load_space

__all__ = ["ParamRow", "describe_parameters", "fitting_rule_sets", "inspect_model", "model_lines"]

# --------------------------------------------------------------------------- parameters
def fitting_rule_sets(model: nn.Module) -> list[str]:
    """Registered rule sets that fit ``model``: each rule matches, no hidden weight is left
    out, and layouts agree with the modules (``nn.Linear`` / ``Conv1D``)."""
    return [name for name in rule_set_names() if rules_fit(model, name)]


class ParamRow(NamedTuple):
    """One line of :func:`describe_parameters`.

    Attributes:
        name: parameter name (a split weight has one row per block).
        shape: its shape (of the whole tensor).
        role: ``"matched"``, ``"embedding"`` (embeddings and output head),
            ``"unassigned"`` (a 2-D hidden weight no rule matches: trained with AdamW) or
            ``"norm/bias"``.
        module_type: the module type of a matched weight or block, else None.
        rule_type: the fused rule's type when the row is one block of a split weight.
        layout: ``"out_in"`` / ``"in_out"`` for matched weights, else None.
        geometries: the candidate geometries (``("adamw",)`` unless matched).
    """

    name: str
    shape: tuple[int, ...]
    role: str
    module_type: str | None
    rule_type: str | None
    layout: str | None
    geometries: tuple[str, ...]

    def cells(self) -> tuple[str, str, str, str]:
        """Four columns: name, shape, module type (:attr:`label`), candidate geometries."""
        return self.name, "x".join(map(str, self.shape)), self.label, ", ".join(self.geometries)

    @property
    def label(self) -> str:
        """The module-type column of ``geosearch inspect``."""
        if self.role == "matched":
            return self.module_type + (f" (block of {self.rule_type})" if self.rule_type else "")
        return {"embedding": "embedding/head", "unassigned": "NO RULE"}.get(self.role, self.role)


def describe_parameters(built: BuiltModel | nn.Module, rules: str | Sequence[ModuleRule] | None = None,
                        space_geometries: Mapping[str, Sequence[str]] | None = None) -> list[ParamRow]:
    """Every parameter of a model with the module type the rules give it.

    Args:
        built: a :class:`BuiltModel` (or a bare module, with ``rules`` given).
        rules: a rule-set name or rules; None = the model's default rule set.
        space_geometries: module type or family -> candidate geometries (a search space's
            ``geometries``); None = every geometry.

    Returns:
        One :class:`ParamRow` per parameter (per block of a split weight), in
        ``named_parameters()`` order.

    Raises:
        ConfigError: no rules given for a model without a default rule set (the message
            lists the rule sets that fit), or rules that do not fit the model.
    """
    model = built.model if isinstance(built, BuiltModel) else built
    if rules is None:
        rules = built.rules if isinstance(built, BuiltModel) else None
        if rules is None:
            spec = built.spec if isinstance(built, BuiltModel) else type(model).__name__
            raise ConfigError(f"model {spec!r} has no default rule set; name one", key="rules",
                              allowed=fitting_rule_sets(model) or rule_set_names())
    rule_seq = get_rule_set(rules) if isinstance(rules, str) else tuple(rules)
    family_of = {t: fam for fam, types in family_types(rule_seq).items() for t in types}
    match = match_parameters(model, rule_seq)
    matched = {m.name: m for m in match.matched}
    embeddings, unassigned = set(match.embeddings), set(match.unmatched_hidden)
    every = tuple(geometry_names())

    def candidates(t: str) -> tuple[str, ...]:
        if space_geometries is None:
            return every
        return tuple(space_geometries.get(t) or space_geometries.get(family_of.get(t, ""), ()))

    rows = []
    for name, param in model.named_parameters():
        shape = tuple(param.shape)
        if name in matched:
            m = matched[name]
            for t in m.types:
                rows.append(ParamRow(name, shape, "matched", t, m.rule.type if m.rule.split else None,
                                     m.rule.layout, candidates(t)))
            continue
        role = "embedding" if name in embeddings else "unassigned" if name in unassigned else "norm/bias"
        rows.append(ParamRow(name, shape, role, None, None, None, ("adamw",)))
    return rows


# --------------------------------------------------------------------------- the models
def model_lines(width: int = 100) -> list[str]:
    """The model specs a run takes (``--model``, ``proxy.model``, ``target.model``), each kind
    on its lines; every ``hf:MODEL_TYPE`` of the installed transformers, which error messages
    point to rather than list (``geosearch inspect --models``)."""
    from geosearch.models.specs import HF_MODELS, PRESETS, PY_SPEC_HELP

    presets = ", ".join(f"{name} ({p['n_layer']} layers, width {p['n_embd']})" for name, p in PRESETS.items())
    lines = [f"presets (the nanoGPT GPT): {presets}",
             f"Hugging Face families with their rule sets: {', '.join('hf:' + n for n in HF_MODELS)}"]
    try:
        import transformers
    except ImportError:
        lines.append("hf:MODEL_TYPE: needs Hugging Face transformers, which is not installed "
                     "(pip install 'geosearch[hf]')")
    else:
        from geosearch.models.hf_configs import TESTED_WITH, LEFT_OUT, left_out_types, listed_types

        types, left = listed_types(), left_out_types()
        checked = transformers.__version__ in TESTED_WITH
        unchecked = [] if checked else [t for t in types if t not in LEFT_OUT]
        lines += [f"hf:MODEL_TYPE, the {len(types)} decoder-only causal LM types of transformers "
                  f"{transformers.__version__} that work at their", "default size (build, forward, "
                  "probes, a step; random weights, no download):"]
        lines += textwrap.wrap(", ".join(types), width=width, initial_indent="  ", subsequent_indent="  ",
                               break_on_hyphens=False)
        if unchecked:
            lines.append(f"  (checked with transformers {', '.join(TESTED_WITH)}; "
                         "run benchmarks/hf_families.py to check this version)")
        lines.append(f"left out, {len(left)} causal LM types of transformers {transformers.__version__}:")
        for t, why in sorted(left.items()):
            lines += textwrap.wrap(f"{t}: {why}", width=width, initial_indent="  ", subsequent_indent="      ")
    lines += ["hf:PATH: a directory holding a Hugging Face config.json (hf:./DIR for one here)",
              f"{PY_SPEC_HELP}: your own nn.Module, made by FACTORY(vocab_size, block_size, **model_args)"]
    return lines


# --------------------------------------------------------------------------- the command
def inspect_model(model: str | None = None, *, model_args: Mapping[str, Any] | None = None,
                  space: str | os.PathLike | None = None, rules: str | None = None,
                  assign: str | None = None) -> None:
    """Print every parameter of a model with its module type and candidate geometries.

    The rules are the ones ``geosearch search`` would take: ``rules``, else the space's
    (unless they were derived from the space's model and ``model`` names another), else the
    model's own. Prints the table on stdout, and one warning per 2-D weight no rule matches
    on stderr.

    Args:
        model: a model spec; None = the space's ``proxy.model``.
        model_args: model fields, over the space's (which count only for the space's model).
        space: a search-space file or shipped name: the candidates of each module type.
        rules: a registered rule-set name.
        assign: an assignment (inline ``"attn=stiefel,mlp=dgram"`` in the rules' module
            types, or a YAML file): also print its plan, what every module type would be
            trained with (:meth:`geosearch.plan.Plan.describe`), before any training.

    Raises:
        ConfigError: neither a model nor a space; an unknown model, rule set or space; a
            space's module type that the rules do not have; rules that do not fit the
            model, or a rule that matches none of its parameters (after the table).
    """
    searched = load_space(space) if space is not None else None
    if model is None and searched is None:
        raise ConfigError("give --model SPEC (tiny, small, gpt2, hf:gpt2, hf:llama, hf:MODEL_TYPE, hf:PATH, "
                          "py:MODULE:FACTORY) "
                          "or --space FILE", source="inspect")
    args = dict(searched.proxy.model_args) if searched is not None and model is None else {}
    args.update(model_args or {})
    spec = model if model is not None else searched.proxy.model
    rule_seq, rules_name = _given_rules(rules, searched, model)
    built = build_meta_model(spec, vocab_size=256, model_args=args, for_data=False)
    fitting = fitting_rule_sets(built.model)
    if rule_seq is None:
        rule_seq, rules_name = _model_rules(built, rules_name)

    if searched is not None:
        _check_space_types(searched, rule_seq, rules_name)
    try:
        rows = describe_parameters(built, rule_seq, searched.geometries if searched is not None else None)
    except ConfigError as e:  # rules for another family, e.g. nanogpt's nn.Linear rules on hf:gpt2
        raise ConfigError(e.problem.rstrip("."), source=rules_name, key=e.key,
                          allowed=fitting or e.allowed) from None
    match = match_parameters(built.model, rule_seq)  # for the rules that match nothing

    _print_report(built, spec, rows, searched, rules_name, fitting)
    empty = empty_rule_error(match, spec, source=rules_name)
    if empty is not None:
        raise empty
    if assign is not None:
        print()
        from_space = searched is not None and not (searched.rules_from_model and model is not None)
        named = rules or (searched.rules if from_space and isinstance(searched.rules, str)
                          else None if from_space else built.rules)
        print(_plan_of(built.model, assign, named or tuple(rule_seq)).describe())


def _given_rules(rules: str | None, searched: SearchSpace | None,
                 model: str | None) -> tuple[Sequence[ModuleRule] | None, str | None]:
    """The rules ``--rules`` or the space gives, and their name; (None, None) when neither does."""
    if rules is not None:
        return get_rule_set(rules), f"rule set {rules!r}"
    if searched is not None and not (searched.rules_from_model and model is not None):
        rule_seq = get_rule_set(searched.rules) if isinstance(searched.rules, str) else searched.rules
        rules_name = (f"rule set {searched.rules!r}" if isinstance(searched.rules, str)
                      else "the space's rules")
        return rule_seq, rules_name
    return None, None


def _model_rules(built: BuiltModel, rules_name: str | None) -> tuple[Sequence[ModuleRule], str | None]:
    """The model's own rules and their name, for a command that named none (``rules_name`` kept if none)."""
    if isinstance(built.rules, str):
        return get_rule_set(built.rules), f"rule set {built.rules!r} (the model's)"
    if built.rules:  # an hf: model no registered rule set fits
        return built.rules, "the rules read off its module names (the model's)"
    return (), rules_name  # a py: model: show its parameters, so that rules can be written for it


def _check_space_types(searched: SearchSpace, rule_seq: Sequence[ModuleRule], rules_name: str | None) -> None:
    """Raise ConfigError for a module type of the space's ``geometries`` that the rules do not have."""
    families = family_types(rule_seq)
    unknown = [k for k in searched.geometries if k not in families and k not in module_types(rule_seq)]
    if unknown:
        raise ConfigError(f"module type {unknown[0]!r} of the space is not a type of {rules_name}",
                          source=searched.source, key=f"geometries.{unknown[0]}",
                          allowed=[*families, *module_types(rule_seq)])


def _print_report(built: BuiltModel, spec: str, rows: Sequence[ParamRow], searched: SearchSpace | None,
                  rules_name: str | None, fitting: Sequence[str]) -> None:
    """Print the inspect table with its header and summary lines, and warn of unassigned weights."""
    print(built.summary())
    if rules_name is None:
        print(f"no rules: model {spec!r} has no default rule set; name one with --rules NAME "
              f"(registered: {', '.join(rule_set_names())}) or write rules in a search space")
    else:
        print(f"module types by {rules_name}"
              + (f"; candidate geometries from {searched.source}" if searched is not None else ""))
    _print_table(rows, searched)
    counts = Counter(r.module_type for r in rows if r.role == "matched")
    print("module types: " + (", ".join(f"{t} ({n} weight{'s' if n > 1 else ''})" for t, n in counts.items())
                              or "none"))
    print("rule sets that fit this model: " + (", ".join(fitting) or "none registered; write rules"))
    inferred = built.rules if isinstance(built.rules, tuple) else () if fitting else infer_rules(built.model)
    if inferred:
        print(_rules_yaml(inferred), end="")
    for r in rows:
        if r.role == "unassigned" and rules_name is not None:
            print(f"warning: 2-D weight {r.name!r} matches no rule of {rules_name}; it will be trained "
                  "with AdamW", file=sys.stderr)


def _plan_of(model: nn.Module, assign: str, rules: str | Sequence[ModuleRule]) -> Plan:
    """The plan of ``--assign``: a file, or inline in the module types of ``rules``."""
    if os.path.isfile(assign):
        return bind(model, load_assignment(assign), source="--assign")
    return bind(model, Assignment.parse(assign, rules=rules), source="--assign")


def _rules_yaml(rules: Sequence[ModuleRule]) -> str:
    """Rules read off module names as the ``rules:`` list of a search space, with a comment."""
    defaults = {"split": (), "layout": "out_in", "default": None}  # left out, as a space may
    plain = [{k: (list(v) if isinstance(v, tuple) else v) for k, v in dataclasses.asdict(r).items()
              if k not in defaults or v != defaults[k]} for r in rules]
    text = yaml.safe_dump({"rules": plain}, sort_keys=False, default_flow_style=None, width=120)
    return "rules read off the module names (as a search space writes them):\n" + text


def _print_table(rows: Sequence[ParamRow], space: SearchSpace | None) -> None:
    """The parameter table: name, shape, module type, candidate geometries."""

    def candidates(row: ParamRow) -> str:
        if row.role == "unassigned":
            return "adamw (unassigned hidden weight)"
        if row.role != "matched":
            return "adamw"
        if space is None:
            return "any: " + ", ".join(geometry_names())
        return ", ".join(row.geometries) or "(not searched)"

    cells = [(*r.cells()[:3], candidates(r)) for r in rows]
    widths = [max(len(c[i]) for c in [("parameter", "shape", "module type", ""), *cells]) for i in range(3)]
    print(f"{'parameter':<{widths[0]}}  {'shape':<{widths[1]}}  {'module type':<{widths[2]}}  geometries")
    for c in cells:
        print(f"{c[0]:<{widths[0]}}  {c[1]:<{widths[1]}}  {c[2]:<{widths[2]}}  {c[3]}")
