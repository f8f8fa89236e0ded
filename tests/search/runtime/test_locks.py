"""Tests of geosearch.search.runtime.locks: the command lock of a study's run directory.

The ask lock and its record are tested through ``Owner.ask`` and the dead-trial recovery
in tests/search/runtime/test_liveness.py.
"""

from __future__ import annotations

import os

import pytest

from geosearch.util.errors import GeosearchError
from geosearch.search.runtime import liveness
from geosearch.search.runtime.locks import CommandLock


@pytest.mark.skipif(os.name != "posix", reason="command locks are POSIX flocks")
def test_of_two_commands_on_a_study_one_holds_it_and_the_other_is_refused_naming_its_pid(tmp_path):
    run_dir = tmp_path / "runs" / "t"
    first = CommandLock(run_dir, "t")
    try:
        # an flock is per open file: a second open of the same file, here too, is refused
        with pytest.raises(GeosearchError, match=rf"study 't' in .* is being run by another process "
                                                 rf"on this machine \(pid {os.getpid()}\)"):
            CommandLock(run_dir, "t")
    finally:
        first.close()
    with CommandLock(run_dir, "t"):  # released: the next command takes it
        assert liveness.live_processes(run_dir) == []  # not a worker's lock file
