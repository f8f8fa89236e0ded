"""Faults against the study's own files (``_study_files``): one byte changed in a stored
value on both storages, outputs onto the study's files, and a one-process and a
``--workers`` search started together on one run directory. Each runs once here;
``benchmarks/chaos.py --faults N`` loops them for ``docs/reliability.md``.
"""

from __future__ import annotations

import random
import sys

import pytest
from _study_files import flipped_bytes, mixed_start, overwrites

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not sys.platform.startswith("linux"), reason="the processes are watched through Linux /proc"
    ),
]


@pytest.mark.parametrize("kind", ["sqlite", "journal"])
def test_one_changed_byte_is_refused_and_repaired_from_the_intact_copy(kind, tmp_path):
    # one flip in the storage, one in a trial's record
    result = flipped_bytes(tmp_path, random.Random(11), kind, flips=2)
    assert result.violations == [], result.violations
    assert result.notes == ["2 flips: 2 refused, 2 repaired, 0 undetected"]


def test_no_output_writes_over_the_study_or_a_finished_run(tmp_path):
    result = overwrites(tmp_path, random.Random(12))
    assert result.violations == [], result.violations
    assert result.notes == ["10 of 10 refused, 0 files changed"]


def test_a_one_process_and_a_workers_search_started_together_leave_one_storage(tmp_path):
    result = mixed_start(tmp_path, random.Random(13), runs=1)
    assert result.violations == [], result.violations
    assert result.notes == ["one command refused in 1 of 1 runs"]
