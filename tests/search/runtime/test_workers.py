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
from geosearch.search.runtime.urls import STORAGE_ENV, mask_url
from geosearch.search.runtime.workers import _worker_command, _worker_env

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
