"""The reader under the search-space schema: problems collected by key path, and the
search-control sections.

:class:`SchemaReader` collects every problem of a file instead of stopping at the first
(each a :class:`~geosearch.util.errors.ConfigError` naming the key path and the allowed
values), reads a mapping with its allowed keys, and parses the sections that say how
Optuna searches rather than what: ``budget``, ``pruner`` (with its loss pruner) and
``sampler``, into the dataclasses of :mod:`geosearch.search.space.sections`. The parser of the
whole file (:mod:`geosearch.search.space.schema`) extends it. Torch-free.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, get_args

from geosearch.util.checks import MAX_STEPS, SEED, Range, shown
from geosearch.util.errors import ConfigError
from geosearch.rules.roles import rules_for_roles
from geosearch.search.horizon.pruner import ARG_LIMITS
from geosearch.search.space.sections import (
    Budget,
    Hyperparams,
    LossPrunerSpec,
    PrunerSpec,
    SamplerSpec,
    SamplerType,
)

__all__ = ["BUDGET_LIMITS", "HYPERPARAMS", "MAX_STEP_GRID", "STEP_FACTOR_RANGE", "LOSS_PRUNER_ARGS", "LOSS_PRUNER_LIMITS", "REMOVED_PRUNER_KEYS",
           "READS", "SAMPLER_LIMITS", "SchemaReader", "SearchSpaceError", "join_key",
           "sections_to_read"]

READS = {"proxy": ("rules", "hyperparams", "target", "ladder"), "rules": ("geometries",),
         "geometries": ("hyperparams",), "hyperparams": ("sampler",),
         "repeats": ("max_repeats", "baselines"), "max_repeats": ("baselines",),
         "baselines": ("max_repeats",), "target": ("ladder",), "ladder": ("target",)}
"""Section -> the sections read with it or checked against it (``rules`` follows
``proxy`` only when it is the model's)."""


def sections_to_read(changed: set[str], rules_from_model: bool) -> set[str]:
    """The top-level sections to read again when ``changed`` change: they, and every section
    that :data:`READS` one of them."""
    out, todo = set(changed), list(changed)
    while todo:
        for k in READS.get(todo.pop(), ()):
            if k not in out and (k != "rules" or rules_from_model):
                out.add(k)
                todo.append(k)
    return out


REMOVED_PRUNER_KEYS = ("trend_min_logit", "horizon_steps")
"""Pruner keys of older spaces: an error says what replaced them."""
HYPERPARAMS = ("spectral_lr", "lr", "step_grid", "step_halving")
"""The keys of ``hyperparams``: the continuous parameters a space may search, the step grid
and how it is searched."""
STEP_FACTOR_RANGE = Range(0.01, 100)
"""One factor of ``hyperparams.step_grid`` (of ``proxy.spectral_lr``)."""
MAX_STEP_GRID = 5
"""Factors a step grid may list at most: each multiplies the space's points."""
LOSS_PRUNER_ARGS: dict[str, tuple[str, ...]] = {
    "none": (),
    "median": ("n_startup_trials", "n_warmup_steps", "interval_steps", "n_min_trials"),
    "percentile": ("percentile", "n_startup_trials", "n_warmup_steps", "interval_steps",
                   "n_min_trials"),
    "successive_halving": ("min_resource", "reduction_factor", "min_early_stopping_rate",
                           "bootstrap_count"),
}
"""Loss pruner -> the Optuna constructor arguments a space may set."""


BUDGET_LIMITS: dict[str, Range] = {
    "trials": Range(1, 1_000_000, whole=True, null=True),
    "timeout": Range(0, open_low=True, null=True),
}
"""``budget:``'s numbers -> their ranges."""
SAMPLER_LIMITS: dict[str, Range] = {
    "seed": dataclasses.replace(SEED, null=True),
    "n_startup_trials": Range(0, 1_000_000, whole=True, null=True),
}
"""``sampler:``'s numbers -> their ranges (a seed as numpy takes it, with room for the
workers' ``seed + i``)."""
LOSS_PRUNER_LIMITS: dict[str, Range] = {
    "percentile": Range(0, 100),
    "n_startup_trials": Range(0, 1_000_000, whole=True),
    "n_warmup_steps": Range(0, MAX_STEPS, whole=True),
    "interval_steps": Range(1, MAX_STEPS, whole=True),
    "n_min_trials": Range(1, 1_000_000, whole=True),
    "min_resource": Range(1, MAX_STEPS, whole=True),
    "reduction_factor": Range(2, 100, whole=True),
    "min_early_stopping_rate": Range(0, 100, whole=True),
    "bootstrap_count": Range(0, 1_000_000, whole=True),
}
"""The loss pruners' arguments (:data:`LOSS_PRUNER_ARGS`) -> their ranges (``min_resource``
may also be ``auto``)."""


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

    def role_rules(self, rules: Any, geometries: Any) -> Any:
        """The rules a space whose ``geometries`` name a role (``attn_qk``) uses: a stacked
        rule set's per-matrix twin (:func:`geosearch.rules.roles.rules_for_roles`); None, with
        the problem recorded, when the rules cannot cut Q from K."""
        if rules is None or not isinstance(geometries, Mapping):
            return rules
        try:
            return rules_for_roles(rules, [str(k) for k in geometries])
        except ConfigError as e:
            self.rekey(e, "geometries")
            return None

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
        """``budget:``: trials and timeout (seconds), each in its range of
        :data:`BUDGET_LIMITS` or null."""
        d = self.mapping(value, "budget", [f.name for f in dataclasses.fields(Budget)])
        out = {}
        for k, allowed in BUDGET_LIMITS.items():
            out[k], problem = allowed.check(d.get(k))
            if problem is not None:
                self.error(f"budget.{k}", problem)
                out[k] = None
        return Budget(**out)

    def pruner(self, value: Any) -> PrunerSpec:
        """``pruner:``: the LogitGrowthPruner's arguments, each in its range
        (:data:`~geosearch.search.horizon.pruner.ARG_LIMITS`), and its loss pruner."""
        fields = [f.name for f in dataclasses.fields(PrunerSpec)]
        for k in [k for k in REMOVED_PRUNER_KEYS if isinstance(value, Mapping) and k in value]:
            self.error(f"pruner.{k}", "removed: the step-wise logit trend was replaced by a forecast "
                       "in Σ η to the target (target.steps or --target-steps; pruner.interval and "
                       "pruner.max_logit_factor tune it)", fields)
            value = {kk: v for kk, v in value.items() if kk != k}
        d = self.mapping(value, "pruner", fields)
        loss = self.loss_pruner(d.pop("loss", None))
        n_before = len(self.problems)
        for k, v in d.items():  # one key at a time, so that every bad key is reported
            d[k], problem = ARG_LIMITS[k].check(v)  # YAML 1.1's 1e3, a string, read as a number
            if problem is not None:
                self.error(f"pruner.{k}", problem)
        if len(self.problems) > n_before:
            return PrunerSpec(loss=loss)
        return PrunerSpec(loss=loss, **d)

    def loss_pruner(self, value: Any) -> LossPrunerSpec:
        """``pruner.loss:``: a name or ``{type, ...}`` with the arguments of
        :data:`LOSS_PRUNER_ARGS`, each in its range (:data:`LOSS_PRUNER_LIMITS`), then
        range-checked by Optuna."""
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
            if k == "min_resource" and v == "auto":
                continue
            args[k], problem = LOSS_PRUNER_LIMITS[k].check(v)
            if problem is not None and k == "min_resource":
                problem = f"expected {LOSS_PRUNER_LIMITS[k].text} or 'auto', got {shown(v)}"
            if problem is not None:
                self.error(f"pruner.loss.{k}", problem)
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
            names = [n for n in ("spectral_lr", "lr") if getattr(hyperparams, n) is not None]
            self.error("sampler.type", "a grid needs a finite space, but "
                       f"{', '.join('hyperparams.' + n for n in names)} is continuous",
                       [k for k in kinds if k != "grid"])
        seed, problem = SAMPLER_LIMITS["seed"].check(d.get("seed", 0))
        if problem is not None:
            self.error("sampler.seed", problem)
            seed = 0
        startup = d.get("n_startup_trials")
        if startup is not None and kind in ("grid", "random"):
            self.error("sampler.n_startup_trials", f"the {kind} sampler takes no "
                       "n_startup_trials", ["auto", "tpe", "gp"])
        else:
            startup, problem = SAMPLER_LIMITS["n_startup_trials"].check(startup)
            if problem is not None:
                self.error("sampler.n_startup_trials", problem)
        return SamplerSpec(type=kind, seed=seed, n_startup_trials=startup)


def join_key(prefix: str, key: str) -> str:
    """The key path ``prefix.key`` (``key`` alone at the top)."""
    return f"{prefix}.{key}" if prefix else key
