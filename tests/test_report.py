"""Tests for geosearch.report on hand-made studies (no training).

The ranking and its statistics are tested in test_ranking.py and test_stats.py; here the
report must render the search's ranking and verdict.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import optuna
import pytest
from optuna.distributions import CategoricalDistribution, FloatDistribution
from optuna.trial import TrialState, create_trial

from geosearch import report as rp
from geosearch.cli import main
from geosearch.errors import GeosearchError
from geosearch.search.ranking import rank_study
from geosearch.search.study import format_ranking, mask_url

optuna.logging.set_verbosity(optuna.logging.WARNING)

GEOS = ["stiefel", "dgram", "adamw", "euclidean"]
DISTS = {"geometry.attn": CategoricalDistribution(GEOS), "geometry.mlp": CategoricalDistribution(GEOS)}
TYPES = {"attn": ("attn_qkv", "attn_out"), "mlp": ("mlp_in", "mlp_out")}
PNG = b"\x89PNG\r\n\x1a\n"


def _assignment(attn: str, mlp: str) -> dict[str, str]:
    return {t: g for fam, g in (("attn", attn), ("mlp", mlp)) for t in TYPES[fam]}


def _metrics(steps: int, logit_growth: float, loss0: float, sigma: float) -> list[dict]:
    return [
        {
            "step": s,
            "train_loss": loss0 + 1 - s / steps,
            "val_loss": loss0 + 1 - s / steps,
            "step_ms": 10.0,
            "max_logit": 5.0 * logit_growth ** (s / 10),
            "sigma_max": {t: sigma * (1 + s / steps) for ts in TYPES.values() for t in ts},
        }
        for s in range(0, steps + 1, 10)
    ]


def add(
    study: optuna.Study,
    run_dir: Path,
    attn: str,
    mlp: str,
    losses: list[float] | None = None,
    *,
    state: TrialState = TrialState.COMPLETE,
    step_ms: float = 10.0,
    steps: int = 40,
    attrs: dict | None = None,
    params: dict | None = None,
    metrics: bool = True,
    seeds_dirs: bool = False,
) -> int:
    """Add one finished trial in the study.py layout, with its metrics.jsonl; returns its number."""
    number = len(study.trials)
    status = {TrialState.COMPLETE: "completed", TrialState.PRUNED: "unstable", TrialState.FAIL: "failed"}
    ua = {
        "status": status[state],
        "assignment": _assignment(attn, mlp),
        "budget_steps": steps,
        "mean_step_ms": step_ms,
        "tokens_per_s": 1000.0 * 2048 / step_ms,
        "trial_dir": f"trials/{number}",
    }
    if losses is not None:
        mean = sum(losses) / len(losses)
        std = (sum((v - mean) ** 2 for v in losses) / (len(losses) - 1)) ** 0.5 if len(losses) > 1 else None
        ua.update(val_losses=losses, val_loss_mean=mean, val_loss_std=std, seeds=list(range(len(losses))))
    ua.update(attrs or {})
    p = {"geometry.attn": attn, "geometry.mlp": mlp, **(params or {})}
    d = {**DISTS, **{k: FloatDistribution(1e-3, 1e-1, log=True) for k in (params or {})}}
    value = sum(losses) / len(losses) if (losses and state == TrialState.COMPLETE) else None
    inter = {ua.get("stop_step", steps): 9.0} if state == TrialState.PRUNED else {}
    study.add_trial(create_trial(params=p, distributions=d, value=value, state=state,
                                 user_attrs=ua, intermediate_values=inter))
    if metrics:
        last = ua.get("stop_step", steps)
        growth = 3.0 if attn == "dgram" else 1.1
        recs = _metrics(last, growth, losses[0] if losses else 5.0, 1.0 if attn != "dgram" else 2.0)
        dirs = [Path(f"trials/{number}/seed{s}") for s in range(2)] if seeds_dirs else [Path(f"trials/{number}")]
        for d_ in dirs:
            (run_dir / d_).mkdir(parents=True, exist_ok=True)
            (run_dir / d_ / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in recs) + "\n")
    return number


def new_study(run_dir: Path, name: str = "demo", space: dict | None = None) -> optuna.Study:
    run_dir.mkdir(parents=True, exist_ok=True)
    study = optuna.create_study(storage=f"sqlite:///{run_dir}/study.db", study_name=name)
    study.set_user_attr("space", {"pruner": {"max_logit": 500.0}} if space is None else space)
    study.set_user_attr("geosearch_version", "0.1.0")
    study.set_user_attr("proxy", {"model": "tiny", "steps": 40, "batch": 8})
    return study


@pytest.fixture
def finished(tmp_path: Path) -> Path:
    """A small finished study: 4 completed (3 seeds), 1 unstable, 1 failed."""
    run = tmp_path / "runs" / "demo"
    s = new_study(run)
    add(s, run, "stiefel", "dgram", [3.30, 3.32, 3.31], step_ms=16.0)
    add(s, run, "stiefel", "stiefel", [3.40, 3.42, 3.41], step_ms=16.0)
    add(s, run, "euclidean", "euclidean", [3.50, 3.52, 3.51], step_ms=13.0, seeds_dirs=True)
    add(s, run, "adamw", "adamw", [3.60, 3.62, 3.61], step_ms=10.0)
    add(s, run, "dgram", "dgram", state=TrialState.PRUNED,
        attrs={"stop_step": 20, "prune_reason": "max logit 1.2e+03 > 500 at step 20 (layer 0)"})
    add(s, run, "dgram", "stiefel", state=TrialState.FAIL, metrics=False,
        attrs={"fail_reason": "RuntimeError: CUDA out of memory"})
    return run


def _row(text: str, *cells: object) -> bool:
    """Whether a markdown table row holds these cells next to each other."""
    pattern = r"\|\s*" + r"\s*\|\s*".join(re.escape(str(c)) for c in cells) + r"\s*\|"
    return re.search(pattern, text) is not None


# --------------------------------------------------------------------------- the report
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
    assert _row(text, "1", 0, "attn=stiefel, mlp=dgram")
    assert _row(text, "4", 3, "attn=adamw, mlp=adamw")
    assert _row(text, 4, "attn=dgram, mlp=dgram", 20, "max logit 1.2e+03 > 500 at step 20 (layer 0)")
    assert _row(text, 5, "attn=dgram, mlp=stiefel", "RuntimeError: CUDA out of memory")
    # mean ± sample std over 3 seeds: 3.30, 3.32, 3.31 -> 3.31 ± 0.01
    assert _row(text, "attn=stiefel, mlp=dgram", "3.3100", "0.0100", 3)
    # clearly separated (Δ=0.1 ≫ Welch threshold t(4)·√2·0.01/√3 ≈ 0.023): a winner, not a tie
    assert "**Verdict:** winner: attn=stiefel, mlp=dgram (trial 0," in text
    assert "no single winner" not in text and "=1" not in text
    # threshold from the study's pruner settings; the dashboard paragraph is there
    assert "500 (from the study's pruner settings)" in text
    assert f"optuna-dashboard sqlite:///{finished.resolve()}/study.db" in text
    # the result names the unstable assignment too
    assert "Unstable (pruned): attn=dgram, mlp=dgram (trial 4, step 20)." in text


def test_pruned_trial_shows_reason_and_step_from_attrs_or_storage(tmp_path: Path) -> None:
    run = tmp_path / "r"
    s = new_study(run)
    add(s, run, "stiefel", "stiefel", [3.4])
    # no stop_step attr: the step comes from the last intermediate value the pruner saw
    n = add(s, run, "dgram", "dgram", state=TrialState.PRUNED, attrs={"prune_reason": "entropy collapse"})
    text = rp.write_report(run, plots=False).report.read_text()
    assert _row(text, n, "attn=dgram, mlp=dgram", 40, "entropy collapse")
    assert "Unstable trials (pruned)" in text


def test_logit_curve_falls_back_to_probe_history(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    run = tmp_path / "probe"
    s = new_study(run, space={})  # no pruner settings: LogitGrowthPruner's default threshold
    history = [{"step": 0, "max_logit": 4.0}, {"step": 10, "max_logit": 40.0}]
    add(s, run, "dgram", "dgram", [3.3], metrics=False, attrs={"probe_history": history})
    add(s, run, "stiefel", "dgram", [3.2], metrics=False)
    loaded = rp.load_run(run)
    assert rp._logit_series(loaded.trials[0]) == [([0.0, 10.0], [4.0, 40.0])]
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


def test_journal_storage_and_study_choice(tmp_path: Path) -> None:
    run = tmp_path / "j"
    run.mkdir()
    storage = optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(str(run / "journal.log")))
    for name in ("a", "b"):
        st = optuna.create_study(storage=storage, study_name=name)
        st.add_trial(create_trial(params={"geometry.attn": "stiefel"},
                                  distributions={"geometry.attn": DISTS["geometry.attn"]}, value=3.0))
    # two studies and no --study: the error lists them instead of guessing
    with pytest.raises(GeosearchError, match="pick one with --study; expected one of: a, b"):
        rp.load_run(run)
    loaded = rp.load_run(run, study_name="b")
    assert loaded.study_name == "b" and [t.label for t in loaded.trials] == ["attn=stiefel"]
    with pytest.raises(GeosearchError, match="no study 'c'"):
        rp.load_run(run, study_name="c")


def test_storage_errors_are_one_line_user_errors(finished: Path) -> None:
    (finished / "journal.log").write_text("")
    # both storages present: say so instead of guessing which one is current
    with pytest.raises(GeosearchError, match="both study.db and journal.log; pass --storage"):
        rp.load_run(finished)
    assert rp.load_run(finished, storage=f"sqlite:///{finished}/study.db").study_name == "demo"
    # a password in a storage URL never reaches the report or an error message
    assert mask_url("postgresql://me:s3cret@db:5432/x") == "postgresql://me:***@db:5432/x"
    assert mask_url("sqlite:////runs/a:b@c/study.db") == "sqlite:////runs/a:b@c/study.db"  # a path, no password


# --------------------------------------------------------------------------- ranking
def test_ranking_names_a_tie_not_a_winner(tmp_path: Path) -> None:
    run = tmp_path / "tie"
    s = new_study(run)
    add(s, run, "stiefel", "dgram", [3.30, 3.34, 3.32])
    add(s, run, "stiefel", "stiefel", [3.33, 3.32, 3.35])  # per seed +0.03, -0.02, +0.03
    add(s, run, "euclidean", "euclidean", [3.60, 3.61, 3.62])  # clearly worse
    # paired on the shared seeds 0-2: mean Δ 0.013 < t(2)·sd(Δ)/√3 = 4.30·0.029/√3 ≈ 0.072 (tie);
    # +0.30, +0.27, +0.30: 0.29 > 4.30·0.017/√3 ≈ 0.043 (separated)
    ranking = rank_study(rp.load_run(run).study)
    assert [r.versus_best for r in ranking.rows] == ["best", "tie", "separated"]
    assert ranking.tied == [0, 1]
    assert ranking.verdict.startswith("no single winner:")  # not "winner: ..."
    text = rp.write_report(run, plots=False).report.read_text()
    assert _row(text, "=1", 0) and _row(text, "=1", 1) and _row(text, "3", 2)
    # the report and the ranking printed after `geosearch search` give the same verdict
    cli_verdict = format_ranking(s).splitlines()[-1].removeprefix("verdict: ")
    assert cli_verdict == ranking.verdict and f"**Verdict:** {cli_verdict}." in text


def test_one_seed_each_names_no_winner(tmp_path: Path) -> None:
    run = tmp_path / "one"
    s = new_study(run)
    add(s, run, "stiefel", "dgram", [3.30])
    add(s, run, "stiefel", "stiefel", [3.90])  # val_loss_std is None, as study.py stores it
    ranking = rank_study(rp.load_run(run).study)
    # Δ = 0.6 is large, but one seed has no spread: no false winner
    assert [r.versus_best for r in ranking.rows] == ["best", "unknown"]
    assert "cannot be judged" in ranking.verdict and not ranking.verdict.startswith("winner:")
    text = rp.write_report(run, plots=False).report.read_text()
    assert "1 seed, spread unknown" in text and ranking.verdict in text
    assert _row(text, "2", 1, "attn=stiefel, mlp=stiefel", "3.9000", "unknown", 1)


def test_bookkeeping_trials_are_hidden_and_interrupted_ones_named(tmp_path: Path) -> None:
    run = tmp_path / "book"
    s = new_study(run)
    add(s, run, "stiefel", "dgram", [3.3, 3.31])
    # study.py's FAIL trials that never trained: a raced grid point, a repeated proposal
    add(s, run, "stiefel", "dgram", state=TrialState.FAIL, metrics=False,
        attrs={"status": "duplicate", "fail_reason": "same point as trial 0", "duplicate_of": 0})
    add(s, run, "dgram", "dgram", state=TrialState.FAIL, metrics=False,
        attrs={"status": "skipped", "fail_reason": "the budget of 1 trials was taken by other workers"})
    # a worker killed mid-trial (status left "running"), and a Ctrl-C (status "interrupted")
    killed = add(s, run, "dgram", "stiefel", state=TrialState.FAIL, attrs={
        "status": "running", "fail_reason": "interrupted before it finished (its worker was killed or crashed)"})
    stopped = add(s, run, "adamw", "adamw", state=TrialState.FAIL, metrics=False, attrs={
        "status": "interrupted", "fail_reason": "interrupted (Ctrl-C); queued again"})
    failed = add(s, run, "euclidean", "euclidean", state=TrialState.FAIL, metrics=False,
                 attrs={"fail_reason": "RuntimeError: boom"})
    loaded = rp.load_run(run)
    assert {t.number: t.state for t in loaded.trials} == {
        0: "completed", killed: "interrupted", stopped: "interrupted", failed: "failed"}
    assert loaded.not_run == 2
    text = rp.write_report(run, plots=False).report.read_text()
    assert "same point as trial 0" not in text and "taken by other workers" not in text
    assert "- trials: 4 (1 completed, 0 unstable, 1 failed, 2 interrupted)" in text
    assert "not shown: 2 duplicate or skipped trials" in text
    assert _row(text, killed, "attn=dgram, mlp=stiefel", "interrupted",
                "interrupted before it finished (its worker was killed or crashed)")
    assert _row(text, stopped, "attn=adamw, mlp=adamw", "interrupted", "interrupted (Ctrl-C); queued again")
    # only the real failure is in the failed table (and counted as failed for stability)
    assert _row(text, failed, "attn=euclidean, mlp=euclidean", "RuntimeError: boom")
    assert {(r["value"], r["failed"]) for r in rp.stability_table(loaded.trials) if r["param"] == "attn"} \
        == {("stiefel", 0), ("euclidean", 1)}


# --------------------------------------------------------------------------- importance
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


# --------------------------------------------------------------------------- cost and Pareto
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
    pts, front = rp._pareto_trials(run.trials)
    assert [pts[i].number for i in front] == [3, 2, 0]


def test_cost_without_baseline_uses_fastest_and_says_so(tmp_path: Path) -> None:
    run = tmp_path / "nb"
    s = new_study(run)
    add(s, run, "stiefel", "dgram", [3.3], step_ms=20.0)
    add(s, run, "stiefel", "stiefel", [3.4], step_ms=16.0)
    cost = rp.cost_table(rp.load_run(run).trials)
    assert "fastest trial" in cost.baseline and "no all-adamw or all-euclidean baseline" in cost.baseline
    assert {c.trial.number: c.step_ratio for c in cost.rows} == pytest.approx({1: 1.0, 0: 1.25})


# --------------------------------------------------------------------------- CLI
def test_cli_report_prints_where_files_are(finished: Path, capsys) -> None:
    assert main(["report", str(finished), "--no-plots"]) == 0
    out = capsys.readouterr().out
    assert f"report: {finished / 'report.md'}" in out


def test_cli_missing_dir_is_one_line_exit_2(tmp_path: Path, capsys) -> None:
    code = main(["report", str(tmp_path / "nope")])
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1 and "nope: no such run directory" in err and "Traceback" not in err


def test_cli_dir_without_storage(tmp_path: Path, capsys) -> None:
    assert main(["report", str(tmp_path)]) == 2
    assert "no study storage here (study.db or journal.log)" in capsys.readouterr().err
