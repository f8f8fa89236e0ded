"""Which forecast rule comes closest to the long runs' final max logit, from a search's rungs?

The pruner forecasts a trial's max attention logit at its target with
``forecast_max_logit``: a law in log(σ₀ + Σ η) fitted on the latter half of a rung's probes
(Σ η at least half the rung's), the lower of the logit law and the σ route
(``docs/design.md``, "The instability signal"). This script replays the searches that
``fidelity.py --compare`` reads through that rule and through alternatives, each fed the
same stored probes of each rung, and divides each forecast by the long runs' real max logit
at the target (``fidelity.py --truth``: the ground truth never goes through a rule):

* ``pruner``: the pruner's own forecast (``LogitGrowthPruner().forecast``), as searched;
* ``logit law``: the same points, the logit law alone (no σ route);
* ``σ route``: the same points, the σ route alone (the logit's fitted level now times
  (σ_T/σ_t)², σ_T from the σ law, capped by the step bound σ_t + Σ η_T − Σ η_t);
* ``peak phase``: both routes, fitted only on probes taken while the step was at least half
  its peak, i.e. before the rung's cosine cooldown (at the cooldown's end a rung's logits
  flatten while a longer run's keep growing at full step; ``small`` 0.05 showed it).

Each ``DIR:MODEL:ETA`` names a search's run directory and its ground truth (2,000 steps).
Example (the five searches of docs/benchmarks.md's fidelity section)::

    python benchmarks/forecast_rules.py runs/fid-small-eq400:small:0.02 \\
        runs/fid-tiny-eq400:tiny:0.05 runs/fid-tiny-0.02-eq400:tiny:0.02 \\
        runs/fid-tiny-0.1-eq400:tiny:0.1 runs/fid-small-0.05:small:0.05
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import optuna

from _common import machine, publish  # benchmarks/ is on sys.path when a script runs
from fidelity import PAPER, _final_logit, _paper_key, load_truth
from geosearch.search.horizon.forecast import forecast_max_logit
from geosearch.search.horizon.probe_rows import QK_TYPES
from geosearch.search.horizon.pruner import DEFAULT_WINDOW, LogitGrowthPruner
from geosearch.search.records import (
    ASSIGNMENT,
    BASELINE,
    PROBE_HISTORY,
    PROXY,
    SEED_OF,
    TARGET_SUM_ETA,
    TRIAL_DIR,
)
from geosearch.search.records import read_rung_probes
from geosearch.search.runtime.storage import open_run_study

RULES = ("pruner", "logit law", "σ route", "peak phase")
PEAK_FRACTION = 0.5  # "peak phase": probes while the step was at least this part of its peak


def _rows(history: list[dict], target: float) -> tuple[list[float], list[float], list[float] | None, list[float]]:
    """Σ η, max logit, query/key σ_max (or None) and the step between probes, of the points
    the pruner fits on (a Σ η and a max logit)."""
    rows = [r for r in history if r.get("sum_eta") is not None and r.get("max_logit") is not None]
    rows.sort(key=lambda r: r["step"])
    eta = [float(r["sum_eta"]) for r in rows]
    logit = [float(r["max_logit"]) for r in rows]
    sigma = [max((r.get("sigma_max") or {}).get(t) or 0.0 for t in QK_TYPES) for r in rows]
    step = [(b - a) / max(1, rows[i + 1]["step"] - rows[i]["step"])
            for i, (a, b) in enumerate(zip(eta, eta[1:]))]
    return eta, logit, (sigma if all(s > 0 for s in sigma) else None), [step[0] if step else 0.0] + step


def forecast(rule: str, history: list[dict], target: float, peak: float) -> float | None:
    """One rule's forecast max logit at ``target`` Σ η from one rung's probe rows."""
    eta, logit, sigma, step = _rows(history, target)
    if rule == "peak phase":
        keep = [i for i, s in enumerate(step) if s >= PEAK_FRACTION * peak]
        eta, logit = [eta[i] for i in keep], [logit[i] for i in keep]
        sigma = None if sigma is None else [sigma[i] for i in keep]
    if len(eta) < DEFAULT_WINDOW:
        return None
    if rule == "σ route":
        if sigma is None:
            return None
        now = forecast_max_logit(eta, logit, eta[-1], min_points=DEFAULT_WINDOW)
        grown = forecast_max_logit(eta, sigma, target, min_points=DEFAULT_WINDOW)
        if now is None or grown is None:
            return None
        sigma_t = min(grown.value, sigma[-1] + max(0.0, target - eta[-1]))
        return now.value * (sigma_t / sigma[-1]) ** 2
    f = forecast_max_logit(eta, logit, target, sigma=None if rule == "logit law" else sigma,
                           min_points=DEFAULT_WINDOW)
    return None if f is None else f.value


def table(run_dir: str, model: str, eta: float, steps: int) -> tuple[list[str], dict[str, list[float]]]:
    """The ratio table of one search, and every rule's top-rung ratios."""
    truth = load_truth(model, steps, eta)
    study = open_run_study(run_dir)
    proxy = study.user_attrs.get(PROXY) or {}
    if (proxy.get("model"), proxy.get("spectral_lr")) != (model, eta):
        sys.exit(f"{run_dir}: the study's proxy is {proxy.get('model')}/{proxy.get('spectral_lr')}, "
                 f"not the ground truth's {model}/{eta}")
    pruner = LogitGrowthPruner()
    lines = [f"`{run_dir}`: `{model}` at spectral step {eta}, ground truth {steps} steps", "",
             "| assignment | real max logit | rung | " + " | ".join(RULES) + " |",
             "|---|---:|---|" + "---:|" * len(RULES)]
    top: dict[str, list[float]] = {r: [] for r in RULES}
    for t in sorted(study.get_trials(deepcopy=False), key=lambda t: t.number):
        key = _paper_key(t.user_attrs[ASSIGNMENT]) if ASSIGNMENT in t.user_attrs else None
        if (t.user_attrs.get(BASELINE) or key not in PAPER or t.user_attrs.get(SEED_OF) is not None
                or t.state.name not in ("COMPLETE", "PRUNED")):
            continue  # a baseline, another assignment, an extra seed (top rung only), or a failed run
        real = [v for v in (_final_logit(r) for r in truth.get(key, []) if r["status"] == "completed")
                if v is not None]
        rungs = read_rung_probes(Path(run_dir) / t.user_attrs.get(TRIAL_DIR, f"trials/{t.number}"))
        target = t.user_attrs.get(TARGET_SUM_ETA)
        if not real or not rungs or target is None:
            continue
        real_mean = statistics.fmean(real)
        for i, history in enumerate(rungs):
            cells = []
            for rule in RULES:
                if rule == "pruner":  # the pruner itself, on this rung's probes
                    frozen = optuna.trial.create_trial(
                        state=optuna.trial.TrialState.COMPLETE, value=0.0, params=t.params,
                        distributions=t.distributions, user_attrs=dict(t.user_attrs, **{PROBE_HISTORY: history}))
                    f = pruner.forecast(study, frozen)
                    v = None if f is None else f.value
                else:
                    v = forecast(rule, history, float(target), eta)
                cells.append("—" if v is None else f"{v / real_mean:.2f}")
                if v is not None and i == len(rungs) - 1:
                    top[rule].append(v / real_mean)
            lines.append(f"| {PAPER[key]} | {real_mean:.1f} | {i} | " + " | ".join(cells) + " |")
    return lines, top


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("searches", nargs="+", metavar="DIR:MODEL:ETA")
    parser.add_argument("--steps", type=int, default=2000, help="the ground truth's steps")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "forecast_rules.md")
    args = parser.parse_args(argv)
    lines = [machine(), "", "Forecast ÷ real max logit at the target (within ×2: 0.5 to 2).", ""]
    summary = ["| search | " + " | ".join(f"{r}: within ×2 at the top rung" for r in RULES) + " |",
               "|---|" + "---:|" * len(RULES)]
    total = {r: [0, 0] for r in RULES}
    for spec in args.searches:
        try:
            run_dir, model, eta = spec.rsplit(":", 2)
            eta_value = float(eta)
        except ValueError:
            sys.exit(f"{spec!r}: expected DIR:MODEL:ETA, e.g. runs/fid-small-eq400:small:0.02")
        rows, top = table(run_dir, model, eta_value, args.steps)
        lines += rows + [""]
        cells = []
        for r in RULES:
            hit = sum(0.5 <= x <= 2 for x in top[r])
            total[r][0] += hit
            total[r][1] += len(top[r])
            cells.append(f"{hit} of {len(top[r])}")
        summary.append(f"| `{model}` {eta} | " + " | ".join(cells) + " |")
    summary.append("| all | " + " | ".join(f"**{h} of {n}**" for h, n in total.values()) + " |")
    publish("\n".join(lines + summary), args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
