"""What building a model gives: :class:`BuiltModel`, the model and what geosearch needs to know about it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from torch import nn

from geosearch.rules.modules import ModuleRule
from geosearch.rules.rule import rule_to_mapping
from geosearch.util.checks import is_int
from geosearch.util.errors import ConfigError
from geosearch.util.yaml_io import plain

__all__ = ["SOURCE", "BuiltModel", "check_vocab"]

SOURCE = "--model"
"""Where model errors say the spec came from."""


@dataclass
class BuiltModel:
    """A freshly initialised model and what geosearch needs to know about it.

    Attributes:
        model: the ``nn.Module`` (on the CPU).
        spec: the spec it was built from.
        family: ``"nanogpt"`` (presets), the Hugging Face model type (``"gpt2"``,
            ``"llama"``, ``"phi3"``, ...) or ``"py"``.
        rules: its default rules: a registered rule set's name, or rules read off its module
            names (``hf:`` models no registered set fits); ``None`` for ``py:`` models (the
            search space or assignment names them).
        block_size: context length T it was built for.
        vocab_size: its vocabulary size (``None`` when unknown, for ``py:`` models).
        qk_source: how the attention probes capture its queries and keys (a
            :data:`geosearch.models.qk.QK_SOURCES` name), ``None`` when they cannot.
        config: the resolved architecture, YAML-safe (a preset's ``GPTConfig``, a Hugging
            Face config's non-default fields, or a factory and its arguments).
        warnings: what a user should know about this model (no attention probes), one line
            each; logged when the model is built.
    """

    model: nn.Module
    spec: str
    family: str
    rules: str | tuple[ModuleRule, ...] | None
    block_size: int
    vocab_size: int | None
    qk_source: str | None
    config: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)

    def num_params(self) -> int:
        """Parameters, shared (tied) tensors counted once."""
        return sum(p.numel() for p in self.model.parameters())

    def describe(self) -> dict[str, Any]:
        """YAML-safe summary for ``config.yaml`` and ``geosearch inspect``."""
        rules = self.rules if not isinstance(self.rules, tuple) else plain(
            [rule_to_mapping(r) for r in self.rules])
        return {"spec": self.spec, "family": self.family, "class": type(self.model).__name__,
                "rules": rules, "qk_source": self.qk_source, "block_size": self.block_size,
                "vocab_size": self.vocab_size, "parameters": self.num_params(), "config": self.config,
                "warnings": list(self.warnings)}

    def summary(self) -> str:
        """One line for people: spec, class, size, default rules."""
        rules = (f"rule set {self.rules!r}" if isinstance(self.rules, str)
                 else "rules read off its module names" if self.rules else "no default rule set")
        probes = f"attention probes via {self.qk_source}" if self.qk_source else "no attention probes"
        return (f"{self.spec}: {type(self.model).__name__}, {self.num_params():,} parameters, "
                f"T={self.block_size}; {rules}; {probes}")


def check_vocab(spec: str, data_vocab: int, model_vocab: Any) -> None:
    if is_int(model_vocab) and model_vocab < data_vocab:
        raise ConfigError(f"model {spec!r}: vocab_size {model_vocab} is smaller than the data's {data_vocab}",
                          source=SOURCE, key="model_args.vocab_size")
