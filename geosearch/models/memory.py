"""Whether a model can train on a device, told from its parameter count before it is built.

A model built on the meta device (:func:`geosearch.models.zoo.build_meta_model`) has its
parameters' shapes and no memory. Training it needs at least
:data:`BYTES_PER_PARAMETER` bytes per parameter on the device (fp32 weights, their gradients
and AdamW's two moments; manifold Muon keeps one momentum buffer, so this is its upper
end) before a single activation is stored. A model whose parameters alone need more than
the device's whole memory cannot train there: :func:`check_fits` says so in one line
instead of an allocator's traceback minutes later (or a machine swapping to a halt).
The attention probes hold one layer's logits at a time, rows x heads x T x T fp32 values
(:func:`probe_logit_bytes`): with ``block_size: 100000`` that is 80 GB for one probe row
of ``tiny``, so the context length counts as well.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import torch
import torch.nn as nn

from geosearch.util.errors import ConfigError

__all__ = ["BYTES_PER_PARAMETER", "check_fits", "device_memory", "parameter_count",
           "probe_logit_bytes"]

BYTES_PER_PARAMETER = 16
"""fp32 weight (4), gradient (4) and two optimizer moments (8): the least a training step
holds per parameter; mixed precision keeps the fp32 weights too."""


def parameter_count(model: nn.Module) -> int:
    """The model's parameters, each shared tensor once (tied embeddings)."""
    seen = {id(p): p.numel() for p in model.parameters()}
    return sum(seen.values())


def probe_logit_bytes(config: Mapping[str, Any], block_size: int, rows: int) -> int:
    """The bytes of one layer's attention logits on the probe batch: ``rows`` x heads x
    ``block_size``² fp32 values (heads from the model's config, 1 when it names none)."""
    heads = next((v for k in ("n_head", "num_attention_heads")
                  if isinstance(v := config.get(k), int) and v > 0), 1)
    return 4 * rows * heads * block_size**2


def device_memory(device: str | torch.device) -> int | None:
    """The whole memory of ``device`` in bytes: the machine's physical memory for the CPU,
    the card's for CUDA; ``None`` where it cannot be read (MPS, other backends)."""
    device = torch.device(device)
    if device.type == "cpu":
        try:
            return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        except (AttributeError, ValueError, OSError):  # not POSIX
            return None
    if device.type == "cuda" and torch.cuda.is_available():
        index = device.index if device.index is not None else torch.cuda.current_device()
        return int(torch.cuda.get_device_properties(index).total_memory)
    return None


def _bytes(n: float) -> str:
    for unit in ("bytes", "KB", "MB", "GB", "TB", "PB"):
        if n < 1000 or unit == "PB":
            return f"{n:,.0f} {unit}" if unit == "bytes" else f"{n:,.1f} {unit}"
        n /= 1000
    raise AssertionError("unreachable")


def check_fits(model: nn.Module, spec: str, device: str | torch.device, *, source: str | None,
               key: str | None, probe_bytes: int = 0) -> None:
    """Refuse a model whose parameters alone, or with its probes' attention logits
    (``probe_bytes``, :func:`probe_logit_bytes`), need more than ``device``'s memory.

    Args:
        model: the model, best built on the meta device (nothing is allocated).
        spec: its model spec, for the message.
        device: where it would train (``cpu``, ``cuda``, ``cuda:1``, ...).
        source, key: what the error names (the space file and ``proxy.model_args``, a flag).
        probe_bytes: what the attention probes hold besides (0: not counted).

    Raises:
        ConfigError: it cannot fit; the message gives the count, the bytes and the memory.
    """
    count = parameter_count(model)
    memory = device_memory(device)
    need = count * BYTES_PER_PARAMETER
    if memory is None or need + probe_bytes <= memory:
        return
    where = "this machine's memory" if torch.device(device).type == "cpu" else f"{device}'s memory"
    if need <= memory:  # the context: T x T logits per head
        raise ConfigError(f"model {spec!r}: its attention probes hold {_bytes(probe_bytes)} of "
                          "logits (probe rows x heads x block_size², 4 bytes each) besides "
                          f"{_bytes(need)} "
                          f"for its parameters, and {where} is {_bytes(memory)}; make block_size "
                          "or probe_batch_size smaller", source=source, key=key)
    raise ConfigError(f"model {spec!r} has {count:,} parameters: training them needs at least "
                      f"{_bytes(need)} ({BYTES_PER_PARAMETER} bytes each: weights, gradients, "
                      f"optimizer state) and {where} is {_bytes(memory)}; make it smaller",
                      source=source, key=key)
