"""Does the default search's choice of processes pay, and does it keep the answer?

Runs the same search twice, from scratch, in fresh run directories, and times each:

* ``one process``: ``geosearch search --workers 1`` with ``OMP_NUM_THREADS`` unset, so torch
  takes its default threads (what every search did before the default chose workers);
* ``default``: ``geosearch search`` without ``--workers`` (on an idle CPU machine with a
  grid of at least as many points as cores: one single-thread worker per core; its header
  line says what it chose).

Then it checks that both reached the same verdict (:func:`decisions`: the order, each row's
judgment, the winner, the stability line; not their figures) and that every point got the same value in both (a trial's value is its
seeds' mean validation loss: the processes change where it runs, not what it measures).

Run it on an idle machine: the point is wall time, and a loaded machine times the load.
The default search takes minutes each way; ``--set proxy.steps=20 --set repeats=1``
(or ``--space`` a small space) makes a quick check that the script works.

Usage: ``python benchmarks/search_cores.py [--space default] [--set KEY=VALUE ...]``
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import optuna

from _common import machine, publish

from geosearch.search.runtime.storage import open_run_study

REPO = Path(__file__).resolve().parents[1]


def run(label: str, flags: list[str], args: argparse.Namespace, root: Path) -> dict:
    """One search from scratch in ``root/label``: wall seconds, its header's workers line,
    the verdict, the winner's geometry and every point's value."""
    runs = root / label
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    cmd = [sys.executable, "-m", "geosearch", "search", "--space", args.space, "--runs-dir",
           str(runs), "--study", "cores", *[a for s in args.set for a in ("--set", s)], *flags]
    start = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        sys.exit(f"{label}: exit {proc.returncode}: {proc.stderr.strip()[-500:]}")
    lines = proc.stdout.splitlines()

    def first(prefix: str) -> str:
        return next((ln for ln in lines if ln.startswith(prefix)), f"({prefix} no line)")

    run_dir = runs / "cores"
    study = open_run_study(run_dir)  # journal.log or study.db, whichever the search made
    values = {tuple(sorted(t.params.items())): t.value for t in study.get_trials()
              if t.value is not None}
    verdict = first("verdict:")
    return {"seconds": seconds, "workers": first("workers:") if not flags else "--workers 1",
            "verdict": verdict, "winner": verdict.split(" (trial")[0].removeprefix("verdict: "),
            "values": values, "decisions": decisions(lines)}


def decisions(lines: list[str]) -> tuple:
    """What the verdict decides, without its figures: the ranked order with each row's
    judgment (best, worse, within noise), the verdict's kind and winner, and the stability
    line with its numbers masked. Two searches whose values differ in the last digits (torch's
    threads sum in another order) reach the same verdict when these agree."""
    start = next((i for i, ln in enumerate(lines) if ln.startswith("rank ")), len(lines))
    rows = []
    for ln in lines[start + 1:]:
        if not ln[:4].strip().isdigit():
            break
        cells = re.split(r"\s{2,}", ln.strip())
        rows.append((cells[2], re.sub(r"[-+]?\d[\d.,]*", "#", cells[-1])))
    verdict = next((ln for ln in lines if ln.startswith("verdict:")), "")
    stability = next((ln for ln in lines if ln.startswith("stability at your target:")), "")
    return (tuple(rows), verdict.split(",")[0].split(" (trial")[0],
            re.sub(r"\d[\d.,]*", "#", stability))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--space", default="default", help="the space to search (default: default)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="passed on to both searches, e.g. proxy.steps=20 for a quick check")
    p.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "search_cores.md")
    args = p.parse_args()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    header = machine()
    with tempfile.TemporaryDirectory() as tmp:
        one = run("one", ["--workers", "1"], args, Path(tmp))
        default = run("default", [], args, Path(tmp))
    same_values = one["values"] == default["values"]
    common = one["values"].keys() & default["values"].keys()
    gap = max((abs(one["values"][k] - default["values"][k]) for k in common), default=float("nan"))
    rows = ["| search | wall s | processes | winner |", "|---|---|---|---|"]
    for label, r in (("one process", one), ("default", default)):
        rows.append(f"| {label} | {r['seconds']:.1f} | {r['workers']} | {r['winner']} |")
    text = "\n".join([
        f"Machine: {header}", "", f"Space: {args.space} {' '.join(args.set)}", "", *rows, "",
        f"default / one process: {default['seconds'] / one['seconds']:.2f}x the wall time",
        f"same verdict (order, judgments, winner, stability): "
        f"{one['decisions'] == default['decisions']}; same winner: "
        f"{one['winner'] == default['winner']}; every point's value equal: {same_values} "
        f"({len(one['values'])} points; largest difference {gap:.2e}: torch's threads may sum "
        "in another order)", ""])
    publish(text, args.out)
    if one["decisions"] != default["decisions"]:
        sys.exit("the two searches disagree")


if __name__ == "__main__":
    main()
