"""A run's state at a step, saved and taken up again: the trunk and branches of the ladder.

A warmup-stable-decay run (``TrainConfig.cooldown_steps``) is at the same state before its
cooldown whatever its length, so one constant-step run (the *trunk*) saves its state at the
points where the ladder's runs start their cooldowns, and each such run (a *branch*)
starts from that state and trains its cooldown alone: a completed run of its length at the
cost of its cooldown (docs/design.md, "The ladder"). :func:`save_state` writes the model's
and the optimizer's state, the training batches' generator and the torch random state, the
step and the records so far (rank 0, atomically); :func:`load_state` checks that a state
belongs to the run that takes it up (the same run up to its step: model, data, seed, every
optimizer setting and the schedule's factor at each step before it) and returns it. A
branch keeps its own latest state (:data:`LAST`) and, killed, resumes from that
(:func:`start_state`). Files: ``<out_dir>/states/step<k>.pt`` and ``states/last.pt``.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

from geosearch.util.errors import ConfigError
from geosearch.proxy.config import TrainConfig

__all__ = [
    "LAST",
    "STATES_DIR",
    "load_state",
    "restore_state",
    "save_state",
    "start_state",
    "state_path",
    "wanted",
]

STATES_DIR = "states"
LAST = "last.pt"
"""A run's own latest state in ``states/`` (saved at each evaluation by a run that keeps
states); a rerun into the same folder resumes from it."""
_SAME = (
    "model",
    "model_args",
    "data",
    "tokenizer",
    "vocab_size",
    "batch_size",
    "lr",
    "spectral_lr",
    "weight_decay",
    "betas",
    "momentum",
    "solver",
    "optimizer_args",
    "grad_clip",
    "qk_clip",
    "seed",
    "grad_accum",
)
"""The fields two runs share when one takes up the other's state (besides the schedule)."""


def state_path(out_dir: str | os.PathLike, step: int | None = None) -> Path:
    """``<out_dir>/states/step<k>.pt``, or the run's own latest (``states/last.pt``)."""
    return Path(out_dir) / STATES_DIR / (LAST if step is None else f"step{step}.pt")


def _identity(config: TrainConfig) -> dict[str, Any]:
    d = config.to_dict()
    return {k: d[k] for k in _SAME}


def save_state(path: Path, run: Any, step: int, history: list[dict]) -> None:
    """Write the state of ``run`` (the trainer's ``_Run``) after ``step`` steps to ``path``."""
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []
    blob = {
        "step": step,
        "identity": _identity(run.config),
        "factors": [run.config.lr_factor(t) for t in range(step)],
        "model": run.raw_model.state_dict(),
        "optimizer": run.raw_optimizer.state_dict(),
        "generator": run.generator.get_state(),
        "torch_rng": torch.get_rng_state(),
        "cuda_rng": cuda,
        "history": history,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    torch.save(blob, tmp)
    os.replace(tmp, path)


def load_state(path: Path, config: TrainConfig) -> dict[str, Any]:
    """The state in ``path``, checked against ``config`` (resolved): the same run up to the
    state's step.

    Raises:
        ConfigError: another run's state (the first field that differs), one past the run's
            end, or a schedule that differs before its step.
    """
    blob = torch.load(path, map_location="cpu", weights_only=False)
    mine = _identity(config)
    for key, value in blob["identity"].items():
        if mine.get(key) != value:
            raise ConfigError(
                f"the state is of another run ({key} {value!r}, this run's {mine.get(key)!r})",
                source=str(path),
                key=key,
            )
    step = blob["step"]
    if step > config.steps:
        raise ConfigError(
            f"the state is at step {step}, past this run's {config.steps}",
            source=str(path),
            key="steps",
        )
    for t, f in enumerate(blob["factors"]):
        if abs(config.lr_factor(t) - f) > 1e-12:
            raise ConfigError(
                f"this run's schedule differs from the state's at step {t + 1} "
                f"({config.lr_factor(t):.6g} against {f:.6g}): only the cooldown may "
                "follow the state",
                source=str(path),
                key="cooldown_steps",
            )
    return blob


def restore_state(run: Any, blob: dict[str, Any]) -> tuple[int, list[dict]]:
    """Put ``blob`` (:func:`load_state`) into ``run``: its weights, optimizer, random
    states and the learning rates of its next step. Returns the step and the records."""
    step = blob["step"]
    run.raw_model.load_state_dict(blob["model"])
    run.raw_optimizer.load_state_dict(blob["optimizer"])
    run.generator.set_state(blob["generator"])
    torch.set_rng_state(blob["torch_rng"])
    if blob["cuda_rng"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(blob["cuda_rng"])
    run.scheduler.last_epoch = step
    for group, base in zip(run.raw_optimizer.param_groups, run.scheduler.base_lrs):
        group["lr"] = base * run.config.lr_factor(step)
    return step, list(blob["history"])


def start_state(
    out_dir: str | os.PathLike | None, start_from: str | os.PathLike | None, config: TrainConfig
) -> dict[str, Any] | None:
    """The state a run starts from: the later of its own latest (a rerun of a killed run)
    and ``start_from`` (a trunk's), else ``None`` (from scratch).

    Raises:
        ConfigError: ``start_from`` is missing, or a state is not this run's (:func:`load_state`).
    """
    if start_from is not None and not Path(start_from).is_file():
        raise ConfigError("no such state: the trunk did not reach it", source=str(start_from))
    own = state_path(out_dir) if out_dir is not None else None
    found = [
        load_state(p, config) for p in (own, start_from) if p is not None and Path(p).is_file()
    ]
    return max(found, key=lambda b: b["step"], default=None)


def wanted(step: int, save_at: Iterable[int], keep: bool, do_eval: bool) -> list[int | None]:
    """The states to save after ``step``: ``step<k>.pt`` where it is in ``save_at``, and the
    run's own latest (``None``) at an evaluation when it keeps one."""
    return ([step] if step in set(save_at) else []) + ([None] if keep and do_eval else [])
