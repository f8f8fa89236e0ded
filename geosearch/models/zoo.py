"""Build the models a search can train: the proxy presets, Hugging Face models, your own.

:func:`build_model` turns a model spec (:mod:`geosearch.models.specs`: ``tiny``, ``small``,
``gpt2``, ``hf:gpt2``, ``hf:llama``, ``hf:<model_type>``, ``hf:PATH``,
``py:MODULE:FACTORY``) and its ``model_args`` into a randomly initialised ``nn.Module`` with
what the rest of geosearch needs to know about it (:class:`BuiltModel`: its default rules,
how the probes capture its queries and keys, its context length); :func:`check_model_spec`
checks a spec without building it, :func:`build_meta_model` builds it on the meta device,
and :func:`lm_loss` is the next-token loss of any of them. Hugging Face models
(``pip install 'geosearch[hf]'``) are built from their config with random weights: no
download, no tokenizer, nothing read from the network. ``hf:<model_type>`` (any decoder-only
causal LM of ``transformers``: ``mistral``, ``qwen2``, ``gemma``, ``phi3``, ...) and
``hf:PATH`` (a directory holding ``config.json``) are made by
:mod:`geosearch.models.hf_configs`; their rules are the first registered rule set that fits,
else rules read off their module names (:func:`geosearch.rules.inference.model_rules`). A
model whose queries and keys the probes cannot capture (:mod:`geosearch.models.qk`) is
built with a warning that says why (logged once per spec, and kept in
:attr:`BuiltModel.warnings`, hence in each run's ``config.yaml``): its runs report no
attention logits, and the logit-growth pruner has nothing to go on. So is an ``hf:PATH``
model whose ``config.json`` vocabulary is far above the data's (:func:`_far_vocab_warning`:
rows the data never uses, and ``--model-arg vocab_size=N``). A ``py:`` factory
(``py:package.module:factory`` or ``py:path/to/file.py:factory``)
is called as ``factory(vocab_size=..., block_size=..., **model_args)`` and must return an
``nn.Module`` whose ``forward(idx)`` maps token ids (B, T) to logits (B, T, vocab_size), an
object with ``.logits``, or a tuple starting with them; it has no default rule set
(:func:`geosearch.inspect.fitting_rule_sets` lists the registered ones that fit), and its
attention is probed when its modules follow the proxy's ``record_qk`` protocol, are
``transformers`` attention modules, or are LLaMA-style (:mod:`geosearch.models.qk`);
otherwise ``qk_source`` is None and its runs report no attention logits.

Example:
    >>> built = build_model("hf:llama", vocab_size=256, block_size=None, model_args={"num_hidden_layers": 2})
    >>> built.rules, built.qk_source, built.block_size
    ('llama', 'attention_interface', 128)
    >>> loss = lm_loss(built.model, x, y)          # x, y: (B, T) token ids
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn

from geosearch.util.checks import is_int
from geosearch.util.errors import ConfigError, GeosearchError, SettingsError
from geosearch.models.hf_configs import (
    LEFT_OUT,
    SIZE_FIELDS,
    HFSource,
    check_heads,
    check_sizes,
    checked_args,
    default_config,
    directory_kwargs,
    hf_source,
    make_hf_config,
    small_kwargs,
)
from geosearch.models.built import BuiltModel, check_vocab
from geosearch.models.lm import output_logits
from geosearch.models.model import GPT, make_config
from geosearch.models.qk import detect_qk_source, why_no_qk_source
from geosearch.models.user import one_line, plan_py
from geosearch.rules.inference import model_rules
from geosearch.models.specs import (  # the spec names live without torch
    DEFAULT_BLOCK_SIZE,
    HF_MODELS,
    HF_PREFIX,
    PRESETS,
    PY_PREFIX,
    HFFamily,
    model_spec_names,
    preset_rules,
)
from geosearch.util.yaml_io import plain

__all__ = [
    "BuiltModel", "build_meta_model", "build_model", "check_logits", "check_model_spec", "default_rules",
    "hf_config_fields",
]

_SOURCE = "--model"
# Config fields that describe the checkpoint, not the architecture: not overridable.
_HF_INTERNAL = frozenset({"_name_or_path", "transformers_version", "architectures", "model_type",
                          "id2label", "label2id", "return_dict", "output_hidden_states",
                          "output_attentions", "torchscript", "problem_type"})


# --------------------------------------------------------------------------- build
def build_model(spec: str, *, vocab_size: int, block_size: int | None = None,
                model_args: Mapping[str, Any] | None = None, for_data: bool = True) -> BuiltModel:
    """Build a randomly initialised model from a spec (see the module docstring).

    Seed torch before calling for a reproducible initialisation.

    Args:
        spec: ``tiny``/``small``/``gpt2``, ``hf:gpt2``, ``hf:llama``, ``hf:<model_type>``,
            ``hf:PATH`` or ``py:package.module:factory`` (:func:`model_spec_names`).
        vocab_size: the data's vocabulary size; ``model_args["vocab_size"]`` may raise it.
        block_size: context length when ``model_args`` does not set one; None = the
            preset's, else :data:`DEFAULT_BLOCK_SIZE`.
        model_args: field overrides: a preset's :class:`~geosearch.models.model.GPTConfig`
            fields, a Hugging Face config's fields or their aliases (``n_layer=2`` for
            GPT-2, ``num_hidden_layers=2`` for LLaMA), or the factory's keyword arguments;
            ``block_size`` works for every kind (for Hugging Face models it sets
            ``n_positions`` / ``max_position_embeddings``).
        for_data: ``vocab_size`` is the data's, so an ``hf:PATH`` vocabulary far above it is
            warned about (:func:`_far_vocab_warning`); False: a stand-in (``geosearch
            inspect``, a model's rules or logit scale), which nothing is warned about.

    Returns:
        A :class:`BuiltModel`.

    Raises:
        ConfigError: an unknown spec, a Hugging Face spec without ``transformers``
            installed, an unknown model field, a bad size, a module that cannot be
            imported, a missing factory or one that does not take the arguments or does
            not return an ``nn.Module``; each message names the spec and what is allowed.
    """
    return _plan(spec, vocab_size, block_size, dict(model_args or {}), for_data)()


def check_model_spec(spec: str, model_args: Mapping[str, Any] | None = None, *,
                     vocab_size: int = 256) -> None:
    """Check a spec and its ``model_args`` without building the model (cheap).

    Presets and Hugging Face specs are checked completely (their config is made);
    ``py:`` specs are imported and their factory's signature is checked against the
    arguments, but the factory is not called.

    Raises:
        ConfigError: as :func:`build_model`.
    """
    _plan(spec, vocab_size, None, dict(model_args or {}))


def default_rules(spec: str, model_args: Mapping[str, Any] | None = None) -> str | tuple | None:
    """The default rules of a spec: ``nanogpt`` for presets, the family's rule set for
    :data:`~geosearch.models.specs.HF_MODELS` (both without building anything:
    :func:`~geosearch.models.specs.preset_rules`); for other ``hf:`` specs, the rules of the
    model built on the meta device with ``model_args`` (a registered rule set that fits,
    else a tuple of :class:`~geosearch.rules.modules.ModuleRule` read off its module names; needs
    ``transformers``); None for ``py:`` specs and unknown or unbuildable ones.

    Use it to parse an inline assignment for a model (``Assignment.parse(text,
    rules=default_rules(spec) or "nanogpt")``) before the model exists.
    """
    known = preset_rules(spec)
    if known is not None or not isinstance(spec, str) or not spec.startswith(HF_PREFIX):
        return known
    try:
        return build_meta_model(spec, vocab_size=256, model_args=model_args, for_data=False).rules
    except ConfigError:
        return None


def build_meta_model(spec: str, *, vocab_size: int, block_size: int | None = None,
                     model_args: Mapping[str, Any] | None = None, for_data: bool = True) -> BuiltModel:
    """:func:`build_model` on the meta device: parameter names, shapes and module classes
    without memory or initialisation, to look at a model (``geosearch inspect``, the search
    preflight) without paying for it. A model whose construction fails on the meta device
    (a ``py:`` factory that computes with its tensors, say) is built for real on the CPU.

    Raises:
        ConfigError: as :func:`build_model`.
    """
    build = _plan(spec, vocab_size, block_size, dict(model_args or {}), for_data)
    try:
        with torch.device("meta"):
            return build()
    except ConfigError:
        raise
    except Exception:  # noqa: BLE001 - cannot be built on meta: build it for real
        return build()


def check_logits(built: BuiltModel, data_vocab: int, *, source: str | None = _SOURCE,
                 key: str | None = "model") -> bool:
    """Run the model once, as a run would, and check the logits it returns.

    One forward pass of ``built.model`` in eval mode, without gradients (and with the CPU's
    random state kept), on a batch of 2 sequences of its context ``built.block_size``
    (token 0), on the device it is on: on the meta device it costs nothing and gives the
    shapes. The logits must be (2, T, V) with V the vocabulary the model was built for
    (``built.vocab_size``: the data's, unless ``model_args.vocab_size`` raises it), the
    contract of a ``py:`` factory; else every run would fail or train a different model.

    Args:
        built: the model, built for real or on the meta device (:func:`build_meta_model`).
        data_vocab: the data's vocabulary size.
        source, key: where the model spec came from, for the error.

    Returns:
        True when checked; False when the forward could not tell: it cannot run on the
        meta device (a data-dependent operation; build the model for real to check it),
        or the host ran out of memory.

    Raises:
        SettingsError: the forward raised (for real), or its logits are not (2, T, V).
    """
    model, spec = built.model, built.spec
    first = next(itertools.chain(model.parameters(), model.buffers()), None)
    device = first.device if first is not None else torch.device("cpu")
    x = torch.zeros((2, built.block_size), dtype=torch.long, device=device)  # (2, T)
    training = model.training
    model.eval()
    try:
        with torch.no_grad(), torch.random.fork_rng(devices=[]):
            out = model(x)
    except ConfigError as e:
        raise SettingsError.of(e) from None
    except (MemoryError, torch.OutOfMemoryError):
        return False
    except Exception as e:  # noqa: BLE001 - the model's own code: any error, as one line
        if device.type == "meta":
            return False
        raise SettingsError(f"model {spec!r}: its forward(idx) on a batch of shape {tuple(x.shape)} raised "
                            f"{one_line(e)}", source=source, key=key) from e
    finally:
        model.train(training)
    try:
        logits = output_logits(out, model, x)  # (2, T, V)
    except TypeError as e:
        raise SettingsError(f"model {spec!r}: {e}", source=source, key=key) from None
    want = built.vocab_size if is_int(built.vocab_size) else data_vocab
    if logits.size(-1) != want:
        whose = "the data's" if want == data_vocab else f"model_args.vocab_size; the data's is {data_vocab}"
        raise SettingsError(
            f"model {spec!r}: forward(idx) returned logits of shape {tuple(logits.shape)}, expected "
            f"{(*x.shape, want)}: their last dimension must be the vocabulary it was built for "
            f"(vocab_size={want}, {whose})", source=source, key=key)
    return True


_Build = Callable[[], BuiltModel]
"""What ``_plan_*`` return: the checked spec, built on call."""


def _plan(spec: Any, vocab_size: int, block_size: int | None, model_args: dict[str, Any],
          for_data: bool = True) -> _Build:
    build = _plan_kind(spec, vocab_size, block_size, model_args, for_data)

    def build_and_warn() -> BuiltModel:
        built = build()
        if built.qk_source is None:
            built.warnings.append(
                f"model {spec!r}: the attention probes cannot capture the queries and keys of "
                f"{type(built.model).__name__}: {why_no_qk_source(built.model)}; its runs report no "
                "attention logits and the logit-growth pruner has no signal")
        for line in built.warnings:
            _warn_once(line)
        return built
    return build_and_warn


_WARNED: set[str] = set()


def _warn_once(line: str) -> None:
    """Log ``line`` as a warning the first time this process sees it (one line on stderr
    when logging is not configured)."""
    if line not in _WARNED:
        _WARNED.add(line)
        logging.getLogger("geosearch").warning(line)


def _plan_kind(spec: Any, vocab_size: int, block_size: int | None, model_args: dict[str, Any],
               for_data: bool = True) -> _Build:
    if not isinstance(spec, str):
        raise ConfigError(f"a model spec must be a string, got {spec!r}", source=_SOURCE, key="model",
                          allowed=model_spec_names())
    if spec in PRESETS:
        return _plan_preset(spec, vocab_size, block_size, model_args)
    if spec.startswith(HF_PREFIX):
        try:
            return _plan_hf(spec, vocab_size, block_size, model_args, for_data)
        except GeosearchError:
            raise
        except Exception as e:  # noqa: BLE001 - the family's own config code, as one line
            why = LEFT_OUT.get(spec[len(HF_PREFIX):])
            note = " (so `geosearch inspect --models` leaves it out)" if why else ""
            raise ConfigError(f"model {spec!r} cannot be configured: {one_line(e)}{note}",
                              source=_SOURCE, key="model") from None
    if spec.startswith(PY_PREFIX):
        return plan_py(spec, vocab_size, block_size, model_args)
    raise ConfigError(f"unknown model {spec!r}", source=_SOURCE, key="model", allowed=model_spec_names())


FAR_VOCAB_FACTOR = 4
FAR_VOCAB_ROWS = 1_024
"""A vocabulary a model takes from its ``config.json`` is far from the data's when it is more
than :data:`FAR_VOCAB_FACTOR` times as large and more than :data:`FAR_VOCAB_ROWS` ids larger
(a checkpoint's 151,936 on bytes' 256): :func:`_far_vocab_warning` warns. Padding (nanoGPT's
50,257 to 50,304) and a tokenizer a few times smaller than the model's are not far."""


def _far_vocab_warning(spec: str, data_vocab: int, config: Any) -> str | None:
    """The warning for a Hugging Face config whose ``vocab_size`` is far from the data's
    (:data:`FAR_VOCAB_FACTOR`, :data:`FAR_VOCAB_ROWS`), or None: the embedding and output
    head rows the data never uses cost memory and time every step."""
    model_vocab = getattr(config, "vocab_size", None)
    if not is_int(model_vocab) or not (model_vocab > FAR_VOCAB_FACTOR * data_vocab
                                       and model_vocab - data_vocab > FAR_VOCAB_ROWS):
        return None
    unused, width = model_vocab - data_vocab, getattr(config, "hidden_size", None)
    tied = getattr(config, "tie_word_embeddings", True) is not False
    rows = (f"the embedding, shared with the output head, holds {unused:,} rows" if tied else
            f"the embedding and the output head hold {unused:,} rows each")
    if is_int(width):
        rows += f" of width {width:,} ({unused * width * (1 if tied else 2):,} parameters)"
    ratio = model_vocab / data_vocab
    times = f"{ratio:.1f}" if ratio < 10 else f"{int(ratio):,}"
    return (f"model {spec!r}: its config's vocab_size {model_vocab:,} is {times}x the data's "
            f"{data_vocab:,}: {rows} the data never uses, paid in memory and time every step; "
            f"--model-arg vocab_size={data_vocab} (proxy.model_args.vocab_size) builds it for the data")


# presets ---------------------------------------------------------------------------
def _plan_preset(spec: str, vocab_size: int, block_size: int | None, model_args: dict[str, Any]) -> _Build:
    base = {"vocab_size": vocab_size, **({"block_size": block_size} if block_size is not None else {})}
    try:
        config = make_config(spec, **{**base, **model_args})
    except ConfigError as e:
        raise ConfigError(f"model {spec!r}: {e.problem}", source=_SOURCE, key=f"model_args.{e.key}",
                          allowed=e.allowed) from None
    check_vocab(spec, vocab_size, config.vocab_size)

    def build() -> BuiltModel:
        return BuiltModel(GPT(config), spec, "nanogpt", "nanogpt", config.block_size, config.vocab_size,
                          "nanogpt", dataclasses.asdict(config))
    return build


# Hugging Face ----------------------------------------------------------------------
def _transformers(spec: str) -> Any:
    try:
        import transformers
    except ImportError:
        raise ConfigError(f"model {spec!r} needs Hugging Face transformers, which is not installed; "
                          "install it with: pip install 'geosearch[hf]'", source=_SOURCE, key="model") from None
    return transformers


def hf_config_fields(name: str) -> list[str]:
    """The ``model_args`` keys ``hf:<name>`` accepts: its config's fields, their aliases,
    ``block_size`` and ``attn_implementation`` (``eager``, ``sdpa``, ...). ``name`` is a
    family of :data:`HF_MODELS`, another model type, or a directory holding ``config.json``."""
    return _hf_fields(HF_MODELS.get(name) or _hf_source(HF_PREFIX + name))


def _hf_source(spec: str) -> HFSource:
    return hf_source(spec, spec[len(HF_PREFIX):], _transformers(spec), model_spec_names())


def _hf_fields(where: HFFamily | HFSource) -> list[str]:
    if isinstance(where, HFFamily):
        config_class = getattr(_transformers(where.config_class), where.config_class)
        fields = set(default_config(config_class).to_dict())
    else:
        config_class, fields = where.config_class, set(where.fields)
    keys = (fields - _HF_INTERNAL) | set(getattr(config_class, "attribute_map", {}))
    return sorted(keys | {"block_size", "attn_implementation"})


def _plan_hf(spec: str, vocab_size: int, block_size: int | None, model_args: dict[str, Any],
             for_data: bool = True) -> _Build:
    """``hf:<family>`` (:data:`HF_MODELS`), ``hf:<model_type>`` or ``hf:PATH``
    (:mod:`geosearch.models.hf_configs`): check the arguments, make the config; ``for_data``:
    warn when ``vocab_size`` (the data's) is far below ``hf:PATH``'s own."""
    name = spec[len(HF_PREFIX):]
    transformers = _transformers(spec)
    family = HF_MODELS.get(name)
    source = None if family is not None else _hf_source(spec)
    config_class = getattr(transformers, family.config_class) if family else source.config_class
    label = family.config_class if family else source.label
    block_field = family.block_field if family else source.block_field
    args, context = checked_args(spec, model_args, _hf_fields(family or source), label, config_class, block_field)
    kwargs, size_fields = _hf_kwargs(family, source, args, vocab_size, block_size, block_field)
    check_sizes(spec, kwargs, size_fields)
    config = make_hf_config(spec, label, config_class, kwargs)
    check_vocab(spec, vocab_size, getattr(config, "vocab_size", None))
    # a directory's config.json keeps its checkpoint's vocabulary unless model_args set one
    far = _far_vocab_warning(spec, vocab_size, config) if for_data and source is not None \
        and source.directory and "vocab_size" not in args else None
    check_heads(spec, config, "head_dim" in args or "head_dim" in (source.base if source else {}))
    if context is None and block_field is not None:
        context = int(getattr(config, block_field))
        if source is not None and source.directory and block_field not in args and not block_size:
            context = min(context, DEFAULT_BLOCK_SIZE)  # config.json's positions: the model's reach
    context = context or block_size or DEFAULT_BLOCK_SIZE

    def build() -> BuiltModel:
        model_class = family.model_class if family else source.model_class
        kind = name if family is not None else source.model_type
        try:
            model = getattr(transformers, model_class)(config)
        except (TypeError, ValueError) as e:
            raise ConfigError(f"model {spec!r}: {model_class} rejected its config: {e}",
                              source=_SOURCE, key="model_args") from None
        except GeosearchError:
            raise
        except Exception as e:  # noqa: BLE001 - the family's own code: any error, as one line
            if torch.empty(0).is_meta:  # build_meta_model builds it again on the CPU
                raise
            raise ConfigError(f"model {spec!r} (family {kind}) cannot be built: {one_line(e)}",
                              source=_SOURCE, key="model") from e
        _check_forward(spec, kind, model, int(config.vocab_size))
        rules = family.rules if family is not None else model_rules(model)
        return BuiltModel(model, spec, kind, rules, int(context), int(config.vocab_size), detect_qk_source(model),
                          plain(config.to_diff_dict()), warnings=[far] if far else [])
    return build


FORWARD_CHECK_TOKENS = 8
"""Tokens per sequence of the forward pass every Hugging Face model is checked by when built."""


def _check_forward(spec: str, kind: str, model: nn.Module, vocab: int) -> None:
    """One forward pass of a freshly built Hugging Face model (2 sequences of
    :data:`FORWARD_CHECK_TOKENS` tokens, no gradients, the random state kept), so that a
    family its shrunk config does not suit fails here, in one line naming the family and the
    reason, not at a run's first step. Nothing is checked on the meta device."""
    first = next(itertools.chain(model.parameters(), model.buffers()), None)
    if first is None or first.device.type == "meta":
        return
    x = torch.arange(2 * FORWARD_CHECK_TOKENS, device=first.device).reshape(2, -1) % vocab  # (2, T)
    training = model.training
    model.eval()
    try:
        with torch.no_grad(), torch.random.fork_rng(devices=[]):
            output_logits(model(x), model, x)
    except (MemoryError, torch.OutOfMemoryError):
        return
    except Exception as e:  # noqa: BLE001 - the family's own code: any error, as one line
        raise ConfigError(f"model {spec!r} (family {kind}) does not run at this size: its forward pass "
                          f"raised {one_line(e)}", source=_SOURCE, key="model_args") from e
    finally:
        model.train(training)


def _hf_kwargs(family: HFFamily | None, source: HFSource | None, args: dict[str, Any], vocab_size: int,
               block_size: int | None, block_field: str | None) -> tuple[dict[str, Any], tuple[str, ...] | list[str]]:
    """The config's keyword arguments (the defaults, the proxy's sizes, ``args``) and its size fields."""
    if family is not None:
        kwargs = {**family.defaults, family.block_field: block_size or DEFAULT_BLOCK_SIZE,
                  "vocab_size": vocab_size, "use_cache": False, **args}
        return kwargs, family.size_fields
    own = {block_field: block_size or DEFAULT_BLOCK_SIZE} if block_field else {}
    if source.directory:  # a directory's config.json, as written; T the proxy's unless given
        own = {block_field: block_size} if block_field and block_size else {}
        kwargs = {**directory_kwargs(source, args), **own, **args}
    else:
        kwargs = {**small_kwargs(source, args), "vocab_size": vocab_size, **own, **args}
    return kwargs, [f for f in (*map(source.real_name, SIZE_FIELDS), block_field) if f in kwargs]
