"""Search spaces: which geometries each module type may take, and how to score them.

A search space is a YAML file (schema version 1) loaded into :class:`SearchSpace`, a tree
of typed dataclasses. Every problem in the file is reported at once, each naming the
file, the key path and the allowed values. The shipped spaces (``default``, ``paper``,
``full``, ``llama``) load by name::

    >>> space = load_space("default")
    >>> space.categorical_choices()
    {'geometry.attn': ['stiefel', 'dgram'], 'geometry.mlp': ['stiefel', 'dgram']}
    >>> space.grid_size()
    4

The schema, every key optional but ``version`` and ``geometries``::

    version: 1
    name: default                 # study name (runs/<name>/); default: the file's stem
    rules: nanogpt                # rule-set name, or a list of {type, pattern, family,
                                  #   split, layout} as in assignment files; default: the
                                  #   model's rule set (nanogpt for the presets, gpt2 for
                                  #   hf:gpt2, llama for hf:llama; py: models must name one)
    geometries:                   # one Optuna categorical per key: a module type of the
      attn: [stiefel, dgram]      #   rules, or a family shorthand (attn, mlp) covering its
      mlp: [stiefel, dgram]       #   types; every module type covered exactly once
    hyperparams:                  # optional continuous parameters, log-uniform [low, high]
      spectral_lr: [0.005, 0.05]  #   or per geometry: {stiefel: [..], dgram: [..]}
      lr: [1.0e-4, 3.0e-3]        #   AdamW lr (embeddings, head, norms, adamw types)
    proxy:                        # the proxy run: any geosearch.proxy.train.TrainConfig field
      model: small                #   tiny | small | gpt2 | hf:gpt2 | hf:llama | py:MODULE:FACTORY
      model_args: {}              #   model fields, e.g. {n_layer: 2} (geosearch.proxy.zoo)
      data: null                  #   corpus path; null = the built-in text
      steps: 200
      ...
    repeats: 1                    # seeds per assignment (proxy.seed, proxy.seed + 1, ...)
    budget: {trials: null, timeout: null}   # trials; seconds (null = no limit)
    pruner:                       # LogitGrowthPruner arguments (null disables a rule)
      max_logit: 1000.0
      min_entropy: 0.01
      n_warmup_steps: 0
      window: 5
      trend_min_logit: 100.0
      horizon_steps: null         # null = the trial's budget (proxy.steps)
      loss: none                  # none | median | percentile | successive_halving, or
                                  #   {type: median, n_startup_trials: 2, ...}
    sampler: {type: auto, seed: 0}  # auto | grid | tpe | random | gp (+ n_startup_trials)

When ``rules`` is not set, the space takes the default rule set of ``proxy.model``
(:func:`geosearch.proxy.zoo.default_rules`), so ``geosearch search --model hf:llama`` with a
space written for the proxy searches LLaMA's module types; an override of the model
(``--model``, ``proxy.model=...``) moves such derived rules along. Rules the space names stay
as they are. ``to_dict()`` writes the rules in use, whichever way they came.

Command-line flags and ``key=value`` overrides go through :func:`apply_overrides`.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import math
import numbers
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, get_args

import optuna
import yaml

from geosearch.errors import ConfigError
from geosearch.search.pruners import (
    DEFAULT_MAX_LOGIT,
    DEFAULT_MIN_ENTROPY,
    DEFAULT_TREND_MIN_LOGIT,
    DEFAULT_WINDOW,
    LogitGrowthPruner,
)

if TYPE_CHECKING:  # pragma: no cover
    from geosearch.assignment import Assignment
    from geosearch.modules import ModuleRule
    from geosearch.proxy.train import TrainConfig

__all__ = [
    "Budget",
    "Hyperparams",
    "LogRange",
    "LossPrunerSpec",
    "PrunerSpec",
    "SamplerSpec",
    "SearchSpace",
    "SearchSpaceError",
    "Suggestion",
    "apply_overrides",
    "load_space",
    "space_names",
]

SCHEMA_VERSION = 1
TOP_KEYS = ("version", "name", "rules", "geometries", "hyperparams", "proxy", "repeats",
            "budget", "pruner", "sampler")
HYPERPARAMS = ("spectral_lr", "lr")
SamplerType = Literal["auto", "grid", "tpe", "random", "gp"]
LossPrunerType = Literal["none", "median", "percentile", "successive_halving"]
# Loss pruner -> its Optuna constructor arguments a space may set.
LOSS_PRUNER_ARGS: dict[str, tuple[str, ...]] = {
    "none": (),
    "median": ("n_startup_trials", "n_warmup_steps", "interval_steps", "n_min_trials"),
    "percentile": ("percentile", "n_startup_trials", "n_warmup_steps", "interval_steps",
                   "n_min_trials"),
    "successive_halving": ("min_resource", "reduction_factor", "min_early_stopping_rate",
                           "bootstrap_count"),
}
# "auto" searches exhaustively when the space is finite and at most this many assignments
# and no trial budget says otherwise (see SearchSpace.sampler_type).
AUTO_GRID_LIMIT = 64
# Command-line flags of `geosearch search` -> the key path they set.
CLI_FLAGS: dict[str, str] = {
    "trials": "budget.trials",
    "timeout": "budget.timeout",
    "steps": "proxy.steps",
    "model": "proxy.model",
    "data": "proxy.data",
    "batch_size": "proxy.batch_size",
    "device": "proxy.device",
    "repeats": "repeats",
    "seed": "sampler.seed",
    "sampler": "sampler.type",
    "name": "name",
}
_SHIPPED = resources.files("geosearch.search") / "spaces"


# --------------------------------------------------------------------------- the tree
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
    """Continuous hyperparameters searched together with the geometries."""

    spectral_lr: LogRange | dict[str, LogRange] | None = None
    """Manifold-Muon step size: one range (Optuna parameter ``spectral_lr``) or one per
    manifold geometry (``spectral_lr.<geometry>``, set as that key's ``lr`` option)."""
    lr: LogRange | None = None
    """AdamW step size (embeddings, head, norms, types assigned ``adamw``); parameter ``lr``."""

    def __bool__(self) -> bool:
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
    """Its constructor arguments (:data:`LOSS_PRUNER_ARGS` lists them per type)."""

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
    """Arguments of :class:`~geosearch.search.pruners.LogitGrowthPruner` (defaults and
    their justification are in its docstring)."""

    max_logit: float = DEFAULT_MAX_LOGIT
    """Largest acceptable attention logit."""
    min_entropy: float | None = DEFAULT_MIN_ENTROPY
    """Smallest acceptable attention entropy (nats); ``None``: rule off."""
    n_warmup_steps: int = 0
    """Steps before the logit and entropy rules apply."""
    window: int = DEFAULT_WINDOW
    """Probe points the max-logit trend is fitted on."""
    trend_min_logit: float | None = DEFAULT_TREND_MIN_LOGIT
    """Max logit from which the trend is extrapolated; ``None``: trend rule off."""
    horizon_steps: int | None = None
    """Step the trend is extrapolated to; ``None`` = the trial's budget (``proxy.steps``)."""
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


@dataclass(frozen=True)
class Suggestion:
    """What one trial tries: an assignment and the proxy settings it changes.

    Attributes:
        geometry: categorical parameter (module type or shorthand) -> geometry.
        options: per-key assignment options (a per-geometry ``spectral_lr`` sets ``lr``).
        train_overrides: :class:`~geosearch.proxy.train.TrainConfig` fields to replace
            (``spectral_lr``, ``lr`` when searched).
        rules: the rule set, for the assignment.
    """

    geometry: dict[str, str]
    options: dict[str, dict[str, float]]
    train_overrides: dict[str, float]
    rules: str | tuple[ModuleRule, ...]

    def assignment(self, provenance: Mapping[str, Any] | None = None) -> Assignment:
        """The :class:`~geosearch.assignment.Assignment` this suggestion trains."""
        from geosearch.assignment import Assignment

        rules = self.rules if isinstance(self.rules, str) else list(self.rules)
        return Assignment(geometry=dict(self.geometry), options=dict(self.options), rules=rules,
                          provenance=dict(provenance or {}))


@dataclass(frozen=True)
class SearchSpace:
    """A validated search space. Build it with :func:`load_space` or :meth:`from_dict`.

    Example:
        >>> space = SearchSpace.from_dict({"version": 1, "geometries": {
        ...     "attn": ["stiefel", "dgram"], "mlp": ["stiefel", "dgram"]}}, source="inline")
        >>> space.grid_size(), space.sampler_type()
        (4, 'grid')
        >>> s = space.suggest(optuna.trial.FixedTrial({"attn": "stiefel", "mlp": "dgram"}))
        >>> s.geometry
        {'attn': 'stiefel', 'mlp': 'dgram'}
    """

    geometries: dict[str, tuple[str, ...]]
    """Categorical parameter (module type or family shorthand) -> geometries it may take."""
    proxy: TrainConfig
    """The proxy run every trial trains (``seed`` is the first repeat's seed)."""
    rules: str | tuple[ModuleRule, ...] = "nanogpt"
    """Rule-set name, or the rules themselves."""
    rules_from_model: bool = field(default=False, compare=False)
    """True when the space set no ``rules`` and they are ``proxy.model``'s default rule set
    (an override of the model then re-derives them)."""
    hyperparams: Hyperparams = field(default_factory=Hyperparams)
    """Continuous hyperparameters, if any."""
    repeats: int = 1
    """Seeds each assignment is trained with; the trial's score is their mean."""
    budget: Budget = field(default_factory=Budget)
    """Trials and timeout."""
    pruner: PrunerSpec = field(default_factory=PrunerSpec)
    """The pruner."""
    sampler: SamplerSpec = field(default_factory=SamplerSpec)
    """The sampler."""
    name: str = "search"
    """Study name; the run directory is ``runs/<name>/``."""
    source: str | None = None
    """The file (or other origin) the space was read from, for messages."""

    # ------------------------------------------------------------------ building
    @classmethod
    def from_dict(cls, d: Any, source: str | None = None) -> SearchSpace:
        """Validate a mapping in the YAML schema (see the module docstring).

        Raises:
            SearchSpaceError: every problem found, each naming ``source``, the key path
                and the allowed values.
        """
        return _Parser(source).space(d)

    def to_dict(self) -> dict[str, Any]:
        """Plain YAML-safe data that :meth:`from_dict` turns back into this space."""
        rules: Any = self.rules
        if not isinstance(rules, str):
            rules = [{"type": r.type, "pattern": r.pattern, "family": r.family,
                      "split": list(r.split), "layout": r.layout} for r in rules]
        hp: dict[str, Any] = {}
        if isinstance(self.hyperparams.spectral_lr, LogRange):
            hp["spectral_lr"] = _range_list(self.hyperparams.spectral_lr)
        elif self.hyperparams.spectral_lr:
            hp["spectral_lr"] = {g: _range_list(r) for g, r in self.hyperparams.spectral_lr.items()}
        if self.hyperparams.lr is not None:
            hp["lr"] = _range_list(self.hyperparams.lr)
        pruner = {f.name: getattr(self.pruner, f.name)
                  for f in dataclasses.fields(self.pruner) if f.name != "loss"}
        pruner["loss"] = {"type": self.pruner.loss.type, **self.pruner.loss.args}
        return {
            "version": SCHEMA_VERSION,
            "name": self.name,
            "rules": rules,
            "geometries": {k: list(v) for k, v in self.geometries.items()},
            "hyperparams": hp,
            "proxy": self.proxy.to_dict(),
            "repeats": self.repeats,
            "budget": dataclasses.asdict(self.budget),
            "pruner": pruner,
            "sampler": dataclasses.asdict(self.sampler),
        }

    # ------------------------------------------------------------------ what a study needs
    def categorical_choices(self) -> dict[str, list[str]]:
        """One Optuna categorical per geometries key: ``geometry.<key>`` -> choices."""
        return {f"geometry.{k}": list(v) for k, v in self.geometries.items()}

    def grid_size(self) -> int | float:
        """Number of distinct assignments, or ``math.inf`` when continuous
        hyperparameters are searched too."""
        if self.hyperparams:
            return math.inf
        return math.prod(len(v) for v in self.geometries.values())

    def sampler_type(self) -> str:
        """The sampler :meth:`make_sampler` builds, ``auto`` resolved: ``grid`` when the
        space is finite and the trial budget covers it (without a trial budget: when it
        has at most :data:`AUTO_GRID_LIMIT` assignments), else ``tpe``."""
        if self.sampler.type != "auto":
            return self.sampler.type
        size = self.grid_size()
        limit = self.budget.trials if self.budget.trials is not None else AUTO_GRID_LIMIT
        return "grid" if size <= limit else "tpe"

    def make_sampler(self, seed: int | None = None) -> optuna.samplers.BaseSampler:
        """The Optuna sampler.

        ``grid`` is a :class:`optuna.samplers.GridSampler` over
        :meth:`categorical_choices` (visited in a seeded random order; the study stops by
        itself once every assignment is done, and resumes where it stopped). ``tpe`` is
        Optuna's default multivariate TPE, which models interactions between module types.

        Args:
            seed: overrides ``sampler.seed``; parallel workers should pass distinct seeds
                (e.g. ``seed + worker_index``) so their first random trials differ.

        Raises:
            ConfigError: ``gp`` without scipy installed.
        """
        seed = self.sampler.seed if seed is None else seed
        kind = self.sampler_type()
        startup = {} if self.sampler.n_startup_trials is None else {
            "n_startup_trials": self.sampler.n_startup_trials}
        if kind == "grid":
            return optuna.samplers.GridSampler(self.categorical_choices(), seed=seed)
        if kind == "random":
            return optuna.samplers.RandomSampler(seed=seed)
        if kind == "gp":
            if importlib.util.find_spec("scipy") is None:
                raise ConfigError("Optuna's GPSampler needs scipy, which is not installed "
                                  "(pip install scipy), or choose another sampler",
                                  source=self.source, key="sampler.type",
                                  allowed=[t for t in get_args(SamplerType) if t != "gp"])
            return optuna.samplers.GPSampler(seed=seed, **startup)
        return optuna.samplers.TPESampler(seed=seed, **startup)

    def make_pruner(self) -> LogitGrowthPruner:
        """The :class:`~geosearch.search.pruners.LogitGrowthPruner` of ``pruner``."""
        return self.pruner.make()

    def suggest(self, trial: optuna.trial.BaseTrial) -> Suggestion:
        """Ask ``trial`` for one point of the space.

        Parameter names: ``geometry.<key>`` for each geometries key (``geometry.attn``...), ``spectral_lr`` or
        ``spectral_lr.<geometry>`` (only for geometries this trial uses), ``lr``. Pass
        ``optuna.trial.FixedTrial(study.best_params)`` to rebuild the best trial's point.
        """
        geometry = {k: trial.suggest_categorical(f"geometry.{k}", list(v))
                    for k, v in self.geometries.items()}
        options: dict[str, dict[str, float]] = {}
        overrides: dict[str, float] = {}
        spectral = self.hyperparams.spectral_lr
        if isinstance(spectral, LogRange):
            overrides["spectral_lr"] = spectral.suggest(trial, "spectral_lr")
        elif spectral:
            for g in [g for g in spectral if g in geometry.values()]:
                value = spectral[g].suggest(trial, f"spectral_lr.{g}")
                options.update({k: {"lr": value} for k, kg in geometry.items() if kg == g})
        if self.hyperparams.lr is not None:
            overrides["lr"] = self.hyperparams.lr.suggest(trial, "lr")
        return Suggestion(geometry, options, overrides, self.rules)

    def train_config(self, suggestion: Suggestion | None = None, repeat: int = 0) -> TrainConfig:
        """The proxy config of one run: ``proxy`` with the suggestion's overrides and seed
        ``proxy.seed + repeat``."""
        overrides = suggestion.train_overrides if suggestion is not None else {}
        return dataclasses.replace(self.proxy, seed=self.proxy.seed + repeat, **overrides)

    def summary(self) -> str:
        """A few lines for a person: what is searched, how, on which proxy."""
        by_choices: dict[tuple[str, ...], list[str]] = {}
        for k, v in self.geometries.items():
            by_choices.setdefault(v, []).append(k)
        params = "; ".join(f"{', '.join(ks)} in {{{', '.join(v)}}}" for v, ks in by_choices.items())
        size = self.grid_size()
        hp, spectral = [], self.hyperparams.spectral_lr
        if isinstance(spectral, LogRange):
            hp.append(f"spectral_lr {_range_text(spectral)}")
        elif spectral:
            hp.extend(f"spectral_lr.{g} {_range_text(r)}" for g, r in spectral.items())
        if self.hyperparams.lr is not None:
            hp.append(f"lr {_range_text(self.hyperparams.lr)}")
        p = self.proxy
        return "\n".join([
            f"search space {self.name!r} ({self.source or 'inline'})",
            f"  geometries: {params}"
            + (f" = {size} assignments" if size != math.inf else "")
            + (f"; rule set {self.rules!r}" if isinstance(self.rules, str) else "; the space's rules")
            + (" (the model's)" if self.rules_from_model else ""),
            *([f"  hyperparams: {', '.join(hp)}"] if hp else []),
            f"  proxy: {p.model}{p.model_args or ''}, {p.steps} steps x {p.batch_size} seqs, "
            f"data {p.data or 'built-in'}, solver {p.solver}; {self.repeats} seed(s) each",
            f"  sampler: {self.sampler_type()}; budget: trials {self.budget.trials}, "
            f"timeout {self.budget.timeout}",
        ])


class SearchSpaceError(ConfigError):
    """All the problems of a search space at once.

    The message is one line for one problem; for several, a first line counting them and
    one indented line each. ``problems`` holds them as separate :class:`ConfigError`.
    """

    def __init__(self, problems: Sequence[ConfigError], source: str | None) -> None:
        self.problems = list(problems)
        if len(self.problems) == 1:
            p = self.problems[0]
            super().__init__(p.problem, source=source, key=p.key, allowed=p.allowed)
        else:
            lines = [ConfigError(p.problem, key=p.key, allowed=p.allowed) for p in self.problems]
            super().__init__(f"{len(lines)} problems in the search space:\n"
                             + "\n".join(f"  {e}" for e in lines), source=source)


# --------------------------------------------------------------------------- loading
def space_names() -> list[str]:
    """Names of the search spaces shipped with geosearch (``load_space(name)``)."""
    return sorted(p.name[: -len(".yaml")] for p in _SHIPPED.iterdir() if p.name.endswith(".yaml"))


def load_space(path: str | os.PathLike) -> SearchSpace:
    """Read a search space from a YAML file, or a shipped one by name (``"default"``).

    Raises:
        ConfigError: missing or unreadable file (listing the shipped names), malformed
            YAML (with line and column); :class:`SearchSpaceError` for every problem of
            its content.
    """
    text_path = os.fspath(path)
    shipped = _SHIPPED / f"{text_path}.yaml"
    if not Path(text_path).exists() and os.sep not in text_path and shipped.is_file():
        source, text = str(shipped), shipped.read_text(encoding="utf-8")
        name = text_path
    else:
        source, name = text_path, Path(text_path).stem
        try:
            text = Path(text_path).read_text(encoding="utf-8")
        except FileNotFoundError:
            raise ConfigError("no such file, nor a shipped search space of that name",
                              source=source, allowed=space_names()) from None
        except (OSError, UnicodeDecodeError) as e:
            raise ConfigError(f"cannot read the file ({getattr(e, 'strerror', None) or e})",
                              source=source) from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        raise ConfigError(f"malformed YAML{where}: {getattr(e, 'problem', None) or e}",
                          source=source) from None
    if isinstance(data, dict) and "name" not in data:
        data = {**data, "name": name}
    return SearchSpace.from_dict(data, source=source)


def apply_overrides(
    space: SearchSpace,
    overrides: Iterable[str] | Mapping[str, Any] = (),
    /,
    **flags: Any,
) -> SearchSpace:
    """A copy of ``space`` with some keys replaced, validated again.

    Args:
        space: the space to start from.
        overrides: dotted ``key=value`` strings as typed on a command line (the value is
            read as YAML: ``proxy.steps=100``, ``proxy.data=null``,
            ``hyperparams.lr=[1e-4,1e-3]``), or a mapping of dotted keys to values.
        **flags: command-line flags (:data:`CLI_FLAGS`: ``trials``, ``timeout``, ``steps``,
            ``model``, ``data``, ``batch_size``, ``device``, ``repeats``, ``seed``,
            ``sampler``, ``name``); a ``None`` value means "not given". Applied after
            ``overrides``.

    Raises:
        ConfigError: an override that is not ``key=value``, or a key path through a
            value that is not a mapping; :class:`SearchSpaceError` for bad keys or values
            (the source names the overridden file).
        TypeError: an unknown flag (a programming error).
    """
    for flag in flags:
        if flag not in CLI_FLAGS:
            raise TypeError(f"apply_overrides() got an unexpected flag {flag!r}; "
                            f"known: {', '.join(CLI_FLAGS)}")
    source = f"overrides of {space.source or 'the search space'}"
    pairs: list[tuple[str, Any]] = []
    if isinstance(overrides, Mapping):
        pairs.extend((str(k), v) for k, v in overrides.items())
    else:
        for item in overrides:
            key, eq, value = item.partition("=")
            if not eq or not key.strip():
                raise ConfigError(f"expected 'key=value' (e.g. proxy.steps=100), got {item!r}",
                                  source=source)
            try:
                parsed = yaml.safe_load(value) if value.strip() else None
            except yaml.YAMLError:
                parsed = value
            pairs.append((key.strip(), parsed))
    pairs.extend((CLI_FLAGS[f], v) for f, v in flags.items() if v is not None)
    if not pairs:
        return space

    d = space.to_dict()
    if space.rules_from_model and not any(k == "rules" or k.startswith("rules.") for k, _ in pairs):
        del d["rules"]  # derived from the model: derive them again from the (new) model
    for key, value in pairs:
        node = d
        *parents, last = key.split(".")
        for i, part in enumerate(parents):
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            if not isinstance(child, dict):
                raise ConfigError(f"cannot set {key!r}: {'.'.join(parents[: i + 1])} is not a "
                                  "mapping", source=source, key=key)
            node = child
        node[last] = value
    return SearchSpace.from_dict(d, source=source)


# --------------------------------------------------------------------------- validation
class _Parser:
    """Reads one space, collecting every problem instead of stopping at the first."""

    def __init__(self, source: str | None) -> None:
        self.source = source
        self.problems: list[ConfigError] = []

    def error(self, key: str, problem: str, allowed: Iterable[object] | None = None) -> None:
        self.problems.append(ConfigError(problem, key=key or None, allowed=allowed))

    def rekey(self, e: ConfigError, prefix: str) -> None:
        key = f"{prefix}.{e.key}" if e.key else prefix
        self.error(key, e.problem, e.allowed)

    def mapping(self, value: Any, key: str, allowed: Sequence[str]) -> dict[str, Any]:
        """``value`` as a dict (None = empty); unknown keys are problems."""
        if value is None:
            return {}
        if not isinstance(value, Mapping):
            self.error(key, f"expected a mapping, got {type(value).__name__}", allowed)
            return {}
        out = {}
        for k, v in value.items():
            if k in allowed:
                out[k] = v
            else:
                self.error(_join(key, str(k)), f"unknown key {k!r}", allowed)
        return out

    # ------------------------------------------------------------------ the whole file
    def space(self, d: Any) -> SearchSpace:
        if d is None:
            d = {}
        top = self.mapping(d, "", TOP_KEYS)
        if isinstance(d, Mapping) or d is None:
            if "version" not in top:
                self.error("version", "missing schema version (add 'version: 1')", [SCHEMA_VERSION])
            elif top["version"] != SCHEMA_VERSION or isinstance(top["version"], bool):
                self.error("version", f"unsupported schema version {top['version']!r}",
                           [SCHEMA_VERSION])
        name = top.get("name", "search")
        if not isinstance(name, str) or not name or "/" in name or name.startswith("."):
            self.error("name", f"expected a study name (no '/'), got {name!r}")
        rules_from_model = "rules" not in top
        rules = self.model_rules(top.get("proxy")) if rules_from_model else self.rules(top["rules"])
        geometries = self.geometries(top.get("geometries"), rules)
        hyperparams = self.hyperparams(top.get("hyperparams"), geometries)
        proxy = self.proxy(top.get("proxy"))
        repeats = top.get("repeats", 1)
        if not _is_int(repeats) or repeats < 1:
            self.error("repeats", f"expected a whole number >= 1, got {repeats!r}")
        budget = self.budget(top.get("budget"))
        pruner = self.pruner(top.get("pruner"))
        sampler = self.sampler(top.get("sampler"), hyperparams)

        if self.problems:
            raise SearchSpaceError(self.problems, self.source)
        assert rules is not None  # else a problem was recorded
        space = SearchSpace(
            geometries=geometries, proxy=proxy, rules=rules, hyperparams=hyperparams,
            repeats=repeats, budget=budget, pruner=pruner, sampler=sampler, name=name,
            source=self.source, rules_from_model=rules_from_model,
        )
        if budget.trials is None and budget.timeout is None and space.sampler_type() != "grid":
            self.error("budget", f"a {space.sampler_type()} search never ends by itself: set "
                       "budget.trials or budget.timeout")
            raise SearchSpaceError(self.problems, self.source)
        return space

    # ------------------------------------------------------------------ sections
    def model_rules(self, proxy: Any) -> str | None:
        """The default rule set of ``proxy.model``, for a space that sets no rules; None when
        it has none (a problem for ``py:`` models; an unknown model is ``proxy``'s problem)."""
        from geosearch.modules import rule_set_names
        from geosearch.proxy.train import TrainConfig
        from geosearch.proxy.zoo import PY_PREFIX, default_rules

        model = proxy.get("model", TrainConfig.model) if isinstance(proxy, Mapping) else TrainConfig.model
        name = default_rules(model)
        if name is None and isinstance(model, str) and model.startswith(PY_PREFIX):
            self.error("rules", f"missing: model {model!r} has no default rule set; name one, or "
                       "write rules matching its parameter names (geosearch inspect --model "
                       f"{model} --rules NAME shows how a rule set fits)", rule_set_names())
        return name

    def rules(self, value: Any) -> str | tuple[ModuleRule, ...] | None:
        """The rules, or None when they are wrong (the problems are recorded)."""
        from geosearch.modules import ModuleRule, check_rules, rule_set_names

        if isinstance(value, str):
            if value not in rule_set_names():
                self.error("rules", f"unknown rule set {value!r}", rule_set_names())
                return None
            return value
        if isinstance(value, Mapping) or not isinstance(value, Sequence) or not value:
            self.error("rules", "expected a rule-set name or a non-empty list of rules",
                       rule_set_names())
            return None
        fields = [f.name for f in dataclasses.fields(ModuleRule)]
        out = []
        for i, r in enumerate(value):
            key = f"rules[{i}]"
            r = self.mapping(r, key, fields)
            missing = [k for k in ("type", "pattern", "family") if not isinstance(r.get(k), str)]
            if missing:
                self.error(key, f"missing or non-string {', '.join(missing)}")
                continue
            split = r.get("split") or ()
            if isinstance(split, str) or not isinstance(split, Sequence):
                self.error(f"{key}.split", "expected a list of module type names")
                continue
            try:
                out.append(ModuleRule(r["type"], r["pattern"], r["family"], tuple(split),
                                      r.get("layout", "out_in")))
            except ConfigError as e:
                self.rekey(e, key)
        if len(out) < len(value):
            return None
        try:
            check_rules(out)
        except ConfigError as e:
            self.error(e.key or "rules", e.problem, e.allowed)
            return None
        return tuple(out)

    def geometries(
        self, value: Any, rules: str | tuple[ModuleRule, ...] | None
    ) -> dict[str, tuple[str, ...]]:
        from geosearch.assignment import geometry_names
        from geosearch.modules import family_types, get_rule_set, module_types

        known = geometry_names()
        if value is None:
            self.error("geometries", "missing: which geometries may each module type take?")
            return {}
        if not isinstance(value, Mapping) or not value:
            self.error("geometries", "expected a mapping of module type (or attn/mlp) -> list "
                       "of geometries")
            return {}
        # Without valid rules the keys cannot be checked; the geometries still are.
        rule_list = get_rule_set(rules) if isinstance(rules, str) else rules or ()
        families, types = family_types(rule_list), module_types(rule_list)
        out: dict[str, tuple[str, ...]] = {}
        for k, v in value.items():
            key = f"geometries.{k}"
            if types and k not in types and k not in families:
                self.error(key, f"unknown module type {k!r}", [*families, *types])
            choices = [v] if isinstance(v, str) else v
            if not isinstance(choices, Sequence) or not choices:
                self.error(key, "expected a geometry or a non-empty list of geometries", known)
                continue
            for c in choices:
                if c not in known:
                    self.error(key, f"unknown geometry {c!r}", known)
            if len(set(map(str, choices))) != len(choices):
                self.error(key, "a geometry is listed twice")
            out[str(k)] = tuple(str(c) for c in choices)
        if types:
            covered: dict[str, str] = {}
            for k in out:
                for t in families.get(k, [k] if k in types else []):
                    if t in covered:
                        self.error(f"geometries.{k}", f"module type {t!r} is also covered by "
                                   f"{covered[t]!r}; give each type one entry")
                    covered[t] = k
            missing = [t for t in types if t not in covered]
            if missing:
                self.error("geometries", "no geometries for module type(s) "
                           f"{', '.join(missing)}", [*families, *types])
            clash = [k for k in out if k in HYPERPARAMS or k.startswith("spectral_lr.")]
            for k in clash:
                self.error(f"geometries.{k}", "a module type may not share a name with a "
                           "hyperparameter", HYPERPARAMS)
        return out

    def hyperparams(self, value: Any, geometries: dict[str, tuple[str, ...]]) -> Hyperparams:
        from geosearch.assignment import ADAMW

        h = self.mapping(value, "hyperparams", HYPERPARAMS)
        spectral: LogRange | dict[str, LogRange] | None = None
        if h.get("spectral_lr") is not None:
            v = h["spectral_lr"]
            if isinstance(v, Mapping):
                used = sorted({g for gs in geometries.values() for g in gs if g != ADAMW})
                spectral = {}
                for g, r in v.items():
                    if g not in used:
                        self.error(f"hyperparams.spectral_lr.{g}", f"{g!r} is not a manifold "
                                   "geometry of this space", used)
                    rng = self.log_range(r, f"hyperparams.spectral_lr.{g}")
                    if rng is not None:
                        spectral[str(g)] = rng
            else:
                spectral = self.log_range(v, "hyperparams.spectral_lr")
        lr = None
        if h.get("lr") is not None:
            lr = self.log_range(h["lr"], "hyperparams.lr")
        return Hyperparams(spectral_lr=spectral, lr=lr)

    def log_range(self, value: Any, key: str) -> LogRange | None:
        nums = [_number(x) for x in value] if isinstance(value, (list, tuple)) else []
        if len(nums) != 2 or any(x is None for x in nums):
            self.error(key, f"expected [low, high] (a log-uniform range), got {value!r}")
            return None
        low, high = nums
        if not 0 < low < high or not math.isfinite(high):
            self.error(key, f"expected 0 < low < high, got [{low}, {high}]")
            return None
        return LogRange(low, high)

    def proxy(self, value: Any) -> TrainConfig:
        from geosearch.proxy.train import TrainConfig
        from geosearch.proxy.zoo import check_model_spec

        fields = [f.name for f in dataclasses.fields(TrainConfig)]
        d = self.mapping(value, "proxy", fields)
        n_before = len(self.problems)
        for k, v in d.items():  # one at a time, so that every bad key is reported
            try:
                TrainConfig.from_dict({k: v})
            except ConfigError as e:
                self.error(f"proxy.{k}", e.problem, e.allowed)
        model, model_args = d.get("model", TrainConfig.model), d.get("model_args") or {}
        if isinstance(model, str) and isinstance(model_args, Mapping):
            try:  # a preset, hf:gpt2, hf:llama or py:module:factory; nothing is built
                check_model_spec(model, model_args)
            except ConfigError as e:
                self.rekey(e, "proxy")  # e.key: model, or model_args.<field>
        if isinstance(d.get("optimizer_args"), Mapping):
            self.optimizer_args(d["optimizer_args"], fields)
        if len(self.problems) > n_before:
            return TrainConfig()
        try:
            return TrainConfig.from_dict(d)
        except ConfigError as e:
            self.rekey(e, "proxy")
            return TrainConfig()

    def optimizer_args(self, args: Mapping[str, Any], train_fields: list[str]) -> None:
        from geosearch.assignment import OPTION_KINDS, check_option
        from geosearch.optim.build import DEFAULTS

        allowed = [k for k in DEFAULTS if k not in train_fields]
        for k, v in args.items():
            key = f"proxy.optimizer_args.{k}"
            if k in train_fields:
                self.error(key, f"set it as proxy.{k}")
            elif k not in allowed:
                self.error(key, f"unknown optimizer setting {k!r}", allowed)
            elif k in OPTION_KINDS:
                try:
                    check_option(k, v, source=None, key=key)
                except ConfigError as e:
                    self.error(key, e.problem, e.allowed)

    def budget(self, value: Any) -> Budget:
        d = self.mapping(value, "budget", [f.name for f in dataclasses.fields(Budget)])
        trials, timeout = d.get("trials"), d.get("timeout")
        if trials is not None and (not _is_int(trials) or trials < 1):
            self.error("budget.trials", f"expected a whole number >= 1 or null, got {trials!r}")
            trials = None
        if timeout is not None:
            t = _number(timeout)
            if t is None or not 0 < t < math.inf:
                self.error("budget.timeout", f"expected seconds > 0 or null, got {timeout!r}")
            timeout = t
        return Budget(trials=trials, timeout=timeout)

    def pruner(self, value: Any) -> PrunerSpec:
        fields = [f.name for f in dataclasses.fields(PrunerSpec)]
        d = self.mapping(value, "pruner", fields)
        loss = self.loss_pruner(d.pop("loss", None))
        for k in ("max_logit", "min_entropy", "trend_min_logit"):
            if isinstance(d.get(k), str) and _number(d[k]) is not None:
                d[k] = _number(d[k])  # YAML 1.1 reads 1e3 as a string
        n_before = len(self.problems)
        # One key at a time (the others at their defaults) so that every bad key is
        # reported; trend_min_logit < max_logit is the one check across keys, made last.
        for k, v in d.items():
            if k == "trend_min_logit":
                continue
            try:
                LogitGrowthPruner(**{"trend_min_logit": None, k: v})
            except (ValueError, TypeError) as e:
                self.error(f"pruner.{k}", str(e).rstrip("."))
        if len(self.problems) == n_before:
            try:
                LogitGrowthPruner(**d)
            except (ValueError, TypeError) as e:
                self.error("pruner.trend_min_logit", str(e).rstrip("."))
        if len(self.problems) > n_before:
            return PrunerSpec(loss=loss)
        return PrunerSpec(loss=loss, **d)

    def loss_pruner(self, value: Any) -> LossPrunerSpec:
        kinds = list(LOSS_PRUNER_ARGS)
        if value is None:
            return LossPrunerSpec()
        d = {"type": value} if isinstance(value, str) else value
        if not isinstance(d, Mapping):
            self.error("pruner.loss", "expected a pruner name or a mapping with 'type'", kinds)
            return LossPrunerSpec()
        kind = d.get("type", "none")
        if kind not in LOSS_PRUNER_ARGS:
            self.error("pruner.loss.type", f"unknown loss pruner {kind!r}", kinds)
            return LossPrunerSpec()
        n_before = len(self.problems)
        args = self.mapping({k: v for k, v in d.items() if k != "type"}, "pruner.loss",
                            ["type", *LOSS_PRUNER_ARGS[kind]])
        for k, v in args.items():
            if k == "percentile":
                ok, expected = _number(v) is not None, "a number"
                args[k] = _number(v)
            else:
                ok, expected = _is_int(v) or (k == "min_resource" and v == "auto"), "a whole number"
            if not ok:
                self.error(f"pruner.loss.{k}", f"expected {expected}, got {v!r}")
        if kind == "percentile" and "percentile" not in args:
            self.error("pruner.loss.percentile", "missing: the percentile pruner needs it "
                       "(0-100; prune trials worse than this percentile)")
        if len(self.problems) > n_before:
            return LossPrunerSpec()
        spec = LossPrunerSpec(kind, dict(args))
        try:
            spec.make()  # Optuna's own range checks
        except ValueError as e:
            self.error("pruner.loss", str(e).rstrip("."))
        return spec

    def sampler(self, value: Any, hyperparams: Hyperparams) -> SamplerSpec:
        kinds = list(get_args(SamplerType))
        d = {"type": value} if isinstance(value, str) else value
        d = self.mapping(d, "sampler", [f.name for f in dataclasses.fields(SamplerSpec)])
        kind = d.get("type", "auto")
        if kind not in kinds:
            self.error("sampler.type", f"unknown sampler {kind!r}", kinds)
            kind = "auto"
        if kind == "grid" and hyperparams:
            names = [n for n in HYPERPARAMS if getattr(hyperparams, n) is not None]
            self.error("sampler.type", "a grid needs a finite space, but "
                       f"{', '.join('hyperparams.' + n for n in names)} is continuous",
                       [k for k in kinds if k != "grid"])
        seed = d.get("seed", 0)
        if seed is not None and not _is_int(seed):
            self.error("sampler.seed", f"expected an integer or null, got {seed!r}")
            seed = 0
        startup = d.get("n_startup_trials")
        if startup is not None:
            if kind in ("grid", "random"):
                self.error("sampler.n_startup_trials", f"the {kind} sampler takes no "
                           "n_startup_trials", ["auto", "tpe", "gp"])
            elif not _is_int(startup) or startup < 0:
                self.error("sampler.n_startup_trials", f"expected a whole number >= 0, got "
                           f"{startup!r}")
        return SamplerSpec(type=kind, seed=seed, n_startup_trials=startup)


# --------------------------------------------------------------------------- helpers
def _join(prefix: str, key: str) -> str:
    return f"{prefix}.{key}" if prefix else key


def _is_int(v: object) -> bool:
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


def _number(v: object) -> float | None:
    """A finite number, also from a numeric string (YAML 1.1 reads ``1e-4`` as a string)."""
    if isinstance(v, bool):
        return None
    if isinstance(v, (numbers.Real, str)):
        try:
            x = float(v)  # type: ignore[arg-type]
        except ValueError:
            return None
        return x if math.isfinite(x) else None
    return None


def _range_list(r: LogRange) -> list[float]:
    return [r.low, r.high]


def _range_text(r: LogRange) -> str:
    return f"[{r.low:g}, {r.high:g}] (log)"
