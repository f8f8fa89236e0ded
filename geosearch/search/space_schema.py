"""The search-space YAML schema (version 1): reading a file into a SearchSpace, and back.

:func:`parse_space` validates a mapping as read from YAML and builds the
:class:`~geosearch.search.space.SearchSpace` tree, collecting every problem of the file
before it raises (one :class:`~geosearch.search.space.SearchSpaceError` naming the file, the
key path and the allowed values of each). When ``rules`` is not set, the space takes the
default rule set of ``proxy.model`` (:func:`geosearch.proxy.specs.default_rules`), so a space
written for the proxy searches LLaMA's module types under ``--model hf:llama``. The proxy
section is checked field by field against :class:`~geosearch.proxy.config.TrainConfig`
(:meth:`_Parser.proxy`); :func:`dump_space` writes a space back. The schema, every key
optional but ``version`` and ``geometries``::

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
    proxy:                        # the proxy run: any geosearch.proxy.config.TrainConfig field
      model: small                #   tiny | small | gpt2 | hf:gpt2 | hf:llama | py:MODULE:FACTORY
      model_args: {}              #   model fields, e.g. {n_layer: 2} (geosearch.proxy.zoo)
      data: null                  #   corpus path; null = the built-in text
      steps: 200
      ...
    repeats: 1                    # seeds per assignment (proxy.seed, proxy.seed + 1, ...)
    max_repeats: null             # adaptive seeds: contenders get one more seed a round up
                                  #   to this many (null: repeats, i.e. off)
    baselines: [adamw, muon]      # trained beside, reported, never exported: adamw | muon |
                                  #   muon_qkclip; [] for none
    target: {steps: 2000, spectral_lr: null, model: null}   # the user's run (null: the proxy's)
    ladder: {rungs: 1, max_spectral_lr: null, max_steps: null, lower_seeds: null}
                                  #   rungs of growing Σ η towards the target's (null: 10 ×
                                  #   proxy.spectral_lr, proxy.steps; every seed below the top)
    budget: {trials: null, timeout: null}   # trials; seconds (null = no limit)
    pruner:                       # LogitGrowthPruner arguments (null disables a rule)
      max_logit: 1000.0           #   absolute, for trials without a logit scale
      max_logit_factor: 10.0      #   × the model's d/√d_head
      min_entropy: 0.01
      n_warmup_steps: 0
      window: 5
      interval: 0.9               #   of the max-logit forecast in Σ η to the target
      max_extrapolation: 4.0      #   prune on it only once the run's Σ η >= target's / 4
      loss: none                  # none | median | percentile | successive_halving, or
                                  #   {type: median, n_startup_trials: 2, ...}
    sampler: {type: auto, seed: 0}  # auto | grid | tpe | random | gp (+ n_startup_trials)
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, get_args

from geosearch.assignment import ADAMW, geometry_names
from geosearch.errors import ConfigError
from geosearch.optim import settings as optim_settings
from geosearch.modules import (
    ModuleRule,
    check_rules,
    family_types,
    get_rule_set,
    module_types,
    rule_from_mapping,
    rule_set_names,
)
from geosearch.proxy.config import TrainConfig
from geosearch.proxy.specs import HF_PREFIX, PY_PREFIX, default_rules
from geosearch.search.baselines import parse_extras
from geosearch.search.pruners import LogitGrowthPruner
from geosearch.search.sections import (
    Budget,
    Hyperparams,
    LogRange,
    LossPrunerSpec,
    PrunerSpec,
    SamplerSpec,
    SamplerType,
)
from geosearch.search.space import (
    SearchSpace,
    SearchSpaceError,
)
from geosearch.search.storage import study_name_problem
from geosearch.search.target import parse_horizon

SCHEMA_VERSION = 1
TOP_KEYS = ("version", "name", "rules", "geometries", "hyperparams", "proxy", "repeats",
            "max_repeats", "baselines", "target", "ladder", "budget", "pruner", "sampler")
# Pruner keys of older spaces: an error says what replaced them.
REMOVED_PRUNER_KEYS = ("trend_min_logit", "horizon_steps")
HYPERPARAMS = ("spectral_lr", "lr")
# Loss pruner -> its Optuna constructor arguments a space may set.
LOSS_PRUNER_ARGS: dict[str, tuple[str, ...]] = {
    "none": (),
    "median": ("n_startup_trials", "n_warmup_steps", "interval_steps", "n_min_trials"),
    "percentile": ("percentile", "n_startup_trials", "n_warmup_steps", "interval_steps",
                   "n_min_trials"),
    "successive_halving": ("min_resource", "reduction_factor", "min_early_stopping_rate",
                           "bootstrap_count"),
}


def parse_space(d: Any, source: str | None = None) -> SearchSpace:
    """Validate a mapping in the YAML schema (see the module docstring) into a space.

    Raises:
        SearchSpaceError: every problem found, each naming ``source``, the key path and
            the allowed values.
    """
    return _Parser(source).space(d)


def dump_space(space: SearchSpace) -> dict[str, Any]:
    """Plain YAML-safe data in the schema, which :func:`parse_space` turns back into ``space``."""
    rules: Any = space.rules
    if not isinstance(rules, str):
        rules = [{"type": r.type, "pattern": r.pattern, "family": r.family,
                  "split": list(r.split), "layout": r.layout} for r in rules]
    hp: dict[str, Any] = {}
    if isinstance(space.hyperparams.spectral_lr, LogRange):
        hp["spectral_lr"] = _range_list(space.hyperparams.spectral_lr)
    elif space.hyperparams.spectral_lr:
        hp["spectral_lr"] = {g: _range_list(r) for g, r in space.hyperparams.spectral_lr.items()}
    if space.hyperparams.lr is not None:
        hp["lr"] = _range_list(space.hyperparams.lr)
    pruner = {f.name: getattr(space.pruner, f.name)
              for f in dataclasses.fields(space.pruner) if f.name != "loss"}
    pruner["loss"] = {"type": space.pruner.loss.type, **space.pruner.loss.args}
    return {
        "version": SCHEMA_VERSION,
        "name": space.name,
        "rules": rules,
        "geometries": {k: list(v) for k, v in space.geometries.items()},
        "hyperparams": hp,
        "proxy": space.proxy.to_dict(),
        "repeats": space.repeats,
        "max_repeats": space.max_repeats,
        "baselines": list(space.baselines),
        "target": dataclasses.asdict(space.target),
        "ladder": dataclasses.asdict(space.ladder),
        "budget": dataclasses.asdict(space.budget),
        "pruner": pruner,
        "sampler": dataclasses.asdict(space.sampler),
    }


def _range_list(r: LogRange) -> list[float]:
    return [r.low, r.high]


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
        if study_name_problem(name):  # it names the run directory
            self.error("name", study_name_problem(name))
        rules_from_model = "rules" not in top
        rules = self.model_rules(top.get("proxy")) if rules_from_model else self.rules(top["rules"])
        geometries = self.geometries(top.get("geometries"), rules)
        hyperparams = self.hyperparams(top.get("hyperparams"), geometries)
        proxy = self.proxy(top.get("proxy"))
        repeats = top.get("repeats", 1)
        if not _is_int(repeats) or repeats < 1:
            self.error("repeats", f"expected a whole number >= 1, got {repeats!r}")
        max_repeats, baselines = parse_extras(self, top.get("max_repeats"), repeats,
                                              top.get("baselines", list(SearchSpace.baselines)))
        target, ladder = parse_horizon(self, top.get("target"), top.get("ladder"), proxy)
        budget = self.budget(top.get("budget"))
        pruner = self.pruner(top.get("pruner"))
        sampler = self.sampler(top.get("sampler"), hyperparams)

        if self.problems:
            raise SearchSpaceError(self.problems, self.source)
        assert rules is not None  # else a problem was recorded
        space = SearchSpace(
            geometries=geometries, proxy=proxy, rules=rules, hyperparams=hyperparams,
            repeats=repeats, max_repeats=max_repeats, baselines=baselines, budget=budget, pruner=pruner, sampler=sampler, name=name,
            source=self.source, rules_from_model=rules_from_model, target=target, ladder=ladder,
        )
        if budget.trials is None and budget.timeout is None and space.sampler_type() != "grid":
            self.error("budget", f"a {space.sampler_type()} search never ends by itself: set "
                       "budget.trials or budget.timeout")
            raise SearchSpaceError(self.problems, self.source)
        return space

    # ------------------------------------------------------------------ sections
    def model_rules(self, proxy: Any) -> str | tuple[ModuleRule, ...] | None:
        """The default rule set of ``proxy.model``, for a space that sets no rules; None when
        it has none (a problem for ``py:`` models; an unknown model is ``proxy``'s problem)."""
        model = proxy.get("model", TrainConfig.model) if isinstance(proxy, Mapping) else TrainConfig.model
        args = proxy.get("model_args") if isinstance(proxy, Mapping) else None
        name = default_rules(model, args if isinstance(args, Mapping) else None)
        if name is None and isinstance(model, str) and model.startswith((PY_PREFIX, HF_PREFIX)):
            self.error("rules", f"missing: model {model!r} has no default rule set; name one, or "
                       "write rules matching its parameter names (geosearch inspect --model "
                       f"{model} --rules NAME shows how a rule set fits)", rule_set_names())
        return name

    def rules(self, value: Any) -> str | tuple[ModuleRule, ...] | None:
        """The rules, or None when they are wrong (the problems are recorded)."""
        if isinstance(value, str):
            if value not in rule_set_names():
                self.error("rules", f"unknown rule set {value!r}", rule_set_names())
                return None
            return value
        if isinstance(value, Mapping) or not isinstance(value, Sequence) or not value:
            self.error("rules", "expected a rule-set name or a non-empty list of rules",
                       rule_set_names())
            return None
        out = []
        for i, r in enumerate(value):  # each rule on its own, so that every bad one is reported
            try:
                out.append(rule_from_mapping(r, key=f"rules[{i}]"))
            except ConfigError as e:
                self.error(e.key, e.problem, e.allowed)
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
        fields = [f.name for f in dataclasses.fields(TrainConfig)]
        d = self.mapping(value, "proxy", fields)
        n_before = len(self.problems)
        for k, v in d.items():  # one at a time, so that every bad key is reported
            if k == "optimizer_args":
                continue  # checked key by key below
            try:
                TrainConfig.from_dict({k: v})
            except ConfigError as e:
                self.error(f"proxy.{k}", e.problem, e.allowed)
        model, model_args = d.get("model", TrainConfig.model), d.get("model_args") or {}
        if isinstance(model, str) and isinstance(model_args, Mapping):
            # Checking a spec makes its model config (torch, transformers for hf:, the
            # factory's module for py:): imported here, so that importing a space is light.
            from geosearch.proxy.zoo import check_model_spec

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
        allowed = [k for k in optim_settings.names("global") if k not in train_fields]
        for k, v in args.items():
            key = f"proxy.optimizer_args.{k}"
            if k in train_fields:
                self.error(key, f"set it as proxy.{k}")
            elif k not in allowed:
                self.error(key, f"unknown optimizer setting {k!r}", allowed)
            else:
                try:
                    optim_settings.check(k, v, key=key)
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
        for k in [k for k in REMOVED_PRUNER_KEYS if isinstance(value, Mapping) and k in value]:
            self.error(f"pruner.{k}", "removed: the step-wise logit trend was replaced by a forecast "
                       "in Σ η to the target (target.steps or --target-steps; pruner.interval and "
                       "pruner.max_logit_factor tune it)", fields)
            value = {kk: v for kk, v in value.items() if kk != k}
        d = self.mapping(value, "pruner", fields)
        loss = self.loss_pruner(d.pop("loss", None))
        for k in ("max_logit", "max_logit_factor", "min_entropy", "interval", "max_extrapolation"):
            if isinstance(d.get(k), str) and _number(d[k]) is not None:
                d[k] = _number(d[k])  # YAML 1.1 reads 1e3 as a string
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
