"""One proxy pretraining run: the training loop behind every trial and ``geosearch train``.

:func:`train` builds the model (any spec of :mod:`geosearch.models.zoo`), the data and the
optimizer (AdamW and manifold Muon groups in one ``ManifoldMuon``), then runs the loop:
draw the *global* batch from a seeded generator, keep this rank's rows, forward, backward,
clip the global gradient norm, step (then QK-clip when ``qk_clip`` is set:
:mod:`geosearch.proxy.qkclip`), move the learning rate along warmup + cosine. Every
``eval_every`` steps it measures the validation loss on fixed batches and every
``probe_every`` steps the attention logits, entropies, σ_max and constraint errors; each
such step becomes one line of ``metrics.jsonl`` (:mod:`geosearch.proxy.rundir`) and one
``callback(step, metrics)`` call, whose returned reason stops the run. A non-finite loss
ends the run ``unstable``, an exception in the loop ``failed``; neither raises. It knows
nothing of Optuna. Data parallel: every rank draws the same global batch and takes its own
contiguous slice, so N processes see the data one process sees; rank 0 alone writes files
and asks the callback, and its decision is broadcast::

    >>> from geosearch.assignment import Assignment
    >>> result = train(TrainConfig(model="tiny", steps=50),
    ...                Assignment.parse("attn=stiefel,mlp=dgram"), out_dir="runs/one")
    >>> result.status, result.final_val_loss
    ('completed', 2.71...)

    accelerate launch --multi_gpu --num_processes 4 -m geosearch train ...   # GPUs
    torchrun --nproc_per_node 2 -m geosearch train --device cpu ...           # CPU, gloo
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import time
import traceback
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from geosearch.assignment import Assignment, load_assignment
from geosearch.util.errors import ConfigError, GeosearchError, SettingsError
from geosearch.build import optimizer_from_plan
from geosearch.plan import bind
from geosearch.proxy.accelerator import get_accelerator
from geosearch.proxy.config import TrainConfig, TrainResult, check_batch_split
from geosearch.proxy.data import config_corpus, get_batch
from geosearch.proxy.probes import WeightProbe, attention_stats
from geosearch.proxy.qkclip import QKClip
from geosearch.proxy.rundir import Progress, RunWriter, describe_run
from geosearch.proxy.state import restore_state, save_state, start_state, state_path, wanted
from geosearch.proxy.trackers import Trackers, check_trackers
from geosearch.models.lm import lm_loss
from geosearch.models.memory import check_fits, probe_logit_bytes
from geosearch.models.zoo import build_meta_model, build_model, check_logits

__all__ = ["VAL_SEED", "train"]

Callback = Callable[[int, dict], "str | None"]

# The validation and probe batches are drawn with this seed whatever ``TrainConfig.seed``
# is, so runs with different seeds are scored on the same text.
VAL_SEED = 1234

# A model whose attention geosearch cannot capture: no logits or entropies to report.
_NO_ATTENTION = {"max_logit": None, "max_logit_per_layer": None, "min_entropy": None, "mean_entropy": None}


# --------------------------------------------------------------------------- train
def train(
    config: TrainConfig,
    assignment: Assignment | str | os.PathLike,
    callback: Callback | None = None,
    out_dir: str | os.PathLike | None = None,
    *,
    progress: bool = False,
    project: str = "geosearch",
    run_name: str | None = None,
    store_dir: str | os.PathLike | None = None,
    start_from: str | os.PathLike | None = None,
    save_at: tuple[int, ...] = (),
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
        project: the tracker project the run belongs to (``config.log_with``): the
            search passes its study name.
        run_name: the run's tracker name (the search: ``trial N seed S``); None = the
            name of ``out_dir``.
        store_dir: where a tracker store shared by the project's runs lives (MLflow's
            ``mlflow.db``): the search passes its study's directory; None = ``out_dir``.
        start_from: a state another run saved (:mod:`geosearch.proxy.state`: a trunk's, at
            the start of this run's cooldown) to train on from; its records come first.
        save_at: steps after which to save the state in ``out_dir/states`` (a trunk's
            branch points). With either, the run keeps its own latest state at each
            evaluation and, rerun into ``out_dir``, resumes from it.

    Returns:
        The :class:`TrainResult`. Instabilities and errors inside the loop are reported
        in it, not raised.

    Raises:
        ConfigError: bad config or an assignment that does not fit the model (before
            anything is trained); a :class:`~geosearch.util.errors.SettingsError` for what fails
            every run of these settings, whatever it trains: a device or precision this
            machine lacks, a batch that does not split over the processes x ``grad_accum``,
            an unknown tracker, the data, the model (a ``py:`` model's logits not of the
            data's vocabulary).
        Exception: whatever fails while building the data, model or optimizer (e.g. out
            of memory), before step 1; only the training loop reports errors as ``failed``.
        KeyboardInterrupt: passed through.
    """
    config = config.resolved()
    if isinstance(assignment, (str, os.PathLike)):
        assignment = load_assignment(assignment)
    accelerator = get_accelerator(config.device, config.mixed_precision)
    # the precision used (the run's, else Accelerate's configuration), as config.yaml records
    config = dataclasses.replace(config, mixed_precision=accelerator.mixed_precision)
    try:
        run = _Run(config, assignment, accelerator, out_dir,
                   tracking=(project, run_name or Path(out_dir or "run").name), store_dir=store_dir)
        keep = (start_from is not None or bool(save_at)) and out_dir is not None
        start = start_state(out_dir, start_from, config) if keep or start_from is not None else None
        return run.run(callback, progress, start=start, save_at=save_at if keep else (), keep=keep)
    finally:
        # The run's model and optimizer are unreachable now; free_memory drops Accelerate's
        # references too, runs gc.collect() and empties the CUDA cache: the next run of
        # this process starts clean.
        accelerator.free_memory()


def _non_finite(train_loss: float, grad_norm: float, fp16: bool) -> str | None:
    """The reason a step's loss or grad norm stops the run (fp16's inf grad norm is the scaler's), else None."""
    # fp16: an inf gradient norm is the loss scaler's business, not instability
    if not math.isfinite(train_loss) or (not fp16 and not math.isfinite(grad_norm)):
        what = "loss" if not math.isfinite(train_loss) else "gradient norm"
        return f"non-finite {what} ({train_loss:.3g}, grad norm {grad_norm:.3g})"
    return None


class _CallbackError(Exception):
    """Carries an exception raised by the callback (as ``__cause__``) out of the loop."""


class _Run:
    """The state of one run; :meth:`run` is the training loop."""

    def __init__(self, config: TrainConfig, assignment: Assignment, accelerator: Any,
                 out_dir: str | os.PathLike | None,
                 tracking: tuple[str, str] = ("geosearch", "run"),
                 store_dir: str | os.PathLike | None = None) -> None:
        self.config, self.accelerator = config, accelerator
        self.world, self.rank = accelerator.num_processes, accelerator.process_index
        # The run's settings, every rank, before any work: what fails here fails every run
        # of these settings, whatever it trains (SettingsError; the search stops on one).
        check_batch_split(config.batch_size, config.grad_accum, self.world)
        check_trackers(config.log_with)
        from accelerate.utils import set_seed

        set_seed(config.seed)  # python, numpy, torch (CPU and CUDA): the initialisation
        try:
            self.corpus = config_corpus(config)
            # too large for the device: one line before any memory is taken
            meta = build_meta_model(config.model, vocab_size=self.corpus.vocab_size, model_args=config.model_args)
            probe = probe_logit_bytes(meta.config, meta.block_size, config.probe_batch_size)
            check_fits(meta.model, config.model, accelerator.device, source="TrainConfig",
                       key="model_args", probe_bytes=probe)
            del meta
            # preset, hf:gpt2, hf:llama or py:module:factory; checks vocab_size >= the corpus's
            self.built = build_model(config.model, vocab_size=self.corpus.vocab_size, block_size=None,
                                     model_args=config.model_args)
            self.corpus.check_block_size(self.built.block_size)
            if self.built.family == "py":  # a factory's logits: the data's vocabulary (on the CPU)
                check_logits(self.built, self.corpus.vocab_size, source="TrainConfig")
        except SettingsError:
            raise
        except ConfigError as e:  # the data or the model: the same for every assignment
            raise SettingsError.of(e) from e
        device = accelerator.device
        model = self.built.model.to(device)  # on the device before the optimizer
        # What every parameter gets, bound once: the optimizer, the probes and config.yaml
        # read this plan. Building the optimizer places the weights on their manifolds.
        self.plan = bind(model, assignment, config.optimizer_settings(), source="TrainConfig")
        optimizer = optimizer_from_plan(self.plan, verbose=False)
        self.raw_model, self.raw_optimizer = model, optimizer
        self.model, self.optimizer = accelerator.prepare(model, optimizer)
        if config.compile:  # the training steps only; probes and evals run raw_model
            self.model = torch.compile(self.model)
        # One LambdaLR over every group scales each group's own peak lr, so the spectral
        # step follows the same warmup + cosine as AdamW. Not passed through prepare():
        # Accelerate would step it once per process per step.
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, self.lr_factor)
        self.weight_probe = WeightProbe.from_plan(self.plan)
        # QK-clip (off unless config.qk_clip): refuses query/key weights on a manifold
        self.qk_clip = QKClip(model, config.qk_clip, qk_source=self.built.qk_source, plan=self.plan,
                              source="TrainConfig")

        # Batches: the training stream from the run's seed; validation and probe batches
        # fixed (VAL_SEED) and made once. Every rank draws the global batch and keeps its rows.
        self.block_size = self.built.block_size
        self.generator = torch.Generator().manual_seed(config.seed)
        val_gen = torch.Generator().manual_seed(VAL_SEED)
        self.val_batches = [self.shard(*get_batch(self.corpus.val, config.batch_size,
                                                  self.block_size, val_gen))
                            for _ in range(config.eval_batches)]  # each x, y: (B/N, T)
        probe_x, _ = get_batch(self.corpus.val, config.probe_batch_size, self.block_size, val_gen)
        self.probe_x = probe_x.to(device)  # (P, T), the same on every rank
        self.run_config = describe_run(config, self.plan, self.built, self.corpus, accelerator)
        self.writer = RunWriter(out_dir) if out_dir is not None and accelerator.is_main_process \
            else None
        if self.writer:
            self.writer.write_config(self.run_config)
        elif config.log_with and accelerator.is_main_process:
            warnings.warn("log_with is ignored: the run has no directory (out_dir) for the "
                          "trackers' files", stacklevel=3)
        self.trackers = Trackers(config.log_with, out_dir, project=tracking[0], run_name=tracking[1],
                                 config=self.run_config, store_dir=store_dir) \
            if self.writer and config.log_with else None

    def lr_factor(self, step: int) -> float:
        """Multiplier of the peak lr after ``step`` optimizer steps (TrainConfig.lr_factor)."""
        return self.config.lr_factor(step)

    def shard(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """This rank's contiguous rows of a global batch, on the device: (B, T) -> (B/N, T)."""
        n = x.size(0) // self.world
        x, y = x[self.rank * n:(self.rank + 1) * n], y[self.rank * n:(self.rank + 1) * n]
        device = self.accelerator.device
        if device.type == "cuda":  # pinned, so the copy runs asynchronously
            x, y = x.pin_memory(), y.pin_memory()
        return x.to(device, non_blocking=True), y.to(device, non_blocking=True)

    # ----------------------------------------------------------------------- loop
    def run(self, callback: Callback | None, progress: bool, *, start: dict | None = None,
            save_at: tuple[int, ...] = (), keep: bool = False) -> TrainResult:
        cfg, acc = self.config, self.accelerator
        fp16 = cfg.mixed_precision == "fp16"
        max_norm = cfg.grad_clip if cfg.grad_clip > 0 else float("inf")
        tokens = cfg.batch_size * self.block_size  # global tokens per step
        bar = Progress(cfg.steps, enabled=progress and acc.is_main_process)
        history: list[dict] = []
        step_s: list[float] = []  # wall time of each training step
        since_record = 0  # steps since the last record, for its step_ms
        status, reason, stop_step = "completed", None, None
        ended = None  # "interrupted" when an exception leaves the loop
        step = 0
        if start is not None:  # a trunk's state, or this run's own (a rerun)
            step, history = restore_state(self, start)
        first = step + 1
        self.model.train()
        try:
            for step in range(first, cfg.steps + 1):
                t0 = time.perf_counter()
                train_loss, gnorm = self.train_step(max_norm)
                lr = cfg.lr * self.lr_factor(step - 1)
                bad = _non_finite(train_loss, gnorm, fp16)
                if bad is not None:
                    status, stop_step, reason = "unstable", step, bad
                    history.append(self.record(step, train_loss, gnorm, lr, None))
                    self.emit(history[-1])
                    break
                self.optimizer_step()
                since_record += 1
                do_eval = step % cfg.eval_every == 0 or step == cfg.steps
                do_probe = step % cfg.probe_every == 0 or step == cfg.steps
                if (do_eval or do_probe) and acc.device.type == "cuda":
                    torch.cuda.synchronize()  # charge the step's GPU work to the step
                step_s.append(time.perf_counter() - t0)
                bar.step(train_loss)
                if not (do_eval or do_probe):
                    self.keep_states(step, history, save_at, keep=False)
                    continue

                interval_s = sum(step_s[-since_record:]) / since_record  # mean since last record
                since_record = 0
                metrics = self.record(step, train_loss, gnorm, lr, interval_s * 1e3,
                                      tokens / interval_s, do_eval, do_probe)
                history.append(metrics)
                self.emit(metrics)
                bar.record(metrics)
                stop = self.verdict(callback, step, metrics, do_eval)
                if stop:
                    status, reason, stop_step = "unstable", stop, step
                    break
                self.keep_states(step, history, save_at, keep=keep and do_eval)
        except (KeyboardInterrupt, GeosearchError):
            ended = "interrupted"
            raise
        except _CallbackError as e:  # the caller's own exception, e.g. TrialLost
            ended = "interrupted"
            raise e.__cause__ from None
        except Exception as e:  # noqa: BLE001 - any error of the loop is the run's result
            status, reason, stop_step = "failed", f"{type(e).__name__}: {e}", step
            if self.writer:
                self.writer.write_traceback(traceback.format_exc())
        finally:  # an interrupted run's trackers get what it measured, and end valid
            result = self.result(status, reason, stop_step, history, step_s, tokens)
            self.close(bar, ended or status, result)
        if self.writer:
            self.writer.write_result(result)
        return result

    def keep_states(self, step: int, history: list[dict], save_at: tuple[int, ...],
                    keep: bool) -> None:
        """Save the states wanted after ``step`` (:func:`~geosearch.proxy.state.wanted`), rank 0."""
        if self.writer is None:
            return
        for at in wanted(step, save_at, keep, True):
            save_state(state_path(self.writer.dir, at), self, step, history)

    def train_step(self, max_norm: float) -> tuple[float, float]:
        """One step's batch, forward/backward and gradient clip: the global mean loss and grad norm."""
        acc = self.accelerator
        x, y = self.shard(*get_batch(self.corpus.train, self.config.batch_size,
                                     self.block_size, self.generator))  # (B/N, T)
        with self.qk_clip.observe():  # each head's max logit, when QK-clip is on
            loss = self.forward_backward(x, y)  # (), the mean over the micro-batches
        grad_norm = acc.clip_grad_norm_(self.model.parameters(), max_norm)
        # The one host sync of a step: the global mean loss and the grad norm.
        # (grad_norm is already global: DDP averaged the gradients.)
        both = torch.stack([loss.detach().float(), torch.as_tensor(grad_norm).float()])  # (2,)
        train_loss, gnorm = acc.reduce(both, "mean").tolist()
        return train_loss, gnorm

    def optimizer_step(self) -> None:
        """The optimizer step, then QK-clip and the schedule (unless fp16 skipped it); zero the grads."""
        if self.optimizer.scaler is not None:  # fp16: Accelerate's wrapper runs the
            self.optimizer.step()  # loss scaler, which skips steps with inf gradients
            stepped = not self.optimizer.step_was_skipped
        else:  # the wrapper would only add package look-ups (accelerate 1.x) per call
            self.raw_optimizer.step()
            stepped = True
        if stepped:
            self.qk_clip.apply()  # shrink W_q/W_k of heads whose max logit passed τ
            self.scheduler.step()
        self.raw_optimizer.zero_grad(set_to_none=True)

    def verdict(self, callback: Callback | None, step: int, metrics: dict, do_eval: bool) -> str | None:
        """Why the run stops after this record (the callback's reason, else a non-finite val loss)."""
        stop = self.ask(callback, step, metrics)
        if not stop and do_eval and not math.isfinite(metrics["val_loss"]):
            stop = f"non-finite validation loss ({metrics['val_loss']})"
        return stop

    def close(self, bar: Progress, ended: str, result: TrainResult) -> None:
        """Close the progress bar, the run's files and its trackers (given how the run
        ``ended`` and its ``result`` so far: their final metrics)."""
        bar.close()
        if self.writer:
            self.writer.close()
        if self.trackers:
            self.trackers.finish(ended, result)

    def result(self, status: str, reason: str | None, stop_step: int | None, history: list[dict],
               step_s: list[float], tokens: int) -> TrainResult:
        """The run's :class:`TrainResult` (:meth:`run` writes it to ``result.json``)."""
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
        return result

    def emit(self, metrics: dict) -> None:
        """Write one record to metrics.jsonl and the trackers (main process)."""
        if self.writer:
            self.writer.write_metrics(metrics)
        if self.trackers:
            self.trackers.log(metrics)

    def forward_backward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Forward and backward of this rank's rows in ``grad_accum`` equal micro-batches.

        Each micro-batch's mean loss is divided by their number, so the summed gradient is
        the whole batch's (every target counts: none is -1 in a corpus). An explicit loop,
        not Accelerate's ``accumulate()``: its ``gradient_accumulation_steps`` belongs to
        the process's one Accelerator, not to a run. DDP averages over the ranks once, in
        the last micro-batch's backward.

        Args:
            x, y: this rank's inputs and targets (B/N, T).

        Returns:
            The batch's mean loss, detached (a scalar).
        """
        n, acc = self.config.grad_accum, self.accelerator
        total = torch.zeros((), device=x.device)
        for i, (xm, ym) in enumerate(zip(x.chunk(n), y.chunk(n))):  # each (B/N/n, T)
            with contextlib.nullcontext() if i == n - 1 else acc.no_sync(self.model):
                loss = lm_loss(self.model, xm, ym) / n  # any model family, through the wrappers
                acc.backward(loss)
            total += loss.detach().float()
        return total

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
            "max_logit": None, "max_logit_per_layer": None, "max_logit_per_head": None,
            "min_entropy": None,
            "mean_entropy": None, "sigma_max": None, "constraint_error": None,
            "dual_residual": None,
            **self.qk_clip.metrics(),  # qk_clipped, qk_clipped_total: only when QK-clip is on
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
            losses = torch.stack([lm_loss(model, x, y).float() for x, y in self.val_batches])  # (E,)
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
            "max_logit_per_head": att.get("max_logit_per_head"),
            "min_entropy": att["min_entropy"],
            "mean_entropy": att["mean_entropy"],
            "sigma_max": weights["sigma_max"],
            "constraint_error": weights["constraint_error"],  # manifold types only
            "dual_residual": max(residuals) if residuals else None,
            # a soft-capping model's logits before the cap: only for such a model
            **{key: att[key] for key in ("raw_max_logit", "raw_max_logit_per_layer") if key in att},
        }
