"""Attention roles: ``attn_qk`` (queries and keys) and ``attn_vo`` (values and the output).

The logit ``q·k`` grows with σ(W_Q)·σ(W_K), so the stability of attention is a query–key
property, while the values and the output projection carry what attention writes into the
residual stream. A *role* names the module types of one of these paths as one key of an
assignment or a search space (one categorical, one choice):

* ``attn_qk`` -> ``attn_q``, ``attn_k``;
* ``attn_vo`` -> ``attn_v``, ``attn_out``.

Roles need Q, K and V as module types of their own: separate projections (``llama`` and the
Hugging Face families read off their names) or the blocks of a split fused weight
(``nanogpt_split``, ``gpt2_split``). A role named on a rule set that keeps a fused weight
as one matrix (``nanogpt``, ``gpt2``) takes that rule set's per-matrix twin
(:func:`rules_for_roles`), since only there are Q and K apart. Precedence in an
assignment: a type's own entry, then its role's, then its family's. Torch-free.

Example:
    >>> role_types("llama")
    {'attn_qk': ['attn_q', 'attn_k'], 'attn_vo': ['attn_v', 'attn_out']}
    >>> rules_for_roles("nanogpt", ["attn_qk", "attn_vo", "mlp"])
    'nanogpt_split'
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from geosearch.rules.modules import (
    ATTENTION_SIBLINGS,
    PER_MATRIX,
    STACKED,
    ModuleRule,
    attention_layout,
    get_rule_set,
    module_types,
)
from geosearch.util.errors import ConfigError

__all__ = ["HEAD_TYPES", "ROLES", "role_of", "role_types", "rules_for_roles"]

ROLES: dict[str, tuple[str, ...]] = {"attn_qk": ("attn_q", "attn_k"),
                                     "attn_vo": ("attn_v", "attn_out")}
"""Role -> the module types it stands for."""

HEAD_TYPES = ("attn_q", "attn_k", "attn_v")
"""The module types whose output rows are blocks of ``head_dim``, one per head: the types
that take the ``per_head`` option."""


def _rules(rules: str | Sequence[ModuleRule]) -> Sequence[ModuleRule]:
    return get_rule_set(rules) if isinstance(rules, str) else rules


def role_types(rules: str | Sequence[ModuleRule]) -> dict[str, list[str]]:
    """Role -> its module types, for the roles whose types the rules all have (and which no
    rule uses as a type name of its own)."""
    types = module_types(_rules(rules))
    return {role: list(members) for role, members in ROLES.items()
            if role not in types and all(t in types for t in members)}


def role_of(rules: str | Sequence[ModuleRule]) -> dict[str, str]:
    """Module type -> its role, for the types a role of ``rules`` covers."""
    return {t: role for role, members in role_types(rules).items() for t in members}


def rules_for_roles(rules: str | Sequence[ModuleRule],
                    keys: Iterable[str]) -> str | Sequence[ModuleRule]:
    """The rules an assignment or space with these ``keys`` uses: ``rules`` itself, or, when a
    key is a role and ``rules`` constrains a fused Q/K/V weight as one matrix, its per-matrix
    twin (:data:`~geosearch.rules.modules.ATTENTION_SIBLINGS`).

    Raises:
        ConfigError: a role on a stacked rule set without a twin (custom rules: write a
            ``split`` for the fused weight).
    """
    named = [k for k in keys if k in ROLES]
    if not named or role_types(rules):
        return rules
    if attention_layout(_rules(rules)) == STACKED:
        if isinstance(rules, str) and rules in ATTENTION_SIBLINGS:
            return ATTENTION_SIBLINGS[rules]
        raise ConfigError(f"role {named[0]!r} needs Q, K and V as separate module types, and these "
                          "rules keep the fused q/k/v weight as one: give its rule "
                          "split: [attn_q, attn_k, attn_v]", key=named[0],
                          allowed=sorted(ATTENTION_SIBLINGS))
    return rules


def role_problem(rules: str | Sequence[ModuleRule], key: str) -> str:
    """``"; role ... stands for ..."``: why the role ``key`` is not a key of ``rules``, for an
    'unknown module type' message; ``""`` when ``key`` is no role."""
    if key not in ROLES:
        return ""
    split = attention_layout(_rules(rules)) == PER_MATRIX
    why = "some are missing" if split else "its attention is not cut into those types"
    return f"; role {key!r} stands for {', '.join(ROLES[key])}, and {why}"
