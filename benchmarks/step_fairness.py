"""Does the geometry win, or the step size that happened to suit it?

The reference study trained every assignment at one shared spectral step, and so does
geosearch's default space. This benchmark asks, of the stored 2,000-step ground-truth runs
(``benchmarks/data/fidelity``, made by ``fidelity.py --truth``; 4 assignments x 2 seeds at
each step size; nothing is trained here), what the answer is when each assignment gets its
own best step from the grid of step sizes those runs cover:

* ``tiny`` at spectral steps 0.02, 0.05, 0.07, 0.1 (a grid of x0.4, x1, x1.4, x2 around
  0.05; 0.02 is the default space's step);
* ``small`` at 0.02 and 0.05 (the only two stored).

For each model it prints, per assignment and step: the mean final validation loss over the
seeds, the final max attention logit against the threshold (10 x d/sqrt(d_head), the
pruner's default), and whether the run was harmed (over the threshold); then, for each
shared step, the order of the four and the attention and MLP main effects (blocked model,
95% intervals, ``geosearch.search.stats.scores.main_effects``); then each assignment at its
own best step (lowest mean loss among the steps where it was not harmed; harmed everywhere:
its lowest loss, marked), the own-step order and main effects; and the compute the tuning
costs (runs at every step of the grid, as a ratio of one step's).

The best step is chosen on the same runs that score it (there is no held-out seed): with 2
seeds a step whose loss is lower by noise is preferred, which favours the tuned answer by
the seed noise at most; the intervals say how large that is.

Prediction, written before this analysis was first run (the per-step losses had not been
looked at; known beforehand, from docs/benchmarks.md: at the shared step the long runs'
best is all-DGram at tiny/small 0.02 and Stiefel-attention + DGram-MLP at tiny 0.05, 0.07,
0.1 and small 0.05, and DGram attention crosses the threshold at tiny 0.05 and above and at
small 0.05):

1. the assignments with DGram attention have their best step at 0.02, those with Stiefel
   attention a larger one (>= 0.05);
2. each at its own best step, the winner is Stiefel-attention + DGram-MLP on both models:
   the shared-0.02 answer (all-DGram) does not survive the tuning, the shared-0.05 one does;
3. DGram attention at its own best step is not harmed;
4. the attention main effect at own best steps favours Stiefel, with an interval that
   excludes 0 on ``tiny``.

Chance rates: a random winner among four is right 1 time in 4; a random sign of an effect 1
in 2.

Usage::

    python benchmarks/step_fairness.py            # prints the tables (seconds: no training)
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]

from fidelity import PAPER, load_truth  # noqa: E402

from geosearch.search.horizon.pruner import DEFAULT_MAX_LOGIT_FACTOR  # noqa: E402
from geosearch.search.horizon.target import model_logit_scale  # noqa: E402
from geosearch.search.stats.scores import Point, Score, main_effects  # noqa: E402

GRIDS = {"tiny": (0.01, 0.02, 0.05, 0.07, 0.1), "small": (0.02, 0.05)}
STEPS = 2000
SHORT = {"attn=stiefel,mlp=stiefel": "S+S", "attn=stiefel,mlp=dgram": "S-attn+D-MLP",
         "attn=dgram,mlp=stiefel": "D-attn+S-MLP", "attn=dgram,mlp=dgram": "D+D"}


def _cell(model: str, eta: float, threshold: float) -> dict[str, dict]:
    """assignment -> its runs at ``eta``: score, mean loss, final max logit (max over seeds), harmed."""
    out = {}
    for assign, recs in load_truth(model, STEPS, eta).items():
        done = [r for r in recs if r["status"] == "completed"]
        if not done:
            continue
        finals = [r["probes"][-1]["max_logit"] for r in done if r["probes"]]
        logit = max(finals) if finals else math.nan
        out[assign] = {"score": Score.of([r["final_val_loss"] for r in done], [r["config"]["seed"] for r in done]),
                       "loss": statistics.fmean(r["final_val_loss"] for r in done), "logit": logit,
                       "harmed": logit > threshold, "eta": eta, "seeds": len(done)}
    return out


def _point(assign: str) -> Point:
    return Point(dict(kv.split("=") for kv in assign.split(",")))


def _effects(cells: dict[str, dict]) -> str:
    effects = main_effects([(_point(a), c["score"]) for a, c in cells.items()])
    return "; ".join(f"{e.factor}: {e.text()}" for e in effects) or "no matched pairs"


def _order(cells: dict[str, dict]) -> str:
    ranked = sorted(cells, key=lambda a: cells[a]["loss"])
    return " < ".join(f"{SHORT[a]}{' (harmed)' if cells[a]['harmed'] else ''}" for a in ranked)


def report(model: str) -> list[str]:
    threshold = DEFAULT_MAX_LOGIT_FACTOR * model_logit_scale(model, {})
    grid = GRIDS[model]
    by_eta = {eta: _cell(model, eta, threshold) for eta in grid}
    lines = [f"### `{model}`, {STEPS} steps, spectral steps {', '.join(map(str, grid))} "
             f"(threshold {threshold:.0f})", "",
             "| assignment | " + " | ".join(f"η {eta}" for eta in grid) + " |",
             "|---|" + "---|" * len(grid)]
    for assign in PAPER:
        row = []
        for eta in grid:
            c = by_eta[eta].get(assign)
            row.append("—" if c is None else f"{c['loss']:.4f} (logit {c['logit']:.0f}{', harmed' if c['harmed'] else ''})")
        lines.append(f"| {SHORT[assign]} | " + " | ".join(row) + " |")
    lines.append("")
    for eta in grid:
        cells = by_eta[eta]
        if len(cells) == len(PAPER):
            lines.append(f"- shared step {eta}: {_order(cells)}; {_effects(cells)}")
    own = {}
    for assign in PAPER:
        runs = [by_eta[eta][assign] for eta in grid if assign in by_eta[eta]]
        safe = [c for c in runs if not c["harmed"]]
        own[assign] = min(safe or runs, key=lambda c: c["loss"])
    steps = ", ".join(f"{SHORT[a]} {c['eta']}{' (harmed at every step)' if c['harmed'] else ''}"
                      for a, c in own.items())
    lines.append(f"- each at its own best step ({steps}): {_order(own)}; {_effects(own)}")
    edge = [SHORT[a] for a, c in own.items() if c["eta"] in (grid[0], grid[-1]) and not c["harmed"]]
    if edge:
        lines.append(f"- best step at an end of the grid (not bracketed: the optimum may lie beyond it): "
                     f"{', '.join(edge)}")
    lines.append(f"- compute of the tuning: {len(grid)} steps x the untuned runs = {len(grid)}x")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(GRIDS), choices=list(GRIDS))
    args = parser.parse_args(argv)
    for model in args.models:
        print("\n".join(report(model)) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
