"""Search spaces: which geometries each module type may take, and how to score them.

A search space is a YAML file (the schema is in :mod:`geosearch.search.space.schema`) loaded
into :class:`SearchSpace`, a tree of typed frozen dataclasses that makes the study's sampler,
pruner and proxy config and turns each trial into a :class:`Suggestion` (an assignment plus
the proxy settings it changes). The shipped spaces (``default``, ``paper``, ``full``,
``llama``) load by name; command-line flags and ``key=value`` overrides go through
:func:`apply_overrides`, which moves rules derived from the model along with the model::

    >>> space = load_space("default")
    >>> space.categorical_choices()
    {'geometry.attn': ['stiefel', 'dgram'], 'geometry.mlp': ['stiefel', 'dgram']}
    >>> space.grid_size()
    4
"""

from __future__ import annotations

import dataclasses
import importlib.util
import math
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, get_args

import optuna

from geosearch.assignment import Assignment
from geosearch.util.errors import ConfigError
from geosearch.util.files import read_user_text
from geosearch.util.text import wrap
from geosearch.rules.modules import ModuleRule
from geosearch.proxy.config import TrainConfig
from geosearch.search.horizon.pruner import LogitGrowthPruner
from geosearch.search.records import SPACE, STEP_FACTOR
from geosearch.search.space.sections import (
    Budget,
    Hyperparams,
    LogRange,
    PrunerSpec,
    SamplerSpec,
    SamplerType,
)
from geosearch.search.space.horizon import LadderSpec, TargetSpec
from geosearch.search.space.reader import SearchSpaceError
from geosearch.search.space.schema import TOP_KEYS, dump_space, parse_space
from geosearch.util.yaml_io import parse_value, parse_yaml

__all__ = ["SearchSpace", "Suggestion", "apply_overrides", "load_space", "space_names", "study_pruner"]

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
    "tokenizer": "proxy.tokenizer",
    "vocab_size": "proxy.vocab_size",
    "batch_size": "proxy.batch_size",
    "device": "proxy.device",
    "mixed_precision": "proxy.mixed_precision",
    "grad_accum": "proxy.grad_accum",
    "compile": "proxy.compile",
    "log_with": "proxy.log_with",
    "repeats": "repeats",
    "seed": "sampler.seed",
    "sampler": "sampler.type",
    "name": "name",
    "target_steps": "target.steps",
    "target_spectral_lr": "target.spectral_lr",
    "target_model": "target.model",
}
_SHIPPED = resources.files("geosearch.search.space") / "spaces"


# --------------------------------------------------------------------------- the tree
@dataclass(frozen=True)
class Suggestion:
    """What one trial tries: an assignment and the proxy settings it changes.

    Attributes:
        geometry: categorical parameter (module type or shorthand) -> geometry.
        options: per-key assignment options (a per-geometry ``spectral_lr`` sets ``lr``).
        train_overrides: :class:`~geosearch.proxy.config.TrainConfig` fields to replace
            (``spectral_lr``, ``lr`` when searched; ``spectral_lr`` = the proxy's × the step
            factor with a step grid).
        rules: the rule set, for the assignment.
        step_factor: the factor of ``proxy.spectral_lr`` of a step grid (1: the shared step);
            the target it trains for is the user's run at that factor of the target's step.
    """

    geometry: dict[str, str]
    options: dict[str, dict[str, float]]
    train_overrides: dict[str, float]
    rules: str | tuple[ModuleRule, ...]
    step_factor: float = 1.0

    def assignment(self, provenance: Mapping[str, Any] | None = None,
                   settings: Mapping[str, Any] | None = None) -> Assignment:
        """The :class:`~geosearch.assignment.Assignment` this suggestion trains; with
        ``settings`` (the run's global optimizer settings, see
        :meth:`~geosearch.proxy.config.TrainConfig.optimizer_settings`) it reproduces the
        run's optimizer on its own."""
        rules = self.rules if isinstance(self.rules, str) else list(self.rules)
        return Assignment(geometry=dict(self.geometry), options=dict(self.options), rules=rules,
                          settings=dict(settings or {}), provenance=dict(provenance or {}))


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
    max_repeats: int | None = None
    """Seeds an assignment may get at most with adaptive seeds: after the points, the best and
    those within noise of it get one more seed a round until separated or at this many;
    ``None`` (or ``repeats``) = off."""
    baselines: tuple[str, ...] = ("adamw", "muon")
    """Baselines trained beside the assignments, reported and never exported
    (:data:`geosearch.search.study.baseline_trials.BASELINES`); ``()`` = none."""
    budget: Budget = field(default_factory=Budget)
    """Trials and timeout."""
    target: TargetSpec = field(default_factory=TargetSpec)
    """The run the user will do; the answer is for its Σ η."""
    ladder: LadderSpec = field(default_factory=LadderSpec)
    """The rungs of growing Σ η each trial trains; the value is read at the top one."""
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
        """Validate a mapping in the YAML schema (:mod:`geosearch.search.space.schema`).

        Raises:
            SearchSpaceError: every problem found, each naming ``source``, the key path
                and the allowed values.
        """
        return parse_space(cls, d, source)

    @classmethod
    def from_stored(cls, d: Any, source: str) -> SearchSpace | None:
        """The space a study stored (its ``space`` attr), read without its model: checking a
        model imports a ``py:`` model's code, and reading a finished study runs no user
        code. What a stored point needs (geometries, rules, searched settings, pruner) is
        there; ``None`` when the stored space does not read (an older schema, say)."""
        if not isinstance(d, dict):
            return None
        proxy = d.get("proxy")
        if isinstance(proxy, dict):
            proxy = {k: v for k, v in proxy.items() if k not in ("model", "model_args")}
        try:
            return cls.from_dict({**d, "proxy": proxy}, source=source)
        except (ConfigError, ValueError):
            return None

    def to_dict(self) -> dict[str, Any]:
        """Plain YAML-safe data that :meth:`from_dict` turns back into this space."""
        return dump_space(self)

    # ------------------------------------------------------------------ what a study needs
    def categorical_choices(self) -> dict[str, list[Any]]:
        """One Optuna categorical per geometries key: ``geometry.<key>`` -> choices; and
        ``step_factor`` -> the step grid's factors when the space has one."""
        out: dict[str, list[Any]] = {f"geometry.{k}": list(v) for k, v in self.geometries.items()}
        if self.hyperparams.step_grid is not None:
            out[STEP_FACTOR] = list(self.hyperparams.step_grid)
        return out

    def grid_size(self) -> int | float:
        """Number of distinct points (assignments, times the step grid's factors), or
        ``math.inf`` when continuous hyperparameters are searched too."""
        if self.hyperparams:
            return math.inf
        return math.prod(len(v) for v in self.categorical_choices().values())

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
        """The :class:`~geosearch.search.horizon.pruner.LogitGrowthPruner` of ``pruner``."""
        return self.pruner.make()

    def suggest(self, trial: optuna.trial.BaseTrial) -> Suggestion:
        """Ask ``trial`` for one point of the space.

        Parameter names: ``geometry.<key>`` for each geometries key (``geometry.attn``...), ``spectral_lr`` or
        ``spectral_lr.<geometry>`` (only for geometries this trial uses), ``lr``, ``step_factor``
        (the step grid's: the run's ``spectral_lr`` is the proxy's × it). Pass
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
        factor = 1.0
        if self.hyperparams.step_grid is not None:
            factor = float(trial.suggest_categorical(STEP_FACTOR, list(self.hyperparams.step_grid)))
            overrides["spectral_lr"] = self.proxy.spectral_lr * factor
        return Suggestion(geometry, options, overrides, self.rules, factor)

    def train_config(self, suggestion: Suggestion | None = None, repeat: int = 0) -> TrainConfig:
        """The proxy config of one run: ``proxy`` with the suggestion's overrides and seed
        ``proxy.seed + repeat``."""
        overrides = suggestion.train_overrides if suggestion is not None else {}
        return dataclasses.replace(self.proxy, seed=self.proxy.seed + repeat, **overrides)

    def summary(self, plan_lines: Sequence[str] = ()) -> str:
        """A few lines for a person: what is searched, how, on which proxy; ``plan_lines``
        (the study plan's :meth:`~geosearch.search.space.plan.StudyPlan.header_lines`) go
        before the sampler's. Each is wrapped at :data:`~geosearch.util.text.WIDTH` columns."""
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
        if self.hyperparams.step_grid is not None:
            steps = ", ".join(f"{self.proxy.spectral_lr * f:.3g}" for f in self.hyperparams.step_grid)
            hp.append(f"spectral_lr in {{{steps}}} (step grid x{', x'.join(f'{f:g}' for f in self.hyperparams.step_grid)} "
                      "of the shared step: ranked at the shared step and at each assignment's own best"
                      + ("; successive halving: every seed at the shared step, 1 at the others, the rest at the best)"
                         if self.hyperparams.step_halving else "; every seed at every step)"))
        p = self.proxy
        seeds = f"{self.repeats} seed(s) each" + (
            f", up to {self.max_repeats} for the contenders (adaptive)"
            if self.max_repeats and self.max_repeats > self.repeats else "")
        lines = [
            f"search space {self.name!r} ({self.source or 'inline'})",
            f"  geometries: {params}"
            + (f" = {size} {'points' if self.hyperparams.step_grid else 'assignments'}"
               if size != math.inf else "")
            + (f"; rule set {self.rules!r}" if isinstance(self.rules, str) else "; the space's rules")
            + (" (the model's)" if self.rules_from_model else ""),
            *([f"  hyperparams: {', '.join(hp)}"] if hp else []),
            f"  proxy: {p.model}{p.model_args or ''}, {p.steps} steps x {p.batch_size} seqs, "
            f"data {p.data or 'built-in'}, solver {p.solver}; {seeds}",
            *plan_lines,
            f"  sampler: {self.sampler_type()}; budget: trials {self.budget.trials}, "
            f"timeout {self.budget.timeout}",
        ]
        return "\n".join(part for line in lines for part in wrap(line))  # at most WIDTH columns


# --------------------------------------------------------------------------- loading
def space_names() -> list[str]:
    """Names of the search spaces shipped with geosearch (``load_space(name)``)."""
    return sorted(p.name[: -len(".yaml")] for p in _SHIPPED.iterdir() if p.name.endswith(".yaml"))


def load_space(path: str | os.PathLike) -> SearchSpace:
    """Read a search space from a YAML file, or a shipped one by name (``"default"``).

    A shipped name (:func:`space_names`) always means the shipped space, whatever the
    working directory holds (write ``./default`` for a file named ``default``).

    Raises:
        ConfigError: missing or unreadable file (listing the shipped names), a directory,
            pipe or device, more than 1 MiB, not UTF-8 (:func:`geosearch.util.files.read_user_text`),
            malformed YAML (with line and column), too many YAML aliases; :class:`SearchSpaceError`
            for every problem of its content.
    """
    text_path = os.fspath(path)
    if text_path in space_names():
        shipped = _SHIPPED / f"{text_path}.yaml"
        source, text = str(shipped), shipped.read_text(encoding="utf-8")
        name = text_path
    else:
        source, name = text_path, Path(text_path).stem
        text = read_user_text(text_path, what="a search-space YAML file",
                              missing="no such file, nor a shipped search space of that name",
                              allowed=space_names())
    data = parse_yaml(text, source=source)
    if not isinstance(data, dict):
        got = "an empty file" if data is None else f"a {type(data).__name__}"
        raise ConfigError(f"expected a search space (a mapping: version, geometries, ...), got {got}",
                          source=source)
    if "name" not in data:
        data = {**data, "name": name}
    return SearchSpace.from_dict(data, source=source)


def apply_overrides(
    space: SearchSpace,
    overrides: Iterable[str] | Mapping[str, Any] = (),
    /,
    **flags: Any,
) -> SearchSpace:
    """A copy of ``space`` with some keys replaced, validated again: the sections the keys
    name, and those checked against them, are read by the schema's own readers (the same
    errors as in a file); the others are kept as parsed (no dump and re-read of the space).

    Args:
        space: the space to start from.
        overrides: dotted ``key=value`` strings as typed on a command line (the value is
            read as YAML: ``proxy.steps=100``, ``proxy.data=null``,
            ``hyperparams.lr=[1e-4,1e-3]``), or a mapping of dotted keys to values.
        **flags: command-line flags, the keys of :data:`CLI_FLAGS` (the one list of them:
            ``geosearch search`` passes each of its arguments of that name); a ``None`` value
            means "not given". Applied after ``overrides``.

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
            pairs.append((key.strip(), parse_value(value, source=f"{source}: {key.strip()}")))
    pairs.extend((CLI_FLAGS[f], v) for f, v in flags.items() if v is not None)
    if not pairs:
        return space

    # only the sections the keys name are dumped and read again, with those whose checks
    # read them (a model's rules follow its model); the others stay as parsed
    top = {k.split(".")[0] for k, _ in pairs}
    d: dict[str, Any] = {**dump_space(space, top & set(TOP_KEYS)),
                         **{k: None for k in top - set(TOP_KEYS)}}
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
    return _parse_overridden(d, source, space)


def _parse_overridden(d: dict[str, Any], source: str, space: SearchSpace) -> SearchSpace:
    """The space with its overrides; of several problems the first in the schema's order is
    said (flags on a command line: one problem at a time, one line)."""
    try:
        return parse_space(SearchSpace, d, source, keep=space)
    except SearchSpaceError as e:
        if len(e.problems) < 2:
            raise
        raise SearchSpaceError(e.problems[:1], source) from None


def _range_text(r: LogRange) -> str:
    return f"[{r.low:g}, {r.high:g}] (log)"


def study_pruner(study: optuna.Study) -> LogitGrowthPruner:
    """The stability pruner of the study's stored space (its thresholds, interval and
    ``max_extrapolation``); the defaults when the stored space does not read."""
    space = SearchSpace.from_stored(study.user_attrs.get(SPACE), f"study {study.study_name!r} (attrs)")
    return space.make_pruner() if space is not None else LogitGrowthPruner()
