"""A loss-curve law on the Σ η clock: the completed loss at the target, forecast from branches.

With ``ladder.branches`` each rung is a completed run (a cooldown branched off the trunk) at
its own Σ η, so one assignment and seed gives completed losses at a few Σ η. The law
``L(S) = L∞ + A·S^−α`` (a power law in the cumulative step S = Σ η, the simplest member of
the family of the multi-power law, arXiv 2503.12811, for runs that each end in a cooldown)
is fitted to them per assignment and seed (:func:`fit_law`: α by a search on a log grid
and a golden-section refinement, L∞ and A by least squares at each α) and read at the
target's Σ η with a prediction interval (:func:`forecast_law`: the delta method, Student-t
with n − 3 degrees of freedom; over seeds, the t interval of their forecasts' mean,
:func:`law_forecast`). The branches end in a linear cooldown, the target in the proxy's
cosine: the forecast is of a run of the target's Σ η on the branches' schedule.

Which order ranks (:func:`ranking_rule`): the longest completed branch's, until a benchmark
shows the law's order beats it (:data:`LAW_RANKS`; ``docs/benchmarks.md``); the verdict
says which. Pure Python, no torch.

Example:
    >>> s = [2.0, 4.0, 8.0, 16.0, 32.0]
    >>> fit = fit_law(s, [2.0 + 3.0 * x ** -0.5 for x in s])
    >>> round(fit.l_inf, 4), round(fit.a, 4), round(fit.alpha, 4)
    (2.0, 3.0, 0.5)
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from geosearch.search.stats.scores import t_quantile

__all__ = [
    "LAW_RANKS",
    "LawFit",
    "LawForecast",
    "fit_law",
    "forecast_law",
    "law_forecast",
    "ranking_rule",
]

LAW_RANKS = False
"""Whether the law's forecast ranks instead of the longest completed branch: ``False``
until a benchmark shows that its order matches the long runs' more often
(``docs/benchmarks.md``). On stored completed runs (``benchmarks/curve_law.py``: 400, 500
and 1,000 steps read at 2,000, four settings) it matched them no more often than the
1,000-step runs' own order (Spearman ≥ 0.8 at 3 of 4 each), and its 90% interval held the
long runs' mean at 10 of 16; on branches it is not measured. The ranking is the branch's."""
_ALPHAS = (0.02, 4.0)  # the exponents searched
LEVEL = 0.9


@dataclass(frozen=True)
class LawFit:
    """``L(S) = l_inf + a·S^−alpha`` fitted to ``n`` points; ``sse`` its squared residuals."""

    l_inf: float
    a: float
    alpha: float
    sse: float
    n: int
    points: tuple[tuple[float, float], ...] = ()

    def at(self, s: float) -> float:
        """The law at Σ η ``s``."""
        return self.l_inf + self.a * s**-self.alpha


@dataclass(frozen=True)
class LawForecast:
    """The completed loss at ``sum_eta``: ``value`` with a ``level`` interval [low, high]
    (NaN when nothing measures the spread: three points of one seed fit exactly)."""

    value: float
    low: float
    high: float
    sum_eta: float
    seeds: int
    level: float = LEVEL

    def text(self) -> str:
        span = "" if math.isnan(self.low) else f" [{self.low:.4f}, {self.high:.4f}]"
        return f"{self.value:.4f}{span} at Σ η {self.sum_eta:.3g} ({self.seeds} seed(s))"


def _linear(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float, float]:
    """Least squares ``y = c + a·x`` (``xs`` not all equal): (c, a, sse)."""
    a, c = statistics.linear_regression(xs, ys)
    return c, a, sum((y - c - a * x) ** 2 for x, y in zip(xs, ys))


def fit_law(sum_eta: Sequence[float], losses: Sequence[float]) -> LawFit | None:
    """The law fitted to (Σ η, completed loss) points; ``None`` with fewer than 3 finite
    points at distinct positive Σ η."""
    pts = sorted(
        (float(s), float(y))
        for s, y in zip(sum_eta, losses)
        if s > 0 and math.isfinite(s) and math.isfinite(y)
    )
    if len({s for s, _ in pts}) < 3:
        return None
    ss, ys = [s for s, _ in pts], [y for _, y in pts]

    def sse(log_alpha: float) -> float:
        return _linear([s ** -math.exp(log_alpha) for s in ss], ys)[2]

    lo, hi = (math.log(a) for a in _ALPHAS)
    grid = [lo + (hi - lo) * i / 200 for i in range(201)]
    best = min(range(len(grid)), key=lambda i: sse(grid[i]))
    a, b = grid[max(0, best - 1)], grid[min(len(grid) - 1, best + 1)]
    g = (math.sqrt(5) - 1) / 2
    for _ in range(80):  # golden section on the bracket around the grid's best
        c, d = b - g * (b - a), a + g * (b - a)
        a, b = (a, d) if sse(c) <= sse(d) else (c, b)
    alpha = math.exp((a + b) / 2)
    l_inf, amp, err = _linear([s**-alpha for s in ss], ys)
    return LawFit(l_inf, amp, alpha, err, len(pts), tuple(pts))


def forecast_law(fit: LawFit, sum_eta: float, level: float = LEVEL) -> LawForecast:
    """The law at ``sum_eta`` with a prediction interval for one completed run there: the
    delta method on (L∞, A, α) with the residual variance, Student-t with n − 3 degrees of
    freedom (NaN bounds with no residual degrees of freedom or a singular fit)."""
    value = fit.at(sum_eta)
    dof = fit.n - 3
    if dof < 1:
        return LawForecast(value, math.nan, math.nan, sum_eta, 1, level)
    s2 = fit.sse / dof

    def grad(s: float) -> list[float]:
        p = s**-fit.alpha
        return [1.0, p, -fit.a * p * math.log(s)]

    rows = [grad(s) for s, _ in fit.points]
    jtj = [[sum(r[i] * r[j] for r in rows) for j in range(3)] for i in range(3)]
    inv = _inverse3(jtj)
    if inv is None:
        return LawForecast(value, math.nan, math.nan, sum_eta, 1, level)
    g = grad(sum_eta)
    var = s2 * (1 + sum(g[i] * inv[i][j] * g[j] for i in range(3) for j in range(3)))
    half = t_quantile(dof, 0.5 + level / 2) * math.sqrt(max(var, 0.0))
    return LawForecast(value, value - half, value + half, sum_eta, 1, level)


def _inverse3(m: list[list[float]]) -> list[list[float]] | None:
    """The inverse of a 3 × 3 matrix, ``None`` when it is (numerically) singular."""
    (a, b, c), (d, e, f), (g, h, i) = m
    det = a * (e * i - f * h) - b * (d * i - f * g) + c * (d * h - e * g)
    scale = max(abs(x) for row in m for x in row) ** 3
    if not scale or abs(det) <= 1e-12 * scale:
        return None
    adj = [
        [e * i - f * h, c * h - b * i, b * f - c * e],
        [f * g - d * i, a * i - c * g, c * d - a * f],
        [d * h - e * g, b * g - a * h, a * e - b * d],
    ]
    return [[x / det for x in row] for row in adj]


def law_forecast(
    per_seed: Sequence[Sequence[tuple[float, float]]], sum_eta: float, level: float = LEVEL
) -> LawForecast | None:
    """One assignment's forecast at ``sum_eta`` from each seed's (Σ η, completed loss)
    points: the mean of the seeds' fits, with the t interval of that mean over two or more
    seeds, else the one fit's own interval; ``None`` when no seed has 3 points."""
    fits = [
        f
        for f in (fit_law([s for s, _ in pts], [y for _, y in pts]) for pts in per_seed)
        if f is not None
    ]
    if not fits:
        return None
    if len(fits) == 1:
        return forecast_law(fits[0], sum_eta, level)
    values = [f.at(sum_eta) for f in fits]
    n = len(values)
    mean = sum(values) / n
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    half = t_quantile(n - 1, 0.5 + level / 2) * sd / math.sqrt(n)
    return LawForecast(mean, mean - half, mean + half, sum_eta, n, level)


def ranking_rule(top_sum_eta: float, target_sum_eta: float, branches: bool) -> str:
    """Which order the ranking is read from, in words (the verdict's ``ranked by`` line):
    the top rung's completed runs; with branches, the longest branch's, the law's forecast
    shown beside it (:data:`LAW_RANKS` is ``False``: ranking on it waits for the benchmark)."""
    if not branches:
        return f"the top rung's completed runs (Σ η {top_sum_eta:.3g})"
    return (
        f"the longest completed branch (Σ η {top_sum_eta:.3g}); the curve law at "
        f"Σ η {target_sum_eta:.3g} is not benchmarked"
    )
