"""A password in a ``postgresql://`` storage URL shows in no worker's command line (``ps``),
in no file of the run directory (trial ``config.yaml``, worker logs, report, export) and in
no output: the workers get it through the environment."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from _harness import alive, run, start, wait_until, worker_pids, write_space

SECRET = "s3cret-pw"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_the_storage_password_shows_nowhere(tmp_path, postgres_url):  # noqa: F811
    # the test server trusts 127.0.0.1: any password opens it, as a real one would
    scheme, rest = postgres_url.split("://", 1)
    user, host = rest.split("@", 1)
    url = f"{scheme}://{user}:{SECRET}@{host}"
    space = write_space(tmp_path, "sec")
    args = ["search", "--space", str(space), "--runs-dir", "runs", "--storage", url]
    code, first = run([*args, "--trials", "1"], tmp_path, tmp_path / "first.log")  # one process
    assert code == 0, first[-2000:]

    cmd = start([*args, "--workers", "2"], tmp_path, tmp_path / "workers.log")
    seen: list[bytes] = []

    def workers_started() -> bool:
        pids = worker_pids(cmd.pid)
        for pid in pids:
            try:
                seen.append(Path(f"/proc/{pid}/cmdline").read_bytes())
            except OSError:
                pass
        return len(pids) == 2 or cmd.proc.poll() is not None

    wait_until(workers_started, 120, "the workers")
    assert cmd.wait() == 0, cmd.output()[-2000:]
    assert seen and all(b"--storage" in c and SECRET.encode() not in c for c in seen)
    assert all(not alive(p) for p in worker_pids(cmd.pid))

    run_dir = tmp_path / "runs" / "sec"
    configs = list(run_dir.glob("trials/*/config.yaml"))
    assert len(configs) == 4
    assert any(":***@" in c.read_text() for c in configs)  # the one-process run's command, masked
    for path in [p for p in tmp_path.rglob("*") if p.is_file()]:
        if path.suffix not in (".png", ".db"):
            assert SECRET not in path.read_text(errors="replace"), path
