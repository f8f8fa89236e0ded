"""The track record's one source: ``track_record.json``, as the benchmark scores it."""

from __future__ import annotations

import pytest

import json
import sys
from pathlib import Path

from geosearch.search.stats.track import ORDER_RECORD, track_record, track_text

BENCHMARKS = Path(__file__).resolve().parents[3] / "benchmarks"


@pytest.mark.slow
def test_the_track_record_file_is_what_the_benchmark_scores_from_the_stored_data(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    sys.modules.pop("fidelity", None)
    import fidelity

    assert fidelity.track_record() == track_record()
    o = track_record()["order"]
    assert (ORDER_RECORD.at, list(ORDER_RECORD.far), list(ORDER_RECORD.near)) == (
        o["at"],
        o["far"],
        o["near"],
    )
    w = track_record()["search"]["winner"]
    assert f"best at {w['hits']} of {w['of']} settings" in track_text()


def test_the_track_record_ships_with_the_package():
    text = (BENCHMARKS.parent / "pyproject.toml").read_text(encoding="utf-8")
    assert '"geosearch.search.stats" = ["track_record.json"]' in text


def test_a_compared_search_writes_its_row_in_place_or_last(monkeypatch, tmp_path):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    sys.modules.pop("fidelity", None)
    import fidelity

    searches = tmp_path / "searches.json"
    old = {"setting": "tiny 0.05", "truth_best": "all-DGram", "search_best": "all-DGram",
           "spearman": 0.4, "stability": [3, 4], "from": "docs/benchmarks.md"}
    searches.write_text(json.dumps({"source": ["hand-made"], "settings": [old, dict(
        old, setting="small 0.02")]}), encoding="utf-8")
    assert fidelity.setting_name("tiny", 0.05, {}) == "tiny 0.05"
    assert fidelity.setting_name("tiny", 0.05, {"n_layer": 4}) == "4-layer tiny 0.05"
    assert fidelity.setting_name("mini", 0.1, {"n_embd": 32}) == "mini 0.1 n_embd=32"

    new = dict(old, spearman=0.95, stability=[4, 4], **{"from": "fidelity.py --compare runs/x"})
    fidelity.record_search(new, searches)
    fidelity.record_search(dict(new, setting="4-layer tiny 0.05"), searches)
    data = json.loads(searches.read_text(encoding="utf-8"))
    assert data["source"] == ["hand-made"]
    assert [r["setting"] for r in data["settings"]] == [
        "tiny 0.05", "small 0.02", "4-layer tiny 0.05"]
    assert data["settings"][0] == new and data["settings"][1]["spearman"] == 0.4


def test_a_named_setting_is_its_row_and_an_expert_stack_counts_as_mlp(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    sys.modules.pop("fidelity", None)
    import fidelity

    spec, args = fidelity.SETTINGS["mixtral-moe"]
    assert fidelity.setting_name(spec, 0.02, args) == "mixtral-moe 0.02"
    other = fidelity.setting_name(spec, 0.02, dict(args, block_size=64))
    assert other.startswith("hf:mixtral 0.02 ") and "block_size=64" in other
    moe = {"attn_q": "stiefel", "attn_k": "stiefel", "attn_v": "stiefel", "attn_out": "stiefel",
           "moe_gate": "dgram", "moe_in": "dgram", "moe_out": "dgram", "router": "adamw"}
    assert fidelity._paper_key(moe) == "attn=stiefel,mlp=dgram"
    assert fidelity._paper_key(dict(moe, moe_out="stiefel")) == "attn=stiefel,mlp=mixed"
    dense = {"attn_qkv": "dgram", "attn_out": "dgram", "mlp_in": "stiefel", "mlp_out": "stiefel"}
    assert fidelity._paper_key(dense) == "attn=dgram,mlp=stiefel"
    assert fidelity.assignment_for(spec, "attn=dgram,mlp=stiefel", args).resolve() == dict(
        moe, attn_q="dgram", attn_k="dgram", attn_v="dgram", attn_out="dgram", moe_gate="stiefel",
        moe_in="stiefel", moe_out="stiefel")


def test_a_roles_study_is_scored_on_its_eight_points(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    for name in ("fidelity", "roles", "no_run_rules"):
        sys.modules.pop(name, None)
    import fidelity
    import no_run_rules
    import roles

    split = {"attn_q": "stiefel", "attn_k": "stiefel", "attn_v": "dgram", "attn_out": "dgram",
             "mlp_in": "dgram", "mlp_out": "dgram"}  # nanogpt_split's types
    assert roles.role_key(split) == "attn_qk=stiefel,attn_vo=dgram,mlp=dgram"
    llama = dict(split, attn_k="dgram", mlp_gate="dgram")
    assert roles.role_key(llama) == "attn_qk=mixed,attn_vo=dgram,mlp=dgram"
    label = roles.LABELS["attn_qk=stiefel,attn_vo=dgram,mlp=dgram"]
    assert label == "QK Stiefel, VO DGram, MLP DGram"
    assert not any(roles.role_truth("tiny", 2000, 0.05, {"n_embd": 32}).values())  # not stored

    class Study:  # what points_of reads: the space the study recorded
        def __init__(self, geometries):
            self.user_attrs = {"space": {"geometries": geometries}}

    assert fidelity.points_of(Study({"attn": [], "mlp": []})).labels is fidelity.PAPER
    scored = fidelity.points_of(Study({"attn_qk": [], "attn_vo": [], "mlp": []}))
    assert list(scored.labels) == roles.ROLE_POINTS
    assert scored.key_of(split) == roles.role_key(split)

    keys = [f"p{i}" for i in range(8)]
    mean = {k: float(i) for i, k in enumerate(keys)}  # p0 best
    assert no_run_rules.chances(mean, keys, keys=keys)[0] == pytest.approx(1 / 8)
    # the worst four pruned (tied last): ρ >= 0.8 iff Σ d² <= 10 among the best four's order,
    # 13 of the 24 orders
    assert no_run_rules.chances(mean, keys[:4], keys=keys) == pytest.approx((1 / 4, 13 / 24))
    assert no_run_rules.chances(mean, keys[4:], keys=keys)[0] == 0
