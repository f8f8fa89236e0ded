"""A trial's recorded probe rows, as the pruner and the outlook read them (the probes
themselves are measured by :mod:`geosearch.proxy.probes`): the ``probe_history`` rows
the trial loop records (:func:`probe_row`), with the stability rung's (``stability_probes``)
a :class:`TrialProbes`, read back by step (:func:`read_probes`), and the proxy's and
target's d/√d_head the trial stores (:func:`stored_scales`). Torch-free.

The search keeps the rows in the trial's ``probes.json`` (not in user attrs: they would
fill ``optuna best-trial``): the trial loop hands them to the pruner while the trial runs,
and the outlook reads them back from that file. A trial that stores them as user attrs of
those names (a study built by hand) is read the same way (:meth:`TrialProbes.of`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from optuna.trial import FrozenTrial

from geosearch.util.checks import finite_or_none, is_positive, is_whole
from geosearch.search.records import (
    LOGIT_SCALE,
    PROBE_FIELDS,
    PROBE_HISTORY,
    STABILITY_PROBES,
    TARGET_LOGIT_SCALE,
)

__all__ = ["PROBE_KEYS", "QK_TYPES", "Probe", "TrialProbes", "non_finite", "parse_probes",
           "probe_row", "read_probes", "stored_scales"]

QK_TYPES = ("attn_qkv", "attn_q", "attn_k")
PROBE_KEYS = tuple(k for k in PROBE_FIELDS if k != "sum_eta")  # a row's keys from the metrics


def probe_row(metrics: Mapping, *, sum_eta: float | None) -> dict:
    """One ``probe_history`` row from a probe step's trainer metrics and its Σ η.

    Args:
        metrics: The trainer's metrics at a probe step (``geosearch.proxy.train``).
        sum_eta: Σ η after ``metrics["step"]`` optimizer steps (e.g. from
            :func:`~geosearch.search.horizon.forecast.schedule_sum_eta`), or ``None``.
    """
    row = {k: metrics.get(k) for k in PROBE_KEYS}
    row["sum_eta"] = sum_eta
    return row


@dataclass(frozen=True)
class Probe:
    """One probe step of a trial, its values parsed (``None``: not recorded or not finite
    where noted)."""

    step: int
    max_logit: float | None
    min_entropy: float | None
    train_loss: float | None
    sum_eta: float | None
    qk_sigma: float | None  # largest σ_max over QK_TYPES
    target_step: int | None = None  # a stability-rung probe: the target's step at its Σ η²


def non_finite(probes: list[Probe], values: Mapping[int, float]) -> str | None:
    """The first non-finite probe value or intermediate val loss, in words; ``None`` if none."""
    for p in probes:
        for name in ("train_loss", "max_logit", "min_entropy"):
            v = getattr(p, name)
            if v is not None and not math.isfinite(v):
                return f"non-finite {name} ({v}) at step {p.step}"
    for step in sorted(values):
        if not math.isfinite(values[step]):
            return f"non-finite val loss ({values[step]}) at step {step}"
    return None


@dataclass(frozen=True)
class TrialProbes:
    """A trial's probe rows: ``history`` (``probe_history``: its run's, the one the pruner
    judges, or at the end the first seed's at the top rung it reached) and ``stability``
    (``stability_probes``: its stability rung's; empty without one)."""

    history: list = field(default_factory=list)
    stability: list = field(default_factory=list)

    @classmethod
    def of(cls, record: Mapping) -> TrialProbes:
        """The rows under ``probe_history`` and ``stability_probes`` in ``record``: the
        trial's ``probes.json``, or the user attrs of a trial that stores them."""
        return cls(record.get(PROBE_HISTORY) or [], record.get(STABILITY_PROBES) or [])


def read_probes(trial: FrozenTrial, probes: TrialProbes | None = None) -> list[Probe]:
    """The trial's ``probe_history`` rows (``probes``'s, or its user attrs' when ``None``)
    as :class:`Probe` s, by step; ValueError on a malformed row."""
    probes = probes if probes is not None else TrialProbes.of(trial.user_attrs)
    return parse_probes(probes.history, PROBE_HISTORY)


def parse_probes(history: object, attr: str) -> list[Probe]:
    """Rows of probes (``probe_history``, or another attr of such rows named ``attr`` in
    errors) as :class:`Probe` s, by step; ValueError on a malformed row."""
    if not isinstance(history, (list, tuple)):
        raise ValueError(
            f"trial.user_attrs[{attr!r}] must be a list of dicts "
            f"but got {type(history).__name__}."
        )
    probes = []
    for i, row in enumerate(history):
        if not isinstance(row, Mapping) or not is_whole(row.get("step")):
            raise ValueError(
                f"trial.user_attrs[{attr!r}][{i}] must be a dict with an "
                f"integer 'step' but got {row!r}."
            )
        sigma = row.get("sigma_max")
        if sigma is not None and not isinstance(sigma, Mapping):
            raise ValueError(
                f"trial.user_attrs[{attr!r}][{i}]['sigma_max'] must be a dict "
                f"of module type -> sigma_max but got {sigma!r}."
            )
        qk = [float(sigma[t]) for t in QK_TYPES if sigma and sigma.get(t) is not None]
        qk = [v for v in qk if math.isfinite(v)]
        probes.append(
            Probe(
                step=int(row["step"]),
                max_logit=_optional_float(row.get("max_logit")),
                min_entropy=_optional_float(row.get("min_entropy")),
                train_loss=_optional_float(row.get("train_loss")),
                sum_eta=finite_or_none(row.get("sum_eta")),
                qk_sigma=max(qk) if qk else None,
                target_step=int(row["target_step"]) if is_whole(row.get("target_step")) else None,
            )
        )
    probes.sort(key=lambda p: p.step)
    return probes


def stored_scales(trial: FrozenTrial) -> tuple[float | None, float | None]:
    """(the proxy's, the target's) d/√d_head stored on the trial: the target's defaults to
    the proxy's, and without the proxy's neither is used (the logits cannot be converted)."""
    proxy, target = (trial.user_attrs.get(a) for a in (LOGIT_SCALE, TARGET_LOGIT_SCALE))
    if not is_positive(proxy):
        return None, None
    return float(proxy), float(target) if is_positive(target) else float(proxy)


def _optional_float(v: object) -> float | None:
    return None if v is None else float(v)  # type: ignore[arg-type]
