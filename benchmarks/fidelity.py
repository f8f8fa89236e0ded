"""Does a search answer for the user's training length? Ground truth from long runs.

The ground truth: every assignment of a space (default: the reference study's four, attention
and MLP each Stiefel or DGram) trained on the proxy for the full target length, several
seeds each, with the proxy's schedule and settings. Each run is stored as one JSON file in
``benchmarks/data/fidelity/`` (the final validation loss, the max-logit and σ_max history
against Σ η, the cost), keyed by its settings, so an interrupted benchmark resumes and the
ground truth is measured once per setting and kept with the repository.

The searches under test (``--search``) are then compared against it: same winner,
Spearman over the assignments, signs of the main effects, compute as a fraction of the
ground truth's, and the forecast max logit at the target against the real one.

Usage::

    python benchmarks/fidelity.py --truth --eta 0.02 --steps 2000 --seeds 0 1   # ~45 min, 2 cores
    python benchmarks/fidelity.py --truth --model mini --eta 0.02               # the default's, ~15 min
    python benchmarks/fidelity.py --truth --eta 0.05 --steps 2000 --seeds 0 1
    python benchmarks/fidelity.py --show --eta 0.02 --steps 2000                 # the table so far
    geosearch search --study fid002 --runs-dir runs                             # the search under test
    python benchmarks/fidelity.py --compare runs/fid002 --eta 0.02 --steps 2000
    python benchmarks/fidelity.py --compare runs/fid-mini-for-small --model mini   # its target's truth
    python benchmarks/fidelity.py --truth --eta 0.02 --steps 1000 --seeds 0 1   # a shorter length
    python benchmarks/fidelity.py --lengths --eta 0.02 --steps 2000             # its order vs 2,000's
    python benchmarks/fidelity.py --truth --eta 0.02 --steps 2000 --model-arg n_embd=32  # a narrow copy
    python benchmarks/fidelity.py --widths --eta 0.02 --steps 2000              # its order vs the model's
    python benchmarks/fidelity.py --curve --model mini --eta 0.02               # the order along the long runs
    python benchmarks/fidelity.py --truth --setting llama-gqa --eta 0.02        # beyond GPT-2
    python benchmarks/fidelity.py --compare runs/fid-llama-gqa --setting llama-gqa --eta 0.02
    python benchmarks/fidelity.py --compare runs/roles-tiny-0.05 --model tiny --eta 0.05  # roles

The default problem, ``mini`` at 0.02 (stop 26, 2026-12-02). The default search on ``small``
took 1,186 s on two cores and its ranked runs alone (4 × 2 × 400 steps) about 10 minutes, so no
ladder on ``small`` meets the 10-minute target. The default proxy became ``mini`` (``small`` at
half its width and context: 4 layers, width 64, context 64), the size chosen for the time
alone (an all-DGram step: 60 ms against ``small``'s 262) before any run of it was trained.
Prediction, written before its long runs and its search (``--truth --model mini --eta 0.02``,
then the default search, timed, and ``--compare``):

1. The long runs: all-DGram best, as at ``small`` 0.02, ``tiny`` 0.02 and ``small``'s width-64
   copy at 0.02; no run above the threshold (10 × 64/√16 = 160; the width-64 copy of ``small``
   peaked at 35).
2. The search: the long runs' best named; nothing pruned; stability decisions 4 of 4; DGram
   attention's measured max logit within ×2 of the long runs'; Spearman below 0.8 (the 400-step
   orders on ``small`` 0.02 had 0.40).
3. The default search's wall time 300–450 s (about 6,600 steps at 45 ms a step, plus setup).

Beyond GPT-2 (stop 30, 2026-12-03): two proxies of other families, :data:`SETTINGS`, chosen
before any run of them was trained, for the time alone (a 2,000-step run in about 1.5 and 2.5
minutes on one loaded thread), at the default search's spectral step 0.02 (``--setting NAME
--truth``, then ``geosearch search --model SPEC --model-arg ...`` with the default space and
``--compare RUN --setting NAME``). ``llama-gqa``: ``hf:llama``, 2 layers, width 64, 4 query
heads sharing 2 key-value heads (grouped-query attention), rotary embeddings, SwiGLU MLP of
176, context 32; rule set ``llama``, so attention's geometry is on each of Q, K, V and O, not
on a stacked QKV as in ``nanogpt``. ``mixtral-moe``: ``hf:mixtral`` at the same sizes, its
MLP 4 experts of width 112 routed top-2 (each token's active MLP width 224), no auxiliary
loss; rule set ``mixtral``: ``mlp`` is the experts' matrices, the routers stay AdamW in all
four. Threshold at both: 10 × 64/√16 = 160. Prediction, written before their runs:

1. The long runs: all-DGram best at both, in the order all-DGram, DGram-attn + Stiefel-MLP,
   Stiefel-attn + DGram-MLP, all-Stiefel (the order at ``tiny``, ``mini`` and ``small`` 0.02:
   a step this small leaves DGram's free column norms room to help before its logits grow).
   No run above the threshold: DGram attention's peak max logit below 80 (the GPT-2 proxies
   peaked at 6.5–22 at 0.02). On ``llama-gqa`` DGram attention's lead smaller than on
   ``mini`` (0.076): per-matrix Stiefel keeps each of Q and K at σ = 1, about 3× the q·k
   scale of a stacked Stiefel QKV, so Stiefel attention is less starved of logit scale. On
   ``mixtral-moe`` the MLP's effect (DGram better) larger than on ``llama-gqa``: each
   expert's output is scaled down by its router weight (< 1), which DGram's norms can make
   up for and Stiefel's σ = 1 cannot.
2. The searches: the long runs' best named at both; nothing pruned; stability decisions 4 of
   4 at both; Spearman 0.4–0.8 (the 400-step rung at 0.02 scored 0.40, 0.80 and 0.80 on the
   GPT-2 proxies: the attention factor ordered right, one pair within it swapped); compute
   0.25–0.35 of the long runs' (the stability rung and 2 seeds of 400 steps, at most an
   adaptive seed or two).

Measured (``docs/benchmarks.md``, "Beyond GPT-2"): Stiefel attention best at both (all-DGram
third), DGram attention's max logits peaking at 70–117, below 160; both searches named a wrong first
(three-way ties at 400 steps), Spearman −0.40 at both; decisions 4 of 4; compute 0.325, 0.350.

The comparison reads the study as the tool does (its ranking at the top rung, its main
effects, the pruner's forecast at the target) and never uses the ground truth to choose
anything. The forecast is checked three ways: the pruner's forecast from the search's top
rung (what the tool reports), from its first rung only (the proxy run's Σ η, extrapolated
to the target's), and from the first 10% of each long run itself (same run, same
schedule: a test of the law alone).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import optuna
import torch

from _common import machine, publish  # benchmarks/ is on sys.path when a script runs
from geosearch.assignment import Assignment
from geosearch.proxy.config import TrainConfig
from geosearch.models.zoo import default_rules
from geosearch.proxy.train import train
from geosearch.rules.modules import get_rule_set, rule_set_names
from geosearch.search.horizon.forecast import forecast_max_logit
from geosearch.search.horizon.ladder import spearman
from geosearch.search.horizon.probe_rows import QK_TYPES
from geosearch.search.horizon.pruner import LogitGrowthPruner
from geosearch.search.stats.ranking import rank_scores
from geosearch.search.stats.study_ranking import rank_study
from geosearch.search.records import (
    ASSIGNMENT,
    BASELINE,
    LADDER,
    PROBE_HISTORY,
    PROXY,
    PRUNE_REASON,
    PRUNED_RUNG,
    RUNG_INDICES,
    RUNG_LOSSES,
    SEED_OF,
    SPACE,
    STABILITY,
    STABILITY_PROBES,
    STOP_STEP,
    TARGET,
    TRIAL_DIR,
)
from geosearch.search.stats.pooled import main_effects
from geosearch.search.stats.scores import Point, Score
from geosearch.search.stats.trials import trial_label
from geosearch.search.horizon.reading import study_reading
from geosearch.search.horizon.target import probe_sum_eta
from geosearch.search.horizon.probe_rows import TrialProbes
from geosearch.search.records import read_probes_file, read_rung_probes
from geosearch.search.runtime.storage import open_run_study

DATA = Path(__file__).parent / "data" / "fidelity"
PAPER = {  # the reference study's four assignments (rule set nanogpt: c_attn is one type)
    "attn=stiefel,mlp=stiefel": "all-Stiefel",
    "attn=stiefel,mlp=dgram": "Stiefel-attn + DGram-MLP",
    "attn=dgram,mlp=stiefel": "DGram-attn + Stiefel-MLP",
    "attn=dgram,mlp=dgram": "all-DGram",
}


SETTINGS: dict[str, tuple[str, dict[str, int]]] = {
    "llama-gqa": ("hf:llama", dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=4,
                                   num_key_value_heads=2, intermediate_size=176, block_size=32)),
    "mixtral-moe": ("hf:mixtral", dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=4,
                                       num_key_value_heads=2, intermediate_size=112,
                                       num_local_experts=4, num_experts_per_tok=2, block_size=32)),
}
"""Named proxies beyond GPT-2 (``--setting NAME``): name -> (model spec, model args), chosen
and written down before their long runs (the prediction in the module docstring)."""


EVALS = 20
"""Validation points of a ground-truth run trained now (every 5% of it). Runs stored before
stop 26 have 4 (every 25%); :func:`load_truth` matches runs on everything else."""


def truth_config(model: str, steps: int, eta: float, seed: int, model_args: dict | None = None,
                 evals: int = EVALS) -> TrainConfig:
    """A ground-truth run: the default space's proxy settings at the target length, with a
    finer validation (16 fixed batches, ``evals`` times) and probes every 1% of the run;
    ``model_args`` change the model (e.g. ``n_embd`` for a narrower copy)."""
    return TrainConfig(model=model, steps=steps, spectral_lr=eta, seed=seed, batch_size=16,
                       eval_every=max(1, steps // evals), eval_batches=16,
                       probe_every=max(1, steps // 100), solver="project", model_args=dict(model_args or {}))


def assignment_for(model: str, assign: str, model_args: dict | None = None) -> Assignment:
    """``assign`` (``attn=...,mlp=...``) read with the model's own rules: ``nanogpt`` for the
    presets, the family's rule set for ``hf:`` models (``llama``, ``mixtral``, ...)."""
    return Assignment.parse(assign, rules=default_rules(model, model_args) or "nanogpt")


def run_key(config: TrainConfig, assign: str) -> str:
    blob = json.dumps({"config": config.to_dict(), "assign": assign}, sort_keys=True)
    return hashlib.sha1(blob.encode()).hexdigest()[:12]


def _commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              cwd=Path(__file__).parent, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def run_truth(model: str, steps: int, eta: float, seeds: list[int], only: list[str] | None = None,
              model_args: dict | None = None) -> None:
    """Train every missing ground-truth run (of the ``only`` assignments) and store it."""
    DATA.mkdir(parents=True, exist_ok=True)
    print(machine())
    stored = load_truth(model, steps, eta, model_args)
    for seed in seeds:
        for assign in [a for a in PAPER if only is None or a in only]:
            config = truth_config(model, steps, eta, seed, model_args)
            path = DATA / f"{run_key(config, assign)}.json"
            if any(r["config"]["seed"] == seed for r in stored[assign]):  # any validation spacing
                print(f"have  {assign} seed {seed}")
                continue
            t0 = time.perf_counter()
            result = train(config, assignment_for(model, assign, model_args), progress=False)
            probes = [{"step": m["step"], "max_logit": m.get("max_logit"), "sigma_max": m.get("sigma_max"),
                       "lr": m.get("lr"), "val_loss": m.get("val_loss")}
                      for m in result.history if m.get("max_logit") is not None]
            record = {"assign": assign, "config": config.to_dict(), "status": result.status,
                      "reason": result.reason, "final_val_loss": result.final_val_loss,
                      "mean_step_ms": result.mean_step_ms, "wall_s": time.perf_counter() - t0,
                      "probes": probes, "commit": _commit(), "torch": torch.__version__}
            path.write_text(json.dumps(record, indent=1), encoding="utf-8")
            print(f"done  {assign} seed {seed}: {result.status}, val {result.final_val_loss}, "
                  f"{record['wall_s']:.0f} s -> {path.name}")


def load_truth(model: str, steps: int, eta: float, model_args: dict | None = None) -> dict[str, list[dict]]:
    """assignment -> its stored ground-truth runs (any seeds) at these settings (the
    model's own sizes unless ``model_args`` are given)."""
    out: dict[str, list[dict]] = {a: [] for a in PAPER}
    for path in sorted(DATA.glob("*.json")):
        rec = json.loads(path.read_text(encoding="utf-8"))
        c = rec["config"]
        if ((c["model"], c["steps"], c["spectral_lr"]) == (model, steps, eta) and rec["assign"] in out
                and (c.get("model_args") or {}) == (model_args or {})):
            out[rec["assign"]].append(rec)
    return out


def show_truth(model: str, steps: int, eta: float, model_args: dict | None = None) -> None:
    truth = load_truth(model, steps, eta, model_args)
    print(f"ground truth: {model}{f' {model_args}' if model_args else ''}, {steps} steps, spectral lr {eta}")
    rows = []
    for assign, recs in truth.items():
        losses = [r["final_val_loss"] for r in recs if r["status"] == "completed"]
        peak = max((p["max_logit"] for r in recs for p in r["probes"]), default=float("nan"))
        mean = statistics.fmean(losses) if losses else float("nan")
        rows.append((mean, assign, losses, peak))
    for mean, assign, losses, peak in sorted(rows):
        print(f"  {PAPER[assign]:26s} {mean:.4f}  seeds {[round(x, 4) for x in losses]}  peak max logit {peak:.1f}")


# ============================================================================ the comparison
LAW_FRACTIONS = (0.05, 0.1, 0.25, 0.5)


def truth_scores(truth: dict[str, list[dict]]) -> dict[str, Score]:
    """assignment -> its long runs' final val losses with their seeds; an assignment with
    no completed run is left out (so ``len(...) < len(PAPER)`` says the truth is missing)."""
    return {a: Score.of([r["final_val_loss"] for r in done], [r["config"]["seed"] for r in done])
            for a, recs in truth.items() if (done := [r for r in recs if r["status"] == "completed"])}


def _point(assign: str) -> Point:
    return Point(dict(kv.split("=") for kv in assign.split(",")))


def family_of(module_type: str) -> str:
    """A module type's family in the rules that have it (an MoE model's ``moe_gate``,
    ``moe_in``, ``moe_out`` are ``mlp``'s; its ``router`` is neither), else its prefix."""
    families = {t: r.family for name in rule_set_names() for r in get_rule_set(name)
                for t in r.types}
    return families.get(module_type, module_type.split("_")[0])


def group_key(resolved: dict[str, str], groups: tuple[str, ...],
              group_of: Callable[[str], str]) -> str:
    """``G1=g,G2=g`` of a resolved assignment (type -> geometry), each type in its group
    (``group_of``); ``mixed`` for a group whose types differ, ``?`` for one with none."""
    key = []
    for f in groups:
        found = {g for t, g in resolved.items() if group_of(t) == f}
        key.append(f"{f}={found.pop() if len(found) == 1 else 'mixed' if found else '?'}")
    return ",".join(key)


def _paper_key(resolved: dict[str, str]) -> str:
    """``attn=G,mlp=G`` of a resolved assignment, each type in its rules' family."""
    return group_key(resolved, ("attn", "mlp"), family_of)


@dataclass(frozen=True)
class Points:
    """The points :func:`compare` scores a study on: key -> label (in the order the table
    lists them), the key of a trial's resolved assignment (a key not in ``labels`` is not
    scored), and the long runs of each key at ``(model, steps, eta, model_args)``."""

    labels: dict[str, str]
    key_of: Callable[[dict[str, str]], str]
    truth: Callable[..., dict[str, list[dict]]]


def points_of(study) -> Points:
    """The reference study's four (:data:`PAPER`, this script's long runs), or for a study
    whose space searches a role (``attn_qk``, ``attn_vo``) the eight role points and
    ``roles.py``'s long runs."""
    from geosearch.rules.roles import ROLES

    geometries = (study.user_attrs.get(SPACE) or {}).get("geometries") or {}
    if not any(k in ROLES for k in geometries):
        return Points(PAPER, _paper_key, load_truth)
    import roles  # roles.py imports this module: read only when a roles study is scored

    return roles.SCORED


def _effects_text(effects) -> dict[str, str]:
    return {e.factor: e.text() for e in effects}


def _signs(effects) -> dict[str, str]:
    """factor -> the better level (only effects with a sign: a non-zero effect)."""
    return {e.factor: e.better for e in effects if e.effect != 0}


def _final_logit(rec: dict) -> float | None:
    last = rec["probes"][-1] if rec["probes"] else None
    return None if last is None or last["step"] != rec["config"]["steps"] else last["max_logit"]


def _early_forecast(rec: dict, fraction: float, target_sum_eta: float) -> float | None:
    """The forecast law on the first ``fraction`` of a long run's own probes (its schedule's
    Σ η), at the run's final Σ η: the pruner's law and arguments, none of its thresholds."""
    config = TrainConfig.from_dict(rec["config"])
    at = probe_sum_eta(config, assignment_for(config.model, rec["assign"], config.model_args))
    rows = [p for p in rec["probes"] if p["step"] <= fraction * config.steps and p["max_logit"] is not None]
    sum_eta = [at(p["step"]) for p in rows]
    keep = [i for i, e in enumerate(sum_eta) if e > 0]
    sigma = [max((p.get("sigma_max") or {}).get(t) or 0.0 for t in QK_TYPES) for p in rows]
    f = forecast_max_logit([sum_eta[i] for i in keep], [rows[i]["max_logit"] for i in keep], target_sum_eta,
                           sigma=[sigma[i] for i in keep] if all(sigma[i] > 0 for i in keep) else None)
    return None if f is None else f.value


def _search_steps(trial, rungs: list[dict], stability: dict | None = None,
                  run_dir: str = "") -> int:
    """Optimizer steps a trial trained (a pruned run counts to its stop step), its stability
    rung's included (its rows in the trial's probes.json)."""
    stop = trial.user_attrs.get(STOP_STEP)
    if stability and read_probes_file(Path(run_dir), trial).get(STABILITY_PROBES):
        if trial.user_attrs.get(PRUNED_RUNG) == "stability":
            return stop if isinstance(stop, int) else stability["steps"]
        stab = stability["steps"]
    else:
        stab = 0
    return stab + _rung_steps(trial, rungs, stop)


def _rung_steps(trial, rungs: list[dict], stop) -> int:
    losses = trial.user_attrs.get(RUNG_LOSSES) or []
    indices = trial.user_attrs.get(RUNG_INDICES) or range(len(losses))  # a seed trial: the top rung
    total, last = 0, None
    for i, seeds in zip(indices, losses):
        total += rungs[i]["steps"] * len(seeds)
        last = i
    if trial.state.name == "PRUNED" and isinstance(stop, int) and last is not None:
        total -= rungs[last]["steps"] - stop  # the stopped run is in rung_losses, to its stop step
    return total


def _search_rows(ranking, trials: dict, points: Points) -> dict[str, dict]:
    """Assignment -> the top-rung mean, rung-0 mean and trial of its best-ranked point."""
    search: dict[str, dict] = {}
    for row in ranking.rows:
        t = trials[row.number]
        key = points.key_of(t.user_attrs[ASSIGNMENT])
        if key in points.labels and key not in search:
            rung0 = [r for r in (t.user_attrs.get(RUNG_LOSSES) or [[]])[0]]
            search[key] = {"mean": row.score.mean, "rung0": statistics.fmean(rung0) if rung0 else math.nan,
                           "trial": t}
    return search


def _pruned_trials(trials: dict, points: Points) -> dict[str, object]:
    """Assignment -> the first of its points the search pruned (it calls them unstable)."""
    pruned: dict[str, object] = {}
    for t in trials.values():
        if t.state.name == "PRUNED" and not t.user_attrs.get(BASELINE) and ASSIGNMENT in t.user_attrs:
            pruned.setdefault(points.key_of(t.user_attrs[ASSIGNMENT]), t)
    return pruned


def _frozen_rung0(t, run_dir: str):
    """A copy of trial ``t`` whose probe history is its first rung's (None without rung probes,
    which its folder's rung_probes.json holds)."""
    rungs = read_rung_probes(Path(run_dir) / t.user_attrs.get(TRIAL_DIR, "")) if t is not None else []
    if not rungs:
        return None
    attrs = dict(t.user_attrs, **{PROBE_HISTORY: rungs[0]})
    return optuna.trial.create_trial(state=t.state, value=t.value if t.state.name == "COMPLETE"
                                     else None, params=t.params, distributions=t.distributions,
                                     user_attrs=attrs, intermediate_values=t.intermediate_values)


def _forecast_row(a: str, runs: list[dict], score: Score, search: dict[str, dict], pruned: dict[str, object],
                  study, pruner, target_sum_eta: float, run_dir: str,
                  label: str) -> tuple[str, list[float | None]]:
    """One assignment's row of the search-vs-truth table, with its forecast-over-real ratios."""
    recs = [r for r in runs if r["status"] == "completed"]
    real = [v for v in (_final_logit(r) for r in recs) if v is not None]
    real_mean = statistics.fmean(real) if real else math.nan
    cells, row_ratios = [], []
    t = search.get(a, {}).get("trial") or pruned.get(a)
    frozen_rung0 = _frozen_rung0(t, run_dir)
    held = TrialProbes.of(read_probes_file(Path(run_dir), t)) if t is not None else None
    for f in ([pruner.forecast(study, t, held) if t is not None else None,
               pruner.forecast(study, frozen_rung0) if frozen_rung0 is not None else None]):
        v = None if f is None else f.value
        cells.append("—" if v is None else f"{v:.1f} [{f.low:.1f}, {f.high:.1f}]")
        row_ratios.append(None if v is None else v / real_mean)
    early = [v for v in (_early_forecast(r, 0.1, target_sum_eta) for r in recs) if v is not None]
    v = statistics.fmean(early) if early else None
    cells.append("—" if v is None else f"{v:.1f}")
    row_ratios.append(None if v is None else v / real_mean)
    line = (f"| {label} | {score.mean:.4f} ({score.n} seeds) | "
            f"{search[a]['mean']:.4f} | {search[a]['rung0']:.4f} | {' / '.join(cells)} | "
            f"{real_mean:.1f} | {' / '.join('—' if x is None else f'{x:.2f}' for x in row_ratios)} |"
            if a in search else
            f"| {label} | {score.mean:.4f} ({score.n} seeds) | pruned: "
            f"{(pruned[a].user_attrs.get(PRUNE_REASON) or '') if a in pruned else 'not run'} | | "
            f"{' / '.join(cells)} | {real_mean:.1f} | "
            f"{' / '.join('—' if x is None else f'{x:.2f}' for x in row_ratios)} |")
    return line, row_ratios


def _law_lines(truth: dict[str, list[dict]], truth_mean: dict[str, float], model: str, steps: int, eta: float,
               target_sum_eta: float, labels: dict[str, str]) -> list[str]:
    """The table of the forecast law alone, fitted on each long run's first part and read at its end."""
    lines = ["", "The forecast law alone, on each long run's own probes: fitted on the first part of "
             "the run, forecast to its end; forecast ÷ real max logit at the end (one number a seed).", "",
             ]
    at = probe_sum_eta(truth_config(model, steps, eta, 0), assignment_for(model, next(iter(PAPER))))
    reached = {f: at(int(f * steps)) for f in LAW_FRACTIONS}
    lines += ["| assignment | " + " | ".join(f"first {f:.0%} (Σ η ×{target_sum_eta / reached[f]:.1f} to go)"
                                           for f in LAW_FRACTIONS) + " |", "|---|" + "---|" * len(LAW_FRACTIONS)]
    for a in sorted(labels, key=truth_mean.get):
        cells = []
        for f in LAW_FRACTIONS:
            rs = [(_early_forecast(r, f, target_sum_eta), _final_logit(r)) for r in truth[a] if r["status"] == "completed"]
            cells.append(", ".join("—" if v is None or not real else f"{v / real:.2f}" for v, real in rs))
        lines.append(f"| {labels[a]} | " + " | ".join(cells) + " |")
    return lines


def study_truth(attrs: dict, model: str, eta: float, model_args: dict | None = None
                ) -> tuple[str, dict]:
    """The model (and model args) whose ground truth scores a study with these study attrs:
    its target's (the study's stored plan, ``target``). The study's proxy must be ``model``
    (with ``model_args``) at peak step ``eta`` and batch 16, else the script exits naming
    both. A target model other than the proxy's (``--target-model``) is that preset at its
    own sizes; the proxy's own model keeps the proxy's ``model_args``."""
    proxy = attrs.get(PROXY) or {}
    if (proxy.get("model"), proxy.get("spectral_lr"), proxy.get("batch_size"), proxy.get("model_args") or {}) != (
            model, eta, 16, model_args or {}):
        sys.exit(f"the study's proxy is {proxy.get('model')}/{proxy.get('spectral_lr')}/batch "
                 f"{proxy.get('batch_size')}/{proxy.get('model_args') or {}}, not the ground truth's "
                 f"{model}/{eta}/batch 16/{model_args or {}}")
    target = (attrs.get(TARGET) or {}).get("model") or model
    return (model, dict(model_args or {})) if target == model else (target, {})


def _flops_of(trials, model: str, steps: int, eta: float, model_args: dict | None,
              rungs: list[dict], stability: dict | None, run_dir: str) -> float:
    """Training FLOPs of ``trials`` of the four (each its steps × one step of its assignment
    on ``model``, :func:`step_flops`): the compute of a proxy other than the target model."""
    per_step: dict[str, float] = {}
    total = 0.0
    for t in trials:
        a = _paper_key(t.user_attrs.get(ASSIGNMENT) or {})
        if a not in PAPER:
            continue
        if a not in per_step:
            per_step[a] = step_flops(truth_config(model, steps, eta, 0, model_args), a)
        total += per_step[a] * _search_steps(t, rungs, stability, run_dir)
    return total


def compare(run_dir: str, model: str, steps: int, eta: float, out: Path | None,
            model_args: dict | None = None) -> None:
    """Print (and publish) the search-vs-truth table for the study in ``run_dir`` (a model
    changed by ``model_args``: its own ground truth, and the study must train the same).
    The study's proxy is ``model``; the ground truth is its target model's
    (:func:`study_truth`: a ``--target-model`` study is scored against that model's long
    runs, its compute in FLOPs), scored on the points of its space (:func:`points_of`: the
    four, or the eight roles)."""
    study = open_run_study(run_dir)
    points = points_of(study)
    labels = points.labels
    proxy_model, proxy_args = model, dict(model_args or {})
    model, model_args = study_truth(study.user_attrs, model, eta, model_args)
    truth = points.truth(model, steps, eta, model_args)
    scores = truth_scores(truth)
    if len(scores) < len(labels):
        sys.exit(f"the ground truth at {model}/{steps}/{eta} has {len(scores)} of {len(labels)} "
                 "assignments: run --truth (roles.py --train for a roles study) first")
    rungs = study.user_attrs.get(LADDER) or []
    ranking = rank_study(study)
    trials = {t.number: t for t in study.get_trials(deepcopy=False)}
    search = _search_rows(ranking, trials, points)
    pruned = _pruned_trials(trials, points)
    truth_rank = rank_scores([(i, labels[a], s) for i, (a, s) in enumerate(scores.items())],
                             {i: _point(a) for i, a in enumerate(scores)})
    keys = [a for a in labels if a in search]
    truth_mean = {a: scores[a].mean for a in labels}
    truth_best = min(labels, key=truth_mean.get)
    search_best = points.key_of(trials[ranking.rows[0].number].user_attrs[ASSIGNMENT])
    rho = spearman([search[a]["mean"] for a in keys], [truth_mean[a] for a in keys])
    rho0 = spearman([search[a]["rung0"] for a in keys], [truth_mean[a] for a in keys])
    # the tool's whole order: ranked ones by their loss, then the pruned ones, tied last
    worst = max((search[a]["mean"] for a in keys), default=0.0) + 1.0
    rho_all = spearman([search[a]["mean"] if a in search else worst for a in labels],
                       [truth_mean[a] for a in labels])
    chance_win, chance_rho, rho_at = _chances(truth_mean, keys, labels)
    # the order the ladder forecasts at the target (each loss's line in log Σ η through the
    # rungs; the top rung's own order when it reached the target): not what the verdict ranks on
    reading = study_reading(study)
    order = reading.forecast_order if reading is not None else []
    placed = {a: order.index(trial_label(search[a]["trial"])) for a in keys
              if trial_label(search[a]["trial"]) in order}
    rho_fc = (spearman([placed[a] for a in placed], [truth_mean[a] for a in placed])
              if reading is not None and reading.extrapolated and len(placed) == len(keys) else None)
    truth_effects = main_effects((_point(a), s) for a, s in scores.items())
    s_signs, t_signs = _signs(ranking.effects), _signs(truth_effects)

    baselines = [t for t in trials.values() if t.user_attrs.get(BASELINE)]
    stability = study.user_attrs.get(STABILITY)
    search_steps = sum(_search_steps(t, rungs, stability, run_dir) for t in trials.values()
                       if not t.user_attrs.get(BASELINE))
    baseline_steps = sum(_search_steps(t, rungs, stability, run_dir) for t in baselines)
    truth_steps = sum(r["config"]["steps"] for recs in truth.values() for r in recs)
    other = (proxy_model, proxy_args) != (model, model_args)
    if other:  # a proxy other than the target model: steps of two models, compared in FLOPs
        search_flops = _flops_of([t for t in trials.values() if not t.user_attrs.get(BASELINE)],
                                 proxy_model, steps, eta, proxy_args, rungs, stability, run_dir)
        truth_flops = sum(step_flops(truth_config(model, steps, eta, 0, model_args), a)
                          * r["config"]["steps"] for a, recs in truth.items() for r in recs)

    pruner = LogitGrowthPruner()
    target_sum_eta = probe_sum_eta(truth_config(model, steps, eta, 0, model_args),
                                   assignment_for(model, next(iter(PAPER)), model_args))(steps)
    lines = [machine(), "",
             *([f"Proxy `{proxy_model}`, target model `{model}` (the study's plan): the ground "
                "truth is the target model's.", ""] if other else []),
             f"Ground truth: `{model}`, {steps} steps, peak spectral step {eta} (Σ η {target_sum_eta:.1f}), "
             f"seeds {sorted({s for sc in scores.values() for s in (sc.seeds or ())})}; "
             f"the search: `{run_dir}`, {len(rungs)} rung(s) at Σ η "
             f"{', '.join(format(r['sum_eta'], '.1f') for r in rungs)}, ranked at the top one.", "",
             "| assignment | truth: val loss | search: top rung | search: rung 0 | forecast max logit "
             "(top rung / rung 0 / first 10% of long run) | real max logit at the end | ratios |",
             "|---|---|---|---|---|---|---|"]
    ratios: list[float] = []
    for a in sorted(labels, key=truth_mean.get):
        line, row_ratios = _forecast_row(a, truth[a], scores[a], search, pruned, study, pruner, target_sum_eta,
                                           run_dir, labels[a])
        ratios += [x for x in row_ratios if x is not None]
        lines.append(line)
    lines += ["",
              f"- Winner: truth **{labels[truth_best]}** (the long runs' verdict: "
              f"{truth_rank.verdict}); search **{labels.get(search_best, search_best)}** "
              f"(its verdict: {ranking.verdict}). "
              f"Same winner: **{'yes' if truth_best == search_best else 'no'}**.",
              f"- Spearman over the {len(keys)} ranked assignments: top rung **{rho:.2f}**; rung 0 alone "
              f"(the proxy's own Σ η, what a one-rung search answers) {rho0:.2f}"
              + (f"; over all {len(labels)}, the pruned placed last (tied): **{rho_all:.2f}**"
                 if len(keys) < len(labels) else "")
              + (f"; the order forecast at the target (lines in log Σ η through the rungs, extrapolated "
                 f"from Σ η {reading.rungs[-1].sum_eta:.1f}): {rho_fc:.2f}, best "
                 f"{labels[min(placed, key=placed.get)]}" if rho_fc is not None else "") + ".",
              f"- Chance under a random order of the {len(keys)} ranked (the pruned last, "
              f"tied): the right winner {chance_win:.3f}, ρ ≥ {rho_at:g} over all "
              f"{len(labels)} {chance_rho:.3f}.",
              f"- Main effects, truth: {'; '.join(_effects_text(truth_effects).values()) or 'none'}.",
              f"- Main effects, search: {'; '.join(_effects_text(ranking.effects).values()) or 'none'}.",
              "- Same better level: " + ", ".join(
                  f"{f} " + ("not measured (no matched pair completed)" if f not in s_signs else
                             "yes" if s_signs[f] == t_signs[f] else "no") for f in sorted(t_signs)) + ".",
              (f"- Compute: the search trained {search_steps:,} optimizer steps of `{proxy_model}`, "
               f"{search_flops:.3g} FLOPs; the ground truth {truth_steps:,} of `{model}`, "
               f"{truth_flops:.3g} FLOPs: **{search_flops / truth_flops:.3f}** of it; its baselines "
               f"({', '.join(sorted(t.user_attrs[BASELINE] for t in baselines)) or 'none'}) another "
               f"{baseline_steps:,} steps of the proxy, not needed for the answer." if other else
               f"- Compute: the search trained {search_steps:,} optimizer steps of the same model and batch, "
               f"the ground truth {truth_steps:,}: **{search_steps / truth_steps:.3f}** of it; its baselines "
               f"({', '.join(sorted(t.user_attrs[BASELINE] for t in baselines)) or 'none'}) another "
               f"{baseline_steps:,} steps ({baseline_steps / truth_steps:.3f}), not needed for the answer."),
              f"- Forecast max logit over real, every forecast above: "
              f"{', '.join(f'{x:.2f}' for x in ratios)}; within ×2: "
              f"{sum(0.5 <= x <= 2 for x in ratios)} of {len(ratios)}."]
    stability_lines, decisions = _stability_lines(study, trials, truth, pruner, run_dir, points)
    lines += stability_lines
    lines += _law_lines(truth, truth_mean, model, steps, eta, target_sum_eta, labels)
    text = "\n".join(lines)
    if out is None:
        print(text)
    else:
        publish(text, out)
    name = setting_name(proxy_model, eta, proxy_args) + (f" target {model}" if other else "")
    row = {"setting": name, "truth_best": labels[truth_best],
           "search_best": labels.get(search_best, search_best), "spearman": round(rho_all, 4),
           "stability": list(decisions), "left": len(keys),
           "from": f"fidelity.py --compare {run_dir}"}
    if labels is not PAPER:  # the track record scores the default space's four only
        print(f"row (not recorded in {SEARCHES.name}, which holds the four): {row}")
        return
    record_search(row)
    print(f"{SEARCHES}: row {row['setting']!r} written (--track-record scores it)")


def _chances(truth_mean: dict[str, float], ranked: list[str],
             labels: dict[str, str]) -> tuple[float, float, float]:
    """The chance of the right winner and of ρ ≥ the bar (``no_run_rules.RHO_AT``, the third
    number) under a random order of the ``ranked`` points (the others pruned, last, tied):
    ``no_run_rules.chances`` over all of ``labels``."""
    import no_run_rules

    return (*no_run_rules.chances(truth_mean, ranked, keys=tuple(labels)), no_run_rules.RHO_AT)


def _stability_lines(study, trials: dict, truth: dict[str, list[dict]], pruner: LogitGrowthPruner,
                     run_dir: str, points: Points) -> tuple[list[str], tuple[int, int]]:
    """With a stability rung: each assignment's measured max logit at the target (first seed)
    against the long runs' final ones, and the threshold decision against theirs (any probe
    of any seed above the threshold); nothing without one. Also (decisions equal to the long
    runs', decisions), (0, 0) without a stability rung."""
    rows = []
    for t in trials.values():
        if (t.user_attrs.get(BASELINE) or SEED_OF in t.user_attrs or ASSIGNMENT not in t.user_attrs
                or t.state.name not in ("COMPLETE", "PRUNED")):  # not an interrupted or failed run
            continue
        m = pruner.measured(study, t, TrialProbes.of(read_probes_file(Path(run_dir), t)))
        a = points.key_of(t.user_attrs[ASSIGNMENT])
        if m is None or a not in points.labels:
            continue
        real = [x for x in (_final_logit(r) for r in truth[a]) if x is not None]
        long_above = any(p["max_logit"] is not None and p["max_logit"] > m.threshold for r in truth[a] for p in r["probes"])
        rows.append((a, m, real, long_above))
    if not rows:
        return [], (0, 0)
    out = ["", "Stability rung (measured at the target's Σ η², first seed) against the long runs:", "",
           "| assignment | measured final (peak) | long runs' final | ratio to their mean | search | long runs |",
           "|---|---|---|---|---|---|"]
    for a, m, real, long_above in sorted(rows, key=lambda r: points.labels[r[0]]):
        mean = statistics.fmean(real) if real else math.nan
        out.append(f"| {points.labels[a]} | {m.final:.1f} ({m.peak:.1f}) | "
                   f"{', '.join(f'{x:.1f}' for x in real)} "
                   f"| {m.final / mean:.2f} | {m.verdict} | {'above' if long_above else 'below'} |")
    same = sum((m.verdict == "above") == long_above for _, m, _, long_above in rows)
    out.append(f"\nThreshold decisions equal to the long runs': {same} of {len(rows)}.")
    return out, (same, len(rows))


def _order_cells(scores: dict[str, Score], t_mean: list[float]) -> str:
    """The table cells of one stand-in's order against the target's (``t_mean``, in
    :data:`PAPER` order): its best, whether that is the target's, the Spearman of its seed
    means and of each seed it shares across the four."""
    keys = list(PAPER)
    mean = [scores[a].mean for a in keys]
    best = keys[mean.index(min(mean))]
    t_best = keys[t_mean.index(min(t_mean))]
    seeds = sorted(set.intersection(*(set(scores[a].seeds or ()) for a in keys)))
    per_seed = [spearman([scores[a].values[list(scores[a].seeds).index(sd)] for a in keys], t_mean)
                for sd in seeds]
    return (f"{PAPER[best]} | {'yes' if best == t_best else 'no'} | {spearman(mean, t_mean):.2f} | "
            + ", ".join(f"{r:.2f}" for r in per_seed))


PAIR_SETTINGS = [("tiny", 0.02), ("tiny", 0.05), ("tiny", 0.1), ("small", 0.02), ("small", 0.05)]


def pairs(steps: int, short: int, out: Path | None) -> None:
    """Every pair of the four at each setting with both lengths stored: did the gap at
    ``short`` steps (the ranked rung's length; completed runs, 2 seeds, 16 batches) keep its
    sign at ``steps``? Tallied by the gap's size, the record the ranking's verdict quotes
    beside each pair (``geosearch.search.stats.track.ORDER_RECORD``)."""
    from geosearch.search.stats.track import ORDER_RECORD

    rows, tally = pair_tally(steps, short)
    far, near = tally[True], tally[False]
    head = f"Pairs at {short} steps against {steps} steps (completed runs, mean of 2 seeds)"
    text = "\n".join([head, "", *rows, "",
                      f"gaps >= {ORDER_RECORD.at:g}: kept their order {far[0]} of {far[1]}; "
                      f"closer: {near[0]} of {near[1]} (the verdict quotes {ORDER_RECORD.far} "
                      f"and {ORDER_RECORD.near})"])
    if out is not None:
        publish(text, out)
    else:
        print(text)


ORDER_AT = 0.02
"""The gap, in nats, that splits far pairs from close ones in the order record."""


def pair_tally(steps: int, short: int) -> tuple[list[str], dict[bool, list[int]]]:
    """The table of :func:`pairs` and its tally: far (gap >= :data:`ORDER_AT`) -> [kept, pairs]."""
    from itertools import combinations

    tally = {True: [0, 0], False: [0, 0]}
    rows = ["| setting | pair | gap at short | gap at target | kept |", "|---|---|---:|---:|---|"]
    for model, eta in PAIR_SETTINGS:
        a, b = truth_scores(load_truth(model, short, eta)), truth_scores(load_truth(model, steps, eta))
        if len(a) < len(PAPER) or len(b) < len(PAPER):
            rows.append(f"| {model} {eta} | (not stored at both lengths) | | | |")
            continue
        for x, y in combinations(PAPER, 2):
            g, big = a[x].mean - a[y].mean, b[x].mean - b[y].mean
            kept = (g > 0) == (big > 0)
            t = tally[abs(g) >= ORDER_AT]
            t[0] += kept
            t[1] += 1
            rows.append(f"| {model} {eta} | {PAPER[x]} − {PAPER[y]} | {g:+.4f} | {big:+.4f} | {kept} |")
    return rows, tally


SEARCHES = Path(__file__).parent / "data" / "searches.json"
"""The default search against the long runs, one row per setting: ``--compare RUN`` writes
its setting's row (:func:`record_search`); the rows whose ``from`` is ``docs/benchmarks.md``
were copied by hand from that page, as their run directories are not stored."""


def setting_name(model: str, eta: float, model_args: dict | None = None) -> str:
    """A setting's row name: ``"tiny 0.05"``, ``"4-layer tiny 0.05"`` (``n_layer=4``), other
    model fields after it (``"tiny 0.05 n_embd=32"``)."""
    named = [name for name, known in SETTINGS.items() if known == (model, dict(model_args or {}))]
    if named:
        return f"{named[0]} {eta:g}"
    args = dict(model_args or {})
    layers = args.pop("n_layer", None)
    head = f"{layers}-layer " if layers is not None else ""
    return head + " ".join([f"{model} {eta:g}", *(f"{k}={v}" for k, v in sorted(args.items()))])


def record_search(row: dict, searches: Path = SEARCHES) -> None:
    """Write ``row`` into ``searches``: in place of the row of the same setting, else last."""
    data = json.loads(searches.read_text(encoding="utf-8"))
    rows = data["settings"]
    at = next((i for i, r in enumerate(rows) if r["setting"] == row["setting"]), len(rows))
    rows[at:at + 1] = [row]
    searches.write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
TRACK = Path(__file__).parent.parent / "geosearch" / "search" / "stats" / "track_record.json"
"""The record the verdict quotes, shipped with the package (``--track-record`` writes it)."""


def _binom_tail(k: int, n: int, p: float) -> float:
    """P(X >= k) for X ~ Binomial(n, p)."""
    return sum(math.comb(n, i) * p**i * (1 - p) ** (n - i) for i in range(k, n + 1))


def _exact_interval(k: int, n: int) -> tuple[float, float]:
    """The exact (Clopper-Pearson) 95% interval of k successes in n, by bisection."""
    def solve(f, want: float) -> float:
        lo, hi = 0.0, 1.0
        for _ in range(60):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if f(mid) < want else (lo, mid)
        return (lo + hi) / 2
    low = 0.0 if k == 0 else solve(lambda p: _binom_tail(k, n, p), 0.025)
    high = 1.0 if k == n else 1 - solve(lambda q: _binom_tail(n - k, n, q), 0.025)
    return low, high


def _tally(hits: int, of: int, chance: float) -> dict:
    low, high = _exact_interval(hits, of)
    return {"hits": hits, "of": of, "low": round(low, 4), "high": round(high, 4),
            "chance": round(chance, 6), "p": float(f"{_binom_tail(hits, of, chance):.3g}")}


def track_record(steps: int = 2000, short: int = 400, searches: Path = SEARCHES) -> dict:
    """The record the verdict quotes, scored from the stored data: the pairs' order from
    ``short`` to ``steps`` (:func:`pair_tally`) and the stored searches against the long
    runs (``searches``): the best named, Spearman >= 0.8, the stability decisions."""
    _, tally = pair_tally(steps, short)
    rows = json.loads(searches.read_text(encoding="utf-8"))["settings"]
    winner = sum(r["truth_best"] == r["search_best"] for r in rows)
    rho = sum(r["spearman"] >= 0.8 for r in rows)
    same, of = (sum(r["stability"][i] for r in rows) for i in (0, 1))
    nulls = right_null(rows)
    return {
        "written_by": f"python benchmarks/fidelity.py --track-record "
                      f"(--steps {steps}, short {short})",
        "order": {"at": ORDER_AT, "far": tally[True], "near": tally[False], "short_steps": short,
                  "long_steps": steps},
        "search": {"long_steps": steps, "settings": [r["setting"] for r in rows],
                   "winner": _tally(winner, len(rows), 1 / 4) | nulls["winner"](winner),
                   "spearman": {"at": 0.8, **_tally(rho, len(rows), 1 / 6), **nulls["rho"](rho)},
                   "stability": {"hits": same, "of": of}, **nulls["beside"]},
    }


def right_null(rows: list[dict]) -> dict:
    """The chance of each tally under the right null (a random order of the assignments each
    search kept, ``left``: ``no_run_rules.chances``; the p-value its Poisson-binomial tail),
    and the no-run rule's and the better constant rule's tallies beside the search's
    (``no_run_rules.score`` on the stored long runs), for :func:`track_record`."""
    import no_run_rules as nr

    scored = nr.score(rows, nr.stored_truths(rows))
    cw = [r["chance_winner"] for r in scored["rows"]]
    cr = [r["chance_rho"] for r in scored["rows"]]
    rule = scored["rule"]

    def null(chances: list[float]):
        return lambda hits: {"chance": round(sum(chances) / len(chances), 6),
                             "p": float(f"{nr.tail(hits, chances):.3g}"),
                             "null": "a random order of the assignments each search kept"}

    return {"winner": null(cw), "rho": null(cr), "beside": {
        "no_run_rule": {"winner": rule["winner"][0], "spearman": rule["rho"][0],
                        "of": scored["settings"], "stability": rule["decisions"]},
        "constant_rule_stability": scored["constant_decisions"]}}


def write_track_record(steps: int, short: int) -> None:
    """Write :data:`TRACK` from :func:`track_record` and print it."""
    text = json.dumps(track_record(steps, short), indent=1) + "\n"
    TRACK.write_text(text, encoding="utf-8")
    print(f"{TRACK}:\n{text}")


def lengths(model: str, steps: int, eta: float, out: Path | None) -> None:
    """How the order of completed runs of each shorter stored length agrees with the
    order at ``steps``: the best assignment, Spearman of the seed means and of each seed
    alone, and the cost of one seed of the four at that length against the target's
    2-seed ground truth. No search and no rule of the tool: the ceiling of any ladder whose
    top rung is a completed run of that length."""
    target = truth_scores(load_truth(model, steps, eta))
    if len(target) < len(PAPER):
        sys.exit(f"the ground truth at {model}/{steps}/{eta} has {len(target)} of {len(PAPER)} "
                 "assignments: run --truth first")
    configs = [json.loads(p.read_text(encoding="utf-8"))["config"] for p in DATA.glob("*.json")]
    found = sorted({c["steps"] for c in configs if (c["model"], c["spectral_lr"]) == (model, eta)
                    and c["steps"] < steps})
    keys = list(PAPER)
    t_mean = [target[a].mean for a in keys]
    t_best = keys[t_mean.index(min(t_mean))]
    truth_steps = steps * sum(target[a].n for a in keys)
    lines = [machine(), "", f"`{model}`, peak spectral step {eta}: the order of completed runs of each length "
             f"against the order at {steps} steps (seed means; best there: {PAPER[t_best]}).", "",
             "| steps | best (seed mean) | = best at the target | Spearman, seed mean | Spearman, each seed | "
             "compute of the four, per seed (÷ the target's ground truth) |", "|---:|---|---|---:|---|---:|"]
    for n in found:
        scores = truth_scores(load_truth(model, n, eta))
        if len(scores) < len(PAPER):
            continue
        lines.append(f"| {n:,} | {_order_cells(scores, t_mean)} | {len(keys) * n / truth_steps:.3f} |")
    seeds = sorted(set.intersection(*(set(target[a].seeds or ()) for a in keys)))
    if len(seeds) == 2:  # is the target's order itself beyond seed noise?
        first, second = ([target[a].values[list(target[a].seeds).index(sd)] for a in keys] for sd in seeds)
        lines += ["", f"The target's own seeds {seeds[0]} and {seeds[1]} order the four with Spearman "
                      f"{spearman(first, second):.2f} between them."]
    text = "\n".join(lines) + "\n"
    if out is None:
        print(text)
    else:
        publish(text, out)


def curve(model: str, steps: int, eta: float, out: Path | None, model_args: dict | None = None) -> None:
    """The long runs' own validation losses along the run (runs trained since stop 26 record
    :data:`EVALS` points; earlier ones 4): at each point the seed means, the best, and the
    order's Spearman against the order at the end. Mid-run losses are not those of completed
    shorter runs (``--lengths``: those cool down), so this shows when in the run the order
    settles, not what a ladder can reach."""
    truth = load_truth(model, steps, eta, model_args)
    keys = list(PAPER)
    if any(len(truth[a]) == 0 for a in keys):
        sys.exit(f"the ground truth at {model}/{steps}/{eta} lacks some assignments: run --truth first")
    points: dict[int, dict[str, list[float]]] = {}
    for a in keys:
        for rec in truth[a]:
            for p in rec["probes"]:
                if p.get("val_loss") is not None:
                    points.setdefault(p["step"], {}).setdefault(a, []).append(p["val_loss"])
    final = [statistics.fmean(r["final_val_loss"] for r in truth[a]) for a in keys]
    head = " | ".join(PAPER[a] for a in keys)
    lines = [f"`{model}`{f' {model_args}' if model_args else ''}, peak spectral step {eta}, {steps} steps: the "
             "long runs' validation loss along the run (seed means, 16 batches)", "",
             f"| step | {head} | best | Spearman with the end |", "|---:|" + "---:|" * len(keys) + "---|---:|"]
    for step in sorted(points):
        row = points[step]
        if len(row) < len(keys) or len({len(v) for v in row.values()}) != 1:
            continue  # a point not every run recorded
        mean = [statistics.fmean(row[a]) for a in keys]
        best = PAPER[keys[mean.index(min(mean))]]
        lines.append(f"| {step:,} | " + " | ".join(f"{m:.4f}" for m in mean)
                     + f" | {best} | {spearman(mean, final):.2f} |")
    text = "\n".join(lines) + "\n"
    if out is None:
        print(text)
    else:
        publish(text, out)


def step_flops(config: TrainConfig, assign: str) -> float:
    """Floating-point operations of one training step of ``config``'s model with ``assign``:
    forward, backward and the optimizer step (the msign and retraction products too), as
    torch's ``FlopCounterMode`` counts them (matrix products), on one random batch. Exact
    and machine-free, unlike a time: the compute of two model sizes compared like with like."""
    from torch.utils.flop_counter import FlopCounterMode

    from geosearch.build import optimizer_from_plan
    from geosearch.plan import bind
    from geosearch.models.lm import lm_loss
    from geosearch.models.zoo import build_model

    torch.manual_seed(0)
    built = build_model(config.model, vocab_size=256, model_args=config.model_args)
    plan = bind(built.model, assignment_for(config.model, assign, config.model_args),
                config.optimizer_settings(), source="fidelity")
    optimizer = optimizer_from_plan(plan, verbose=False)
    x = torch.randint(0, 256, (config.batch_size, built.block_size))
    with FlopCounterMode(display=False) as counter:
        lm_loss(built.model, x, x).backward()
        optimizer.step()
    return float(counter.get_total_flops())


def widths(model: str, steps: int, eta: float, out: Path | None) -> None:
    """How narrower copies of the model, trained for the whole target (same steps, same
    spectral step, same data and seeds), order the four against the model's own order: the
    best, Spearman of the seed means and of each seed, and the compute of the copy's 2
    seeds of the four against the ground truth's (training-step FLOPs, :func:`step_flops`).
    No search and no rule of the tool: whether the spectral step size transfers across
    width well enough that a narrow copy at the target's length stands in for the model."""
    truth = load_truth(model, steps, eta)
    target = truth_scores(truth)
    if len(target) < len(PAPER):
        sys.exit(f"the ground truth at {model}/{steps}/{eta} has {len(target)} of {len(PAPER)} "
                 "assignments: run --truth first")
    recs = [json.loads(p.read_text(encoding="utf-8")) for p in DATA.glob("*.json")]
    variants = sorted({json.dumps(r["config"]["model_args"], sort_keys=True) for r in recs
                       if (r["config"]["model"], r["config"]["steps"], r["config"]["spectral_lr"]) == (model, steps, eta)
                       and r["config"].get("model_args")})
    keys = list(PAPER)
    t_mean = [target[a].mean for a in keys]
    t_best = keys[t_mean.index(min(t_mean))]
    base = truth_config(model, steps, eta, 0)
    truth_flops = sum(step_flops(base, a) * target[a].n for a in keys)
    ms_truth = statistics.fmean(r["mean_step_ms"] for recs in truth.values() for r in recs)
    lines = [machine(), "", f"`{model}`, {steps} steps at peak spectral step {eta}: narrower copies trained "
             f"for the same steps, against the model's own order (seed means; best: {PAPER[t_best]}).", "",
             "| model args | best (seed mean) | = the model's best | Spearman, seed mean | Spearman, each seed | "
             "compute of the four × 2 seeds (÷ the ground truth's, FLOPs) | ms/step ratio (indicative) |",
             "|---|---|---|---:|---|---:|---:|"]
    for blob in variants:
        args = json.loads(blob)
        found = load_truth(model, steps, eta, args)
        scores = truth_scores(found)
        if len(scores) < len(PAPER):
            continue
        cfg = truth_config(model, steps, eta, 0, args)
        flops = sum(step_flops(cfg, a) * scores[a].n for a in keys)
        ms = statistics.fmean(r["mean_step_ms"] for a in keys for r in found[a])
        label = ", ".join(f"{k}={v}" for k, v in args.items())
        lines.append(f"| {label} | {_order_cells(scores, t_mean)} | {flops / truth_flops:.3f} | "
                     f"{ms / ms_truth:.2f} |")
    text = "\n".join(lines) + "\n"
    if out is None:
        print(text)
    else:
        publish(text, out)


def _model_of(p: argparse.ArgumentParser, args: argparse.Namespace) -> tuple[str, dict[str, int]]:
    """The model spec and model args that ``--model``/``--model-arg`` or ``--setting`` name."""
    model_args = {}
    for item in args.model_arg:
        key, _, value = item.partition("=")
        if not value.lstrip("-").isdigit():
            p.error(f"--model-arg {item!r}: expected KEY=INT, e.g. n_embd=32")
        model_args[key] = int(value)
    if not args.setting:
        return args.model, model_args
    if model_args:
        p.error("--setting names its own model args: not with --model-arg")
    return SETTINGS[args.setting][0], dict(SETTINGS[args.setting][1])


def main(argv: list[str] | None = None) -> int:
    global DATA
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--truth", action="store_true", help="train the missing ground-truth runs")
    p.add_argument("--show", action="store_true", help="print the stored ground truth")
    p.add_argument("--model", default="small")
    p.add_argument("--setting", choices=list(SETTINGS),
                   help="a proxy beyond GPT-2: its model and model args (not with --model-arg)")
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--eta", type=float, default=0.02, help="peak spectral step size")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    p.add_argument("--model-arg", action="append", default=[], metavar="KEY=INT", help="with --truth, --show "
                   "or --compare: a model field changed, e.g. n_embd=32 (a narrower copy); repeatable")
    p.add_argument("--only", nargs="+", choices=list(PAPER), help="with --truth: these assignments only "
                   "(to share the runs between processes)")
    p.add_argument("--data-dir", type=Path, default=DATA, help="where the ground-truth runs are stored")
    p.add_argument("--compare", metavar="RUN_DIR", help="compare the study in RUN_DIR with the ground truth")
    p.add_argument("--lengths", action="store_true", help="how the order of each shorter stored length "
                   "agrees with the order at --steps")
    p.add_argument("--widths", action="store_true", help="how narrower copies trained for --steps (stored "
                   "with --truth --model-arg n_embd=...) order the four against the model's own order")
    p.add_argument("--curve", action="store_true", help="the long runs' validation loss at each recorded "
                   "point and the order's agreement with the order at the end")
    p.add_argument("--pairs", type=int, metavar="SHORT", help="every pair's gap at SHORT steps against --steps, "
                   "tallied by size: the record the ranking's verdict quotes per pair")
    p.add_argument("--out", type=Path, help="with --compare, --lengths, --widths or --pairs: also write the table "
                   "to this file")
    p.add_argument("--track-record", action="store_true",
                   help="score the stored pairs (400 steps against --steps) and searches "
                        "(data/searches.json) and write the record the verdict quotes "
                        "(geosearch/search/stats/track_record.json)")
    args = p.parse_args(argv)
    DATA = args.data_dir
    args.model, model_args = _model_of(p, args)
    if args.compare:
        compare(args.compare, args.model, args.steps, args.eta, args.out, model_args)
        return 0
    if args.curve:
        curve(args.model, args.steps, args.eta, args.out, model_args)
        return 0
    if args.widths:
        widths(args.model, args.steps, args.eta, args.out)
        return 0
    if args.pairs:
        pairs(args.steps, args.pairs, args.out)
        return 0
    if args.track_record:
        write_track_record(args.steps, 400)
        return 0
    if args.lengths:
        lengths(args.model, args.steps, args.eta, args.out)
        return 0
    if args.truth:
        run_truth(args.model, args.steps, args.eta, args.seeds, args.only, model_args)
    if args.show or args.truth:
        show_truth(args.model, args.steps, args.eta, model_args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
