"""A user's own model for the ``py:`` model spec tests (``py:_user_model:make_model``).

Names that no registered rule set knows (``blocks.N.mix.qkv``, ``blocks.N.ff.up``...),
attention that follows the proxy's ``record_qk`` protocol, and a forward that returns
the logits tensor, as the ``py:`` contract in :mod:`geosearch.models.zoo` describes.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from geosearch.rules.modules import ModuleRule

RULES = [
    ModuleRule("attn_qkv", r"\.mix\.qkv\.weight$", "attn"),
    ModuleRule("attn_out", r"\.mix\.out\.weight$", "attn"),
    ModuleRule("mlp_in", r"\.ff\.up\.weight$", "mlp"),
    ModuleRule("mlp_out", r"\.ff\.down\.weight$", "mlp"),
]
"""Rules for this model, as a user would write them in a search space or assignment."""


class Mixer(nn.Module):
    """Causal self-attention; stores ``last_q``/``last_k`` (B, nh, T, hs) when ``record_qk``."""

    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(width, 3 * width, bias=False)
        self.out = nn.Linear(width, width, bias=False)
        self.record_qk, self.last_q, self.last_k = False, None, None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = (t.view(B, T, self.heads, -1).transpose(1, 2) for t in self.qkv(x).split(C, dim=2))
        if self.record_qk:
            self.last_q, self.last_k = q.detach(), k.detach()
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B, nh, T, hs)
        return self.out(y.transpose(1, 2).reshape(B, T, C))


class FeedForward(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.up = nn.Linear(width, 2 * width)
        self.down = nn.Linear(2 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.relu(self.up(x)))


class Block(nn.Module):
    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.mix, self.ff = Mixer(width, heads), FeedForward(width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.mix(self.norm1(x))
        return x + self.ff(self.norm2(x))


class TinyLM(nn.Module):
    def __init__(self, vocab_size: int, block_size: int, width: int, depth: int, heads: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab_size, width)
        self.pos = nn.Embedding(block_size, width)
        self.blocks = nn.ModuleList(Block(width, heads) for _ in range(depth))
        self.norm = nn.LayerNorm(width)
        self.unembed = nn.Linear(width, vocab_size, bias=False)
        for p in self.parameters():
            if p.dim() == 2:
                nn.init.normal_(p, std=0.02)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.embed(idx) + self.pos(torch.arange(idx.size(1), device=idx.device))
        for block in self.blocks:
            x = block(x)
        return self.unembed(self.norm(x))  # (B, T, V)


def make_model(vocab_size: int, block_size: int, width: int = 32, depth: int = 2, heads: int = 2) -> TinyLM:
    """The factory ``py:_user_model:make_model`` calls."""
    return TinyLM(vocab_size, block_size, width, depth, heads)


def not_a_model(vocab_size: int, block_size: int) -> str:
    """A factory that breaks the contract (returns no nn.Module)."""
    return "model"


class CheckedLM(TinyLM):
    """A TinyLM whose forward looks at its token ids (``.item()``): it cannot run on the
    meta device, whose tensors hold no values."""

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        if idx.max().item() >= self.embed.num_embeddings:
            raise ValueError(f"token id {idx.max().item()} out of range")
        return super().forward(idx)


def ignores_vocab(vocab_size: int, block_size: int, width: int = 32, depth: int = 2, heads: int = 2) -> TinyLM:
    """A factory that breaks the contract: its logits are 100 wide, whatever ``vocab_size`` is."""
    return TinyLM(100, block_size, width, depth, heads)


def checked_ignores_vocab(vocab_size: int, block_size: int, width: int = 32, depth: int = 2,
                          heads: int = 2) -> CheckedLM:
    """:func:`ignores_vocab`, with a forward that cannot run on the meta device."""
    return CheckedLM(100, block_size, width, depth, heads)


def checked(vocab_size: int, block_size: int, width: int = 32, depth: int = 2, heads: int = 2) -> CheckedLM:
    """A model that keeps the contract, with a forward that cannot run on the meta device."""
    return CheckedLM(vocab_size, block_size, width, depth, heads)
