"""Suite-wide settings and the shared fixtures (``fake``: a fake trainer; ``finished``: a
finished study to report on; ``postgres_url``: a throwaway PostgreSQL database; ``no_plots``:
searches whose reports leave the plots out).

One intra-op torch thread for every test (and ``OMP_NUM_THREADS=1`` for the subprocesses
tests start): the models and matrices here are tiny and gain nothing from threads, while
on a 2-core CI machine a second spinning thread slows small ops down many times
(measured: a 10-step tiny run took 30 s instead of 0.55 s).
"""

from __future__ import annotations

import os

import pytest
import torch

# fixtures shared by many test files, registered here so the files use them by name alone
from _postgres import postgres_server, postgres_url  # noqa: F401
from _report_study import finished  # noqa: F401
from _no_plots import no_plots  # noqa: F401
from _search_helpers import fake  # noqa: F401


@pytest.fixture(autouse=True, scope="session")
def _one_thread():
    threads, env = torch.get_num_threads(), os.environ.get("OMP_NUM_THREADS")
    torch.set_num_threads(1)
    os.environ["OMP_NUM_THREADS"] = "1"
    yield
    torch.set_num_threads(threads)
    if env is None:
        os.environ.pop("OMP_NUM_THREADS", None)
    else:
        os.environ["OMP_NUM_THREADS"] = env


@pytest.fixture
def accelerator():
    """The process's one ``accelerate.Accelerator(cpu=True)``: Accelerate keeps its state in
    a process-wide singleton, so tests share the trainer's instead of making and resetting
    their own (a reset would leave the trainer's cached one broken)."""
    from geosearch.proxy.accelerator import get_accelerator

    return get_accelerator("cpu")


@pytest.fixture
def running_trial():
    """Leave a RUNNING trial in study ``t`` of ``tmp_path/runs`` as a worker leaves it.

    Returns ``make(tmp_path, params, worker, heartbeat=None) -> trial number``: the point
    ``params`` (``geometry.attn`` in {adamw, euclidean}, ``geometry.mlp`` = adamw) is
    queued and taken, with the ``worker`` attr and, if given, a ``heartbeat``.
    """
    from geosearch.search.runtime.storage import open_run_study

    def make(tmp_path, params, worker, heartbeat=None) -> int:
        study = open_run_study(tmp_path / "runs" / "t")
        study.enqueue_trial(params, user_attrs={"queued": True, "queued_params": params})
        trial = study.ask()
        trial.suggest_categorical("geometry.attn", ["adamw", "euclidean"])
        trial.suggest_categorical("geometry.mlp", ["adamw"])
        trial.set_user_attr("worker", worker)
        trial.set_user_attr("status", "running")  # training
        if heartbeat is not None:
            trial.set_user_attr("heartbeat", heartbeat)
        return trial.number

    return make
