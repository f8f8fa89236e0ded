"""Tests for geosearch.report.markdown on hand-made studies (no training).

The ranking statistics themselves (Score, the Welch t-test) are tested in test_study.py;
here the report must render the search's ranking and verdict.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from _report_study import add, new_study, row

from geosearch import report as rp
from geosearch.cli import main
from geosearch.search.stats.study_ranking import rank_study
from geosearch.search.stats.track import track_record
from geosearch.search.study.export import format_ranking


@pytest.mark.slow
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
    assert row(text, "=1", 0) and row(text, "=1", 1) and row(text, "3", 2)
    # the report and the ranking printed after `geosearch search` give the same verdict
    cli_verdict = next(ln for ln in format_ranking(s).splitlines() if ln.startswith("verdict: "))
    assert cli_verdict.startswith("verdict: no single winner: attn=stiefel, mlp=dgram (trial 0)")
    assert "trial 1 within noise" in cli_verdict and f"**Verdict:** {ranking.verdict}." in text
    # beside the verdict, the method's own record against long runs, with its chance rates
    w = track_record()["search"]["winner"]
    assert "How far to trust it: in the benchmark the default search named the 2,000-step runs' best " \
           f"at {w['hits']} of {w['of']} settings" in text
    assert f"chance {w['chance']:.2f}, 1 in the assignments each search kept" in text
    # the dashboard command a user copies shows the trials' files too
    assert f"optuna-dashboard sqlite:///{run}/study.db --artifact-dir {run}/artifacts" in text


def test_one_seed_each_names_no_winner(tmp_path: Path) -> None:
    run = tmp_path / "one"
    s = new_study(run)
    add(s, run, "stiefel", "dgram", [3.30])
    add(s, run, "stiefel", "stiefel", [3.90])  # one seed: no spread
    ranking = rank_study(rp.load_run(run).study)
    # Δ = 0.6 is large, but one seed has no spread: no false winner
    assert [r.versus_best for r in ranking.rows] == ["best", "unknown"]
    assert "cannot be judged" in ranking.verdict and not ranking.verdict.startswith("winner:")
    text = rp.write_report(run, plots=False).report.read_text()
    assert "1 seed, spread unknown" in text and ranking.verdict in text
    assert row(text, "2", 1, "attn=stiefel, mlp=stiefel", "3.9000", "unknown", 1)


def test_cli_report_prints_where_files_are(finished: Path, capsys) -> None:
    assert main(["report", str(finished), "--no-plots"]) == 0
    out = capsys.readouterr().out
    assert f"report: {finished / 'report.md'}" in out


def test_horizon_section_reads_the_ladder(finished: Path) -> None:
    text = rp.write_report(finished, plots=False).report.read_text()
    section = text.split("## Horizon")[1].split("\n## ")[0]
    # Rule: the section states the target and its Σ η.
    assert "your target: 160 steps at spectral step 0.02 on `tiny`, a cumulative spectral step Σ η of 1.8" in section
    # Rule: one row per ranked assignment, its mean loss at each rung (rung 0: +0.5, +0.3 more
    # with stiefel attention, in the fixture).
    assert row(section, "attn=stiefel, mlp=dgram", "completed", "4.1100", "3.3100")
    assert row(section, "attn=euclidean, mlp=euclidean", "completed", "4.0100", "3.5100")
    # Rule: the reading names the lead change and the verdict is marked, here and in the result.
    assert ("the lead changed between Σ η 0.45 and 1.8 (attn=euclidean, mlp=euclidean -> "
            "attn=stiefel, mlp=dgram); your target is 1.8") in section
    assert "**Not yet stable: the lead changed between Σ η 0.45 and 1.8; your target is Σ η 1.8.**" in section
    verdict = next(line for line in text.splitlines() if line.startswith("**Verdict:**"))
    assert verdict.endswith("(not yet stable: the lead changed between Σ η 0.45 and 1.8; your target is Σ η 1.8).")


@pytest.mark.slow
def test_a_study_without_target_says_so(tmp_path: Path) -> None:
    run = tmp_path / "old"
    s = new_study(run)
    add(s, run, "stiefel", "dgram", [3.3])
    text = rp.write_report(run, plots=False).report.read_text()
    # Rule: a study from before targets has no reading, and the report says why.
    assert "This study records no target (it was made before targets)." in text


@pytest.mark.slow
def test_report_shows_baselines_and_merged_seeds(monkeypatch, tmp_path: Path) -> None:
    from _search_helpers import FakeTrain, make_space, search, use_train

    # euclidean attention 0.05 better than the Muon baseline in each seed; oblique a tie with it
    loss = {"attn=euclidean,mlp=oblique": 3.0, "attn=oblique,mlp=oblique": 3.005,
            "attn=adamw,mlp=adamw": 3.2, "attn=euclidean,mlp=euclidean": 3.05}
    noise = [0.0, 0.02, -0.01, 0.01]
    use_train(monkeypatch, FakeTrain(losses=lambda key, seed: loss[key] + noise[seed] + (
        0.004 * seed if "attn=oblique" in key else 0.0)))
    search(make_space({"attn": ["euclidean", "oblique"], "mlp": ["oblique"]}, repeats=2, max_repeats=3,
                      baselines=["adamw", "muon"]), tmp_path)
    run = rp.load_run(tmp_path / "runs" / "t")
    assert sorted(b.label for b in run.baselines) == ["baseline adamw", "baseline muon"]
    assert len(run.trials) == 2 and run.seed_trials == 2  # seeds merged, baselines apart
    assert all(t.loss.n == 3 for t in run.trials)
    text = rp.write_report(run.run_dir, plots=False).report.read_text()
    section = text.split("## Baselines")[1].split("\n## ")[0]
    # Rule: per baseline, each assignment's Δ (negative = better) with its interval and test.
    assert "**muon** (trial" in section and "**adamw** (trial" in section
    assert row(section, "attn=euclidean, mlp=oblique", "-0.0500", "0.0000", "paired", "1.00")
    assert row(section, "attn=euclidean, mlp=oblique", "-0.2000", "0.0000", "paired", "1.00")
    # Rule: each baseline says how it trained (the report is where its Δ is read).
    assert "**muon** (trial" in section and "Trained as Muon: spectral step 0.02 × √max(1, fan_out/fan_in) " \
        "(muon_scale keller), msign 5 × polar_express, no weight decay." in section
    assert "Trained as AdamW: lr 0.0006, weight decay 0.1." in section
    # Rule: baselines are not ranked, and the verdict says how many seeds each contender got.
    ranking = text.split("## Ranking")[1].split("\n## ")[0]
    assert "baseline" not in ranking
    assert "adaptive seeds (up to 3 per assignment) stopped" in text and "- adaptive seeds: 2 seed trials" in text


@pytest.mark.slow
def test_stability_section_forecasts_each_completed_run(tmp_path: Path) -> None:
    run = tmp_path / "runs" / "st"
    s = new_study(run, ladder=True)
    # a run whose max logit grows as 1·(1 + Σ η)² to Σ η 1.8, and one that holds at 3
    grow = [{"step": k * 4, "max_logit": (1 + 0.18 * k) ** 2, "sum_eta": 0.18 * k} for k in range(1, 11)]
    flat = [dict(r, max_logit=3.0) for r in grow]
    target = {"target_sum_eta": 5.4, "logit_scale": 8.0, "target_logit_scale": 8.0}
    add(s, run, "dgram", "dgram", [3.3], attrs={"probe_history": grow, **target})
    add(s, run, "stiefel", "stiefel", [3.4], attrs={"probe_history": flat, **target})
    written = rp.write_report(run, plots=True)
    assert (run / "plots" / "horizon.png").is_file()  # with each forecast drawn at the target
    text = written.report.read_text()
    section = text.split("## Stability at your target")[1].split("\n## ")[0]
    # Rule: one row a completed run: its last max logit and Σ η, the forecast at the target
    # ((1 + 5.4)² = 41, 3x past the run: acted on), the threshold 10 × 8 and the verdict.
    assert row(section, 0, "attn=dgram, mlp=dgram", "7.84 (1.8)", "41 [41, 41]", "80", "below", "×3")
    assert row(section, 1, "attn=stiefel, mlp=stiefel", "3 (1.8)", "3 [3, 3]", "80", "below", "×3")


def test_no_bold_on_a_factor_whose_main_effect_is_within_noise(tmp_path: Path) -> None:
    run = tmp_path / "noisy"
    s = new_study(run)
    # attention: stiefel ahead by 0.05 on average, but +0.15 in seed 0 and -0.05 in seed 1;
    # the MLP makes no difference at all. PED-ANOVA's top half is both attn=stiefel points.
    for mlp, shift in (("stiefel", 0.0), ("dgram", 0.001)):
        add(s, run, "stiefel", mlp, [3.00 + shift, 3.10 + shift])
        add(s, run, "dgram", mlp, [3.15 + shift, 3.05 + shift])
    imp = rp.geometry_importances(s)
    assert imp.top == "geometry.attn" and imp.decisive("geometry.attn") is False
    effect = next(e for e in rank_study(s).effects if e.factor == "attn")
    # the mean of the per-seed differences (0.15, -0.05) in both pairs is 0.05, and the
    # seeds disagree by 0.2: its 95% interval covers zero
    assert effect.effect == pytest.approx(0.05) and effect.half_width > 0.05 and not effect.decisive
    text = rp.write_report(run, plots=False).report.read_text()
    section = text.split("## Which module type's geometry matters most")[1].split("\n## ")[0]
    # Rule: never bold a factor the main effects call within noise; say so beside it, with
    # the main effect the Result section shows.
    assert "**" not in section and "Most important" not in section
    assert ("Largest importance: attn, not shown to matter most: its main effect is within seed "
            f"noise ({effect.text()}).") in section
    assert effect.text().startswith("attention's geometry: stiefel and dgram within noise: stiefel ahead by 0.0500")
    assert f"- {effect.text()}" in text.split("## Result")[1].split("\n## ")[0]
    assert row(section, "attn", "geometry.attn", f"{imp.values['geometry.attn']:.3f}", "within noise")


@pytest.mark.slow
def test_no_bold_with_one_seed_or_no_matched_pair(tmp_path: Path) -> None:
    run = tmp_path / "one"
    s = new_study(run)
    for attn, mlp, loss in (("stiefel", "stiefel", 3.0), ("stiefel", "dgram", 3.1),
                            ("dgram", "stiefel", 3.5), ("dgram", "dgram", 3.6)):
        add(s, run, attn, mlp, [loss], metrics=False)
    text = rp.write_report(run, plots=False).report.read_text()
    # one seed a point: attention is 0.5 ahead, but there is no spread to judge it by
    assert "Largest importance: attn, not shown to matter most: its main effect has no spread to judge by" in text
    imp = rp.geometry_importances(s)
    assert imp.top == "geometry.attn" and imp.decisive("geometry.attn") is False
    assert "**attn**" not in text
    assert row(text, "attn", "geometry.attn", f"{imp.values['geometry.attn']:.3f}", "spread unknown")
    # no two points differ only in the attention's geometry: no main effect at all
    run = tmp_path / "diag"
    s = new_study(run)
    add(s, run, "stiefel", "stiefel", [3.0, 3.01])
    add(s, run, "dgram", "dgram", [3.5, 3.52])
    add(s, run, "euclidean", "euclidean", [3.6, 3.59])
    text = rp.write_report(run, plots=False).report.read_text()
    section = text.split("## Which module type's geometry matters most")[1].split("\n## ")[0]
    assert "**" not in section and "no two assignments differ only in it" in section
    assert "no matched pair" in section
