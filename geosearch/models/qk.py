"""Queries and keys of any supported model, captured with hooks, for the attention probes.

The instability probes (:func:`geosearch.proxy.probes.attention_stats`) need each
layer's queries and keys exactly as its attention sees them, and the scale it multiplies
``q·kᵀ`` by. :func:`qk_capture` gets them from one ordinary forward pass, without
touching the attention computation (SDPA or flash kernels stay in use), from one of
these *sources* (:data:`QK_SOURCES`):

``nanogpt``
    Modules with a ``record_qk`` switch that store ``last_q``/``last_k`` (B, nh, T, hs)
    when it is on: :class:`geosearch.models.model.CausalSelfAttention`, or any user
    module that follows the same protocol. Scale ``hs**-0.5``.
``gpt2``
    Hugging Face ``GPT2Attention``: a forward hook on the fused ``c_attn`` (a ``Conv1D``)
    keeps its output (B, T, 3C), which is cut into q, k, v and into heads the way the
    model does (``split(split_size, dim=2)``, ``view(B, T, nh, hs).transpose(1, 2)``).
    Scale: the module's own (``hs**-0.5`` when ``scale_attn_weights``, divided by
    ``layer_idx + 1`` when ``scale_attn_by_inverse_layer_idx``; 1 when neither).
``llama``
    Hugging Face ``LlamaAttention`` and the attention modules built the same way: rotary
    embeddings handed in as ``position_embeddings=(cos, sin)`` and applied by their modeling
    file's own ``apply_rotary_pos_emb`` (Mistral, Mixtral, Qwen2, Qwen3, Gemma, Gemma 3,
    Phi, Phi-3, GPT-NeoX, OLMo, OLMo 2, StableLM, Starcoder2, Granite, Cohere, SmolLM3, ...
    in ``transformers`` 5). Forward hooks keep the projections' outputs: ``q_proj`` and
    ``k_proj``; or the fused ``qkv_proj`` (Phi-3: ``[Q | K | V]``, K and V
    ``num_key_value_heads`` wide); or ``query_key_value`` (GPT-NeoX, Persimmon: per head
    ``[q | k | v]``). A forward pre-hook on the attention module keeps the
    ``position_embeddings`` the decoder passes it. The capture then redoes what the module
    does between its projections and its attention: ``clip_qkv`` clamping (OLMo), the q/k
    norms (``q_norm``/``k_norm`` on (B, T, nh, hd) heads, or on the whole width when that
    is their size (OLMo 2); ``q_layernorm``/``k_layernorm`` on (B, nh, T, hd)), rotary
    embeddings on the first ``rotary_ndims`` of each head when the module says so (Phi,
    StableLM) and on none when ``use_rope`` is off (SmolLM3's NoPE layers), then repeats the
    key heads for grouped-query attention with ``repeat_kv``. When the layer is not given
    ``position_embeddings`` (older ``transformers``), they are recomputed with the model's
    ``rotary_emb`` from the ``position_ids`` the layer got, else ``arange(T)``. Scale: the
    module's ``scaling``. Not captured (the probes then say so, see
    :mod:`geosearch.models.zoo`): soft-capped attention logits (Gemma 2), attention without
    ``position_embeddings`` (GPT-J, OPT, BLOOM, CodeGen: their positions are applied inside
    the module), cross-attention.

Example:
    >>> with qk_capture(model, "llama") as capture:
    ...     model(x)
    >>> [(layer.q.shape, layer.k.shape, layer.scale) for layer in capture.layers()]
"""

from __future__ import annotations

import inspect
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


_FUSED_QK = ("qkv_proj", "query_key_value")
"""Fused projections the ``llama`` source reads queries and keys from (see the docstring)."""


def _is_llama(m: nn.Module) -> bool:
    has_projections = (hasattr(m, "q_proj") and hasattr(m, "k_proj")) or any(hasattr(m, f) for f in _FUSED_QK)
    if not (type(m).__name__.endswith("Attention") and has_projections and _head_dim(m)):
        return False
    if getattr(m, "is_cross_attention", False) or getattr(m, "attn_logit_softcapping", None) is not None:
        return False  # another attention than scale * q @ kᵀ over the layer's own tokens
    try:
        takes_rotary = "position_embeddings" in inspect.signature(type(m).forward).parameters
    except (TypeError, ValueError):
        takes_rotary = False
    if hasattr(m, "query_key_value") and not hasattr(m, "q_proj"):
        heads = getattr(m, "num_heads", None) or getattr(getattr(m, "config", None), "num_attention_heads", 0)
        if m.query_key_value.weight.shape[0] != 3 * heads * _head_dim(m):
            return False  # Falcon's multi-query / grouped layouts: not per head [q | k | v]
    rotary = _rotary_function(m)
    try:  # LLaMA's (q, k, cos, sin), not GPT-J's apply_rotary_pos_emb(tensor, sin, cos)
        takes_pair = rotary is not None and list(inspect.signature(rotary).parameters)[:4] == ["q", "k", "cos", "sin"]
    except (TypeError, ValueError):
        takes_pair = False
    return (takes_rotary or hasattr(m, "rotary_emb")) and takes_pair


def _head_dim(m: nn.Module) -> int | None:
    return getattr(m, "head_dim", None) or getattr(m, "head_size", None)


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


# llama: projection outputs (B, T, nh*hd) and (B, T, nkv*hd), or a fused one, and (cos, sin)
def _install_llama(m: nn.Module, raw: dict[str, Any]) -> list:
    def pre_hook(_module: nn.Module, args: tuple, kwargs: dict) -> None:
        raw["position_embeddings"] = kwargs.get("position_embeddings")
        raw["position_ids"] = kwargs.get("position_ids")

    fused = next((f for f in _FUSED_QK if hasattr(m, f)), None)
    outputs = [(fused, "qkv")] if fused and not hasattr(m, "q_proj") else [("q_proj", "q"), ("k_proj", "k")]
    return [m.register_forward_pre_hook(pre_hook, with_kwargs=True),
            *(getattr(m, name).register_forward_hook(_keep(raw, key)) for name, key in outputs)]


def _rotary_function(m: nn.Module) -> Callable | None:
    """``apply_rotary_pos_emb`` of the module's own modeling file; LLaMA's for a module
    defined outside ``transformers`` (a user's LLaMA-style module); None when its
    ``transformers`` modeling file has none (its rotary embedding works otherwise)."""
    fn = getattr(sys.modules.get(type(m).__module__), "apply_rotary_pos_emb", None)
    if fn is None and not type(m).__module__.startswith("transformers."):
        return _llama_function(m, "apply_rotary_pos_emb")
    return fn


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


def _llama_projections(m: nn.Module, raw: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
    """Queries (B, T, nh*hd) and keys (B, T, nkv*hd) as the projections gave them."""
    if "qkv" not in raw:
        return raw["q"], raw["k"]
    qkv, hd = raw["qkv"], _head_dim(m)
    if hasattr(m, "query_key_value"):  # per head [q | k | v]
        B, T, _ = qkv.shape
        q, k, _ = qkv.view(B, T, -1, 3 * hd).chunk(3, dim=-1)  # (B, T, nh, hd) each
        return q.reshape(B, T, -1), k.reshape(B, T, -1)
    n_q = m.config.num_attention_heads * hd
    n_kv = getattr(m, "num_key_value_heads", None) or m.config.num_key_value_heads
    return qkv[..., :n_q], qkv[..., n_q:n_q + n_kv * hd]  # [Q | K | V]


def _finish_llama(m: nn.Module, raw: dict[str, Any], model: nn.Module) -> LayerQK | None:
    if not ("qkv" in raw or ("q" in raw and "k" in raw)):
        return None
    q, k = _llama_projections(m, raw)  # (B, T, nh*hd), (B, T, nkv*hd)
    clip = getattr(getattr(m, "config", None), "clip_qkv", None)
    if clip is not None:
        q, k = q.clamp(-clip, clip), k.clamp(-clip, clip)
    hd = _head_dim(m)
    B, T, _ = q.shape
    q_norm, k_norm = getattr(m, "q_norm", None), getattr(m, "k_norm", None)
    weight = getattr(q_norm, "weight", None)
    whole = weight is not None and weight.dim() == 1 and weight.numel() == q.size(-1) != hd
    if whole:  # one norm over the whole width (OLMo 2)
        q, k = q_norm(q), k_norm(k)
    q = q.view(B, T, -1, hd)  # (B, T, nh, hd)
    k = k.view(B, T, -1, hd)  # (B, T, nkv, hd)
    if q_norm is not None and not whole:  # per head (Qwen3, Gemma 3; Cohere's (nh, hd) weight)
        q, k = q_norm(q), k_norm(k)
    q, k = q.transpose(1, 2), k.transpose(1, 2)  # (B, nh, T, hd), (B, nkv, T, hd)
    if getattr(m, "q_layernorm", None) is not None:  # Phi, StableLM, Persimmon
        q, k = m.q_layernorm(q), m.k_layernorm(k)
    if getattr(m, "use_rope", True):
        cos_sin = raw.get("position_embeddings")
        if cos_sin is None:
            cos_sin = llama_rotary(model, m, q, raw.get("position_ids"))
        cos, sin = cos_sin  # (B or 1, T, rotary dims)
        rot = getattr(m, "rotary_ndims", None) or hd  # partial rotary (Phi, StableLM)
        q_rot, k_rot = _rotary_function(m)(q[..., :rot], k[..., :rot], cos, sin)
        q, k = torch.cat([q_rot, q[..., rot:]], dim=-1), torch.cat([k_rot, k[..., rot:]], dim=-1)
    n_rep = q.size(1) // k.size(1)
    k = _llama_function(m, "repeat_kv")(k, n_rep)  # (B, nh, T, hd)
    scale = getattr(m, "scaling", None)
    return LayerQK(q, k, float(hd ** -0.5 if scale is None else scale))


_INSTALL: dict[str, Callable[[nn.Module, dict], list]] = {
    "nanogpt": _install_recording, "gpt2": _install_gpt2, "llama": _install_llama}
_FINISH: dict[str, Callable[[nn.Module, dict, nn.Module], LayerQK | None]] = {
    "nanogpt": _finish_recording, "gpt2": _finish_gpt2, "llama": _finish_llama}

