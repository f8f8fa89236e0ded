"""The small typed sections of a search space: hyperparameter ranges, budget, pruner, sampler.

Frozen dataclasses that :class:`~geosearch.search.space.spec.SearchSpace` holds and
:mod:`geosearch.search.space.schema` fills from YAML; the pruner and sampler sections make
their Optuna objects.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Literal

import optuna

from geosearch.search.horizon.pruner import (
    DEFAULT_INTERVAL,
    DEFAULT_MAX_EXTRAPOLATION,
    DEFAULT_MAX_LOGIT,
    DEFAULT_MAX_LOGIT_FACTOR,
    DEFAULT_MIN_ENTROPY,
    DEFAULT_WINDOW,
    LogitGrowthPruner,
)

__all__ = ["Budget", "Hyperparams", "LogRange", "LossPrunerSpec", "LossPrunerType", "PrunerSpec",
           "SamplerSpec", "SamplerType"]

SamplerType = Literal["auto", "grid", "tpe", "random", "gp"]
LossPrunerType = Literal["none", "median", "percentile", "successive_halving"]


@dataclass(frozen=True)
class LogRange:
    """A continuous hyperparameter sampled log-uniformly in ``[low, high]``."""

    low: float
    high: float

    def suggest(self, trial: optuna.trial.BaseTrial, name: str) -> float:
        """``trial.suggest_float(name, low, high, log=True)``."""
        return trial.suggest_float(name, self.low, self.high, log=True)


@dataclass(frozen=True)
class Hyperparams:
    """Hyperparameters searched together with the geometries: continuous ranges, and the
    step grid (finite)."""

    spectral_lr: LogRange | dict[str, LogRange] | None = None
    """Manifold-Muon step size: one range (Optuna parameter ``spectral_lr``) or one per
    manifold geometry (``spectral_lr.<geometry>``, set as that key's ``lr`` option)."""
    lr: LogRange | None = None
    """AdamW step size (embeddings, head, norms, types assigned ``adamw``); parameter ``lr``."""
    step_grid: tuple[float, ...] | None = None
    """Factors of ``proxy.spectral_lr`` each point is trained at (a categorical, Optuna
    parameter ``step_factor``; 1 among them: the shared step), so that each assignment is
    also ranked at its own best step; ``None``: every point at the shared step."""
    step_halving: bool = True
    """With a step grid: successive halving over it (one seed at every factor, the other
    ``repeats - 1`` only at each assignment's best; the stability rung at the largest factor
    first, its pass standing for the smaller ones); False: every seed at every factor."""

    def __bool__(self) -> bool:
        """True when a continuous parameter is searched (the step grid is finite)."""
        return self.spectral_lr is not None or self.lr is not None


@dataclass(frozen=True)
class Budget:
    """How long the study runs; ``None`` = no limit of that kind."""

    trials: int | None = None
    """Trials to run (finished trials of a resumed study count)."""
    timeout: float | None = None
    """Seconds of wall time for ``study.optimize``."""


@dataclass(frozen=True)
class LossPrunerSpec:
    """The loss-based Optuna pruner consulted when no instability rule fires."""

    type: LossPrunerType = "none"
    """``none``, ``median``, ``percentile`` or ``successive_halving``."""
    args: dict[str, Any] = field(default_factory=dict)
    """Its constructor arguments
    (:data:`~geosearch.search.space.reader.LOSS_PRUNER_ARGS` lists them per type)."""

    def make(self) -> optuna.pruners.BasePruner | None:
        """The Optuna pruner, or ``None`` for ``none``."""
        classes = {
            "median": optuna.pruners.MedianPruner,
            "percentile": optuna.pruners.PercentilePruner,
            "successive_halving": optuna.pruners.SuccessiveHalvingPruner,
        }
        return None if self.type == "none" else classes[self.type](**self.args)


@dataclass(frozen=True)
class PrunerSpec:
    """Arguments of :class:`~geosearch.search.horizon.pruner.LogitGrowthPruner` (defaults and
    their justification are in its docstring)."""

    max_logit: float = DEFAULT_MAX_LOGIT
    """Largest acceptable attention logit, for trials that store no logit scale."""
    max_logit_factor: float = DEFAULT_MAX_LOGIT_FACTOR
    """Largest acceptable attention logit as a multiple of the model's d/√d_head."""
    min_entropy: float | None = DEFAULT_MIN_ENTROPY
    """Smallest acceptable attention entropy (nats); ``None``: rule off."""
    n_warmup_steps: int = 0
    """Steps before the logit, forecast and entropy rules apply."""
    window: int = DEFAULT_WINDOW
    """Fewest probe points the max-logit forecast in Σ η is fitted on."""
    interval: float | None = DEFAULT_INTERVAL
    """Coverage of the forecast's prediction interval; ``None``: forecast rule off."""
    max_extrapolation: float | None = DEFAULT_MAX_EXTRAPOLATION
    """The forecast rule prunes only when the target's Σ η is at most this × the run's."""
    loss: LossPrunerSpec = field(default_factory=LossPrunerSpec)
    """The wrapped loss pruner."""

    def make(self) -> LogitGrowthPruner:
        """The configured pruner."""
        args = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "loss"}
        return LogitGrowthPruner(self.loss.make(), **args)


@dataclass(frozen=True)
class SamplerSpec:
    """The Optuna sampler."""

    type: SamplerType = "auto"
    """``auto`` (grid when small and finite, else TPE), ``grid``, ``tpe``, ``random``, ``gp``."""
    seed: int | None = 0
    """Sampler seed; ``None`` = random. Give each parallel worker its own."""
    n_startup_trials: int | None = None
    """Random trials before TPE/GP model the results; ``None`` = Optuna's default (10)."""
