"""What every benchmark shares: the machine line above its tables, and how it publishes them."""

from __future__ import annotations

import math
import os
import platform
import shlex
import sys
from pathlib import Path

import optuna
import torch


def machine() -> str:
    """CPU count and model, torch and its threads, optuna, and the load at the start."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else math.nan
    return (f"{os.cpu_count()} CPUs ({cpu}), torch {torch.__version__} with "
            f"{torch.get_num_threads()} thread(s), optuna {optuna.__version__}, "
            f"load average {load:.1f} at the start")


def command_line() -> str:
    """The command that produced a result, as a person would retype it."""
    return "python " + " ".join(shlex.quote(a) for a in sys.argv)


def publish(text: str, path: Path) -> None:
    """Print a benchmark's tables and write them, with the command that made them, to
    ``path`` (so every figure in docs/benchmarks.md can be traced to a command)."""
    text = f"Command: `{command_line()}`\n\n{text}"
    print()
    print(text)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    print(f"written to {path}")
