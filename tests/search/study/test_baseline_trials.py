"""Tests of geosearch.search.study.baseline_trials: baselines trained beside the points,
never counted, never exported, compared with every assignment (Δ loss with its interval,
ms/step ratio)."""

from __future__ import annotations

import dataclasses

import optuna
import pytest
from _search_helpers import FakeTrain, make_space, search, trials_of, use_train
from optuna.trial import TrialState

from geosearch.util.errors import ConfigError
from geosearch.search.study.baseline_trials import baseline_table
from geosearch.search.study.export import format_ranking
from geosearch.search.study.queue import done_count
from geosearch.search.records import BASELINE
from geosearch.search.study.export import export_best
from geosearch.search.runtime.storage import open_run_study
from geosearch.search.space.plan import plan_study

optuna.logging.set_verbosity(optuna.logging.WARNING)

GRID = {"attn": ["euclidean", "oblique"], "mlp": ["oblique"]}
LOSS = {"attn=euclidean,mlp=oblique": 3.0, "attn=oblique,mlp=oblique": 3.2,
        "attn=adamw,mlp=adamw": 3.1, "attn=euclidean,mlp=euclidean": 3.05}
STEP_MS = {"attn=adamw,mlp=adamw": 1.0, "attn=euclidean,mlp=euclidean": 2.0}


def timed(fake):
    """``fake`` with a step time per run: 1 ms AdamW, 2 ms Muon, 4 ms the manifolds."""
    def run(config, assignment, **kw):
        g = assignment.resolve()
        result = fake(config, assignment, **kw)
        return dataclasses.replace(result, mean_step_ms=STEP_MS.get(f"attn={g['attn_qkv']},mlp={g['mlp_in']}", 4.0))
    return run


def losses(key, seed, *config):
    return LOSS[key] + 0.01 * seed + (0.003 if seed == 1 and "oblique" in key else 0.0)


@pytest.mark.slow
@pytest.mark.parametrize("sampler", ["grid", "tpe"])
def test_baselines_are_trained_not_counted_not_exported_and_compared(monkeypatch, tmp_path, sampler):
    f = FakeTrain(losses=losses, with_config=True)
    use_train(monkeypatch, timed(f))
    extra = {"budget": {"trials": 2}, "sampler": {"type": "tpe", "seed": 0}} if sampler == "tpe" else {}
    space = make_space(GRID, repeats=2, baselines=["adamw", "muon"], target={"steps": 40},
                       ladder={"rungs": 2, "max_steps": 20}, **extra)
    rungs = plan_study(space).rungs
    out = search(space, tmp_path)
    trials = trials_of(tmp_path)
    base = {t.user_attrs[BASELINE]: t for t in trials if BASELINE in t.user_attrs}
    assert set(base) == {"adamw", "muon"} and all(t.state == TrialState.COMPLETE for t in base.values())
    assert base["adamw"].params == {} and base["adamw"].user_attrs["assignment"]["attn_qkv"] == "adamw"
    # AdamW at rung 0 only, Muon at every rung, each with the study's seeds
    adamw_runs = [c for c, call in zip(f.configs, f.calls) if call[0] == "attn=adamw,mlp=adamw"]
    assert [c.steps for c in adamw_runs] == [rungs[0].steps] * 2
    assert [c.spectral_lr for c in adamw_runs] == [rungs[0].spectral_lr] * 2
    assert base["adamw"].user_attrs["rung_indices"] == [0]
    assert base["muon"].user_attrs["rung_indices"] == [0, 1]
    assert len([c for c in f.calls if c[0] == "attn=euclidean,mlp=euclidean"]) == 2 * len(rungs)
    # never counted, never ranked, never exported
    study = open_run_study(tmp_path / "runs" / "t")
    assert done_count(study) == 2 and len(out.ranking.rows) == 2
    assert {r.number for r in out.ranking.rows}.isdisjoint(t.number for t in base.values())
    assert "attn=euclidean" in export_best(tmp_path / "runs" / "t")[0].read_text()
    # the table: Δ = assignment - baseline at the baseline's rung, paired on seeds, and ms ratio
    table = baseline_table(study)
    best = next(r for r in table.rows["muon"] if r.label.startswith("attn=euclidean"))
    assert best.delta == pytest.approx(3.0 - 3.05 + 0.0015) and best.test == "paired"
    # every ms/step ratio is to the one cost baseline (AdamW), in each baseline's rows alike
    assert best.step_ratio == pytest.approx(4.0) and table.cost_to == "AdamW"
    worse = next(r for r in table.rows["adamw"] if r.label.startswith("attn=oblique"))
    assert worse.delta == pytest.approx(3.2 - 3.1 + 0.0015) and worse.interval is not None
    assert worse.step_ratio == pytest.approx(4.0) and table.baselines["adamw"]["rung"] == 0
    # Rule: each baseline is described at the rung it is compared at (Muon: the top rung's step).
    assert table.baselines["muon"]["trained"].startswith(f"Muon: spectral step {rungs[-1].spectral_lr:g} ×")
    text = format_ranking(study, details=True)
    assert "baselines (reported, never exported" in text and "muon (trial" in text
    assert f"Δ {best.text()}  4.00x ms/step" in text and "ms/step ratio to AdamW" in text


def test_bogus_baseline_is_one_line_naming_the_key_and_the_allowed_values():
    with pytest.raises(ConfigError) as e:
        make_space(baselines=["bogus"])
    assert "\n" not in str(e.value) and "baselines" in str(e.value)
    assert "adamw, muon, muon_qkclip" in str(e.value) and "'bogus'" in str(e.value)


@pytest.mark.slow
def test_muon_qkclip_trains_with_kimi_tau(monkeypatch, tmp_path):
    f = use_train(monkeypatch, FakeTrain(losses=lambda key, seed: 3.0))
    search(make_space(GRID, baselines=["muon_qkclip"]), tmp_path)
    clipped = [c for c, call in zip(f.configs, f.calls) if call[0] == "attn=euclidean,mlp=euclidean"]
    assert [c.qk_clip for c in clipped] == [100.0]
    assert all(c.qk_clip is None for c, call in zip(f.configs, f.calls) if call[0] != "attn=euclidean,mlp=euclidean")


@pytest.mark.slow
def test_each_baseline_says_the_step_and_muon_convention_it_trained_with(monkeypatch, tmp_path):
    f = use_train(monkeypatch, FakeTrain(losses=lambda key, seed: 3.0))
    proxy = {**make_space().to_dict()["proxy"], "spectral_lr": 0.03,
             "optimizer_args": {"muon_scale": "none", "ns_steps": 10}}
    search(make_space(GRID, baselines=["adamw", "muon"], proxy=proxy), tmp_path)
    muon_runs = [c for c, call in zip(f.configs, f.calls) if call[0] == "attn=euclidean,mlp=euclidean"]
    # Rule: the Muon baseline trains with the space's optimizer settings (its shape convention too).
    assert muon_runs and all(c.optimizer_args["muon_scale"] == "none" for c in muon_runs)
    study = open_run_study(tmp_path / "runs" / "t")
    table = baseline_table(study)
    # Rule: the table says how each baseline trained: the step, Muon's scale convention and msign.
    assert table.baselines["muon"]["trained"] == (
        "Muon: spectral step 0.03 with no shape scale (muon_scale none), msign 10 × polar_express, "
        "no weight decay")
    assert table.baselines["adamw"]["trained"].startswith(f"AdamW: lr {proxy['lr']:g}")
    details = format_ranking(study, details=True)
    assert "    trained as Muon: spectral step 0.03 with no shape scale" in details
