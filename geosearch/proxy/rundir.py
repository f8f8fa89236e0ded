"""A proxy run's record: its directory (config.yaml, metrics.jsonl, result.json), its progress.

:func:`describe_run` gathers what produced a run (its resolved settings, model, assignment,
data, device, package versions, host, date and command) into the dict written to
``config.yaml``, so that a result can be reproduced from its directory alone.
:class:`RunWriter` writes the files (rank 0 only; ``metrics.jsonl`` flushed line by line)
and :class:`Progress` shows the run on stderr.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import socket
import sys
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import yaml

from geosearch.proxy.config import TrainConfig, TrainResult, short_number
from geosearch.util.yaml_io import plain

if TYPE_CHECKING:  # pragma: no cover
    from geosearch.plan import Plan
    from geosearch.proxy.data import Corpus
    from geosearch.models.zoo import BuiltModel


# --------------------------------------------------------------------------- record
def describe_run(config: TrainConfig, plan: Plan, built: BuiltModel, corpus: Corpus,
                 accelerator: Any) -> dict:
    """The resolved configuration and environment of a run, as written to config.yaml.

    Args:
        config: the run's resolved settings.
        plan: what every parameter is trained with (:func:`geosearch.plan.bind`).
        built: the model it trains.
        corpus: its data.
        accelerator: the process's ``accelerate.Accelerator`` (device, process count).
    """
    device = str(accelerator.device)
    if accelerator.device.type == "cuda":
        device += f" ({torch.cuda.get_device_name(accelerator.device)})"
    return {
        "train": config.to_dict(),
        "model_config": built.config,  # the resolved architecture (GPTConfig for presets)
        "model": built.describe(),
        "assignment": plan.assignment.to_dict(),
        "geometry": dict(plan.assignment.resolve()),
        "optimizer": {"settings": plain(dict(plan.settings)), "types": plain(plan.types())},
        "data": {"source": corpus.source, "vocab_size": corpus.vocab_size,
                 "train_tokens": int(corpus.train.numel()), "val_tokens": int(corpus.val.numel())},
        "seed": config.seed,
        "device": device,
        "mixed_precision": accelerator.mixed_precision,  # the one used
        "num_processes": accelerator.num_processes,
        "versions": versions(),
        "hostname": socket.gethostname(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": list(sys.argv),
    }


def versions() -> dict[str, str]:
    """Versions of geosearch, torch, accelerate, optuna and Python."""
    import accelerate  # here: importing it is slow, and only a run needs it

    from geosearch import __version__

    try:  # read from the metadata: nothing below search/ imports Optuna
        optuna = metadata.version("optuna")
    except metadata.PackageNotFoundError:
        optuna = "not installed"
    return {"geosearch": __version__, "torch": str(torch.__version__),
            "accelerate": accelerate.__version__, "optuna": optuna,
            "python": platform.python_version()}


# --------------------------------------------------------------------------- output
class RunWriter:
    """The run directory: config.yaml, metrics.jsonl (flushed per line), result.json."""

    def __init__(self, out_dir: str | os.PathLike) -> None:
        self.dir = Path(out_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.metrics = open(self.dir / "metrics.jsonl", "w", encoding="utf-8")  # noqa: SIM115

    def write_config(self, config: dict) -> None:
        with open(self.dir / "config.yaml", "w", encoding="utf-8") as f:
            yaml.safe_dump(plain(config), f, sort_keys=False)

    def write_metrics(self, metrics: dict) -> None:
        self.metrics.write(json.dumps(metrics) + "\n")
        self.metrics.flush()  # a crash leaves every line written so far

    def write_traceback(self, text: str) -> None:
        (self.dir / "traceback.txt").write_text(text, encoding="utf-8")

    def close(self) -> None:
        self.metrics.close()

    def write_result(self, result: TrainResult) -> None:
        (self.dir / "result.json").write_text(json.dumps(result.to_dict(), indent=2) + "\n",
                                              encoding="utf-8")


class Progress:
    """tqdm bar on a TTY; otherwise one log line per evaluation; nothing when disabled."""

    def __init__(self, total: int, enabled: bool) -> None:
        self.enabled, self.bar, self.loss = enabled, None, float("nan")
        self.max_logit: float | None = None
        if enabled and sys.stderr.isatty():
            from tqdm import tqdm  # an Optuna dependency

            self.bar = tqdm(total=total, unit="step", dynamic_ncols=True, leave=False)

    def step(self, loss: float) -> None:
        if self.bar is not None:
            self.loss = loss
            self.bar.set_postfix(loss=f"{loss:.3f}", max_logit=short_number(self.max_logit),
                                 refresh=False)
            self.bar.update(1)  # redraws at most every 0.1 s

    def record(self, m: dict) -> None:
        if m["max_logit"] is not None:
            self.max_logit = m["max_logit"]
        if self.enabled and self.bar is None and m["val_loss"] is not None:
            print(f"step {m['step']}: train {m['train_loss']:.4f} val {m['val_loss']:.4f} "
                  f"max logit {short_number(self.max_logit)} {m['step_ms']:.1f} ms/step",
                  file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
