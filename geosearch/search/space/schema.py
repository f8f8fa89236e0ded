"""The search-space YAML schema (version 1): reading a file into a SearchSpace, and back.

:func:`parse_space` validates a mapping as read from YAML and builds the
:class:`~geosearch.search.space.spec.SearchSpace` tree, collecting every problem of the file
before it raises (one :class:`~geosearch.search.space.reader.SearchSpaceError` naming the file, the
key path and the allowed values of each). When ``rules`` is not set, the space takes the
default rule set of ``proxy.model`` (:func:`geosearch.models.zoo.default_rules`), so a space
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
    geometries:                   # one Optuna categorical per key: a module type, a role
      attn: [stiefel, dgram]      #   (attn_qk, attn_vo: geosearch.rules.roles) or a family
      mlp: [stiefel, dgram]       #   (attn, mlp) covering its types; each type covered once
    hyperparams:                  # optional continuous parameters, log-uniform [low, high]
      spectral_lr: [0.005, 0.05]  #   or per geometry: {stiefel: [..], dgram: [..]}
      lr: [1.0e-4, 3.0e-3]        #   AdamW lr (embeddings, head, norms, adamw types)
      step_grid: [0.5, 1, 2]      #   or: each point at each factor of proxy.spectral_lr (2-5
                                  #   factors in [0.01, 100], 1 among them), ranked at the
                                  #   shared step and at each assignment's own best step
    proxy:                        # the proxy run: any geosearch.proxy.config.TrainConfig field
      model: small                #   tiny | small | gpt2 | hf:gpt2 | hf:llama | py:MODULE:FACTORY
      model_args: {}              #   model fields, e.g. {n_layer: 2} (geosearch.models.zoo)
      data: null                  #   corpus path; null = the built-in text
      vocab_size: null            #   the data's vocabulary, for train.bin/val.bin that name none
      steps: 200
      ...
    repeats: 1                    # seeds per assignment (proxy.seed, proxy.seed + 1, ...)
    max_repeats: null             # adaptive seeds: contenders get one more seed a round up
                                  #   to this many (null: repeats, i.e. off)
    baselines: [adamw, muon]      # trained beside, reported, never exported: adamw | muon |
                                  #   muon_qkclip; [] for none
    target: {steps: 2000, spectral_lr: null, model: null}   # the user's run (null: the proxy's)
    ladder: {rungs: 1, max_spectral_lr: null, max_steps: null, lower_seeds: null,
             stability_steps: null}
                                  #   rungs of growing Σ η towards the target's (null: the
                                  #   proxy's spectral_lr, proxy.steps; every seed below the top);
                                  #   stability_steps: a first rung of that many steps ending at
                                  #   the target's Σ η², which measures its logits (null: none)
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

Numbers: every number key takes a range (:func:`space_limits` gathers them; docs/design.md,
"Numbers", tables them): NaN and ±inf never; the steps of a run geosearch trains
(``proxy.steps``, ``ladder.max_steps``, ``ladder.stability_steps``, the warmup, eval and
probe intervals, the pruners' step counts) at most 10,000,000; ``target.steps`` at most 10⁹
(never trained); ``proxy.batch_size`` at most 100,000; ``eval_batches``,
``probe_batch_size``, ``grad_accum``, ``dual_steps``, ``ns_steps`` at most 10,000;
``repeats``, ``max_repeats``, ``ladder.lower_seeds`` at most 100; ``ladder.rungs`` at most
20; ``budget.trials`` at most 10⁶; seeds in [0, 2³¹ − 1]. A key given twice in the file is
refused (:mod:`geosearch.util.yaml_io`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Any, Generic, TypeVar

from geosearch.assignment import geometry_names
from geosearch.util.checks import MAX_STEPS, Range, parse_number, shown
from geosearch.rules.rule import rule_to_mapping
from geosearch.util.errors import ConfigError
from geosearch.optim import settings as optim_settings
from geosearch.optim.settings import ADAMW
from geosearch.rules.modules import (
    ModuleRule,
    check_rules,
    family_types,
    get_rule_set,
    module_types,
    rule_from_mapping,
    rule_set_names,
)
from geosearch.rules.roles import role_problem, role_types
from geosearch.proxy.config import LIMITS as TRAIN_LIMITS
from geosearch.proxy.config import OPTIMIZER_FIELDS, TrainConfig
from geosearch.search.records import STEP_FACTOR
from geosearch.models.specs import HF_PREFIX, PY_PREFIX, preset_rules
from geosearch.search.space.baseline_specs import REPEATS, parse_extras
from geosearch.search.space.reader import (
    BUDGET_LIMITS,
    HYPERPARAMS,
    LOSS_PRUNER_LIMITS,
    MAX_STEP_GRID,
    STEP_FACTOR_RANGE,
    SAMPLER_LIMITS,
    SchemaReader,
    SearchSpaceError,
    sections_to_read,
)
from geosearch.search.horizon.pruner import ARG_LIMITS as PRUNER_LIMITS
from geosearch.search.space.sections import Hyperparams, LogRange
from geosearch.search.runtime.storage import study_name_problem
from geosearch.search.space.horizon import LADDER_LIMITS, TARGET_LIMITS, parse_horizon

Space = TypeVar("Space")
"""The space class (:class:`~geosearch.search.space.spec.SearchSpace`, which calls this module:
named here by a type variable, so that the two modules do not import each other)."""

SCHEMA_VERSION = 1
TOP_KEYS = ("version", "name", "rules", "geometries", "hyperparams", "proxy", "repeats",
            "max_repeats", "baselines", "target", "ladder", "budget", "pruner", "sampler")
def space_limits() -> dict[str, Range]:
    """Every number key of a space, by its path, -> the values it may take: the ranges the
    sections check with (:class:`~geosearch.util.checks.Range`, the one rule for numbers: NaN and
    ±inf never, every count bounded), gathered from where each section keeps them. The
    hyperparameter ranges (``hyperparams.*``: ``[low, high]``, 0 < low < high) are lists and
    not in it. docs/design.md ("Numbers") shows this table.
    """
    out: dict[str, Range] = {"repeats": REPEATS, "max_repeats": dataclasses.replace(REPEATS, null=True)}
    for name in (f.name for f in dataclasses.fields(TrainConfig)):
        if name in TRAIN_LIMITS:
            out[f"proxy.{name}"] = TRAIN_LIMITS[name]
        elif name in OPTIMIZER_FIELDS and name in optim_settings.RANGES_OF:
            out[f"proxy.{name}"] = optim_settings.RANGES_OF[name]
    out.update({f"proxy.optimizer_args.{n}": r for n, r in optim_settings.RANGES_OF.items()
                if n in optim_settings.names("global") and n not in OPTIMIZER_FIELDS})
    out.update({f"target.{k}": r for k, r in TARGET_LIMITS.items()})
    out.update({f"ladder.{k}": r for k, r in LADDER_LIMITS.items()})
    out.update({f"budget.{k}": r for k, r in BUDGET_LIMITS.items()})
    out.update({f"pruner.{k}": r for k, r in PRUNER_LIMITS.items()})
    out.update({f"pruner.loss.{k}": r for k, r in LOSS_PRUNER_LIMITS.items()})
    out.update({f"sampler.{k}": r for k, r in SAMPLER_LIMITS.items()})
    return out


def parse_space(cls: type[Space], d: Any, source: str | None = None, keep: Any = None) -> Space:
    """Validate a mapping in the YAML schema (see the module docstring) into a ``cls``
    (:class:`~geosearch.search.space.spec.SearchSpace`, whose ``from_dict`` calls this).

    With ``keep`` (a parsed space) ``d`` holds only the top-level sections that change: they
    are read, with the sections whose checks read them
    (:data:`~geosearch.search.space.reader.READS`, from :func:`dump_space`); the others are
    ``keep``'s, as parsed. The same readers check
    both ways, so a flag's error reads as the file's would.

    Raises:
        SearchSpaceError: every problem found, each naming ``source``, the key path and
            the allowed values.
    """
    return _Parser(source, cls).space(d, keep)


def dump_space(space: Any, keys: Iterable[str] = TOP_KEYS) -> dict[str, Any]:
    """Plain YAML-safe data in the schema, which :func:`parse_space` turns back into ``space``
    (a :class:`~geosearch.search.space.spec.SearchSpace`): its top-level sections ``keys``."""
    dump = {"version": lambda: SCHEMA_VERSION, "name": lambda: space.name,
            "rules": lambda: _dump_rules(space.rules),
            "hyperparams": lambda: _dump_hyperparams(space),
            "geometries": lambda: {k: list(v) for k, v in space.geometries.items()},
            "proxy": lambda: space.proxy.to_dict(), "repeats": lambda: space.repeats,
            "max_repeats": lambda: space.max_repeats, "baselines": lambda: list(space.baselines),
            "pruner": lambda: {**{f.name: getattr(space.pruner, f.name) for f in dataclasses.fields(
                space.pruner) if f.name != "loss"}, "loss": {"type": space.pruner.loss.type,
                                                            **space.pruner.loss.args}}}
    return {k: dump[k]() if k in dump else dataclasses.asdict(getattr(space, k)) for k in keys}


def _dump_rules(rules: Any) -> Any:
    return rules if isinstance(rules, str) else [rule_to_mapping(r) for r in rules]


def _dump_hyperparams(space: Any) -> dict[str, Any]:
    hp: dict[str, Any] = {}
    if isinstance(space.hyperparams.spectral_lr, LogRange):
        hp["spectral_lr"] = _range_list(space.hyperparams.spectral_lr)
    elif space.hyperparams.spectral_lr:
        hp["spectral_lr"] = {g: _range_list(r) for g, r in space.hyperparams.spectral_lr.items()}
    if space.hyperparams.lr is not None:
        hp["lr"] = _range_list(space.hyperparams.lr)
    if space.hyperparams.step_grid is not None:
        hp["step_grid"] = list(space.hyperparams.step_grid)
        hp["step_halving"] = space.hyperparams.step_halving
    return hp


def _range_list(r: LogRange) -> list[float]:
    return [r.low, r.high]


class _Parser(SchemaReader, Generic[Space]):
    """Reads one space, collecting every problem instead of stopping at the first (the
    budget, pruner and sampler sections: :class:`~geosearch.search.space.reader.SchemaReader`)
    into a ``make`` (the space class)."""

    def __init__(self, source: str | None, make: type[Space]) -> None:
        super().__init__(source)
        self.make = make

    # ------------------------------------------------------------------ the whole file
    def space(self, d: Any, keep: Any = None) -> Space:
        if d is None:
            d = {}
        top = self.mapping(d, "", TOP_KEYS)
        if keep is None or "version" in top:
            self.version(d, top)
        if keep is None:
            redo = set(TOP_KEYS)
        else:  # the sections read with a changed one: from the parsed space
            redo = sections_to_read(set(top), keep.rules_from_model)
            top = {**dump_space(keep, redo - set(top) - {"rules"}), **top}

        def read(key: str, reader: Any, *args: Any) -> Any:
            return reader(*args) if key in redo else getattr(keep, key)

        name = read("name", self.name, top.get("name", "search"))
        n_before = len(self.problems)
        # first: the rules may come from its model
        proxy = read("proxy", self.proxy, top.get("proxy"))
        model_wrong = any(p.key is not None and p.key.split(".")[:2] in (["proxy", "model"], ["proxy", "model_args"])
                          for p in self.problems[n_before:])
        rules_from_model = "rules" not in top
        if "rules" not in redo:
            rules, rules_from_model = keep.rules, keep.rules_from_model
        elif rules_from_model:  # a wrong model has no rules: its problem says why, not "missing"
            rules = None if model_wrong else self.model_rules(top.get("proxy"))
        else:
            rules = self.rules(top["rules"])
        if "geometries" in redo:  # a role (attn_qk) on nanogpt: nanogpt_split
            rules = self.role_rules(rules, top.get("geometries"))
        geometries = read("geometries", self.geometries, top.get("geometries"), rules)
        hyperparams = read("hyperparams", self.hyperparams, top.get("hyperparams"), geometries,
                           proxy)
        repeats, problem = (REPEATS.check(top.get("repeats", 1)) if "repeats" in redo
                            else (keep.repeats, None))
        if problem is not None:
            self.error("repeats", problem)
        max_repeats, baselines = (parse_extras(self, top.get("max_repeats"), repeats,
                                               top.get("baselines", list(self.make.baselines)))
                                  if "baselines" in redo else (keep.max_repeats, keep.baselines))
        target, ladder = (parse_horizon(self, top.get("target"), top.get("ladder"), proxy)
                          if "target" in redo else (keep.target, keep.ladder))
        budget = read("budget", self.budget, top.get("budget"))
        pruner = read("pruner", self.pruner, top.get("pruner"))
        sampler = read("sampler", self.sampler, top.get("sampler"), hyperparams)

        if self.problems:
            raise SearchSpaceError(self.problems, self.source)
        assert rules is not None  # else a problem was recorded
        space = self.make(
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
    def version(self, d: Any, top: Mapping) -> None:
        if not isinstance(d, Mapping):
            return
        if "version" not in top:
            self.error("version", "missing schema version (add 'version: 1')", [SCHEMA_VERSION])
        elif top["version"] != SCHEMA_VERSION or isinstance(top["version"], bool):
            self.error("version", f"unsupported schema version {top['version']!r}",
                       [SCHEMA_VERSION])

    def name(self, name: Any) -> Any:
        if study_name_problem(name):  # it names the run directory
            self.error("name", study_name_problem(name))
        return name

    def model_rules(self, proxy: Any) -> str | tuple[ModuleRule, ...] | None:
        """The default rule set of ``proxy.model``, for a space that sets no rules; None when
        it has none (a problem for ``py:`` models; an unknown model is ``proxy``'s problem)."""
        model = proxy.get("model", TrainConfig.model) if isinstance(proxy, Mapping) else TrainConfig.model
        args = proxy.get("model_args") if isinstance(proxy, Mapping) else None
        name = preset_rules(model)
        if name is None and isinstance(model, str) and model.startswith(HF_PREFIX):
            from geosearch.models.zoo import default_rules  # torch: an hf: model of no known family

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
        types = module_types(rule_list)
        families = {**role_types(rule_list), **family_types(rule_list)}  # keys for several types
        out: dict[str, tuple[str, ...]] = {}
        for k, v in value.items():
            key = f"geometries.{k}"
            if types and k not in types and k not in families:
                self.error(key, f"unknown module type {k!r}{role_problem(rule_list, k)}",
                           [*families, *types])
            choices = self._choices(key, v, known)
            if choices is not None:
                out[str(k)] = choices
        if types:  # a type whose rule has a default (a router: adamw) may go unnamed
            defaulted = {t for r in rule_list if r.default is not None for t in r.types}
            self._check_coverage(out, families, types, defaulted)
        return out

    def _choices(self, key: str, v: Any, known: Sequence[str]) -> tuple[str, ...] | None:
        """One module type's geometries (a name or a list of names), checked against
        ``known``; None when they are not a name or a non-empty list."""
        choices = [v] if isinstance(v, str) else v
        if not isinstance(choices, Sequence) or not choices:
            self.error(key, "expected a geometry or a non-empty list of geometries", known)
            return None
        for c in choices:
            if c not in known:
                self.error(key, f"unknown geometry {c!r}", known)
        if len(set(map(str, choices))) != len(choices):
            self.error(key, "a geometry is listed twice")
        return tuple(str(c) for c in choices)

    def _check_coverage(self, out: dict[str, tuple[str, ...]], families: Mapping[str, Sequence[str]],
                        types: Sequence[str], defaulted: Collection[str] = ()) -> None:
        """Every module type covered by exactly one entry (at most one for the
        ``defaulted`` ones, which take their rule's default), and no entry named like a
        hyperparameter."""
        covered: dict[str, str] = {}
        for k in out:
            for t in families.get(k, [k] if k in types else []):
                if t in covered:
                    self.error(f"geometries.{k}", f"module type {t!r} is also covered by "
                               f"{covered[t]!r}; give each type one entry")
                covered[t] = k
        missing = [t for t in types if t not in covered and t not in defaulted]
        if missing:
            self.error("geometries", "no geometries for module type(s) "
                       f"{', '.join(missing)}", [*families, *types])
        clash = [k for k in out if k in HYPERPARAMS or k == STEP_FACTOR or k.startswith("spectral_lr.")]
        for k in clash:
            self.error(f"geometries.{k}", "a module type may not share a name with a "
                       "hyperparameter", HYPERPARAMS)

    def hyperparams(self, value: Any, geometries: dict[str, tuple[str, ...]],
                    proxy: TrainConfig) -> Hyperparams:
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
        grid = None
        if h.get("step_grid") is not None:
            grid = self.step_grid(h["step_grid"], searched=h.get("spectral_lr") is not None,
                                  shared=proxy.spectral_lr)
        halving = True
        if h.get("step_halving") is not None:
            if not isinstance(h["step_halving"], bool):
                self.error("hyperparams.step_halving", "expected true (successive halving over the "
                           "step grid) or false (every seed at every step), got "
                           f"{shown(h['step_halving'])}", ["true", "false"])
            else:  # without a grid it has nothing to halve (--set hyperparams.step_grid=null)
                halving = h["step_halving"]
        return Hyperparams(spectral_lr=spectral, lr=lr, step_grid=grid, step_halving=halving)

    def step_grid(self, value: Any, *, searched: bool, shared: float) -> tuple[float, ...] | None:
        """``hyperparams.step_grid``: 2 to :data:`MAX_STEP_GRID` distinct factors of
        ``proxy.spectral_lr``, each in :data:`STEP_FACTOR_RANGE`, 1 among them (the shared
        step the first answer is read at); one problem, naming the key, when it is not."""
        key = "hyperparams.step_grid"
        if searched:
            self.error(key, "hyperparams.spectral_lr already searches the step: give one or the other")
            return None
        if not shared > 0:
            self.error(key, f"scales proxy.spectral_lr, which is {shown(shared)}: give the shared "
                            "step (a number > 0)")
            return None
        nums = ([STEP_FACTOR_RANGE.check(x) for x in value]
                if isinstance(value, (list, tuple)) else [])
        factors = [float(x) for x, problem in nums if problem is None]
        if (not 2 <= len(nums) <= MAX_STEP_GRID or len(factors) < len(nums)
                or len(set(factors)) < len(factors) or 1.0 not in factors):
            self.error(key, f"expected 2 to {MAX_STEP_GRID} distinct factors of proxy.spectral_lr, "
                            f"each {STEP_FACTOR_RANGE.text}, 1 among them (the shared step), "
                            f"e.g. [0.5, 1, 2], got {shown(value)}")
            return None
        return tuple(factors)

    def log_range(self, value: Any, key: str) -> LogRange | None:
        nums = [parse_number(x) for x in value] if isinstance(value, (list, tuple)) else []
        if len(nums) != 2 or any(x is None for x in nums) or not 0 < nums[0] < nums[1]:
            self.error(key, f"expected [low, high], two numbers with 0 < low < high (a log-uniform "
                            f"range), got {shown(value)}")
            return None
        return LogRange(*nums)

    def proxy(self, value: Any) -> TrainConfig:
        fields = [f.name for f in dataclasses.fields(TrainConfig)]
        d = self.mapping(value, "proxy", fields)
        n_before = len(self.problems)
        for k, v in d.items():  # one at a time, so that every bad key is reported
            if k == "optimizer_args":
                continue  # checked key by key below
            try:  # the warmup against the most steps: the whole proxy is checked below
                TrainConfig.from_dict({k: v, "steps": MAX_STEPS} if k == "warmup_steps" else {k: v})
            except ConfigError as e:
                self.error(f"proxy.{k}", e.problem, e.allowed)
        model, model_args = d.get("model", TrainConfig.model), d.get("model_args") or {}
        if isinstance(model, str) and isinstance(model_args, Mapping):
            # Checking a spec makes its model config (torch, transformers for hf:, the
            # factory's module for py:): imported here, so that importing a space is light.
            from geosearch.models.zoo import check_model_spec

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
