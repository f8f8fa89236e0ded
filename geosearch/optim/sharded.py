"""Whole matrices of sharded weights: FSDP2 (``fully_shard``) and other DTensor parameters.

Under FSDP2 every parameter is a ``DTensor`` of which each rank holds a slice (``Shard(0)``
by default: a block of rows). Elementwise work (Nesterov momentum, AdamW) runs on the
slices as they are, but a manifold-Muon step needs the whole matrix: ``msign`` and the
projection onto the tangent space see all of it, the retraction (a polar factor, column
norms) too, and a fused weight is split into its blocks (Q, K, V) along the whole matrix,
not along a rank's rows. So :class:`~geosearch.optim.ManifoldMuon` gathers the weight and
its momentum (:func:`whole`), steps the whole matrix, and each rank keeps its own slice
(:func:`write_back`), as Moonlight's distributed Muon does (gather, compute the full
update, keep the local part). The step of each batch of matrices
(:mod:`geosearch.optim.grouped`) is computed **once**, by one owner rank (:func:`owners`:
each batch to the least loaded rank so far, in an order every rank shares), which sends
the new matrices (and the dual variables and residuals) to the others (:func:`share_all`:
one broadcast per owner of all it computed, flattened into one buffer). A batch is stepped by its owner exactly as one process steps it, so sharded
training gives one process's numbers. Per matrix and step that costs two all-gathers of
the weight's size (the weight and its Nesterov momentum; FSDP2 itself gathers the weight
once for the forward pass and, by default, once more for the backward) and its part of a
broadcast,
and the whole matrices of one weight in memory (what training it unsharded needs).

Under DDP every rank holds every weight whole and the same gradient (all-reduced), so
every rank would compute the same step: given DDP's process group
(``ManifoldMuon(..., replicas=group)``, which :func:`~geosearch.build.build_optimizer` passes
for a model wrapped in ``DistributedDataParallel``), :func:`owners` divides the plain
weights' batches among its ranks in the same way, and :func:`share` sends each result.

Supported layouts: a ``DTensor`` on a one-dimensional device mesh whose placement is
``Shard(d)`` (any dimension: FSDP2's default ``Shard(0)`` or a ``shard_placement_fn``'s
``Shard(1)``) or ``Replicate()``. Anything else (a 2-D mesh, as HSDP or FSDP with tensor
parallelism make; ``Partial``; strided shards) is refused by :func:`layout_problem`
before training. Plain tensors pass through untouched.

``torch.distributed`` is looked up only when a DTensor can exist (its module is loaded),
so unsharded training imports nothing more.
"""

from __future__ import annotations

import sys

import torch
from torch import Tensor

__all__ = ["is_sharded", "layout_problem", "whole", "write_back", "any_rank", "ranks", "owners",
           "divide", "is_mine", "share", "share_all", "SUPPORTED"]

SUPPORTED = "a 1-D device mesh with a Shard or Replicate placement (FSDP2's fully_shard on one mesh dimension)"
"""The sharded layouts manifold Muon steps, in words (for messages)."""


def is_sharded(t: Tensor) -> bool:
    """Whether ``t`` is a ``DTensor`` (an FSDP2 parameter, its gradient or momentum)."""
    module = sys.modules.get("torch.distributed.tensor")
    return module is not None and isinstance(t, module.DTensor)


def layout_problem(p: Tensor) -> str | None:
    """``None`` when manifold Muon can step ``p`` (a plain tensor or a supported DTensor);
    else the layout in words, e.g. ``"a DTensor on a 2-D device mesh, placements
    (Replicate(), Shard(dim=0))"`` (HSDP)."""
    if not is_sharded(p):
        return None
    from torch.distributed.tensor import Replicate, Shard

    mesh, placements = p.device_mesh, tuple(p.placements)
    ok = mesh.ndim == 1 and all(type(pl) in (Shard, Replicate) for pl in placements)
    if ok:
        return None
    return f"a DTensor on a {mesh.ndim}-D device mesh, placements ({', '.join(map(repr, placements))})"


def whole(t: Tensor) -> Tensor:
    """The whole matrix of ``t`` on every rank (an all-gather), or ``t`` itself when plain."""
    return t.full_tensor() if is_sharded(t) else t


def write_back(p: Tensor, full: Tensor) -> None:
    """Write ``full`` (the whole new value of ``p``, equal on every rank) into ``p``: into
    this rank's slice when ``p`` is sharded (no communication), else into ``p`` itself."""
    if not is_sharded(p):
        if full is not p:
            p.copy_(full)
        return
    from torch.distributed.tensor import distribute_tensor

    # src_data_rank=None: every rank cuts its own slice out of its own copy of `full`
    # with the placement's own rule (uneven shards included), without communication.
    mine = distribute_tensor(full, p.device_mesh, p.placements, src_data_rank=None).to_local()
    p.to_local().copy_(mine)


def any_rank(p: Tensor, flags: list[bool]) -> list[bool]:
    """``flags`` or-ed over the ranks of ``p``'s mesh (one small all-reduce), so that every
    rank takes the same branch for its slice of a sharded weight; plain ``p``: as given."""
    if not is_sharded(p):
        return flags
    import torch.distributed as dist

    local = p.to_local()
    t = torch.tensor([int(f) for f in flags], dtype=torch.int32, device=local.device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=p.device_mesh.get_group())
    return [bool(v) for v in t.tolist()]


def ranks(params: list[Tensor], replicas: object = None) -> tuple[object, int]:
    """``(process group, its size)`` over which :func:`owners` divides a batch of ``params``
    (see there), or ``(None, 1)`` when every rank steps it."""
    groups = {p.device_mesh.get_group() for p in params} if all(map(is_sharded, params)) else set()
    if replicas is not None and not any(map(is_sharded, params)):
        groups = {replicas}
    if len(groups) != 1:
        return None, 1
    import torch.distributed as dist

    group = groups.pop()
    return group, dist.get_world_size(group)


def owners(batches: list[tuple[list[Tensor], float]],
           replicas: object = None) -> list[tuple[int, object] | None]:
    """For each batch (its members' parameters, its cost): ``(owner, process group)`` when
    every parameter is a DTensor of one mesh of two or more ranks, or a plain tensor that
    every rank of ``replicas`` (a process group of two or more ranks: DDP's) holds whole and
    steps alike; else ``None`` (every rank steps it). Each batch goes to the rank with the
    least cost so far (ties: the lowest), in the order given, which is the same on every
    rank, so every rank draws the same plan."""
    load: dict[object, list[float]] = {}
    out: list[tuple[int, object] | None] = []
    for params, cost in batches:
        group, size = ranks(params, replicas)
        if size < 2:
            out.append(None)
            continue
        loads = load.setdefault(group, [0.0] * size)
        owner = min(range(size), key=loads.__getitem__)
        loads[owner] += cost
        out.append((owner, group))
    return out


def divide(costs: list[list[float]], size: int) -> list[list[tuple[int, int, int]]]:
    """Cut a list of batches (each its members' costs, in an order every rank shares) into
    ``size`` contiguous runs of about equal cost, one per rank: for each batch its pieces
    ``(start, stop, rank)`` over its members. A batch is cut only where a run ends, so each
    rank gets about ``1/size`` of the arithmetic and few pieces (a piece's step launches
    about as many operations as a whole batch's: cutting every batch in ``size`` parts
    leaves each rank every batch's operations).

    >>> divide([[4.0, 4.0, 4.0, 4.0], [1.0, 1.0], [2.0, 2.0]], 2)
    [[(0, 3, 0), (3, 4, 1)], [(0, 2, 1)], [(0, 2, 1)]]
    """
    total = sum(map(sum, costs)) or 1.0
    out, done, rank = [], 0.0, 0
    for members in costs:
        pieces, start = [], 0
        for i, c in enumerate(members):
            # a run ends where the cost so far passes the rank's share (at a member's middle)
            while rank < size - 1 and done + c / 2 >= (rank + 1) * total / size:
                if i > start:
                    pieces.append((start, i, rank))
                start, rank = i, rank + 1
            done += c
        pieces.append((start, len(members), rank))
        out.append(pieces)
    return out


def is_mine(owner: tuple[int, object] | None) -> bool:
    """Whether this rank computes a batch of :func:`owners`' plan."""
    if owner is None:
        return True
    import torch.distributed as dist

    return dist.get_rank(owner[1]) == owner[0]


def share(t: Tensor, owner: tuple[int, object]) -> None:
    """Overwrite ``t`` on every rank of the group with the owner's ``t`` (a broadcast)."""
    import torch.distributed as dist

    rank, group = owner
    buf = t if t.is_contiguous() else t.contiguous()
    dist.broadcast(buf, src=dist.get_global_rank(group, rank), group=group)
    if buf is not t:
        t.copy_(buf)


def share_all(sends: list[tuple[Tensor, tuple[int, object]]]) -> None:
    """:func:`share` for many tensors: ``(tensor, owner)`` pairs, listed in the same order on
    every rank. The tensors of one owner (and dtype and device) travel flattened in one
    buffer, so a step costs one broadcast per owner instead of one per matrix (each a
    round trip of its own, which on two CPU ranks cost more than the compute it saved)."""
    import torch.distributed as dist

    buckets: dict[tuple, list[Tensor]] = {}
    for t, owner in sends:
        buckets.setdefault((owner, t.dtype, t.device), []).append(t)
    for ((rank, group), dtype, device), tensors in buckets.items():
        mine = dist.get_rank(group) == rank
        sizes = [t.numel() for t in tensors]
        flat = (torch.cat([t.reshape(-1) for t in tensors]) if mine
                else torch.empty(sum(sizes), dtype=dtype, device=device))
        dist.broadcast(flat, src=dist.get_global_rank(group, rank), group=group)
        if mine:
            continue
        for t, part in zip(tensors, flat.split(sizes)):
            t.copy_(part.view(t.shape))
