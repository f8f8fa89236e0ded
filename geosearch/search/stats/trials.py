"""Read a study's trials: a trial's final val losses as a :class:`Score` (its adaptive-seed
trials merged in, :func:`point_scores`), what it searched as a :class:`Point` (for main
effects), and its point and outcome in words (:func:`trial_label`, :func:`trial_line`).

The statistics (:mod:`geosearch.search.stats.scores`) know nothing of Optuna; the ranking
(:mod:`geosearch.search.stats.ranking`) ranks what this module reads. A point's adaptive seeds
are trials of their own (``seed_of``), merged into its score here; baselines (``baseline``)
get no score and are labelled by their name.

Example:
    >>> family_geometry({"attn_qkv": "stiefel", "attn_out": "stiefel", "mlp_in": "dgram"}, "attn")
    'stiefel'
    >>> format_params({"spectral_lr": 0.01234, "warmup": 50})
    'spectral_lr=0.0123, warmup=50'
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from optuna.trial import FrozenTrial, TrialState

from geosearch.optim import settings as catalog

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
    STEP_FACTOR,
    STOP_STEP,
    PRUNED,
    UNSTABLE,
    VAL_LOSSES,
    is_extra,
    trial_status,
)
from geosearch.search.stats.scores import Point, Score

__all__ = [
    "StepCost",
    "family_geometry",
    "format_params",
    "proxy_settings",
    "point_scores",
    "step_cost",
    "study_step_cost",
    "step_text",
    "step_words",
    "trial_factors",
    "trial_label",
    "trial_line",
    "trial_score",
]

_FAMILIES = ("attn", "mlp")


# =========================================================================== scores
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


def point_scores(trials: Iterable[FrozenTrial], *, baselines: bool = False) -> dict[int, Score]:
    """Trial number -> :class:`Score` of each completed point of the space: its own seeds
    with those of its completed adaptive-seed trials (``seed_of``) added, each seed once, so
    that pairing by seed across assignments holds. Seed trials get no entry, nor baselines
    unless ``baselines`` (each with its step halving's seed trial merged in the same way)."""
    trials = list(trials)
    scores = {t.number: trial_score(t) for t in trials
              if t.state == TrialState.COMPLETE and SEED_OF not in t.user_attrs
              and (not is_extra(t) or (baselines and BASELINE in t.user_attrs))}
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


# =========================================================================== points and lines
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


def proxy_settings(proxy: Mapping[str, Any]) -> dict[str, Any]:
    """The global optimizer settings of a study's ``proxy`` record, the catalog's defaults
    for those it lacks."""
    values = catalog.defaults("global")
    values.update({k: v for k, v in proxy.items() if k in values})
    values.update({k: v for k, v in (proxy.get("optimizer_args") or {}).items() if k in values})
    return values


def step_text(factor: float, proxy: Mapping[str, Any], *, adamw: bool = False,
              spectral_lr: float | None = None) -> str:
    """A step grid's ``factor`` times the proxy's step, in words: ``"lr 0.0012"`` for a run
    whose every assigned type is AdamW (it takes no spectral step), else ``"spectral step
    0.04"`` (``spectral_lr``: the rung's peak spectral step, default the proxy's).

    Example:
        >>> step_text(2, {"lr": 0.0006}, adamw=True)
        'lr 0.0012'
    """
    values = proxy_settings(proxy)
    if adamw:
        return f"lr {values['lr'] * factor:.3g}"
    return f"spectral step {(values['spectral_lr'] if spectral_lr is None else spectral_lr) * factor:.3g}"


def step_words(trial: FrozenTrial, proxy: Mapping[str, Any] | None = None) -> str | None:
    """The step a trial of a step grid trained at, in words, from its factor (the
    ``step_factor`` param of a point, attr of a baseline) and the study's ``proxy`` record:
    ``"spectral step 0.04"`` (a point, a Muon baseline), ``"lr 0.0012"`` (a run whose every
    type is AdamW: the AdamW baseline), ``"spectral step x2"`` without the record; ``None``
    without a factor."""
    factor = trial.params.get(STEP_FACTOR, trial.user_attrs.get(STEP_FACTOR))
    if not isinstance(factor, (int, float)):
        return None
    if not isinstance(proxy, Mapping):
        return f"spectral step x{factor:g}"
    assignment = trial.user_attrs.get(ASSIGNMENT)
    adamw = isinstance(assignment, Mapping) and bool(assignment) and set(assignment.values()) == {"adamw"}
    return step_text(float(factor), proxy, adamw=adamw)


def trial_label(trial: FrozenTrial, *, hyperparams: bool = True, proxy: Mapping[str, Any] | None = None) -> str:
    """The searched point in words: ``"attn=stiefel, mlp=dgram, spectral_lr=0.012"``.

    The geometries come from the ``geometry.*`` params (else the queued params, else the
    ``assignment`` attr); ``hyperparams=False`` leaves the other params out. A step grid's
    factor is given as the step (:func:`step_words`, from the study's ``proxy`` record).
    """
    step = step_words(trial, proxy) if hyperparams else None
    if BASELINE in trial.user_attrs:
        return f"baseline {trial.user_attrs[BASELINE]}" + (f" at {step}" if step else "")
    geometry, others = _searched(trial)
    if geometry:
        parts = [f"{k}={v}" for k, v in geometry.items()]
    else:
        assignment = trial.user_attrs.get(ASSIGNMENT)
        parts = _assignment_label(assignment) if isinstance(assignment, dict) else []
    others.pop(STEP_FACTOR, None)
    if hyperparams and others:
        parts.append(format_params(others))
    if step:
        parts.append(step)
    return ", ".join(parts) or "(no point)"


def trial_line(trial: FrozenTrial, proxy: Mapping[str, Any] | None = None) -> str:
    """One line per finished trial: point, outcome (and why), val loss, max logit, speed; a
    step grid's factor as the step (``proxy``: the study's record, :func:`step_words`)."""
    ua = trial.user_attrs
    status = trial_status(trial)
    head = f"trial {trial.number:>3}  {trial_label(trial, proxy=proxy)}"
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


# --------------------------------------------------------------------------- cost
COST_BASELINES = (("adamw", "AdamW (all-adamw)"), ("euclidean", "Muon (all-euclidean)"))
"""The cost baseline, first found first: the mean ms/step of the all-``adamw`` runs, else of
the all-``euclidean`` (Muon) ones."""


@dataclass(frozen=True)
class StepCost:
    """Every ms/step ratio the search states, against one baseline.

    Attributes:
        baseline: what the ratios are to, in words (``"AdamW (all-adamw)"``).
        name: its short name (``"AdamW"``, ``"Muon"``, or ``"trial N"`` for the fastest).
        trials: the trials averaged into it.
        ms: its mean ms/step (``None``: no trial recorded a step time).
        ratios: trial number -> its ms/step over ``ms``.
    """

    baseline: str
    name: str
    trials: tuple[int, ...]
    ms: float | None
    ratios: dict[int, float]


def step_cost(entries: Iterable[tuple[int, str | None, str, float | None]]) -> StepCost:
    """The ms/step ratio of each ``(trial number, its one geometry or None, label, ms/step)``
    to the cost baseline (:data:`COST_BASELINES`; without either, the fastest trial, and
    ``baseline`` says so). The one place the search's ms/step ratios are computed."""
    timed = [(n, g, label, ms) for n, g, label, ms in entries
             if ms is not None and math.isfinite(ms) and ms > 0]
    if not timed:
        return StepCost("no trial recorded its step time", "none", (), None, {})
    for geometry, words in COST_BASELINES:
        base = [e for e in timed if e[1] == geometry]
        if base:
            name = words.split(" ")[0]
            break
    else:
        fastest = min(timed, key=lambda e: (e[3], e[0]))
        base, name = [fastest], f"trial {fastest[0]}"
        words = (f"the fastest trial ({fastest[2]}, trial {fastest[0]}): the study has no "
                 "all-adamw or all-euclidean baseline")
    ms = sum(e[3] for e in base) / len(base)
    return StepCost(words, name, tuple(e[0] for e in base), ms, {n: t / ms for n, _, _, t in timed})


def trial_geometry(trial: FrozenTrial) -> str | None:
    """The one geometry of every module type of ``trial`` (``None``: several)."""
    geos = set((trial.user_attrs.get(ASSIGNMENT) or {}).values())
    return next(iter(geos)) if len(geos) == 1 else None


def study_step_cost(trials: Iterable[FrozenTrial]) -> StepCost:
    """:func:`step_cost` of a study's completed and unstable trials (not adaptive-seed trials),
    as the report's cost table reads them."""
    return step_cost((t.number, trial_geometry(t), trial_label(t),
                      _finite(t.user_attrs.get(MEAN_STEP_MS)))
                     for t in trials
                     if trial_status(t) in (COMPLETED, UNSTABLE) and SEED_OF not in t.user_attrs)


def _finite(x: Any) -> float | None:
    return float(x) if isinstance(x, (int, float)) and math.isfinite(x) else None
