"""Name rules: which parameter of a model is which module type.

A *rule set* is a tuple of :class:`ModuleRule`, one per module type, each a regular
expression over full parameter names (``model.named_parameters()``). Rule sets live in
the :data:`RULE_SETS` registry; adding a model family is one entry there (or one
:func:`register_rule_set` call).

A rule may match a 3-D *expert stack* (``[experts, out, in]``: the experts of a
mixture-of-experts layer in current ``transformers``, one matrix per expert): each expert's
matrix is a weight of the rule's type, and ``layout`` and ``split`` speak of that matrix.

A rule may describe a *fused* weight (nanoGPT's ``attn.c_attn`` stacks Q, K and V):
``split=("attn_q", "attn_k", "attn_v")`` cuts it into equal blocks along its output
dimension, and each block is its own module type. ``layout`` says where that output
dimension is: ``"out_in"`` for ``nn.Linear`` (weight is ``(out, in)``, blocks along dim 0)
and ``"in_out"`` for Hugging Face ``Conv1D`` (weight is ``(in, out)``, blocks along dim 1).

Example:
    >>> rules = get_rule_set("nanogpt_split")
    >>> module_types(rules)
    ['attn_q', 'attn_k', 'attn_v', 'attn_out', 'mlp_in', 'mlp_out']
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from geosearch.rules.rule import (  # noqa: F401 - public here
    FAMILIES,
    LAYOUTS,
    RULE_KEYS,
    ModuleRule,
    rule_from_mapping,
    rule_to_mapping,
)
from geosearch.rules.fused import FusedQKV, fused_qkv_layout, qkv_split_problem  # noqa: F401 - public here
from geosearch.util.errors import ConfigError, unknown_name

if TYPE_CHECKING:  # pragma: no cover - torch is imported where a model is matched
    from torch import nn

# Module names that usually hold an output (LM) head; one of the checks in
# `_embedding_and_head_ids` that keep heads out of the "unassigned hidden weight" list.
_HEAD_NAMES = frozenset({"lm_head", "embed_out", "output", "head"})


# --------------------------------------------------------------------------- registry
def _rule(type_: str, pattern: str, family: str, **kw) -> ModuleRule:
    return ModuleRule(type_, pattern, family, **kw)


_LLAMA_ATTENTION = (
    _rule("attn_q", r"(^|\.)self_attn\.q_proj\.weight$", "attn"),
    _rule("attn_k", r"(^|\.)self_attn\.k_proj\.weight$", "attn"),
    _rule("attn_v", r"(^|\.)self_attn\.v_proj\.weight$", "attn"),
    _rule("attn_out", r"(^|\.)self_attn\.o_proj\.weight$", "attn"),
)

_ROUTED_EXPERTS = (
    _rule("moe_gate_up", r"(^|\.)mlp\.experts\.gate_up_proj$", "mlp", split=("moe_gate", "moe_in")),
    _rule("moe_out", r"(^|\.)mlp\.experts\.down_proj$", "mlp"),
)
"""An MoE layer's expert stacks as current transformers stores them: gate and up fused
(cut into two blocks), down on its own."""


RULE_SETS: dict[str, tuple[ModuleRule, ...]] = {
    # nanoGPT (Karpathy) / geosearch.models.model.GPT: nn.Linear everywhere. The fused QKV
    # weight is one module type, as in the reference study.
    "nanogpt": (
        _rule("attn_qkv", r"(^|\.)attn\.c_attn\.weight$", "attn"),
        _rule("attn_out", r"(^|\.)attn\.c_proj\.weight$", "attn"),
        _rule("mlp_in", r"(^|\.)mlp\.c_fc\.weight$", "mlp"),
        _rule("mlp_out", r"(^|\.)mlp\.c_proj\.weight$", "mlp"),
    ),
    # The same model with Q, K and V as separate module types (blocks of c_attn's rows).
    "nanogpt_split": (
        _rule("attn_qkv", r"(^|\.)attn\.c_attn\.weight$", "attn", split=("attn_q", "attn_k", "attn_v")),
        _rule("attn_out", r"(^|\.)attn\.c_proj\.weight$", "attn"),
        _rule("mlp_in", r"(^|\.)mlp\.c_fc\.weight$", "mlp"),
        _rule("mlp_out", r"(^|\.)mlp\.c_proj\.weight$", "mlp"),
    ),
    # Hugging Face GPT-2 (``GPT2LMHeadModel``, ``--model hf:gpt2``): nanoGPT's names, but
    # every hidden weight is a ``Conv1D`` stored as (in, out).
    "gpt2": (
        _rule("attn_qkv", r"(^|\.)attn\.c_attn\.weight$", "attn", layout="in_out"),
        _rule("attn_out", r"(^|\.)attn\.c_proj\.weight$", "attn", layout="in_out"),
        _rule("mlp_in", r"(^|\.)mlp\.c_fc\.weight$", "mlp", layout="in_out"),
        _rule("mlp_out", r"(^|\.)mlp\.c_proj\.weight$", "mlp", layout="in_out"),
    ),
    # HF GPT-2 with Q, K and V as separate module types: blocks of c_attn's *columns*.
    "gpt2_split": (
        _rule("attn_qkv", r"(^|\.)attn\.c_attn\.weight$", "attn", split=("attn_q", "attn_k", "attn_v"),
              layout="in_out"),
        _rule("attn_out", r"(^|\.)attn\.c_proj\.weight$", "attn", layout="in_out"),
        _rule("mlp_in", r"(^|\.)mlp\.c_fc\.weight$", "mlp", layout="in_out"),
        _rule("mlp_out", r"(^|\.)mlp\.c_proj\.weight$", "mlp", layout="in_out"),
    ),
    # Hugging Face LLaMA (``LlamaForCausalLM``, ``--model hf:llama``) and the models that
    # share its names (Mistral, Qwen2, ...): separate Q, K, V projections (K and V are
    # narrower under grouped-query attention) and a SwiGLU MLP
    # ``down_proj(silu(gate_proj(x)) * up_proj(x))``. ``up_proj`` is ``mlp_in`` (the
    # linear path into the hidden width, as GPT-2's ``c_fc``); the gate is its own type,
    # ``mlp_gate``; ``mlp=`` reaches all three MLP weights.
    "llama": (
        *_LLAMA_ATTENTION,
        _rule("mlp_gate", r"(^|\.)mlp\.gate_proj\.weight$", "mlp"),
        _rule("mlp_in", r"(^|\.)mlp\.up_proj\.weight$", "mlp"),
        _rule("mlp_out", r"(^|\.)mlp\.down_proj\.weight$", "mlp"),
    ),
    # Mixture-of-experts families of transformers 5 (Mixtral, Qwen3-MoE, OLMoE: LLaMA's
    # attention; Qwen2-MoE adds a shared expert; DeepSeek V2/V3 and GPT-OSS below). The
    # experts of a layer are 3-D stacks [experts, out, in]; ``gate_up_proj`` holds each
    # expert's gate and up matrices as whole blocks (``.chunk(2, dim=-1)``): ``moe_gate``
    # and ``moe_in``; ``down_proj`` is ``moe_out``. The router ``mlp.gate`` is ``router``
    # (family ``routing``: AdamW unless an assignment names it).
    "mixtral": (
        *_LLAMA_ATTENTION,
        *_ROUTED_EXPERTS,
        _rule("router", r"(^|\.)mlp\.gate\.weight$", "routing", default="adamw"),
    ),
    "qwen2_moe": (
        *_LLAMA_ATTENTION,
        _rule("mlp_gate", r"(^|\.)mlp\.shared_expert\.gate_proj\.weight$", "mlp"),
        _rule("mlp_in", r"(^|\.)mlp\.shared_expert\.up_proj\.weight$", "mlp"),
        _rule("mlp_out", r"(^|\.)mlp\.shared_expert\.down_proj\.weight$", "mlp"),
        *_ROUTED_EXPERTS,
        _rule("router", r"(^|\.)mlp\.(gate|shared_expert_gate)\.weight$", "routing", default="adamw"),
    ),
    # DeepSeek V2/V3: multi-head latent attention (queries through a low-rank q_a -> q_b,
    # keys and values through kv_a (with the shared rotary key) -> kv_b), dense MLPs in the
    # first layers, then routed experts and shared experts.
    "deepseek": (
        _rule("attn_q_a", r"(^|\.)self_attn\.q_a_proj\.weight$", "attn"),
        _rule("attn_q", r"(^|\.)self_attn\.q_b_proj\.weight$", "attn"),
        _rule("attn_kv_a", r"(^|\.)self_attn\.kv_a_proj_with_mqa\.weight$", "attn"),
        _rule("attn_kv", r"(^|\.)self_attn\.kv_b_proj\.weight$", "attn"),
        _rule("attn_out", r"(^|\.)self_attn\.o_proj\.weight$", "attn"),
        _rule("mlp_gate", r"(^|\.)mlp\.(shared_experts\.)?gate_proj\.weight$", "mlp"),
        _rule("mlp_in", r"(^|\.)mlp\.(shared_experts\.)?up_proj\.weight$", "mlp"),
        _rule("mlp_out", r"(^|\.)mlp\.(shared_experts\.)?down_proj\.weight$", "mlp"),
        *_ROUTED_EXPERTS,
        _rule("router", r"(^|\.)mlp\.gate\.weight$", "routing", default="adamw"),
    ),
    # GPT-OSS: experts stored [experts, in, out] (``x @ W``), gate and up interleaved
    # column by column (``[..., ::2]``, ``[..., 1::2]``): one type, not cut into blocks.
    "gpt_oss": (
        *_LLAMA_ATTENTION,
        _rule("moe_gate_up", r"(^|\.)mlp\.experts\.gate_up_proj$", "mlp", layout="in_out"),
        _rule("moe_out", r"(^|\.)mlp\.experts\.down_proj$", "mlp", layout="in_out"),
        _rule("router", r"(^|\.)mlp\.router\.weight$", "routing", default="adamw"),
    ),
}


STACKED, PER_MATRIX = "stacked", "per-matrix"
"""How the attention geometry applies: to the fused ``[Q; K; V]`` matrix as one (the
reference study's "Stiefel attention": QᵀQ + KᵀK + VᵀV = I, each block's singular values
about 1/√3) or to each projection on its own (QᵀQ = KᵀK = VᵀV = I)."""

ATTENTION_SIBLINGS = {"nanogpt": "nanogpt_split", "nanogpt_split": "nanogpt", "gpt2": "gpt2_split",
                      "gpt2_split": "gpt2"}
"""Rule sets that differ only in the attention layout: the stacked one and its per-matrix twin."""


def attention_layout(rules: str | Sequence[ModuleRule]) -> str | None:
    """:data:`STACKED` when an attention rule constrains a fused Q/K/V weight as one matrix
    (a fused ``attn_qkv`` without ``split``), :data:`PER_MATRIX` when Q, K and V are
    separate module types (separate weights, or blocks of a split one); None without them."""
    rules = get_rule_set(rules) if isinstance(rules, str) else rules
    attn = [r for r in rules if r.family == "attn"]
    if any(r.type == "attn_qkv" and not r.split for r in attn):
        return STACKED
    types = {t for r in attn for t in r.types}
    return PER_MATRIX if {"attn_q", "attn_k"} <= types else None


def attention_variant(name: str, layout: str) -> str:
    """The registered rule set for the same model as ``name`` with attention ``layout``.

    Raises:
        ConfigError: an unknown layout, or a model whose weights offer only one layout (a
            model with separate Q, K and V tensors cannot constrain them as one stack).
    """
    if layout not in (STACKED, PER_MATRIX):
        raise ConfigError(f"unknown attention layout {layout!r}", key="attention", allowed=(STACKED, PER_MATRIX))
    if attention_layout(name) == layout:
        return name
    if name in ATTENTION_SIBLINGS:
        return ATTENTION_SIBLINGS[name]
    raise ConfigError(f"rule set {name!r} has {attention_layout(name) or 'no'} attention and no {layout} twin: "
                      "a stack is one tensor (a fused q/k/v weight), so only fused weights offer both",
                      key="attention", allowed=sorted(ATTENTION_SIBLINGS))


def rule_set_names() -> list[str]:
    """Names of the registered rule sets, sorted."""
    return sorted(RULE_SETS)


def get_rule_set(name: str) -> tuple[ModuleRule, ...]:
    """The rule set registered under ``name``.

    Raises:
        ConfigError: unknown name; the message lists the known ones.
    """
    if name not in RULE_SETS:
        raise unknown_name("rule set", name, RULE_SETS, key="rules")
    return RULE_SETS[name]


def register_rule_set(name: str, rules: Iterable[ModuleRule]) -> tuple[ModuleRule, ...]:
    """Add a rule set to the registry (checked with :func:`check_rules`).

    Raises:
        ConfigError: the name is taken, or the rules are inconsistent.
    """
    if name in RULE_SETS:
        raise ConfigError(f"rule set {name!r} is already registered", key="rules")
    rules = tuple(rules)
    check_rules(rules)
    RULE_SETS[name] = rules
    return rules


def empty_rule_error(match: MatchResult, model: str, *, source: str | None) -> ConfigError | None:
    """The error for the first rule of ``match`` that matched no parameter of ``model`` (a
    spec, for the message), or None when every rule matched something."""
    if not match.empty_rules:
        return None
    r = match.empty_rules[0]
    return ConfigError(f"rule {r.type!r} (pattern {r.pattern!r}) matches no parameter of the {model!r} model",
                       source=source, key="rules")


def check_rules(rules: Sequence[ModuleRule], *, source: str | None = None, key: str = "rules") -> None:
    """Check that a rule set is non-empty and gives every module type one name.

    Raises:
        ConfigError: no rules, or a module type (split blocks included) appears twice.
    """
    if not rules:
        raise ConfigError("a rule set needs at least one rule", source=source, key=key)
    seen: set[str] = set()
    for i, rule in enumerate(rules):
        names = rule.types + ((rule.type,) if rule.split else ())
        for t in names:
            if t in seen:
                raise ConfigError(f"module type {t!r} is defined twice", source=source, key=f"{key}[{i}]")
            if t in FAMILIES:
                raise ConfigError(f"module type {t!r} clashes with the family shorthand of that name",
                                  source=source, key=f"{key}[{i}]")
            seen.add(t)


def module_types(rules: Sequence[ModuleRule]) -> list[str]:
    """The module types that take a geometry, in rule order.

    A split rule contributes its block types (``attn_q, attn_k, attn_v``) instead of the
    fused type, since each block gets its own geometry.
    """
    return [t for rule in rules for t in rule.types]


def family_types(rules: Sequence[ModuleRule]) -> dict[str, list[str]]:
    """Family -> its module types (only families that the rules use)."""
    out: dict[str, list[str]] = {}
    for rule in rules:
        out.setdefault(rule.family, []).extend(rule.types)
    return out


# --------------------------------------------------------------------------- matching
@dataclass(frozen=True)
class ParamMatch:
    """A parameter and the rule that matched it."""

    name: str
    param: nn.Parameter
    rule: ModuleRule

    @property
    def types(self) -> tuple[str, ...]:
        """Module type of each block (one entry when the weight is not split)."""
        return self.rule.types


@dataclass
class MatchResult:
    """What :func:`match_parameters` found.

    Attributes:
        matched: parameters that a rule matched, in ``named_parameters()`` order.
        unmatched_hidden: names of 2-D parameters (and 3-D expert stacks) no rule matched
            that are neither embeddings nor an output head: hidden weights the rule set missed.
        empty_rules: rules that matched no parameter.
        rest: every parameter no rule matched, ``(name, param)``: embeddings, head, norms,
            biases (and the ``unmatched_hidden`` ones).
        embeddings: names of the parameters recognised as embeddings or output head.
    """

    matched: list[ParamMatch] = field(default_factory=list)
    unmatched_hidden: list[str] = field(default_factory=list)
    empty_rules: list[ModuleRule] = field(default_factory=list)
    rest: list[tuple[str, nn.Parameter]] = field(default_factory=list)
    embeddings: list[str] = field(default_factory=list)


def _embedding_and_head_ids(model: nn.Module) -> set[int]:
    """ids of the parameters that are embeddings or an output head (tied or not).

    Found by module type, not by name alone: every ``nn.Embedding``/``nn.EmbeddingBag``
    weight (a tied head shares it, so it is covered too); a Hugging Face model's
    ``get_output_embeddings()``; and an untied head, i.e. a 2-D module weight outside the
    layer stack (no numeric index in its name, unlike ``h.0.mlp.c_fc``) whose output size
    is an embedding's vocabulary size or whose module has a usual head name (``lm_head``,
    ``output``...).
    """
    from torch import nn  # here: rules and rule sets are read without torch

    ids: set[int] = set()
    vocab_sizes: set[int] = set()
    for module in model.modules():
        if isinstance(module, (nn.Embedding, nn.EmbeddingBag)):
            ids.add(id(module.weight))
            vocab_sizes.add(module.weight.shape[0])
    get_out = getattr(model, "get_output_embeddings", None)
    if callable(get_out):
        try:
            head = get_out()
        except (NotImplementedError, AttributeError, TypeError):
            head = None
        if isinstance(getattr(head, "weight", None), nn.Parameter):
            ids.add(id(head.weight))
    for mod_name, module in model.named_modules():
        w = getattr(module, "weight", None)
        if not isinstance(w, nn.Parameter) or w.dim() != 2:
            continue
        parts = mod_name.split(".")
        if any(part.isdigit() for part in parts):
            continue  # inside a stack of layers: a hidden weight
        out_dim = w.shape[1] if _module_kind(module) == "in_out" else w.shape[0]
        if out_dim in vocab_sizes or parts[-1] in _HEAD_NAMES:
            ids.add(id(w))
    return ids


def _module_kind(module: nn.Module | None) -> str | None:
    """The layout a module's weight is known to have, or None when unknown."""
    from torch import nn  # here: rules and rule sets are read without torch

    if isinstance(module, nn.Linear):
        return "out_in"
    if module is not None and type(module).__name__ == "Conv1D":  # transformers.pytorch_utils
        return "in_out"
    return None


def match_parameters(model: nn.Module, rules: Sequence[ModuleRule] | str) -> MatchResult:
    """Match every parameter of ``model`` against ``rules``.

    Shared (tied) parameters are seen once, under their first name, as in
    ``model.named_parameters()``.

    Args:
        model: any ``nn.Module``.
        rules: a rule sequence, or the name of a registered rule set.

    Returns:
        A :class:`MatchResult`.

    Raises:
        ConfigError: a parameter matches two rules; a rule matches a parameter that is not
            2-D; a split weight's output dimension does not divide into its blocks; a rule's
            layout contradicts the module holding the weight (``nn.Linear`` is ``out_in``,
            ``Conv1D`` is ``in_out``).
    """
    if isinstance(rules, str):
        rules = get_rule_set(rules)
    compiled = [(rule, re.compile(rule.pattern)) for rule in rules]
    modules = dict(model.named_modules())
    head_ids = _embedding_and_head_ids(model)
    hits = {rule: 0 for rule in rules}
    result = MatchResult()
    for name, param in model.named_parameters():
        found = [rule for rule, rx in compiled if rx.search(name)]
        if len(found) > 1:
            raise ConfigError(f"parameter {name!r} matches several rules: "
                              + ", ".join(f"{r.type} ({r.pattern})" for r in found), key="rules")
        if not found:
            result.rest.append((name, param))
            if id(param) in head_ids:
                result.embeddings.append(name)
            elif name.endswith("bias"):  # per-expert biases, (experts, out)
                pass
            elif param.dim() == 2 or (param.dim() == 3 and "expert" in name):  # a stack of experts
                result.unmatched_hidden.append(name)
            continue
        rule = found[0]
        owner_name = name.rpartition(".")[0]
        _check_match(name, param, rule, modules.get(owner_name), modules.get(owner_name.rpartition(".")[0]))
        hits[rule] += 1
        result.matched.append(ParamMatch(name, param, rule))
    result.empty_rules = [rule for rule in rules if hits[rule] == 0]
    return result


def _check_match(name: str, param: nn.Parameter, rule: ModuleRule, owner: nn.Module | None,
                 attention: nn.Module | None) -> None:
    if param.dim() not in (2, 3):
        raise ConfigError(f"rule {rule.type!r} (pattern {rule.pattern!r}) matches {name!r} of shape "
                          f"{tuple(param.shape)}; rules must match 2-D weights only, or 3-D stacks of "
                          r"expert matrices (anchor the pattern with '\.weight$')", key="rules")
    kind = _module_kind(owner) if param.dim() == 2 else None
    if kind is not None and kind != rule.layout:
        raise ConfigError(f"rule {rule.type!r} says layout {rule.layout!r} but {name!r} belongs to a "
                          f"{type(owner).__name__}, whose weight is {kind!r}; use a rule set for this "
                          "model family", key="rules", allowed=rule_set_names())
    if rule.split:
        out = param.shape[param.dim() - 2 + rule.split_dim]  # of each expert's matrix, for a stack
        if out % len(rule.split):
            raise ConfigError(f"{name!r} has {out} outputs (dim {rule.split_dim}), which do not split "
                              f"into {len(rule.split)} equal blocks {', '.join(rule.split)}", key="rules")
        leaf = name.split(".")[-2] if "." in name else ""
        problem = qkv_split_problem(attention, leaf, out) if rule.family == "attn" and len(rule.split) == 3 else None
        if problem is not None:
            raise ConfigError(f"rule {rule.type!r} cuts {name!r} ({out} outputs) into 3 equal blocks of "
                              f"{out // 3}, but {problem}: keep it one module type (a rule without split)",
                              key="rules")
