"""Rank the completed trials of a study, and say whether the top one is a winner or a tie.

One rule serves the ranking printed after ``geosearch search``, the exported provenance
and ``report.md``: :func:`rank_scores` builds the :class:`Ranking` and its one-line
verdict, and every caller shows that verdict. Trials are ranked by their mean final
validation loss over seeds; each is compared with the best by a paired t-test on the seeds
both ran (every assignment runs the same seeds), else a Welch t-test, at 5% two-sided with
exact fractional-df quantiles (:mod:`geosearch.search.stats.scores`). A trial with one seed has no
spread: its comparison is ``"unknown"`` and the verdict says the gap cannot be judged
rather than naming a winner that seed noise could explain. The verdict also names the
module types whose geometry has a main effect beyond noise (e.g. "attention's geometry:
stiefel better than dgram by 0.0800 ± 0.0200 (95% CI, 2 seeds × 2 pairs)"), and the
smallest gap the study could have detected (80% power). Which assignments get another
seed is planned from the ranking (:mod:`geosearch.search.stats.seeding`); a point's adaptive
seeds are trials of their own
(``seed_of``), merged into its :class:`Score` here (:func:`point_scores`), and baselines
(``baseline``) are never ranked.

Example:
    >>> ranking = rank_scores([(0, "attn=stiefel", Score((3.00, 3.02, 2.98))),
    ...                        (1, "attn=dgram", Score((3.50, 3.52, 3.48)))])
    >>> [row.versus_best for row in ranking.rows]
    ['best', 'separated']
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from geosearch.search.records import (
    ASSIGNMENT,
    BASELINE,
    COMPLETED,
    FAIL_REASON,
    INTERRUPTED,
    MAX_LOGIT,
    MEAN_STEP_MS,
    NOT_RUN,
    PRUNE_REASON,
    QUEUED_PARAMS,
    RETRIED,
    SEED_OF,
    SEEDS,
    STOP_STEP,
    PRUNED,
    UNSTABLE,
    VAL_LOSSES,
    is_extra,
    trial_status,
)

from geosearch.search.stats.seeding import max_seeds, study_seed_plan
from geosearch.search.stats.scores import (
    Comparison,
    MainEffect,
    Noise,
    Point,
    Score,
    compare,
    detectable_gap,
    main_effects,
    seed_noise,
)

__all__ = [
    "RankedTrial",
    "Ranking",
    "Sensitivity",
    "compare_scores",
    "family_geometry",
    "format_params",
    "point_scores",
    "rank_scores",
    "rank_study",
    "trial_factors",
    "trial_label",
    "trial_line",
    "trial_score",
]

_FAMILIES = ("attn", "mlp")
_TESTS = {"paired": "paired t-test on the seeds both ran, 5%", "welch": "Welch t-test, 5%",
          "none": "equal means, no spread to test"}


def compare_scores(best: Score, other: Score) -> tuple[str, float | None]:
    """Can ``other`` be told apart from ``best`` (a t-test at 5%, two-sided)?

    Paired on the seeds both ran when they share two or more, else Welch (see
    :func:`geosearch.search.stats.scores.compare`, which gives the test, df and gap too).

    Returns:
        ``(verdict, threshold)``: ``"tie"`` when the gap is below the threshold
        t₀.₉₇₅(df)·se, ``"separated"`` above it, ``"unknown"`` when there is no spread to
        judge by (threshold ``None``).
    """
    c = compare(best, other)
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
        gap: the gap to the best that its test judged: the mean per-seed difference on the
            seeds both ran when paired, else its mean minus the best mean (0 for the best).
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
        test: ``"paired"`` or ``"welch"``.
        noise: the pooled noise of one run it is computed from.
    """

    gap: float
    seeds: int
    test: str
    noise: Noise

    def text(self) -> str:
        """``"gaps below 0.0312 could not be reliably detected with 2 seeds (80% power, ...)"``."""
        return (f"gaps below {self.gap:.4f} could not be reliably detected with {self.seeds} "
                f"seeds (80% power, {_TESTS[self.test]}; noise sd {self.noise.sd:.4f} per run)")


@dataclass(frozen=True)
class Ranking:
    """Completed trials, best first, and the verdict in words.

    Attributes:
        rows: the completed trials, ranked.
        tied: trial numbers within noise of the best (the best included).
        verdict: one line: a winner, a tie, or why no winner can be named; then the main
            effects beyond noise and the smallest detectable gap.
        effects: every factor's main effect (:func:`geosearch.search.stats.scores.main_effects`),
            within noise or not; each has ``text()``.
        sensitivity: the smallest detectable gap (``None``: no spread to state it from).
    """

    rows: list[RankedTrial]
    tied: list[int]
    verdict: str
    effects: tuple[MainEffect, ...] = ()
    sensitivity: Sensitivity | None = None


def rank_scores(entries: Iterable[tuple[int, str, Score]],
                points: Mapping[int, Point] | None = None) -> Ranking:
    """Rank ``(trial number, label, score)`` entries by mean (see the module docstring).

    Args:
        entries: the completed trials; those without a finite value (``score.n == 0``)
            are left out.
        points: trial number -> what it searched, for the factors' main effects (none
            without it).
    """
    scored = sorted((e for e in entries if e[2].n), key=lambda e: (e[2].mean, e[0]))
    if not scored:
        return Ranking([], [], "no trial completed, so no assignment can be recommended")
    best = scored[0][2]
    rows = [RankedTrial(1, scored[0][0], scored[0][1], best, 0.0, "best", None)]
    for i, (number, label, score) in enumerate(scored[1:], start=2):
        c = compare(best, score)
        # the gap the test judged: on shared seeds when paired (a point with an extra seed has a
        # mean over more seeds than the pairs the threshold is for)
        gap = c.diff if c.test == "paired" else score.mean - best.mean
        rows.append(RankedTrial(i, number, label, score, gap, c.verdict, c.threshold, c))
    tied = [r.number for r in rows if r.versus_best in ("best", "tie")]
    effects = tuple(main_effects((points[n], s) for n, _, s in scored if n in points)) if points else ()
    sensitivity = _sensitivity(rows)
    return Ranking(rows, tied, _verdict(rows, effects, sensitivity), effects, sensitivity)


def rank_study(study: optuna.Study) -> Ranking:
    """Rank the completed points of ``study`` by mean final val loss, each with its adaptive
    seeds merged in (see the module docstring); with adaptive seeds on, the verdict ends
    with how many seeds each contender got and why seeding stopped (or what is pending)."""
    trials = study.get_trials(deepcopy=False)
    scores = point_scores(trials)
    done = [t for t in trials if t.number in scores]
    ranking = rank_scores([(t.number, trial_label(t), scores[t.number]) for t in done],
                          {t.number: trial_factors(t) for t in done})
    plan = study_seed_plan(study, ranking)
    if plan is None or not ranking.rows:
        return ranking
    contenders = [r for r in ranking.rows if r.versus_best in ("best", "tie", "unknown")]
    seeds = ", ".join(f"trial {r.number}: {r.score.n}" for r in contenders)
    state = "stopped" if plan.stop else "not finished"
    note = (f"adaptive seeds (up to {max_seeds(study)} per assignment) {state}: {plan.reason}; "
            f"seeds per contender: {seeds}")
    return dataclasses.replace(ranking, verdict=f"{ranking.verdict}; {note}")


def point_scores(trials: Iterable[FrozenTrial]) -> dict[int, Score]:
    """Trial number -> :class:`Score` of each completed point of the space: its own seeds
    with those of its completed adaptive-seed trials (``seed_of``) added, each seed once, so
    that pairing by seed across assignments holds. Baselines and seed trials get no entry."""
    trials = list(trials)
    scores = {t.number: trial_score(t) for t in trials
              if t.state == TrialState.COMPLETE and not is_extra(t)}
    for t in sorted(trials, key=lambda t: t.number):
        n = t.user_attrs.get(SEED_OF)
        if t.state == TrialState.COMPLETE and n in scores:
            scores[n] = _merged(scores[n], trial_score(t))
    return scores


def _merged(a: Score, b: Score) -> Score:
    """``a`` with the values of ``b`` whose seeds it lacks (all of them, unpaired, when
    either records no seeds)."""
    if a.seeds is None or b.seeds is None:
        return Score(a.values + b.values)
    new = [(v, s) for v, s in zip(b.values, b.seeds) if s not in a.seeds]
    return Score(a.values + tuple(v for v, _ in new), a.seeds + tuple(s for _, s in new))


def _sensitivity(rows: list[RankedTrial]) -> Sensitivity | None:
    """The detectable gap of the best-vs-runner-up test at the pooled noise of all trials."""
    c = rows[1].comparison if len(rows) > 1 else None
    if c is None or c.n < 2:
        return None
    paired = c.test == "paired"
    noise = seed_noise([r.score if paired else Score(r.score.values) for r in rows])
    if noise is None or noise.sd == 0:
        return None
    # a difference of two means over n seeds: se = sd·√(2/n), paired (sd of a difference
    # sd·√2 over √n, df n-1) or not (df 2n-2 with equal spreads)
    se = noise.sd * math.sqrt(2 / c.n)
    gap = detectable_gap(se, c.n - 1 if paired else 2 * c.n - 2)
    return Sensitivity(gap, c.n, "paired" if paired else "welch", noise)


def _verdict(rows: list[RankedTrial], effects: tuple[MainEffect, ...], sensitivity: Sensitivity | None) -> str:
    top = rows[0]
    name = f"{top.label} (trial {top.number}, val loss {top.score.text()})"
    if len(rows) == 1:
        return f"only one assignment completed: {name}; there is nothing to compare it with"
    ties = [r for r in rows[1:] if r.versus_best == "tie"]
    unknown = [r for r in rows[1:] if r.versus_best == "unknown"]
    if ties:
        others = ", ".join(f"{r.label} (trial {r.number})" for r in ties)
        tests = " / ".join(dict.fromkeys(_TESTS[r.comparison.test] for r in ties))
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
            how = f"beyond the noise threshold {second.threshold:.4f} ({_TESTS[second.comparison.test]})"
        elif second.comparison.test == "paired":
            how = "by the same amount in every seed, so there is no noise to explain it"
        else:
            how = "and every seed of both agrees exactly, so there is no noise to explain it"
        base = (f"winner: {name}; the runner-up {second.label} (trial {second.number}) is "
                f"{second.gap:.4f} higher, {how}")
    extras = [e.text() for e in effects if e.decisive]
    if sensitivity is not None:
        extras.append(sensitivity.text())
    return "; ".join([base, *extras])


# =========================================================================== trials
def trial_score(trial: FrozenTrial) -> Score:
    """The final val losses of a trial with their seeds: its ``val_losses`` and ``seeds``
    attrs, else the value of a completed trial, else none (``n == 0``)."""
    values = trial.user_attrs.get(VAL_LOSSES)
    seeds = trial.user_attrs.get(SEEDS)
    seeds = seeds if isinstance(seeds, list) else None
    if isinstance(values, list) and values:
        return Score.of(values, seeds)
    # a pruned trial's value is its last intermediate value, not a final loss
    done = trial.state == TrialState.COMPLETE and trial.value is not None
    return Score.of([trial.value] if done else [], seeds if done else None)


def trial_factors(trial: FrozenTrial) -> Point:
    """What a trial searched, for main effects: the ``geometry.*`` params as factors (else
    each family's geometry from the ``assignment`` attr), the other params as the rest."""
    geometry, others = _searched(trial)
    if not geometry:
        assignment = trial.user_attrs.get(ASSIGNMENT)
        assignment = assignment if isinstance(assignment, dict) else {}
        geometry = {fam: family_geometry(assignment, fam) for fam in _FAMILIES}
        geometry = {k: g for k, g in geometry.items() if g != "?"}
        geometry |= {t: str(g) for t, g in assignment.items() if not any(_in_family(t, f) for f in _FAMILIES)}
    return Point(geometry, tuple(others.items()))


def format_params(params: Mapping[str, Any]) -> str:
    """``"spectral_lr=0.012, lr=0.0006"``: floats to 3 significant digits."""
    return ", ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in params.items())


def family_geometry(assignment: Mapping[str, str], family: str) -> str:
    """The geometry of a module family ("attn", "mlp") in an assignment (module type or
    shorthand -> geometry); ``"mixed: q=stiefel,k=dgram"`` when its types differ, ``"?"``
    when it has none."""
    found = {t: g for t, g in sorted(assignment.items()) if _in_family(t, family)}
    if not found:
        return "?"
    if len(set(found.values())) == 1:
        return next(iter(found.values()))
    return "mixed: " + ",".join(f"{t[len(family) + 1:] or t}={g}" for t, g in found.items())


def _in_family(module_type: str, family: str) -> bool:
    """Whether a module type (or shorthand) belongs to a family ("attn" holds "attn_qkv")."""
    return module_type == family or module_type.startswith(family + "_")


def _searched(trial: FrozenTrial) -> tuple[dict[str, str], dict[str, Any]]:
    """The ``geometry.*`` params (prefix dropped) and the other params, sorted by name, of a
    trial (else of its queued params)."""
    params = trial.params or trial.user_attrs.get(QUEUED_PARAMS) or {}
    geometry = {k[len("geometry."):]: str(v) for k, v in sorted(params.items()) if k.startswith("geometry.")}
    return geometry, {k: v for k, v in sorted(params.items()) if not k.startswith("geometry.")}


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
    if BASELINE in trial.user_attrs:
        return f"baseline {trial.user_attrs[BASELINE]}"
    geometry, others = _searched(trial)
    if geometry:
        parts = [f"{k}={v}" for k, v in geometry.items()]
    else:
        assignment = trial.user_attrs.get(ASSIGNMENT)
        parts = _assignment_label(assignment) if isinstance(assignment, dict) else []
    if hyperparams and others:
        parts.append(format_params(others))
    return ", ".join(parts) or "(no point)"


def trial_line(trial: FrozenTrial) -> str:
    """One line per finished trial: point, outcome (and why), val loss, max logit, speed."""
    ua = trial.user_attrs
    status = trial_status(trial)
    head = f"trial {trial.number:>3}  {trial_label(trial)}"
    if SEED_OF in ua:
        head += f" (seed {', '.join(map(str, ua.get(SEEDS) or []))} of trial {ua[SEED_OF]})"
    if status == COMPLETED:
        what = f"completed  val {trial_score(trial).text()}"
    elif status in (UNSTABLE, PRUNED):
        step = ua.get(STOP_STEP)
        kind = "" if status == UNSTABLE else " (loss pruner, not unstable)"
        what = f"PRUNED{kind}{f' at step {step}' if step is not None else ''}: {ua.get(PRUNE_REASON)}"
    elif status in NOT_RUN:
        return f"{head}  not run: {ua.get(FAIL_REASON)}"
    elif status in (INTERRUPTED, RETRIED):
        what = ua.get(FAIL_REASON) or INTERRUPTED  # the stored reasons start with the word
    else:
        what = f"FAILED: {ua.get(FAIL_REASON) or 'no message'}"
    extra = []
    if isinstance(ua.get(MAX_LOGIT), (int, float)):
        extra.append(f"max logit {ua[MAX_LOGIT]:.3g}")
    if isinstance(ua.get(MEAN_STEP_MS), (int, float)) and math.isfinite(ua[MEAN_STEP_MS]):
        extra.append(f"{ua[MEAN_STEP_MS]:.1f} ms/step")
    return "  ".join([head, what, *extra])
