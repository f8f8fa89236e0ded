"""The benchmark's no-run rule, constant rule and chance rates (benchmarks/no_run_rules.py),
computed on a hand-made table."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[3] / "benchmarks"


@pytest.fixture
def rules(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    sys.modules.pop("no_run_rules", None)
    import no_run_rules

    return no_run_rules


def test_chance_under_the_right_null_is_per_setting_and_its_tail_is_poisson_binomial(rules):
    r = rules
    order = {r.S_D: 1.0, r.ALL_STIEFEL: 2.0, r.D_S: 3.0, r.ALL_DGRAM: 4.0}  # long runs' means
    assert r.chances(order, list(r.FOUR)) == pytest.approx((1 / 4, 1 / 6))
    # two left: the right winner and ρ >= 0.8 over all four (the pruned tied last) are one event
    assert r.chances(order, [r.ALL_STIEFEL, r.S_D]) == pytest.approx((1 / 2, 1 / 2))
    assert r.rho_all([r.S_D, r.ALL_STIEFEL], [r.D_S, r.ALL_DGRAM], order) == pytest.approx(
        4.5 / 22.5**0.5
    )
    assert r.rho_all([r.ALL_STIEFEL, r.S_D], [r.D_S, r.ALL_DGRAM], order) < 0.8
    # 3 settings of four and 5 of two: 7 of 8 winners, 6 of 8 ρ >= 0.8
    assert r.tail(7, [1 / 4] * 3 + [1 / 2] * 5) == pytest.approx(0.00732421875)
    assert r.tail(6, [1 / 6] * 3 + [1 / 2] * 5) == pytest.approx(0.0261863426)
    assert r.tail(7, [1 / 4] * 8) == pytest.approx(0.000381469727)  # the misstated null
    assert r.tail(0, [0.3, 0.9]) == pytest.approx(1.0)


def test_the_rules_and_the_scores_on_a_hand_made_table(rules):
    r = rules
    assert r.no_run_order(0.02) == ([r.ALL_DGRAM, r.S_D, r.D_S, r.ALL_STIEFEL], set())
    assert r.no_run_order(0.03) == ([r.S_D, r.ALL_STIEFEL], {r.ALL_DGRAM, r.D_S})
    assert [r.no_run_crosses(e, r.D_S) for e in (0.03, 0.05)] == [False, True]
    assert not r.no_run_crosses(0.1, r.S_D)
    assert r.parse_setting("4-layer tiny 0.05") == ("tiny", 0.05, {"n_layer": 4})
    assert r.parse_setting("mini 0.1 n_embd=32") == ("mini", 0.1, {"n_embd": 32})
    assert r.constant_rule([True, True, False, False, False, False]) == 4

    low = {r.ALL_DGRAM: 1.0, r.S_D: 2.0, r.D_S: 3.0, r.ALL_STIEFEL: 4.0}
    high = {r.S_D: 1.0, r.ALL_STIEFEL: 2.0, r.D_S: 3.0, r.ALL_DGRAM: 4.0}
    below = dict.fromkeys(r.FOUR, False)
    truths = {
        "tiny 0.02": (low, below),
        "tiny 0.05": (high, below | {r.ALL_DGRAM: True, r.D_S: True}),
        "small 0.05": (high, below | {r.ALL_DGRAM: True}),
    }  # one DGram-attention run stays below
    rows = [
        {
            "setting": "tiny 0.02",
            "search_best": "all-DGram",
            "spearman": 0.8,
            "stability": [4, 4],
            "left": 4,
        },
        {
            "setting": "tiny 0.05",
            "search_best": "all-Stiefel",
            "spearman": 0.74,
            "stability": [4, 4],
            "left": 2,
        },
        {
            "setting": "small 0.05",
            "search_best": "Stiefel-attn + DGram-MLP",
            "spearman": 0.95,
            "stability": [3, 4],
            "left": 2,
        },
        {"setting": "mini 0.02", "search_best": "all-DGram", "spearman": 1.0, "stability": [4, 4]},
    ]  # no truth
    s = r.score(rows, truths)
    assert s["settings"] == 3
    assert s["search"]["winner"][:2] == [2, 3] and s["search"]["rho"][:2] == [2, 3]
    assert s["search"]["decisions"] == [11, 12]
    assert s["rule"]["winner"][:2] == [3, 3] and s["rule"]["rho"][:2] == [3, 3]
    assert s["rule"]["decisions"] == [11, 12]  # small 0.05's D-S stayed below
    assert s["constant_decisions"] == [9, 12]  # 3 above, 9 below
    assert s["search"]["winner"][2] == pytest.approx(r.tail(2, [1 / 4, 1 / 2, 1 / 2]))
    assert s["rule"]["rho"][2] == pytest.approx(1 / 6 * 1 / 2 * 1 / 2)
    assert [row["left"] for row in s["rows"]] == [4, 2, 2]
    text = "\n".join(r.lines(s))
    assert "The no-run rule: best named at 3 of 3" in text and "constant rule: 9 of 12" in text


def test_a_study_whose_target_model_differs_is_scored_on_that_models_long_runs(
    rules, monkeypatch, tmp_path
):
    """fidelity.py --compare reads the target model from the study's plan; the row it writes
    (``"tiny 0.02 target mini"``) is scored on ``mini``'s long runs, not ``tiny``'s."""
    import fidelity

    proxy = {"model": "tiny", "spectral_lr": 0.02, "batch_size": 16, "model_args": {}}
    assert fidelity.study_truth({"proxy": proxy, "target": {"model": "mini"}}, "tiny", 0.02) == (
        "mini",
        {},
    )
    assert fidelity.study_truth({"proxy": proxy, "target": {"model": "tiny"}}, "tiny", 0.02) == (
        "tiny",
        {},
    )
    narrow = dict(proxy, model_args={"n_embd": 16})  # the proxy's own model keeps its fields
    assert fidelity.study_truth({"proxy": narrow, "target": {}}, "tiny", 0.02, {"n_embd": 16}) == (
        "tiny",
        {"n_embd": 16},
    )
    with pytest.raises(SystemExit, match="the study's proxy is tiny/0.02"):
        fidelity.study_truth({"proxy": proxy, "target": {"model": "mini"}}, "mini", 0.02)

    name = "tiny 0.02 target mini"
    assert rules.parse_setting(name) == ("tiny", 0.02, {})
    assert rules.truth_model(name) == ("mini", 0.02, {})
    assert rules.truth_model("4-layer tiny 0.05") == ("tiny", 0.05, {"n_layer": 4})

    # hand-made long runs: mini's order is the reverse of tiny's; one mini run above 160
    losses = {"tiny": [1.0, 2.0, 3.0, 4.0], "mini": [4.0, 3.0, 2.0, 1.0]}
    for model, values in losses.items():
        for assign, loss in zip(rules.FOUR, values):
            logit = 200.0 if (model, assign) == ("mini", rules.ALL_DGRAM) else 20.0
            rec = {
                "assign": assign,
                "status": "completed",
                "final_val_loss": loss,
                "probes": [{"step": 2000, "max_logit": logit}],
                "config": {"model": model, "steps": 2000, "spectral_lr": 0.02, "model_args": {}},
            }
            (tmp_path / f"{model}-{assign}.json").write_text(json.dumps(rec), encoding="utf-8")
    monkeypatch.setattr(fidelity, "DATA", tmp_path)
    mean, above = rules.stored_truths([{"setting": name}])[name]
    assert mean == dict(zip(rules.FOUR, losses["mini"]))
    assert above == {a: a == rules.ALL_DGRAM for a in rules.FOUR}
    assert rules.stored_truths([{"setting": "tiny 0.02"}])["tiny 0.02"][0] == dict(
        zip(rules.FOUR, losses["tiny"])
    )
