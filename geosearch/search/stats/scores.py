"""The statistics behind the ranking: seed scores, paired and Welch comparisons, factor main
effects, and the smallest gap a study can detect.

Every assignment of a study is trained with the same seeds (common random numbers), so a
seed's own effect (init, data order) moves every assignment alike and is not noise. The
ranked assignments are read together as a two-way table without interaction,
loss[a, s] = μ + α_a + β_s + ε, fitted by least squares over every (assignment, seed) cell
(the blocked noise model, :mod:`geosearch.search.stats.blocked`; unbalanced when adaptive
seeds gave some assignments more). Its residual σ pools the noise of all assignments, with
df = cells − rank of the design ((A−1)(S−1) when balanced: 3 for 4 assignments × 2 seeds,
where one pair's paired t-test has df 1 and t₀.₉₇₅ = 12.7), and every comparison of two
assignments is the contrast α_b − α_a with standard error σ·√(cᵀ(XᵀX)⁺c). When the table
leaves no residual df (one seed each, one assignment) or two scores are not linked by
shared seeds, a comparison falls back to a paired t-test on the seeds both ran, and to
Welch's test when fewer than two are shared. A module type's *main effect* (e.g. attention
Stiefel vs DGram) is estimated from matched pairs of trials that differ only in that
factor, averaged over the other factors' levels: a contrast of the same fit, else pooled
from the pairs' per-seed differences. Quantiles are exact Student-t quantiles at fractional
degrees of freedom (scipy), and the minimum detectable difference uses the exact
noncentral-t power. scipy and numpy are imported on first use so that reading a ranking's
fields stays light. The fit is :mod:`geosearch.search.stats.blocked` and the pooled noise
and main effects are :mod:`geosearch.search.stats.pooled`, both built on this module. Nothing
here knows Optuna: :mod:`geosearch.search.stats.trials` turns trials into :class:`Score` and
:class:`Point`.

Example:
    >>> from geosearch.search.stats.blocked import blocked_fit
    >>> best = Score((3.00, 3.50, 2.60), seeds=(0, 1, 2))
    >>> other = Score((3.05, 3.54, 2.66), seeds=(0, 1, 2))
    >>> c = compare(best, other)
    >>> c.test, c.verdict, round(c.diff, 3)
    ('paired', 'separated', 0.05)
    >>> third = Score((3.10, 3.61, 2.69), seeds=(0, 1, 2))
    >>> fit = blocked_fit([best, other, third])
    >>> fit.df, compare(best, other, blocked=fit).test
    (4, 'blocked')
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Hashable, Protocol

__all__ = [
    "BlockedTest",
    "Comparison",
    "MainEffect",
    "Noise",
    "Point",
    "Score",
    "above_rounding",
    "best_on_shared_seeds",
    "compare",
    "detectable_gap",
    "judge_gap",
    "t_quantile",
    "welch_df",
]

ALPHA = 0.05  # two-sided level of every test and interval
POWER = 0.80  # the power at which the detectable gap is stated
_FACTOR_NAMES = {"attn": "attention", "mlp": "the MLP"}


# =========================================================================== scores
@dataclass(frozen=True)
class Score:
    """Final validation losses of one trial over its seeds.

    Attributes:
        values: the finite final val losses.
        seeds: the seed of each value, in the same order (``None``: not recorded, so the
            score cannot be paired with another).

    Example:
        >>> s = Score((3.0, 3.2))
        >>> round(s.mean, 3), round(s.std, 4), s.n
        (3.1, 0.1414, 2)
    """

    values: tuple[float, ...]
    seeds: tuple[int, ...] | None = None

    @classmethod
    def of(cls, values: Iterable[Any], seeds: Sequence[Any] | None = None) -> Score:
        """The finite values among ``values`` (``None``, NaN and inf are dropped, with their
        seed); ``seeds`` are kept only when there is one distinct seed per value."""
        values = list(values)
        if seeds is not None and (len(seeds) != len(values) or len(set(seeds)) != len(seeds)):
            seeds = None
        kept = []
        for i, v in enumerate(values):
            try:
                x = float(v)
            except (TypeError, ValueError):
                continue
            if math.isfinite(x):
                kept.append((x, i))
        return cls(tuple(x for x, _ in kept),
                   None if seeds is None else tuple(int(seeds[i]) for _, i in kept))

    @property
    def n(self) -> int:
        return len(self.values)

    @property
    def mean(self) -> float:
        # statistics computes exactly, then rounds: equal seeds give exactly that value
        return statistics.mean(self.values) if self.values else math.nan

    @property
    def std(self) -> float | None:
        """Sample standard deviation (ddof=1); ``None`` with fewer than two seeds."""
        return statistics.stdev(self.values) if self.n >= 2 else None

    @property
    def se(self) -> float | None:
        """Standard error of the mean; ``None`` with fewer than two seeds."""
        return None if self.std is None else self.std / math.sqrt(self.n)

    def differences(self, other: Score) -> list[float]:
        """``other - self`` at each seed both have, by seed; ``[]`` when either has no seeds."""
        if self.seeds is None or other.seeds is None:
            return []
        mine = dict(zip(self.seeds, self.values))
        return [v - mine[s] for s, v in sorted(zip(other.seeds, other.values)) if s in mine]

    def text(self) -> str:
        """``"3.3100 ± 0.0100 (n=3)"``; the mean alone with one seed, ``"—"`` with none."""
        if self.n == 0:
            return "—"
        if self.std is None:
            return f"{self.mean:.4f}"
        return f"{self.mean:.4f} ± {self.std:.4f} (n={self.n})"



def best_on_shared_seeds(candidates: Iterable[tuple[int, Score]]) -> int | None:
    """The number of the candidate with the lowest mean over the seeds every candidate ran
    (all of its values when seeds are not recorded or none is shared; ties: the lowest
    number); ``None`` without a scored candidate.

    How a step grid picks an assignment's best step: its factors compared on the same seeds,
    so that a factor given more seeds afterwards (successive halving, adaptive seeds) keeps
    the choice those seeds were given for.

    Example:
        >>> best_on_shared_seeds([(1, Score((3.0, 3.4), (0, 1))), (2, Score((3.1,), (0,)))])
        1
    """
    scored = [(n, s) for n, s in candidates if s.n]
    if not scored:
        return None
    shared = (set.intersection(*(set(s.seeds) for _, s in scored))
              if all(s.seeds is not None for _, s in scored) else set())

    def mean(s: Score) -> float:
        if not shared:
            return s.mean
        return statistics.mean(v for v, seed in zip(s.values, s.seeds or ()) if seed in shared)

    return min(scored, key=lambda c: (mean(c[1]), c[0]))[0]

# =========================================================================== quantiles
def t_quantile(df: float, p: float = 1 - ALPHA / 2) -> float:
    """The exact ``p`` quantile of Student's t at ``df`` degrees of freedom (fractional df
    allowed; infinite df gives the normal quantile)."""
    from scipy import stats

    if df <= 0:
        raise ValueError(f"degrees of freedom must be positive but got {df}")
    return float(stats.norm.ppf(p) if math.isinf(df) else stats.t.ppf(p, df))


def welch_df(a: Score, b: Score) -> float:
    """Welch–Satterthwaite degrees of freedom of ``mean(a) - mean(b)`` (both n ≥ 2, not
    both without spread): (v₁ + v₂)² / (v₁²/(n₁-1) + v₂²/(n₂-1)), vᵢ = seᵢ²."""
    v1, v2 = a.se ** 2, b.se ** 2
    return (v1 + v2) ** 2 / (v1 ** 2 / (a.n - 1) + v2 ** 2 / (b.n - 1))


def detectable_gap(se: float, df: float, alpha: float = ALPHA, power: float = POWER) -> float:
    """The smallest true gap that a two-sided t-test at level ``alpha`` detects with
    probability ``power``, for a difference estimated with standard error ``se`` and ``df``
    degrees of freedom: λ·se, where the noncentral t with noncentrality λ exceeds the
    critical value t₁₋α/₂(df) in absolute value with probability ``power``."""
    from scipy import optimize, stats

    if se == 0:
        return 0.0
    crit = t_quantile(df, 1 - alpha / 2)

    def shortfall(lam: float) -> float:
        # P(T < -crit | λ) = P(T > crit | -λ): scipy's nct.cdf far in the lower tail can be NaN
        return float(stats.nct.sf(crit, df, lam) + stats.nct.sf(crit, df, -lam)) - power

    hi = crit + 2.0
    while shortfall(hi) < 0:
        hi *= 2
    return float(optimize.brentq(shortfall, 0.0, hi, xtol=1e-10)) * se


# =========================================================================== comparisons
@dataclass(frozen=True)
class Comparison:
    """How a trial compares with the best (or with the trial ranked just above it).

    Attributes:
        verdict: ``"tie"`` (not shown worse at 5%), ``"separated"`` (worse beyond noise) or
            ``"unknown"`` (no spread to judge by).
        test: ``"blocked"`` (a contrast of the assignment + seed fit), ``"paired"``
            (per-seed differences), ``"welch"`` or ``"none"``.
        diff: the estimated gap, other minus best (blocked: α_other − α_best; paired: the
            mean per-seed difference; Welch: the difference of means).
        threshold: t₀.₉₇₅(df)·se, the half-width of the gap's 95% interval (``None``: unknown).
        df: the test's degrees of freedom (``None``: no test).
        n: the seeds both ran (Welch and none: the smaller count).
        se: the standard error of ``diff`` (``None``: unknown).
    """

    verdict: str
    test: str
    diff: float
    threshold: float | None
    df: float | None
    n: int
    se: float | None = None

    @property
    def interval(self) -> tuple[float, float] | None:
        """The gap's 95% interval, ``diff ± threshold`` (``None``: no spread to give one)."""
        return None if self.threshold is None else (self.diff - self.threshold, self.diff + self.threshold)


class BlockedTest(Protocol):
    """What :func:`compare` asks of a blocked fit
    (:class:`geosearch.search.stats.blocked.BlockedFit`, which builds on this module)."""

    def compare(self, best: Score, other: Score) -> Comparison | None: ...


def compare(best: Score, other: Score, *, blocked: BlockedTest | None = None) -> Comparison:
    """Compare ``other`` with ``best``: the contrast of the two in ``blocked`` when given and
    both are in it, linked by shared seeds (the test every ranking uses); else a paired
    t-test on the seeds both ran when they share at least two, else a Welch t-test, else
    ``"unknown"``.

    The gap counts as ``"separated"`` only when ``other`` is worse: its estimate exceeds
    ``threshold``; an exact zero gap is a tie even when there is no spread at all.
    """
    if blocked is not None:
        c = blocked.compare(best, other)
        if c is not None:
            return c
    d = best.differences(other)
    if len(d) >= 2:
        n = len(d)
        diff = statistics.mean(d)
        sd = above_rounding(statistics.stdev(d), best.values + other.values)
        se = sd / math.sqrt(n)
        threshold = t_quantile(n - 1) * se
        return Comparison(judge_gap(diff, threshold), "paired", diff, threshold, n - 1, n, se)
    diff = other.mean - best.mean
    n = min(best.n, other.n)
    if best.se is None or other.se is None:
        return Comparison("tie" if diff == 0 else "unknown", "none", diff, None, None, n)
    if above_rounding(math.hypot(best.se, other.se), best.values + other.values) == 0:
        return Comparison(judge_gap(diff, 0.0), "welch", diff, 0.0, None, n, 0.0)
    df = welch_df(best, other)
    se = math.hypot(best.se, other.se)
    threshold = t_quantile(df) * se
    return Comparison(judge_gap(diff, threshold), "welch", diff, threshold, df, n, se)


def above_rounding(sd: float, values: Sequence[float]) -> float:
    """``sd``, or 0 when it is at the level of float rounding of ``values`` (a per-seed
    difference that is the same in every seed up to the last bits has no noise)."""
    return 0.0 if sd <= 1e-12 * max(map(abs, values), default=0.0) else sd


def judge_gap(diff: float, threshold: float) -> str:
    """Worse beyond the threshold (so with no noise, any positive gap) is separated."""
    return "separated" if diff > threshold else "tie"


# =========================================================================== noise
@dataclass(frozen=True)
class Noise:
    """The seed-to-seed noise of one run, pooled over the trials.

    Attributes:
        sd: residual standard deviation of one run's final loss.
        df: its degrees of freedom.
        blocked: True when the seeds' shared effect was removed (trial + seed model); a
            paired difference then has standard deviation sd·√2.
    """

    sd: float
    df: int
    blocked: bool


# =========================================================================== main effects
@dataclass(frozen=True)
class Point:
    """What a trial searched, split for factorial contrasts.

    Attributes:
        levels: factor -> level, e.g. ``{"attn": "stiefel", "mlp": "dgram"}``.
        rest: everything else that was searched (hyperparameters), compared as a whole.
    """

    levels: Mapping[str, str]
    rest: Hashable = ()


@dataclass(frozen=True)
class MainEffect:
    """The effect of one factor's level on the final loss, averaged over the others.

    Attributes:
        factor: ``"attn"``, ``"mlp"`` or a module type.
        better, worse: the two levels compared; ``effect`` ≥ 0 is worse minus better.
        effect: mean over matched pairs of each pair's gap (blocked: α_worse − α_better
            of the fit; else the mean per-seed difference).
        half_width: of its 95% interval (``None``: no residual df and no pair with two seeds).
        df: degrees of freedom of the interval (blocked: the fit's residual df).
        seeds: the number of seeds each matched pair shares.
        blocked: True when the interval is the contrast's in the assignment + seed fit of
            all the cells, False when pooled from the pairs' own per-seed differences.
    """

    factor: str
    better: str
    worse: str
    effect: float
    half_width: float | None
    df: int
    seeds: tuple[int, ...]
    blocked: bool = False

    @property
    def decisive(self) -> bool:
        """True when the 95% interval excludes zero."""
        return self.half_width is not None and self.effect > self.half_width

    @property
    def name(self) -> str:
        """``"attention's geometry"``."""
        return f"{_FACTOR_NAMES.get(self.factor, self.factor)}'s geometry"

    def text(self) -> str:
        """``"attention's geometry: stiefel better than dgram by 0.0800 ± 0.0200 (95% CI,
        2 seeds × 2 pairs)"``, or says that the interval covers zero."""
        return f"{self.name}: {self.body()}"

    def body(self) -> str:
        """:meth:`text` without the factor's name."""
        lo, hi = min(self.seeds), max(self.seeds)
        p = len(self.seeds)
        design = f"{lo if lo == hi else f'{lo}–{hi}'} seed{'s' * (hi > 1)} × {p} pair{'s' * (p > 1)}"
        if self.half_width is None:
            return f"{self.better} ahead of {self.worse} by {self.effect:.4f}, spread unknown ({design})"
        ci = f"{self.effect:.4f} ± {self.half_width:.4f} (95% CI, {design})"
        if self.decisive:
            return f"{self.better} better than {self.worse} by {ci}"
        return f"{self.better} and {self.worse} within noise: {self.better} ahead by {ci}"
