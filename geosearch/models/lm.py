"""The causal-LM forward and loss of any model the zoo builds: the proxy GPT, Hugging Face
models and a user's own module, through a DDP or compile wrapper too."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["lm_logits", "lm_loss", "output_logits"]


def lm_logits(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """Next-token logits of any zoo model (or a DDP/Accelerate wrapper of one).

    Calls ``model(x)`` and takes the logits from what it returns: a tensor, an object
    with ``.logits`` (Hugging Face), or a tuple whose first item is the logits (the proxy
    GPT returns ``(logits, None)``).

    Args:
        model: the model.
        x: token ids (B, T).

    Returns:
        (B, T, V).

    Raises:
        TypeError: the output holds no (B, T, V) logits.
    """
    return output_logits(model(x), model, x)


def output_logits(out: object, model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The logits in what ``model(x)`` returned (:func:`lm_logits`).

    Raises:
        TypeError: ``out`` holds no (B, T, V) logits.
    """
    logits = getattr(out, "logits", None)
    if logits is None:
        logits = out[0] if isinstance(out, (tuple, list)) and out else out
    if not isinstance(logits, torch.Tensor) or logits.dim() != 3 or logits.shape[:2] != x.shape:
        shape = tuple(logits.shape) if isinstance(logits, torch.Tensor) else type(logits).__name__
        raise TypeError(f"{type(model).__name__}.forward(idx) must return logits of shape (B, T, V) = "
                        f"({x.size(0)}, {x.size(1)}, V), or an object with .logits; got {shape}")
    return logits


def lm_loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy of any zoo model on inputs ``x`` and targets ``y``.

    ``y`` is already the shifted sequence (as :func:`geosearch.proxy.data.get_batch`
    returns it); Hugging Face's ``labels=`` path, which shifts again, is not used.
    Targets of -1 are ignored.

    Args:
        model: the model (or a DDP/Accelerate wrapper of it).
        x, y: token ids (B, T).

    Returns:
        A scalar tensor.
    """
    logits = lm_logits(model, x)  # (B, T, V)
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1), ignore_index=-1)
