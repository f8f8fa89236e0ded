"""Does the logit-growth pruner save compute without changing the winner?

The same search (``search_spaces/paper.yaml``: attention and MLP each Stiefel or DGram,
the study's settings, scaled down to a CPU proxy) is run once per pruning setting, all in
this run and on the same machine:

- ``none``: no pruning. Every trial trains to its end (the trainer still stops a run
  whose loss is non-finite: it cannot go on). This run defines which trials *end
  unstable*: the run stopped non-finite, or its last probed max attention logit of some
  seed is above the pruner's ``max_logit`` (the paper.yaml value).
- ``logit``: paper.yaml's own :class:`~geosearch.search.pruners.LogitGrowthPruner`
  (max logit, max-logit trend, entropy collapse, non-finite), no loss pruner.
- ``median``: a loss-only pruner: Optuna's ``MedianPruner`` through the space's
  ``pruner.loss`` setting, the logit, trend and entropy rules switched off.
- ``logit+median``: the logit-growth pruner wrapping that median pruner (how the two
  are meant to be combined).

Each search runs twice: at a spectral step size where DGram attention misbehaves (the
smallest of a scan of step sizes at which the DGram-attention assignment ends unstable
without pruning) and at the study's own 0.02. The runs are seeded, so a pruned trial
replays its unpruned run up to the step it is stopped at.

Measured per search: trial-steps spent (training steps summed over trials and seeds),
the trials' wall time, the steps spent on trials that end unstable, and the winner
(lowest mean final val loss). Targets, for the logit-growth pruner: every trial that
ends unstable is stopped within 25% of its budget; the whole search spends at most 50%
of the unpruned search's trial-steps and picks the same winner.

Not a test: it prints tables and writes them to ``benchmarks/results/pruning.md``.

Usage::

    python benchmarks/pruning.py                  # tiny proxy, 300 steps, 1 seed (~7-9 min on 2 shared cores)
    python benchmarks/pruning.py --quick          # a smoke run (~1 min)
    python benchmarks/pruning.py --spectral-lr 0.5    # skip the scan
    python benchmarks/pruning.py --model small --steps 500 --repeats 3   # closer to paper.yaml (hours)
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import io
import math
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import optuna
import torch

from _common import machine, publish  # benchmarks/ is on sys.path when a script runs
from geosearch.proxy.train import train
from geosearch.search.pruners import BUDGET_STEPS_ATTR, PROBE_HISTORY_ATTR
from geosearch.report import TrialRecord, load_run
from geosearch.search.ranking import rank_study
from geosearch.search.space import SearchSpace, apply_overrides, load_space
from geosearch.search.study import run_search

RESULTS = Path(__file__).parent / "results" / "pruning.md"
STUDY_LR = 0.02  # paper.yaml's spectral step size
SCAN = (0.05, 0.1, 0.2, 0.5, 1.0)  # 1-2-5 steps above it
SCANNED = {"geometry.attn": "dgram", "geometry.mlp": "stiefel"}  # the DGram-attention point
MODES = ("none", "logit", "median", "logit+median")
# "off" for the logit rule: the largest float passes the pruner's own checks (finite,
# positive); a probed logit never exceeds it, and a non-finite one is caught anyway.
OFF = sys.float_info.max
STOP_TARGET, COMPUTE_TARGET = 0.25, 0.50


# --------------------------------------------------------------------------- settings
def base_space(args: argparse.Namespace) -> SearchSpace:
    """paper.yaml at the benchmark's proxy scale."""
    space = load_space("paper")
    overrides = {"proxy.device": args.device}
    if args.solver:
        overrides["proxy.solver"] = args.solver
    return apply_overrides(space, overrides, model=args.model, steps=args.steps,
                           repeats=args.repeats)


def mode_space(space: SearchSpace, mode: str, lr: float, median_startup: int) -> SearchSpace:
    """``space`` at spectral step ``lr`` with the pruner of ``mode``."""
    median = {"type": "median", "n_startup_trials": median_startup, "n_warmup_steps": 0}
    off = {"max_logit": OFF, "trend_min_logit": None, "min_entropy": None}
    pruner = {
        "none": {**off, "loss": "none"},
        "logit": {},  # paper.yaml's own
        "median": {**off, "loss": median},
        "logit+median": {"loss": median},
    }[mode]
    overrides = {"proxy.spectral_lr": lr, **{f"pruner.{k}": v for k, v in pruner.items()}}
    return apply_overrides(space, overrides, name=f"pruning-lr{lr:g}-{mode.replace('+', '-')}")


# --------------------------------------------------------------------------- one search
@dataclass
class TrialRun:
    """One trial of one search, as the benchmark counts it."""

    key: str  # the assignment, e.g. "attn=dgram, mlp=stiefel"
    number: int
    status: str  # completed | unstable | failed
    steps: int  # training steps spent, over its seeds
    seconds: float  # wall time of the trial
    final_logits: list[float]  # last probed max logit of each seed that ran
    loss: float  # mean final val loss (nan when none)
    stop_step: int | None = None
    reason: str | None = None


@dataclass
class SearchRun:
    mode: str
    lr: float
    trials: dict[str, TrialRun]
    winner: str | None
    seconds: float
    order: list[str] = field(default_factory=list)

    @property
    def steps(self) -> int:
        return sum(t.steps for t in self.trials.values())

    @property
    def trial_seconds(self) -> float:
        return sum(t.seconds for t in self.trials.values())


def _last(records: list[dict], key: str) -> float | None:
    values = [r[key] for r in records if r.get(key) is not None]
    return float(values[-1]) if values else None


def _trial_run(t: TrialRecord) -> TrialRun:
    # metrics.jsonl holds a record at every probe/eval step and at the step a run stopped,
    # so the last record's step is the number of steps that seed trained
    steps = sum(int(_last(seed, "step") or 0) for seed in t.metrics)
    logits = [x for x in (_last(seed, "max_logit") for seed in t.metrics) if x is not None]
    return TrialRun(key=t.label, number=t.number, status=t.state, steps=steps,
                    seconds=t.duration_s or 0.0, final_logits=logits,
                    loss=t.loss.mean if t.loss.n else math.nan, stop_step=t.stop_step,
                    reason=t.reason)


class _TrialLines(io.TextIOBase):
    """Forwards the search's per-trial lines to stdout, indented; drops the rest."""

    def write(self, text: str) -> int:
        for line in text.splitlines():
            if line.startswith("trial "):
                print("    " + line, flush=True)
        return len(text)


def run_one(space: SearchSpace, mode: str, lr: float, runs_dir: Path) -> SearchRun:
    print(f"  search lr={lr:g}, pruning: {mode}", flush=True)
    t0 = time.perf_counter()
    outcome = run_search(space, runs_dir=runs_dir, export=False, out=_TrialLines(), progress=False)
    seconds = time.perf_counter() - t0
    run = load_run(outcome.run_dir)
    trials = {t.label: _trial_run(t) for t in run.trials if t.state in ("completed", "unstable", "failed")}
    ranking = rank_study(run.study)
    winner = ranking.rows[0].label if ranking.rows else None
    order = [t.key for t in sorted(trials.values(), key=lambda t: t.number)]
    return SearchRun(mode, lr, trials, winner, seconds, order)


# --------------------------------------------------------------------------- the scan
def ends_unstable(status: str, final_logits: list[float], max_logit: float) -> bool:
    """The benchmark's definition: stopped (non-finite) or a seed's last max logit above
    the pruner's threshold (or non-finite)."""
    return status != "completed" or any(not (x <= max_logit) for x in final_logits)


def replay(space: SearchSpace, history: list[dict]) -> tuple[int | None, str | None]:
    """Where the space's pruner would have stopped a finished run: its metrics fed, step
    by step, to a trial of an in-memory study, as the search's callback feeds them."""
    study = optuna.create_study(pruner=space.make_pruner())
    trial = study.ask()
    trial.set_user_attr(BUDGET_STEPS_ATTR, space.proxy.steps)
    probes: list[dict] = []
    for m in history:
        if m.get("val_loss") is not None:
            trial.report(float(m["val_loss"]), m["step"])
        if m.get("max_logit") is not None:
            probes.append({k: m.get(k) for k in ("step", "max_logit", "min_entropy", "train_loss")})
            trial.set_user_attr(PROBE_HISTORY_ATTR, list(probes))
        why = study.pruner.reason(study, trial)
        if why:
            return m["step"], why
    return None, None


def scan(space: SearchSpace, lrs: tuple[float, ...]) -> tuple[float, list[dict]]:
    """Train the DGram-attention assignment without pruning at each step size, smallest
    first, until one ends unstable. Returns that step size (the largest scanned if none
    does) and one row per run."""
    suggestion = space.suggest(optuna.trial.FixedTrial(SCANNED))
    assignment = suggestion.assignment()
    label = ", ".join(f"{k.split('.')[1]}={v}" for k, v in SCANNED.items())
    rows = []
    for lr in lrs:
        config = dataclasses.replace(space.train_config(suggestion), spectral_lr=lr)
        t0 = time.perf_counter()
        result = train(config, assignment)
        logits = [m["max_logit"] for m in result.history if m.get("max_logit") is not None]
        final = logits[-1] if logits else math.nan
        unstable = ends_unstable(result.status, [final], space.pruner.max_logit)
        stop, _ = replay(space, result.history)
        rows.append({"lr": lr, "assignment": label, "status": result.status, "final_logit": final,
                     "peak_logit": max(logits, default=math.nan), "loss": result.final_val_loss,
                     "unstable": unstable, "pruner_stop": stop, "seconds": time.perf_counter() - t0})
        print(f"  scan {label} lr={lr:g}: {result.status}, final max logit {final:.3g}, "
              f"val loss {result.final_val_loss}, {'ends unstable' if unstable else 'stable'}",
              flush=True)
        if unstable:
            return lr, rows
    return lrs[-1], rows


# --------------------------------------------------------------------------- tables
def _fmt_loss(x: float) -> str:
    return f"{x:.4f}" if math.isfinite(x) else "—"


def compare(runs: dict[str, SearchRun], max_logit: float, budget: int) -> tuple[list[dict], set[str]]:
    """Summary rows per mode against the unpruned run, and the trials that end unstable."""
    base = runs["none"]
    unstable = {k for k, t in base.trials.items() if ends_unstable(t.status, t.final_logits, max_logit)}
    stable_losses = {k: t.loss for k, t in base.trials.items() if k not in unstable and math.isfinite(t.loss)}
    stable_winner = min(stable_losses, key=stable_losses.get) if stable_losses else None
    rows = []
    for mode, run in runs.items():
        on_unstable = [run.trials[k].steps for k in unstable if k in run.trials]
        pruned = [k for k, t in run.trials.items() if t.status == "unstable"]
        rows.append({
            "mode": mode,
            "steps": run.steps,
            "steps_ratio": run.steps / base.steps,
            "seconds": run.trial_seconds,
            "seconds_ratio": run.trial_seconds / base.trial_seconds if base.trial_seconds else math.nan,
            "unstable_steps": sum(on_unstable),
            "worst_stop": max(on_unstable) / budget if on_unstable else None,
            "pruned": len(pruned),
            "pruned_stable": sum(k not in unstable for k in pruned),
            "winner": run.winner,
            "same_winner": run.winner == base.winner,
            "same_stable_winner": run.winner == stable_winner,
        })
    return rows, unstable


def summary_table(rows: list[dict]) -> str:
    lines = ["| pruning | trial-steps | ÷ unpruned | trial wall s | ÷ unpruned | steps on trials that end "
             "unstable | latest stop of those (÷ budget) | pruned (of them stable) | winner | "
             "same winner as unpruned |",
             "|---|---:|---:|---:|---:|---:|---:|---|---|---|"]
    for r in rows:
        worst = "—" if r["worst_stop"] is None else f"{r['worst_stop']:.0%}"
        lines.append(
            f"| {r['mode']} | {r['steps']} | {r['steps_ratio']:.2f} | {r['seconds']:.0f} | "
            f"{r['seconds_ratio']:.2f} | {r['unstable_steps']} | {worst} | "
            f"{r['pruned']} ({r['pruned_stable']}) | {r['winner'] or '—'} | "
            f"{'yes' if r['same_winner'] else 'NO'} |")
    return "\n".join(lines) + "\n"


def trial_table(runs: dict[str, SearchRun], unstable: set[str]) -> str:
    base = runs["none"]
    modes = [m for m in runs if m != "none"]
    lines = ["| trial | assignment | unpruned: val loss | final max logit | ends unstable | "
             + " | ".join(f"{m}: steps" for m in modes) + " |",
             "|---:|---|---:|---:|---|" + "---|" * len(modes)]
    for key in base.order:
        t = base.trials[key]
        logit = ", ".join(f"{x:.3g}" for x in t.final_logits) or "—"
        if t.status != "completed":
            logit += f" ({t.status} at step {t.stop_step})"
        cells = []
        for m in modes:
            r = runs[m].trials.get(key)
            if r is None:
                cells.append("—")
            elif r.status == "unstable":
                cells.append(f"{r.steps} (pruned: {r.reason})")
            else:
                cells.append(f"{r.steps} ({r.status})")
        lines.append(f"| {t.number} | {key} | {_fmt_loss(t.loss)} | {logit} | "
                     f"{'yes' if key in unstable else 'no'} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def scan_table(rows: list[dict], chosen: float) -> str:
    lines = ["| spectral lr | assignment | status | peak max logit | final max logit | val loss | "
             "ends unstable | logit pruner would stop it at | s |",
             "|---:|---|---|---:|---:|---:|---|---|---:|"]
    for r in rows:
        loss = r["loss"] if r["loss"] is not None else math.nan
        stop = "—" if r["pruner_stop"] is None else f"step {r['pruner_stop']}"
        lines.append(f"| {r['lr']:g}{' (used)' if r['lr'] == chosen else ''} | {r['assignment']} | "
                     f"{r['status']} | {r['peak_logit']:.3g} | {r['final_logit']:.3g} | "
                     f"{_fmt_loss(loss)} | {'yes' if r['unstable'] else 'no'} | {stop} | "
                     f"{r['seconds']:.0f} |")
    return "\n".join(lines) + "\n"


def verdicts(rows: list[dict], unstable: set[str], base: SearchRun, lr: float) -> str:
    out = []
    stable = [k for k in base.trials if k not in unstable]
    for r in rows:
        if r["mode"] not in ("logit", "logit+median"):
            continue
        if not unstable:
            t1 = "no trial ends unstable, so there is nothing to stop early (target not applicable)"
        else:
            ok = r["worst_stop"] <= STOP_TARGET
            t1 = (f"trials that end unstable stopped by {r['worst_stop']:.0%} of their budget at the "
                  f"latest: target (≤ {STOP_TARGET:.0%}) {'met' if ok else 'NOT met'}")
        ok2 = r["steps_ratio"] <= COMPUTE_TARGET and r["same_winner"]
        t2 = (f"{r['steps_ratio']:.0%} of the unpruned trial-steps, winner "
              f"{'the same' if r['same_winner'] else 'different'}: target (≤ {COMPUTE_TARGET:.0%} with "
              f"the same winner) {'met' if ok2 else 'NOT met'}")
        floor = ""
        share = len(stable) / len(base.trials)
        if r["mode"] == "logit" and r["steps_ratio"] > COMPUTE_TARGET and share >= COMPUTE_TARGET:
            floor = (" (every trial ends stable: a pruner that stops only unstable trials has nothing "
                     "to save here)" if not unstable else
                     f" ({len(stable)} of {len(base.trials)} trials end stable and train to the end "
                     f"under a pruner that only stops unstable ones: its floor is {share:.0%} plus "
                     "the steps the unstable ones take before they are stopped)")
        out.append(f"- lr {lr:g}, {r['mode']}: {t1}; {t2}{floor}")
        if not r["same_winner"] and r["same_stable_winner"]:
            out.append(f"  - the unpruned winner ({base.winner}) ends unstable; the pruned search "
                       "picks the best of the trials that end stable, as it is meant to")
    return "\n".join(out) + "\n"


# --------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny", help="proxy preset: tiny (default), small, gpt2")
    parser.add_argument("--steps", type=int, default=300, help="steps per proxy run (default 300)")
    parser.add_argument("--repeats", type=int, default=1, help="seeds per assignment (default 1)")
    parser.add_argument("--solver", choices=("project", "dual"),
                        help="manifold-Muon solver (default: paper.yaml's, dual)")
    parser.add_argument("--device", default="cpu", help="cpu (default), cuda or auto")
    parser.add_argument("--spectral-lr", type=float,
                        help="the misbehaving step size; skips the scan")
    parser.add_argument("--scan", default=",".join(f"{x:g}" for x in SCAN),
                        help="step sizes to scan, smallest first (default %(default)s)")
    parser.add_argument("--median-startup", type=int, default=1,
                        help="MedianPruner n_startup_trials (default 1: the 4-point grid has too few "
                             "trials for Optuna's default 5, which would never prune)")
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES,
                        help="pruning settings to compare (none is always run)")
    parser.add_argument("--quick", action="store_true",
                        help="smoke run: 100 steps, scan 0.5,1 (other flags still apply)")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")
    parser.add_argument("--keep", type=Path, help="keep the run directories here")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    if args.quick:
        args.steps, args.scan = 100, "0.5,1"
    modes = ["none", *[m for m in args.modes if m != "none"]]
    torch.set_num_threads(args.threads)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    started = time.perf_counter()
    header_machine = machine()

    space = base_space(args)
    max_logit = space.pruner.max_logit
    budget = space.proxy.steps * space.repeats
    print(space.summary(), flush=True)

    scan_rows: list[dict] = []
    if args.spectral_lr is not None:
        bad_lr = args.spectral_lr
    else:
        bad_lr, scan_rows = scan(space, tuple(float(x) for x in args.scan.split(",")))
    lrs = [bad_lr] + ([STUDY_LR] if bad_lr != STUDY_LR else [])

    sections = []
    with tempfile.TemporaryDirectory() as tmp:
        runs_dir = args.keep or Path(tmp)
        for lr in lrs:
            runs = {m: run_one(mode_space(space, m, lr, args.median_startup), m, lr, runs_dir)
                    for m in modes}
            rows, unstable = compare(runs, max_logit, budget)
            sections.append((lr, runs, rows, unstable))

    p = space.proxy
    command = "python benchmarks/pruning.py " + " ".join(argv if argv is not None else sys.argv[1:])
    text = [
        f"# Pruning: logit growth vs loss-only vs none ({p.model} proxy)\n",
        f"{datetime.datetime.now().isoformat(timespec='seconds')}; `{command.strip()}`; "
        f"{header_machine}; {time.perf_counter() - started:.0f} s in all.\n",
        f"Search: `search_spaces/paper.yaml` (attn, mlp ∈ {{stiefel, dgram}}, grid of 4, seeded order) "
        f"at proxy scale: model `{p.model}`, {p.steps} steps × batch {p.batch_size}, solver `{p.solver}`"
        f"{' (K=' + str(p.optimizer_args.get('dual_steps')) + ')' if p.solver == 'dual' else ''}, "
        f"eval every {p.eval_every}, probe every {p.probe_every}, {space.repeats} seed(s) per "
        f"assignment. Logit-growth pruner: paper.yaml's (max_logit {max_logit:g}, trend from "
        f"{space.pruner.trend_min_logit:g} over {space.pruner.window} probes to the trial's budget, "
        f"min entropy {space.pruner.min_entropy:g}). Median: Optuna `MedianPruner(n_startup_trials="
        f"{args.median_startup}, n_warmup_steps=0)` on the val loss (reported every {p.eval_every} "
        "steps), logit rules off. *Ends unstable*: in the unpruned search, the run stopped non-finite "
        f"or a seed's last max logit is above {max_logit:g}. Trial-steps are exact (seeded runs); "
        "wall times are from a shared machine and only indicative.\n",
    ]
    if scan_rows:
        text += ["## Scan: where does DGram attention misbehave?\n",
                 f"`attn=dgram, mlp=stiefel` without pruning, smallest step size first, until it ends "
                 f"unstable; that step size is used below (the study's own is {STUDY_LR}).\n",
                 scan_table(scan_rows, bad_lr)]
    elif args.spectral_lr is not None:
        text.append(f"Misbehaving step size given on the command line: {bad_lr:g} (no scan).\n")
    for lr, runs, rows, unstable in sections:
        text += [f"## Spectral lr {lr:g}\n",
                 "Order of the trials: " + "; ".join(runs["none"].order) + ".\n",
                 summary_table(rows), "\n" + trial_table(runs, unstable), "\n" + verdicts(rows, unstable, runs["none"], lr)]
    publish("\n".join(text), args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
