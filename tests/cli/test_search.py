"""Tests of the ``search``, ``export`` and ``inspect`` commands.

Bad inputs run in-process through ``geosearch.cli.main``; killing a search and resuming it,
and two workers on one study, run the real command in subprocesses on the tiny proxy.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import optuna
import pytest
import yaml
from _secret_urls import ABSENT, FORMS
from optuna.trial import TrialState

from geosearch.assignment import load_assignment
from geosearch.cli import build_parser, main
from geosearch.search.space.spec import CLI_FLAGS

pytestmark = pytest.mark.usefixtures("no_plots")  # no test here checks a plot: tests/_no_plots.py

REPO = Path(__file__).resolve().parents[2]
PROXY = {"model": "tiny", "batch_size": 2, "eval_batches": 1, "probe_batch_size": 1, "device": "cpu"}


def write_space(path: Path, geometries: dict, steps: int = 10, every: int = 5, **extra) -> Path:
    d = {"version": 1, "geometries": geometries, "baselines": [],
         "proxy": {**PROXY, "steps": steps, "eval_every": every, "probe_every": every}, **extra}
    path.write_text(yaml.safe_dump(d), encoding="utf-8")
    return path


def geosearch_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "geosearch", *args]


def env() -> dict:
    # one intra-op thread: the tiny proxy gains nothing from more, and spinning threads of
    # several processes on a small shared machine slow every one of them down
    return {**os.environ, "OMP_NUM_THREADS": "1",
            "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}


def load(run_dir: Path, name: str) -> optuna.Study:
    db, journal = run_dir / "study.db", run_dir / "journal.log"
    storage = f"sqlite:///{db}" if db.exists() else optuna.storages.JournalStorage(
        optuna.storages.journal.JournalFileBackend(str(journal)))
    return optuna.load_study(study_name=name, storage=storage)


# --------------------------------------------------------------------------- bad inputs
GOOD = {"attn": ["adamw"], "mlp": ["adamw", "euclidean"]}
BAD_SPACES = {
    "malformed": ("version: 1\ngeometries: {attn: [stiefel\n", "malformed YAML at line"),
    "unknown_geometry": ({"attn": ["stiefle"], "mlp": ["adamw"]}, "geometries.attn: unknown geometry 'stiefle'"),
    "unknown_type": ({**GOOD, "attn_qq": ["adamw"]}, "geometries.attn_qq: unknown module type 'attn_qq'"),
    "rule_matching_nothing": (
        {"rules": [{"type": "attn_qkv", "pattern": r"attn\.c_attn\.weight$", "family": "attn"},
                   {"type": "attn_out", "pattern": r"attn\.c_proj\.weight$", "family": "attn"},
                   {"type": "mlp_in", "pattern": r"mlp\.c_fc\.weight$", "family": "mlp"},
                   {"type": "mlp_out", "pattern": r"mlp\.c_proj\.weight$", "family": "mlp"},
                   {"type": "mlp_gate", "pattern": r"mlp\.c_gate\.weight$", "family": "mlp"}],
         "geometries": GOOD},
        "rules: rule 'mlp_gate' (pattern 'mlp\\\\.c_gate\\\\.weight$') matches no parameter"),
}


def one_error_line(capsys, command: str) -> str:
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err  # one clear line, no traceback
    assert lines[0].startswith(f"geosearch {command}: error: ")
    return lines[0]


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(BAD_SPACES))
def test_bad_search_space_ends_with_one_line_naming_file_and_key(case, tmp_path, capsys):
    content, expected = BAD_SPACES[case]
    path = tmp_path / f"{case}.yaml"
    if isinstance(content, str):
        path.write_text(content, encoding="utf-8")
    elif "rules" in content:
        write_space(path, content["geometries"], rules=content["rules"])
    else:
        write_space(path, content)
    rc = main(["search", "--space", str(path), "--runs-dir", str(tmp_path / "runs")])
    line = one_error_line(capsys, "search")
    assert rc == 2 and str(path) in line and expected in line
    assert not (tmp_path / "runs").exists()  # checked before any study or file is created


def test_each_flag_that_sets_a_space_key_is_an_argument_of_search():
    # CLI_FLAGS is the one list of them (flag -> key): each is an argument of the same name
    # (--study sets the name), which geosearch search hands to apply_overrides
    args = vars(build_parser().parse_args(["search"]))
    assert {"study" if f == "name" else f for f in CLI_FLAGS} <= set(args)
    assert all(args["study" if f == "name" else f] is None for f in CLI_FLAGS)  # None: not given


def test_missing_space_file_lists_the_shipped_spaces(tmp_path, capsys):
    rc = main(["search", "--space", str(tmp_path / "nope.yaml")])
    line = one_error_line(capsys, "search")
    assert rc == 2 and "nope.yaml: no such file, nor a shipped search space" in line and "default" in line


def test_bad_storage_url_is_one_line(tmp_path, capsys):
    space = write_space(tmp_path / "s.yaml", GOOD)
    rc = main(["search", "--space", str(space), "--runs-dir", str(tmp_path / "runs"),
               "--storage", "bogus://nowhere"])
    line = one_error_line(capsys, "search")
    assert rc == 2 and "--storage: cannot open the storage 'bogus://nowhere'" in line


def _storage_error(kind: str, text: str) -> Exception:
    from geosearch.util.errors import ConfigError

    if kind == "storage":  # e.g. a connection dropped inside a transaction
        try:
            raise RuntimeError(text)
        except RuntimeError as cause:
            e = optuna.exceptions.StorageInternalError("An exception is raised during the commit.")
            e.__cause__ = cause
            return e
    return ConfigError(text, source="--storage")


@pytest.mark.parametrize("worker", [False, True], ids=["command", "worker"])
@pytest.mark.parametrize("kind", ["storage", "config"])
def test_a_storage_error_quoting_the_secret_shows_it_masked(kind, worker, monkeypatch, tmp_path, capsys):
    import geosearch.search.study.run

    from geosearch.util.urls import STORAGE_ENV, mask_url

    form = FORMS[-2]  # a password with / : @ %
    url = form.url(ABSENT)
    said = f"(psycopg2.OperationalError) password {form.secret!r} refused; dsn {url}"

    def failing(*args, **kwargs):
        raise _storage_error(kind, said)

    monkeypatch.setattr(geosearch.search.study.run, "run_search", failing)
    if worker:  # a worker is given the masked URL, the full one in its environment
        monkeypatch.setenv(STORAGE_ENV, url)
    space = write_space(tmp_path / "s.yaml", GOOD)
    rc = main(["search", "--space", str(space), "--runs-dir", str(tmp_path / "runs"),
               "--storage", mask_url(url) if worker else url])
    line = one_error_line(capsys, "search")
    assert rc == 2 and form.leaks(line) == [] and "password '***' refused" in line, line
    assert f"dsn {mask_url(url)}" in line


def test_a_failing_report_quoting_the_secret_shows_it_masked(monkeypatch, tmp_path, capsys):
    import geosearch.report
    from geosearch.cli.search import _report_after_search

    form = FORMS[-1]  # ?password=
    url = form.url(ABSENT)

    def broken(*args, **kwargs):
        raise RuntimeError(f"cannot connect with password {form.secret} to {url}")

    monkeypatch.setattr(geosearch.report, "write_report", broken)
    _report_after_search(tmp_path / "runs" / "r", "r", url)
    err = capsys.readouterr().err
    assert form.leaks(err) == [] and "report failed (RuntimeError: cannot connect with password ***" in err


@pytest.mark.parametrize("argv, expected", [
    (["export", "{tmp}/no_run"], "no_run: no such run directory"),
    (["export", "{tmp}"], "no study storage here (study.db or journal.log)"),
    (["inspect", "--model", "huge"], "unknown model 'huge'; expected one of: tiny, mini, small, gpt2, hf:gpt2"),
    (["inspect", "--model", "tiny", "--rules", "nosuch"], "unknown rule set 'nosuch'"),
])
def test_bad_export_and_inspect_inputs_are_one_line(argv, expected, tmp_path, capsys):
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    rc = main(argv)
    line = one_error_line(capsys, argv[0])
    assert rc == 2 and expected in line


@pytest.mark.slow
def test_bad_input_in_a_real_process_prints_no_traceback(tmp_path):
    space = write_space(tmp_path / "s.yaml", {"attn": ["stiefle"], "mlp": ["adamw"]})
    r = subprocess.run(geosearch_cmd("search", "--space", str(space)), capture_output=True, text=True,
                       env=env(), cwd=tmp_path, timeout=120)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.strip().splitlines() == [
        f"geosearch search: error: {space}: geometries.attn: unknown geometry 'stiefle'; expected one of: "
        "dgram, euclidean, oblique, spectral_ball, sphere, stiefel, adamw"]


# --------------------------------------------------------------------------- inspect
def test_inspect_shows_types_and_candidates_and_warns_about_unmatched_weights(tmp_path, capsys):
    rules = [{"type": "attn_qkv", "pattern": r"attn\.c_attn\.weight$", "family": "attn"},
             {"type": "attn_out", "pattern": r"attn\.c_proj\.weight$", "family": "attn"},
             {"type": "mlp_in", "pattern": r"mlp\.c_fc\.weight$", "family": "mlp"}]
    space = write_space(tmp_path / "s.yaml", {"attn": ["stiefel", "dgram"], "mlp_in": ["dgram"]}, rules=rules)
    assert main(["inspect", "--space", str(space)]) == 0
    out, err = capsys.readouterr()
    row = next(line for line in out.splitlines() if line.startswith("transformer.h.0.attn.c_attn.weight"))
    assert row.split() == ["transformer.h.0.attn.c_attn.weight", "96x32", "attn_qkv", "stiefel,", "dgram"]
    assert "transformer.h.1.mlp.c_fc.weight" in out and "adamw (unassigned hidden weight)" in out
    # the missing mlp_out rule leaves mlp.c_proj unassigned: one warning per weight
    assert err.count("matches no rule") == 2 and "transformer.h.0.mlp.c_proj.weight" in err


# --------------------------------------------------------------------------- kill, resume
def start_and_stop_mid_trial(cmd, tmp_path, study, sig, need_complete=True):
    """Run ``cmd``, wait until a trial is training (after one completed, if asked), send
    ``sig``; returns (process, {number: value} of completed trials, the running trial)."""
    # A shell that starts a background job (as CI may) makes it ignore SIGINT, and the
    # child would inherit that: give the search the default handler a terminal gives it.
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env(),
                            cwd=tmp_path, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    db = tmp_path / "runs" / study / "study.db"
    deadline = time.monotonic() + 240
    try:
        while True:
            assert proc.poll() is None, "the search ended before it could be stopped:\n" + proc.stderr.read()
            assert time.monotonic() < deadline, "no trial reached the middle of its run in time"
            time.sleep(0.1)
            if not db.exists():
                continue
            try:
                trials = load(db.parent, study).get_trials()
            except Exception:  # noqa: BLE001 - the study is not created yet
                continue
            complete = {t.number: t.value for t in trials if t.state == TrialState.COMPLETE}
            # status "running": training has started; at most one probe: most steps still ahead,
            # so the signal cannot land after the trial finished
            mid = [t for t in trials if t.state == TrialState.RUNNING and t.user_attrs.get("status") == "running"
                   and len(t.user_attrs.get("probe_history", [])) <= 1]
            if mid and (complete or not need_complete):
                proc.send_signal(sig)
                proc.wait(timeout=120)
                return proc, complete, mid[0]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.slow
def test_killed_search_resumes_without_losing_trials_and_reruns_the_killed_point(tmp_path):
    # 120 steps, a probe every 30: the window the kill must land in (training, at most one
    # probe) is 60 steps; at 40/10 it was 20, and a CI run's polling once missed it in every trial
    space = write_space(tmp_path / "k.yaml", {"attn": ["adamw"], "mlp": ["adamw", "euclidean", "oblique"]},
                        steps=120, every=30)
    cmd = geosearch_cmd("search", "--space", str(space), "--runs-dir", "runs")
    _, done_before, killed = start_and_stop_mid_trial(cmd, tmp_path, "k", signal.SIGKILL)  # no cleanup at all
    db = tmp_path / "runs" / "k" / "study.db"
    assert next(t for t in load(db.parent, "k").get_trials() if t.number == killed.number).state == TrialState.RUNNING

    r = subprocess.run(cmd, capture_output=True, text=True, env=env(), cwd=tmp_path, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"trial {killed.number} was left running by a worker that died" in r.stdout
    trials = load(db.parent, "k").get_trials()
    by_number = {t.number: t for t in trials}
    for n, value in done_before.items():  # nothing completed before the kill was lost or redone
        assert by_number[n].state == TrialState.COMPLETE and by_number[n].value == value
    assert by_number[killed.number].state == TrialState.FAIL
    assert "interrupted before it finished" in by_number[killed.number].user_attrs["fail_reason"]
    retry = [t for t in trials if t.user_attrs.get("retry_of") == killed.number]
    assert len(retry) == 1 and retry[0].state == TrialState.COMPLETE and retry[0].params == killed.params
    complete = [t for t in trials if t.state == TrialState.COMPLETE]
    # the budget (3 points) is honoured: each point completed exactly once
    assert sorted(t.params["geometry.mlp"] for t in complete) == ["adamw", "euclidean", "oblique"]
    assert load_assignment(tmp_path / "runs" / "k" / "best_assignment.yaml").provenance["study"] == "k"


# --------------------------------------------------------------------------- workers
@pytest.mark.slow
def test_two_workers_finish_the_exhaustive_space_without_duplicates(tmp_path, capsys):
    space = write_space(tmp_path / "w.yaml", {"attn": ["adamw", "oblique"], "mlp": ["adamw", "euclidean"]})
    r = subprocess.run(geosearch_cmd("search", "--space", str(space), "--runs-dir", "runs", "--workers", "2"),
                       capture_output=True, text=True, env=env(), cwd=tmp_path, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    run = tmp_path / "runs" / "w"
    assert (run / "journal.log").is_file() and not (run / "study.db").exists()
    assert "started 2 workers" in r.stdout and "stopped: every assignment of the space has been tried" in r.stdout
    trials = load(run, "w").get_trials()
    trained = [t for t in trials if t.user_attrs.get("status") in ("completed", "unstable", "failed")]
    points = [tuple(sorted(t.params.items())) for t in trained]
    assert len(points) == 4 and len(set(points)) == 4  # every point once, none twice
    assert all(t.state == TrialState.COMPLETE for t in trained)
    assert sum(line.startswith("trial ") for line in r.stdout.splitlines()) == 4
    for i in (0, 1):
        assert (run / "workers" / f"worker{i}.log").is_file()
    # the search ends with the report, written once by the parent from the journal storage
    lines = r.stdout.splitlines()
    where = lines[-2] if lines[-1].startswith("No plots: ") else lines[-1]  # no_plots: a note after it
    best = Path("runs") / "w" / "best_assignment.yaml"
    assert where.startswith(f"best assignment: {best} (report.md")
    assert "## Browse this study in optuna-dashboard" in (run / "report.md").read_text()
    assert not any("report:" in (run / "workers" / f"worker{i}.log").read_text() for i in (0, 1))

    # export reads the journal storage of the run directory
    assert main(["export", str(run), "--top", "2", "-o", str(tmp_path / "top")]) == 0
    files = sorted((tmp_path / "top").glob("rank*.yaml"))
    assert [load_assignment(f).provenance["rank"] for f in files] == [1, 2]
    assert "verdict:" in capsys.readouterr().out


@pytest.mark.slow
def test_a_failing_report_costs_one_warning_line_not_the_search(monkeypatch, tmp_path, capsys):
    import geosearch.report

    def broken(*args, **kwargs):
        raise RuntimeError("disk full\nsecond line")

    monkeypatch.setattr(geosearch.report, "write_report", broken)
    space = write_space(tmp_path / "r.yaml", {"attn": ["adamw"], "mlp": ["adamw"]}, steps=4, every=2)
    run = tmp_path / "runs" / "r"
    assert main(["search", "--space", str(space), "--runs-dir", str(tmp_path / "runs")]) == 0
    captured = capsys.readouterr()
    warnings = [ln for ln in captured.err.splitlines() if ln.strip()]
    # one line that says the search is kept, why the report failed and how to retry it
    assert warnings == [f"warning: the search is saved, but its report failed (RuntimeError: disk "
                        f"full); retry with: geosearch report {run}"]
    assert "best assignment:" in captured.out
    assert "report:" not in captured.out and "report.md" not in captured.out
    assert load_assignment(run / "best_assignment.yaml").provenance["study"] == "r"
    assert not (run / "report.md").exists()


@pytest.mark.slow
def test_ctrl_c_exits_130_and_queues_the_interrupted_trial(tmp_path):
    space = write_space(tmp_path / "c.yaml", {"attn": ["adamw"], "mlp": ["adamw", "oblique"]}, steps=5000, every=100)
    cmd = geosearch_cmd("search", "--space", str(space), "--runs-dir", "runs")
    proc, _, trial = start_and_stop_mid_trial(cmd, tmp_path, "c", signal.SIGINT, need_complete=False)
    err = proc.stderr.read()
    assert proc.returncode == 130 and "Traceback" not in err
    assert err.strip().splitlines()[-1] == "geosearch search: interrupted; rerun the same command to resume"
    trials = load(tmp_path / "runs" / "c", "c").get_trials()
    stopped = next(t for t in trials if t.number == trial.number)
    assert stopped.state == TrialState.FAIL and stopped.user_attrs["status"] == "interrupted"
    queued = [t for t in trials if t.user_attrs.get("retry_of") == trial.number]
    assert len(queued) == 1 and queued[0].state == TrialState.WAITING  # a rerun runs it


@pytest.mark.slow
def test_search_takes_the_vocabulary_of_a_bare_token_directory_from_vocab_size(fake, tmp_path, capsys):
    data = tmp_path / "tok"
    data.mkdir()
    for name, n in (("train.bin", 400), ("val.bin", 100)):
        (np.arange(n, dtype=np.uint16) % 300).tofile(data / name)
    space = write_space(tmp_path / "s.yaml", {"attn": ["adamw"], "mlp": ["adamw"]}, name="v")
    base = ["search", "--space", str(space), "--runs-dir", str(tmp_path / "runs"), "--data", str(data)]
    # Rule: the preflight refuses a bare directory without a vocabulary, naming the flags.
    assert main(base) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"geosearch search: error: {data}: vocab_size: no vocabulary size") and "--vocab-size N" in err
    assert not (tmp_path / "runs" / "v").exists()
    # Rule: --vocab-size sets proxy.vocab_size, which the study records.
    assert main([*base, "--vocab-size", "300"]) == 0
    study = optuna.load_study(study_name="v", storage=f"sqlite:///{tmp_path / 'runs' / 'v' / 'study.db'}")
    assert study.user_attrs["proxy"]["vocab_size"] == study.user_attrs["space"]["proxy"]["vocab_size"] == 300
    assert study.user_attrs["data_digest"]["data"]["files"] == 2


@pytest.mark.slow
def test_the_default_search_prints_a_narrow_header_and_at_most_30_lines_after_its_trials(
        fake, tmp_path, capsys, monkeypatch):
    import geosearch.report
    from geosearch.util.text import WIDTH

    monkeypatch.chdir(tmp_path)  # relative paths: the lines' width does not depend on tmp_path
    # the plots' files are not what this checks (matplotlib's ~10 s): said as written
    monkeypatch.setattr(geosearch.report, "make_plots", lambda run, folder, *a: ({"val_loss": Path(folder)}, []))
    assert main(["search", "--space", "default", "--model", "tiny", "--steps", "10",
                 "--batch-size", "2", "--runs-dir", "runs"]) == 0
    lines = capsys.readouterr().out.splitlines()
    header = lines[:next(i for i, ln in enumerate(lines) if ln.startswith("study 'default' in "))]
    after = lines[next(i for i, ln in enumerate(lines) if ln.startswith("stopped: ")):]
    # Rule: the header (the space, the target and ladder, the cost) wraps at 100 columns; what
    # follows the per-trial lines (the table, the verdict's lines, where the answer is) is at
    # most 30 lines, none wider than 100 columns.
    assert header[0].startswith("search space 'default'") and any("  target: " in ln for ln in header)
    assert max(map(len, header)) <= WIDTH, header
    assert after[-1] == "best assignment: runs/default/best_assignment.yaml (report.md, plots/ beside it)"
    assert any(ln.startswith("verdict: ") for ln in after)
    assert len(after) <= 30 and max(map(len, after)) <= WIDTH, after
