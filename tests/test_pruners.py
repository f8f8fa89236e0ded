"""LogitGrowthPruner: every rule on synthetic probe histories, the warmup, the wrapped pruner."""

from __future__ import annotations

import math
import random

import optuna
import pytest
from optuna.trial import TrialState, create_trial

from geosearch.search.pruners import LogitGrowthPruner

optuna.logging.set_verbosity(optuna.logging.WARNING)

BUDGET = 300


def probes(logits, *, every=10, start=0, entropy=1.0, loss=4.0):
    """A probe history: one point every ``every`` steps with the given max logits."""
    return [
        {"step": start + i * every, "max_logit": v, "min_entropy": entropy, "train_loss": loss}
        for i, v in enumerate(logits)
    ]


def running(history, *, budget=BUDGET, values=None):
    """A frozen RUNNING trial as the objective leaves it after storing its probes."""
    attrs = {"probe_history": history}
    if budget is not None:
        attrs["budget_steps"] = budget
    return create_trial(
        state=TrialState.RUNNING, user_attrs=attrs, intermediate_values=values or {}
    )


def judge(pruner, trial):
    """(prune decision, reason) for ``trial`` in a fresh study using ``pruner``."""
    study = optuna.create_study(pruner=pruner)
    decision = pruner.prune(study, trial)
    why = pruner.reason(study, trial)
    assert decision == (why is not None)  # prune and reason always agree
    return decision, why


def exponential(first, per_step, n, every=10):
    """Max logits growing by the factor ``per_step`` per training step."""
    return [first * per_step ** (i * every) for i in range(n)]


# ---------------------------------------------------------------------- arguments
@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"max_logit": -1}, "max_logit must be positive and finite but got -1"),
        ({"max_logit": 0}, "max_logit must be positive and finite but got 0"),
        ({"max_logit": math.inf}, "max_logit must be positive and finite but got inf"),
        ({"min_entropy": -0.1}, "min_entropy must be non-negative or None but got -0.1"),
        ({"n_warmup_steps": -1}, "n_warmup_steps cannot be negative but got -1"),
        ({"window": 2}, "window must be an integer of at least 3 but got 2"),
        ({"window": 4.5}, "window must be an integer of at least 3 but got 4.5"),
        ({"trend_min_logit": 0}, "trend_min_logit must be between 0 and max_logit"),
        ({"trend_min_logit": 2e3}, "trend_min_logit must be between 0 and max_logit"),
        ({"horizon_steps": 0}, "horizon_steps must be at least 1 or None but got 0"),
    ],
)
def test_bad_arguments_are_rejected_with_the_value(kwargs, message):
    # Rule: constructor arguments are checked, the message names the argument and value.
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        LogitGrowthPruner(**kwargs)


def test_wrapped_must_be_a_pruner():
    # Rule: wrapped is an optuna pruner or None.
    with pytest.raises(TypeError, match="wrapped must be an optuna.pruners.BasePruner"):
        LogitGrowthPruner(wrapped="median")


# ---------------------------------------------------------------------- max logit
def test_max_logit_above_threshold_prunes():
    decision, why = judge(LogitGrowthPruner(), running(probes([20, 40, 1.5e3])))
    # Rule: a probed max logit above max_logit (1e3) prunes.
    assert decision
    assert why == "max logit 1.5e+03 at step 20 > max_logit 1e+03"


def test_max_logit_below_threshold_and_flat_is_kept():
    decision, why = judge(LogitGrowthPruner(), running(probes([900.0] * 8)))
    # Rule: a max logit at the threshold's edge that does not grow is not pruned.
    assert not decision and why is None


# ---------------------------------------------------------------------- trend
def test_exponential_growth_is_pruned_early_by_the_trend():
    # Doubling every 20 steps from 10: 113 at step 70, would reach 1e3 near step 133.
    logits = exponential(10.0, 2 ** (1 / 20), 8)
    decision, why = judge(LogitGrowthPruner(), running(probes(logits)))
    # Rule: the log-linear trend over the last 5 points, extrapolated to the budget
    # (step 300), crosses max_logit, while the logit itself (113) is far below it.
    assert max(logits) < 1e3
    assert decision
    assert why.startswith("max-logit trend: 113 at step 70 extrapolates to")
    assert why.endswith("> 1e+03 by step 300 (x32 per 100 steps over steps 30-70)")


def test_trend_waits_for_trend_min_logit():
    logits = exponential(10.0, 2 ** (1 / 20), 7)  # ends at 80 at step 60
    # Rule: below trend_min_logit (100, Kimi's tau) the trend is not extrapolated.
    assert not judge(LogitGrowthPruner(), running(probes(logits)))[0]
    # Rule: with a lower trend_min_logit the same history is pruned by the trend.
    decision, why = judge(LogitGrowthPruner(trend_min_logit=50), running(probes(logits)))
    assert decision and why.startswith("max-logit trend")


def test_trend_needs_window_points():
    fast = exponential(100.0, 1.05, 5)  # x1.6 per 10 steps, all above trend_min_logit
    # Rule: fewer probe points than `window` (4 < 5): no trend.
    assert not judge(LogitGrowthPruner(), running(probes(fast[:4])))[0]
    # Rule: with `window` points the trend fires.
    assert judge(LogitGrowthPruner(), running(probes(fast)))[0]
    # Rule: a larger window needs more points.
    assert not judge(LogitGrowthPruner(window=6), running(probes(fast)))[0]


def test_trend_needs_positive_slope():
    falling = [900.0, 800.0, 700.0, 600.0, 500.0]
    # Rule: a falling max logit is never extrapolated into a divergence.
    assert not judge(LogitGrowthPruner(), running(probes(falling)))[0]


def test_trend_ignores_noise_around_a_plateau():
    # Flat around 300 with +-40% noise: the fitted line rises (x1.24 per 100 steps), which
    # would cross 1e3 by step 1000, but the slope is within 2 standard errors of zero.
    noisy = [300.0, 420.0, 250.0, 430.0, 330.0]
    decision, why = judge(LogitGrowthPruner(), running(probes(noisy), budget=1000))
    # Rule: the growth rate must exceed twice its standard error.
    assert not decision, why
    # Rule: the same rise without the noise is pruned.
    steady = exponential(300.0, 1.24 ** (1 / 100), 5)
    assert judge(LogitGrowthPruner(), running(probes(steady), budget=1000))[0]


def test_trend_is_fitted_on_the_last_window_points_only():
    # Early fast growth, then a plateau: the last 5 points are flat.
    logits = [10.0, 30.0, 90.0, 200.0, 400.0, 410.0, 400.0, 405.0, 410.0]
    # Rule: only the last `window` points count, so the early growth is not extrapolated.
    assert not judge(LogitGrowthPruner(), running(probes(logits)))[0]


def test_trend_horizon_defaults_to_budget_and_can_be_longer():
    slow = exponential(150.0, 1.2 ** (1 / 100), 6)  # x1.2 per 100 steps: 164 at step 50
    # Rule: the default horizon is the trial's budget (300 steps): 164 -> ~234, kept.
    assert not judge(LogitGrowthPruner(), running(probes(slow)))[0]
    # Rule: horizon_steps (the real run's length) extends the extrapolation: pruned.
    decision, why = judge(LogitGrowthPruner(horizon_steps=5000), running(probes(slow)))
    assert decision and "by step 5000" in why
    # Rule: without budget_steps and horizon_steps there is nothing to extrapolate to.
    fast = exponential(100.0, 1.05, 5)
    assert not judge(LogitGrowthPruner(), running(probes(fast), budget=None))[0]
    # Rule: at or past the horizon the trend is not used.
    assert not judge(LogitGrowthPruner(), running(probes(fast), budget=40))[0]


def test_trend_can_be_turned_off():
    logits = exponential(10.0, 2 ** (1 / 20), 8)
    # Rule: trend_min_logit=None disables the trend rule.
    assert not judge(LogitGrowthPruner(trend_min_logit=None), running(probes(logits)))[0]


# ---------------------------------------------------------------------- entropy
def test_entropy_collapse_prunes():
    history = probes([20.0] * 4, entropy=1.2)
    history[-1]["min_entropy"] = 0.004
    decision, why = judge(LogitGrowthPruner(), running(history))
    # Rule: min attention entropy below min_entropy (0.01 nats) prunes.
    assert decision
    assert why == (
        "attention entropy collapse: min entropy 0.004 at step 30 < min_entropy 0.01"
    )
    # Rule: a sharp but healthy head (0.05 nats) is not a collapse.
    history[-1]["min_entropy"] = 0.05
    assert not judge(LogitGrowthPruner(), running(history))[0]
    # Rule: min_entropy=None disables the entropy rule.
    history[-1]["min_entropy"] = 0.0
    assert not judge(LogitGrowthPruner(min_entropy=None), running(history))[0]


# ---------------------------------------------------------------------- non-finite
@pytest.mark.parametrize("key", ["train_loss", "max_logit", "min_entropy"])
@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_non_finite_probe_prunes_even_during_warmup(key, bad):
    history = probes([5.0, 6.0])
    history[1][key] = bad
    decision, why = judge(LogitGrowthPruner(n_warmup_steps=1000), running(history))
    # Rule: a NaN/inf probe value prunes at any step, warmup included.
    assert decision
    assert why == f"non-finite {key} ({bad}) at step 10"


def test_non_finite_val_loss_prunes_even_during_warmup():
    trial = running(probes([5.0]), values={10: 3.2, 20: math.nan})
    decision, why = judge(LogitGrowthPruner(n_warmup_steps=1000), trial)
    # Rule: a NaN reported validation loss prunes at any step, warmup included.
    assert decision and why == "non-finite val loss (nan) at step 20"


def test_missing_probe_values_are_not_measurements():
    history = [{"step": 10, "max_logit": None, "min_entropy": None, "train_loss": 3.0},
               {"step": 20, "train_loss": 2.9}]
    # Rule: None or absent probe values are "not measured", neither healthy nor unstable.
    assert not judge(LogitGrowthPruner(), running(history))[0]


def test_malformed_history_is_a_clear_error():
    # Rule: a probe history without integer steps is a programming error, said in words.
    with pytest.raises(ValueError, match=r"probe_history'\]\[0\] must be a dict"):
        judge(LogitGrowthPruner(), running([{"max_logit": 3.0}]))


# ---------------------------------------------------------------------- warmup
def test_warmup_hides_the_instability_rules():
    pruner = LogitGrowthPruner(n_warmup_steps=50)
    # Rule: before n_warmup_steps a huge max logit does not prune.
    assert not judge(pruner, running(probes([5e3, 5e3, 5e3])))[0]  # steps 0-20
    # Rule: from n_warmup_steps on it does; the reason names the first judged step.
    decision, why = judge(pruner, running(probes([5e3] * 7)))  # steps 0-60
    assert decision and why == "max logit 5e+03 at step 50 > max_logit 1e+03"
    # Rule: entropy collapse during warmup does not prune either.
    collapsed = probes([5.0, 5.0], entropy=0.0)
    assert not judge(pruner, running(collapsed))[0]


def test_trend_only_fits_points_after_warmup():
    logits = exponential(100.0, 1.05, 5)  # steps 0-40, pruned without warmup
    assert judge(LogitGrowthPruner(), running(probes(logits)))[0]
    # Rule: probe points before n_warmup_steps are not part of the trend's window.
    assert not judge(LogitGrowthPruner(n_warmup_steps=20), running(probes(logits)))[0]


# ---------------------------------------------------------------------- false positives
def healthy_history(seed):
    """A stable run: logits rise fast from 3 to ~40 in the first 60 steps (attention learns),
    then creep up slowly to ~150 by step 300, with 10% multiplicative noise."""
    rng = random.Random(seed)
    out = []
    for step in range(0, BUDGET + 1, 10):
        base = 3.0 + 37.0 * (1 - math.exp(-step / 20)) + 110.0 * step / BUDGET
        out.append({"step": step, "max_logit": base * math.exp(rng.gauss(0.0, 0.1)),
                    "min_entropy": 0.8 + 0.2 * rng.random(), "train_loss": 5.0 - step / 100})
    return out


@pytest.mark.parametrize("seed", range(5))
def test_healthy_slowly_growing_run_is_never_pruned(seed):
    history = healthy_history(seed)
    pruner = LogitGrowthPruner()
    for n in range(1, len(history) + 1):  # as the objective asks at every probe step
        decision, why = judge(pruner, running(history[:n]))
        # Rule: a stable, slowly growing max logit (fast early rise, 10% noise) is never
        # pruned, at any probe step of the budget.
        assert not decision, f"false positive at step {history[n - 1]['step']}: {why}"


def test_unstable_run_is_pruned_before_its_logit_crosses_the_threshold():
    # DGram-like: x1.6 per 10 steps from step 60 on, reaching 1e3 at step ~110.
    history = healthy_history(0)[:7]
    for step in range(70, BUDGET + 1, 10):
        last = history[-1]["max_logit"]
        history.append({"step": step, "max_logit": last * 1.6, "min_entropy": 0.5,
                        "train_loss": 4.0})
    pruner = LogitGrowthPruner()
    first = next(n for n in range(1, len(history) + 1)
                 if judge(pruner, running(history[:n]))[0])
    pruned_at = history[first - 1]
    # Rule: the trend prunes it while its max logit is still below max_logit.
    assert pruned_at["max_logit"] < 1e3
    assert pruner.reason(optuna.create_study(), running(history[:first])).startswith(
        "max-logit trend")


# ---------------------------------------------------------------------- wrapped pruner
def study_with_finished(pruner, losses):
    study = optuna.create_study(pruner=pruner)
    for loss in losses:
        study.add_trial(create_trial(value=loss, intermediate_values={10: loss}))
    return study


def test_wrapped_median_decides_when_no_rule_fires():
    pruner = LogitGrowthPruner(wrapped=optuna.pruners.MedianPruner(n_startup_trials=1))
    study = study_with_finished(pruner, [1.0, 1.1, 1.2])
    healthy = probes([10.0, 12.0])
    worse = running(healthy, values={10: 5.0})
    # Rule: no instability rule fires; the wrapped MedianPruner prunes a worse-than-median loss.
    assert pruner.prune(study, worse)
    assert pruner.reason(study, worse) == "loss pruner MedianPruner: val loss 5 at step 10"
    better = running(healthy, values={10: 0.5})
    # Rule: the wrapped MedianPruner keeps a better-than-median loss.
    assert not pruner.prune(study, better)
    assert pruner.reason(study, better) is None


def test_rules_take_precedence_over_the_wrapped_pruner():
    pruner = LogitGrowthPruner(wrapped=optuna.pruners.MedianPruner(n_startup_trials=1))
    study = study_with_finished(pruner, [1.0, 1.1, 1.2])
    trial = running(probes([10.0, 2e3]), values={10: 0.5})
    # Rule: an instability rule prunes even a trial the loss pruner would keep.
    assert pruner.reason(study, trial).startswith("max logit 2e+03")


def test_without_wrapped_a_bad_loss_is_kept():
    study = study_with_finished(LogitGrowthPruner(), [1.0, 1.1, 1.2])
    trial = running(probes([10.0, 12.0]), values={10: 50.0})
    # Rule: with no wrapped pruner only the instability rules prune.
    assert not study.pruner.prune(study, trial)


def test_live_trial_should_prune_and_reason_agree():
    pruner = LogitGrowthPruner()
    study = optuna.create_study(pruner=pruner)
    trial = study.ask()
    trial.set_user_attr("budget_steps", BUDGET)
    trial.set_user_attr("probe_history", probes([10.0, 20.0]))
    trial.report(3.0, 10)
    # Rule: a healthy live trial is kept through trial.should_prune().
    assert not trial.should_prune() and pruner.reason(study, trial) is None
    trial.set_user_attr("probe_history", probes([10.0, 20.0, 3e3]))
    # Rule: trial.should_prune() uses the same rules; reason() accepts the live trial.
    assert trial.should_prune()
    assert pruner.reason(study, trial) == "max logit 3e+03 at step 20 > max_logit 1e+03"


def test_reason_agrees_with_a_stateful_wrapped_pruner():
    # SuccessiveHalvingPruner records rung values while pruning, so calling it twice gives
    # different answers; the objective calls should_prune() and then reason().
    sha = optuna.pruners.SuccessiveHalvingPruner(min_resource=1, reduction_factor=2)
    pruner = LogitGrowthPruner(wrapped=sha)
    study = optuna.create_study(pruner=pruner)
    for _ in range(3):
        t = study.ask()
        t.report(1.0, 1)
        assert not t.should_prune()
        study.tell(t, 1.0)
    trial = study.ask()
    trial.report(5.0, 1)
    # Rule: the wrapped pruner's decision is remembered, so reason() explains should_prune().
    assert trial.should_prune()
    assert pruner.reason(study, trial) == (
        "loss pruner SuccessiveHalvingPruner: val loss 5 at step 1")
