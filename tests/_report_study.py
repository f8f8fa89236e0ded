"""Hand-made finished studies in the search's run-directory layout, for the report tests.

``add`` writes one finished trial as the search stores it (user attrs, intermediate values,
``trials/<n>/metrics.jsonl``, its losses and probes at each rung of the ladder);
``new_study`` creates the study with its study attrs (with ``ladder=True``, a target and a
two-rung ladder); the ``finished`` fixture is a small study with every outcome and a ladder.
No training happens.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import optuna
import pytest
from optuna.distributions import CategoricalDistribution, FloatDistribution
from optuna.trial import TrialState, create_trial

from geosearch.search.records import write_probes_file, write_rung_probes

optuna.logging.set_verbosity(optuna.logging.WARNING)

GEOS = ["stiefel", "dgram", "adamw", "euclidean"]
DISTS = {"geometry.attn": CategoricalDistribution(GEOS), "geometry.mlp": CategoricalDistribution(GEOS)}
TYPES = {"attn": ("attn_qkv", "attn_out"), "mlp": ("mlp_in", "mlp_out")}
PNG = b"\x89PNG\r\n\x1a\n"
# the study's ladder: rung 0 the 40-step proxy run, rung 1 at 4x its spectral step; the target
TARGET = {"steps": 160, "spectral_lr": 0.02, "model": "tiny", "sum_eta": 1.8}
LADDER = [{"index": 0, "steps": 40, "spectral_lr": 0.02, "sum_eta": 0.45},
          {"index": 1, "steps": 40, "spectral_lr": 0.08, "sum_eta": 1.8}]


def _assignment(attn: str, mlp: str) -> dict[str, str]:
    return {t: g for fam, g in (("attn", attn), ("mlp", mlp)) for t in TYPES[fam]}


def _metrics(steps: int, logit_growth: float, loss0: float, sigma: float) -> list[dict]:
    return [
        {
            "step": s,
            "train_loss": loss0 + 1 - s / steps,
            "val_loss": loss0 + 1 - s / steps,
            "step_ms": 10.0,
            "max_logit": 5.0 * logit_growth ** (s / 10),
            "sigma_max": {t: sigma * (1 + s / steps) for ts in TYPES.values() for t in ts},
        }
        for s in range(0, steps + 1, 10)
    ]


def add(
    study: optuna.Study,
    run_dir: Path,
    attn: str,
    mlp: str,
    losses: list[float] | None = None,
    *,
    state: TrialState = TrialState.COMPLETE,
    step_ms: float = 10.0,
    steps: int = 40,
    attrs: dict | None = None,
    params: dict | None = None,
    metrics: bool = True,
    seeds_dirs: bool = False,
) -> int:
    """Add one finished trial in the study.py layout, with its metrics.jsonl; returns its number."""
    number = len(study.trials)
    status = {TrialState.COMPLETE: "completed", TrialState.PRUNED: "unstable", TrialState.FAIL: "failed"}
    ua = {
        "status": status[state],
        "assignment": _assignment(attn, mlp),
        "budget_steps": steps,
        "mean_step_ms": step_ms,
        "tokens_per_s": 1000.0 * 2048 / step_ms,
        "trial_dir": f"trials/{number}",
    }
    if losses is not None:
        ua.update(val_losses=losses, seeds=list(range(len(losses))))
    if losses is not None and "ladder" in study.user_attrs:
        # rung 0 is 0.5 higher, more so for stiefel attention: the rungs' order differs
        rung0 = [v + 0.5 + (0.3 if attn == "stiefel" else 0.0) for v in losses]
        ua.update(rung_losses=[rung0, losses])
        # the trial's file, as the search writes it
        write_rung_probes(run_dir / f"trials/{number}", [
            [{"step": s_, "max_logit": 5.0 * (1 + k) * (1 + s_ / 10), "sum_eta": r["sum_eta"] * s_ / steps}
             for s_ in range(10, steps + 1, 10)] for k, r in enumerate(LADDER)])
    ua.update(attrs or {})
    rows = {k: ua.pop(k) for k in ("probe_history", "stability_probes") if k in ua}
    if rows:  # the trial's probes.json, as the search writes it (no user attrs)
        write_probes_file(run_dir / f"trials/{number}", rows)
    p = {"geometry.attn": attn, "geometry.mlp": mlp, **(params or {})}
    d = {**DISTS, **{k: FloatDistribution(1e-3, 1e-1, log=True) for k in (params or {})}}
    value = sum(losses) / len(losses) if (losses and state == TrialState.COMPLETE) else None
    inter = {ua.get("stop_step", steps): 9.0} if state == TrialState.PRUNED else {}
    study.add_trial(create_trial(params=p, distributions=d, value=value, state=state,
                                 user_attrs=ua, intermediate_values=inter))
    if metrics:
        last = ua.get("stop_step", steps)
        growth = 3.0 if attn == "dgram" else 1.1
        recs = _metrics(last, growth, losses[0] if losses else 5.0, 1.0 if attn != "dgram" else 2.0)
        dirs = [Path(f"trials/{number}/seed{s}") for s in range(2)] if seeds_dirs else [Path(f"trials/{number}")]
        for d_ in dirs:
            (run_dir / d_).mkdir(parents=True, exist_ok=True)
            (run_dir / d_ / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in recs) + "\n")
    return number


def new_study(run_dir: Path, name: str = "demo", space: dict | None = None,
              ladder: bool = False) -> optuna.Study:
    run_dir.mkdir(parents=True, exist_ok=True)
    study = optuna.create_study(storage=f"sqlite:///{run_dir}/study.db", study_name=name)
    study.set_user_attr("space", {"pruner": {"max_logit": 500.0}} if space is None else space)
    study.set_user_attr("geosearch_version", "0.1.0")
    study.set_user_attr("proxy", {"model": "tiny", "steps": 40, "batch": 8})
    if ladder:
        study.set_user_attr("target", TARGET)
        study.set_user_attr("ladder", LADDER)
    return study


@pytest.fixture
def finished(tmp_path: Path) -> Path:
    """A small finished study: 4 completed (3 seeds), 1 unstable, 1 failed."""
    run = tmp_path / "runs" / "demo"
    s = new_study(run, ladder=True)
    add(s, run, "stiefel", "dgram", [3.30, 3.32, 3.31], step_ms=16.0)
    add(s, run, "stiefel", "stiefel", [3.40, 3.42, 3.41], step_ms=16.0)
    add(s, run, "euclidean", "euclidean", [3.50, 3.52, 3.51], step_ms=13.0, seeds_dirs=True)
    add(s, run, "adamw", "adamw", [3.60, 3.62, 3.61], step_ms=10.0)
    add(s, run, "dgram", "dgram", state=TrialState.PRUNED,
        attrs={"stop_step": 20, "prune_reason": "max logit 1.2e+03 > 500 at step 20 (layer 0)"})
    add(s, run, "dgram", "stiefel", state=TrialState.FAIL, metrics=False,
        attrs={"fail_reason": "RuntimeError: CUDA out of memory"})
    return run


def row(text: str, *cells: object) -> bool:
    """Whether a markdown table row holds these cells next to each other."""
    pattern = r"\|\s*" + r"\s*\|\s*".join(re.escape(str(c)) for c in cells) + r"\s*\|"
    return re.search(pattern, text) is not None
