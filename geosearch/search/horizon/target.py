"""The user's target run and the Σ η ladder towards it: a space's ``target:`` and ``ladder:``.

A study answers for a *target*: the training run the user will do (its steps, peak
spectral step and model), on the proxy's schedule shape (its warmup fraction and its
cosine floor). What moves a ranking with the length of training is the cumulative spectral
step Σ η (docs/design.md, "Horizon"), so the target becomes a Σ η, and the ladder's rungs
(:func:`geosearch.search.horizon.ladder.plan_ladder`) become proxy runs of growing Σ η towards it.
This module holds the two sections (:class:`TargetSpec`, :class:`LadderSpec`), resolves
them against the proxy (:func:`resolve_target`, :func:`plan_rungs`, :func:`rung_run`),
gives each run's Σ η at a step (:func:`run_sum_eta`), a model's logit scale d/√d_head
(:func:`model_logit_scale`, which builds the model on the meta device: the only use of
torch here) and reads a study's ladder back (:func:`study_reading`, :func:`horizon_note`).

Example:
    >>> from geosearch.search.space.spec import load_space
    >>> space = load_space("default")
    >>> [round(r.sum_eta, 1) for r in plan_rungs(space)], round(resolve_target(space).sum_eta, 1)
    ([2.2, 4.4], 21.8)
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import optuna
from optuna.trial import TrialState

from geosearch.util.checks import STEPS, Range, is_number, is_whole
from geosearch.util.errors import ConfigError
from geosearch.optim.settings import ADAMW
from geosearch.proxy.config import TrainConfig
from geosearch.search.horizon.forecast import (
    schedule_sum_eta,
    schedule_sum_eta2,
    stability_lr,
    stiefel_logit_bound,
)
from geosearch.search.horizon.ladder import HorizonReading, Rung, plan_ladder, read_ladder
from geosearch.search.horizon.probes import QK_TYPES
from geosearch.search.stats.trials import trial_label
from geosearch.search.records import LADDER, RUNG_LOSSES, TARGET, is_extra

if TYPE_CHECKING:  # pragma: no cover
    from geosearch.assignment import Assignment
    from geosearch.search.space.spec import SearchSpace, Suggestion

__all__ = [
    "LADDER_LIMITS", "STABILITY_RUNG", "TARGET_LIMITS", "LadderSpec", "Target", "TargetSpec", "check_horizon", "horizon_lines",
    "horizon_note", "horizon_verdict", "ladder_record", "model_logit_scale", "parse_horizon", "plan_rungs",
    "plan_stability", "probe_sum_eta", "stability_clock", "stability_record", "takes_spectral_qk", "target_step_at",
    "reading_record",
    "resolve_target", "rung_dir", "rung_means", "rung_run", "run_sum_eta", "short_target", "study_reading",
    "target_line",
]

# --------------------------------------------------------------------------- the sections
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
    step that ends at the target's Σ η² (:func:`plan_stability`), so that its probes *measure*
    the attention logits at the target; ``None``: no stability rung (the pruner forecasts in
    Σ η instead). Its loss is not ranked."""

    def __post_init__(self) -> None:
        _check_fields(self, LADDER_LIMITS)


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


# --------------------------------------------------------------------------- Σ η
@dataclass(frozen=True)
class Target:
    """The target resolved against the proxy: every field known, and its Σ η."""

    steps: int
    spectral_lr: float
    model: str
    model_args: dict[str, Any]
    sum_eta: float
    sum_eta2: float = math.nan
    """Σ η² of the target run: the clock of logit growth across step sizes."""

    def record(self) -> dict[str, Any]:
        """What a study and an exported assignment record of it."""
        return {"steps": self.steps, "spectral_lr": self.spectral_lr, "model": self.model,
                "sum_eta": self.sum_eta, "sum_eta2": self.sum_eta2}


def run_sum_eta(proxy: TrainConfig, steps: int, peak: float, step: int | None = None) -> float:
    """Σ η after ``step`` steps (default: all) of a run of ``steps`` steps at peak ``peak``,
    on the proxy's schedule shape: its warmup stretched to ``steps``, its ``min_lr_ratio``."""
    return schedule_sum_eta(steps if step is None else step, steps=steps, peak=peak,
                            warmup_steps=_warmup(proxy, steps), min_lr_ratio=proxy.min_lr_ratio)


def run_sum_eta2(proxy: TrainConfig, steps: int, peak: float, step: int | None = None) -> float:
    """Σ η² after ``step`` steps (default: all) of such a run (:func:`run_sum_eta`'s schedule)."""
    return schedule_sum_eta2(steps if step is None else step, steps=steps, peak=peak,
                             warmup_steps=_warmup(proxy, steps), min_lr_ratio=proxy.min_lr_ratio)


def _warmup(proxy: TrainConfig, steps: int) -> int | None:
    """The proxy's warmup as a share of ``steps``; ``None`` (10% of any run) stays ``None``."""
    if proxy.warmup_steps is None:
        return None
    return min(steps, round(proxy.warmup_steps * steps / proxy.steps))


def resolve_target(space: SearchSpace) -> Target:
    """The space's target with the proxy's values for what it leaves out, and its Σ η."""
    p, t = space.proxy, space.target
    steps = t.steps if t.steps is not None else p.steps
    lr = t.spectral_lr if t.spectral_lr is not None else p.spectral_lr
    model = t.model if t.model is not None else p.model
    args = dict(p.model_args) if model == p.model else {}
    return Target(steps, lr, model, args, run_sum_eta(p, steps, lr), run_sum_eta2(p, steps, lr))


def plan_rungs(space: SearchSpace) -> list[Rung]:
    """The ladder's rungs for ``space`` (:func:`~geosearch.search.horizon.ladder.plan_ladder` on the
    proxy's schedule shape); the proxy run alone when it takes no spectral step."""
    p, ladder = space.proxy, space.ladder
    base = Rung(0, p.steps, p.spectral_lr, run_sum_eta(p, p.steps, p.spectral_lr))
    target = resolve_target(space).sum_eta
    if ladder.rungs == 1 or not (base.sum_eta > 0 and target > 0):
        return [base]
    return plan_ladder(p.steps, p.spectral_lr, target, rungs=ladder.rungs,
                       schedule_sum=lambda n: run_sum_eta(p, n, 1.0),
                       max_spectral_lr=ladder.max_spectral_lr or p.spectral_lr,
                       max_steps=ladder.max_steps or p.steps)


STABILITY_RUNG = -1
"""The index of the stability rung (:func:`plan_stability`): it is not a rung of the ladder."""


def plan_stability(space: SearchSpace) -> Rung | None:
    """The stability rung of ``space``, or ``None`` without ``ladder.stability_steps``.

    Attention logits grow with Σ η², not Σ η, across step sizes (docs/design.md, "Horizon"),
    so a run of ``stability_steps`` steps on the proxy's schedule shape at the peak step
    η' = √(S₂(target) / Σ f²) ends at the target's Σ η² and its probes measure the logits the
    target run would reach. Its ``spectral_lr`` is η' (every spectral step of a trial is
    scaled by η' over the proxy's, as at any rung), its ``sum_eta`` that run's Σ η.

    Example:
        >>> import dataclasses
        >>> from geosearch.search.space.spec import load_space
        >>> space = load_space("default")
        >>> space = dataclasses.replace(space, ladder=dataclasses.replace(space.ladder, stability_steps=400))
        >>> r = plan_stability(space)
        >>> r.steps, round(r.spectral_lr / space.proxy.spectral_lr, 2)
        (400, 2.23)
    """
    n, p = space.ladder.stability_steps, space.proxy
    target = resolve_target(space)
    if n is None or not target.sum_eta2 > 0:
        return None
    lr = stability_lr(target.sum_eta2, n, warmup_steps=_warmup(p, n), min_lr_ratio=p.min_lr_ratio)
    return Rung(STABILITY_RUNG, n, lr, run_sum_eta(p, n, lr))


def stability_record(space: SearchSpace) -> dict[str, Any] | None:
    """The stability rung as a study records it (``stability``), ``None`` without one."""
    rung = plan_stability(space)
    if rung is None:
        return None
    return {**dataclasses.asdict(rung), "sum_eta2": run_sum_eta2(space.proxy, rung.steps, rung.spectral_lr),
            "target_sum_eta2": resolve_target(space).sum_eta2}


def target_step_at(space: SearchSpace, sum_eta2: float) -> int:
    """The first step of the target run whose Σ η² reaches ``sum_eta2`` (its last step when
    none does): where a logit measured at that Σ η² would appear in the user's run."""
    t, p = resolve_target(space), space.proxy
    lo, hi = 0, t.steps
    while lo < hi:  # Σ η² grows with the step
        mid = (lo + hi) // 2
        if run_sum_eta2(p, t.steps, t.spectral_lr, mid) >= sum_eta2:
            hi = mid
        else:
            lo = mid + 1
    return lo


def stability_clock(space: SearchSpace, rung: Rung) -> Callable[[int], int]:
    """``step -> the target's step at the same Σ η²`` for the stability ``rung``'s run."""
    return lambda step: target_step_at(space, run_sum_eta2(space.proxy, rung.steps, rung.spectral_lr, step))


def takes_spectral_qk(assignment: Assignment) -> bool:
    """Whether any attention query/key weight of ``assignment`` takes a spectral step (its
    logits then have a Σ η² clock; AdamW's have none: the AdamW baseline)."""
    qk = [g for t, g in assignment.resolve().items() if t in QK_TYPES]
    return not (qk and all(g == ADAMW for g in qk))


def rung_seeds(seeds: Sequence[int], rung: Rung, top: Rung, lower: int | None) -> list[int]:
    """The seeds a trial trains at ``rung``: all of ``seeds`` at the ladder's ``top`` rung,
    the first ``lower`` below it (``None``: all)."""
    return list(seeds) if rung.index >= top.index or lower is None else list(seeds[:lower])


def ladder_record(rungs: Sequence[Rung]) -> list[dict[str, Any]]:
    """The rungs as a study records them (``ladder``)."""
    return [dataclasses.asdict(r) for r in rungs]


def rung_run(space: SearchSpace, suggestion: Suggestion, repeat: int,
             rung: Rung) -> tuple[TrainConfig, Assignment]:
    """The config and assignment of one seed's run at ``rung``: rung 0 is the proxy run as
    the space makes it; a higher rung takes the rung's steps (the warmup stretched with
    them) and multiplies every spectral step of the trial (the searched ones too) by the
    rung's over the proxy's."""
    if rung.index == 0:
        return space.train_config(suggestion, repeat=repeat), suggestion.assignment()
    factor = rung.spectral_lr / space.proxy.spectral_lr
    options = {k: {**o, "lr": o["lr"] * factor} if "lr" in o else dict(o)
               for k, o in suggestion.options.items()}
    scaled = dataclasses.replace(suggestion, options=options)
    config = space.train_config(scaled, repeat=repeat)
    config = dataclasses.replace(config, steps=rung.steps, spectral_lr=config.spectral_lr * factor,
                                 warmup_steps=_warmup(space.proxy, rung.steps))
    return config, scaled.assignment()


def probe_sum_eta(config: TrainConfig, assignment: Assignment) -> Callable[[int], float | None]:
    """``step -> Σ η`` of one run for the attention query/key weights (their own ``lr``
    option when the assignment gives one, else ``config.spectral_lr``): the forecast's
    abscissa in each ``probe_history`` row. ``None`` at every step when every query/key
    type is trained by AdamW: it takes no spectral step, so its logits have no Σ η clock to
    be forecast on (the AdamW baseline)."""
    if not takes_spectral_qk(assignment):
        return lambda step: None
    peaks = [o["lr"] for t, o in assignment.resolve_options().items() if t in QK_TYPES and "lr" in o]
    peak = float(max(peaks)) if peaks else config.spectral_lr
    warmup = config.resolved().warmup_steps
    return lambda step: schedule_sum_eta(min(step, config.steps), steps=config.steps, peak=peak,
                                         warmup_steps=warmup, min_lr_ratio=config.min_lr_ratio)


def rung_dir(trial_dir: Path, rung: int, rungs: int, seed: int, seeds: int) -> Path:
    """``trials/<n>[/rung<k>][/seed<s>]``: a level only where there is more than one;
    ``trials/<n>/stability`` for the stability rung (one seed)."""
    if rung == STABILITY_RUNG:
        return trial_dir / "stability"
    out = trial_dir if rungs == 1 else trial_dir / f"rung{rung}"
    return out if seeds == 1 else out / f"seed{seed}"


# --------------------------------------------------------------------------- logit scale
def model_logit_scale(model: str, model_args: dict[str, Any] | None = None) -> float | None:
    """d_model/√d_head of a model spec (:func:`~geosearch.search.horizon.forecast.stiefel_logit_bound`),
    read from its config once built on the meta device; ``None`` when the config does not
    say (a ``py:`` model).

    Raises:
        ConfigError: an unknown or bad model spec.
    """
    from geosearch.models.zoo import build_meta_model  # torch

    args = dict(model_args or {})
    vocab = args.get("vocab_size", 256)
    built = build_meta_model(model, vocab_size=vocab if is_whole(vocab) else 256, model_args=args,
                             for_data=False)
    if built.family == "nanogpt":
        width, heads, head_dim = built.config.get("n_embd"), built.config.get("n_head"), None
    else:
        config = getattr(built.model, "config", None)
        width, heads = getattr(config, "hidden_size", None), getattr(config, "num_attention_heads", None)
        head_dim = getattr(config, "head_dim", None)
    if not (is_whole(width) and is_whole(heads)) or width < 1 or heads < 1:
        return None
    return stiefel_logit_bound(width, head_dim if is_whole(head_dim) else max(1, width // heads))


# --------------------------------------------------------------------------- reading
def rung_means(value: Any) -> list[float] | None:
    """Each rung's mean final val loss over its seeds (NaN where none is finite) from a
    ``rung_losses`` attr, or ``None`` when it is not a list of lists."""
    if not isinstance(value, list) or not all(isinstance(v, list) for v in value):
        return None
    out = []
    for losses in value:
        finite = [float(x) for x in losses if is_number(x) and math.isfinite(x)]
        out.append(sum(finite) / len(finite) if finite and len(finite) == len(losses) else math.nan)
    return out


def study_reading(study: optuna.Study) -> HorizonReading | None:
    """The ladder's reading over the completed trials of ``study`` (labelled by their
    points), or ``None`` when there is nothing to read: a study from before targets, or
    one rung whose Σ η is the target's (within 10%)."""
    attrs = study.user_attrs
    ladder, target = attrs.get(LADDER), attrs.get(TARGET)
    if not (isinstance(ladder, list) and ladder and isinstance(target, dict)
            and is_number(target.get("sum_eta")) and target["sum_eta"] > 0):
        return None
    rungs = [Rung(**r) for r in ladder]
    losses: dict[str, list[float]] = {}
    for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        if is_extra(t):  # baselines and adaptive seeds are not points of the ladder's reading
            continue
        means = rung_means(t.user_attrs.get(RUNG_LOSSES))
        if means is not None and len(means) == len(rungs):
            label = trial_label(t)
            losses[label if label not in losses else f"{label} (trial {t.number})"] = means
    reading = read_ladder(rungs, losses, float(target["sum_eta"]))
    return reading if len(rungs) > 1 or reading.extrapolated else None


def horizon_note(reading: HorizonReading | None) -> str | None:
    """What the verdict must add about the target: ``None`` when the ladder's order held
    up to the target, else why the ranking is not known to hold there."""
    if reading is None or not reading.leaders:
        return None
    target = f"your target is Σ η {reading.target_sum_eta:.3g}"
    if len(reading.rungs) == 1:
        return (f"ranked at Σ η {reading.rungs[0].sum_eta:.3g} only; {target}: the order there is "
                "not measured (ladder.rungs >= 2 ranks closer to it)")
    if reading.stable:
        return None
    if reading.lead_changes:
        lo, hi, _, _ = reading.lead_changes[-1]
        why = f"the lead changed between Σ η {lo:.3g} and {hi:.3g}"
    else:
        c = next(c for c in reading.crossings if not c.measured)
        why = f"{c.second} is forecast to overtake {c.first} near Σ η {c.sum_eta:.3g}"
    return f"not yet stable: {why}; {target}"


def horizon_verdict(verdict: str, reading: HorizonReading | None) -> str:
    """A ranking's verdict, marked with :func:`horizon_note` when it may not hold at the
    target (``"... (not yet stable: the lead changed ...)"``)."""
    note = horizon_note(reading)
    return verdict if note is None else f"{verdict} ({note})"


def horizon_lines(reading: HorizonReading | None) -> list[str]:
    """The reading as the search prints it: a heading and its lines, or nothing."""
    if reading is None:
        return []
    return ["horizon (the ranking at each rung of the Σ η ladder, towards your target):",
            *(f"  {line}" for line in reading.lines)]


def reading_record(reading: HorizonReading) -> dict[str, Any]:
    """The reading as an exported assignment's provenance records it (YAML-safe)."""
    return {
        "target_sum_eta": reading.target_sum_eta,
        "rungs": ladder_record(reading.rungs),
        "leaders": list(reading.leaders),
        "lead_changes": [{"from_sum_eta": lo, "to_sum_eta": hi, "from": a, "to": b}
                         for lo, hi, a, b in reading.lead_changes],
        "spearman_ends": reading.spearman_ends if math.isfinite(reading.spearman_ends) else None,
        "stable": reading.stable and len(reading.rungs) > 1,
        "extrapolated": reading.extrapolated,
        "lines": list(reading.lines),
    }


def target_line(space: SearchSpace) -> str:
    """One line of the search header: the target, its Σ η, and the ladder's rungs."""
    t, rungs = resolve_target(space), plan_rungs(space)
    base = rungs[0].sum_eta
    if t.sum_eta <= base * 1.1:
        return (f"  target: the proxy run itself (Σ η {base:.3g}); --target-steps N ranks for "
                "a longer run")
    if len(rungs) > 1:
        ladder = f"{len(rungs)} rungs at Σ η " + ", ".join(f"{r.sum_eta:.3g}" for r in rungs)
    elif space.ladder.rungs > 1:  # rungs take the proxy's step, and no more steps than it
        ladder = (f"1 rung, the proxy run: the ladder's limits reach no further (ladder.max_steps "
                  f"> proxy.steps {space.proxy.steps} ranks closer to it)")
    else:
        ladder = "1 rung, the proxy run (ladder.rungs >= 2 ranks closer to it)"
    stab = plan_stability(space)
    if stab is not None:
        ladder += (f"; stability rung first: {stab.steps} steps at spectral_lr {stab.spectral_lr:.3g}, "
                   f"ending at your run's Σ η² {t.sum_eta2:.3g}, measures its logits")
    return (f"  target: {t.steps} steps at spectral_lr {t.spectral_lr:g}, model {t.model}: "
            f"Σ η {t.sum_eta:.3g} (the proxy's {base:.3g}); ladder: {ladder}")


# --------------------------------------------------------------------------- helpers
def _check_fields(spec: Any, limits: dict[str, Range]) -> None:
    """Each field of ``limits`` in its range (numeric strings too, for the fields that are
    not whole: YAML 1.1 reads ``1e-2`` as one), kept as checked; raises a ConfigError keyed
    by the field."""
    for name, allowed in limits.items():
        value, problem = allowed.check(getattr(spec, name))
        if problem is not None:
            raise ConfigError(problem, key=name)
        object.__setattr__(spec, name, value)
