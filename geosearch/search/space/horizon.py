"""The ``target:`` and ``ladder:`` sections of a space: the run the user will do, and the rungs
of growing Σ η each trial trains towards it (docs/design.md, "Horizon" and "The ladder").

:class:`TargetSpec` and :class:`LadderSpec` hold them as written (``None``: the proxy's);
:func:`parse_horizon` reads them for the schema's parser with the rest of the space file and
checks them against the proxy (:func:`check_horizon`). The study's plan
(:mod:`geosearch.search.space.plan`) resolves them into a target and rungs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from geosearch.util.checks import STEPS, Range
from geosearch.util.errors import ConfigError
from geosearch.proxy.config import TrainConfig
from geosearch.search.horizon.target import run_sum_eta

__all__ = ["LADDER_LIMITS", "TARGET_LIMITS", "LadderSpec", "TargetSpec", "check_horizon", "parse_horizon",
           "short_target"]


@dataclass(frozen=True)
class TargetSpec:
    """The run the user will do (``target:``); each field ``None`` = the proxy's."""

    steps: int | None = None
    """Optimizer steps of the target run (``--target-steps``)."""
    spectral_lr: float | None = None
    """Its peak spectral step size (``--target-spectral-lr``)."""
    model: str | None = None
    """Its model spec (``--target-model``), for the logit scale d/√d_head; ``None`` = the
    proxy's model with its ``model_args``."""

    def __post_init__(self) -> None:
        _check_fields(self, TARGET_LIMITS)
        if self.model is not None and not isinstance(self.model, str):
            raise ConfigError(f"expected a model spec (a preset, hf:NAME or py:MODULE:FACTORY) "
                              f"or null, got {self.model!r}", key="model")


@dataclass(frozen=True)
class LadderSpec:
    """The rungs of growing Σ η each trial trains (``ladder:``); rung 0 is the proxy run."""

    rungs: int = 1
    """Rungs at most, rung 0 included; 1 = the proxy run only."""
    max_spectral_lr: float | None = None
    """Largest peak spectral step of a rung; ``None`` = the proxy's own: rungs reach Σ η by
    more steps, never by a larger step (docs/design.md, "The ladder": a larger step inflates
    the logits and did not rank as the long runs did). A value above the proxy's lets rungs
    take a larger step instead of more steps."""
    max_steps: int | None = None
    """Most steps of a rung (at least ``proxy.steps``); ``None`` = ``proxy.steps``."""
    lower_seeds: int | None = None
    """Seeds each rung below the top trains (the first of the trial's); ``None`` = all of
    them. The ranking is read at the top rung, which always trains every seed."""
    stability_steps: int | None = None
    """Steps of the stability rung, trained first with the first seed at the peak spectral
    step that ends at the target's Σ η²
    (:func:`~geosearch.search.horizon.stability.plan_stability`), so that its probes
    *measure* the attention logits at the target; ``None``: no stability rung (the pruner forecasts in
    Σ η instead). Its loss is not ranked."""

    branches: bool = False
    """Trunk and branches: each seed of a trial trains one run at the proxy's step, constant
    after the warmup (the trunk), and each rung is a cooldown branched off it
    (:mod:`geosearch.proxy.state`): a completed warmup-stable-decay run of the rung's length
    at the cost of its cooldown; rungs reach Σ η by steps only. ``False``: each rung is a
    run of its own on the proxy's schedule."""
    cooldown: float = 0.2
    """With ``branches``: each branch's cooldown as a share of its steps."""

    def __post_init__(self) -> None:
        _check_fields(self, LADDER_LIMITS)
        if not isinstance(self.branches, bool):
            raise ConfigError(f"expected true or false, got {self.branches!r}", key="branches")


TARGET_LIMITS: dict[str, Range] = {
    "steps": Range(1, 1_000_000_000, whole=True, null=True),
    "spectral_lr": Range(0, open_low=True, null=True),
}
"""The numbers of ``target:`` -> their ranges (the target is not trained, only its Σ η is
computed: up to 10⁹ steps)."""
LADDER_LIMITS: dict[str, Range] = {
    "rungs": Range(1, 20, whole=True),
    "max_spectral_lr": Range(0, open_low=True, null=True),
    "max_steps": dataclasses.replace(STEPS, null=True),
    "lower_seeds": Range(1, 100, whole=True, null=True),
    "stability_steps": dataclasses.replace(STEPS, null=True),
    "cooldown": Range(0, 1, open_low=True, open_high=True),
}
"""The numbers of ``ladder:`` -> their ranges (a rung is trained: at most
:data:`~geosearch.util.checks.MAX_STEPS` steps)."""


class _Parser(Protocol):
    """What :func:`parse_horizon` needs of the schema's parser."""

    problems: list[ConfigError]

    def mapping(self, value: Any, key: str, allowed: Sequence[str]) -> dict[str, Any]: ...

    def error(self, key: str, problem: str, allowed: Iterable[object] | None = None) -> None: ...


def parse_horizon(parser: _Parser, target: Any, ladder: Any,
                  proxy: TrainConfig) -> tuple[TargetSpec, LadderSpec]:
    """The ``target:`` and ``ladder:`` sections of a space, read for the schema's parser
    (:mod:`geosearch.search.space.schema`): each field is checked by its dataclass, one key
    at a time so that every bad key is reported, then the sections against the proxy
    (:func:`check_horizon`, when nothing else is wrong). Problems go to ``parser``."""
    specs = []
    for value, key, cls in ((target, "target", TargetSpec), (ladder, "ladder", LadderSpec)):
        d = parser.mapping(value, key, [f.name for f in dataclasses.fields(cls)])
        n_before = len(parser.problems)
        for k, v in d.items():
            try:
                cls(**{k: v})
            except ConfigError as e:
                parser.error(f"{key}.{k}", e.problem, e.allowed)
        specs.append(cls(**d) if len(parser.problems) == n_before else cls())
    target_spec, ladder_spec = specs
    if not parser.problems:
        parser.problems.extend(check_horizon(target_spec, ladder_spec, proxy))
    return target_spec, ladder_spec


def check_horizon(target: TargetSpec, ladder: LadderSpec, proxy: TrainConfig) -> list[ConfigError]:
    """The problems between the two sections and the proxy, each keyed by its path: an
    unknown target model, a ladder whose ``max_steps`` is below the proxy's steps, a target
    shorter (in Σ η) than the proxy run (:func:`short_target`)."""
    problems = []
    short = short_target(target, proxy)
    if short is not None:
        problems.append(short)
    if target.model is not None:
        from geosearch.models.zoo import check_model_spec  # torch: only when a model is named

        try:
            check_model_spec(target.model)
        except ConfigError as e:
            problems.append(ConfigError(e.problem, key=f"target.{e.key or 'model'}", allowed=e.allowed))
    if ladder.max_steps is not None and ladder.max_steps < proxy.steps:
        problems.append(ConfigError(f"expected at least proxy.steps ({proxy.steps}), got "
                                    f"{ladder.max_steps}: rung 0 is the proxy run", key="ladder.max_steps"))
    return problems


def short_target(target: TargetSpec, proxy: TrainConfig) -> ConfigError | None:
    """The problem of a target whose Σ η is below the proxy run's, else ``None``.

    The ranking is read at the proxy run (rung 0) or above: the ladder climbs from it towards
    the target and never below it (docs/design.md, "The ladder"). A shorter target would get
    the answer for a longer run than the user's, with the header saying "the proxy run
    itself", so it is refused, keyed by ``target.steps`` when the target has fewer steps,
    else by ``target.spectral_lr``.
    """
    steps = target.steps if target.steps is not None else proxy.steps
    lr = target.spectral_lr if target.spectral_lr is not None else proxy.spectral_lr
    theirs = run_sum_eta(proxy, proxy.steps, proxy.spectral_lr)
    ours = run_sum_eta(proxy, steps, lr)
    if not (theirs > 0 and ours < theirs * (1 - 1e-9)):
        return None
    if steps < proxy.steps:
        key, fix = "target.steps", f"train the proxy no longer (--steps {steps} or fewer)"
    else:
        key, fix = "target.spectral_lr", f"give the proxy your run's step (proxy.spectral_lr={lr:g})"
    return ConfigError(
        f"your run ({steps:,} steps at spectral_lr {lr:g}, Σ η {ours:.3g}) is shorter than the proxy "
        f"run ({proxy.steps:,} steps at {proxy.spectral_lr:g}, Σ η {theirs:.3g}), where the ranking "
        f"is read; {fix}, or give your run's length (--target-steps N)", key=key)


def _check_fields(spec: Any, limits: dict[str, Range]) -> None:
    """Each field of ``limits`` in its range (numeric strings too, for the fields that are
    not whole: YAML 1.1 reads ``1e-2`` as one), kept as checked; raises a ConfigError keyed
    by the field."""
    for name, allowed in limits.items():
        value, problem = allowed.check(getattr(spec, name))
        if problem is not None:
            raise ConfigError(problem, key=name)
        object.__setattr__(spec, name, value)
