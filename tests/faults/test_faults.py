"""Faults injected into real ``geosearch search`` processes; after each, the same command is
rerun and the invariants of ``_harness.violations`` must hold (see ``_harness``).

Each scenario runs once here, with a fixed seed for the moment the fault hits;
``benchmarks/chaos.py --faults N`` loops them with N seeds for ``docs/reliability.md``.
"""

from __future__ import annotations

import random
import signal
import sys

import pytest
from _harness import (
    damaged_storage,
    dropped_connection,
    full_disk,
    partial_point,
    second_command,
    shared_storage,
    simultaneous,
    signal_parent,
    signal_single,
    signal_worker,
    trial_failures,
)
from _small_fs import small_filesystem
from _stops import closed_output, train_terminated

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="the faults are injected through Linux /proc and mount")


def check(result) -> None:
    assert result.landed, f"the fault hit after the search ended, so it tested nothing: {result}"
    assert result.violations == [], f"{result.fault}: {result.violations} ({result.notes})"


@pytest.mark.slow
def test_the_workers_stop_with_their_parent_killed_or_terminated(tmp_path):
    check(signal_parent(tmp_path, random.Random(1), (signal.SIGKILL, signal.SIGTERM)))


@pytest.mark.slow
def test_a_killed_worker_loses_nothing(tmp_path):
    check(signal_worker(tmp_path, random.Random(2), signal.SIGKILL))


@pytest.mark.slow
def test_a_terminated_search_records_its_trial_and_exits_130(tmp_path):
    check(signal_single(tmp_path, random.Random(3), signal.SIGTERM))


@pytest.mark.slow
def test_a_second_command_on_a_live_study_is_refused(tmp_path):
    check(second_command(tmp_path, random.Random(4)))


@pytest.mark.slow
def test_an_environment_failure_is_retried_and_an_assignment_failure_is_not(tmp_path):
    check(trial_failures(tmp_path, random.Random(7)))


@pytest.mark.slow
def test_two_commands_started_at_once_train_each_point_once(tmp_path):
    result = simultaneous(tmp_path, random.Random(7), runs=2)
    check(result)
    assert result.notes == ["one command refused in 2 of 2 runs"]


@pytest.mark.slow
def test_two_run_directories_on_one_storage_leave_nothing_waiting(tmp_path):
    result = shared_storage(tmp_path, random.Random(8), runs=1)
    check(result)
    assert result.notes == ["the grid was queued twice in 1 of 1 runs"]


@pytest.fixture
def can_mount(tmp_path):
    try:
        with small_filesystem(tmp_path / "probe", "1m"):
            pass
    except OSError as e:
        pytest.skip(f"no small file system for the full-disk faults: {e} (run as root)")


@pytest.mark.slow
@pytest.mark.parametrize("workers", [2, 1], ids=["journal-workers", "sqlite-one-process"])
def test_a_full_file_system_loses_nothing_and_the_rerun_resumes_at_once(workers, tmp_path, can_mount):
    check(full_disk(tmp_path, random.Random(5), workers))


@pytest.mark.slow
def test_dropped_postgresql_connections_lose_nothing(tmp_path, postgres_server):  # noqa: F811
    check(dropped_connection(tmp_path, random.Random(6), postgres_server))


@pytest.mark.slow
@pytest.mark.parametrize(("action", "workers"), [("kill", 1), ("int", 1), ("kill", 2), ("int", 2),
                                                 ("parent-term", 2)])
def test_a_trial_stopped_between_its_parameters_leaves_no_point_untrained(action, workers, tmp_path):
    check(partial_point(tmp_path, action, workers))


@pytest.mark.slow
def test_a_storage_damaged_after_a_kill_is_recovered_and_resumed(tmp_path):
    # the other kinds and damages: tests/cli/test_recover.py, and chaos.py's loop
    check(damaged_storage(tmp_path, random.Random(9), "journal", "garbage"))


@pytest.mark.slow
def test_a_search_whose_output_closes_stops_as_on_ctrl_c_and_resumes(tmp_path):
    check(closed_output(tmp_path, random.Random(10)))


@pytest.mark.slow
def test_a_terminated_train_ends_its_tensorboard_run(tmp_path):
    pytest.importorskip("tensorboard")
    check(train_terminated(tmp_path, random.Random(11)))
