"""Does the search beat a rule that needs no run? The fidelity table, scored beside two rules.

Every setting of ``benchmarks/data/searches.json`` (the default search against the 2,000-step
runs, ``fidelity.py``) is scored three ways on the stored long runs: the search (its row),
the best rule that needs no run, and the better constant rule for the stability decisions.

- **The no-run rule** (:func:`no_run_order`), read off the settings measured first (before
  any of the held-out ones): at a spectral step ≤ 0.02, all-DGram > Stiefel-attn + DGram-MLP
  > DGram-attn + Stiefel-MLP > all-Stiefel; above it, Stiefel-attn + DGram-MLP >
  all-Stiefel with DGram attention unstable. Its stability decisions: DGram attention
  crosses the threshold iff η ≥ 0.05, Stiefel attention never. Between 0.02 and 0.05 the
  rule says "unstable" for the order and "stable" for the decisions: it is scored as it
  reads (the DGram-attention pair placed last, tied, as pruned).
- **The better constant rule**: the better of "every assignment above the threshold" and
  "every one below", over all the table's decisions at once (not per setting, not per
  attention geometry).
- **Chance under the right null** (:func:`chances`): the search ranks only the assignments
  it kept (``left`` in a row: 2 where DGram attention was pruned), so a random order among
  those is right 1 time in ``left`` and reaches ρ ≥ 0.8 (over all four, the pruned placed
  last, tied, against the long runs) as often as enumeration says; the tally's p-value is
  the Poisson-binomial tail over the settings' own chances (:func:`tail`).

Usage::

    python benchmarks/no_run_rules.py                       # the table and the tallies
    python benchmarks/no_run_rules.py --out benchmarks/results/no_run_rules.md

**New settings that discriminate** (:data:`NEW_SETTINGS`), chosen and this prediction written
(2026-12-03) before any of their runs, from the stored long runs' DGram-attention peak max
logits over the threshold (10 × d/√d_head), which grow about as η^2.8 (``tiny``: 0.11× at 0.02,
1.4× at 0.05) to η^3 (``small``: 0.11×, 1.7×). (A first version named ``mini`` 0.03 from the
width-64 ``small`` copy's logit, not ``mini``'s; corrected before any run: ``mini`` 0.02 peaks
at 0.13×, so 0.03 would land near 0.42×, outside 0.5–2×.)

1. ``mini`` 0.04 (off the grid 0.01–0.1): DGram attention's peak at the target about 0.9×
   its threshold 160 (0.13 × 2^2.8).
2. ``small`` 0.04 (off the grid): about 0.9× its threshold 226 (0.11 × 2³).
3. ``mini`` proxy, ``small`` target at 0.02 (``--target-model small``): a proxy narrower than
   the target model; the long runs are ``small`` 0.02's, stored.
4. ``tiny`` proxy, ``mini`` target at 0.02 (``--target-model mini``); long runs stored.

Prediction: (a) at 1 and 2 DGram attention's long runs peak within 0.5–2× of the threshold,
and at one of the two at least the long runs' best has DGram attention (below the
threshold it still helps the loss, as at 0.02), so the no-run rule (Stiefel-attn + DGram-MLP
first above 0.02) names the wrong best there; (b) the default search's stability decisions
at 1 and 2 match the long runs' except where a run peaks within ±25% of the threshold; (c)
at 3 and 4 the search names the long runs' best (all-DGram) but reaches Spearman ≥ 0.8 at
one of the two at most (``small``'s own 400-step order had 0.40); (d) the search beats the
no-run rule on winners over the four together, not on Spearman. Commands (each piece under
15 minutes on an idle 2-core machine but the ``small`` long runs, about 9 minutes each, one
assignment ``A`` a piece)::

    python benchmarks/fidelity.py --truth --model mini --eta 0.04 --steps 2000 --seeds 0 1
    python benchmarks/fidelity.py --truth --model small --eta 0.04 --steps 2000 --seeds 0 --only A
    geosearch search --model mini --set proxy.spectral_lr=0.04 --study fid-mini-0.04
    geosearch search --model mini --target-model small --study fid-mini-for-small
    geosearch search --model tiny --target-model mini --study fid-tiny-for-mini
    python benchmarks/fidelity.py --compare runs/fid-mini-0.04 --model mini --eta 0.04 --steps 2000

(``--compare`` of 3 and 4 reads the target model from the study's plan and scores against its
long runs: ``python benchmarks/fidelity.py --compare runs/fid-mini-for-small --model mini``.)
"""

from __future__ import annotations

import argparse
import itertools
import json
import re
import statistics
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from geosearch.search.horizon.ladder import spearman

ALL_DGRAM, S_D, D_S, ALL_STIEFEL = (
    "attn=dgram,mlp=dgram",
    "attn=stiefel,mlp=dgram",
    "attn=dgram,mlp=stiefel",
    "attn=stiefel,mlp=stiefel",
)
FOUR = (ALL_STIEFEL, S_D, D_S, ALL_DGRAM)
RHO_AT = 0.8
NEW_SETTINGS = ("mini 0.04", "small 0.04", "mini 0.02 target small", "tiny 0.02 target mini")
"""The discriminating settings, chosen before their runs (the docstring's prediction)."""
ORDER_STEP = 0.02  # the rule's order switches above this step
CROSS_STEP = 0.05  # the rule's DGram attention crosses the threshold from this step


def no_run_order(eta: float) -> tuple[list[str], set[str]]:
    """The no-run rule's order at spectral step ``eta``: the ranked assignments, best first,
    and those it calls unstable (placed last, tied)."""
    if eta <= ORDER_STEP:
        return [ALL_DGRAM, S_D, D_S, ALL_STIEFEL], set()
    return [S_D, ALL_STIEFEL], {ALL_DGRAM, D_S}


def no_run_crosses(eta: float, assign: str) -> bool:
    """The no-run rule's stability decision: DGram attention above the threshold iff
    η ≥ 0.05; Stiefel attention never."""
    return assign.startswith("attn=dgram") and eta >= CROSS_STEP


def placed(order: Sequence[str], pruned: Iterable[str],
           keys: Sequence[str] = FOUR) -> dict[str, float]:
    """Rank positions over all ``keys``: ``order`` 1, 2, ...; the ``pruned`` tied after them."""
    pruned = [a for a in keys if a in set(pruned)]
    out = {a: float(i + 1) for i, a in enumerate(order)}
    tied = len(order) + (len(pruned) + 1) / 2
    return out | {a: tied for a in pruned}


def rho_all(order: Sequence[str], pruned: Iterable[str], truth_mean: Mapping[str, float],
            keys: Sequence[str] = FOUR) -> float:
    """Spearman over all ``keys`` between an order (the pruned last, tied) and the long runs'."""
    pos = placed(order, pruned, keys)
    return spearman([pos[a] for a in keys], [truth_mean[a] for a in keys])


def chances(truth_mean: Mapping[str, float], left: Sequence[str],
            keys: Sequence[str] = FOUR) -> tuple[float, float]:
    """Chance, under a random order of the ``left`` assignments (the others of ``keys``
    pruned, placed last, tied), of naming the long runs' best, and of ρ ≥ 0.8 over all
    ``keys`` (the four; ``fidelity.py --compare`` passes a roles study's eight)."""
    best = min(keys, key=lambda a: truth_mean[a])
    pruned = [a for a in keys if a not in left]
    perms = list(itertools.permutations(left))
    win = sum(p[0] == best for p in perms) / len(perms)
    rho = sum(rho_all(p, pruned, truth_mean, keys) >= RHO_AT - 1e-12 for p in perms) / len(perms)
    return win, rho


def tail(hits: int, chance: Sequence[float]) -> float:
    """P(X ≥ hits) for X the number of successes of independent trials with these chances
    (Poisson-binomial)."""
    dist = [1.0]
    for p in chance:
        dist = [a * (1 - p) + b * p for a, b in zip(dist + [0.0], [0.0] + dist)]
    return sum(dist[hits:])


def constant_rule(decisions: Sequence[bool]) -> int:
    """Decisions the better constant rule gets right: max(above, below)."""
    above = sum(decisions)
    return max(above, len(decisions) - above)


SETTING = re.compile(r"(?:(\d+)-layer )?(\S+) ([\d.]+)((?: \w+=\d+)*)(?: target (\S+))?")
"""A row's setting name: the proxy, its step, its model fields, and a target model other than
the proxy's (``"mini 0.02 target small"``, ``fidelity.py --compare`` of a ``--target-model``
study)."""


def parse_setting(name: str) -> tuple[str, float, dict]:
    """``"4-layer tiny 0.05"`` -> (``"tiny"``, 0.05, {"n_layer": 4}); other ``k=v`` after it:
    the proxy's model, step and model fields (:func:`truth_model` names the scored one)."""
    m = SETTING.fullmatch(name)
    if m is None:
        raise ValueError(f"not a setting name: {name!r}")
    args = {k: int(v) for k, v in (kv.split("=") for kv in m.group(4).split())}
    if m.group(1):
        args["n_layer"] = int(m.group(1))
    return m.group(2), float(m.group(3)), args


def truth_model(name: str) -> tuple[str, float, dict]:
    """The model whose long runs score the row ``name``: its target model at its own sizes
    where the name has one (``"tiny 0.02 target mini"`` -> (``"mini"``, 0.02, {})), else
    :func:`parse_setting`'s."""
    model, eta, args = parse_setting(name)
    target = SETTING.fullmatch(name).group(5)
    return (model, eta, args) if target in (None, model) else (target, eta, {})


def score(
    rows: Sequence[dict], truths: Mapping[str, tuple[dict[str, float], dict[str, bool]]]
) -> dict:
    """The search, the no-run rule and the constant rule over ``rows`` (searches.json's),
    with ``truths``: setting -> (the long runs' mean final loss per assignment, whether any
    of its long runs crossed the threshold). Rows without a truth are left out."""
    table, chance_w, chance_r = [], [], []
    tally = {"search": [0, 0, 0, 0], "rule": [0, 0, 0, 0]}  # winner, rho, decisions hit, of
    decisions: list[bool] = []
    for row in rows:
        if row["setting"] not in truths:
            continue
        mean, above = truths[row["setting"]]
        _, eta, _ = parse_setting(row["setting"])
        order, unstable = no_run_order(eta)
        best = min(FOUR, key=lambda a: mean[a])
        left = row.get("left", 4)
        kept = _kept(row, mean, left)
        w, r = chances(mean, kept)
        chance_w.append(w)
        chance_r.append(r)
        rule_rho = rho_all(order, unstable, mean)
        rule_dec = sum(no_run_crosses(eta, a) == above[a] for a in FOUR)
        s_hits, s_of = row["stability"]
        for name, won, rho, hit, of in (
            ("search", _label(best) == row["search_best"], row["spearman"], s_hits, s_of),
            ("rule", order[0] == best, rule_rho, rule_dec, 4),
        ):
            t = tally[name]
            t[0] += won
            t[1] += rho >= RHO_AT - 1e-9
            t[2] += hit
            t[3] += of
        decisions += [above[a] for a in FOUR]
        table.append(
            {
                "setting": row["setting"],
                "truth_best": _label(best),
                "search_best": row["search_best"],
                "rule_best": _label(order[0]),
                "search_rho": row["spearman"],
                "rule_rho": rule_rho,
                "search_decisions": f"{s_hits} of {s_of}",
                "rule_decisions": f"{rule_dec} of 4",
                "left": left,
                "chance_winner": w,
                "chance_rho": r,
            }
        )
    n = len(table)
    out = {
        "rows": table,
        "settings": n,
        "constant_decisions": [constant_rule(decisions), len(decisions)],
    }
    for name, (won, rho, hit, of) in tally.items():
        out[name] = {
            "winner": [won, n, tail(won, chance_w)],
            "rho": [rho, n, tail(rho, chance_r)],
            "decisions": [hit, of],
        }
    return out


def _kept(row: dict, mean: Mapping[str, float], left: int) -> list[str]:
    """The assignments the search ranked: all four, or the two Stiefel-attention ones where
    DGram attention was pruned (``left`` 2, the only pruning the stored searches made)."""
    if left == 4:
        return list(FOUR)
    if left == 2:
        return [ALL_STIEFEL, S_D]
    raise ValueError(f"{row['setting']}: left {left} is not 2 or 4; name the kept assignments")


LABELS = {
    ALL_STIEFEL: "all-Stiefel",
    S_D: "Stiefel-attn + DGram-MLP",
    D_S: "DGram-attn + Stiefel-MLP",
    ALL_DGRAM: "all-DGram",
}


def _label(assign: str) -> str:
    return LABELS[assign]


def lines(result: dict) -> list[str]:
    """The scored table and its tallies, as markdown."""
    out = [
        "| setting | long runs' best | search / rule best | search ρ | rule ρ "
        "| decisions search / rule "
        "| left | chance: winner, ρ ≥ 0.8 |",
        "|---|---|---|---:|---:|---|---:|---|",
    ]
    for r in result["rows"]:
        mark = (
            "✓" if r["search_best"] == r["truth_best"] else "✗",
            "✓" if r["rule_best"] == r["truth_best"] else "✗",
        )
        out.append(
            f"| {r['setting']} | {r['truth_best']} | {r['search_best']} {mark[0]} / "
            f"{r['rule_best']} "
            f"{mark[1]} | {r['search_rho']:.2f} | {r['rule_rho']:.2f} | {r['search_decisions']} / "
            f"{r['rule_decisions']} | {r['left']} | "
            f"{r['chance_winner']:.2f}, {r['chance_rho']:.2f} |"
        )
    n = result["settings"]
    out.append("")
    for name in ("search", "rule"):
        s = result[name]
        out.append(
            f"- {'The search' if name == 'search' else 'The no-run rule'}: best named at "
            f"{s['winner'][0]} of {n} (p = {s['winner'][2]:.3g} under the right null), ρ ≥ 0.8 at "
            f"{s['rho'][0]} of {n} (p = {s['rho'][2]:.3g}), stability decisions "
            f"{s['decisions'][0]} of "
            f"{s['decisions'][1]}."
        )
    c = result["constant_decisions"]
    out.append(f"- The better constant rule: {c[0]} of {c[1]} stability decisions.")
    return out


def stored_truths(rows: Sequence[dict]) -> dict[str, tuple[dict[str, float], dict[str, bool]]]:
    """Each row's long-run means and threshold crossings from ``benchmarks/data/fidelity``."""
    from fidelity import SETTINGS, load_truth  # torch: only when run on the stored data
    from geosearch.search.horizon.scale import model_logit_scale

    out = {}
    for row in rows:
        model, eta, args = truth_model(row["setting"])
        if model in SETTINGS:  # a named setting ("llama-gqa"): its model and arguments
            model, args = SETTINGS[model][0], {**SETTINGS[model][1], **args}
        truth = load_truth(model, 2000, eta, args)
        if not all(any(r["status"] == "completed" for r in truth[a]) for a in FOUR):
            continue
        threshold = 10.0 * model_logit_scale(model, args)
        mean = {
            a: statistics.fmean(r["final_val_loss"] for r in truth[a] if r["status"] == "completed")
            for a in FOUR
        }
        above = {
            a: any(
                p["max_logit"] is not None and p["max_logit"] > threshold
                for r in truth[a]
                for p in r["probes"]
            )
            for a in FOUR
        }
        out[row["setting"]] = (mean, above)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument(
        "--searches", type=Path, default=Path(__file__).parent / "data" / "searches.json"
    )
    p.add_argument("--out", type=Path, help="also write the table to this file")
    args = p.parse_args(argv)
    rows = json.loads(args.searches.read_text(encoding="utf-8"))["settings"]
    text = "\n".join(lines(score(rows, stored_truths(rows))))
    if args.out is not None:
        from _common import publish

        publish(text, args.out)
    else:
        print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
