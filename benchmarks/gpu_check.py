"""GPU readiness and GPU figures: a bf16 search, bf16 against fp32, optimizer step times, bf16
numerics, trials side by side on one GPU, the default search's wall time.

One script, at most about 8 minutes on one GPU (``--budget``: 470 s; every child process has
a timeout inside it), that checks what a user's first GPU run needs and measures what it
costs:

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
    column (the fp32 result rounded to bf16) shows what rounding alone costs;
(e) how many trials one GPU runs side by side: for k = 1, 2, 4, 8, 16 (``--concurrency``)
    k child processes, each one ``geosearch.proxy.train.train`` run of the ``small`` proxy
    (batch 16, probes every 10 steps, bf16, attn=stiefel, mlp=dgram) with
    one CPU thread, released together after a warm-up (a barrier) and timed over the same
    steps: the aggregate steps/s, the ms/step of each run, the speedup over k = 1, the peak
    memory each run allocated, and the k after which the aggregate grows by less than 10%.
    ``geosearch search --workers k`` on one GPU puts all k workers on that GPU: this is
    what it gains;
(f) the shipped default search, ``python -m geosearch search --space default --device cuda
    --mixed-precision bf16``, in a child process: wall time, steps trained, the verdict, the
    exit code (``--default-search``: on by default on CUDA; off with ``--quick`` and on the
    CPU, where it takes about 8 minutes). Its timeout is what is left of the budget; a
    search that runs out is stopped (Ctrl-C, then killed) and reported as timed out, with
    the steps it trained and the total its rate projects.

(g) the whole training step of each geometry (all-Stiefel, attention Stiefel + MLP DGram,
    all-DGram), the grouped step and the ungrouped one, against ``torch.optim.Muon`` and
    Muon in fp32, with the optimizer's operation count and the constraint error: the rows
    of ``benchmarks/optimizer_step.py --train`` (mini and small on a GPU, mini in the CPU
    fallback, tiny with ``--quick``); then the same step with ``torch.compile`` (the model,
    and the optimizer step in the fixed-iteration mode) against eager, with the compile
    time apart and the loss against eager (``--train --compile``; mini, tiny with
    ``--quick`` through the ``aot_eager`` backend).

Accelerate allows one precision per process, so (a)+(b, bf16) and (b, fp32) run in two
child processes of this script; (c), (d) and (g) run here; (e) and (f) in child processes.
Without CUDA (or with ``--device cpu``) it runs a CPU fallback on smaller shapes, marked
"CPU fallback" in the table. The table goes to ``benchmarks/results/gpu_check.md``; the
exit code is 1 when a check fails (a timed-out or skipped part is reported, not failed).

How long on a GPU (an estimate: this script has not run on one yet). One training step of
the ``small`` proxy (and of ``mini``, the default's: the same layers and matrices at half
the width) dispatches about 3,200 torch operations (counted on the CPU with a
``TorchDispatchMode``: attn=stiefel, mlp=dgram, bf16 autocast, probes every 10 steps), each
a kernel launch on CUDA; at 6 to 12 µs of host time per eager operation that is 20 to 40 ms
a step for one process, however fast the GPU (the model is far too small to keep an H200
busy: hence part (e)). So: (a, b) 40 s, (c) 15 s, (d) 5 s, (g) 160 s (120 s of it
compiling), (e) about 110 s (a child's start, about 15 s, dominates each k), (f) 5,800 to
7,400 steps plus 17 to 21 run setups, 165 to 353 s. In all about 490 to 680 s, which is why
(f) gets only what is left of the budget;
after (e) the estimate of (f) is redone from the measured ms/step of one run. The script
prints its estimates before it starts.

Usage::

    python benchmarks/gpu_check.py                 # on a GPU: about 8 minutes
    python benchmarks/gpu_check.py --device cpu    # the CPU fallback
    python benchmarks/gpu_check.py --quick         # a few seconds of work per part (tests)
"""

from __future__ import annotations

import argparse
import collections
import ctypes
import dataclasses
import io
import json
import math
import os
import re
import signal
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
from optimizer_step import (  # noqa: E402
    LR, SHAPES, compile_rows, compile_table, run_case, train_rows, train_table, train_verdicts,
)

RESULTS = Path(__file__).parent / "results" / "gpu_check.md"
ASSIGNMENT = {"geometry.attn": "stiefel", "geometry.mlp": "dgram"}  # a point of the default space
LOSS_FLOOR = 0.03
TIMED_GEOMETRIES = ("euclidean", "stiefel", "dgram", "oblique")
RETRACTED = ("stiefel", "dgram", "oblique", "sphere", "spectral_ball")
BF16_U = 2.0 ** -8  # bf16 unit roundoff (8 significand bits)
MSIGN_TOL = 0.1
CHILD_TIMEOUT = 180  # seconds (a, b) may take at most
BUDGET = {"cuda": 470.0, "cpu": 900.0, "quick": 300.0}  # --budget defaults, seconds
MARGIN = 10.0  # seconds of the budget kept for the table
SATURATION = 0.10  # the aggregate "stops growing" when the next k adds less than this
GO_WAIT = 600.0  # seconds a concurrency child waits for the others before it runs alone
SEARCH_GRACE = 20.0  # seconds a timed-out search gets after Ctrl-C to record its trial (it
# needs well under one); the most the script can run past its budget
MIN_SEARCH = {"cuda": 60.0, "cpu": 60.0, "quick": 10.0}  # less left than this: (f) skipped
_PARENT = "GPU_CHECK_PARENT_PID"  # a child's parent: the child gets SIGTERM when it dies

# Planning figures for the estimates printed before a GPU run (guesses, not measurements;
# the module docstring says where they come from).
STEP_MS = (20.0, 40.0)  # one training step of the small proxy, one process on the GPU
GPU_MS = 10.0  # the GPU's own time of such a step: the floor of k runs side by side
START_S = 15.0  # a child process's start: imports, CUDA context, model, first steps
RUN_SETUP_S = 2.0  # per proxy run of a search: build, place on the manifolds, evaluate
PART_S = {"ab": 40.0, "c": 15.0, "d": 5.0, "g": 40.0, "g compiled": 120.0}  # on a GPU

# (f) with --quick: the default space at tiny sizes (a check of the code path, not the search)
QUICK_NOTE = " (quick: the default space at tiny sizes, a check of the code path)"
QUICK_SEARCH_FLAGS = {"model": "tiny", "steps": 4, "batch_size": 2}
QUICK_SEARCH_SETS = ["geometries.mlp=[dgram]", "ladder.stability_steps=4", "proxy.eval_every=2",
                     "proxy.eval_batches=2", "proxy.probe_every=2", "proxy.probe_batch_size=2", "baselines=[]", "max_repeats=2"]


@dataclasses.dataclass(frozen=True)
class Concurrency:
    """Part (e): the runs trained side by side and the k values."""

    model: str
    batch_size: int | None  # None: the default space's (16)
    warmup: int  # steps before the barrier (untimed)
    timed: int  # steps timed after it
    probe_every: int  # the barrier and the end of the window are probe steps
    ks: tuple[int, ...]

    @property
    def steps(self) -> int:
        """A run's steps: one probe interval after the window, so that no run ends inside
        another's window (and the final evaluation falls outside it)."""
        return self.warmup + self.timed + self.probe_every


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
    concurrency: Concurrency


def sizes(device: str, quick: bool) -> Sizes:
    """The GPU setting, the CPU fallback, or the quick one (a few seconds per part)."""
    if quick:
        return Sizes("tiny", 6, 2, 2, 3, [(48, 16), (16, 48)], 1, 2, Concurrency("tiny", 4, 2, 4, 2, (1, 2)))
    if device == "cuda":
        return Sizes("tiny", 100, 4, 16, 25, SHAPES["gpt2"], 3, 10,
                     Concurrency("small", None, 20, 60, 10, (1, 2, 4, 8, 16)))
    return Sizes("tiny", 40, 4, 4, 20, SHAPES["small"], 1, 3, Concurrency("tiny", None, 4, 12, 4, (1, 2)))


def _mode(args: argparse.Namespace) -> str:
    return "quick" if args.quick else args.device


# --------------------------------------------------------------------------- child processes
@dataclasses.dataclass
class Child:
    """A child process of this script, its output going to ``log``."""

    name: str
    proc: subprocess.Popen
    log: Path
    start: float
    timed_out: float | None = None  # seconds after its start it was stopped at, when it was

    def failure(self, out: Path | None = None) -> str | None:
        """Why it gave no result (``out``: the file it should have written), else None."""
        if self.timed_out is not None:
            return f"timed out after {self.timed_out:.0f} s"
        if self.proc.returncode != 0 or (out is not None and not out.is_file()):
            return f"exit code {self.proc.returncode}: {_tail(self.log)}"
        return None


def _tail(log: Path, lines: int = 5) -> str:
    try:
        text = log.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return "(no output)"
    return "\n".join(text.strip().splitlines()[-lines:]) or "(no output)"


def _env(**extra: str) -> dict[str, str]:
    """A child's environment: this checkout's geosearch, this process's pid, ``extra``."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
            _PARENT: str(os.getpid()), **extra}


def _start(name: str, cmd: list[str], log: Path, env: dict[str, str], cwd: Path | None = None) -> Child:
    with open(log, "w", encoding="utf-8") as f:  # a file, not a pipe: a full pipe cannot block it
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=env, cwd=cwd)
    return Child(name, proc, log, time.perf_counter())


def _kill(children: list[Child]) -> None:
    for c in children:
        if c.proc.poll() is None:
            c.proc.kill()
            if c.timed_out is None:
                c.timed_out = time.perf_counter() - c.start
        c.proc.wait()


def _wait(children: list[Child], until: float, interrupt_first: bool = False) -> None:
    """Wait for every child until ``until`` (``time.perf_counter``); stop those still running
    then (Ctrl-C first when ``interrupt_first``, so that a search records its trial; killed
    :data:`SEARCH_GRACE` seconds later) and mark them timed out. Never raises for a child."""
    try:
        for c in children:
            try:
                c.proc.wait(timeout=max(0.0, until - time.perf_counter()))
            except subprocess.TimeoutExpired:
                c.timed_out = until - c.start
        late = [c for c in children if c.proc.poll() is None]
        if interrupt_first and late:
            for c in late:
                c.proc.send_signal(signal.SIGINT)
            grace = time.perf_counter() + SEARCH_GRACE
            for c in late:
                try:
                    c.proc.wait(timeout=max(0.1, grace - time.perf_counter()))
                except subprocess.TimeoutExpired:
                    pass
    finally:  # also on Ctrl-C here: no child outlives this call
        _kill(children)


def _die_with_parent() -> None:
    """In a child process: get SIGTERM when this script's main process dies (Linux), so that
    no child outlives it, however it ends."""
    parent = os.environ.get(_PARENT, "")
    if not (parent.isdigit() and sys.platform.startswith("linux")):
        return
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGTERM), 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() != int(parent):  # it died before the signal was armed
        os.kill(os.getpid(), signal.SIGTERM)


# The same for a command that is not this script (the search of part (f)): armed, then exec'd
# (the parent-death signal survives exec).
_EXEC_DYING_WITH_PARENT = (
    "import ctypes, os, signal, sys\n"
    "try:\n"
    "    ctypes.CDLL(None).prctl(1, int(signal.SIGTERM), 0, 0, 0)\n"
    "except (OSError, AttributeError):\n"
    "    pass\n"
    f"if os.getppid() != int(os.environ['{_PARENT}']):\n"
    "    sys.exit(143)\n"
    "os.execv(sys.argv[1], sys.argv[1:])\n")


# --------------------------------------------------------------------------- (a, b) children
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


def run_children(args: argparse.Namespace, until: float) -> list[dict]:
    """The bf16 child (search + seed 0) and the fp32 child (seeds 0, 1), side by side."""
    common = ["--device", args.device] + (["--quick"] if args.quick else [])
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
        kids = []
        try:
            for precision in ("bf16", "no"):
                path = Path(tmp) / f"{precision}.json"
                cmd = [sys.executable, __file__, "--child", precision, "--child-out", str(path), *common]
                kids.append((precision, path, _start(precision, cmd, Path(tmp) / f"{precision}.log", _env())))
        finally:
            _wait([k for _, _, k in kids], until)
        results = []
        for precision, path, kid in kids:
            problem = kid.failure(path)
            results.append({"precision": precision, "error": problem} if problem
                           else json.loads(path.read_text(encoding="utf-8")))
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


# --------------------------------------------------------------------------- (e) concurrency
def _wait_for(path: Path, seconds: float) -> bool:
    end = time.monotonic() + seconds
    while not path.exists():
        if time.monotonic() > end:
            return False
        time.sleep(0.002)
    return True


def throughput_child(index: int, sync: Path, conc: Concurrency, device: str) -> dict:
    """In a child process: one proxy run; at step ``conc.warmup`` it says it is ready (a file
    in ``sync``) and waits for the others (``go``), then times ``conc.timed`` steps."""
    torch.set_num_threads(1)
    from geosearch.proxy.train import train
    from geosearch.search.space.spec import apply_overrides, load_space

    space = apply_overrides(load_space("default"),
                            ["proxy.mixed_precision=bf16", f"proxy.probe_every={conc.probe_every}"],
                            name="gpu-check-concurrency", model=conc.model, steps=conc.steps,
                            batch_size=conc.batch_size, device=device)
    cuda = torch.device(device).type == "cuda"
    mark: dict = {}

    def callback(step: int, metrics: dict) -> None:
        if step == conc.warmup:
            (sync / f"ready-{index}").write_text("ready", encoding="utf-8")
            mark["synced"] = _wait_for(sync / "go", GO_WAIT)
            mark["t0"], mark["wall0"] = time.perf_counter(), time.time()
        elif step == conc.warmup + conc.timed and "t0" in mark:
            mark["t1"], mark["wall1"] = time.perf_counter(), time.time()  # the step's GPU work synced
            if cuda:
                mark["peak_mib"] = torch.cuda.max_memory_allocated() / 2**20
                free, total = torch.cuda.mem_get_info()
                mark["in_use_mib"] = (total - free) / 2**20  # every process's, CUDA contexts too

    assignment = space.suggest(optuna.trial.FixedTrial(ASSIGNMENT)).assignment()
    r = train(dataclasses.replace(space.train_config(), seed=index), assignment, callback)
    out = {"index": index, "status": r.status, "window": [mark.get("wall0"), mark.get("wall1")],
           "peak_mib": mark.get("peak_mib"), "in_use_mib": mark.get("in_use_mib")}
    if "t1" not in mark:
        return {**out, "error": f"{r.status} before the end of the timed steps: {r.reason}"}
    if not mark["synced"]:
        return {**out, "error": f"the others were not ready within {GO_WAIT:.0f} s: timed alone"}
    seconds = mark["t1"] - mark["t0"]
    return {**out, "ms": seconds / conc.timed * 1e3, "steps_per_s": conc.timed / seconds}


def _barrier(kids: list[Child], sync: Path, until: float) -> None:
    """Release the runs (``go``) once every one that still runs is ready, or at ``until``."""
    while time.perf_counter() < until:
        if all(c.proc.poll() is not None or (sync / f"ready-{i}").exists() for i, c in enumerate(kids)):
            break
        time.sleep(0.02)
    (sync / "go").write_text("go", encoding="utf-8")


def concurrency_round(k: int, args: argparse.Namespace, until: float) -> dict:
    """k runs side by side: each one's result, or why it gave none."""
    with tempfile.TemporaryDirectory(prefix=f"gpu-check-k{k}-") as tmp:
        sync = Path(tmp)
        env = _env(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
        start = time.perf_counter()
        kids: list[Child] = []
        try:
            for i in range(k):
                cmd = [sys.executable, __file__, "--throughput-child", str(i), "--sync-dir", str(sync),
                       "--child-out", str(sync / f"result-{i}.json"), "--device", args.device,
                       *(["--quick"] if args.quick else [])]
                kids.append(_start(f"run {i}", cmd, sync / f"run{i}.log", env))
            _barrier(kids, sync, until)
            barrier_s = time.perf_counter() - start
        finally:
            _wait(kids, until)
        runs, errors = [], []
        for i, c in enumerate(kids):
            out = sync / f"result-{i}.json"
            problem = c.failure(out)
            result = None if problem else json.loads(out.read_text(encoding="utf-8"))
            problem = problem or (result or {}).get("error")
            if problem:
                errors.append(f"run {i}: {problem}")
            else:
                runs.append(result)
    ok = not errors and len(runs) == k
    cut = any(c.timed_out is not None for c in kids)  # stopped at the part's end: out of budget
    windows = [r["window"] for r in runs]
    overlap = None
    if windows:
        span = max(w[1] for w in windows) - min(w[0] for w in windows)
        overlap = max(0.0, min(w[1] for w in windows) - max(w[0] for w in windows)) / span if span > 0 else 1.0
    return {"k": k, "ok": ok, "cut": cut, "runs": runs, "errors": errors, "barrier_s": barrier_s,
            "wall_s": time.perf_counter() - start, "overlap": overlap,
            "steps_per_s": sum(r["steps_per_s"] for r in runs)}


def _round_estimate(k: int, conc: Concurrency, prev: dict | None, device: str) -> float:
    """Seconds a round of k runs should take at most: from the last round that ran (its
    start and warm-up × 2, its ms/step × k / its k: no gain from running side by side),
    else from the planning figures."""
    if prev is not None:
        ms = max(r["ms"] for r in prev["runs"]) * k / prev["k"]
        return 2.0 * prev["barrier_s"] + (conc.timed + conc.probe_every) * ms / 1e3 + 5.0
    per_step = max(STEP_MS[1], k * GPU_MS) if device == "cuda" else 50.0 * k
    return START_S + conc.steps * per_step / 1e3


def concurrency(args: argparse.Namespace, conc: Concurrency, until: float) -> list[dict]:
    """Part (e): a round per k in ``args.concurrency``, each skipped when its estimate does not
    fit before ``until`` (and all of them, as one part, stopped at ``until``)."""
    rounds, prev = [], None
    for k in args.concurrency:
        left = until - time.perf_counter()
        estimate = _round_estimate(k, conc, prev, args.device)
        if estimate > left:
            rounds.append({"k": k, "skipped": f"its estimated {estimate:.0f} s exceed the {max(0.0, left):.0f} s "
                                              "left of this part's budget"})
            continue
        print(f"  k = {k}: {k} run(s) side by side (estimated ≤ {estimate:.0f} s) ...", flush=True)
        rounds.append(concurrency_round(k, args, until))
        if rounds[-1]["ok"]:
            prev = rounds[-1]
    return rounds


# --------------------------------------------------------------------------- (f) default search
def search_args(args: argparse.Namespace) -> list[str]:
    """``geosearch search``'s arguments for part (f) (without ``--runs-dir``)."""
    out = ["--space", "default", "--device", args.device, "--mixed-precision", "bf16"]
    if args.quick:
        for flag, value in QUICK_SEARCH_FLAGS.items():
            out += [f"--{flag.replace('_', '-')}", str(value)]
        for setting in QUICK_SEARCH_SETS:
            out += ["--set", setting]
    return out


def search_plan(quick: bool) -> dict:
    """The steps and proxy runs part (f)'s search trains: without, and with every adaptive seed."""
    from geosearch.search.space.baseline_specs import BASELINES
    from geosearch.search.space.plan import plan_study
    from geosearch.search.space.spec import apply_overrides, load_space

    space = load_space("default")
    if quick:
        space = apply_overrides(space, QUICK_SEARCH_SETS, **QUICK_SEARCH_FLAGS)
    plan = plan_study(space)
    steps_lo = plan.least_steps or 0
    steps_hi = plan.most_steps or steps_lo
    points, stability = int(space.grid_size()), 1 if space.ladder.stability_steps else 0
    runs_lo = points * (space.repeats + stability) + sum(
        space.repeats + (0 if BASELINES[b].rung0_only else stability) for b in space.baselines)
    runs_hi = runs_lo + points * max(0, (space.max_repeats or space.repeats) - space.repeats)
    return {"steps": (steps_lo, steps_hi), "runs": (runs_lo, runs_hi)}


def search_estimate(plan: dict, step_ms: tuple[float, float]) -> tuple[float, float]:
    """Seconds the search should take: a start, every run's setup, every step."""
    return tuple(START_S + runs * RUN_SETUP_S + steps * ms / 1e3
                 for runs, steps, ms in zip(plan["runs"], plan["steps"], step_ms))


def _trained(runs_dir: Path) -> tuple[int, int, float]:
    """Steps trained, proxy runs and seconds in training steps, from the runs' files."""
    steps = runs = 0
    train_s = 0.0
    for metrics in runs_dir.glob("*/trials/*/*/metrics.jsonl"):
        lines = metrics.read_text(encoding="utf-8", errors="replace").strip().splitlines()
        try:
            last = json.loads(lines[-1]).get("step", 0) if lines else 0
        except json.JSONDecodeError:  # a line cut short by a kill
            last = json.loads(lines[-2]).get("step", 0) if len(lines) > 1 else 0
        steps, runs = steps + last, runs + 1
        result = metrics.with_name("result.json")
        if result.is_file():
            train_s += last * json.loads(result.read_text(encoding="utf-8"))["mean_step_ms"] / 1e3
    return steps, runs, train_s


def default_search(args: argparse.Namespace, until: float, plan: dict, estimate: tuple[float, float]) -> dict:
    """Part (f): the search in a child process until it ends or ``until``."""
    shown = "python -m geosearch search " + " ".join(search_args(args)) + " --runs-dir TMP"
    out = {"command": shown, "plan": plan, "estimate": estimate, "timeout": until - time.perf_counter()}
    if out["timeout"] < MIN_SEARCH[_mode(args)]:
        return {**out, "skipped": f"only {max(0.0, out['timeout']):.0f} s of the budget left"}
    with tempfile.TemporaryDirectory(prefix="gpu-check-search-") as tmp:
        runs_dir = Path(tmp) / "runs"
        cmd = [sys.executable, "-m", "geosearch", "search", *search_args(args), "--runs-dir", str(runs_dir)]
        kid = _start("search", [sys.executable, "-c", _EXEC_DYING_WITH_PARENT, *cmd], Path(tmp) / "search.log",
                     _env(), cwd=Path(tmp))
        _wait([kid], until, interrupt_first=True)
        wall = time.perf_counter() - kid.start
        log = kid.log.read_text(encoding="utf-8", errors="replace")
        steps, runs, train_s = _trained(runs_dir)
        tail = _tail(kid.log)
    verdict = next((ln[len("verdict: "):] for ln in log.splitlines() if ln.startswith("verdict: ")), None)
    stopped = next((ln[len("stopped: "):] for ln in log.splitlines() if ln.startswith("stopped: ")), None)
    trials = collections.Counter(m.group(1) for m in re.finditer(r"^trial\s+\d+\s{2}.+?\s{2}(\S+)", log, re.M))
    return {**out, "rc": kid.proc.returncode, "timed_out": kid.timed_out, "wall_s": wall, "steps": steps,
            "runs": runs, "train_s": train_s, "verdict": verdict, "stopped": stopped, "trials": dict(trials),
            "tail": tail}


# --------------------------------------------------------------------------- the table
def _num(x) -> str:
    if isinstance(x, str):
        return x
    return "—" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.3g}"


def _cell(text: str, limit: int = 400) -> str:
    """Text for one table cell: one line, no pipes, at most ``limit`` characters."""
    text = " ".join(str(text).split()).replace("|", "/")
    return text if len(text) <= limit else text[:limit - 1] + "…"


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


def saturation(rounds: list[dict]) -> tuple[int | None, str]:
    """The k after which the aggregate grows by less than :data:`SATURATION`, and a line saying it."""
    ok = [r for r in rounds if r.get("ok")]
    if len(ok) < 2:
        return None, "Saturation: not measured (fewer than two values of k ran to completion)."
    for a, b in zip(ok, ok[1:]):
        growth = b["steps_per_s"] / a["steps_per_s"] - 1
        if growth < SATURATION:
            return a["k"], (f"Saturates at k = {a['k']}: from k = {a['k']} to k = {b['k']} the aggregate "
                            f"changes by {growth:+.0%} (less than +{SATURATION:.0%}).")
    return None, (f"Does not saturate up to k = {ok[-1]['k']}: the aggregate grows by {SATURATION:.0%} or "
                  f"more from each k to the next.")


def _round_row(r: dict, one: float | None, prev: float | None) -> str:
    """One row of part (e)'s table (``one``: k = 1's aggregate; ``prev``: the previous k's)."""
    if "skipped" in r:
        return f"| {r['k']} | — | — | — | — | — | — | — | — | skipped: {r['skipped']} |"
    ms = [x["ms"] for x in r["runs"]]
    peaks = [x["peak_mib"] for x in r["runs"] if x.get("peak_mib") is not None]
    in_use = [x["in_use_mib"] for x in r["runs"] if x.get("in_use_mib") is not None]
    errors = _cell("; ".join(r["errors"]), 300)
    check = "ok" if r["ok"] else f"cut: the part's time ran out ({errors})" if r.get("cut") else f"FAIL: {errors}"
    growth = f"{r['steps_per_s'] / prev - 1:+.0%}" if r["ok"] and prev else "—"
    speedup = f"{r['steps_per_s'] / one:.2f}×" if one and r["ok"] else "—"
    per_run = f"{sum(ms) / len(ms):.1f} ({min(ms):.1f}–{max(ms):.1f})" if ms else "—"
    overlap = "—" if r["overlap"] is None else f"{r['overlap']:.0%}"
    peak = f"{max(peaks):.0f}" if peaks else "—"
    used = f"{max(in_use):.0f}" if in_use else "—"
    return (f"| {r['k']} | {len(r['runs'])}/{r['k']} | {r['steps_per_s']:.1f} | {per_run} | {speedup} "
            f"| {growth} | {overlap} | {peak} | {used} | {check} |")


def _workers_meaning(rounds: list[dict], k_sat: int | None, one: float | None, fallback: bool) -> str:
    """What part (e) means for ``geosearch search --workers k``."""
    if fallback:
        return ("CPU fallback: the k runs share this machine's CPU cores (one thread each), not a GPU; "
                "these figures say nothing about a GPU. On the CPU, `geosearch search --workers k` "
                "gives each worker cpu_count // k torch threads.")
    ok_rounds = [r for r in rounds if r.get("ok")]
    at = k_sat if k_sat is not None else (ok_rounds[-1]["k"] if ok_rounds else None)
    gain = next((r["steps_per_s"] / one for r in ok_rounds if r["k"] == at), None) if one else None
    meaning = ("What this means for `geosearch search --workers k` on one GPU: worker i takes GPU "
               "i mod #GPUs (`CUDA_VISIBLE_DEVICES`), so with one GPU all k workers land on it, side "
               "by side as the runs here")
    if gain is None:
        meaning += "."
    elif k_sat is not None:
        meaning += (f": `--workers {at}` trains about {gain:.1f}× the steps per second of `--workers 1`; "
                    "more workers add less than 10% each.")
    else:
        meaning += (f": `--workers {at}` trains about {gain:.1f}× the steps per second of `--workers 1` "
                    f"(more than {at} not measured).")
    return meaning + (f" Unlike these runs, a worker takes cpu_count // k torch threads ({os.cpu_count()} // k "
                      "here) instead of one, and between runs it builds models and evaluates, outside the "
                      "timed window.")


def concurrency_section(rounds: list[dict], fallback: bool) -> tuple[str, str]:
    """The table of part (e), and its check: FAIL (a run failed), timed out (a k was cut at the
    part's end, as a run that hangs would be), ok (a k ran, none failed or was cut), skipped."""
    lines = ["| k | runs ok | aggregate steps/s | per-run ms/step: mean (min–max) | speedup over k = 1 "
             "| growth over the previous k | timed windows overlap | peak allocated per run, MiB "
             "| device memory in use, MiB | check |", "|---" * 10 + "|"]
    one = next((r["steps_per_s"] for r in rounds if r.get("ok") and r["k"] == 1), None)
    prev = None
    for r in rounds:
        lines.append(_round_row(r, one, prev))
        if r.get("ok"):
            prev = r["steps_per_s"]
    k_sat, line = saturation(rounds)
    ok_rounds = [r for r in rounds if r.get("ok")]
    best = max(ok_rounds, key=lambda r: r["steps_per_s"], default=None)
    if best is not None and one:
        line += f" The highest aggregate: k = {best['k']}, {best['steps_per_s'] / one:.2f}× one run's."
    ran = [r for r in rounds if "skipped" not in r]
    cut = [r for r in ran if not r["ok"] and r.get("cut")]
    failed = [r for r in ran if not r["ok"] and not r.get("cut")]
    check = "FAIL" if failed else "timed out" if cut else "ok" if ok_rounds else "skipped"
    meaning = _workers_meaning(rounds, k_sat, one, fallback)
    return "\n".join(lines) + "\n\n" + line + "\n\n" + meaning + "\n", check


def default_search_section(s: dict | None, why_off: str) -> tuple[str, str]:
    """The table of part (f), and its check: ok, FAIL, timed out, skipped or off."""
    if s is None:
        return f"Off: {why_off}.\n", "off"
    plan = s["plan"]
    lo, hi = plan["steps"]
    planned = f"{lo:,}" + (f"–{hi:,}" if hi != lo else "")
    est = f"{s['estimate'][0]:.0f}–{s['estimate'][1]:.0f} s"
    runs = "–".join(dict.fromkeys(map(str, plan["runs"])))  # "17–21", or "12" when both are
    lines = ["| | |", "|---|---|", f"| command | `{s['command']}` |",
             f"| estimated before the run | {est} ({planned} steps, {runs} proxy runs; "
             f"{s.get('estimate_basis', 'planning figures')}) |",
             f"| timeout | {max(0.0, s['timeout']):.0f} s (what was left of the budget) |"]
    if "skipped" in s:
        lines.append(f"| outcome | skipped: {s['skipped']} |")
        return "\n".join(lines) + "\n", "skipped"
    rate = s["steps"] / s["wall_s"] if s["wall_s"] > 0 else math.nan
    timed_out = s["timed_out"] is not None
    if timed_out:
        outcome = (f"timed out after {s['timed_out']:.0f} s: stopped with Ctrl-C (killed {SEARCH_GRACE:.0f} s "
                   f"later if still running), exit code {s['rc']}")
    else:
        outcome = f"exit code {s['rc']}"
    trials = ", ".join(f"{k} {v}" for k, v in sorted(s["trials"].items())) or "none"
    lines += [f"| outcome | {outcome} |", f"| wall time | {s['wall_s']:.1f} s |",
              f"| steps trained | {s['steps']:,} of the {planned} planned, in {s['runs']} proxy runs |",
              f"| throughput | {rate:.1f} steps/s over the wall time; the training steps themselves took "
              f"{s['train_s']:.0f} s ({s['train_s'] / s['wall_s']:.0%}; the rest: the start, model builds, "
              "evaluations and probes, the study's bookkeeping) |" if s["wall_s"] > 0 else "| throughput | — |",
              f"| trials | {trials} |", f"| stopped | {_cell(s['stopped'] or '—')} |",
              f"| verdict | {_cell(s['verdict'] or '— (none printed)')} |"]
    if timed_out and rate > 0:
        lines.append(f"| projection | at {rate:.1f} steps/s the planned {planned} steps take about "
                     f"{lo / rate:.0f}" + (f"–{hi / rate:.0f}" if hi != lo else "")
                     + " s (a projection from the part that ran, not a measurement) |")
    failed = s["trials"].get("failed", 0)
    if timed_out:
        check = "FAIL" if failed else "timed out"
    else:
        check = "ok" if s["rc"] == 0 and s["verdict"] and not failed else "FAIL"
    if check == "FAIL":
        lines.append(f"| output (last lines) | {_cell(s['tail'])} |")
    lines.append(f"| check | {check}{': not judged' if check == 'timed out' else ''} (ok: exit code 0, a verdict, "
                 "no failed trial) |")
    return "\n".join(lines) + "\n", check


# --------------------------------------------------------------------------- main
def _ks(text: str) -> tuple[int, ...]:
    if text.strip().lower() in ("", "none", "0"):
        return ()
    try:
        ks = tuple(sorted({int(x) for x in text.split(",") if x.strip()}))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected k values like 1,2,4,8, got {text!r}") from None
    if any(k < 1 or k > 64 for k in ks):
        raise argparse.ArgumentTypeError(f"k values must lie in 1..64, got {text!r}")
    return ks


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cuda", "cpu"),
                        default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--quick", action="store_true", help="tiny sizes: seconds per part (tests)")
    parser.add_argument("--concurrency", type=_ks, default=None, metavar="K,K,...",
                        help="(e): the numbers of runs side by side (default 1,2,4,8,16 on CUDA, 1,2 "
                             "otherwise; none: skip)")
    parser.add_argument("--default-search", action=argparse.BooleanOptionalAction, default=None,
                        help="(f): run the shipped default search (default: on CUDA without --quick)")
    parser.add_argument("--budget", type=float, default=None, metavar="SECONDS",
                        help="the whole script's time; the parts' timeouts come out of it "
                             f"(default {BUDGET['cuda']:.0f} on CUDA, {BUDGET['cpu']:.0f} on the CPU, "
                             f"{BUDGET['quick']:.0f} with --quick)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--child", choices=("bf16", "no"), help=argparse.SUPPRESS)
    parser.add_argument("--child-out", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--throughput-child", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--sync-dir", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.budget is not None and not args.budget > 0:
        parser.error(f"--budget: expected seconds > 0, got {args.budget}")
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: CUDA is not available here (the CPU fallback is --device cpu)")
    size = sizes(args.device, args.quick)
    if args.concurrency is None:
        args.concurrency = size.concurrency.ks
    if args.default_search is None:
        args.default_search = args.device == "cuda" and not args.quick
    if args.budget is None:
        args.budget = BUDGET[_mode(args)]
    return args


def training_step_rows(args: argparse.Namespace, device: torch.device) -> dict:
    """(g): ``optimizer_step.py --train``'s rows: mini and small on a GPU, mini in the CPU
    fallback, tiny (one step per variant) with ``--quick``."""
    if args.quick:
        models, sized = ["tiny"], argparse.Namespace(warmup=1, rounds=1, block=1)
    elif device.type == "cuda":
        models, sized = ["mini", "small"], argparse.Namespace(warmup=3, rounds=6, block=5)
    else:
        models, sized = ["mini"], argparse.Namespace(warmup=2, rounds=3, block=3)
    rows = [r for m in models for r in train_rows(m, sized, device)]
    what = f"{sized.rounds} rounds of {sized.block} steps per variant after {sized.warmup} warm-up"
    # torch.compile: mini (compiling is the cost), tiny with --quick through the aot_eager
    # backend (the capture and the graphs, no code generation: seconds on a CPU)
    backend = "aot_eager" if args.quick else "inductor"
    compiled = compile_rows(models[0], sized, device, backend)
    return {"models": models, "rows": rows, "what": what, "compiled": compiled,
            "backend": backend}


def estimates(args: argparse.Namespace, size: Sizes, plan: dict | None) -> tuple[str, tuple[float, float] | None]:
    """The time each part should take on a GPU, in words, and (f)'s estimate in seconds."""
    search = search_estimate(plan, STEP_MS) if plan else None
    if args.device != "cuda" or args.quick:
        return "no estimate (the planning figures are for a GPU at full sizes)", search
    conc = size.concurrency
    e = sum(START_S + conc.steps * max(STEP_MS[1], k * GPU_MS) / 1e3 for k in args.concurrency)
    fixed = sum(PART_S.values()) + e
    lo, hi = (fixed + search[0], fixed + search[1]) if search else (fixed, fixed)
    text = (f"(a, b) ~{PART_S['ab']:.0f} s, (c) ~{PART_S['c']:.0f} s, (d) ~{PART_S['d']:.0f} s, "
            f"(g) ~{PART_S['g'] + PART_S['g compiled']:.0f} s, "
            f"(e) ~{e:.0f} s for k = {', '.join(map(str, args.concurrency)) or 'none'}, (f) "
            + (f"{search[0]:.0f}–{search[1]:.0f} s" if search else "off")
            + f": {lo:.0f}–{hi:.0f} s in all, against a budget of {args.budget:.0f} s (the larger k of (e) "
            "are skipped and (f) is timed out rather than overrun it). Basis: one small-proxy step at "
            f"{STEP_MS[0]:.0f}–{STEP_MS[1]:.0f} ms on the GPU (about 3,200 eager torch ops), a child's start "
            f"{START_S:.0f} s, {RUN_SETUP_S:.0f} s per proxy run's setup: planning figures, not measurements")
    return text, search


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    size = sizes(args.device, args.quick)
    if args.child or args.throughput_child is not None:
        _die_with_parent()
        if args.child:
            result = child(args.child, [0] if args.child == "bf16" else [0, 1], args.child == "bf16",
                           size, args.device)
        else:
            result = throughput_child(args.throughput_child, args.sync_dir, size.concurrency, args.device)
        args.child_out.write_text(json.dumps(result), encoding="utf-8")
        return 0

    start = time.perf_counter()
    deadline = start + args.budget
    device = torch.device(args.device)
    fallback = device.type != "cuda"
    gpu = f"{torch.cuda.get_device_name(device)}, " if not fallback else ""
    plan = search_plan(args.quick) if args.default_search else None
    estimate_text, search_est = estimates(args, size, plan)
    print(f"estimate: {estimate_text}", flush=True)

    print("(a, b) search and proxy runs in child processes ...", flush=True)
    children = run_children(args, min(start + CHILD_TIMEOUT, deadline - MARGIN))
    print("(c) optimizer step times ...", flush=True)
    timings = step_times(size, device)
    print("(d) bf16 numerics ...", flush=True)
    numerics = bf16_numerics(size, device)
    print("(g) training step against Muon ...", flush=True)
    train = training_step_rows(args, device)
    if not fallback:
        torch.cuda.empty_cache()  # this process's cache, before (e) and (f) take the GPU

    # (e) may use what (f) will not need: (f)'s estimate (at most half the budget) is kept for it
    reserve = min(search_est[1], args.budget / 2) if search_est else 0.0
    print(f"(e) runs side by side: k = {', '.join(map(str, args.concurrency)) or 'none'} ...", flush=True)
    rounds = concurrency(args, size.concurrency, deadline - MARGIN - reserve)
    search = None
    if args.default_search:
        basis = "planning figures"
        one = next((r for r in rounds if r.get("ok") and r["k"] == 1), None)
        if one is not None and not args.quick and size.concurrency.model == "small":
            ms = one["runs"][0]["ms"]
            search_est = search_estimate(plan, (ms, ms * 1.25))
            basis = (f"redone from (e)'s {ms:.1f} ms/step of one run (to 1.25× that), {START_S:.0f} s start, "
                     f"{RUN_SETUP_S:.0f} s a run's setup")
        print(f"(f) the default search (estimated {search_est[0]:.0f}–{search_est[1]:.0f} s, "
              f"timeout {deadline - MARGIN - time.perf_counter():.0f} s) ...", flush=True)
        search = default_search(args, deadline - MARGIN, plan, search_est)
        search["estimate_basis"] = basis

    search_text, search_ok = search_section(children)
    precision_text, precision_ok = precision_section(children)
    numerics_text, numerics_ok = numerics_section(numerics)
    conc_text, conc_check = concurrency_section(rounds, fallback) if rounds else ("Off: --concurrency none.\n", "off")
    why_off = ("--no-default-search" if args.device == "cuda" and not args.quick else
               "on by default on CUDA only, and not with --quick (on a 2-core CPU the default search takes "
               "about 8 minutes); --default-search runs it")
    default_text, default_check = default_search_section(search, why_off)
    checks = {"bf16 search": "ok" if search_ok else "FAIL", "bf16 vs fp32": "ok" if precision_ok else "FAIL",
              "bf16 numerics": "ok" if numerics_ok else "FAIL",
              "runs side by side": conc_check,
              "default search": default_check}
    conc = size.concurrency
    title = "GPU readiness" + (" — CPU fallback" if fallback else "")
    text = (
        f"# {title}\n\n"
        f"Device: {gpu}{device}{' (CPU fallback: no CUDA, smaller shapes, bf16 on the CPU)' if fallback else ''}"
        f"{' — quick sizes' if args.quick else ''}. {machine()}. Total {time.perf_counter() - start:.0f} s "
        f"of a {args.budget:.0f} s budget.\n\n"
        f"Estimated before the run: {estimate_text}.\n\n"
        f"Checks: " + ", ".join(f"{k} {v}" for k, v in checks.items()) + ".\n\n"
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
        f"distance ≤ {MSIGN_TOL} from fp32.\n\n{numerics_text}\n"
        f"## (e) Runs side by side on one {'GPU' if not fallback else 'machine (CPU fallback)'}\n\n"
        f"Command: `python benchmarks/gpu_check.py --concurrency {','.join(map(str, args.concurrency)) or 'none'}"
        f"{' --device cpu' if fallback else ''}{' --quick' if args.quick else ''}`: for each k, k child processes "
        f"(`OMP_NUM_THREADS=1`, `torch.set_num_threads(1)`), each one `geosearch.proxy.train.train` run of the "
        f"default space's proxy ({conc.model}, batch {conc.batch_size or 'of the space, 16'}, bf16, probes every "
        f"{conc.probe_every} steps, {', '.join(f'{k}={v}' for k, v in ASSIGNMENT.items())}). Each run "
        f"trains {conc.warmup} warm-up steps, waits until every run has (a barrier), then is timed over "
        f"{conc.timed} steps (probes included, no evaluation), and trains {conc.probe_every} more so that no "
        f"run ends inside another's window. Aggregate = the sum over the runs of steps / second; peak "
        f"allocated = `torch.cuda.max_memory_allocated` in each run; device memory in use = total − free "
        f"(`torch.cuda.mem_get_info`) at the end of a window: every process's, CUDA contexts included.\n\n"
        f"{conc_text}\n"
        f"## (f) The default search{QUICK_NOTE if args.quick else ''}\n\n"
        f"{default_text}\n"
        f"## (g) Training step against Muon ({', '.join(train['models'])}; {train['what']})\n\n"
        "The rows of `benchmarks/optimizer_step.py --train`: the whole training step (fp32) of "
        "each geometry, "
        "grouped and ungrouped, against torch.optim.Muon and Muon in fp32, alternated in one "
        "process; "
        "optimizer ops = ATen operations of one optimizer step (each at least one kernel launch "
        "on a GPU)."
        f"\n\n{train_table(train['rows'])}\n{train_verdicts(train['rows'])}\n"
        f"### (g) with torch.compile ({train['models'][0]}; backend {train['backend']})\n\n"
        "The rows of `benchmarks/optimizer_step.py --train --compile`: eager against "
        "torch.compile of the model (forward and backward) and of the optimizer step in the "
        "fixed-iteration mode, the variants alternated in one process; first step s: the "
        "first step's seconds (compiling, for the compiled variants); |Δ loss|: the largest "
        "over every step against eager from the same seed and batches."
        f"\n\n{compile_table(train['compiled'])}"
    )
    publish(text, args.out)
    return 1 if "FAIL" in checks.values() else 0


if __name__ == "__main__":
    raise SystemExit(main())
