"""Tests for geosearch.report.analysis: importance, stability, cost ratios, Pareto front."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest
from _report_study import DISTS, add, new_study, row
from optuna.trial import TrialState, create_trial

from geosearch import report as rp


@pytest.mark.slow
def test_importance_ranks_the_module_type_that_decides_the_loss(tmp_path: Path) -> None:
    run = tmp_path / "imp"
    s = new_study(run)
    # mlp geometry decides the loss entirely (0.5, beyond noise); attn is irrelevant (a
    # balanced 2x2 design, twice, 3 seeds each, seed noise of its own in each point)
    for rep in range(2):
        for attn in ("stiefel", "dgram"):
            for mlp in ("stiefel", "dgram"):
                loss = (3.0 if mlp == "dgram" else 3.5) + 0.001 * rep
                jitter = [0.0, 0.01, -0.01] if (attn == "dgram") == (rep == 0) else [0.01, -0.01, 0.0]
                add(s, run, attn, mlp, [loss + j for j in jitter], metrics=False)
    imp = rp.geometry_importances(s)
    assert imp.values is not None and imp.points == 8
    assert list(imp.values) == ["geometry.mlp", "geometry.attn"]
    assert imp.values["geometry.mlp"] > 0.9 > 0.1 > imp.values["geometry.attn"]
    assert imp.decisive("geometry.mlp") is True and imp.decisive("geometry.attn") is False
    text = rp.write_report(run, plots=False).report.read_text()
    # Rule: the top factor is bold when its main effect (the Result's) is beyond noise.
    assert "Most important: **mlp**, beyond seed noise (the MLP's geometry: dgram better than stiefel by 0.5" in text
    assert row(text, "mlp", "geometry.mlp", f"{imp.values['geometry.mlp']:.3f}", "beyond noise (dgram better)")
    assert row(text, "attn", "geometry.attn", f"{imp.values['geometry.attn']:.3f}", "within noise")


def _grid_with_extras(run: Path) -> tuple[optuna.Study, dict[tuple[str, str], list[float]]]:
    """A 2x2 grid, 2 seeds each: the MLP decides the loss (0.5), attention within noise (its
    effect flips sign with the MLP's geometry); the best point has two adaptive seeds (its
    params repeated) and an AdamW baseline without params has the best value of all."""
    s = new_study(run)
    base = {("stiefel", "dgram"): 3.00, ("dgram", "dgram"): 3.03,
            ("stiefel", "stiefel"): 3.53, ("dgram", "stiefel"): 3.50}
    jitter = {("stiefel", "dgram"): [0.0, 0.04], ("dgram", "dgram"): [0.02, 0.0],
              ("stiefel", "stiefel"): [0.0, 0.02], ("dgram", "stiefel"): [0.02, 0.0]}
    seeds = {k: [v + j for j in jitter[k]] for k, v in base.items()}
    numbers = {k: add(s, run, *k, losses, metrics=False) for k, losses in seeds.items()}
    best = numbers[("stiefel", "dgram")]
    for seed, loss in ((2, 2.99), (3, 3.01)):
        add(s, run, "stiefel", "dgram", [loss], metrics=False, attrs={"seed_of": best, "seeds": [seed]})
        seeds[("stiefel", "dgram")].append(loss)
    s.add_trial(create_trial(value=2.5, user_attrs={
        "status": "completed", "baseline": "adamw", "val_losses": [2.5, 2.5], "seeds": [0, 1]}))
    return s, seeds


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:Some regimes:UserWarning")  # PED-ANOVA on 4 or 7 trials
@pytest.mark.filterwarnings("ignore::optuna.exceptions.ExperimentalWarning")  # normalize=False
def test_importance_counts_each_assignment_once_without_baselines(tmp_path: Path) -> None:
    s, seeds = _grid_with_extras(tmp_path / "extras")
    imp = rp.geometry_importances(s)
    # Rule: one value per point, its seeds merged: 4 points, not 4 + 2 seed trials + 1
    # baseline (whose 2.5 would be the best value of the study).
    assert imp.points == 4 and "over the 4 completed assignments" in imp.note
    assert list(imp.values) == ["geometry.mlp", "geometry.attn"]
    # the same numbers as PED-ANOVA on a study of the 4 points alone, each at its merged mean
    ref = optuna.create_study()
    for (attn, mlp), losses in seeds.items():
        ref.add_trial(create_trial(params={"geometry.attn": attn, "geometry.mlp": mlp},
                                   distributions=DISTS, value=sum(losses) / len(losses)))
    raw = optuna.importance.get_param_importances(
        ref, evaluator=optuna.importance.PedAnovaImportanceEvaluator(target_quantile=0.5), normalize=False)
    total = sum(raw.values())
    assert imp.values == pytest.approx({p: v / total for p, v in raw.items()})
    assert imp.values["geometry.mlp"] > 0.9
    # the old count (every completed trial) put the seed trials' attn=stiefel in the top
    # quantile with mlp=dgram: a 50/50 split that named attention first
    raw_all = optuna.importance.get_param_importances(
        s, evaluator=optuna.importance.PedAnovaImportanceEvaluator(target_quantile=2 / 7), normalize=False,
        params=["geometry.attn", "geometry.mlp"])
    assert raw_all["geometry.attn"] == pytest.approx(raw_all["geometry.mlp"])
    text = rp.write_report(tmp_path / "extras", plots=False).report.read_text()
    assert "Most important: **mlp**" in text and "**attn**" not in text


@pytest.mark.slow
def test_importance_needs_two_completed_trials(tmp_path: Path) -> None:
    run = tmp_path / "few"
    s = new_study(run)
    add(s, run, "stiefel", "dgram", [3.3])
    add(s, run, "dgram", "dgram", state=TrialState.PRUNED, attrs={"prune_reason": "x"})
    imp = rp.geometry_importances(s)
    assert imp.values is None and "not enough completed assignments" in imp.note
    assert "not enough completed assignments" in rp.write_report(run, plots=False).report.read_text()
    pytest.importorskip("matplotlib")
    written, skipped = rp.make_plots(rp.load_run(run), run / "plots")
    assert "importance" not in written  # nothing to draw, and the report says why
    assert "importance: not enough completed assignments (1; need at least 2)." in skipped


def test_pareto_front() -> None:
    pts = [(1.0, 3.0), (2.0, 2.0), (3.0, 2.5), (4.0, 1.0), (2.0, 2.0), (0.5, float("nan"))]
    # (3, 2.5) is dominated by (2, 2); equal points are both kept; nan is never on the front
    assert rp.pareto_front(pts) == [0, 1, 4, 3]
    assert rp.pareto_front([]) == []


@pytest.mark.slow
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
