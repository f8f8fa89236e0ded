"""Time per optimizer step at GPT-2-small weight shapes, per geometry × solver.

Compares :class:`geosearch.optim.ManifoldMuon` on every registered geometry with both
solvers against ``torch.optim.AdamW`` and against the reference algorithm as published
(see the "reference" section below), all measured in the same run, and reports the
constraint error each leaves. Not a test: it prints a table and writes it to
``benchmarks/results/optimizer_step.md``.

``--accuracy`` measures msign instead, for each Newton–Schulz coefficient set
(``ns_coefficients``: ``polar_express``, ``quintic``) and 1–12 iterations: its distance to
the exact polar factor and the error of its singular values, on Gaussian and decaying
spectra, and its time per call; then how many iterations each set needs to reach the
other's accuracy, so that a speed claim is made at equal accuracy. It writes
``benchmarks/results/msign_accuracy.md``.

Usage::

    python benchmarks/optimizer_step.py                      # GPT-2 small shapes
    python benchmarks/optimizer_step.py --shapes small --repeats 2   # a quick run
    python benchmarks/optimizer_step.py --threads 1          # stable numbers on a shared CPU
    python benchmarks/optimizer_step.py --device cuda --repeats 20
    python benchmarks/optimizer_step.py --accuracy --shapes small --threads 1
    python benchmarks/optimizer_step.py --ranks --models mini --steps 30 --warmup 5 --threads 1
    python benchmarks/optimizer_step.py --train --compile --models mini --threads 1 --warmup 3
"""

from __future__ import annotations

import argparse
import datetime
import math
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch

from _common import publish  # benchmarks/ is on sys.path when a script runs
from geosearch.manifolds import get_manifold, manifold_names, msign
from geosearch.manifolds.msign import NS_COEFFICIENTS
from geosearch.optim.muon import ManifoldMuon

SHAPES = {
    # (out, in) of nn.Linear: c_attn, attn c_proj, c_fc, mlp c_proj of GPT-2 small
    "gpt2": [(2304, 768), (768, 768), (3072, 768), (768, 3072)],
    "small": [(576, 192), (192, 192), (768, 192), (192, 768)],
}
LR = 0.02  # the study's spectral step size
RESULTS = Path(__file__).parent / "results" / "optimizer_step.md"

# ------------------------------------------------------------------------------------
# The reference algorithm as published, kept here only for this comparison.
# Manifold Muon of Bernstein (2025) as in the "modular manifolds" code, with the Gram
# projector P of the study inserted: Λ₀ = −¼·P(WᵀG + GᵀW); K = 20 times
# A = msign(G + 2WΛ), H = P(WᵀA + AᵀW), stop if ‖H‖_F/√numel < 1e-6, Λ ← Λ − α(1 − k/K)H
# with the fixed α = 0.1 on the unscaled G; msign = 10 Polar Express iterations (that
# code's default; run in float32 here like ours). Retraction: Stiefel msign(W); DGram
# the SVD-based U Vᵀ·diag(σ) (which re-sorts column norms, so it moves on-manifold points).
# ------------------------------------------------------------------------------------
REF_STEPS, REF_ALPHA, REF_TOL, REF_NS = 20, 0.1, 1e-6, 10
REFERENCE_GEOMETRIES = ("stiefel", "dgram")


def reference_dgram_retract(W: torch.Tensor) -> torch.Tensor:
    """REFERENCE ONLY (published DGram retraction): ``U Vᵀ·diag(σ)`` for tall ``W``."""
    U, S, Vh = torch.linalg.svd(W, full_matrices=False)
    return (U @ Vh) * S


def reference_direction(geometry: str, W: torch.Tensor, G: torch.Tensor) -> tuple[torch.Tensor, float]:
    """REFERENCE ONLY: the published dual-ascent direction for tall ``W``; (A, last residual)."""
    project = get_manifold(geometry).gram_projector
    lam = -0.25 * project(W.T @ G + G.T @ W)
    for k in range(REF_STEPS):
        A = msign(G + 2 * W @ lam, steps=REF_NS)
        H = project(W.T @ A + A.T @ W)
        residual = float(H.norm() / math.sqrt(H.numel()))
        if residual < REF_TOL:
            break
        lam = lam - REF_ALPHA * (1 - k / REF_STEPS) * H
    return A, residual


def reference_update(
    geometry: str, W: torch.Tensor, G: torch.Tensor, lr: float
) -> tuple[torch.Tensor, float]:
    """REFERENCE ONLY: one published manifold-Muon update; returns (new W, last residual)."""
    wide = W.shape[0] < W.shape[1]
    if wide:
        W, G = W.T, G.T
    A, residual = reference_direction(geometry, W, G)
    new = W - lr * A
    new = msign(new, steps=REF_NS) if geometry == "stiefel" else reference_dgram_retract(new)
    return (new.T if wide else new), residual


class ReferenceOptimizer:
    """REFERENCE ONLY: Nesterov momentum (as in ManifoldMuon) + :func:`reference_update`."""

    def __init__(self, param: torch.Tensor, geometry: str, lr: float = LR, momentum: float = 0.95):
        self.param, self.geometry, self.lr, self.beta = param, geometry, lr, momentum
        self.buf = torch.zeros_like(param)
        self.residual = math.nan

    @torch.no_grad()
    def step(self) -> None:
        g = self.param.grad
        self.buf.lerp_(g, 1 - self.beta)
        update = torch.lerp(g, self.buf, self.beta)
        new, self.residual = reference_update(self.geometry, self.param, update, self.lr)
        self.param.copy_(new)


# ------------------------------------------------------------------------------------
def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def _gradients(shape, count: int, device, seed: int) -> list[torch.Tensor]:
    """Gaussian gradients with ‖G‖_F = 1 (the reference measured norms of 0.3–2.9)."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(count):
        g = torch.randn(*shape, generator=gen)
        out.append((g / g.norm()).to(device))
    return out


def run_case(make: Callable[[torch.nn.Parameter], object], geometry: str, shape, args, device,
             dtype: torch.dtype = torch.float32) -> dict:
    """Median seconds per step of one optimizer on one weight, and what it leaves behind.

    ``dtype``: the weight's and its gradients' dtype (placed on the manifold in float32,
    then rounded to it)."""
    torch.manual_seed(0)
    p = torch.nn.Parameter(torch.randn(*shape, device=device) / math.sqrt(shape[1]))
    if geometry != "adamw":
        with torch.no_grad():
            p.copy_(get_manifold(geometry).project(p))
    p.data = p.data.to(dtype)
    opt = make(p)
    grads = [g.to(dtype) for g in _gradients(shape, args.warmup + args.repeats, device, seed=1)]
    times = []
    for i, g in enumerate(grads):
        p.grad = g
        _sync(device)
        t0 = time.perf_counter()
        opt.step()
        _sync(device)
        if i >= args.warmup:
            times.append(time.perf_counter() - t0)
    error = 0.0
    if geometry != "adamw":
        error = float(get_manifold(geometry).constraint_error(p.detach().double()))
    if isinstance(opt, ReferenceOptimizer):
        residual = opt.residual
    else:
        residual = opt.state[p].get("residual", math.nan) if isinstance(opt, ManifoldMuon) else math.nan
    return {"seconds": statistics.median(times), "error": error, "residual": residual}


def _cases(args) -> list[tuple[str, str, Callable]]:
    cases: list[tuple[str, str, Callable]] = [
        ("adamw", "torch AdamW",
         lambda p: torch.optim.AdamW([p], lr=6e-4, betas=(0.9, 0.95), weight_decay=0.1)),
    ]
    for geometry in args.geometries:
        for solver in ("project", "dual"):
            label = solver + (" (default)" if solver == "project"
                              else f" (K≤{args.dual_steps}, tol {args.dual_tol:g})")
            cases.append((geometry, label, lambda p, g=geometry, s=solver: ManifoldMuon(
                [{"params": [p], "geometry": g, "lr": LR, "solver": s, "dual_steps": args.dual_steps,
                  "dual_tol": args.dual_tol}])))
        if geometry in REFERENCE_GEOMETRIES:  # the study's geometries: also measure the warm start
            cases.append((geometry, "dual + warm start", lambda p, g=geometry: ManifoldMuon(
                [{"params": [p], "geometry": g, "lr": LR, "solver": "dual", "warm_start": True,
                  "dual_steps": args.dual_steps, "dual_tol": args.dual_tol}])))
        if geometry in REFERENCE_GEOMETRIES and not args.no_reference:
            cases.append((geometry, "reference (published)", lambda p, g=geometry: ReferenceOptimizer(p, g)))
    return cases


# ------------------------------------------------------------------------------------
# --accuracy: msign's coefficient sets against the exact polar factor, per iteration.
# G = U diag(σ) Vᵀ with U, V from the QR of Gaussian matrices (float64), so the exact polar
# factor U Vᵀ is known; msign(G) has G's singular vectors, so ‖msign(G) − U Vᵀ‖₂ is its worst
# singular value's distance to 1 (up to float32 rounding).
# ------------------------------------------------------------------------------------
SPECTRA = {
    "gaussian": "i.i.d. N(0, 1) entries (Marchenko–Pastur; the square shape reaches σ_min ≈ 4e-4·‖G‖_F)",
    "power": "σ_i ∝ 1/i, i = 1..min(m, n) (a decaying, gradient-like spectrum)",
    "decades": "σ log-spaced from σ_max down to 1e-3·σ_max (three decades)",
}
ACCURACY_STEPS = tuple(range(1, 13))
ACCURACY_RESULTS = Path(__file__).parent / "results" / "msign_accuracy.md"
BASE_STEPS = 5  # the default ns_steps, and torch.optim.Muon's


def spectrum_matrix(kind: str, shape, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """``(G, exact polar factor)`` in float64 for a spectrum of :data:`SPECTRA`."""
    m, n = shape
    if kind == "gaussian":
        G = torch.randn(m, n, generator=gen, dtype=torch.float64)
        U, _, Vh = torch.linalg.svd(G, full_matrices=False)
        return G, U @ Vh
    k = min(m, n)
    U = torch.linalg.qr(torch.randn(m, k, generator=gen, dtype=torch.float64))[0]
    V = torch.linalg.qr(torch.randn(n, k, generator=gen, dtype=torch.float64))[0]
    i = torch.arange(1, k + 1, dtype=torch.float64)
    sigma = 1 / i if kind == "power" else torch.logspace(0, -3, k, dtype=torch.float64)
    return (U * sigma) @ V.mT, U @ V.mT


def msign_errors(G: torch.Tensor, P: torch.Tensor, coefficients: str, steps: int) -> dict:
    """``‖msign(G) − P‖₂`` and the max and median of ``|σ_i(msign(G)) − 1|`` (float32 msign)."""
    A = msign(G.float(), steps=steps, coefficients=coefficients).double()
    sv = torch.linalg.svdvals(A)
    return {"dist": float(torch.linalg.matrix_norm(A - P, ord=2)), "max": float((sv - 1).abs().max()),
            "median": float((sv - 1).abs().median())}


def time_msign(G: torch.Tensor, coefficients: str, steps: int, args, device) -> float:
    """Median seconds of one msign call on ``G`` (float32, on ``device``)."""
    times = []
    for i in range(args.warmup + args.repeats):
        _sync(device)
        t0 = time.perf_counter()
        msign(G, steps=steps, coefficients=coefficients)
        _sync(device)
        if i >= args.warmup:
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def accuracy_rows(shapes, args, device) -> list[dict]:
    """One row per (spectrum, shape, set, steps): the errors and the time per call."""
    rows = []
    for kind in SPECTRA:
        gen = torch.Generator().manual_seed(0)
        for shape in shapes:
            G, P = spectrum_matrix(kind, shape, gen)
            G32 = G.float().to(device)
            for coefficients in NS_COEFFICIENTS:
                for steps in ACCURACY_STEPS:
                    row = {"spectrum": kind, "shape": shape, "set": coefficients, "steps": steps,
                           **msign_errors(G, P, coefficients, steps)}
                    row["ms"] = time_msign(G32, coefficients, steps, args, device) * 1e3
                    rows.append(row)
            print(f"  {kind:9s} {shape[0]}×{shape[1]}", flush=True)
    return rows


def _worst(rows: list[dict], kind: str, coefficients: str, steps: int) -> dict:
    """Over the shapes: the largest errors, and the summed time per call."""
    mine = [r for r in rows if r["spectrum"] == kind and r["set"] == coefficients and r["steps"] == steps]
    return {"dist": max(r["dist"] for r in mine), "median": max(r["median"] for r in mine),
            "ms": sum(r["ms"] for r in mine)}


def _fewest(rows: list[dict], kind: str, coefficients: str, key: str, target: float) -> int | None:
    """The fewest iterations of ``coefficients`` whose worst ``key`` error is at most ``target``."""
    return next((k for k in ACCURACY_STEPS if _worst(rows, kind, coefficients, k)[key] <= target), None)


def _time_fit(rows: list[dict], kind: str, sets) -> tuple[float, float]:
    """``(a, b)`` of the least-squares line ms ≈ a + b·steps through the times per call
    (summed over the shapes) of the coefficient sets ``sets``: less noisy on a shared
    machine than one measured cell."""
    ks = [k for _ in sets for k in ACCURACY_STEPS]
    ms = [_worst(rows, kind, c, k)["ms"] for c in sets for k in ACCURACY_STEPS]
    mk, mm = statistics.fmean(ks), statistics.fmean(ms)
    b = sum((k - mk) * (m - mm) for k, m in zip(ks, ms)) / sum((k - mk) ** 2 for k in ks)
    return mm - b * mk, b


ERROR_LEVELS = {"dist": (0.9, 0.5, 0.35, 0.15, 1e-2, 1e-4), "median": (0.2, 0.1, 1e-2, 1e-5)}
"""The accuracies the equal-accuracy table asks each set to reach (worst over the shapes)."""
ERROR_NAMES = {"dist": "‖·‖₂", "median": "median |σ − 1|"}


def accuracy_tables(rows: list[dict], shapes) -> str:
    sets = list(NS_COEFFICIENTS)
    # Both sets run the same three products per iteration: one line through both times (the
    # per-set lines are printed to show that they agree up to the machine's noise).
    fits = {(kind, c): _time_fit(rows, kind, [c]) for kind in SPECTRA for c in sets}
    pooled = {kind: _time_fit(rows, kind, sets) for kind in SPECTRA}
    out = []
    for kind, text in SPECTRA.items():
        out += [f"### {kind}: {text}", "",
                "Worst over the shapes of ‖msign(G) − polar(G)‖₂ (= max |σ − 1|) and of the median "
                "|σ − 1|; ms: time per call summed over the shapes.", "",
                "| steps | " + " | ".join(f"{c} ‖·‖₂" for c in sets) + " | "
                + " | ".join(f"{c} median" for c in sets) + " | " + " | ".join(f"{c} ms" for c in sets) + " |",
                "|---" * (1 + 3 * len(sets)) + "|"]
        for k in ACCURACY_STEPS:
            w = {c: _worst(rows, kind, c, k) for c in sets}
            out.append(f"| {k} | " + " | ".join(f"{w[c]['dist']:.2e}" for c in sets) + " | "
                       + " | ".join(f"{w[c]['median']:.2e}" for c in sets) + " | "
                       + " | ".join(f"{w[c]['ms']:.2f}" for c in sets) + " |")
        out += ["", "Time per call, least-squares fit over 1–12 steps: "
                + "; ".join(f"{c} {fits[kind, c][0]:.2f} + {fits[kind, c][1]:.2f}·steps ms" for c in sets)
                + f"; both {pooled[kind][0]:.2f} + {pooled[kind][1]:.2f}·steps ms", ""]
    out += ["### At equal accuracy", "",
            "Per accuracy level (worst over the shapes), the fewest iterations of each set that reach it "
            "(— : none of 1–12 does) and the time per call there, from the line fitted through both "
            "sets' times (the same products per iteration); "
            f"ratio: {sets[1]}'s time over {sets[0]}'s (> 1: {sets[0]} is faster at that accuracy). "
            f"Rows \"= X at {BASE_STEPS}\": the level is set X's own error at {BASE_STEPS} iterations.", "",
            "| spectrum | error | level | " + " | ".join(f"{c} steps | {c} ms" for c in sets) + " | ratio |",
            "|---" * (4 + 2 * len(sets)) + "|"]
    for kind in SPECTRA:
        for key, name in ERROR_NAMES.items():
            levels = [(f"{x:g}", x) for x in ERROR_LEVELS[key]]
            levels += [(f"= {c} at {BASE_STEPS} ({_worst(rows, kind, c, BASE_STEPS)[key]:.2g})",
                        _worst(rows, kind, c, BASE_STEPS)[key]) for c in sets]
            for label, level in levels:
                cells, ms = [], {}
                for c in sets:
                    k = _fewest(rows, kind, c, key, level)
                    if k is None:
                        cells.append("— | —")
                        continue
                    a, b = pooled[kind]
                    ms[c] = a + b * k
                    cells.append(f"{k} | {ms[c]:.1f}")
                ratio = f"{ms[sets[1]] / ms[sets[0]]:.2f}" if len(ms) == 2 else "—"
                out.append(f"| {kind} | {name} | {label} | " + " | ".join(cells) + f" | {ratio} |")
    out += ["", "### Per shape", "", "| spectrum | shape | set | steps | ‖·‖₂ | max |σ − 1| | median |σ − 1| | ms |",
            "|---" * 8 + "|"]
    out += [f"| {r['spectrum']} | {r['shape'][0]}×{r['shape'][1]} | {r['set']} | {r['steps']} | {r['dist']:.2e} | "
            f"{r['max']:.2e} | {r['median']:.2e} | {r['ms']:.3f} |" for r in rows]
    return "\n".join(out) + "\n"


def accuracy_main(args, device) -> int:
    shapes = SHAPES[args.shapes]
    rows = accuracy_rows(shapes, args, device)
    header = (
        f"# msign accuracy per Newton–Schulz coefficient set ({args.shapes} shapes: "
        + ", ".join(f"{m}×{n}" for m, n in shapes) + ")\n\n"
        f"{datetime.datetime.now().isoformat(timespec='seconds')}; device {device} "
        f"({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads); "
        f"torch {torch.__version__}; msign in float32 against the exact polar factor U Vᵀ (float64); "
        f"time: median of {args.repeats} calls after {args.warmup} warm-up.\n\n"
    )
    publish(header + accuracy_tables(rows, shapes), args.out or ACCURACY_RESULTS)
    return 0


# ------------------------------------------------------------------------------------
# --train: the whole training step of a proxy, per geometry, against torch.optim.Muon and
# against the ungrouped step (every matrix stepped alone, the adaptive retraction), the
# variants alternated in blocks in one process.
# ------------------------------------------------------------------------------------
# Muon in float32 as the search's baseline runs it: ManifoldMuon's euclidean geometry with
# torch.optim.Muon's coefficients (torch's own iterates in bfloat16, slow on most CPUs).
MUON_FP32 = "Muon fp32 (euclidean, quintic)"
TRAIN_ASSIGNMENTS = {
    MUON_FP32: "attn=euclidean,mlp=euclidean",
    "all-Stiefel": "attn=stiefel,mlp=stiefel",
    "attn Stiefel + MLP DGram": "attn=stiefel,mlp=dgram",
    "all-DGram": "attn=dgram,mlp=dgram",
}
TRAIN_RESULTS = Path(__file__).parent / "results" / "train_step.md"
MUON = "torch.optim.Muon"
VARIANTS = {  # label -> ManifoldMuon keywords and settings
    "grouped": ({}, {}),
    "ungrouped (previous)": ({"grouped": False}, {"retraction": "adaptive"}),
}


class OpCounter(torch.utils._python_dispatch.TorchDispatchMode):
    """Counts the ATen operations dispatched while active (views and in-place ops included;
    a foreach call is one operation): on a GPU each is at least one kernel launch."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += 1
        return func(*args, **(kwargs or {}))


class TrainCase:
    """One variant's model, optimizer(s) and batches, stepped a block at a time."""

    def __init__(self, model_name: str, label: str, assignment: str | None, corpus, device,
                 seed: int = 0,
                 batch_size: int = 16, optimizer_kwargs: dict | None = None,
                 compiled: tuple[bool, bool] = (False, False), backend: str = "inductor"):
        from geosearch.assignment import Assignment
        from geosearch.build import build_optimizer
        from geosearch.models.model import GPT, make_config

        torch.manual_seed(seed)
        self.label, self.device, self.batch_size = label, device, batch_size
        self.config = make_config(model_name, vocab_size=corpus.vocab_size)
        self.model = GPT(self.config).to(device)
        self.corpus = corpus
        self.gen = torch.Generator().manual_seed(seed)
        opt_kwargs, settings = optimizer_kwargs or ({}, {})
        if assignment is None:  # torch Muon on the hidden matrices, our AdamW on the rest
            muon = Assignment.parse("attn=euclidean,mlp=euclidean")
            plan = build_optimizer(self.model, muon, verbose=False)
            hidden = [p for g in plan.param_groups if g["geometry"] != "adamw" for p in g["params"]]
            rest = [g for g in plan.param_groups if g["geometry"] == "adamw"]
            self.opts = [torch.optim.Muon(hidden, lr=LR, weight_decay=0.0, adjust_lr_fn="original"),
                         ManifoldMuon(rest)]
        else:
            opt = build_optimizer(self.model, Assignment.parse(assignment), verbose=False,
                                  **settings)
            self.opts = [ManifoldMuon(opt.param_groups, **opt_kwargs) if opt_kwargs else opt]
        self.ms: list[float] = []
        self.losses: list[float] = []  # every step's loss, timed or not
        self.first_s = math.nan  # the first step's seconds (with compiled parts: compiling)
        self.graphs = self.breaks = 0
        # compiled = (the model's forward and backward, the optimizer's step): torch.compile
        self.compiled = compiled
        self.forward = torch.compile(self.model, backend=backend) if compiled[0] else self.model
        self.steppers = [torch.compile(opt.step, backend=backend) if compiled[1] else opt.step
                         for opt in self.opts]

    def batch(self):
        from geosearch.proxy.data import get_batch

        x, y = get_batch(self.corpus.train, self.batch_size, self.config.block_size, self.gen)
        return x.to(self.device), y.to(self.device)

    def step(self) -> torch.Tensor:
        x, y = self.batch()
        _, loss = self.forward(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        for step in self.steppers:
            step()
        for opt in self.opts:
            opt.zero_grad(set_to_none=True)
        return loss.detach()

    def run(self, steps: int, record: bool) -> None:
        from torch._dynamo.utils import counters

        graphs, breaks = counters["stats"]["unique_graphs"], sum(counters["graph_break"].values())
        for _ in range(steps):
            _sync(self.device)
            t0 = time.perf_counter()
            loss = self.step()
            _sync(self.device)
            seconds = time.perf_counter() - t0
            if record:
                self.ms.append(1e3 * seconds)
            if not self.losses:
                self.first_s = seconds
            self.losses.append(float(loss))
        # torch.compile's graphs compiled and graph breaks met in these steps
        self.graphs += counters["stats"]["unique_graphs"] - graphs
        self.breaks += sum(counters["graph_break"].values()) - breaks

    def optimizer_ops(self) -> int:
        """ATen operations of one optimizer step (on fresh gradients)."""
        x, y = self.batch()
        _, loss = self.model(x, y)
        loss.backward()
        with OpCounter() as counter:
            for opt in self.opts:
                opt.step()
        for opt in self.opts:
            opt.zero_grad(set_to_none=True)
        return counter.count

    def error(self) -> float:
        """Largest constraint error over the manifold matrices (nan for torch Muon)."""
        from geosearch.optim.blocks import block_view

        worst = math.nan
        for opt in self.opts:
            for g in opt.param_groups:
                if not isinstance(opt, ManifoldMuon) or g["geometry"] in ("adamw", "euclidean"):
                    continue
                geo = g["geometry"]
                names = geo if isinstance(geo, tuple) else (geo,) * g["split"]
                for p in g["params"]:
                    blocks = block_view(p.detach().double(), g["split"], g["split_dim"]).reshape(
                        g["split"], *block_view(p, g["split"], g["split_dim"]).shape[-2:])
                    for name, W in zip(names, blocks):
                        e = float(get_manifold(name).constraint_error(W))
                        worst = e if math.isnan(worst) else max(worst, e)
        return worst


def train_rows(model_name: str, args, device) -> list[dict]:
    """Per variant: median ms of a whole training step, optimizer operations per step,
    constraint error after the run; the variants alternate in blocks of ``args.block``."""
    from geosearch.proxy.data import load_corpus

    corpus = load_corpus(None)
    cases = [TrainCase(model_name, MUON, None, corpus, device)]
    for name, assignment in TRAIN_ASSIGNMENTS.items():
        for label, (kw, settings) in VARIANTS.items():
            if name == MUON_FP32:
                settings = dict(settings, ns_coefficients="quintic")
            cases.append(TrainCase(model_name, label, assignment, corpus, device,
                                   optimizer_kwargs=(kw, settings)))
            cases[-1].geometry = name
    cases[0].geometry = "euclidean (Muon)"
    for case in cases:  # warm-up
        case.run(args.warmup, record=False)
    for _ in range(args.rounds):
        for case in cases:
            case.run(args.block, record=True)
    rows = []
    for case in cases:
        rows.append({"model": model_name, "geometry": case.geometry, "variant": case.label,
                     "ms": statistics.median(case.ms), "ops": case.optimizer_ops(),
                     "error": case.error()})
        print(f"  {model_name} {case.geometry:26s} {case.label:22s} {rows[-1]['ms']:7.1f} ms "
              f"{rows[-1]['ops']:6d} ops  error {rows[-1]['error']:.1e}", flush=True)
    return rows


def train_table(rows: list[dict]) -> str:
    """Ratios against torch Muon and against the ungrouped step of the same run."""
    lines = ["| model | geometry | variant | step ms | × torch Muon | × Muon fp32 grouped | "
             "ungrouped ÷ this, ms | optimizer ops | ungrouped ÷ this, ops | constraint error |",
             "|---" * 10 + "|"]
    for r in rows:
        muon = next(x for x in rows if x["model"] == r["model"] and x["variant"] == MUON)
        fp32 = next(x for x in rows if x["model"] == r["model"] and x["geometry"] == MUON_FP32
                    and x["variant"] == "grouped")
        old = next((x for x in rows if x["model"] == r["model"] and x["geometry"] == r["geometry"]
                    and x["variant"].startswith("ungrouped")), None)
        speed = f"{old['ms'] / r['ms']:.2f}" if old else "—"
        fewer = f"{old['ops'] / r['ops']:.1f}" if old else "—"
        err = "—" if math.isnan(r["error"]) else f"{r['error']:.1e}"
        lines.append(f"| {r['model']} | {r['geometry']} | {r['variant']} | {r['ms']:.1f} | "
                     f"{r['ms'] / muon['ms']:.2f} | {r['ms'] / fp32['ms']:.2f} | {speed} | "
                     f"{r['ops']} | {fewer} | "
                     f"{err} |")
    return "\n".join(lines) + "\n"


def train_verdicts(rows: list[dict]) -> str:
    """Targets: grouped step ≤ 1.25× Muon on mini, ≤ 1.1× on small, at error ≤ 1e-5; optimizer
    operations ÷ ≥ 4 on mini."""
    limit = {"mini": 1.25, "small": 1.1}
    out = []
    for r in rows:
        if r["variant"] != "grouped" or r["geometry"] == MUON_FP32:
            continue
        muon = next(x for x in rows if x["model"] == r["model"] and x["variant"] == MUON)
        fp32 = next(x for x in rows if x["model"] == r["model"] and x["geometry"] == MUON_FP32
                    and x["variant"] == "grouped")
        old = next(x for x in rows if x["model"] == r["model"] and x["geometry"] == r["geometry"]
                   and x["variant"].startswith("ungrouped"))
        ratio, fewer = r["ms"] / muon["ms"], old["ops"] / r["ops"]
        lim = limit.get(r["model"])
        ok = lim is not None and ratio <= lim and r["error"] <= 1e-5
        ok32 = lim is not None and r["ms"] / fp32["ms"] <= lim and r["error"] <= 1e-5
        out.append(f"- {r['model']}, {r['geometry']}: {ratio:.2f}× torch.optim.Muon's step "
                   f"(target ≤ {lim}), "
                   f"error {r['error']:.1e}: {'met' if ok else 'NOT met'}; "
                   f"{r['ms'] / fp32['ms']:.2f}× Muon fp32 "
                   f"grouped: {'met' if ok32 else 'NOT met'}; optimizer ops ÷ {fewer:.1f}"
                   + (f" (target ≥ 4: {'met' if fewer >= 4 else 'NOT met'})"
                      if r["model"] == "mini" else ""))
    return "\n".join(out) + "\n"


def train_main(args, device) -> int:
    rows = [r for m in args.models for r in train_rows(m, args, device)]
    header = (
        f"# Training step against torch.optim.Muon ({', '.join(args.models)})\n\n"
        f"{datetime.datetime.now().isoformat(timespec='seconds')}; device {device} "
        f"({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads); "
        f"torch {torch.__version__}. One process, the variants alternated in blocks of "
        f"{args.block} steps, "
        f"{args.rounds} rounds after {args.warmup} warm-up steps each; step ms: median over the "
        f"{args.block * args.rounds} timed steps (forward, backward, clip, optimizer step, "
        "zero_grad; batch 16). "
        f"{MUON}: Keller's quintic, 5 steps, adjust_lr_fn='original', lr {LR}, on the attention "
        "and MLP "
        "matrices (a fused c_attn as one matrix; its Newton–Schulz runs in bfloat16, slow on a CPU "
        "without "
        f"bf16 units), ManifoldMuon's AdamW on the rest, as in every variant. {MUON_FP32}: "
        "ManifoldMuon's "
        "euclidean geometry with the same coefficients in float32 (the search's Muon baseline). "
        "grouped: this ManifoldMuon (matrices of one shape and geometry stepped as one batch, "
        "retraction 'auto'); ungrouped (previous): every matrix stepped alone, retraction "
        "'adaptive'. "
        "Optimizer ops: ATen operations of one optimizer step (TorchDispatchMode); constraint "
        "error: "
        "the largest over the manifold matrices after the run.\n\n")
    publish(header + train_table(rows) + "\n" + train_verdicts(rows), args.out or TRAIN_RESULTS)
    return 0


# ------------------------------------------------------------------------------------
# --train --compile: the whole training step with torch.compile (the model's forward and
# backward; the optimizer's step in the fixed-iteration mode, which has no data-dependent
# control flow) against eager, the variants alternated in blocks in one process.
# ------------------------------------------------------------------------------------
COMPILE_ASSIGNMENTS = (MUON_FP32, "attn Stiefel + MLP DGram")
FIXED = {"fixed_iterations": True}
COMPILE_VARIANTS = {  # label -> (compile the model, compile the optimizer step), settings
    "eager": ((False, False), {}),
    "eager, fixed iterations": ((False, False), FIXED),
    "compiled model": ((True, False), {}),
    "compiled model + step, fixed iterations": ((True, True), FIXED),
}
COMPILE_RESULTS = Path(__file__).parent / "results" / "train_compile.md"


def compile_rows(model_name: str, args, device, backend: str = "inductor") -> list[dict]:
    """Per assignment of :data:`COMPILE_ASSIGNMENTS` and variant of :data:`COMPILE_VARIANTS`:
    the first step's seconds (compiling, for the compiled ones), the median step ms, the
    graphs compiled and graph breaks met, the optimizer's ATen operations (eager variants
    only: a compiled step runs fused kernels), the constraint error, and the largest
    |Δ loss| over every step against the eager variant (the same seed and batches)."""
    import torch._dynamo
    from geosearch.proxy.data import load_corpus

    torch._dynamo.reset()
    corpus, cases = load_corpus(None), []
    for name in COMPILE_ASSIGNMENTS:
        for label, (compiled, settings) in COMPILE_VARIANTS.items():
            if name == MUON_FP32:
                settings = dict(settings, ns_coefficients="quintic")
            case = TrainCase(model_name, label, TRAIN_ASSIGNMENTS[name], corpus, device,
                             optimizer_kwargs=({}, settings), compiled=compiled, backend=backend)
            case.geometry = name
            cases.append(case)
    for case in cases:  # warm-up: the compiled variants compile here
        case.run(args.warmup, record=False)
        print(f"  {model_name} {case.geometry:26s} {case.label:40s} first step "
              f"{case.first_s:6.1f} s", flush=True)
    for _ in range(args.rounds):
        for case in cases:
            case.run(args.block, record=True)
    rows = []
    for case in cases:
        eager = next(c for c in cases if c.geometry == case.geometry and c.label == "eager")
        rows.append({"model": model_name, "geometry": case.geometry, "variant": case.label,
                     "ms": statistics.median(case.ms), "first_s": case.first_s,
                     "graphs": case.graphs, "breaks": case.breaks,
                     "ops": None if any(case.compiled) else case.optimizer_ops(), "error": case.error(),
                     "dloss": max(abs(a - b) for a, b in zip(case.losses, eager.losses)),
                     "steps": len(case.losses)})
        r = rows[-1]
        print(f"  {model_name} {case.geometry:26s} {case.label:40s} {r['ms']:7.1f} ms "
              f"Δloss {r['dloss']:.1e} error {r['error']:.1e}", flush=True)
    return rows


def compile_table(rows: list[dict]) -> str:
    """Ratios against the eager variant of the same assignment, measured in the same run."""
    lines = ["| model | geometry | variant | step ms | eager ÷ this | first step s | graphs "
             "| graph breaks | optimizer ops | largest \\|Δ loss\\| vs eager | constraint error |",
             "|---" * 11 + "|"]
    for r in rows:
        eager = next(x for x in rows if x["model"] == r["model"]
                     and x["geometry"] == r["geometry"] and x["variant"] == "eager")
        err = "—" if math.isnan(r["error"]) else f"{r['error']:.1e}"
        lines.append(f"| {r['model']} | {r['geometry']} | {r['variant']} | {r['ms']:.1f} | "
                     f"{eager['ms'] / r['ms']:.2f} | {r['first_s']:.1f} | {r['graphs']} | "
                     f"{r['breaks']} | {'—' if r['ops'] is None else r['ops']} | "
                     f"{r['dloss']:.1e} | {err} |")
    return "\n".join(lines) + "\n"


def compile_main(args, device) -> int:
    rows = [r for m in args.models for r in compile_rows(m, args, device, args.backend)]
    header = (
        f"# Training step with torch.compile against eager ({', '.join(args.models)})\n\n"
        f"{datetime.datetime.now().isoformat(timespec='seconds')}; device {device} "
        f"({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads); "
        f"torch {torch.__version__}; backend {args.backend}. One process, the variants "
        f"alternated in blocks of {args.block} steps, {args.rounds} rounds after {args.warmup} "
        f"warm-up steps each (the compiled variants compile in the first: its seconds are "
        f"the first step's); step ms: median over the {args.block * args.rounds} timed steps "
        "(forward, backward, clip, optimizer step, zero_grad; batch 16). compiled model: "
        "torch.compile(model) (its forward and backward); + step: torch.compile(opt.step) with "
        "fixed_iterations: true (no data-dependent control flow: every retraction the fixed "
        "one). Graphs and graph breaks: torch._dynamo's counters over the variant's steps. "
        "Optimizer ops: ATen operations of one eager optimizer step. |Δ loss|: the largest "
        "over every step against the eager variant from the same seed and batches.\n\n")
    publish(header + compile_table(rows), args.out or COMPILE_RESULTS)
    return 0


# ------------------------------------------------------------------------------------
# --retraction: the constraint error the fixed (warm) retraction leaves over many steps,
# against the adaptive one, on the mini proxy's matrix shapes with Gaussian gradients.
# ------------------------------------------------------------------------------------
RETRACTION_SHAPES = [(64, 64)] * 16 + [(256, 64)] * 4 + [(64, 256)] * 4  # mini's 4 layers
RETRACTED = ("stiefel", "dgram", "oblique", "sphere", "spectral_ball")
RETRACTION_RESULTS = Path(__file__).parent / "results" / "retraction_drift.md"


def retraction_drift(geometry: str, retraction: str, steps: int, seed: int = 0) -> dict:
    """Project-solver steps of lr 0.02 with Gaussian gradients (Nesterov momentum 0.95) on
    :data:`RETRACTION_SHAPES`: the largest and final constraint error over the steps, and
    the median ms of an optimizer step."""
    gen = torch.Generator().manual_seed(seed)
    params = [torch.nn.Parameter(torch.randn(*s, generator=gen) / math.sqrt(s[1]))
              for s in RETRACTION_SHAPES]
    opt = ManifoldMuon([{"params": params, "geometry": geometry, "lr": LR,
                         "retraction": retraction}])
    M = get_manifold(geometry)
    worst, times, final = 0.0, [], 0.0
    for i in range(steps):
        for p in params:
            p.grad = torch.randn(p.shape, generator=gen)
        t0 = time.perf_counter()
        opt.step()
        times.append(time.perf_counter() - t0)
        if i % 10 == 9 or i == steps - 1:
            final = max(float(M.constraint_error(p.detach().double())) for p in params)
            worst = max(worst, final)
    return {"geometry": geometry, "retraction": retraction, "worst": worst, "final": final,
            "ms": 1e3 * statistics.median(times)}


def retraction_main(args) -> int:
    rows = []
    for geometry in [g for g in RETRACTED if g in args.geometries]:
        for retraction in ("adaptive", "fixed"):
            rows.append(retraction_drift(geometry, retraction, args.steps))
            r = rows[-1]
            print(f"  {geometry:14s} {retraction:9s} worst {r['worst']:.2e} final {r['final']:.2e} "
                  f"{r['ms']:.2f} ms", flush=True)
    lines = ["| geometry | retraction | largest error | final error | optimizer ms "
             "| fixed ≤ 1e-5 |",
             "|---" * 6 + "|"]
    for r in rows:
        ok = "—" if r["retraction"] == "adaptive" else ("yes" if r["worst"] <= 1e-5 else "no")
        lines.append(f"| {r['geometry']} | {r['retraction']} | {r['worst']:.1e} | "
                     f"{r['final']:.1e} | {r['ms']:.2f} | {ok} |")
    header = (
        f"# Constraint error of the retractions over {args.steps} steps\n\n"
        f"{datetime.datetime.now().isoformat(timespec='seconds')}; {torch.get_num_threads()} "
        "thread(s); "
        f"torch {torch.__version__}. ManifoldMuon, project solver, lr {LR}, Gaussian gradients, on "
        "the mini "
        f"proxy's 24 matrix shapes ({len(RETRACTION_SHAPES)} matrices, one group); error: the "
        "largest "
        "over the matrices, checked every 10 steps (largest over the run, and at the end); ms: "
        "median "
        "optimizer step. adaptive: the checked retraction (polar with per-matrix decisions and an "
        "SVD "
        "fallback); fixed: the geometry's fixed-iteration one (Stiefel: 2 cubic Newton–Schulz "
        "iterations from the stepped point; DGram: 8 Polar Express + 2 cubic; Oblique, Sphere: the "
        "same normalisation without the zero branch; spectral ball: the msign cap).\n\n")
    publish(header + "\n".join(lines) + "\n", args.out or RETRACTION_RESULTS)
    return 0


# ------------------------------------------------------------------------------------
# --order: how far the weights move when only the float summation order changes (the
# grouped step against the ungrouped one: batched against single products), per solver.
# ------------------------------------------------------------------------------------
def order_rows(model_name: str, steps: int) -> list[dict]:
    """Per assignment and solver: the largest |ΔW| between the grouped and the ungrouped
    step after each of ``steps`` training steps from the same weights and batches."""
    from geosearch.proxy.data import load_corpus

    corpus, rows = load_corpus(None), []
    for name, assignment in TRAIN_ASSIGNMENTS.items():
        if name == MUON_FP32:
            continue
        for solver in ("project", "dual"):
            settings = {"solver": solver, "retraction": "adaptive"}
            a = TrainCase(model_name, "grouped", assignment, corpus, torch.device("cpu"),
                          optimizer_kwargs=({}, settings))
            b = TrainCase(model_name, "ungrouped", assignment, corpus, torch.device("cpu"),
                          optimizer_kwargs=({"grouped": False}, settings))
            diffs = []
            for _ in range(steps):
                a.step()
                b.step()
                diffs.append(max(float((p - q).abs().max()) for p, q in
                                 zip(a.model.parameters(), b.model.parameters())))
            rows.append({"assignment": name, "solver": solver, "diffs": diffs})
            print(f"  {name:26s} {solver:8s} " + " ".join(f"{d:.1e}" for d in diffs), flush=True)
    return rows


def order_main(args) -> int:
    rows = order_rows(args.models[0], args.steps)
    steps = " | ".join(f"step {i + 1}" for i in range(args.steps))
    lines = [f"| assignment | solver | {steps} |", "|---" * (2 + args.steps) + "|"]
    lines += [f"| {r['assignment']} | {r['solver']} | "
              + " | ".join(f"{d:.1e}" for d in r["diffs"]) + " |" for r in rows]
    header = (
        f"# Summation order: grouped against ungrouped step ({args.models[0]})\n\n"
        f"{datetime.datetime.now().isoformat(timespec='seconds')}; {torch.get_num_threads()} "
        "thread(s); "
        f"torch {torch.__version__}. Two copies of the model from the same seed and batches, one "
        "stepped "
        "grouped (batched products), one ungrouped (each matrix alone), retraction 'adaptive' in "
        "both; "
        "the largest |ΔW| over all weights after each training step (dual: K 20, tol 1e-3).\n\n")
    out = args.out or Path(__file__).parent / "results" / "order.md"
    publish(header + "\n".join(lines) + "\n", out)
    return 0


# ------------------------------------------------------------------------------------
# --ranks: the optimizer's time per rank under DDP, one rank against two (gloo, CPU), where
# the ranks divide the matrices' steps (geosearch.optim.sharded.owners) and broadcast them.
# ------------------------------------------------------------------------------------
RANKS_ASSIGNMENT = "attn=stiefel,mlp=dgram"


def ranks_worker(args) -> int:
    """One rank (under torchrun): train ``args.models[0]`` for ``args.steps`` steps (DDP when
    there are two ranks or more) and print the median ``opt.step()`` ms of each rank."""
    import json
    import os

    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from geosearch.assignment import Assignment
    from geosearch.build import build_optimizer
    from geosearch.models.lm import lm_loss
    from geosearch.models.model import GPT, make_config

    world = int(os.environ.get("WORLD_SIZE", "1"))
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    config = make_config(args.models[0])
    model = GPT(config)
    if world > 1:
        model = DistributedDataParallel(model)
    opt = build_optimizer(model, Assignment.parse(RANKS_ASSIGNMENT), verbose=False,
                          ddp_owner_steps=not args.every_rank)
    import geosearch.optim.grouped as grouped

    computing, step_batch = [0.0], grouped.step_batch

    def timed(*a):  # the time this rank spends computing its batches' steps
        start = time.perf_counter()
        step_batch(*a)
        computing[0] += time.perf_counter() - start

    grouped.step_batch = timed
    g = torch.Generator().manual_seed(1)
    times, computed = [], []
    for _ in range(args.steps):
        x = torch.randint(config.vocab_size, (8, config.block_size + 1), generator=g)
        opt.zero_grad()
        lm_loss(model, x[:, :-1], x[:, 1:]).backward()
        computing[0] = 0.0
        start = time.perf_counter()
        opt.step()
        times.append((time.perf_counter() - start) * 1e3)
        computed.append(computing[0] * 1e3)
    ms = [None] * world
    dist.all_gather_object(ms, (statistics.median(times[args.warmup:]),
                                statistics.median(computed[args.warmup:])))
    if dist.get_rank() == 0:
        print("RANKS " + json.dumps(ms), flush=True)
    dist.barrier()
    dist.destroy_process_group()
    return 0


def ranks_main(args) -> int:
    import json
    import os
    import subprocess
    import sys

    rows = {}
    runs = {"1": (1, []), "2, owner steps": (2, []), "2, every rank all": (2, ["--every-rank"])}
    for label, (n, extra) in runs.items():
        env = {**os.environ, "OMP_NUM_THREADS": str(args.threads or 1)}
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
               str(n), __file__, "--ranks-worker", "--models", args.models[0], "--steps",
               str(args.steps), "--warmup", str(args.warmup), *extra]
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
        line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RANKS ")), None)
        if proc.returncode != 0 or line is None:
            print(proc.stderr[-2000:])
            return 1
        rows[label] = json.loads(line.removeprefix("RANKS "))
        print(f"  {label} rank(s): " + ", ".join(f"{ms:.1f} ({c:.1f})" for ms, c in rows[label])
              + " ms", flush=True)
    one, c_one = rows["1"][0]
    header = (
        f"# Optimizer time per rank under DDP ({args.models[0]}, {RANKS_ASSIGNMENT})\n\n"
        f"{datetime.datetime.now().isoformat(timespec='seconds')}; gloo on CPU, "
        f"{args.threads or 1} thread(s) per rank; torch {torch.__version__}; median `opt.step()` "
        f"over {args.steps - args.warmup} steps after {args.warmup}; with two ranks each steps "
        "its share of the matrices (`ddp_owner_steps=True`: project-solver batches cut into one "
        "run of about equal arithmetic per rank) and receives the rest (one broadcast per owner), or (every rank all) "
        "steps every matrix itself, build_optimizer's default; its own steps: the time in "
        "the grouped step's batches it computes (the rest: momentum, AdamW, broadcasts, waits)."
        "\n\n")
    lines = ["| ranks | optimizer ms per rank | slowest / one rank | of which its own steps, ms "
             "| slowest / one rank |", "|---|---|---|---|---|"]
    for label, row in rows.items():
        two, c_two = max(ms for ms, _ in row), max(c for _, c in row)
        lines.append(f"| {label} | {', '.join(f'{ms:.1f}' for ms, _ in row)} | {two / one:.2f} | "
                     f"{', '.join(f'{c:.1f}' for _, c in row)} | {c_two / c_one:.2f} |")
    out = args.out or Path(__file__).parent / "results" / "optimizer_ranks.md"
    publish(header + "\n".join(lines) + "\n", out)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", choices=sorted(SHAPES), default="gpt2",
                        help="weight shapes (default gpt2)")
    parser.add_argument("--repeats", type=int, default=3, help="timed steps per case (median reported)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed steps first")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--geometries", nargs="+", default=manifold_names(), choices=manifold_names())
    parser.add_argument("--dual-steps", type=int, default=20, help="K of our dual solver")
    parser.add_argument("--dual-tol", type=float, default=1e-3, help="tolerance of our dual solver")
    parser.add_argument("--no-reference", action="store_true", help="skip the published reference")
    parser.add_argument("--threads", type=int, default=None,
                        help="CPU threads for torch (default: torch's choice; 1 gives stable numbers on a "
                             "machine other jobs share)")
    parser.add_argument("--accuracy", action="store_true",
                        help="measure msign per coefficient set and iteration count instead (accuracy "
                             "against the exact polar factor, and time per call)")
    parser.add_argument("--train", action="store_true",
                        help="time the whole training step of --models per geometry against "
                             "torch.optim.Muon and the ungrouped step instead")
    parser.add_argument("--compile", action="store_true",
                        help="with --train: the training step with torch.compile (the model; the "
                             "optimizer step in the fixed-iteration mode) against eager")
    parser.add_argument("--backend", default="inductor",
                        help="--compile: torch.compile's backend (default inductor)")
    parser.add_argument("--retraction", action="store_true",
                        help="the constraint error of the fixed and adaptive retractions over "
                             "--steps steps")
    parser.add_argument("--order", action="store_true",
                        help="how far the weights of the first of --models move, grouped against "
                             "ungrouped, over --steps training steps (the summation order alone)")
    parser.add_argument("--ranks", action="store_true",
                        help="the optimizer's ms per rank under DDP, 1 against 2 gloo ranks (--models, "
                             "--steps, --warmup, --threads per rank)")
    parser.add_argument("--ranks-worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--every-rank", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--steps", type=int, default=2000,
                        help="--retraction, --order, --ranks: steps")
    parser.add_argument("--models", nargs="+", default=["mini", "small"],
                        help="proxies for --train")
    parser.add_argument("--rounds", type=int, default=6,
                        help="--train: rounds of alternated blocks")
    parser.add_argument("--block", type=int, default=5, help="--train: steps per variant and round")
    parser.add_argument("--out", type=Path, default=None,
                        help=f"where to write (default {RESULTS.name}, or {ACCURACY_RESULTS.name} with --accuracy, "
                             "in benchmarks/results/)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    if args.accuracy:
        return accuracy_main(args, device)
    if args.train and args.compile:
        return compile_main(args, device)
    if args.train:
        return train_main(args, device)
    if args.retraction:
        return retraction_main(args)
    if args.order:
        return order_main(args)
    if args.ranks:
        return ranks_main(args)
    if args.ranks_worker:
        return ranks_worker(args)
    shapes = SHAPES[args.shapes]

    rows = []
    for geometry, label, make in _cases(args):
        per_shape = [run_case(make, geometry, shape, args, device) for shape in shapes]
        row = {
            "geometry": geometry, "solver": label,
            "ms": [r["seconds"] * 1e3 for r in per_shape],
            "error": max(r["error"] for r in per_shape),
            "residual": max((r["residual"] for r in per_shape), default=math.nan),
        }
        row["total"] = sum(row["ms"])
        rows.append(row)
        print(f"  {geometry:14s} {label:32s} {row['total']:10.1f} ms", flush=True)

    adamw = next(r["total"] for r in rows if r["geometry"] == "adamw")
    reference = {r["geometry"]: r for r in rows if r["solver"].startswith("reference")}
    table = _table(rows, shapes, adamw, reference)
    header = (
        f"# Optimizer step time ({args.shapes} shapes)\n\n"
        f"{datetime.datetime.now().isoformat(timespec='seconds')}; device {device} "
        f"({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads); "
        f"torch {torch.__version__}; "
        f"median of {args.repeats} steps after {args.warmup} warm-up; spectral lr {LR}; Gaussian gradients "
        f"with ‖G‖_F = 1. Times in ms per step of one weight; ratios of the total over the four shapes, "
        f"measured in this run. Error: the geometry's constraint error after the steps "
        f"(max over shapes); residual: the dual solver's last tangent residual ‖H‖_F/√numel.\n"
        f"Reference = published manifold Muon: K={REF_STEPS} dual ascent, fixed α={REF_ALPHA} on the "
        f"unscaled G, "
        f"msign with {REF_NS} Polar Express steps; DGram retraction U Vᵀ·diag(σ) from an SVD.\n\n"
    )
    verdicts = _verdicts(rows, reference)
    publish(header + table + "\n" + verdicts, args.out or RESULTS)
    return 0


def _table(rows, shapes, adamw: float, reference: dict) -> str:
    cols = [f"{m}×{n} ms" for m, n in shapes]
    head = " | total ms | × AdamW | reference ÷ this | error | residual |"
    lines = ["| geometry | solver | " + " | ".join(cols) + head,
             "|---" * (len(cols) + 7) + "|"]
    for r in rows:
        ref = reference.get(r["geometry"])
        speedup = f"{ref['total'] / r['total']:.1f}×" if ref is not None and ref is not r else "—"
        lines.append(
            f"| {r['geometry']} | {r['solver']} | " + " | ".join(f"{x:.1f}" for x in r["ms"])
            + f" | {r['total']:.1f} | {r['total'] / adamw:.1f} | {speedup} | {r['error']:.1e} | "
            + ("—" if math.isnan(r["residual"]) else f"{r['residual']:.1e}") + " |")
    return "\n".join(lines) + "\n"


def _verdicts(rows, reference: dict) -> str:
    """Target: the default solver ≥ 5× faster than the reference at equal or better error
    (errors below 1e-6, float32 rounding, count as equal)."""
    out = []
    for geometry, ref in reference.items():
        default = next(r for r in rows if r["geometry"] == geometry and r["solver"].startswith("project"))
        speedup = ref["total"] / default["total"]
        ok = speedup >= 5 and default["error"] <= max(ref["error"], 1e-6)
        out.append(f"- {geometry}: default solver {speedup:.1f}× faster than the reference; constraint "
                   f"error {default['error']:.1e} vs {ref['error']:.1e}; target (≥ 5× at equal or better "
                   f"error, below 1e-6 counting as equal) {'met' if ok else 'NOT met'}")
    return "\n".join(out) + ("\n" if out else "")


if __name__ == "__main__":
    raise SystemExit(main())
