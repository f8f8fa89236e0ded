"""The report's Result section: the :class:`~geosearch.search.stats.verdict.Verdict` as
short paragraphs and tables (the winner and how sure, the ranked pairs, the main effects, the
baselines, the target, the track record), then the one-line verdict it was read from."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

from geosearch.search.stats.track import track_text
from geosearch.search.stats.verdict import Verdict

__all__ = ["verdict_sections"]


def _fmt(x: float | None, spec: str = ".4f") -> str:
    return "—" if x is None or not math.isfinite(x) else format(x, spec)


def _table(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    return out + ["| " + " | ".join(str(c).replace("|", "\\|") for c in row) + " |" for row in rows]


def _headline(v: Verdict) -> str:
    who = f"**{v.winner}** (trial {v.trial}, val loss {_fmt(v.mean)}" + (
        f" ± {_fmt(v.std)}, {v.seeds} seeds)" if v.std is not None else f", {v.seeds} seed)"
    )
    others = ", ".join(map(str, v.within_noise))
    return {
        "none": "No trial completed, so no assignment can be recommended.",
        "single": f"Only {who} completed: there is nothing to compare it with.",
        "tie": f"No single winner: {who} has the lowest mean, but trial(s) {others} are within "
        "noise of it. Rerun the tied assignments with more seeds (`--repeats`).",
        "unknown": f"Lowest: {who}; its gap to trial(s) {others} cannot be judged (one seed: no "
        "spread). Rerun with `--repeats 3`.",
    }.get(v.kind, f"Winner: {who}.")


def verdict_sections(v: Verdict, *, at_own_step: bool = False) -> list[str]:
    """The Result section's lines (``at_own_step``: a step grid's own-step answer)."""
    lines = ["## Result", "", _headline(v), ""]
    if v.kind == "none":
        return lines
    how = [
        ["runner-up's gap to the winner", _fmt(v.margin)],
        ["noise threshold it is judged against (95%)", _fmt(v.threshold)],
        ["test", v.test or "—"],
        ["seeds of the winner", v.seeds],
        ["smallest gap the study could detect (80% power)", _fmt(v.detectable)],
    ]
    if v.seeding:
        how.append(["adaptive seeds", v.seeding.removeprefix("adaptive seeds ")])
    lines += ["### How sure", "", *_table(["", ""], how), ""]
    if v.pairs:
        lines += [
            "### Ranked pairs",
            "",
            "Each neighbour against the one above it, down to the last "
            "contender; the benchmark's record says how often gaps that size kept their order "
            f"at {v.track['order'].get('long_steps', 2000):,} steps.",
            "",
        ]
        lines += _table(
            ["pair", "gap", "95% CI", "separated", "in the benchmark"],
            [
                [
                    f"#{p.rank} trial {p.upper} vs #{p.rank + 1} trial {p.lower}",
                    _fmt(p.gap),
                    "—" if p.low is None else f"[{_fmt(p.low)}, {_fmt(p.high)}]",
                    "not judged" if p.separated is None else "yes" if p.separated else "no",
                    p.record,
                ]
                for p in v.pairs
            ],
        ) + [""]
    if v.effects:
        at = (
            " at each assignment's own best step (at the shared step: the verdict)"
            if at_own_step
            else ""
        )
        lines += [
            "### Main effects",
            "",
            "Each factor's geometry (averaged over matched pairs that "
            f"differ only in it, within seeds){at}:",
            "",
        ]
        lines += _table(
            ["factor", "ahead", "behind", "by", "± 95%", "beyond noise"],
            [
                [
                    e.factor,
                    e.better,
                    e.worse,
                    _fmt(e.effect),
                    _fmt(e.half_width),
                    "yes" if e.decisive else "no",
                ]
                for e in v.effects
            ],
        ) + [""]
        lines += [f"- {e.text}" for e in v.effects] + [""]
    if v.baselines:
        lines += [
            "### Against the baselines",
            "",
            "The winner's val loss minus each baseline's "
            "(negative: the winner is better), paired on shared seeds."
            + (
                f" Its step takes {v.step_ratio:.2f}× {v.ratio_to}'s ms/step (the cost "
                "baseline of every ratio in this report)."
                if v.step_ratio is not None
                else ""
            ),
            "",
        ]
        lines += _table(
            ["baseline", "trial", "status", "its val loss", "winner − baseline", "± 95%", "reading"],
            [
                [
                    b.name,
                    b.trial,
                    b.status,
                    _fmt(b.mean),
                    _fmt(b.delta, "+.4f"),
                    _fmt(b.half_width),
                    b.word if b.delta is not None else "—",
                ]
                for b in v.baselines
            ],
        ) + [""]
    lines += ["### At your target", ""]
    if v.order_measured is None:
        lines.append("- The target is the proxy run itself: the order is measured there.")
    else:
        lines.append(
            "- The order: "
            + (
                "measured; the leader held at every rung up to it."
                if v.order_measured
                else f"{v.order_note}."
            )
        )
    above = [s for s in v.stability if s.verdict not in (None, "below")]
    judged = [s for s in v.stability if s.verdict is not None]
    if judged:
        lines.append(
            "- Stability: "
            + (
                "every assignment and baseline judged stays below the max-logit threshold."
                if not above
                else "; ".join(
                    f"{s.label} (trial {s.trial}) {s.verdict}"
                    + (f", crossing near your step {s.crossed_at:,}" if s.crossed_at else "")
                    for s in above
                )
                + "."
            )
            + " (Table: Stability at your target.)"
        )
    lines += [
        "",
        f"How far to trust it: {track_text(v.track)} (docs/benchmarks.md).",
        "",
        "### The verdict in one line",
        "",
        f"**Verdict:** {v.sentence}.",
    ]
    return lines
