"""The baselines' trials and their table: the optimizers people use today, trained beside
the assignments, never exported.

A space's ``baselines:`` names them (:data:`BASELINES`). ``adamw`` gives every module type the
space assigns the geometry ``adamw`` (plain AdamW at the proxy's ``lr``), ``muon`` gives them
``euclidean`` (unconstrained Muon at the proxy's ``spectral_lr``) and ``muon_qkclip`` the
same with Kimi K2's QK-clip (the proxy's ``qk_clip`` at τ = 100). Each is a trial of its own
with the ``baseline`` attr, queued once the space's points are done (:func:`queue_baselines`),
trained with the study's seeds at every rung of the Σ η ladder (a Muon step moves σ by at
most η too, so Σ η means the same) or, for AdamW, which takes no spectral step, at rung 0
only. With a step grid each baseline is tuned as the assignments are: one trial per factor
(attr ``step_factor``), AdamW at ``lr`` × the factor, Muon at ``spectral_lr`` × the factor.
:func:`baseline_table` compares each ranked assignment with each baseline at the baseline's
top rung: Δ loss (negative: the assignment is better) with the 95% interval of the paired
test on shared seeds, and the ms/step ratio; and it says how each baseline trained (its
step, and Muon's shape convention and msign). With a step grid it compares each assignment
at its own best step with each baseline at the baseline's own best step (its lowest mean
val loss over the factors), and the points at the shared step with the baselines at factor
1 (:attr:`BaselineTable.shared`). Torch-free.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import optuna
from optuna.trial import FrozenTrial

from geosearch.util.checks import finite_or_none
from geosearch.search.study.queue import enqueue
from geosearch.search.stats.ranking import RankedTrial, Ranking
from geosearch.search.stats.study_ranking import rank_study
from geosearch.search.stats.scores import Score, best_on_shared_seeds
from geosearch.search.stats.trials import point_scores, study_step_cost, trial_score
from geosearch.search.records import (
    BASELINE,
    COMPLETED,
    FINISHED,
    LADDER,
    MEAN_STEP_MS,
    PROXY,
    PRUNE_REASON,
    FAIL_REASON,
    RUNG_INDICES,
    RUNG_LOSSES,
    RUNNING,
    SEED_OF,
    SEEDS,
    STEP_FACTOR,
    WAITING,
    trial_status,
)
from geosearch.search.stats.scores import compare
from geosearch.search.space.baseline_specs import (
    BASELINES,
    baseline_factors,
    baseline_step,
    training_text,
)
from geosearch.search.space.spec import SearchSpace, Suggestion


__all__ = ["BaselineRow", "BaselineTable", "baseline_suggestion", "baseline_table", "baselines_lines",
           "queue_baselines", "rung_score"]

def baseline_suggestion(space: SearchSpace, name: str, factor: float | None = None) -> Suggestion:
    """The run of baseline ``name``: every key of the space's ``geometries`` gets the
    baseline's geometry, the proxy's settings otherwise (not a point of the space); at a
    step grid's ``factor``, AdamW's ``lr`` (it takes no spectral step) or Muon's
    ``spectral_lr`` times it."""
    spec = BASELINES[name]
    overrides: dict[str, float] = dict(spec.train_overrides)
    if factor is None:
        return Suggestion({k: spec.geometry for k in space.geometries}, {}, overrides, space.rules)
    if spec.geometry == "adamw":
        overrides["lr"] = space.proxy.lr * factor
        factor = 1.0  # its spectral step, for the target's Σ η: unchanged
    else:
        overrides["spectral_lr"] = space.proxy.spectral_lr * factor
    return Suggestion({k: spec.geometry for k in space.geometries}, {}, overrides, space.rules, factor)


def queue_baselines(study: optuna.Study, space: SearchSpace) -> list[str]:
    """Queue each baseline of ``space`` (with a step grid: at each factor, attr
    ``step_factor``) that no trial has run, is running or waits for (keyed by name and
    factor, so calling it again queues nothing twice).

    Returns:
        The names queued (``"muon at x2"`` for a factor of a step grid).
    """
    have = {(t.user_attrs.get(BASELINE), t.user_attrs.get(STEP_FACTOR))
            for t in study.get_trials(deepcopy=False) if trial_status(t) in (*FINISHED, RUNNING, WAITING)}
    queued = []
    for name in space.baselines:
        factors = baseline_factors(space.hyperparams.step_grid)
        if space.hyperparams.step_grid and space.hyperparams.step_halving:
            factors = tuple(sorted(factors, reverse=True))  # as the points: the largest step first
        for factor in factors:
            if (name, factor) in have:
                continue
            marks = {BASELINE: name} if factor is None else {BASELINE: name, STEP_FACTOR: factor}
            enqueue(study, {}, marks=marks)
            queued.append(name if factor is None else f"{name} at x{factor:g}")
    return queued


# --------------------------------------------------------------------------- reading
def rung_score(trial: FrozenTrial, rung: int) -> Score | None:
    """A trial's final val losses at ladder rung ``rung`` with their seeds (``rung_losses``,
    ``rung_indices``, ``seeds``), ``None`` when it did not train that rung."""
    losses, seeds = trial.user_attrs.get(RUNG_LOSSES), trial.user_attrs.get(SEEDS)
    if not isinstance(losses, list):
        return None
    indices = trial.user_attrs.get(RUNG_INDICES) or list(range(len(losses)))
    if rung not in indices or not isinstance(losses[indices.index(rung)], list):
        return None
    values = losses[indices.index(rung)]
    seeds = seeds[:len(values)] if isinstance(seeds, list) else None
    return Score.of(values, seeds)


@dataclass(frozen=True)
class BaselineRow:
    """One assignment against one baseline at the baseline's top rung.

    Attributes:
        number, label: the ranked assignment.
        delta: its mean loss minus the baseline's (paired: the mean per-seed difference);
            negative = the assignment is better.
        interval: half-width of the 95% interval of ``delta`` (``None``: no spread).
        test: ``"paired"``, ``"welch"`` or ``"none"``.
        step_ratio: its ms/step over the cost baseline's, the one all ratios are to
            (:func:`geosearch.search.stats.trials.step_cost`; ``None``: not recorded).
    """

    number: int
    label: str
    delta: float
    interval: float | None
    test: str
    step_ratio: float | None

    def text(self) -> str:
        """``"-0.0312 ± 0.0100 (paired), better"``."""
        if self.interval is None:
            return f"{self.delta:+.4f} (no spread)"
        word = ("better" if self.delta < -self.interval else
                "worse" if self.delta > self.interval else "within noise")
        return f"{self.delta:+.4f} ± {self.interval:.4f} ({self.test}), {word}"


@dataclass(frozen=True)
class BaselineTable:
    """Per baseline: its outcome, the rung it is compared at, and one row per assignment.

    Attributes:
        baselines: name -> ``{"trial", "status", "rung", "sum_eta", "score", "step_ms",
            "reason", "trained", "factor", "step", "tried"}`` (the latest trial of that
            baseline; with a step grid, the one at its own best step; ``trained``: how it
            trained, :func:`~geosearch.search.space.baseline_specs.training_text`, and ``step``
            its step in words, ``"spectral step 0.04"``, both ``None`` without the study's
            proxy record; ``factor``: its step grid's factor, ``None`` without a grid;
            ``tried``: with a grid, ``(factor, step in words, status, score or None)`` at
            each factor, ascending).
        rows: name -> the :class:`BaselineRow` of each ranked assignment (best first);
            empty when the baseline did not complete.
        shared: with a step grid, the points at the shared step against each baseline at
            factor 1 (this table: each assignment at its own best step against each
            baseline at its own); ``None`` without one.
        cost_to: the cost baseline the ``step_ratio`` of every row is to (``"AdamW"``).
    """

    baselines: dict[str, dict[str, Any]]
    rows: dict[str, list[BaselineRow]]
    shared: BaselineTable | None = None
    cost_to: str | None = None


def baseline_table(study: optuna.Study, ranking: Ranking | None = None) -> BaselineTable:
    """Compare every ranked assignment of ``study`` with each baseline it trained; with a
    step grid, each assignment at its own best step with each baseline at its own, and the
    points at the shared step with the baselines at factor 1 (``shared``)."""
    ranking = ranking or rank_study(study)
    trials = {t.number: t for t in study.get_trials(deepcopy=False)}
    scores = point_scores(trials.values(), baselines=True)  # with step halving's seed trials merged
    latest: dict[str, dict[float | None, FrozenTrial]] = {}
    for t in sorted(trials.values(), key=lambda t: t.number):
        if BASELINE in t.user_attrs and SEED_OF not in t.user_attrs and trial_status(t) in FINISHED:
            factor = t.user_attrs.get(STEP_FACTOR)
            latest.setdefault(t.user_attrs[BASELINE], {})[None if factor is None else float(factor)] = t
    if not any(f is not None for runs in latest.values() for f in runs):  # no step grid
        return _against(study, trials, {name: runs[None] for name, runs in latest.items()}, ranking.rows,
                        scores)
    own: dict[str, FrozenTrial] = {}
    for name, runs in latest.items():  # its best step on the seeds all its steps ran, as the points'
        best = best_on_shared_seeds((t.number, scores[t.number]) for t in runs.values() if t.number in scores)
        own[name] = (trials[best] if best is not None
                     else runs.get(1.0, runs[max(runs, key=lambda f: runs[f].number)]))
    table = _against(study, trials, own, ranking.rows, scores)
    for name, b in table.baselines.items():
        b["tried"] = [(f, _step_words(study, name, t) or (f"x{f:g}" if f is not None else "the proxy's step"),
                       trial_status(t), scores.get(t.number) if trial_status(t) == COMPLETED else None)
                      for f, t in sorted(latest[name].items(), key=lambda kv: (kv[0] is not None, kv[0] or 0))]
    shared_rows = ranking.steps.shared.rows if ranking.steps is not None else []
    shared = _against(study, trials, {n: runs[1.0] for n, runs in latest.items() if 1.0 in runs}, shared_rows,
                      scores)
    return BaselineTable(table.baselines, table.rows, shared, table.cost_to)


def _step_words(study: optuna.Study, name: str, trial: FrozenTrial, spectral_lr: float | None = None) -> str | None:
    """Baseline ``trial``'s step in words (``None`` without the study's proxy record)."""
    proxy = study.user_attrs.get(PROXY)
    if not isinstance(proxy, dict) or name not in BASELINES:
        return None
    return baseline_step(name, proxy, spectral_lr, trial.user_attrs.get(STEP_FACTOR))


def _against(study: optuna.Study, trials: dict[int, FrozenTrial], chosen: dict[str, FrozenTrial],
             ranked: list[RankedTrial], scores: dict[int, Score]) -> BaselineTable:
    """Each of the ``ranked`` trials against each ``chosen`` baseline trial (its score in
    ``scores``, seed trials merged), at the baseline's top rung."""
    ladder = study.user_attrs.get(LADDER)
    top = len(ladder) - 1 if isinstance(ladder, list) and ladder else 0
    proxy = study.user_attrs.get(PROXY)
    info: dict[str, dict[str, Any]] = {}
    rows: dict[str, list[BaselineRow]] = {}
    cost = study_step_cost(trials.values())  # every ratio against the one cost baseline
    for name, b in chosen.items():
        indices = b.user_attrs.get(RUNG_INDICES) or list(range(len(b.user_attrs.get(RUNG_LOSSES) or [1])))
        rung = indices[-1]
        status = trial_status(b)
        score = scores.get(b.number, trial_score(b)) if status == COMPLETED else None
        step_ms = finite_or_none(b.user_attrs.get(MEAN_STEP_MS))
        entry = ladder[rung] if isinstance(ladder, list) and rung < len(ladder) else {}
        sum_eta = entry.get("sum_eta")
        factor = b.user_attrs.get(STEP_FACTOR)
        trained = training_text(name, proxy, entry.get("spectral_lr"), factor) \
            if isinstance(proxy, dict) and name in BASELINES else None
        info[name] = {"trial": b.number, "status": status, "rung": rung, "sum_eta": sum_eta,
                      "score": score, "step_ms": step_ms,
                      "reason": b.user_attrs.get(PRUNE_REASON) or b.user_attrs.get(FAIL_REASON),
                      "trained": trained, "factor": factor,
                      "step": _step_words(study, name, b, entry.get("spectral_lr")), "tried": []}
        rows[name] = []
        if score is None or not score.n:
            continue
        for r in ranked:
            mine = r.score if rung == top else rung_score(trials[r.number], rung)
            if mine is None or not mine.n:
                continue
            c = compare(score, mine)
            rows[name].append(BaselineRow(r.number, r.label, c.diff, c.threshold, c.test,
                                          cost.ratios.get(r.number)))
    return BaselineTable(info, rows, cost_to=cost.name)


def baselines_lines(table: BaselineTable) -> list[str]:
    """The table as the search prints it under the ranking (nothing without baselines);
    with a step grid, the own-step comparison then the shared-step one, each line naming
    the step the baseline trained at."""
    if not table.baselines:
        return []
    if table.shared is None:
        return ["baselines (reported, never exported; Δ = assignment - baseline at the baseline's "
                "rung, negative = the assignment is better; 95% interval; ms/step ratio to "
                f"{table.cost_to}):",
                *_block_lines(table, grid=False)]
    return ["baselines (reported, never exported), tuned over the step grid as the assignments are; "
            "Δ = each assignment at its own best step - each baseline at its own best step (its "
            "lowest mean val loss over the grid), at the baseline's rung, negative = the "
            f"assignment is better; 95% interval; ms/step ratio to {table.cost_to}:",
            *_block_lines(table, grid=True),
            "  at the shared step: each point at factor 1 against each baseline at factor 1:",
            *_block_lines(table.shared, grid=True)]


def _block_lines(table: BaselineTable, *, grid: bool) -> list[str]:
    """Each baseline's line, how it trained, and its rows."""
    lines = []
    for name, b in table.baselines.items():
        where = f"rung {b['rung']}" + (f", Σ η {b['sum_eta']:.3g}" if b["sum_eta"] is not None else "")
        step = b["step"] or (f"x{b['factor']:g}" if b["factor"] is not None else "?")
        head = f"{name} at {step}" if grid else name
        tried = ", ".join(f"{s}: {sc.mean:.4f}" if sc is not None and sc.n else f"{s}: {st}"
                          for _, s, st, sc in b["tried"])
        where += f"; over the grid {tried}" if tried else ""
        trained = [f"    trained as {b['trained']}"] if b["trained"] else []
        if b["status"] != COMPLETED:
            lines += [f"  {head} (trial {b['trial']}, {where}): {b['status']}: {b['reason']}", *trained]
            continue
        ms = f", {b['step_ms']:.1f} ms/step" if b["step_ms"] is not None else ""
        lines += [f"  {head} (trial {b['trial']}, {where}): val {b['score'].text()}{ms}", *trained]
        versus = f" vs {name} at {step}" if grid else ""
        for r in table.rows[name]:
            ratio = f"  {r.step_ratio:.2f}x ms/step" if r.step_ratio is not None else ""
            lines.append(f"    {r.label} (trial {r.number}): Δ {r.text()}{versus}{ratio}")
    return lines
