"""How fast is the proxy trainer, and what do the geometries cost per step?

Three measurements, printed and written to ``benchmarks/results/proxy_throughput.md``:

1. Trainer overhead: ``geosearch.proxy.train.train`` with every module type on AdamW
   against a plain PyTorch loop over the same model, batches, AdamW groups, clip and
   schedule (no Accelerate, no probes, no per-step host sync). Target: tokens/s ratio
   >= 0.95.
2. Probe cost: the time of one probe (attention logits/entropy on the probe batch, σ_max
   and constraint errors) divided by ``probe_every`` training steps. Target: <= 5%.
3. ms/step of the proxy under each uniform geometry and the reference study's two mixed
   assignments (attn=stiefel,mlp=dgram; attn=dgram,mlp=stiefel), as ratios to AdamW.

Timing on a shared machine: every step time here is the median over blocks of
``BLOCK`` steps (the first block, which allocates and picks kernels, left out), and the
best of ``--repeats`` runs, the runs of different loops interleaved. A burst of other
work then slows one block of one run, not the number.

Not a test: numbers depend on the machine. Usage::

    python benchmarks/proxy_throughput.py                       # small preset, 60 steps, best of 3
    python benchmarks/proxy_throughput.py --model tiny --steps 30 --repeats 1   # quick look
    python benchmarks/proxy_throughput.py --threads 1           # steadier on a busy machine
"""

from __future__ import annotations

import argparse
import datetime
import math
import os
import platform
import statistics
import time
from pathlib import Path

import torch

import geosearch.proxy.train as train_mod
from _common import publish  # benchmarks/ is on sys.path when a script runs
from geosearch.assignment import Assignment
from geosearch.manifolds import geometry_names
from geosearch.build import build_optimizer
from geosearch.proxy.data import get_batch, load_corpus
from geosearch.models.model import GPT, make_config
from geosearch.proxy.config import TrainConfig, TrainResult
from geosearch.proxy.train import train

RESULTS = Path(__file__).parent / "results" / "proxy_throughput.md"
ADAMW = "attn=adamw,mlp=adamw"
MIXED = ("attn=stiefel,mlp=dgram", "attn=dgram,mlp=stiefel")
BLOCK = 5  # steps per timed block


def plain_loop_ms(config: TrainConfig, optimizer: str = "torch") -> float:
    """ms/step of a hand-written loop: same model, data, AdamW groups, clip, schedule.

    ``optimizer="torch"``: ``torch.optim.AdamW``; ``"geosearch"``: ``build_optimizer`` with
    every type on AdamW (``ManifoldMuon``'s AdamW groups), to tell the trainer's overhead
    from the optimizer's.
    """
    config = config.resolved()
    device = torch.device("cuda" if config.device != "cpu" and torch.cuda.is_available() else "cpu")
    torch.manual_seed(config.seed)
    corpus = load_corpus(config.data)
    model_config = make_config(config.model, vocab_size=corpus.vocab_size, **config.model_args)
    model = GPT(model_config).to(device)
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": config.weight_decay},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    if optimizer == "torch":
        opt = torch.optim.AdamW(groups, lr=config.lr, betas=config.betas)
    else:
        opt = build_optimizer(model, Assignment.parse(ADAMW), verbose=False, lr=config.lr,
                              betas=config.betas, weight_decay=config.weight_decay)
    warmup, steps, floor = config.warmup_steps, config.steps, config.min_lr_ratio

    def factor(s: int) -> float:
        if s < warmup:
            return (s + 1) / warmup
        progress = min(1.0, (s - warmup) / max(1, steps - warmup))
        return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, factor)
    gen = torch.Generator().manual_seed(config.seed)
    blocks, t0 = [], time.perf_counter()
    for step in range(1, steps + 1):
        x, y = get_batch(corpus.train, config.batch_size, model_config.block_size, gen)
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        _, loss = model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        if step % BLOCK == 0:
            if device.type == "cuda":
                torch.cuda.synchronize()
            blocks.append((time.perf_counter() - t0) / BLOCK)
            t0 = time.perf_counter()
    return 1e3 * statistics.median(blocks[1:])


def trainer_ms(config: TrainConfig, assignment: str) -> tuple[float, TrainResult]:
    """ms/step of ``train`` (median over its records' step_ms, which exclude probe time)."""
    result = train(config, Assignment.parse(assignment))
    return statistics.median(m["step_ms"] for m in result.history[1:]), result


def probe_ms(config: TrainConfig, assignment: str) -> float:
    """Median wall time of one probe during a run."""
    spent: list[float] = []
    original = train_mod._Run.probe

    def timed(self):
        t0 = time.perf_counter()
        out = original(self)
        spent.append(time.perf_counter() - t0)
        return out

    train_mod._Run.probe = timed
    try:
        train(config, Assignment.parse(assignment))
    finally:
        train_mod._Run.probe = original
    return 1e3 * statistics.median(spent)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="small")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--solver", default="project")
    parser.add_argument("--probe-every", type=int, default=TrainConfig.probe_every)
    parser.add_argument("--repeats", type=int, default=3, help="best of this many runs")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch CPU threads (1 is steadier on a shared machine)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.steps < 3 * BLOCK:
        parser.error(f"--steps must be at least {3 * BLOCK}")

    base = dict(model=args.model, steps=args.steps, batch_size=args.batch_size, device=args.device,
                solver=args.solver)
    # records (with probes, whose time step_ms leaves out) every BLOCK steps; one eval at the end
    timing = TrainConfig(**base, eval_every=args.steps, probe_every=BLOCK)
    tokens = args.batch_size * make_config(args.model).block_size
    cuda = args.device != "cpu" and torch.cuda.is_available()
    lines = [f"# proxy throughput ({datetime.date.today()})", "",
             f"model `{args.model}`, batch {args.batch_size}, {args.steps} steps, solver "
             f"`{args.solver}`, best of {args.repeats}; torch {torch.__version__}, "
             f"{platform.machine()}, {torch.get_num_threads()} threads, load average "
             f"{os.getloadavg()[0]:.1f} at start, device "
             + (torch.cuda.get_device_name() if cuda else "cpu"), ""]
    train(TrainConfig(**{**base, "steps": 5}, eval_every=5, probe_every=5),
          Assignment.parse(ADAMW))  # warm up allocator, kernels, corpus cache

    plain = plain_ours = ours = math.inf
    for _ in range(args.repeats):
        plain = min(plain, plain_loop_ms(timing))
        plain_ours = min(plain_ours, plain_loop_ms(timing, "geosearch"))
        ours = min(ours, trainer_ms(timing, ADAMW)[0])
    lines += ["## trainer vs plain PyTorch loop (all AdamW)", "",
              "| loop | ms/step | tokens/s | ratio of tokens/s |", "|---|---:|---:|---:|",
              f"| plain loop, torch.optim.AdamW | {plain:.1f} | {1e3 * tokens / plain:,.0f} | 1.00 |",
              f"| plain loop, ManifoldMuon (AdamW groups) | {plain_ours:.1f} | "
              f"{1e3 * tokens / plain_ours:,.0f} | {plain / plain_ours:.3f} |",
              f"| geosearch train | {ours:.1f} | {1e3 * tokens / ours:,.0f} | "
              f"{plain / ours:.3f} (target >= 0.95) |", ""]

    names = [ADAMW] + [f"attn={g},mlp={g}" for g in geometry_names() if g != "adamw"] + list(MIXED)
    best: dict[str, float] = {}
    results: dict[str, TrainResult] = {}
    probe = math.inf
    probing = TrainConfig(**base, eval_every=args.steps, probe_every=args.probe_every)
    for _ in range(args.repeats):
        probe = min(probe, probe_ms(probing, MIXED[0]))
        for name in names:
            ms, results[name] = trainer_ms(timing, name)
            best[name] = min(best.get(name, math.inf), ms)
    share = probe / args.probe_every / best[MIXED[0]]
    lines += ["## probe cost", "",
              f"{MIXED[0]}: one probe takes {probe:.1f} ms, every {args.probe_every} steps of "
              f"{best[MIXED[0]]:.1f} ms: **{100 * share:.1f}%** of training time (target <= 5%)", ""]
    lines += ["## ms/step by assignment", "",
              "| assignment | ms/step | × AdamW | status | val loss |", "|---|---:|---:|---|---:|"]
    for name in names:
        loss = results[name].final_val_loss
        lines.append(f"| {name} | {best[name]:.1f} | {best[name] / best[ADAMW]:.2f} | "
                     f"{results[name].status} | {'-' if loss is None else f'{loss:.3f}'} |")
    publish("\n".join(lines) + "\n", RESULTS)


if __name__ == "__main__":
    main()
