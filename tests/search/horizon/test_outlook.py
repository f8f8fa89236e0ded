"""geosearch.search.horizon.outlook: every assignment's forecast at the target, as the pruner judges it."""

from __future__ import annotations

from functools import partial

import optuna
import pytest
import yaml
from _search_helpers import FakeTrain, make_space, search, use_train
from optuna.trial import TrialState, create_trial

from geosearch.search.study.export import export_best, format_ranking
from geosearch.search.horizon.forecast import schedule_sum_eta
from geosearch.search.horizon.outlook import stability_lines, stability_record, stability_rows
from geosearch.search.space.spec import study_pruner
from geosearch.search.horizon.pruner import LogitGrowthPruner
from geosearch.search.records import read_probes_file
from geosearch.search.runtime.storage import open_run_study

optuna.logging.set_verbosity(optuna.logging.WARNING)

STEPS, PEAK, TARGET_STEPS = 300, 0.02, 1000
TINY = 8.0  # the tiny proxy's d/√d_head: threshold 80 at the default factor 10


def law(c: float, power: float, sum_eta: bool = True) -> list[dict]:
    """Probe rows of a 300-step run whose max logit is c·(1 + Σ η)^power."""
    rows = []
    for step in range(10, STEPS + 1, 10):
        eta = schedule_sum_eta(step, steps=STEPS, peak=PEAK)
        rows.append({"step": step, "max_logit": c * (1 + eta) ** power, "min_entropy": 1.0,
                     "train_loss": 3.0, "sum_eta": eta if sum_eta else None})
    return rows


def add(study: optuna.Study, history: list[dict], **attrs) -> int:
    number = len(study.trials)
    ua = {"probe_history": history, "target_sum_eta": schedule_sum_eta(TARGET_STEPS, steps=TARGET_STEPS, peak=PEAK),
          "target_steps": TARGET_STEPS, "logit_scale": TINY, "target_logit_scale": TINY,
          "assignment": {"attn_qkv": "dgram"}, **attrs}
    study.add_trial(create_trial(state=TrialState.COMPLETE, value=3.0, user_attrs=ua,
                                 params={"geometry.attn": f"g{number}"},
                                 distributions={"geometry.attn": optuna.distributions.CategoricalDistribution(
                                     ["g0", "g1", "g2", "g3"])}))
    return number


def test_each_trial_gets_the_pruners_outlook_and_its_last_max_logit():
    study = optuna.create_study()
    growing = add(study, law(1.0, 2.0))       # 19 at the run's end (Σ η 3.3), ~130 at Σ η 10.9
    flat = add(study, law(3.0, 0.0))          # a plateau at 3
    adamw = add(study, law(0.5, 0.0, sum_eta=False), baseline="adamw")
    pruner = LogitGrowthPruner()
    rows = stability_rows(study, [growing, flat, adamw], pruner)
    # Rule: each row carries the last probe's max logit and Σ η and the pruner's own outlook.
    assert [r.number for r in rows] == [growing, flat, adamw]
    assert rows[0].max_logit == pytest.approx(law(1.0, 2.0)[-1]["max_logit"])
    assert rows[0].sum_eta == pytest.approx(schedule_sum_eta(STEPS, steps=STEPS, peak=PEAK))
    frozen = {t.number: t for t in study.get_trials()}
    assert rows[0].outlook == pruner.outlook(study, frozen[growing])
    # Rule: the target 3.3x past the run is within max_extrapolation: the growth is judged
    # above 10 × d/√d_head, the plateau below it, both acted on.
    assert rows[0].outlook.verdict == "above" and rows[0].outlook.acted_on
    assert rows[1].outlook.verdict == "below" and rows[1].outlook.forecast.value == pytest.approx(3.0)
    # Rule: a baseline is labelled as one; AdamW has no Σ η, so no forecast, and says why.
    assert rows[2].label == "baseline adamw" and rows[2].outlook is None
    assert rows[2].text().endswith("no forecast: no Σ η (AdamW query/key weights take no spectral step)")
    lines = stability_lines(rows)
    assert lines[0].startswith("stability at your target") and len(lines) == 4
    assert "forecast" in lines[1] and "above threshold 80 (10 × d/√d_head 8)" in lines[1]


def test_nothing_to_forecast_prints_nothing():
    study = optuna.create_study()
    n = add(study, law(1.0, 2.0)[:3])  # 3 probes: fewer than the forecast's window of 5
    rows = stability_rows(study, [n], LogitGrowthPruner())
    assert rows[0].outlook is None and stability_lines(rows) == []


def test_the_studys_own_pruner_settings_judge(tmp_path):
    # Rule: the study's stored space decides the threshold (max_logit_factor 2: 16 tiny logits).
    space = make_space(pruner={"max_logit_factor": 2.0})
    study = optuna.create_study()
    study.set_user_attr("space", space.to_dict())
    assert study_pruner(study).outlook(study, create_trial(
        state=TrialState.COMPLETE, value=1.0, user_attrs={
            "probe_history": law(3.0, 0.0), "target_sum_eta": 10.0, "logit_scale": TINY})).threshold == 16.0
    # ... and an unreadable one gives the defaults.
    study.set_user_attr("space", {"version": 99})
    assert isinstance(study_pruner(study), LogitGrowthPruner)


def test_the_record_is_plain_yaml():
    study = optuna.create_study()
    rows = stability_rows(study, [add(study, law(1.0, 2.0)), add(study, law(1.0, 2.0)[:2])], LogitGrowthPruner())
    record = stability_record(rows[0])
    assert yaml.safe_load(yaml.safe_dump(record)) == record
    assert record["verdict"] == "above" and record["acted_on"] is True and record["threshold"] == 80.0
    assert record["low"] <= record["forecast"] <= record["high"] and record["text"] == rows[0].outlook.text()
    assert set(stability_record(rows[1])) == {"max_logit", "at_sum_eta"}  # no forecast: what was measured


@pytest.mark.slow
def test_the_search_prints_and_exports_the_outlook(monkeypatch, tmp_path):
    # A real (fake-trained) search: the ranking printed at its end and the exported file
    # carry each assignment's outlook; the fake's two probes are too few to forecast on.
    use_train(monkeypatch, FakeTrain(logits=lambda key, seed: 12.0))
    out = search(make_space(), tmp_path)
    study = open_run_study(tmp_path / "runs" / "t")
    rows = stability_rows(study, [r.number for r in out.ranking.rows], study_pruner(study),
                          partial(read_probes_file, tmp_path / "runs" / "t"))  # probes.json's
    assert all(r.max_logit == 12.0 and r.outlook is None for r in rows)
    # nothing forecast (the probes of probes.json are too few): no block
    assert "stability at your target" not in format_ranking(study, run_dir=tmp_path / "runs" / "t")
    best = yaml.safe_load(export_best(tmp_path / "runs" / "t", tmp_path / "b.yaml")[0].read_text())
    assert best["provenance"]["stability"]["max_logit"] == 12.0
