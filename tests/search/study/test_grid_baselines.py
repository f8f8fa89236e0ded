"""A space with a step grid and baselines, searched with the fake trainer: each baseline is
trained at every factor of the grid (AdamW's lr, Muon's spectral step), the Δ table compares
each assignment at its own best step with each baseline at its own best step, and the
points at the shared step with the baselines at factor 1, every line naming the baseline's
step; the shared-step ranking is a table of its own; a point a loss pruner stopped at the
shared step is reported as pruned with its reason, with its step, never as unstable."""

from __future__ import annotations

import pytest
from _search_helpers import FakeTrain, TINY_PROXY, make_space, search, trials_of, use_train

from geosearch.report import write_report
from geosearch.search.records import BASELINE, STEP_FACTOR, trial_status
from geosearch.search.runtime.storage import open_run_study
from geosearch.search.stats.study_ranking import rank_study
from geosearch.search.study.baseline_trials import baseline_table
from geosearch.search.study.export import format_ranking

SHARED = 0.02
GRID = [0.5, 1, 2]
TWO = {"attn": ["stiefel", "dgram"], "mlp": ["stiefel"]}
# val loss by (run, factor): AdamW best at twice its lr, Muon at half its spectral step;
# Stiefel attention best at the shared step, DGram attention at half of it
LOSS = {"attn=stiefel,mlp=stiefel": {0.5: 3.05, 1: 3.0, 2: 3.06},
        "attn=dgram,mlp=stiefel": {0.5: 3.05, 1: 3.1, 2: 3.2},
        "attn=adamw,mlp=adamw": {0.5: 3.3, 1: 3.2, 2: 3.15},
        "attn=euclidean,mlp=euclidean": {0.5: 3.02, 1: 3.08, 2: 3.3}}


def _grid_space(lr, **extra):
    return make_space(TWO, repeats=2, hyperparams={"step_grid": GRID, "step_halving": False},
                      proxy={**TINY_PROXY, "spectral_lr": SHARED}, **extra)


def _factor(key, config, lr):
    """The run's factor: of the proxy's lr for AdamW, of the shared spectral step otherwise."""
    return round(config.lr / lr if key == "attn=adamw,mlp=adamw" else config.spectral_lr / SHARED, 6)


@pytest.mark.slow
def test_baselines_are_tuned_over_the_grid_and_compared_at_their_own_best_step(monkeypatch, tmp_path):
    lr = _grid_space(1.0).proxy.lr

    def losses(key, seed, config):
        return LOSS[key][_factor(key, config, lr)] + 0.05 * seed + 0.001 * ((len(key) + seed) % 3)

    fake = use_train(monkeypatch, FakeTrain(losses=losses, with_config=True))
    space = _grid_space(lr, baselines=["adamw", "muon"])
    search(space, tmp_path)
    trials = trials_of(tmp_path)
    # Rule: each baseline trains at each factor of the grid, marked with it: AdamW at lr × the
    # factor (its spectral step untouched), Muon at spectral_lr × the factor.
    marks = sorted((t.user_attrs[BASELINE], t.user_attrs[STEP_FACTOR]) for t in trials if BASELINE in t.user_attrs)
    assert marks == [("adamw", 0.5), ("adamw", 1.0), ("adamw", 2.0), ("muon", 0.5), ("muon", 1.0), ("muon", 2.0)]
    adamw = [c for c, call in zip(fake.configs, fake.calls) if call[0] == "attn=adamw,mlp=adamw"]
    assert sorted({round(c.lr / lr, 6) for c in adamw}) == GRID and {c.spectral_lr for c in adamw} == {SHARED}
    muon = [c for c, call in zip(fake.configs, fake.calls) if call[0] == "attn=euclidean,mlp=euclidean"]
    assert sorted({round(c.spectral_lr, 6) for c in muon}) == [0.01, 0.02, 0.04]

    study = open_run_study(tmp_path / "runs" / "t")
    ranking = rank_study(study)
    table = baseline_table(study, ranking)
    # Rule: each baseline is compared at its own best step (lowest mean over the factors)...
    assert table.baselines["adamw"]["factor"] == 2 and table.baselines["adamw"]["step"] == f"lr {lr * 2:.3g}"
    assert table.baselines["muon"]["factor"] == 0.5 and table.baselines["muon"]["step"] == "spectral step 0.01"
    assert table.baselines["muon"]["trained"].startswith("Muon: spectral step 0.01 ")
    assert [f for f, *_ in table.baselines["muon"]["tried"]] == GRID
    # ... against each assignment at its own best step: Stiefel attention at 0.02 (3.0) vs Muon
    # at 0.01 (3.02), paired on the seeds
    row = next(r for r in table.rows["muon"] if r.label.startswith("attn=stiefel"))
    assert row.label == "attn=stiefel, mlp=stiefel at step 0.02" and row.delta == pytest.approx(3.0 - 3.02, abs=2e-3)
    # Rule: the shared-step answer is compared with the baselines at factor 1.
    shared = table.shared
    assert shared is not None and shared.baselines["muon"]["factor"] == 1
    assert shared.baselines["muon"]["step"] == "spectral step 0.02" and shared.baselines["adamw"]["step"] == f"lr {lr:.3g}"
    dgram = next(r for r in shared.rows["muon"] if r.label.startswith("attn=dgram"))
    assert dgram.label == "attn=dgram, mlp=stiefel" and dgram.delta == pytest.approx(3.1 - 3.08, abs=2e-3)

    # Rule: the printed table names each baseline's step on every line, both comparisons.
    text = format_ranking(study, ranking, details=True)
    assert "  muon at spectral step 0.01 (trial" in text and "  muon at spectral step 0.02 (trial" in text
    assert f"  adamw at lr {lr * 2:.3g} (trial" in text
    assert "over the grid spectral step 0.01: " in text
    assert f"(trial {row.number}): Δ {row.text()} vs muon at spectral step 0.01" in text
    assert f"(trial {dgram.number}): Δ {dgram.text()} vs muon at spectral step 0.02" in text
    # Rule: the shared-step ranking is a table of its own beside the own-step one.
    assert "each assignment at its own best step (the exported answer):" in text
    at_shared = text.split("at the shared step 0.02:\n", 1)[1]
    assert at_shared.splitlines()[0].startswith("rank  trial") and "attn=stiefel, mlp=stiefel " in at_shared.splitlines()[1]

    write_report(tmp_path / "runs" / "t", plots=False)
    report = (tmp_path / "runs" / "t" / "report.md").read_text(encoding="utf-8")
    assert "## Ranking at the shared step 0.02" in report
    shared_section = report.split("## Ranking at the shared step 0.02", 1)[1].split("\n## ", 1)[0]
    assert "| attn=stiefel, mlp=stiefel |" in shared_section and "step_factor" not in shared_section
    assert "tuned over the step grid as the assignments are" in report and "not tuned separately" not in report
    assert "**muon** at spectral step 0.01 (trial" in report and "### At the shared step" in report
    assert "| baseline's step |" in report and "| spectral step 0.02 |" in report


@pytest.mark.slow
def test_a_loss_pruned_point_at_the_shared_step_is_pruned_not_unstable(monkeypatch, tmp_path):
    # Stiefel attention at the shared step trains at 4.0, every other run at 3.0: the median
    # pruner (one startup trial; two points train before it) stops it at its first report;
    # its logits stay low, so it is no instability
    def losses(key, seed, config):
        return 4.0 if key == "attn=stiefel,mlp=stiefel" and round(config.spectral_lr, 6) == SHARED else 3.0

    use_train(monkeypatch, FakeTrain(losses=losses, with_config=True))
    space = make_space(TWO, hyperparams={"step_grid": GRID, "step_halving": False}, proxy={**TINY_PROXY, "spectral_lr": SHARED},
                       pruner={"loss": {"type": "median", "n_startup_trials": 1, "n_warmup_steps": 0}})
    search(space, tmp_path)
    stopped = next(t for t in trials_of(tmp_path)
                   if t.params.get("geometry.attn") == "stiefel" and t.params.get(STEP_FACTOR) == 1)
    # Rule: recorded as pruned (a loss pruner's prune), with its reason.
    assert trial_status(stopped) == "pruned" and "MedianPruner" in stopped.user_attrs["prune_reason"]
    study = open_run_study(tmp_path / "runs" / "t")
    ranking = rank_study(study)
    # Rule: only points pruned as unstable are "unstable at the shared step".
    assert ranking.steps is not None and ranking.steps.unstable_shared == ()
    assert "unstable at the shared step" not in ranking.verdict
    # Rule: its "not ranked" line says pruned by the loss pruner, with the reason and the step.
    text = format_ranking(study, ranking)
    line = next(s for s in text.splitlines() if s.startswith(f"  trial {stopped.number:>3}"))
    assert "attn=stiefel, mlp=stiefel, spectral step 0.02" in line and "step_factor" not in line
    assert "PRUNED (loss pruner, not unstable)" in line and "MedianPruner" in line
    report = write_report(tmp_path / "runs" / "t", plots=False).report.read_text(encoding="utf-8")
    assert "Pruned by the loss pruner" in report and "Unstable (pruned)" not in report
