"""QK-clip: cap each attention head's max logit at τ by shrinking its query and key weights.

Kimi K2's MuonClip (Kimi Team 2025, arXiv 2507.20534) as a training option
(``TrainConfig.qk_clip``) of the unconstrained baselines, the fix people reach for
instead of a manifold (``docs/design.md``, "The instability signal"). During each
training forward, every head h of every attention layer records ``S_max^h``, its largest
logit ``scale·q_i·k_j`` over the batch and the causal pairs j ≤ i (maximum over
data-parallel processes too); right after the optimizer step each head with
``S_max^h > τ`` gets ``γ_h = τ / S_max^h``:

* multi-head attention: the head's query outputs (its rows of ``W_q``, or columns of a
  ``Conv1D``, and of the bias) are multiplied by ``γ_h^α`` and its key outputs by
  ``γ_h^(1−α)`` (α = 0.5, Kimi's √γ), so its logits on those inputs shrink by exactly
  ``γ_h``; scaling the bias too keeps this exact, and rotary embeddings commute with it.
* grouped-query attention: the shared key head is left alone and the query head takes
  all of ``γ_h``, as Kimi K2 does with MLA's shared rotary key; clipping one head then
  never changes the logits of the other heads of its group.

Other heads keep every bit; the optimizer state is not touched. The cap is exact for the
clipped heads on the batch they were measured on; later layers then see other inputs,
and the next step moves the weights again, so the probes (another batch, one step on)
can read a little above τ. Only downscaling happens, which keeps a weight in its set
for AdamW, ``euclidean`` (plain Muon) and ``spectral_ball`` (σ_max cannot grow); it
would move a weight off a manifold (Stiefel, DGram, sphere, oblique), so :class:`QKClip`
refuses those. The head maxima are taken inside the capture of :mod:`geosearch.models.qk`
as each layer runs (one matmul per layer) and only the ``(n_head,)`` vector is kept; the
rescale needs no host sync. They are maxima of the raw logits ``scale·q·kᵀ`` (before a
soft cap, which is what the weights scale) over every causal pair (a sliding window's
mask is not applied: the bound is conservative).

Example:
    >>> clip = QKClip(model, tau=100.0, plan=plan)
    >>> with clip.observe():
    ...     loss = lm_loss(model, x, y)
    >>> loss.backward(); optimizer.step()
    >>> clip.apply()   # number of heads clipped (a 0-d tensor)
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import NamedTuple

import torch
from torch import nn

from geosearch.util.errors import ConfigError
from geosearch.optim.settings import ADAMW
from geosearch.rules.modules import fused_qkv_layout
from geosearch.plan import ParamPlan, Plan
from geosearch.proxy.config import check_qk_clip
from geosearch.models.qk import LayerQK, attention_layers, detect_qk_source, qk_capture, why_no_qk_source

__all__ = ["CLIP_GEOMETRIES", "HeadBlock", "HeadLayout", "QKClip", "head_layout", "head_max_logits"]

CLIP_GEOMETRIES = (ADAMW, "euclidean", "spectral_ball")
"""Geometries of the query/key weights that QK-clip may rescale (see the module doc)."""

_CHUNK = 1 << 24
"""Most logits (float32, 64 MiB) materialised at once while taking a layer's head maxima."""


class HeadBlock(NamedTuple):
    """Where an attention layer's query (or key) heads sit in a weight.

    Attributes:
        weight: the projection weight.
        bias: its bias, or None.
        dim: the output dimension of ``weight``: 0 for ``nn.Linear`` (out, in), 1 for a
            Hugging Face ``Conv1D`` (in, out).
        start: index along ``dim`` of the first head's first output.
        heads: number of heads, each ``head_dim`` consecutive outputs.
        head_dim: outputs per head.
    """

    weight: nn.Parameter
    bias: nn.Parameter | None
    dim: int
    start: int
    heads: int
    head_dim: int

    @property
    def stop(self) -> int:
        return self.start + self.heads * self.head_dim


class HeadLayout(NamedTuple):
    """An attention layer's query and key heads; ``k.heads`` divides ``q.heads`` (GQA)."""

    q: HeadBlock
    k: HeadBlock


# --------------------------------------------------------------------------- layouts
_FUSED = ("c_attn", "qkv_proj", "Wqkv", "W_pack")
"""Fused projections stacked as ``[Q | K | V]`` whose heads :func:`head_layout` can find."""


def head_layout(m: nn.Module) -> HeadLayout:
    """Where attention module ``m`` keeps each head's query and key outputs: the rows of
    ``q_proj`` and ``k_proj`` (``nn.Linear``), or the ``[Q | K | V]`` blocks of a fused
    projection (rows of an ``nn.Linear``, columns of a ``Conv1D``) sized by the module's
    head counts (:func:`geosearch.rules.modules.fused_qkv_layout`: Q ``heads·head_dim`` wide, K
    ``kv_heads·head_dim``).

    Raises:
        ValueError: neither is there, or the fused one is not stacked that way.
    """
    if hasattr(m, "q_proj") and hasattr(m, "k_proj"):
        hd = getattr(m, "head_dim", None) or getattr(m, "head_size", None)
        if not hd:
            raise ValueError(f"{type(m).__name__} has q_proj/k_proj but states no head_dim to find its heads by")
        q, k = m.q_proj, m.k_proj
        layout = HeadLayout(HeadBlock(q.weight, q.bias, 0, 0, q.weight.size(0) // hd, hd),
                            HeadBlock(k.weight, k.bias, 0, 0, k.weight.size(0) // hd, hd))
    else:
        leaf = next((f for f in _FUSED if isinstance(getattr(getattr(m, f, None), "weight", None), nn.Parameter)),
                    None)
        fused = fused_qkv_layout(m, leaf) if leaf is not None else None
        if fused is None:
            raise ValueError(f"{type(m).__name__} has no q_proj/k_proj and no fused c_attn, qkv_proj, Wqkv or "
                             "W_pack with head counts to find each head's query and key rows in")
        proj = getattr(m, leaf)
        dim = 1 if type(proj).__name__ == "Conv1D" else 0  # Conv1D weight (in, out), y = x @ W + b
        out = proj.weight.size(dim)
        if fused.per_head or fused.q_rows + 2 * fused.kv_rows != out:
            raise ValueError(f"{type(m).__name__}.{leaf} ({out} outputs) is not [Q | K | V] blocks of "
                             f"{fused.heads} query and {fused.kv_heads} key heads of {fused.head_dim}")
        layout = HeadLayout(
            HeadBlock(proj.weight, proj.bias, dim, 0, fused.heads, fused.head_dim),
            HeadBlock(proj.weight, proj.bias, dim, fused.q_rows, fused.kv_heads, fused.head_dim))
    if layout.k.heads < 1 or layout.q.heads % layout.k.heads:
        raise ValueError(f"{type(m).__name__}: {layout.q.heads} query heads cannot share "
                         f"{layout.k.heads} key heads")
    return layout


# --------------------------------------------------------------------------- measure
def head_max_logits(layer: LayerQK) -> torch.Tensor:
    """Each head's largest causal attention logit over the batch, in float32.

    The probes' ``max_logit`` (:func:`geosearch.proxy.probes.causal_logits`) per head, up
    to rounding, at the cost of one batched matmul: the scale goes on ``q`` and the causal
    mask is added inside the matmul (``baddbmm``), which on CPU is 3x cheaper than scaling
    and masking the logits afterwards.

    Args:
        layer: queries and keys (B, nh, T, hs) as the kernel gets them; its soft cap and
            mask are not applied (see the module doc).

    Returns:
        (nh,): ``max_{b, j ≤ i} scale·q[b,h,i]·k[b,h,j]``.
    """
    B, nh, T, _ = layer.q.shape
    rows = max(1, _CHUNK // (nh * T * T))  # batch rows per chunk: bounded memory
    with torch.no_grad(), torch.autocast(layer.q.device.type, enabled=False):  # float32 logits
        q, k = layer.q.float() * layer.scale, layer.k.float()
        future = torch.full((T, T), float("-inf"), device=q.device).triu(1)  # (T, T): -inf where j > i
        maxima = [torch.baddbmm(future, q[b:b + rows].flatten(0, 1), k[b:b + rows].flatten(0, 1).mT)
                  .view(-1, nh, T, T).amax(dim=(0, 2, 3)) for b in range(0, B, rows)]  # each (nh,)
    return torch.stack(maxima).amax(dim=0)


# --------------------------------------------------------------------------- clip
class QKClip:
    """QK-clip for one model: observe a training forward, then :meth:`apply` after the step.

    With ``tau=None`` it is switched off: :meth:`observe` installs nothing, :meth:`apply`
    does nothing and :meth:`metrics` is empty, so a trainer can call it unconditionally.

    Args:
        model: the unwrapped model.
        tau: the cap τ on each head's max logit (Kimi K2 uses 100); None = off.
        alpha: share of ``γ`` taken by the query (``γ^α``) with the rest on the key;
            only used where keys are not shared.
        qk_source: one of :data:`~geosearch.models.qk.QK_SOURCES`; None = detected.
        plan: the run's plan; when given, the query/key weights' geometries are checked
            against :data:`CLIP_GEOMETRIES`.
        source: where ``tau`` came from, for error messages (key ``qk_clip``).

    Raises:
        ConfigError: τ not a positive finite number, α outside [0, 1], a model whose
            attention cannot be captured or whose query/key weights cannot be found, or
            query/key weights on a manifold.
    """

    def __init__(self, model: nn.Module, tau: float | None, *, alpha: float = 0.5,
                 qk_source: str | None = None, plan: Plan | None = None,
                 source: str = "QKClip") -> None:
        self.model, self.alpha = model, alpha
        self.tau = check_qk_clip(tau, source)
        self.clipped: torch.Tensor | None = None  # heads clipped at the last apply, 0-d
        self.clipped_total: torch.Tensor | None = None  # over all applies, 0-d
        if self.tau is None:
            return
        if not 0 <= alpha <= 1:
            raise ConfigError(f"alpha must be in [0, 1] but got {alpha!r}", source=source, key="qk_clip")
        self.qk_source = qk_source or detect_qk_source(model)
        if self.qk_source is None:
            raise ConfigError(f"the logits of {type(model).__name__} cannot be clipped: {why_no_qk_source(model)}",
                              source=source, key="qk_clip")
        try:
            self.layouts = [head_layout(m) for m in attention_layers(model, self.qk_source)]
        except ValueError as e:
            raise ConfigError(f"cannot clip this model's logits: {e}", source=source, key="qk_clip") from None
        if plan is not None:
            _check_geometries(plan, self.layouts, source)
        self._smax: list[torch.Tensor | None] = [None] * len(self.layouts)

    @property
    def enabled(self) -> bool:
        return self.tau is not None

    def observe(self) -> AbstractContextManager[None]:
        """Keep each head's max logit over the forward passes since the last :meth:`apply`
        (the micro-batches of one step, with gradient accumulation)."""
        if not self.enabled:
            return nullcontext()
        return self._observing()

    @contextmanager
    def _observing(self) -> Iterator[None]:
        def keep(i: int, layer: LayerQK) -> None:
            new = head_max_logits(layer)  # (nh,); q, k are dropped after this
            old = self._smax[i]
            self._smax[i] = new if old is None else torch.maximum(old, new)

        with qk_capture(self.model, self.qk_source, on_layer=keep):
            yield

    @torch.no_grad()
    def apply(self) -> torch.Tensor | None:
        """Rescale the heads whose observed max logit exceeds τ; call after the optimizer step.

        Returns:
            The number of heads clipped (a 0-d tensor on the device, not synced), or
            None when switched off.

        Raises:
            RuntimeError: no forward pass was observed since the last call.
        """
        if not self.enabled:
            return None
        if any(s is None for s in self._smax):
            raise RuntimeError("QKClip.apply() needs a forward pass inside QKClip.observe() first")
        sizes = [s.numel() for s in self._smax]
        smax = torch.cat(self._smax)  # (Σ nh,) every layer's heads
        if torch.distributed.is_available() and torch.distributed.is_initialized() \
                and torch.distributed.get_world_size() > 1:  # same γ on every rank
            torch.distributed.all_reduce(smax, op=torch.distributed.ReduceOp.MAX)
        over = torch.isfinite(smax) & (smax > self.tau)
        gamma = torch.where(over, self.tau / smax, torch.ones_like(smax))  # (Σ nh,), 1 = untouched
        for layout, g in zip(self.layouts, gamma.split(sizes)):
            _rescale(layout, g, self.alpha)
        self._smax = [None] * len(self.layouts)
        self.clipped = over.sum()
        self.clipped_total = self.clipped if self.clipped_total is None else self.clipped_total + self.clipped
        return self.clipped

    def metrics(self) -> dict[str, int]:
        """``qk_clipped`` (heads clipped at the last step) and ``qk_clipped_total`` (head
        clips over the run so far); empty when switched off, so a run without QK-clip
        records exactly what it did before."""
        if not self.enabled:
            return {}
        return {"qk_clipped": int(self.clipped) if self.clipped is not None else 0,
                "qk_clipped_total": int(self.clipped_total) if self.clipped_total is not None else 0}


def _rescale(layout: HeadLayout, gamma: torch.Tensor, alpha: float) -> None:
    """Multiply each head's query/key outputs by its factor, one multiply per weight."""
    if layout.k.heads == layout.q.heads:
        factors = ((layout.q, gamma ** alpha), (layout.k, gamma ** (1 - alpha)))
    else:  # grouped-query attention: the shared key stays, the query takes all of γ
        factors = ((layout.q, gamma),)
    scales: dict[int, tuple[HeadBlock, torch.Tensor]] = {}  # per weight: (block, per-output scale)
    for block, g in factors:
        _, vec = scales.setdefault(id(block.weight), (block, torch.ones(
            block.weight.size(block.dim), dtype=block.weight.dtype, device=block.weight.device)))
        vec[block.start:block.stop] = g.to(vec.dtype).repeat_interleave(block.head_dim)
    for block, vec in scales.values():  # x * 1.0 == x: unclipped heads keep every bit
        block.weight.mul_(vec.unsqueeze(1) if block.dim == 0 else vec)
        if block.bias is not None:
            block.bias.mul_(vec)


def _check_geometries(plan: Plan, layouts: list[HeadLayout], source: str) -> None:
    rows = {id(r.param): r for r in plan.params}
    for layout in layouts:
        for block in layout:
            row = rows.get(id(block.weight))
            for geometry in (_block_geometries(row, block) if row is not None else ()):
                if geometry not in CLIP_GEOMETRIES:
                    raise ConfigError(
                        f"QK-clip rescales query/key weights, which would move {row.name} off its "
                        f"{geometry} manifold; use it with unconstrained attention",
                        source=source, key="qk_clip", allowed=CLIP_GEOMETRIES)


def _block_geometries(row: ParamPlan, block: HeadBlock) -> tuple[str, ...]:
    """The geometries of the blocks of ``row`` that hold ``block``'s heads."""
    if row.split == 1 or block.dim != row.split_dim:
        return row.geometries
    size = row.param.size(row.split_dim) // row.split
    return row.geometries[block.start // size:(block.stop - 1) // size + 1]
