"""Does the stability pruner stop the runs that instability harms, and only those?

Ground truth is defined by **harm**, never by a logit threshold. paper.yaml's grid
(attention and MLP each Stiefel or DGram) is trained without pruning, ``--repeats`` seeds
per assignment, at each spectral step size of ``--lrs``, once at the target's length
(``--target-steps``, default: the proxy's ``--steps``). An assignment is *harmed* at a
step size when, in those target runs,

- (a) a seed's run stopped non-finite or ended with a non-finite validation loss; or
- (b) a seed's validation loss rose: its final value is above the lowest it reached by
  more than 2 s; or
- (c) its mean final validation loss is worse than that of *every* assignment with
  bounded attention (Stiefel attention: σ_max(W_Q) = σ_max(W_K) = 1, so its logits cannot
  grow past d/√d_head; those not harmed by (a) or (b)) by more than 2 s·√(2/r).

``s`` is the seed noise: the pooled standard deviation of the final validation loss over
the seeds of each assignment (r seeds), or ``--noise`` with one seed.

The search at the proxy's length (``--steps``) is then replayed through each pruning
setting, exactly as the search asks its pruner: one trial per assignment in a seeded
order, the seeds one after the other, ``trial.report`` of the first seed's validation
losses, the probe rows (``probe_row``: the trainer's metrics and Σ η of the proxy's
schedule) stored before every ``should_prune()``, one pruned seed prunes the trial. The
trials carry the forecast's inputs: the target's Σ η (``schedule_sum_eta`` of
``--target-steps`` at the same step size), its length, and the model's d/√d_head. The
runs are seeded, so a pruned run is its unpruned run's prefix and the replay is exact.

- ``none``: nothing pruned (the trainer still stops a non-finite run: it cannot go on);
- ``logit``: :class:`~geosearch.search.horizon.pruner.LogitGrowthPruner` with its defaults
  (max logit and forecast against 10 × d/√d_head, entropy collapse, non-finite);
- ``median``: Optuna's ``MedianPruner`` on the validation loss alone;
- ``logit+median``: the first wrapping the second.

Reported per setting: trial-steps (training steps summed over trials and seeds) as a
fraction of the unpruned search's, the pruned trials, **false prunes** (pruned, but not
harmed), **missed harms** (harmed, not pruned), and the winner (lowest mean final
validation loss among completed trials) against the best unharmed assignment. Also the
forecast itself: the max logit forecast at the target from a quarter, a half and all of
the proxy run, against the target run's final max logit.

Not a test: it prints tables and writes them to ``benchmarks/results/pruning.md``.

Usage::

    python benchmarks/pruning.py                     # tiny, 300 steps, 2 seeds, lr 0.02,0.2,0.5
    python benchmarks/pruning.py --target-steps 1500 # forecast 5x past the proxy's length
    python benchmarks/pruning.py --steps 100 --lrs 0.05,0.5 --solver project   # a quick check
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import math
import random
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import optuna
import torch
from optuna.trial import TrialState, create_trial

from _common import machine, publish  # benchmarks/ is on sys.path when a script runs
from geosearch.proxy.config import TrainConfig
from geosearch.proxy.train import train
from geosearch.search.horizon.forecast import schedule_sum_eta, stiefel_logit_bound
from geosearch.search.horizon.probe_rows import probe_row
from geosearch.search.horizon.pruner import LogitGrowthPruner
from geosearch.search.records import (
    BUDGET_STEPS,
    LOGIT_SCALE,
    PROBE_HISTORY,
    TARGET_LOGIT_SCALE,
    TARGET_STEPS,
    TARGET_SUM_ETA,
)
from geosearch.search.space.plan import plan_study
from geosearch.search.space.spec import SearchSpace, apply_overrides, load_space

RESULTS = Path(__file__).parent / "results" / "pruning.md"
MODES = ("none", "logit", "median", "logit+median")
BOUNDED_ATTENTION = ("stiefel",)  # attention geometries that hold σ_max at 1


# --------------------------------------------------------------------------- runs
@dataclass
class Run:
    """One seed of one assignment, trained without pruning."""

    status: str
    history: list[dict]
    config: TrainConfig

    @property
    def steps(self) -> int:
        """Steps trained: the last record's step (a record is written where a run stops)."""
        return self.history[-1]["step"] if self.history else 0

    @property
    def vals(self) -> list[float]:
        return [m["val_loss"] for m in self.history if m.get("val_loss") is not None]

    @property
    def final_val(self) -> float:
        return self.vals[-1] if self.vals else math.nan

    @property
    def final_logit(self) -> float:
        logits = [m["max_logit"] for m in self.history if m.get("max_logit") is not None]
        return logits[-1] if logits else math.nan

    def sum_eta(self, step: int) -> float:
        c = self.config.resolved()
        return schedule_sum_eta(step, steps=c.steps, peak=c.spectral_lr,
                                warmup_steps=c.warmup_steps, min_lr_ratio=c.min_lr_ratio)


def proxy_space(args: argparse.Namespace) -> SearchSpace:
    """paper.yaml at the benchmark's proxy scale, at its shared step (no step grid)."""
    overrides = {"proxy.device": args.device, "hyperparams.step_grid": None}
    if args.solver:
        overrides["proxy.solver"] = args.solver
    return apply_overrides(load_space("paper"), overrides, model=args.model, steps=args.steps,
                           repeats=args.repeats)


def assignments(space: SearchSpace) -> dict[str, dict[str, str]]:
    """label ("attn=dgram, mlp=stiefel") -> FixedTrial params, for paper.yaml's grid."""
    keys = list(space.geometries)
    out: dict[str, dict[str, str]] = {}

    def walk(i: int, params: dict[str, str]) -> None:
        if i == len(keys):
            out[", ".join(f"{k}={v}" for k, v in params.items())] = {
                f"geometry.{k}": v for k, v in params.items()}
            return
        for g in space.geometries[keys[i]]:
            walk(i + 1, {**params, keys[i]: g})

    walk(0, {})
    return out


def train_grid(space: SearchSpace, lr: float, steps: int) -> dict[str, list[Run]]:
    """Every assignment × seed at spectral step ``lr`` for ``steps`` steps, unpruned."""
    runs: dict[str, list[Run]] = {}
    for label, params in assignments(space).items():
        suggestion = space.suggest(optuna.trial.FixedTrial(params))
        for r in range(space.repeats):
            config = space.train_config(suggestion, repeat=r)
            config = dataclasses.replace(config, spectral_lr=lr, steps=steps)
            t0 = time.perf_counter()
            result = train(config, suggestion.assignment())
            run = Run(result.status, result.history, config)
            runs.setdefault(label, []).append(run)
            print(f"    {label} seed {config.seed}, lr {lr:g}, {steps} steps: {result.status}, "
                  f"val {run.final_val:.4f}, max logit {run.final_logit:.3g} "
                  f"({time.perf_counter() - t0:.0f} s)", flush=True)
    return runs


def logit_scale(space: SearchSpace) -> float:
    """The proxy model's d/√d_head (presets: n_embd, n_head)."""
    from geosearch.proxy.data import load_corpus
    from geosearch.models.zoo import build_meta_model

    corpus = load_corpus(space.proxy.data)
    cfg = build_meta_model(space.proxy.model, vocab_size=corpus.vocab_size,
                           model_args=space.proxy.model_args).config
    if not (isinstance(cfg, dict) and {"n_embd", "n_head"} <= cfg.keys()):
        raise SystemExit(f"--model {space.proxy.model}: this benchmark reads d/√d_head of the "
                         "proxy presets (tiny, small, gpt2) only")
    return stiefel_logit_bound(cfg["n_embd"], cfg["n_embd"] // cfg["n_head"])


# --------------------------------------------------------------------------- ground truth
@dataclass
class Harm:
    """The ground truth for one assignment at one step size."""

    loss: float  # mean final val loss over seeds (nan if any is not finite)
    loss_sd: float
    final_logit: float  # seed 0's last probed max logit
    reasons: list[str] = field(default_factory=list)

    @property
    def harmed(self) -> bool:
        return bool(self.reasons)


def seed_noise(runs: dict[str, list[Run]]) -> float | None:
    """Pooled standard deviation of the final val loss over each assignment's seeds."""
    num = den = 0.0
    for seeds in runs.values():
        vals = [r.final_val for r in seeds if math.isfinite(r.final_val)]
        if len(vals) > 1:
            num += statistics.variance(vals) * (len(vals) - 1)
            den += len(vals) - 1
    return math.sqrt(num / den) if den else None


def judge_harm(runs: dict[str, list[Run]], noise: float) -> dict[str, Harm]:
    """Criteria (a)-(c) of the module docstring, per assignment."""
    out: dict[str, Harm] = {}
    for label, seeds in runs.items():
        finals = [r.final_val for r in seeds]
        finite = all(math.isfinite(v) for v in finals)
        harm = Harm(loss=statistics.fmean(finals) if finite else math.nan,
                    loss_sd=statistics.stdev(finals) if finite and len(finals) > 1 else math.nan,
                    final_logit=seeds[0].final_logit)
        for r in seeds:
            if r.status != "completed" or not math.isfinite(r.final_val):
                harm.reasons.append(f"(a) seed {r.config.seed} {r.status} at step {r.steps}, "
                                    f"final val {r.final_val:.4g}")
            elif r.final_val > min(r.vals) + 2 * noise:
                harm.reasons.append(f"(b) seed {r.config.seed} val rose {min(r.vals):.4f} -> "
                                    f"{r.final_val:.4f}")
        out[label] = harm
    bounded = [h.loss for label, h in out.items()
               if _attention(label) in BOUNDED_ATTENTION and not h.harmed]
    if bounded:
        r = min(len(s) for s in runs.values())
        margin = 2 * noise * math.sqrt(2 / r)
        for label, h in out.items():
            if _attention(label) not in BOUNDED_ATTENTION and not h.harmed \
                    and h.loss > max(bounded) + margin:
                h.reasons.append(f"(c) {h.loss:.4f} > bounded attention's worst "
                                 f"{max(bounded):.4f} + {margin:.3f}")
    return out


def _attention(label: str) -> str:
    return dict(part.split("=") for part in label.split(", "))["attn"]


# --------------------------------------------------------------------------- the replay
@dataclass
class Outcome:
    """One trial of a replayed search."""

    steps: int
    pruned: bool
    reason: str | None
    value: float  # mean final val loss (completed trials)


def make_pruner(mode: str, median_startup: int) -> optuna.pruners.BasePruner:
    median = optuna.pruners.MedianPruner(n_startup_trials=median_startup, n_warmup_steps=0)
    return {"none": optuna.pruners.NopPruner(), "logit": LogitGrowthPruner(),
            "median": median, "logit+median": LogitGrowthPruner(median)}[mode]


def replay(pruner: optuna.pruners.BasePruner, runs: dict[str, list[Run]], order: list[str],
           attrs: dict) -> dict[str, Outcome]:
    """The search over ``runs`` (in ``order``) as ``pruner`` would have stopped it."""
    study = optuna.create_study(pruner=pruner)
    out = {}
    for label in order:
        trial = study.ask()
        for key, value in {**attrs, BUDGET_STEPS: runs[label][0].config.steps}.items():
            trial.set_user_attr(key, value)
        steps, reason = 0, None
        for r, run in enumerate(runs[label]):
            stop, reason = _replay_seed(study, trial, run, report=r == 0)
            steps += stop if stop is not None else run.steps
            if stop is not None or run.status != "completed":
                reason = reason or f"trainer: {run.status} at step {run.steps}"
                break
        if reason is not None:
            study.tell(trial, state=TrialState.PRUNED)
            out[label] = Outcome(steps, True, reason, math.nan)
        else:
            value = statistics.fmean(r.final_val for r in runs[label])
            study.tell(trial, value)
            out[label] = Outcome(steps, False, None, value)
    return out


def _replay_seed(study: optuna.Study, trial: optuna.Trial, run: Run,
                 report: bool) -> tuple[int | None, str | None]:
    rows: list[dict] = []
    for m in run.history:
        if report and m.get("val_loss") is not None:
            trial.report(float(m["val_loss"]), m["step"])
        if m.get("max_logit") is not None:
            rows.append(probe_row(m, sum_eta=run.sum_eta(m["step"])))
            trial.set_user_attr(PROBE_HISTORY, list(rows))
        if trial.should_prune():
            why = getattr(study.pruner, "reason", None)
            return m["step"], (why(study, trial) if callable(why) else None) or \
                f"{type(study.pruner).__name__} at step {m['step']}"
    return None, None


# --------------------------------------------------------------------------- tables
def _loss(x: float) -> str:
    return f"{x:.4f}" if math.isfinite(x) else "—"


def truth_table(harm: dict[str, Harm], noise: float) -> str:
    lines = [f"Seed noise s = {noise:.4f}.\n",
             "| assignment | final val loss (mean ± sd) | final max logit (seed 0) | harmed |",
             "|---|---:|---:|---|"]
    for label, h in harm.items():
        lines.append(f"| {label} | {_loss(h.loss)} ± {_loss(h.loss_sd)} | {h.final_logit:.3g} | "
                     f"{'; '.join(h.reasons) if h.harmed else 'no'} |")
    return "\n".join(lines) + "\n"


def summary_rows(outcomes: dict[str, dict[str, Outcome]], harm: dict[str, Harm]) -> list[dict]:
    base = sum(o.steps for o in outcomes["none"].values())
    unharmed = {k: h.loss for k, h in harm.items() if not h.harmed}
    best = min(unharmed, key=unharmed.get) if unharmed else None
    rows = []
    for mode, trials in outcomes.items():
        completed = {k: o.value for k, o in trials.items() if not o.pruned}
        winner = min(completed, key=completed.get) if completed else None
        pruned = [k for k, o in trials.items() if o.pruned]
        rows.append({
            "mode": mode, "steps": sum(o.steps for o in trials.values()),
            "fraction": sum(o.steps for o in trials.values()) / base if base else math.nan,
            "pruned": len(pruned), "false": [k for k in pruned if not harm[k].harmed],
            "missed": [k for k, h in harm.items() if h.harmed and not trials[k].pruned],
            "winner": winner, "right_winner": winner == best, "best": best})
    return rows


def summary_table(rows: list[dict]) -> str:
    lines = ["| pruning | trial-steps | ÷ unpruned | pruned | false prunes | missed harms | "
             "winner | = best unharmed |", "|---|---:|---:|---:|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['mode']} | {r['steps']} | {r['fraction']:.2f} | {r['pruned']} | "
                     f"{len(r['false'])}{_names(r['false'])} | {len(r['missed'])}"
                     f"{_names(r['missed'])} | {r['winner'] or '—'} | "
                     f"{'yes' if r['right_winner'] else 'NO'} |")
    return "\n".join(lines) + "\n"


def _names(labels: list[str]) -> str:
    return f" ({'; '.join(labels)})" if labels else ""


def trial_table(outcomes: dict[str, dict[str, Outcome]], order: list[str]) -> str:
    modes = [m for m in outcomes if m != "none"]
    lines = ["| trial | assignment | " + " | ".join(f"{m}: steps" for m in modes) + " |",
             "|---:|---|" + "---|" * len(modes)]
    for i, label in enumerate(order):
        cells = [f"{o.steps} (pruned: {o.reason})" if o.pruned else f"{o.steps}"
                 for o in (outcomes[m][label] for m in modes)]
        lines.append(f"| {i} | {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def forecast_table(proxy: dict[str, list[Run]], target: dict[str, list[Run]], attrs: dict) -> str:
    """Seed 0's forecast at the target from 1/4, 1/2 and all of the proxy run."""
    pruner = LogitGrowthPruner()
    study = optuna.create_study()
    lines = ["| assignment | target's final max logit | forecast from ¼ of the proxy | from ½ | "
             "from all | ratio (all) |", "|---|---:|---:|---:|---:|---:|"]
    for label, seeds in proxy.items():
        run, truth = seeds[0], target[label][0].final_logit
        cells = []
        for part in (4, 2, 1):
            rows = [probe_row(m, sum_eta=run.sum_eta(m["step"])) for m in run.history
                    if m.get("max_logit") is not None and m["step"] <= run.config.steps // part]
            frozen = create_trial(state=TrialState.RUNNING,
                                  user_attrs={**attrs, PROBE_HISTORY: rows})
            f = pruner.forecast(study, frozen)
            cells.append("—" if f is None else f"{f.value:.3g} ({f.low:.3g}–{f.high:.3g})")
            ratio = "—" if f is None else f"{f.value / truth:.2f}"
        lines.append(f"| {label} | {truth:.3g} | " + " | ".join(cells) + f" | {ratio} |")
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- main
def one_step_size(space: SearchSpace, lr: float, args: argparse.Namespace, scale: float,
                  order: list[str]) -> str:
    print(f"  spectral lr {lr:g}: proxy runs ({args.steps} steps)", flush=True)
    proxy = train_grid(space, lr, args.steps)
    if args.target_steps == args.steps:
        target = proxy
    else:
        print(f"  spectral lr {lr:g}: target runs ({args.target_steps} steps)", flush=True)
        target = train_grid(space, lr, args.target_steps)
    noise = seed_noise(target) if args.noise is None else args.noise
    if noise is None:
        raise SystemExit("one seed per assignment: give the seed noise with --noise")
    harm = judge_harm(target, noise)
    t = target[order[0]][0].config.resolved()
    attrs = {TARGET_SUM_ETA: schedule_sum_eta(t.steps, steps=t.steps, peak=lr,
                                                   warmup_steps=t.warmup_steps,
                                                   min_lr_ratio=t.min_lr_ratio),
             TARGET_STEPS: t.steps, LOGIT_SCALE: scale, TARGET_LOGIT_SCALE: scale}
    outcomes = {m: replay(make_pruner(m, args.median_startup), proxy, order, attrs)
                for m in ["none", *[m for m in args.modes if m != "none"]]}
    rows = summary_rows(outcomes, harm)
    logit = next(r for r in rows if r["mode"] == "logit")
    verdict = (f"Logit pruner at lr {lr:g}: {len(logit['false'])} false prune(s) (target 0), "
               f"{len(logit['missed'])} missed harm(s), {logit['fraction']:.0%} of the unpruned "
               f"trial-steps; its winner {'is' if logit['right_winner'] else 'is NOT'} the best "
               f"unharmed assignment ({logit['best']}).")
    print("  " + verdict, flush=True)
    return "\n".join([
        f"## Spectral lr {lr:g} (target Σ η {attrs[TARGET_SUM_ETA]:.3g}, "
        f"proxy Σ η {proxy[order[0]][0].sum_eta(args.steps):.3g})\n",
        "Ground truth (unpruned target runs):\n", truth_table(harm, noise),
        "Replayed search, trial order: " + "; ".join(order) + ".\n", summary_table(rows),
        "\n" + trial_table(outcomes, order),
        "\nForecast at the target (seed 0; value and 90% interval, in the model's logits):\n",
        forecast_table(proxy, target, attrs), f"\n{verdict}\n"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny", help="proxy preset: tiny (default), small, gpt2")
    parser.add_argument("--steps", type=int, default=300, help="steps per proxy run (default 300)")
    parser.add_argument("--target-steps", type=int,
                        help="length of the target runs that define harm (default: --steps)")
    parser.add_argument("--repeats", type=int, default=2, help="seeds per assignment (default 2)")
    parser.add_argument("--lrs", default="0.02,0.2,0.5",
                        help="spectral step sizes, comma-separated (default %(default)s)")
    parser.add_argument("--noise", type=float,
                        help="seed noise s of the final val loss (needed with --repeats 1)")
    parser.add_argument("--solver", choices=("project", "dual"),
                        help="manifold-Muon solver (default: paper.yaml's, dual)")
    parser.add_argument("--device", default="cpu", help="cpu (default), cuda or auto")
    parser.add_argument("--median-startup", type=int, default=1,
                        help="MedianPruner n_startup_trials (default 1: Optuna's 5 never prunes "
                             "a grid of 4)")
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES,
                        help="pruning settings to replay (none is always replayed)")
    parser.add_argument("--order-seed", type=int, default=0, help="seed of the trial order")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    args.target_steps = args.target_steps or args.steps
    if args.target_steps < args.steps:
        parser.error("--target-steps must be at least --steps")
    torch.set_num_threads(args.threads)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    started, header_machine = time.perf_counter(), machine()

    space = proxy_space(args)
    scale = logit_scale(space)
    order = list(assignments(space))
    random.Random(args.order_seed).shuffle(order)
    print(space.summary(plan_study(space).header_lines()), flush=True)
    sections = [one_step_size(space, float(lr), args, scale, order) for lr in args.lrs.split(",")]

    p = space.proxy
    text = [
        f"# Pruning by harm: logit forecast vs loss-only vs none ({p.model} proxy)\n",
        f"{datetime.datetime.now().isoformat(timespec='seconds')}; {header_machine}; "
        f"{time.perf_counter() - started:.0f} s in all.\n",
        f"Search: `search_spaces/paper.yaml` (attn, mlp ∈ {{stiefel, dgram}}) at proxy scale: "
        f"model `{p.model}` (d/√d_head {scale:.3g}), {args.steps} steps × batch {p.batch_size}, "
        f"solver `{p.solver}`, eval every {p.eval_every}, probe every {p.probe_every}, "
        f"{space.repeats} seed(s) per assignment; target runs of {args.target_steps} steps at the "
        f"same step size define harm. Logit pruner: `LogitGrowthPruner()` defaults (threshold "
        f"10 × d/√d_head = {10 * scale:.3g}, forecast's 90% interval, min entropy 0.01). Median: "
        f"`MedianPruner(n_startup_trials={args.median_startup}, n_warmup_steps=0)`. Harm "
        "criteria (a)-(c) and the replay are described in the script's docstring. Trial-steps "
        "are exact (seeded runs).\n",
        *sections,
    ]
    publish("\n".join(text), args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
