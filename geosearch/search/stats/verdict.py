"""The verdict as data: what a search concludes, built once, rendered three ways.

:class:`Verdict` holds the winner and how sure (the trials within noise of it, the seeds),
each adjacent pair's gap with its 95% interval, the stability at the target, the main
effects, the baselines' gaps to the winner, whether the order at the target is measured,
and the benchmark's track record (:func:`track_record`, read from ``track_record.json``,
which ``benchmarks/fidelity.py --track-record`` writes). :func:`verdict_of` builds it from a
:class:`~geosearch.search.stats.ranking.Ranking` and what the study layer reads beside it
(stability rows, baseline rows, the ladder's note). Renderings: :func:`verdict_lines` (the
four lines the search prints under its table), :func:`verdict_record` (the fields
``best_assignment.yaml`` stores) and the report's sections
(:mod:`geosearch.report.markdown`). The statistics are the ranking's own: nothing here
tests or ranks again.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from geosearch.search.stats.ranking import Ranking, _test_text
from geosearch.search.stats.track import ORDER_RECORD
from geosearch.search.stats.track import track_record
from geosearch.util.text import WIDTH

__all__ = [
    "BaselineGap",
    "Effect",
    "PairStep",
    "StabilityAt",
    "Verdict",
    "WIDTH",
    "clip",
    "verdict_lines",
    "verdict_of",
    "verdict_record",
]


def clip(line: str, width: int = WIDTH) -> str:
    """``line`` cut to ``width`` columns, ending in ``…`` when cut."""
    return line if len(line) <= width else line[: width - 1] + "…"


@dataclass(frozen=True)
class PairStep:
    """Two neighbours of the ranking: ``lower`` against ``upper`` (rank ``rank`` and the next)."""

    rank: int
    upper: int
    lower: int
    gap: float
    low: float | None
    high: float | None
    separated: bool | None  # None: not judged (no spread)
    record: str  # the benchmark's record for gaps that size


@dataclass(frozen=True)
class Effect:
    """A factor's main effect: ``better`` ahead of ``worse`` by ``effect`` ± ``half_width``."""

    factor: str
    better: str
    worse: str
    effect: float
    half_width: float | None
    decisive: bool
    text: str


@dataclass(frozen=True)
class StabilityAt:
    """One trial's max logit at the target: ``how`` is ``measured`` (the stability rung),
    ``forecast`` or ``none``; ``verdict`` ``below``/``above``/``may pass``; ``crossed_at``:
    the target run's step where it goes above the threshold."""

    trial: int
    label: str
    how: str
    verdict: str | None
    max_logit: float | None
    threshold: float | None
    crossed_at: int | None = None
    unstable: bool = False  # pruned as unstable at the target


@dataclass(frozen=True)
class BaselineGap:
    """The winner against one baseline: ``delta`` = winner − baseline (negative: the winner
    is better) ± ``half_width`` (95%), ``word`` better / worse / within noise; ``step_ratio``
    the winner's ms/step over the cost baseline's (``ratio_to``)."""

    name: str
    trial: int
    status: str
    mean: float | None
    delta: float | None
    half_width: float | None
    test: str | None
    word: str


@dataclass(frozen=True)
class Verdict:
    """What the search concludes (see the module docstring).

    Attributes:
        kind: ``winner``, ``tie``, ``unknown`` (no spread to judge the gap), ``single`` (one
            assignment completed) or ``none``.
        winner, trial, mean, std, seeds: the top of the ranking and its score.
        within_noise: trials not shown worse than the winner (tie) or not judged (unknown).
        margin, threshold, test: the runner-up's gap to the winner, the noise threshold it
            was judged against, and the test in words.
        pairs, effects: each adjacent pair's gap; every factor's main effect.
        detectable: the smallest gap the study could detect (80% power), ``None``: unknown.
        seeding: how adaptive seeding ended, in words (``None``: not on).
        stability: the ranked assignments' and baselines' max logit at the target, then the
            trials pruned as unstable.
        baselines: the winner against each baseline; ``step_ratio``: the winner's ms/step over
            ``ratio_to``'s (the one cost baseline, :func:`geosearch.report.analysis.cost_table`).
        ranked_sum_eta, target_sum_eta: Σ η of the ranked rung and of the target.
        order_measured: whether the order at the target is measured (``None``: the target is
            the ranked run); ``order_note``: why not, or that it held.
        sentence: the ranking's one-line verdict (with the ladder's note), for the report.
        track: the benchmark's record (:func:`track_record`).
    """

    kind: str
    winner: str | None
    trial: int | None
    mean: float | None
    std: float | None
    seeds: int
    within_noise: tuple[int, ...]
    margin: float | None
    threshold: float | None
    test: str | None
    pairs: tuple[PairStep, ...]
    effects: tuple[Effect, ...]
    detectable: float | None
    seeding: str | None
    stability: tuple[StabilityAt, ...]
    baselines: tuple[BaselineGap, ...]
    step_ratio: float | None
    ratio_to: str | None
    ranked_sum_eta: float | None
    target_sum_eta: float | None
    order_measured: bool | None
    order_note: str | None
    sentence: str
    track: dict[str, Any]
    ranked_by: str | None = None
    """Which order ranked, in words, where the ladder says (branches: the longest branch's
    or the curve law's); ``None``: the ranked rung's, unsaid."""


def verdict_of(
    ranking: Ranking,
    *,
    sentence: str,
    stability: tuple[StabilityAt, ...] = (),
    baselines: tuple[BaselineGap, ...] = (),
    step_ratio: float | None = None,
    ratio_to: str | None = None,
    ranked_sum_eta: float | None = None,
    target_sum_eta: float | None = None,
    order_measured: bool | None = None,
    order_note: str | None = None,
    ranked_by: str | None = None,
) -> Verdict:
    """The :class:`Verdict` of ``ranking`` (its rows, pairs, effects and sensitivity as
    they are) with what the study layer read beside it."""
    rows = ranking.rows
    top = rows[0] if rows else None
    second = rows[1] if len(rows) > 1 else None
    if top is None:
        kind = "none"
    elif second is None:
        kind = "single"
    elif any(r.versus_best == "tie" for r in rows[1:]):
        kind = "tie"
    elif any(r.versus_best == "unknown" for r in rows[1:]):
        kind = "unknown"
    else:
        kind = "winner"
    close = tuple(r.number for r in rows[1:] if r.versus_best in ("tie", "unknown"))
    c = second.comparison if second is not None else None
    pairs = tuple(
        PairStep(
            p.rank,
            p.upper,
            p.lower,
            p.comparison.diff,
            *(p.comparison.interval or (None, None)),
            None if p.comparison.interval is None else p.comparison.verdict == "separated",
            _order_record(p.comparison.diff),
        )
        for p in ranking.pairs
    )
    effects = tuple(
        Effect(e.factor, e.better, e.worse, e.effect, e.half_width, e.decisive, e.text())
        for e in ranking.effects
    )
    seeding = ranking.verdict.partition("; adaptive seeds ")[2] or None
    return Verdict(
        kind=kind,
        winner=top.label if top else None,
        trial=top.number if top else None,
        mean=top.score.mean if top else None,
        std=top.score.std if top else None,
        seeds=top.score.n if top else 0,
        within_noise=close,
        margin=second.gap if second else None,
        threshold=second.threshold if second else None,
        test=_test_words(c) if c is not None else None,
        pairs=pairs,
        effects=effects,
        detectable=ranking.sensitivity.gap if ranking.sensitivity is not None else None,
        seeding=f"adaptive seeds {seeding}" if seeding else None,
        stability=stability,
        baselines=baselines,
        step_ratio=step_ratio,
        ratio_to=ratio_to,
        ranked_sum_eta=ranked_sum_eta,
        target_sum_eta=target_sum_eta,
        order_measured=order_measured,
        order_note=order_note,
        sentence=sentence,
        track=track_record(),
        ranked_by=ranked_by,
    )


def _order_record(gap: float) -> str:

    return ORDER_RECORD.text(gap)


def _test_words(c: Any) -> str:

    return _test_text(c.test, c.df)


# =========================================================================== terminal
def verdict_lines(v: Verdict) -> list[str]:
    """The four lines under the ranked table, each at most :data:`WIDTH` columns: the
    winner and how sure; stability at the target; against the baselines; the order at the
    target; then, where the ladder says it, which order ranked (``ranked_by``). The line on
    where the files are is the caller's."""
    lines = [_sure_line(v), _stability_line(v), _baselines_line(v), _order_line(v),
             None if v.ranked_by is None else f"ranked by {v.ranked_by}"]
    return [clip(line) for line in lines if line]


def _sure_line(v: Verdict) -> str:
    if v.kind == "none":
        return "verdict: no trial completed, so no assignment can be recommended"
    who = f"{v.winner} (trial {v.trial})"
    seeds = f"{v.seeds} seed{'s' * (v.seeds != 1)}"
    if v.kind == "single":
        return f"verdict: only {who} completed; nothing to compare it with"
    others = ", ".join(map(str, v.within_noise))
    if v.kind == "tie":
        return (
            f"verdict: no single winner: {who} is lowest, trial{'s' * (len(v.within_noise) > 1)} "
            f"{others} within noise ({seeds}; rerun them with more --repeats)"
        )
    if v.kind == "unknown":
        return f"verdict: {who} is lowest; its gap to trial {others} cannot be judged (one seed)"
    how = f"> noise {v.threshold:.4f}" if v.threshold else "in every seed"
    return f"verdict: winner {who}, {v.margin:.4f} ahead of #2, {how} ({seeds})"


def _stability_line(v: Verdict) -> str | None:
    rows = [s for s in v.stability if s.how != "none"]
    if not rows:
        return None
    how = "measured" if any(s.how == "measured" for s in rows) else "forecast"
    head = "stability at your target"
    above = [s for s in rows if s.verdict != "below"]
    if not above:
        limit = next((s.threshold for s in rows if s.threshold is not None), None)
        tail = f" max logit {limit:.3g}" if limit is not None else " the threshold"
        return f"{head}: all {len(rows)} {how} below{tail}"
    parts = [f"{s.label} {_stability_word(s)}" for s in above]
    return f"{head}, {how}: " + "; ".join(parts)


def _stability_word(s: StabilityAt) -> str:
    if s.verdict == "above":
        at = f" at step {s.crossed_at:,}" if s.crossed_at is not None else ""
        return f"crosses{at}" + (" (pruned)" if s.unstable else "")
    return s.verdict or "unknown"


def _baselines_line(v: Verdict) -> str | None:
    if not v.baselines or v.kind == "none":
        return None
    parts = []
    for b in v.baselines:
        if b.delta is None:
            parts.append(f"{b.name} {b.status}")
        elif b.half_width is None:
            parts.append(f"{b.name} {b.delta:+.4f} (no spread)")
        else:
            parts.append(f"{b.name} {b.delta:+.4f}±{b.half_width:.4f}")
    words = {b.word for b in v.baselines if b.delta is not None and b.half_width is not None}
    if len(words) == 1:
        both = {1: "", 2: "both "}.get(len(parts), "all ")
        parts[-1] += f" ({both}{words.pop()})"
    else:
        parts = [
            p + (f" ({b.word})" if b.half_width is not None else "")
            for p, b in zip(parts, v.baselines)
        ]
    cost = f"; {v.step_ratio:.2f}x {v.ratio_to} ms/step" if v.step_ratio is not None else ""
    return "vs baselines: " + ", ".join(parts) + cost


def _order_line(v: Verdict) -> str | None:
    if v.order_measured is None or v.kind == "none":
        return None
    at = (
        f"order at your target (Σ η {v.target_sum_eta:.3g})"
        if v.target_sum_eta
        else "order at your target"
    )
    if v.order_measured:
        return f"{at}: measured, the leader held at every rung up to it"
    ranked = f"ranked at Σ η {v.ranked_sum_eta:.3g}; " if v.ranked_sum_eta else ""
    return (
        f"{at}: not measured ({ranked}ladder.rungs >= 2 ranks closer)"
        if v.order_note is None or "not measured" in v.order_note
        else f"{at}: {v.order_note.split('; your target is')[0]}"
    )


# =========================================================================== record
def verdict_record(v: Verdict) -> dict[str, Any]:
    """The fields as ``best_assignment.yaml`` stores them (YAML-safe; no prose but the
    effects' and pairs' own short texts)."""
    record = asdict(v)
    if record.get("ranked_by") is None:
        record.pop("ranked_by", None)
    record.pop("sentence")
    record["within_noise"] = list(v.within_noise)
    record["track"] = {
        "order": v.track.get("order"),
        "search": {
            k: v.track["search"][k] for k in ("settings", "winner", "spearman", "stability")
        },
    }
    return _plain(record)


def _plain(x: Any) -> Any:
    if isinstance(x, dict):
        return {k: _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    return x
