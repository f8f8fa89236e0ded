"""``--workers N`` processes: they follow their parent, take SIGTERM as Ctrl-C, and get a
storage URL's secrets through the environment, not on their command line."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from _secret_urls import ABSENT, FORMS
from geosearch.search.runtime.liveness import PARENT_ENV, STALE_AFTER
from geosearch.util.urls import STORAGE_ENV, mask_url
from _search_helpers import make_space

from geosearch.search.runtime import workers
from geosearch.search.runtime.storage import DB_FILE, JOURNAL_FILE, resolve_storage
from geosearch.search.runtime.workers import _worker_command, _worker_env, auto_workers, choose_workers

REPO = Path(__file__).resolve().parents[3]
linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


# A parent that starts a child following it, prints the child's pid and sleeps; the child
# writes "stopped" to a file when SIGTERM reaches it (as KeyboardInterrupt, the way a worker
# records its trial).
PARENT = """
import os, subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", sys.argv[1], sys.argv[2]],
                         env={**os.environ, %r: str(os.getpid())})
print(child.pid, flush=True)
time.sleep(120)
""" % PARENT_ENV
CHILD = """
import sys, time
from geosearch.search.runtime.workers import follow_parent, sigterm_as_ctrl_c
follow_parent()
with sigterm_as_ctrl_c():
    try:
        print("ready", flush=True)
        time.sleep(120)
    except KeyboardInterrupt:
        open(sys.argv[1], "w").write("stopped")
"""


@pytest.mark.slow
@linux
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_a_worker_is_stopped_like_ctrl_c_when_its_parent_dies(sig, tmp_path):
    mark = tmp_path / "stopped"
    parent = subprocess.Popen([sys.executable, "-c", PARENT, CHILD, str(mark)], cwd=REPO,
                              stdout=subprocess.PIPE, text=True)
    try:
        child = int(parent.stdout.readline())
        assert parent.stdout.readline().strip() == "ready"  # the child's, through the same pipe
        os.kill(parent.pid, sig)
        parent.wait(timeout=30)
        deadline = time.monotonic() + 30
        while _alive(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(child), "the worker outlived its parent"
        assert mark.read_text() == "stopped"  # it ran its Ctrl-C path: a trial would be recorded
    finally:
        parent.kill()
        parent.wait()


def test_sigterm_is_ctrl_c_only_inside_the_block():
    code = ("import os, signal\n"
            "from geosearch.search.runtime.interrupts import sigint_deferred\n"
            "from geosearch.search.runtime.workers import sigterm_as_ctrl_c\n"
            "before = signal.getsignal(signal.SIGTERM)\n"
            "with sigterm_as_ctrl_c():\n"
            "    try:\n"
            "        os.kill(os.getpid(), signal.SIGTERM)\n"
            "        import time; time.sleep(5)\n"
            "    except KeyboardInterrupt:\n"
            "        print('interrupted')\n"
            "    with sigint_deferred():\n"
            "        os.kill(os.getpid(), signal.SIGTERM)  # Ctrl-C held off: so is SIGTERM\n"
            "print(signal.getsignal(signal.SIGTERM) == before)\n")
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert r.stdout.split() == ["interrupted", "True"], r.stderr


@pytest.mark.parametrize("form", FORMS, ids=lambda f: f.form)
def test_a_storage_secret_is_kept_off_command_lines(form, tmp_path):
    url = form.url(ABSENT)
    space = SimpleNamespace(name="s")
    cmd, secret_env = _worker_command(space, tmp_path / "s", url, 2, STALE_AFTER, None)
    assert cmd[cmd.index("--storage") + 1] == mask_url(url)  # `ps` shows the masked form
    assert form.leaks(" ".join(cmd)) == []
    env = _worker_env(0, [], secret_env, 1)
    assert env[STORAGE_ENV] == url and env[PARENT_ENV] == str(os.getpid())  # the worker opens it
    # a storage without secrets goes on the command line as it is, and nothing in the environment
    cmd, secret_env = _worker_command(space, tmp_path / "s", "sqlite:////runs/a:b@c/study.db", 2,
                                      STALE_AFTER, None)
    assert "sqlite:////runs/a:b@c/study.db" in cmd and secret_env == {}


# --------------------------------------------------------------------------- the default
def test_the_default_takes_one_single_thread_worker_per_core_when_the_grid_keeps_them_busy():
    n, line = choose_workers(2, 6)
    assert n == 2 and line == "workers: 2 single-thread processes (2 cores; --workers 1 for one process)"
    assert choose_workers(8, 8)[0] == 8
    # Rule: fewer points than cores, or one core: one process, and the line says why.
    assert choose_workers(4, 3) == (1, "workers: one process (3 points for 4 cores; --workers N for N "
                                       "processes)")
    assert choose_workers(1, 6)[0] == 1


@pytest.mark.parametrize("kwargs, why", [
    ({"threads": "OMP_NUM_THREADS=1"}, "OMP_NUM_THREADS=1 is set"),
    ({"threads": "--threads 1"}, "--threads 1 is set"),
    ({"gpus": True}, "GPU trials"),
    ({"one_process": "a study one process started, in study.db"}, "study.db"),
])
def test_the_user_s_threads_gpus_and_a_one_process_storage_keep_one_process(kwargs, why):
    n, line = choose_workers(2, 6, **kwargs)
    assert n == 1 and why in line and line.endswith("--workers N for N processes)")


def test_a_sampler_s_points_keep_one_process():
    # Rule: a sampler proposes the points (no grid): each worker would seed its own sampler,
    # so the search would depend on the process count; one process keeps it reproducible.
    n, line = choose_workers(2, None)
    assert n == 1 and "sampler" in line


def test_every_header_line_fits_100_columns():
    cases = [choose_workers(2, 6), choose_workers(64, 3), choose_workers(2, None),
             choose_workers(2, 6, threads="OMP_NUM_THREADS=16"), choose_workers(2, 6, gpus=True),
             choose_workers(2, 6, one_process="a study one process started, in study.db")]
    assert all(len(line) <= 100 for _, line in cases)


def test_a_rerun_finds_the_storage_its_study_was_started_in(tmp_path, monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(workers, "cpu_cores", lambda: 2)
    space = make_space({"attn": ["adamw", "euclidean"], "mlp": ["adamw", "euclidean"]})
    run_dir = tmp_path / space.name
    assert auto_workers(space, run_dir, None, 4)[0] == 2  # a new study: workers, a journal
    # Rule: a study one process started (study.db) resumes as one process, in study.db ...
    run_dir.mkdir()
    (run_dir / DB_FILE).touch()
    n, line = auto_workers(space, run_dir, None, 4)
    assert n == 1 and "study.db" in line
    assert resolve_storage(run_dir, None, workers=n).endswith(DB_FILE)
    # ... and one the workers started (journal.log) resumes with workers, in journal.log.
    (run_dir / DB_FILE).unlink()
    (run_dir / JOURNAL_FILE).touch()
    n, _ = auto_workers(space, run_dir, None, 4)
    assert n == 2 and resolve_storage(run_dir, None, workers=n).endswith(JOURNAL_FILE)
    # an SQLite URL given with --storage: one process
    assert auto_workers(space, run_dir, "sqlite:///x.db", 4)[0] == 1


def test_threads_set_this_process_and_each_worker_and_keep_one_process(tmp_path, monkeypatch):
    import torch

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(workers, "cpu_cores", lambda: 4)
    space = make_space({"attn": ["adamw", "euclidean"], "mlp": ["adamw", "euclidean"]})
    before = torch.get_num_threads()
    try:
        # Rule: --threads N sets torch's threads here, and the default then keeps one process
        # (the user chose the threads), naming the flag ...
        n, line = workers.process_count(space, tmp_path / space.name, None, None, 4,
                                        threads=3, auto=True, cap=True)
        assert torch.get_num_threads() == 3
        assert n == 1 and "(--threads 3 is set;" in line
        # ... and with --workers each worker takes N threads: the flag and the variable.
        assert workers.process_count(space, tmp_path, None, 2, 4, threads=2, auto=True,
                                     cap=True) == (2, None)
        cmd, _ = _worker_command(space, tmp_path, None, 2, STALE_AFTER, None, 2)
        assert cmd[-2:] == ["--threads", "2"]
        assert _worker_env(0, [], {}, 2)["OMP_NUM_THREADS"] == "2"
    finally:
        torch.set_num_threads(before)


# --------------------------------------------------------------------------- the cap
def test_workers_beyond_the_cores_or_the_gpus_are_cut_in_one_line(monkeypatch):
    space = make_space({"attn": ["adamw"], "mlp": ["adamw"]})
    monkeypatch.setattr(workers, "cpu_cores", lambda: 2)
    monkeypatch.setattr(workers, "_worker_gpus", lambda s: [])
    assert workers.cap_workers(space, 2) == (2, None)
    n, line = workers.cap_workers(space, 1000)
    assert n == 2 and line == ("workers: 2 processes, not 1000: this machine has 2 cores (more "
                               "processes would only share them)")
    monkeypatch.setattr(workers, "_worker_gpus", lambda s: ["0"])  # GPU trials: one worker each
    n, line = workers.cap_workers(space, 2)
    assert n == 1 and "this machine has 1 GPU (" in line and len(line) <= 100


def test_more_torch_threads_than_free_cores_is_said_in_one_line(monkeypatch):
    import torch

    monkeypatch.setattr(workers, "cpu_cores", lambda: 2)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    monkeypatch.setattr(os, "getloadavg", lambda: (1.9, 1.0, 1.0))  # another job holds 2 cores
    assert workers.thread_note() == (
        "note: torch runs 2 threads, but about 1 of this machine's 2 cores are free (load 1.9); "
        "--threads 1 (or OMP_NUM_THREADS=1) sets its threads")
    monkeypatch.setattr(os, "getloadavg", lambda: (0.2, 1.0, 1.0))
    assert workers.thread_note() is None
