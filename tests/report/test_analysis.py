"""Tests for geosearch.report.analysis: importance, stability, cost ratios, Pareto front."""

from __future__ import annotations

from pathlib import Path

import pytest
from _report_study import add, new_study
from optuna.trial import TrialState

from geosearch import report as rp


def test_importance_ranks_the_module_type_that_decides_the_loss(tmp_path: Path) -> None:
    run = tmp_path / "imp"
    s = new_study(run)
    # mlp geometry decides the loss entirely; attn is irrelevant (balanced 2x2 design, twice)
    for rep in range(2):
        for attn in ("stiefel", "dgram"):
            for mlp in ("stiefel", "dgram"):
                loss = (3.0 if mlp == "dgram" else 3.5) + 0.001 * rep
                add(s, run, attn, mlp, [loss], metrics=False)
    imp = rp.geometry_importances(s)
    assert imp.values is not None
    assert list(imp.values) == ["geometry.mlp", "geometry.attn"]
    assert imp.values["geometry.mlp"] > 0.9 > 0.1 > imp.values["geometry.attn"]
    assert "**mlp**" in rp.write_report(run, plots=False).report.read_text()


def test_importance_needs_two_completed_trials(tmp_path: Path) -> None:
    run = tmp_path / "few"
    s = new_study(run)
    add(s, run, "stiefel", "dgram", [3.3])
    add(s, run, "dgram", "dgram", state=TrialState.PRUNED, attrs={"prune_reason": "x"})
    imp = rp.geometry_importances(s)
    assert imp.values is None and "not enough completed trials" in imp.note
    assert "not enough completed trials" in rp.write_report(run, plots=False).report.read_text()
    pytest.importorskip("matplotlib")
    written, skipped = rp.make_plots(rp.load_run(run), run / "plots")
    assert "importance" not in written  # nothing to draw, and the report says why
    assert "importance: not enough completed trials (1; need at least 2)." in skipped


def test_pareto_front() -> None:
    pts = [(1.0, 3.0), (2.0, 2.0), (3.0, 2.5), (4.0, 1.0), (2.0, 2.0), (0.5, float("nan"))]
    # (3, 2.5) is dominated by (2, 2); equal points are both kept; nan is never on the front
    assert rp.pareto_front(pts) == [0, 1, 4, 3]
    assert rp.pareto_front([]) == []


def test_cost_ratios_and_pareto_on_a_study(finished: Path) -> None:
    run = rp.load_run(finished)
    cost = rp.cost_table(run.trials)
    # all-adamw trial 3 is the baseline (10 ms/step); stiefel trials take 16 ms -> 1.6x
    assert cost.baseline.startswith("AdamW") and cost.baseline_trials == [3]
    ratio = {c.trial.number: c.step_ratio for c in cost.rows}
    assert ratio[3] == pytest.approx(1.0) and ratio[0] == pytest.approx(1.6) and ratio[2] == pytest.approx(1.3)
    tokens = {c.trial.number: c.tokens_ratio for c in cost.rows}
    assert tokens[0] == pytest.approx(10 / 16)
    # time = 40 steps x ms/step. Trial 1 (same time as 0, worse loss) is dominated.
    pts, front = rp.pareto_trials(run.trials)
    assert [pts[i].number for i in front] == [3, 2, 0]


def test_cost_without_baseline_uses_fastest_and_says_so(tmp_path: Path) -> None:
    run = tmp_path / "nb"
    s = new_study(run)
    add(s, run, "stiefel", "dgram", [3.3], step_ms=20.0)
    add(s, run, "stiefel", "stiefel", [3.4], step_ms=16.0)
    cost = rp.cost_table(rp.load_run(run).trials)
    assert "fastest trial" in cost.baseline and "no all-adamw or all-euclidean baseline" in cost.baseline
    assert {c.trial.number: c.step_ratio for c in cost.rows} == pytest.approx({1: 1.0, 0: 1.25})
