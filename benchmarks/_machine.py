"""The machine line every benchmark prints above its tables."""

from __future__ import annotations

import math
import os
import platform
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
