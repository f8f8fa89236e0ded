"""Several machines on one study: workers sharing a PostgreSQL storage, one of them killed.

The ``postgres_url`` fixture (``tests/_postgres.py``) starts a throwaway PostgreSQL server
on 127.0.0.1, or skips with the reason where none can run.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
import yaml
from optuna.trial import TrialState

pytestmark = pytest.mark.usefixtures("no_plots")  # no test here checks a plot: tests/_no_plots.py

REPO = Path(__file__).resolve().parents[3]


# --------------------------------------------------------------------------- the tests
PROXY = {"model": "tiny", "batch_size": 2, "eval_batches": 1, "probe_batch_size": 1, "device": "cpu",
         "steps": 300, "eval_every": 100, "probe_every": 100}
GRID = {"attn": ["adamw", "oblique"], "mlp": ["adamw", "euclidean"]}
STALE_AFTER = 5  # seconds; workers beat every 1.25 s


def env() -> dict:
    return {**os.environ, "OMP_NUM_THREADS": "1",
            "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}


def worker(space: Path, url: str, runs_dir: Path, cwd: Path) -> subprocess.Popen:
    """One machine's `geosearch search` on the shared study (each with its own run dir)."""
    cmd = [sys.executable, "-m", "geosearch", "search", "--space", str(space), "--study", "pg",
           "--storage", url, "--runs-dir", str(runs_dir), "--stale-after", str(STALE_AFTER)]
    return subprocess.Popen(cmd, cwd=cwd, env=env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)


_STORAGES: dict[str, optuna.storages.BaseStorage] = {}


def load(url: str) -> optuna.Study:
    """The study, through one storage (one connection pool) per URL for all the polling."""
    from geosearch.search.runtime.storage import open_storage

    if url not in _STORAGES:
        _STORAGES[url] = open_storage("unused", url)[0]  # postgresql:// with the installed driver
    return optuna.load_study(study_name="pg", storage=_STORAGES[url])


def finish(proc: subprocess.Popen, timeout: float = 240) -> str:
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"a worker ran past {timeout} s:\n{out[-3000:]}")
    assert proc.returncode == 0, out[-3000:]
    return out


@pytest.mark.slow
def test_a_postgresql_storage_tests_its_connections_before_use(postgres_url):
    from geosearch.search.runtime.storage import open_storage

    storage, desc = open_storage("unused", postgres_url)
    assert isinstance(storage, optuna.storages.RDBStorage) and desc == postgres_url
    # a trial can outlast an idle timeout: a dropped connection is replaced, not an error
    assert storage.engine_kwargs["pool_pre_ping"] is True


@pytest.mark.slow
def test_a_read_only_open_of_a_database_without_a_study_creates_no_tables(postgres_url):
    import sqlalchemy

    from geosearch.util.errors import ConfigError
    from geosearch.search.runtime.storage import _with_installed_driver, open_run_study

    def tables() -> list[str]:
        engine = sqlalchemy.create_engine(_with_installed_driver(postgres_url))
        try:
            return sqlalchemy.inspect(engine).get_table_names()
        finally:
            engine.dispose()

    if tables():
        pytest.skip("no database of its own on this server (no CREATEDB right)")
    # Rule: export and report (read-only) refuse a database without Optuna's tables instead of
    # creating them, naming --storage (given) and leaving it empty.
    with pytest.raises(ConfigError, match=r"^--storage: holds no tables, not an Optuna storage"):
        open_run_study("unused", storage=postgres_url, read_only=True)
    assert tables() == []
    optuna.create_study(study_name="pg", storage=load_storage(postgres_url))
    assert open_run_study("unused", storage=postgres_url, read_only=True).study_name == "pg"


def load_storage(url: str) -> optuna.storages.BaseStorage:
    from geosearch.search.runtime.storage import open_storage

    return open_storage("unused", url)[0]


@pytest.mark.slow
def test_a_killed_worker_on_another_machine_has_its_trial_run_again(postgres_url, tmp_path):
    """Workers A and B share the study through PostgreSQL, each with its own run directory
    (as on two machines). A is killed mid-trial. Its lock file is removed first, as it would
    not be visible from another machine: the others can only tell from A's heartbeat, which
    stops. B (if still running ``STALE_AFTER`` s later) or a worker C started afterwards
    fails A's trial and queues its point again; the study ends with every point completed
    once and nothing completed before the kill lost."""
    space = tmp_path / "pg.yaml"
    space.write_text(yaml.safe_dump({"version": 1, "geometries": GRID, "proxy": PROXY, "baselines": []}), encoding="utf-8")
    a = worker(space, postgres_url, tmp_path / "machine-a", tmp_path)
    procs = [a]
    try:
        # B joins once A has created the study and queued the grid
        deadline = time.monotonic() + 120
        while True:
            assert a.poll() is None, a.stdout.read()[-3000:]
            assert time.monotonic() < deadline, "worker A did not start a trial in time"
            time.sleep(0.2)
            try:
                trials = load(postgres_url).get_trials()
            except Exception:  # noqa: BLE001 - not created yet
                continue
            if any(t.state == TrialState.RUNNING for t in trials):
                break
        b = worker(space, postgres_url, tmp_path / "machine-b", tmp_path)
        procs.append(b)
        # kill A while it is training, most steps still ahead
        while True:
            assert a.poll() is None, "worker A finished before it could be killed:\n" + a.stdout.read()[-3000:]
            assert time.monotonic() < deadline + 120, "no trial of A reached the middle of its run"
            time.sleep(0.1)
            trials = load(postgres_url).get_trials()
            mine = [t for t in trials if t.state == TrialState.RUNNING
                    and (t.user_attrs.get("worker") or {}).get("pid") == a.pid
                    and t.user_attrs.get("status") == "running" and len(t.user_attrs.get("probe_history", [])) <= 1]
            if mine:
                break
        killed = mine[0]
        shutil.rmtree(tmp_path / "machine-a" / "pg" / ".locks")  # A's disk is not visible elsewhere
        completed_before = {t.number: t.value for t in trials if t.state == TrialState.COMPLETE}
        os.kill(a.pid, signal.SIGKILL)
        killed_at = time.monotonic()
        a.communicate()

        outputs = [finish(b)]
        state = lambda: next(t for t in load(postgres_url).get_trials()  # noqa: E731
                             if t.number == killed.number).state
        if state() == TrialState.RUNNING:  # B was done before A's heartbeat went stale
            time.sleep(max(0.0, killed_at + STALE_AFTER + 1 - time.monotonic()))
            c = worker(space, postgres_url, tmp_path / "machine-c", tmp_path)
            procs.append(c)
            outputs.append(finish(c))
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.communicate()

    printed = "\n".join(outputs)
    print(f"recovered by worker {'BC'[len(outputs) - 1]}")  # which path ran, for -s
    # the dead trial was found through its heartbeat (its lock was not visible), not its lock
    assert re.search(rf"trial {killed.number} was left running by a worker that died \(no heartbeat "
                     rf"from {re.escape(socket.gethostname())} for \d+ s\)", printed), printed[-3000:]
    trials = load(postgres_url).get_trials()
    by_number = {t.number: t for t in trials}
    assert by_number[killed.number].state == TrialState.FAIL
    assert by_number[killed.number].user_attrs["status"] == "running"  # it never finished
    retry = [t for t in trials if t.user_attrs.get("retry_of") == killed.number]
    assert len(retry) == 1 and retry[0].state == TrialState.COMPLETE and retry[0].params == killed.params
    for n, value in completed_before.items():  # no completed trial lost or redone
        assert by_number[n].state == TrialState.COMPLETE and by_number[n].value == value
    complete = sorted(tuple(sorted(t.params.items())) for t in trials if t.state == TrialState.COMPLETE)
    assert len(complete) == 4 and len(set(complete)) == 4  # every grid point completed exactly once
