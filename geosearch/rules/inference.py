"""Rules read off a model's module names, for models no registered rule set fits.

A Hugging Face family that geosearch has no rule set for (``hf:phi3``, ``hf:gpt_neox``,
``hf:PATH``) still names its weights the way the field does: ``q_proj``/``k_proj``/
``v_proj``/``o_proj``, ``gate_proj``/``up_proj``/``down_proj``, fused ``c_attn``,
``qkv_proj``, ``query_key_value`` or ``gate_up_proj``, ``fc1``/``fc2``, ``dense`` inside an
attention block. :func:`infer_rules` turns those names into a rule set with the module types
of the registered ones (``attn_q``, ``attn_k``, ``attn_v``, ``attn_qkv``, ``attn_out``,
``mlp_gate``, ``mlp_in``, ``mlp_out``), the layout of the module that holds each weight
(``nn.Linear``: ``out_in``, ``Conv1D``: ``in_out``), and a ``split`` for fused weights whose
blocks are stacked whole (``c_attn``, ``qkv_proj``, ``Wqkv``, ``W_pack``: ``[Q | K | V]``
when the attention module's head counts make the three equally wide; ``gate_up_proj``:
``[gate | up]``). Weights stored per
head interleaved (``query_key_value`` of GPT-NeoX, Falcon, BLOOM) stay one type,
``attn_qkv``. :func:`model_rules` picks a model's rules: the first registered rule set that
fits it (:func:`rules_fit`), else the inferred ones.

Example:
    >>> rules = infer_rules(model)            # e.g. Phi3ForCausalLM
    >>> module_types(rules)
    ['attn_q', 'attn_k', 'attn_v', 'attn_out', 'mlp_gate', 'mlp_in', 'mlp_out']
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TYPE_CHECKING

from geosearch.util.errors import ConfigError
from geosearch.rules.modules import (
    ModuleRule,
    _embedding_and_head_ids,
    _module_kind,
    check_rules,
    fused_qkv_layout,
    match_parameters,
    qkv_split_problem,
    rule_set_names,
)

if TYPE_CHECKING:  # pragma: no cover
    from torch import nn

__all__ = ["infer_rules", "model_rules", "rules_fit"]

# Module (leaf) name -> module type, wherever the module sits.
_LEAF_TYPES: dict[str, str] = {
    **dict.fromkeys(("q_proj", "query", "wq", "q_lin"), "attn_q"),
    **dict.fromkeys(("k_proj", "key", "wk", "k_lin"), "attn_k"),
    **dict.fromkeys(("v_proj", "value", "wv", "v_lin"), "attn_v"),
    **dict.fromkeys(("c_attn", "qkv_proj", "Wqkv", "W_pack", "query_key_value"), "attn_qkv"),
    **dict.fromkeys(("o_proj", "out_lin"), "attn_out"),
    "q_a_proj": "attn_q_a", "q_b_proj": "attn_q",  # multi-head latent attention (DeepSeek)
    "kv_a_proj_with_mqa": "attn_kv_a", "kv_a_proj": "attn_kv_a", "kv_b_proj": "attn_kv",
    **dict.fromkeys(("gate_proj", "w1"), "mlp_gate"),  # w1, w3, w2: LLaMA's reference code
    **dict.fromkeys(("up_proj", "c_fc", "fc1", "fc_in", "dense_h_to_4h", "w3"), "mlp_in"),
    **dict.fromkeys(("down_proj", "fc2", "fc_out", "dense_4h_to_h", "w2"), "mlp_out"),
    **dict.fromkeys(("gate_up_proj", "input_linear"), "mlp_gate_up"),  # [gate | up] (Granite's input_linear)
    "output_linear": "mlp_out",
}
# Names whose type depends on the block they sit in: (inside attention, inside the MLP).
_CONTEXT_TYPES: dict[str, tuple[str | None, str | None]] = {
    "c_proj": ("attn_out", "mlp_out"), "dense": ("attn_out", None), "wo": ("attn_out", "mlp_out"),
    "proj": ("attn_out", None), "out_proj": ("attn_out", None), "q": ("attn_q", None), "k": ("attn_k", None), "v": ("attn_v", None),
    "o": ("attn_out", None), "g_proj": ("attn_gate", None), "output_gate": ("attn_gate", None),
}
_ATTN_WORDS, _MLP_WORDS = ("attn", "attention"), ("mlp", "ffn", "feed_forward", "feedforward", "moe", "expert")
_MIXER_WORDS = (*_ATTN_WORDS, "mamba", "mixer", "temporal_block", "linear_attn")
"""Blocks that mix tokens (attention, linear attention, state-space layers): a weight inside
one that no name says more about is ``attn_other`` (family ``attn``)."""
# Fused weights whose blocks are stacked whole along the output dimension, and the blocks.
_CONTIGUOUS_SPLITS: dict[str, tuple[str, ...]] = {
    **dict.fromkeys(("c_attn", "qkv_proj", "Wqkv", "W_pack"), ("attn_q", "attn_k", "attn_v")),
    "gate_up_proj": ("mlp_gate", "mlp_in"),
}
_ORDER = ("attn_qkv", "attn_q_a", "attn_q", "attn_kv_a", "attn_kv", "attn_k", "attn_v", "attn_gate",
          "attn_out", "attn_other", "mlp_gate_up", "mlp_gate", "mlp_in", "mlp_out", "moe_gate_up",
          "moe_gate", "moe_in", "moe_out", "router")
"""Rule order of an inferred set: the registered sets' order (``llama``, ``mixtral``)."""
# Mixture of experts: a 3-D stack's (or a per-expert module's) name -> its module type.
_EXPERT_TYPES: dict[str, str] = {
    **dict.fromkeys(("gate_up_proj", "input_linear", "w13", "gate_up"), "moe_gate_up"),
    **dict.fromkeys(("gate_proj", "w1"), "moe_gate"),
    **dict.fromkeys(("up_proj", "w3", "fc1", "linear"), "moe_in"),
    **dict.fromkeys(("down_proj", "w2", "output_linear", "fc2", "linear_v"), "moe_out"),
}
_ROUTER_LEAVES = ("gate", "router", "shared_expert_gate", "gating_network")


def rules_fit(model: nn.Module, rules: str | Sequence[ModuleRule]) -> bool:
    """True when ``rules`` fit ``model``: each rule matches, no hidden weight is left out,
    and layouts agree with the modules (``nn.Linear`` / ``Conv1D``)."""
    try:
        match = match_parameters(model, rules)
    except ConfigError:
        return False
    return bool(match.matched) and not match.empty_rules and not match.unmatched_hidden


def model_rules(model: nn.Module) -> str | tuple[ModuleRule, ...] | None:
    """A model's default rules: the first registered rule set (by name) that fits it, else
    :func:`infer_rules`; None when neither finds a hidden weight."""
    for name in rule_set_names():
        if rules_fit(model, name):
            return name
    return infer_rules(model) or None


def infer_rules(model: nn.Module) -> tuple[ModuleRule, ...]:
    """Rules for the hidden weights of ``model`` whose module names say what they are.

    Embeddings and the output head are left out, and so are weights with an unknown name
    (they stay unmatched: AdamW, and ``geosearch inspect`` lists them). Each rule's pattern
    is the weight's name after its layer index (``(^|\\.)self_attn\\.q_proj\\.weight$``),
    or its whole name with ``\\d+`` for each index where that would be ambiguous.

    Returns:
        The rules in the registered sets' type order; empty when no name is known.
    """
    modules = dict(model.named_modules())
    all_names = [n for n, _ in model.named_parameters()]
    heads = _embedding_and_head_ids(model)
    moe = any("expert" in n for n in all_names)
    found: dict[str, list[tuple[str, nn.Module]]] = {}  # type -> [(parameter name, module)]
    layouts: dict[str, str] = {}
    for name, param in model.named_parameters():
        owner_name, _, leaf = name.rpartition(".")
        if (id(param) in heads or param.dim() not in (2, 3) or (param.dim() == 2 and leaf != "weight")
                or leaf.endswith("bias")):
            continue
        if param.dim() == 3:  # a stack of experts' matrices
            if "expert" not in name:
                continue
            stack = owner_name if leaf == "weight" else name
            type_ = _EXPERT_TYPES.get(stack.rpartition(".")[2])
            if type_ is not None:
                layouts[type_] = _stack_layout(modules.get(owner_name), stack.rpartition(".")[2], param, model)
        else:
            type_ = _type_of(owner_name, modules.get(owner_name), moe)
        if type_ is not None:
            found.setdefault(type_, []).append((name, modules[owner_name]))
    splits = {t: _split(t, entries, modules) for t, entries in found.items()}
    taken = set(found)
    rules = []
    for type_ in sorted(found, key=_ORDER.index):
        entries = found[type_]
        split = splits[type_]
        if split and (taken & set(split)) - {type_}:  # the blocks' types exist unfused too
            split = ()
        taken |= set(split)
        family = "attn" if type_.startswith("attn") else "routing" if type_ == "router" else "mlp"
        layout = layouts.get(type_) or _module_kind(entries[0][1]) or "out_in"
        rules.append(ModuleRule(type_, _pattern([n for n, _ in entries], all_names), family,
                                split=split, layout=layout, default="adamw" if type_ == "router" else None))
    rules = tuple(rules)
    if rules:
        check_rules(rules, source="inferred rules")
    return rules


def _type_of(module_name: str, module: nn.Module | None = None, moe: bool = False) -> str | None:
    """The module type a weight of module ``module_name`` gets, or None. In a mixture of
    experts (``moe``), a weight inside ``experts.<i>`` is an expert's, and a router's
    name or class (``gate``, ``router``, ``...Router``) makes it a ``router``."""
    parts = module_name.split(".")
    leaf = parts[-1]
    expert = _expert_type(parts, module) if moe else None
    if expert is not None:
        return expert
    if leaf in _LEAF_TYPES:
        return _LEAF_TYPES[leaf]
    positional = _positional_type(parts) if len(parts) > 1 else None
    if positional is not None:
        return positional
    if leaf in _CONTEXT_TYPES:
        in_attn, in_mlp = _CONTEXT_TYPES[leaf]
        for part in reversed(parts[:-1]):  # the innermost block that says what it is
            low = part.lower()
            if any(w in low for w in _ATTN_WORDS):
                return in_attn
            if any(w in low for w in _MLP_WORDS):
                return in_mlp
    for part in reversed(parts[:-1]):  # any other weight of a token-mixing block
        low = part.lower()
        if any(w in low for w in _MLP_WORDS):
            return None
        if any(w in low for w in _MIXER_WORDS) or low == "conv":  # LFM's short convolution block
            return "attn_other"
    return None


def _positional_type(parts: list[str]) -> str | None:
    """BERT's ``intermediate.dense`` / ``output.dense`` outside attention, and an MLP written as
    ``nn.Sequential`` (CTRL's ``ffn.0``, ``ffn.2``: the first layer in, any later one out)."""
    leaf, parent = parts[-1], parts[-2].lower()
    if leaf == "dense" and not any(w in p.lower() for p in parts for w in _ATTN_WORDS):
        return {"intermediate": "mlp_in", "output": "mlp_out"}.get(parent)
    if leaf.isdigit() and parent in _MLP_WORDS:
        return "mlp_in" if leaf == "0" else "mlp_out"
    return None


def _expert_type(parts: list[str], module: nn.Module | None) -> str | None:
    """In a mixture of experts: the type of a per-expert module's weight, ``router``, or None."""
    leaf = parts[-1]
    inside = [i for i, p in enumerate(parts[:-1]) if "expert" in p.lower() and parts[i + 1].isdigit()]
    if inside and leaf in _EXPERT_TYPES and "shared" not in parts[inside[-1]].lower():
        return _EXPERT_TYPES[leaf]
    cls = type(module).__name__.lower() if module is not None else ""
    named = leaf in _LEAF_TYPES or leaf in _CONTEXT_TYPES
    inside_router = len(parts) > 1 and parts[-2] in _ROUTER_LEAVES  # gate.wg, router.classifier
    if leaf in _ROUTER_LEAVES or inside_router or (not named and ("router" in cls or "gate" in cls)):
        return "router"
    return None


def _stack_layout(owner: nn.Module | None, leaf: str, param: nn.Parameter, model: nn.Module) -> str:
    """The layout of each expert's matrix in a 3-D stack: ``in_out`` when its module's forward
    multiplies by it from the right (``x @ self.<leaf>[e]``), ``out_in`` when it calls
    ``linear`` with it; else by the model's width (the input side of ``gate_up``/``in``, the
    output side of ``out``)."""
    source = _forward_source(owner)
    if f"@ self.{leaf}" in source:
        return "in_out"
    if "linear(" in source and f"self.{leaf}" in source:
        return "out_in"
    width = getattr(getattr(model, "config", None), "hidden_size", None)
    rows, cols = param.shape[-2:]
    into = _EXPERT_TYPES.get(leaf) != "moe_out"
    if isinstance(width, int) and (rows == width) != (cols == width):
        return "in_out" if (rows == width) == into else "out_in"
    return "out_in"


def _forward_source(module: nn.Module | None) -> str:
    import inspect

    try:
        return inspect.getsource(type(module).forward) if module is not None else ""
    except (OSError, TypeError):
        return ""


def _split(type_: str, entries: list[tuple[str, nn.Module]], modules: dict[str, nn.Module]) -> tuple[str, ...]:
    """The split of a fused type when every weight of it is stacked in equal whole blocks:
    for ``attn_qkv``, when the attention module's head counts say Q, K and V are equally wide
    and stacked whole (:func:`~geosearch.rules.modules.fused_qkv_layout`)."""
    if type_ == "moe_gate_up":  # each expert's [gate | up], cut by ``.chunk(2, dim=-1)``
        sources = {_forward_source(module) for _, module in entries}
        whole = all("chunk(2, dim=-1)" in src and "::2" not in src for src in sources)
        return ("moe_gate", "moe_in") if whole and all(m.dim() == 3 for m in _params(entries)) else ()
    leaves = {n.split(".")[-2] for n, _ in entries}
    if len(leaves) != 1 or next(iter(leaves)) not in _CONTIGUOUS_SPLITS:
        return ()
    leaf = next(iter(leaves))
    blocks = _CONTIGUOUS_SPLITS[leaf]
    for name, module in entries:
        layout = _module_kind(module) or "out_in"
        out_dim = module.weight.shape[1 if layout == "in_out" else 0]
        if out_dim % len(blocks):
            return ()
        if type_ == "attn_qkv":
            attention = modules.get(name.rsplit(".", 2)[0])
            if fused_qkv_layout(attention, leaf) is None or qkv_split_problem(attention, leaf, out_dim):
                return ()  # unknown heads, grouped-query or multi-query (K, V narrower), per head
    return blocks


def _params(entries: list[tuple[str, nn.Module]]) -> list:
    out = []
    for name, module in entries:
        p = dict(module.named_parameters(recurse=False)).get(name.rpartition(".")[2])
        if p is not None:
            out.append(p)
    return out


def _pattern(names: list[str], all_names: list[str]) -> str:
    """A regular expression matching exactly ``names`` among ``all_names``: their names
    after the layer index when that is enough, else their whole names."""
    chosen = set(names)
    others = [n for n in all_names if n not in chosen]
    pattern = _either(sorted({re.escape(_tail(n)) for n in names}), r"(^|\.)")
    if any(re.search(pattern, n) for n in others):
        pattern = _either(sorted({_generalise(n) for n in names}), "^")
    return pattern


def _either(alternatives: list[str], prefix: str) -> str:
    body = alternatives[0] if len(alternatives) == 1 else "(" + "|".join(alternatives) + ")"
    return f"{prefix}{body}$"


def _tail(name: str) -> str:
    """The part of a parameter name after its last numeric component (a layer index)."""
    parts = name.split(".")
    idx = max((i for i, p in enumerate(parts) if p.isdigit()), default=-1)
    return ".".join(parts[idx + 1:])


def _generalise(name: str) -> str:
    """``name`` as a regular expression with ``\\d+`` for each numeric component but the
    module's own name (``ffn.0`` of an ``nn.Sequential`` stays ``0``)."""
    parts = name.split(".")
    keep = len(parts) - 2 if parts[-1] in ("weight", "bias") else len(parts) - 1
    return r"\.".join(r"\d+" if p.isdigit() and i != keep else re.escape(p) for i, p in enumerate(parts))
