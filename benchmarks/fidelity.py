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
    python benchmarks/fidelity.py --truth --eta 0.05 --steps 2000 --seeds 0 1
    python benchmarks/fidelity.py --show --eta 0.02 --steps 2000                 # the table so far
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

from _common import machine  # benchmarks/ is on sys.path when a script runs
from geosearch.assignment import Assignment
from geosearch.proxy.train import TrainConfig, train

DATA = Path(__file__).parent / "data" / "fidelity"
PAPER = {  # the reference study's four assignments (rule set nanogpt: c_attn is one type)
    "attn=stiefel,mlp=stiefel": "all-Stiefel",
    "attn=stiefel,mlp=dgram": "Stiefel-attn + DGram-MLP",
    "attn=dgram,mlp=stiefel": "DGram-attn + Stiefel-MLP",
    "attn=dgram,mlp=dgram": "all-DGram",
}


def truth_config(model: str, steps: int, eta: float, seed: int) -> TrainConfig:
    """A ground-truth run: the default space's proxy settings at the target length, with a
    finer final validation (16 fixed batches) and probes every 1% of the run."""
    return TrainConfig(model=model, steps=steps, spectral_lr=eta, seed=seed, batch_size=16,
                       eval_every=max(1, steps // 4), eval_batches=16,
                       probe_every=max(1, steps // 100), solver="project")


def run_key(config: TrainConfig, assign: str) -> str:
    blob = json.dumps({"config": config.to_dict(), "assign": assign}, sort_keys=True)
    return hashlib.sha1(blob.encode()).hexdigest()[:12]


def _commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              cwd=Path(__file__).parent, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def run_truth(model: str, steps: int, eta: float, seeds: list[int]) -> None:
    """Train every missing ground-truth run and store it."""
    DATA.mkdir(parents=True, exist_ok=True)
    print(machine())
    for seed in seeds:
        for assign in PAPER:
            config = truth_config(model, steps, eta, seed)
            path = DATA / f"{run_key(config, assign)}.json"
            if path.exists():
                print(f"have  {assign} seed {seed}: {path.name}")
                continue
            t0 = time.perf_counter()
            result = train(config, Assignment.parse(assign), progress=False)
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


def load_truth(model: str, steps: int, eta: float) -> dict[str, list[dict]]:
    """assignment -> its stored ground-truth runs (any seeds) at these settings."""
    out: dict[str, list[dict]] = {a: [] for a in PAPER}
    for path in sorted(DATA.glob("*.json")):
        rec = json.loads(path.read_text(encoding="utf-8"))
        c = rec["config"]
        if (c["model"], c["steps"], c["spectral_lr"]) == (model, steps, eta) and rec["assign"] in out:
            out[rec["assign"]].append(rec)
    return out


def show_truth(model: str, steps: int, eta: float) -> None:
    truth = load_truth(model, steps, eta)
    print(f"ground truth: {model}, {steps} steps, spectral lr {eta}")
    rows = []
    for assign, recs in truth.items():
        losses = [r["final_val_loss"] for r in recs if r["status"] == "completed"]
        peak = max((p["max_logit"] for r in recs for p in r["probes"]), default=float("nan"))
        mean = statistics.fmean(losses) if losses else float("nan")
        rows.append((mean, assign, losses, peak))
    for mean, assign, losses, peak in sorted(rows):
        print(f"  {PAPER[assign]:26s} {mean:.4f}  seeds {[round(x, 4) for x in losses]}  peak max logit {peak:.1f}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--truth", action="store_true", help="train the missing ground-truth runs")
    p.add_argument("--show", action="store_true", help="print the stored ground truth")
    p.add_argument("--model", default="small")
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--eta", type=float, default=0.02, help="peak spectral step size")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    args = p.parse_args(argv)
    if args.truth:
        run_truth(args.model, args.steps, args.eta, args.seeds)
    if args.show or args.truth:
        show_truth(args.model, args.steps, args.eta)
    return 0


if __name__ == "__main__":
    sys.exit(main())
