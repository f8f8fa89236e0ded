"""The model specs a run can name, without torch: presets, Hugging Face families, ``py:``.

A *model spec* (``--model``, ``TrainConfig.model``, ``proxy.model`` of a search space) is a
proxy preset name (:data:`PRESETS`: the proxy GPT, rule set ``nanogpt``), ``hf:<family>``
(:data:`HF_MODELS`: ``hf:gpt2`` and ``hf:llama``, rule sets ``gpt2`` and ``llama``),
``hf:<model_type>`` (any other decoder-only causal LM of ``transformers``: ``hf:mistral``,
``hf:qwen2``, ``hf:gemma``, ``hf:phi3``, ...), ``hf:PATH`` (a directory holding a
``config.json``; see :mod:`geosearch.models.hf_configs`) or ``py:MODULE:FACTORY`` (your own
``nn.Module``, no default rule set). This module holds the names and what each registered
family defaults to, so that a search space or the command line can list them and find their
rule set (:func:`preset_rules`) without importing torch; :mod:`geosearch.models.zoo`
builds them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from geosearch.util.checks import Range

# Presets. vocab_size is not part of a preset: it comes from the data (256 for bytes).
# "mini" is the default search's proxy: `small` at half its width and context, the size at
# which the default search fits its 10 minutes on two CPU cores (a DGram step takes 60 ms
# there, 262 ms on `small`: docs/benchmarks.md, "The default problem"). "small" is the
# 4-layer, width-128 model the optimizer overheads in docs/design.md were measured on (0.8M
# parameters; one batch-16 AdamW training step takes about 95 ms on two CPU cores, `tiny`
# about 4 ms).
PRESETS: dict[str, dict[str, int]] = {
    "tiny": dict(n_layer=2, n_head=2, n_embd=32, block_size=32),  # tests: ms per step
    "mini": dict(n_layer=4, n_head=4, n_embd=64, block_size=64),  # the default search's
    "small": dict(n_layer=4, n_head=4, n_embd=128, block_size=128),  # geosearch train's default
    "gpt2": dict(n_layer=12, n_head=12, n_embd=768, block_size=1024),  # GPT-2 small (124M)
}
"""Proxy GPT presets: :class:`~geosearch.models.model.GPTConfig` fields by name."""

DEFAULT_BLOCK_SIZE = 128
"""Context length of Hugging Face and ``py:`` models when neither ``block_size`` nor
``model_args`` set one (the ``small`` preset's)."""

MODEL_SIZE = Range(1, 2**24, whole=True)
"""A size of a model's config (a width, head count, vocabulary or context): 2²⁴ is 100x the
widest published decoder's hidden size and 64x the largest vocabulary; what a machine can
hold is checked from the parameter count (:mod:`geosearch.models.memory`)."""
MODEL_DEPTH = Range(1, 1_024, whole=True)
"""A model's layer count: the deepest published decoders have about 128. A bound is needed
before the model is built at all: the meta device holds any width, but builds every layer."""
DEPTH_FIELDS = frozenset({"n_layer", "n_layers", "num_layers", "num_hidden_layers"})


def size_range(field: str) -> Range:
    """The range of a model config's size ``field``: :data:`MODEL_DEPTH` for a layer count."""
    return MODEL_DEPTH if field in DEPTH_FIELDS else MODEL_SIZE


HF_PREFIX, PY_PREFIX = "hf:", "py:"
PY_SPEC_HELP = "py:MODULE:FACTORY"

@dataclass(frozen=True)
class HFFamily:
    """A Hugging Face causal-LM family that ``hf:<name>`` builds.

    Attributes:
        config_class: name of its config class in ``transformers``.
        model_class: name of its causal-LM class in ``transformers``.
        defaults: config fields set unless ``model_args`` override them.
        block_field: the config field holding the context length.
        size_fields: fields that must be positive integers.
        rules: its rule set in :mod:`geosearch.rules.modules`.
    """

    config_class: str
    model_class: str
    defaults: Mapping[str, Any]
    block_field: str
    size_fields: tuple[str, ...]
    rules: str


HF_MODELS: dict[str, HFFamily] = {
    "gpt2": HFFamily(
        "GPT2Config", "GPT2LMHeadModel",
        defaults=dict(n_layer=4, n_head=4, n_embd=128, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                      bos_token_id=None, eos_token_id=None),
        block_field="n_positions", size_fields=("n_layer", "n_head", "n_embd", "n_positions", "vocab_size"),
        rules="gpt2"),
    "llama": HFFamily(
        "LlamaConfig", "LlamaForCausalLM",
        defaults=dict(hidden_size=128, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                      intermediate_size=344, bos_token_id=None, eos_token_id=None),
        block_field="max_position_embeddings",
        size_fields=("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                     "intermediate_size", "max_position_embeddings", "vocab_size"),
        rules="llama"),
}
"""``hf:<name>`` -> how to build it. One entry per family.

Defaults are the size of the ``small`` proxy (the CPU default) with dropout off, no KV cache
and the data's vocabulary (256 for the byte-level corpora). ``hf:gpt2``: ``n_layer=4,
n_head=4, n_embd=128, n_positions=block_size`` (128), ``activation_function=gelu_new``
(GPT-2's), tied embeddings, no BOS/EOS id (no tokenizer). ``hf:llama``: ``hidden_size=128,
num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2`` (grouped-query
attention), ``intermediate_size=344`` (≈ 8/3 × 128, LLaMA's SwiGLU ratio),
``max_position_embeddings=block_size``, untied head."""


def model_spec_names() -> list[str]:
    """The model specs :func:`build_model` accepts (``py:`` as its pattern)."""
    return [*PRESETS, *(HF_PREFIX + name for name in HF_MODELS), PY_SPEC_HELP]


def preset_rules(spec: str) -> str | None:
    """The rule set of a spec known without building anything: ``nanogpt`` for presets, the
    family's rule set for :data:`HF_MODELS`; None for every other spec (other ``hf:`` types,
    ``py:``). :func:`geosearch.models.zoo.default_rules` builds the rest on the meta device.
    """
    if spec in PRESETS:
        return "nanogpt"
    if isinstance(spec, str) and spec.startswith(HF_PREFIX) and spec[len(HF_PREFIX):] in HF_MODELS:
        return HF_MODELS[spec[len(HF_PREFIX):]].rules
    return None
