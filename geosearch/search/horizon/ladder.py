"""Answers at the user's training length: the Σ η ladder and what its rungs say.

A proxy run ranks assignments for its own cumulative spectral step Σ_t η_t, and the ranking
moves with Σ η (docs/design.md, "Horizon"). The ladder trains each assignment at a few rungs
of growing Σ η, from the proxy's own run up to the user's target (or as far as the ladder's
limits allow), all on the proxy's schedule shape. The ranking is read at the top rung;
this module compares the rungs: where the lead changed, how well successive rungs agree
(Spearman), which pairs cross, and, when the top rung stops short of the target, where each
gap is heading (a line in log Σ η through the rungs, extrapolated and labelled as such).
Pure Python: no torch, no Optuna.

Example:
    >>> rungs = [Rung(0, 200, 0.02, 2.2), Rung(1, 200, 0.2, 22.0)]
    >>> h = read_ladder(rungs, {"a": [2.30, 1.90], "b": [2.20, 2.00]}, target_sum_eta=22.0)
    >>> h.leaders, h.lead_changes
    (['b', 'a'], [(2.2, 22.0, 'b', 'a')])
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

__all__ = ["Rung", "HorizonReading", "forecast_at", "plan_ladder", "ranks", "read_ladder", "spearman"]


@dataclass(frozen=True)
class Rung:
    """One rung of the ladder: a proxy run of ``steps`` steps at peak spectral step
    ``spectral_lr``, whose schedule adds up to ``sum_eta``."""

    index: int
    steps: int
    spectral_lr: float
    sum_eta: float
    cooldown: int | None = None
    """``None``: a run of its own on the proxy's schedule shape. A number: a branch
    (``ladder.branches``), the last ``cooldown`` steps of a warmup-stable-decay run whose
    first ``steps − cooldown`` are the trunk's, shared with the lower rungs."""

    @property
    def branch_point(self) -> int:
        """The trunk's step where this branch's cooldown starts (a run of its own: 0)."""
        return 0 if self.cooldown is None else self.steps - self.cooldown


def plan_ladder(
    proxy_steps: int,
    proxy_lr: float,
    target_sum_eta: float,
    *,
    rungs: int,
    schedule_sum: Callable[[int], float],
    max_spectral_lr: float,
    max_steps: int,
) -> list[Rung]:
    """The rungs from the proxy's own run to the target's Σ η.

    Rung 0 is the proxy run as configured. The others are spaced evenly in log Σ η up to
    the target. A rung reaches its Σ η on the proxy's step count by a larger peak spectral
    step; where that would exceed ``max_spectral_lr`` it takes more steps instead (at most
    ``max_steps``), and where even that falls short it stops at the highest Σ η it can
    reach (the reading then extrapolates, and says so). Rungs that would repeat a lower
    rung's Σ η are dropped.

    Args:
        proxy_steps: steps of the proxy run.
        proxy_lr: its peak spectral step η.
        target_sum_eta: Σ η of the user's run.
        rungs: how many rungs at most, rung 0 included (1 = the proxy run only).
        schedule_sum: ``steps -> Σ_t lr_factor(t)`` for a run of that many steps on the
            proxy's schedule shape (warmup and cosine), so Σ η = peak · schedule_sum(steps).
        max_spectral_lr: the largest peak spectral step a rung may use.
        max_steps: the most steps a rung may take.

    Raises:
        ValueError: a non-positive argument.
    """
    if rungs < 1 or proxy_steps < 1 or max_steps < proxy_steps:
        raise ValueError(f"rungs must be >= 1 and max_steps >= proxy steps, got rungs={rungs}, "
                         f"proxy_steps={proxy_steps}, max_steps={max_steps}")
    if not (proxy_lr > 0 and max_spectral_lr > 0 and target_sum_eta > 0):
        raise ValueError("proxy_lr, max_spectral_lr and target_sum_eta must be > 0")
    base = proxy_lr * schedule_sum(proxy_steps)
    out = [Rung(0, proxy_steps, proxy_lr, base)]
    if rungs == 1 or target_sum_eta <= base * (1 + 1e-9):
        return out
    for k in range(1, rungs):
        want = base * (target_sum_eta / base) ** (k / (rungs - 1))
        steps, lr = proxy_steps, want / schedule_sum(proxy_steps)
        if lr > max_spectral_lr:
            lr = max(max_spectral_lr, proxy_lr)
            steps = _steps_for(want / lr, schedule_sum, proxy_steps, max_steps)
        reached = lr * schedule_sum(steps)
        if reached <= out[-1].sum_eta * (1 + 1e-6):
            break  # the ladder's limits are reached: higher rungs would repeat this one
        out.append(Rung(len(out), steps, lr, reached))
    return out


def _steps_for(units: float, schedule_sum: Callable[[int], float], lo: int, hi: int) -> int:
    """The fewest steps in [lo, hi] whose schedule adds up to ``units`` (hi if none does)."""
    if schedule_sum(hi) < units:
        return hi
    while lo < hi:  # schedule_sum grows with the step count
        mid = (lo + hi) // 2
        if schedule_sum(mid) >= units:
            hi = mid
        else:
            lo = mid + 1
    return lo


def spearman(a: Sequence[float], b: Sequence[float]) -> float:
    """Spearman's rank correlation of two equally long sequences (average ranks for ties);
    NaN when either is constant or shorter than 2."""
    if len(a) != len(b) or len(a) < 2:
        return math.nan
    ra, rb = ranks(a), ranks(b)
    ma, mb = sum(ra) / len(ra), sum(rb) / len(rb)
    cov = sum((x - ma) * (y - mb) for x, y in zip(ra, rb))
    va = sum((x - ma) ** 2 for x in ra)
    vb = sum((y - mb) ** 2 for y in rb)
    return cov / math.sqrt(va * vb) if va and vb else math.nan


def ranks(xs: Sequence[float]) -> list[float]:
    """1-based ranks, ties getting the mean of the ranks they span."""
    order = sorted(range(len(xs)), key=lambda i: xs[i])
    ranks = [0.0] * len(xs)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and xs[order[j + 1]] == xs[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


@dataclass(frozen=True)
class Crossing:
    """Two assignments whose order flips: between two rungs (``measured``) or, by the line
    through the rungs in log Σ η, between the top rung and the target (``forecast``)."""

    first: str  # ahead at the lower Σ η
    second: str  # ahead at the higher one
    sum_eta: float  # where the gap crosses zero (interpolated in log Σ η)
    measured: bool


@dataclass
class HorizonReading:
    """What the ladder's rungs say about the ranking at the target.

    Attributes:
        rungs: the rungs with a score for every assignment, lowest first.
        target_sum_eta: Σ η of the user's run.
        leaders: the best assignment at each rung.
        lead_changes: ``(Σ η from, Σ η to, old leader, new leader)``.
        spearman_steps: Spearman between successive rungs' orders.
        spearman_ends: Spearman between the lowest and the top rung.
        crossings: pairs whose order flips, measured or forecast.
        extrapolated: the top rung is short of the target (by more than 10%), so the
            forecast crossings are extrapolations.
        forecast_order: the order at the target by each loss's line in log Σ η (the top
            rung's order when nothing is extrapolated).
        lines: a few sentences for a person.
    """

    rungs: list[Rung]
    target_sum_eta: float
    leaders: list[str] = field(default_factory=list)
    lead_changes: list[tuple[float, float, str, str]] = field(default_factory=list)
    spearman_steps: list[float] = field(default_factory=list)
    spearman_ends: float = math.nan
    crossings: list[Crossing] = field(default_factory=list)
    extrapolated: bool = False
    forecast_order: list[str] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)
    rule: str | None = None
    """Which order ranked, in words (set for a ladder of branches: the verdict says it)."""

    @property
    def stable(self) -> bool:
        """No lead change across the rungs and no crossing of the leader forecast."""
        leader = self.leaders[-1] if self.leaders else None
        return not self.lead_changes and not any(
            not c.measured and leader in (c.first, c.second) for c in self.crossings)


def read_ladder(rungs: Sequence[Rung], losses: Mapping[str, Sequence[float]],
                target_sum_eta: float) -> HorizonReading:
    """Compare the rungs' rankings and look ahead to the target.

    Args:
        rungs: the ladder's rungs, lowest Σ η first.
        losses: assignment label -> its mean final validation loss at each rung (same
            order as ``rungs``). Assignments missing a rung (pruned there) are left out.
        target_sum_eta: Σ η of the user's run.
    """
    rungs = list(rungs)
    labels = [k for k, v in losses.items()
              if len(v) == len(rungs) and all(math.isfinite(x) for x in v)]
    reading = HorizonReading(rungs, target_sum_eta)
    if not labels or not rungs:
        reading.lines.append("no assignment was scored at every rung: the rungs cannot be compared")
        return reading
    table = {k: list(losses[k]) for k in labels}
    for i, _ in enumerate(rungs):
        reading.leaders.append(min(labels, key=lambda k: (table[k][i], k)))
    for i in range(1, len(rungs)):
        if reading.leaders[i] != reading.leaders[i - 1]:
            reading.lead_changes.append((rungs[i - 1].sum_eta, rungs[i].sum_eta,
                                         reading.leaders[i - 1], reading.leaders[i]))
        reading.spearman_steps.append(spearman([table[k][i - 1] for k in labels],
                                               [table[k][i] for k in labels]))
    if len(rungs) > 1:
        reading.spearman_ends = spearman([table[k][0] for k in labels], [table[k][-1] for k in labels])
    top = rungs[-1].sum_eta
    reading.extrapolated = target_sum_eta > top * 1.1
    xs = [math.log(r.sum_eta) for r in rungs]
    at_target = {k: _line_at(xs, table[k], math.log(target_sum_eta)) if reading.extrapolated
                 else table[k][-1] for k in labels}
    reading.forecast_order = sorted(labels, key=lambda k: (at_target[k], k))
    reading.crossings = _crossings(labels, table, rungs, xs, target_sum_eta, reading.extrapolated)
    reading.lines = _lines(reading)
    return reading


def forecast_at(rungs: Sequence[Rung], losses: Sequence[float], sum_eta: float) -> float:
    """One assignment's loss at ``sum_eta`` by the least-squares line through its rungs'
    losses in log Σ η (as :func:`read_ladder` forecasts; the last loss with one rung)."""
    return _line_at([math.log(r.sum_eta) for r in rungs], list(losses), math.log(sum_eta))


def _line_at(xs: Sequence[float], ys: Sequence[float], x: float) -> float:
    """The least-squares line through (xs, ys) at x; the last y with a single point."""
    n = len(xs)
    if n < 2:
        return ys[-1]
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((a - mx) ** 2 for a in xs)
    if sxx == 0:
        return ys[-1]
    slope = sum((a - mx) * (b - my) for a, b in zip(xs, ys)) / sxx
    return my + slope * (x - mx)


def _crossings(labels: list[str], table: dict[str, list[float]], rungs: list[Rung],
               xs: list[float], target: float, extrapolated: bool) -> list[Crossing]:
    out = []
    for ai, a in enumerate(labels):
        for b in labels[ai + 1:]:
            gap = [table[a][i] - table[b][i] for i in range(len(rungs))]  # < 0: a ahead
            for i in range(1, len(rungs)):
                if gap[i - 1] * gap[i] < 0:
                    first, second = (a, b) if gap[i - 1] < 0 else (b, a)
                    out.append(Crossing(first, second, _zero(xs[i - 1], xs[i], gap[i - 1], gap[i]),
                                        measured=True))
            if extrapolated and len(rungs) > 1:
                end = _line_at(xs, gap, math.log(target))
                if gap[-1] * end < 0:
                    first, second = (a, b) if gap[-1] < 0 else (b, a)
                    out.append(Crossing(first, second, _zero(xs[-1], math.log(target), gap[-1], end),
                                        measured=False))
    return out


def _zero(x0: float, x1: float, y0: float, y1: float) -> float:
    """Σ η where the line through (x0, y0), (x1, y1) (x = log Σ η) crosses zero."""
    return math.exp(x0 + (x1 - x0) * y0 / (y0 - y1))


def _lines(r: HorizonReading) -> list[str]:
    top = r.rungs[-1]
    lines = [f"ladder: {len(r.rungs)} rung(s), Σ η " + ", ".join(f"{g.sum_eta:.3g}" for g in r.rungs)
             + f"; your target: Σ η {r.target_sum_eta:.3g}"]
    for lo, hi, old, new in r.lead_changes:
        lines.append(f"the lead changed between Σ η {lo:.3g} and {hi:.3g} ({old} -> {new}); "
                     f"your target is {r.target_sum_eta:.3g}")
    if len(r.rungs) > 1 and math.isfinite(r.spearman_ends):
        lines.append(f"Spearman between the lowest and the top rung: {r.spearman_ends:.2f}")
    if r.extrapolated:
        lines.append(f"the top rung reached Σ η {top.sum_eta:.3g}, short of the target: beyond it "
                     "the order is a straight-line extrapolation in log Σ η, not a measurement")
        for c in (c for c in r.crossings if not c.measured):
            lines.append(f"forecast: {c.second} overtakes {c.first} near Σ η {c.sum_eta:.3g}")
    if not r.lead_changes and not r.extrapolated:
        lines.append(f"the leader held at every rung: {r.leaders[-1]}")
    return lines
