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
