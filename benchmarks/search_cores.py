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

``--breakdown`` runs the search once instead, in this process with one worker and one
thread, and says where its wall time goes: process start, preflight, each proxy run's setup,
forward, backward, the rest of the training step, the optimizer, probes, evaluations, the
rest of the run loop (records, the trial's callback), what lies between the runs (Optuna,
storage, artifacts) and the report at the end; then the floor (forward + backward) for
the planned steps on the machine's cores. It prints every trial's value (``repr``), so two
runs of it can be compared digit for digit.

Usage: ``python benchmarks/search_cores.py [--space default] [--set KEY=VALUE ...]
[--breakdown]``
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


class Timers:
    """Seconds spent in functions, by name: :meth:`wrap` replaces ``owner.attr`` by a timed
    call (the original kept for :meth:`restore`). Nested timers count apart, each its own."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self.calls: dict[str, int] = {}
        self.inside: set[str] = set()
        self.saved: list[tuple[object, str, object]] = []

    def wrap(self, owner: object, attr: str, name: str, only_inside: str | None = None) -> None:
        """Time ``owner.attr`` as ``name``; with ``only_inside`` only calls made while the
        timer of that name runs (the model's forward inside a training step, not in an
        evaluation)."""
        original = getattr(owner, attr)
        self.saved.append((owner, attr, original))

        def timed(*args, **kwargs):
            if only_inside is not None and only_inside not in self.inside:
                return original(*args, **kwargs)
            self.inside.add(name)
            start = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - start
                self.calls[name] = self.calls.get(name, 0) + 1
                self.inside.discard(name)

        setattr(owner, attr, timed)

    def restore(self) -> None:
        for owner, attr, original in reversed(self.saved):
            setattr(owner, attr, original)
        self.saved.clear()


def process_start() -> float:
    """Seconds a fresh interpreter takes to import what a search worker imports."""
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import geosearch.cli.search, geosearch.proxy.train, "
                    "geosearch.search.study.run"], check=True,
                   env={**os.environ, "PYTHONPATH": str(REPO)})
    return time.perf_counter() - start


def breakdown(args: argparse.Namespace) -> None:
    """One search (``--workers 1``, one thread) in this process, timed by part."""
    import torch

    import geosearch.proxy.train as train_mod
    import geosearch.report as report
    import geosearch.search.study.run as run_mod
    from geosearch.cli import main as cli

    torch.set_num_threads(1)
    timers, R = Timers(), train_mod._Run
    timers.wrap(run_mod, "preflight", "preflight")
    timers.wrap(run_mod, "train", "proxy runs")
    import geosearch.search.study.trial_loop as loop_mod

    timers.wrap(loop_mod, "train", "proxy runs")
    timers.wrap(R, "__init__", "run setup")
    timers.wrap(R, "train_step", "training step")
    timers.wrap(R, "forward_backward", "forward + backward")
    timers.wrap(train_mod, "lm_loss", "forward", only_inside="forward + backward")
    timers.wrap(R, "optimizer_step", "optimizer")
    timers.wrap(R, "probe", "probes")
    timers.wrap(R, "evaluate", "evaluations")
    timers.wrap(R, "ask", "trial callback")
    timers.wrap(report, "write_report", "report")
    started = process_start()
    with tempfile.TemporaryDirectory() as tmp:
        cmd = ["search", "--space", args.space, "--runs-dir", tmp, "--study", "cores",
               "--workers", "1", *[a for s in args.set for a in ("--set", s)]]
        start = time.perf_counter()
        code = cli(cmd)
        wall = time.perf_counter() - start
        timers.restore()
        study = open_run_study(Path(tmp) / "cores")
        values = sorted((t.number, t.value) for t in study.get_trials())
    sec, n = timers.seconds, timers.calls
    steps, runs = n.get("training step", 0), n.get("proxy runs", 0)
    fb, fwd = sec.get("forward + backward", 0.0), sec.get("forward", 0.0)
    parts = [
        ("process start (imports), one process", started, 1),
        ("preflight", sec.get("preflight", 0.0), n.get("preflight", 0)),
        ("proxy run setup (data, model, optimizer, batches)", sec.get("run setup", 0.0),
         n.get("run setup", 0)),
        ("forward", fwd, n.get("forward", 0)),
        ("backward", fb - fwd, n.get("forward + backward", 0)),
        ("batch, clip, loss sync", sec.get("training step", 0.0) - fb, n.get("training step", 0)),
        ("optimizer (step, schedule, zero_grad)", sec.get("optimizer", 0.0),
         n.get("optimizer", 0)),
        ("probes", sec.get("probes", 0.0), n.get("probes", 0)),
        ("evaluations", sec.get("evaluations", 0.0), n.get("evaluations", 0)),
        ("trial callback (pruner, storage)", sec.get("trial callback", 0.0),
         n.get("trial callback", 0)),
    ]
    inside = sum(t for _, t, _ in parts[2:])  # the parts timed inside the proxy runs
    parts.append(("rest of the proxy runs (records, files, free_memory)",
                  sec.get("proxy runs", 0.0) - inside, n.get("proxy runs", 0)))
    parts.append(("between the runs (Optuna, storage, artifacts, export)",
                  wall - sec.get("preflight", 0.0) - sec.get("proxy runs", 0.0)
                  - sec.get("report", 0.0), 1))
    parts.append(("report (tables and plots)", sec.get("report", 0.0), n.get("report", 0)))
    total = started + wall
    rows = ["| part | seconds | share | calls | ms per call |", "|---|---|---|---|---|"]
    for name, t, calls in parts:
        rows.append(f"| {name} | {t:.1f} | {100 * t / total:.1f}% | {calls} | "
                    f"{1e3 * t / calls if calls else float('nan'):.1f} |")
    rows.append(f"| total (process start + search wall) | {total:.1f} | 100% | | |")
    cores = os.cpu_count() or 1
    floor = fb / max(1, n.get("forward + backward", 1)) * steps / cores
    text = "\n".join([
        f"Machine: {machine()}", "", f"Space: {args.space} {' '.join(args.set)}; one process, "
        f"--workers 1, one thread; exit {code}; {runs} proxy runs, {steps} steps", "", *rows,
        "", f"floor: forward + backward {1e3 * fb / max(1, n.get('forward + backward', 1)):.1f} "
        f"ms a step x {steps} steps / {cores} cores = {floor:.0f} s",
        "", "trial values: " + "; ".join(f"{k}: {v!r}" for k, v in values), ""])
    publish(text, args.out.with_name("search_breakdown.md"))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--space", default="default", help="the space to search (default: default)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="passed on to both searches, e.g. proxy.steps=20 for a quick check")
    p.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "search_cores.md")
    p.add_argument("--breakdown", action="store_true",
                   help="one search in this process, one worker and thread: where its time goes")
    args = p.parse_args()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    if args.breakdown:
        breakdown(args)
        return
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
