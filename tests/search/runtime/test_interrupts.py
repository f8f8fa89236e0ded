"""Tests of geosearch.search.runtime.interrupts: the Ctrl-C latch and the SIGINT deferral.

The recording of an interrupted trial is tested through the search (tests/faults/,
tests/search/runtime/test_distributed.py); here the signal handling alone, in the main thread.
"""

from __future__ import annotations

import os
import signal
import sys

import pytest

from geosearch.search.runtime.interrupts import (
    CTRL_C,
    OutputClosed,
    ctrl_c_latch,
    output_guard,
    sigint_deferred,
    sigint_honoured,
    signals_held,
)

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="sends SIGINT to itself")


def _send_sigint_and_wait() -> None:
    # To this thread (the main one): os.kill to the process lets the kernel pick any of its
    # threads (torch's, a tracker's), which on a loaded machine may run the C handler only
    # after the loop below has ended, and then no KeyboardInterrupt comes in time.
    signal.raise_signal(signal.SIGINT)
    for _ in range(100_000):  # the handler runs between two bytecodes of the main thread
        pass


@pytest.fixture
def python_sigint():
    """SIGINT with Python's own handler (KeyboardInterrupt) for the test, put back after.

    A process started with SIGINT ignored keeps it ignored, and Python then installs no
    handler: a background job of a non-interactive shell starts so (``pytest ... &`` in a CI
    script; the case ``sigint_honoured`` exists for). A test that expects a delivered Ctrl-C to
    raise sets the handler itself instead of taking it from how the suite was started."""
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, before)


def test_the_latch_keeps_a_swallowed_ctrl_c_and_restores_the_handler():
    before = signal.getsignal(signal.SIGINT)
    with ctrl_c_latch():
        assert not CTRL_C.is_set()
        with pytest.raises(KeyboardInterrupt):  # raised, as without the latch...
            _send_sigint_and_wait()
        assert CTRL_C.is_set()  # ...and kept, for where Python swallows the KeyboardInterrupt
    assert not CTRL_C.is_set()  # cleared when the loop ends
    assert signal.getsignal(signal.SIGINT) == before


def test_sigint_is_ignored_while_deferred_and_handled_after():
    before = signal.getsignal(signal.SIGINT)
    with sigint_deferred():
        _send_sigint_and_wait()  # ignored: no KeyboardInterrupt
    assert signal.getsignal(signal.SIGINT) == before


def test_signals_held_arrive_after_the_block_and_the_handlers_come_back(python_sigint):
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    finished = False
    with pytest.raises(KeyboardInterrupt):
        with signals_held():
            _send_sigint_and_wait()  # held: the block goes on to its end
            with signals_held():  # nested: held once, delivered by the outermost block
                pass
            finished = True
    assert finished
    assert {s: signal.getsignal(s) for s in before} == before


def test_a_signal_held_during_a_journal_append_comes_after_the_record_and_the_lock(
        tmp_path, monkeypatch, python_sigint):
    from geosearch.search.runtime.journal import SafeJournalFile

    journal = SafeJournalFile(tmp_path / "journal.log")
    release = journal.lock.release

    def release_then_signal() -> None:  # the moment a Ctrl-C once landed in
        release()
        _send_sigint_and_wait()

    monkeypatch.setattr(journal.lock, "release", release_then_signal)
    with pytest.raises(KeyboardInterrupt):
        journal.append_logs([{"op_code": 0, "worker_id": "w", "study_name": "s", "directions": [1]}])
    assert (tmp_path / "journal.log").read_text().count("\n") == 1  # the record is whole
    assert not os.path.lexists(str(tmp_path / "journal.log") + ".lock")  # the lock is released


def test_a_ctrl_c_python_ignores_in_its_own_callback_is_kept_without_a_traceback(monkeypatch):
    class RaisesWhenCollected:
        def __init__(self, exc):
            self.exc = exc

        def __del__(self):
            if self.exc is KeyboardInterrupt:
                _send_sigint_and_wait()  # a Ctrl-C landing in a callback Python runs for itself
            else:
                raise self.exc

    shown = []
    monkeypatch.setattr(sys, "unraisablehook", lambda u: shown.append(type(u.exc_value)))
    with ctrl_c_latch():
        obj = RaisesWhenCollected(KeyboardInterrupt)
        del obj  # Python ignores the KeyboardInterrupt raised in __del__
        assert CTRL_C.is_set()  # kept, for the trainer's callback to raise again
        obj = RaisesWhenCollected(ValueError)
        del obj
    assert shown == [ValueError]  # the Ctrl-C's traceback is not shown; anything else is
    obj = RaisesWhenCollected(ValueError)
    del obj
    assert shown == [ValueError, ValueError]  # the hook is back


def test_an_ignored_sigint_is_a_ctrl_c_again_inside_the_block_only():
    before = signal.signal(signal.SIGINT, signal.SIG_IGN)  # as a shell script's `cmd &` starts it
    try:
        with pytest.raises(KeyboardInterrupt):
            with sigint_honoured():
                _send_sigint_and_wait()
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
        _send_sigint_and_wait()  # ignored again after the block
    finally:
        signal.signal(signal.SIGINT, before)


def test_a_stdout_whose_reader_left_raises_output_closed_once(monkeypatch):
    read, write = os.pipe()
    os.close(read)  # `search | head`: head has exited
    stream = os.fdopen(write, "w")
    monkeypatch.setattr(sys, "stdout", stream)
    with pytest.raises(OutputClosed):  # a KeyboardInterrupt: the search stops as on Ctrl-C
        with output_guard():
            print("trial 0 ...", flush=True)
    assert sys.stdout is stream and isinstance(OutputClosed(), KeyboardInterrupt)
    print("after", flush=True)  # stdout now goes to os.devnull: Python's flush at exit passes
    stream.close()
