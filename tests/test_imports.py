"""Modules that must load without torch, so that reading settings and spaces stays light.

Add a module here when the layers say it holds no model: its import is checked in a fresh
interpreter, where nothing else has imported torch yet.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

TORCH_FREE = [
    "geosearch.proxy.config",  # TrainConfig, TrainResult
    "geosearch.models.specs",  # model spec names and default rule sets
    "geosearch.search.space.spec",  # the search space
    "geosearch.search.space.schema",  # its YAML parser
    "geosearch.search.space.reader",  # the parser's base: problems, budget, pruner, sampler
    "geosearch.search.stats.seeding",  # the adaptive-seed plan
    "geosearch.search.runtime.locks",  # the command and ask locks
]


@pytest.mark.slow
@pytest.mark.parametrize("module", TORCH_FREE)
def test_module_imports_without_torch(module):
    code = (f"import sys, {module}; "
            "assert 'torch' not in sys.modules, sorted(m for m in sys.modules if 'torch' in m)")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                          timeout=60)
    # Rule: importing the module leaves torch unloaded.
    assert proc.returncode == 0, proc.stderr
