"""``ManifoldMuon``: manifold Muon for constrained weights, AdamW for the rest.

The optimizer only holds state and param groups (the maths is in
:mod:`geosearch.optim.solvers` and :mod:`geosearch.manifolds`), in the style of Keller
Jordan's ``MuonWithAuxAdam``: every group says what it is with a ``geometry`` key.

* ``geometry="adamw"``: AdamW (keys ``lr``, ``betas``, ``eps``, ``weight_decay``).
* any registered manifold (or a tuple of them, one per block): Nesterov momentum, then
  a manifold-Muon step of spectral size ``lr`` and the retraction (keys below).
  ``"euclidean"`` is plain Muon: ``W ← (1 − lr·wd)·W − lr·s·msign(M)`` with the shape
  scale of the group's ``muon_scale``: ``"keller"`` (the default) ``s = sqrt(max(1,
  fan_out/fan_in))``, as Keller Jordan's Muon and ``torch.optim.Muon(adjust_lr_fn=
  "original")``; ``"none"`` ``s = 1``, as the reference study's unconstrained Muon.
  Constrained geometries take ``s = 1`` (the spectral step size of the reference study)
  and no weight decay.

Every matrix of every manifold group is stepped in a batch with the other matrices of its
shape, geometry and settings (:mod:`geosearch.optim.grouped`; ``grouped=False`` steps each
alone, the same maths in more operations).

Parameters of manifold groups are **projected onto their manifold when the group is
added** (at construction), as the reference study places weights on their manifold at
initialisation; the optimizer then keeps them there. Parameters already on it (constraint
error at most 1e-4 of the scale of ``WᵀW``, e.g. weights resumed from a checkpoint) are
left bit-for-bit untouched.

Sharded weights (FSDP2's ``fully_shard``: DTensor parameters on a 1-D device mesh) work:
momentum and AdamW run on each rank's slice, while each manifold matrix is gathered and
placed whole on every rank, stepped and retracted whole by one owner rank per batch, which
sends the result to the others, and every rank keeps its slice
(:mod:`geosearch.optim.sharded`; docs/design.md, "Sharded training"). Under DDP
(``replicas=``) the plain weights' batches are divided among the ranks alike.

Group keys, their defaults and their checks come from :mod:`geosearch.optim.settings`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import Tensor

from geosearch.util.errors import ConfigError
from geosearch.manifolds import Manifold, get_manifold, manifold_names
from geosearch.optim import grouped, settings, sharded
from geosearch.optim.settings import ADAMW
from geosearch.optim.blocks import block_view

__all__ = ["ManifoldMuon", "MUON_DEFAULTS", "MUON_SCALES", "ADAMW_DEFAULTS", "SOLVERS"]

SOLVERS: tuple[str, ...] = settings.SETTINGS["solver"].choices
"""The manifold-Muon direction solvers (see :mod:`geosearch.optim.solvers`)."""

MUON_DEFAULTS: dict[str, Any] = settings.group_defaults(settings.MUON)
"""Manifold-Muon group keys and their defaults (a copy of the settings catalog's, which
groups are checked against)."""

ADAMW_DEFAULTS: dict[str, Any] = settings.group_defaults(ADAMW)
"""AdamW group keys and their defaults (a copy of the settings catalog's)."""

MUON_SCALES: dict[str, Callable[[int, int], float]] = {
    "keller": lambda fan_out, fan_in: math.sqrt(max(1.0, fan_out / fan_in)),
    "none": lambda fan_out, fan_in: 1.0,
}
"""Plain Muon's (``euclidean``) shape scale by the catalog's ``muon_scale`` name:
``(fan_out, fan_in)`` -> the factor on the step."""

_COMMON_KEYS = ("params", "geometry", "name")
# Keys torch itself may put in a group (named parameters, LR schedulers).
_TORCH_KEYS = ("param_names", "initial_lr")
_SOURCE = "ManifoldMuon"
# A parameter whose constraint error is at most this fraction of the scale of its Gram
# matrix (at least 1) is not projected again when a group is added, so building an
# optimizer on resumed weights does not perturb them, whatever their size.
_ON_MANIFOLD_RTOL = 1e-4


class ManifoldMuon(torch.optim.Optimizer):
    """Manifold Muon on constrained weights and AdamW on the rest, in one optimizer.

    Args:
        params: param groups (dicts), each with a ``geometry``: ``"adamw"``, a manifold
            name (see :func:`geosearch.manifolds.manifold_names`), or, with ``split > 1``,
            a tuple with one manifold name per block. Missing keys take
            :data:`MUON_DEFAULTS` / :data:`ADAMW_DEFAULTS`; an optional ``name`` is free
            text. Manifold groups take 2-D tensors of either orientation.
        grouped: step matrices of one shape, geometry and setting as one batch (the
            default); ``False`` steps each matrix alone (for comparisons).
        replicas: a process group whose ranks hold every plain weight whole, with the same
            gradient (DDP's ``process_group``): each batch of manifold matrices is then
            stepped by one of its ranks and broadcast to the others
            (:func:`geosearch.optim.sharded.owners`); ``None``: every rank steps all.

    Raises:
        ConfigError (a ``ValueError``): a missing or unknown geometry, an unknown key
            (the message lists the allowed ones), a bad value, a weight whose split
            dimension does not divide into ``split`` blocks, or a manifold weight sharded
            in a layout it cannot step (a DTensor on a 2-D device mesh, or placed other
            than ``Shard``/``Replicate``); at a step, a manifold weight replaced by a flat
            shard since construction (DeepSpeed ZeRO).

    State per parameter: ``momentum_buffer``; ``dual`` (Λ, with ``warm_start``) and
    ``residual`` (float, the dual solver's last tangent residual, largest over blocks);
    AdamW: ``exp_avg``, ``exp_avg_sq``, ``step``. The buffers of a sharded parameter are
    DTensors sharded like it; ``dual`` is a plain tensor, whole and equal on every rank.

    Example:
        >>> model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Linear(32, 4))
        >>> opt = ManifoldMuon([
        ...     {"params": [model[0].weight], "geometry": "stiefel", "lr": 0.02},
        ...     {"params": [model[1].weight], "geometry": "dgram", "solver": "dual"},
        ...     {"params": [model[0].bias, model[1].bias], "geometry": "adamw", "lr": 1e-3},
        ... ])
        >>> model(torch.randn(8, 16)).square().mean().backward()
        >>> opt.step()
    """

    def __init__(self, params: Iterable[Tensor] | Iterable[dict[str, Any]], *,
                 grouped: bool = True, replicas: Any = None) -> None:
        # Defaults differ per kind of group, so groups are completed in add_param_group
        # and torch's single `defaults` dict stays empty.
        self.grouped = grouped
        self.replicas = replicas
        super().__init__(params, {})

    # ------------------------------------------------------------------ groups
    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """Validate and complete a group, place manifold params on their manifold, add it."""
        index = len(self.param_groups)
        group = _complete_group(dict(param_group), index)
        super().add_param_group(group)
        if group["geometry"] != ADAMW:
            with torch.no_grad():
                for p in group["params"]:
                    _check_param(p, group, index)
                    _place_on_manifold(p, group)

    # -------------------------------------------------------------------- step
    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """One update of every parameter that has a gradient.

        Args:
            closure: re-evaluates the model and returns the loss (optional).
        """
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self._adamw_steps([g for g in self.param_groups if g["geometry"] == ADAMW])
        muon = [(i, g) for i, g in enumerate(self.param_groups) if g["geometry"] != ADAMW]
        if muon:
            self._muon_steps(muon)
        return loss

    @torch.compiler.disable
    def _adamw_steps(self, groups: list[dict[str, Any]]) -> None:
        """The AdamW groups, eagerly also inside a compiled ``step``: their step counts are
        Python numbers in the bias corrections, on which ``torch.compile`` would recompile
        at every step (the manifold steps, the bulk of the work, are compiled)."""
        for group in groups:
            self._adamw_step(group)

    def _muon_steps(self, groups: list[tuple[int, dict[str, Any]]]) -> None:
        """Momentum per group (foreach), then every matrix in batches of one shape, geometry
        and setting (:mod:`geosearch.optim.grouped`), then each parameter's state."""
        batches: dict[tuple, tuple[Manifold, dict[str, Any], list[grouped.Member]]] = {}
        stepped = []  # (p, group, whole weight, its members)
        for index, group in groups:
            params = [p for p in group["params"] if p.grad is not None]
            for p in params:
                _check_grad(p, group, index)
            warm = group["solver"] == "dual" and group["warm_start"]
            kwargs = {k: group[k] for k in settings.solver_keys()}
            for p, update in zip(params, self._momentum(params, group)):
                lam0 = self.state[p].get("dual") if warm else None
                # A sharded (FSDP2) weight is stepped whole, by one owner rank: gathered here,
                # written back into this rank's slice below (geosearch.optim.sharded).
                weight, update = sharded.whole(p), sharded.whole(update)
                members = []
                pieces = list(zip(_pieces(weight, group), _pieces(update, group)))
                for i, ((manifold, W), (_, U)) in enumerate(pieces):
                    # lam0 is (k, k) for one piece, (split, ..., k, k) for blocks stepped apart
                    start = lam0 if lam0 is None or len(pieces) == 1 else lam0[i]
                    member = grouped.Member.of(W, U, start)
                    step = dict(kwargs, lr=group["lr"], weight_decay=_decay(manifold, group),
                                scale=_scale(manifold, W, group))
                    alone = None if self.grouped else (id(p), i)
                    key = grouped.batch_key(manifold, member, step, alone)
                    batch = batches.setdefault(key, (manifold, step, [], []))
                    batch[2].append(member)
                    batch[3].append(p)
                    members.append(member)
                stepped.append((p, group, weight, members))
        self._step_batches(list(batches.values()))
        for p, group, weight, members in stepped:
            sharded.write_back(p, weight)
            if group["solver"] != "dual":
                continue
            state = self.state[p]
            state["residual"] = max(float(m.residual.max()) for m in members)
            if group["warm_start"] and any(m.is_gram for m in _geometries(group)):
                # (k, k) for a whole matrix, (split, k, k) for blocks, as lam0 was read
                lams = [m.lam if m.lam is not None else _zeros_dual(m.weight) for m in members]
                if len(lams) > 1 and len({lam.shape for lam in lams}) > 1:  # heads of some blocks
                    state["dual"] = [lam.clone() for lam in lams]
                elif len(lams) > 1:
                    state["dual"] = torch.stack([lam.squeeze(0) for lam in lams])
                else:
                    state["dual"] = (lams[0] if group["split"] > 1 else lams[0].squeeze(0)).clone()

    def _step_batches(self, batches: list[tuple[Manifold, dict[str, Any], list, list]]) -> None:
        """Step each batch once: sharded weights (and DDP's, with ``replicas``) by one owner
        rank per batch, which sends the results (:mod:`geosearch.optim.sharded`). Every rank
        computes all its batches first, then the results are sent, one broadcast per owner
        (:func:`~geosearch.optim.sharded.share_all`): a broadcast right after each batch would
        make each rank wait for the other's, one batch at a time. Batches
        are not cut into parts per rank: a batch stepped whole by its owner gives one
        process's numbers exactly, and a cut one moves the dual solver's weights (a changed
        summation order, beyond 1e-5 within 5 steps in tests/optim/test_fsdp.py, and through
        the next gradients a changed weight anywhere in the model does the same). So only
        when every batch takes the ``project`` solver (which keeps one process's numbers to
        about 1e-6 at any batch size) are the batches cut among the ranks
        (:meth:`_divided`), so that a model with few batches (every layer's matrices of one
        shape) keeps every rank busy."""
        if all(step["solver"] == "project" for _, step, _, _ in batches):
            batches, plan = self._divided(batches)
        else:
            plan = sharded.owners([(ps, grouped.cost(ms)) for _, _, ms, ps in batches], self.replicas)
        for (manifold, step, members, _), owner in zip(batches, plan):
            if sharded.is_mine(owner):
                grouped.step_batch(manifold, members, step)
        sends: list = []  # (tensor, owner), sent in one broadcast per owner
        for (manifold, step, members, _), owner in zip(batches, plan):
            if owner is not None:
                grouped.share_batch(manifold, members, step, lambda t, o=owner: sends.append((t, o)))
        sharded.share_all(sends)

    def _divided(self, batches: list) -> tuple[list, list]:
        """The ``project`` solver's batches cut among the ranks of their process group
        (:func:`~geosearch.optim.sharded.divide`: about equal arithmetic per rank, few
        pieces), with each piece's owner."""
        groups: dict[object, tuple[int, list[int]]] = {}
        for i, (_, _, _, params) in enumerate(batches):
            group, size = sharded.ranks(params, self.replicas)
            groups.setdefault(group, (size, []))[1].append(i)
        pieces: dict[int, list] = {}
        for group, (size, idx) in groups.items():  # size 1: one piece, every rank steps it
            costs = [[grouped.cost([m]) if size > 1 else 0.0 for m in batches[i][2]] for i in idx]
            for i, cuts in zip(idx, sharded.divide(costs, size)):
                manifold, step, members, params = batches[i]
                pieces[i] = [((manifold, step, members[a:b], params[a:b]),
                              (rank, group) if size > 1 else None) for a, b, rank in cuts]
        flat = [piece for i in range(len(batches)) for piece in pieces[i]]
        return [b for b, _ in flat], [o for _, o in flat]

    def _momentum(self, params: list[Tensor], group: dict[str, Any]) -> list[Tensor]:
        """Update each parameter's momentum buffer; return the Nesterov (or plain) momenta.
        Elementwise, so one foreach call per kind of tensor (plain or sharded)."""
        beta, out = group["momentum"], {}
        kinds: dict[bool, list[Tensor]] = {}
        for p in params:
            state = self.state[p]
            if "momentum_buffer" not in state:
                state["momentum_buffer"] = torch.zeros_like(p)
            kinds.setdefault(sharded.is_sharded(p), []).append(p)
        for ps in kinds.values():
            grads = [p.grad for p in ps]
            bufs = [self.state[p]["momentum_buffer"] for p in ps]
            torch._foreach_lerp_(bufs, grads, 1 - beta)
            updates = torch._foreach_lerp(grads, bufs, beta) if group["nesterov"] else bufs
            out.update(zip(map(id, ps), updates))
        return [out[id(p)] for p in params]

    def _adamw_step(self, group: dict[str, Any]) -> None:
        params, grads, exp_avgs, exp_avg_sqs, steps = [], [], [], [], []
        for p in group["params"]:
            if p.grad is None:
                continue
            if p.grad.is_sparse:
                raise RuntimeError("ManifoldMuon's AdamW does not support sparse gradients")
            state = self.state[p]
            if "step" not in state:
                state["step"] = 0
                state["exp_avg"] = torch.zeros_like(p)
                state["exp_avg_sq"] = torch.zeros_like(p)
            state["step"] += 1
            params.append(p)
            grads.append(p.grad)
            exp_avgs.append(state["exp_avg"])
            exp_avg_sqs.append(state["exp_avg_sq"])
            steps.append(state["step"])
        if not params:
            return
        lr, eps, wd = group["lr"], group["eps"], group["weight_decay"]
        beta1, beta2 = group["betas"]
        # One batch of foreach calls per step count (usually one: every param stepped equally
        # often) and kind of tensor: foreach refuses lists mixing DTensors (FSDP2 shards) and
        # plain tensors. The ops are elementwise, so batching does not change the numbers.
        batches: dict[tuple[int, bool], list[int]] = {}
        for i, (p, step) in enumerate(zip(params, steps)):
            batches.setdefault((step, sharded.is_sharded(p)), []).append(i)
        for (step, _), idx in sorted(batches.items()):
            ps, gs = [params[i] for i in idx], [grads[i] for i in idx]
            avgs, sqs = [exp_avgs[i] for i in idx], [exp_avg_sqs[i] for i in idx]
            torch._foreach_lerp_(avgs, gs, 1 - beta1)
            torch._foreach_mul_(sqs, beta2)
            torch._foreach_addcmul_(sqs, gs, gs, value=1 - beta2)
            if wd:
                torch._foreach_mul_(ps, 1 - lr * wd)
            bias1, bias2 = 1 - beta1**step, 1 - beta2**step
            denom = torch._foreach_sqrt(sqs)
            torch._foreach_div_(denom, math.sqrt(bias2))
            torch._foreach_add_(denom, eps)
            torch._foreach_addcdiv_(ps, avgs, denom, value=-lr / bias1)


# --------------------------------------------------------------------------- helpers
def _complete_group(group: dict[str, Any], index: int) -> dict[str, Any]:
    """Check a group's keys and values; fill in the defaults of its kind."""
    where = f"param group {index}"
    geometry = group.get("geometry")
    known = manifold_names() + [ADAMW]
    if geometry is None:
        raise ConfigError(f"{where} has no 'geometry' key; every group must say how it is trained",
                          source=_SOURCE, key="geometry", allowed=known)
    if isinstance(geometry, list):
        geometry = group["geometry"] = tuple(geometry)
    names = geometry if isinstance(geometry, tuple) else (geometry,)
    for g in names:
        if g not in known:
            raise ConfigError(f"{where}: unknown geometry {g!r}", source=_SOURCE, key="geometry",
                              allowed=known)
    if len(names) > 1 and ADAMW in names:
        raise ConfigError(f"{where}: 'adamw' cannot be one block of a split weight", source=_SOURCE,
                          key="geometry", allowed=manifold_names())
    defaults = settings.group_defaults(ADAMW if geometry == ADAMW else settings.MUON)
    allowed = list(_COMMON_KEYS) + list(defaults)
    unknown = [k for k in group if k not in allowed and k not in _TORCH_KEYS]
    if unknown:
        kind = "AdamW" if geometry == ADAMW else "manifold-Muon"
        raise ConfigError(
            f"{where}: unknown key(s) {', '.join(map(repr, unknown))} for a {kind} group; the allowed "
            f"keys are {', '.join(allowed)}", source=_SOURCE, key=unknown[0], allowed=allowed)
    for k, v in defaults.items():
        group.setdefault(k, v)
    _check_values(group, where, names, defaults)
    return group


def _check_values(group: dict[str, Any], where: str, names: tuple[str, ...], keys: Iterable[str]) -> None:
    kind = ADAMW if group["geometry"] == ADAMW else settings.MUON
    for key in keys:
        setting = settings.group_setting(kind, key)
        if key == "heads" and isinstance(group[key], (tuple, list)):  # one count per block
            group[key] = _check_heads(group, where)
            continue
        value, want = settings.validate(setting.name, group[key], group=True)
        if want is not None:
            raise ConfigError(f"{where}: {key} must be {want}, got {group[key]!r}", source=_SOURCE, key=key,
                              allowed=setting.choices or None)
        group[key] = value
    if kind == ADAMW:
        return
    if len(names) > 1 and len(names) != group["split"]:
        raise ConfigError(f"{where}: {len(names)} geometries {names} for split={group['split']} blocks; give "
                          "one geometry per block", source=_SOURCE, key="geometry")
    if group["weight_decay"] and "euclidean" not in names:
        raise ConfigError(f"{where}: weight_decay applies to euclidean blocks only, and this group's "
                          f"geometry is {group['geometry']!r}; constrained weights are not decayed",
                          source=_SOURCE, key="weight_decay")


def _where(group: dict[str, Any], index: int) -> str:
    name = group.get("name")
    return f"param group {index}" + (f" ({name})" if isinstance(name, str) and name else "")


def _check_param(p: Tensor, group: dict[str, Any], index: int) -> None:
    problem = sharded.layout_problem(p)
    if problem is not None:
        raise ConfigError(f"{_where(group, index)}: a weight is {problem}, which manifold Muon cannot step: it "
                          f"steps sharded weights on {sharded.SUPPORTED}", source=_SOURCE, key="params")
    if p.ndim not in (2, 3):  # 3-D: a stack of expert matrices, each on its manifold
        raise ConfigError(f"param group {index}: manifold geometries take 2-D weights (or 3-D stacks of "
                          f"expert matrices), got a tensor of shape {tuple(p.shape)}; train it with 'adamw'",
                          source=_SOURCE, key="params")
    split, dim = group["split"], group["split_dim"]
    if p.shape[p.ndim - 2 + dim] % split:
        raise ConfigError(f"param group {index}: dimension {dim} of a {tuple(p.shape)} weight does not split "
                          f"into {split} equal blocks", source=_SOURCE, key="split")
    rows = p.shape[p.ndim - 2 + dim] // split
    if any(rows % h for h in _heads(group)) or (p.ndim == 3 and max(_heads(group)) > 1):
        raise ConfigError(f"param group {index}: blocks of {rows} rows of {tuple(p.shape)} "
                          f"do not cut into heads={group['heads']} equal heads (2-D weights only)",
                          source=_SOURCE, key="heads")


def _check_grad(p: Tensor, group: dict[str, Any], index: int) -> None:
    if p.grad.is_sparse:
        raise RuntimeError("ManifoldMuon does not support sparse gradients")
    if p.ndim not in (2, 3):  # 3-D: a stack of expert matrices
        raise ConfigError(
            f"{_where(group, index)}: a manifold-Muon weight became a tensor of shape "
            f"{tuple(p.shape)} after the optimizer was built; wrappers that flatten weights into "
            "shards (DeepSpeed ZeRO, FSDP1) cannot train manifold geometries: shard with FSDP2's "
            "fully_shard",
            source=_SOURCE, key="params")


def _geometries(group: dict[str, Any]) -> list[Manifold]:
    geo = group["geometry"]
    names = geo if isinstance(geo, tuple) else (geo,) * group["split"]
    return [get_manifold(g) for g in names]


def _uniform(group: dict[str, Any]) -> bool:
    geo = group["geometry"]
    return not isinstance(geo, tuple) or len(set(geo)) == 1


def _pieces(t: Tensor, group: dict[str, Any]) -> list[tuple[Manifold, Tensor]]:
    """(geometry, view of ``t``) pairs to step: one batched view when every block has the
    same geometry, else one view per block. Writing into a view writes into ``t``."""
    views = block_view(t, group["split"], group["split_dim"])
    geos, heads = _geometries(group), _heads(group)
    if _uniform(group) and views.dim() <= 3 and len(set(heads)) == 1:  # one stack
        return [(geos[0], _per_head(views, heads[0]))]  # (rows, cols) or (count, rows, cols)
    return [(g, _per_head(v, h)) for g, v, h in zip(geos, views.unbind(0), heads)]


def _heads(group: dict[str, Any]) -> tuple[int, ...]:
    """Heads each block is cut into (1: the block is one matrix), one count per block."""
    h = group.get("heads", 1)
    return tuple(h) if isinstance(h, tuple) else (h,) * group["split"]


def _per_head(view: Tensor, heads: int) -> Tensor:
    """``(rows, cols)`` or ``(count, rows, cols)`` as ``(count · heads, rows/heads, cols)``:
    each head's rows a matrix (a view: writing into it writes the weight)."""
    if heads == 1:
        return view
    return view.unflatten(-2, (heads, -1)).view(-1, view.shape[-2] // heads, view.shape[-1])


def _check_heads(group: dict[str, Any], where: str) -> tuple[int, ...]:
    heads = tuple(group["heads"])
    if len(heads) != group["split"] or any(settings.validate("heads", h)[1] for h in heads):
        raise ConfigError(f"{where}: heads must be a count or one count per block "
                          f"(split={group['split']}), got {heads!r}", source=_SOURCE, key="heads")
    return heads


def _place_on_manifold(p: Tensor, group: dict[str, Any]) -> None:
    """Project each block of ``p`` that is off its manifold onto it; blocks already on it
    (e.g. resumed from a checkpoint) are left untouched. A sharded ``p`` is judged and
    projected whole, every rank taking the same decision, and each rank keeps its slice."""
    full = sharded.whole(p)
    pieces = _pieces(full, group)
    off = sharded.any_rank(p, [not _on_manifold(manifold, view) for manifold, view in pieces])
    for (manifold, view), project in zip(pieces, off):
        if project:
            view.copy_(manifold.project(view))
    if any(off):
        sharded.write_back(p, full)


def _on_manifold(manifold: Manifold, W: Tensor) -> bool:
    """Whether every matrix of ``W`` (``(..., m, n)``) satisfies its constraint to
    ``_ON_MANIFOLD_RTOL`` times the scale of its Gram matrix: the largest squared norm of
    the columns of its tall orientation, or 1 when smaller (so unit-scale sets such as
    Stiefel keep an absolute tolerance, and DGram weights with large column norms, whose
    rounding error grows with the norms squared, are still seen as on the set)."""
    err = manifold.constraint_error(W)
    tall = W.mT if W.shape[-2] < W.shape[-1] else W
    scale = tall.square().sum(dim=-2).amax(dim=-1).clamp_min(1.0)  # max_j ‖w_j‖², at least 1
    return bool((err <= _ON_MANIFOLD_RTOL * scale.to(err.dtype)).all())


def _decay(manifold: Manifold, group: dict[str, Any]) -> float:
    return group["weight_decay"] if manifold.name == "euclidean" else 0.0


def _scale(manifold: Manifold, W: Tensor, group: dict[str, Any]) -> float:
    """Plain Muon's shape scale (the group's ``muon_scale``) for euclidean blocks, else 1.

    ``W`` is a view from :func:`_pieces`, already ``(out, in)``."""
    if manifold.name != "euclidean":
        return 1.0
    fan_out, fan_in = W.shape[-2:]
    return MUON_SCALES[group["muon_scale"]](fan_out, fan_in)


def _zeros_dual(W: Tensor) -> Tensor:
    k = min(W.shape[-2:])
    return torch.zeros(*W.shape[:-2], k, k, dtype=W.dtype, device=W.device)
