"""The reader under the search-space schema: problems collected by key path, and the
search-control sections.

:class:`SchemaReader` collects every problem of a file instead of stopping at the first
(each a :class:`~geosearch.errors.ConfigError` naming the key path and the allowed
values), reads a mapping with its allowed keys, and parses the sections that say how
Optuna searches rather than what: ``budget``, ``pruner`` (with its loss pruner) and
``sampler``, into the dataclasses of :mod:`geosearch.search.space.sections`. The parser of the
whole file (:mod:`geosearch.search.space.schema`) extends it. Torch-free.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, get_args

from geosearch.checks import is_whole, parse_number
from geosearch.errors import ConfigError
from geosearch.search.horizon.pruner import LogitGrowthPruner
from geosearch.search.space.sections import (
    Budget,
    Hyperparams,
    LossPrunerSpec,
    PrunerSpec,
    SamplerSpec,
    SamplerType,
)

__all__ = ["HYPERPARAMS", "LOSS_PRUNER_ARGS", "REMOVED_PRUNER_KEYS", "SchemaReader", "SearchSpaceError",
           "join_key"]

REMOVED_PRUNER_KEYS = ("trend_min_logit", "horizon_steps")
"""Pruner keys of older spaces: an error says what replaced them."""
HYPERPARAMS = ("spectral_lr", "lr")
"""The continuous parameters a space may search (``hyperparams``)."""
LOSS_PRUNER_ARGS: dict[str, tuple[str, ...]] = {
    "none": (),
    "median": ("n_startup_trials", "n_warmup_steps", "interval_steps", "n_min_trials"),
    "percentile": ("percentile", "n_startup_trials", "n_warmup_steps", "interval_steps",
                   "n_min_trials"),
    "successive_halving": ("min_resource", "reduction_factor", "min_early_stopping_rate",
                           "bootstrap_count"),
}
"""Loss pruner -> the Optuna constructor arguments a space may set."""


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


class SchemaReader:
    """Reads a space's sections, collecting every problem in ``problems``.

    Args:
        source: the file read, for the messages (``None``: a mapping given in code).
    """

    def __init__(self, source: str | None) -> None:
        self.source = source
        self.problems: list[ConfigError] = []

    def error(self, key: str, problem: str, allowed: Iterable[object] | None = None) -> None:
        """Record a problem at the key path ``key`` (``""``: the file itself)."""
        self.problems.append(ConfigError(problem, key=key or None, allowed=allowed))

    def rekey(self, e: ConfigError, prefix: str) -> None:
        """Record a section's own error under the section's key path ``prefix``."""
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
                self.error(join_key(key, str(k)), f"unknown key {k!r}", allowed)
        return out

    def budget(self, value: Any) -> Budget:
        """``budget:``: trials (a whole number >= 1) and timeout (seconds > 0), each or null."""
        d = self.mapping(value, "budget", [f.name for f in dataclasses.fields(Budget)])
        trials, timeout = d.get("trials"), d.get("timeout")
        if trials is not None and (not is_whole(trials) or trials < 1):
            self.error("budget.trials", f"expected a whole number >= 1 or null, got {trials!r}")
            trials = None
        if timeout is not None:
            t = parse_number(timeout)
            if t is None or not 0 < t < math.inf:
                self.error("budget.timeout", f"expected seconds > 0 or null, got {timeout!r}")
            timeout = t
        return Budget(trials=trials, timeout=timeout)

    def pruner(self, value: Any) -> PrunerSpec:
        """``pruner:``: the LogitGrowthPruner's arguments, each checked by the pruner, and
        its loss pruner."""
        fields = [f.name for f in dataclasses.fields(PrunerSpec)]
        for k in [k for k in REMOVED_PRUNER_KEYS if isinstance(value, Mapping) and k in value]:
            self.error(f"pruner.{k}", "removed: the step-wise logit trend was replaced by a forecast "
                       "in Σ η to the target (target.steps or --target-steps; pruner.interval and "
                       "pruner.max_logit_factor tune it)", fields)
            value = {kk: v for kk, v in value.items() if kk != k}
        d = self.mapping(value, "pruner", fields)
        loss = self.loss_pruner(d.pop("loss", None))
        for k in ("max_logit", "max_logit_factor", "min_entropy", "interval", "max_extrapolation"):
            if isinstance(d.get(k), str) and parse_number(d[k]) is not None:
                d[k] = parse_number(d[k])  # YAML 1.1 reads 1e3 as a string
        n_before = len(self.problems)
        for k, v in d.items():  # one key at a time, so that every bad key is reported
            try:
                LogitGrowthPruner(**{k: v})
            except (ValueError, TypeError) as e:
                self.error(f"pruner.{k}", str(e).rstrip("."))
        if len(self.problems) > n_before:
            return PrunerSpec(loss=loss)
        return PrunerSpec(loss=loss, **d)

    def loss_pruner(self, value: Any) -> LossPrunerSpec:
        """``pruner.loss:``: a name or ``{type, ...}`` with the arguments of
        :data:`LOSS_PRUNER_ARGS`, range-checked by Optuna."""
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
                ok, expected = parse_number(v) is not None, "a number"
                args[k] = parse_number(v)
            else:
                ok, expected = is_whole(v) or (k == "min_resource" and v == "auto"), "a whole number"
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
        """``sampler:``: a name or ``{type, seed, n_startup_trials}``; a grid needs a space
        without continuous ``hyperparams``."""
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
        if seed is not None and not is_whole(seed):
            self.error("sampler.seed", f"expected an integer or null, got {seed!r}")
            seed = 0
        startup = d.get("n_startup_trials")
        if startup is not None:
            if kind in ("grid", "random"):
                self.error("sampler.n_startup_trials", f"the {kind} sampler takes no "
                           "n_startup_trials", ["auto", "tpe", "gp"])
            elif not is_whole(startup) or startup < 0:
                self.error("sampler.n_startup_trials", f"expected a whole number >= 0, got "
                           f"{startup!r}")
        return SamplerSpec(type=kind, seed=seed, n_startup_trials=startup)


def join_key(prefix: str, key: str) -> str:
    """The key path ``prefix.key`` (``key`` alone at the top)."""
    return f"{prefix}.{key}" if prefix else key
