"""The proxy model: a small GPT-2 written the way nanoGPT writes it.

Every trial of a geometry search trains one of these for a few hundred steps. The
parameter names are nanoGPT's exactly (``transformer.wte``, ``transformer.wpe``,
``transformer.h.N.ln_1``, ``attn.c_attn``, ``attn.c_proj``, ``ln_2``, ``mlp.c_fc``,
``mlp.c_proj``, ``transformer.ln_f``, ``lm_head``), so the ``nanogpt`` rule set in
:mod:`geosearch.rules.modules` finds the hidden weights of this model and of a user's
nanoGPT alike.

Sizes come from a preset, overridable field by field::

    >>> config = make_config("tiny", n_layer=3)
    >>> model = GPT(config)
    >>> logits, loss = model(idx, targets)          # idx, targets: (B, T) int64

The attention runs through ``F.scaled_dot_product_attention(is_causal=True)``. The
instability probes need each layer's queries and keys; setting ``record_qk = True`` on a
:class:`CausalSelfAttention` (see :func:`geosearch.proxy.probes.recording_qk`) makes it
keep them as ``last_q``, ``last_k`` on the next forward; the attention itself and the
normal path are unchanged.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from geosearch.util.errors import ConfigError
from geosearch.models.specs import PRESETS, size_range  # the preset names live without torch


@dataclass
class GPTConfig:
    """Sizes of the proxy GPT.

    Attributes:
        vocab_size: number of token ids; 256 for the byte-level corpora, else read from
            the data (``meta.json``).
        block_size: context length T.
        n_layer: number of transformer blocks.
        n_head: attention heads per block; ``n_embd`` must be a multiple of it.
        n_embd: model width C.
        bias: biases in the Linear layers and LayerNorms (GPT-2 has them).
        tie_weights: share the token embedding with the LM head (GPT-2 does).
        dropout: dropout probability; 0 for short proxy runs (nothing to regularise).
    """

    vocab_size: int = 256
    block_size: int = 128
    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 128
    bias: bool = True
    tie_weights: bool = True
    dropout: float = 0.0

    def __post_init__(self) -> None:
        for name in ("vocab_size", "block_size", "n_layer", "n_head", "n_embd"):
            _, problem = size_range(name).check(getattr(self, name))
            if problem:
                raise ConfigError(problem, source="GPTConfig", key=name)
        if self.n_embd % self.n_head:
            raise ConfigError(f"n_embd={self.n_embd} is not a multiple of n_head={self.n_head}",
                              source="GPTConfig", key="n_embd")
        if not 0.0 <= self.dropout < 1.0:
            raise ConfigError(f"must be in [0, 1) but got {self.dropout!r}",
                              source="GPTConfig", key="dropout")


def make_config(preset: str = "small", **overrides: object) -> GPTConfig:
    """A :class:`GPTConfig` from a preset with some fields replaced.

    Args:
        preset: one of :data:`PRESETS` (``tiny``, ``small``, ``gpt2``).
        **overrides: any :class:`GPTConfig` field, e.g. ``vocab_size=50304``.

    Raises:
        ConfigError: unknown preset or field (the message lists the allowed ones), or a
            bad value.
    """
    if preset not in PRESETS:
        raise ConfigError(f"unknown preset {preset!r}", source="make_config", key="preset",
                          allowed=list(PRESETS))
    fields = [f.name for f in dataclasses.fields(GPTConfig)]
    for key in overrides:
        if key not in fields:
            raise ConfigError(f"unknown model field {key!r}", source="make_config", key=key,
                              allowed=fields)
    return GPTConfig(**{**PRESETS[preset], **overrides})


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention with the Q, K, V projections fused in ``c_attn``.

    Attributes:
        record_qk: when True, the next forward stores ``last_q`` and ``last_k``
            (B, nh, T, hs), detached, for the probes. False in training.
    """

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.n_head = config.n_head
        self.n_embd = config.n_embd
        self.dropout = config.dropout
        # q, k, v for all heads in one matmul; rows [0:C) are q, [C:2C) k, [2C:3C) v
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.resid_dropout = nn.Dropout(config.dropout)
        self.record_qk = False
        self.last_q: torch.Tensor | None = None
        self.last_k: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.size()  # batch, sequence length, width
        hs = C // self.n_head
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)  # 3 x (B, T, C)
        q = q.view(B, T, self.n_head, hs).transpose(1, 2)  # (B, nh, T, hs)
        k = k.view(B, T, self.n_head, hs).transpose(1, 2)  # (B, nh, T, hs)
        v = v.view(B, T, self.n_head, hs).transpose(1, 2)  # (B, nh, T, hs)
        if self.record_qk:  # probe forward only: the logits are q·kᵀ/√hs
            self.last_q, self.last_k = q.detach(), k.detach()
        y = F.scaled_dot_product_attention(
            q, k, v, dropout_p=self.dropout if self.training else 0.0, is_causal=True
        )  # (B, nh, T, hs)
        y = y.transpose(1, 2).contiguous().view(B, T, C)  # heads side by side again
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.gelu(self.c_fc(x))  # (B, T, 4C)
        return self.dropout(self.c_proj(x))  # (B, T, C)


class Block(nn.Module):
    """Pre-LN transformer block: x + attn(ln(x)), then x + mlp(ln(x))."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.mlp = MLP(config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        x = x + self.mlp(self.ln_2(x))
        return x


class GPT(nn.Module):
    """GPT-2: token + position embeddings, ``n_layer`` pre-LN blocks, final LayerNorm, LM head.

    Example:
        >>> model = GPT(make_config("tiny"))
        >>> idx, targets = torch.randint(256, (2, 4, 32))
        >>> logits, loss = model(idx, targets)   # logits (4, 32, 256), loss ≈ ln 256 at init
    """

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.config = config
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(config.vocab_size, config.n_embd),
            wpe=nn.Embedding(config.block_size, config.n_embd),
            drop=nn.Dropout(config.dropout),
            h=nn.ModuleList([Block(config) for _ in range(config.n_layer)]),
            ln_f=nn.LayerNorm(config.n_embd, bias=config.bias),
        ))
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        if config.tie_weights:
            # one tensor; named_parameters() lists it once, as transformer.wte.weight
            self.transformer.wte.weight = self.lm_head.weight

        # GPT-2 init: N(0, 0.02) everywhere, and the projections that write into the
        # residual stream scaled by 1/√(2·n_layer) so its variance does not grow with depth.
        self.apply(self._init_weights)
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))

    def _init_weights(self, module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def num_params(self, non_embedding: bool = True) -> int:
        """Number of parameters; without the position embedding by default (as nanoGPT)."""
        n = sum(p.numel() for p in self.parameters())
        if non_embedding:
            n -= self.transformer.wpe.weight.numel()
        return n

    def forward(
        self, idx: torch.Tensor, targets: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Logits for every position, and the mean cross-entropy when targets are given.

        Args:
            idx: token ids (B, T), T ≤ block_size.
            targets: next-token ids (B, T); -1 marks positions to ignore.

        Returns:
            ``(logits, loss)``: logits (B, T, vocab_size), loss a scalar or None.
        """
        B, T = idx.size()
        if T > self.config.block_size:
            raise ValueError(f"sequence length {T} exceeds block_size {self.config.block_size}")
        pos = torch.arange(T, dtype=torch.long, device=idx.device)  # (T,)
        tok_emb = self.transformer.wte(idx)  # (B, T, C)
        pos_emb = self.transformer.wpe(pos)  # (T, C)
        x = self.transformer.drop(tok_emb + pos_emb)  # (B, T, C)
        for block in self.transformer.h:
            x = block(x)
        x = self.transformer.ln_f(x)
        logits = self.lm_head(x)  # (B, T, vocab_size)
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1),
                                   ignore_index=-1)
        return logits, loss
