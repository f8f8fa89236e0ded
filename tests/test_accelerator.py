"""Tests of the process's one Accelerator and the distributed timeout (geosearch/proxy/accelerator.py)."""

from __future__ import annotations

import pytest

from geosearch.errors import ConfigError
from geosearch.proxy import accelerator as accelerator_mod
from geosearch.proxy.train import get_accelerator


def test_one_device_and_precision_per_process():
    get_accelerator("cpu", "no")  # this process trains on CPU without mixed precision
    with pytest.raises(ConfigError, match="one device and precision per process"):
        get_accelerator("cpu", "bf16")


def test_distributed_timeout_comes_from_its_environment_variable(monkeypatch):
    monkeypatch.delenv(accelerator_mod.DIST_TIMEOUT_ENV, raising=False)
    # Rule: without the variable a rank waits 30 minutes in a collective.
    assert accelerator_mod._dist_timeout() == 1800.0
    monkeypatch.setenv(accelerator_mod.DIST_TIMEOUT_ENV, "90")
    assert accelerator_mod._dist_timeout() == 90.0
    # Rule: a value that is not a positive number is an error naming the variable.
    for bad in ("soon", "0", "-5"):
        monkeypatch.setenv(accelerator_mod.DIST_TIMEOUT_ENV, bad)
        with pytest.raises(ConfigError, match=r"GEOSEARCH_DIST_TIMEOUT: must be a positive number"):
            accelerator_mod._dist_timeout()
