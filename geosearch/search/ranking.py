"""Rank the completed trials of a study, and say whether the top one is a winner or a tie.

One rule serves the ranking printed after ``geosearch search``, the exported provenance
and ``report.md``, so they always give the same verdict on the same study.

The rule: trials are ranked by their mean final validation loss over seeds. Two means are
*within noise* (a tie) when |Δmean| < t·√(se₁² + se₂²), t being the two-sided 95%
Student-t quantile at the Welch–Satterthwaite degrees of freedom: a Welch t-test at 5%,
without scipy (t ≈ 2 with many seeds, as in the usual "two standard errors" rule, but
2.8-4.3 with 2-3 seeds each, where the spread itself is uncertain). A trial with one seed
has no spread: its comparison is ``"unknown"``, and the verdict says that the gap cannot
be judged rather than naming a winner that seed noise could explain.

Example:
    >>> ranking = rank_scores([(0, "attn=stiefel", Score((3.00, 3.02, 2.98))),
    ...                        (1, "attn=dgram", Score((3.50, 3.52, 3.48)))])
    >>> [row.versus_best for row in ranking.rows]
    ['best', 'separated']
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

__all__ = [
    "RankedTrial",
    "Ranking",
    "Score",
    "compare_scores",
    "family_geometry",
    "format_params",
    "rank_scores",
    "rank_study",
    "trial_label",
    "trial_score",
]

# Two-sided 95% Student-t quantiles (df -> t); a df between two entries uses the lower
# entry (a larger t: conservative). Infinity -> the normal quantile.
_T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306,
         9: 2.262, 10: 2.228, 12: 2.179, 15: 2.131, 20: 2.086, 30: 2.042, 60: 2.000,
         120: 1.980}
_FAMILIES = ("attn", "mlp")


# =========================================================================== statistics
@dataclass(frozen=True)
class Score:
    """Final validation losses of one trial over its seeds.

    Example:
        >>> s = Score((3.0, 3.2))
        >>> round(s.mean, 3), round(s.std, 4), s.n
        (3.1, 0.1414, 2)
    """

    values: tuple[float, ...]

    @classmethod
    def of(cls, values: Iterable[Any]) -> Score:
        """The finite values among ``values`` (``None``, NaN and inf are dropped)."""
        xs = []
        for v in values:
            try:
                x = float(v)
            except (TypeError, ValueError):
                continue
            if math.isfinite(x):
                xs.append(x)
        return cls(tuple(xs))

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

    def text(self) -> str:
        """``"3.3100 ± 0.0100 (n=3)"``; the mean alone with one seed, ``"—"`` with none."""
        if self.n == 0:
            return "—"
        if self.std is None:
            return f"{self.mean:.4f}"
        return f"{self.mean:.4f} ± {self.std:.4f} (n={self.n})"


def _t_quantile(df: float) -> float:
    if not math.isfinite(df):
        return 1.96
    best = _T975[1]
    for k, t in _T975.items():
        if k <= df + 1e-9:  # Welch's df of equal spreads is an integer up to rounding
            best = t
    return best if df < 1e6 else 1.96


def compare_scores(best: Score, other: Score) -> tuple[str, float | None]:
    """Can ``other`` be told apart from ``best`` (a Welch t-test at 5%, two-sided)?

    Returns:
        ``(verdict, threshold)``: ``"tie"`` when |Δmean| is below the threshold
        t₀.₉₇₅(df)·√(se₁² + se₂²) (df by Welch–Satterthwaite), ``"separated"`` above it,
        ``"unknown"`` when either has fewer than two seeds (threshold ``None``).
    """
    diff = abs(other.mean - best.mean)
    if best.se is None or other.se is None:
        return ("tie" if diff == 0 else "unknown"), None
    v1, v2 = best.se ** 2, other.se ** 2
    if v1 + v2 == 0:
        return ("tie" if diff == 0 else "separated"), 0.0
    df = (v1 + v2) ** 2 / ((v1 ** 2 / (best.n - 1) if v1 else 0) + (v2 ** 2 / (other.n - 1) if v2 else 0))
    threshold = _t_quantile(df) * math.sqrt(v1 + v2)
    return ("tie" if diff < threshold else "separated"), threshold


# =========================================================================== ranking
@dataclass(frozen=True)
class RankedTrial:
    """One completed trial in the ranking.

    Attributes:
        rank: 1 = lowest mean val loss.
        number: Optuna trial number.
        label: the searched point, e.g. ``"attn=stiefel, mlp=dgram"``.
        score: its final val losses over seeds.
        gap: its mean minus the best mean (0 for the best).
        versus_best: ``"best"``, ``"tie"``, ``"separated"`` or ``"unknown"``.
        threshold: the noise threshold of the comparison with the best (``None``: unknown).
    """

    rank: int
    number: int
    label: str
    score: Score
    gap: float
    versus_best: str
    threshold: float | None


@dataclass(frozen=True)
class Ranking:
    """Completed trials, best first, and the verdict in words.

    Attributes:
        rows: the completed trials, ranked.
        tied: trial numbers within noise of the best (the best included).
        verdict: one sentence: a winner, a tie, or why no winner can be named.
    """

    rows: list[RankedTrial]
    tied: list[int]
    verdict: str


def rank_scores(entries: Iterable[tuple[int, str, Score]]) -> Ranking:
    """Rank ``(trial number, label, score)`` entries by mean (see the module docstring).

    Entries without a finite value (``score.n == 0``) are left out.
    """
    scored = sorted((e for e in entries if e[2].n), key=lambda e: (e[2].mean, e[0]))
    if not scored:
        return Ranking([], [], "no trial completed, so no assignment can be recommended")
    best = scored[0][2]
    rows = []
    for i, (number, label, score) in enumerate(scored):
        verdict, threshold = ("best", None) if i == 0 else compare_scores(best, score)
        rows.append(RankedTrial(i + 1, number, label, score, score.mean - best.mean, verdict, threshold))
    tied = [r.number for r in rows if r.versus_best in ("best", "tie")]
    return Ranking(rows, tied, _verdict(rows))


def rank_study(study: optuna.Study) -> Ranking:
    """Rank the completed trials of ``study`` by mean final val loss (see the module docstring)."""
    done = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    return rank_scores((t.number, trial_label(t), trial_score(t)) for t in done)


def _verdict(rows: list[RankedTrial]) -> str:
    top = rows[0]
    name = f"{top.label} (trial {top.number}, val loss {top.score.text()})"
    if len(rows) == 1:
        return f"only one assignment completed: {name}; there is nothing to compare it with"
    ties = [r for r in rows[1:] if r.versus_best == "tie"]
    if ties:
        others = ", ".join(f"{r.label} (trial {r.number})" for r in ties)
        return (f"no single winner: {name} has the lowest mean, but {others} "
                f"{'is' if len(ties) == 1 else 'are'} within noise of it (Welch t-test, 5%); "
                "rerun the tied assignments with more seeds (--repeats)")
    unknown = [r for r in rows[1:] if r.versus_best == "unknown"]
    if unknown:
        first = unknown[0]
        if all(r.score.n < 2 for r in rows):
            who = "with one seed per assignment there is no spread"
        elif top.score.n < 2:
            who = "the best assignment has one seed, so no spread"
        else:
            who = (f"{len(unknown)} of the others {'has' if len(unknown) == 1 else 'have'} one "
                   "seed, so no spread")
        return (f"lowest val loss: {name}, {first.gap:+.4f} ahead of {first.label} (trial "
                f"{first.number}); {who}, so whether that gap is more than seed noise cannot be "
                "judged (rerun with --repeats 3)")
    second = rows[1]
    if not second.threshold:
        how = "and every seed of both agrees exactly, so there is no noise to explain it"
    else:
        how = f"beyond the noise threshold {second.threshold:.4f} (Welch t-test, 5%)"
    return (f"winner: {name}; the runner-up {second.label} (trial {second.number}) is "
            f"{second.gap:.4f} higher, {how}")


# =========================================================================== trials
def trial_score(trial: FrozenTrial) -> Score:
    """The final val losses of a trial: its ``val_losses`` attr, else the value of a
    completed trial, else none (``n == 0``)."""
    values = trial.user_attrs.get("val_losses")
    if isinstance(values, list) and values:
        return Score.of(values)
    # a pruned trial's value is its last intermediate value, not a final loss
    done = trial.state == TrialState.COMPLETE and trial.value is not None
    return Score.of([trial.value] if done else [])


def format_params(params: Mapping[str, Any]) -> str:
    """``"spectral_lr=0.012, lr=0.0006"``: floats to 3 significant digits."""
    return ", ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in params.items())


def family_geometry(assignment: Mapping[str, str], family: str) -> str:
    """The geometry of a module family ("attn", "mlp") in an assignment (module type or
    shorthand -> geometry); ``"mixed: q=stiefel,k=dgram"`` when its types differ, ``"?"``
    when it has none."""
    found = {t: g for t, g in sorted(assignment.items()) if t == family or t.startswith(family + "_")}
    if not found:
        return "?"
    if len(set(found.values())) == 1:
        return next(iter(found.values()))
    return "mixed: " + ",".join(f"{t[len(family) + 1:] or t}={g}" for t, g in found.items())


def _assignment_label(assignment: Mapping[str, str]) -> list[str]:
    """``attn=stiefel, mlp=dgram`` when each family is uniform, else every module type."""
    parts = []
    for fam in _FAMILIES:
        g = family_geometry(assignment, fam)
        if g != "?" and not g.startswith("mixed"):
            parts.append(f"{fam}={g}")
        else:
            parts += [f"{t}={v}" for t, v in sorted(assignment.items()) if t.startswith(fam)]
    parts += [f"{t}={v}" for t, v in sorted(assignment.items()) if not t.startswith(_FAMILIES)]
    return parts


def trial_label(trial: FrozenTrial, *, hyperparams: bool = True) -> str:
    """The searched point in words: ``"attn=stiefel, mlp=dgram, spectral_lr=0.012"``.

    The geometries come from the ``geometry.*`` params (else the queued params, else the
    ``assignment`` attr); ``hyperparams=False`` leaves the other params out.
    """
    params = trial.params or trial.user_attrs.get("queued_params") or {}
    geometry = {k[len("geometry."):]: str(v) for k, v in sorted(params.items()) if k.startswith("geometry.")}
    others = {k: v for k, v in sorted(params.items()) if not k.startswith("geometry.")}
    if geometry:
        parts = [f"{k}={v}" for k, v in geometry.items()]
    else:
        assignment = trial.user_attrs.get("assignment")
        parts = _assignment_label(assignment) if isinstance(assignment, dict) else []
    if hyperparams and others:
        parts.append(format_params(others))
    return ", ".join(parts) or "(no point)"
