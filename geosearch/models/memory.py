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

Time is told the same way (:func:`time_note`): a training step's FLOPs from the parameter
count and the context (:func:`step_flops`), at the rate a few matrix products reach on the
device (:func:`matmul_rate`). That is a lower bound (no eval, probes or overheads), so it is
said only when one run would take an hour or more, as a note: the user may mean it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import torch
import torch.nn as nn

from geosearch.util.errors import ConfigError

__all__ = ["BYTES_PER_PARAMETER", "LONG_RUN_S", "check_fits", "device_memory", "matmul_rate",
           "parameter_count", "probe_logit_bytes", "step_flops", "time_note"]

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


LONG_RUN_S = 3600.0
"""A run estimated to take at least this long (seconds) gets :func:`time_note`'s line."""


def step_flops(params: int, config: Mapping[str, Any], block_size: int, batch: int) -> float:
    """The FLOPs of one training step (forward and backward) on ``batch`` sequences of
    ``block_size`` tokens: 6 per parameter and token, plus the attention's logits and mixing,
    12 x layers x width x ``block_size`` per token (the usual count: Kaplan et al. 2020).
    Layers and width come from the model's config (``n_layer``/``num_hidden_layers``,
    ``n_embd``/``hidden_size``; 0 where it names none).

    Example:
        >>> step_flops(1000, {"n_layer": 2, "n_embd": 8}, block_size=16, batch=4)
        580608
    """
    def field(*keys: str) -> int:
        return next((v for k in keys if isinstance(v := config.get(k), int) and v > 0), 0)

    layers, width = field("n_layer", "num_hidden_layers"), field("n_embd", "hidden_size")
    return batch * block_size * (6 * params + 12 * layers * width * block_size)


def matmul_rate(device: str | torch.device, size: int = 256, seconds: float = 0.05) -> float:
    """The FLOP/s of fp32 ``size`` x ``size`` matrix products on ``device``, timed for about
    ``seconds`` (an upper end for a training step's rate there)."""
    import time

    device = torch.device(device)
    a = torch.randn(size, size, device=device)
    b = torch.randn(size, size, device=device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    a @ b  # noqa: B018 - warm-up
    sync()
    count, start = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - start) < seconds or count < 3:
        a @ b  # noqa: B018
        sync()
        count += 1
    return 2 * size**3 * count / elapsed


def _duration(seconds: float) -> str:
    for unit, length in (("days", 86400), ("h", 3600), ("min", 60)):
        if seconds >= length:
            return f"{seconds / length:,.1f} {unit}"
    return f"{seconds:.0f} s"


def time_note(spec: str, flops: float, steps: int, rate: float, runs: int | None = None,
              long: float = LONG_RUN_S) -> str | None:
    """One line when a run of ``steps`` steps of ``flops`` each, at ``rate`` FLOP/s, would
    take at least ``long`` seconds (with ``runs``: what that many runs take), else ``None``.

    Example:
        >>> time_note("small", 1e12, 1000, 1e9, runs=8)[:49]
        "note: one run of 'small' takes at least 11.6 days"
    """
    seconds = flops * steps / rate
    if seconds < long:
        return None
    more = f", {runs} runs {_duration(seconds * runs)}" if runs else ""
    return (f"note: one run of {spec!r} takes at least {_duration(seconds)} here ({flops:.0e} "
            f"FLOPs a step x {steps:,} steps at the {rate:.0e} FLOP/s a matrix product reaches)"
            f"{more}; Ctrl-C stops it")
