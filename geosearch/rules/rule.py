"""One name rule: :class:`ModuleRule` (which module type a weight is), its families and
layouts, and its mapping form in assignment and search-space files. Torch-free."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from geosearch.util.errors import ConfigError

__all__ = ["FAMILIES", "LAYOUTS", "RULE_KEYS", "ModuleRule", "rule_from_mapping", "rule_to_mapping"]

FAMILIES = ("attn", "mlp", "routing")
"""Families of module types; each is also a shorthand key in assignments (``attn=stiefel``).
``routing`` holds the routers of mixture-of-experts layers (type ``router``), which
``attn=``/``mlp=`` do not reach: they keep AdamW unless an assignment names them."""

LAYOUTS = {"out_in": 0, "in_out": 1}
"""Weight layout -> the dimension that holds the outputs (where fused blocks are stacked)."""

@dataclass(frozen=True)
class ModuleRule:
    """How to find one module type's weights by parameter name.

    Attributes:
        type: module type name, e.g. ``"attn_qkv"``; for a split rule, the fused weight's name.
        pattern: regular expression, ``re.search``-ed against the full parameter name.
            Anchor it to the weight (``r"\\.attn\\.c_attn\\.weight$"``): rules match 2-D
            weights only, biases go to AdamW.
        family: ``"attn"`` or ``"mlp"``; the assignment shorthands ``attn=`` / ``mlp=`` reach
            every type of that family.
        split: when set, the weight is cut into ``len(split)`` equal blocks along its output
            dimension, block ``i`` being module type ``split[i]``.
        layout: ``"out_in"`` (``nn.Linear``) or ``"in_out"`` (Hugging Face ``Conv1D``).
        default: the geometry the type takes when an assignment names neither it nor its
            family (``"adamw"`` for routers); None: an assignment must name it.
    """

    type: str
    pattern: str
    family: str
    split: tuple[str, ...] = ()
    layout: str = "out_in"
    default: str | None = None

    def __post_init__(self) -> None:
        # Tuples keep the rule hashable whatever sequence the caller passed.
        object.__setattr__(self, "split", tuple(self.split))
        if self.family not in FAMILIES:
            raise ConfigError(
                f"rule {self.type!r}: unknown family {self.family!r}", key="family", allowed=FAMILIES
            )
        if self.layout not in LAYOUTS:
            raise ConfigError(
                f"rule {self.type!r}: unknown layout {self.layout!r}", key="layout", allowed=LAYOUTS
            )
        if len(self.split) == 1:
            raise ConfigError(f"rule {self.type!r}: split needs at least 2 block types, got 1", key="split")
        try:
            re.compile(self.pattern)
        except re.error as e:
            raise ConfigError(f"rule {self.type!r}: pattern {self.pattern!r} is not a regular expression ({e})",
                              key="pattern") from None

    @property
    def types(self) -> tuple[str, ...]:
        """The module types this rule assigns: the split block types, or ``(type,)``."""
        return self.split or (self.type,)

    @property
    def split_dim(self) -> int:
        """The weight dimension holding the outputs: 0 for ``out_in``, 1 for ``in_out``."""
        return LAYOUTS[self.layout]




RULE_KEYS = ("type", "pattern", "family", "split", "layout", "default")
"""The keys of a rule written as a mapping (YAML): the fields of :class:`ModuleRule`."""


def rule_from_mapping(r: Any, *, source: str | None = None, key: str = "rules[0]") -> ModuleRule:
    """One rule from its mapping form (or a :class:`ModuleRule`, returned as is): the one
    parser of rules that assignments and search spaces share.

    Raises:
        ConfigError: not a mapping, an unknown key, a missing or non-string
            type/pattern/family, a bad split, family, layout or pattern; ``key`` is the
            rule's key path (``rules[1]``) and the message names the field.
    """
    if isinstance(r, ModuleRule):
        return r
    if not isinstance(r, Mapping):
        raise ConfigError(f"expected a mapping with keys {', '.join(RULE_KEYS)}", source=source, key=key)
    for k in r:
        if k not in RULE_KEYS:
            raise ConfigError(f"unknown key {k!r}", source=source, key=f"{key}.{k}", allowed=RULE_KEYS)
    for k in ("type", "pattern", "family"):
        if not isinstance(r.get(k), str) or not r[k]:
            raise ConfigError("missing, or not a string", source=source, key=f"{key}.{k}")
    if r["family"] not in FAMILIES:
        raise ConfigError(f"unknown family {r['family']!r}", source=source, key=f"{key}.family", allowed=FAMILIES)
    if r.get("layout", "out_in") not in LAYOUTS:
        raise ConfigError(f"unknown layout {r['layout']!r}", source=source, key=f"{key}.layout", allowed=LAYOUTS)
    split = r.get("split") or ()
    if isinstance(split, str) or not isinstance(split, Sequence) or not all(isinstance(x, str) for x in split):
        raise ConfigError("expected a list of module type names", source=source, key=f"{key}.split")
    default = r.get("default")
    if default is not None and (not isinstance(default, str) or not default):
        raise ConfigError("expected a geometry name", source=source, key=f"{key}.default")
    try:
        return ModuleRule(r["type"], r["pattern"], r["family"], tuple(split), r.get("layout", "out_in"), default)
    except ConfigError as e:  # unknown family or layout, a bad regex, a one-block split
        raise ConfigError(e.problem, source=source, key=f"{key}.{e.key}", allowed=e.allowed) from None


def rule_to_mapping(rule: ModuleRule) -> dict[str, Any]:
    """A rule as plain data (the inverse of :func:`rule_from_mapping`); ``default`` only when set."""
    out = {"type": rule.type, "pattern": rule.pattern, "family": rule.family, "split": list(rule.split),
           "layout": rule.layout}
    if rule.default is not None:
        out["default"] = rule.default
    return out
