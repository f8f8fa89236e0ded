"""Each assignment's max attention logit at the user's target: the stability outlook.

With a stability rung (``ladder.stability_steps``; docs/design.md, "The stability rung")
each trial's logit at the target is *measured*, by a run that ends at the target's Σ η²
(:meth:`~geosearch.search.horizon.pruner.LogitGrowthPruner.measured`), and that is what is
shown. Without one it is forecast:

The stability pruner forecasts a trial's max logit at the target's Σ η and prunes only
what is clearly above the target's threshold and near enough to the data
(:meth:`~geosearch.search.horizon.pruner.LogitGrowthPruner.outlook`). The user needs the same
forecast for every assignment the search kept, and for the baselines: "all-DGram is
forecast at 2.1e3 by your step 50,000, above 960". This module reads it off a finished
study with the study's own pruner settings, for the printed summary, the report and the
exported assignment's provenance. How far such a forecast can be trusted is measured in
``docs/benchmarks.md`` (``fidelity.py``, ``forecast_rules.py``): from a rung 5× short of the
target in Σ η it was within ×2 of 2,000-step runs for 12 of 20.

Example:
    >>> rows = stability_rows(study, [0, 3], study_pruner(study))                  # doctest: +SKIP
    >>> print("\\n".join(stability_lines(rows)))                # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import optuna
from optuna.trial import FrozenTrial

from geosearch.util.checks import finite_or_none
from geosearch.search.horizon.forecast import Measured, Outlook, short_logit
from geosearch.search.horizon.probe_rows import TrialProbes
from geosearch.search.horizon.pruner import LogitGrowthPruner
from geosearch.search.stats.trials import trial_label
from geosearch.search.records import (
    BASELINE,
    LOGIT_SCALE,
    PROXY,
    STABILITY_FROM,
    TARGET_LOGIT_SCALE,
)

__all__ = ["StabilityRow", "stability_lines", "stability_record", "stability_rows"]


@dataclass(frozen=True)
class StabilityRow:
    """One trial's last measured max logit and its outlook at the target.

    Attributes:
        number: The trial.
        label: Its assignment (or ``baseline <name>``).
        max_logit: The last probed max logit of its first seed at the top rung it reached,
            in the proxy's logits; ``None`` without probes.
        sum_eta: Σ η at that probe (``None`` for a run that takes no spectral step).
        outlook: The forecast at the target against the threshold; ``None`` when there is
            nothing to fit (too few probes, no Σ η, no target).
        scale_ratio: The target model's d/√d_head over the proxy's: the outlook is in the
            target's logits, ``max_logit`` in the proxy's (1 when the target is the proxy's
            model or a scale is unknown).
        measured: The max logit its stability rung measured at the target's Σ η², in the
            target's logits; ``None`` without a stability rung (then ``outlook`` forecasts).
        measured_by: With step halving, the trial at a larger step whose stability rung
            stands for this one's (``measured`` is that rung's, which ends past this
            trial's target Σ η²); ``None``: its own.
    """

    number: int
    label: str
    max_logit: float | None
    sum_eta: float | None
    outlook: Outlook | None
    scale_ratio: float = 1.0
    measured: Measured | None = None
    measured_by: int | None = None

    def text(self) -> str:
        """One line: the trial, what it measured, and its outlook."""
        m = self.measured
        if m is not None and self.measured_by is not None:
            return (f"{self.label} (trial {self.number}): measured past your target's Σ η² by the "
                    f"stability rung of trial {self.measured_by}, at a larger step (step halving): max "
                    f"logit {short_logit(m.final)} (peak {short_logit(m.peak)}), below {m.threshold_text}")
        if m is not None:
            return f"{self.label} (trial {self.number}): {m.text()}"
        now = ("no max logit probed" if self.max_logit is None else
               f"max logit {short_logit(self.max_logit)}"
               + (f" at Σ η {self.sum_eta:.3g}" if self.sum_eta is not None else ""))
        if self.outlook is not None:
            later = self.outlook.text()
        elif self.max_logit is not None and self.sum_eta is None:
            later = "no forecast: no Σ η (AdamW query/key weights take no spectral step)"
        else:
            later = "no forecast: too few probes, or no target"
        return f"{self.label} (trial {self.number}): {now}; {later}"


def stability_rows(study: optuna.Study, numbers: Iterable[int], pruner: LogitGrowthPruner,
                   probes_of: Callable[[FrozenTrial], Mapping] | None = None,
                   ) -> list[StabilityRow]:
    """The outlook of each trial in ``numbers`` (in that order), from its probes.

    Args:
        study: A study the search ran (its trials store target Σ η and logit scales).
        numbers: The trials to read, e.g. the ranked ones and the baselines.
        pruner: Judge with this pruner: the study's own is
            :func:`geosearch.search.space.spec.study_pruner`.
        probes_of: Where a trial's probe rows are (a mapping with ``probe_history`` and
            ``stability_probes``): the search keeps them in the trial's ``probes.json``
            (``functools.partial(read_probes_file, run_dir)``,
            :func:`geosearch.search.records.read_probes_file`); ``None``: its user
            attrs (a study built by hand).
    """
    by_number = {t.number: t for t in study.get_trials(deepcopy=False)}
    record = study.user_attrs.get(PROXY)  # a baseline of a step grid is labelled with its step
    def read(t: FrozenTrial) -> TrialProbes:
        return TrialProbes.of(probes_of(t) if probes_of is not None else t.user_attrs)

    rows = []
    for n in numbers:
        t = by_number[n]
        held = read(t)
        probes = [p for p in held.history
                  if isinstance(p, dict) and finite_or_none(p.get("max_logit")) is not None]
        last = probes[-1] if probes else {}
        base = t.user_attrs.get(BASELINE)
        proxy, target = (finite_or_none(t.user_attrs.get(k)) for k in (LOGIT_SCALE, TARGET_LOGIT_SCALE))
        measured, by = pruner.measured(study, t, held), t.user_attrs.get(STABILITY_FROM)
        if measured is None and isinstance(by, int) and by in by_number:  # step halving's
            measured = pruner.measured(study, by_number[by], read(by_number[by]))
        rows.append(StabilityRow(
            number=n, label=trial_label(t, proxy=record) if base else trial_label(t, hyperparams=False),
            max_logit=finite_or_none(last.get("max_logit")), sum_eta=finite_or_none(last.get("sum_eta")),
            outlook=pruner.outlook(study, t, held),
            scale_ratio=target / proxy if proxy and target else 1.0, measured=measured,
            measured_by=by if measured is not None and isinstance(by, int) else None))
    return rows


def stability_lines(rows: list[StabilityRow]) -> list[str]:
    """The outlook as the search prints it: a heading and one line a trial, or nothing."""
    if any(r.measured is not None for r in rows):
        return ["stability at your target (max logit in the target model's logits, measured by the "
                "stability rung, which ends at your run's Σ η²: docs/design.md, \"The stability rung\"):",
                *(f"  {r.text()}" for r in rows)]
    if not any(r.outlook is not None for r in rows):
        return []
    return ["stability at your target (forecast max logit in the target model's logits, 90% interval; "
            "a forecast far past the run is a rough guide: docs/benchmarks.md):",
            *(f"  {r.text()}" for r in rows)]


def stability_record(row: StabilityRow) -> dict[str, Any]:
    """A row as an exported assignment's provenance records it (YAML-safe)."""
    record: dict[str, Any] = {"max_logit": row.max_logit, "at_sum_eta": row.sum_eta}
    m = row.measured
    if m is not None:
        record["measured"] = {"final": m.final, "peak": m.peak, "threshold": m.threshold,
                              "verdict": m.verdict, "crossed_at_step": m.crossed_at, "text": m.text()}
        if row.measured_by is not None:
            record["measured"] |= {"by_trial": row.measured_by, "text": row.text()}
    o = row.outlook
    if o is not None:
        record |= {"forecast": o.forecast.value, "low": o.forecast.low, "high": o.forecast.high,
                   "level": o.forecast.level, "target_sum_eta": o.forecast.target_sum_eta,
                   "threshold": o.threshold, "verdict": o.verdict, "acted_on": o.acted_on,
                   "text": o.text()}
    return record
