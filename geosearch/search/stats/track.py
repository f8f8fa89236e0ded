"""The benchmark's track record, read from ``track_record.json`` (shipped with the package),
which ``python benchmarks/fidelity.py --track-record`` writes: how often pairs kept their
order from the ranked rung to the long runs (:data:`ORDER_RECORD`), and how often the
default search matched the long runs (:func:`track_text`). The ranking quotes the first
beside each gap, the verdict both; neither is a hand-copied constant.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from typing import Any

__all__ = ["ORDER_RECORD", "TRACK_FILE", "OrderRecord", "track_record", "track_text"]

TRACK_FILE = "track_record.json"


@lru_cache(maxsize=1)
def track_record() -> dict[str, Any]:
    """The benchmark's record as ``benchmarks/fidelity.py --track-record`` wrote it (shipped
    with the package): ``order`` (pairs kept their order from the ranked rung to the long
    runs, by gap size) and ``search`` (the default search against the long runs, per
    setting, with the tallies)."""
    text = (
        resources.files("geosearch.search.stats").joinpath(TRACK_FILE).read_text(encoding="utf-8")
    )
    return json.loads(text)


def track_text(record: dict[str, Any] | None = None) -> str:
    """The search's record in one sentence, from :func:`track_record`: its tallies, their
    chance under the benchmark's null (a random order of the assignments each search kept),
    and, where recorded, what a rule that needs no run got at the same settings."""
    s = (record or track_record())["search"]
    w, r, st = s["winner"], s["spearman"], s["stability"]
    null = (f"{w['chance']:.2f}, 1 in the assignments each search kept" if "null" in w
            else "1 in 4 each")
    text = (
        f"in the benchmark the default search named the {s['long_steps']:,}-step runs' best at "
        f"{w['hits']} of {w['of']} settings (95% interval {w['low']:.2f}-{w['high']:.2f}; chance "
        f"{null}, p = {w['p']:.2g} for {w['hits']} or more), ordered the four with Spearman "
        f">= {r['at']:g} at {r['hits']} of {r['of']} ({r['low']:.2f}-{r['high']:.2f}; "
        f"p = {r['p']:.2g}) and made {st['hits']} of {st['of']} stability "
        "decisions as the long runs did"
    )
    rule, const = s.get("no_run_rule"), s.get("constant_rule_stability")
    if rule:
        text += (f"; a rule that needs no run got {rule['winner']}, {rule['spearman']} and "
                 f"{rule['stability'][0]} of {rule['stability'][1]}")
    if const:
        text += f" (a constant rule: {const[0]} of {const[1]} decisions)"
    return text


@dataclass(frozen=True)
class OrderRecord:
    """How often pairs of assignments kept their order from the search's ranked rung to the
    target's length in the project's benchmark, by their gap at the rung: a gap beyond noise
    at the rung can still flip later in training. Quoted beside each gap as the benchmark's
    record, not as a promise for another model or setting.

    Attributes:
        at: the gap, in nats, that splits far pairs from close ones.
        far: (kept their order, pairs) for pairs at least ``at`` apart.
        near: the same for closer pairs.
    """

    at: float
    far: tuple[int, int]
    near: tuple[int, int]

    def text(self, gap: float) -> str:
        """``"≥ 0.02: in the benchmark such gaps kept their order at 2,000 steps 13 of 15
        times"``."""
        kept, of = self.far if abs(gap) >= self.at else self.near
        side = "≥" if abs(gap) >= self.at else "<"
        return (f"{side} {self.at:g}: in the benchmark such gaps kept their order at 2,000 steps "
                f"{kept} of {of} times")


def _order_record() -> OrderRecord:
    """The benchmark's record (docs/benchmarks.md, "fidelity.py"), as ``python
    benchmarks/fidelity.py --track-record`` scored it from the stored runs into
    ``track_record.json``: completed 400-step runs (the ranked rung's length) against the
    2,000-step runs, 2 seeds each, of the four paper assignments at the settings stored at
    both lengths, every pair, by the gap at 400 steps."""
    o = track_record()["order"]
    return OrderRecord(at=o["at"], far=tuple(o["far"]), near=tuple(o["near"]))


ORDER_RECORD = _order_record()
