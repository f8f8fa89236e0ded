"""The plan: what every parameter of a model gets under an assignment, worked out once.

:func:`bind` matches the assignment's name rules against the model once and returns a
:class:`Plan`: per parameter (a :class:`ParamPlan` row) its module type(s), geometry (one
per block of a fused weight), merged optimizer options, layout and ``(out, in)`` block
view; the parameters no rule matches go to AdamW, with weight decay when they are
matrices (embeddings, head) and without it otherwise (norms, biases). Options are merged
with the precedence

    catalog defaults < ``assignment.settings`` < ``bind(..., settings)`` < per-type options

(:mod:`geosearch.optim.settings` holds the catalog). ``build_optimizer`` makes its param
groups from the plan (:meth:`Plan.param_groups`), the weight probes watch its rows, and
:meth:`Plan.describe` shows it before any training.

Example:
    >>> plan = bind(model, Assignment.parse("attn=stiefel,mlp=dgram"))   # doctest: +SKIP
    >>> print(plan.describe())                                           # doctest: +SKIP
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from torch import Tensor, nn

from geosearch.assignment import Assignment, load_assignment
from geosearch.util.errors import ConfigError
from geosearch.util.frozen import FrozenMap, thaw
from geosearch.optim.settings import ADAMW
from geosearch.rules.modules import (
    PER_MATRIX,
    STACKED,
    ParamMatch,
    attention_layout,
    fused_qkv_layout,
    match_parameters,
    module_types,
    rule_set_names,
)
from geosearch.rules.roles import HEAD_TYPES
from geosearch.optim import settings as catalog
from geosearch.optim.blocks import block_view
from geosearch.util.text import text_table

__all__ = ["DECAY", "NO_DECAY", "RULE", "ParamPlan", "Plan", "bind", "resolve_settings"]

_MOVE = " (an answer from another model: assignment.with_rules(NAME), or export --rules NAME)"

RULE, DECAY, NO_DECAY = "rule", "decay", "no_decay"
"""Roles of a parameter: matched by a rule; AdamW with weight decay (matrices no rule
matches: embeddings, head); AdamW without (norms, biases)."""

_REST_NAMES = {DECAY: "adamw: embeddings, head", NO_DECAY: "adamw: norms, biases (no decay)"}


@dataclass(frozen=True, eq=False)
class ParamPlan:
    """What one parameter gets.

    Attributes:
        name: its name in ``model.named_parameters()`` (the first one, when tied).
        param: the parameter.
        types: the module type of each block (one entry unless the weight is fused);
            empty when no rule matched it.
        geometries: the geometry of each block (``("adamw",)`` when no rule matched it).
        options: its optimizer options, merged (param-group keys: ``lr``, ``momentum``...).
        role: :data:`RULE`, :data:`DECAY` or :data:`NO_DECAY`.
        layout: ``"out_in"`` or ``"in_out"`` for a matched weight, else None.
        split_dim: the dimension holding the outputs (where fused blocks are stacked).
        heads: the heads each block is cut into, one count per block (1: a whole matrix;
            more under the ``per_head`` option: each head's rows a matrix of their own).
    """

    name: str
    param: nn.Parameter
    types: tuple[str, ...]
    geometries: tuple[str, ...]
    options: Mapping[str, Any]
    role: str
    layout: str | None = None
    split_dim: int = 0
    heads: tuple[int, ...] = ()

    @property
    def split(self) -> int:
        """The number of blocks (1 unless fused)."""
        return max(1, len(self.types))

    @property
    def geometry(self) -> str | tuple[str, ...]:
        """The geometry as a param group states it: one name, or a tuple per block."""
        if self.geometries[0] == ADAMW or len(self.geometries) == 1:
            return self.geometries[0]
        return self.geometries

    @property
    def trainable(self) -> bool:
        return self.param.requires_grad

    def blocks(self, t: Tensor | None = None) -> Tensor:
        """The ``(out, in)`` view of ``t`` (default: the parameter): ``(out, in)``, or
        ``(split, out/split, in)`` for a fused weight (see :func:`~geosearch.optim.blocks.block_view`)."""
        return block_view(self.param if t is None else t, self.split, self.split_dim)

    def group(self) -> dict[str, Any]:
        """The param-group keys of this parameter (without ``params`` and ``name``)."""
        group = {"geometry": self.geometry, **self.options}
        if self.geometry != ADAMW:
            if self.split > 1:
                group["split"] = self.split
            if self.split > 1 or self.split_dim:  # an in_out weight is stepped as its (out, in) transpose
                group["split_dim"] = self.split_dim
            if any(h > 1 for h in self.heads):  # per head: one count, or one per block
                group["heads"] = self.heads[0] if len(set(self.heads)) == 1 else self.heads
        return group


@dataclass(frozen=True, eq=False)
class Plan:
    """Every parameter of a model with what it gets; made by :func:`bind`.

    Attributes:
        model: the model's class name.
        assignment: the assignment it was bound from.
        settings: the global optimizer settings in force (catalog defaults, then
            ``assignment.settings``, then the ``bind`` settings).
        params: one row per parameter (tied ones once), in ``named_parameters()`` order.
    """

    model: str
    assignment: Assignment
    settings: Mapping[str, Any]
    params: tuple[ParamPlan, ...]

    @property
    def rules_label(self) -> str:
        return self.assignment.rules_label

    @property
    def matched(self) -> tuple[ParamPlan, ...]:
        """The rows of weights a rule matched."""
        return tuple(r for r in self.params if r.role == RULE)

    @property
    def frozen(self) -> int:
        """How many parameters do not require grad (they get no group)."""
        return sum(not r.trainable for r in self.params)

    def rows(self, module_type: str) -> tuple[ParamPlan, ...]:
        """The rows holding (a block of) ``module_type``."""
        return tuple(r for r in self.params if module_type in r.types)

    def param_groups(self) -> list[dict[str, Any]]:
        """Param groups for :class:`~geosearch.optim.ManifoldMuon`, trainable parameters only.

        AdamW with weight decay and AdamW without (embeddings, head, norms, biases), when
        they hold any parameter, first: a trainer that logs group 0's ``lr`` as *the*
        learning rate (Hugging Face's ``Trainer``) then logs AdamW's, not a spectral step.
        Then one group per distinct (geometry, options, layout) of matched weights, named by
        its module types, in order of first appearance.
        """
        groups: dict[tuple, dict[str, Any]] = {}
        rest = {role: {"params": [], **_rest_group(role, self.settings), "name": name}
                for role, name in _REST_NAMES.items()}
        for row in self.params:
            if not row.trainable:
                continue
            if row.role != RULE:
                rest[row.role]["params"].append(row.param)
                continue
            spec = row.group()
            key = tuple(sorted((k, repr(v)) for k, v in spec.items()))
            group = groups.setdefault(key, {**spec, "params": [], "name": []})
            group["params"].append(row.param)
            group["name"].extend(t for t in row.types if t not in group["name"])
        out = [{**g, "name": ",".join(g["name"])} for g in groups.values()]
        return [g for g in rest.values() if g["params"]] + out

    def types(self) -> list[dict[str, Any]]:
        """Per module type (in rule order), then per AdamW rest group: what it gets, as plain data.

        Entries have ``type``, ``geometry``, ``layout``, ``block`` (the ``(out, in)`` shape
        of one block; shapes joined by ``/`` when layers differ), ``tensors``, ``params``
        (of its blocks), ``options`` (all merged options) and ``per_type`` (the options
        that differ from what the global settings give). The plan as ``config.yaml`` or
        ``inspect`` would show it.
        """
        entries: dict[str, dict[str, Any]] = {}
        for row in self.params:
            names = row.types if row.role == RULE else (_REST_NAMES[row.role],)
            for i, (t, geo) in enumerate(zip(names, row.geometries)):
                h = row.heads[i] if row.heads else 1
                if h > 1:  # per head: heads x (rows/heads, in)
                    out, cols = row.blocks().shape[-2:]
                    shape = f"{h}x{out // h}x{cols}"
                else:
                    shape = "x".join(map(str, row.blocks().shape[-2:])) if row.role == RULE else None
                if t not in entries:
                    base = catalog.group_values(catalog.ADAMW if geo == ADAMW else catalog.MUON, self.settings) \
                        if row.role == RULE else _rest_group(row.role, self.settings)
                    options = thaw(row.options)
                    entries[t] = {"type": t, "geometry": geo, "layout": row.layout, "block": [], "tensors": 0,
                                  "params": 0, "options": options,
                                  "per_type": {k: v for k, v in options.items() if thaw(base.get(k)) != v}}
                e = entries[t]
                e["tensors"] += 1
                e["params"] += row.param.numel() // row.split
                if shape is not None and shape not in e["block"]:
                    e["block"].append(shape)
        for e in entries.values():
            e["block"] = "/".join(e["block"]) or None
        order = {t: i for i, t in enumerate(module_types(self.assignment.rule_set()) + list(_REST_NAMES.values()))}
        return sorted(entries.values(), key=lambda e: order[e["type"]])

    def describe(self) -> str:
        """A table of the plan: per module type its geometry, layout, block shape, tensors,
        parameters, step size, weight decay and per-type options, under a line with the
        global settings.

        Example::

            plan for GPT [rule set 'nanogpt']: 26 tensors, 7,232 parameters
            settings: lr=0.0006 spectral_lr=0.02 betas=[0.9, 0.95] ... ns_steps=5
              type                             geometry  layout  block  tensors  params      lr   wd  options
              attn_qkv                         stiefel   out_in  48x16        2   1,536    0.02    0
              ...
              adamw: norms, biases (no decay)  adamw     -       -           18     448  0.0006    0
        """
        n = sum(r.param.numel() for r in self.params)
        head = f"plan for {self.model} [{self.rules_label}]: {len(self.params)} tensors, {n:,} parameters"
        if self.frozen:
            head += f" ({self.frozen} frozen)"
        layout = attention_layout(self.assignment.rule_set())
        if layout is not None:
            head += f"; attention {layout}: {_LAYOUT_WORDS[layout]}"
        cells = [("type", "geometry", "layout", "block", "tensors", "params", "lr", "wd", "options")]
        for e in self.types():
            opts = e["options"]
            cells.append((e["type"], e["geometry"], e["layout"] or "-", e["block"] or "-", str(e["tensors"]),
                          f"{e['params']:,}", f"{opts['lr']:.4g}", f"{opts.get('weight_decay', 0.0):.3g}",
                          " ".join(f"{k}={_show(v)}" for k, v in e["per_type"].items())))
        shown = " ".join(f"{k}={_show(v)}" for k, v in self.settings.items())
        return "\n".join([head, f"settings: {shown}", *text_table(cells, numbers=range(4, 8))])


_LAYOUT_WORDS = {STACKED: "its geometry holds for the fused [Q; K; V] matrix as one",
                 PER_MATRIX: "its geometry holds for Q, K and V each"}


def _show(value: Any) -> str:
    value = thaw(value)
    if isinstance(value, bool):
        return str(value).lower()
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def _rest_group(role: str, values: Mapping[str, Any]) -> dict[str, Any]:
    """The keys of the AdamW group of parameters no rule matched."""
    group = {"geometry": ADAMW, **catalog.group_values(catalog.ADAMW, values)}
    if role == NO_DECAY:
        group["weight_decay"] = 0.0
    return group


def resolve_settings(assignment: Assignment, overrides: Mapping[str, Any] | None = None, *,
                     source: str | None = None) -> dict[str, Any]:
    """The global settings in force: catalog defaults < ``assignment.settings`` < ``overrides``.

    Raises:
        ConfigError: an override that is not a global setting, or a bad value.
    """
    values = catalog.defaults("global")
    values.update(assignment.settings)
    for k, v in (overrides or {}).items():
        if k not in values:
            raise ConfigError(f"unknown setting {k!r}", source=source, key=k, allowed=values)
        values[k] = catalog.check(k, v, source=source, key=k)
    return values


def bind(model: nn.Module, assignment: Assignment | str | os.PathLike,
         settings: Mapping[str, Any] | None = None, *, source: str = "bind") -> Plan:
    """Match ``assignment`` against ``model`` once: what every parameter gets.

    Args:
        model: the model (nanoGPT names for the default rule set).
        assignment: an :class:`~geosearch.assignment.Assignment`, or the path of a saved one.
        settings: global settings that override the assignment's (``build_optimizer``
            keywords: ``lr``, ``spectral_lr``, ``momentum``...; see
            :func:`geosearch.optim.settings.names`).
        source: what error messages name as the origin (``"build_optimizer"``...).

    Returns:
        A :class:`Plan` with one row per parameter.

    Raises:
        ConfigError: an unknown setting or bad value; a rule that matches no parameter; a
            2-D hidden weight no rule matches; a fused weight whose blocks mix ``adamw``
            and manifolds or ask for different options; a rule that contradicts the model
            (layout, shape); or not an assignment.
    """
    if isinstance(assignment, (str, os.PathLike)):
        assignment = load_assignment(assignment)
    if not isinstance(assignment, Assignment):
        raise ConfigError(f"expected an Assignment or the path of a saved one, got {type(assignment).__name__}",
                          source=source, key="assignment")
    values = resolve_settings(assignment, settings, source=source)
    label = assignment.rules_label
    try:
        match = match_parameters(model, assignment.rule_set())
    except ConfigError as e:  # a rule that fits the model badly: say which rules and where
        raise ConfigError(f"{label}: {e.problem}{_MOVE}", source=e.source or source, key=e.key,
                          allowed=e.allowed) from None
    if match.empty_rules:
        raise ConfigError(
            f"{label}: rule(s) matching no parameter of {type(model).__name__}: "
            + ", ".join(f"{r.type} ({r.pattern})" for r in match.empty_rules)
            + f"; pick the rule set for this model family{_MOVE}", source=source, key="rules",
            allowed=rule_set_names())
    if match.unmatched_hidden:
        raise ConfigError(
            f"{len(match.unmatched_hidden)} 2-D hidden weight(s) match no rule of {label}, so no "
            f"geometry: {', '.join(match.unmatched_hidden)}; add rules for them or pick another rule set",
            source=source, key="rules", allowed=rule_set_names())

    geometry, options = assignment.resolve(), assignment.resolve_options()
    modules = dict(model.named_modules())
    rows = [_matched_row(m, geometry, options, values, source, modules) for m in match.matched]
    for name, p in match.rest:
        role = DECAY if p.dim() >= 2 else NO_DECAY
        options_ = {k: v for k, v in _rest_group(role, values).items() if k != "geometry"}
        rows.append(ParamPlan(name, p, (), (ADAMW,), FrozenMap(options_), role))
    order = {id(p): i for i, (_, p) in enumerate(model.named_parameters())}
    rows.sort(key=lambda r: order[id(r.param)])
    return Plan(type(model).__name__, assignment, FrozenMap(values), tuple(rows))


def _matched_row(m: ParamMatch, geometry: Mapping[str, str], options: Mapping[str, dict],
                 values: Mapping[str, Any], source: str, modules: Mapping[str, nn.Module]) -> ParamPlan:
    """The row of a weight a rule matched; a fused weight's blocks must agree (but on
    ``per_head``, which becomes the row's ``heads``)."""
    geos = tuple(geometry[t] for t in m.types)
    opts = [{k: v for k, v in options[t].items() if k != "per_head"} for t in m.types]
    heads = _heads(m, [bool(options[t].get("per_head")) for t in m.types], modules, source)
    if len(m.types) > 1:
        if ADAMW in geos and set(geos) != {ADAMW}:
            raise ConfigError(
                f"{m.name!r} is one tensor cut into blocks {', '.join(m.types)}; their geometries "
                f"({', '.join(f'{t}={g}' for t, g in zip(m.types, geos))}) must be all manifolds or all "
                f"{ADAMW!r}", source=source, key="geometry")
        if any(o != opts[0] for o in opts[1:]):
            raise ConfigError(
                f"{m.name!r} is one tensor cut into blocks {', '.join(m.types)}, so they share one step; "
                f"their options differ: {', '.join(f'{t}={o}' for t, o in zip(m.types, opts))}",
                source=source, key="options")
    kind = catalog.ADAMW if geos[0] == ADAMW else catalog.MUON
    merged = {**catalog.group_values(kind, values), **opts[0]}  # per-type options (checked) win
    return ParamPlan(m.name, m.param, m.types, geos, FrozenMap(merged), RULE, m.rule.layout, m.rule.split_dim,
                     heads)


def _heads(m: ParamMatch, per_head: list[bool], modules: Mapping[str, nn.Module],
           source: str) -> tuple[int, ...]:
    """Heads each block of ``m`` is cut into: its rows / the attention's ``head_dim`` where
    ``per_head`` is set (Q, K and V blocks only; K and V count the key/value heads)."""
    if not any(per_head):
        return ()
    owner = m.name.rpartition(".")[0]
    layout = fused_qkv_layout(modules.get(owner.rpartition(".")[0]), owner.rpartition(".")[2])
    rows = m.param.shape[m.param.dim() - 2 + m.rule.split_dim] // max(1, len(m.types))
    out = []
    for t, on in zip(m.types, per_head):
        if not on:
            out.append(1)
            continue
        if t not in HEAD_TYPES or m.param.dim() != 2:
            problem = f"per_head applies to {', '.join(HEAD_TYPES)} only"
        elif layout is None:
            problem = f"the head size of {owner!r} is not found (its attention module names no head count)"
        elif rows % layout.head_dim:
            problem = f"its {rows} rows do not cut into heads of {layout.head_dim}"
        else:
            out.append(rows // layout.head_dim)
            continue
        raise ConfigError(f"{m.name!r} ({t}): {problem}", source=source, key=f"options.{t}.per_head")
    return tuple(out)
