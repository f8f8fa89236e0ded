"""Data-parallel trials: ``torchrun --nproc_per_node 2 -m geosearch search`` on CPU (gloo).

Every rank trains each trial on half the global batch and rank 0 alone runs the study, so
the search must pick the same points, prune at the same steps and score the same values
(up to float summation order) as one process; a rank that dies or a Ctrl-C must end the
whole launch promptly, with the trial recoverable.
"""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
import yaml
from optuna.trial import TrialState

from geosearch.util.errors import ConfigError
from geosearch.search.runtime import liveness
from geosearch.search.study import failures as recovery
from geosearch.search.space.spec import SearchSpace
from geosearch.search.study.run import run_search

pytestmark = pytest.mark.usefixtures("no_plots")  # no test here checks a plot: tests/_no_plots.py

REPO = Path(__file__).resolve().parents[3]
optuna.logging.set_verbosity(optuna.logging.WARNING)

# Stiefel attention starts with σ_max = 1 (max logit ≈ 1.1 at step 5 on this proxy),
# AdamW attention with small weights (≈ 0.16): a max_logit of 0.5 prunes every
# stiefel-attention trial at its first probe and lets the others complete.
SPACE = {
    "version": 1, "name": "dp", "baselines": [],
    "geometries": {"attn": ["adamw", "stiefel"], "mlp": ["adamw", "euclidean"]},
    "proxy": {"model": "tiny", "steps": 10, "batch_size": 4, "eval_every": 5, "probe_every": 5,
              "eval_batches": 1, "probe_batch_size": 2, "device": "cpu", "lr": 3e-3},
    "sampler": {"type": "random", "seed": 3},
    "budget": {"trials": 4},
    "pruner": {"max_logit_factor": 0.0625, "loss": "none"},  # 0.5 for tiny (d/√d_head = 8)
}


def env() -> dict:
    return {**os.environ, "OMP_NUM_THREADS": "1",
            "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}


def torchrun(*args: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
            "-m", "geosearch", "search", *args]


def write_space(path: Path, **changes) -> Path:
    d = {**SPACE, **changes}
    path.write_text(yaml.safe_dump(d), encoding="utf-8")
    return path


def load(run_dir: Path, name: str) -> optuna.Study:
    return optuna.load_study(study_name=name, storage=f"sqlite:///{run_dir / 'study.db'}")


def outline(study: optuna.Study) -> list[tuple]:
    """What a search decided, trial by trial: point, state, outcome, step it stopped at."""
    return [(t.number, t.params, t.state, t.user_attrs.get("status"), t.user_attrs.get("stop_step"))
            for t in study.get_trials()]


# --------------------------------------------------------------------------- same trials
@pytest.mark.slow
def test_two_processes_pick_prune_and_score_as_one_process(tmp_path):
    space = write_space(tmp_path / "dp.yaml")
    r = subprocess.run(torchrun("--space", str(space), "--runs-dir", "two"), cwd=tmp_path, env=env(),
                       capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    # rank 0 alone talks: one study line, one line per trial, one ranking
    assert r.stdout.count("each trial on 2 processes (data parallel)") == 1
    assert r.stdout.count("stopped: budget of 4 trials reached") == 1

    one = run_search(SearchSpace.from_dict(SPACE, source="dp"), runs_dir=tmp_path / "one",
                     out=io.StringIO(), progress=False)
    two_study, one_study = load(tmp_path / "two" / "dp", "dp"), load(one.run_dir, "dp")
    # rank 0's sampler, same seed: the same points in the same order, pruned at the same steps
    assert outline(two_study) == outline(one_study)
    states = [t.state for t in two_study.get_trials()]
    assert TrialState.PRUNED in states and TrialState.COMPLETE in states  # both paths ran
    for a, b in zip(one_study.get_trials(), two_study.get_trials()):
        # same global batch and seed: equal up to float summation order (measured ~1e-6)
        if a.state == TrialState.COMPLETE:
            assert b.value == pytest.approx(a.value, abs=2e-5)
        assert b.intermediate_values == pytest.approx(a.intermediate_values, abs=2e-5)
        if a.user_attrs.get("status") in ("completed", "unstable"):
            assert a.user_attrs["num_processes"] == 1 and b.user_attrs["num_processes"] == 2
            config = yaml.safe_load((tmp_path / "two" / "dp" / b.user_attrs["trial_dir"] / "config.yaml").read_text())
            assert config["num_processes"] == 2  # every trained trial records its processes
    assert (tmp_path / "two" / "dp" / "best_assignment.yaml").is_file()


def test_workers_and_a_distributed_launch_do_not_mix(monkeypatch, tmp_path):
    # checked on every rank before any process group is made, so every rank stops alike
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    space = SearchSpace.from_dict(SPACE, source="dp")
    with pytest.raises(ConfigError, match=r"--workers: --workers 2 runs .* this distributed launch "
                                          r"\(2 processes\) .*pick one"):
        run_search(space, runs_dir=tmp_path, workers=2, out=io.StringIO())
    monkeypatch.setenv("WORLD_SIZE", "3")
    with pytest.raises(ConfigError, match=r"proxy.batch_size: global batch 4 does not split over the 3 processes"):
        run_search(space, runs_dir=tmp_path, out=io.StringIO())
    assert not (tmp_path / "dp").exists()


# --------------------------------------------------------------------------- failures
RAISING_CALLBACK = """
import sys
from geosearch.assignment import Assignment
from geosearch.proxy.accelerator import get_accelerator
from geosearch.proxy.config import TrainConfig
from geosearch.proxy.train import train
config = TrainConfig(model="tiny", steps=6, batch_size=4, eval_every=3, probe_every=3,
                     eval_batches=1, probe_batch_size=1, device="cpu")
acc = get_accelerator("cpu", "no")
def storage_down(step, metrics):
    raise ValueError("storage down")
try:
    train(config, Assignment.parse("attn=adamw,mlp=adamw"), callback=storage_down)
except ValueError as e:  # rank 0: the callback's own exception
    assert acc.is_main_process and "storage down" in str(e), e
except RuntimeError as e:  # the others: told by the same broadcast, at the same step
    assert not acc.is_main_process and "callback raised at step 3" in str(e), e
else:
    sys.exit("the run went on")
# no rank was left behind in a collective: the next run trains in step and stops together
result = train(config, Assignment.parse("attn=adamw,mlp=adamw"), callback=lambda s, m: "stop" if s == 3 else None)
assert result.status == "unstable" and result.stop_step == 3, result
print(f"rank {acc.process_index} ok")
"""


@pytest.mark.slow
def test_a_callback_that_raises_on_rank_0_ends_the_run_on_every_rank(tmp_path):
    script = tmp_path / "raising.py"
    script.write_text(RAISING_CALLBACK)
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                        str(script)], env=env(), capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    assert sorted(line for line in r.stdout.splitlines() if line.endswith(" ok")) == ["rank 0 ok", "rank 1 ok"]


def _start_long_search(tmp_path: Path, name: str) -> tuple[subprocess.Popen, optuna.trial.FrozenTrial]:
    """A 2-rank search whose trials are long; returns once trial 0 is training."""
    space = write_space(tmp_path / f"{name}.yaml", name=name,
                        proxy={**SPACE["proxy"], "steps": 5000, "eval_every": 100, "probe_every": 100})
    proc = subprocess.Popen(torchrun("--space", str(space), "--runs-dir", "runs"), cwd=tmp_path, env=env(),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    db = tmp_path / "runs" / name / "study.db"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.stdout.read()[-3000:]
        time.sleep(0.2)
        try:
            running = [t for t in load(db.parent, name).get_trials()
                       if t.state == TrialState.RUNNING and t.user_attrs.get("status") == "running"]
        except Exception:  # noqa: BLE001 - not created yet
            continue
        if running:
            return proc, running[0]
    os.killpg(proc.pid, signal.SIGKILL)
    pytest.fail("no trial started training in time")


def _children(pid: int) -> list[int]:
    kids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:  # the field after the state is the parent pid
            kids.append(int(stat.parent.name))
    return kids


def _end(proc: subprocess.Popen, within: float) -> tuple[float, str]:
    """Seconds the launch took to end (all of it, or killed after ``within``) and its output."""
    start = time.monotonic()
    try:
        out, _ = proc.communicate(timeout=within)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"the launch still ran {within} s later:\n{out[-3000:]}")
    return time.monotonic() - start, out


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="finds rank 1 through /proc")
def test_a_dead_rank_ends_the_launch_and_its_trial_runs_again(tmp_path):
    proc, trial = _start_long_search(tmp_path, "dead")
    rank0 = trial.user_attrs["worker"]["pid"]  # rank 0 owns the trial
    rank1 = [p for p in _children(proc.pid) if p != rank0]
    assert len(rank1) == 1, (rank0, _children(proc.pid))
    os.kill(rank1[0], signal.SIGKILL)
    took, out = _end(proc, within=60)
    # torchrun saw rank 1 die and stopped rank 0, which was waiting in a collective
    assert proc.returncode != 0 and took < 30, out[-3000:]
    run_dir = tmp_path / "runs" / "dead"
    left = next(t for t in load(run_dir, "dead").get_trials() if t.number == trial.number)
    if left.state == TrialState.FAIL:
        # rank 0 learnt of it before torchrun stopped it (gloo's "connection closed by peer":
        # a failure of the environment) and recorded it itself, queued again (below)
        assert left.user_attrs["status"] in ("retried", "interrupted"), (
            left.user_attrs.get("status"), left.user_attrs.get("fail_reason"), out[-2000:])
    else:
        assert left.state == TrialState.RUNNING  # stopped inside a collective: nobody could record it...
        # ...and the next run of the study, on any number of processes, takes it as dead at once
        owner = liveness.Owner(run_dir)
        try:
            recovered = recovery.recover_stale(load(run_dir, "dead"), owner, 300)
        finally:
            owner.close()
        assert [r.number for r in recovered] == [trial.number] and "lock" in recovered[0].why
    retry = [t for t in load(run_dir, "dead").get_trials() if t.user_attrs.get("retry_of") == trial.number]
    assert len(retry) == 1 and retry[0].state == TrialState.WAITING
    assert retry[0].user_attrs["queued_params"] == trial.params


@pytest.mark.slow
def test_ctrl_c_ends_every_rank_and_queues_the_trial(tmp_path):
    proc, trial = _start_long_search(tmp_path, "stop")
    os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does: every process gets it
    took, out = _end(proc, within=60)
    assert proc.returncode != 0 and took < 30, out[-3000:]
    # every rank ends with the one-line message, none with a traceback of its own
    assert out.count("geosearch search: interrupted; rerun the same command to resume") == 2, out[-3000:]
    trials = load(tmp_path / "runs" / "stop", "stop").get_trials()
    stopped = next(t for t in trials if t.number == trial.number)
    assert stopped.state == TrialState.FAIL and stopped.user_attrs["status"] == "interrupted"
    queued = [t for t in trials if t.user_attrs.get("retry_of") == trial.number]
    assert len(queued) == 1 and queued[0].state == TrialState.WAITING
