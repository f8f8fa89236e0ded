"""The grouped manifold-Muon step: matrices of one shape and geometry stepped as one batch.

A model holds the same projection in every layer, the blocks of a fused weight (Q, K, V)
and the experts of an MoE layer: many matrices of one shape, trained with one geometry
and the same settings. Stepping each alone costs about 150 small tensor operations per
matrix (``msign``, the tangent projection, the solve and the retraction), and on a CPU or
a GPU it is the operation count, not the arithmetic, that sets the optimizer's time. So
:class:`~geosearch.optim.ManifoldMuon` collects every matrix to step into batches
(:func:`batch_key`: geometry, shape on the tall orientation, dtype, device and every
setting the step reads), stacks each batch into one ``(n, rows, cols)`` tensor and steps
it with batched products (:func:`step_batch`), as ``torch.optim``'s ``foreach``
implementations do for AdamW. A parameter that is already a batch of matrices (the
``(split, rows, cols)`` view of a fused weight; a 3-D expert tensor) is one member that
brings several matrices.

Every matrix gets what it would alone: the maths is per matrix (``msign``, the
projections and the retraction act on the last two dimensions; the dual solver stops and
freezes each matrix at its own tolerance; the adaptive retraction decides per matrix), up
to the float summation order of batched products (about 1e-7 in float32).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from geosearch.manifolds import Manifold
from geosearch.optim.solvers import batched_update

__all__ = ["Member", "batch_key", "cost", "share_batch", "step_batch"]


@dataclass
class Member:
    """One piece of a parameter in a batch: ``weight`` and ``update`` are ``(count, rows,
    cols)`` views on the tall orientation (writing into ``weight`` writes the parameter,
    or the whole matrix gathered from its shards); ``lam0`` the dual warm start
    ``(count, k, k)`` or ``None``. :func:`step_batch` fills ``lam`` and ``residual``."""

    weight: Tensor
    update: Tensor
    lam0: Tensor | None = None
    lam: Tensor | None = field(default=None, repr=False)
    residual: Tensor | None = field(default=None, repr=False)

    @classmethod
    def of(cls, W: Tensor, U: Tensor, lam0: Tensor | None) -> Member:
        """From a piece's ``(rows, cols)`` or ``(count, rows, cols)`` views (any orientation)."""
        if W.ndim == 2:
            W, U = W.unsqueeze(0), U.unsqueeze(0)
        if W.shape[-2] < W.shape[-1]:
            W, U = W.mT, U.mT
        if lam0 is not None:
            lam0 = lam0.reshape(W.shape[0], *lam0.shape[-2:])
        return cls(W, U, lam0)


def batch_key(manifold: Manifold, member: Member, step: dict[str, Any], alone: Any = None) -> tuple:
    """What matrices must share to be stepped together: the geometry, the tall shape, dtype
    and device, whether a warm start is given, and the step's settings ``step`` (learning
    rate, decay, scale, solver keys). ``alone``: anything that makes the key unique (the
    ungrouped step: one batch per piece)."""
    W = member.weight
    settings = tuple(sorted((k, v if isinstance(v, (str, int, float, bool)) else id(v))
                            for k, v in step.items()))
    shape = tuple(W.shape[-2:])
    return (manifold.name, shape, W.dtype, W.device, member.lam0 is None, settings, alone)


def step_batch(manifold: Manifold, members: list[Member], step: dict[str, Any]) -> None:
    """Step the members of one batch (:func:`batch_key`) as one stack and write each result
    into its member's weight; set each member's ``lam`` (or ``None``) and ``residual``
    (``(count,)``, or ``None`` for the project solver)."""
    counts = [m.weight.shape[0] for m in members]
    if len(members) == 1:
        W, U, lam0 = members[0].weight, members[0].update, members[0].lam0
    else:
        W = torch.cat([m.weight for m in members])
        U = torch.cat([m.update for m in members])
        lam0 = None if members[0].lam0 is None else torch.cat([m.lam0 for m in members])
    new, lam, r = batched_update(manifold, W, U, lam0=lam0, **step)
    if len(members) == 1:
        members[0].weight.copy_(new)
        members[0].lam, members[0].residual = lam, r
        return
    torch._foreach_copy_([m.weight for m in members], list(new.split(counts)))
    lams = [None] * len(members) if lam is None else lam.split(counts)
    rs = [None] * len(members) if r is None else r.split(counts)
    for m, lam_m, r_m in zip(members, lams, rs):
        m.lam, m.residual = lam_m, r_m


def cost(members: list[Member]) -> float:
    """The arithmetic of a batch's step, roughly: matrices × rows × cols × the small dim."""
    return float(sum(n * rows * cols**2 for n, rows, cols in (m.weight.shape for m in members)))


def share_batch(manifold: Manifold, members: list[Member], step: dict[str, Any],
                send: Callable[[Tensor], None]) -> None:
    """After the owner rank stepped a batch: ``send`` (the owner's value to every rank, at
    once or when the step's sends are flushed) each new weight, and with the dual solver
    each residual and (Gram geometries) dual variable, so every rank holds what the owner
    computed. Other ranks receive into fresh buffers."""
    for m in members:
        send(m.weight)
        if step["solver"] != "dual":
            continue
        count, k = m.weight.shape[0], m.weight.shape[-1]
        if m.residual is None:
            m.residual = m.weight.new_zeros(count)
        send(m.residual)
        if manifold.is_gram:
            if m.lam is None:
                m.lam = m.update.new_zeros(count, k, k)
            send(m.lam)
