"""Does splitting attention by role (QK apart from VO), or per head, beat the published answer?

The eight role points (``attn_qk``, ``attn_vo`` and ``mlp`` each Stiefel or DGram; Q, K and V
are blocks of ``c_attn`` each on its own manifold, rule set ``nanogpt_split``) and one
per-head point (QK Stiefel per head, VO and MLP DGram) trained for the full target length
with fidelity.py's ground-truth settings (:func:`fidelity.truth_config`: 2,000 steps, 16
fixed validation batches), 2 seeds each, one JSON per run in ``benchmarks/data/roles/``
(resumable: run it in pieces). They are compared with fidelity.py's stored long runs of the
reference study's four assignments (stacked attention) at the same settings.

Usage::

    python benchmarks/roles.py --train --model tiny --eta 0.05 --seeds 0 1      # ~10 min
    python benchmarks/roles.py --train --model mini --eta 0.02 --seeds 0 1 --limit 4   # a piece
    python benchmarks/roles.py --show --model tiny --eta 0.05                  # the table so far
    geosearch search --model tiny --space roles --set proxy.spectral_lr=0.05 --study roles-tiny-0.05
    python benchmarks/fidelity.py --compare runs/roles-tiny-0.05 --model tiny --eta 0.05  # on the 8

Prediction, written before any of these runs (2026-12-03; a 20-step smoke search of the
``roles`` space on ``mini`` had been run, whose ranking is not evidence at 2,000 steps):

1. The max logit follows the QK geometry: at ``tiny`` 0.05, where stacked DGram attention
   reached 114-119, every QK-DGram point peaks above the threshold 80 (10 × 32/√16) and every
   QK-Stiefel point below 20, whatever VO and the MLP take.
2. ``tiny`` 0.05: the best role point is QK-Stiefel, VO-DGram, MLP-DGram; against the best
   paper assignment (Stiefel-attn + DGram-MLP, 2.1957) its gap is within ±0.03, so splitting
   by role does not beat the published answer beyond seed noise.
3. ``mini`` 0.02 (DGram attention not harmed; all-DGram best, 1.5517): the best role point
   has VO-DGram and MLP-DGram; the VO main effect is larger than the QK one.
4. Per head: QK-Stiefel per head is within ±0.02 of whole-matrix QK-Stiefel (same VO and
   MLP) in loss and within ×2 in peak max logit, at both settings.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from _common import machine, publish  # benchmarks/ is on sys.path when a script runs
from fidelity import (
    PAPER,
    Points,
    _commit,
    family_of,
    group_key,
    load_truth,
    run_key,
    truth_config,
    truth_scores,
)
from geosearch.assignment import Assignment
from geosearch.rules.roles import ROLES
from geosearch.proxy.train import train
from geosearch.search.stats.ranking import rank_scores
from geosearch.search.stats.blocked import blocked_fit
from geosearch.search.stats.scores import Point, Score

DATA = Path(__file__).parent / "data" / "roles"
GEOS = ("stiefel", "dgram")
ROLE_POINTS = [f"attn_qk={qk},attn_vo={vo},mlp={mlp}" for qk in GEOS for vo in GEOS for mlp in GEOS]
PER_HEAD = "attn_qk=stiefel,attn_qk.per_head=true,attn_vo=dgram,mlp=dgram"
WHOLE = "attn_qk=stiefel,attn_vo=dgram,mlp=dgram"
"""The per-head point and its whole-matrix twin."""
POINTS = [*ROLE_POINTS, PER_HEAD]
_NAMES = {"stiefel": "Stiefel", "dgram": "DGram"}
LABELS = {a: ", ".join(f"{k.removeprefix('attn_').upper()} {_NAMES[g]}"
                       for k, g in (kv.split("=") for kv in a.split(","))) for a in ROLE_POINTS}
"""A role point's label: ``"QK Stiefel, VO DGram, MLP DGram"``."""


def role_key(resolved: dict[str, str]) -> str:
    """``attn_qk=G,attn_vo=G,mlp=G`` of a resolved assignment (type -> geometry): Q and K in
    ``attn_qk``, V and the output in ``attn_vo``, the rest in its family."""
    role = {t: r for r, types in ROLES.items() for t in types}
    return group_key(resolved, ("attn_qk", "attn_vo", "mlp"), lambda t: role.get(t) or family_of(t))


def role_truth(model: str, steps: int, eta: float,
               model_args: dict | None = None) -> dict[str, list[dict]]:
    """The eight role points' stored long runs (none but at 2,000 steps, the model's sizes)."""
    runs = load(model, eta) if steps == 2000 and not model_args else {}
    return {a: runs.get(a, []) for a in ROLE_POINTS}


SCORED = Points(LABELS, role_key, role_truth)
"""What ``fidelity.py --compare`` scores a study of the ``roles`` space on."""


def run_all(model: str, eta: float, seeds: list[int], limit: int | None) -> None:
    """Train the missing runs (at most ``limit`` of them: a piece) and store each."""
    DATA.mkdir(parents=True, exist_ok=True)
    print(machine())
    done = 0
    for seed in seeds:
        for assign in POINTS:
            config = truth_config(model, 2000, eta, seed)
            path = DATA / f"{run_key(config, assign)}.json"
            if path.exists():
                continue
            if limit is not None and done >= limit:
                return
            t0 = time.perf_counter()
            result = train(config, Assignment.parse(assign), progress=False)
            probes = [{"step": m["step"], "max_logit": m.get("max_logit"),
                       "max_logit_per_head": m.get("max_logit_per_head")}
                      for m in result.history if m.get("max_logit") is not None]
            record = {"assign": assign, "config": config.to_dict(), "status": result.status,
                      "final_val_loss": result.final_val_loss, "mean_step_ms": result.mean_step_ms,
                      "wall_s": time.perf_counter() - t0, "probes": probes, "commit": _commit(),
                      "torch": torch.__version__}
            path.write_text(json.dumps(record), encoding="utf-8")
            done += 1
            print(f"done  {assign} seed {seed}: {result.status}, val {result.final_val_loss}, "
                  f"{record['wall_s']:.0f} s")


def load(model: str, eta: float) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {a: [] for a in POINTS}
    for path in sorted(DATA.glob("*.json")):
        rec = json.loads(path.read_text(encoding="utf-8"))
        c = rec["config"]
        if (c["model"], c["steps"], c["spectral_lr"]) == (model, 2000, eta)\
                and rec["assign"] in out:
            out[rec["assign"]].append(rec)
    return out


def _peak(recs: list[dict]) -> float:
    return max((p["max_logit"] for r in recs for p in r["probes"] if p["max_logit"] is not None),
               default=float("nan"))


def show(model: str, eta: float, out: Path | None) -> None:
    runs, paper = load(model, eta), load_truth(model, 2000, eta)
    scores = truth_scores(runs)
    paper_scores = truth_scores(paper)
    entries = [(i, a, s) for i, (a, s) in enumerate({**scores, **paper_scores}.items())]
    labels = {a: PAPER.get(a) or LABELS.get(a) or a for a in [*scores, *paper_scores]}
    lines = [f"{model}, spectral step {eta}, 2,000 steps: final val loss (mean over seeds), its "
             "seeds, the peak max logit over the run", "",
             "| assignment | val loss | seeds | peak max logit |", "|---|---:|---|---:|"]
    for _, a, s in sorted(entries, key=lambda e: e[2].mean):
        recs = runs.get(a) or paper.get(a, [])
        lines.append(f"| {labels[a]} | {s.mean:.4f} | {', '.join(f'{v:.4f}' for v in s.values)} | "
                     f"{_peak(recs):.1f} |")
    roles = [(i, a, s) for i, (a, s) in enumerate(scores.items()) if a in ROLE_POINTS]
    points = {i: Point(dict(kv.split("=") for kv in a.split(","))) for i, a, _ in roles}
    ranking = rank_scores(roles, points)
    lines += ["", f"The role points' ranking: {ranking.verdict}", "",
              "Main effects over the role points (95% intervals):", ""]
    lines += [f"- {e.text()}" for e in ranking.effects]
    fit = blocked_fit([*scores.values(), *paper_scores.values()])  # every run: the noise pooled

    def gap(a: Score, b: Score, what: str) -> str:
        c = fit.compare(b, a) if fit is not None else None
        if c is None:
            return f"{what}: not comparable (no shared seeds)"
        return (f"{what}: {c.diff:+.4f} ± {c.threshold:.4f} (95%, blocked fit of all "
                f"{fit.cells} runs, df {fit.df:g}): "
                f"{'beyond' if abs(c.diff) > c.threshold else 'within'} seed noise")

    if paper_scores and scores:
        best_paper = min(paper_scores, key=lambda a: paper_scores[a].mean)
        best_role = min((a for a in scores if a in ROLE_POINTS), key=lambda a: scores[a].mean)
        lines += ["", gap(scores[best_role], paper_scores[best_paper],
                          f"Best role point ({best_role}) minus the best paper assignment "
                          f"({PAPER[best_paper]})")]
    if PER_HEAD in scores and WHOLE in scores:
        peaks = f"; peak max logit {_peak(runs[PER_HEAD]):.1f} against {_peak(runs[WHOLE]):.1f}"
        lines += ["", gap(scores[PER_HEAD], scores[WHOLE],
                          "QK-Stiefel per head minus whole matrix (VO, MLP DGram)") + peaks]
    text = "\n".join(lines)
    if out is None:
        print(text)
    else:
        publish(text, out)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--train", action="store_true")
    p.add_argument("--show", action="store_true")
    p.add_argument("--model", default="tiny")
    p.add_argument("--eta", type=float, default=0.05)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    p.add_argument("--limit", type=int, default=None, help="train at most this many runs (a piece)")
    p.add_argument("--out", type=Path, default=None, help="also write the table here")
    args = p.parse_args()
    if args.train:
        run_all(args.model, args.eta, args.seeds, args.limit)
    if args.show or not args.train:
        show(args.model, args.eta, args.out)


if __name__ == "__main__":
    main()
