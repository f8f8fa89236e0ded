"""GPU readiness: a bf16 search, bf16 against fp32, optimizer step times, bf16 numerics.

One script, at most 5 minutes on one GPU, that checks what a user's first GPU run needs:

(a) a short default search (the shipped ``default`` space on the ``tiny`` proxy, one seed,
    few steps) through ``run_search`` on CUDA in bf16: every trial completes and a winner
    is ranked;
(b) one proxy run in bf16 against the same run in fp32: the final validation losses
    differ by at most ``max(0.03, 2 × |fp32 seed 0 − fp32 seed 1|)`` nats (two seeds in
    fp32 measure the run-to-run noise in the same run; 0.03 nats, about 1% of a proxy
    loss, is the floor when the seeds happen to agree);
(c) the time of one optimizer step per geometry (``ManifoldMuon``'s adamw group, euclidean,
    stiefel, dgram, oblique; project and dual solvers) against ``torch.optim.AdamW`` and
    ``torch.optim.Muon``, on GPT-2-small weight shapes, with the precision of each row:
    weights fp32 (a bf16 run as geosearch trains it: Accelerate's bf16 mixed precision
    autocasts the matmuls of the forward and backward passes and keeps the weights, their
    gradients and the optimizer step in fp32) and weights bf16 (a model cast to bf16), and
    the precision of the Newton–Schulz iteration (``torch.optim.Muon``: bf16;
    ``ManifoldMuon``: fp32, msign's bf16 iteration being no optimizer setting; one msign
    alone in each);
(d) msign and the retractions with bf16 tensors, against float32. With u = 2⁻⁸ the bf16
    unit roundoff: a retraction passes when the constraint error of its bf16 result is at
    most 2u (what rounding a point of the set to bf16 can cost: each entry moves by at most
    u relative, so WᵀW moves by at most 2u per pair of unit-norm columns) and it lies within
    3u of the fp32 result, relative to its largest entry (the input's rounding, u, through
    a retraction that at most doubles it near the set, plus the output's rounding, u); msign
    passes when bf16 and fp32 directions are within 0.1 in spectral norm (below the ±0.12
    spread of singular values that 5 Polar Express steps leave by design). The floor
    column (the fp32 result rounded to bf16) shows what rounding alone costs.

Accelerate allows one precision per process, so (a)+(b, bf16) and (b, fp32) run in two
child processes of this script; (c) and (d) run here. Without CUDA (or with
``--device cpu``) it runs a CPU fallback on smaller shapes, marked "CPU fallback" in the
table. The table goes to ``benchmarks/results/gpu_check.md``; the exit code is 1 when a
check fails.

Usage::

    python benchmarks/gpu_check.py                 # on a GPU: about 2-3 minutes
    python benchmarks/gpu_check.py --device cpu    # the CPU fallback
    python benchmarks/gpu_check.py --quick         # a few seconds of work per part (tests)
"""

from __future__ import annotations

import argparse
import dataclasses
import io
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this checkout's geosearch, also when it is not installed

import optuna  # noqa: E402
import torch  # noqa: E402

from _common import machine, publish  # noqa: E402  (benchmarks/ is on sys.path when a script runs)
from geosearch.manifolds import get_manifold, msign  # noqa: E402
from geosearch.optim.muon import ManifoldMuon  # noqa: E402
from optimizer_step import LR, SHAPES, run_case  # noqa: E402

RESULTS = Path(__file__).parent / "results" / "gpu_check.md"
ASSIGNMENT = {"geometry.attn": "stiefel", "geometry.mlp": "dgram"}  # the bf16/fp32 pair's point
LOSS_FLOOR = 0.03
TIMED_GEOMETRIES = ("euclidean", "stiefel", "dgram", "oblique")
RETRACTED = ("stiefel", "dgram", "oblique", "sphere", "spectral_ball")
BF16_U = 2.0 ** -8  # bf16 unit roundoff (8 significand bits)
MSIGN_TOL = 0.1
CHILD_TIMEOUT = 240  # seconds; the whole check stays under 5 minutes on a GPU


@dataclasses.dataclass(frozen=True)
class Sizes:
    """How big each part is: the proxy run and the matrices."""

    model: str
    steps: int
    points: int  # assignments of the search: 4 (the default space) or 2 (quick)
    batch_size: int
    eval_every: int
    shapes: list[tuple[int, int]]
    warmup: int
    repeats: int


def sizes(device: str, quick: bool) -> Sizes:
    """The GPU setting, the CPU fallback, or the quick one (a few seconds per part)."""
    if quick:
        return Sizes("tiny", 6, 2, 2, 3, [(48, 16), (16, 48)], 1, 2)
    if device == "cuda":
        return Sizes("tiny", 100, 4, 16, 25, SHAPES["gpt2"], 3, 10)
    return Sizes("tiny", 40, 4, 4, 20, SHAPES["small"], 1, 3)


# --------------------------------------------------------------------------- child processes
def _space(size: Sizes, device: str, precision: str):
    from geosearch.search.space.spec import apply_overrides, load_space

    sets = [f"proxy.mixed_precision={precision}", f"proxy.eval_every={size.eval_every}",
            f"proxy.probe_every={size.eval_every}", "proxy.eval_batches=2", "proxy.probe_batch_size=2",
            "ladder.rungs=1", "ladder.stability_steps=null", "baselines=[]", "max_repeats=null"]
    # a check of the GPU path, not of the horizon, baselines or seeding: the proxy run only
    if size.points == 2:
        sets.append("geometries.mlp=[dgram]")  # attn in {stiefel, dgram}
    return apply_overrides(load_space("default"), sets, name=f"gpu-check-{precision}",
                           model=size.model, steps=size.steps, batch_size=size.batch_size,
                           repeats=1, device=device)


def child(precision: str, seeds: list[int], search: bool, size: Sizes, device: str) -> dict:
    """In a child process: the bf16 search (if asked) and one proxy run per seed."""
    from geosearch.proxy.train import train
    from geosearch.search.study.run import run_search

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    space = _space(size, device, precision)
    out: dict = {"precision": precision, "runs": []}
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as runs_dir:
        if search:
            start = time.perf_counter()
            outcome = run_search(space, runs_dir=runs_dir, out=io.StringIO(), progress=False,
                                 export=False)
            best = outcome.ranking.rows[0] if outcome.ranking.rows else None
            out["search"] = {"counts": outcome.counts, "stopped": outcome.stopped,
                             "best": best.label if best else None,
                             "best_loss": best.score.mean if best else None,
                             "seconds": time.perf_counter() - start}
        assignment = space.suggest(optuna.trial.FixedTrial(ASSIGNMENT)).assignment()
        for seed in seeds:
            r = train(dataclasses.replace(space.train_config(), seed=seed), assignment)
            out["runs"].append({"seed": seed, "status": r.status, "loss": r.final_val_loss,
                                "ms": r.mean_step_ms, "tokens_per_s": r.tokens_per_s})
    return out


def run_children(args: argparse.Namespace) -> list[dict]:
    """The bf16 child (search + seed 0) and the fp32 child (seeds 0, 1), side by side."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    common = ["--device", args.device] + (["--quick"] if args.quick else [])
    procs = []
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
        for precision in ("bf16", "no"):
            path = Path(tmp) / f"{precision}.json"
            cmd = [sys.executable, __file__, "--child", precision, "--child-out", str(path), *common]
            procs.append((precision, path, subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE,
                                                            stderr=subprocess.STDOUT, text=True)))
        results = []
        for precision, path, proc in procs:
            try:
                log, _ = proc.communicate(timeout=CHILD_TIMEOUT)
            except subprocess.TimeoutExpired:
                proc.kill()
                log, _ = proc.communicate()
            if proc.returncode != 0 or not path.is_file():
                tail = "\n".join(log.strip().splitlines()[-5:])
                results.append({"precision": precision, "error": f"exit code {proc.returncode}: {tail}"})
            else:
                results.append(json.loads(path.read_text()))
    return results


# --------------------------------------------------------------------------- (c) step times
class _MsignOnly:
    """A stand-in optimizer whose step is one msign of the gradient, in fp32 or bf16."""

    def __init__(self, p: torch.nn.Parameter, bf16: bool) -> None:
        self.p, self.bf16, self.state = p, bf16, {}

    @torch.no_grad()
    def step(self) -> None:
        self.out = msign(self.p.grad, bf16=self.bf16)


def _step_cases(device: torch.device) -> list[dict]:
    """What (c) times: each optimizer, at each weight precision, and msign alone."""
    on_cuda = device.type == "cuda"
    cases = []

    def case(optimizer, geometry, solver, weights, iteration, make, run_geometry=None):
        cases.append({"optimizer": optimizer, "geometry": geometry, "solver": solver, "weights": weights,
                      "iteration": iteration, "make": make, "run_geometry": run_geometry or geometry,
                      "dtype": torch.bfloat16 if weights == "bf16" else torch.float32})

    for weights in ("fp32", "bf16"):
        case("torch AdamW", "adamw", "—", weights, "—",
             lambda p: torch.optim.AdamW([p], lr=6e-4, betas=(0.9, 0.95), weight_decay=0.1))
        if hasattr(torch.optim, "Muon"):  # torch >= 2.9
            case("torch Muon", "euclidean", "NS (Keller)", weights, "bf16",
                 lambda p: torch.optim.Muon([p], lr=LR, weight_decay=0.0, adjust_lr_fn="original"))
        case("ManifoldMuon", "adamw", "—", weights, "—",
             lambda p: ManifoldMuon([{"params": [p], "geometry": "adamw", "lr": 6e-4, "weight_decay": 0.1}]))
        # bf16 weights: the default solver only (a model cast to bf16 is not what geosearch trains)
        for geometry in TIMED_GEOMETRIES:
            for solver in ("project", "dual") if weights == "fp32" else ("project",):
                case("ManifoldMuon", geometry, solver, weights, "fp32",
                     lambda p, g=geometry, s=solver: ManifoldMuon(
                         [{"params": [p], "geometry": g, "lr": LR, "solver": s}]))
    for bf16 in (False, True):
        iteration = "bf16" if bf16 and on_cuda else "fp32" + (" (bf16 is CUDA only)" if bf16 else "")
        case("msign alone", "—", "5 Polar Express", "fp32", iteration,
             lambda p, b=bf16: _MsignOnly(p, b), run_geometry="adamw")
    return cases


def step_times(size: Sizes, device: torch.device) -> list[dict]:
    """Median ms per step over ``size.shapes`` and the constraint error left, per optimizer."""
    timing = argparse.Namespace(warmup=size.warmup, repeats=size.repeats)
    rows = []
    for c in _step_cases(device):
        per_shape = [run_case(c["make"], c["run_geometry"], shape, timing, device, dtype=c["dtype"])
                     for shape in size.shapes]
        ms = [r["seconds"] * 1e3 for r in per_shape]
        rows.append({**{k: c[k] for k in ("optimizer", "geometry", "solver", "weights", "iteration")},
                     "ms": ms, "total": sum(ms), "error": max(r["error"] for r in per_shape)})
    return rows


# --------------------------------------------------------------------------- (d) bf16 numerics
def bf16_numerics(size: Sizes, device: torch.device) -> list[dict]:
    """msign and each retraction on bf16 tensors against float32, per shape."""
    on_cuda = device.type == "cuda"
    gen = torch.Generator().manual_seed(0)
    rows = []
    for m, n in size.shapes:
        G = torch.randn(m, n, generator=gen).to(device)
        fp32 = msign(G)
        low = msign(G.bfloat16(), bf16=True)  # on CUDA the iteration itself runs in bf16
        dist = float(torch.linalg.matrix_norm((low.float() - fp32).double(), ord=2))
        sv = torch.linalg.svdvals(low.double())
        rows.append({"op": "msign", "shape": (m, n),
                     "compute": f"bf16 in/out, {'bf16' if on_cuda else 'fp32'} iteration",
                     "error": f"σ ∈ [{float(sv.min()):.2f}, {float(sv.max()):.2f}]", "floor": "—",
                     "distance": dist, "ok": dist <= MSIGN_TOL})
        for name in RETRACTED:
            manifold = get_manifold(name)
            W = manifold.project(torch.randn(m, n, generator=gen).to(device) / math.sqrt(n))
            Y = W - LR * msign(torch.randn(m, n, generator=gen).to(device))  # one step off the set
            exact = manifold.retract(Y)
            low = manifold.retract(Y.bfloat16())
            error = float(manifold.constraint_error(low.double()))
            floor = float(manifold.constraint_error(exact.bfloat16().double()))
            dist = float((low.float() - exact).abs().max() / exact.abs().max())
            assert low.dtype == torch.bfloat16
            rows.append({"op": f"retract {name}", "shape": (m, n), "compute": "bf16 in/out",
                         "error": error, "floor": floor, "distance": dist,
                         "ok": error <= 2 * BF16_U and dist <= 3 * BF16_U})
    return rows


# --------------------------------------------------------------------------- the table
def _num(x) -> str:
    if isinstance(x, str):
        return x
    return "—" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.3g}"


def search_section(children: list[dict]) -> tuple[str, bool]:
    bf16 = next(c for c in children if c["precision"] == "bf16")
    if "error" in bf16:
        return f"FAIL: the bf16 child process failed ({bf16['error']})\n", False
    s = bf16["search"]
    total = sum(s["counts"].values())
    ok = s["counts"].get("completed", 0) == total > 0 and s["best"] is not None
    lines = ["| trials | outcomes | stopped | best | best val loss | seconds | check |",
             "|---|---|---|---|---|---|---|",
             f"| {total} | {', '.join(f'{k} {v}' for k, v in sorted(s['counts'].items()))} | {s['stopped']} "
             f"| {s['best']} | {_num(s['best_loss'])} | {s['seconds']:.1f} | {'ok' if ok else 'FAIL'} |"]
    return "\n".join(lines) + "\n", ok


def precision_section(children: list[dict]) -> tuple[str, bool]:
    failed = [c for c in children if "error" in c]
    if failed:
        return "".join(f"FAIL: the {c['precision']} child process failed ({c['error']})\n" for c in failed), False
    runs = [(c["precision"], r) for c in children for r in c["runs"]]
    lines = ["| precision | seed | status | final val loss | ms/step | tokens/s |", "|---|---|---|---|---|---|"]
    lines += [f"| {'bf16' if p == 'bf16' else 'fp32'} | {r['seed']} | {r['status']} | {_num(r['loss'])} "
              f"| {_num(r['ms'])} | {_num(r['tokens_per_s'])} |" for p, r in runs]
    loss = {(p, r["seed"]): r["loss"] for p, r in runs}
    try:
        gap = abs(loss[("bf16", 0)] - loss[("no", 0)])
        noise = abs(loss[("no", 0)] - loss[("no", 1)])
    except TypeError:  # a run without a final loss
        return "\n".join(lines) + "\n\nFAIL: a run has no final validation loss\n", False
    tol = max(LOSS_FLOOR, 2 * noise)
    ok = gap <= tol and all(r["status"] == "completed" for _, r in runs)
    verdict = (f"|bf16 − fp32| = {gap:.4f} at seed 0; fp32 seed-to-seed |0 − 1| = {noise:.4f}; "
               f"tolerance max({LOSS_FLOOR}, 2 × {noise:.4f}) = {tol:.4f}: {'ok' if ok else 'FAIL'}")
    return "\n".join(lines) + "\n\n" + verdict + "\n", ok


def timing_section(rows: list[dict], shapes) -> str:
    def base(optimizer: str, weights: str) -> float:
        w = weights if weights in ("fp32", "bf16") else "fp32"
        return next((r["total"] for r in rows if r["optimizer"] == optimizer and r["weights"] == w), math.nan)

    cols = [f"{m}×{n} ms" for m, n in shapes]
    lines = ["| optimizer | geometry | solver | weights | iteration | " + " | ".join(cols)
             + " | total ms | × AdamW | × torch Muon | error |", "|---" * (len(cols) + 9) + "|"]
    for r in rows:
        lines.append(f"| {r['optimizer']} | {r['geometry']} | {r['solver']} | {r['weights']} | {r['iteration']} | "
                     + " | ".join(f"{x:.2f}" for x in r["ms"])
                     + f" | {r['total']:.2f} | {_num(r['total'] / base('torch AdamW', r['weights']))} "
                     f"| {_num(r['total'] / base('torch Muon', r['weights']))} | {r['error']:.1e} |")
    return "\n".join(lines) + "\n"


def numerics_section(rows: list[dict]) -> tuple[str, bool]:
    lines = ["| op | shape | dtypes | constraint error (bf16) | floor (fp32 → bf16) | distance to fp32 | check |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        m, n = r["shape"]
        lines.append(f"| {r['op']} | {m}×{n} | {r['compute']} | {_num(r['error'])} | {_num(r['floor'])} "
                     f"| {_num(r['distance'])} | {'ok' if r['ok'] else 'FAIL'} |")
    return "\n".join(lines) + "\n", all(r["ok"] for r in rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cuda", "cpu"),
                        default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--quick", action="store_true", help="tiny sizes: seconds per part (tests)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--child", choices=("bf16", "no"), help=argparse.SUPPRESS)
    parser.add_argument("--child-out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: CUDA is not available here (the CPU fallback is --device cpu)")
    size = sizes(args.device, args.quick)
    if args.child:
        result = child(args.child, [0] if args.child == "bf16" else [0, 1], args.child == "bf16",
                       size, args.device)
        args.child_out.write_text(json.dumps(result), encoding="utf-8")
        return 0

    start = time.perf_counter()
    device = torch.device(args.device)
    fallback = device.type != "cuda"
    gpu = f"{torch.cuda.get_device_name(device)}, " if not fallback else ""
    print("(a, b) search and proxy runs in child processes ...", flush=True)
    children = run_children(args)
    print("(c) optimizer step times ...", flush=True)
    timings = step_times(size, device)
    print("(d) bf16 numerics ...", flush=True)
    numerics = bf16_numerics(size, device)

    search_text, search_ok = search_section(children)
    precision_text, precision_ok = precision_section(children)
    numerics_text, numerics_ok = numerics_section(numerics)
    checks = {"bf16 search": search_ok, "bf16 vs fp32": precision_ok, "bf16 numerics": numerics_ok}
    title = "GPU readiness" + (" — CPU fallback" if fallback else "")
    text = (
        f"# {title}\n\n"
        f"Device: {gpu}{device}{' (CPU fallback: no CUDA, smaller shapes, bf16 on the CPU)' if fallback else ''}"
        f"{' — quick sizes' if args.quick else ''}. {machine()}. Total {time.perf_counter() - start:.0f} s.\n\n"
        f"Checks: " + ", ".join(f"{k} {'ok' if v else 'FAIL'}" for k, v in checks.items()) + ".\n\n"
        f"## (a) Default search in bf16 ({size.points} assignments, {size.model} proxy, {size.steps} steps, "
        f"1 seed)\n\n{search_text}\n"
        f"## (b) bf16 against fp32 ({size.model} proxy, {size.steps} steps, "
        f"{', '.join(f'{k}={v}' for k, v in ASSIGNMENT.items())})\n\n{precision_text}\n"
        f"## (c) Optimizer step (median of {size.repeats} after {size.warmup} warm-up, spectral lr {LR}; "
        f"error = constraint error left)\n\n"
        f"Weights fp32 is a bf16 run as geosearch trains it: Accelerate's bf16 mixed precision autocasts the "
        f"matmuls of the forward and backward passes to bf16 and keeps the weights, their gradients and the "
        f"optimizer step in fp32. Weights bf16 is a model cast to bf16 (not what geosearch trains; the default "
        f"solver only). Iteration is the precision of the Newton–Schulz (msign) iteration: torch.optim.Muon "
        f"always runs it in bf16, ManifoldMuon in fp32 (msign's bf16 iteration, `msign(G, bf16=True)`, CUDA "
        f"only, is no optimizer setting); the two msign rows time one msign of the gradient in each, what a "
        f"bf16 setting could save per msign. × AdamW and × torch Muon: against the row of the same "
        f"weights.\n\n{timing_section(timings, size.shapes)}\n"
        f"## (d) msign and retractions on bf16 tensors\n\n"
        f"u = 2⁻⁸ (bf16 unit roundoff). A retraction passes at constraint error ≤ 2u = {2 * BF16_U:.4f} "
        f"and distance ≤ 3u = {3 * BF16_U:.4f} of its largest entry from fp32; msign at a spectral "
        f"distance ≤ {MSIGN_TOL} from fp32.\n\n{numerics_text}"
    )
    publish(text, args.out)
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
