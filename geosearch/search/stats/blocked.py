"""The blocked noise model: one least-squares fit of loss[a, s] = μ + α_a + β_s + ε over
every (assignment, seed) cell of the ranked scores (:func:`blocked_fit`, :class:`BlockedFit`).

Every assignment of a study is trained with the same seeds (common random numbers), so a
seed's own effect (init, data order) moves every assignment alike and is not noise: the
seeds are blocks, and the ranked assignments are read together as a two-way table without
interaction (unbalanced when adaptive seeds gave some assignments more). Its residual σ pools
the noise of all assignments, with df = cells − rank of the design ((A−1)(S−1) when
balanced: 3 for 4 assignments × 2 seeds, where one pair's paired t-test has df 1 and
t₀.₉₇₅ = 12.7), and a comparison of two assignments is the contrast α_b − α_a with standard
error σ·√(cᵀ(XᵀX)⁺c) (:meth:`BlockedFit.compare`, which
:func:`geosearch.search.stats.scores.compare` uses when given the fit, falling back to its
paired or Welch test when the fit is ``None`` or the two are not linked by shared seeds).
numpy is imported on first use; nothing here knows Optuna or torch.

Example:
    >>> best = Score((3.00, 3.50, 2.60), seeds=(0, 1, 2))
    >>> other = Score((3.05, 3.54, 2.66), seeds=(0, 1, 2))
    >>> third = Score((3.10, 3.61, 2.69), seeds=(0, 1, 2))
    >>> fit = blocked_fit([best, other, third])
    >>> fit.df, fit.compare(best, other).test
    (4, 'blocked')
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from geosearch.search.stats.scores import Comparison, Score, above_rounding, judge_gap, t_quantile

__all__ = ["BlockedFit", "blocked_fit"]


@dataclass(frozen=True, eq=False)
class BlockedFit:
    """The least-squares fit of loss[a, s] = μ + α_a + β_s + ε over every (assignment, seed)
    cell of some scores (:func:`blocked_fit`).

    The seeds are blocks shared by all assignments, so the seed effect β_s is estimated
    once from all of them instead of being counted as noise (Welch) or removed pair by pair
    with one degree of freedom lost per seed and pair (paired t-test). The design is
    dummy-coded and over-parameterised (intercept, one column per assignment, one per seed);
    only contrasts of the α's are estimable, and only between assignments linked by shared
    seeds, which :meth:`contrast` checks rather than trusting a pseudo-inverse.

    Attributes:
        sd: the residual standard deviation σ of one run (0 when at float rounding).
        df: its degrees of freedom, cells − rank of the design ((A−1)(S−1) when balanced).
        cells: the number of (assignment, seed) values fitted.
        scores: the scores given; ``positions[i]`` is the fitted assignment of ``scores[i]``,
            ``None`` for one left out (no seeds recorded, or no value).
    """

    sd: float
    df: int
    cells: int
    scores: tuple[Score, ...]
    positions: tuple[int | None, ...]
    _coef: Any = field(repr=False)  # μ, α, β: one least-squares solution
    _gram_pinv: Any = field(repr=False)  # (XᵀX)⁺
    _row_space: Any = field(repr=False)  # X⁺X, the projection onto the estimable functions

    def contrast(self, weights: Mapping[int, float]) -> tuple[float, float] | None:
        """The estimate and standard error of Σ wᵢ·α of ``scores[i]``, σ·√(cᵀ(XᵀX)⁺c);
        ``None`` when a score is not in the fit or the combination is not estimable (its
        weights do not sum to zero, or it links assignments that share no chain of seeds)."""
        import numpy as np

        c = np.zeros(len(self._coef))
        for i, w in weights.items():
            a = self.positions[i] if 0 <= i < len(self.positions) else None
            if a is None:
                return None
            c[1 + a] += w
        if not c.any() or np.linalg.norm(self._row_space @ c - c) > 1e-9 * np.linalg.norm(c):
            return None
        var = max(float(c @ self._gram_pinv @ c), 0.0)
        return float(c @ self._coef), self.sd * math.sqrt(var)

    def position(self, score: Score, besides: int | None = None) -> int | None:
        """The index of ``score`` in :attr:`scores` among the fitted ones (the same object
        first, else an equal score), other than ``besides``; ``None`` when absent."""
        fitted = [i for i, a in enumerate(self.positions) if a is not None and i != besides]
        return next((i for i in fitted if self.scores[i] is score),
                    next((i for i in fitted if self.scores[i] == score), None))

    def compare(self, best: Score, other: Score) -> Comparison | None:
        """The blocked test of ``other`` against ``best``
        (:func:`geosearch.search.stats.scores.compare` with ``blocked``): the contrast
        α_other − α_best with t₀.₉₇₅ at this fit's df; ``None`` when either is not in the fit or
        the two are not linked by shared seeds."""
        i = self.position(best)
        j = None if i is None else self.position(other, besides=i)
        got = None if j is None else self.contrast({j: 1.0, i: -1.0})
        if got is None:
            return None
        diff, se = got
        threshold = t_quantile(self.df) * se
        return Comparison(judge_gap(diff, threshold), "blocked", diff, threshold, self.df,
                          len(best.differences(other)), se)


def blocked_fit(scores: Sequence[Score]) -> BlockedFit | None:
    """Fit loss[a, s] = μ + α_a + β_s + ε by least squares to every (score, seed) value of
    ``scores`` that records its seeds (see :class:`BlockedFit`).

    Unbalanced tables (an adaptive seed on some assignments, a seed lost to a NaN) are fitted
    as they are: the residual df is cells − rank(X), and a cell that no other assignment
    shares a seed with is absorbed by its seed's β and adds nothing to the noise. Returns
    ``None`` when no residual degree of freedom is left (one seed each, one assignment):
    the comparisons then fall back to paired or Welch tests per pair.
    """
    import numpy as np

    fitted = [i for i, s in enumerate(scores) if s.n and s.seeds is not None]
    seeds = sorted({x for i in fitted for x in scores[i].seeds})
    width = 1 + len(fitted) + len(seeds)
    col = {x: 1 + len(fitted) + j for j, x in enumerate(seeds)}
    rows, y = [], []
    for a, i in enumerate(fitted):
        for x, v in zip(scores[i].seeds, scores[i].values):
            row = np.zeros(width)
            row[0] = row[1 + a] = row[col[x]] = 1.0
            rows.append(row)
            y.append(v)
    if not rows:
        return None
    design, y = np.array(rows), np.array(y)
    # one SVD gives the rank, a least-squares solution, (XᵀX)⁺ and the projection X⁺X
    u, sv, vt = np.linalg.svd(design, full_matrices=False)
    rank = int(np.sum(sv > sv.max() * max(design.shape) * np.finfo(float).eps))
    df = len(y) - rank
    if df <= 0:
        return None
    u, sv, vt = u[:, :rank], sv[:rank], vt[:rank]
    coef = vt.T @ ((u.T @ y) / sv)
    rss = float(np.sum((y - design @ coef) ** 2))
    where = {i: a for a, i in enumerate(fitted)}
    return BlockedFit(above_rounding(math.sqrt(rss / df), y.tolist()), df, len(y), tuple(scores),
                      tuple(where.get(i) for i in range(len(scores))), coef, (vt.T / sv ** 2) @ vt, vt.T @ vt)
