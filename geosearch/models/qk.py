"""Queries and keys of any supported model, captured for the attention probes.

The instability probes (:func:`geosearch.proxy.probes.attention_stats`) and QK-clip
(:mod:`geosearch.proxy.qkclip`) need each attention layer's queries and keys exactly as its
attention kernel gets them, the scale it multiplies ``q·kᵀ`` by and the soft cap it puts on
the result. :func:`qk_capture` gets them during ordinary forward passes without changing
what the forward computes, from one of these *sources* (:data:`QK_SOURCES`):

``nanogpt``
    Modules with a ``record_qk`` switch that store ``last_q``/``last_k`` (B, nh, T, hs)
    when it is on: the built-in proxies' :class:`geosearch.models.model.CausalSelfAttention`,
    or a ``py:`` model's own module that follows the same protocol. Scale ``hs**-0.5``.
``attention_interface``
    Hugging Face models whose attention modules call ``transformers``' attention functions
    (``ALL_ATTENTION_FUNCTIONS``: every decoder-only family of ``transformers`` 5 except a
    few older ones that compute their logits themselves, e.g. BLOOM, GPT-Neo, MPT, and
    Falcon before 5.25),
    with a ``transformers`` that has ``AttentionInterface`` and ``AttentionMaskInterface``.
    While the capture is on, the config of those modules names a geosearch attention
    function (``AttentionInterface.register``; its mask function is the original
    implementation's, so the masks are made as before). It receives what the kernel would:
    ``query`` (B, nh, T, hd) and ``key`` (B, nkv, T, hd) after the model's rotary
    embeddings, q/k norms, clamps and fused or multi-query layouts, ``scaling``, ``softcap``
    (Gemma 2) and the attention mask; it hands them over and then calls the kernel the model
    is configured with (``sdpa``, ``eager``, flash, ...), so the forward's result is what it
    was. Nothing about a family is redone here. On exit the config names its kernel again.
``gpt2``, ``llama``
    Forward hooks, for a ``transformers`` without ``AttentionInterface`` and for LLaMA-style
    modules of one's own (a ``py:`` model). ``gpt2``: Hugging Face ``GPT2Attention``, its
    fused ``c_attn`` output cut by its ``split_size`` and head size; scale: the module's own.
    ``llama``: modules with ``q_proj``/``k_proj`` whose modeling file's
    ``apply_rotary_pos_emb(q, k, cos, sin)`` rotates all of each head by the
    ``position_embeddings`` the layer is handed (recomputed with the model's ``rotary_emb``
    when it is not), keys repeated for grouped-query attention; scale: the module's
    ``scaling``. An attention that does more between its projections and its kernel (q/k
    norms, clamps, partial or no rotary embeddings, soft caps, sliding windows, fused
    projections) is not hooked: such a model gets no source, and :func:`why_no_qk_source`
    says why.

Example:
    >>> with qk_capture(model) as capture:
    ...     model(x)
    >>> [(layer.q.shape, layer.k.shape, layer.scale, layer.softcap) for layer in capture.layers()]
"""

from __future__ import annotations

import functools
import inspect
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from geosearch.models.qk_hooks import (  # noqa: F401 - LayerQK and llama_rotary are public here
    LayerQK,
    _install_hooks,
    _is_gpt2,
    _is_llama,
    _llama_refusal,
    llama_rotary,
)

QK_SOURCES = ("nanogpt", "attention_interface", "gpt2", "llama")
"""How queries and keys can be captured, in the order :func:`detect_qk_source` tries them."""


# --------------------------------------------------------------------------- detection
def _is_recording(m: nn.Module) -> bool:
    return hasattr(m, "record_qk") and hasattr(m, "last_q") and hasattr(m, "last_k")


def interface_missing() -> str | None:
    """Why the ``attention_interface`` source is unavailable, in words; None when it is
    available (``transformers`` with ``AttentionInterface`` and ``AttentionMaskInterface``)."""
    try:
        import transformers
    except ImportError:
        return "transformers is not installed"
    try:
        from transformers import AttentionInterface  # noqa: F401
        from transformers.masking_utils import AttentionMaskInterface  # noqa: F401
    except ImportError:
        return f"transformers {transformers.__version__} has no AttentionInterface"
    return None


@functools.lru_cache(maxsize=None)
def _calls_attention_functions(cls: type) -> bool:
    """True when ``cls.forward`` calls ``transformers``' attention functions."""
    try:
        return "ALL_ATTENTION_FUNCTIONS" in inspect.getsource(cls.forward)
    except (OSError, TypeError):
        return False


def _is_interface(m: nn.Module) -> bool:
    return (hasattr(getattr(m, "config", None), "_attn_implementation")
            and _calls_attention_functions(type(m))
            and not getattr(m, "is_cross_attention", False)
            and getattr(m, "is_causal", True) is not False)  # not an encoder's (a vision tower's)


_DETECT: dict[str, Callable[[nn.Module], bool]] = {
    "nanogpt": _is_recording, "attention_interface": _is_interface, "gpt2": _is_gpt2, "llama": _is_llama}


def attention_layers(model: nn.Module, source: str) -> list[nn.Module]:
    """The attention modules of ``model`` that ``source`` can capture, in module order
    (none for ``attention_interface`` when :func:`interface_missing`).

    Raises:
        ValueError: unknown source.
    """
    if source not in _DETECT:
        raise ValueError(f"unknown qk source {source!r}; expected one of: {', '.join(QK_SOURCES)}")
    if source == "attention_interface" and interface_missing() is not None:
        return []
    if source == "llama":  # all or none: a model is not probed on some of its layers
        candidates = [m for m in model.modules() if type(m).__name__.endswith("Attention") and hasattr(m, "q_proj")]
        return candidates if all(map(_is_llama, candidates)) else []
    return [m for m in model.modules() if _DETECT[source](m)]


def detect_qk_source(model: nn.Module) -> str | None:
    """The first source of :data:`QK_SOURCES` that finds attention layers in ``model``,
    or None when none does (the attention probes are then unavailable:
    :func:`why_no_qk_source` says why)."""
    for source in QK_SOURCES:
        if attention_layers(model, source):
            return source
    return None


def why_no_qk_source(model: nn.Module) -> str:
    """Why :func:`detect_qk_source` finds nothing in ``model``, in plain words (a phrase
    that follows "cannot capture the queries and keys of <class>: ")."""
    attention = next((m for m in model.modules() if "Attention" in type(m).__name__), None)
    if attention is None:
        return ("it has no attention layer geosearch recognises (none follows the record_qk protocol, "
                "calls transformers' attention functions, or is GPT-2 or LLaMA attention)")
    name = type(attention).__name__
    missing = interface_missing()
    if missing is None and type(attention).__module__.startswith("transformers."):
        if _calls_attention_functions(type(attention)):
            return f"its {name} is cross-attention or an encoder's, not the causal self-attention the probes read"
        return (f"its {name} computes the attention logits inside its own forward instead of calling "
                "transformers' attention functions (AttentionInterface), so its queries and keys never "
                "reach geosearch")
    refusal = _llama_refusal(attention) or "it is neither GPT-2 nor LLaMA attention"
    hooks = f"forward hooks cannot follow its {name}: {refusal}"
    if missing is not None and type(attention).__module__.startswith("transformers."):
        return f"{missing} (install a newer transformers to capture any family) and {hooks}"
    return f"its {name} does not follow the record_qk protocol and {hooks}"


# --------------------------------------------------------------------------- capture
class QKCapture:
    """What :func:`qk_capture` yields; read :meth:`layers` after a forward pass."""

    def __init__(self, model: nn.Module, source: str, layers: list[nn.Module],
                 on_layer: Callable[[int, LayerQK], None] | None) -> None:
        self.model, self.source, self.modules = model, source, layers
        self.raw: list[dict[str, Any]] = [{} for _ in layers]  # hooks: per layer, captured tensors
        self._taken: dict[int, LayerQK] = {}
        self._on_layer = on_layer

    def take(self, i: int, layer: LayerQK) -> None:
        """Attention layer ``i`` has run: stream it to ``on_layer``, or keep it."""
        if self._on_layer is not None:
            self._on_layer(i, layer)
        else:
            self._taken[i] = layer

    def layers(self) -> list[LayerQK]:
        """Per-layer :class:`LayerQK` of the last forward pass, in layer order.

        Raises:
            RuntimeError: no forward pass ran inside the ``with`` block (or every layer was
                streamed to ``on_layer``).
        """
        if not self._taken:
            raise RuntimeError("no queries/keys captured: run a forward pass inside qk_capture()")
        return [self._taken[i] for i in sorted(self._taken)]


@contextmanager
def qk_capture(model: nn.Module, source: str | None = None,
               on_layer: Callable[[int, LayerQK], None] | None = None) -> Iterator[QKCapture]:
    """Capture every attention layer's queries and keys during forward passes in the block.

    On entry the hooks, the ``record_qk`` switch or the geosearch attention function are
    put in place; on exit they are removed (the model's own attention implementation
    named again) and the captured tensors dropped. The last forward pass wins. The
    forward computes what it computes without the capture, gradients included.

    Args:
        model: the unwrapped model (not a DDP wrapper: pass the one whose attention layers
            you mean).
        source: one of :data:`QK_SOURCES`; None = :func:`detect_qk_source`.
        on_layer: streaming mode: called as ``on_layer(i, layer_qk)`` as soon as attention
            layer ``i`` has its queries and keys, which are then dropped, so a training
            forward keeps nothing beyond what ``on_layer`` keeps (e.g. a per-head max);
            ``layers()`` then has nothing to return.

    Yields:
        A :class:`QKCapture`; ``capture.layers()`` after a forward.

    Raises:
        ValueError: unknown source, or the model has no attention layer of that source
            (the message says why).
        RuntimeError: the model's attention is already being captured (captures do not nest).
    """
    if source is None:
        source = detect_qk_source(model)
        if source is None:
            raise ValueError(f"cannot capture the queries and keys of {type(model).__name__}: "
                             f"{why_no_qk_source(model)}")
    layers = attention_layers(model, source)
    if not layers:
        raise ValueError(f"{type(model).__name__} has no {source!r} attention layer to probe")
    capture = QKCapture(model, source, layers, on_layer)
    undo: list[Callable[[], None]] = []
    try:
        _INSTALL[source](capture, undo)
        yield capture
    finally:
        for step in reversed(undo):
            step()
        for raw in capture.raw:
            raw.clear()
        capture._taken.clear()


# nanogpt: the module records them itself -------------------------------------------------
def _install_recording(capture: QKCapture, undo: list) -> None:
    for i, m in enumerate(capture.modules):
        def hook(m: nn.Module, _inputs: Any, _output: Any, i: int = i) -> None:
            if m.last_q is not None:
                q, k = m.last_q, m.last_k
                m.last_q, m.last_k = None, None
                capture.take(i, LayerQK(q, k, q.size(-1) ** -0.5))
        m.record_qk = True
        undo.append(m.register_forward_hook(hook).remove)
        undo.append(functools.partial(_stop_recording, m))


def _stop_recording(m: nn.Module) -> None:
    m.record_qk, m.last_q, m.last_k = False, None, None


# attention_interface: a registered attention function --------------------------------------
_PREFIX = "geosearch_qk:"
"""The geosearch attention functions are registered as ``_PREFIX + <the original's name>``."""
_STATE = "_geosearch_qk"
"""Attribute an attention module carries while captured: ``(capture, layer index)``."""


def _install_interface(capture: QKCapture, undo: list) -> None:
    configs = {id(m.config): m.config for m in capture.modules}
    for m in capture.modules:
        if _STATE in m.__dict__:
            raise RuntimeError(f"the attention of {type(capture.model).__name__} is already being "
                               "captured; qk_capture() blocks do not nest")
    for config in configs.values():
        original = config._attn_implementation
        _set_implementation(config, _register(original))
        undo.append(functools.partial(_set_implementation, config, original))
    for i, m in enumerate(capture.modules):
        m.__dict__[_STATE] = (capture, i)
        undo.append(functools.partial(m.__dict__.pop, _STATE, None))


def _set_implementation(config: Any, name: str | None) -> None:
    """Name the attention implementation of ``config`` alone (not of its sub-configs)."""
    if hasattr(config, "_attn_implementation_internal"):
        config._attn_implementation_internal = name
    else:
        config._attn_implementation = name


@functools.lru_cache(maxsize=None)
def _register(original: str | None) -> str:
    """Register the geosearch attention function standing in for ``original`` (and the
    original's mask function under the same name); return that name."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface

    name = f"{_PREFIX}{original}"
    AttentionInterface.register(name, _capturing_attention)
    if original in ALL_MASK_ATTENTION_FUNCTIONS:
        AttentionMaskInterface.register(name, ALL_MASK_ATTENTION_FUNCTIONS[original])
    return name


def _kernel(module: nn.Module) -> Callable:
    """The attention function ``module`` calls without the capture: its config's
    implementation looked up as its modeling file looks it up (``eager`` = the file's own
    ``eager_attention_forward``)."""
    name = module.config._attn_implementation
    original = name[len(_PREFIX):] if isinstance(name, str) and name.startswith(_PREFIX) else name
    home = sys.modules.get(type(module).__module__)
    eager = getattr(home, "eager_attention_forward", None)
    if eager is None:
        from transformers.models.llama.modeling_llama import eager_attention_forward as eager
    interface = getattr(home, "ALL_ATTENTION_FUNCTIONS", None)
    if interface is None:
        from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS as interface
    return interface[original] if original not in (None, "None", "eager") and original in interface else eager


def _capturing_attention(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                         attention_mask: Any, scaling: float | None = None, dropout: float = 0.0,
                         **kwargs: Any) -> Any:
    """The geosearch attention function: hand ``query``, ``key`` (heads repeated for
    grouped-query attention), ``scaling``, ``softcap`` and the mask (where it lets queries
    see keys, and what it adds to the logits) over, then run the kernel."""
    state = module.__dict__.get(_STATE)
    if state is not None and query.size(-2) == key.size(-2):  # self-attention over the layer's tokens
        capture, i = state
        q, k = query.detach(), key.detach()  # (B, nh, T, hd), (B, nkv, T, hd)
        if k.size(1) != q.size(1):  # key head j serves query heads j·n .. (j+1)·n - 1
            B, nkv, T, hd = k.shape
            k = k[:, :, None].expand(B, nkv, q.size(1) // nkv, T, hd).reshape(B, q.size(1), T, hd)
        softcap = kwargs.get("softcap")
        T = q.size(-2)
        capture.take(i, LayerQK(q, k, float(q.size(-1) ** -0.5 if scaling is None else scaling),
                                None if softcap is None else float(softcap),
                                _allowed(attention_mask, T), _bias(attention_mask, T)))
    return _kernel(module)(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kwargs)


def _allowed(mask: Any, T: int) -> torch.Tensor | None:
    """Where a 4-D (B, 1 or nh, T, T) attention mask lets queries see keys: a boolean mask
    as is, an additive one where it is not (close to) its dtype's minimum; None for any
    other mask (None, a padding mask, a flex ``BlockMask``)."""
    if not isinstance(mask, torch.Tensor) or mask.dim() != 4 or tuple(mask.shape[-2:]) != (T, T):
        return None
    if mask.dtype == torch.bool:
        return mask.detach()
    return mask.detach() > torch.finfo(mask.dtype).min / 2


def _bias(mask: Any, T: int) -> torch.Tensor | None:
    """A 4-D (B, 1 or nh, T, T) additive attention mask as the kernel adds it to the
    logits (0 or a position bias where keys are seen, ALiBi's in Falcon); None for any
    other mask."""
    if (not isinstance(mask, torch.Tensor) or mask.dim() != 4 or tuple(mask.shape[-2:]) != (T, T)
            or not mask.is_floating_point()):
        return None
    return mask.detach()


# gpt2: hooks on the fused c_attn output (B, T, 3C) ------------------------------------------
_INSTALL: dict[str, Callable[[QKCapture, list], None]] = {
    "nanogpt": _install_recording, "attention_interface": _install_interface,
    "gpt2": _install_hooks, "llama": _install_hooks}
