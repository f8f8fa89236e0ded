"""Prune trials whose attention logits are on their way to a divergence at the user's target.

:class:`LogitGrowthPruner` is an Optuna pruner that reads the attention probes the
objective stores on each trial and stops an assignment when its max attention logit is
already too large, or is forecast to be too large by the end of the training run the user
will actually do (the target), usually long before the loss shows it. The forecast is in
the cumulative spectral step Σ η, not in steps (:mod:`geosearch.search.horizon.forecast`). When no
instability rule fires it hands the decision to an ordinary loss-based Optuna pruner, the
way :class:`optuna.pruners.PatientPruner` wraps one.

The pruner only reads what the objective stores on the trial (:func:`probe_row` builds a
row; the attrs are listed in ``docs/design.md``, "Study and trial attributes"): ``probe_history``
(per probe step: ``step``, ``max_logit``, ``min_entropy``, ``train_loss``, ``sum_eta`` and
``sigma_max`` per module type; a missing value is ``None``, a NaN stays a float NaN),
``target_sum_eta`` and ``target_steps`` (the target run), ``logit_scale`` and
``target_logit_scale`` (d_model/√d_head of the proxy and of the target model:
:func:`~geosearch.search.horizon.forecast.stiefel_logit_bound`), and the validation losses it
reports (``trial.intermediate_values``).

Studies written before these keys existed still prune: without ``logit_scale`` the logit
threshold is the absolute ``max_logit``; without ``target_sum_eta`` (or ``sum_eta`` in the
rows) the forecast rule is skipped.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import optuna
from optuna.pruners import BasePruner
from optuna.trial import FrozenTrial, TrialState

from geosearch.util.checks import MAX_STEPS, Range, is_number, is_whole
from geosearch.search.horizon.forecast import LogitForecast, Measured, Outlook, forecast_max_logit, short_logit
from geosearch.search.horizon.probe_rows import (
    Probe,
    TrialProbes,
    non_finite,
    parse_probes,
    read_probes,
    stored_scales,
)
from geosearch.search.records import (
    STABILITY_PROBES,
    STABILITY_RUN,
    TARGET_STEPS,
    TARGET_SUM_ETA,
)

__all__ = ["ARG_LIMITS", "LogitGrowthPruner", "prune_verdict"]

# Defaults, shared with the search-space schema; LogitGrowthPruner's docstring says why.
DEFAULT_MAX_LOGIT = 1e3
DEFAULT_MAX_LOGIT_FACTOR = 10.0
DEFAULT_MIN_ENTROPY = 0.01
DEFAULT_WINDOW = 5
DEFAULT_INTERVAL = 0.9
DEFAULT_MAX_EXTRAPOLATION = 4.0
ARG_LIMITS: dict[str, Range] = {
    "max_logit": Range(0, open_low=True),
    "max_logit_factor": Range(0, open_low=True),
    "min_entropy": Range(0, null=True),
    "n_warmup_steps": Range(0, MAX_STEPS, whole=True),
    "window": Range(3, 10_000, whole=True),
    "interval": Range(0, 1, open_low=True, open_high=True, null=True),
    "max_extrapolation": Range(1, null=True),
}
"""The pruner's number arguments (a space's ``pruner:`` keys) -> the values each may take."""

# Module types whose σ_max bounds the attention logits (the fused and the split query/key
# weights of geosearch.rules.modules' rule sets); the forecast's σ route reads the largest.
@dataclass(frozen=True)
class _Threshold:
    """A logit threshold in a model's units, and how to say it."""

    value: float
    text: str


class LogitGrowthPruner(BasePruner):
    """Prune a trial whose attention logits are, or will be by the target, too large.

    After ``n_warmup_steps`` the trial is pruned when any of these holds (probe points at
    earlier steps are ignored by these rules):

    1. **max logit**: a probed max attention logit is above the threshold;
    2. **forecast**: the max logit forecast at the target's Σ η
       (:func:`~geosearch.search.horizon.forecast.forecast_max_logit` on the probes' Σ η, max
       logit and query/key σ_max, at least ``window`` points) is above the target's
       threshold *at the lower end of its ``interval`` prediction interval*, so a plateau
       or a noisy curve is not pruned on its point forecast alone;
    3. **entropy collapse**: a probed min attention entropy is below ``min_entropy``.

    At any step, warmup included, it is pruned when a probed ``max_logit``,
    ``min_entropy`` or ``train_loss``, or a reported validation loss, is NaN or infinite.

    **The stability rung** (``ladder.stability_steps``; docs/design.md, "The stability
    rung"): while the trial's ``stability_run`` attr is true its probes come from a run that
    ends at the target's Σ η², so they *measure* the target's logits. Rule 1 then judges
    them, in the target model's logits, against the target's threshold, and rule 2 does not
    apply. A trial whose stability rung was measured (``stability_probes``) is not judged by
    the forecast any more either: the measurement replaces it.

    **Thresholds in the model's own unit.** With LayerNorm'd inputs and Stiefel Q and K
    the logit is at most S = d_model/√d_head (8 tiny, 23 small, 96 GPT-2 small); under
    other geometries σ_max is free and the logit can pass S by the factor σ_Q·σ_K. The
    threshold is ``max_logit_factor × S`` of the model the logit belongs to: the proxy's
    for rule 1, the target's for rule 2, whose forecast is converted to the target model
    by the ratio of the two S (same σ growth and alignment, larger bound). Without a
    ``logit_scale`` on the trial the threshold is the absolute ``max_logit``.

    Why these defaults (the anchors are in docs/design.md, "The instability signal"):

    - ``max_logit_factor=10``. Wortsman et al. 2023 (arXiv 2309.14322) see the loss
      degrade once max logits reach about 1e3 and divergence follow above 1e4. These are
      absolute logits; read at the scale of GPT-2 small (S = 96, the model of the
      published geometry runs) they are about 10 S and 100 S. That their models' S is of
      this order is an assumption, not a measurement: the factor carries the anchors to
      other widths, it was not fitted to any run. The factor is the lower, harm anchor,
      so the threshold is where harm is documented, not where the run is already lost.
      Kimi K2's QK-Clip caps logits at τ = 100, about 0.2 S for its d_model 7168 and
      query/key head dimension 192 (S ≈ 517): a ceiling a stable recipe *enforces*, well
      inside the bound, not a sign of failure, so it is not a pruning threshold.
    - ``max_logit=1e3``: the same anchor in absolute units, for trials that do not store
      their model's S (studies from before it was stored).
    - ``interval=0.9``: the forecast rule prunes when the 5% one-sided lower end is above
      the threshold, i.e. when growth is clear, not merely possible.
    - ``window=5`` probe points: the fewest that give the fit (two parameters) a usable
      residual spread (3 degrees of freedom).
    - ``min_entropy=0.01`` nats. Zhai et al. 2023 (arXiv 2303.06296) find attention
      entropy collapsing towards zero in diverging runs. 0.01 nats means the average query
      puts about 99.9% of its weight on one key (T = 128): a saturated softmax, not merely
      a sharp head (previous-token and attention-sink heads are sharp and healthy).
      ``min_entropy`` is the probes' lowest per-head entropy, averaged over rows. It
      usually fires after the logit rules; it catches collapse that the max logit misses.
    - ``n_warmup_steps=0``, as in Optuna's pruners: the max-logit and entropy thresholds
      need no warmup, and the forecast's interval is wide while it has few points.
    - ``max_extrapolation=4``: the forecast rule acts only once the run's Σ η is at least a
      quarter of the target's (two doublings of Σ η past the data at most). The law is
      fitted on the run so far, and early in a run (warmup, attention learning) logits rise
      faster than they go on to: ``benchmarks/fidelity.py`` measured DGram attention's
      forecasts from the first 10% of 2,000-step runs (Σ η ×11 short of the end) 0.6–40×
      the real value, from 25% (×2.8) within 2.2×, from 50% (×1.4) within 1.6×, while the
      prediction interval, which assumes the law holds, stayed narrow. Farther forecasts are still
      computed and reported (:meth:`forecast`), never pruned on; the Σ η ladder measures
      instead of extrapolating.

    Args:
        wrapped: A loss-based pruner (e.g. ``optuna.pruners.MedianPruner()``) that decides
            when none of the rules fire, or ``None``. Its decision for a given trial and
            set of reported values is remembered, so :meth:`prune` and :meth:`reason`
            agree even for pruners that record state while pruning (successive halving).
        max_logit: Largest acceptable attention logit when the trial stores no
            ``logit_scale``; positive.
        max_logit_factor: Largest acceptable attention logit as a multiple of the model's
            d_model/√d_head; positive.
        min_entropy: Smallest acceptable attention entropy in nats, or ``None`` to turn
            the entropy rule off; non-negative.
        n_warmup_steps: Steps before the logit, forecast and entropy rules apply;
            non-negative.
        window: Fewest probe points (with Σ η) the forecast is fitted on; at least 3.
        interval: Coverage of the forecast's prediction interval, between 0 and 1;
            ``None`` turns the forecast rule off.
        max_extrapolation: Largest ratio of the target's Σ η to the last probe's at which
            the forecast rule may prune; at least 1; ``None``: any.

    Example:
        >>> import optuna
        >>> pruner = LogitGrowthPruner(wrapped=optuna.pruners.MedianPruner())
        >>> study = optuna.create_study(pruner=pruner)
        >>> trial = study.ask()
        >>> trial.set_user_attr("logit_scale", 96.0)
        >>> trial.set_user_attr("probe_history", [
        ...     {"step": 10, "max_logit": 2.5e3, "min_entropy": 0.8, "train_loss": 4.1}])
        >>> trial.should_prune()
        True
        >>> pruner.reason(study, trial)
        'max logit 2.5e+03 at step 10 > threshold 960 (10 × d/√d_head 96)'
    """

    def __init__(
        self,
        wrapped: BasePruner | None = None,
        *,
        max_logit: float = DEFAULT_MAX_LOGIT,
        max_logit_factor: float = DEFAULT_MAX_LOGIT_FACTOR,
        min_entropy: float | None = DEFAULT_MIN_ENTROPY,
        n_warmup_steps: int = 0,
        window: int = DEFAULT_WINDOW,
        interval: float | None = DEFAULT_INTERVAL,
        max_extrapolation: float | None = DEFAULT_MAX_EXTRAPOLATION,
    ) -> None:
        if wrapped is not None and not isinstance(wrapped, BasePruner):
            raise TypeError(
                f"wrapped must be an optuna.pruners.BasePruner or None but got {wrapped!r}."
            )
        given = {"max_logit": max_logit, "max_logit_factor": max_logit_factor, "min_entropy": min_entropy,
                 "n_warmup_steps": n_warmup_steps, "window": window, "interval": interval,
                 "max_extrapolation": max_extrapolation}
        arg: dict[str, Any] = {}
        for name, allowed in ARG_LIMITS.items():  # the one rule for numbers: NaN, inf never
            arg[name], problem = allowed.check(given[name])
            if problem is not None:
                raise ValueError(f"{name} must be {allowed.text} but got {given[name]}.")

        self._wrapped = wrapped
        self._max_logit: float = arg["max_logit"]
        self._factor: float = arg["max_logit_factor"]
        self._min_entropy: float | None = arg["min_entropy"]
        self._n_warmup_steps: int = arg["n_warmup_steps"]
        self._window: int = arg["window"]
        self._interval: float | None = arg["interval"]
        self._max_extrapolation: float | None = arg["max_extrapolation"]
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
            One line naming the rule, the measured or forecast value and the threshold,
            e.g. ``"forecast max logit 2.1e3 (1.4e3–3.0e3) by step 50,000 (Σ η 545) >
            threshold 960 (10 × d/√d_head 96)"``; ``None`` when no rule fires and the
            wrapped pruner (if any) does not prune.
        """
        if isinstance(trial, optuna.trial.Trial):
            trial = _frozen(study, trial)
        return self.instability(study, trial) or self._wrapped_reason(study, trial)

    def instability(
        self, study: optuna.study.Study, trial: FrozenTrial | optuna.trial.Trial,
        rows: TrialProbes | None = None,
    ) -> str | None:
        """Why ``trial`` is unstable by this pruner's own rules (non-finite values, the max
        logit over its threshold now or forecast at the target, collapsed attention), or
        ``None``; :meth:`reason` less the wrapped loss pruner, whose prunes are not
        instabilities. ``rows``: the trial's probes as handed by the trial loop (``None``:
        its user attrs', :meth:`TrialProbes.of`), here and in the methods below."""
        if isinstance(trial, optuna.trial.Trial):
            trial = _frozen(study, trial)
        rows = rows if rows is not None else TrialProbes.of(trial.user_attrs)
        probes = read_probes(trial, rows)
        why = non_finite(probes, trial.intermediate_values)
        if why is not None:
            return why
        # Warmup: the instability rules only see probe points at steps >= n_warmup_steps.
        judged = [p for p in probes if p.step >= self._n_warmup_steps]
        if trial.user_attrs.get(STABILITY_RUN):
            return self._too_large_at_target(judged, trial) or self._collapsed(judged)
        measured = bool(rows.stability)
        return (self._too_large(judged, trial) or (None if measured else self._forecast_rule(judged, trial))
                or self._collapsed(judged))

    def forecast(self, study: optuna.study.Study, trial: FrozenTrial | optuna.trial.Trial,
                 rows: TrialProbes | None = None) -> LogitForecast | None:
        """The trial's max logit forecast at its target, in the target model's logits.

        ``None`` when the trial stores no target, or has fewer than ``window`` probe
        points (after warmup) with Σ η and a max logit. Used by the forecast rule; callable
        on its own, e.g. to report the forecast of trials that were not pruned.
        """
        if isinstance(trial, optuna.trial.Trial):
            trial = _frozen(study, trial)
        judged = [p for p in read_probes(trial, rows) if p.step >= self._n_warmup_steps]
        return self._forecast(judged, trial)

    def outlook(self, study: optuna.study.Study, trial: FrozenTrial | optuna.trial.Trial,
                rows: TrialProbes | None = None) -> Outlook | None:
        """The trial's max logit at its target against the target's threshold: what the
        forecast rule decides on, also for the trials it did not prune (the report shows
        every assignment's). ``None`` when :meth:`forecast` is."""
        if isinstance(trial, optuna.trial.Trial):
            trial = _frozen(study, trial)
        judged = [p for p in read_probes(trial, rows) if p.step >= self._n_warmup_steps]
        return self._outlook(judged, trial)

    def measured(self, study: optuna.study.Study, trial: FrozenTrial | optuna.trial.Trial,
                 rows: TrialProbes | None = None) -> Measured | None:
        """The trial's max logit measured by its stability rung, against the target's
        threshold (what rule 1 judged the rung on); ``None`` without a stability rung's
        probes."""
        if isinstance(trial, optuna.trial.Trial):
            trial = _frozen(study, trial)
        stability = (rows if rows is not None else TrialProbes.of(trial.user_attrs)).stability
        if not stability:
            return None
        probes = [p for p in parse_probes(stability, STABILITY_PROBES)
                  if p.step >= self._n_warmup_steps and p.max_logit is not None]
        if not probes:
            return None
        ratio, limit = self._target_units(trial)
        values = [p.max_logit * ratio for p in probes]
        crossed = self._over_at_target(probes, trial)
        return Measured(values[-1], max(values), limit.value, limit.text,
                        crossed.target_step if crossed is not None else None)

    # ------------------------------------------------------------------ the rules
    def max_logit_threshold(self, trial: FrozenTrial) -> tuple[float, str]:
        """The max-logit threshold ``trial``'s probes are judged against on the proxy, and
        its rule in words: ``max_logit_factor`` × its ``logit_scale`` (d/√d_head), or
        ``max_logit`` without one (``(80.0, "10 × d/√d_head 8")``)."""
        scale = stored_scales(trial)[0]
        if scale is None:
            return self._max_logit, f"max_logit {self._max_logit:.3g}"
        return self._threshold(scale).value, f"{self._factor:g} × d/√d_head {scale:.3g}"

    def _threshold(self, scale: float | None) -> _Threshold:
        """``max_logit_factor × scale``, or the absolute ``max_logit`` without a scale."""
        if scale is None:
            return _Threshold(self._max_logit, f"max_logit {self._max_logit:.3g}")
        value = self._factor * scale
        text = f"threshold {value:.3g} ({self._factor:g} × d/√d_head {scale:.3g})"
        return _Threshold(value, text)

    def _too_large(self, probes: list[Probe], trial: FrozenTrial) -> str | None:
        limit = self._threshold(stored_scales(trial)[0])
        for p in probes:
            if p.max_logit is not None and p.max_logit > limit.value:
                return f"max logit {p.max_logit:.3g} at step {p.step} > {limit.text}"
        return None

    def _target_units(self, trial: FrozenTrial) -> tuple[float, _Threshold]:
        """The factor from the proxy's logits to the target model's, and the target's threshold."""
        proxy, target = stored_scales(trial)
        return (target / proxy if proxy else 1.0), self._threshold(target)

    def _over_at_target(self, probes: list[Probe], trial: FrozenTrial) -> Probe | None:
        """The first probe whose max logit, in the target's logits, is above its threshold."""
        ratio, limit = self._target_units(trial)
        return next((p for p in probes if p.max_logit is not None and p.max_logit * ratio > limit.value), None)

    def _too_large_at_target(self, probes: list[Probe], trial: FrozenTrial) -> str | None:
        p = self._over_at_target(probes, trial)
        if p is None:
            return None
        ratio, limit = self._target_units(trial)
        units = f" (the proxy's {short_logit(p.max_logit)} × {ratio:.3g})" if ratio != 1 else ""
        where = f"; near step {p.target_step:,} of your run" if p.target_step is not None else ""
        return (f"unstable at your target: max logit {short_logit(p.max_logit * ratio)}{units} at "
                f"step {p.step} of the stability rung > {limit.text}{where}")

    def _forecast(self, probes: list[Probe], trial: FrozenTrial) -> LogitForecast | None:
        target = trial.user_attrs.get(TARGET_SUM_ETA)
        if self._interval is None or not (is_number(target) and math.isfinite(target)):
            return None
        points = [p for p in probes if p.sum_eta is not None and p.max_logit is not None]
        if len(points) < self._window:
            return None
        sigma = [p.qk_sigma for p in points]
        forecast = forecast_max_logit(
            [p.sum_eta for p in points], [p.max_logit for p in points], float(target),
            sigma=None if None in sigma else sigma, min_points=self._window,
            level=self._interval)
        proxy, target_scale = stored_scales(trial)
        if forecast is not None and proxy is not None:
            forecast = forecast.scaled(target_scale / proxy)
        return forecast

    def _outlook(self, probes: list[Probe], trial: FrozenTrial) -> Outlook | None:
        forecast = self._forecast(probes, trial)
        if forecast is None:
            return None
        reached = max((p.sum_eta for p in probes if p.sum_eta is not None), default=0.0)
        limit = self._threshold(stored_scales(trial)[1])
        return Outlook(forecast, limit.value, limit.text, reached, self._max_extrapolation)

    def _forecast_rule(self, probes: list[Probe], trial: FrozenTrial) -> str | None:
        outlook = self._outlook(probes, trial)
        # too far past the data to prune on (see max_extrapolation), or not clearly above
        if outlook is None or not outlook.acted_on or outlook.verdict != "above":
            return None
        forecast = outlook.forecast
        proxy, target_scale = stored_scales(trial)
        steps = trial.user_attrs.get(TARGET_STEPS)
        eta = f"Σ η {forecast.target_sum_eta:.3g}"
        when, notes = (f"by step {steps:,}", [eta]) if is_whole(steps) else (f"at {eta}", [])
        if proxy != target_scale:
            notes.append(f"the proxy's logits × {target_scale / proxy:.3g}")
        if notes:
            when += f" ({'; '.join(notes)})"
        return (f"forecast max logit {short_logit(forecast.value)} ({short_logit(forecast.low)}–"
                f"{short_logit(forecast.high)}) {when} > {outlook.threshold_text}")

    def _collapsed(self, probes: list[Probe]) -> str | None:
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


def prune_verdict(pruner: BasePruner, study: optuna.study.Study, trial: optuna.trial.Trial,
                  step: int, rows: TrialProbes) -> tuple[str, bool] | None:
    """Whether ``pruner`` prunes ``trial`` at ``step`` (``None``: it does not), why, and
    whether that is an instability: a :class:`LogitGrowthPruner`'s own rule is, judged on
    ``rows`` (the probes the trial loop hands it); its wrapped loss pruner's prune, or any
    other pruner's (a ``MedianPruner`` handed to ``study.optimize``, say), is not."""
    if isinstance(pruner, LogitGrowthPruner):  # its rules once, then its loss pruner's
        frozen = _frozen(study, trial)
        why = pruner.instability(study, frozen, rows)
        if why is not None:
            return why, True
        why = pruner._wrapped_reason(study, frozen)
        return (why, False) if why is not None else None
    if not trial.should_prune():
        return None
    reason = getattr(pruner, "reason", None)
    why = reason(study, trial) if callable(reason) else None
    return why or f"pruned by {type(pruner).__name__} at step {step}", False


# ---------------------------------------------------------------------- helpers
def _frozen(study: optuna.study.Study, trial: optuna.trial.Trial) -> FrozenTrial:
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        if t.number == trial.number:
            return t
    raise ValueError(f"trial {trial.number} is not a running trial of study {study.study_name!r}.")
