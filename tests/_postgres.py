"""A throwaway PostgreSQL server for the tests that need one (``postgres_server``,
``postgres_url``; registered in ``conftest.py``).

``postgres_url`` starts a server on 127.0.0.1 (``initdb`` into a temporary directory,
``pg_ctl start`` on a free port, stopped at the end), so plain ``python -m pytest`` runs
those tests wherever the server binaries are installed (``apt-get install postgresql``;
``.ci/run`` does it). ``GEOSEARCH_TEST_POSTGRES_URL`` points them at a server of your own
instead. Without either they are skipped, with the reason; with
``GEOSEARCH_REQUIRE_POSTGRES=1`` (set by ``.ci/run`` once the binaries are there) they fail
instead of skipping.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import optuna
import pytest

optuna.logging.set_verbosity(optuna.logging.WARNING)


# --------------------------------------------------------------------------- the server
def _unavailable(reason: str) -> None:
    if os.environ.get("GEOSEARCH_REQUIRE_POSTGRES") == "1":
        pytest.fail(f"GEOSEARCH_REQUIRE_POSTGRES=1 but {reason}")
    pytest.skip(reason)


def _binary(name: str) -> str | None:
    found = shutil.which(name)
    if found:
        return found
    # Debian/Ubuntu keep the server binaries off PATH
    for folder in sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True):
        if os.access(os.path.join(folder, name), os.X_OK):
            return os.path.join(folder, name)
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _Server:
    """A PostgreSQL server in a temporary directory, trust auth on 127.0.0.1 only."""

    def __init__(self, initdb: str, pg_ctl: str) -> None:
        self.pg_ctl = pg_ctl
        self.prefix: list[str] = []
        self.dir = Path(tempfile.mkdtemp(prefix="geosearch-pg-"))
        if os.geteuid() == 0:  # the server refuses to run as root: run it as `postgres`
            try:
                user = pwd.getpwnam("postgres")
            except KeyError:
                shutil.rmtree(self.dir)
                _unavailable("running as root and there is no 'postgres' user to run the "
                             "PostgreSQL server as")
            os.chown(self.dir, user.pw_uid, user.pw_gid)
            self.prefix = ["runuser", "-u", "postgres", "--"]
        self.data, self.log = self.dir / "data", self.dir / "server.log"
        self.port = _free_port()
        self._run([initdb, "-D", str(self.data), "-U", "postgres", "-A", "trust", "-E", "UTF8",
                   "--no-sync"])
        options = (f"-c listen_addresses=127.0.0.1 -p {self.port} -k {self.dir} -c fsync=off "
                   "-c synchronous_commit=off -c full_page_writes=off -c max_connections=100")
        self._run([pg_ctl, "-D", str(self.data), "-l", str(self.log), "-w", "-t", "60",
                   "-o", options, "start"])
        self.url = f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, cmd: list[str]) -> None:
        r = subprocess.run([*self.prefix, *cmd], capture_output=True, text=True, timeout=120)
        if r.returncode != 0:
            log = self.log.read_text(errors="replace")[-2000:] if self.log.exists() else ""
            raise RuntimeError(f"{' '.join(cmd)} failed:\n{r.stdout}{r.stderr}{log}")

    def stop(self) -> None:
        try:
            self._run([self.pg_ctl, "-D", str(self.data), "-m", "immediate", "-w", "stop"])
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[str]:
    """The URL of a PostgreSQL server for this test session (its ``postgres`` database)."""
    try:
        import psycopg2  # noqa: F401 - the driver SQLAlchemy uses for postgresql:// URLs
    except ImportError:
        _unavailable("psycopg2 is not installed (pip install 'geosearch[postgres]')")
    given = os.environ.get("GEOSEARCH_TEST_POSTGRES_URL")
    if given:
        yield given
        return
    initdb, pg_ctl = _binary("initdb"), _binary("pg_ctl")
    if not (initdb and pg_ctl):
        _unavailable("PostgreSQL server binaries not found: no initdb/pg_ctl on PATH or in "
                     "/usr/lib/postgresql/*/bin (apt-get install postgresql, or set "
                     "GEOSEARCH_TEST_POSTGRES_URL)")
    server = _Server(initdb, pg_ctl)
    try:
        yield server.url
    finally:
        server.stop()


@pytest.fixture
def postgres_url(postgres_server: str) -> str:
    """A fresh, empty database on the session's server (the server's URL if it cannot be made)."""
    import psycopg2

    name = f"geosearch_{uuid.uuid4().hex[:12]}"
    try:
        conn = psycopg2.connect(postgres_server)
    except psycopg2.Error as e:
        pytest.fail(f"cannot connect to {postgres_server}: {e}")
    try:
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute(f"CREATE DATABASE {name}")
    except psycopg2.Error:  # no CREATEDB right on a given server: share its database
        return postgres_server
    finally:
        conn.close()
    return postgres_server.rsplit("/", 1)[0] + "/" + name
