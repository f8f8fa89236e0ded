"""Tests for geosearch.report.plots: every promised plot is written, or the report says why."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import optuna
import pytest
from _report_study import LADDER, PNG, _metrics, add, new_study, row
from optuna.trial import create_trial

from geosearch import report as rp
from geosearch.report.analysis import head_logits
from geosearch.search.records import write_rung_probes
from geosearch.report.plots import (
    _heads_figure,
    _horizon_figure,
    _layers_figure,
    _logit_series,
    _max_logit_figure,
    _val_loss_figure,
)


def _with_layers(run_dir: Path, top_layer: dict[int, int] | None = None) -> None:
    """Give every record of every metrics.jsonl two layers' max logits: the layer
    ``top_layer[trial]`` (default 0) holds the record's max logit, the other a third of it;
    and two heads per layer, the first holding the layer's."""
    for path in sorted(run_dir.glob("trials/*/**/metrics.jsonl")):  # trials/<n>/[seed<s>/]
        top = (top_layer or {}).get(int(path.relative_to(run_dir).parts[1]), 0)
        recs = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        for r in recs:
            layers = [r["max_logit"] / 3] * 2
            layers[top] = r["max_logit"]
            r["max_logit_per_layer"] = layers
            r["max_logit_per_head"] = [[v, v / 2] for v in layers]  # two heads, the first leads
        path.write_text("\n".join(json.dumps(r) for r in recs) + "\n")


def _baseline(study: optuna.Study, run_dir: Path, name: str, losses: list[float], rungs: list[int]) -> int:
    """A baseline trial as the search stores it: no params, the ``baseline`` attr, its losses
    and first seed's probes at each rung it trained (AdamW: rung 0, no Σ η), its metrics.jsonl."""
    number = len(study.trials)
    adamw = name == "adamw"
    mean = sum(losses) / len(losses)
    study.add_trial(create_trial(value=mean, user_attrs={
        "status": "completed", "baseline": name, "trial_dir": f"trials/{number}", "budget_steps": 40,
        "val_losses": losses, "seeds": list(range(len(losses))),
        "mean_step_ms": 10.0, "rung_indices": rungs,
        "rung_losses": [[v + 0.5 * (rungs[-1] - k) for v in losses] for k in rungs]}))
    write_rung_probes(run_dir / f"trials/{number}", [  # the trial's file, as the search writes it
        [{"step": s, "max_logit": 4.0 + s / 10, **({} if adamw else {
            "sum_eta": LADDER[k]["sum_eta"] * s / 40})} for s in range(10, 41, 10)] for k in rungs])
    recs = _metrics(40, 1.05, losses[0], 1.0)
    (run_dir / f"trials/{number}/metrics.jsonl").write_text("\n".join(json.dumps(r) for r in recs) + "\n")
    return number


@pytest.mark.slow
def test_report_writes_every_plot_and_names_every_trial(finished: Path) -> None:
    pytest.importorskip("matplotlib")  # the `report` extra
    _with_layers(finished)  # probes of each layer, as the trainer writes them now
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


@pytest.mark.slow
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


@pytest.mark.slow
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


def _grey(colour) -> bool:
    from matplotlib.colors import to_rgb

    r, g, b = to_rgb(colour)
    return r == g == b


@pytest.mark.slow
def test_baselines_are_drawn_beside_the_assignments(finished: Path) -> None:
    pytest.importorskip("matplotlib")
    from matplotlib.figure import Figure

    study = optuna.load_study(study_name="demo", storage=f"sqlite:///{finished}/study.db")
    adamw = _baseline(study, finished, "adamw", [3.70, 3.72, 3.71], rungs=[0])
    muon = _baseline(study, finished, "muon", [3.45, 3.47, 3.46], rungs=[0, 1])
    run = rp.load_run(finished)
    assert [b.baseline for b in run.baselines] == ["adamw", "muon"]
    # Rule: the val-loss and max-logit plots draw each baseline in grey with a style of its
    # own, labelled by its name (AdamW's curves are from rung 0: it takes no spectral step).
    for figure in (_val_loss_figure, _max_logit_figure):
        lines = {ln.get_label(): ln for ln in figure(Figure, run).axes[0].get_lines()}
        base = [lines["baseline adamw (rung 0)"], lines["baseline muon"]]
        assert all(_grey(ln.get_color()) for ln in base)
        assert base[0].get_color() != base[1].get_color()
        assert not any(_grey(ln.get_color()) for lab, ln in lines.items()
                       if lab.startswith(("attn=", "attn=stiefel, mlp=")))
    lines = {ln.get_label(): ln for ln in _val_loss_figure(Figure, run).axes[0].get_lines()}
    metrics = rp.load_run(finished).baselines[0].metrics[0]
    assert list(lines["baseline adamw (rung 0)"].get_ydata()) == [r["val_loss"] for r in metrics]
    # the horizon: Muon's loss at both rungs (Σ η 0.45, 1.8), AdamW's at rung 0 only
    ax_loss = _horizon_figure(Figure, run).axes[0]
    loss = {ln.get_label(): ln for ln in ax_loss.get_lines()}
    assert list(loss["baseline muon"].get_xdata()) == [0.45, 1.8]
    assert list(loss["baseline muon"].get_ydata()) == pytest.approx([3.96, 3.46])
    assert list(loss["baseline adamw (rung 0)"].get_xdata()) == [0.45]
    assert _grey(loss["baseline muon"].get_color())
    files = rp.write_report(finished)
    assert {"val_loss", "max_logit", "horizon"} <= set(files.plots)
    text = files.report.read_text()
    assert f"**adamw** (trial {adamw}" in text and f"**muon** (trial {muon}" in text


@pytest.mark.slow
def test_per_layer_logits_drawn_when_the_metrics_have_them(finished: Path) -> None:
    pytest.importorskip("matplotlib")
    from matplotlib.figure import Figure

    # Rule: a study whose metrics have no per-layer values skips the figure quietly.
    files = rp.write_report(finished)
    assert "max_logit_layers" not in files.plots and files.plots_note is None
    assert not (finished / "plots" / "max_logit_layers.png").exists()
    assert "max_logit_layers" not in files.report.read_text()
    # the same study once its probes record each layer: layer 1 leads in trial 4 only
    _with_layers(finished, top_layer={4: 1})
    run = rp.load_run(finished)
    fig = _layers_figure(Figure, run)
    # one panel per trial with metrics (trial 5 failed before any), best first, unstable last
    titles = [ax.get_title().split("\n") for ax in fig.axes]
    assert [t[1] for t in titles] == ["(trial 0)", "(trial 1)", "(trial 2)", "(trial 3)", "(trial 4, unstable)"]
    assert titles[0][0] == "attn=stiefel, mlp=dgram"
    first = {ln.get_label(): ln for ln in fig.axes[0].get_lines()}
    logits = [r["max_logit"] for r in run.trials[0].metrics[0]]
    assert list(first["layer 0"].get_ydata()) == pytest.approx(logits)
    assert list(first["layer 1"].get_ydata()) == pytest.approx([v / 3 for v in logits])
    assert first["prune threshold 500"].get_ydata()[0] == 500
    peaks = {p.trial.number: (p.layer, p.step) for p in rp.peak_layers(run.trials)}
    assert peaks == {0: (0, 40), 1: (0, 40), 2: (0, 40), 3: (0, 40), 4: (1, 20)}
    files = rp.write_report(finished)
    assert files.plots["max_logit_layers"].read_bytes()[:8] == PNG
    text = files.report.read_text()
    assert "(plots/max_logit_layers.png)" in text
    assert ("the last rung it reached): layer 0 in 4 of 5 runs (trials 0, 1, 2, 3); "
            "layer 1 in 1 of 5 runs (trial 4).") in text


@pytest.mark.slow
def test_per_head_logits_drawn_at_the_end_of_the_stability_rung(finished: Path) -> None:
    pytest.importorskip("matplotlib")
    from matplotlib.figure import Figure

    # Rule: without per-head probes there is no heatmap, and no note.
    assert _heads_figure(Figure, rp.load_run(finished)) is None
    # Trial 0's stability rung records 2 layers x 3 heads; its last probe is the one drawn.
    grid = [[1.0, 2.0, 3.0], [4.0, 5.0, 60.0]]
    stability = finished / "trials/0/stability"
    stability.mkdir(parents=True, exist_ok=True)
    recs = [{"step": 10, "max_logit_per_head": [[0.0] * 3] * 2}, {"step": 20, "max_logit_per_head": grid},
            {"step": 21, "val_loss": 3.0}]
    (stability / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in recs) + "\n")
    run = rp.load_run(finished)
    assert head_logits(run.run_dir, run.trials[0]) == ("stability rung", 20, grid)
    fig = _heads_figure(Figure, run)
    panels = [ax for ax in fig.axes if ax.get_images()]
    # Rule: one heatmap per run with per-head values, layers down, heads across, their values.
    assert len(panels) == 1 and "(trial 0, stability rung step 20)" in panels[0].get_title()
    assert panels[0].get_images()[0].get_array().tolist() == grid
    files = rp.write_report(finished)
    assert files.plots["max_logit_heads"].read_bytes()[:8] == PNG
    assert "(plots/max_logit_heads.png)" in files.report.read_text()
