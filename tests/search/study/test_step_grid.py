"""A space with a step grid (``hyperparams.step_grid``) searched with the fake trainer: the
two answers of its verdict (at the shared step; each assignment at its own best step), an
assignment unstable at the shared step and stable at its own, the main effects side by
side, the exported step, and the target that follows each point's step."""

from __future__ import annotations

import pytest
from _search_helpers import FakeTrain, TINY_PROXY, make_space, search, trials_of, use_train

from geosearch.assignment import load_assignment
from geosearch.search.records import STEP_FACTOR, TARGET_SUM_ETA
from geosearch.search.runtime.storage import open_run_study
from geosearch.search.stats.study_ranking import rank_study

SHARED = 0.02
GRID = [0.5, 1, 2]
FOUR = {"attn": ["stiefel", "dgram"], "mlp": ["stiefel", "dgram"]}


def _loss(key, seed, config):
    """At the shared step Stiefel attention is ahead by 0.1; DGram attention is best at half
    the step (0.3 lower), Stiefel attention at twice it; DGram MLP 0.02 ahead everywhere;
    a seed moves every run alike, with a small jitter so that the noise is not zero."""
    f = round(config.spectral_lr / SHARED, 6)
    attn = {("attn=stiefel", 1): 3.0, ("attn=stiefel", 0.5): 3.05, ("attn=stiefel", 2): 2.98,
            ("attn=dgram", 1): 3.1, ("attn=dgram", 0.5): 2.8, ("attn=dgram", 2): 3.3}[key.split(",")[0], f]
    mlp = 0.0 if key.endswith("mlp=dgram") else 0.02
    jitter = 0.002 * ((len(key) * 7 + seed * 3 + int(f * 10)) % 5 - 2)
    return attn + mlp + 0.05 * seed + jitter


def _logits(key, seed, config):
    """DGram attention with Stiefel MLP blows up at the shared step and above."""
    big = key == "attn=dgram,mlp=stiefel" and config.spectral_lr >= SHARED * (1 - 1e-9)
    return 5e3 if big else 10.0


def _grid_space(geometries=FOUR, **extra):
    return make_space(geometries, repeats=2, hyperparams={"step_grid": GRID, "step_halving": False},
                      proxy={**TINY_PROXY, "spectral_lr": SHARED}, **extra)


@pytest.mark.slow
def test_two_answers_side_by_side_and_the_export_carries_the_own_step(monkeypatch, tmp_path):
    import torch

    from geosearch.build import build_optimizer
    from geosearch.models.model import GPT, make_config

    fake = use_train(monkeypatch, FakeTrain(losses=_loss, logits=_logits, with_config=True))
    space = _grid_space()
    search(space, tmp_path)
    # Rule: an exhaustive grid trains every assignment at every factor, each seed at
    # spectral_lr = the shared step × the factor.
    trials = [t for t in trials_of(tmp_path) if STEP_FACTOR in t.params]
    assert len(trials) == 12
    assert sorted({round(c.spectral_lr, 6) for c in fake.configs}) == [0.01, 0.02, 0.04]

    ranking = rank_study(open_run_study(tmp_path / "runs" / "t"))
    answers = ranking.steps
    assert answers is not None and answers.shared_step == SHARED
    # Rule: the shared-step answer ranks the points at factor 1 only, as without a grid:
    # Stiefel attention wins there (all-DGram's attention at 0.02: 3.1).
    shared_top = answers.shared.rows[0]
    assert answers.factors[shared_top.number] == 1 and shared_top.label == "attn=stiefel, mlp=dgram"
    assert {answers.factors[r.number] for r in answers.shared.rows} == {1.0}
    assert not answers.at_the_end(shared_top.number)
    # Rule: each assignment at its own best step: one row per assignment, at the factor of
    # its lowest mean; DGram attention at half the step wins.
    own = {r.label: answers.factors[r.number] for r in ranking.rows}
    assert own == {"attn=dgram, mlp=dgram at step 0.01": 0.5, "attn=dgram, mlp=stiefel at step 0.01": 0.5,
                   "attn=stiefel, mlp=dgram at step 0.04": 2.0, "attn=stiefel, mlp=stiefel at step 0.04": 2.0}
    assert ranking.rows[0].label.startswith("attn=dgram, mlp=dgram")
    # Rule: the verdict gives both answers, the own steps, the unstable-at-shared one, the
    # main effects side by side (attention's reverses, the MLP's survives), and what is exported.
    v = ranking.verdict
    assert v.startswith("at the shared step 0.02: winner: attn=stiefel, mlp=dgram")
    assert "; each assignment at its own best step: winner: attn=dgram, mlp=dgram at step 0.01" in v
    unstable_trial = next(t.number for t in trials_of(tmp_path)
                          if t.params.get(STEP_FACTOR) == 1 and t.params["geometry.attn"] == "dgram"
                          and t.params["geometry.mlp"] == "stiefel")
    assert (f"attn=dgram, mlp=stiefel: unstable at the shared step (trial {unstable_trial}), stable "
            "at its own (step 0.01, trial") in v
    # every own best here is at the grid's end: not bracketed, and said so
    assert "best at the grid's end, so not bracketed" in v
    assert "attention's geometry reverses with the tuning: at the shared step, stiefel better than dgram" in v
    assert "at each one's own best step, dgram better than stiefel by" in v
    assert "the MLP's geometry survives the tuning" in v
    assert "exported: the answer at each assignment's own best step" in v
    # the effects are main_effects' own (intervals from the blocked fit), not restated
    effects = {f: (s, o) for f, s, o in answers.effects}
    assert effects["attn"][1].better == "dgram" and effects["attn"][0].better == "stiefel"
    assert effects["attn"][1].blocked and effects["attn"][1].decisive

    # Rule: the export is the own-step winner, its step in the settings; the file alone
    # rebuilds an optimizer whose manifold groups step at it.
    best = load_assignment(tmp_path / "runs" / "t" / "best_assignment.yaml")
    assert best.provenance["trial"] == ranking.rows[0].number
    assert best.geometry == {"attn": "dgram", "mlp": "dgram"}
    assert best.settings["spectral_lr"] == pytest.approx(0.01)
    assert best.provenance["step"] == {"spectral_lr": pytest.approx(0.01), "factor": 0.5,
                                       "shared_spectral_lr": SHARED, "grid": (0.5, 1.0, 2.0),
                                       "answer": "each assignment at its own best step"}
    stored = best.provenance["verdict"]  # the fields, not the prose
    assert stored["trial"] == ranking.rows[0].number
    assert stored["kind"] in ("winner", "tie", "unknown") and "sentence" not in stored
    torch.manual_seed(0)
    opt = build_optimizer(GPT(make_config("tiny", vocab_size=256)), best, verbose=False)
    manifold = [g for g in opt.param_groups if g.get("geometry") in ("dgram", "stiefel")]
    assert manifold and all(g["lr"] == pytest.approx(0.01) for g in manifold)

    # Rule: report.md gives the same verdict, both answers, and says at which step its main
    # effects are.
    from geosearch.report import write_report

    write_report(tmp_path / "runs" / "t", plots=False)
    report = (tmp_path / "runs" / "t" / "report.md").read_text(encoding="utf-8")
    assert "at the shared step 0.02: winner" in report and "each assignment at its own best step" in report
    assert "within seeds) at each assignment's own best step" in report


@pytest.mark.slow
def test_without_a_grid_the_ranking_is_unchanged(fake, tmp_path):
    # Rule: a space without a step grid has one answer, no step parts in its verdict.
    search(make_space(FOUR, repeats=2), tmp_path)
    ranking = rank_study(open_run_study(tmp_path / "runs" / "t"))
    assert ranking.steps is None and "shared step" not in ranking.verdict


@pytest.mark.slow
def test_the_target_follows_each_points_step(monkeypatch, tmp_path):
    fake = use_train(monkeypatch, FakeTrain(with_config=True))
    space = _grid_space({"attn": ["stiefel"], "mlp": ["stiefel"]},
                        ladder={"stability_steps": 5}, target={"steps": 40})
    search(space, tmp_path)
    base = [c for c in fake.configs if c.steps == 5]  # the stability rung's runs, one a point
    # Rule: the stability rung trains at η' × the point's factor: it ends at the Σ η² of the
    # user's run at that factor of the target's step (its clock's ratios are unchanged).
    eta = min(c.spectral_lr for c in base)
    assert sorted(round(c.spectral_lr / eta, 6) for c in base) == [1.0, 2.0, 4.0]
    # Rule: the forecast's target Σ η is the user's run at the point's own step.
    sums = {t.params[STEP_FACTOR]: t.user_attrs[TARGET_SUM_ETA] for t in trials_of(tmp_path)}
    assert sums[0.5] == pytest.approx(sums[1.0] / 2) and sums[2.0] == pytest.approx(2 * sums[1.0])
