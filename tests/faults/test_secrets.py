"""A storage URL's secret, in every form (a password holding ``/``, ``:``, ``@`` or ``%``,
a ``?password=`` parameter), shows in no output of ``search``, ``report`` and ``export``, in
no file of the run directory (trial ``config.yaml``, artifacts, worker logs, report.md) and
on no worker's command line (``ps``): the workers get the URL through the environment.

The forms are in ``tests/_secret_urls.py``; the masking itself is unit-tested in
``tests/search/runtime/test_storage.py``.
"""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from _bad_inputs import Case, run_case
from _harness import alive, run, start, wait_until, worker_pids, write_space
from _secret_urls import ABSENT, FORMS, RAW_AT, SecretUrl

from geosearch.search.runtime import storage as storage_module
from geosearch.util.urls import STORAGE_ENV, mask_url

linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
FULL = [f for f in FORMS if f.form in ("all", "query")]
"""The forms a whole search runs with: every special character of a password in one, and
the query parameter (the others differ from "all" only in the URL's spelling, checked by
the error paths below)."""


def _files_leaking(form: SecretUrl, root: Path) -> list[str]:
    return [f"{p.relative_to(root)}: {form.leaks(p.read_bytes())}" for p in sorted(root.rglob("*"))
            if p.is_file() and p.suffix != ".png" and form.leaks(p.read_bytes())]


@pytest.mark.slow
@linux
@pytest.mark.parametrize("form", FULL, ids=lambda f: f.form)
def test_a_search_shows_its_storage_secret_nowhere(form, tmp_path, postgres_url):  # noqa: F811
    # the test server trusts 127.0.0.1: any password opens it, as a real one would (so the
    # workers' environment is read below to see that they get the full URL)
    url, shown = form.url(postgres_url), mask_url(form.url(postgres_url))
    assert shown != url and form.leaks(shown) == []
    space = write_space(tmp_path, "sec")
    args = ["search", "--space", str(space), "--runs-dir", "runs", "--storage", url]
    code, first = run([*args, "--trials", "1"], tmp_path, tmp_path / "first.log")  # one process
    assert code == 0, first[-2000:]
    assert f"study 'sec' in {shown}: new" in first  # the header line

    cmd = start([*args, "--workers", "2"], tmp_path, tmp_path / "workers.log")
    seen: dict[int, tuple[bytes, bytes]] = {}

    def workers_started() -> bool:
        for pid in worker_pids(cmd.pid):
            try:
                seen.setdefault(pid, (Path(f"/proc/{pid}/cmdline").read_bytes(),
                                      Path(f"/proc/{pid}/environ").read_bytes()))
            except OSError:
                pass
        return len(seen) == 2 or cmd.proc.poll() is not None

    wait_until(workers_started, 120, "the workers")
    assert cmd.wait() == 0, cmd.output()[-2000:]
    assert len(seen) == 2 and all(not alive(p) for p in seen)
    for cmdline, environ in seen.values():
        argv = cmdline.split(b"\0")
        assert argv[argv.index(b"--storage") + 1] == shown.encode() and form.leaks(cmdline) == []
        assert f"{STORAGE_ENV}={url}".encode() in environ.split(b"\0")  # what the worker opens

    for command in ("report", "export"):
        code, out = run([command, "runs/sec", "--storage", url], tmp_path, tmp_path / f"{command}.log")
        assert code == 0, out[-2000:]

    run_dir = tmp_path / "runs" / "sec"
    configs = sorted(run_dir.glob("trials/*/config.yaml"))
    assert len(configs) == 4
    for c in configs:  # the command each trial records: the search's, or a worker's
        assert shown in yaml.safe_load(c.read_text())["command"], c
    assert list((run_dir / "artifacts").rglob("*")) and list((run_dir / "workers").glob("*.log"))
    report = (run_dir / "report.md").read_text()
    assert f"storage: `{shown}`" in report and f"optuna-dashboard {shown} --artifact-dir " in report
    assert _files_leaking(form, tmp_path) == []  # outputs (*.log), report, artifacts, configs, ...


@pytest.fixture
def no_retry_wait(monkeypatch):
    """A refused connection is tried 3 times, 0.5-1.5 s apart: here without the waits."""
    monkeypatch.setattr(storage_module, "time", SimpleNamespace(sleep=lambda s: None))


def _commands(form: SecretUrl) -> list[tuple[str, Case]]:
    url = form.url(ABSENT)
    space = {"version": 1, "geometries": {"attn": ["adamw"], "mlp": ["adamw"]},
             "proxy": {"model": "tiny", "steps": 2, "device": "cpu"}}

    def search(d: Path) -> list[str]:
        (d / "s.yaml").write_text(yaml.safe_dump(space), encoding="utf-8")
        return ["search", "--space", "s.yaml", "--runs-dir", "runs", "--storage", url, "--workers", "2"]

    return [("search", Case("search", search)),
            ("report", Case("report", lambda d: ["report", "runs/s", "--storage", url])),
            ("export", Case("export", lambda d: ["export", "runs/s", f"--storage={url}"]))]


@pytest.mark.parametrize("form", [*FORMS, RAW_AT], ids=lambda f: f.form)
def test_a_storage_that_cannot_be_opened_shows_no_secret(form, tmp_path, no_retry_wait):
    for name, case in _commands(form):
        outcome = run_case(case, tmp_path / name)
        assert outcome.problems() == [], f"{name}: {outcome.stderr}"  # one line, exit 2, nothing written
        assert form.leaks(outcome.stderr + outcome.stdout) == [], outcome.stderr
        assert f"cannot open the storage {mask_url(form.url(ABSENT))!r}: " in outcome.line, outcome.line
        if form is RAW_AT:  # refused before connecting, with a way out
            assert outcome.line.endswith("URL-encoded, as %40"), outcome.line
        else:  # the driver's own words, or that there is none
            assert "OperationalError" in outcome.line or "driver is not installed" in outcome.line, \
                outcome.line
