"""Ends that are not a kill: a search whose output's reader leaves (``search | head``) and a
``train`` stopped by SIGTERM (what ``timeout``, SLURM and ``docker stop`` send). Each
returns a :class:`_harness.Result`; ``test_faults.py`` runs them once, ``benchmarks/chaos.py``
loops them.

Invariants, beside those of :func:`_harness.violations` (checked after the rerun):

* a search whose stdout is closed mid-search stops as on Ctrl-C: exit 141 (128 + SIGPIPE,
  as a shell reports it), its last line on stderr says its output was closed and how to
  resume, and the rerun finishes the grid;
* ``train`` given SIGTERM exits 130, says that it does not resume, and its TensorBoard run
  is ended: the HParams session holds the final metrics and the status ``interrupted``;
  no process of it is left.
"""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import time
from pathlib import Path

from _harness import (
    INTERRUPTED,
    TIMEOUT,
    Command,
    Result,
    _finish,
    _search_args,
    alive,
    completed,
    env,
    kill_tree,
    mid_trial,
    wait_until,
    write_space,
)


def closed_output(tmp: Path, rng: random.Random) -> Result:
    """A one-process search whose stdout is a pipe, closed by its reader at a seeded moment
    once a trial trains; then the rerun."""
    space = write_space(tmp, "pipe")
    args = _search_args(space)
    run_dir = tmp / "runs" / "pipe"
    log = tmp / "first.log"
    with open(log, "w", encoding="utf-8") as err:
        proc = subprocess.Popen([sys.executable, "-m", "geosearch", *args], cwd=tmp, env=env(),
                                stdout=subprocess.PIPE, stderr=err)
    cmd = Command(proc, log)
    try:
        landed = mid_trial(cmd, run_dir, rng)
        before = completed(run_dir)
        proc.stdout.close()  # the reader left: `search | head` once head has its lines
        code = cmd.wait()
    finally:
        kill_tree(cmd.pid)
    lines = cmd.output().strip().splitlines()
    found = []
    if landed and code != 141:
        found.append(f"exited {code} when its output closed, not 141")
    if landed and not (lines and "output was closed" in lines[-1] and "rerun" in lines[-1]):
        found.append(f"its last line on stderr does not say how to resume: {lines[-1:]}")
    result = _finish(tmp, args, run_dir, before, "stdout closed mid-search", landed,
                     [f"exit {code}: {lines[-1][:120] if lines else ''}"])
    result.violations[:0] = found
    return result


def train_terminated(tmp: Path, rng: random.Random) -> Result:
    """``train --log-with tensorboard`` given SIGTERM at a seeded moment once it logs."""
    out = tmp / "run"
    log = tmp / "train.log"
    with open(log, "w", encoding="utf-8") as f:
        proc = subprocess.Popen(
            [sys.executable, "-m", "geosearch", "train", "--assign", "attn=adamw,mlp=adamw",
             "--model", "tiny", "--device", "cpu", "--steps", "100000", "--batch-size", "2",
             "--eval-every", "5", "--log-with", "tensorboard", "--out", str(out), "--quiet"],
            cwd=tmp, env=env(), stdout=f, stderr=subprocess.STDOUT)
    cmd = Command(proc, log)
    try:
        wait_until(lambda: (out / "metrics.jsonl").is_file() or proc.poll() is not None, TIMEOUT,
                   "the run's first metrics")
        time.sleep(rng.uniform(0.0, 1.0))
        landed = proc.poll() is None
        proc.send_signal(signal.SIGTERM)
        code = cmd.wait()
    finally:
        kill_tree(cmd.pid)
    lines = cmd.output().strip().splitlines()
    found = []
    if code not in INTERRUPTED:
        found.append(f"exited {code} on SIGTERM, not 130")
    if not lines or "train does not resume" not in lines[-1]:
        found.append(f"its last line does not say what a rerun does: {lines[-1:]}")
    status = _session_status(out / "tensorboard")
    if status != ("interrupted", "STATUS_UNKNOWN"):
        found.append(f"the TensorBoard session was not ended as interrupted: {status}")
    if alive(cmd.pid):
        found.append(f"train's process {cmd.pid} is still alive")
    return Result("SIGTERM of train --log-with tensorboard", found, landed,
                  [f"exit {code}: {lines[-1][:120] if lines else ''}"])


def _session_status(log_dir: Path) -> tuple[str | None, str | None]:
    """The HParams session's ``status`` hyperparameter and end status in ``log_dir``'s own
    event files, ``(None, None)`` where there is none."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import api_pb2, metadata

    events = EventAccumulator(str(log_dir))
    events.Reload()
    content = events.PluginTagToContent(metadata.PLUGIN_NAME)
    if metadata.SESSION_END_INFO_TAG not in content:
        return None, None
    start = metadata.parse_session_start_info_plugin_data(content[metadata.SESSION_START_INFO_TAG])
    end = metadata.parse_session_end_info_plugin_data(content[metadata.SESSION_END_INFO_TAG])
    return start.hparams["status"].string_value, api_pb2.Status.Name(end.status)
