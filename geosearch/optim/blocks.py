"""The ``(out, in)`` block view of a weight: the one place a layout and a split are read.

A hidden weight is stored ``(out, in)`` by ``nn.Linear`` and ``(in, out)`` by Hugging
Face's ``Conv1D``, and a fused weight (``c_attn``: Q, K, V) holds several equal blocks
along its output dimension. :func:`block_view` turns any of them into a view in the
``(out, in)`` orientation of ``nn.Linear``, one matrix per block, so the optimizer steps,
the probes measure, and the plan describes the same matrices.
"""

from __future__ import annotations

from torch import Tensor

__all__ = ["block_view"]


def block_view(t: Tensor, split: int = 1, split_dim: int = 0) -> Tensor:
    """A view of ``t`` in the ``(out, in)`` orientation: ``t`` itself (no split, ``(out, in)``
    layout), its transpose (``split_dim=1``), or ``(split, out/split, in)`` for its blocks.

    A ``split_dim=1`` weight (Hugging Face ``Conv1D``, stored ``(in, out)``) is seen
    transposed, so a manifold constrains the same Gram matrix whatever the layout: this
    matters for square matrices, which are not reoriented to tall (DGram's orthogonal
    columns are input directions for both). Writing into the view writes into ``t``.

    Args:
        t: a 2-D weight (or its gradient, or its momentum), or a 3-D stack of expert
            matrices ``(experts, ·, ·)``: every expert's matrix is seen the same way, the
            experts along the batch dimension after the blocks.
        split: the number of equal blocks along ``split_dim``.
        split_dim: the dimension holding the outputs: 0 for ``(out, in)``, 1 for ``(in, out)``.

    Example:
        >>> import torch
        >>> W = torch.arange(24.0).reshape(4, 6)          # Conv1D (in=4, out=6), 3 blocks
        >>> block_view(W, 3, 1).shape, torch.equal(block_view(W, 3, 1)[1], W[:, 2:4].mT)
        (torch.Size([3, 2, 4]), True)
    """
    if split > 1:  # (split, rows, cols), or (split, experts, rows, cols) for a stack of experts
        dim = t.dim() - 2 + split_dim
        t = t.unflatten(dim, (split, -1)).movedim(dim, 0)
    return t.mT if split_dim == 1 else t
