"""Prune trials whose attention logits are on their way to a divergence.

:class:`LogitGrowthPruner` is an Optuna pruner that reads the attention probes the
objective stores on each trial and stops an assignment as soon as its attention is
visibly going unstable, usually long before the loss shows it. When no instability rule
fires it can hand the decision to an ordinary loss-based Optuna pruner, the way
:class:`optuna.pruners.PatientPruner` wraps one.

What the objective stores on the trial (the pruner only reads):

- ``trial.user_attrs["probe_history"]``: a list of dicts, one per probe step, with keys
  ``step`` (int), ``max_logit`` (float, the largest attention logit q·k/√d_head over
  layers and heads), ``min_entropy`` (float, nats, the lowest attention entropy the probes
  report) and ``train_loss`` (float). A value may be missing or ``None`` (not measured);
  a NaN must stay a float NaN (Optuna's storages round-trip it).
- ``trial.user_attrs["budget_steps"]``: the number of training steps of the trial.
- ``trial.report(val_loss, step)``: the validation losses (``trial.intermediate_values``).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from dataclasses import dataclass

import optuna
from optuna.pruners import BasePruner
from optuna.trial import FrozenTrial, TrialState

__all__ = ["LogitGrowthPruner"]

# Defaults, shared with the search-space schema; LogitGrowthPruner's docstring says why.
DEFAULT_MAX_LOGIT = 1e3
DEFAULT_MIN_ENTROPY = 0.01
DEFAULT_WINDOW = 5
DEFAULT_TREND_MIN_LOGIT = 100.0

PROBE_HISTORY_ATTR = "probe_history"
BUDGET_STEPS_ATTR = "budget_steps"

# The trend rule needs the fitted log-growth rate to be at least this many standard errors
# above zero: a flat but noisy max logit must not be extrapolated into a divergence.
_SLOPE_Z = 2.0


@dataclass(frozen=True)
class _Probe:
    step: int
    max_logit: float | None
    min_entropy: float | None
    train_loss: float | None


class LogitGrowthPruner(BasePruner):
    """Prune a trial whose attention logits grow towards divergence.

    After ``n_warmup_steps`` the trial is pruned when any of these holds (probe points at
    earlier steps are ignored by these rules):

    1. **max logit**: a probed max attention logit is above ``max_logit``;
    2. **max-logit trend**: a least-squares line through log(max_logit) vs step over the
       last ``window`` probe points, extrapolated to the horizon (``horizon_steps``, else
       the trial's own ``budget_steps``), ends above ``max_logit``. The rule only looks at
       trials whose latest max logit is at least ``trend_min_logit`` and whose growth rate
       is positive and at least twice its standard error;
    3. **entropy collapse**: a probed min attention entropy is below ``min_entropy``.

    At any step, warmup included, it is pruned when a probed ``max_logit``,
    ``min_entropy`` or ``train_loss``, or a reported validation loss, is NaN or infinite.

    When no rule fires, ``wrapped`` (a loss-based Optuna pruner, with its own warmup)
    decides; without it the trial continues. :meth:`reason` returns the rule that fired
    as text, so the objective can store it on the trial (a pruner cannot write attributes
    on a ``FrozenTrial``).

    Why these defaults (the anchors are in DESIGN.md, "The instability signal"):

    - ``max_logit=1e3``. Wortsman et al. 2023 (arXiv 2309.14322) see the loss degrade
      once max logits reach about 1e3 and divergence follow above 1e4. Kimi K2's QK-Clip
      caps logits at τ = 100, but that is a ceiling a stable recipe *enforces*, not a sign
      of failure: an unclipped healthy run may pass 100, so pruning there would throw away
      good assignments. 1e3 is the lowest value at which harm is documented. It is also an
      order of magnitude above what norm-constrained attention can reach: with
      LayerNorm'd inputs (‖x‖² ≈ d, unit gains) and Stiefel Q and K (σ_max = 1) the logit
      is at most d/√d_head, 96 for GPT-2 small and 23 for d = 128, d_head = 32.
    - ``trend_min_logit=100`` (Kimi's τ). Below it logits are in the range healthy runs
      live in, and early training grows them quickly before they plateau: extrapolating
      that early exponential growth would prune healthy trials. Above τ, sustained
      exponential growth is the failure mode the paper describes (DGram attention's free
      singular values), and the trend rule prunes it before the logit itself crosses
      ``max_logit``: that is what makes the pruner early.
    - ``window=5`` probe points: the fewest that give a growth rate with a usable standard
      error (3 degrees of freedom); the slope must exceed twice it.
    - ``min_entropy=0.01`` nats. Zhai et al. 2023 (arXiv 2303.06296) find attention
      entropy collapsing towards zero in diverging runs. 0.01 nats means the average query
      puts about 99.9% of its weight on one key (T = 128): a saturated softmax, not merely
      a sharp head (previous-token and attention-sink heads are sharp and healthy).
      ``min_entropy`` is the probes' lowest per-head entropy, averaged over rows. It
      usually fires after the logit rules; it catches collapse that the max logit misses.
    - ``n_warmup_steps=0``, as in Optuna's pruners: the thresholds above are absolute,
      so they need no warmup to be meaningful.

    Args:
        wrapped: A loss-based pruner (e.g. ``optuna.pruners.MedianPruner()``) that decides
            when none of the rules fire, or ``None``. Its decision for a given trial and
            set of reported values is remembered, so :meth:`prune` and :meth:`reason`
            agree even for pruners that record state while pruning (successive halving).
        max_logit: Largest acceptable attention logit; positive.
        min_entropy: Smallest acceptable attention entropy in nats, or ``None`` to turn
            the entropy rule off; non-negative.
        n_warmup_steps: Steps before the logit and entropy rules apply; non-negative.
        window: Probe points the trend is fitted on; at least 3.
        trend_min_logit: Latest max logit from which the trend rule applies, below
            ``max_logit``; ``None`` turns the trend rule off.
        horizon_steps: Step the trend is extrapolated to, e.g. the length of the real
            training run the assignment is meant for; ``None`` uses the trial's
            ``budget_steps``. A long horizon prunes any sustained exponential growth above
            ``trend_min_logit``.

    Example:
        >>> import optuna
        >>> pruner = LogitGrowthPruner(wrapped=optuna.pruners.MedianPruner())
        >>> study = optuna.create_study(pruner=pruner)
        >>> trial = study.ask()
        >>> trial.set_user_attr("budget_steps", 300)
        >>> trial.set_user_attr("probe_history", [
        ...     {"step": 10, "max_logit": 2.5e3, "min_entropy": 0.8, "train_loss": 4.1}])
        >>> trial.should_prune()
        True
        >>> pruner.reason(study, trial)
        'max logit 2.5e+03 at step 10 > max_logit 1e+03'
    """

    def __init__(
        self,
        wrapped: BasePruner | None = None,
        *,
        max_logit: float = DEFAULT_MAX_LOGIT,
        min_entropy: float | None = DEFAULT_MIN_ENTROPY,
        n_warmup_steps: int = 0,
        window: int = DEFAULT_WINDOW,
        trend_min_logit: float | None = DEFAULT_TREND_MIN_LOGIT,
        horizon_steps: int | None = None,
    ) -> None:
        if wrapped is not None and not isinstance(wrapped, BasePruner):
            raise TypeError(
                f"wrapped must be an optuna.pruners.BasePruner or None but got {wrapped!r}."
            )
        if not (_is_number(max_logit) and math.isfinite(max_logit) and max_logit > 0):
            raise ValueError(f"max_logit must be positive and finite but got {max_logit}.")
        if min_entropy is not None and not (
            _is_number(min_entropy) and math.isfinite(min_entropy) and min_entropy >= 0
        ):
            raise ValueError(f"min_entropy must be non-negative or None but got {min_entropy}.")
        if not (_is_int(n_warmup_steps) and n_warmup_steps >= 0):
            raise ValueError(f"n_warmup_steps cannot be negative but got {n_warmup_steps}.")
        if not (_is_int(window) and window >= 3):
            raise ValueError(f"window must be an integer of at least 3 but got {window}.")
        if trend_min_logit is not None and not (
            _is_number(trend_min_logit) and 0 < trend_min_logit < max_logit
        ):
            raise ValueError(
                f"trend_min_logit must be between 0 and max_logit ({max_logit}) "
                f"or None but got {trend_min_logit}."
            )
        if horizon_steps is not None and not (_is_int(horizon_steps) and horizon_steps >= 1):
            raise ValueError(f"horizon_steps must be at least 1 or None but got {horizon_steps}.")

        self._wrapped = wrapped
        self._max_logit = float(max_logit)
        self._min_entropy = None if min_entropy is None else float(min_entropy)
        self._n_warmup_steps = n_warmup_steps
        self._window = window
        self._trend_min_logit = None if trend_min_logit is None else float(trend_min_logit)
        self._horizon_steps = horizon_steps
        # (study name, trial number) -> (reported values, wrapped pruner's decision)
        self._wrapped_decisions: dict[tuple[str, int], tuple[tuple, bool]] = {}

    @property
    def wrapped(self) -> BasePruner | None:
        """The loss-based pruner consulted when no instability rule fires."""
        return self._wrapped

    def prune(self, study: optuna.study.Study, trial: FrozenTrial) -> bool:
        """Whether to prune ``trial``: :meth:`reason` is not ``None``.

        Called by Optuna from ``trial.should_prune()``.
        """
        return self.reason(study, trial) is not None

    def reason(
        self, study: optuna.study.Study, trial: FrozenTrial | optuna.trial.Trial
    ) -> str | None:
        """Why ``trial`` is (or would be) pruned, or ``None`` if it is not.

        Same decision as :meth:`prune`, from the trial's stored values only.

        Args:
            study: The trial's study.
            trial: The trial, frozen or live (a live ``optuna.trial.Trial`` is looked up
                in ``study``).

        Returns:
            One line naming the rule, the measured value, its step and the threshold, e.g.
            ``"max-logit trend: 145 at step 60 extrapolates to 2.3e+03 > 1e+03 by step
            300 (x1.9 per 100 steps over steps 20-60)"``; ``None`` when no rule fires and
            the wrapped pruner (if any) does not prune.
        """
        if isinstance(trial, optuna.trial.Trial):
            trial = _frozen(study, trial)
        probes = _read_probes(trial)
        why = _non_finite(probes, trial.intermediate_values)
        if why is not None:
            return why

        # Warmup: the instability rules only see probe points at steps >= n_warmup_steps.
        judged = [p for p in probes if p.step >= self._n_warmup_steps]
        why = self._too_large(judged) or self._trend(judged, trial) or self._collapsed(judged)
        if why is not None:
            return why
        return self._wrapped_reason(study, trial)

    # ------------------------------------------------------------------ the rules
    def _too_large(self, probes: list[_Probe]) -> str | None:
        for p in probes:
            if p.max_logit is not None and p.max_logit > self._max_logit:
                return (
                    f"max logit {p.max_logit:.3g} at step {p.step} "
                    f"> max_logit {self._max_logit:.3g}"
                )
        return None

    def _trend(self, probes: list[_Probe], trial: FrozenTrial) -> str | None:
        if self._trend_min_logit is None:
            return None
        points = [(p.step, p.max_logit) for p in probes if p.max_logit is not None]
        points = [(s, v) for s, v in points if v > 0][-self._window :]
        if len(points) < self._window:
            return None
        last_step, last_logit = points[-1]
        if last_logit < self._trend_min_logit:
            return None
        horizon = self._horizon_steps
        if horizon is None:
            horizon = trial.user_attrs.get(BUDGET_STEPS_ATTR)
            if not _is_int(horizon):
                return None
        if horizon <= last_step:
            return None

        steps = [float(s) for s, _ in points]
        logs = [math.log(v) for _, v in points]
        slope, intercept, stderr = _fit_line(steps, logs)
        if not slope > 0 or slope <= _SLOPE_Z * stderr:
            return None
        predicted_log = intercept + slope * horizon
        if predicted_log <= math.log(self._max_logit):
            return None
        predicted = math.exp(min(predicted_log, 700.0))  # exp(710) overflows a float
        return (
            f"max-logit trend: {last_logit:.3g} at step {last_step} extrapolates to "
            f"{predicted:.2g} > {self._max_logit:.3g} by step {horizon} "
            f"(x{math.exp(100 * slope):.3g} per 100 steps over steps {points[0][0]}-{last_step})"
        )

    def _collapsed(self, probes: list[_Probe]) -> str | None:
        if self._min_entropy is None:
            return None
        for p in probes:
            if p.min_entropy is not None and p.min_entropy < self._min_entropy:
                return (
                    f"attention entropy collapse: min entropy {p.min_entropy:.3g} at step "
                    f"{p.step} < min_entropy {self._min_entropy:.3g}"
                )
        return None

    def _wrapped_reason(self, study: optuna.study.Study, trial: FrozenTrial) -> str | None:
        if self._wrapped is None or trial.last_step is None:
            return None
        values = tuple(sorted(trial.intermediate_values.items()))
        key = (study.study_name, trial.number)
        remembered = self._wrapped_decisions.get(key)
        if remembered is not None and remembered[0] == values:
            decision = remembered[1]
        else:
            decision = bool(self._wrapped.prune(study, trial))
            self._wrapped_decisions[key] = (values, decision)
        if not decision:
            return None
        step = trial.last_step
        return (
            f"loss pruner {type(self._wrapped).__name__}: val loss "
            f"{trial.intermediate_values[step]:.4g} at step {step}"
        )


# ---------------------------------------------------------------------- helpers
def _non_finite(probes: list[_Probe], values: Mapping[int, float]) -> str | None:
    for p in probes:
        for name in ("train_loss", "max_logit", "min_entropy"):
            v = getattr(p, name)
            if v is not None and not math.isfinite(v):
                return f"non-finite {name} ({v}) at step {p.step}"
    for step in sorted(values):
        if not math.isfinite(values[step]):
            return f"non-finite val loss ({values[step]}) at step {step}"
    return None


def _read_probes(trial: FrozenTrial) -> list[_Probe]:
    history = trial.user_attrs.get(PROBE_HISTORY_ATTR, [])
    if not isinstance(history, (list, tuple)):
        raise ValueError(
            f"trial.user_attrs[{PROBE_HISTORY_ATTR!r}] must be a list of dicts "
            f"but got {type(history).__name__}."
        )
    probes = []
    for i, row in enumerate(history):
        if not isinstance(row, Mapping) or not _is_int(row.get("step")):
            raise ValueError(
                f"trial.user_attrs[{PROBE_HISTORY_ATTR!r}][{i}] must be a dict with an "
                f"integer 'step' but got {row!r}."
            )
        probes.append(
            _Probe(
                step=int(row["step"]),
                max_logit=_optional_float(row.get("max_logit")),
                min_entropy=_optional_float(row.get("min_entropy")),
                train_loss=_optional_float(row.get("train_loss")),
            )
        )
    probes.sort(key=lambda p: p.step)
    return probes


def _fit_line(x: list[float], y: list[float]) -> tuple[float, float, float]:
    """Least-squares ``y ≈ intercept + slope·x``; returns (slope, intercept, stderr of slope)."""
    n = len(x)
    mx, my = sum(x) / n, sum(y) / n
    sxx = sum((a - mx) ** 2 for a in x)
    if sxx == 0:
        return 0.0, my, math.inf
    slope = sum((a - mx) * (b - my) for a, b in zip(x, y)) / sxx
    intercept = my - slope * mx
    rss = sum((b - intercept - slope * a) ** 2 for a, b in zip(x, y))
    stderr = math.sqrt(rss / (n - 2) / sxx) if n > 2 else math.inf
    return slope, intercept, stderr


def _frozen(study: optuna.study.Study, trial: optuna.trial.Trial) -> FrozenTrial:
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        if t.number == trial.number:
            return t
    raise ValueError(f"trial {trial.number} is not a running trial of study {study.study_name!r}.")


def _optional_float(v: object) -> float | None:
    return None if v is None else float(v)  # type: ignore[arg-type]


def _is_number(v: object) -> bool:
    return isinstance(v, numbers.Real) and not isinstance(v, bool)


def _is_int(v: object) -> bool:
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)
