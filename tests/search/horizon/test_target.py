"""Tests of geosearch.search.horizon.target (read through the study plan,
geosearch.search.space.plan): the target and the Σ η ladder, from the space to the export,
with the trial loop's rungs (a fake trainer, and the tiny proxy for real once)."""

from __future__ import annotations

import io
import math

import optuna
import pytest
import yaml
from _search_helpers import TINY_PROXY, FakeTrain, make_space, search, trials_of, use_train
from _spaces import problems, space
from optuna.trial import TrialState

from geosearch.assignment import load_assignment
from geosearch.cli import build_parser
from geosearch.util.errors import ConfigError
from geosearch.search.horizon.forecast import schedule_sum_eta, schedule_sum_eta2
from geosearch.search.space.reader import SearchSpaceError
from geosearch.search.space.spec import apply_overrides, load_space
from geosearch.search.records import read_probes_file, read_rung_probes
from geosearch.search.runtime.storage import open_run_study
from geosearch.search.study.export import format_ranking
from geosearch.search.study.run import run_search
from geosearch.search.horizon.reading import horizon_note, study_reading
from geosearch.search.horizon.scale import model_logit_scale
from geosearch.search.space.plan import plan_study

optuna.logging.set_verbosity(optuna.logging.WARNING)


def ladder_space(rungs=2, target_steps=40, ladder=None, target_lr=None, **extra):
    """The tiny test space with a target 4× the proxy's 10 steps and a ladder towards it,
    whose rungs may step up to 10× the proxy's 0.02 (the default takes more steps instead:
    ``own_step_space``)."""
    return make_space(target={"steps": target_steps, "spectral_lr": target_lr},
                      ladder={"rungs": rungs, "max_spectral_lr": 0.2, **(ladder or {})}, **extra)


def own_step_space(rungs=2, max_steps=20, **extra):
    """The tiny test space, target 40 steps, with the default ladder: the proxy's own step,
    at most ``max_steps`` steps a rung."""
    return make_space(target={"steps": 40}, ladder={"rungs": rungs, "max_steps": max_steps}, **extra)


# --------------------------------------------------------------------------- the sections
def test_target_and_rungs_resolve_against_the_proxy():
    s = ladder_space(rungs=3)
    t = plan_study(s).target
    # Rule: the target's Σ η is its own schedule's (the proxy's shape, its own length).
    assert (t.steps, t.spectral_lr, t.model) == (40, 0.02, "tiny")
    assert t.sum_eta == pytest.approx(schedule_sum_eta(40, steps=40, peak=0.02))
    rungs = list(plan_study(s).rungs)
    # Rule: rung 0 is the proxy run; the rungs grow evenly in log Σ η up to the target's.
    assert (rungs[0].steps, rungs[0].spectral_lr) == (10, 0.02)
    assert rungs[0].sum_eta == pytest.approx(schedule_sum_eta(10, steps=10, peak=0.02))
    assert [r.steps for r in rungs] == [10, 10, 10] and rungs[-1].sum_eta == pytest.approx(t.sum_eta)
    ratios = [b.sum_eta / a.sum_eta for a, b in zip(rungs, rungs[1:])]
    assert ratios[0] == pytest.approx(ratios[1])
    # Rule: an explicit warmup keeps its share of the run (4 of 10 steps -> 16 of 40).
    warm = make_space(proxy={**TINY_PROXY, "warmup_steps": 4}, target={"steps": 40})
    assert plan_study(warm).target.sum_eta == pytest.approx(
        schedule_sum_eta(40, steps=40, peak=0.02, warmup_steps=16))
    # Rule: without a target section the target is the proxy run, and one rung is planned.
    plain = make_space(ladder={"rungs": 3})
    assert plan_study(plain).target.sum_eta == pytest.approx(rungs[0].sum_eta)
    assert len(plan_study(plain).rungs) == 1


def test_default_ladder_takes_more_steps_never_a_larger_step():
    s = own_step_space(rungs=3, max_steps=20)
    rungs, target = list(plan_study(s).rungs), plan_study(s).target.sum_eta
    # Rule: every rung steps at the proxy's 0.02; the rungs grow by steps, the top one at
    # max_steps, short of the target (40 steps), and it says where it stopped.
    assert [r.spectral_lr for r in rungs] == [0.02] * len(rungs) and len(rungs) >= 2
    assert [r.steps for r in rungs] == sorted({r.steps for r in rungs}) and rungs[-1].steps == 20
    assert rungs[-1].sum_eta == pytest.approx(schedule_sum_eta(20, steps=20, peak=0.02))
    assert rungs[-1].sum_eta < target
    assert f"ladder: {len(rungs)} rungs at Σ η" in plan_study(s).header_lines()[0]
    # Rule: with max_steps at the proxy's (its default) nothing lies beyond rung 0, and the
    # header names the limit to raise rather than ladder.rungs.
    flat = make_space(target={"steps": 40}, ladder={"rungs": 2})
    assert len(plan_study(flat).rungs) == 1
    assert "ladder.max_steps > proxy.steps 10" in plan_study(flat).header_lines()[0]


def test_ladder_limits_take_more_steps_then_stop():
    # the target (40 steps) needs 4x the proxy's step in 10 steps; capped at 2x, the top
    # rung trains the fewest steps that reach it instead
    s = ladder_space(ladder={"max_spectral_lr": 0.04, "max_steps": 40})
    top, target = list(plan_study(s).rungs)[-1], plan_study(s).target.sum_eta
    assert top.spectral_lr == 0.04 and 10 < top.steps < 40
    assert schedule_sum_eta(top.steps - 1, steps=top.steps - 1, peak=0.04) < target <= top.sum_eta
    # a target of 80 steps is out of reach of 20 steps at 0.04: the top rung stops there
    s = ladder_space(target_steps=80, ladder={"max_spectral_lr": 0.04, "max_steps": 20})
    top = list(plan_study(s).rungs)[-1]
    assert (top.spectral_lr, top.steps) == (0.04, 20)
    assert top.sum_eta == pytest.approx(schedule_sum_eta(20, steps=20, peak=0.04))
    assert top.sum_eta < plan_study(s).target.sum_eta


def test_bad_target_and_ladder_name_the_key():
    with pytest.raises(SearchSpaceError) as e:
        space(target={"steps": 0, "spectral_lr": "fast", "colour": 1},
              ladder={"rungs": 0, "max_spectral_lr": -1})
    found = problems(e)
    # Rule: every bad key is reported, by its path, with what was expected.
    assert found["target.steps"].problem == "expected a whole number in [1, 1,000,000,000] or null, got 0"
    assert found["target.spectral_lr"].problem == "expected a number > 0 or null, got 'fast'"
    assert found["target.colour"].allowed == ["steps", "spectral_lr", "model"]
    assert found["ladder.rungs"].problem == "expected a whole number in [1, 20], got 0"
    assert found["ladder.max_spectral_lr"].problem == "expected a number > 0 or null, got -1"
    # Rule: a rung cannot be shorter than the proxy run, and the target model must exist.
    with pytest.raises(SearchSpaceError) as e:
        space(proxy={"steps": 100}, ladder={"rungs": 2, "max_steps": 50}, target={"model": "nope"})
    found = problems(e)
    assert "at least proxy.steps (100)" in found["ladder.max_steps"].problem
    assert "unknown model 'nope'" in found["target.model"].problem and "tiny" in found["target.model"].allowed


def test_a_target_shorter_than_the_proxy_run_is_refused_saying_what_to_shorten():
    # Rule: the ranking is read at the proxy run or above it (the ladder climbs from it), so a
    # target of fewer steps would get the answer for a longer run than the user's: refused,
    # keyed by target.steps, saying how to fit the proxy to it.
    with pytest.raises(SearchSpaceError) as e:
        space(proxy={"steps": 20}, target={"steps": 5})
    found = problems(e)
    assert set(found) == {"target.steps"}
    assert found["target.steps"].problem.startswith(
        "your run (5 steps at spectral_lr 0.02, Σ η 0.064) is shorter than the proxy run (20 steps at "
        "0.02, Σ η 0.237), where the ranking is read")
    assert found["target.steps"].problem.endswith(
        "; train the proxy no longer (--steps 5 or fewer), or give your run's length (--target-steps N)")
    # Rule: more steps at a smaller step can be shorter too (in Σ η): keyed by its step.
    with pytest.raises(SearchSpaceError) as e:
        space(proxy={"steps": 20}, target={"steps": 30, "spectral_lr": 0.005})
    assert "proxy.spectral_lr=0.005" in problems(e)["target.spectral_lr"].problem
    # Rule: the proxy's own length, or more, is a target (the header says "the proxy run itself").
    assert space(proxy={"steps": 20}, target={"steps": 20}).target.steps == 20
    assert "the proxy run itself" in plan_study(space(proxy={"steps": 20})).header_lines()[0]


def test_cli_flags_set_the_target_and_the_header_prints_it():
    args = build_parser().parse_args(["search", "--target-steps", "5000", "--target-spectral-lr", "0.01",
                                      "--target-model", "gpt2"])
    s = apply_overrides(load_space("default"), target_steps=args.target_steps,
                        target_spectral_lr=args.target_spectral_lr, target_model=args.target_model)
    # Rule: the flags override the space's target section.
    assert (s.target.steps, s.target.spectral_lr, s.target.model) == (5000, 0.01, "gpt2")
    lines = s.summary(plan_study(s).header_lines()).splitlines()
    # Rule: the header states the target and its Σ η, and the proxy's, in at most 6 lines
    # (each wrapped at 100 columns, the rest of a line indented under its key).
    assert max(map(len, lines)) <= 100 and len([ln for ln in lines if not ln.startswith("    ")]) <= 6
    text = "\n".join(lines).replace("\n    ", " ")
    sum_eta = schedule_sum_eta(5000, steps=5000, peak=0.01)
    assert f"target: 5000 steps at spectral_lr 0.01, model gpt2: Σ η {sum_eta:.3g}" in text
    assert "(the proxy's 4.38)" in text
    assert "stability rung first: 200 steps at spectral_lr 0.0497, ending at your run's Σ η² 0.198" in text


def test_the_default_space_measures_stability_at_its_target_and_ranks_on_a_quarter_of_its_steps():
    s = load_space("default")
    rungs, target, stab = list(plan_study(s).rungs), plan_study(s).target, plan_study(s).stability
    # Rule: the default target is 2,000 steps at the proxy's step; the stability rung ends at its
    # Σ η² (200 steps at 3.14 x the step); the ranked run takes the proxy's own step, short of
    # the target's Σ η.
    assert target.steps == 2000 and [(r.steps, r.spectral_lr) for r in rungs] == [(400, s.proxy.spectral_lr)]
    assert stab.steps == 200 and stab.spectral_lr / s.proxy.spectral_lr == pytest.approx(3.1444, rel=1e-4)
    assert rungs[-1].sum_eta < target.sum_eta / 4
    # Rule: the assignments' steps (the stability rung's one seed, the ranked run's two) are at
    # most 1/4 of the target run's for each assignment with the same seeds (4 x 2 x 2,000).
    per_point = stab.steps + rungs[-1].steps * s.repeats
    assert s.grid_size() * per_point <= s.grid_size() * s.repeats * target.steps / 4
    # Rule: the ranked run is evaluated on 16 fixed batches, as the ground truth is.
    assert s.proxy.eval_batches == 16


@pytest.mark.parametrize(("model", "scale"), [("tiny", 8.0), ("small", 128 / math.sqrt(32)),
                                              ("gpt2", 96.0)])
def test_model_logit_scale_of_the_presets(model, scale):
    # Rule: d_model/√d_head read from the model's own config.
    assert model_logit_scale(model) == pytest.approx(scale)


def test_model_logit_scale_of_hugging_face_models():
    pytest.importorskip("transformers")
    assert model_logit_scale("hf:gpt2", {"n_embd": 64, "n_head": 4}) == pytest.approx(64 / 4)
    # LLaMA's head_dim is its own field: width 64, 4 heads of 32 -> 64/√32
    assert model_logit_scale("hf:llama", {"hidden_size": 64, "num_attention_heads": 4,
                                          "head_dim": 32}) == pytest.approx(64 / math.sqrt(32))


# --------------------------------------------------------------------------- the trial loop
def rung_loss(key, seed, config):
    """all-adamw attention learns fast early; euclidean wins once the spectral step is large."""
    if "attn=adamw" in key:
        return 3.0 + 0.01 * seed
    return 3.1 + 0.01 * seed - (0.3 if config.spectral_lr > 0.03 else 0.0)


@pytest.mark.slow
def test_each_trial_trains_every_rung_and_is_scored_at_the_top(monkeypatch, tmp_path):
    f = use_train(monkeypatch, FakeTrain(losses=rung_loss, with_config=True))
    buf = io.StringIO()
    out = run_search(ladder_space(repeats=2), runs_dir=tmp_path / "runs", out=buf, progress=False)
    rungs = list(plan_study(ladder_space()).rungs)
    # Rule: every seed is trained at every rung, lowest first, with the rung's steps and step.
    assert [(c.steps, c.spectral_lr, c.seed) for c in f.configs[:4]] == [
        (10, 0.02, 0), (10, 0.02, 1), (rungs[1].steps, pytest.approx(rungs[1].spectral_lr), 0),
        (rungs[1].steps, pytest.approx(rungs[1].spectral_lr), 1)]
    for t in trials_of(tmp_path):
        ua = t.user_attrs
        # Rule: per-rung losses are recorded; the value is the top rung's mean over seeds.
        assert len(ua["rung_losses"]) == 2 and all(len(r) == 2 for r in ua["rung_losses"])
        assert ua["val_losses"] == ua["rung_losses"][-1] and t.value == pytest.approx(sum(ua["val_losses"]) / 2)
        # Rule: intermediate values are the ranked (top) rung's first seed's, where the value is
        # read (Optuna keeps one per step), up to that rung's last step.
        assert set(t.intermediate_values.values()) == {ua["rung_losses"][-1][0]}
        assert max(t.intermediate_values) == rungs[-1].steps
        # Rule: the forecast's inputs are on the trial before training.
        assert ua["target_sum_eta"] == pytest.approx(plan_study(ladder_space()).target.sum_eta)
        assert ua["target_steps"] == 40 and ua["logit_scale"] == ua["target_logit_scale"] == 8.0
        # Rule: each probe row carries its run's Σ η and σ_max; rung_probes keeps each rung's
        # and probes.json the trial's probe_history (the last rung's), files, not user attrs,
        # which keep its last max logit (the peak is the rows'). AdamW query/key weights take no spectral
        # step: their rows have no Σ η.
        assert not {"rung_probes", "probe_history", "stability_probes"} & set(ua)
        rung_probes = read_rung_probes(tmp_path / "runs" / "t" / ua["trial_dir"])
        for rung, rows in zip(rungs, rung_probes):
            if ua["assignment"]["attn_qkv"] == "adamw":
                assert [r["sum_eta"] for r in rows] == [None, None]
            else:
                assert [r["sum_eta"] for r in rows] == pytest.approx(
                    [schedule_sum_eta(s, steps=rung.steps, peak=rung.spectral_lr) for s in (5, 10)])
            assert all(r["sigma_max"] == {"attn_qkv": 1.0} for r in rows)
        history = read_probes_file(tmp_path / "runs" / "t", t)["probe_history"]
        assert history == rung_probes[-1]
        assert "peak_max_logit" not in ua
        assert ua["max_logit"] == history[-1]["max_logit"]
    # Rule: the ranking is the top rung's, and the reading names the lead change and marks
    # the verdict as not yet stable.
    assert out.ranking.rows[0].label.startswith("attn=euclidean")
    text = buf.getvalue()
    assert "the lead changed between Σ η" in text and "order at your target (Σ η" in text
    order = next(line for line in text.splitlines() if line.startswith("order at your target"))
    assert "not yet stable: the lead changed between Σ η" in order
    # Rule: the export records the target and the reading.
    a = load_assignment(out.exported)
    assert a.provenance["target"]["steps"] == 40 and a.provenance["target"]["model"] == "tiny"
    target = plan_study(ladder_space()).target
    assert a.provenance["target"]["sum_eta"] == pytest.approx(target.sum_eta)
    h = a.provenance["horizon"]
    assert h["stable"] is False and h["leaders"][0].startswith("attn=adamw")
    assert h["leaders"][-1].startswith("attn=euclidean") and len(h["lead_changes"]) == 1


@pytest.mark.slow
def test_lower_seeds_trains_the_first_seeds_below_the_top_rung_and_all_at_the_top(monkeypatch, tmp_path):
    f = use_train(monkeypatch, FakeTrain(losses=rung_loss, with_config=True))
    space = ladder_space(rungs=3, ladder={"lower_seeds": 1}, repeats=3)
    rungs = list(plan_study(space).rungs)
    out = run_search(space, runs_dir=tmp_path / "runs", out=io.StringIO(), progress=False)
    # Rule: one trial trains seed 0 at each lower rung, then every seed at the top rung.
    assert [(c.steps, c.seed) for c in f.configs[:5]] == [
        (rungs[0].steps, 0), (rungs[1].steps, 0), (rungs[2].steps, 0), (rungs[2].steps, 1), (rungs[2].steps, 2)]
    for t in trials_of(tmp_path):
        losses = t.user_attrs["rung_losses"]
        assert [len(r) for r in losses] == [1, 1, 3] and t.user_attrs["val_losses"] == losses[-1]
    # Rule: the value and the ranking come from the top rung's three seeds.
    assert out.ranking.rows[0].score.n == 3
    # Rule: the header counts the steps so: (1 + 1 + 3 seeds) at their rungs per assignment.
    each = rungs[0].steps + rungs[1].steps + 3 * rungs[2].steps
    text = space.summary(plan_study(space).header_lines()).replace("\n    ", " ")  # unwrapped
    assert f"({each:,} steps each)" in text and "1 below the top" in text


@pytest.mark.slow
def test_a_rung_with_a_larger_step_than_the_targets_is_not_judged_on_its_logits(monkeypatch, tmp_path):
    use_train(monkeypatch, FakeTrain(
        logits=lambda key, seed, config: 5e3 if "euclidean" in key and config.spectral_lr > 0.03 else 5.0,
        with_config=True))
    search(ladder_space(repeats=2), tmp_path)
    t = next(t for t in trials_of(tmp_path) if t.params["geometry.attn"] == "euclidean")
    # Rule: rung 1 takes a 10x larger step than the target's: its logits (5e3) are recorded,
    # not judged; the trial completes and is ranked on its loss.
    assert t.state == TrialState.COMPLETE
    rung_probes = read_rung_probes(tmp_path / "runs" / "t" / t.user_attrs["trial_dir"])
    assert max(r["max_logit"] for r in rung_probes[1]) == 5e3


@pytest.mark.slow
def test_an_unstable_run_at_a_higher_rung_prunes_naming_the_rung(monkeypatch, tmp_path):
    use_train(monkeypatch, FakeTrain(
        logits=lambda key, seed, config: 5e3 if "euclidean" in key and config.spectral_lr > 0.03 else 5.0,
        with_config=True))
    # the target's own step (1.0) is above every rung's: each rung is judged like the proxy run
    space = ladder_space(repeats=2, target_lr=1.0)
    search(space, tmp_path)
    t = next(t for t in trials_of(tmp_path) if t.params["geometry.attn"] == "euclidean")
    top = list(plan_study(space).rungs)[-1]
    assert t.state == TrialState.PRUNED
    # Rule: the reason names the rung and its Σ η, then the seed and the pruner's rule.
    assert t.user_attrs["prune_reason"].startswith(f"rung 1 (Σ η {top.sum_eta:.3g}), seed 0: max logit 5e+03")
    assert t.user_attrs["pruned_rung"] == 1 and t.user_attrs["pruned_seed"] == 0
    # Rule: the lower rung's losses are kept; the pruned rung has the one run it stopped.
    assert [len(r) for r in t.user_attrs["rung_losses"]] == [2, 1]


def stability_space(steps=10, **extra):
    """The tiny test space (target 40 steps at 0.02) with a stability rung of ``steps`` steps."""
    return make_space(target={"steps": 40}, ladder={"rungs": 1, "stability_steps": steps}, **extra)


@pytest.mark.slow
def test_the_stability_rung_trains_first_at_the_targets_sum_eta2(monkeypatch, tmp_path):
    f = use_train(monkeypatch, FakeTrain(with_config=True))
    space = stability_space(repeats=2, baselines=["adamw", "muon"])
    buf = io.StringIO()
    run_search(space, runs_dir=tmp_path / "runs", out=buf, progress=False)
    stab = plan_study(space).stability
    target2 = schedule_sum_eta2(40, steps=40, peak=0.02)
    # Rule: the stability rung takes stability_steps at the step whose run ends at the target's
    # Σ η² (same schedule shape): 10 steps for a 40-step target at 0.02 -> 0.02·√(S₂(40)/S₂(10)).
    assert stab.steps == 10 and schedule_sum_eta2(10, steps=10, peak=stab.spectral_lr) == pytest.approx(target2)
    study = open_run_study(tmp_path / "runs" / "t")
    assert study.user_attrs["stability"]["target_sum_eta2"] == pytest.approx(target2)
    by_point = {}
    for t in trials_of(tmp_path):
        by_point[t.user_attrs.get("baseline") or t.params["geometry.attn"]] = t
    # Rule: each trial trains the stability rung first, with its first seed only, then the
    # ladder; its rows carry the target's step at their Σ η² and are kept as stability_probes.
    stab_runs = [i for i, c in enumerate(f.configs) if c.spectral_lr > 0.021]
    assert len(stab_runs) == 2  # the euclidean point and the muon baseline
    for i in stab_runs:
        assert (f.configs[i].steps, f.configs[i].spectral_lr, f.configs[i].seed) == (
            10, pytest.approx(stab.spectral_lr), 0)
        assert f.calls[i + 1] == (f.calls[i][0], 0) and f.configs[i + 1].spectral_lr == 0.02
    held = {k: read_probes_file(tmp_path / "runs" / "t", t) for k, t in by_point.items()}
    euclid = held["euclidean"]["stability_probes"]
    assert by_point["euclidean"].user_attrs["stability_run"] is False
    assert [r["step"] for r in euclid] == [5, 10]
    assert euclid[-1]["target_step"] == 40 and 0 < euclid[0]["target_step"] < 40
    assert "stability_peak_logit" not in by_point["euclidean"].user_attrs  # the rows' to read
    # Rule: AdamW query/key weights (the adamw point and baseline) take no spectral step: no
    # Σ η² clock, no stability rung; the muon baseline trains it.
    assert held["adamw"]["stability_probes"] == [] and held["muon"]["stability_probes"]
    # Rule: the summary shows what was measured, in the target's logits, against its threshold.
    out = buf.getvalue()
    assert "stability at your target: all 2 measured below max logit" in out
    run_dir = tmp_path / "runs" / "t"
    details = format_ranking(open_run_study(run_dir), None, run_dir, details=True)
    assert "measured by the stability rung" in details
    assert "attn=euclidean, mlp=adamw (trial" in details
    assert "measured at your target's Σ η²: max logit 10" in details
    # Rule: the header counts its steps (one seed of stability_steps per point and muon).
    assert "the stability rung (10 steps, 1 seed) (30 steps each)" in out.replace("\n    ", " ")  # unwrapped


@pytest.mark.slow
def test_a_run_unstable_at_the_targets_sum_eta2_is_pruned_before_the_ladder(monkeypatch, tmp_path):
    f = use_train(monkeypatch, FakeTrain(
        logits=lambda key, seed, config: 500.0 if "euclidean" in key and config.spectral_lr > 0.021 else 5.0,
        with_config=True))
    space = stability_space(repeats=2)
    search(space, tmp_path)
    t = next(t for t in trials_of(tmp_path) if t.params["geometry.attn"] == "euclidean")
    # Rule: pruned as unstable at the target, from the measured logit, naming the rung, its
    # step, the threshold and where the user's run crosses it; the ladder is not trained.
    assert t.state == TrialState.PRUNED and t.user_attrs["status"] == "unstable"
    why = t.user_attrs["prune_reason"]
    assert why.startswith("stability rung (10 steps at spectral_lr ")
    assert "unstable at your target: max logit 500 at step 5 of the stability rung" in why
    assert "> threshold 80 (10 × d/√d_head 8); near step " in why
    assert t.user_attrs["pruned_rung"] == "stability" and t.user_attrs["rung_losses"] == []
    euclid_runs = [c for c in f.configs if c.spectral_lr > 0.021]
    assert len(euclid_runs) == 1  # the stability rung only
    # Rule: the same logits at the proxy's own step are below the proxy's threshold: kept.
    assert next(t for t in trials_of(tmp_path) if t.params["geometry.attn"] == "adamw").state == TrialState.COMPLETE


@pytest.mark.slow
def test_resume_with_another_stability_rung_is_refused(fake, tmp_path):
    search(stability_space(), tmp_path)
    # Rule: the stability rung is part of the ladder, which a study keeps.
    with pytest.raises(ConfigError, match=r"ladder: study 't' was created with the ladder"):
        search(stability_space(steps=20), tmp_path)
    with pytest.raises(ConfigError, match=r"ladder: study 't' was created with the ladder"):
        search(make_space(target={"steps": 40}), tmp_path)


@pytest.mark.slow
def test_one_rung_short_of_the_target_says_the_target_is_not_measured(fake, tmp_path):
    buf = io.StringIO()
    run_search(make_space(target={"steps": 40}), runs_dir=tmp_path / "runs", out=buf, progress=False)
    study = open_run_study(tmp_path / "runs" / "t")
    note = horizon_note(study_reading(study))
    # Rule: a single rung ranks at the proxy's Σ η only, and the verdict says so.
    assert note.startswith("ranked at Σ η") and "the order there is not measured" in note
    order = next(ln for ln in buf.getvalue().splitlines() if ln.startswith("order at your target"))
    assert "not measured (ranked at Σ η 0.128" in order
    assert note in format_ranking(study, details=True)


@pytest.mark.slow
def test_a_study_without_target_prints_no_reading(fake, tmp_path):
    buf = io.StringIO()
    run_search(make_space(), runs_dir=tmp_path / "runs", out=buf, progress=False)
    # Rule: the target is the proxy run: nothing to read, nothing added to the verdict.
    assert study_reading(open_run_study(tmp_path / "runs" / "t")) is None
    assert "horizon" not in buf.getvalue()


@pytest.mark.slow
def test_resume_with_another_target_is_refused(fake, tmp_path):
    search(ladder_space(), tmp_path)
    # Rule: the target is part of the study's identity, with an error saying why.
    with pytest.raises(ConfigError, match=r"target: study 't' was created for the target .*another "
                                          r"target is another question"):
        search(ladder_space(target_steps=80), tmp_path)
    with pytest.raises(ConfigError, match=r"ladder: study 't' was created with the ladder"):
        search(ladder_space(rungs=3), tmp_path)
    # Rule: a study written by an earlier build (no target in its space) is refused in one
    # line; this build does not read it.
    study = open_run_study(tmp_path / "runs" / "t")
    old = {k: v for k, v in study.user_attrs["space"].items() if k not in ("target", "ladder")}
    search(make_space(name="old"), tmp_path)
    old_study = open_run_study(tmp_path / "runs" / "old")
    old_study.set_user_attr("space", {**old, "name": "old"})
    with pytest.raises(ConfigError, match=r"study 'old' was written by an earlier build of "
                                          r"geosearch \(it records no space.target\)") as e:
        search(make_space(name="old", target={"steps": 40}), tmp_path)
    assert "\n" not in str(e.value)


# --------------------------------------------------------------------------- for real
@pytest.mark.slow
def test_tiny_ladder_trains_each_rung_in_its_own_directory(tmp_path):
    s = ladder_space(rungs=2, target_steps=30, geometries={"attn": ["stiefel"], "mlp": ["adamw"]})
    out = search(s, tmp_path)
    assert out.counts == {"completed": 1}
    (t,) = trials_of(tmp_path)
    run = tmp_path / "runs" / "t" / "trials" / str(t.number)
    top = list(plan_study(s).rungs)[-1]
    assert top.index == 1 and top.spectral_lr > 0.02  # rung 1: a larger step, same 10 steps
    # Rule: one directory per rung; each run's config is the rung's.
    for k in (0, 1):
        config = yaml.safe_load((run / f"rung{k}" / "config.yaml").read_text())["train"]
        rung = list(plan_study(s).rungs)[k]
        assert (config["steps"], config["spectral_lr"]) == (rung.steps, pytest.approx(rung.spectral_lr))
        assert len((run / f"rung{k}" / "metrics.jsonl").read_text().splitlines()) == 2
    # Rule: the value is the top rung's loss; its probes carry the top run's Σ η.
    assert t.value == pytest.approx(t.user_attrs["rung_losses"][1][0])
    rows = read_probes_file(tmp_path / "runs" / "t", t)["probe_history"]
    assert rows[-1]["sum_eta"] == pytest.approx(top.sum_eta) and rows[-1]["sigma_max"]["attn_qkv"] > 0
