"""Accelerate's experiment trackers for one proxy run (``TrainConfig.log_with``).

Accelerate's own path (``Accelerator(log_with=...)``, ``init_trackers``, ``end_training``)
belongs to the process's one Accelerator: its trackers are fixed when it is made,
``init_trackers`` appends to the same list run after run, and ``end_training`` destroys the
process group. A search trains many runs in one process, so each run makes the tracker
objects ``init_trackers`` would make (``accelerate.tracking``) and starts, logs to and
finishes them itself, on the main process. One tracker run per proxy run, grouped by study:
the project is the study name and the run is named ``trial N seed S``. Files stay offline,
under the run directory (TensorBoard events in ``<run>/tensorboard``; wandb offline unless
``WANDB_MODE`` says otherwise; MLflow's local store unless ``MLFLOW_TRACKING_URI`` is set).

Each metrics record is logged as scalars (:func:`scalars`): the losses and probes, the step
time and throughput, σ_max and the constraint error per type, the max logit per layer.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import Any

from geosearch.errors import SettingsError

SCALARS = ("train_loss", "val_loss", "grad_norm", "lr", "max_logit", "raw_max_logit", "min_entropy",
           "mean_entropy", "dual_residual", "qk_clipped", "qk_clipped_total")
"""The keys of a metrics record logged as scalars under their own names (when measured)."""
RENAMED = {"step_ms": "time/step_ms", "tokens_per_s": "throughput/tokens_per_s"}
"""Keys of a metrics record logged as scalars under another name."""
PER_TYPE = ("sigma_max", "constraint_error")
"""Keys holding one value per module type, logged as ``<key>/<type>``."""
PER_LAYER = {"max_logit_per_layer": "max_logit", "raw_max_logit_per_layer": "raw_max_logit"}
"""Keys holding one value per layer, logged as ``<name>/layer_<i>``."""
_PACKAGE = {"tensorboard": "tensorboard"}  # the import a tracker needs, where not its name


def known_trackers() -> list[str]:
    """The tracker names Accelerate knows (``accelerate.tracking.LOGGER_TYPE_TO_CLASS``)."""
    from accelerate.tracking import LOGGER_TYPE_TO_CLASS

    return list(LOGGER_TYPE_TO_CLASS)


def check_trackers(names: list[str], *, source: str | None = "TrainConfig", key: str | None = "log_with") -> None:
    """Refuse unknown trackers and those whose package is missing, before any training.

    Args:
        names: tracker names (``TrainConfig.log_with``).
        source, key: where they came from (the search: its space and ``proxy.log_with``).

    Raises:
        SettingsError: naming ``source`` and ``key``, the known trackers, or the package
            to install.
    """
    known = known_trackers()
    for name in names:
        if name not in known:
            raise SettingsError(f"unknown tracker {name!r}", source=source, key=key, allowed=known)
        package = _PACKAGE.get(name, name)
        if importlib.util.find_spec(package) is None:
            raise SettingsError(f"tracker {name!r} needs the package {package} (pip install "
                                f"{package})", source=source, key=key)


class Trackers:
    """The trackers of one run: started with its configuration, fed its records, finished.

    Args:
        names: tracker names (``TrainConfig.log_with``), already checked.
        out_dir: the run directory; offline files go under it.
        project: the study (or project) the run belongs to.
        run_name: the run's name within it, e.g. ``trial 3 seed 1``.
        config: the run's ``config.yaml`` dict; its scalars are stored as hyperparameters.
    """

    def __init__(self, names: list[str], out_dir: str | os.PathLike, *, project: str,
                 run_name: str, config: dict) -> None:
        from accelerate.tracking import LOGGER_TYPE_TO_CLASS

        out = Path(out_dir)
        self.trackers = []
        for name in names:
            cls = LOGGER_TYPE_TO_CLASS[name]
            if name == "tensorboard":  # one event directory per run, inside the run directory
                tracker = cls("tensorboard", out)
            elif name == "wandb":
                tracker = cls(project, name=run_name, group=project, dir=str(out),
                              mode=os.environ.get("WANDB_MODE", "offline"))
            elif name == "mlflow":
                tracker = cls(experiment_name=project, run_name=run_name)
            elif cls.requires_logging_directory:
                tracker = cls(project, out)
            else:
                tracker = cls(project)
            tracker.start()
            self.trackers.append(tracker)
        hparams = hyperparameters(config, run_name)
        for tracker in self.trackers:
            tracker.store_init_configuration(hparams)

    def log(self, metrics: dict) -> None:
        """Log one metrics record's measured values (:func:`scalars`)."""
        values = scalars(metrics)
        for tracker in self.trackers:
            tracker.log(values, step=metrics["step"])

    def finish(self) -> None:
        for tracker in self.trackers:
            tracker.finish()


def scalars(metrics: dict) -> dict[str, float]:
    """A metrics record's measured values as tracker scalars: :data:`SCALARS` by name,
    ``time/step_ms``, ``throughput/tokens_per_s``, ``sigma_max/<type>``,
    ``constraint_error/<type>``, ``max_logit/layer_<i>`` (and ``raw_max_logit/layer_<i>``)."""
    values = {k: float(metrics[k]) for k in SCALARS if metrics.get(k) is not None}
    values.update({name: float(metrics[k]) for k, name in RENAMED.items() if metrics.get(k) is not None})
    for key in PER_TYPE:
        values.update({f"{key}/{t}": float(v) for t, v in (metrics.get(key) or {}).items()})
    for key, name in PER_LAYER.items():
        values.update({f"{name}/layer_{i}": float(v) for i, v in enumerate(metrics.get(key) or [])})
    return values


def hyperparameters(config: dict, run_name: str) -> dict[str, Any]:
    """The run's settings as flat scalars: ``train.*``, ``geometry.<type>``, seed, precision."""
    flat: dict[str, Any] = {"run": run_name, "seed": config.get("seed"),
                            "mixed_precision": config.get("mixed_precision")}
    flat.update({f"train.{k}": v for k, v in config.get("train", {}).items()})
    flat.update({f"geometry.{t}": g for t, g in config.get("geometry", {}).items()})
    return {k: v if isinstance(v, (bool, int, float, str)) else str(v)
            for k, v in flat.items() if v is not None}
