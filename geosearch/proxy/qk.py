"""Queries and keys of any supported model, captured with hooks, for the attention probes.

The instability probes (:func:`geosearch.proxy.probes.attention_stats`) need each
layer's queries and keys exactly as its attention sees them, and the scale it multiplies
``q·kᵀ`` by. :func:`qk_capture` gets them from one ordinary forward pass, without
touching the attention computation (SDPA or flash kernels stay in use), from one of
these *sources* (:data:`QK_SOURCES`):

``nanogpt``
    Modules with a ``record_qk`` switch that store ``last_q``/``last_k`` (B, nh, T, hs)
    when it is on: :class:`geosearch.proxy.model.CausalSelfAttention`, or any user
    module that follows the same protocol. Scale ``hs**-0.5``.
``gpt2``
    Hugging Face ``GPT2Attention``: a forward hook on the fused ``c_attn`` (a ``Conv1D``)
    keeps its output (B, T, 3C), which is cut into q, k, v and into heads the way the
    model does (``split(split_size, dim=2)``, ``view(B, T, nh, hs).transpose(1, 2)``).
    Scale: the module's own (``hs**-0.5`` when ``scale_attn_weights``, divided by
    ``layer_idx + 1`` when ``scale_attn_by_inverse_layer_idx``; 1 when neither).
``llama``
    Hugging Face ``LlamaAttention`` and attention modules built the same way (Mistral,
    Qwen2: ``q_proj``, ``k_proj``, ``head_dim``, rotary embeddings, no q/k norm). Forward
    hooks keep the outputs of ``q_proj`` and ``k_proj``; a forward pre-hook on the
    attention module keeps the ``position_embeddings=(cos, sin)`` the decoder passes it
    (computed by the model's own ``rotary_emb`` from the position ids). The capture then
    applies rotary embeddings exactly where the model does, with the model's own
    ``apply_rotary_pos_emb`` on (B, nh, T, hd) heads, and repeats the key heads for
    grouped-query attention with its ``repeat_kv``. When the layer is not given
    ``position_embeddings`` (older ``transformers``), they are recomputed with the model's
    ``rotary_emb`` from the ``position_ids`` the layer got, else ``arange(T)``. Scale: the
    module's ``scaling`` (``head_dim**-0.5``).

Example:
    >>> with qk_capture(model, "llama") as capture:
    ...     model(x)
    >>> [(layer.q.shape, layer.k.shape, layer.scale) for layer in capture.layers()]
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, NamedTuple

import torch
from torch import nn

QK_SOURCES = ("nanogpt", "gpt2", "llama")
"""How queries and keys can be captured; see the module docstring."""


class LayerQK(NamedTuple):
    """One attention layer's queries and keys as its softmax sees them.

    Attributes:
        q: queries (B, nh, T, hs), position embeddings applied.
        k: keys (B, nh, T, hs); with grouped-query attention, each key head repeated for
            the query heads that share it.
        scale: the attention logits are ``scale * q @ kᵀ``.
    """

    q: torch.Tensor
    k: torch.Tensor
    scale: float


# --------------------------------------------------------------------------- detection
def _is_recording(m: nn.Module) -> bool:
    return hasattr(m, "record_qk") and hasattr(m, "last_q") and hasattr(m, "last_k")


def _is_gpt2(m: nn.Module) -> bool:
    return (type(m).__name__ == "GPT2Attention" and hasattr(m, "c_attn")
            and not getattr(m, "is_cross_attention", False))


def _is_llama(m: nn.Module) -> bool:
    return (type(m).__name__.endswith("Attention") and hasattr(m, "q_proj") and hasattr(m, "k_proj")
            and hasattr(m, "head_dim") and not hasattr(m, "q_norm") and not hasattr(m, "k_norm"))


_DETECT: dict[str, Callable[[nn.Module], bool]] = {
    "nanogpt": _is_recording, "gpt2": _is_gpt2, "llama": _is_llama}


def attention_layers(model: nn.Module, source: str) -> list[nn.Module]:
    """The attention modules of ``model`` that ``source`` can capture, in module order.

    Raises:
        ValueError: unknown source.
    """
    if source not in _DETECT:
        raise ValueError(f"unknown qk source {source!r}; expected one of: {', '.join(QK_SOURCES)}")
    return [m for m in model.modules() if _DETECT[source](m)]


def detect_qk_source(model: nn.Module) -> str | None:
    """The first source of :data:`QK_SOURCES` that finds attention layers in ``model``,
    or None when none does (the attention probes are then unavailable)."""
    for source in QK_SOURCES:
        if attention_layers(model, source):
            return source
    return None


# --------------------------------------------------------------------------- capture
class QKCapture:
    """What :func:`qk_capture` yields; read :meth:`layers` after a forward pass."""

    def __init__(self, model: nn.Module, source: str, layers: list[nn.Module]) -> None:
        self.model, self.source, self.modules = model, source, layers
        self.raw: list[dict[str, Any]] = [{} for _ in layers]  # per layer: captured tensors

    def layers(self) -> list[LayerQK]:
        """Per-layer :class:`LayerQK` of the last forward pass, in layer order.

        Raises:
            RuntimeError: no forward pass ran inside the ``with`` block.
        """
        out = [_FINISH[self.source](m, raw, self.model) for m, raw in zip(self.modules, self.raw)]
        if any(layer is None for layer in out):
            raise RuntimeError("no queries/keys captured: run a forward pass inside qk_capture()")
        return out


@contextmanager
def qk_capture(model: nn.Module, source: str | None = None,
               on_layer: Callable[[int, LayerQK], None] | None = None) -> Iterator[QKCapture]:
    """Capture every attention layer's queries and keys during forward passes in the block.

    Hooks (or the ``record_qk`` switch) are installed on entry and removed on exit; the
    captured tensors are detached and dropped on exit. The last forward pass wins.

    Args:
        model: the unwrapped model (not a DDP wrapper: hooks see the same modules either
            way, but pass the one whose attention layers you mean).
        source: one of :data:`QK_SOURCES`; None = :func:`detect_qk_source`.
        on_layer: streaming mode: called as ``on_layer(i, layer_qk)`` as soon as attention
            layer ``i`` has run, after which its tensors are dropped, so a training forward
            keeps nothing beyond what ``on_layer`` keeps (e.g. a per-head max); ``layers()``
            then has nothing to return.

    Yields:
        A :class:`QKCapture`; ``capture.layers()`` after a forward.

    Raises:
        ValueError: unknown source, or the model has no attention layer of that source.
    """
    if source is None:
        source = detect_qk_source(model)
        if source is None:
            raise ValueError(f"{type(model).__name__} has no attention layer that geosearch can probe "
                             f"(known kinds: {', '.join(QK_SOURCES)})")
    layers = attention_layers(model, source)
    if not layers:
        raise ValueError(f"{type(model).__name__} has no {source!r} attention layer to probe")
    capture = QKCapture(model, source, layers)
    handles: list[Any] = []
    try:
        for i, (module, raw) in enumerate(zip(layers, capture.raw)):
            handles += _INSTALL[source](module, raw)
            if on_layer is not None:
                handles.append(module.register_forward_hook(_stream(i, raw, source, model, on_layer)))
        yield capture
    finally:
        for h in handles:
            h.remove()
        if source == "nanogpt":
            for m in layers:
                m.record_qk, m.last_q, m.last_k = False, None, None
        for raw in capture.raw:
            raw.clear()


def _keep(raw: dict[str, Any], key: str) -> Callable:
    def hook(_module: nn.Module, _inputs: Any, output: torch.Tensor) -> None:
        raw[key] = output.detach()
    return hook


def _stream(i: int, raw: dict[str, Any], source: str, model: nn.Module,
            on_layer: Callable[[int, LayerQK], None]) -> Callable:
    """The attention module's forward hook of streaming mode: hand over, then drop."""
    def hook(m: nn.Module, _inputs: Any, _output: Any) -> None:
        layer = _FINISH[source](m, raw, model)
        raw.clear()
        if source == "nanogpt":
            m.last_q, m.last_k = None, None
        if layer is not None:
            on_layer(i, layer)
    return hook


# nanogpt: the module records them itself
def _install_recording(m: nn.Module, raw: dict[str, Any]) -> list:
    m.record_qk = True
    return []


def _finish_recording(m: nn.Module, raw: dict[str, Any], model: nn.Module) -> LayerQK | None:
    if m.last_q is None:
        return None
    return LayerQK(m.last_q, m.last_k, m.last_q.size(-1) ** -0.5)


# gpt2: the fused c_attn output (B, T, 3C)
def _install_gpt2(m: nn.Module, raw: dict[str, Any]) -> list:
    return [m.c_attn.register_forward_hook(_keep(raw, "qkv"))]


def _gpt2_scale(m: nn.Module) -> float:
    scale = getattr(m, "scaling", None)  # transformers >= 4.48 precomputes it
    if scale is None:
        scale = m.head_dim ** -0.5 if m.scale_attn_weights else 1.0
        if m.scale_attn_by_inverse_layer_idx:
            scale /= float(m.layer_idx + 1)
    return float(scale)


def _finish_gpt2(m: nn.Module, raw: dict[str, Any], model: nn.Module) -> LayerQK | None:
    if "qkv" not in raw:
        return None
    q, k, _ = raw["qkv"].split(m.split_size, dim=2)  # 3 x (B, T, C)
    B, T, _ = q.shape
    q = q.view(B, T, -1, m.head_dim).transpose(1, 2)  # (B, nh, T, hs)
    k = k.view(B, T, -1, m.head_dim).transpose(1, 2)  # (B, nh, T, hs)
    return LayerQK(q, k, _gpt2_scale(m))


# llama: q_proj/k_proj outputs (B, T, nh*hd), (B, T, nkv*hd) and the layer's (cos, sin)
def _install_llama(m: nn.Module, raw: dict[str, Any]) -> list:
    def pre_hook(_module: nn.Module, args: tuple, kwargs: dict) -> None:
        raw["position_embeddings"] = kwargs.get("position_embeddings")
        raw["position_ids"] = kwargs.get("position_ids")

    return [m.register_forward_pre_hook(pre_hook, with_kwargs=True),
            m.q_proj.register_forward_hook(_keep(raw, "q")),
            m.k_proj.register_forward_hook(_keep(raw, "k"))]


def _llama_function(m: nn.Module, name: str) -> Callable:
    """``apply_rotary_pos_emb`` / ``repeat_kv`` of the module's own modeling file."""
    fn = getattr(sys.modules.get(type(m).__module__), name, None)
    if fn is None:
        from transformers.models.llama import modeling_llama

        fn = getattr(modeling_llama, name)
    return fn


def llama_rotary(model: nn.Module, m: nn.Module, x: torch.Tensor,
                 position_ids: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin from the model's own ``rotary_emb`` for attention module ``m``.

    Used when the layer was not handed ``position_embeddings``: the module's own
    ``rotary_emb`` (transformers < 4.45), else the model's first module named
    ``rotary_emb``. ``position_ids`` default to ``arange(T)``.
    """
    rotary = getattr(m, "rotary_emb", None)
    if rotary is None:
        rotary = next((mod for name, mod in model.named_modules() if name.endswith("rotary_emb")), None)
    if rotary is None:
        raise RuntimeError(f"{type(m).__name__}: no position_embeddings passed and no rotary_emb module found")
    if position_ids is None:
        position_ids = torch.arange(x.size(-2), device=x.device).unsqueeze(0)  # (1, T)
    return rotary(x, position_ids)


def _finish_llama(m: nn.Module, raw: dict[str, Any], model: nn.Module) -> LayerQK | None:
    if "q" not in raw or "k" not in raw:
        return None
    B, T, _ = raw["q"].shape
    q = raw["q"].view(B, T, -1, m.head_dim).transpose(1, 2)  # (B, nh, T, hd)
    k = raw["k"].view(B, T, -1, m.head_dim).transpose(1, 2)  # (B, nkv, T, hd)
    cos_sin = raw.get("position_embeddings")
    if cos_sin is None:
        cos_sin = llama_rotary(model, m, q, raw.get("position_ids"))
    cos, sin = cos_sin  # (B or 1, T, hd)
    q, k = _llama_function(m, "apply_rotary_pos_emb")(q, k, cos, sin)
    n_rep = q.size(1) // k.size(1)
    k = _llama_function(m, "repeat_kv")(k, n_rep)  # (B, nh, T, hd)
    scale = getattr(m, "scaling", None)
    return LayerQK(q, k, float(m.head_dim ** -0.5 if scale is None else scale))


_INSTALL: dict[str, Callable[[nn.Module, dict], list]] = {
    "nanogpt": _install_recording, "gpt2": _install_gpt2, "llama": _install_llama}
_FINISH: dict[str, Callable[[nn.Module, dict, nn.Module], LayerQK | None]] = {
    "nanogpt": _finish_recording, "gpt2": _finish_gpt2, "llama": _finish_llama}

