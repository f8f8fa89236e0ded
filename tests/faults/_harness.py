"""Faults injected for real into a tiny search, and the invariants checked after each.

A scenario starts the real command (``python -m geosearch search`` on a 4-point grid of the
tiny proxy, a fraction of a second per trial), injects one fault at a seeded random moment
once training has begun (a signal to the parent or to a worker, a full file system, a
dropped database connection, a second command, exceptions raised inside trials), reruns the same command as the README
says, and checks with :func:`violations` that:

1. every trial completed before the fault is kept, with its value;
2. every point was trained exactly once (one trial with a verdict per point, each
   ``metrics.jsonl`` written by one process: its steps strictly increase);
3. ``geosearch report`` and ``geosearch export`` read the study;
4. the budget is met (every point of the grid has a verdict);
5. nothing is left RUNNING, and no process of the study is left alive.

``tests/faults/test_faults.py`` runs each scenario once; ``benchmarks/chaos.py --faults N``
loops them with N seeds and prints the table of ``docs/reliability.md``.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import optuna
import yaml
from _small_fs import fill, small_filesystem
from optuna.trial import TrialState

REPO = Path(__file__).resolve().parents[2]
GRID = {"attn": ["adamw", "euclidean"], "mlp": ["adamw", "euclidean"]}
STEPS = 60
PROXY = {"model": "tiny", "batch_size": 2, "eval_batches": 1, "probe_batch_size": 1, "device": "cpu",
         "steps": STEPS, "eval_every": 20, "probe_every": 20}
POINTS = {(a, m) for a in GRID["attn"] for m in GRID["mlp"]}
TIMEOUT = 180.0  # seconds any one command may take before the scenario fails
INTERRUPTED = (130, -signal.SIGINT)
"""Exit codes of an interrupted search: 130, or (rarely, on main too) death by SIGINT after
the CLI returned 130, when CPython's "unhandled KeyboardInterrupt" flag was set by code it
ran through ``PyRun_*`` while the signal landed (the trial is recorded either way)."""

optuna.logging.set_verbosity(optuna.logging.WARNING)


# --------------------------------------------------------------------------- processes
def env(**extra: str) -> dict[str, str]:
    """The environment of the commands: this checkout first, one thread each."""
    return {**os.environ, "OMP_NUM_THREADS": "1", "MPLBACKEND": "Agg",
            "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""), **extra}


def write_space(folder: Path, name: str) -> Path:
    """A 4-point grid search space ``name`` in ``folder``."""
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump({"version": 1, "name": name, "geometries": GRID, "proxy": PROXY,
                                    "baselines": []}),
                    encoding="utf-8")
    return path


@dataclass
class Command:
    """A ``geosearch`` command running in the background, its output in files."""

    proc: subprocess.Popen
    log: Path

    @property
    def pid(self) -> int:
        return self.proc.pid

    def output(self) -> str:
        return self.log.read_text(encoding="utf-8", errors="replace") if self.log.exists() else ""

    def wait(self, timeout: float = TIMEOUT) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            kill_tree(self.pid)
            self.proc.wait()
            raise AssertionError(f"the command ran past {timeout:g} s:\n{self.output()[-3000:]}") from None


def start(args: list[str], cwd: Path, log: Path, **extra_env: str) -> Command:
    """Start ``python -m geosearch ARGS`` in ``cwd``; stdout and stderr go to ``log``."""
    with open(log, "w", encoding="utf-8") as f:
        # a shell's background job ignores SIGINT: give it the handler a terminal gives
        proc = subprocess.Popen([sys.executable, "-m", "geosearch", *args], cwd=cwd, env=env(**extra_env),
                                stdout=f, stderr=subprocess.STDOUT,
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    return Command(proc, log)


def run(args: list[str], cwd: Path, log: Path, **extra_env: str) -> tuple[int, str]:
    """Run ``python -m geosearch ARGS`` to its end: ``(exit code, output)``."""
    cmd = start(args, cwd, log, **extra_env)
    return cmd.wait(), cmd.output()


def children(pid: int) -> list[int]:
    """The live descendants of ``pid`` (Linux ``/proc``)."""
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        parents.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], [pid]
    while todo:
        for c in parents.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie does not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def kill_tree(pid: int) -> None:
    """SIGKILL ``pid`` and its descendants (cleanup)."""
    for p in [*children(pid), pid]:
        with contextlib.suppress(OSError):
            os.kill(p, signal.SIGKILL)


def wait_until(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


# --------------------------------------------------------------------------- the study
def study_trials(run_dir: Path, storage: str | None = None) -> list[optuna.trial.FrozenTrial]:
    """The trials of the run directory's study (or of ``storage``), as stored now."""
    from geosearch.search.runtime.storage import open_run_study

    return open_run_study(run_dir, storage=storage).get_trials(deepcopy=False)


def completed(run_dir: Path, storage: str | None = None) -> dict[int, float]:
    """``{number: value}`` of the completed trials, ``{}`` when the study cannot be read yet."""
    try:
        return {t.number: t.value for t in study_trials(run_dir, storage) if t.state == TrialState.COMPLETE}
    except Exception:  # noqa: BLE001 - not created yet, or being written
        return {}


def in_training(run_dir: Path, storage: str | None = None) -> bool:
    """Whether a trial is training (RUNNING, status ``running``)."""
    from geosearch.search.records import STATUS

    try:
        trials = study_trials(run_dir, storage)
    except Exception:  # noqa: BLE001 - not created yet, or being written
        return False
    return any(t.state == TrialState.RUNNING and t.user_attrs.get(STATUS) == "running" for t in trials)


def mid_trial(cmd: Command, run_dir: Path, rng: random.Random, storage: str | None = None,
              spread: float = 1.0) -> bool:
    """Wait until a trial trains, then a seeded random ``[0, spread)`` s more; returns
    whether the command still runs (the fault then lands mid-search)."""
    wait_until(lambda: in_training(run_dir, storage) or cmd.proc.poll() is not None, TIMEOUT,
               "a trial in training")
    time.sleep(rng.uniform(0.0, spread))
    return cmd.proc.poll() is None


def worker_pids(parent: int) -> list[int]:
    """The ``--worker-index`` processes started by ``parent``."""
    out = []
    for pid in children(parent):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"--worker-index" in cmdline:
            out.append(pid)
    return out


def point(t: optuna.trial.FrozenTrial) -> tuple[str, str]:
    return t.params.get("geometry.attn"), t.params.get("geometry.mlp")


def violations(run_dir: Path, before: dict[int, float], storage: str | None = None,
               pids: list[int] = ()) -> list[str]:
    """Every broken invariant (see the module docstring) after a fault and the rerun."""
    from geosearch.cli import main

    out = []
    try:
        trials = study_trials(run_dir, storage)
    except Exception as e:  # noqa: BLE001 - the study does not read: everything is broken
        return [f"the study does not read: {type(e).__name__}: {e}"]
    out += _lost_trials(trials, before)
    out += _verdict_problems(trials)
    running = [t.number for t in trials if t.state == TrialState.RUNNING]
    if running:
        out.append(f"trials left RUNNING: {running}")
    out += _shared_metrics(run_dir)
    extra = ["--storage", storage] if storage else []
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()) as err:
        if main(["export", str(run_dir), "-o", str(run_dir / "exported.yaml"), *extra]) != 0:
            out.append(f"export failed: {err.getvalue().strip()[:300]}")
        if main(["report", str(run_dir), "--no-plots", *extra]) != 0:
            out.append(f"report failed: {err.getvalue().strip()[:300]}")
    left = [p for p in pids if alive(p)]
    if left:
        out.append(f"processes of the study still alive: {left}")
    return out


def _lost_trials(trials: list[optuna.trial.FrozenTrial], before: dict[int, float]) -> list[str]:
    """Invariant 1: each trial completed before the fault, lost or with another value."""
    by_number = {t.number: t for t in trials}
    out = []
    for n, value in before.items():
        t = by_number.get(n)
        if t is None or t.state != TrialState.COMPLETE or t.value != value:
            out.append(f"completed trial {n} ({value}) lost or changed")
    return out


def _verdict_problems(trials: list[optuna.trial.FrozenTrial]) -> list[str]:
    """Invariants 2 and 4: the points with more than one verdict, and those with none."""
    from geosearch.search.records import FINISHED, trial_status

    out = []
    verdicts: dict[tuple[str, str], int] = {}
    for t in trials:
        if trial_status(t) in FINISHED:
            verdicts[point(t)] = verdicts.get(point(t), 0) + 1
    twice = [p for p, k in verdicts.items() if k > 1]
    if twice:
        out.append(f"points trained more than once: {sorted(twice)}")
    missing = POINTS - set(verdicts)
    if missing:
        out.append(f"budget not met: no verdict for {sorted(missing)}")
    return out


def _shared_metrics(run_dir: Path) -> list[str]:
    """Invariant 2: each ``metrics.jsonl`` whose steps do not strictly increase (two writers)."""
    out = []
    for metrics in sorted((run_dir / "trials").glob("**/metrics.jsonl")):
        steps = []
        for line in metrics.read_text(encoding="utf-8", errors="replace").splitlines():
            with contextlib.suppress(ValueError, AttributeError):
                steps.append(json.loads(line)["step"])
        if any(b <= a for a, b in zip(steps, steps[1:])):
            out.append(f"{metrics.relative_to(run_dir)} written by two processes (steps {steps})")
    return out


# --------------------------------------------------------------------------- scenarios
@dataclass
class Result:
    """One scenario's run."""

    fault: str
    violations: list[str]
    landed: bool
    """Whether the fault hit while the search was still running (else it tested little)."""
    notes: list[str] = field(default_factory=list)


def _search_args(space: Path, *extra: str) -> list[str]:
    return ["search", "--space", str(space), "--runs-dir", "runs", *extra]


def _begin(tmp: Path, name: str, *extra: str) -> tuple[Path, Path, list[str], Command]:
    """Start the search of study ``name`` in ``tmp``: ``(space, run dir, args, command)``."""
    space = write_space(tmp, name)
    args = _search_args(space, *extra)
    return space, tmp / "runs" / name, args, start(args, tmp, tmp / "first.log")


def _finish(tmp: Path, args: list[str], run_dir: Path, before: dict[int, float], fault: str,
            landed: bool, notes: list[str], pids: list[int] = (), storage: str | None = None,
            **extra_env: str) -> Result:
    """Rerun the command to its end and check the invariants."""
    code, output = run(args, tmp, tmp / "rerun.log", **extra_env)
    found = [] if code == 0 else [f"the rerun exited {code}: {output.strip().splitlines()[-1:]}"]
    found += violations(run_dir, before, storage, pids)
    return Result(fault, found, landed, notes)


def signal_parent(tmp: Path, rng: random.Random, sigs: tuple[signal.Signals, ...]) -> Result:
    """``--workers 2``: the parent gets each of ``sigs`` mid-search, one run each; its
    workers must stop with it (SIGTERM: exit 130 after they record their trials)."""
    space = write_space(tmp, "wp")
    run_dir = tmp / "runs" / "wp"
    args = _search_args(space, "--workers", "2")
    found, notes, before, all_pids, landed = [], [], {}, [], True
    for i, sig in enumerate(sigs):
        cmd = start(args, tmp, tmp / f"run{i}.log")
        try:
            landed &= mid_trial(cmd, run_dir, rng)
            # a rerun sees the trials the previous parent left RUNNING at once: wait for this
            # parent's own workers, so the signal lands mid-search, not in its startup
            wait_until(lambda cmd=cmd: worker_pids(cmd.pid) or cmd.proc.poll() is not None, TIMEOUT,
                       "the parent's workers")
            pids = worker_pids(cmd.pid)
            before.update(completed(run_dir))
            cmd.proc.send_signal(sig)
            code = cmd.wait()
            deadline = time.monotonic() + 30
            while any(alive(p) for p in pids) and time.monotonic() < deadline:
                time.sleep(0.1)
            orphans = [p for p in pids if alive(p)]
        finally:
            kill_tree(cmd.pid)
        all_pids += pids
        notes.append(f"{sig.name}: parent exit {code}, {len(pids)} workers stopped")
        if orphans:
            found.append(f"workers outlived their parent ({sig.name}) by 30 s: {orphans}")
        if sig == signal.SIGTERM and code not in INTERRUPTED:
            found.append(f"the parent exited {code} on SIGTERM, not 130")
    result = _finish(tmp, args, run_dir, before, " then ".join(s.name for s in sigs)
                     + " of the --workers parent", landed, notes, all_pids)
    result.violations[:0] = found
    return result


def signal_worker(tmp: Path, rng: random.Random, sig: signal.Signals) -> Result:
    """``--workers 2``: one worker, picked at random, gets ``sig`` mid-search."""
    _, run_dir, args, cmd = _begin(tmp, "ww", "--workers", "2")
    try:
        landed = mid_trial(cmd, run_dir, rng)
        pids = worker_pids(cmd.pid)
        before = completed(run_dir)
        landed &= bool(pids)
        if pids:
            os.kill(rng.choice(sorted(pids)), sig)
        code = cmd.wait()
        lines = cmd.output().strip().splitlines()
    finally:
        kill_tree(cmd.pid)
    notes = [f"parent exit {code}: {lines[-1][:120] if lines else ''}"]
    return _finish(tmp, args, run_dir, before, f"{sig.name} of a worker", landed, notes, pids)


def signal_single(tmp: Path, rng: random.Random, sig: signal.Signals) -> Result:
    """One process on SQLite gets ``sig`` mid-search."""
    _, run_dir, args, cmd = _begin(tmp, "sp")
    try:
        landed = mid_trial(cmd, run_dir, rng)
        before = completed(run_dir)
        cmd.proc.send_signal(sig)
        code = cmd.wait()
    finally:
        kill_tree(cmd.pid)
    result = _finish(tmp, args, run_dir, before, f"{sig.name} of a one-process search", landed,
                     [f"exit {code}"])
    if sig == signal.SIGTERM and landed and code not in INTERRUPTED:
        result.violations.insert(0, f"exited {code} on SIGTERM, not 130")
    return result


def second_command(tmp: Path, rng: random.Random) -> Result:
    """A second ``geosearch search`` of the same study while the first (``--workers 2``) runs:
    refused with one line; the first finishes alone."""
    # 10x the usual steps: the first command must outlast the second one's start (imports)
    longer = ("--steps", str(10 * STEPS))
    space, run_dir, args, cmd = _begin(tmp, "two", "--workers", "2", *longer)
    try:
        landed = mid_trial(cmd, run_dir, rng)
        code2, out2 = run(_search_args(space, *longer), tmp, tmp / "second.log")
        code = cmd.wait()
    finally:
        kill_tree(cmd.pid)
    found = []
    lines = out2.strip().splitlines()
    if landed and (code2 != 2 or "is being run by another process" not in (lines[-1] if lines else "")):
        found.append(f"the second command exited {code2}: {lines[-1:]}")
    if code != 0:
        found.append(f"the first command exited {code}")
    found += violations(run_dir, {}, None, [])
    return Result("a second command on the live study", found, landed, [f"second: exit {code2}"])


REFUSED = "is being run by another process on this machine"
"""What the command refused by a live run of its study says (``locks.busy_error``)."""


def start_two(first: list[str], second: list[str], tmp: Path, name: str,
              rng: random.Random) -> tuple[list[Command], list[int]]:
    """Start two commands a seeded 0-50 ms apart (logs ``<name>-a.log``, ``<name>-b.log``),
    wait for both and leave no process behind: (the commands, their exit codes)."""
    pair = [start(first, tmp, tmp / f"{name}-a.log")]
    time.sleep(rng.uniform(0.0, 0.05))
    pair.append(start(second, tmp, tmp / f"{name}-b.log"))
    try:
        codes = [cmd.wait() for cmd in pair]
    finally:
        for cmd in pair:
            kill_tree(cmd.pid)
    return pair, codes


def simultaneous(tmp: Path, rng: random.Random, runs: int, workers: int = 1) -> Result:
    """Two ``geosearch search`` commands of one new study started at the same instant (a
    seeded 0-50 ms apart), ``runs`` times (SQLite, or ``workers`` > 1: a journal): one
    command's processes train every trial, the other is refused with one line naming the
    first's pid (or, started after the first was done, finds nothing to do); every point
    is trained once."""
    found, refused = [], 0
    for i in range(runs):
        name = f"sim{i}"
        args = _search_args(write_space(tmp, name), *(["--workers", str(workers)] if workers > 1 else []))
        pair, codes = start_two(args, args, tmp, name, rng)
        run_dir = tmp / "runs" / name
        owners = {(t.user_attrs.get("worker") or {}).get("pid") for t in study_trials(run_dir)} - {None}
        if len(owners) > workers:
            found.append(f"run {i}: trials trained by {len(owners)} processes, not one command's")
        for cmd, other, code in zip(pair, pair[::-1], codes):
            lines = cmd.output().strip().splitlines()
            if code == 2 and lines and REFUSED in lines[-1] and f"(pid {other.pid})" in lines[-1]:
                refused += 1
                if cmd.pid in owners:
                    found.append(f"run {i}: the refused command trained a trial")
            elif code != 0:
                found.append(f"run {i}: a command exited {code}: {lines[-1:]}")
        found += [f"run {i}: {v}" for v in violations(run_dir, {}, None, [])]
    kind = f"journal, --workers {workers}" if workers > 1 else "SQLite, one process each"
    return Result(f"two commands started at once ({kind})", found, True,
                  [f"one command refused in {refused} of {runs} runs"])


def full_disk(tmp: Path, rng: random.Random, workers: int) -> Result:
    """The run directory's file system fills up mid-search (``workers`` > 1: the journal;
    1: SQLite); space is freed and the command rerun at once."""
    mnt = tmp / "mnt"
    with small_filesystem(mnt):
        name = "fdw" if workers > 1 else "fds"
        space = write_space(tmp, name)
        run_dir = mnt / "runs" / name
        args = ["search", "--space", str(space), "--runs-dir", str(mnt / "runs"),
                *(["--workers", str(workers)] if workers > 1 else [])]
        cmd = start(args, tmp, tmp / "first.log")
        try:
            landed = mid_trial(cmd, run_dir, rng)
            before = completed(run_dir)
            filler = fill(mnt)
            code = cmd.wait()
            lines = cmd.output().strip().splitlines()
        finally:
            kill_tree(cmd.pid)
        filler.unlink()
        notes = [f"exit {code}: {lines[-1][:160] if lines else ''}"]
        kind = "journal, --workers 2" if workers > 1 else "SQLite, one process"
        return _finish(tmp, args, run_dir, before, f"full file system ({kind})", landed, notes)


def fresh_database(server: str) -> str:
    """The URL of a new, empty database on the PostgreSQL server of URL ``server``."""
    import psycopg2

    name = f"faults_{os.getpid()}_{time.monotonic_ns()}"
    conn = psycopg2.connect(server)
    try:
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute(f"CREATE DATABASE {name}")
    finally:
        conn.close()
    return server.rsplit("/", 1)[0] + "/" + name


def dropped_connection(tmp: Path, rng: random.Random, server: str) -> Result:
    """One process on PostgreSQL (a new database of the server at URL ``server``); every
    connection of its database is terminated by the server (``pg_terminate_backend``)
    mid-trial, twice."""
    import psycopg2

    url = fresh_database(server)
    _, run_dir, args, cmd = _begin(tmp, "pg", "--storage", url)
    dropped = 0
    try:
        landed = mid_trial(cmd, run_dir, rng, url, spread=0.0)
        before = completed(run_dir, url)
        # Both drops inside the trial that is training (a drop in the instant between a
        # trial's ask() and its first attrs is the ask record's case, tests/search/runtime/test_liveness.py).
        time.sleep(rng.uniform(0.1, 0.8))
        for _ in range(2):
            conn = psycopg2.connect(url)
            try:
                conn.autocommit = True
                with conn.cursor() as cur:
                    cur.execute("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                                "WHERE datname = current_database() AND pid <> pg_backend_pid()")
                    dropped += cur.fetchone()[0]
            finally:
                conn.close()
        code = cmd.wait()
        lines = cmd.output().strip().splitlines()
    finally:
        kill_tree(cmd.pid)
    notes = [f"{dropped} connections dropped; exit {code}: {lines[-1][:160] if lines else ''}"]
    return _finish(tmp, args, run_dir, before, "PostgreSQL connections dropped mid-trial", landed,
                   notes, storage=url)


# Loaded at start-up (``sitecustomize``) by every process of :func:`trial_failures`: wraps
# the trainer so that, counted over all processes through files, point (euclidean,
# euclidean) always raises a ValueError (the assignment's failure) and the first runs of
# two other points raise torch.OutOfMemoryError (the environment's), as a GPU would.
_INJECT = """
import os
if os.environ.get("GEOSEARCH_FAULT_DIR"):
    import torch
    import geosearch.proxy.train as _t

    _real, _dir = _t.train, os.environ["GEOSEARCH_FAULT_DIR"]
    _OOM = {"attn=adamw,mlp=euclidean": 2, "attn=euclidean,mlp=adamw": 1}

    def train(config, assignment, **kw):
        g = assignment.resolve()
        key = f"attn={g['attn_qkv']},mlp={g['mlp_in']}"
        with open(os.path.join(_dir, "calls.log"), "a") as f:
            f.write(key + "\\n")
        if key == "attn=euclidean,mlp=euclidean":
            raise ValueError("this assignment cannot train (injected)")
        for i in range(_OOM.get(key, 0)):
            try:
                os.close(os.open(os.path.join(_dir, f"oom-{key}-{i}"), os.O_CREAT | os.O_EXCL))
            except FileExistsError:
                continue
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (injected)")
        return _real(config, assignment, **kw)

    _t.train = train
"""


def trial_failures(tmp: Path, rng: random.Random) -> Result:
    """``--workers 2 --max-retries 1``: exceptions raised inside trials (see ``_INJECT``):
    an out-of-memory error on the first run of one point is retried and completes; one on
    the first two runs of another point is retried once, then stays failed; a ValueError of
    a third point is not retried. ``rng`` is unused: the faults hit by point, not by time."""
    from geosearch.search.records import FAILURE_KIND, STATUS

    inject = tmp / "inject"
    inject.mkdir()
    (inject / "sitecustomize.py").write_text(_INJECT, encoding="utf-8")
    fault_env = {"GEOSEARCH_FAULT_DIR": str(inject), "PYTHONPATH": os.pathsep.join(
        [str(REPO), str(inject), os.environ.get("PYTHONPATH", "")])}
    space = write_space(tmp, "tf")
    run_dir = tmp / "runs" / "tf"
    args = _search_args(space, "--workers", "2", "--max-retries", "1")
    code, output = run(args, tmp, tmp / "first.log", **fault_env)
    lines = output.strip().splitlines()
    before = completed(run_dir)
    result = _finish(tmp, args, run_dir, before, "exceptions inside trials (out of memory, ValueError)",
                     True, [f"exit {code}: {lines[-1][:160] if lines else ''}"], **fault_env)
    calls = (inject / "calls.log").read_text(encoding="utf-8").split()
    runs = {k: calls.count(k) for k in sorted(set(calls))}
    want = {"attn=adamw,mlp=adamw": 1, "attn=adamw,mlp=euclidean": 2,
            "attn=euclidean,mlp=adamw": 2, "attn=euclidean,mlp=euclidean": 1}
    if runs != want:
        result.violations.append(f"proxy runs per point {runs}, expected {want}")
    outcome = {}
    for t in study_trials(run_dir):
        outcome.setdefault("{}/{}".format(*point(t)), []).append(
            f"{t.user_attrs.get(STATUS)}:{t.user_attrs.get(FAILURE_KIND)}")
    expected = {"adamw/adamw": ["completed:None"],
                "adamw/euclidean": ["retried:environment", "failed:environment"],
                "euclidean/adamw": ["retried:environment", "completed:None"],
                "euclidean/euclidean": ["failed:assignment"]}
    if outcome != expected:
        result.violations.append(f"trials per point {outcome}, expected {expected}")
    return result


def clean(tmp: Path) -> None:
    """Remove a scenario's directory (after a loop iteration)."""
    shutil.rmtree(tmp, ignore_errors=True)


INJECT = Path(__file__).resolve().parent / "_inject"
"""The folder of the ``sitecustomize`` that injects a fault at an exact moment."""


def partial_point(tmp: Path, action: str, workers: int) -> Result:
    """Trial 1 is stopped between the writes of its two parameters (``action``: ``kill``
    = SIGKILL, ``int`` = Ctrl-C of the process that trains it, ``parent-term`` = SIGTERM
    of the ``--workers`` parent), leaving part of its point stored; the rerun must train
    every point of the grid, each once (one process on SQLite, or ``workers`` on a
    journal)."""
    name = f"pp{workers}"
    space = write_space(tmp, name)
    run_dir = tmp / "runs" / name
    args = _search_args(space, *(["--workers", str(workers)] if workers > 1 else []))
    path = os.pathsep.join([str(INJECT), str(REPO), os.environ.get("PYTHONPATH", "")])
    cmd = start(args, tmp, tmp / "first.log", PYTHONPATH=path,
                GEOSEARCH_TEST_FAULT=f"1:geometry.mlp:{action}")
    try:
        code = cmd.wait()
        lines = cmd.output().strip().splitlines()
    finally:
        kill_tree(cmd.pid)
    partial = [t.number for t in study_trials(run_dir) if len(t.params) == 1]
    kind = f"journal, --workers {workers}" if workers > 1 else "SQLite, one process"
    return _finish(tmp, args, run_dir, {}, f"{action} between a trial's two parameters ({kind})",
                   bool(partial), [f"exit {code}: {lines[-1][:160] if lines else ''}",
                                   f"trials left with part of their point: {partial}"])


def shared_storage(tmp: Path, rng: random.Random, runs: int, kind: str = "journal") -> Result:
    """Two ``geosearch search`` commands with two run directories on one storage (``kind``:
    a ``journal`` file or an ``sqlite`` file), started together, ``runs`` times: both read the new study before either queues its
    grid (``GEOSEARCH_TEST_RACE`` holds the first queueing 2 s), so every point is queued
    twice; both must exit 0 with every point trained once and no trial left WAITING."""
    found, raced = [], 0
    path = os.pathsep.join([str(INJECT), str(REPO), os.environ.get("PYTHONPATH", "")])
    for i in range(runs):
        name = f"sh{i}"
        space = write_space(tmp, name)
        storage = f"sqlite:///{tmp / f'{name}.db'}" if kind == "sqlite" else str(tmp / f"{name}.log")
        pair = []
        for side in "ab":
            args = ["search", "--space", str(space), "--runs-dir", f"runs-{side}", "--storage", storage]
            pair.append(start(args, tmp, tmp / f"{name}-{side}.log", PYTHONPATH=path, GEOSEARCH_TEST_RACE="2"))
            time.sleep(rng.uniform(0.0, 0.05))
        try:
            codes = [cmd.wait() for cmd in pair]
        finally:
            for cmd in pair:
                kill_tree(cmd.pid)
        for cmd, code in zip(pair, codes):
            if code != 0:
                found.append(f"run {i}: a command exited {code}: {cmd.output().strip().splitlines()[-1:]}")
        trials = study_trials(tmp / "runs-a" / name, storage)
        queued = [t for t in trials if t.user_attrs.get("queued") and "baseline" not in t.user_attrs]
        raced += len(queued) > len(POINTS)
        waiting = [t.number for t in trials if t.state == TrialState.WAITING]
        if waiting:
            found.append(f"run {i}: trials left WAITING: {waiting}")
        found += [f"run {i}: {v}" for v in violations(tmp / "runs-a" / name, {}, storage, [])]
    return Result(f"two run directories on one {kind} storage, started at once", found, raced == runs,
                  [f"the grid was queued twice in {raced} of {runs} runs"])


def damaged_storage(tmp: Path, rng: random.Random, kind: str, how: str) -> Result:
    """A search (``kind``: one process on ``sqlite``, or ``--workers 2`` on a ``journal``)
    is killed mid-search (SIGKILL of every process), then its storage is damaged (``how``:
    ``truncated`` at a seeded point of its middle half, or ``garbage`` written there);
    ``export`` must refuse it with one line naming ``geosearch recover`` (the fault landed)
    or read it whole (the damage hit bytes the storage does not use, or a torn last journal
    record), ``recover`` must rebuild it from ``trials/<n>/`` (or change nothing), and the
    rerun must keep every completed trial and train every point once."""
    name = f"rc{kind[0]}{how[0]}"
    file = "journal.log" if kind == "journal" else "study.db"
    _, run_dir, args, cmd = _begin(tmp, name, *(["--workers", "2"] if kind == "journal" else []))
    try:  # once a trial is completed: the damage can then lose one
        wait_until(lambda: completed(run_dir) or cmd.proc.poll() is not None, TIMEOUT, "a completed trial")
        landed = mid_trial(cmd, run_dir, rng)
        before = completed(run_dir)
    finally:
        kill_tree(cmd.pid)
        cmd.wait()
    storage = run_dir / file
    size = storage.stat().st_size
    at = rng.randrange(size // 4, 3 * size // 4)
    if how == "truncated":
        os.truncate(storage, at)
    else:
        with open(storage, "r+b") as f:
            f.seek(at)
            f.write(b"\x00scribbled\x07" * 400)  # 4,400 bytes: pages SQLite uses
    found = []
    code, out = run(["export", str(run_dir)], tmp, tmp / "export.log")
    lines = out.strip().splitlines()
    # garbage can land in pages SQLite does not use: the study then still reads, and the
    # fault tested little (not landed); otherwise export must refuse it in one line
    refused = code == 2 and len(lines) == 1 and f"geosearch recover {run_dir}" in lines[0]
    if code not in (0, 2) or (code == 2 and len(lines) != 1):
        found.append(f"export of the damaged study exited {code}: {lines[-1:]}")
    code, out = run(["recover", str(run_dir)], tmp, tmp / "recover.log")
    said = [line for line in out.strip().splitlines() if line.startswith("rebuilt")]
    if code != 0:
        found.append(f"recover exited {code}: {out.strip().splitlines()[-1:]}")
    result = _finish(tmp, args, run_dir, before, f"{how} {file} after a SIGKILL, then recover",
                     landed and refused,
                     [f"damaged at byte {at} of {size}; {said[0][:140] if said else out.strip()[-140:]}"])
    result.violations[:0] = found
    return result
