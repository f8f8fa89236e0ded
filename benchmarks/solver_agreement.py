"""Do the one-msign and the dual-ascent manifold-Muon solvers rank assignments alike?

Every assignment of a search space (default ``search_spaces/paper.yaml``: attention and
MLP each Stiefel or DGram) is trained on the proxy twice per seed, once with
``solver: project`` (one msign of the tangent-projected gradient) and once with
``solver: dual`` (the space's dual ascent, K = 20 in paper.yaml), with the same seeds,
in the same run, the two solvers alternating. Compared:

- the final validation losses (mean over seeds): Spearman's rank correlation over the
  assignments, and whether both solvers pick the same winner;
- the cost: ms per training step (the whole step: forward, backward, every optimizer
  group), dual ÷ project, per assignment and over all of them.

If the ranks agree, a search can score assignments with the cheap solver and keep the
dual one for the final training (neither is the exact optimum: see
``benchmarks/direction_quality.py``). Not a test: it prints a table and writes it to
``benchmarks/results/solver_agreement.md``.

Usage::

    python benchmarks/solver_agreement.py               # tiny proxy, paper.yaml's 500 steps, 3 seeds (~6-9 min, 2 shared cores)
    python benchmarks/solver_agreement.py --quick       # 100 steps, 1 seed
    python benchmarks/solver_agreement.py --model small --repeats 3   # the CPU default proxy (much longer)
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import itertools
import math
import statistics
import sys
import time
from pathlib import Path

import optuna
import torch

from _common import machine, publish  # benchmarks/ is on sys.path when a script runs
from geosearch.proxy.train import train
from geosearch.search.horizon.ladder import ranks, spearman
from geosearch.search.space.plan import plan_study
from geosearch.search.space.spec import SearchSpace, apply_overrides, load_space

RESULTS = Path(__file__).parent / "results" / "solver_agreement.md"
SOLVERS = ("project", "dual")


# --------------------------------------------------------------------------- runs
def points(space: SearchSpace) -> list[dict[str, str]]:
    """Every assignment of a finite space as Optuna params, in the space's key order."""
    choices = space.categorical_choices()
    names = list(choices)
    return [dict(zip(names, combo)) for combo in itertools.product(*choices.values())]


def label(params: dict[str, str]) -> str:
    return ", ".join(f"{k.split('.', 1)[1]}={v}" for k, v in params.items())


def run_all(space: SearchSpace, args: argparse.Namespace) -> dict[str, dict[str, list[dict]]]:
    """label -> solver -> one record per seed."""
    results: dict[str, dict[str, list[dict]]] = {}
    for r in range(space.repeats):
        for i, params in enumerate(points(space)):
            suggestion = space.suggest(optuna.trial.FixedTrial(params))
            assignment = suggestion.assignment()
            # alternate which solver goes first, so drift in the machine's load is shared
            order = SOLVERS if (i + r) % 2 == 0 else SOLVERS[::-1]
            for solver in order:
                config = dataclasses.replace(space.train_config(suggestion, repeat=r), solver=solver)
                t0 = time.perf_counter()
                result = train(config, assignment)
                residual = [m["dual_residual"] for m in result.history if m.get("dual_residual") is not None]
                rec = {"seed": config.seed, "status": result.status, "loss": result.final_val_loss,
                       "ms": result.mean_step_ms, "residual": residual[-1] if residual else None,
                       "seconds": time.perf_counter() - t0}
                results.setdefault(label(params), {}).setdefault(solver, []).append(rec)
                print(f"  seed {config.seed} {label(params):28s} {solver:8s} {result.status:10s} "
                      f"val {result.final_val_loss:.4f}  {result.mean_step_ms:6.1f} ms/step", flush=True)
    return results


def _mean(xs: list[float]) -> float:
    xs = [x for x in xs if x is not None and math.isfinite(x)]
    return statistics.fmean(xs) if xs else math.nan


def _spread(xs: list[float]) -> str:
    xs = [x for x in xs if x is not None and math.isfinite(x)]
    if not xs:
        return "—"
    if len(xs) < 2:
        return f"{xs[0]:.4f}"
    return f"{statistics.fmean(xs):.4f} ± {statistics.stdev(xs):.4f}"


# --------------------------------------------------------------------------- report
def report(results: dict[str, dict[str, list[dict]]]) -> tuple[str, dict]:
    labels = list(results)
    loss = {s: [_mean([r["loss"] for r in results[k][s]]) for k in labels] for s in SOLVERS}
    ms = {s: [_mean([r["ms"] for r in results[k][s]]) for k in labels] for s in SOLVERS}
    rank = {s: ranks(loss[s]) for s in SOLVERS}
    lines = ["| assignment | project: val loss | dual: val loss | dual − project | rank project / dual | "
             "project ms/step | dual ms/step | dual ÷ project | dual residual (last) |",
             "|---|---:|---:|---:|---|---:|---:|---:|---:|"]
    for i, k in enumerate(labels):
        p, d = results[k]["project"], results[k]["dual"]
        bad = [f"{s} {r['status']} (seed {r['seed']})" for s in SOLVERS for r in results[k][s]
               if r["status"] != "completed"]
        residual = _mean([r["residual"] for r in d])
        lines.append(
            f"| {k}{' — ' + ', '.join(bad) if bad else ''} | {_spread([r['loss'] for r in p])} | "
            f"{_spread([r['loss'] for r in d])} | {loss['dual'][i] - loss['project'][i]:+.4f} | "
            f"{rank['project'][i]:g} / {rank['dual'][i]:g} | {ms['project'][i]:.1f} | {ms['dual'][i]:.1f} | "
            f"{ms['dual'][i] / ms['project'][i]:.2f} | {residual:.1e} |")
    rho = spearman(loss["project"], loss["dual"])
    winners = {s: labels[min(range(len(labels)), key=lambda i: loss[s][i])] for s in SOLVERS}
    cost = sum(ms["dual"]) / sum(ms["project"])
    # how large is seed noise next to the gaps between assignments?
    noise = _mean([statistics.stdev([r["loss"] for r in results[k][s]])
                   for k in labels for s in SOLVERS if len(results[k][s]) >= 2])
    gaps = sorted(loss["project"])
    min_gap = min((b - a for a, b in zip(gaps, gaps[1:])), default=math.nan)
    summary = {"rho": rho, "n": len(labels), "winners": winners, "cost": cost, "noise": noise,
               "min_gap": min_gap}
    text = "\n".join(lines) + "\n\n" + "\n".join([
        f"- Spearman ρ of the mean val losses over the {len(labels)} assignments, project vs dual: "
        f"**{rho:.2f}** (with n = {len(labels)}, ρ moves in steps of {6 / (len(labels) ** 3 - len(labels)) * 2:.2g}: "
        "1 means the same order)",
        f"- winner: project {winners['project']}; dual {winners['dual']} "
        f"({'the same' if winners['project'] == winners['dual'] else 'DIFFERENT'})",
        f"- cost: dual ÷ project = **{cost:.2f}×** ms per training step (sum over the assignments)",
        f"- seed noise: mean std over seeds of one assignment's val loss {noise:.4f}; smallest gap between "
        f"two assignments' mean (project) {min_gap:.4f}" if math.isfinite(noise) else
        "- seed noise: one seed per assignment, so rank swaps cannot be told from seed noise",
    ]) + "\n"
    return text, summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--space", default="paper", help="search space file or shipped name (default paper)")
    parser.add_argument("--model", default="tiny", help="proxy preset: tiny (default), small, gpt2")
    parser.add_argument("--steps", type=int, help="steps per proxy run (default: the space's)")
    parser.add_argument("--repeats", type=int, help="seeds per assignment (default: the space's)")
    parser.add_argument("--spectral-lr", type=float, help="spectral step size (default: the space's)")
    parser.add_argument("--device", default="cpu", help="cpu (default), cuda or auto")
    parser.add_argument("--quick", action="store_true", help="smoke run: 100 steps, 1 seed")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    if args.quick:
        args.steps, args.repeats = 100, 1
    torch.set_num_threads(args.threads)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    started = time.perf_counter()
    header_machine = machine()

    overrides = {"proxy.device": args.device, "hyperparams.step_grid": None}  # one shared step
    if args.spectral_lr is not None:
        overrides["proxy.spectral_lr"] = args.spectral_lr
    space = apply_overrides(load_space(args.space), overrides, model=args.model, steps=args.steps,
                            repeats=args.repeats)
    if space.hyperparams:
        raise SystemExit("solver_agreement.py: the space searches continuous hyperparameters; "
                         "give one with only geometries")
    print(space.summary(plan_study(space).header_lines()), flush=True)
    results = run_all(space, args)
    table, _ = report(results)

    p = space.proxy
    dual = {k: v for k, v in p.optimizer_args.items() if k.startswith("dual")}
    command = "python benchmarks/solver_agreement.py " + " ".join(argv if argv is not None else sys.argv[1:])
    text = "\n".join([
        f"# Solver agreement: project vs dual ({p.model} proxy)\n",
        f"{datetime.datetime.now().isoformat(timespec='seconds')}; `{command.strip()}`; {header_machine}; "
        f"{time.perf_counter() - started:.0f} s in all.\n",
        f"Space `{args.space}` ({space.source}); model `{p.model}`, {p.steps} steps × batch {p.batch_size}, spectral lr "
        f"{p.spectral_lr:g}, {space.repeats} seed(s) ({', '.join(str(p.seed + r) for r in range(space.repeats))}) "
        f"per assignment and solver; dual settings {dual or 'the defaults'}. Val loss: final, mean ± std "
        "over seeds; ms/step: mean training-step time of the run (the first steps left out), averaged "
        "over seeds; the two solvers alternate, so both see the same machine load on average. The "
        "machine is shared: the cost ratio is indicative, the losses are exact for these seeds.\n",
        table,
    ])
    publish(text, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
