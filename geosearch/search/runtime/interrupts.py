"""Ctrl-C while a search trains: keep the signal, and hold it off while it is recorded.

The trial loop runs inside :class:`ctrl_c_latch`, which remembers a Ctrl-C (:data:`CTRL_C`)
that Python swallowed in a callback of its own, so that the trainer's callback can raise
it again; :class:`sigint_deferred` ignores SIGINT while the loop records an interrupted
trial (``torchrun`` sends every rank a second one); :class:`signals_held` holds SIGINT and
SIGTERM for the length of a storage write and delivers them after it, so that a signal
never lands inside a lock's release; :class:`sigint_honoured` gives SIGINT back its
KeyboardInterrupt in a process that started with it ignored (a shell script's ``cmd &``);
:class:`output_guard` takes a stdout whose reader left (``search | head``) as a Ctrl-C
(:class:`OutputClosed`). All act in the main thread only.
How an interrupted trial is recorded is in ``docs/design.md`` ("Trial outcomes").
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from typing import Any, TextIO

__all__ = ["CTRL_C", "DEFERRED", "OutputClosed", "ctrl_c_latch", "output_guard", "sigint_deferred",
           "sigint_honoured", "signals_held"]

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


class sigint_honoured:
    """Take SIGINT as Ctrl-C (KeyboardInterrupt) in this block, also in a process that
    started with SIGINT ignored: a shell script starts a background job (``cmd &``) so, and
    Python then installs no handler. The ``--workers`` parent runs no trial loop (whose
    latch installs one), so ``kill -INT`` of it went unheard; its workers are stopped as on
    a Ctrl-C now. A handler already in place is left as it is."""

    def __enter__(self) -> None:
        self.active = (threading.current_thread() is threading.main_thread()
                       and signal.getsignal(signal.SIGINT) is signal.SIG_IGN
                       and not DEFERRED.is_set())
        if self.active:
            signal.signal(signal.SIGINT, signal.default_int_handler)

    def __exit__(self, *exc: object) -> None:
        if self.active:
            signal.signal(signal.SIGINT, signal.SIG_IGN)


class OutputClosed(KeyboardInterrupt):
    """The reader of the command's stdout left (``geosearch search | head -5``): the search
    stops as on a Ctrl-C (its trial recorded interrupted, the study resumable) and says so
    on stderr."""


class output_guard:
    """Wrap ``sys.stdout`` in this block so that a write or flush that finds its reader gone
    (``BrokenPipeError``: Python ignores SIGPIPE) raises :class:`OutputClosed` once, with
    stdout then pointed at ``os.devnull`` so that nothing later (Python's own flush at exit)
    fails on it. Before, ``search | head`` ended with exit 0 in mid-search."""

    def __enter__(self) -> None:
        self.stream = sys.stdout
        sys.stdout = _Guarded(self.stream)  # type: ignore[assignment]

    def __exit__(self, *exc: object) -> None:
        sys.stdout = self.stream


class _Guarded:
    def __init__(self, stream: TextIO) -> None:
        self._stream, self._closed = stream, False

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except BrokenPipeError:
            return self._reader_left()

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            self._reader_left()

    def _reader_left(self) -> int:
        try:
            os.dup2(os.open(os.devnull, os.O_WRONLY), self._stream.fileno())
        except (OSError, ValueError):
            pass
        if self._closed:
            return 0
        self._closed = True
        raise OutputClosed

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)
