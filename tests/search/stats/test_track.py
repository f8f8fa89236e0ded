"""The track record's one source: ``track_record.json``, as the benchmark scores it."""

from __future__ import annotations

import sys
from pathlib import Path

from geosearch.search.stats.track import ORDER_RECORD, track_record, track_text

BENCHMARKS = Path(__file__).resolve().parents[3] / "benchmarks"


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
