"""An assignment moved to another rule set: from the proxy's module types to a model's.

A search on the built-in proxy answers in the proxy's module types (rule set ``nanogpt``:
``attn_qkv``, ``attn_out``, ``mlp_in``, ``mlp_out``); a Hugging Face model names its
weights by another rule set (``gpt2``, ``llama``, ...). :func:`retarget` gives every module
type of the new rules the geometry (and options) of its counterpart in the old ones:

1. the same type (``attn_out`` is ``attn_out`` in every rule set);
2. a fused or split attention input: ``attn_qkv`` takes the geometry of ``attn_q``,
   ``attn_k`` and ``attn_v`` when they agree, and each of those takes ``attn_qkv``'s;
3. a gated MLP's ``mlp_gate`` takes ``mlp_in``'s (both map the model width to the MLP
   width);
4. otherwise the types of the same family (``attn``, ``mlp``), when they agree.

Sources that disagree (``attn_q`` Stiefel and ``attn_k`` DGram cannot become one fused
``attn_qkv``) are refused in one line that names them. The result says each family by its
shorthand when all its types agree, as a search's export does. Torch-free.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from geosearch.util.errors import ConfigError
from geosearch.rules.modules import ModuleRule, family_types

__all__ = ["counterparts", "retarget"]

_SPLIT = ("attn_q", "attn_k", "attn_v")


def counterparts(type_: str, family: str, old: Mapping[str, str]) -> list[str]:
    """The module types of the old rules (``old``: type -> family) whose geometry ``type_``
    (of ``family``) takes, by the rules of the module docstring."""
    if type_ in old:
        return [type_]
    if type_ == "attn_qkv" and all(t in old for t in _SPLIT):
        return list(_SPLIT)
    if type_ in _SPLIT and "attn_qkv" in old:
        return ["attn_qkv"]
    if type_ == "mlp_gate" and "mlp_in" in old:
        return ["mlp_in"]
    return [t for t, f in old.items() if f == family]


def retarget(geometry: Mapping[str, str], options: Mapping[str, Mapping[str, Any]],
             old_families: Mapping[str, str], rules: Sequence[ModuleRule],
             label: str) -> tuple[dict[str, str], dict[str, dict[str, Any]]]:
    """The geometry and options of every module type of ``rules``, from the resolved ones
    of another rule set.

    Args:
        geometry: old module type -> geometry (every type, shorthands expanded).
        options: old module type -> its options.
        old_families: old module type -> family.
        rules: the new rules.
        label: how messages name the new rules (``"rule set 'llama'"``).

    Returns:
        ``(geometry, options)`` keyed by family shorthand where all of a family's types
        agree, by module type elsewhere.

    Raises:
        ConfigError: a new type has no counterpart, or its counterparts disagree.
    """
    new_geometry: dict[str, str] = {}
    new_options: dict[str, dict[str, Any]] = {}
    for rule in rules:
        for t in rule.types:
            sources = counterparts(t, rule.family, old_families)
            if not sources:
                raise ConfigError(f"module type {t!r} of {label} has no counterpart (no {rule.family} "
                                  "type) in the assignment; give it a geometry by hand", key="rules")
            found = {geometry[s] for s in sources}
            if len(found) > 1:
                shown = ", ".join(f"{s}={geometry[s]}" for s in sources)
                hint = ("choose a rule set that keeps them apart (a *_split one for a fused q/k/v)"
                        if t == "attn_qkv" else f"give the assignment one geometry for its {rule.family} types")
                raise ConfigError(f"module type {t!r} of {label} stands for {shown}, which differ; {hint}",
                                  key="rules")
            opts = [dict(options.get(s, {})) for s in sources]
            if any(o != opts[0] for o in opts):
                raise ConfigError(f"module type {t!r} of {label} stands for {', '.join(sources)}, whose "
                                  "options differ", key="rules")
            new_geometry[t] = found.pop()
            if opts[0]:
                new_options[t] = opts[0]
    return _by_family(new_geometry, new_options, family_types(rules))


def _by_family(geometry: dict[str, str], options: dict[str, dict[str, Any]],
               families: Mapping[str, list[str]]) -> tuple[dict[str, str], dict[str, dict[str, Any]]]:
    """Say a family by its shorthand where all its types share geometry and options."""
    out_geometry: dict[str, str] = {}
    out_options: dict[str, dict[str, Any]] = {}
    for family, types in families.items():
        same = (len({geometry[t] for t in types}) == 1
                and all(options.get(t, {}) == options.get(types[0], {}) for t in types))
        if same:
            out_geometry[family] = geometry[types[0]]
            if options.get(types[0]):
                out_options[family] = options[types[0]]
        else:
            out_geometry.update({t: geometry[t] for t in types})
            out_options.update({t: options[t] for t in types if options.get(t)})
    return out_geometry, out_options
