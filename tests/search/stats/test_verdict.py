"""The verdict as data: its fields, its four terminal lines, the track record's one source."""

from __future__ import annotations


from pathlib import Path

import yaml

from geosearch.search.stats.ranking import rank_scores
from geosearch.search.stats.track import track_record
from geosearch.search.stats.scores import Point, Score
from geosearch.search.stats.verdict import (
    WIDTH,
    BaselineGap,
    StabilityAt,
    verdict_lines,
    verdict_of,
    verdict_record,
)

BENCHMARKS = Path(__file__).resolve().parents[3] / "benchmarks"


def _ranking():
    entries = [
        (0, "attn=stiefel, mlp=stiefel", Score((3.00, 3.02), (0, 1))),
        (1, "attn=stiefel, mlp=dgram", Score((3.30, 3.31), (0, 1))),
        (2, "attn=dgram, mlp=stiefel", Score((3.20, 3.23), (0, 1))),
        (3, "attn=dgram, mlp=dgram", Score((3.50, 3.50), (0, 1))),
    ]
    points = {
        0: Point({"attn": "stiefel", "mlp": "stiefel"}),
        1: Point({"attn": "stiefel", "mlp": "dgram"}),
        2: Point({"attn": "dgram", "mlp": "stiefel"}),
        3: Point({"attn": "dgram", "mlp": "dgram"}),
    }
    return rank_scores(entries, points)


def test_the_verdict_holds_the_rankings_numbers_not_new_ones():
    r = _ranking()
    v = verdict_of(r, sentence=r.verdict)
    assert (v.kind, v.winner, v.trial, v.seeds) == ("winner", r.rows[0].label, 0, 2)
    assert v.margin == r.rows[1].gap and v.threshold == r.rows[1].threshold
    assert [(p.upper, p.lower, p.gap) for p in v.pairs] == [
        (p.upper, p.lower, p.comparison.diff) for p in r.pairs
    ]
    assert [(e.factor, e.effect, e.decisive) for e in v.effects] == [
        (e.factor, e.effect, e.decisive) for e in r.effects
    ]
    assert v.detectable == r.sensitivity.gap and v.sentence == r.verdict


def test_four_lines_each_within_100_columns_and_the_record_is_fields():
    r = _ranking()
    unstable = StabilityAt(
        9, "attn=dgram, mlp=dgram " * 4, "measured", "above", 300.0, 80.0, 1340, True
    )
    base = (
        BaselineGap("adamw", 4, "completed", 3.1, -0.1, 0.02, "paired", "better"),
        BaselineGap("muon", 5, "completed", 3.05, -0.05, 0.06, "paired", "within noise"),
    )
    v = verdict_of(
        r,
        sentence=r.verdict,
        stability=(unstable,),
        baselines=base,
        step_ratio=2.5,
        ratio_to="AdamW",
        ranked_sum_eta=4.4,
        target_sum_eta=21.8,
        order_measured=False,
        order_note="ranked at Σ η 4.4 only; your target is Σ η 21.8: the order there is not "
        "measured",
    )
    lines = verdict_lines(v)
    assert len(lines) == 4 and max(map(len, lines)) <= WIDTH
    assert lines[0].startswith("verdict: winner attn=stiefel, mlp=stiefel (trial 0)")
    assert "crosses at step 1,340 (pruned)" in lines[1] or lines[1].endswith("…")
    assert "adamw -0.1000±0.0200 (better)" in lines[2] and "2.50x AdamW ms/step" in lines[2]
    assert lines[3].startswith("order at your target (Σ η 21.8): not measured")
    record = verdict_record(v)
    assert yaml.safe_load(yaml.safe_dump(record)) == record and "sentence" not in record
    assert record["baselines"][0]["delta"] == -0.1 and record["stability"][0]["crossed_at"] == 1340
    assert record["track"]["search"]["winner"] == track_record()["search"]["winner"]


def test_the_verdict_says_which_rule_ranked_where_the_ladder_says_it():
    from geosearch.search.horizon.curve import ranking_rule

    r = _ranking()
    plain = verdict_of(r, sentence=r.verdict, order_measured=True)
    assert not any(line.startswith("ranked by") for line in verdict_lines(plain))
    assert "ranked_by" not in verdict_record(plain)
    rule = ranking_rule(8.8, 21.8, branches=True)
    v = verdict_of(r, sentence=r.verdict, order_measured=True, ranked_by=rule)
    lines = verdict_lines(v)
    assert lines[-1] == f"ranked by {rule}" and len(lines[-1]) <= WIDTH
    assert "longest completed branch (Σ η 8.8); the curve law" in lines[-1]
    assert verdict_record(v)["ranked_by"] == rule
