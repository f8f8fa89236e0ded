"""Accelerate's experiment trackers for one proxy run (``TrainConfig.log_with``).

Accelerate's own path (``Accelerator(log_with=...)``, ``init_trackers``, ``end_training``)
belongs to the process's one Accelerator: its trackers are fixed when it is made,
``init_trackers`` appends to the same list run after run, and ``end_training`` destroys the
process group. A search trains many runs in one process, so each run makes the tracker
objects ``init_trackers`` would make (``accelerate.tracking``) and starts, logs to and
finishes them itself, on the main process. One tracker run per proxy run, grouped by study:
the project is the study name and the run is named ``trial N seed S``. Files stay offline,
under the run directory (TensorBoard events in ``<run>/tensorboard``; wandb offline unless
``WANDB_MODE`` says otherwise; MLflow's SQLite store ``mlflow.db`` in ``store_dir``, the
study's directory in a search, unless ``MLFLOW_TRACKING_URI`` is set).

Each metrics record is logged as scalars (:meth:`Trackers.log`): the losses and probes, the
step time and throughput, σ_max and the constraint error per type, the max logit per layer.
At the end, interrupted or not, each tracker gets the run's final metrics
(:func:`final_metrics`, ``final/*``) and its status; TensorBoard gets them as an HParams
session in the run's own event directory (:func:`write_hparams`), which Accelerate's
``store_init_configuration`` would put, without metrics, in a timestamped sub-run.
"""

from __future__ import annotations

import contextlib
import importlib.util
import math
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from geosearch.util.errors import SettingsError

if TYPE_CHECKING:  # pragma: no cover
    from geosearch.proxy.config import TrainResult

SCALARS = ("train_loss", "val_loss", "grad_norm", "lr", "max_logit", "raw_max_logit", "min_entropy",
           "mean_entropy", "dual_residual", "qk_clipped", "qk_clipped_total")
"""The keys of a metrics record logged as scalars under their own names (when measured)."""
RENAMED = {"step_ms": "time/step_ms", "tokens_per_s": "throughput/tokens_per_s"}
"""Keys of a metrics record logged as scalars under another name."""
PER_TYPE = ("sigma_max", "constraint_error")
"""Keys holding one value per module type, logged as ``<key>/<type>``."""
PER_LAYER = {"max_logit_per_layer": "max_logit", "raw_max_logit_per_layer": "raw_max_logit"}
"""Keys holding one value per layer, logged as ``<name>/layer_<i>``."""
FINAL = ("final/val_loss", "final/best_val_loss", "final/max_logit", "final/min_entropy",
         "final/step", "final/step_ms", "final/tokens_per_s")
"""The final metrics every run's HParams session lists (:func:`final_metrics`)."""
TRACKERS_LOG = "trackers.log"
"""The file in the run directory that gets what the trackers print (all but TensorBoard)."""
MLFLOW_STORE = "mlflow.db"
"""MLflow's SQLite store in the store directory, unless ``MLFLOW_TRACKING_URI`` is set."""
_PACKAGE = {"tensorboard": "tensorboard"}  # the import a tracker needs, where not its name
# a run's end status -> the HParams session's (tensorboard.plugins.hparams.api_pb2.Status;
# it has no "aborted": an interrupted run's is unknown)
_SESSION_STATUS = {"completed": "STATUS_SUCCESS", "unstable": "STATUS_FAILURE",
                   "failed": "STATUS_FAILURE", "interrupted": "STATUS_UNKNOWN"}
# ... and the MLflow run's (mlflow.entities.RunStatus)
_MLFLOW_STATUS = {"completed": "FINISHED", "unstable": "FAILED", "failed": "FAILED",
                  "interrupted": "KILLED"}


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
        store_dir: where a store shared by the project's runs lives (MLflow's ``mlflow.db``):
            the study's directory in a search; None = ``out_dir``.
    """

    def __init__(self, names: list[str], out_dir: str | os.PathLike, *, project: str,
                 run_name: str, config: dict, store_dir: str | os.PathLike | None = None) -> None:
        from accelerate.tracking import LOGGER_TYPE_TO_CLASS

        out = Path(out_dir)
        self.trackers = []
        # what the trackers print themselves (wandb's 34 lines a run, alembic's INFO lines of
        # MLflow's store) goes to the run's trackers.log; TensorBoard prints nothing
        self.log_file = out / TRACKERS_LOG if set(names) - {"tensorboard"} else None
        self.step = 0  # the last step logged
        for name in names:
            cls = LOGGER_TYPE_TO_CLASS[name]
            if name == "tensorboard":  # one event directory per run, inside the run directory
                tracker = cls("tensorboard", out)
            elif name == "wandb":
                tracker = cls(project, name=run_name, group=project, dir=str(out),
                              mode=os.environ.get("WANDB_MODE", "offline"))
            elif name == "mlflow":
                artifacts = use_mlflow_store(Path(store_dir if store_dir is not None else out))
                tracker = cls(experiment_name=project, run_name=run_name, logging_dir=artifacts)
            elif cls.requires_logging_directory:
                tracker = cls(project, out)
            else:
                tracker = cls(project)
            with quiet(self.log_file):
                tracker.start()
            self.trackers.append(tracker)
        self.hparams = hyperparameters(config, run_name)
        for tracker in self.trackers:
            if tracker.name == "tensorboard":
                # Accelerate's store_init_configuration writes add_hparams(values, {}) and
                # hparams.yml into new timestamped sub-runs: the HParams session is written
                # at the end instead (finish), with the final metrics, in the run's own
                # event directory, and hparams.yml goes there too.
                with open(Path(tracker.logging_dir) / "hparams.yml", "w", encoding="utf-8") as f:
                    yaml.safe_dump(self.hparams, f, sort_keys=False)
            else:
                with quiet(self.log_file):
                    tracker.store_init_configuration(self.hparams)

    def log(self, metrics: dict) -> None:
        """Log one metrics record's measured values (:func:`scalars`)."""
        values = scalars(metrics)
        self.step = metrics["step"]
        for tracker in self.trackers:
            tracker.log(values, step=self.step)

    def finish(self, status: str, result: TrainResult) -> None:
        """Log the run's final metrics and status, then close every tracker.

        Args:
            status: how the run ended: ``result.status``, or ``interrupted`` when an
                exception (Ctrl-C, the caller's callback) ends it.
            result: the run's result, as far as it got.
        """
        with quiet(self.log_file):
            self._finish(status, result)

    def _finish(self, status: str, result: TrainResult) -> None:
        final = final_metrics(result)
        step = int(final.get("final/step", self.step))
        try:
            for tracker in self.trackers:
                if tracker.name == "tensorboard":
                    write_hparams(tracker.writer, {**self.hparams, "status": status}, final, status, step)
                else:
                    tracker.log(final, step=step)
                    if tracker.name in ("mlflow", "wandb"):  # these add to the stored ones
                        tracker.store_init_configuration({"status": status})
        finally:
            for tracker in self.trackers:
                if tracker.name == "mlflow":  # Accelerate's finish ends it FINISHED, whatever happened
                    import mlflow

                    mlflow.end_run(status=_MLFLOW_STATUS.get(status, "FINISHED"))
                else:
                    tracker.finish()


def tracker_lines(names: list[str], runs_under: str | os.PathLike, *, project: str,
                  store_dir: str | os.PathLike) -> list[str]:
    """One terminal line per tracker of ``names``: where its runs are and how to open them
    (what the trackers print themselves goes to each run's ``trackers.log``).

    Args:
        names: tracker names (``log_with``).
        runs_under: the run directory (``train --out``), or the folder holding a search's
            run directories (``<run_dir>/trials``).
        project: the study (or project) the runs belong to.
        store_dir: where MLflow's store ``mlflow.db`` is (unless ``MLFLOW_TRACKING_URI`` is set).

    Example:
        >>> tracker_lines(["tensorboard"], "out", project="p", store_dir="out")
        ['tensorboard: events under out/ (view: tensorboard --logdir out)']
    """
    under = Path(runs_under).as_posix()
    lines = []
    for name in names:
        if name == "tensorboard":
            line = f"events under {under}/ (view: tensorboard --logdir {under})"
        elif name == "wandb":
            mode = os.environ.get("WANDB_MODE", "offline")
            line = (f"project {project}, {mode}; files under {under}/"
                    + (" (upload: wandb sync DIR)" if mode == "offline" else ""))
        elif name == "mlflow":
            uri = os.environ.get("MLFLOW_TRACKING_URI") or mlflow_store_uri(Path(store_dir))
            line = f"experiment {project} in {uri} (view: mlflow ui --backend-store-uri {uri})"
        else:
            line = f"project {project}; files under {under}/"
        lines.append(f"{name}: {line}")
    return lines


@contextlib.contextmanager
def quiet(log: Path | None) -> Iterator[None]:
    """Send what is written to this process's stdout and stderr (file descriptors 1 and 2:
    a tracker's own prints, its logging, a helper process it starts now) to ``log`` in this
    block; ``None``: nothing changes."""
    if log is None:
        yield
        return
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    try:
        with open(log, "a", encoding="utf-8") as f, contextlib.redirect_stdout(f), \
                contextlib.redirect_stderr(f):  # Python's streams, where they are not fds 1, 2
            os.dup2(f.fileno(), 1)
            os.dup2(f.fileno(), 2)
            try:
                yield
            finally:
                f.flush()
                sys.stdout.flush()
                sys.stderr.flush()
                os.dup2(saved[0], 1)
                os.dup2(saved[1], 2)
    finally:
        for fd in saved:
            os.close(fd)


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


def final_metrics(result: TrainResult) -> dict[str, float]:
    """The run's final metrics (:data:`FINAL`, those it measured): its last and best
    validation loss, its last max logit and min entropy (and raw max logit, for a model
    that soft-caps), its last step, its mean step time and throughput."""
    last: dict[str, Any] = {}
    for record in result.history:
        last.update({k: v for k, v in record.items() if v is not None})
    values = {"final/val_loss": result.final_val_loss, "final/best_val_loss": result.best_val_loss,
              "final/max_logit": last.get("max_logit"), "final/raw_max_logit": last.get("raw_max_logit"),
              "final/min_entropy": last.get("min_entropy"), "final/step": last.get("step")}
    if math.isfinite(result.mean_step_ms):  # NaN: no step was timed
        values.update({"final/step_ms": result.mean_step_ms, "final/tokens_per_s": result.tokens_per_s})
    return {k: float(v) for k, v in values.items() if v is not None}


def write_hparams(writer: Any, hparams: dict[str, Any], final: dict[str, float], status: str,
                  step: int) -> None:
    """Write the run's HParams session into ``writer``'s own event file, with its final metrics.

    The experiment (the hyperparameters' and metrics' names: :data:`FINAL`, and
    ``final/raw_max_logit`` when measured), the session's start (the hyperparameters'
    values) and end (its status), and each final metric as a scalar at ``step``, so that
    TensorBoard's HParams view shows the run's settings next to its results. Not
    ``SummaryWriter.add_hparams``: it writes them into a new timestamped sub-run.

    Args:
        writer: the run's ``torch.utils.tensorboard.SummaryWriter``.
        hparams: the run's hyperparameters (scalars).
        final: its final metrics (:func:`final_metrics`).
        status: how it ended (``completed``, ``unstable``, ``failed``, ``interrupted``).
        step: the step the final metrics are logged at.
    """
    from tensorboard.plugins.hparams import api_pb2, plugin_data_pb2
    from torch.utils.tensorboard.summary import hparams as hparams_pb

    names = [*FINAL, *(["final/raw_max_logit"] if "final/raw_max_logit" in final else [])]
    experiment, start, end = hparams_pb(hparams, dict.fromkeys(names, 0.0))
    # torch's session end says STATUS_SUCCESS whatever happened: the run's own status
    plugin = end.value[0].metadata.plugin_data
    data = plugin_data_pb2.HParamsPluginData.FromString(plugin.content)
    data.session_end_info.status = api_pb2.Status.Value(_SESSION_STATUS.get(status, "STATUS_UNKNOWN"))
    data.session_end_info.end_time_secs = time.time()
    plugin.content = data.SerializeToString()
    for summary in (experiment, start, end):
        writer.file_writer.add_summary(summary)
    for name, value in final.items():
        writer.add_scalar(name, value, global_step=step)
    writer.flush()


def use_mlflow_store(directory: Path) -> str | None:
    """Point MLflow at the SQLite store ``<directory>/mlflow.db``, unless the user chose one.

    MLflow keeps its store where the process starts (``./mlflow.db`` since MLflow 3.7,
    ``./mlruns`` before); ``MLFLOW_TRACKING_URI``, when set, is left to choose.

    Returns:
        The artifact location of the experiment when MLflow creates it
        (``<directory>/mlartifacts``); None when ``MLFLOW_TRACKING_URI`` is set.
    """
    if os.environ.get("MLFLOW_TRACKING_URI"):
        return None
    import mlflow

    directory = directory.resolve()
    directory.mkdir(parents=True, exist_ok=True)
    mlflow.set_tracking_uri(mlflow_store_uri(directory))
    return str(directory / "mlartifacts")


def mlflow_store_uri(directory: Path) -> str:
    """The SQLAlchemy URI of ``<directory>/mlflow.db`` (``sqlite:////abs/path/mlflow.db``)."""
    return "sqlite:///" + (Path(directory).resolve() / MLFLOW_STORE).as_posix()


def hyperparameters(config: dict, run_name: str) -> dict[str, Any]:
    """The run's settings as flat scalars: ``train.*``, ``geometry.<type>``, seed, precision."""
    flat: dict[str, Any] = {"run": run_name, "seed": config.get("seed"),
                            "mixed_precision": config.get("mixed_precision")}
    flat.update({f"train.{k}": v for k, v in config.get("train", {}).items()})
    flat.update({f"geometry.{t}": g for t, g in config.get("geometry", {}).items()})
    return {k: v if isinstance(v, (bool, int, float, str)) else str(v)
            for k, v in flat.items() if v is not None}
