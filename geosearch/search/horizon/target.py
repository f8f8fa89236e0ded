"""The user's target run and the Σ η ladder towards it, resolved against the proxy.

A study answers for a *target*: the training run the user will do (its steps, peak
spectral step and model), on the proxy's schedule shape (its warmup fraction and its
cosine floor). What moves a ranking with the length of training is the cumulative spectral
step Σ η (docs/design.md, "Horizon"), so the target becomes a Σ η (:func:`resolve_target`),
and the ladder's rungs (:func:`plan_rungs`, on
:func:`~geosearch.search.horizon.ladder.plan_ladder`) become proxy runs of growing Σ η
towards it. :func:`run_sum_eta` gives each run's Σ η at a step, :func:`probe_sum_eta` the
abscissa of a run's probes. The space's ``target:`` and ``ladder:`` sections are read in
:mod:`geosearch.search.space.horizon`; the study's plan (:mod:`geosearch.search.space.plan`)
calls these once.

Example:
    >>> from geosearch.search.space.plan import plan_study
    >>> from geosearch.search.space.spec import load_space
    >>> plan = plan_study(load_space("default"))
    >>> [round(r.sum_eta, 1) for r in plan.rungs], round(plan.target.sum_eta, 1)
    ([4.4], 21.8)
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from geosearch.optim.settings import ADAMW
from geosearch.proxy.config import TrainConfig
from geosearch.search.horizon.forecast import schedule_sum_eta, schedule_sum_eta2, wsd_sum_eta
from geosearch.search.horizon.ladder import Rung, plan_ladder
from geosearch.search.horizon.probe_rows import QK_TYPES

if TYPE_CHECKING:  # pragma: no cover
    from geosearch.assignment import Assignment

__all__ = ["Target", "branch_warmup", "ladder_record", "plan_branches",
           "plan_rungs", "probe_sum_eta", "resolve_target", "run_steps", "rung_seeds",
           "run_sum_eta", "run_sum_eta2", "takes_spectral_qk", "warmup_share"]


class TargetFields(Protocol):
    """What :func:`resolve_target` reads of a space's ``target:`` section (each ``None`` =
    the proxy's)."""

    steps: int | None
    spectral_lr: float | None
    model: str | None


class LadderFields(Protocol):
    """What :func:`plan_rungs` reads of a space's ``ladder:`` section."""

    rungs: int
    max_spectral_lr: float | None
    max_steps: int | None
    # with branches (``branches``, ``cooldown``): read where present (plan_branches)


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


def run_sum_eta(proxy: TrainConfig, steps: int, spectral_lr: float, step: int | None = None) -> float:
    """Σ η after ``step`` steps (default: all) of a run of ``steps`` steps at peak
    ``spectral_lr``, on the proxy's schedule shape: its warmup stretched to ``steps``, its
    ``min_lr_ratio``."""
    return schedule_sum_eta(steps if step is None else step, steps=steps, peak=spectral_lr,
                            warmup_steps=warmup_share(proxy, steps), min_lr_ratio=proxy.min_lr_ratio)


def run_sum_eta2(proxy: TrainConfig, steps: int, spectral_lr: float, step: int | None = None) -> float:
    """Σ η² after ``step`` steps (default: all) of such a run (:func:`run_sum_eta`'s schedule)."""
    return schedule_sum_eta2(steps if step is None else step, steps=steps, peak=spectral_lr,
                             warmup_steps=warmup_share(proxy, steps), min_lr_ratio=proxy.min_lr_ratio)


def warmup_share(proxy: TrainConfig, steps: int) -> int | None:
    """The proxy's warmup as a share of ``steps``; ``None`` (10% of any run) stays ``None``."""
    if proxy.warmup_steps is None:
        return None
    return min(steps, round(proxy.warmup_steps * steps / proxy.steps))


def resolve_target(proxy: TrainConfig, target: TargetFields) -> Target:
    """The ``target`` section with the proxy's values for what it leaves out, and its Σ η."""
    steps = target.steps if target.steps is not None else proxy.steps
    lr = target.spectral_lr if target.spectral_lr is not None else proxy.spectral_lr
    model = target.model if target.model is not None else proxy.model
    args = dict(proxy.model_args) if model == proxy.model else {}
    return Target(steps, lr, model, args, run_sum_eta(proxy, steps, lr), run_sum_eta2(proxy, steps, lr))


def plan_rungs(proxy: TrainConfig, ladder: LadderFields, target_sum_eta: float) -> list[Rung]:
    """The ladder's rungs towards ``target_sum_eta``
    (:func:`~geosearch.search.horizon.ladder.plan_ladder` on the proxy's schedule shape); the
    proxy run alone when it takes no spectral step."""
    base = Rung(0, proxy.steps, proxy.spectral_lr, run_sum_eta(proxy, proxy.steps, proxy.spectral_lr))
    if getattr(ladder, "branches", False):
        return plan_branches(proxy, ladder, target_sum_eta)
    if ladder.rungs == 1 or not (base.sum_eta > 0 and target_sum_eta > 0):
        return [base]
    return plan_ladder(proxy.steps, proxy.spectral_lr, target_sum_eta, rungs=ladder.rungs,
                       schedule_sum=lambda n: run_sum_eta(proxy, n, 1.0),
                       max_spectral_lr=ladder.max_spectral_lr or proxy.spectral_lr,
                       max_steps=ladder.max_steps or proxy.steps)


def plan_branches(proxy: TrainConfig, ladder: LadderFields, target_sum_eta: float) -> list[Rung]:
    """The ladder as branches off one trunk (``ladder.branches``): rungs of growing length
    at the proxy's step, spaced evenly in log Σ η from the proxy's steps up to the target
    or ``ladder.max_steps`` (:func:`~geosearch.search.horizon.ladder.plan_ladder`), each a
    warmup-stable-decay run (:func:`branch_warmup`, its last ``ladder.cooldown`` share a
    cooldown). Rung 0 is the proxy's length on that schedule.

    Example:
        >>> from types import SimpleNamespace
        >>> proxy = TrainConfig(steps=400, spectral_lr=0.02)
        >>> ladder = SimpleNamespace(rungs=3, max_spectral_lr=None, max_steps=2000, cooldown=0.2)
        >>> [(r.steps, r.cooldown, r.branch_point) for r in plan_branches(proxy, ladder, 40.0)]
        [(400, 80, 320), (934, 187, 747), (2000, 400, 1600)]
    """
    share, warmup = float(getattr(ladder, "cooldown", 0.2)), branch_warmup(proxy)

    def cooldown(n: int) -> int:
        return min(max(1, round(share * n)), n - warmup)

    def unit(n: int) -> float:
        return wsd_sum_eta(n, steps=n, peak=1.0, warmup_steps=warmup, cooldown_steps=cooldown(n),
                           min_lr_ratio=proxy.min_lr_ratio)

    if proxy.steps - warmup < 1 or not proxy.spectral_lr > 0:
        base = run_sum_eta(proxy, proxy.steps, proxy.spectral_lr)
        return [Rung(0, proxy.steps, proxy.spectral_lr, base)]
    rungs = plan_ladder(proxy.steps, proxy.spectral_lr, target_sum_eta, rungs=ladder.rungs,
                        schedule_sum=unit, max_spectral_lr=proxy.spectral_lr,
                        max_steps=ladder.max_steps or proxy.steps)
    return [dataclasses.replace(r, cooldown=cooldown(r.steps)) for r in rungs]


def branch_warmup(proxy: TrainConfig) -> int:
    """The warmup of every branch and of the trunk: the proxy run's, whatever their length."""
    return proxy.resolved().warmup_steps


def rung_seeds(seeds: Sequence[int], rung: Rung, top: Rung, lower: int | None) -> list[int]:
    """The seeds a trial trains at ``rung``: all of ``seeds`` at the ladder's ``top`` rung,
    the first ``lower`` below it (``None``: all)."""
    return list(seeds) if rung.index >= top.index or lower is None else list(seeds[:lower])


def run_steps(rungs: Sequence[Rung]) -> int:
    """Steps one seed trains over ``rungs`` (the ones it trains): each run's steps; of
    branches (``ladder.branches``) the trunk to the last branch point and every cooldown."""
    branches = [r for r in rungs if r.cooldown is not None]
    trunk = max((r.branch_point for r in branches), default=0)
    trunk += sum(r.cooldown or 0 for r in branches)
    return trunk + sum(r.steps for r in rungs if r.cooldown is None)


def ladder_record(rungs: Sequence[Rung]) -> list[dict[str, Any]]:
    """The rungs as a study records them (``ladder``)."""
    return [{k: v for k, v in dataclasses.asdict(r).items() if k != "cooldown" or v is not None}
            for r in rungs]


def takes_spectral_qk(assignment: Assignment) -> bool:
    """Whether any attention query/key weight of ``assignment`` takes a spectral step (its
    logits then have a Σ η² clock; AdamW's have none: the AdamW baseline)."""
    qk = [g for t, g in assignment.resolve().items() if t in QK_TYPES]
    return not (qk and all(g == ADAMW for g in qk))


def probe_sum_eta(config: TrainConfig, assignment: Assignment) -> Callable[[int], float | None]:
    """``step -> Σ η`` of one run for the attention query/key weights (their own ``lr``
    option when the assignment gives one, else ``config.spectral_lr``): the forecast's
    abscissa in each probe row. ``None`` at every step when every query/key type is trained
    by AdamW: it takes no spectral step, so its logits have no Σ η clock to be forecast on
    (the AdamW baseline)."""
    if not takes_spectral_qk(assignment):
        return lambda step: None
    peaks = [o["lr"] for t, o in assignment.resolve_options().items() if t in QK_TYPES and "lr" in o]
    peak = float(max(peaks)) if peaks else config.spectral_lr
    warmup = config.resolved().warmup_steps
    if config.cooldown_steps is not None:  # warmup-stable-decay: a trunk or a branch
        return lambda step: wsd_sum_eta(min(step, config.steps), steps=config.steps, peak=peak,
                                        warmup_steps=warmup, cooldown_steps=config.cooldown_steps,
                                        min_lr_ratio=config.min_lr_ratio)
    return lambda step: schedule_sum_eta(min(step, config.steps), steps=config.steps, peak=peak,
                                         warmup_steps=warmup, min_lr_ratio=config.min_lr_ratio)
