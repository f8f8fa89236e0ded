"""Run a Python script in two CPU processes (``torchrun``, gloo) for the data-parallel tests."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def run_two(script: Path, *args: str, timeout: float = 180) -> subprocess.CompletedProcess:
    """``torchrun --nproc_per_node 2 script *args`` with this checkout importable and one
    thread per process; asserts it exited 0 (showing the end of its stderr otherwise)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                           "--nproc_per_node", "2", str(script), *args],
                          env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc
