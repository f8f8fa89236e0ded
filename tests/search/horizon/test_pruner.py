"""LogitGrowthPruner: every rule on synthetic probe histories, the warmup, the wrapped pruner."""

from __future__ import annotations

import math
import re
import random

import optuna
import pytest
from optuna.trial import TrialState, create_trial

from geosearch.search.horizon.forecast import schedule_sum_eta
from geosearch.search.horizon.probe_rows import probe_row
from geosearch.search.horizon.pruner import LogitGrowthPruner

optuna.logging.set_verbosity(optuna.logging.WARNING)

BUDGET = 300
PEAK = 0.02  # spectral step of the synthetic proxy runs
TINY, GPT2 = 8.0, 96.0  # d/√d_head of the tiny proxy and of GPT-2 small


def probes(logits, *, every=10, start=0, entropy=1.0, loss=4.0):
    """A probe history: one point every ``every`` steps with the given max logits."""
    return [
        {"step": start + i * every, "max_logit": v, "min_entropy": entropy, "train_loss": loss}
        for i, v in enumerate(logits)
    ]


def running(history, *, budget=BUDGET, values=None, **attrs):
    """A frozen RUNNING trial as the objective leaves it after storing its probes (and the
    forecast's inputs given as keyword arguments: target_sum_eta, logit_scale, ...)."""
    attrs["probe_history"] = history
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


def with_sum_eta(history, steps=BUDGET, peak=PEAK, sigma=None):
    """``history`` with each row's Σ η of a ``steps``-step proxy run (and σ_max of attn_qkv
    from ``sigma(sum_eta)``), as the objective stores them."""
    out = []
    for row in history:
        eta = schedule_sum_eta(row["step"], steps=steps, peak=peak)
        extra = {"sigma_max": {"attn_qkv": sigma(eta), "mlp_in": 1.0}} if sigma else {}
        out.append({**row, "sum_eta": eta, **extra})
    return out


def law(c, power=2.0, steps=BUDGET, every=10, **kwargs):
    """A probe history following logit = c·(1 + Σ η)^power over a ``steps``-step proxy run."""
    rows = probes([0.0] * (steps // every), every=every, start=every, **kwargs)
    for row in rows:
        row["sum_eta"] = schedule_sum_eta(row["step"], steps=steps, peak=PEAK)
        row["max_logit"] = c * (1.0 + row["sum_eta"]) ** power
    return rows


def target(steps, scale=GPT2, proxy_scale=TINY):
    """The trial attributes of a target run of ``steps`` steps at PEAK on a model of
    d/√d_head ``scale``, searched on a proxy of d/√d_head ``proxy_scale``."""
    return {"target_sum_eta": schedule_sum_eta(steps, steps=steps, peak=PEAK),
            "target_steps": steps, "logit_scale": proxy_scale, "target_logit_scale": scale}


# ---------------------------------------------------------------------- arguments
@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"max_logit": -1}, "max_logit must be a number > 0 but got -1"),
        ({"max_logit": 0}, "max_logit must be a number > 0 but got 0"),
        ({"max_logit": math.inf}, "max_logit must be a number > 0 but got inf"),
        ({"min_entropy": -0.1}, "min_entropy must be a number >= 0 or null but got -0.1"),
        ({"n_warmup_steps": -1}, "n_warmup_steps must be a whole number in [0, 10,000,000] but got -1"),
        ({"window": 2}, "window must be a whole number in [3, 10,000] but got 2"),
        ({"window": 4.5}, "window must be a whole number in [3, 10,000] but got 4.5"),
        ({"max_logit_factor": 0}, "max_logit_factor must be a number > 0 but got 0"),
        ({"max_logit_factor": math.nan}, "max_logit_factor must be a number > 0 but got nan"),
        ({"interval": 1.0}, "interval must be a number in (0, 1) or null but got 1.0"),
        ({"interval": 0}, "interval must be a number in (0, 1) or null but got 0"),
    ],
)
def test_bad_arguments_are_rejected_with_the_value(kwargs, message):
    # Rule: constructor arguments are checked, the message names the argument and value.
    with pytest.raises(ValueError, match=re.escape(message)):
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


# ---------------------------------------------------------------------- scaled threshold
def test_max_logit_threshold_is_scaled_by_the_models_bound():
    history = probes([20.0, 40.0, 95.0])
    # Rule: with the proxy's d/√d_head stored, the threshold is 10 × it (80 on tiny) ...
    decision, why = judge(LogitGrowthPruner(), running(history, logit_scale=TINY))
    assert decision and why == "max logit 95 at step 20 > threshold 80 (10 × d/√d_head 8)"
    # ... 960 on GPT-2 small, where 95 is healthy ...
    assert not judge(LogitGrowthPruner(), running(history, logit_scale=GPT2))[0]
    # ... and max_logit_factor moves it.
    assert not judge(LogitGrowthPruner(max_logit_factor=20), running(history, logit_scale=TINY))[0]


# ---------------------------------------------------------------------- forecast
def test_a_growth_law_crossing_the_target_threshold_is_pruned_by_the_forecast():
    # logit = 0.1·(1 + Σ η)² on a tiny proxy of 300 steps: 1.8 at its end (Σ η 3.3),
    # far below its own threshold 80. The target: GPT-2 small, 50,000 steps at the same
    # step size (Σ η 545): 0.1·546² = 3.0e4 in tiny logits, x12 in GPT-2's.
    history = law(0.1)
    decision, why = judge(LogitGrowthPruner(max_extrapolation=None), running(history, **target(50_000)))
    truth = 0.1 * (1 + schedule_sum_eta(50_000, steps=50_000, peak=PEAK)) ** 2 * GPT2 / TINY
    # Rule: the lower end of the forecast at the target is above 10 × 96; the reason
    # names the forecast, the target and the threshold.
    assert decision
    assert why.startswith("forecast max logit 3.6e5 (3.6e5–3.6e5) by step 50,000 (Σ η 545; "
                          "the proxy's logits × 12) > threshold 960 (10 × d/√d_head 96)"), why
    assert f"{truth:.2g}" == "3.6e+05"
    # Rule: the same run with a target of its own length is not pruned (1.8 < 80).
    assert not judge(LogitGrowthPruner(max_extrapolation=None), running(history, **target(BUDGET, scale=TINY)))[0]


@pytest.mark.parametrize("scale", [TINY, GPT2])
def test_the_forecast_is_judged_in_units_of_the_bound(scale):
    # 0.0025·(1 + 545)² = 745 tiny logits = 93 × tiny's d/√d_head at the target.
    history = law(0.0025)
    trial = running(history, **target(50_000, scale=scale))
    # Rule: the decision compares the forecast with max_logit_factor × d/√d_head, the same
    # in any model's unit: pruned at a factor of 90, kept at 100.
    assert judge(LogitGrowthPruner(max_extrapolation=None, max_logit_factor=90), trial)[0]
    assert not judge(LogitGrowthPruner(max_extrapolation=None, max_logit_factor=100), trial)[0]
    # Rule: forecast() gives the number in the target's logits (x12 for GPT-2 small).
    f = LogitGrowthPruner(max_extrapolation=None).forecast(optuna.create_study(), trial)
    assert f.value == pytest.approx(0.0025 * 546.019 ** 2 * scale / TINY, rel=1e-6)


def test_the_forecast_rule_prunes_only_within_max_extrapolation():
    # The growth law of the test above: tiny logits 0.1·(1 + Σ η)², a run to Σ η 3.3.
    history = law(0.1)
    reached = max(r["sum_eta"] for r in history)
    far = running(history, **target(50_000))  # Σ η 545: ×165 past the run
    # Rule: by default (max_extrapolation 4) a target 165× past the run's Σ η is forecast
    # (forecast() still answers) but never pruned on ...
    assert not judge(LogitGrowthPruner(), far)[0]
    assert LogitGrowthPruner().forecast(optuna.create_study(), far).value > 960
    # ... and it is pruned once the limit allows that distance.
    assert judge(LogitGrowthPruner(max_extrapolation=200), far)[0]
    # Rule: a target within 4× of the run's Σ η is judged: 2·(1 + Σ η)² reaches 37 tiny
    # logits in the run (below 80) and about 3.7e3 GPT-2 logits at Σ η 11.6 (above 960).
    near_steps = next(n for n in range(BUDGET, 50_000, 10)
                      if schedule_sum_eta(n, steps=n, peak=PEAK) > 3.5 * reached)
    near = running(law(2.0), **target(near_steps))
    assert judge(LogitGrowthPruner(), near)[0]
    with pytest.raises(ValueError, match=r"max_extrapolation must be a number >= 1 or null but got 0.5"):
        LogitGrowthPruner(max_extrapolation=0.5)


def test_the_outlook_is_what_the_forecast_rule_decides_on():
    # The law of the tests above, 0.1·(1 + Σ η)² tiny logits to Σ η 3.3, judged at a
    # far target (x165) and a near one (within max_extrapolation 4).
    history = law(0.1)
    reached = max(r["sum_eta"] for r in history)
    study = optuna.create_study()
    far = LogitGrowthPruner().outlook(study, running(history, **target(50_000)))
    # Rule: far past the run the forecast is above the threshold but not acted on, and the
    # rule does not prune; the outlook says so, with the forecast and the threshold.
    assert far.verdict == "above" and not far.acted_on and not judge(LogitGrowthPruner(), running(
        history, **target(50_000)))[0]
    assert far.threshold == 960 and far.to_go == pytest.approx(545.019 / reached, rel=1e-3)
    assert far.forecast.value == LogitGrowthPruner().forecast(study, running(history, **target(50_000))).value
    assert far.text().startswith("forecast 3.6e5 (3.6e5–3.6e5) at Σ η 545, above threshold 960 "
                                 "(10 × d/√d_head 96); Σ η ×166 past the run: a rough guide"), far.text()
    # Rule: near the run the same verdict is acted on, and the rule prunes.
    near_steps = next(n for n in range(BUDGET, 50_000, 10)
                      if schedule_sum_eta(n, steps=n, peak=PEAK) > 3.5 * reached)
    near = LogitGrowthPruner().outlook(study, running(law(2.0), **target(near_steps)))
    assert near.verdict == "above" and near.acted_on and "rough guide" not in near.text()
    assert judge(LogitGrowthPruner(), running(law(2.0), **target(near_steps)))[0]
    # Rule: no target on the trial, no outlook.
    assert LogitGrowthPruner().outlook(study, running(history)) is None


def test_a_plateau_is_not_pruned_however_long_the_target():
    # Attention learns (fast rise to ~50, 60% of tiny's threshold), then holds with 10%
    # noise: the forecast's lower end must stay below the threshold even 165x further on.
    for seed in range(20):
        rng = random.Random(seed)
        history = with_sum_eta(probes([50.0 * min(1.0, i / 8) * math.exp(rng.gauss(0, 0.1)) + 1
                                       for i in range(30)], start=10))
        trial = running(history, **target(50_000, scale=TINY))
        decision, why = judge(LogitGrowthPruner(max_extrapolation=None), trial)
        # Rule: a plateau below the threshold is never pruned by the forecast.
        assert not decision, f"seed {seed}: {why}"


def test_the_sigma_route_keeps_a_stiefel_run_whose_logits_creep():
    # Logits creeping linearly in Σ η from 20 to 86 (alignment, LayerNorm gains) while
    # σ_max(attn_qkv) stays 1: σ_Q·σ_K cannot grow, so the forecast holds the level.
    history = with_sum_eta(probes([20.0 + 2.0 * i for i in range(30)], start=10))
    for row in history:
        row["max_logit"] = 20.0 * (1.0 + row["sum_eta"])
    stiefel = with_sum_eta(history, sigma=lambda eta: 1.0)
    dgram = with_sum_eta(history, sigma=lambda eta: 1.0 + eta)
    attrs = target(50_000, scale=GPT2, proxy_scale=GPT2)
    # Rule: the same logits are pruned when σ_max grows with Σ η (DGram) and kept when
    # it is fixed (Stiefel).
    assert judge(LogitGrowthPruner(max_extrapolation=None), running(dgram, **attrs))[0]
    assert not judge(LogitGrowthPruner(max_extrapolation=None), running(stiefel, **attrs))[0]
    # Rule: without σ_max the logit fit alone decides: pruned.
    assert judge(LogitGrowthPruner(max_extrapolation=None), running(history, **attrs))[0]


def test_forecast_is_skipped_without_its_inputs():
    history = law(0.1)
    full = target(50_000)
    assert judge(LogitGrowthPruner(max_extrapolation=None), running(history, **full))[0]
    # Rule: no target_sum_eta on the trial (an older study): the forecast rule is skipped.
    no_target = {k: v for k, v in full.items() if k != "target_sum_eta"}
    assert not judge(LogitGrowthPruner(max_extrapolation=None), running(history, **no_target))[0]
    # Rule: no sum_eta in the probe rows: skipped.
    bare = [{k: v for k, v in row.items() if k != "sum_eta"} for row in history]
    assert not judge(LogitGrowthPruner(max_extrapolation=None), running(bare, **full))[0]
    # Rule: fewer than `window` rows with Σ η: skipped.
    assert not judge(LogitGrowthPruner(max_extrapolation=None, window=31), running(history, **full))[0]
    # Rule: interval=None turns the rule off.
    assert not judge(LogitGrowthPruner(max_extrapolation=None, interval=None), running(history, **full))[0]


def test_forecast_without_logit_scale_uses_the_absolute_threshold():
    history = law(0.1)
    attrs = {"target_sum_eta": target(50_000)["target_sum_eta"]}
    decision, why = judge(LogitGrowthPruner(max_extrapolation=None), running(history, **attrs))
    # Rule: without logit_scale the forecast (3.0e4 in the proxy's own logits) is compared
    # with max_logit (1e3); without target_steps the reason gives the target's Σ η.
    assert decision
    assert why == "forecast max logit 3.0e4 (3.0e4–3.0e4) at Σ η 545 > max_logit 1e+03"


def test_forecast_only_fits_points_after_warmup():
    history = law(0.1)
    attrs = target(50_000)
    # Rule: probe points before n_warmup_steps are not fitted: with all but 4 hidden, the
    # forecast has too few points (window 5).
    assert judge(LogitGrowthPruner(max_extrapolation=None, n_warmup_steps=260), running(history, **attrs))[0]
    assert not judge(LogitGrowthPruner(max_extrapolation=None, n_warmup_steps=270), running(history, **attrs))[0]


def test_probe_row_carries_the_forecasts_inputs():
    metrics = {"step": 40, "max_logit": 3.0, "min_entropy": 0.5, "train_loss": 4.2,
               "val_loss": None, "sigma_max": {"attn_qkv": 1.2}, "lr": 1e-3}
    # Rule: a row holds the probe keys, σ_max per type, and the Σ η given.
    assert probe_row(metrics, sum_eta=0.4) == {
        "step": 40, "max_logit": 3.0, "min_entropy": 0.5, "train_loss": 4.2,
        "sigma_max": {"attn_qkv": 1.2}, "sum_eta": 0.4}


def test_malformed_sigma_max_is_a_clear_error():
    # Rule: sigma_max must be a dict of module type -> value, said in words.
    with pytest.raises(ValueError, match=r"\['sigma_max'\] must be a dict"):
        judge(LogitGrowthPruner(), running([{"step": 1, "max_logit": 3.0, "sigma_max": 2.0}]))


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


OWN_END = {"target_sum_eta": schedule_sum_eta(BUDGET, steps=BUDGET, peak=PEAK),
           "target_steps": BUDGET}  # a target of the proxy run's own length


@pytest.mark.parametrize("seed", range(5))
def test_healthy_slowly_growing_run_is_never_pruned(seed):
    history = with_sum_eta(healthy_history(seed))
    pruner = LogitGrowthPruner()
    for n in range(1, len(history) + 1):  # as the objective asks at every probe step
        decision, why = judge(pruner, running(history[:n], **OWN_END))
        # Rule: a stable, slowly growing max logit (fast early rise, 10% noise) is never
        # pruned, at any probe step of the budget, forecast to the budget's end.
        assert not decision, f"false positive at step {history[n - 1]['step']}: {why}"


def test_unstable_run_is_pruned_before_its_logit_crosses_the_threshold():
    # Growing much faster than any Σ η law: x1.6 per 10 steps from step 60 on, reaching
    # 1e3 at step ~110.
    history = healthy_history(0)[:7]
    for step in range(70, BUDGET + 1, 10):
        last = history[-1]["max_logit"]
        history.append({"step": step, "max_logit": last * 1.6, "min_entropy": 0.5,
                        "train_loss": 4.0})
    history = with_sum_eta(history)
    pruner = LogitGrowthPruner()
    first = next(n for n in range(1, len(history) + 1)
                 if judge(pruner, running(history[:n], **OWN_END))[0])
    pruned_at = history[first - 1]
    # Rule: the forecast to the run's own end prunes it while its max logit is still
    # below max_logit.
    assert pruned_at["max_logit"] < 1e3
    assert pruner.reason(optuna.create_study(), running(history[:first], **OWN_END)).startswith(
        "forecast max logit")


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


# ---------------------------------------------------------------------- the stability rung
def stability_rows(logits, *, every=10, target_every=50):
    """A stability run's probe rows: each with the target's step at its Σ η²."""
    return [{**row, "target_step": (i + 1) * target_every}
            for i, row in enumerate(probes(logits, every=every, start=every))]


def test_the_stability_run_is_judged_on_measured_logits_at_the_targets_threshold():
    pruner = LogitGrowthPruner()
    # tiny proxy (S 8) for a GPT-2-small target (S 96): threshold 960 in the target's logits,
    # the proxy's logits × 12. 85 × 12 = 1,020 > 960: above; 75 × 12 = 900: below.
    over = running(stability_rows([20.0, 60.0, 85.0]), stability_run=True, **target(50_000))
    under = running(stability_rows([20.0, 60.0, 75.0]), stability_run=True, **target(50_000))
    pruned, why = judge(pruner, over)
    # Rule: measured, not forecast: the run ends at the target's Σ η², so its logits are the
    # target's; judged against the target's threshold, in the target model's units.
    assert pruned and why == ("unstable at your target: max logit 1.0e3 (the proxy's 85 × 12) at step 30 "
                              "of the stability rung > threshold 960 (10 × d/√d_head 96); near step 150 of your run")
    assert judge(pruner, under) == (False, None)
    # Rule: the same rows judged as a ladder rung use the proxy's threshold (80): pruned there.
    assert judge(pruner, running(stability_rows([20.0, 60.0, 85.0]), **target(50_000)))[0]


def test_a_measured_trial_is_not_judged_by_the_forecast_any_more():
    pruner = LogitGrowthPruner(max_extrapolation=None)
    growing = with_sum_eta(law(0.5, power=2.0))
    assert judge(pruner, running(growing, **target(50_000)))[1].startswith("forecast max logit")
    # Rule: once the stability rung measured the target's logits (stability_probes), the
    # ladder's rungs are judged on their own measured logits only: no forecast rule.
    measured = running(growing, stability_probes=stability_rows([1.0, 2.0]), **target(50_000))
    assert judge(pruner, measured) == (False, None)


def test_measured_reads_the_stability_rungs_probes_in_the_targets_logits():
    pruner = LogitGrowthPruner()
    study = optuna.create_study()
    t = running(probes([1.0]), stability_probes=stability_rows([20.0, 90.0, 85.0]), **target(50_000))
    m = pruner.measured(study, t)
    # Rule: last and peak in the target's logits (× 96/8), the first crossing's target step.
    assert (m.final, m.peak, m.threshold, m.crossed_at) == (pytest.approx(1020.0), pytest.approx(1080.0),
                                                            960.0, 100)
    assert m.verdict == "above"
    assert pruner.measured(study, running(probes([1.0]), **target(50_000))) is None
