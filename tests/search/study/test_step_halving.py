"""A step grid searched by successive halving (``hyperparams.step_halving``, the default
with a grid), with the fake trainer: every seed at the shared step, one seed at the other
steps, the other seeds there only at each assignment's and each baseline's best step; the stability rung at the largest step first,
its pass standing for the smaller steps of the same assignment; the own-step answer chosen
on the seed every step ran, so a promoted step keeps its place; and the steps it trains
against the full grid's."""

from __future__ import annotations

import pytest

from functools import partial

import dataclasses

from _search_helpers import FakeTrain, TINY_PROXY, make_space, search, trials_of, use_train

from geosearch.search.records import (
    BASELINE,
    SEED_OF,
    SEEDS,
    STABILITY_FROM,
    STABILITY_PASSED_AT,
    STEP_FACTOR,
    trial_status,
)
from geosearch.search.horizon.outlook import stability_rows
from geosearch.search.records import read_probes_file
from geosearch.search.runtime.storage import open_run_study
from geosearch.search.space.spec import study_pruner
from geosearch.search.stats.study_ranking import rank_study
from geosearch.search.study.baseline_trials import baseline_table

SHARED = 0.02
GRID = [0.5, 1, 2]
TWO = {"attn": ["stiefel", "dgram"], "mlp": ["stiefel"]}
STIEFEL, DGRAM = "attn=stiefel,mlp=stiefel", "attn=dgram,mlp=stiefel"
ADAMW, MUON = "attn=adamw,mlp=adamw", "attn=euclidean,mlp=euclidean"
# val loss by (run, factor) at the first seed: Stiefel attention best at the shared step,
# DGram attention at half of it, AdamW at twice its lr, Muon at half its spectral step
LOSS = {STIEFEL: {0.5: 3.05, 1: 3.0, 2: 3.06}, DGRAM: {0.5: 2.95, 1: 3.1, 2: 3.2},
        ADAMW: {0.5: 3.3, 1: 3.2, 2: 3.15}, MUON: {0.5: 3.02, 1: 3.08, 2: 3.3}}
BEST = {STIEFEL: 1.0, DGRAM: 0.5, ADAMW: 2.0, MUON: 0.5}


def _space(halving=True, **extra):
    hp = {"step_grid": GRID} if halving else {"step_grid": GRID, "step_halving": False}
    return make_space(TWO, repeats=2, hyperparams=hp, proxy={**TINY_PROXY, "spectral_lr": SHARED}, **extra)


def _factor(key, config, lr):
    return round(config.lr / lr if key == ADAMW else config.spectral_lr / SHARED, 6)


def _losses(lr, second_seed_penalty=0.0):
    """The table above; the second seed 0.05 higher everywhere, plus ``second_seed_penalty``
    for the promoted step of DGram attention (so that its two-seed mean falls behind the
    one-seed value of another of its steps)."""
    def losses(key, seed, config):
        f = _factor(key, config, lr)
        extra = second_seed_penalty if (key, f, seed) == (DGRAM, 0.5, 1) else 0.0
        return LOSS[key][f] + 0.05 * seed + extra
    return losses


def _ranked_runs(fake, steps):
    """(key, factor, seed) of every ranked run (``config.steps == steps``)."""
    lr = _space().proxy.lr
    return sorted((call[0], _factor(call[0], c, lr), c.seed)
                  for c, call in zip(fake.configs, fake.calls) if c.steps == steps)


@pytest.mark.slow
def test_one_seed_at_every_step_and_the_rest_at_each_best_step(monkeypatch, tmp_path):
    lr = _space().proxy.lr
    fake = use_train(monkeypatch, FakeTrain(losses=_losses(lr, second_seed_penalty=0.3), with_config=True))
    search(_space(baselines=["adamw", "muon"]), tmp_path)
    # Rule: every assignment and baseline trains both seeds at the shared step and its first
    # seed at the other steps; only its best step (on that seed) trains the second there.
    runs = _ranked_runs(fake, TINY_PROXY["steps"])
    for key in LOSS:
        assert [(f, s) for k, f, s in runs if k == key] == sorted(
            {(f, 0) for f in GRID} | {(1.0, 1), (BEST[key], 1)}), key
    trials = trials_of(tmp_path)
    points = [t for t in trials if STEP_FACTOR in t.params and SEED_OF not in t.user_attrs]
    assert len(points) == 6
    assert all(t.user_attrs[SEEDS] == ([0, 1] if t.params[STEP_FACTOR] == 1 else [0]) for t in points)
    # Stiefel attention's best is the shared step, which has its seeds: no promotion
    seeds = [t for t in trials if SEED_OF in t.user_attrs]
    assert sorted(t.user_attrs.get(BASELINE) or "" for t in seeds) == ["", "adamw", "muon"]
    assert all(t.user_attrs[SEEDS] == [1] and trial_status(t) == "completed" for t in seeds)

    study = open_run_study(tmp_path / "runs" / "t")
    ranking = rank_study(study)
    # Rule: the own-step answer is the promoted step with both seeds, chosen on the seed all
    # its steps ran: DGram attention's step 0.01 stays its best although its two-seed mean
    # (3.15) is behind its one-seed value at 0.02 (3.1).
    own = {r.label: (ranking.steps.factors[r.number], r.score.n) for r in ranking.rows}
    assert own == {"attn=dgram, mlp=stiefel at step 0.01": (0.5, 2),
                   "attn=stiefel, mlp=stiefel at step 0.02": (1.0, 2)}
    # Rule: each baseline is compared at its promoted step, its two seeds merged.
    table = baseline_table(study, ranking)
    assert {n: (b["factor"], b["score"].n) for n, b in table.baselines.items()} == {
        "adamw": (2.0, 2), "muon": (0.5, 2)}
    assert all(len(rows) == 2 for rows in table.rows.values())


@pytest.mark.slow
def test_halving_trains_less_than_the_full_grid_and_names_the_same_steps(monkeypatch, tmp_path):
    lr = _space().proxy.lr
    answers, steps = {}, {}
    for halving in (True, False):
        fake = use_train(monkeypatch, FakeTrain(losses=_losses(lr), with_config=True))
        search(_space(halving, baselines=["adamw", "muon"]), tmp_path / str(halving))
        ranking = rank_study(open_run_study(tmp_path / str(halving) / "runs" / "t"))
        answers[halving] = [(r.label, ranking.steps.factors[r.number]) for r in ranking.rows]
        steps[halving] = sum(c.steps for c in fake.configs)
    # Rule: where the seeds agree on each assignment's best step, halving names the full
    # grid's steps and order, for 19 ranked runs of the full grid's 24 (4 run types x 3
    # steps x 2 seeds; halving: 2 + 1 + 1 each, and 1 more for the 3 whose best step is not
    # the shared one).
    assert answers[True] == answers[False]
    assert steps[True] * 24 == steps[False] * 19


@pytest.mark.slow
def test_a_stability_pass_at_a_larger_step_stands_for_the_smaller_ones(monkeypatch, tmp_path):
    stab_steps = 10  # the fake trainer records steps 5 and 10

    def logits(key, seed, config):
        # DGram attention's stability rung blows up at twice the shared step only (its η'
        # there: 2.5 × 0.04)
        big = key == DGRAM and config.steps == stab_steps and config.spectral_lr > 4 * SHARED
        return 5e3 if big else 10.0

    fake = use_train(monkeypatch, FakeTrain(logits=logits, with_config=True))
    space = _space(ladder={"stability_steps": stab_steps}, target={"steps": 80})
    search(dataclasses.replace(space, proxy=dataclasses.replace(space.proxy, steps=20)), tmp_path)
    trials = {t.number: t for t in trials_of(tmp_path)}
    points = {(t.params["geometry.attn"], t.params[STEP_FACTOR]): t for t in trials.values()
              if STEP_FACTOR in t.params and SEED_OF not in t.user_attrs}
    stability = sorted((call[0], c.spectral_lr) for c, call in zip(fake.configs, fake.calls) if c.steps == stab_steps)
    # Rule: the largest step trains the stability rung first; a pass there stands for the
    # smaller steps (stability_from), a failure makes the next step train its own.
    assert [k for k, _ in stability] == [DGRAM, DGRAM, STIEFEL]
    assert points["stiefel", 2.0].user_attrs[STABILITY_PASSED_AT] == 2.0
    for f in (0.5, 1.0):
        assert trials[points["stiefel", f].user_attrs[STABILITY_FROM]].params[STEP_FACTOR] == 2.0
        assert STABILITY_PASSED_AT not in points["stiefel", f].user_attrs
    assert trial_status(points["dgram", 2.0]) == "unstable" and STABILITY_PASSED_AT not in points["dgram", 2.0].user_attrs
    assert points["dgram", 1.0].user_attrs[STABILITY_PASSED_AT] == 1.0
    assert trials[points["dgram", 0.5].user_attrs[STABILITY_FROM]] is points["dgram", 1.0]
    # Rule: the unstable step takes no part in the promotion, and the shared step, which
    # trained both seeds, is never promoted.
    promoted = {(t.params["geometry.attn"], t.params[STEP_FACTOR])
                for t in (trials[x.user_attrs[SEED_OF]] for x in trials.values() if SEED_OF in x.user_attrs)}
    assert promoted and ("dgram", 2.0) not in promoted and all(f != 1 for _, f in promoted)
    # Rule: the stability outlook of a step that took a larger step's pass says so, with
    # that rung's measurement (past its own target's Σ η²).
    study = open_run_study(tmp_path / "runs" / "t")
    small, large = points["stiefel", 0.5], points["stiefel", 2.0]
    inherited, own = stability_rows(study, [small.number, large.number], study_pruner(study),
                                    partial(read_probes_file, tmp_path / "runs" / "t"))
    assert inherited.measured_by == large.number and own.measured_by is None
    assert inherited.measured == own.measured
    assert f"by the stability rung of trial {large.number}, at a larger step" in inherited.text()
