"""Fused query/key/value projections: how an attention module lays them out, by its head counts.

A fused projection (GPT-2's ``c_attn``, ``qkv_proj``, GPT-NeoX's ``query_key_value``) may
hold ``[Q | K | V]`` as whole blocks, or q, k and v interleaved head by head, and under
grouped-query attention K and V are narrower than Q. :func:`fused_qkv_layout` reads that off
the attention module, and :func:`qkv_split_problem` says why an equal three-way cut would be
wrong. Torch-free (modules are only read).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:  # pragma: no cover
    from torch import nn

class FusedQKV(NamedTuple):
    """How an attention module lays out a fused query/key/value projection, by its head counts.

    Attributes:
        heads: query heads.
        kv_heads: key/value heads (fewer under grouped-query attention, 1 under multi-query).
        head_dim: outputs per head.
        per_head: the outputs are ``[q | k | v]`` head by head (GPT-NeoX's, Falcon's and
            BLOOM's ``query_key_value``, GPT-BigCode's ``c_attn`` without multi-query), not
            the blocks ``[Q | K | V]``.
    """

    heads: int
    kv_heads: int
    head_dim: int
    per_head: bool = False

    @property
    def q_rows(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_rows(self) -> int:
        return self.kv_heads * self.head_dim


_HEADS = ("num_heads", "num_attention_heads", "n_head", "n_heads")
_KV_HEADS = ("num_key_value_heads", "num_kv_heads", "kv_heads", "n_kv_heads", "n_kv_head")
_HEAD_DIM = ("head_dim", "head_size")
_WIDTH = ("embed_dim", "hidden_size", "n_embd")
_PER_HEAD_FUSED = frozenset({"query_key_value"})
"""Fused projections stored head by head wherever they appear (see :class:`FusedQKV`)."""


def fused_qkv_layout(attention: nn.Module | None, leaf: str) -> FusedQKV | None:
    """The Q/K/V layout of the fused projection ``attention.<leaf>``, read off the attention
    module's head counts (its attributes, else its ``config``'s: ``num_attention_heads``,
    ``num_key_value_heads`` or ``multi_query``, ``head_dim`` or width / heads); None when
    they cannot be found (a module of one's own without them)."""
    sources = (attention, getattr(attention, "config", None))
    heads = _first_size(sources, _HEADS)
    if attention is None or heads is None:
        return None
    head_dim = _first_size(sources, _HEAD_DIM)
    if head_dim is None:
        width = _first_size(sources, _WIDTH)
        if width is None or width % heads:
            return None
        head_dim = width // heads
    flags = [getattr(s, "multi_query", None) for s in sources]
    multi_query = next((f for f in flags if isinstance(f, bool)), None)
    kv_heads = _first_size(sources, _KV_HEADS) or (1 if multi_query else heads)
    per_head = leaf in _PER_HEAD_FUSED or (multi_query is False and hasattr(attention, "multi_query"))
    return FusedQKV(heads, kv_heads, head_dim, per_head)


def _first_size(sources: tuple[Any, ...], names: tuple[str, ...]) -> int | None:
    for source in sources:
        for name in names:
            value = getattr(source, name, None) if source is not None else None
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return value
    return None


def qkv_split_problem(attention: nn.Module | None, leaf: str, out: int) -> str | None:
    """Why cutting the fused projection ``attention.<leaf>`` (``out`` outputs) into equal Q, K
    and V blocks would be wrong, or None when it is right or the layout is unknown."""
    layout = fused_qkv_layout(attention, leaf)
    if layout is None:
        return None
    heads = f"{layout.heads} heads × {layout.head_dim}"
    if layout.per_head:
        return f"it holds q, k and v interleaved head by head ({heads}), not as [Q | K | V] blocks"
    total = layout.q_rows + 2 * layout.kv_rows
    kv = f"{layout.kv_heads} key/value head{'s' if layout.kv_heads != 1 else ''}"
    if total != out:
        return f"its attention's head counts ({heads}, {kv}) give Q + K + V = {total} rows, not {out}"
    if layout.q_rows != layout.kv_rows:
        return (f"it holds Q in {layout.q_rows} rows ({heads}) and K, V in {layout.kv_rows} each ({kv}), "
                "so an equal cut would give part of Q the geometry of K")
    return None
