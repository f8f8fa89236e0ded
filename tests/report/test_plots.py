"""Tests for geosearch.report.plots: every promised plot is written, or the report says why."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from _report_study import PNG, add, new_study, row

from geosearch import report as rp
from geosearch.report.plots import _logit_series


def test_report_writes_every_plot_and_names_every_trial(finished: Path) -> None:
    pytest.importorskip("matplotlib")  # the `report` extra
    files = rp.write_report(finished)
    text = files.report.read_text()
    # every plot file the report promises is written, a real PNG, and linked from report.md
    assert set(files.plots) == set(rp.PLOT_NAMES)
    for name, path in files.plots.items():
        assert path == finished / "plots" / f"{name}.png"
        assert path.read_bytes()[:8] == PNG
        assert f"(plots/{name}.png)" in text
    assert files.plots_note is None
    # every trial is named in a table row with its assignment
    assert row(text, "1", 0, "attn=stiefel, mlp=dgram")
    assert row(text, "4", 3, "attn=adamw, mlp=adamw")
    assert row(text, 4, "attn=dgram, mlp=dgram", 20, "max logit 1.2e+03 > 500 at step 20 (layer 0)")
    assert row(text, 5, "attn=dgram, mlp=stiefel", "RuntimeError: CUDA out of memory")
    # mean ± sample std over 3 seeds: 3.30, 3.32, 3.31 -> 3.31 ± 0.01
    assert row(text, "attn=stiefel, mlp=dgram", "3.3100", "0.0100", 3)
    # clearly separated (Δ=0.1 ≫ Welch threshold t(4)·√2·0.01/√3 ≈ 0.023): a winner, not a tie
    assert "**Verdict:** winner: attn=stiefel, mlp=dgram (trial 0," in text
    assert "no single winner" not in text and "=1" not in text
    # threshold from the study's pruner settings; the dashboard paragraph is there
    assert "500 (from the study's pruner settings)" in text
    assert f"optuna-dashboard sqlite:///{finished.resolve()}/study.db" in text
    # the result names the unstable assignment too
    assert "Unstable (pruned): attn=dgram, mlp=dgram (trial 4, step 20)." in text


def test_logit_curve_falls_back_to_probe_history(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    run = tmp_path / "probe"
    s = new_study(run, space={})  # no pruner settings: LogitGrowthPruner's default threshold
    history = [{"step": 0, "max_logit": 4.0}, {"step": 10, "max_logit": 40.0}]
    add(s, run, "dgram", "dgram", [3.3], metrics=False, attrs={"probe_history": history})
    add(s, run, "stiefel", "dgram", [3.2], metrics=False)
    loaded = rp.load_run(run)
    assert _logit_series(loaded.trials[0]) == [([0.0, 10.0], [4.0, 40.0])]
    assert loaded.threshold_source == "the LogitGrowthPruner default" and loaded.threshold > 0
    written, skipped = rp.make_plots(loaded, run / "plots")
    assert "max_logit" in written  # drawn from probe_history alone
    # no metrics.jsonl at all: the curves that need them are skipped, with the reason
    assert "val_loss: no trial recorded val_loss" in skipped


def test_report_without_matplotlib_still_writes_tables(finished: Path, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib` now raises ImportError
    files = rp.write_report(finished)
    text = files.report.read_text()
    assert files.plots == {}
    assert not (finished / "plots").exists()
    assert "pip install 'geosearch[report]'" in text
    assert "## Ranking" in text and "## Cost" in text  # the tables are all there


def test_horizon_plot_needs_a_target(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    run = tmp_path / "old"
    s = new_study(run)  # made before targets: no target, no ladder
    add(s, run, "stiefel", "dgram", [3.3])
    written, skipped = rp.make_plots(rp.load_run(run), run / "plots")
    # Rule: without a target the horizon plot is skipped, with the reason.
    assert "horizon" not in written and any(s_.startswith("horizon: the study records no target") for s_ in skipped)
    # Rule: a ladder short of its target is drawn too (extrapolated to the target).
    run = tmp_path / "short"
    s = new_study(run, ladder=True)
    s.set_user_attr("target", {"steps": 1000, "spectral_lr": 0.02, "model": "tiny", "sum_eta": 11.0})
    add(s, run, "stiefel", "dgram", [3.3])
    add(s, run, "dgram", "dgram", [3.2])
    loaded = rp.load_run(run)
    assert loaded.reading is not None and loaded.reading.extrapolated
    written, _ = rp.make_plots(loaded, run / "plots")
    assert written["horizon"].read_bytes()[:8] == PNG
