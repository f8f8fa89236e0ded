"""``--workers N``: run a study's trials in N processes of the same command on this machine.

The launching process has created the study and queued its points; :func:`run_workers`
starts N ``python -m geosearch search ... --worker-index i`` processes, each on GPU
``i mod #GPUs`` or, without GPUs, on ``cpu_count // N`` threads, with their output
appended to ``workers/worker<i>.log``. It hands each trial to a callback as it finishes,
forwards Ctrl-C (and SIGTERM, taken as Ctrl-C by :func:`sigterm_as_ctrl_c`) once, and
fails with a worker's last log line when one exits with an error. The workers share one
process group apart from the terminal's, and follow their parent (:func:`follow_parent`):
when it dies, even by SIGKILL, they get SIGTERM, record their trial as interrupted and
exit. A storage URL with secrets (a password, a ``password=`` parameter) reaches them in
the environment; their command line carries its masked form. Without ``--workers`` a
search on a CPU takes one single-thread worker per core when its grid has a point for each
(:func:`auto_workers`). How the workers share the study is in ``docs/design.md`` ("Workers").
"""

from __future__ import annotations

import contextlib
import ctypes
import datetime as _dt
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import optuna
from optuna.trial import FrozenTrial

from geosearch.util.errors import GeosearchError
from geosearch.search.runtime.distributed import launch_world
from geosearch.search.runtime.interrupts import DEFERRED, sigint_honoured
from geosearch.search.runtime.liveness import PARENT_ENV, STALE_AFTER, Owner

if TYPE_CHECKING:  # pragma: no cover
    from geosearch.search.space.spec import SearchSpace
from geosearch.search.runtime.storage import DB_FILE, JOURNAL_FILE, SPACE_FILE, WORKERS_DIR
from geosearch.util.urls import hide_secrets

__all__ = ["auto_workers", "cap_workers", "choose_workers", "cpu_cores", "follow_parent",
           "process_count", "run_workers", "share_cpu", "sigterm_as_ctrl_c", "thread_note"]

_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
_STOP_WAIT = 60.0  # seconds the workers get to record an interrupted trial
_LOG_HEADER = "--- geosearch worker log, "  # starts each run's part of a worker log


def _cpu_share(workers: int) -> int:
    """CPU threads per worker when ``workers`` processes share this machine."""
    return max(1, cpu_cores() // workers)


def cpu_cores() -> int:
    """The CPU cores this process may run on (its affinity mask where the system has one)."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def choose_workers(cores: int, points: int | None, *, threads: str | None = None,
                   gpus: bool = False, one_process: str | None = None) -> tuple[int, str]:
    """How many processes a search runs when ``--workers`` is not given, and the header line
    that says so: ``cores`` single-thread workers when there are at least as many
    ``points`` to train as cores (on a CPU, trials of small models run faster as several
    one-thread processes than as one process on every thread), else one process.

    Args:
        cores: the CPU cores (:func:`cpu_cores`).
        points: the trials the study runs to (its queued grid); ``None`` when a sampler
            proposes them (each worker seeds its own, so the points would depend on the
            process count: one process keeps a seeded search reproducible).
        threads: ``"--threads N"`` or ``"OMP_NUM_THREADS=N"`` when given: the user chose
            the threads, one process.
        gpus: the trials run on GPUs (``--workers N`` puts one worker on each).
        one_process: why the storage wants one process, in words (a ``study.db``), or None.
    """
    flag = "; --workers N for N processes)"
    if gpus:
        return 1, "workers: one process (GPU trials" + flag
    if threads is not None:
        return 1, f"workers: one process ({threads} is set" + flag
    if one_process is not None:
        return 1, f"workers: one process ({one_process}" + flag
    if points is None:
        return 1, "workers: one process (a seeded sampler proposes per process" + flag
    if cores < 2 or points < cores:
        return 1, f"workers: one process ({points} points for {cores} cores" + flag
    return cores, f"workers: {cores} single-thread processes ({cores} cores; --workers 1 for one process)"


def auto_workers(space: SearchSpace, run_dir: Path, storage: object,
                 points: int | None, threads: int | None = None) -> tuple[int, str]:
    """:func:`choose_workers` for ``space`` on this machine: its cores, ``threads``
    (``--threads``) or ``OMP_NUM_THREADS``, its GPUs, and the storage a rerun finds (a study
    started as one process in ``study.db`` resumes as one; a ``journal.log`` or a server URL
    takes workers)."""
    why = None
    if storage is not None and not isinstance(storage, str):
        why = "a storage object of this process"
    elif storage is None and (run_dir / DB_FILE).is_file() and not (run_dir / JOURNAL_FILE).is_file():
        why = f"a study one process started, in {DB_FILE}"
    elif storage is not None and storage.startswith("sqlite:"):
        why = "an SQLite storage"
    omp = os.environ.get("OMP_NUM_THREADS")
    chosen = f"--threads {threads}" if threads else \
        None if omp is None else f"OMP_NUM_THREADS={omp}"
    n, line = choose_workers(cpu_cores(), points, threads=chosen,
                             gpus=bool(_worker_gpus(space)), one_process=why)
    note = thread_note() if n == 1 else None  # one process on every thread of a loaded machine
    return n, line if note is None else f"{line}\n{note}"


def process_count(space: SearchSpace, run_dir: Path, storage: object, workers: int | None,
                  points: int | None, *, threads: int | None, auto: bool,
                  cap: bool) -> tuple[int, str | None]:
    """How many processes run a search, and the line that says why (or ``None``):
    ``--workers`` capped (:func:`cap_workers`, when ``cap``), else :func:`auto_workers` (when
    ``auto``: no Optuna objects, no distributed launch), else one. ``threads``
    (``--threads``) are this process's torch threads from here on, so the line counts them."""
    if threads:
        share_cpu(1, threads)
    if workers is None:
        return auto_workers(space, run_dir, storage, points, threads) if auto else (1, None)
    return cap_workers(space, workers) if cap else (workers, None)


def cap_workers(space: SearchSpace, workers: int) -> tuple[int, str | None]:
    """``--workers`` capped by this machine: its cores (each worker needs one), and its GPUs
    when the trials run on GPUs (a worker takes one); the line that says so, or ``None``
    when ``workers`` fits (``--workers 1000`` on 2 cores started 241 processes before)."""
    gpus, cores = _worker_gpus(space), cpu_cores()
    cap = min(cores, len(gpus)) if gpus else cores
    if workers <= cap:
        return workers, None
    what = f"{len(gpus)} GPU{'s' if len(gpus) > 1 else ''}" if gpus and len(gpus) < cores else \
        f"{cores} core{'s' if cores > 1 else ''}"
    return cap, (f"workers: {cap} process{'es' if cap > 1 else ''}, not {workers}: this machine "
                 f"has {what} (more processes would only share them)")


def thread_note() -> str | None:
    """One line when torch's threads exceed the cores other processes leave free (the
    1-minute load average): on a loaded machine each thread waits for a core, and a step
    took 50x its idle time; ``None`` when they fit, or the load cannot be read."""
    import torch

    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):  # not POSIX
        return None
    threads, cores = torch.get_num_threads(), cpu_cores()
    free = max(1, int(cores - load + 0.5))
    if threads <= free:
        return None
    return (f"note: torch runs {threads} threads, but about {free} of this machine's {cores} "
            f"cores are free (load {load:.1f}); --threads {free} (or OMP_NUM_THREADS={free}) "
            "sets its threads")


def share_cpu(workers: int, threads: int | None = None) -> None:
    """In a worker process (or a search or a run given ``--threads``): take ``threads``
    torch threads, else this process's share of the cores."""
    import torch

    torch.set_num_threads(threads or _cpu_share(workers))


@contextlib.contextmanager
def sigterm_as_ctrl_c() -> Iterator[None]:
    """While in this block, take SIGTERM as Ctrl-C (main thread only): the running trial is
    recorded as interrupted and queued again, and the command exits 130.

    The handler calls the SIGINT handler in place at the time of the signal, so that the
    trial loop's own Ctrl-C handling applies. Under a distributed launch the launcher owns
    SIGTERM (it stops every rank when one dies; the next run finds the trial dead through
    its lock): nothing changes there.
    """
    if threading.current_thread() is not threading.main_thread() or launch_world()[1] > 1:
        yield
        return

    def handle(signum: int, frame: Any) -> None:
        if DEFERRED.is_set():  # Ctrl-C held off (an interruption being recorded)
            return
        # a SIGINT ignored since the process started (a shell's background job) is not a
        # hold-off: SIGTERM still stops the run
        handler = signal.getsignal(signal.SIGINT)
        if callable(handler):
            handler(signal.SIGINT, frame)
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, handle)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def follow_parent() -> None:
    """In a worker process: get SIGTERM when the ``--workers`` command that started it dies.

    On Linux through the kernel (``prctl(PR_SET_PDEATHSIG)``), elsewhere through a thread
    that looks at the parent pid every second. Nothing happens outside a worker process
    (no :data:`~geosearch.search.runtime.liveness.PARENT_ENV`).
    """
    parent = os.environ.get(PARENT_ENV, "")
    if not parent.isdigit():
        return
    parent_pid = int(parent)
    armed = False
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            armed = libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0) == 0
        except (OSError, AttributeError):
            armed = False
    if not armed:
        def watch() -> None:
            while os.getppid() == parent_pid:
                time.sleep(1.0)
            os.kill(os.getpid(), signal.SIGTERM)

        threading.Thread(target=watch, name="follow-parent", daemon=True).start()
    elif os.getppid() != parent_pid:  # it died before the signal was armed
        os.kill(os.getpid(), signal.SIGTERM)


def _stop(procs: list[tuple[int, subprocess.Popen, Path]]) -> None:
    """Ctrl-C every live worker once; kill those still running after :data:`_STOP_WAIT` s."""
    for _, p, _ in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGINT)
    deadline = time.monotonic() + _STOP_WAIT
    for _, p, _ in procs:
        try:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def run_workers(space: SearchSpace, run_dir: Path, storage: str | None, workers: int,
                study: optuna.Study, on_trial: Callable[[FrozenTrial], None],
                echo: Callable[[str], None], stale_after: float = STALE_AFTER,
                max_retries: int | None = None, threads: int | None = None) -> str:
    """Start ``workers`` processes on the study, hand on their trials as they finish, wait.

    Args:
        space: the search space (its ``space.yaml`` in ``run_dir`` is what they run).
        run_dir: ``<runs-dir>/<study>``.
        storage: the ``--storage`` the workers share, ``None`` for the run directory's.
        workers: how many processes.
        study: the study, to watch.
        on_trial: called with each trial that finishes while the workers run.
        echo: prints one line.
        stale_after: passed on to the workers.
        max_retries: passed on to the workers (``None``: their default).
        threads: each worker's torch threads (``--threads``; ``None``: a share of the cores).

    Returns:
        Why the search stopped, in words.

    Raises:
        GeosearchError: a worker exited with an error (its last log line).
        KeyboardInterrupt: Ctrl-C, forwarded once to every worker (each fails and
            re-queues its trial), then raised here. Any other exception here stops the
            workers the same way before it is raised.
    """
    gpus = _worker_gpus(space)
    logs = run_dir / WORKERS_DIR
    logs.mkdir(parents=True, exist_ok=True)
    if gpus and workers > len(gpus):
        echo(f"note: {workers} workers share {len(gpus)} GPUs")
    cmd, secret_env = _worker_command(space, run_dir, storage, workers, stale_after, max_retries,
                                      threads)
    procs: list[tuple[int, subprocess.Popen, Path]] = []
    threads = threads or _cpu_share(workers)
    owner = Owner(run_dir)  # a later command sees this run as live until the workers are done
    with sigint_honoured():  # a background job's ignored SIGINT stops the workers too
        try:
            for i in range(workers):
                env = _worker_env(i, gpus, secret_env, threads)
                log = logs / f"worker{i}.log"
                procs.append((i, _start_worker(i, cmd, env, log, procs), log))
            where = "GPUs " + ", ".join(gpus[:workers]) if gpus else f"{threads} CPU threads each"
            echo(f"started {workers} workers ({where}); logs in {logs}")
            _hand_on_trials(study, procs, on_trial)
        except BaseException:
            _stop(procs)
            raise
        finally:
            owner.close()
    _check_exits(procs)
    return f"all {workers} workers finished"


def _worker_gpus(space: SearchSpace) -> list[str]:
    """The GPUs the workers take in turn (``CUDA_VISIBLE_DEVICES``, else all); none for CPU runs."""
    import torch

    gpus: list[str] = []
    if space.proxy.device != "cpu" and torch.cuda.is_available():
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        gpus = [g for g in visible.split(",") if g.strip()] if visible else \
            [str(i) for i in range(torch.cuda.device_count())]
    return gpus


def _worker_command(space: SearchSpace, run_dir: Path, storage: str | None, workers: int,
                    stale_after: float, max_retries: int | None,
                    threads: int | None = None) -> tuple[list[str], dict[str, str]]:
    """Every worker's command line (without ``--worker-index``), and the environment that
    hands them the full storage URL when the command line carries its masked form."""
    cmd = [sys.executable, "-m", "geosearch", "search", "--space", str(run_dir / SPACE_FILE),
           "--study", space.name, "--runs-dir", str(run_dir.parent), "--workers", str(workers)]
    secret_env: dict[str, str] = {}
    if storage is not None:
        storage, secret_env = hide_secrets(storage)  # `ps` shows command lines to everyone
        cmd += ["--storage", storage]
    if stale_after != STALE_AFTER:
        cmd += ["--stale-after", repr(stale_after)]
    if max_retries is not None:
        cmd += ["--max-retries", str(max_retries)]
    if threads:  # --threads: each worker's (its OMP_NUM_THREADS too)
        cmd += ["--threads", str(threads)]
    return cmd, secret_env


def _worker_env(i: int, gpus: list[str], secret_env: dict[str, str], threads: int) -> dict[str, str]:
    """Worker ``i``'s environment: its parent's pid, the full storage URL (``secret_env``),
    and its GPU or CPU threads."""
    env = dict(os.environ, **{PARENT_ENV: str(os.getpid())}, **secret_env)
    if gpus:
        env["CUDA_VISIBLE_DEVICES"] = gpus[i % len(gpus)]
    else:
        env["OMP_NUM_THREADS"] = str(threads)
    return env


def _start_worker(i: int, cmd: list[str], env: dict[str, str], log: Path,
                  procs: list[tuple[int, subprocess.Popen, Path]]) -> subprocess.Popen:
    """Start worker ``i``, its output appended to ``log`` after a header line."""
    with open(log, "a", encoding="utf-8") as f:  # a rerun keeps the earlier runs' logs
        f.write(f"{_LOG_HEADER}{_dt.datetime.now().isoformat(timespec='seconds')}: worker {i} of "
                f"parent pid {os.getpid()}\n")
        f.flush()
        return subprocess.Popen([*cmd, "--worker-index", str(i)], stdout=f,
                                stderr=subprocess.STDOUT, env=env, **_group(procs))


def _hand_on_trials(study: optuna.Study, procs: list[tuple[int, subprocess.Popen, Path]],
                    on_trial: Callable[[FrozenTrial], None]) -> None:
    """Call ``on_trial`` with each trial that finishes until every worker has exited."""
    seen = {t.number for t in study.get_trials(deepcopy=False) if t.state.is_finished()}
    while True:
        running = [p for _, p, _ in procs if p.poll() is None]
        for t in study.get_trials(deepcopy=False):
            if t.state.is_finished() and t.number not in seen:
                seen.add(t.number)
                on_trial(t)
        if not running:
            break
        time.sleep(0.5)


def _check_exits(procs: list[tuple[int, subprocess.Popen, Path]]) -> None:
    """Raise GeosearchError with the last log line of the first worker that exited with an error."""
    bad = [(i, p.returncode, log) for i, p, log in procs if p.returncode not in (0,)]
    if bad:
        i, code, log = bad[0]
        this_run = log.read_text(encoding="utf-8", errors="replace").rsplit(_LOG_HEADER, 1)[-1]
        tail = [ln for ln in this_run.splitlines()[1:] if ln.strip()]  # after the header line
        how = (f"was stopped by {signal.Signals(-code).name}" if code < 0 and -code in signal.valid_signals()
               else f"exited with code {code}")
        raise GeosearchError(f"worker {i} {how}" + (f": {tail[-1][:300]}" if tail else "")
                             + f" (log: {log}); rerun the same command to resume")


def _group(procs: list[tuple[int, subprocess.Popen, Path]]) -> dict[str, Any]:
    """Popen arguments that put the workers in one process group of their own, apart from
    the terminal's: a terminal's Ctrl-C reaches the parent only, which forwards it once."""
    if sys.version_info < (3, 11):  # no process_group argument: a session each
        return {"start_new_session": True}
    return {"process_group": procs[0][1].pid if procs else 0}
