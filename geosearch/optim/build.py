"""``build_optimizer``: one :class:`ManifoldMuon` for a whole model, from an assignment.

The groups, in order (as nanoGPT's ``configure_optimizers`` does, in one visible function):

* one manifold-Muon group per distinct (geometry, options, split) combination of the
  weights the assignment's rules match; a fused weight split into blocks (``c_attn`` ->
  Q, K, V) gets a group whose ``geometry`` is the tuple of its blocks' geometries;
* one AdamW group per distinct options combination of matched weights assigned
  ``"adamw"``;
* AdamW with weight decay for every other parameter of 2 or more dimensions
  (embeddings, the LM head), and AdamW without weight decay for the rest (norms, biases).

Every trainable parameter ends in exactly one group; shared (tied) parameters count once.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import Any

from torch import nn

from geosearch.assignment import ADAMW, Assignment, check_option, load_assignment
from geosearch.errors import ConfigError
from geosearch.modules import ParamMatch, match_parameters, rule_set_names
from geosearch.optim.muon import ADAMW_DEFAULTS, MUON_DEFAULTS, ManifoldMuon

logger = logging.getLogger("geosearch")

SOURCE = "build_optimizer"

DEFAULTS: dict[str, Any] = {
    "lr": ADAMW_DEFAULTS["lr"],  # AdamW step size (embeddings, head, norms, biases, "adamw" types)
    "spectral_lr": MUON_DEFAULTS["lr"],  # manifold-Muon step size
    "betas": ADAMW_DEFAULTS["betas"],
    "eps": ADAMW_DEFAULTS["eps"],
    "weight_decay": 0.1,  # AdamW, on tensors of >= 2 dims only (nanoGPT's convention)
    **{k: MUON_DEFAULTS[k] for k in ("momentum", "nesterov", "solver", "dual_steps", "dual_lr", "dual_tol",
                                     "warm_start", "ns_steps")},
}
"""Global settings and their defaults (the reference study's, taken from
:mod:`geosearch.optim.muon` but for AdamW's weight decay); ``build_optimizer`` keyword
overrides replace them, per-type assignment options replace both."""

# Group keys set from the global settings, per kind of group.
_MUON_KEYS = ("momentum", "nesterov", "solver", "dual_steps", "dual_lr", "dual_tol", "warm_start", "ns_steps")
_ADAMW_KEYS = ("betas", "eps")


def build_optimizer(
    model: nn.Module,
    assignment: Assignment | str | os.PathLike,
    *,
    verbose: bool = True,
    **overrides: Any,
) -> ManifoldMuon:
    """One optimizer for ``model``: manifold Muon where the assignment says, AdamW elsewhere.

    Args:
        model: the model (nanoGPT names for the default rule set).
        assignment: an :class:`~geosearch.assignment.Assignment`, or the path of a saved one.
        verbose: also print the group summary (it is always logged on the ``geosearch``
            logger at INFO).
        **overrides: global settings, see :data:`DEFAULTS`: ``lr`` (AdamW), ``spectral_lr``
            (manifold Muon), ``betas``, ``eps``, ``weight_decay`` (AdamW), ``momentum``,
            ``nesterov``, ``solver``, ``dual_steps``, ``dual_lr``, ``dual_tol``,
            ``warm_start``, ``ns_steps``. Per-type ``options`` of the assignment win over
            these (an ``lr`` option on a manifold type is its spectral step size).

    Returns:
        A :class:`ManifoldMuon` holding every trainable parameter in exactly one group;
        each group has an ``lr`` (so LR schedulers scale all of them) and a ``name``.

    Raises:
        ConfigError: an unknown override or bad value; a rule that matches no parameter; a
            2-D hidden weight no rule matches; a fused weight whose blocks mix ``adamw`` and
            manifolds or ask for different options; or an invalid assignment (unknown
            module type or geometry).

    Example:
        >>> opt = build_optimizer(model, Assignment.parse("attn=stiefel,mlp=dgram"))  # doctest: +SKIP
    """
    if isinstance(assignment, (str, os.PathLike)):
        assignment = load_assignment(assignment)
    if not isinstance(assignment, Assignment):
        raise ConfigError(f"expected an Assignment or the path of a saved one, got {type(assignment).__name__}",
                          source=SOURCE, key="assignment")
    assignment.validate()  # fields may have been changed since construction
    settings = _settings(overrides)
    label = assignment.rules_label

    try:
        match = match_parameters(model, assignment.rule_set())
    except ConfigError as e:  # a rule that fits the model badly: say which rules and where
        raise ConfigError(f"{label}: {e.problem}", source=e.source or SOURCE, key=e.key, allowed=e.allowed) from None
    if match.empty_rules:
        raise ConfigError(
            f"{label}: rule(s) matching no parameter of {type(model).__name__}: "
            + ", ".join(f"{r.type} ({r.pattern})" for r in match.empty_rules)
            + "; pick the rule set for this model family", source=SOURCE, key="rules", allowed=rule_set_names())
    if match.unmatched_hidden:
        raise ConfigError(
            f"{len(match.unmatched_hidden)} 2-D hidden weight(s) match no rule of {label}, so no "
            f"geometry: {', '.join(match.unmatched_hidden)}; add rules for them or pick another rule set",
            source=SOURCE, key="rules", allowed=rule_set_names())

    geometry, options = assignment.resolve(), assignment.resolve_options()
    groups: dict[tuple, dict[str, Any]] = {}
    for m in match.matched:
        if m.param.requires_grad:
            key, group = _matched_group(m, geometry, options, settings)
            groups.setdefault(key, group)["params"].append(m.param)
            groups[key]["_types"].extend(t for t in m.types if t not in groups[key]["_types"])

    # Everything else: AdamW, decayed when >= 2-D (embeddings, head), not otherwise (norms, biases).
    decay = {"params": [], "geometry": ADAMW, "lr": settings["lr"], "weight_decay": settings["weight_decay"],
             "name": "adamw: embeddings, head", **{k: settings[k] for k in _ADAMW_KEYS}}
    no_decay = {**decay, "params": [], "weight_decay": 0.0, "name": "adamw: norms, biases (no decay)"}
    frozen = 0
    for _, p in match.rest:
        if not p.requires_grad:
            frozen += 1
            continue
        (decay if p.dim() >= 2 else no_decay)["params"].append(p)
    frozen += sum(not m.param.requires_grad for m in match.matched)

    param_groups = []
    for group in groups.values():
        types = group.pop("_types")
        group["name"] = ",".join(types)
        param_groups.append(group)
    param_groups += [g for g in (decay, no_decay) if g["params"]]
    _check_partition(model, param_groups)

    opt = ManifoldMuon(param_groups)
    note = f"{label}" + (f"; {frozen} frozen tensor(s) left out" if frozen else "")
    text = optimizer_summary(opt, note=note)
    logger.info("%s", text)
    if verbose:
        print(text)
    return opt


def _settings(overrides: Mapping[str, Any]) -> dict[str, Any]:
    settings = dict(DEFAULTS)
    for k, v in overrides.items():
        if k not in DEFAULTS:
            raise ConfigError(f"unknown setting {k!r}", source=SOURCE, key=k, allowed=DEFAULTS)
        settings[k] = check_option("lr" if k == "spectral_lr" else k, v, source=SOURCE, key=k)
    return settings


def _matched_group(m: ParamMatch, geometry: dict[str, str], options: dict[str, dict],
                   settings: dict[str, Any]) -> tuple[tuple, dict[str, Any]]:
    """The group key and a fresh group (without params) for one matched weight."""
    geos = tuple(geometry[t] for t in m.types)
    opts = [options[t] for t in m.types]
    if len(m.types) > 1:
        if ADAMW in geos and set(geos) != {ADAMW}:
            raise ConfigError(
                f"{m.name!r} is one tensor cut into blocks {', '.join(m.types)}; their geometries "
                f"({', '.join(f'{t}={g}' for t, g in zip(m.types, geos))}) must be all manifolds or all "
                f"{ADAMW!r}", source=SOURCE, key="geometry")
        if any(o != opts[0] for o in opts[1:]):
            raise ConfigError(
                f"{m.name!r} is one tensor cut into blocks {', '.join(m.types)}, so they share one step; "
                f"their options differ: {', '.join(f'{t}={o}' for t, o in zip(m.types, opts))}",
                source=SOURCE, key="options")
    if geos[0] == ADAMW:
        group = {"geometry": ADAMW, "lr": settings["lr"], "weight_decay": settings["weight_decay"],
                 **{k: settings[k] for k in _ADAMW_KEYS}}
    else:
        group = {"geometry": geos[0] if len(geos) == 1 else geos, "lr": settings["spectral_lr"],
                 **{k: settings[k] for k in _MUON_KEYS}}
        if m.rule.split:
            group["split"] = len(m.rule.split)
        if m.rule.split or m.rule.split_dim:  # an in_out (Conv1D) weight is stepped as its (out, in) transpose
            group["split_dim"] = m.rule.split_dim
    group.update(opts[0])  # per-type options (already checked against the geometry) win
    key = tuple(sorted((k, repr(v)) for k, v in group.items()))
    return key, {**group, "params": [], "_types": []}


def _check_partition(model: nn.Module, param_groups: list[dict]) -> None:
    """Every trainable parameter in exactly one group (an internal invariant)."""
    seen: dict[int, str] = {}
    for g in param_groups:
        for p in g["params"]:
            if id(p) in seen:
                raise RuntimeError(f"a parameter is in groups {seen[id(p)]!r} and {g['name']!r}")
            seen[id(p)] = g["name"]
    missing = [n for n, p in model.named_parameters() if p.requires_grad and id(p) not in seen]
    if missing:
        raise RuntimeError(f"parameters in no group: {', '.join(missing)}")


def _geometry_label(geometry: Any) -> str:
    return geometry if isinstance(geometry, str) else "/".join(geometry)


def optimizer_summary(opt: Any, note: str | None = None) -> str:
    """A table of an optimizer's groups: name, geometry, tensors, parameters, lr, weight decay.

    Works on any optimizer whose groups carry ``geometry`` (and on Accelerate's wrapper);
    parameters shared between groups or tensors are counted once.

    Args:
        opt: the optimizer.
        note: appended in brackets to the first line (e.g. the rule set used).

    Example::

        ManifoldMuon: 6 groups, 28 tensors, 7,232 parameters [rule set 'nanogpt_split']
          group                            geometry                                tensors  params      lr   wd
          attn_q,attn_k,attn_v             stiefel/dgram/stiefel (split 3, dim 0)        2   1,536    0.02    0
          attn_out                         stiefel                                       2     512    0.01    0
          mlp_in                           dgram                                         2   2,048    0.02    0
          mlp_out                          adamw                                         2   2,048  0.0006  0.1
          adamw: embeddings, head          adamw                                         2     640  0.0006  0.1
          adamw: norms, biases (no decay)  adamw                                        18     448  0.0006    0
    """
    rows, seen = [], set()
    total_tensors = total_params = 0
    for i, g in enumerate(opt.param_groups):
        params = [p for p in g["params"] if id(p) not in seen]
        seen.update(id(p) for p in params)
        n = sum(p.numel() for p in params)
        total_tensors += len(params)
        total_params += n
        geo = _geometry_label(g.get("geometry", "?"))
        if g.get("split", 1) > 1:
            geo += f" (split {g['split']}, dim {g.get('split_dim', 0)})"
        rows.append((str(g.get("name", f"group {i}")), geo, len(params), n, g.get("lr", float("nan")),
                     g.get("weight_decay", 0.0)))
    kind = type(getattr(opt, "optimizer", opt)).__name__
    head = f"{kind}: {len(rows)} groups, {total_tensors} tensors, {total_params:,} parameters"
    cells = [("group", "geometry", "tensors", "params", "lr", "wd")]
    cells += [(name, geo, str(t), f"{n:,}", f"{lr:.4g}", f"{wd:.3g}") for name, geo, t, n, lr, wd in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(6)]
    lines = [head + (f" [{note}]" if note else "")]
    for row in cells:  # text columns left-aligned, numbers right-aligned
        lines.append("  " + "  ".join(c.ljust(w) if i < 2 else c.rjust(w)
                                      for i, (c, w) in enumerate(zip(row, widths))).rstrip())
    return "\n".join(lines)
