"""A family's own constraints, kept when its config is shrunk to the proxy's size.

:func:`geosearch.models.hf_configs.small_kwargs` sets the width, depth and heads of the
``small`` proxy and scales the MLP widths; :func:`family_fields` then fixes what a family
derives from them and would otherwise keep at its full size: per-layer lists (``layer_types``,
GPT-Neo's ``attention_types``) cut to the new depth with every kind of layer kept; rotary
dimensions (GPT-J's ``rotary_dim``) scaled to the new head size; the latent-attention sizes of
DeepSeek-style models (``q_lora_rank``, ``kv_lora_rank``, ``qk_rope_head_dim``, ...); the
number of experts (at most :data:`MAX_EXPERTS`, top-k at most :data:`MAX_TOP_K`, one expert
group) and the layers before the first mixture-of-experts layer; every MLP width rounded up
to a multiple of :data:`WIDTH_MULTIPLE` (grouped expert kernels need 16-byte strides).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

__all__ = [
    "MAX_EXPERTS",
    "MAX_TOP_K",
    "WIDTH_MULTIPLE",
    "family_fields",
    "fit_layers",
    "round_width",
]

MAX_EXPERTS = 4
"""Experts per mixture-of-experts layer at the shrunk size (the family's own count when smaller)."""

MAX_TOP_K = 2
"""Experts each token is routed to at the shrunk size (the family's own when smaller)."""

WIDTH_MULTIPLE = 16
"""Shrunk MLP and latent widths are rounded up to a multiple of this."""

_EXPERT_COUNTS = ("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts")
_TOP_K = ("num_experts_per_tok", "num_experts_per_token", "moe_topk", "top_k", "moe_k")
_GROUPS = ("n_group", "topk_group", "num_expert_group")
_FIRST_DENSE = ("first_k_dense_replace",)
_LATENT = ("q_lora_rank", "kv_lora_rank")


def round_width(value: float) -> int:
    """``value`` rounded up to a multiple of :data:`WIDTH_MULTIPLE` (at least one multiple)."""
    return max(WIDTH_MULTIPLE, WIDTH_MULTIPLE * math.ceil(value / WIDTH_MULTIPLE))


def fit_layers(values: list[Any], depth: int) -> list[Any]:
    """A per-layer list cut to ``depth`` layers, keeping every kind of layer it has.

    The first ``depth`` entries, then the kinds they miss put at the end in their first
    order (a hybrid model keeps its attention layers when they come late), as far as
    ``depth`` allows."""
    out = list(values[:depth])
    missing = [v for v in dict.fromkeys(map(_key, values)) if v not in set(map(_key, out))]
    kinds = {_key(v): v for v in values}
    for i, key in enumerate(missing[: depth - 1] if depth > 1 else []):
        out[depth - 1 - i] = kinds[key]
    return out


def _key(value: Any) -> str:
    return repr(value)


def family_fields(
    defaults: Mapping[str, Any],
    name_of: Callable[[str], str | None],
    set_: Mapping[str, Any],
    args: Mapping[str, Any],
) -> dict[str, Any]:
    """The config fields that keep a family's constraints at the shrunk size.

    Args:
        defaults: the config's default fields (``config_class().to_dict()``).
        name_of: a standard field name (``num_hidden_layers``) -> the config's own, or None.
        set_: what the shrinker already sets (real names).
        args: the user's ``model_args`` (real names): never overridden.
    """
    out: dict[str, Any] = {}

    def put(name: str | None, value: Any) -> None:
        if name is not None and name not in args and name in defaults:
            out[name] = value

    def now(std: str) -> Any:
        name = name_of(std)
        return args.get(name, set_.get(name, defaults.get(name))) if name else None

    def default(std: str) -> Any:
        return defaults.get(name_of(std) or "")

    _layer_lists(defaults, now("num_hidden_layers"), default("num_hidden_layers"), put)
    width, heads, width0, heads0 = (
        now("hidden_size"),
        now("num_attention_heads"),
        default("hidden_size"),
        default("num_attention_heads"),
    )
    if all(isinstance(v, int) and v > 0 for v in (width, heads, width0, heads0)):
        _head_fields(defaults, width // heads, width0 // heads0, name_of("head_dim"), put)
        for name, value in defaults.items():
            if isinstance(value, int) and (name.endswith("intermediate_size") or name in _LATENT):
                put(name, round_width(value * width / width0))
    _expert_fields(defaults, args, put)
    return out


def _layer_lists(
    defaults: Mapping[str, Any], depth: Any, depth0: Any, put: Callable[[str, Any], None]
) -> None:
    """Per-layer lists cut to the new depth; GPT-Neo's ``attention_types`` said for it."""
    if not isinstance(depth, int):
        return
    if isinstance(depth0, int) and depth != depth0 and depth0 > 1:
        for name, value in defaults.items():
            if isinstance(value, list) and len(value) == depth0:
                put(name, fit_layers(value, depth))
    types = defaults.get("attention_types")
    if (
        isinstance(types, list) and types and isinstance(types[0], list)
    ):  # [[["global", "local"], 12]]
        pattern = types[0][0]
        put("attention_types", [[pattern, max(1, depth // len(pattern))]])


def _head_fields(
    defaults: Mapping[str, Any],
    head: int,
    head0: int,
    head_name: str | None,
    put: Callable[[str | None, Any], None],
) -> None:
    """Rotary and latent-attention sizes for the new head size ``head`` (``head0`` before)."""
    rotary = defaults.get("rotary_dim")
    if isinstance(rotary, int) and rotary > 0:  # GPT-J, CodeGen: rotary on part of each head
        put("rotary_dim", max(2, 2 * round(rotary * head / head0 / 2)))
    if isinstance(defaults.get("qk_rope_head_dim"), int):  # multi-head latent attention
        put("qk_rope_head_dim", head // 2)
        put("qk_nope_head_dim", head // 2)
        put("v_head_dim", head)
        put("qk_head_dim", head)
        put(head_name, head // 2)  # DeepSeek's head_dim is the rotary part


def _expert_fields(
    defaults: Mapping[str, Any], args: Mapping[str, Any], put: Callable[[str, Any], None]
) -> None:
    """At most :data:`MAX_EXPERTS` experts, top-k at most :data:`MAX_TOP_K`, one expert
    group, one dense layer before the first mixture of experts."""
    experts = None
    for name in _EXPERT_COUNTS:
        value = args.get(name, defaults.get(name))
        if isinstance(value, int) and value > 1:
            experts = value if name in args else min(value, MAX_EXPERTS)
            put(name, experts)
    for name in _TOP_K:
        value = defaults.get(name)
        if isinstance(value, int) and value > 0:
            put(name, min(value, MAX_TOP_K, experts or MAX_TOP_K))
        elif value is None and name in defaults and experts:
            put(name, min(MAX_TOP_K, experts))
    for name in _GROUPS:
        if isinstance(defaults.get(name), int):
            put(name, 1)
    for name in _FIRST_DENSE:
        if isinstance(defaults.get(name), int) and defaults[name] > 0:
            put(name, 1)
