"""``build_optimizer``: one :class:`ManifoldMuon` for a whole model, from an assignment.

It binds the assignment to the model (:func:`geosearch.plan.bind`) and builds the
optimizer from the plan's param groups (:meth:`geosearch.plan.Plan.param_groups`). The
groups, in order (as nanoGPT's ``configure_optimizers`` lists them):

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
import sys
from typing import Any

from torch import nn

from geosearch.assignment import Assignment
from geosearch.util.errors import ConfigError
from geosearch.optim.settings import ADAMW
from geosearch.optim import settings as catalog
from geosearch.optim import sharded
from geosearch.optim.muon import ManifoldMuon
from geosearch.plan import Plan, bind
from geosearch.util.text import text_table

logger = logging.getLogger("geosearch")

SOURCE = "build_optimizer"

DEFAULTS: dict[str, Any] = catalog.defaults("global")
"""Global settings and their defaults (from :mod:`geosearch.optim.settings`; the reference
study's, but for AdamW's weight decay, nanoGPT's 0.1)."""


def build_optimizer(
    model: nn.Module,
    assignment: Assignment | str | os.PathLike,
    *,
    verbose: bool = True,
    ddp_owner_steps: bool = False,
    **overrides: Any,
) -> ManifoldMuon:
    """One optimizer for ``model``: manifold Muon where the assignment says, AdamW elsewhere.

    The settings in force are, from weakest to strongest: the catalog defaults
    (:data:`DEFAULTS`), the assignment's ``settings``, these keyword ``overrides``, and the
    assignment's per-type ``options``.

    Args:
        model: the model (nanoGPT names for the default rule set).
        assignment: an :class:`~geosearch.assignment.Assignment`, or the path of a saved one.
        verbose: also print the group summary (it is always logged on the ``geosearch``
            logger at INFO).
        ddp_owner_steps: for a model wrapped in DDP, step each batch of matrices on one
            owner rank and broadcast it, instead of on every rank. Off by default: on two
            CPU gloo ranks it made the optimizer 2.1-2.7x slower per rank (docs/design.md,
            "Sharded training").
        **overrides: global settings, see :data:`DEFAULTS`: ``lr`` (AdamW), ``spectral_lr``
            (manifold Muon), ``betas``, ``eps``, ``weight_decay`` (AdamW), ``momentum``,
            ``nesterov``, ``solver``, ``dual_steps``, ``dual_lr``, ``dual_tol``,
            ``warm_start``, ``ns_steps``, ``ns_coefficients``, ``muon_scale`` (euclidean
            types). Per-type ``options`` of the assignment win over
            these (an ``lr`` option on a manifold type is its spectral step size).

    Returns:
        A :class:`ManifoldMuon` holding every trainable parameter in exactly one group;
        each group has an ``lr`` (so LR schedulers scale all of them) and a ``name``.

    Raises:
        ConfigError: an unknown override or bad value; a rule that matches no parameter; a
            2-D hidden weight no rule matches; a fused weight whose blocks mix ``adamw`` and
            manifolds or ask for different options (see :func:`geosearch.plan.bind`); a
            model wrapped in FSDP1 (``FullyShardedDataParallel``), or a manifold weight
            sharded in a layout manifold Muon cannot step (a 2-D device mesh, a placement
            other than ``Shard``/``Replicate``). FSDP2 (``fully_shard`` on a 1-D mesh)
            works: build the optimizer after sharding the model (docs/design.md, "Sharded
            training"). A model wrapped in DDP (``DistributedDataParallel``) is bound
            by its ``module``'s names.

    Example:
        >>> opt = build_optimizer(model, Assignment.parse("attn=stiefel,mlp=dgram"))  # doctest: +SKIP
    """
    _refuse_fsdp1(model)
    replicas = None
    ddp = getattr(sys.modules.get("torch.nn.parallel"), "DistributedDataParallel", None)
    if ddp is not None and isinstance(model, ddp):
        if ddp_owner_steps:  # each matrix's step on one owner rank, then broadcast
            replicas = model.process_group
        model = model.module

    plan = bind(model, assignment, overrides, source=SOURCE)
    return optimizer_from_plan(plan, verbose=verbose, replicas=replicas)


def _refuse_fsdp1(model: nn.Module) -> None:
    """FSDP1 replaces the weights by flat 1-D shards, which have no rows and columns."""
    fsdp = sys.modules.get("torch.distributed.fsdp")  # not loaded: no model can be wrapped in it
    wrapper = getattr(fsdp, "FullyShardedDataParallel", None)
    if wrapper is not None and any(isinstance(m, wrapper) for m in model.modules()):
        raise ConfigError("the model is wrapped in FSDP1 (FullyShardedDataParallel), whose flat parameter "
                          "shards manifold Muon cannot step; shard it with FSDP2's fully_shard instead",
                          source=SOURCE)


def optimizer_from_plan(plan: Plan, *, verbose: bool = True, replicas: Any = None) -> ManifoldMuon:
    """The :class:`ManifoldMuon` of a :class:`~geosearch.plan.Plan` (what
    :func:`build_optimizer` returns), for callers that bind once and share the plan.

    Args:
        plan: from :func:`geosearch.plan.bind`.
        verbose: also print the group summary (always logged at INFO).
        replicas: DDP's process group (see :class:`ManifoldMuon`), or None.
    """
    param_groups = plan.param_groups()
    _check_partition(plan, param_groups)
    _check_layouts(plan, param_groups)
    opt = ManifoldMuon(param_groups, replicas=replicas)
    note = plan.rules_label + (f"; {plan.frozen} frozen tensor(s) left out" if plan.frozen else "")
    text = optimizer_summary(opt, note=note)
    logger.info("%s", text)
    if verbose and _main_process():
        print(text)
    return opt


def _main_process() -> bool:
    """Whether this is rank 0 of a launched run (or no distributed run): the table is
    printed once, not once per process."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank() == 0
    return os.environ.get("RANK", "0") == "0"


def _check_partition(plan: Plan, param_groups: list[dict]) -> None:
    """Every trainable parameter in exactly one group (an internal invariant)."""
    seen: dict[int, str] = {}
    for g in param_groups:
        for p in g["params"]:
            if id(p) in seen:
                raise RuntimeError(f"a parameter is in groups {seen[id(p)]!r} and {g['name']!r}")
            seen[id(p)] = g["name"]
    missing = [r.name for r in plan.params if r.trainable and id(r.param) not in seen]
    if missing:
        raise RuntimeError(f"parameters in no group: {', '.join(missing)}")


def _check_layouts(plan: Plan, param_groups: list[dict]) -> None:
    """Every manifold weight sharded in a layout manifold Muon steps, said with its name
    (the optimizer itself can name only its param group)."""
    names = {id(r.param): r.name for r in plan.params}
    for g in param_groups:
        if g["geometry"] == ADAMW:
            continue
        for p in g["params"]:
            problem = sharded.layout_problem(p)
            if problem is not None:
                raise ConfigError(f"{problem}, which manifold Muon ({_geometry_label(g['geometry'])}) cannot step: "
                                  f"it steps sharded weights on {sharded.SUPPORTED}; shard this weight so, or "
                                  "assign it 'adamw'", source=SOURCE, key=names[id(p)])


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
    return "\n".join([head + (f" [{note}]" if note else ""), *text_table(cells, numbers=range(2, 6))])
