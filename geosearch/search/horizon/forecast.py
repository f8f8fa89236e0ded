"""Forecast a run's largest attention logit at a longer target, in the cumulative step Σ η.

A manifold-Muon step of spectral size η_t moves σ_max of a weight by at most η_t, so
σ_max(W_T) ≤ σ₀ + Σ_{t<T} η_t, and an attention logit scales like σ_max(W_Q)·σ_max(W_K):
logit growth is polynomial in Σ η and flattens as a decaying schedule adds little Σ η,
never exponential in steps (docs/design.md, "The instability signal"). This module fits
``log max_logit = a + p·log(σ₀ + Σ η)`` to a short run's probes, extrapolates it to the
target's Σ η with a prediction interval, caps it by the step bound, and computes Σ η of
the proxy trainer's warmup + cosine schedule so that a target given in steps becomes a
target in Σ η. Plain arithmetic (the interval's Student-t quantile is scipy's,
:func:`~geosearch.search.stats.scores.t_quantile`): no torch, no optuna.

Example:
    >>> eta = [schedule_sum_eta(s, steps=200, peak=0.02) for s in range(20, 201, 20)]
    >>> logits = [5.0 * (1.0 + x) ** 2 for x in eta]
    >>> target = schedule_sum_eta(2000, steps=2000, peak=0.02)
    >>> f = forecast_max_logit(eta, logits, target)
    >>> round(f.value / (5.0 * (1.0 + target) ** 2), 6), round(f.exponent, 6)
    (1.0, 2.0)
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, replace

from geosearch.search.stats.scores import t_quantile

__all__ = [
    "LogitForecast",
    "Measured",
    "Outlook",
    "forecast_max_logit",
    "schedule_sum_eta",
    "schedule_sum_eta2",
    "wsd_sum_eta",
    "stability_lr",
    "short_logit",
    "stiefel_logit_bound",
]


# --------------------------------------------------------------------------- schedule
def schedule_sum_eta(step: int, *, steps: int, peak: float, warmup_steps: int | None = None,
                     min_lr_ratio: float = 0.1) -> float:
    """Σ η after ``step`` optimizer steps of a run of ``steps`` steps (the proxy's schedule).

    The proxy trainer (``geosearch.proxy.train``) uses, at optimizer step ``s`` (0-based),
    ``η_s = peak·f(s)`` with ``f(s) = (s + 1)/warmup`` during the linear warmup
    (``s < warmup``), then a cosine from 1 down towards ``min_lr_ratio``:
    ``f(s) = r + (1 − r)·(1 + cos(π·(s − warmup)/max(1, steps − warmup)))/2``. The default
    warmup is 10% of the steps (``TrainConfig.resolved()``), and never more than ``steps``.
    This returns ``Σ_{s<step} η_s`` in closed form (exact, O(1) for any length).

    Args:
        step: Optimizer steps taken, ``0 <= step <= steps`` (``steps`` gives the run's total).
        steps: Length of the run, which fixes the cosine's period.
        peak: Peak spectral step size (``TrainConfig.spectral_lr``).
        warmup_steps: Linear warmup steps; ``None`` = ``steps // 10``, as the trainer.
        min_lr_ratio: The cosine's floor as a fraction of ``peak``, in [0, 1].

    Returns:
        The cumulative spectral step Σ η.
    """
    if not (isinstance(steps, int) and steps >= 1):
        raise ValueError(f"steps must be a positive integer but got {steps!r}.")
    if not (isinstance(step, int) and 0 <= step <= steps):
        raise ValueError(f"step must be an integer between 0 and steps ({steps}) but got {step!r}.")
    if not (math.isfinite(peak) and peak >= 0):
        raise ValueError(f"peak must be non-negative and finite but got {peak}.")
    if not 0 <= min_lr_ratio <= 1:
        raise ValueError(f"min_lr_ratio must be in [0, 1] but got {min_lr_ratio}.")
    warmup = steps // 10 if warmup_steps is None else warmup_steps
    if not (isinstance(warmup, int) and warmup >= 0):
        raise ValueError(f"warmup_steps must be a non-negative integer but got {warmup_steps!r}.")
    warmup = min(warmup, steps)

    j = min(step, warmup)  # warmup part: Σ_{s<j} (s + 1)/warmup
    total = j * (j + 1) / (2 * warmup) if j else 0.0
    m = step - j  # cosine part: k = s − warmup = 0 .. m − 1, all with k/period < 1
    if m > 0:
        period = max(1, steps - warmup)
        theta = math.pi / period
        cos_sum = math.sin(m * theta / 2) * math.cos((m - 1) * theta / 2) / math.sin(theta / 2)
        total += m * min_lr_ratio + (1 - min_lr_ratio) * 0.5 * (m + cos_sum)
    return peak * total


def schedule_sum_eta2(step: int, *, steps: int, peak: float, warmup_steps: int | None = None,
                      min_lr_ratio: float = 0.1) -> float:
    """Σ η² after ``step`` optimizer steps of a run of ``steps`` steps: the clock of logit
    growth across step sizes (docs/design.md, "Horizon"), on the schedule
    :func:`schedule_sum_eta` describes, in closed form.

    With ``f(s)`` that schedule's factor: the warmup adds ``Σ_{s<j} (s + 1)²/warmup²``; on
    the cosine ``f = a + b·cos(kθ)`` with ``a = (1 + r)/2``, ``b = (1 − r)/2``, ``θ = π/period``,
    so ``f² = a² + b²/2 + 2ab·cos(kθ) + (b²/2)·cos(2kθ)``, and each cosine sums in closed form.
    Same arguments and errors as :func:`schedule_sum_eta`; returns ``peak² · Σ f²``.

    Example:
        >>> s2 = schedule_sum_eta2(2000, steps=2000, peak=0.02)
        >>> round(s2, 4), round(schedule_sum_eta2(2000, steps=2000, peak=0.04) / s2, 6)
        (0.3178, 4.0)
    """
    schedule_sum_eta(step, steps=steps, peak=peak, warmup_steps=warmup_steps,
                     min_lr_ratio=min_lr_ratio)  # the same argument checks
    warmup = min(steps // 10 if warmup_steps is None else warmup_steps, steps)
    j = min(step, warmup)
    total = j * (j + 1) * (2 * j + 1) / (6 * warmup * warmup) if j else 0.0
    m = step - j
    if m > 0:
        theta = math.pi / max(1, steps - warmup)
        a, b = (1 + min_lr_ratio) / 2, (1 - min_lr_ratio) / 2
        total += m * (a * a + b * b / 2) + 2 * a * b * _cos_sum(m, theta) + b * b / 2 * _cos_sum(m, 2 * theta)
    return peak * peak * total


def wsd_sum_eta(step: int, *, steps: int, peak: float, warmup_steps: int, cooldown_steps: int,
                min_lr_ratio: float = 0.1) -> float:
    """Σ η after ``step`` optimizer steps of a warmup-stable-decay run
    (``TrainConfig.cooldown_steps``): ``f(s) = (s + 1)/warmup`` in the warmup, 1 until the
    cooldown's start ``steps − cooldown_steps``, then ``1 − (1 − r)(k + 1)/cooldown_steps`` at
    its ``k``-th step; in closed form.

    Example:
        >>> wsd_sum_eta(100, steps=100, peak=1.0, warmup_steps=10, cooldown_steps=20,
        ...             min_lr_ratio=0.0)
        85.0
    """
    if not (isinstance(steps, int) and steps >= 1 and isinstance(step, int) and 0 <= step <= steps):
        raise ValueError(f"need 0 <= step <= steps, steps >= 1; got step={step!r}, "
                         f"steps={steps!r}.")
    if not 0 <= warmup_steps + cooldown_steps <= steps:
        raise ValueError(f"warmup_steps + cooldown_steps must be within steps ({steps}) but got "
                         f"{warmup_steps} + {cooldown_steps}.")
    w, start = warmup_steps, steps - cooldown_steps
    j = min(step, w)
    total = j * (j + 1) / (2 * w) if j else 0.0
    total += max(0, min(step, start) - w)
    m = max(0, step - start)
    if m:
        total += m - (1 - min_lr_ratio) * m * (m + 1) / (2 * cooldown_steps)
    return peak * total


def _cos_sum(m: int, theta: float) -> float:
    """``Σ_{k<m} cos(kθ)``."""
    half = math.sin(theta / 2)
    if abs(half) < 1e-12:  # θ a multiple of 2π: every term is 1
        return float(m)
    return math.sin(m * theta / 2) * math.cos((m - 1) * theta / 2) / half


def stability_lr(target_sum_eta2: float, steps: int, *, warmup_steps: int | None = None,
                 min_lr_ratio: float = 0.1) -> float:
    """The peak spectral step at which a run of ``steps`` steps, on the same schedule shape,
    ends at ``target_sum_eta2``: ``η' = √(target Σ η² / Σ f²)``. Logit growth follows Σ η², so
    such a run *measures* the target's logit state in ``steps`` steps (for a 2,000-step target
    and a 400-step run, ``η' ≈ 2.2 η``).

    Example:
        >>> target = schedule_sum_eta2(2000, steps=2000, peak=0.02)
        >>> lr = stability_lr(target, 400)
        >>> round(lr / 0.02, 3), round(schedule_sum_eta2(400, steps=400, peak=lr) / target, 9)
        (2.23, 1.0)
    """
    if not (math.isfinite(target_sum_eta2) and target_sum_eta2 > 0):
        raise ValueError(f"target_sum_eta2 must be positive and finite but got {target_sum_eta2}.")
    unit = schedule_sum_eta2(steps, steps=steps, peak=1.0, warmup_steps=warmup_steps,
                             min_lr_ratio=min_lr_ratio)
    return math.sqrt(target_sum_eta2 / unit)


def stiefel_logit_bound(d_model: int, d_head: int) -> float:
    """``d_model/√d_head``: the largest attention logit Stiefel Q and K allow.

    With LayerNorm'd inputs (‖x‖² ≈ d_model at unit gains) and σ_max(W_Q) = σ_max(W_K) = 1,
    ``|q·k|/√d_head ≤ d_model/√d_head``: 8 for the tiny proxy (32, 16), 23 for small
    (128, 32), 96 for GPT-2 small (768, 64). Logit thresholds are stated in this unit.
    """
    if not (d_model >= 1 and d_head >= 1):
        raise ValueError(f"d_model and d_head must be positive but got {d_model}, {d_head}.")
    return d_model / math.sqrt(d_head)


# --------------------------------------------------------------------------- forecast
@dataclass(frozen=True)
class LogitForecast:
    """A forecast max logit at a target Σ η, with its prediction interval.

    Attributes:
        value: The forecast max logit at the target.
        low: Lower end of the ``level`` prediction interval.
        high: Upper end.
        target_sum_eta: Σ η the forecast is for.
        exponent: Fitted p in ``max_logit ∝ (σ₀ + Σ η)^p``.
        sigma_exponent: Fitted q in ``σ_max ∝ (σ₀ + Σ η)^q``; ``None`` without the σ route.
        sigma0: The σ₀ used.
        points: Probe points the laws were fitted on.
        level: Nominal two-sided coverage of ``[low, high]``.
    """

    value: float
    low: float
    high: float
    target_sum_eta: float
    exponent: float
    sigma_exponent: float | None
    sigma0: float
    points: int
    level: float

    def scaled(self, factor: float) -> LogitForecast:
        """The same forecast with logits multiplied by ``factor`` (e.g. to another model's
        logit scale)."""
        return replace(self, value=self.value * factor, low=self.low * factor,
                       high=self.high * factor)


@dataclass(frozen=True)
class Outlook:
    """A run's max logit at its target, judged against the target's threshold.

    What the stability pruner decides on (``LogitGrowthPruner.outlook``), kept for every
    trial so that the ones it did not prune are reported too.

    Attributes:
        forecast: The forecast at the target, in the target model's logits.
        threshold: The target's max-logit threshold, same unit.
        threshold_text: How the threshold is set, e.g. ``"threshold 230 (10 × d/√d_head 23)"``.
        reached_sum_eta: Σ η the run reached (the data the forecast extrapolates from).
        max_extrapolation: How far past the data the pruner acts on a forecast (a multiple
            of ``reached_sum_eta``); ``None``: any distance.
    """

    forecast: LogitForecast
    threshold: float
    threshold_text: str
    reached_sum_eta: float
    max_extrapolation: float | None

    @property
    def to_go(self) -> float:
        """The target's Σ η over the run's: how far the forecast extrapolates."""
        return self.forecast.target_sum_eta / self.reached_sum_eta if self.reached_sum_eta > 0 else math.inf

    @property
    def acted_on(self) -> bool:
        """Whether the target is near enough for the pruner to prune on this forecast."""
        return self.max_extrapolation is None or self.to_go <= self.max_extrapolation

    @property
    def verdict(self) -> str:
        """``"above"`` (the interval's lower end is above the threshold), ``"may pass"``
        (the interval reaches it) or ``"below"``."""
        if self.forecast.low > self.threshold:
            return "above"
        return "may pass" if self.forecast.high > self.threshold else "below"

    def text(self) -> str:
        """One line, e.g. ``"forecast 2.1e3 (1.4e3–3.0e3) at Σ η 545, above threshold 960
        (10 × d/√d_head 96); Σ η ×5 past the run: a rough guide, not acted on"``."""
        f = self.forecast
        line = (f"forecast {short_logit(f.value)} ({short_logit(f.low)}–{short_logit(f.high)}) at "
                f"Σ η {f.target_sum_eta:.3g}, {self.verdict} {self.threshold_text}")
        if not self.acted_on:
            line += f"; Σ η ×{self.to_go:.3g} past the run: a rough guide, not acted on"
        return line


@dataclass(frozen=True)
class Measured:
    """A trial's max logit *measured* at the target's Σ η² by its stability rung
    (docs/design.md, "The stability rung"), in the target model's logits.

    Attributes:
        final: the last probe's max logit: the target's end state.
        peak: the largest probed max logit of the run.
        threshold: the target's threshold (``max_logit_factor`` × its d/√d_head).
        threshold_text: the threshold in words.
        crossed_at: the target run's step at the Σ η² where the run first went above the
            threshold, ``None`` when it never did (or the probes do not say).
    """

    final: float
    peak: float
    threshold: float
    threshold_text: str
    crossed_at: int | None = None

    @property
    def verdict(self) -> str:
        """``above`` when a probe went above the threshold (the pruner's rule), else ``below``."""
        return "above" if self.peak > self.threshold else "below"

    def text(self) -> str:
        """``"measured at your target's Σ η²: max logit 377 (peak 397) > threshold 230 (...),
        crossing near your step 1,340"``."""
        now = f"max logit {short_logit(self.final)} (peak {short_logit(self.peak)})"
        if self.verdict == "below":
            return f"measured at your target's Σ η²: {now}, below {self.threshold_text}"
        where = f", crossing near your step {self.crossed_at:,}" if self.crossed_at is not None else ""
        return f"measured at your target's Σ η²: {now} > {self.threshold_text}{where}"


def short_logit(x: float) -> str:
    """A logit in a message: 3 significant digits below 1e3, else 2.1e3 style."""
    if not math.isfinite(x) or abs(x) < 1e3:
        return f"{x:.3g}"
    exponent = math.floor(math.log10(abs(x)))
    mantissa = x / 10**exponent
    if round(mantissa, 1) >= 10:  # 9.96e3 rounds to 10.0e3
        mantissa, exponent = mantissa / 10, exponent + 1
    return f"{mantissa:.1f}e{exponent}"


def forecast_max_logit(sum_eta: Sequence[float], max_logit: Sequence[float],
                       target_sum_eta: float, *, sigma: Sequence[float] | None = None,
                       sigma0: float = 1.0, min_points: int = 3,
                       level: float = 0.9) -> LogitForecast | None:
    """Forecast the max attention logit at ``target_sum_eta`` from probes of a shorter run.

    The method, step by step:

    1. **Which points.** The probes in the latter half of the run's cumulative step so far
       (``Σ η >= Σ η_last/2``), and at least the last ``min_points``. Early training, where
       attention learns and its logits rise quickly whatever the geometry, is left out: the
       forecast follows the current regime.
    2. **The law.** Least squares of ``y = log max_logit`` on ``x = log(σ₀ + Σ η)``:
       ``max_logit ≈ e^a·(σ₀ + Σ η)^p``, polynomial in Σ η. ``σ₀`` is the σ_max the
       weights start from; 1 (a Stiefel weight's) by default. It only matters while Σ η is
       of order 1, where the interval of a short run is wide anyway.
    3. **The interval.** The prediction interval of ordinary least squares at
       ``x_T = log(σ₀ + Σ η_T)``: ``ŷ ± t·s·√(1 + 1/n + (x_T − x̄)²/Sxx)``, with ``s``
       the residual standard deviation (n − 2 degrees of freedom) and ``t`` Student's
       quantile at ``(1 + level)/2``. It widens with the distance extrapolated and with
       the scatter of the points (noise, or curvature the law does not follow), so a
       noisy or flattening curve gets a low lower end. Residuals are assumed independent
       and equally spread in ``y``; measured max logits are neither exactly, so read
       ``level`` as nominal.
    4. **The σ route.** When ``sigma`` (σ_max of the query/key weights at each probe) is
       given, a second forecast follows the mechanism: the logit grows like σ_Q·σ_K at
       constant alignment and LayerNorm gains, ``max_logit_T = max_logit_t·(σ_T/σ_t)²``.
       ``σ_T`` and its interval come from the same fit applied to σ_max (``log σ`` on
       ``log(σ₀ + Σ η)``, same points), never more than ``σ_t + Σ η_T − Σ η_t``: a
       manifold-Muon step moves σ_max by at most its η. ``max_logit_t`` is the first fit's
       value at the last point, and the interval adds that fit's prediction spread there
       (the logit's scatter around its trend). ``value``, ``low`` and ``high`` are each
       the lower of the two forecasts'. So a geometry that holds σ_max fixed
       (Stiefel) is forecast at its current level, and one whose σ_max has stopped
       following Σ η is not extrapolated at the logit's earlier rate.

    Args:
        sum_eta: Σ η at each probe, non-decreasing.
        max_logit: The probed max attention logit at each.
        target_sum_eta: Σ η at the end of the target run.
        sigma: σ_max of the query/key weights at each probe, or ``None`` (no σ route).
        sigma0: σ₀ in the law; positive.
        min_points: Fewest points to fit (at least 3: two parameters and a spread).
        level: Coverage of the interval, in (0, 1).

    Returns:
        The forecast, or ``None`` when there is nothing to fit: fewer than ``min_points``
        points, a non-positive or non-finite logit among those fitted, or no spread in Σ η.
        The σ route is left out when a fitted point's σ_max is not positive and finite.
    """
    if len(sum_eta) != len(max_logit) or (sigma is not None and len(sigma) != len(sum_eta)):
        raise ValueError(f"sum_eta, max_logit and sigma must have the same length but got "
                         f"{len(sum_eta)}, {len(max_logit)} and "
                         f"{'-' if sigma is None else len(sigma)}.")
    if not (sigma0 > 0 and math.isfinite(sigma0)):
        raise ValueError(f"sigma0 must be positive and finite but got {sigma0}.")
    if min_points < 3:
        raise ValueError(f"min_points must be at least 3 but got {min_points}.")
    if not 0 < level < 1:
        raise ValueError(f"level must be between 0 and 1 but got {level}.")
    n_all = len(sum_eta)
    if n_all < min_points or not math.isfinite(target_sum_eta):
        return None
    half = sum_eta[-1] / 2
    first = min(n_all - min_points, next(i for i, e in enumerate(sum_eta) if e >= half))
    x_t = math.log(sigma0 + target_sum_eta)
    x = [math.log(sigma0 + e) for e in sum_eta[first:]]
    logit = _LogFit.of(x, max_logit[first:])
    if logit is None:
        return None
    t = t_quantile(logit.n - 2, (1 + level) / 2)
    y, w = logit.at(x_t), t * logit.spread(x_t)
    low, value, high = y - w, y, y + w

    sigma_exponent = None
    sig = None if sigma is None else _LogFit.of(x, sigma[first:])
    if sig is not None:
        sigma_exponent = sig.slope
        # σ_T: its fit and interval at x_T, never more than a step's η per step from σ_t
        log_bound = math.log(sigma[-1] + max(0.0, target_sum_eta - sum_eta[-1]))
        g_low, g, g_high = (min(v, log_bound) - math.log(sigma[-1])
                            for v in (sig.at(x_t) - t * sig.spread(x_t), sig.at(x_t),
                                      sig.at(x_t) + t * sig.spread(x_t)))
        # the logit now: its fitted value at the last point, and the scatter around it
        now, w_now = logit.at(x[-1]), t * logit.spread(x[-1])
        low = min(low, now + 2 * g_low - w_now)
        value = min(value, now + 2 * g)
        high = min(high, now + 2 * g_high + w_now)
    return LogitForecast(value=_exp(value), low=_exp(low), high=_exp(high),
                         target_sum_eta=target_sum_eta, exponent=logit.slope,
                         sigma_exponent=sigma_exponent, sigma0=sigma0, points=logit.n,
                         level=level)


@dataclass(frozen=True)
class _LogFit:
    """Ordinary least squares of ``log v`` on ``x``."""

    slope: float
    intercept: float
    s: float  # residual standard deviation, n − 2 degrees of freedom
    n: int
    mean_x: float
    sxx: float

    @classmethod
    def of(cls, x: Sequence[float], values: Sequence[float]) -> _LogFit | None:
        """The fit, or ``None`` for a non-positive or non-finite value or no spread in x."""
        if not all(math.isfinite(v) and v > 0 for v in values):
            return None
        y = [math.log(v) for v in values]
        n = len(x)
        mx = sum(x) / n
        sxx = sum((a - mx) ** 2 for a in x)
        if not sxx > 0:
            return None
        slope, intercept = statistics.linear_regression(x, y)
        rss = sum((b - intercept - slope * a) ** 2 for a, b in zip(x, y))
        return cls(slope, intercept, math.sqrt(rss / (n - 2)), n, mx, sxx)

    def at(self, x: float) -> float:
        """The fitted ``log v`` at ``x``."""
        return self.intercept + self.slope * x

    def spread(self, x: float) -> float:
        """Standard error of a new observation of ``log v`` at ``x``."""
        return self.s * math.sqrt(1 + 1 / self.n + (x - self.mean_x) ** 2 / self.sxx)


def _exp(v: float) -> float:
    return math.exp(min(v, 700.0))  # exp(710) overflows a float
