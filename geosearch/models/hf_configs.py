"""Configs of the Hugging Face models ``hf:<model_type>`` and ``hf:PATH`` build, offline.

Besides the families with their own entry (:data:`geosearch.models.specs.HF_MODELS`:
``gpt2``, ``llama``), ``hf:<model_type>`` takes any decoder-only causal LM that the
installed ``transformers`` ships (:func:`causal_lm_types`: ``mistral``, ``qwen2``,
``gemma``, ``phi3``, ...; encoders such as BERT and encoder-decoders such as BART are left
out), made from its config class at the ``small`` proxy's size while keeping the family's
own proportions (:func:`small_kwargs`); ``hf:PATH`` takes a local directory holding a
``config.json`` (a checkpoint's, say) and builds that architecture as written. Either way
the weights are random and nothing is downloaded. :class:`HFSource` is what
:mod:`geosearch.models.zoo` needs from either to make the config and the model, and
:func:`check_heads` checks the head counts of any of them; :func:`checked_args`,
:func:`check_sizes` and :func:`make_hf_config` check a ``model_args`` and make the config.

*Listed* types (``geosearch inspect --models``, :func:`listed_types`) are those that work at
their default size: a decoder-only model with attention (:func:`kind_problem`) that the
sweep ``benchmarks/hf_families.py`` built, ran, probed and stepped; the others are in
:data:`LEFT_OUT` with their reason, measured with the ``transformers`` versions of
:data:`TESTED_WITH`. With another version, ``inspect --models`` says the list is unchecked.
"""

from __future__ import annotations

import difflib
import functools
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from geosearch.util.checks import shown
from geosearch.util.errors import ConfigError
from geosearch.util.files import read_user_text
from geosearch.models.hf_shrink import family_fields
from geosearch.models.specs import size_range

SMALL_SIZE: dict[str, int] = {"hidden_size": 128, "num_hidden_layers": 4, "num_attention_heads": 4}
"""``hf:<model_type>`` defaults: the ``small`` proxy's width, depth and heads (standard
config names, mapped through each config's ``attribute_map``)."""

BLOCK_FIELDS = ("max_position_embeddings", "n_positions", "n_ctx", "max_seq_len", "seq_length",
                "context_length")
"""Config fields that may hold the context length, first found wins."""

SIZE_FIELDS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
               "intermediate_size", "head_dim", "vocab_size")
"""Standard fields checked to be positive integers when a config has them."""

CONFIG_FILE = "config.json"
_SOURCE = "--model"


@dataclass
class HFSource:
    """Where an ``hf:`` config comes from, and how to make it.

    Attributes:
        label: the config class name, or the directory.
        config_class: the ``transformers`` config class.
        model_class: name of its causal-LM class in ``transformers``.
        model_type: the config's ``model_type`` (the :class:`BuiltModel` family).
        base: the config a directory holds (empty for a model type: :func:`small_kwargs`).
        directory: the directory of ``hf:PATH``, None for a model type.
        fields: the config's fields (its defaults, and what ``config.json`` sets).
        block_field: the field holding the context length, None when there is none.
    """

    label: str
    config_class: Any
    model_class: str
    model_type: str
    base: dict[str, Any] = field(default_factory=dict)
    directory: str | None = None
    fields: frozenset[str] = frozenset()
    block_field: str | None = None

    def real_name(self, name: str) -> str | None:
        """A standard field name (``hidden_size``) as this config spells it (``n_embd``), or
        None when it has no such field."""
        real = getattr(self.config_class, "attribute_map", {}).get(name, name)
        return real if real in self.fields else None


LIST_HINT = "geosearch inspect --models lists them"
"""Where the model types ``hf:MODEL_TYPE`` takes are listed: a message names it instead of
the list, which holds some 200 names."""


def is_path(target: str) -> bool:
    """``hf:PATH`` rather than ``hf:<model_type>``: the text has a path separator or starts
    with ``.`` or ``~`` (``hf:./my_model`` for a directory in the current one)."""
    return "/" in target or os.sep in target or target.startswith((".", "~"))


def causal_lm_types() -> list[str]:
    """The model types ``hf:<model_type>`` takes: causal LMs that are neither masked-LM
    encoders (BERT, ...) nor sequence-to-sequence models (BART, ...)."""
    from transformers.models.auto import modeling_auto as auto

    causal = set(auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)
    return sorted(causal - set(auto.MODEL_FOR_MASKED_LM_MAPPING_NAMES)
                  - set(auto.MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES))


def hf_source(spec: str, target: str, transformers: Any, allowed: list[str]) -> HFSource:
    """The :class:`HFSource` of ``hf:<model_type>`` or ``hf:PATH``.

    Raises:
        ConfigError: an unknown model type (with close matches), a directory without a
            readable ``config.json``, or one whose model type is not a causal LM.
    """
    from transformers import CONFIG_MAPPING
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    types = causal_lm_types()
    base: dict[str, Any] = {}
    label = None
    if is_path(target):
        path = Path(target).expanduser()
        base = _read_config_json(spec, path)
        model_type = base.pop("model_type", None)
        label = str(path)
        if model_type not in types:
            raise ConfigError(f"model {spec!r}: {path / CONFIG_FILE} has model_type {shown(model_type)}, which "
                              f"is not a decoder-only causal LM of transformers {transformers.__version__} "
                              f"({LIST_HINT})", source=_SOURCE, key="model")
    else:
        model_type = target
        if model_type not in types:
            near = difflib.get_close_matches(model_type, types, n=3)
            hint = f" (did you mean {', '.join('hf:' + t for t in near)}?)" if near else ""
            raise ConfigError(f"unknown Hugging Face model {shown(spec)}{hint}: hf:MODEL_TYPE takes a "
                              f"decoder-only causal LM type of transformers {transformers.__version__} "
                              f"({LIST_HINT}), hf:PATH a directory holding config.json",
                              source=_SOURCE, key="model", allowed=allowed)
    config_class = CONFIG_MAPPING[model_type]
    model_class = MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[model_type]
    fields = frozenset(default_config(config_class).to_dict()) | frozenset(base)
    source = HFSource(label or config_class.__name__, config_class, model_class, model_type, base, label, fields)
    source.block_field = next((f for f in map(source.real_name, BLOCK_FIELDS) if f is not None), None)
    return source


@functools.lru_cache(maxsize=None)
def default_config(config_class: Any) -> Any:
    """``config_class()``, made once and only read, without the warnings ``transformers``
    logs about its own defaults (Starcoder2's BOS id lies outside its default vocabulary)."""
    from transformers.utils import logging as hf_logging

    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        return config_class()
    finally:
        hf_logging.set_verbosity(level)


def _read_config_json(spec: str, path: Path) -> dict[str, Any]:
    config_file = path / CONFIG_FILE
    if not (config_file.exists() or config_file.is_symlink()):
        raise ConfigError(f"model {spec!r}: no {CONFIG_FILE} in {path}; hf:PATH takes a directory holding "
                          "a Hugging Face config.json", source=_SOURCE, key="model")
    text = read_user_text(config_file, what="a Hugging Face config.json")
    try:
        data = json.loads(text)
    except ValueError as e:
        raise ConfigError(f"cannot parse it: {e}", source=str(config_file)) from None
    if not isinstance(data, dict):
        raise ConfigError("expected a JSON object", source=str(config_file))
    return data


def small_kwargs(source: HFSource, args: Mapping[str, Any]) -> dict[str, Any]:
    """Config fields for ``hf:<model_type>`` that ``args`` (real field names) leave unset.

    The ``small`` proxy's width, depth and heads (:data:`SMALL_SIZE`); the family's own
    ratios for what follows from them: key-value heads (``num_key_value_heads`` ×
    heads / the default heads, rounded down to a divisor of the heads), every
    ``*intermediate_size`` (× width / the default width), ``head_dim`` = width / heads;
    dropout off; no BOS/EOS/padding id (no tokenizer is assumed). No KV cache. Then the
    family's own constraints (:func:`geosearch.models.hf_shrink.family_fields`: per-layer
    lists, rotary and latent-attention sizes, experts, 16-byte MLP widths).
    """
    default = default_config(source.config_class)
    defaults = default.to_dict()
    out: dict[str, Any] = {}

    def put(std: str, value: Any) -> None:
        name = source.real_name(std)
        if name is not None and name not in args:
            out[name] = value

    def final(std: str) -> Any:
        name = source.real_name(std)
        return args.get(name, out.get(name, getattr(default, std, None)))

    for std, value in SMALL_SIZE.items():
        put(std, value)
    width, heads = final("hidden_size"), final("num_attention_heads")
    width0, heads0 = getattr(default, "hidden_size", None), getattr(default, "num_attention_heads", None)
    if all(isinstance(v, int) and v > 0 for v in (width, heads, width0, heads0)):
        kv0 = getattr(default, "num_key_value_heads", None) or heads0
        put("num_key_value_heads", _kv_heads(heads, kv0, heads0))
        if width % heads == 0:
            put("head_dim", width // heads)
        out.update(_intermediate_sizes(defaults, args, width, width0))
    out.update(family_fields(defaults, source.real_name, out, args))
    out.update(_quiet_kwargs(defaults, args))
    if "use_cache" in defaults:
        out["use_cache"] = False
    return out


def _kv_heads(heads: int, kv0: int, heads0: int) -> int:
    """Key-value heads in the family's ratio ``kv0 / heads0``, rounded down to a divisor of ``heads``."""
    kv = max(1, heads * kv0 // heads0)
    while heads % kv:
        kv -= 1
    return kv


def _intermediate_sizes(defaults: Mapping[str, Any], args: Mapping[str, Any], width: int,
                        width0: int) -> dict[str, int]:
    """Every ``*intermediate_size`` that ``args`` leave unset, its default × ``width / width0`` (rounded)."""
    return {name: max(1, round(value * width / width0)) for name, value in defaults.items()
            if name.endswith("intermediate_size") and isinstance(value, int) and name not in args}


def _quiet_kwargs(defaults: Mapping[str, Any], args: Mapping[str, Any]) -> dict[str, Any]:
    """Dropout off and no BOS/EOS/padding id, for the fields that ``args`` leave unset."""
    out: dict[str, Any] = {}
    for name, value in defaults.items():
        if name in args:
            continue
        if ("dropout" in name or "pdrop" in name) and isinstance(value, float) and value > 0:
            out[name] = 0.0
        elif name in ("bos_token_id", "eos_token_id", "pad_token_id"):
            out[name] = None
    return out


def directory_kwargs(source: HFSource, args: Mapping[str, Any]) -> dict[str, Any]:
    """Config fields for ``hf:PATH``: its ``config.json`` as written, no KV cache. When
    ``args`` change the depth, the file's per-layer lists (``layer_types``, ...: lists as
    long as its ``num_hidden_layers``) are left out, so the config derives them again."""
    base = dict(source.base)
    depth = source.real_name("num_hidden_layers")
    if depth in args and isinstance(base.get(depth), int):
        base = {k: v for k, v in base.items() if not (isinstance(v, list) and len(v) == base[depth])}
    return {**base, "use_cache": False}


def check_heads(spec: str, config: Any, explicit_head_dim: bool) -> None:
    """Width and head counts that fit together (the configs do not check this themselves)."""
    width, heads = getattr(config, "hidden_size", None), getattr(config, "num_attention_heads", None)
    if not isinstance(width, int) or not isinstance(heads, int) or heads < 1:
        return  # no attention heads (a state-space model, say): nothing to check
    if not explicit_head_dim and width % heads:
        raise ConfigError(f"model {spec!r}: width {width} is not a multiple of {heads} heads",
                          source=_SOURCE, key="model_args")
    kv = getattr(config, "num_key_value_heads", None)
    if kv is not None and (kv < 1 or heads % kv):
        raise ConfigError(f"model {spec!r}: {heads} attention heads do not split into groups for "
                          f"num_key_value_heads={kv}; it must divide the heads", source=_SOURCE,
                          key="model_args.num_key_value_heads")


def checked_args(spec: str, model_args: dict[str, Any], allowed: list[str], label: str, config_class: Any,
             block_field: str | None) -> tuple[dict[str, Any], Any]:
    """``model_args`` checked, by the config's own names, and the context a config without a block field takes."""
    for key in model_args:
        if key not in allowed:
            near = difflib.get_close_matches(str(key), allowed, n=3)
            hint = f" (did you mean {', '.join(near)}?)" if near else ""
            raise ConfigError(f"unknown field {shown(key)} for model {shown(spec)} ({label}){hint}",
                              source=_SOURCE, key=f"model_args.{key}", allowed=allowed)
    aliases = getattr(config_class, "attribute_map", {})
    args = {aliases.get(k, k): v for k, v in model_args.items()}  # hidden_size -> n_embd for GPT-2
    context = args.pop("block_size", None) if block_field is None else None  # no such field: only T
    if "block_size" in args:
        block = args.pop("block_size")
        if block_field in args and args[block_field] != block:
            raise ConfigError(f"model {spec!r}: block_size={block} and {block_field}="
                              f"{args[block_field]} disagree; give one", source=_SOURCE,
                              key="model_args.block_size")
        args[block_field] = block
    return args, context


def check_sizes(spec: str, kwargs: Mapping[str, Any], size_fields: tuple[str, ...] | list[str]) -> None:
    """Raise ConfigError for a size field of ``kwargs`` out of its range
    (:func:`~geosearch.models.specs.size_range`: a whole number from 1)."""
    for key in size_fields:
        _, problem = size_range(key).check(kwargs.get(key))
        if problem:
            raise ConfigError(f"model {spec!r}: {key}: {problem}", source=_SOURCE, key=f"model_args.{key}")


def make_hf_config(spec: str, label: str, config_class: Any, kwargs: dict[str, Any]) -> Any:
    """``config_class(**kwargs)``; ConfigError when it rejects them or the model is an encoder-decoder."""
    try:
        config = config_class(**kwargs)
    except Exception as e:  # noqa: BLE001 - configs raise TypeError, ValueError or their own
        first = (str(e).strip().splitlines() or [type(e).__name__])[-1].strip()
        raise ConfigError(f"model {spec!r}: {label} rejected the arguments: {first}",
                          source=_SOURCE, key="model_args") from None
    if getattr(config, "is_encoder_decoder", False):
        raise ConfigError(f"model {spec!r} is an encoder-decoder; geosearch trains decoder-only causal LMs",
                          source=_SOURCE, key="model")
    return config


# --------------------------------------------------------------------------- listed types
TESTED_WITH = ("5.24.0", "5.25.0")
"""The ``transformers`` versions :data:`LEFT_OUT` was measured with (the sweep on each)."""

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
    "ergo": ("3 hidden weights no name rule recognises "
             "(e.g. model.layers.1.mlp.experts.post_expert_norm.weight)"),
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
    "got_ocr2": ("49 hidden weights no name rule recognises "
                 "(e.g. model.vision_tower.layers.attn.rel_pos_h)"),
    "hy_v4": "9 hidden weights no name rule recognises (e.g. model.layers.attn_hc.fn)",
    "inkling2_loop_text": "15 hidden weights no name rule recognises (e.g. model.layers.self_attn.q_proj.norm.scale)",
    "inkling2_text": "15 hidden weights no name rule recognises (e.g. model.layers.self_attn.q_proj.norm.scale)",
    "inkling_text": "4 hidden weights no name rule recognises (e.g. model.layers.self_attn.rel_logits_proj.proj)",
    "jamba": "4 hidden weights no name rule recognises (e.g. model.layers.mamba.A_log)",
    "kolibri1_1": ("fails at build: Kolibri1_1Config rejected the arguments: "
                   "ValueError: Sliding-attention layer 1 ..."),
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

COMPOSITES: dict[str, str] = {
    "blt": ("a byte-latent transformer (a byte encoder, a global transformer over byte patches, "
            "a byte decoder and an entropy patcher)"),
}
"""What a composite model type is, where the names of its sub-models do not say it."""


@functools.lru_cache(maxsize=None)
def kind_problem(model_type: str) -> str | None:
    """Why ``model_type`` is not a decoder-only model with attention, or None when it is:
    an encoder-decoder (its config says ``is_encoder_decoder``), a composite of several
    stacks (heads only in sub-configs; :data:`COMPOSITES` names the kind, e.g. ``blt``), or
    a state-space or recurrent model (its config has no attention heads at all)."""
    from transformers import CONFIG_MAPPING

    try:
        config = default_config(CONFIG_MAPPING[model_type])
    except Exception:  # noqa: BLE001 - a config that cannot be made with its defaults
        return None
    if getattr(config, "is_encoder_decoder", False):
        return "an encoder-decoder, not decoder-only"
    try:  # a composite (multimodal) config keeps its heads in its text config
        text = config.get_text_config() if hasattr(config, "get_text_config") else config
        heads = getattr(text, "num_attention_heads", None)
    except Exception:  # noqa: BLE001 - a per-layer attribute (heads differ by layer)
        return None
    if heads is None:
        inner = sorted(k for k, v in config.to_dict().items()
                       if isinstance(v, dict) and v.get("num_attention_heads") is not None)
        if inner:  # a byte-latent or other composite model: several stacks, none the text one
            where = f"attention only in its sub-models ({', '.join(inner)}), not one decoder stack"
            return f"{COMPOSITES.get(model_type, 'a composite model')}: {where}"
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
