"""Instability probes: attention logits and entropy, spectral norms, constraint errors.

Two measurements, both cheap enough to run every few training steps:

* :func:`attention_stats` runs one extra forward pass (no grad, eval mode) on a fixed
  probe batch with every attention layer's queries and keys captured as its kernel gets
  them (:mod:`geosearch.models.qk`), and reduces the attention logits ``z = q·kᵀ/√hs``
  of each layer (soft-capped as the kernel caps them, when it does) to

  - ``max_logit``: the largest logit over heads, sequences and causal (query, key)
    pairs; future positions, which the softmax never sees, are excluded. Signed max, as
    in Wortsman et al. 2023 (max logits ≳ 1e3 degrade the loss, ≳ 1e4 diverge). Each
    head's own is kept too (``max_logit_per_head``), to show which heads grow. A position
    bias the kernel adds to the logits (ALiBi's, in Falcon) is not part of it: it is fixed
    by position, not learned, and defined only up to a constant per query row.
  - attention entropy, in nats, of each causal softmax row ``H_i = -Σ_{j≤i} p_ij ln p_ij``
    (at most ``ln(i+1)``), of the softmax the kernel computes (position bias included).
    Row 0 attends to a single key and always has H = 0, so it is
    left out. Each head's entropy is its mean over rows 1..T-1 and the batch;
    ``min_entropy`` is the smallest head entropy (one head collapsing onto single keys,
    Zhai et al. 2023) and ``mean_entropy`` the mean over heads (= over heads and rows).
    The minimum is taken over *heads*, not over single rows: a row minimum is ~0 in any
    healthy model that has a previous-token head, so it could not tell collapse apart.

* :class:`WeightProbe` measures the largest singular value of every watched hidden
  weight and its distance from its manifold
  (``geosearch.manifolds.get_manifold(name).constraint_error``), per module type (split
  blocks of a fused weight separately), reporting the max over layers. It watches the
  matched rows of a :class:`~geosearch.plan.Plan`, so it sees the blocks the optimizer
  steps.

Example:
    >>> probe = WeightProbe.from_plan(bind(model, assignment))   # once
    >>> stats = attention_stats(model, x_probe)                   # every probe step
    >>> stats["max_logit"], probe.measure()["sigma_max"]["attn_qkv"]
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn as nn

from geosearch.util.checks import is_int
from geosearch.util.errors import ConfigError
from geosearch.manifolds import geometry_names, get_manifold
from geosearch.optim.settings import ADAMW
from geosearch.optim.blocks import block_view
from geosearch.plan import Plan, bind
from geosearch.models.model import CausalSelfAttention

if TYPE_CHECKING:  # pragma: no cover
    from geosearch.assignment import Assignment
    from geosearch.models.qk import LayerQK


# --------------------------------------------------------------------------- attention
@contextmanager
def recording_qk(model: nn.Module) -> Iterator[list[CausalSelfAttention]]:
    """Make every attention layer of ``model`` keep ``last_q``/``last_k`` while inside.

    Yields the attention modules in layer order. On exit recording is switched off and
    the stored tensors are dropped.
    """
    layers = [m for m in model.modules() if isinstance(m, CausalSelfAttention)]
    if not layers:
        raise ValueError(f"{type(model).__name__} has no CausalSelfAttention module to probe")
    for m in layers:
        m.record_qk = True
    try:
        yield layers
    finally:
        for m in layers:
            m.record_qk, m.last_q, m.last_k = False, None, None


def causal_logits(q: torch.Tensor, k: torch.Tensor, scale: float | None = None, *,
                  softcap: float | None = None, allowed: torch.Tensor | None = None,
                  bias: torch.Tensor | None = None) -> torch.Tensor:
    """Attention logits q·kᵀ/√hs in float32 with the future masked to -inf.

    Args:
        q, k: (B, nh, T, hs).
        scale: the model's attention scale when it is not 1/√hs (logits ``scale·q·kᵀ``).
        softcap: the kernel's soft cap: logits ``softcap·tanh(z / softcap)``; None = none.
        allowed: (B or 1, nh or 1, T, T) booleans, where the kernel's mask lets a query see
            a key; pairs it forbids are masked too. None = causal only.
        bias: (B or 1, nh or 1, T, T) added after the cap, as the kernel adds its float
            mask (ALiBi's position bias); None = none.

    Returns:
        (B, nh, T, T); entry [b, h, i, j] is the logit of query i for key j, -inf for j > i
        and for pairs ``allowed`` forbids.
    """
    T, hs = q.size(-2), q.size(-1)
    z = q.float() @ k.float().transpose(-2, -1)  # (B, nh, T, T)
    z = z / math.sqrt(hs) if scale is None else z * scale
    if softcap is not None:
        z = softcap * torch.tanh(z / softcap)
    if bias is not None:
        z = z + bias.float()
    masked = torch.ones(T, T, dtype=torch.bool, device=q.device).triu(1)  # (T, T) j > i
    if allowed is not None:
        masked = masked | ~allowed  # (B or 1, nh or 1, T, T)
    return z.masked_fill(masked, float("-inf"))


def row_entropy(logits: torch.Tensor) -> torch.Tensor:
    """Entropy in nats of the softmax of each row; -inf entries have probability 0.

    Args:
        logits: (..., T, T) as from :func:`causal_logits`.

    Returns:
        (..., T); a uniform row over n keys gives ln n.
    """
    p = torch.softmax(logits, dim=-1)  # (..., T, T), 0 where masked
    return torch.special.entr(p).sum(dim=-1)  # entr(p) = -p ln p, entr(0) = 0


def layer_attention_stats(q: torch.Tensor, k: torch.Tensor, scale: float | None = None, *,
                          softcap: float | None = None, allowed: torch.Tensor | None = None,
                          bias: torch.Tensor | None = None) -> tuple[float, float, float]:
    """``(max_logit, min_entropy, mean_entropy)`` of one layer (definitions in the module
    doc): the max of ``scale·q·kᵀ`` (soft-capped when ``softcap``), the entropies of the
    softmax the kernel computes (``bias`` added).

    Args:
        q, k: (B, nh, T, hs) with T ≥ 2.
        scale, softcap, allowed, bias: as :func:`causal_logits`.
    """
    heads, min_entropy, mean_entropy = head_attention_stats(q, k, scale, softcap=softcap,
                                                            allowed=allowed, bias=bias)
    return max(heads, key=_nan_first), min_entropy, mean_entropy


def head_attention_stats(q: torch.Tensor, k: torch.Tensor, scale: float | None = None, *,
                         softcap: float | None = None, allowed: torch.Tensor | None = None,
                         bias: torch.Tensor | None = None) -> tuple[list[float], float, float]:
    """``(max logit of each head, min_entropy, mean_entropy)`` of one layer: as
    :func:`layer_attention_stats`, whose ``max_logit`` is the largest of the heads'."""
    if q.size(-2) < 2:
        raise ValueError("attention entropy needs sequences of at least 2 tokens")
    z = causal_logits(q, k, scale, softcap=softcap, allowed=allowed)  # (B, nh, T, T)
    max_logit = z.amax(dim=(0, 2, 3))  # (nh,) masked entries are -inf, never the max
    seen = z if bias is None else z + bias.float()  # what the softmax gets; -inf stays -inf
    head_entropy = row_entropy(seen)[..., 1:].mean(dim=(0, 2))  # (nh,) rows 1..T-1, batch
    return max_logit.tolist(), head_entropy.min().item(), head_entropy.mean().item()


@torch.no_grad()
def attention_stats(model: nn.Module, x: torch.Tensor, qk_source: str | None = "nanogpt") -> dict:
    """Per-layer max attention logit and attention entropy on the probe batch ``x``.

    One forward pass of ``model`` under ``torch.no_grad`` in eval mode (the training mode
    is restored), each layer reduced to its statistics as soon as it has run. Pass the
    unwrapped model (not a DDP wrapper).

    Args:
        model: a model holding :class:`CausalSelfAttention` layers (e.g. the proxy GPT),
            or any model whose attention :func:`geosearch.models.qk.qk_capture` captures.
        x: token ids (B, T), T ≥ 2; a fixed batch of a few sequences.
        qk_source: how to get each layer's queries and keys, one of
            :data:`geosearch.models.qk.QK_SOURCES` (``BuiltModel.qk_source`` of a zoo model);
            None = detected.

    Returns:
        ``max_logit_per_layer``, ``min_entropy_per_layer``, ``mean_entropy_per_layer``
        (lists, layer order), ``max_logit_per_head`` (a list per layer, one value per
        query head: the layer's max logit is their largest), and ``max_logit`` (max over
        layers), ``min_entropy`` (min over layers), ``mean_entropy`` (mean over layers), as
        floats: the max of ``scale·q·kᵀ`` and the entropies of the kernel's softmax (an
        additive position bias in those only, see the module doc). A model that soft-caps
        its logits (Gemma 2) has them capped here too, and gets ``raw_max_logit_per_layer``
        and ``raw_max_logit``: the largest logits before the cap (what grows when the capped
        ones saturate). A diverged model gives NaN/inf values, which the pruner treats as
        unstable.
    """
    from geosearch.models.qk import qk_capture

    per_layer: dict[int, tuple[float, float, float]] = {}
    per_head: dict[int, list[float]] = {}
    raw: dict[int, float] = {}

    def reduce(i: int, t: LayerQK) -> None:
        heads, lo, mean = head_attention_stats(t.q, t.k, t.scale, softcap=t.softcap,
                                               allowed=t.allowed, bias=t.bias)
        per_layer[i], per_head[i] = (max(heads, key=_nan_first), lo, mean), heads
        if t.softcap is not None:
            raw[i] = causal_logits(t.q, t.k, t.scale, allowed=t.allowed).amax().item()

    was_training = model.training
    model.eval()
    try:
        with qk_capture(model, qk_source, on_layer=reduce):
            model(x)
    finally:
        model.train(was_training)
    max_logit, min_entropy, mean_entropy = (list(v) for v in zip(*(per_layer[i] for i in sorted(per_layer))))
    out = {
        "max_logit_per_layer": max_logit,
        "max_logit_per_head": [per_head[i] for i in sorted(per_head)],
        "min_entropy_per_layer": min_entropy,
        "mean_entropy_per_layer": mean_entropy,
        "max_logit": max(max_logit, key=_nan_first),
        "min_entropy": min(min_entropy, key=lambda v: -math.inf if math.isnan(v) else v),
        "mean_entropy": sum(mean_entropy) / len(mean_entropy),
    }
    if raw:
        out["raw_max_logit_per_layer"] = [raw.get(i, per_layer[i][0]) for i in sorted(per_layer)]
        out["raw_max_logit"] = max(out["raw_max_logit_per_layer"], key=_nan_first)
    return out


def _nan_first(v: float) -> float:
    """Sort key that puts NaN above everything, so max()/min() report a NaN layer."""
    return math.inf if math.isnan(v) else v


# --------------------------------------------------------------------------- weights
@dataclass(frozen=True)
class ProbedWeight:
    """One hidden weight to watch (a :class:`~geosearch.plan.ParamPlan` row has the same
    attributes and serves as well).

    Attributes:
        name: parameter name, for messages.
        param: the 2-D weight, or a 3-D stack of experts' matrices (each watched as a layer's).
        types: module type of each block (one entry unless the weight is fused, e.g.
            ``("attn_q", "attn_k", "attn_v")`` for a split ``c_attn``).
        geometries: geometry of each block, as ``types``.
        split_dim: the dimension the blocks are stacked along (0 for ``nn.Linear``).
    """

    name: str
    param: torch.Tensor
    types: tuple[str, ...]
    geometries: tuple[str, ...]
    split_dim: int = 0


class WeightProbe:
    """σ_max and constraint error of hidden weights, per module type, max over layers.

    Build it once, call :meth:`measure` at every probe step. Blocks of the same type are
    stacked and measured in one batched call.

    σ_max: ``sigma="exact"`` takes the top eigenvalue of the small Gram matrix WᵀW
    (``torch.linalg.eigvalsh``, batched; a few ms for the ``small`` proxy on CPU).
    ``sigma="power"`` runs ``power_iters`` power-iteration steps per call, warm-started
    from the previous call's vector: a lower bound that converges as calls accumulate
    (weights move little between probes); use it when the weights are large.

    Constraint error: ``get_manifold(geometry).constraint_error`` per block; geometry
    ``adamw`` has no constraint and is left out of ``constraint_error``.

    Args:
        weights: the weights to watch: :class:`ProbedWeight` or plan rows.
        sigma: ``"exact"`` or ``"power"``.
        power_iters: power-iteration steps per call (``sigma="power"``); the first call
            does ``10 * power_iters``.

    Example:
        >>> probe = WeightProbe.from_plan(bind(model, Assignment.parse("attn=stiefel,mlp=dgram")))
        >>> probe.measure()
        {'sigma_max': {'attn_qkv': 1.0, ...}, 'constraint_error': {'attn_qkv': 3e-07, ...}}
    """

    SIGMA_METHODS = ("exact", "power")

    def __init__(self, weights: Sequence[ProbedWeight], *, sigma: str = "exact",
                 power_iters: int = 2) -> None:
        if sigma not in self.SIGMA_METHODS:
            raise ConfigError(f"unknown sigma method {sigma!r}", source="WeightProbe", key="sigma",
                              allowed=self.SIGMA_METHODS)
        if not is_int(power_iters) or power_iters < 1:
            raise ConfigError(f"must be a positive integer but got {power_iters!r}",
                              source="WeightProbe", key="power_iters")
        known = geometry_names()
        self.sigma, self.power_iters = sigma, power_iters
        # module type -> [(param, block, n_blocks, split_dim)] and its geometry
        self.blocks: dict[str, list[tuple[torch.Tensor, int, int, int]]] = {}
        self.geometry: dict[str, str] = {}
        for w in weights:
            if w.param.dim() not in (2, 3) or len(w.types) != len(w.geometries):
                raise ValueError(f"{w.name}: need a 2-D weight (or a 3-D stack of experts' matrices) and one "
                                 "geometry per block type")
            for block, (t, geo) in enumerate(zip(w.types, w.geometries)):
                if geo not in known:
                    raise ConfigError(f"unknown geometry {geo!r} for {w.name}", source="WeightProbe",
                                      key=t, allowed=known)
                if self.geometry.setdefault(t, geo) != geo:
                    raise ValueError(f"module type {t!r} has two geometries: "
                                     f"{self.geometry[t]!r} and {geo!r} ({w.name})")
                self.blocks.setdefault(t, []).append((w.param, block, len(w.types), w.split_dim))
        self.manifolds = {t: get_manifold(g) for t, g in self.geometry.items() if g != ADAMW}
        self._v: dict[tuple, torch.Tensor] = {}  # power iteration: (type, m, n) -> (L, n, 1)

    @classmethod
    def from_plan(cls, plan: Plan, **kwargs) -> WeightProbe:
        """Watch every weight the plan's rules matched."""
        return cls(plan.matched, **kwargs)

    @classmethod
    def from_assignment(cls, model: nn.Module, assignment: Assignment, **kwargs) -> WeightProbe:
        """Watch every weight the assignment's rules match in ``model`` (binds a plan; prefer
        :meth:`from_plan` with the plan the optimizer was built from)."""
        return cls.from_plan(bind(model, assignment), **kwargs)

    def stacks(self, module_type: str) -> list[torch.Tensor]:
        """All blocks of one type as (L, m, n) tall matrices (m ≥ n), float32 or float64, one
        stack per shape (a type may hold matrices of two shapes: Qwen2-MoE's routers
        ``mlp.gate`` [experts, width] and ``mlp.shared_expert_gate`` [1, width]).

        Blocks are taken in the ``(out, in)`` orientation first (a ``Conv1D`` block is
        transposed), so a square block's Gram matrix is the one the optimizer constrains."""
        by_shape: dict[tuple[int, ...], list[torch.Tensor]] = {}
        for param, block, n_blocks, split_dim in self.blocks[module_type]:
            W = block_view(param.detach(), n_blocks, split_dim)  # (out, in), (n_blocks, out/n, in)
            if n_blocks > 1:
                W = W[block]
            W = W if W.dim() == 3 else W.unsqueeze(0)  # a stack of experts: one matrix each
            W = W.mT if W.size(-2) < W.size(-1) else W
            by_shape.setdefault(tuple(W.shape[1:]), []).append(W)
        stacks = [torch.cat(mats) for mats in by_shape.values()]  # (L, m, n): layers (× experts)
        return [W if W.dtype == torch.float64 else W.float() for W in stacks]

    @torch.no_grad()
    def measure(self) -> dict[str, dict[str, float]]:
        """``{"sigma_max": {type: float}, "constraint_error": {type: float}}``, max over layers.

        A type with a NaN/inf weight anywhere reports NaN for both (a diverged run must be
        measurable: eigensolvers raise on non-finite input).
        """
        sigma_max, constraint_error = {}, {}
        for t in self.blocks:
            stacks = self.stacks(t)
            if not all(torch.isfinite(W).all() for W in stacks):
                sigma_max[t] = math.nan
                if t in self.manifolds:
                    constraint_error[t] = math.nan
                continue
            sigma_max[t] = max(self._sigma_max(t, W).max().item() for W in stacks)
            if t in self.manifolds:
                constraint_error[t] = max(self.manifolds[t].constraint_error(W).max().item()
                                          for W in stacks)
        return {"sigma_max": sigma_max, "constraint_error": constraint_error}

    def _sigma_max(self, t: str, W: torch.Tensor) -> torch.Tensor:
        """(L,) largest singular value of each tall (m, n) matrix."""
        if self.sigma == "exact":
            gram = W.mT @ W  # (L, n, n), eigenvalues σ²
            return torch.linalg.eigvalsh(gram)[..., -1].clamp_min(0).sqrt()
        key = (t, *W.shape[1:])
        v = self._v.get(key)
        iters = self.power_iters
        if v is None or v.shape[:2] != W.shape[::2] or v.device != W.device:
            g = torch.Generator().manual_seed(0)
            v = torch.randn(W.size(0), W.size(2), 1, generator=g, dtype=W.dtype).to(W.device)
            iters = 10 * self.power_iters
        v = v.to(W.dtype)
        for _ in range(iters):  # v ← WᵀW v / ‖WᵀW v‖
            v = W.mT @ (W @ v)  # (L, n, 1)
            v = v / v.norm(dim=1, keepdim=True).clamp_min(1e-30)
        self._v[key] = v
        return (W @ v).norm(dim=1).squeeze(-1)  # (L,) ‖W v‖ ≤ σ_max


def weight_stats(model: nn.Module, assignment: Assignment) -> dict[str, dict[str, float]]:
    """One-off :meth:`WeightProbe.measure` for ``model`` under ``assignment``."""
    return WeightProbe.from_assignment(model, assignment).measure()
