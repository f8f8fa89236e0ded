"""Which ``hf:MODEL_TYPE`` families geosearch lists: those that work at their default size.

A causal-LM type of the installed ``transformers`` is *listed* (``geosearch inspect
--models``) when it is a decoder-only model with attention (not an encoder-decoder such as
Whisper or MusicGen, not a state-space or recurrent model such as Mamba or RWKV:
:func:`kind_problem`) and the sweep ``benchmarks/hf_families.py`` found it to build at its
default (shrunk) size, run forward, be probed where its attention can be, bind
``attn=stiefel,mlp=dgram`` with its default rules and take a step. The types the sweep
found otherwise are in :data:`LEFT_OUT` with their reason (measured with ``transformers``
:data:`TESTED_WITH`). ``hf:<type>`` still builds a type that is not listed (its
``model_args`` may make it work); a type the sweep has not seen (a newer ``transformers``)
is listed as unchecked.
"""

from __future__ import annotations

import functools

from geosearch.models.hf_configs import causal_lm_types, default_config

__all__ = ["LEFT_OUT", "TESTED_WITH", "kind_problem", "left_out_types", "listed_types"]

TESTED_WITH = "5.24.0"
"""The ``transformers`` version :data:`LEFT_OUT` was measured with."""

LEFT_OUT: dict[str, str] = {}
"""Model type -> why it does not work end to end at its default size (from the sweep)."""


@functools.lru_cache(maxsize=None)
def kind_problem(model_type: str) -> str | None:
    """Why ``model_type`` is not a decoder-only model with attention, or None when it is:
    an encoder-decoder (its config says ``is_encoder_decoder``), or a state-space or
    recurrent model (its config has no attention heads)."""
    from transformers import CONFIG_MAPPING

    try:
        config = default_config(CONFIG_MAPPING[model_type])
    except Exception:  # noqa: BLE001 - a config that cannot be made with its defaults
        return None
    if getattr(config, "is_encoder_decoder", False):
        return "an encoder-decoder, not decoder-only"
    try:
        heads = getattr(config, "num_attention_heads", None)
    except Exception:  # noqa: BLE001 - a per-layer attribute (heads differ by layer)
        return None
    if heads is None:
        return "a state-space or recurrent model: no attention heads"
    return None


def listed_types() -> list[str]:
    """The model types ``geosearch inspect --models`` lists (see the module docstring)."""
    return [t for t in causal_lm_types() if t not in LEFT_OUT and kind_problem(t) is None]


def left_out_types() -> dict[str, str]:
    """The causal-LM types of the installed ``transformers`` that are not listed -> why."""
    out = {}
    for t in causal_lm_types():
        problem = kind_problem(t)
        if problem is not None:
            out[t] = problem
        elif t in LEFT_OUT:
            out[t] = LEFT_OUT[t]
    return out
