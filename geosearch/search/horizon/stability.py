"""The stability rung: its step, which trials train it, how it is judged and how it is said.

Attention logits grow with Σ η², not Σ η, across step sizes (docs/design.md, "Horizon" and
"The stability rung"). A trial first trains one short run, with its first seed, at the peak
step that ends at the target's Σ η² (:func:`plan_stability`), so that its probes *measure*
the logits the target run would reach: the pruner judges them against the target's
threshold (``stability_run``) on the target's step clock (:func:`stability_clock`), and
they are kept as ``stability_probes``. Which trials train it is :func:`stability_skip`;
how a stopped one is said is :func:`stability_prefix`, and the header's clause
:func:`stability_clause`. Its loss is not ranked.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from geosearch.proxy.config import TrainConfig
from geosearch.search.horizon.forecast import stability_lr
from geosearch.search.horizon.ladder import Rung
from geosearch.search.horizon.target import Target, run_sum_eta, run_sum_eta2, warmup_share

__all__ = ["STABILITY_RUNG", "StabilityRung", "plan_stability", "stability_clause",
           "stability_clock", "stability_prefix", "stability_skip", "target_step_at"]

STABILITY_RUNG = -1
"""The index of the stability rung (:func:`plan_stability`): it is not a rung of the ladder."""


@dataclass(frozen=True)
class StabilityRung:
    """The stability rung of a study: its run (``rung``: ``STABILITY_RUNG``, its steps, its
    peak spectral step η' and its Σ η), the Σ η² it ends at and the target's."""

    rung: Rung
    sum_eta2: float
    target_sum_eta2: float

    @property
    def steps(self) -> int:
        return self.rung.steps

    @property
    def spectral_lr(self) -> float:
        return self.rung.spectral_lr

    def record(self) -> dict[str, Any]:
        """The stability rung as a study records it (``stability``)."""
        return {**dataclasses.asdict(self.rung), "sum_eta2": self.sum_eta2,
                "target_sum_eta2": self.target_sum_eta2}


def plan_stability(proxy: TrainConfig, target: Target, steps: int | None) -> StabilityRung | None:
    """The stability rung of ``steps`` steps (``ladder.stability_steps``), or ``None``
    without them (or when the target takes no spectral step).

    A run of ``steps`` steps on the proxy's schedule shape at the peak step
    η' = √(S₂(target) / Σ f²) ends at the target's Σ η², so its probes measure the logits
    the target run would reach. Its ``spectral_lr`` is η' (every spectral step of a trial is
    scaled by η' over the proxy's, as at any rung), its ``sum_eta`` that run's Σ η.

    Example:
        >>> import dataclasses
        >>> from geosearch.search.space.spec import load_space
        >>> from geosearch.search.horizon.target import resolve_target
        >>> space = load_space("default")
        >>> r = plan_stability(space.proxy, resolve_target(space.proxy, space.target), 400)
        >>> r.steps, round(r.spectral_lr / space.proxy.spectral_lr, 2)
        (400, 2.23)
    """
    if steps is None or not target.sum_eta2 > 0:
        return None
    lr = stability_lr(target.sum_eta2, steps, warmup_steps=warmup_share(proxy, steps),
                      min_lr_ratio=proxy.min_lr_ratio)
    rung = Rung(STABILITY_RUNG, steps, lr, run_sum_eta(proxy, steps, lr))
    return StabilityRung(rung, run_sum_eta2(proxy, steps, lr), target.sum_eta2)


def stability_skip(*, seed_trial: bool, spectral_qk: bool, passed_above: int | None) -> str | None:
    """Why a trial does not train the stability rung, or ``None`` when it does.

    Args:
        seed_trial: the trial is an adaptive seed of another (its point measured it).
        spectral_qk: its attention queries and keys take a spectral step (AdamW's have no
            Σ η² clock: nothing to measure).
        passed_above: with step halving, a trial of the same assignment at a larger step
            that passed it (the smaller step's logits grow slower), else ``None``.
    """
    if seed_trial:
        return "an adaptive seed: its point measured it"
    if not spectral_qk:
        return "its attention queries and keys take no spectral step"
    if passed_above is not None:
        return f"trial {passed_above} passed it at a larger step"
    return None


def target_step_at(proxy: TrainConfig, target: Target, sum_eta2: float) -> int:
    """The first step of the target run whose Σ η² reaches ``sum_eta2`` (its last step when
    none does): where a logit measured at that Σ η² would appear in the user's run."""
    lo, hi = 0, target.steps
    while lo < hi:  # Σ η² grows with the step
        mid = (lo + hi) // 2
        if run_sum_eta2(proxy, target.steps, target.spectral_lr, mid) >= sum_eta2:
            hi = mid
        else:
            lo = mid + 1
    return lo


def stability_clock(proxy: TrainConfig, target: Target, rung: Rung) -> Callable[[int], int]:
    """``step -> the target's step at the same Σ η²`` for the stability ``rung``'s run: the
    step the pruner judges its probes at."""
    return lambda step: target_step_at(proxy, target,
                                       run_sum_eta2(proxy, rung.steps, rung.spectral_lr, step))


def stability_prefix(stab: StabilityRung) -> str:
    """How a trial stopped by the stability rung is said, before the reason."""
    return (f"stability rung ({stab.steps} steps at spectral_lr {stab.spectral_lr:.3g}, "
            "your run's Σ η²): ")


def stability_clause(stab: StabilityRung) -> str:
    """The header's clause on the stability rung."""
    return (f"; stability rung first: {stab.steps} steps at spectral_lr {stab.spectral_lr:.3g}, "
            f"ending at your run's Σ η² {stab.target_sum_eta2:.3g}, measures its logits")
