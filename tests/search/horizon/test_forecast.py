"""The Σ η forecast: the schedule's Σ η, Student's t, and forecasts of known growth laws."""

from __future__ import annotations

import math
import random
import re
import types

import pytest

from geosearch.proxy.config import TrainConfig
from geosearch.proxy.train import _Run
from geosearch.search.horizon import forecast as forecast_module
from geosearch.search.horizon.forecast import (
    LogitForecast,
    Measured,
    Outlook,
    forecast_max_logit,
    schedule_sum_eta,
    schedule_sum_eta2,
    short_logit,
    stability_lr,
    stiefel_logit_bound,
)
from geosearch.search.stats.scores import t_quantile

PEAK = 0.02  # the default space's spectral step


def probe_sum_eta(steps, every=10, peak=PEAK):
    """Σ η at each probe step of a proxy run of ``steps`` steps (one probe every ``every``)."""
    return [schedule_sum_eta(s, steps=steps, peak=peak) for s in range(every, steps + 1, every)]


def quadratic_law(sum_eta, c=0.5, sigma0=1.0):
    """A known Σ η law: logit = c·(σ₀ + Σ η)², as σ_Q·σ_K when σ_max grows by the full η."""
    return [c * (sigma0 + e) ** 2 for e in sum_eta]


# ---------------------------------------------------------------------- the schedule
@pytest.mark.parametrize("steps, warmup, floor", [
    (200, None, 0.1), (2000, None, 0.1), (50, 0, 0.0), (7, 3, 0.5), (10, 10, 0.1), (1, None, 0.1),
    (333, 40, 1.0),
])
def test_sum_eta_is_the_sum_of_the_trainers_own_schedule(steps, warmup, floor):
    config = TrainConfig(model="tiny", steps=steps, warmup_steps=warmup, min_lr_ratio=floor)
    run = types.SimpleNamespace(config=config.resolved())
    for step in sorted({0, 1, steps // 3, steps - 1, steps}):
        # the trainer's step t (1-based) uses lr_factor(t - 1): Σ η after `step` steps
        direct = PEAK * sum(_Run.lr_factor(run, s) for s in range(step))
        # Rule: the closed form equals the direct sum of the trainer's lr_factor.
        assert schedule_sum_eta(step, steps=steps, peak=PEAK, warmup_steps=warmup,
                                min_lr_ratio=floor) == pytest.approx(direct, rel=1e-12, abs=1e-15)


@pytest.mark.parametrize(("steps", "warmup", "floor"), [
    (200, None, 0.1), (2000, None, 0.1), (50, 0, 0.0), (7, 3, 0.5), (10, 10, 0.1), (1, None, 0.1),
    (333, 40, 1.0), (2, 0, 0.1), (2, 1, 0.3),
])
def test_sum_eta2_is_the_sum_of_the_squared_schedule(steps, warmup, floor):
    config = TrainConfig(model="tiny", steps=steps, warmup_steps=warmup, min_lr_ratio=floor)
    run = types.SimpleNamespace(config=config.resolved())
    for step in sorted({0, 1, steps // 3, steps - 1, steps}):
        direct = sum((PEAK * _Run.lr_factor(run, s)) ** 2 for s in range(step))
        # Rule: the closed form of Σ η² (warmup + cosine) equals the direct sum of the
        # trainer's own squared steps.
        assert schedule_sum_eta2(step, steps=steps, peak=PEAK, warmup_steps=warmup,
                                 min_lr_ratio=floor) == pytest.approx(direct, rel=1e-12, abs=1e-18)


@pytest.mark.parametrize(("target_steps", "target_peak", "steps"), [
    (2000, 0.02, 400), (2000, 0.02, 200), (2000, 0.05, 400), (40, 0.02, 10), (100, 0.1, 300)])
def test_the_stability_step_ends_at_the_targets_sum_eta2(target_steps, target_peak, steps):
    target = schedule_sum_eta2(target_steps, steps=target_steps, peak=target_peak)
    lr = stability_lr(target, steps)
    # Rule: a run of `steps` steps at the stability step, same schedule shape, ends at the
    # target's Σ η², so η'/η = √(Σ f² of the target / Σ f² of the run).
    assert schedule_sum_eta2(steps, steps=steps, peak=lr) == pytest.approx(target, rel=1e-12)
    unit = schedule_sum_eta2(target_steps, steps=target_steps, peak=1.0) / schedule_sum_eta2(steps, steps=steps, peak=1.0)
    assert lr / target_peak == pytest.approx(math.sqrt(unit))


def test_the_stability_step_of_the_default_target():
    # Rule: 400 steps reach a 2,000-step run's Σ η² at 2.23 × its step, 200 steps at 3.14 ×;
    # Σ η² of the 2,000-step run at 0.02 is 0.318.
    target = schedule_sum_eta2(2000, steps=2000, peak=PEAK)
    assert target == pytest.approx(0.31777, rel=1e-4)
    assert stability_lr(target, 400) / PEAK == pytest.approx(2.2305, rel=1e-4)
    assert stability_lr(target, 200) / PEAK == pytest.approx(3.1444, rel=1e-4)
    with pytest.raises(ValueError, match="target_sum_eta2 must be positive"):
        stability_lr(0.0, 400)


def test_sum_eta_of_the_issues_runs():
    # Rule: the default search (200 steps at 0.02) reaches Σ η 2.2, 2,000 steps 21.8, and a
    # 50,000-step run at the same step size 545 (the numbers the design quotes).
    assert schedule_sum_eta(200, steps=200, peak=PEAK) == pytest.approx(2.199)
    assert schedule_sum_eta(2000, steps=2000, peak=PEAK) == pytest.approx(21.819)
    assert schedule_sum_eta(50_000, steps=50_000, peak=PEAK) == pytest.approx(545.019)


@pytest.mark.parametrize("kwargs, message", [
    ({"step": 11, "steps": 10}, "step must be an integer between 0 and steps (10) but got 11"),
    ({"step": 1, "steps": 0}, "steps must be a positive integer but got 0"),
    ({"step": 1, "steps": 10, "peak": -1.0}, "peak must be non-negative and finite but got -1.0"),
    ({"step": 1, "steps": 10, "min_lr_ratio": 2.0}, "min_lr_ratio must be in [0, 1] but got 2.0"),
    ({"step": 1, "steps": 10, "warmup_steps": -1}, "warmup_steps must be a non-negative integer"),
])
def test_sum_eta_arguments_are_checked(kwargs, message):
    kwargs.setdefault("peak", PEAK)
    # Rule: a bad argument is rejected with its name and value.
    with pytest.raises(ValueError, match=re.escape(message)):
        schedule_sum_eta(**kwargs)


def test_stiefel_logit_bound_of_the_presets():
    # Rule: d/√d_head is 8 for tiny (32, d_head 16), 22.6 for small (128, 32), 96 for GPT-2.
    assert stiefel_logit_bound(32, 16) == 8.0
    assert stiefel_logit_bound(128, 32) == pytest.approx(22.627, abs=1e-3)
    assert stiefel_logit_bound(768, 64) == 96.0


# ---------------------------------------------------------------------- Student's t
@pytest.mark.parametrize("q, df, expected", [
    (0.975, 1, 12.7062), (0.975, 2, 4.3027), (0.975, 3, 3.1824), (0.95, 3, 2.3534),
    (0.95, 10, 1.8125), (0.975, 30, 2.0423), (0.05, 4, -2.1318), (0.5, 7, 0.0),
])
def test_t_quantile_matches_the_tables(q, df, expected):
    # Rule: the exact quantile, to the 4 decimals of a printed table.
    assert t_quantile(df, q) == pytest.approx(expected, abs=1e-4)


def test_the_forecast_uses_scipys_t_quantile(monkeypatch):
    stats = pytest.importorskip("scipy.stats")
    # Rule: one Student-t quantile in the package, scipy's: t(0.95, 3) exactly as scipy has it.
    assert forecast_module.t_quantile is t_quantile
    assert t_quantile(3, 0.95) == float(stats.t.ppf(0.95, 3))
    # Rule: the forecast asks it for the (1 + level)/2 quantile at n − 2 degrees of freedom.
    calls = []
    monkeypatch.setattr(forecast_module, "t_quantile", lambda df, p: calls.append((df, p)) or t_quantile(df, p))
    eta = probe_sum_eta(200)
    forecast_max_logit(eta, [5.0 * (1.0 + e) ** 2 for e in eta], 10.0, level=0.9)
    fitted = sum(e >= eta[-1] / 2 for e in eta)  # the points from half the last Σ η on
    assert calls == [(fitted - 2, pytest.approx(0.95))]


# ---------------------------------------------------------------------- forecasts
def test_an_exact_law_is_recovered():
    eta = probe_sum_eta(300)
    target = schedule_sum_eta(3000, steps=3000, peak=PEAK)
    f = forecast_max_logit(eta, quadratic_law(eta), target)
    # Rule: without noise the fit is the law: exponent 2 and the value at the target.
    assert f.exponent == pytest.approx(2.0)
    assert f.value == pytest.approx(quadratic_law([target])[0], rel=1e-9)
    assert f.low == pytest.approx(f.value) and f.high == pytest.approx(f.value)


def noisy(values, rng, sd=0.1):
    """``values`` with multiplicative log-normal noise of standard deviation ``sd``."""
    return [v * math.exp(rng.gauss(0.0, sd)) for v in values]


@pytest.mark.parametrize("noise", [0.05, 0.1])
def test_a_noisy_law_is_forecast_within_a_factor_and_covered(noise):
    # The quadratic law under the proxy's cosine schedule (300 steps, Σ η 3.3) with
    # multiplicative noise; the target is 10x longer at the same step size (Σ η 33).
    eta = probe_sum_eta(300)
    target = schedule_sum_eta(3000, steps=3000, peak=PEAK)
    truth = quadratic_law([target])[0]
    covered, ratios = 0, []
    for seed in range(200):
        f = forecast_max_logit(eta, noisy(quadratic_law(eta), random.Random(seed), noise), target)
        ratios.append(f.value / truth)
        covered += f.low <= truth <= f.high
    # Rule: the forecast is unbiased (median ratio within 5% of 1); with 5% noise every
    # forecast is within x2 of the truth, with 10% noise 85% of them.
    assert sorted(ratios)[100] == pytest.approx(1.0, abs=0.05)
    within = sum(0.5 < r < 2 for r in ratios) / 200
    assert within == 1.0 if noise == 0.05 else within >= 0.85, within
    # Rule: the 90% interval covers the truth about 90% of the time (binomial: 84-96%).
    assert 0.84 <= covered / 200 <= 0.96, covered


def test_growth_is_polynomial_in_sum_eta_not_exponential_in_steps():
    # The same law over a run whose schedule has decayed: Σ η barely grows over the last
    # steps, so neither does the logit, and the forecast at the run's own end agrees.
    eta = probe_sum_eta(300)
    logits = quadratic_law(eta)
    at_200 = sum(e <= schedule_sum_eta(200, steps=300, peak=PEAK) for e in eta)
    f = forecast_max_logit(eta[:at_200], logits[:at_200], eta[-1])
    # Rule: from step 200 the forecast of step 300's logit is right, though a log-linear
    # extrapolation in steps of the same points would overshoot it.
    assert f.value == pytest.approx(logits[-1], rel=1e-6)
    steps_200 = list(range(10, 201, 10))[-5:]
    rate = math.log(logits[at_200 - 1] / logits[at_200 - 5]) / (steps_200[-1] - steps_200[0])
    assert logits[at_200 - 1] * math.exp(rate * 100) > 1.1 * logits[-1]


def test_a_plateau_is_forecast_at_its_level():
    # Fast early growth, then flat at 40 with 10% noise (attention learned, then holds).
    eta = probe_sum_eta(300)
    rng = random.Random(1)
    logits = noisy([40.0 * min(1.0, e / 0.5) + 1.0 for e in eta], rng)
    f = forecast_max_logit(eta, logits, schedule_sum_eta(50_000, steps=50_000, peak=PEAK))
    # Rule: the interval's lower end stays at or below the plateau, 545/3.3 x further on.
    assert f.low < 41.0 < f.high


def test_the_sigma_route_holds_a_fixed_sigma_at_its_level():
    # Logits creeping up (alignment) while σ_max stays 1 (Stiefel): the logit fit alone
    # extrapolates the creep; σ_Q·σ_K cannot grow, so the σ route holds the level.
    eta = probe_sum_eta(300)
    logits = [2.0 * (1.0 + e) for e in eta]
    target = schedule_sum_eta(50_000, steps=50_000, peak=PEAK)
    alone = forecast_max_logit(eta, logits, target)
    held = forecast_max_logit(eta, logits, target, sigma=[1.0] * len(eta))
    # Rule: without σ the forecast is the law (2·(1 + Σ η)); with a fixed σ it is the
    # current level.
    assert alone.value == pytest.approx(2.0 * (1.0 + target), rel=1e-6)
    assert held.value == pytest.approx(logits[-1], rel=1e-6)
    assert held.sigma_exponent == pytest.approx(0.0)


def test_the_sigma_route_obeys_the_step_bound():
    # σ_max growing faster than a step may move it (σ ∝ (1 + Σ η)^3, impossible under
    # manifold Muon) with logits ∝ σ²: the σ route is capped by σ_t + Σ η_T − Σ η_t.
    eta = probe_sum_eta(300)
    sigma = [(1.0 + e) ** 3 for e in eta]
    logits = [0.1 * s**2 for s in sigma]
    target = schedule_sum_eta(3000, steps=3000, peak=PEAK)
    f = forecast_max_logit(eta, logits, target, sigma=sigma)
    bound = logits[-1] * ((sigma[-1] + target - eta[-1]) / sigma[-1]) ** 2
    # Rule: the forecast is at most the step bound (it is exact here: no noise).
    assert f.value == pytest.approx(bound, rel=1e-9) and f.high == pytest.approx(bound, rel=1e-9)
    assert f.value < 0.1 * (1.0 + target) ** 6


def test_only_the_latter_half_of_sum_eta_is_fitted():
    eta = probe_sum_eta(300)
    # steep early growth (x100 over the first quarter of Σ η), then the quadratic law
    logits = [v * (100.0 if e < eta[-1] / 4 else 1.0) for v, e in zip(quadratic_law(eta), eta)]
    f = forecast_max_logit(eta, logits, 30.0)
    # Rule: the early points do not enter the fit: the law is recovered exactly.
    assert f.exponent == pytest.approx(2.0)
    assert f.points == sum(e >= eta[-1] / 2 for e in eta)


def test_nothing_to_fit_gives_none():
    eta = probe_sum_eta(300)
    logits = quadratic_law(eta)
    # Rule: fewer points than min_points, no spread in Σ η, or a non-positive logit: None.
    assert forecast_max_logit(eta[:4], logits[:4], 30.0, min_points=5) is None
    assert forecast_max_logit([1.0] * 5, logits[:5], 30.0) is None
    assert forecast_max_logit(eta, logits[:-1] + [0.0], 30.0) is None
    assert forecast_max_logit(eta, logits, math.nan) is None
    # Rule: a σ series with a non-finite value only turns the σ route off.
    sigma = [1.0] * (len(eta) - 1) + [math.nan]
    assert forecast_max_logit(eta, logits, 30.0, sigma=sigma).sigma_exponent is None


def test_forecast_arguments_are_checked():
    # Rule: bad arguments are rejected with the argument's name and value.
    with pytest.raises(ValueError, match="same length"):
        forecast_max_logit([1.0, 2.0], [1.0], 3.0)
    with pytest.raises(ValueError, match="sigma0 must be positive and finite but got 0"):
        forecast_max_logit([1.0, 2.0, 3.0], [1.0, 2.0, 3.0], 3.0, sigma0=0)
    with pytest.raises(ValueError, match="min_points must be at least 3 but got 2"):
        forecast_max_logit([1.0, 2.0, 3.0], [1.0, 2.0, 3.0], 3.0, min_points=2)
    with pytest.raises(ValueError, match="level must be between 0 and 1 but got 1"):
        forecast_max_logit([1.0, 2.0, 3.0], [1.0, 2.0, 3.0], 3.0, level=1)


def test_scaled_multiplies_every_end():
    eta = probe_sum_eta(300)
    f = forecast_max_logit(eta, noisy(quadratic_law(eta), random.Random(0)), 30.0)
    g = f.scaled(12.0)
    # Rule: a change of logit unit multiplies the value and both ends.
    assert (g.value, g.low, g.high) == pytest.approx((12 * f.value, 12 * f.low, 12 * f.high))


def test_an_outlook_is_above_below_or_may_pass_by_its_interval():
    f = LogitForecast(value=100.0, low=50.0, high=200.0, target_sum_eta=40.0, exponent=2.0,
                      sigma_exponent=None, sigma0=1.0, points=5, level=0.9)
    # Rule: "above" needs the whole interval above the threshold, "below" the whole of it below.
    assert Outlook(f, 40.0, "t", 10.0, 4.0).verdict == "above"
    assert Outlook(f, 150.0, "t", 10.0, 4.0).verdict == "may pass"
    assert Outlook(f, 250.0, "t", 10.0, 4.0).verdict == "below"
    # Rule: acted on only within max_extrapolation of the run's Σ η (None: always).
    assert Outlook(f, 40.0, "t", 10.0, 4.0).acted_on and Outlook(f, 40.0, "t", 10.0, 4.0).to_go == 4.0
    assert not Outlook(f, 40.0, "t", 9.9, 4.0).acted_on and Outlook(f, 40.0, "t", 0.1, None).acted_on
    assert not Outlook(f, 40.0, "t", 0.0, 4.0).acted_on  # nothing reached: infinitely far


@pytest.mark.parametrize("x, text", [(3.14159, "3.14"), (999.4, "999"), (2104.0, "2.1e3"),
                                     (9960.0, "1.0e4"), (math.inf, "inf")])
def test_short_logit(x, text):
    assert short_logit(x) == text


def test_a_measurement_above_the_threshold_says_where_the_run_crosses_it():
    above = Measured(final=377.0, peak=397.0, threshold=226.0, threshold_text="threshold 226", crossed_at=1340)
    below = Measured(final=22.6, peak=25.1, threshold=226.0, threshold_text="threshold 226")
    # Rule: the verdict is the pruner's (any probe above the threshold), in words with the step.
    assert (above.verdict, below.verdict) == ("above", "below")
    assert above.text() == ("measured at your target's Σ η²: max logit 377 (peak 397) > threshold 226, "
                            "crossing near your step 1,340")
    assert below.text() == "measured at your target's Σ η²: max logit 22.6 (peak 25.1), below threshold 226"
