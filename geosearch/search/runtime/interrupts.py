"""Ctrl-C while a search trains: keep the signal, and hold it off while it is recorded.

The trial loop runs inside :class:`ctrl_c_latch`, which remembers a Ctrl-C (:data:`CTRL_C`)
that Python swallowed in a callback of its own, so that the trainer's callback can raise
it again; :class:`sigint_deferred` ignores SIGINT while the loop records an interrupted
trial (``torchrun`` sends every rank a second one); :class:`signals_held` holds SIGINT and
SIGTERM for the length of a storage write and delivers them after it, so that a signal
never lands inside a lock's release. All act in the main thread only.
How an interrupted trial is recorded is in ``docs/design.md`` ("Trial outcomes").
"""

from __future__ import annotations

import signal
import sys
import threading

__all__ = ["CTRL_C", "DEFERRED", "ctrl_c_latch", "sigint_deferred", "signals_held"]

CTRL_C = threading.Event()
"""Set by a Ctrl-C while a :class:`ctrl_c_latch` is active; cleared when it ends."""
DEFERRED = threading.Event()
"""Set while :class:`sigint_deferred` holds Ctrl-C off (SIGTERM-as-Ctrl-C waits too)."""


class ctrl_c_latch:
    """Remember a Ctrl-C (main thread only) while the loop runs, as well as raising it.

    SIGINT raises KeyboardInterrupt wherever the main thread is; when that is inside a
    callback Python runs for itself (an import lock's or a weakref's), Python prints
    "Exception ignored" with a traceback and the run goes on. The latch keeps the signal,
    and the trainer's callback raises it again at its next call, where the loop records the
    interruption; the traceback of a KeyboardInterrupt so kept is not printed (Python's
    ``sys.unraisablehook``; every other ignored exception still is).
    """

    def __enter__(self) -> None:
        CTRL_C.clear()
        self.previous = None
        if threading.current_thread() is threading.main_thread():
            self.previous = signal.signal(signal.SIGINT, self._handle)
            self.hook = sys.unraisablehook
            sys.unraisablehook = self._unraisable

    def _unraisable(self, unraisable: object) -> None:
        if not (CTRL_C.is_set() and isinstance(getattr(unraisable, "exc_value", None), KeyboardInterrupt)):
            self.hook(unraisable)

    def _handle(self, signum: int, frame: object) -> None:
        CTRL_C.set()
        if callable(self.previous) and self.previous is not self._handle:
            self.previous(signum, frame)
        else:
            raise KeyboardInterrupt

    def __exit__(self, *exc: object) -> None:
        if self.previous is not None:
            signal.signal(signal.SIGINT, self.previous)
            sys.unraisablehook = self.hook
        CTRL_C.clear()


class sigint_deferred:
    """Hold off SIGINT (main thread only) while a Ctrl-C is being recorded."""

    def __enter__(self) -> None:
        self.previous = None
        if threading.current_thread() is threading.main_thread():
            DEFERRED.set()
            self.previous = signal.signal(signal.SIGINT, signal.SIG_IGN)

    def __exit__(self, *exc: object) -> None:
        if self.previous is not None:
            signal.signal(signal.SIGINT, self.previous)
            DEFERRED.clear()


class signals_held:
    """Hold SIGINT and SIGTERM (main thread only) while a short critical section runs, then
    deliver the first one that came to the handler in place again.

    For writes that must not be cut: a KeyboardInterrupt raised inside Optuna's journal lock
    release once left the lock file behind and the trial unrecorded (its cleanup raised
    another error instead). Nested use holds once; a signal that came is delivered when the
    outermost block ends.
    """

    _SIGNALS = (signal.SIGINT, signal.SIGTERM)
    _depth = 0

    def __enter__(self) -> None:
        self.active = threading.current_thread() is threading.main_thread() and signals_held._depth == 0
        signals_held._depth += self.active
        if not self.active:
            return
        self.caught: list[int] = []
        self.previous = {}
        for signum in self._SIGNALS:
            self.previous[signum] = signal.signal(signum, self._hold)

    def _hold(self, signum: int, frame: object) -> None:
        self.caught.append(signum)

    def __exit__(self, *exc: object) -> None:
        if not self.active:
            return
        for signum, handler in self.previous.items():
            signal.signal(signum, signal.SIG_DFL if handler is None else handler)
        signals_held._depth -= 1
        if self.caught:
            signal.raise_signal(self.caught[0])
