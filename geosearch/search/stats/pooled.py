"""What all the scores of a study say together: the pooled seed noise (:func:`seed_noise`)
and each factor's main effects (:func:`main_effects`), both read from the blocked fit of
every (assignment, seed) cell (:mod:`geosearch.search.stats.blocked`) when it has residual df.

It sits above :mod:`geosearch.search.stats.scores` (scores, comparisons, quantiles) and
:mod:`~geosearch.search.stats.blocked` (the fit); nothing here knows Optuna or torch.

Example:
    >>> a = Score((3.00, 3.50), seeds=(0, 1))
    >>> b = Score((3.05, 3.56), seeds=(0, 1))
    >>> noise = seed_noise([a, b])
    >>> noise.df, noise.blocked
    (1, True)
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from itertools import combinations
from typing import Hashable

from geosearch.search.stats.blocked import blocked_fit
from geosearch.search.stats.scores import MainEffect, Noise, Point, Score, t_quantile

__all__ = ["main_effects", "seed_noise"]


def seed_noise(scores: Sequence[Score]) -> Noise | None:
    """The pooled noise of ``scores``: the residual of the additive model
    loss = trial + seed + ε fitted by least squares
    (:func:`geosearch.search.stats.blocked.blocked_fit`) when every score has seeds (the seed
    effect, common to all trials, is not noise for paired comparisons), else the pooled
    within-trial spread. ``None`` when no residual degree of freedom is left."""
    scores = [s for s in scores if s.n]
    if scores and all(s.seeds is not None for s in scores):
        fit = blocked_fit(scores)
        return None if fit is None else Noise(fit.sd, fit.df, True)
    df = sum(s.n - 1 for s in scores)
    rss = sum((s.n - 1) * s.std ** 2 for s in scores if s.n >= 2)
    return Noise(math.sqrt(rss / df), df, False) if df else None


def main_effects(cells: Iterable[tuple[Point, Score]], *, blocked: bool = True) -> list[MainEffect]:
    """Main effects of every factor whose level varies, for each pair of its levels.

    A matched pair is two trials whose points differ only in that factor's level (a, b) and
    that share a seed. The effect is the mean over pairs of each pair's gap loss(b) −
    loss(a) (each level combination of the other factors weighs the same, as in a factorial
    contrast). With ``blocked`` (the default) and a fit of all ``cells`` that has residual
    df (:func:`geosearch.search.stats.blocked.blocked_fit`), the effect is that contrast of
    the fit, Σ (α_b − α_a)/pairs, with its standard error and df: the noise is pooled over
    every cell, not only over the pairs. Otherwise each pair's gap is its mean per-seed
    difference, the variance is pooled
    from the spread of the differences within pairs (df = Σ(seeds − 1)), taking differences
    of different pairs as independent. Pairs are disjoint when each point has one trial; a
    point with several keeps the one with the most seeds (the first listed). Levels with no
    matched pair give no effect; the result lists factors in name order.
    """
    cells = [(p, s) for p, s in cells if s.n]
    fit = blocked_fit([s for _, s in cells]) if blocked else None
    out: list[MainEffect] = []
    for factor in sorted({f for p, _ in cells for f in p.levels}):
        levels = sorted({p.levels[factor] for p, _ in cells if factor in p.levels})
        for a, b in combinations(levels, 2):
            groups: dict[Hashable, dict[str, int]] = {}
            for i, (p, s) in enumerate(cells):
                level = p.levels.get(factor)
                if level not in (a, b):
                    continue
                key = (tuple(sorted((k, v) for k, v in p.levels.items() if k != factor)), p.rest)
                slot = groups.setdefault(key, {})
                if level not in slot or s.n > cells[slot[level]][1].n:
                    slot[level] = i
            shared = {(g[a], g[b]): cells[g[a]][1].differences(cells[g[b]][1])
                      for g in groups.values() if len(g) == 2}
            pairs = [ij for ij, d in shared.items() if d]
            if not pairs:
                continue
            diffs = [shared[ij] for ij in pairs]
            weights: dict[int, float] = {}  # the contrast Σ (α_b − α_a) / pairs
            for i, j in pairs:
                weights[i] = weights.get(i, 0.0) - 1 / len(pairs)
                weights[j] = weights.get(j, 0.0) + 1 / len(pairs)
            contrast = None if fit is None else fit.contrast(weights)
            out.append(_effect(factor, a, b, diffs) if contrast is None else
                       _blocked_effect(factor, a, b, contrast, fit.df, diffs))
    return out


def _effect(factor: str, a: str, b: str, pairs: list[list[float]]) -> MainEffect:
    means = [statistics.mean(d) for d in pairs]
    effect = statistics.mean(means)
    df = sum(len(d) - 1 for d in pairs)
    half = None
    if df:
        var = sum((x - m) ** 2 for d, m in zip(pairs, means) for x in d) / df
        se = math.sqrt(var * sum(1 / len(d) for d in pairs)) / len(pairs)
        half = t_quantile(df) * se
    better, worse = (a, b) if effect >= 0 else (b, a)
    return MainEffect(factor, better, worse, abs(effect), half, df, tuple(len(d) for d in pairs))


def _blocked_effect(factor: str, a: str, b: str, contrast: tuple[float, float], df: int,
                    pairs: list[list[float]]) -> MainEffect:
    effect, se = contrast
    better, worse = (a, b) if effect >= 0 else (b, a)
    return MainEffect(factor, better, worse, abs(effect), t_quantile(df) * se, df,
                      tuple(len(d) for d in pairs), blocked=True)
