"""The ``gpt2`` and ``llama`` query/key sources of :mod:`geosearch.models.qk`: forward hooks.

For a ``transformers`` without ``AttentionInterface`` and for LLaMA-style modules of one's
own (a ``py:`` model). ``gpt2``: Hugging Face ``GPT2Attention``, its fused ``c_attn`` output
cut by its ``split_size`` and head size. ``llama``: modules with ``q_proj``/``k_proj`` whose
modeling file's ``apply_rotary_pos_emb(q, k, cos, sin)`` rotates all of each head
(:func:`_llama_refusal` says when it cannot follow one). :class:`LayerQK` is what every
source hands over.
"""

from __future__ import annotations

import inspect
import sys
from collections.abc import Callable
from typing import Any, NamedTuple, Protocol

import torch
from torch import nn


class _Capture(Protocol):
    """What the hooks read of a :class:`~geosearch.models.qk.QKCapture` (which imports
    this module, so it is named here by what it holds)."""

    source: str
    modules: list[nn.Module]
    raw: list[Any]
    model: nn.Module

    def take(self, i: int, layer: LayerQK) -> None: ...

class LayerQK(NamedTuple):
    """One attention layer's queries and keys as its kernel gets them.

    Attributes:
        q: queries (B, nh, T, hs), position embeddings applied.
        k: keys (B, nh, T, hs); with grouped-query attention, each key head repeated for
            the query heads that share it.
        scale: the raw attention logits are ``scale * q @ kᵀ``.
        softcap: when set, the kernel caps the logits to ``softcap * tanh(z / softcap)``
            before its softmax (Gemma 2); None = no cap.
        allowed: where the kernel's attention mask lets a query see a key, (B or 1, nh or
            1, T, T) booleans (a sliding window, say); None = the plain causal mask.
        bias: an additive (float) mask the kernel adds to the (capped) logits, (B or 1, nh
            or 1, T, T): 0 where a plain mask allows, a position bias where the family puts
            one there (Falcon's ALiBi from ``transformers`` 5.25); None = a boolean mask or none.
    """

    q: torch.Tensor
    k: torch.Tensor
    scale: float
    softcap: float | None = None
    allowed: torch.Tensor | None = None
    bias: torch.Tensor | None = None


def _is_gpt2(m: nn.Module) -> bool:
    return (type(m).__name__ == "GPT2Attention" and hasattr(m, "c_attn")
            and not getattr(m, "is_cross_attention", False))


def _is_llama(m: nn.Module) -> bool:
    return type(m).__name__.endswith("Attention") and _llama_refusal(m) is None


_MORE_THAN_ROTARY = {
    "q_norm": "q/k norms", "k_norm": "q/k norms", "q_layernorm": "q/k norms", "k_layernorm": "q/k norms",
    "rotary_ndims": "rotary embeddings on part of each head", "use_rope": "layers without rotary embeddings",
    "attn_logit_softcapping": "soft-capped logits",
}
"""Attributes of an attention that does more between its projections and its kernel than
the ``llama`` hooks follow, and what it does."""


def _llama_refusal(m: nn.Module) -> str | None:
    """Why the ``llama`` hooks cannot follow attention module ``m``, in words; None when they can."""
    if not (hasattr(m, "q_proj") and hasattr(m, "k_proj")):
        return "it has no separate q_proj and k_proj"
    if not _head_dim(m):
        return "it states no head_dim"
    if getattr(m, "is_cross_attention", False):
        return "it is cross-attention"
    for attr, what in _MORE_THAN_ROTARY.items():
        if getattr(m, attr, None) is not None:
            return f"it applies {what}"
    config = getattr(m, "config", None)
    if getattr(config, "clip_qkv", None) is not None:
        return "it clamps q, k and v"
    if (getattr(config, "partial_rotary_factor", None) or 1.0) != 1.0:
        return "it applies rotary embeddings on part of each head"
    window = getattr(config, "sliding_window", None)
    if (isinstance(window, int) and getattr(config, "use_sliding_window", True) is not False
            and window < (getattr(config, "max_position_embeddings", None) or window + 1)):
        return "its sliding window hides keys from queries, which hooks on the projections cannot see"
    try:
        takes_rotary = "position_embeddings" in inspect.signature(type(m).forward).parameters
    except (TypeError, ValueError):
        takes_rotary = False
    rotary = _rotary_function(m)
    try:  # LLaMA's (q, k, cos, sin), not GPT-J's apply_rotary_pos_emb(tensor, sin, cos)
        takes_pair = rotary is not None and list(inspect.signature(rotary).parameters)[:4] == ["q", "k", "cos", "sin"]
    except (TypeError, ValueError):
        takes_pair = False
    if not ((takes_rotary or hasattr(m, "rotary_emb")) and takes_pair):
        return "its positions are not LLaMA's rotary embeddings handed in as (cos, sin)"
    return None


def _head_dim(m: nn.Module) -> int | None:
    return getattr(m, "head_dim", None) or getattr(m, "head_size", None)


def _keep(raw: dict[str, Any], key: str) -> Callable:
    def hook(_module: nn.Module, _inputs: Any, output: torch.Tensor) -> None:
        raw[key] = output.detach()
    return hook


def _install_hooks(capture: _Capture, undo: list) -> None:
    """The ``gpt2`` and ``llama`` sources: hooks that keep what they need as each layer
    runs, and a forward hook on the attention module that finishes and hands it over."""
    install, finish = _HOOKS[capture.source]
    for i, (m, raw) in enumerate(zip(capture.modules, capture.raw)):
        def done(m: nn.Module, _inputs: Any, _output: Any, i: int = i, raw: dict = raw) -> None:
            layer = finish(m, raw, capture.model)
            raw.clear()
            if layer is not None:
                capture.take(i, layer)
        undo.extend(h.remove for h in install(m, raw))
        undo.append(m.register_forward_hook(done).remove)


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
    q, k, _ = raw["qkv"].split(m.split_size, dim=2)  # 3 x (B, T, C): Q, K, V of nh heads each
    B, T, _ = q.shape
    q = q.view(B, T, -1, m.head_dim).transpose(1, 2)  # (B, nh, T, hs)
    k = k.view(B, T, -1, m.head_dim).transpose(1, 2)  # (B, nh, T, hs)
    return LayerQK(q, k, _gpt2_scale(m))


# llama: hooks on q_proj (B, T, nh*hd), k_proj (B, T, nkv*hd) and the layer's (cos, sin) ----
def _install_llama(m: nn.Module, raw: dict[str, Any]) -> list:
    def pre_hook(_module: nn.Module, args: tuple, kwargs: dict) -> None:
        raw["position_embeddings"] = kwargs.get("position_embeddings")
        raw["position_ids"] = kwargs.get("position_ids")

    return [m.register_forward_pre_hook(pre_hook, with_kwargs=True),
            m.q_proj.register_forward_hook(_keep(raw, "q")), m.k_proj.register_forward_hook(_keep(raw, "k"))]


def _rotary_function(m: nn.Module) -> Callable | None:
    """``apply_rotary_pos_emb`` of the module's own modeling file; LLaMA's for a module
    defined outside ``transformers`` (a user's LLaMA-style module); None when its
    ``transformers`` modeling file has none (its rotary embedding works otherwise)."""
    fn = getattr(sys.modules.get(type(m).__module__), "apply_rotary_pos_emb", None)
    if fn is None and not type(m).__module__.startswith("transformers."):
        return _llama_function(m, "apply_rotary_pos_emb")
    return _plain(fn)


def _llama_function(m: nn.Module, name: str) -> Callable:
    """``apply_rotary_pos_emb`` / ``repeat_kv`` of the module's own modeling file."""
    fn = getattr(sys.modules.get(type(m).__module__), name, None)
    if fn is None:
        from transformers.models.llama import modeling_llama

        fn = getattr(modeling_llama, name)
    return _plain(fn)


def _plain(fn: Callable | None) -> Callable | None:
    """The modeling file's own function under a hub-kernel wrapper, else ``fn`` itself.

    With the ``kernels`` package installed (a dependency of ``transformers`` from 5.25),
    ``@use_kernel_forward_from_hub`` turns a modeling file's function (its
    ``apply_rotary_pos_emb``) into an ``nn.Module`` instance whose ``forward(*args,
    **kwargs)`` calls it: the function it closes over is the one whose signature the hooks
    check and which they call.
    """
    if not isinstance(fn, nn.Module):
        return fn
    try:
        inner = inspect.getclosurevars(type(fn).forward).nonlocals.get("func")
    except TypeError:
        inner = None
    return inner if inspect.isfunction(inner) else fn


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
    hd = _head_dim(m)
    B, T, _ = raw["q"].shape
    q = raw["q"].view(B, T, -1, hd).transpose(1, 2)  # (B, nh, T, hd)
    k = raw["k"].view(B, T, -1, hd).transpose(1, 2)  # (B, nkv, T, hd)
    cos_sin = raw.get("position_embeddings")
    if cos_sin is None:
        cos_sin = llama_rotary(model, m, q, raw.get("position_ids"))
    q, k = _rotary_function(m)(q, k, *cos_sin)
    k = _llama_function(m, "repeat_kv")(k, q.size(1) // k.size(1))  # (B, nh, T, hd)
    scale = getattr(m, "scaling", None)
    return LayerQK(q, k, float(hd ** -0.5 if scale is None else scale))


_HOOKS: dict[str, tuple[Callable[[nn.Module, dict], list],
                        Callable[[nn.Module, dict, nn.Module], LayerQK | None]]] = {
    "gpt2": (_install_gpt2, _finish_gpt2), "llama": (_install_llama, _finish_llama)}
