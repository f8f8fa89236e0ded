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

LEFT_OUT: dict[str, str] = {
    "blt": "takes over 60 s to build or run at its default size",
    "cohere_compass_text": "fails at build: KeyError: full_attention",
    "cpmant": "no MLP weight recognised by name",
    "cwm": "fails at build: CwmConfig rejected the arguments: TypeError: Field 'bos_token_id ...",
    "dbrx": "fails at build: AttributeError: 'DbrxAttentionConfig ...",
    "deepseek_v4": "9 hidden weights no name rule recognises (e.g. model.layers.attn_hc.fn)",
    "dots1": "fails at build: Dots1ForCausalLM rejected its config: empty() takes 1 positional ...",
    "dots3_note": "fails at build: AttributeError ...",
    "dots3_note_text": "fails at build: AmbiguousGlobalPerLayerAttributeError: 'num_attention_heads' is a per-layer attribute ...",
    "emu3": "fails at build: AttributeError: 'Emu3Config' object has ...",
    "falcon_mamba": "no MLP weight recognised by name",
    "fuyu": "takes over 60 s to build or run at its default size",
    "gemma3": "takes over 60 s to build or run at its default size",
    "gemma3n": "fails at build: ImportError: TimmWrapperModel ...",
    "gemma3n_text": "fails at build: intermediate_size: expected a whole number in [1, 16,777,216] ...",
    "gemma4": "takes over 60 s to build or run at its default size",
    "gemma4_assistant": "fails at build: StrictDataclassClassValidationError: Class validation error for validator ...",
    "gemma4_text": "9 hidden weights no name rule recognises (e.g. model.layers.per_layer_input_gate.weight)",
    "gemma4_unified": "takes over 60 s to build or run at its default size",
    "gemma4_unified_assistant": "fails at its first forward at this size (inputs_embeds and shared_kv_states cannot be None)",
    "git": "1 hidden weight no name rule recognises (e.g. git.visual_projection.visual_projection.weight)",
    "got_ocr2": "61 hidden weights no name rule recognises (e.g. model.vision_tower.layers.attn.rel_pos_h)",
    "hy_v4": "9 hidden weights no name rule recognises (e.g. model.layers.attn_hc.fn)",
    "inkling2_loop_text": "15 hidden weights no name rule recognises (e.g. model.layers.self_attn.q_proj.norm.scale)",
    "inkling2_text": "15 hidden weights no name rule recognises (e.g. model.layers.self_attn.q_proj.norm.scale)",
    "inkling_text": "4 hidden weights no name rule recognises (e.g. model.layers.self_attn.rel_logits_proj.proj)",
    "jamba": "4 hidden weights no name rule recognises (e.g. model.layers.mamba.A_log)",
    "lfm2_moe": "fails at build: Lfm2MoeForCausalLM rejected its config: 'NoneType' object is not ...",
    "llama4": "fails at build: AttributeError: 'Llama4Config' object ...",
    "longcat_flash": "takes over 60 s to build or run at its default size",
    "mamba": "no MLP weight recognised by name",
    "mamba2": "fails at build: Mamba2Config rejected the arguments: ValueError: Inconsistent ...",
    "mllama": "takes over 60 s to build or run at its default size",
    "modernbert-decoder": "fails at build: ModernBertDecoderConfig rejected the arguments ...",
    "phi4_multimodal": "7 hidden weights no name rule recognises (e.g. embed_tokens_extend.image_embed.img_processor.head.attention)",
    "qwen3_5": "fails at build: AttributeError: 'Qwen3_5Config ...",
    "qwen3_5_moe": "fails at build: AttributeError ...",
    "qwen4_exp": "fails at build: AttributeError ...",
    "qwen4_exp_text": "fails at build: Qwen4ExpForCausalLM rejected its config: unsupported operand ...",
    "rwkv": "no MLP weight recognised by name",
    "xlnet": "no hidden weight recognised by name",
    "xlstm": "no hidden weight recognised by name",
    "zamba": "fails at build: ZambaForCausalLM rejected its config: There is an issue with your ...",
    "zamba2": "3 hidden weights no name rule recognises (e.g. model.layers.linear.weight)",
    "zaya": "4 hidden weights no name rule recognises (e.g. model.layers.mlp.gate.router_mlp.out_proj.weight)",
}
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
