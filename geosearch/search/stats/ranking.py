"""Rank the completed trials of a study, and say whether the top one is a winner or a tie.

One rule serves the ranking printed after ``geosearch search``, the exported provenance
and ``report.md``: :func:`rank_scores` builds the :class:`Ranking` and its one-line
verdict, and every caller shows that verdict. Trials are ranked by their mean final
validation loss over seeds; each is compared with the best by its contrast in the fit
loss = assignment + seed + ε of all the ranked scores (every assignment runs the same
seeds: :func:`geosearch.search.stats.blocked.blocked_fit`, df 3 for 4 assignments × 2 seeds
where one pair's paired test has df 1), else by a paired t-test on the seeds both ran, else
Welch's, at 5% two-sided with exact quantiles. A trial with no spread to judge by is
``"unknown"``: the verdict says the gap cannot be judged rather than naming a winner that
seed noise could explain. The verdict gives each adjacent pair from the top to just past
the last contender with its gap, 95% interval, separation and the benchmark's record for
gaps that size (:data:`ORDER_RECORD`); then the module types whose geometry has a main
effect beyond noise (e.g. "attention's geometry: stiefel better than dgram by 0.0800 ±
0.0200 (95% CI, 2 seeds × 2 pairs)"), and the smallest gap the study could have detected
(80% power). Which assignments get another seed is planned from the ranking
(:mod:`geosearch.search.stats.seeding`); a point's adaptive seeds are trials of their own
(``seed_of``), merged into its :class:`Score` when the trials are read
(:func:`geosearch.search.stats.trials.point_scores`), and baselines (``baseline``) are never
ranked.

Example:
    >>> ranking = rank_scores([(0, "attn=stiefel", Score((3.00, 3.02, 2.98))),
    ...                        (1, "attn=dgram", Score((3.50, 3.52, 3.48)))])
    >>> [row.versus_best for row in ranking.rows]
    ['best', 'separated']
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass



from geosearch.search.stats.blocked import BlockedFit, blocked_fit
from geosearch.search.stats.pooled import main_effects, seed_noise
from geosearch.search.stats.scores import (
    Comparison,
    MainEffect,
    Noise,
    Point,
    Score,
    compare,
    detectable_gap,
)
from geosearch.search.stats.track import ORDER_RECORD

__all__ = [
    "PairGap",
    "RankedTrial",
    "Ranking",
    "Sensitivity",
    "StepAnswers",
    "compare_scores",
    "rank_scores",
]

_LISTED_PAIRS = 8  # adjacent pairs the one-line verdict spells out (Ranking.pairs has them all)
_TESTS = {"paired": "paired t-test on the seeds both ran, 5%", "welch": "Welch t-test, 5%",
          "none": "equal means, no spread to test",
          "blocked": "blocked t-test (loss = assignment + seed + noise, df {df}), 5%"}


def _test_text(test: str, df: float | None) -> str:
    """The test in words; the blocked one with its residual df."""
    return _TESTS[test].format(df=f"{df:g}" if df is not None else "?")


def compare_scores(best: Score, other: Score, *, blocked: BlockedFit | None = None) -> tuple[str, float | None]:
    """Can ``other`` be told apart from ``best`` (a t-test at 5%, two-sided)?

    Their contrast in ``blocked`` (the assignment + seed fit of their table) when both are
    in it; else paired on the seeds both ran when they share two or more, else Welch (see
    :func:`geosearch.search.stats.scores.compare`, which gives the test, df and gap too).

    Returns:
        ``(verdict, threshold)``: ``"tie"`` when the gap is below the threshold
        t₀.₉₇₅(df)·se, ``"separated"`` above it, ``"unknown"`` when there is no spread to
        judge by (threshold ``None``).
    """
    c = compare(best, other, blocked=blocked)
    return c.verdict, c.threshold


# =========================================================================== ranking
@dataclass(frozen=True)
class RankedTrial:
    """One completed trial in the ranking.

    Attributes:
        rank: 1 = lowest mean val loss.
        number: Optuna trial number.
        label: the searched point, e.g. ``"attn=stiefel, mlp=dgram"``.
        score: its final val losses over seeds.
        gap: the gap to the best that its test judged: the contrast α − α_best of the
            blocked fit, the mean per-seed difference on the seeds both ran when paired, else
            its mean minus the best mean (0 for the best).
        versus_best: ``"best"``, ``"tie"``, ``"separated"`` or ``"unknown"``.
        threshold: the noise threshold of the comparison with the best (``None``: unknown).
        comparison: that comparison in full (test, df, seeds); ``None`` for the best.
    """

    rank: int
    number: int
    label: str
    score: Score
    gap: float
    versus_best: str
    threshold: float | None
    comparison: Comparison | None = None


@dataclass(frozen=True)
class Sensitivity:
    """The smallest gap the study's test detects with 80% power at 5% two-sided.

    Attributes:
        gap: that gap, in val loss.
        seeds: the seeds of the comparison it is stated for (the best vs the runner-up).
        test: ``"blocked"``, ``"paired"`` or ``"welch"``.
        noise: the pooled noise of one run it is computed from.
        df: the degrees of freedom of that test (blocked: the fit's residual df).
    """

    gap: float
    seeds: int
    test: str
    noise: Noise
    df: float | None = None

    def text(self) -> str:
        """``"gaps below 0.0312 could not be reliably detected with 2 seeds (80% power, ...)"``."""
        return (f"gaps below {self.gap:.4f} could not be reliably detected with {self.seeds} "
                f"seed{'s' * (self.seeds != 1)} (80% power, {_test_text(self.test, self.df)}; "
                f"noise sd {self.noise.sd:.4f} per run)")


@dataclass(frozen=True)
class PairGap:
    """Two neighbours of the ranking, the lower one compared with the one above it: no
    ranking is presented as an order when its steps are a hair's breadth.

    Attributes:
        rank: the rank of the upper one (the lower one is ``rank + 1``).
        upper, lower: their trial numbers.
        comparison: lower against upper (gap = lower − upper, its 95% interval, verdict).
    """

    rank: int
    upper: int
    lower: int
    comparison: Comparison

    def text(self) -> str:
        """``"#1 trial 0 vs #2 trial 3: gap 0.0310 (≥ 0.02: in the benchmark such gaps kept
        their order at 2,000 steps 13 of 15 times), 95% CI [0.0120, 0.0500], separated"``."""
        c = self.comparison
        head = (f"#{self.rank} trial {self.upper} vs #{self.rank + 1} trial {self.lower}: "
                f"gap {c.diff:.4f} ({ORDER_RECORD.text(c.diff)})")
        if c.interval is None:
            return f"{head}, not judged (no spread for a 95% interval)"
        word = "separated" if c.verdict == "separated" else "not separated"
        return f"{head}, 95% CI [{c.interval[0]:.4f}, {c.interval[1]:.4f}], {word}"


@dataclass(frozen=True)
class StepAnswers:
    """The two answers of a space with a step grid (``hyperparams.step_grid``): the
    :class:`Ranking` that holds this is each assignment at its own best step (the exported
    answer); ``shared`` is the points at the shared step, ranked as a space without a grid
    would be.

    Attributes:
        shared_step: ``proxy.spectral_lr`` (``None``: not recorded; the factors are shown).
        shared: the ranking of the points at factor 1.
        factors: trial number -> its factor, for every ranked trial of both rankings.
        grid: the grid's factors seen among the points, ascending.
        unstable_shared: ``(label, trial at the shared step, own step's trial)`` for each
            assignment pruned as unstable at the shared step and completed at another (one
            a loss pruner stopped there is ``pruned``, not unstable, and is not here).
        effects: ``(factor, at the shared step or None, at own best steps)`` per main effect
            of the own-step ranking.
    """

    shared_step: float | None
    shared: Ranking
    factors: Mapping[int, float]
    grid: tuple[float, ...]
    unstable_shared: tuple[tuple[str, int, int], ...] = ()
    effects: tuple[tuple[str, MainEffect | None, MainEffect], ...] = ()

    def step(self, number: int) -> str:
        """Trial ``number``'s spectral step in words: ``"0.04"`` (``"x2"`` without the shared
        step)."""
        f = self.factors[number]
        return f"{self.shared_step * f:.3g}" if self.shared_step else f"x{f:g}"

    def at_the_end(self, number: int) -> bool:
        """Whether trial ``number``'s factor is the grid's smallest or largest but not 1: as
        an assignment's best step it is not bracketed (a step past it may be better)."""
        f = self.factors[number]
        return f != 1 and f in (self.grid[0], self.grid[-1])

    def effect_lines(self) -> list[str]:
        """Per main effect: whether it survives the tuning, with both intervals."""
        out = []
        for _, shared, own in self.effects:
            if own.decisive and shared is not None and shared.decisive:
                word = ("survives the tuning" if shared.better == own.better else
                        "reverses with the tuning")
            elif own.decisive and shared is not None and shared.half_width is None:
                word = ("is decisive at each assignment's own best step; at the shared step "
                        "not judged (no spread)")
            elif own.decisive:
                word = "appears only with each assignment at its own best step"
            elif shared is not None and shared.decisive:
                word = "does not survive the tuning"
            else:
                word = "within noise at both"
            at_shared = shared.body() if shared is not None else "not measured (no matched pairs)"
            out.append(f"{own.name} {word}: at the shared step, {at_shared}; at each one's own "
                       f"best step, {own.body()}")
        return out


@dataclass(frozen=True)
class Ranking:
    """Completed trials, best first, and the verdict in words.

    Attributes:
        rows: the completed trials, ranked.
        tied: trial numbers within noise of the best (the best included).
        verdict: one line: a winner, a tie, or why no winner can be named; then the main
            effects beyond noise and the smallest detectable gap.
        effects: every factor's main effect (:func:`geosearch.search.stats.pooled.main_effects`),
            within noise or not; each has ``text()``.
        sensitivity: the smallest detectable gap (``None``: no spread to state it from).
        pairs: each adjacent pair from the top down to the last contender (tie or unknown
            with the best) and the one after it; each has ``text()``, the first 8 in the verdict.
        noise: the blocked fit of the ranked scores (``None``: no residual df, so the
            comparisons are paired or Welch per pair).
        steps: with a step grid, the answer at the shared step beside this one (each
            assignment at its own best step); ``None`` without one.
    """

    rows: list[RankedTrial]
    tied: list[int]
    verdict: str
    effects: tuple[MainEffect, ...] = ()
    sensitivity: Sensitivity | None = None
    pairs: tuple[PairGap, ...] = ()
    noise: BlockedFit | None = None
    steps: StepAnswers | None = None


def rank_scores(entries: Iterable[tuple[int, str, Score]],
                points: Mapping[int, Point] | None = None, *, blocked: bool = True,
                state_effects: bool = True) -> Ranking:
    """Rank ``(trial number, label, score)`` entries by mean (see the module docstring).

    Args:
        entries: the completed trials; those without a finite value (``score.n == 0``)
            are left out.
        points: trial number -> what it searched, for the factors' main effects (none
            without it).
        blocked: compare within the assignment + seed fit of all the ranked scores when it
            has residual df (False: paired or Welch per pair, as before that fit).
        state_effects: name the decisive main effects in the verdict (False: the caller
            states them, as the two answers of a step grid do side by side).
    """
    scored = sorted((e for e in entries if e[2].n), key=lambda e: (e[2].mean, e[0]))
    if not scored:
        return Ranking([], [], "no trial completed, so no assignment can be recommended")
    fit = blocked_fit([s for _, _, s in scored]) if blocked else None
    best = scored[0][2]
    rows = [RankedTrial(1, scored[0][0], scored[0][1], best, 0.0, "best", None)]
    for i, (number, label, score) in enumerate(scored[1:], start=2):
        c = compare(best, score, blocked=fit)
        # the gap the test judged (blocked: the fit's contrast; paired: on shared seeds, as a
        # point with an extra seed has a mean over more seeds than the pairs the test is for)
        rows.append(RankedTrial(i, number, label, score, c.diff, c.verdict, c.threshold, c))
    tied = [r.number for r in rows if r.versus_best in ("best", "tie")]
    effects = (tuple(main_effects(((points[n], s) for n, _, s in scored if n in points), blocked=blocked))
               if points else ())
    sensitivity = _sensitivity(rows, fit)
    pairs = _pairs(rows, fit)
    verdict = _verdict(rows, effects if state_effects else (), sensitivity, pairs)
    return Ranking(rows, tied, verdict, effects, sensitivity, pairs, fit)


def _pairs(rows: list[RankedTrial], fit: BlockedFit | None) -> tuple[PairGap, ...]:
    """Each adjacent pair of ``rows`` down to the last contender and the one after it."""
    last = max(r.rank for r in rows if r.versus_best in ("best", "tie", "unknown"))
    return tuple(PairGap(k, rows[k - 1].number, rows[k].number,
                         compare(rows[k - 1].score, rows[k].score, blocked=fit))
                 for k in range(1, min(last, len(rows) - 1) + 1))


def _sensitivity(rows: list[RankedTrial], fit: BlockedFit | None) -> Sensitivity | None:
    """The detectable gap of the best-vs-runner-up test: its own se and df when blocked
    (σ·√(2/S) at df (A−1)(S−1) when balanced), else at the pooled noise of all trials."""
    c = rows[1].comparison if len(rows) > 1 else None
    if c is not None and c.test == "blocked":
        if not c.se:
            return None
        return Sensitivity(detectable_gap(c.se, c.df), c.n, "blocked", Noise(fit.sd, fit.df, True), c.df)
    if c is None or c.n < 2:
        return None
    paired = c.test == "paired"
    noise = seed_noise([r.score if paired else Score(r.score.values) for r in rows])
    if noise is None or noise.sd == 0:
        return None
    # a difference of two means over n seeds: se = sd·√(2/n), paired (sd of a difference
    # sd·√2 over √n, df n-1) or not (df 2n-2 with equal spreads)
    se = noise.sd * math.sqrt(2 / c.n)
    df = c.n - 1 if paired else 2 * c.n - 2
    return Sensitivity(detectable_gap(se, df), c.n, "paired" if paired else "welch", noise, df)


def _verdict(rows: list[RankedTrial], effects: tuple[MainEffect, ...], sensitivity: Sensitivity | None,
             pairs: tuple[PairGap, ...] = ()) -> str:
    top = rows[0]
    name = f"{top.label} (trial {top.number}, val loss {top.score.text()})"
    if len(rows) == 1:
        return f"only one assignment completed: {name}; there is nothing to compare it with"
    ties = [r for r in rows[1:] if r.versus_best == "tie"]
    unknown = [r for r in rows[1:] if r.versus_best == "unknown"]
    if ties:
        others = ", ".join(f"{r.label} (trial {r.number})" for r in ties)
        tests = " / ".join(dict.fromkeys(_test_text(r.comparison.test, r.comparison.df) for r in ties))
        base = (f"no single winner: {name} has the lowest mean, but {others} "
                f"{'is' if len(ties) == 1 else 'are'} within noise of it ({tests}); "
                "rerun the tied assignments with more seeds (--repeats)")
    elif unknown:
        first = unknown[0]
        if all(r.score.n < 2 for r in rows):
            who = "with one seed per assignment there is no spread"
        elif top.score.n < 2:
            who = "the best assignment has one seed, so no spread"
        else:
            who = (f"{len(unknown)} of the others {'has' if len(unknown) == 1 else 'have'} one "
                   "seed, so no spread")
        base = (f"lowest val loss: {name}, {first.gap:+.4f} ahead of {first.label} (trial "
                f"{first.number}); {who}, so whether that gap is more than seed noise cannot be "
                "judged (rerun with --repeats 3)")
    else:
        second = rows[1]
        if second.threshold:
            how = (f"beyond the noise threshold {second.threshold:.4f} "
                   f"({_test_text(second.comparison.test, second.comparison.df)})")
        elif second.comparison.test in ("paired", "blocked"):
            how = "by the same amount in every seed, so there is no noise to explain it"
        else:
            how = "and every seed of both agrees exactly, so there is no noise to explain it"
        base = (f"winner: {name}; the runner-up {second.label} (trial {second.number}) is "
                f"{second.gap:.4f} higher, {how}")
    extras = ["ranked pairs: " + "; ".join(p.text() for p in pairs[:_LISTED_PAIRS])] if pairs else []
    if len(pairs) > _LISTED_PAIRS:
        extras[0] += (f"; {len(pairs) - _LISTED_PAIRS} more adjacent pairs down to the last "
                      "contender, not listed (their gaps to the best are in the ranking)")
    extras += [e.text() for e in effects if e.decisive]
    if sensitivity is not None:
        extras.append(sensitivity.text())
    return "; ".join([base, *extras])
