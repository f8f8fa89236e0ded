"""``--workers N``: run a study's trials in N processes of the same command on this machine.

The launching process has created the study and queued its points; :func:`run_workers`
starts N ``python -m geosearch search ... --worker-index i`` processes, each on GPU
``i mod #GPUs`` or, without GPUs, on ``cpu_count // N`` threads, with their output in
``workers/worker<i>.log``. It hands each trial to a callback as it finishes, forwards
Ctrl-C once, and fails with a worker's last log line when one exits with an error. How
the workers share the study is in ``docs/design.md`` ("Workers").
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import optuna
from optuna.trial import FrozenTrial

from geosearch.errors import GeosearchError
from geosearch.search.liveness import STALE_AFTER
from geosearch.search.space import SearchSpace
from geosearch.search.storage import SPACE_FILE, WORKERS_DIR

__all__ = ["run_workers", "share_cpu"]


def _cpu_share(workers: int) -> int:
    """CPU threads per worker when ``workers`` processes share this machine."""
    return max(1, (os.cpu_count() or 1) // workers)


def share_cpu(workers: int) -> None:
    """In a worker process: take this process's share of the CPU threads."""
    import torch

    torch.set_num_threads(_cpu_share(workers))


def run_workers(space: SearchSpace, run_dir: Path, storage: str | None, workers: int,
                study: optuna.Study, on_trial: Callable[[FrozenTrial], None],
                echo: Callable[[str], None], stale_after: float = STALE_AFTER) -> str:
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

    Returns:
        Why the search stopped, in words.

    Raises:
        GeosearchError: a worker exited with an error (its last log line).
        KeyboardInterrupt: Ctrl-C, forwarded once to every worker (each fails and
            re-queues its trial), then raised here.
    """
    import torch

    logs = run_dir / WORKERS_DIR
    logs.mkdir(parents=True, exist_ok=True)
    gpus: list[str] = []
    if space.proxy.device != "cpu" and torch.cuda.is_available():
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        gpus = [g for g in visible.split(",") if g.strip()] if visible else \
            [str(i) for i in range(torch.cuda.device_count())]
    if gpus and workers > len(gpus):
        echo(f"note: {workers} workers share {len(gpus)} GPUs")
    cmd = [sys.executable, "-m", "geosearch", "search", "--space", str(run_dir / SPACE_FILE),
           "--study", space.name, "--runs-dir", str(run_dir.parent), "--workers", str(workers)]
    if storage is not None:
        cmd += ["--storage", storage]
    if stale_after != STALE_AFTER:
        cmd += ["--stale-after", repr(stale_after)]
    procs: list[tuple[int, subprocess.Popen, Path]] = []
    threads = _cpu_share(workers)
    for i in range(workers):
        env = dict(os.environ)
        if gpus:
            env["CUDA_VISIBLE_DEVICES"] = gpus[i % len(gpus)]
        else:
            env["OMP_NUM_THREADS"] = str(threads)
        log = logs / f"worker{i}.log"
        with open(log, "w", encoding="utf-8") as f:
            # own session: a terminal's Ctrl-C reaches the parent only, which forwards it once
            p = subprocess.Popen([*cmd, "--worker-index", str(i)], stdout=f, stderr=subprocess.STDOUT,
                                 env=env, start_new_session=True)
        procs.append((i, p, log))
    echo(f"started {workers} workers ({'GPUs ' + ', '.join(gpus[:workers]) if gpus else f'{threads} CPU threads each'}); "
         f"logs in {logs}")

    seen = {t.number for t in study.get_trials(deepcopy=False) if t.state.is_finished()}
    try:
        while True:
            running = [p for _, p, _ in procs if p.poll() is None]
            for t in study.get_trials(deepcopy=False):
                if t.state.is_finished() and t.number not in seen:
                    seen.add(t.number)
                    on_trial(t)
            if not running:
                break
            time.sleep(0.5)
    except KeyboardInterrupt:
        for _, p, _ in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGINT)
        deadline = time.monotonic() + 60
        for _, p, _ in procs:
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
        raise
    bad = [(i, p.returncode, log) for i, p, log in procs if p.returncode not in (0,)]
    if bad:
        i, code, log = bad[0]
        tail = [ln for ln in log.read_text(encoding="utf-8", errors="replace").splitlines() if ln.strip()]
        raise GeosearchError(f"worker {i} exited with code {code}"
                             + (f": {tail[-1]}" if tail else "") + f" (log: {log})")
    return f"all {workers} workers finished"
