"""How close does each manifold-Muon direction come to the exact optimum, on real momenta?

Weights ``W`` and Nesterov momenta ``G`` come from the ``small`` proxy (4 layers, width
128) trained a few steps with manifold Muon (all-Stiefel, then all-DGram; solver
``project``, spectral step 0.02, global gradient clip 1.0): the momentum is the one the
next step would use. For each hidden weight of the first and last layer (``attn.c_attn``,
``attn.c_proj``, ``mlp.c_fc``, ``mlp.c_proj``) the direction problem::

    max ⟨G, A⟩  subject to  ‖A‖_2 ≤ 1  and  A tangent at W

is solved in float64 by ADMM on its dual ``min_Λ ‖G + 2WΛ‖_*`` (every iterate's
multiplier is exactly tangent and the nuclear norm bounds the optimum from above, so the
relative duality gap certifies the optimum ``A*``). Each solver's direction ``A`` is then
scored against it: the objective kept, ``⟨G, Â⟩ / ⟨G, A*⟩`` with ``Â`` the tangent part
``T`` of ``A`` (what a step keeps: the retraction removes the rest, to first order) scaled
into the unit ball when ``‖T‖_2 > 1``, so all are compared at the same spectral step size;
the cosine of ``A`` to ``A*``; the tangent residual ``‖P(WᵀA + AᵀW)‖_F/n`` (the dual
solver's stopping measure); ``‖T‖_2``, how far past η a step goes along the manifold; and
the time per call.

Then the DGram retraction: how far one step of spectral size η moves ``W``,
``‖R(W − ηA) − W‖_2 / η``, for the library's ``Q = polar(W)`` and for the previous
retraction (the polar factor of ``W`` with its columns normalised, kept here under its own
name for this comparison only), at the proxy's weights and at the same weights with their
column norms spread over 0.02–1.1 (DGram attention's ``c_proj`` after 2,000 steps).

Not a test: it prints its tables and writes them to ``benchmarks/results/direction_quality.md``.

Usage::

    python benchmarks/direction_quality.py             # ~2-3 min on one thread
    python benchmarks/direction_quality.py --quick     # 10 training steps, first layer only
"""

from __future__ import annotations

import argparse
import functools
import datetime
import math
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch import Tensor

from _common import machine, publish  # benchmarks/ is on sys.path when a script runs
from optimizer_step import REF_ALPHA, REF_NS, REF_STEPS, reference_direction
from geosearch.assignment import Assignment
from geosearch.manifolds import Manifold, get_manifold, polar
from geosearch.build import build_optimizer
from geosearch.optim.solvers import dual_ascent_direction, project_direction
from geosearch.proxy.data import get_batch, load_corpus
from geosearch.models.lm import lm_loss
from geosearch.models.zoo import build_model

RESULTS = Path(__file__).parent / "results" / "direction_quality.md"
ETA = 0.02  # the study's spectral step size
MODULES = ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj")
SPREAD = (0.02, 1.1)  # column norms of DGram attention's c_proj after 2,000 steps
# the published solver at the momentum's own scale, and at the step benchmark's ‖G‖_F = 1
PUBLISHED = (f"published α={REF_ALPHA:g}, K={REF_STEPS}",
             f"published α={REF_ALPHA:g}, K={REF_STEPS}, G scaled to ‖G‖_F = 1")


def _tall(X: Tensor) -> Tensor:
    return X.mT if X.shape[-2] < X.shape[-1] else X


# --------------------------------------------------------------------- the exact optimum
def exact_direction(manifold: Manifold, W: Tensor, G: Tensor, tol: float = 1e-6,
                    max_iter: int = 5000) -> tuple[Tensor, float, int]:
    """The optimal direction ``A*`` in float64, its relative duality gap and ADMM iterations.

    ADMM on ``min ‖Y‖_* s.t. Y − 2WΛ = G`` (``Λ = P(Λ)`` symmetric): the ``Y`` step
    thresholds singular values, the ``Λ`` step is the least-squares solve
    ``Λ = ½·L⁻¹(P(WᵀR + RᵀW))`` (``manifold.solve_normal``), which leaves the multiplier
    ``Z`` exactly tangent; ``−Z`` scaled into the unit ball is a feasible direction, whose
    objective bounds the optimum from below, and ``‖G + 2WΛ‖_*`` bounds it from above.
    """
    wide = W.shape[-2] < W.shape[-1]
    W, G = _tall(W).double(), _tall(G).double()
    n = W.shape[-1]
    G = G / (G.norm() / math.sqrt(n))  # unit RMS singular value; A* does not depend on it
    lam = -0.5 * manifold.normal_coefficients(W, G)
    Z, rho = torch.zeros_like(G), 1.0
    best_A, lower, upper, k = torch.zeros_like(G), -math.inf, math.inf, 0
    for k in range(1, max_iter + 1):
        WL = 2 * W @ lam
        X = WL + G - Z / rho  # Y = X with its singular values shrunk by 1/ρ
        ev, V = torch.linalg.eigh(X.mT @ X)
        s = ev.clamp_min(0).sqrt()
        Y = X @ (V * ((s - 1 / rho).clamp_min(0) / s.clamp_min(1e-300))) @ V.mT
        R = Y - G + Z / rho
        lam = 0.5 * manifold.solve_normal(W, manifold.gram_projector(W.mT @ R + R.mT @ W))
        WL_new = 2 * W @ lam
        primal = Y - WL_new - G
        Z = Z + rho * primal
        if k % 10:
            continue
        A = -Z / max(1.0, float(torch.linalg.matrix_norm(Z, 2)))
        if float((G * A).sum()) > lower:
            best_A, lower = A, float((G * A).sum())
        upper = min(upper, float(torch.linalg.svdvals(G + WL_new).sum()))
        if (upper - lower) / upper < tol:
            break
        r, d = float(primal.norm()), float(rho * (WL_new - WL).norm())
        if r > 10 * d:  # residual balancing (Boyd et al. 2011, §3.4.1)
            rho = min(2 * rho, 1e6)
        elif d > 10 * r:
            rho = max(rho / 2, 1e-6)
    return (best_A.mT if wide else best_A), (upper - lower) / upper, k


# --------------------------------------------------------------------- the solvers
def column_normalised_retract(W: Tensor) -> Tensor:
    """PREVIOUS DGRAM RETRACTION, kept only for this comparison: ``Q·diag(colsum(Q∘W))``
    with ``Q`` the polar factor of ``W`` with its columns normalised (tall ``W``)."""
    Q = polar(W / torch.linalg.vector_norm(W, dim=-2, keepdim=True))
    return Q * (Q * W).sum(dim=-2, keepdim=True)


def _published(geometry: str, scale_to_unit: bool) -> Callable[[Manifold, Tensor, Tensor], Tensor]:
    def solve(manifold: Manifold, W: Tensor, G: Tensor) -> Tensor:
        if scale_to_unit:
            G = G / G.norm()
        A, _ = reference_direction(geometry, _tall(W), _tall(G))
        return A.mT if W.shape[-2] < W.shape[-1] else A
    return solve


def solvers(geometry: str) -> dict[str, Callable[[Manifold, Tensor, Tensor], Tensor]]:
    """Label -> direction of the float32 ``(W, G)``, as the optimizer computes it."""
    return {
        "project": lambda M, W, G: project_direction(M, W, G),
        "project, SVD msign": lambda M, W, G: project_direction(M, W, G, exact=True),
        "dual K=5": lambda M, W, G: dual_ascent_direction(M, W, G, steps=5)[0],
        "dual K=20": lambda M, W, G: dual_ascent_direction(M, W, G, steps=20)[0],
        PUBLISHED[0]: _published(geometry, False),
        PUBLISHED[1]: _published(geometry, True),
    }


def score(M: Manifold, W: Tensor, G: Tensor, A: Tensor, A_star: Tensor) -> dict[str, float]:
    """Objective kept, cosine to A*, tangent residual and ‖T‖_2 of one direction."""
    W, G, A = W.double(), G.double(), A.double()
    T = M.to_tangent(W, A)
    t2 = float(torch.linalg.matrix_norm(T, 2))
    H = M.tangent_residual(_tall(W), _tall(A))
    return {
        "kept": float((G * T).sum()) / max(1.0, t2) / float((G * A_star).sum()),
        "cos": float((A * A_star).sum() / (A.norm() * A_star.norm())),
        "res": float(H.norm() / H.shape[-1]),
        "t2": t2,
    }


# --------------------------------------------------------------------- real momenta
def momenta(geometry: str, steps: int, layers: list[int], seed: int = 0) -> list[tuple[str, Tensor, Tensor]]:
    """``(name, W, G)`` after ``steps`` manifold-Muon steps of the small proxy."""
    torch.manual_seed(seed)
    corpus = load_corpus()
    built = build_model("small", vocab_size=corpus.vocab_size)
    model = built.model
    opt = build_optimizer(model, Assignment.parse(f"attn={geometry},mlp={geometry}"), verbose=False,
                          spectral_lr=ETA, solver="project")
    gen = torch.Generator().manual_seed(seed)

    def backward() -> None:
        x, y = get_batch(corpus.train, 16, built.block_size, gen)
        lm_loss(model, x, y).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)  # as the trainer does

    for _ in range(steps):
        backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    backward()
    n_layer = sum(1 for name, _ in model.named_parameters() if name.endswith("attn.c_attn.weight"))
    wanted = {f"transformer.h.{i % n_layer}.{m}.weight": f"h{i % n_layer}.{m}" for i in layers for m in MODULES}
    out = []
    for group in opt.param_groups:
        for p in group["params"]:
            name = next(n for n, q in model.named_parameters() if q is p)
            if name not in wanted:
                continue
            buf = opt.state[p]["momentum_buffer"].lerp(p.grad, 1 - group["momentum"])
            G = p.grad.lerp(buf, group["momentum"]) if group["nesterov"] else buf  # as ManifoldMuon
            # one geometry for q, k and v: c_attn is one (3C, C) matrix on the manifold
            out.append((wanted[name], p.detach().clone(), G))
    return out


def _time_ms(fn: Callable[[], object], repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def spread_norms(W: Tensor, seed: int) -> Tensor:
    """The DGram point ``W`` with its (tall) column norms replaced by ``SPREAD``, log-spaced, shuffled."""
    X = _tall(W)
    n = X.shape[-1]
    d = torch.logspace(math.log10(SPREAD[0]), math.log10(SPREAD[1]), n, dtype=X.dtype)
    d = d[torch.randperm(n, generator=torch.Generator().manual_seed(seed))]
    X = X / torch.linalg.vector_norm(X, dim=-2, keepdim=True) * d
    return X.mT if W.shape[-2] < W.shape[-1] else X


def retraction_moves(M: Manifold, W: Tensor, G: Tensor) -> dict[str, float]:
    """‖R(W − ηA) − W‖_2/η with A from ``project``, for both retractions, and ‖A‖_2."""
    A = project_direction(M, W, G)
    X, S = _tall(W), _tall(W - ETA * A)
    moved = {"polar(W)": M.retract(S), "column-normalised": column_normalised_retract(S)}
    out = {label: float(torch.linalg.matrix_norm((R - X).double(), 2)) / ETA for label, R in moved.items()}
    norms = torch.linalg.vector_norm(X, dim=-2)
    return out | {"A2": float(torch.linalg.matrix_norm(A.double(), 2)), "dmin": float(norms.min()),
                  "dmax": float(norms.max())}


# --------------------------------------------------------------------- report
def _fmt_range(xs: list[float], fmt: str = ".3f") -> str:
    return f"{statistics.fmean(xs):{fmt}} ({min(xs):{fmt}}–{max(xs):{fmt}})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40, help="proxy training steps before the momenta")
    parser.add_argument("--layers", type=int, nargs="+", default=[0, -1], help="layers to take (default 0 -1)")
    parser.add_argument("--repeats", type=int, default=3, help="timed calls per solver and matrix (median)")
    parser.add_argument("--quick", action="store_true", help="smoke run: 10 steps, first layer only")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    if args.quick:
        args.steps, args.layers, args.repeats = 10, [0], 1
    torch.set_num_threads(args.threads)
    started, header_machine = time.perf_counter(), machine()

    rows, exact_info, moves = [], [], []
    for geometry in ("stiefel", "dgram"):
        M = get_manifold(geometry)
        problems = momenta(geometry, args.steps, args.layers)
        per_solver: dict[str, list[dict]] = {}
        for label, W, G in problems:
            t0 = time.perf_counter()
            A_star, gap, iters = exact_direction(M, W, G)
            exact_info.append((geometry, label, tuple(W.shape), float(G.norm()), gap, iters,
                               time.perf_counter() - t0))
            for name, solve in solvers(geometry).items():
                rec = score(M, W, G, solve(M, W, G), A_star)
                rec["ms"] = _time_ms(functools.partial(solve, M, W, G), args.repeats)
                per_solver.setdefault(name, []).append(rec)
            if geometry == "dgram":
                moves.append(("proxy weights", label, retraction_moves(M, W, G)))
                moves.append((f"norms spread {SPREAD[0]:g}–{SPREAD[1]:g}", label,
                              retraction_moves(M, spread_norms(W, len(moves)), G)))
            print(f"  {geometry:8s} {label:18s} gap {gap:.1e} after {iters} ADMM iterations; "
                  + "; ".join(f"{k}: {v[-1]['kept']:.3f}" for k, v in per_solver.items()),
                  flush=True)
        for name, recs in per_solver.items():
            rows.append((geometry, name, recs))

    text = _report(rows, exact_info, moves, args, header_machine, time.perf_counter() - started)
    publish(text, args.out)
    return 0


def _report(rows, exact_info, moves, args, header_machine: str, seconds: float) -> str:
    lines = [
        "# Direction quality: each solver against the exact optimum (small proxy momenta)\n",
        f"{datetime.datetime.now().isoformat(timespec='seconds')}; {header_machine}; {seconds:.0f} s in all.\n",
        f"Weights and Nesterov momenta of the `small` proxy after {args.steps} manifold-Muon steps (solver "
        f"`project`, spectral step {ETA}, gradient clip 1.0, seed 0), layers {args.layers}: "
        f"{len(exact_info) // 2} matrices per geometry. Objective kept: ⟨G, Â⟩/⟨G, A*⟩ with Â the "
        "tangent part of the direction, scaled into the unit ball; ‖T‖₂: the spectral norm of that "
        "tangent part before scaling (a step moves ‖T‖₂·η along the manifold). Mean (min–max) over "
        "the matrices; residual: the largest; ms: mean time per call (median of "
        f"{args.repeats} calls each). Published: fixed α={REF_ALPHA:g} on the unscaled G, K={REF_STEPS}, "
        f"{REF_NS} Polar Express steps.\n",
        "| geometry | solver | objective kept | cosine to A* | tangent residual | ‖T‖₂ | ms/call | "
        "published ÷ this: momentum scale | ‖G‖_F = 1 |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    mean = {(g, n): {k: statistics.fmean(r[k] for r in recs) for k in ("kept", "cos", "ms")}
            for g, n, recs in rows}
    for geometry, name, recs in rows:
        speed = []
        for ref_name in PUBLISHED:  # a speed ratio only at equal or better direction quality
            ref, this = mean[(geometry, ref_name)], mean[(geometry, name)]
            if name in PUBLISHED:
                speed.append("—")
            elif this["kept"] >= ref["kept"] and this["cos"] >= ref["cos"]:
                speed.append(f"{ref['ms'] / this['ms']:.1f}×")
            else:
                speed.append("not at equal quality")
        lines.append(
            f"| {geometry} | {name} | {_fmt_range([r['kept'] for r in recs])} | "
            f"{_fmt_range([r['cos'] for r in recs])} | {max(r['res'] for r in recs):.1e} | "
            f"{_fmt_range([r['t2'] for r in recs], '.2f')} | {mean[(geometry, name)]['ms']:.1f} | "
            + " | ".join(speed) + " |")
    gaps = [e[4] for e in exact_info]
    lines += [
        "",
        f"Exact optimum: ADMM in float64; relative duality gap at most **{max(gaps):.1e}** over the "
        f"{len(gaps)} matrices ({min(e[5] for e in exact_info)}–{max(e[5] for e in exact_info)} iterations, "
        f"{sum(e[6] for e in exact_info):.0f} s in all). Momentum norms ‖G‖_F "
        f"{min(e[3] for e in exact_info):.2g}–{max(e[3] for e in exact_info):.2g}.\n",
        f"DGram retraction: ‖R(W − ηA) − W‖₂/η for one step of the `project` direction, η = {ETA} "
        "(‖A‖₂ is the direction's own spectral norm: Newton–Schulz leaves it a little above 1).\n",
        "| weights | column norms | ‖A‖₂ | polar(W) (library): max | median | "
        "column-normalised (previous): max | median |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for case in dict.fromkeys(c for c, _, _ in moves):
        recs = [m for c, _, m in moves if c == case]
        pol, col = [r["polar(W)"] for r in recs], [r["column-normalised"] for r in recs]
        lines.append(f"| {case} | {min(r['dmin'] for r in recs):.2g}–{max(r['dmax'] for r in recs):.2g} | "
                     f"{max(r['A2'] for r in recs):.2f} | {max(pol):.2f} | "
                     f"{statistics.median(pol):.2f} | {max(col):.2f} | {statistics.median(col):.2f} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
