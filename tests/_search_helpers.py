"""Shared by the study tests: a tiny space, a search call, and a fake trainer.

Most study tests replace ``train`` (in :mod:`geosearch.search.study.trial_loop`, where the trial
loop calls it) by :class:`FakeTrain`, which calls the callback with synthetic metrics and
returns a TrainResult, so the study logic is tested in milliseconds. Test modules take the
``fake`` fixture by importing it.
"""

from __future__ import annotations

import io

import pytest

from geosearch.proxy.config import TrainResult
from geosearch.search.study import trial_loop
from geosearch.search.space.spec import SearchSpace
from geosearch.search.runtime.storage import open_run_study
from geosearch.search.study.run import run_search

TINY_PROXY = {"model": "tiny", "steps": 10, "batch_size": 2, "eval_every": 5, "eval_batches": 1,
              "probe_every": 5, "probe_batch_size": 1, "device": "cpu"}


def make_space(geometries=None, **extra) -> SearchSpace:
    """A tiny space; without baselines unless ``baselines=[...]`` is given (the schema's
    default trains adamw and muon beside the points)."""
    d = {"version": 1, "name": "t", "proxy": dict(TINY_PROXY), "baselines": [],
         "geometries": geometries or {"attn": ["adamw", "euclidean"], "mlp": ["adamw"]}}
    d.update(extra)
    return SearchSpace.from_dict(d, source="test space")


def search(space, tmp_path, **kw):
    return run_search(space, runs_dir=tmp_path / "runs", out=io.StringIO(), progress=False, **kw)


def trials_of(tmp_path, name="t"):
    return open_run_study(tmp_path / "runs" / name).get_trials()


def use_train(monkeypatch, fn):
    """Make the trial loop train with ``fn``; returns ``fn``."""
    monkeypatch.setattr(trial_loop, "train", fn)
    return fn


class FakeTrain:
    """Stands in for geosearch.proxy.train.train: two probe/eval steps (5, 10).

    ``losses(key, seed)`` gives the val loss, ``logits(key, seed)`` the max logit, where
    ``key`` is "attn=...,mlp=..." (the resolved family geometries); with
    ``with_config=True`` both are called as ``(key, seed, config)`` (a ladder's rungs differ
    in ``config.steps`` and ``config.spectral_lr``). ``configs`` lists every run's config.
    """

    def __init__(self, losses=None, logits=None, raises=None, with_config=False):
        self.losses = losses or (lambda key, seed, *config: 3.0 + 0.1 * len(key))
        self.logits = logits or (lambda key, seed, *config: 10.0)
        self.raises = raises or (lambda key, seed: None)
        self.with_config = with_config
        self.calls: list[tuple[str, int]] = []
        self.configs: list = []

    def __call__(self, config, assignment, callback=None, out_dir=None, **kw):
        g = assignment.resolve()
        key = f"attn={g['attn_qkv']},mlp={g['mlp_in']}"
        self.calls.append((key, config.seed))
        self.configs.append(config)
        exc = self.raises(key, config.seed)
        if exc is not None:
            raise exc
        args = (key, config.seed, config) if self.with_config else (key, config.seed)
        history = []
        for step in (5, 10):
            loss = self.losses(*args)
            m = {"step": step, "train_loss": loss, "val_loss": loss, "max_logit": self.logits(*args),
                 "min_entropy": 1.0, "sigma_max": {"attn_qkv": 1.0}, "step_ms": 1.0}
            history.append(m)
            stop = callback(step, m) if callback else None
            if stop:
                return TrainResult("unstable", stop, step, loss, loss, history, 1.0, 1e3, {})
        return TrainResult("completed", None, None, loss, loss, history, 1.0, 1e3, {})


@pytest.fixture
def fake(monkeypatch):
    """A :class:`FakeTrain` with its defaults, training every trial of the test."""
    return use_train(monkeypatch, FakeTrain())
