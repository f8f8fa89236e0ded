"""What one proxy run is given and what it gives back: :class:`TrainConfig`, :class:`TrainResult`.

Both are plain dataclasses without torch, so a search space, a report or the command line
can build, check and print them without loading the trainer; :func:`geosearch.proxy.train.train`
takes the one and returns the other. Every field of a run's settings, its default and its
check live in :class:`TrainConfig` (the fields), :data:`LIMITS` (the ranges of its numbers) and
:meth:`TrainConfig._check` (the checks).
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

from geosearch.util.checks import MAX_STEPS, SEED, STEPS, Range
from geosearch.util.errors import ConfigError, SettingsError
from geosearch.models.specs import MODEL_SIZE
from geosearch.optim import settings as optim_settings

Device = Literal["auto", "cpu", "cuda"]
Precision = Literal["no", "bf16", "fp16"]

OPTIMIZER_FIELDS = ("lr", "spectral_lr", "weight_decay", "betas", "momentum", "solver")
"""The optimizer settings that are fields of their own (the common ones); the others go in
``optimizer_args``. Defaults, checks and docs come from :mod:`geosearch.optim.settings`."""
_OPT = optim_settings.defaults()
_COUNT = 10_000  # the most batches, micro-batches or probe sequences of one step

LIMITS: dict[str, Range] = {
    "vocab_size": dataclasses.replace(MODEL_SIZE, null=True),
    "steps": STEPS,
    "batch_size": Range(1, 100_000, whole=True),
    "warmup_steps": Range(0, MAX_STEPS, whole=True, null=True),
    "min_lr_ratio": Range(0, 1),
    "cooldown_steps": Range(0, MAX_STEPS, whole=True, null=True),
    "grad_clip": Range(0),
    "qk_clip": Range(0, open_low=True, null=True),
    "eval_every": STEPS,
    "eval_batches": Range(1, _COUNT, whole=True),
    "probe_every": STEPS,
    "probe_batch_size": Range(1, _COUNT, whole=True),
    "seed": SEED,
    "grad_accum": Range(1, _COUNT, whole=True),
}
"""Every number field of :class:`TrainConfig` but the optimizer's (whose ranges are the
settings catalog's, :mod:`geosearch.optim.settings`) -> the values it may take: the one rule
for numbers (:class:`~geosearch.util.checks.Range`: NaN and ±inf never, counts bounded)."""
LIMIT_NOTES = {"qk_clip": " (the cap on each head's max attention logit, e.g. 100; null: off)",
               "grad_clip": " (0: no clipping)",
               "vocab_size": " (the data's vocabulary; null: its meta file's, its tokenizer's, or 256 for text)"}
"""What a message adds to the range of a field, where the range alone does not say it."""


# --------------------------------------------------------------------------- settings
@dataclass
class TrainConfig:
    """Everything that defines one proxy run, besides the assignment.

    Example:
        >>> TrainConfig(model="tiny", steps=100, lr=1e-3).resolved().warmup_steps
        10
    """

    model: str = "small"
    """The model to train: a proxy preset name (``tiny``, ``small``, ``gpt2``), ``hf:gpt2``,
    ``hf:llama``, ``hf:MODEL_TYPE``, ``hf:PATH`` (Hugging Face, random weights, no download)
    or ``py:module:factory`` (your own ``nn.Module``); see :mod:`geosearch.models.zoo`."""
    model_args: dict[str, Any] = field(default_factory=dict)
    """Model field overrides: a preset's ``GPTConfig`` fields (``{"n_layer": 2}``), a Hugging
    Face config's fields or their aliases (``{"num_hidden_layers": 2}``), or the factory's
    keyword arguments; ``block_size`` works for every kind."""
    data: str | None = None
    """Corpus file or directory for ``load_corpus``; None = the built-in text."""
    tokenizer: str | None = None
    """A Hugging Face ``tokenizer.json`` (or a directory holding one) that encodes the text;
    the vocabulary size is then the tokenizer's. None = bytes (vocab 256)."""
    vocab_size: int | None = None
    """The data's vocabulary size: what ``train.bin`` / ``val.bin`` token ids need when no
    meta file or tokenizer gives it (nanoGPT's ``openwebtext`` writes none: 50257, the GPT-2
    ids); the ids are checked against it. None = the meta file's, the tokenizer's, else
    ``model_args.vocab_size`` (token files), 256 (text). The model's is the data's unless
    ``model_args.vocab_size`` raises it (nanoGPT pads 50257 to 50304)."""
    steps: int = 300
    """Optimizer steps of the run."""
    batch_size: int = 16
    """Global batch in sequences, split evenly over the processes."""
    lr: float = _OPT["lr"]
    """Peak AdamW learning rate (embeddings, head, norms, and weights assigned ``adamw``)."""
    spectral_lr: float = _OPT["spectral_lr"]
    """Peak spectral step size of the manifold Muon groups."""
    weight_decay: float = _OPT["weight_decay"]
    """AdamW weight decay (matrices only; the manifolds take none)."""
    betas: tuple[float, float] = _OPT["betas"]
    """AdamW betas."""
    momentum: float = _OPT["momentum"]
    """Nesterov momentum of the manifold Muon groups."""
    solver: str = _OPT["solver"]
    """Manifold Muon direction: ``project`` (one msign) or ``dual`` (dual ascent)."""
    optimizer_args: dict[str, Any] = field(default_factory=dict)
    """Further global optimizer settings (:mod:`geosearch.optim.settings`), e.g.
    ``{"dual_steps": 5, "ns_steps": 5}``."""
    warmup_steps: int | None = None
    """Linear warmup steps; None = 10% of ``steps``."""
    min_lr_ratio: float = 0.1
    """Both learning rates decay along a cosine to this fraction of their peak."""
    cooldown_steps: int | None = None
    """None: warmup, then the cosine. A number: warmup, then constant at the peak, then a
    linear cooldown over this many last steps to ``min_lr_ratio`` (warmup-stable-decay: a
    run's state before its cooldown is the same for every length, so a cooldown branched
    off one constant-step run completes a run of that length: ``ladder.branches``)."""
    grad_clip: float = 1.0
    """Global gradient-norm clip; 0 = no clipping (the norm is still measured)."""
    qk_clip: float | None = None
    """QK-clip (Kimi K2's MuonClip, :mod:`geosearch.proxy.qkclip`): after each step, shrink
    the query/key weights of every head whose max attention logit in that step's forward
    exceeded this cap τ (Kimi uses 100); None = off. Only for unconstrained attention
    (``adamw``, ``euclidean``, ``spectral_ball``); the records count the clipped heads."""
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
    mixed_precision: Precision | None = None
    """``no``, ``bf16`` or ``fp16`` (fp16 needs CUDA); None = Accelerate's configuration
    (``accelerate launch --mixed_precision``, ``accelerate config``: the variable
    ``ACCELERATE_MIXED_PRECISION``), else ``no``. One value per process; ``config.yaml``
    records the one used."""
    grad_accum: int = 1
    """Micro-batches per optimizer step: the global batch is split into this many, each
    forward/backward on its own, and the gradients summed before the one step."""
    compile: bool = False
    """``torch.compile`` the model for the training steps (the probes and evaluations run
    the model as it is)."""
    log_with: list[str] = field(default_factory=list)
    """Accelerate trackers the run logs its records to (``tensorboard``, ``wandb``,
    ``mlflow``, ...; offline, under the run directory); empty = none."""

    def __post_init__(self) -> None:
        self._check()

    def _check(self) -> None:
        src = "TrainConfig"
        self._check_numbers(src)
        self._check_optimizer_fields(src)
        self._check_device(src)
        self._check_model_and_args(src)
        self._check_run_options(src)

    def _check_numbers(self, src: str) -> None:
        """Check every number field but the optimizer's against :data:`LIMITS`; keep the
        checked values (``int`` counts, ``float`` others: ``"1e-4"`` too, as YAML 1.1 reads it)."""
        for name, allowed in LIMITS.items():
            value, problem = allowed.check(getattr(self, name))
            if problem is not None:
                raise ConfigError(problem + LIMIT_NOTES.get(name, ""), source=src, key=name)
            setattr(self, name, value)
        if self.warmup_steps is not None and self.warmup_steps > self.steps:
            raise ConfigError(f"{self.warmup_steps:,} warmup steps in a run of {self.steps:,} "
                              "steps; "
                              f"expected at most {self.steps:,} (null: 10% of steps)", source=src,
                              key="warmup_steps")

    def _check_optimizer_fields(self, src: str) -> None:
        """Check the optimizer settings that are fields of their own; keep their checked values."""
        for name in OPTIMIZER_FIELDS:  # a peak lr of 0 is allowed, as in a bare param group
            value, want = optim_settings.validate(name, getattr(self, name), group=True)
            if want is not None:
                setting = optim_settings.SETTINGS[name]
                raise ConfigError(f"expected {want}, got {value!r}", source=src, key=name,
                                  allowed=setting.choices or None)
            setattr(self, name, value)

    def _check_device(self, src: str) -> None:
        """Check ``device`` and ``mixed_precision`` (a YAML ``no``, read as false, becomes ``"no"``)."""
        if self.mixed_precision is False:  # YAML 1.1 reads a bare `no` as false
            self.mixed_precision = "no"
        for name, kind in (("device", Device), ("mixed_precision", Precision)):
            if getattr(self, name) not in get_args(kind) and not (
                    name == "mixed_precision" and self.mixed_precision is None):
                raise ConfigError(f"unknown value {getattr(self, name)!r}", source=src, key=name,
                                  allowed=get_args(kind))

    def _check_model_and_args(self, src: str) -> None:
        """Check the model spec; make ``model_args`` and ``optimizer_args`` checked plain dicts."""
        if not isinstance(self.model, str):
            raise ConfigError(f"must be a model spec (a preset name, hf:NAME or py:MODULE:FACTORY) "
                              f"but got {self.model!r}", source=src, key="model")
        for name in ("model_args", "optimizer_args"):
            if not isinstance(getattr(self, name), Mapping):
                raise ConfigError(f"must be a mapping but got {getattr(self, name)!r}",
                                  source=src, key=name)
            setattr(self, name, dict(getattr(self, name)))
        others = [n for n in optim_settings.names("global") if n not in OPTIMIZER_FIELDS]
        for k, v in self.optimizer_args.items():
            if k not in others:
                raise ConfigError("unknown optimizer setting" + (
                    f" (it is a field of its own: set {k} directly)" if k in OPTIMIZER_FIELDS else ""),
                    source=src, key=f"optimizer_args.{k}", allowed=others)
            self.optimizer_args[k] = optim_settings.check(k, v, source=src, key=f"optimizer_args.{k}")

    def _check_run_options(self, src: str) -> None:
        """Check ``compile``, ``data`` and ``tokenizer``; make ``log_with`` a list of tracker names."""
        if not isinstance(self.compile, bool):
            raise ConfigError(f"must be true or false but got {self.compile!r}", source=src,
                              key="compile")
        self.log_with = _tracker_names(self.log_with, src)
        warmup = self.steps // 10 if self.warmup_steps is None else self.warmup_steps
        warmup = min(warmup, self.steps)
        if self.cooldown_steps is not None and self.cooldown_steps > self.steps - warmup:
            raise ConfigError(f"expected at most steps - warmup ({self.steps - warmup}), got "
                              f"{self.cooldown_steps}: the cooldown follows the warmup", source=src,
                              key="cooldown_steps")
        if self.data is not None and not isinstance(self.data, (str, os.PathLike)):
            raise ConfigError(f"must be a path or null but got {self.data!r}", source=src,
                              key="data")
        if self.tokenizer is not None and not isinstance(self.tokenizer, (str, os.PathLike)):
            raise ConfigError(f"must be a path or null but got {self.tokenizer!r}", source=src,
                              key="tokenizer")

    def resolved(self) -> TrainConfig:
        """A copy with every default that depends on other fields filled in."""
        warmup = self.steps // 10 if self.warmup_steps is None else self.warmup_steps
        return dataclasses.replace(self, warmup_steps=warmup)

    def lr_factor(self, step: int) -> float:
        """Multiplier of the peak learning rates after ``step`` optimizer steps (the
        trainer's schedule): the linear warmup, then the cosine, or with ``cooldown_steps``
        the constant peak and the linear cooldown, whose last step is at ``min_lr_ratio``."""
        total, floor, cool = self.steps, self.min_lr_ratio, self.cooldown_steps
        warmup = min(total // 10 if self.warmup_steps is None else self.warmup_steps, total)
        if step < warmup:
            return (step + 1) / warmup
        if cool is not None:
            start = total - cool
            if step < start or not cool:
                return 1.0
            return 1 - (1 - floor) * min(1.0, (step - start + 1) / cool)
        progress = min(1.0, (step - warmup) / max(1, total - warmup))
        return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))

    def optimizer_settings(self) -> dict[str, Any]:
        """The global optimizer settings of the run (``build_optimizer`` keywords, an
        assignment's ``settings``): the optimizer fields and ``optimizer_args``."""
        return {**{n: getattr(self, n) for n in OPTIMIZER_FIELDS}, **self.optimizer_args}

    def to_dict(self) -> dict[str, Any]:
        """Plain YAML/JSON-safe values (``betas`` as a list, ``data`` as a string)."""
        d = dataclasses.asdict(self)
        d["betas"] = list(self.betas)
        d["data"] = None if self.data is None else str(self.data)
        d["tokenizer"] = None if self.tokenizer is None else str(self.tokenizer)
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


def check_batch_split(batch_size: int, grad_accum: int, processes: int = 1, *,
                      source: str | None = "TrainConfig", prefix: str = "") -> None:
    """Refuse a global batch that does not split evenly over ``processes`` and then into
    ``grad_accum`` micro-batches: every run of these settings would be refused.

    Args:
        batch_size: the global batch, in sequences.
        grad_accum: micro-batches per optimizer step.
        processes: the processes that share each step (data parallel).
        source: where the values came from; ``prefix`` goes before the key
            (``"proxy."`` in a search space).

    Raises:
        SettingsError: naming ``batch_size`` when the processes do not divide it, else
            ``grad_accum`` and the values that split this process's rows.

    Example:
        >>> check_batch_split(4, 3, source="s.yaml", prefix="proxy.")
        Traceback (most recent call last):
        ...
        geosearch.util.errors.SettingsError: s.yaml: proxy.grad_accum: global batch 4 does not split over 1 process x 3 micro-batches; expected one of: 1, 2, 4
    """
    if batch_size % processes:
        raise SettingsError(f"global batch {batch_size} does not split over the {processes} processes "
                            "of this launch", source=source, key=f"{prefix}batch_size")
    rows = batch_size // processes  # each process's
    if rows % grad_accum:
        divisors = [d for d in range(1, rows + 1) if rows % d == 0] if rows <= 1 << 20 else []
        many = not divisors or len(divisors) > 16
        where = f"{processes} process{'es' if processes > 1 else ''} x {grad_accum} micro-batches"
        raise SettingsError(f"global batch {batch_size} does not split over {where}"
                            + (f"; expected a divisor of {rows}" if many else ""),
                            source=source, key=f"{prefix}grad_accum", allowed=None if many else divisors)


def _tracker_names(value: Any, src: str) -> list[str]:
    """``log_with`` as a list of tracker names: one name, a comma-separated string or a list."""
    if value is None:
        return []
    names = value.split(",") if isinstance(value, str) else value
    if not isinstance(names, (list, tuple)) or not all(isinstance(n, str) for n in names):
        raise ConfigError(f"must be a tracker name or a list of them but got {value!r}",
                          source=src, key="log_with")
    return [n.strip() for n in names if n.strip()]


def check_qk_clip(value: Any, source: str) -> float | None:
    """``qk_clip`` as a float, or None (off).

    Raises:
        ConfigError: not a positive finite number (errors name ``source``, key ``qk_clip``).
    """
    tau, problem = LIMITS["qk_clip"].check(value)
    if problem is not None:
        raise ConfigError(problem + LIMIT_NOTES["qk_clip"], source=source, key="qk_clip")
    return tau


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
        """The probed steps only, with the keys of the logit-growth pruner's rows but Σ η
        (which the search adds from the schedule: ``geosearch.search.horizon.probe_rows.probe_row``)."""
        return [{k: m.get(k) for k in ("step", "max_logit", "min_entropy", "train_loss", "sigma_max")}
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
        lines.append(f"val loss    final {short_number(self.final_val_loss)}  "
                     f"best {short_number(self.best_val_loss)}")
        probed = [m for m in self.history if m.get("max_logit") is not None]
        if probed:
            last = probed[-1]
            peak = max(probed, key=lambda m: m["max_logit"])
            layer = last["max_logit_per_layer"].index(last["max_logit"])
            lines.append(f"max logit   {short_number(last['max_logit'])} at step {last['step']} "
                         f"(layer {layer}); peak {short_number(peak['max_logit'])} at step {peak['step']}")
            lines.append("sigma_max   " + "  ".join(
                f"{t} {short_number(v)}" for t, v in last["sigma_max"].items()))
            if last.get("qk_clipped_total") is not None:
                lines.append(f"qk-clip     {last['qk_clipped_total']} head clips "
                             f"(tau {self.config.get('train', {}).get('qk_clip')})")
            if last.get("dual_residual") is not None:
                lines.append(f"dual resid  {short_number(last['dual_residual'])}")
        lines.append(f"speed       {self.mean_step_ms:.1f} ms/step, {self.tokens_per_s:,.0f} tokens/s")
        return "\n".join(lines)


def short_number(x: float | None) -> str:
    """``x`` to 4 significant digits, ``-`` for None (the summary and the progress line)."""
    return "-" if x is None else f"{x:.4g}"
