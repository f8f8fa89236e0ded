"""One proxy pretraining run: model, data, optimizer, Accelerate, probes, metrics.

Every trial of a geometry search is one call of :func:`train`; so is ``geosearch train``.
It knows nothing of Optuna: it reports through ``callback(step, metrics)`` and stops when
the callback returns a reason::

    >>> from geosearch.assignment import Assignment
    >>> result = train(TrainConfig(model="tiny", steps=50),
    ...                Assignment.parse("attn=stiefel,mlp=dgram"), out_dir="runs/one")
    >>> result.status, result.final_val_loss
    ('completed', 2.71...)

The model is any spec of :mod:`geosearch.proxy.zoo` (``TrainConfig.model``): a proxy preset,
``hf:gpt2``, ``hf:llama`` or ``py:module:factory``; the loss is the zoo's next-token
cross-entropy (:func:`~geosearch.proxy.zoo.lm_loss`) and the attention probes capture queries
and keys the way that model computes them (``BuiltModel.qk_source``; none for a ``py:``
model geosearch cannot hook, whose records then carry no attention logits).

What one run does, step by step: draw the *global* batch from a seeded generator, keep
this rank's rows, forward, backward, clip the global gradient norm, step the optimizer
(AdamW and manifold Muon groups in one ``ManifoldMuon``), move the learning rate along
warmup + cosine. Every ``eval_every`` steps it measures the validation loss on fixed
batches, every ``probe_every`` steps it probes attention logits, entropies, σ_max and
constraint errors; each such step becomes one line of ``metrics.jsonl`` and one
``callback`` call. A non-finite loss stops the run as ``unstable``; an exception in the
loop ends it as ``failed``; neither raises.

Data parallel: every rank draws the same global batch and takes its own contiguous slice,
so one process and N processes see the same data and the same loss (up to float
summation order). Rank 0 alone writes files and talks to the callback; its stop decision
is broadcast. Launch with::

    accelerate launch --multi_gpu --num_processes 4 -m geosearch train ...   # GPUs
    torchrun --nproc_per_node 2 -m geosearch train --device cpu ...           # CPU, gloo

(``accelerate launch --cpu --num_processes 2`` starts one process: its CPU path needs MPI.)
Accelerate keeps its state in a process-wide singleton, so every run of a process shares
one ``Accelerator`` (:func:`get_accelerator`) and therefore one device and one mixed
precision.
"""

from __future__ import annotations

import atexit
import dataclasses
import datetime
import json
import math
import os
import platform
import socket
import sys
import time
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any, Literal, get_args

import torch
import yaml

from geosearch.assignment import Assignment, load_assignment
from geosearch.errors import ConfigError, GeosearchError
from geosearch.optim import build_optimizer
from geosearch.proxy.data import get_batch, load_corpus
from geosearch.proxy.probes import WeightProbe, attention_stats
from geosearch.proxy.zoo import build_model, lm_loss

Device = Literal["auto", "cpu", "cuda"]
Precision = Literal["no", "bf16", "fp16"]
Solver = Literal["project", "dual"]
Callback = Callable[[int, dict], "str | None"]

# The validation and probe batches are drawn with this seed whatever ``TrainConfig.seed``
# is, so runs with different seeds are scored on the same text.
VAL_SEED = 1234
DIST_TIMEOUT_ENV = "GEOSEARCH_DIST_TIMEOUT"
"""Environment variable: seconds a process of a distributed run waits for the others in
one collective before it gives up (default 1800)."""


# A py: model whose attention geosearch cannot hook: no logits or entropies to report.
_NO_ATTENTION = {"max_logit": None, "max_logit_per_layer": None, "min_entropy": None, "mean_entropy": None}


# --------------------------------------------------------------------------- config
@dataclass
class TrainConfig:
    """Everything that defines one proxy run, besides the assignment.

    Example:
        >>> TrainConfig(model="tiny", steps=100, lr=1e-3).resolved().warmup_steps
        10
    """

    model: str = "small"
    """The model to train: a proxy preset name (``tiny``, ``small``, ``gpt2``), ``hf:gpt2``,
    ``hf:llama`` (Hugging Face, random weights, no download) or ``py:module:factory``
    (your own ``nn.Module``); see :mod:`geosearch.proxy.zoo`."""
    model_args: dict[str, Any] = field(default_factory=dict)
    """Model field overrides: a preset's ``GPTConfig`` fields (``{"n_layer": 2}``), a Hugging
    Face config's fields or their aliases (``{"num_hidden_layers": 2}``), or the factory's
    keyword arguments; ``block_size`` works for every kind."""
    data: str | None = None
    """Corpus file or directory for ``load_corpus``; None = the built-in text."""
    steps: int = 300
    """Optimizer steps of the run."""
    batch_size: int = 16
    """Global batch in sequences, split evenly over the processes."""
    lr: float = 6e-4
    """Peak AdamW learning rate (embeddings, head, norms, and weights assigned ``adamw``)."""
    spectral_lr: float = 0.02
    """Peak spectral step size of the manifold Muon groups."""
    weight_decay: float = 0.1
    """AdamW weight decay (matrices only; the manifolds take none)."""
    betas: tuple[float, float] = (0.9, 0.95)
    """AdamW betas."""
    momentum: float = 0.95
    """Nesterov momentum of the manifold Muon groups."""
    solver: Solver = "project"
    """Manifold Muon direction: ``project`` (one msign) or ``dual`` (dual ascent)."""
    optimizer_args: dict[str, Any] = field(default_factory=dict)
    """Further ``build_optimizer`` overrides, e.g. ``{"dual_steps": 5, "ns_steps": 5}``."""
    warmup_steps: int | None = None
    """Linear warmup steps; None = 10% of ``steps``."""
    min_lr_ratio: float = 0.1
    """Both learning rates decay along a cosine to this fraction of their peak."""
    grad_clip: float = 1.0
    """Global gradient-norm clip; 0 = no clipping (the norm is still measured)."""
    eval_every: int = 50
    """Validation loss every this many steps, and at the last step."""
    eval_batches: int = 4
    """Validation batches (of ``batch_size`` sequences) per evaluation; fixed for the run."""
    probe_every: int = 10
    """Attention and weight probes every this many steps, and at the last step."""
    probe_batch_size: int = 4
    """Sequences in the fixed probe batch."""
    seed: int = 0
    """Seeds the initialisation and the training batches."""
    device: Device = "auto"
    """``auto`` (CUDA when available), ``cpu`` or ``cuda``."""
    mixed_precision: Precision = "no"
    """``no``, ``bf16`` or ``fp16`` (fp16 needs CUDA). One value per process."""

    def __post_init__(self) -> None:
        self._check()

    def _check(self) -> None:
        src = "TrainConfig"
        for name in ("steps", "batch_size", "eval_every", "eval_batches", "probe_every",
                     "probe_batch_size"):
            _positive_int(self, name, src)
        if self.warmup_steps is not None:
            _positive_int(self, "warmup_steps", src, allow_zero=True)
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise ConfigError(f"must be an integer but got {self.seed!r}", source=src, key="seed")
        for name in ("lr", "spectral_lr", "weight_decay", "momentum", "min_lr_ratio", "grad_clip"):
            value = _number(self, name, src)
            if value < 0:
                raise ConfigError(f"must be >= 0 but got {value!r}", source=src, key=name)
        if self.min_lr_ratio > 1:
            raise ConfigError(f"must be in [0, 1] but got {self.min_lr_ratio}", source=src,
                              key="min_lr_ratio")
        betas = tuple(_as_float(b, src, "betas") for b in self.betas) if isinstance(
            self.betas, (list, tuple)) else ()
        if len(betas) != 2 or not all(0 <= b < 1 for b in betas):
            raise ConfigError(f"must be two numbers in [0, 1) but got {self.betas!r}",
                              source=src, key="betas")
        self.betas = betas
        if self.mixed_precision is False:  # YAML 1.1 reads a bare `no` as false
            self.mixed_precision = "no"
        for name, kind in (("solver", Solver), ("device", Device),
                           ("mixed_precision", Precision)):
            if getattr(self, name) not in get_args(kind):
                raise ConfigError(f"unknown value {getattr(self, name)!r}", source=src, key=name,
                                  allowed=get_args(kind))
        if not isinstance(self.model, str):
            raise ConfigError(f"must be a model spec (a preset name, hf:NAME or py:MODULE:FACTORY) "
                              f"but got {self.model!r}", source=src, key="model")
        for name in ("model_args", "optimizer_args"):
            if not isinstance(getattr(self, name), Mapping):
                raise ConfigError(f"must be a mapping but got {getattr(self, name)!r}",
                                  source=src, key=name)
            setattr(self, name, dict(getattr(self, name)))
        if self.data is not None and not isinstance(self.data, (str, os.PathLike)):
            raise ConfigError(f"must be a path or null but got {self.data!r}", source=src,
                              key="data")

    def resolved(self) -> TrainConfig:
        """A copy with every default that depends on other fields filled in."""
        warmup = self.steps // 10 if self.warmup_steps is None else self.warmup_steps
        return dataclasses.replace(self, warmup_steps=min(warmup, self.steps))

    def to_dict(self) -> dict[str, Any]:
        """Plain YAML/JSON-safe values (``betas`` as a list, ``data`` as a string)."""
        d = dataclasses.asdict(self)
        d["betas"] = list(self.betas)
        d["data"] = None if self.data is None else str(self.data)
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], source: str = "train config") -> TrainConfig:
        """Build from a mapping (a YAML section, CLI overrides); errors name ``source``.

        Raises:
            ConfigError: an unknown key (listing the known ones) or a bad value.
        """
        if not isinstance(d, Mapping):
            raise ConfigError(f"must be a mapping but got {type(d).__name__}", source=source)
        known = [f.name for f in dataclasses.fields(cls)]
        for key in d:
            if key not in known:
                raise ConfigError("unknown key", source=source, key=str(key), allowed=known)
        try:
            return cls(**d)
        except ConfigError as e:
            raise ConfigError(e.problem, source=source, key=e.key, allowed=e.allowed) from None


def _positive_int(cfg: TrainConfig, name: str, src: str, allow_zero: bool = False) -> None:
    value = getattr(cfg, name)
    if isinstance(value, bool) or not isinstance(value, int) or value < (0 if allow_zero else 1):
        kind = "a non-negative" if allow_zero else "a positive"
        raise ConfigError(f"must be {kind} integer but got {value!r}", source=src, key=name)


def _as_float(value: Any, src: str, name: str) -> float:
    # YAML 1.1 reads "6e-4" (no dot) as a string: accept numeric strings too.
    try:
        if isinstance(value, bool):
            raise TypeError
        return float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"must be a number but got {value!r}", source=src, key=name) from None


def _number(cfg: TrainConfig, name: str, src: str) -> float:
    value = _as_float(getattr(cfg, name), src, name)
    setattr(cfg, name, value)
    return value


# --------------------------------------------------------------------------- result
@dataclass
class TrainResult:
    """What one run produced.

    Attributes:
        status: ``completed``; ``unstable`` (non-finite loss, or stopped by the callback);
            ``failed`` (an exception in the training loop).
        reason: why an unstable or failed run stopped; None when completed.
        stop_step: the step at which it stopped; None when completed.
        final_val_loss: the last validation loss measured (None if none was).
        best_val_loss: the lowest finite validation loss measured (None if none was).
        history: the metrics dicts, one per eval/probe step (as in ``metrics.jsonl``).
        mean_step_ms: mean wall time of a training step (probes and evals excluded, the
            first steps too: allocation and kernel selection).
        tokens_per_s: global batch tokens per second of training step.
        config: the resolved configuration, as written to ``config.yaml``.
    """

    status: Literal["completed", "unstable", "failed"]
    reason: str | None
    stop_step: int | None
    final_val_loss: float | None
    best_val_loss: float | None
    history: list[dict]
    mean_step_ms: float
    tokens_per_s: float
    config: dict

    @property
    def probe_history(self) -> list[dict]:
        """The probed steps only, with the keys the logit-growth pruner reads."""
        return [{k: m.get(k) for k in ("step", "max_logit", "min_entropy", "train_loss")}
                for m in self.history if m.get("max_logit") is not None]

    def to_dict(self) -> dict:
        """Everything but the history and config (which have their own files)."""
        return {k: getattr(self, k) for k in ("status", "reason", "stop_step", "final_val_loss",
                                              "best_val_loss", "mean_step_ms", "tokens_per_s")}

    def summary(self) -> str:
        """A few lines for people: status, losses, max logit, σ_max per type, speed."""
        steps = self.config.get("train", {}).get("steps")
        lines = [f"status      {self.status}" + (
            f" at step {self.stop_step}: {self.reason}" if self.status != "completed"
            else f" ({steps} steps)")]
        lines.append(f"val loss    final {_fmt(self.final_val_loss)}  best {_fmt(self.best_val_loss)}")
        probed = [m for m in self.history if m.get("max_logit") is not None]
        if probed:
            last = probed[-1]
            peak = max(probed, key=lambda m: m["max_logit"])
            layer = last["max_logit_per_layer"].index(last["max_logit"])
            lines.append(f"max logit   {_fmt(last['max_logit'])} at step {last['step']} "
                         f"(layer {layer}); peak {_fmt(peak['max_logit'])} at step {peak['step']}")
            lines.append("sigma_max   " + "  ".join(
                f"{t} {_fmt(v)}" for t, v in last["sigma_max"].items()))
            if last.get("dual_residual") is not None:
                lines.append(f"dual resid  {_fmt(last['dual_residual'])}")
        lines.append(f"speed       {self.mean_step_ms:.1f} ms/step, {self.tokens_per_s:,.0f} tokens/s")
        return "\n".join(lines)


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.4g}"


# --------------------------------------------------------------------------- accelerator
_ACCELERATOR: tuple[tuple[str, str], Any] | None = None


def get_accelerator(device: Device = "auto", mixed_precision: Precision = "no"):
    """The process's one ``accelerate.Accelerator``, created on first use.

    Accelerate keeps its state in a process-wide singleton that cannot change device or
    precision once made (``AcceleratorState._reset_state`` is private), so every run of a
    process must ask for the same ones. Under ``torchrun``/``accelerate launch`` the
    distributed environment is picked up here, with a collective timeout of
    ``GEOSEARCH_DIST_TIMEOUT`` seconds (default 1800, for gloo and NCCL alike): a rank
    whose peers died unnoticed by the launcher gives up after it.

    Raises:
        ConfigError: CUDA or fp16 asked for without a GPU, or a device/precision other
            than the one this process already uses.
    """
    global _ACCELERATOR
    from accelerate import Accelerator

    resolved = "cuda" if device == "cuda" or (
        device == "auto" and torch.cuda.is_available()) else "cpu"
    if resolved == "cuda" and not torch.cuda.is_available():
        raise ConfigError("CUDA is not available on this machine", key="device",
                          allowed=["auto", "cpu"])
    if mixed_precision == "fp16" and resolved != "cuda":
        raise ConfigError("fp16 needs a CUDA device", key="mixed_precision",
                          allowed=["no", "bf16"])
    key = (resolved, mixed_precision)
    if _ACCELERATOR is not None:
        if _ACCELERATOR[0] != key:
            raise ConfigError(
                f"this process already trains with device={_ACCELERATOR[0][0]}, "
                f"mixed_precision={_ACCELERATOR[0][1]}; Accelerate allows one device and "
                f"precision per process: run device={resolved}, "
                f"mixed_precision={mixed_precision} in a new process", key="mixed_precision")
        return _ACCELERATOR[1]
    from accelerate.utils import InitProcessGroupKwargs

    # Under torchrun a rank waits in a collective for the others; if one died without its
    # launcher noticing, the wait ends after this timeout instead of never (Accelerate's
    # own default is 10 min for NCCL, 30 min for gloo).
    timeout = datetime.timedelta(seconds=_dist_timeout())
    try:
        accelerator = Accelerator(cpu=resolved == "cpu", mixed_precision=mixed_precision,
                                  kwargs_handlers=[InitProcessGroupKwargs(timeout=timeout)])
    except ValueError as e:  # the state was already made by someone else, differently
        raise ConfigError(f"Accelerate refused device={resolved}, "
                          f"mixed_precision={mixed_precision}: {e}") from None
    if accelerator.num_processes > 1:
        # Leave the process group cleanly at exit: gloo ranks that exit with it alive can
        # abort (SIGABRT) when their peer has already closed its sockets.
        atexit.register(accelerator.state.destroy_process_group)
    _ACCELERATOR = (key, accelerator)
    return accelerator


def _dist_timeout() -> float:
    """Seconds a rank waits in a collective: ``GEOSEARCH_DIST_TIMEOUT``, default 1800."""
    text = os.environ.get(DIST_TIMEOUT_ENV, "").strip()
    try:
        value = float(text) if text else 1800.0
    except ValueError:
        value = -1.0
    if not value > 0:
        raise ConfigError(f"must be a positive number of seconds but got {text!r}",
                          source=DIST_TIMEOUT_ENV)
    return value


# --------------------------------------------------------------------------- train
def train(
    config: TrainConfig,
    assignment: Assignment | str | os.PathLike,
    callback: Callback | None = None,
    out_dir: str | os.PathLike | None = None,
    *,
    progress: bool = False,
) -> TrainResult:
    """Train the proxy once with ``assignment`` and report as it goes.

    Args:
        config: the run's settings.
        assignment: an :class:`~geosearch.assignment.Assignment` (module type → geometry),
            or the path of a saved one.
        callback: called on the main process as ``callback(step, metrics)`` after every
            eval/probe step; a non-empty returned string stops the run (status
            ``unstable``, that string the reason). Exceptions it raises propagate.
        out_dir: where rank 0 writes ``config.yaml`` (at the start), ``metrics.jsonl``
            (one flushed line per eval/probe step) and ``result.json`` (at the end).
        progress: show a progress bar (a TTY) or a line per evaluation (otherwise) on
            stderr, main process only.

    Returns:
        The :class:`TrainResult`. Instabilities and errors inside the loop are reported
        in it, not raised.

    Raises:
        ConfigError: bad config, an assignment that does not fit the model, or a batch
            size that does not split over the processes (before anything is trained).
        Exception: whatever fails while building the data, model or optimizer (e.g. out
            of memory), before step 1; only the training loop reports errors as ``failed``.
        KeyboardInterrupt: passed through.
    """
    config = config.resolved()
    if isinstance(assignment, (str, os.PathLike)):
        assignment = load_assignment(assignment)
    accelerator = get_accelerator(config.device, config.mixed_precision)
    try:
        return _Run(config, assignment, accelerator, out_dir).run(callback, progress)
    finally:
        # The run's model and optimizer are unreachable now; free_memory drops Accelerate's
        # references too, runs gc.collect() and empties the CUDA cache: the next run of
        # this process starts clean.
        accelerator.free_memory()


class _CallbackError(Exception):
    """Carries an exception raised by the callback (as ``__cause__``) out of the loop."""


class _Run:
    """The state of one run; :meth:`run` is the training loop."""

    def __init__(self, config: TrainConfig, assignment: Assignment, accelerator: Any,
                 out_dir: str | os.PathLike | None) -> None:
        self.config, self.accelerator = config, accelerator
        self.world, self.rank = accelerator.num_processes, accelerator.process_index
        if config.batch_size % self.world:
            raise ConfigError(f"global batch {config.batch_size} does not split over "
                              f"{self.world} processes", source="TrainConfig", key="batch_size")
        from accelerate.utils import set_seed

        set_seed(config.seed)  # python, numpy, torch (CPU and CUDA): the initialisation
        self.corpus = load_corpus(config.data)
        # preset, hf:gpt2, hf:llama or py:module:factory; checks vocab_size >= the corpus's
        self.built = build_model(config.model, vocab_size=self.corpus.vocab_size, block_size=None,
                                 model_args=config.model_args)
        self.corpus.check_block_size(self.built.block_size)
        device = accelerator.device
        model = self.built.model.to(device)  # on the device before the optimizer
        # places the weights on their manifolds
        optimizer = build_optimizer(
            model, assignment, verbose=False, lr=config.lr, spectral_lr=config.spectral_lr,
            betas=config.betas, weight_decay=config.weight_decay, momentum=config.momentum,
            solver=config.solver, **config.optimizer_args)
        self.raw_model, self.raw_optimizer = model, optimizer
        self.model, self.optimizer = accelerator.prepare(model, optimizer)
        # One LambdaLR over every group scales each group's own peak lr, so the spectral
        # step follows the same warmup + cosine as AdamW. Not passed through prepare():
        # Accelerate would step it once per process per step.
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, self.lr_factor)
        self.weight_probe = WeightProbe.from_assignment(model, assignment)

        # Batches: the training stream from the run's seed; validation and probe batches
        # fixed (VAL_SEED) and made once. Every rank draws the global batch and keeps its rows.
        self.block_size = self.built.block_size
        self.generator = torch.Generator().manual_seed(config.seed)
        val_gen = torch.Generator().manual_seed(VAL_SEED)
        self.val_batches = [self.shard(*get_batch(self.corpus.val, config.batch_size,
                                                  self.block_size, val_gen))
                            for _ in range(config.eval_batches)]
        probe_x, _ = get_batch(self.corpus.val, config.probe_batch_size, self.block_size, val_gen)
        self.probe_x = probe_x.to(device)  # (P, T), the same on every rank
        self.run_config = self.describe(assignment)
        self.writer = _RunWriter(out_dir) if out_dir is not None and accelerator.is_main_process \
            else None
        if self.writer:
            self.writer.write_config(self.run_config)

    def lr_factor(self, step: int) -> float:
        """Multiplier of the peak lr after ``step`` optimizer steps: warmup, then cosine."""
        warmup, total, floor = self.config.warmup_steps, self.config.steps, self.config.min_lr_ratio
        if step < warmup:
            return (step + 1) / warmup
        progress = min(1.0, (step - warmup) / max(1, total - warmup))
        return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))

    def shard(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """This rank's contiguous rows of a global batch, on the device."""
        n = x.size(0) // self.world
        x, y = x[self.rank * n:(self.rank + 1) * n], y[self.rank * n:(self.rank + 1) * n]
        device = self.accelerator.device
        if device.type == "cuda":  # pinned, so the copy runs asynchronously
            x, y = x.pin_memory(), y.pin_memory()
        return x.to(device, non_blocking=True), y.to(device, non_blocking=True)

    # ----------------------------------------------------------------------- loop
    def run(self, callback: Callback | None, progress: bool) -> TrainResult:
        cfg, acc = self.config, self.accelerator
        fp16 = cfg.mixed_precision == "fp16"
        max_norm = cfg.grad_clip if cfg.grad_clip > 0 else float("inf")
        tokens = cfg.batch_size * self.block_size  # global tokens per step
        bar = _Progress(cfg.steps, enabled=progress and acc.is_main_process)
        history: list[dict] = []
        step_s: list[float] = []  # wall time of each training step
        since_record = 0  # steps since the last record, for its step_ms
        status, reason, stop_step = "completed", None, None
        step = 0
        self.model.train()
        try:
            for step in range(1, cfg.steps + 1):
                t0 = time.perf_counter()
                x, y = self.shard(*get_batch(self.corpus.train, cfg.batch_size,
                                             self.block_size, self.generator))  # (B/N, T)
                loss = lm_loss(self.model, x, y)  # any model family, through the DDP wrapper
                acc.backward(loss)
                grad_norm = acc.clip_grad_norm_(self.model.parameters(), max_norm)
                # The one host sync of a step: the global mean loss and the grad norm.
                # (grad_norm is already global: DDP averaged the gradients.)
                both = torch.stack([loss.detach().float(), torch.as_tensor(grad_norm).float()])
                train_loss, gnorm = acc.reduce(both, "mean").tolist()
                lr = cfg.lr * self.lr_factor(step - 1)
                # fp16: an inf gradient norm is the loss scaler's business, not instability
                if not math.isfinite(train_loss) or (not fp16 and not math.isfinite(gnorm)):
                    what = "loss" if not math.isfinite(train_loss) else "gradient norm"
                    status, stop_step = "unstable", step
                    reason = f"non-finite {what} ({train_loss:.3g}, grad norm {gnorm:.3g})"
                    history.append(self.record(step, train_loss, gnorm, lr, None))
                    if self.writer:
                        self.writer.write_metrics(history[-1])
                    break
                if self.optimizer.scaler is not None:  # fp16: Accelerate's wrapper runs the
                    self.optimizer.step()  # loss scaler, which skips steps with inf gradients
                    stepped = not self.optimizer.step_was_skipped
                else:  # the wrapper would only add package look-ups (accelerate 1.x) per call
                    self.raw_optimizer.step()
                    stepped = True
                if stepped:
                    self.scheduler.step()
                self.raw_optimizer.zero_grad(set_to_none=True)
                since_record += 1
                do_eval = step % cfg.eval_every == 0 or step == cfg.steps
                do_probe = step % cfg.probe_every == 0 or step == cfg.steps
                if (do_eval or do_probe) and acc.device.type == "cuda":
                    torch.cuda.synchronize()  # charge the step's GPU work to the step
                step_s.append(time.perf_counter() - t0)
                bar.step(train_loss)
                if not (do_eval or do_probe):
                    continue

                interval_s = sum(step_s[-since_record:]) / since_record  # mean since last record
                since_record = 0
                metrics = self.record(step, train_loss, gnorm, lr, interval_s * 1e3,
                                      tokens / interval_s, do_eval, do_probe)
                history.append(metrics)
                if self.writer:
                    self.writer.write_metrics(metrics)
                bar.record(metrics)
                stop = self.ask(callback, step, metrics)
                if not stop and do_eval and not math.isfinite(metrics["val_loss"]):
                    stop = f"non-finite validation loss ({metrics['val_loss']})"
                if stop:
                    status, reason, stop_step = "unstable", stop, step
                    break
        except (KeyboardInterrupt, GeosearchError):
            raise
        except _CallbackError as e:  # the caller's own exception, e.g. optuna.TrialPruned
            raise e.__cause__ from None
        except Exception as e:  # noqa: BLE001 - any error of the loop is the run's result
            status, reason, stop_step = "failed", f"{type(e).__name__}: {e}", step
            if self.writer:
                self.writer.write_traceback(traceback.format_exc())
        finally:
            bar.close()
            if self.writer:
                self.writer.close()

        vals = [m["val_loss"] for m in history if m.get("val_loss") is not None]
        finite = [v for v in vals if math.isfinite(v)]
        # the first steps allocate and pick kernels: leave them out of the speed
        timed = step_s[min(10, len(step_s) // 10):] or step_s or [float("nan")]
        mean_s = sum(timed) / len(timed)
        result = TrainResult(
            status=status, reason=reason, stop_step=stop_step,
            final_val_loss=vals[-1] if vals else None,
            best_val_loss=min(finite) if finite else None,
            history=history, mean_step_ms=mean_s * 1e3, tokens_per_s=tokens / mean_s,
            config=self.run_config)
        if self.writer:
            self.writer.write_result(result)
        return result

    def ask(self, callback: Callback | None, step: int, metrics: dict) -> str | None:
        """The callback's verdict, asked on the main process and broadcast to all.

        When the callback raises, the other ranks learn it from the same broadcast and
        leave the run too (raising a ``RuntimeError``), so no rank is left waiting in the
        next step's collective.
        """
        stop, error = None, None
        if callback is not None and self.accelerator.is_main_process:
            try:
                stop = callback(step, metrics) or None
            except Exception as e:  # noqa: BLE001 - re-raised below, after the broadcast
                error = e
            if stop is not None and not isinstance(stop, str):
                stop = str(stop)
        if self.world > 1:
            from accelerate.utils import broadcast_object_list

            stop, raised = broadcast_object_list([stop, error is not None])
            if raised and error is None:
                error = RuntimeError(f"the main process's callback raised at step {step}")
        if error is not None:
            raise _CallbackError from error  # not the run's failure: re-raised as is
        return stop

    # ----------------------------------------------------------------------- measurements
    def record(self, step: int, train_loss: float, grad_norm: float, lr: float,
               step_ms: float | None, tokens_per_s: float | None = None,
               do_eval: bool = False, do_probe: bool = False) -> dict:
        """One metrics dict; keys not measured at this step are None."""
        metrics: dict[str, Any] = {
            "step": step, "train_loss": train_loss, "val_loss": None, "grad_norm": grad_norm,
            "lr": lr, "step_ms": step_ms, "tokens_per_s": tokens_per_s,
            "max_logit": None, "max_logit_per_layer": None, "min_entropy": None,
            "mean_entropy": None, "sigma_max": None, "constraint_error": None,
            "dual_residual": None,
        }
        if do_eval:
            metrics["val_loss"] = self.evaluate()
        if do_probe:
            metrics.update(self.probe())
        return metrics

    @torch.no_grad()
    def evaluate(self) -> float:
        """Mean loss over the fixed validation batches, averaged over the ranks."""
        model = self.raw_model
        model.eval()
        with self.accelerator.autocast():
            losses = torch.stack([lm_loss(model, x, y).float() for x, y in self.val_batches])
        model.train()
        return float(self.accelerator.reduce(losses.mean(), "mean").item())

    @torch.no_grad()
    def probe(self) -> dict:
        """Attention logits/entropies on the probe batch, σ_max and constraint errors."""
        with self.accelerator.autocast():
            att = attention_stats(self.raw_model, self.probe_x, self.built.qk_source) \
                if self.built.qk_source else _NO_ATTENTION  # one eval-mode forward
        weights = self.weight_probe.measure()
        residuals = [float(s["residual"]) for s in self.raw_optimizer.state.values()
                     if "residual" in s]
        return {
            "max_logit": att["max_logit"],
            "max_logit_per_layer": att["max_logit_per_layer"],
            "min_entropy": att["min_entropy"],
            "mean_entropy": att["mean_entropy"],
            "sigma_max": weights["sigma_max"],
            "constraint_error": weights["constraint_error"],  # manifold types only
            "dual_residual": max(residuals) if residuals else None,
        }

    def describe(self, assignment: Assignment) -> dict:
        """The resolved configuration and environment, as written to config.yaml."""
        acc = self.accelerator
        device = str(acc.device)
        if acc.device.type == "cuda":
            device += f" ({torch.cuda.get_device_name(acc.device)})"
        return {
            "train": self.config.to_dict(),
            "model_config": self.built.config,  # the resolved architecture (GPTConfig for presets)
            "model": self.built.describe(),
            "assignment": assignment.to_dict(),
            "geometry": dict(assignment.resolve()),
            "data": {"source": self.corpus.source, "train_tokens": int(self.corpus.train.numel()),
                     "val_tokens": int(self.corpus.val.numel())},
            "seed": self.config.seed,
            "device": device,
            "mixed_precision": self.config.mixed_precision,
            "num_processes": self.world,
            "versions": _versions(),
            "hostname": socket.gethostname(),
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "command": list(sys.argv),
        }


def _versions() -> dict[str, str]:
    import accelerate

    from geosearch import __version__

    try:  # read from the metadata: nothing below search/ imports Optuna
        optuna = metadata.version("optuna")
    except metadata.PackageNotFoundError:
        optuna = "not installed"
    return {"geosearch": __version__, "torch": str(torch.__version__),
            "accelerate": accelerate.__version__, "optuna": optuna,
            "python": platform.python_version()}


# --------------------------------------------------------------------------- output
class _RunWriter:
    """The run directory: config.yaml, metrics.jsonl (flushed per line), result.json."""

    def __init__(self, out_dir: str | os.PathLike) -> None:
        self.dir = Path(out_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.metrics = open(self.dir / "metrics.jsonl", "w", encoding="utf-8")  # noqa: SIM115

    def write_config(self, config: dict) -> None:
        with open(self.dir / "config.yaml", "w", encoding="utf-8") as f:
            yaml.safe_dump(_plain(config), f, sort_keys=False)

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


def _plain(x: Any) -> Any:
    """Tuples to lists, paths to strings: what ``yaml.safe_dump`` can write."""
    if isinstance(x, Mapping):
        return {str(k): _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    if isinstance(x, os.PathLike):
        return os.fspath(x)
    if isinstance(x, str):  # str subclasses too (torch.__version__ is a TorchVersion)
        return str(x)
    return x


class _Progress:
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
            self.bar.set_postfix(loss=f"{loss:.3f}", max_logit=_fmt(self.max_logit),
                                 refresh=False)
            self.bar.update(1)  # redraws at most every 0.1 s

    def record(self, m: dict) -> None:
        if m["max_logit"] is not None:
            self.max_logit = m["max_logit"]
        if self.enabled and self.bar is None and m["val_loss"] is not None:
            print(f"step {m['step']}: train {m['train_loss']:.4f} val {m['val_loss']:.4f} "
                  f"max logit {_fmt(self.max_logit)} {m['step_ms']:.1f} ms/step",
                  file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
