"""The report as markdown: :func:`render_markdown` and one function per section.

Sections, in order: the header (run directory, storage, proxy, trial counts), the result
(the search's verdict), the horizon (the target, the Σ η ladder's rungs, each assignment's
loss at each rung and the reading towards the target), the ranking of completed trials
(mean ± std over seeds, ties by the search's paired test; with a step grid, each assignment
at its own best step, then the points at the shared step), unstable, failed and unfinished
trials, the baselines (each assignment's Δ loss and ms/step ratio against AdamW and Muon),
which module type's geometry matters (importance over the assignments, named in bold only
when its main effect is beyond seed noise, and stability), cost, the loss-versus-time
Pareto front, the plots (with the layer that holds each run's largest logit), and how to
browse the study in optuna-dashboard. Every section is a list of lines built from
the loaded run and the analysis results; nothing here reads files or computes statistics.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from geosearch.report.analysis import (CostTable, Importance, pareto_trials, peak_layers,
                                       stability_table)
from geosearch.report.load import RunData, TrialRecord
from geosearch.report.plots import PLOT_NAMES
from geosearch.search.study.baseline_trials import BaselineTable
from geosearch.search.horizon.forecast import short_logit
from geosearch.search.stats.ranking import Ranking
from geosearch.search.stats.scores import MainEffect, Score
from geosearch.search.stats.trials import format_params
from geosearch.report.verdict import verdict_sections
from geosearch.search.stats.verdict import Verdict
from geosearch.search.study.export import study_verdict
from geosearch.search.records import FINISHED, GEOSEARCH_VERSION, PROXY, PRUNED, STEP_FACTOR
from geosearch.search.runtime.backup import ARTIFACTS_DIR
from geosearch.search.horizon.reading import horizon_note

__all__ = ["dashboard_paragraph", "render_markdown"]


def _fmt(x: float | None, spec: str = ".4f", missing: str = "—") -> str:
    return missing if x is None or not math.isfinite(x) else format(x, spec)


def _fmt_spread(s: Score) -> str:
    return f"{s.text()} (1 seed, spread unknown)" if s.n == 1 else s.text()


def _cell(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ").strip()


def _table(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return out


def dashboard_paragraph(run_dir: str | Path = "runs/<study>", storage: str | None = None) -> str:
    """How to open a run's study in optuna-dashboard (the generic text is in the README).

    Args:
        run_dir: the run directory to name in the commands.
        storage: the storage actually opened; ``None`` shows both the SQLite and the
            journal-file command.
    """
    files = f"--artifact-dir {run_dir}/{ARTIFACTS_DIR}"  # each trial's config, metrics, result
    if storage is None:
        commands = (
            f"optuna-dashboard sqlite:///{run_dir}/study.db {files}    # one worker (SQLite)\n"
            f"optuna-dashboard {run_dir}/journal.log {files}          # --workers > 1 (journal file)\n"
        )
    else:
        commands = f"optuna-dashboard {storage} {files}\n"
    return (
        "Every run directory is an ordinary Optuna storage, so "
        "[optuna-dashboard](https://github.com/optuna/optuna-dashboard) can browse the same "
        "study, also while the search runs: optimisation history, parameter importances, "
        "intermediate values, every trial's user attrs (`assignment`, `val_losses`, "
        "`prune_reason`, ...) and, with `--artifact-dir`, its files. Install it with "
        "`pip install 'geosearch[dashboard]'`, then run\n\n"
        f"```bash\n{commands}```\n\n"
        "and open http://127.0.0.1:8080. Its \"Best Trial\" is the lowest value of any completed "
        "trial, a baseline's or an adaptive seed's too (each carries a note saying what it is); "
        "the answer is `best_assignment.yaml`'s trial. A study kept in PostgreSQL opens the "
        "same way with its `postgresql://...` URL."
    )


def render_markdown(
    run: RunData,
    ranking: Ranking,
    importance: Importance,
    cost: CostTable,
    plots: dict[str, str],
    plots_note: str | None = None,
    *,
    baselines: BaselineTable | None = None,
    verdict: Verdict | None = None,
) -> str:
    """The report as markdown.

    Args:
        run: the loaded run.
        ranking: from :func:`geosearch.search.stats.study_ranking.rank_study` on ``run.study``.
        importance: from :func:`~geosearch.report.analysis.geometry_importances`.
        cost: from :func:`~geosearch.report.analysis.cost_table`.
        plots: plot name -> path relative to the run directory, for the plots written.
        plots_note: why some or all plots are missing (e.g.
            :data:`~geosearch.report.plots.PLOTS_HINT`).
        baselines: from :func:`geosearch.search.study.baseline_trials.baseline_table` (no section
            without it).
        verdict: from :func:`geosearch.search.study.export.study_verdict`: the Result section
            as sections and tables (default: built from ``run.study``).
    """
    by_status: dict[str, list[TrialRecord]] = {}
    for t in run.trials:
        by_status.setdefault(t.status, []).append(t)
    sections = [
        _md_header(run, by_status),
        _md_result(ranking, by_status.get("unstable", []), run, verdict),
        _md_horizon(run, plots),
        _md_stability(run),
        _md_ranking(ranking, {t.number: t for t in run.trials}),
        *([_md_shared_ranking(ranking, {t.number: t for t in run.trials})] if ranking.steps is not None else []),
        _md_unfinished(by_status),
        *([_md_baselines(baselines)] if baselines is not None else []),
        _md_importance(importance, stability_table(run.trials)),
        _md_cost(cost),
        _md_pareto(run.trials),
        _md_plots(run, plots, plots_note),
        ["## Browse this study in optuna-dashboard", "", dashboard_paragraph(run.run_dir, run.storage)],
    ]
    return "\n\n".join("\n".join(s) for s in sections) + "\n"


def _step(t: TrialRecord) -> str:
    return str(t.stop_step) if t.stop_step is not None else "?"


def _md_header(run: RunData, by_status: dict[str, list[TrialRecord]]) -> list[str]:
    lines = [f"# geosearch report: {run.study_name}", ""]
    lines.append(f"- run directory: `{run.run_dir}`; storage: `{run.storage}`")
    if run.attrs.get(GEOSEARCH_VERSION):
        lines.append(f"- written by geosearch {run.attrs[GEOSEARCH_VERSION]}")
    proxy = run.attrs.get(PROXY)
    if isinstance(proxy, dict) and proxy:
        lines.append("- proxy: " + ", ".join(f"{k}={json.dumps(v)}" for k, v in proxy.items()))
    counts = [f"{len(by_status.get(s, []))} {s}" for s in FINISHED if s != PRUNED or by_status.get(s)]
    counts += [f"{len(v)} {s}" for s, v in by_status.items() if s not in FINISHED]
    lines.append(f"- trials: {len(run.trials)} ({', '.join(counts)})")
    if run.seed_trials:
        lines.append(f"- adaptive seeds: {run.seed_trials} seed trials, merged into their "
                     "assignments' scores (the verdict says how many seeds each contender got)")
    if run.not_run:
        lines.append(f"- not shown: {run.not_run} duplicate or skipped trials (points already "
                     "scored or taken by another worker: never trained)")
    return lines


def _md_result(ranking: Ranking, unstable: list[TrialRecord], run: RunData,
               verdict: Verdict | None = None) -> list[str]:
    v = verdict if verdict is not None else study_verdict(run.study, ranking, run.run_dir)
    return verdict_sections(v, at_own_step=ranking.steps is not None) + _unstable_line(unstable)


def _unstable_line(unstable: list[TrialRecord]) -> list[str]:
    if not unstable:
        return []
    names = "; ".join(f"{t.label} (trial {t.number}, step {_step(t)})" for t in unstable)
    return ["", f"Unstable (pruned): {names}."]


def _md_horizon(run: RunData, plots: dict[str, str]) -> list[str]:
    lines = ["## Horizon", ""]
    t = run.target
    if t is None:
        return lines + ["This study records no target (it was made before targets)."]
    lines.append(f"The answer is for your target: {t.get('steps')} steps at spectral step "
                 f"{t.get('spectral_lr')} on `{t.get('model')}`, a cumulative spectral step Σ η of "
                 f"{_fmt(t.get('sum_eta'), '.3g')} (docs/design.md, \"Horizon\"). Each assignment "
                 "was trained at every rung of the ladder below and ranked at the top one.")
    ranked = [r for r in run.trials if r.rung_losses]
    if run.rungs:
        lines += [""] + _table(
            ["assignment", "status", *(f"Σ η {r.sum_eta:.3g} ({r.steps} steps, η {r.spectral_lr:.3g})"
                                      for r in run.rungs)],
            [[r.label, r.status, *(_fmt(r.rung_losses[i]) if i < len(r.rung_losses) else "—"
                                  for i in range(len(run.rungs)))] for r in ranked])
    if run.reading is None:
        lines += ["", "The target is the proxy run itself: there is nothing to compare."]
    else:
        lines += [""] + [f"- {line}" for line in run.reading.lines]
        note = horizon_note(run.reading)
        lines += ["", f"**{note[0].upper() + note[1:]}.**" if note else
                  "**Stable:** the leader held at every rung towards the target."]
    if "horizon" in plots:
        lines += ["", f"![{PLOT_NAMES['horizon']}]({plots['horizon']})"]
    return lines


def _md_stability(run: RunData) -> list[str]:
    lines = ["## Stability at your target", ""]
    measured = [r for r in run.stability if r.measured is not None]
    if measured:
        lines.append("The largest attention logit of each completed run's stability rung: a run "
                     "of the proxy that ends at your target's Σ η² (logit growth follows Σ η², not "
                     "Σ η, across step sizes), so it *measures* the logits your run reaches instead "
                     "of forecasting them (docs/design.md, \"The stability rung\"). In the target "
                     "model's logits; a run that went above the threshold was pruned as unstable at "
                     "the target (see the unstable trials), and the step where your run would cross "
                     "it is given.")
        return lines + [""] + _table(
            ["trial", "assignment", "max logit at the end", "peak", "threshold", "verdict"],
            [[r.number, r.label, short_logit(r.measured.final), short_logit(r.measured.peak),
              short_logit(r.measured.threshold), r.measured.verdict] for r in measured])
    rows = [r for r in run.stability if r.outlook is not None]
    if not rows:
        return lines + ["No forecast: no completed trial has enough probes with a Σ η and a target "
                        "to extrapolate to (an AdamW run takes no spectral step, so it has no Σ η)."]
    lines.append("The largest attention logit each completed run reached at the top rung, and the "
                 "stability pruner's forecast of it at your target: a law in log(σ₀ + Σ η) fitted on "
                 "the run's probes, with its 90% prediction interval, in the target model's logits "
                 "(docs/design.md, \"The instability signal\"). The pruner acts on a forecast only "
                 "when it is clearly above the threshold and the target is within "
                 "`max_extrapolation` of the run's Σ η. Farther forecasts are a rough guide: "
                 "against 2,000-step runs, forecasts from 5× short were within ×2 for 12 of 20 "
                 "(docs/benchmarks.md, fidelity.py).")
    lines += [""] + _table(
        ["trial", "assignment", "proxy's max logit (Σ η)", "forecast at the target [90%]", "threshold",
         "verdict", "Σ η to go"],
        [[r.number, r.label,
          f"{short_logit(r.max_logit)} ({_fmt(r.sum_eta, '.3g')})" if r.max_logit is not None else "—",
          f"{short_logit(r.outlook.forecast.value)} [{short_logit(r.outlook.forecast.low)}, "
          f"{short_logit(r.outlook.forecast.high)}]", short_logit(r.outlook.threshold),
          r.outlook.verdict + ("" if r.outlook.acted_on else " (rough guide)"),
          f"×{r.outlook.to_go:.3g}"] for r in rows])
    return lines


def _md_ranking(ranking: Ranking, records: dict[int, TrialRecord]) -> list[str]:
    lines = ["## Ranking (completed trials)", ""]
    if not ranking.rows:
        return lines + ["No completed trials."]
    lines += [
        "Final validation loss, mean ± sample std over seeds (n = seeds). *vs best*: `tie` = "
        "not shown worse than the best at 5%, `separated` = worse beyond that *noise* threshold "
        "(t₀.₉₇₅(df) × the gap's standard error, exact t quantiles), `unknown` = one seed, so no "
        "spread to judge by. Every assignment runs the same seeds, which share initialisation "
        "and data order, so the test is blocked: loss = assignment + seed + ε, fitted by least "
        "squares over all the (assignment, seed) cells, residual df = cells − rank of the "
        "design; *Δ vs best* is the gap the test judged (the fit's contrast with the best). A "
        "paired t-test on the seeds both ran (Welch's when fewer than two are shared) is only "
        "the fallback, when the fit has no residual df or the two assignments share no seeds. "
        "The same rule as the ranking printed by `geosearch search`."
        + (" With the step grid this is each assignment at its own best step (the exported "
           "answer); the next table ranks the points at the shared step." if ranking.steps else ""),
        "",
    ]
    return lines + _ranking_rows(ranking, records, grid=ranking.steps is not None)


def _md_shared_ranking(ranking: Ranking, records: dict[int, TrialRecord]) -> list[str]:
    """The step grid's other answer: the points at the shared step, ranked by the same rule."""
    step = ranking.steps.shared_step
    lines = [f"## Ranking at the shared step {f'{step:g}' if step else '(x1)'}", "",
             "The points at factor 1 of the step grid, ranked by the same rule as above: the "
             "answer a space without a step grid gives.", ""]
    if not ranking.steps.shared.rows:
        return lines + ["No point completed at the shared step."]
    return lines + _ranking_rows(ranking.steps.shared, records, grid=True)


def _ranking_rows(ranking: Ranking, records: dict[int, TrialRecord], *, grid: bool) -> list[str]:
    """The ranking's table; with a step grid each row's label is the ranking's (with its
    step), not the searched ``step_factor``."""
    params = {r.number: {k: v for k, v in (records[r.number].other_params if r.number in records else {}).items()
                         if not (grid and k == STEP_FACTOR)} for r in ranking.rows}
    has_params = any(params.values())
    header = ["rank", "trial", "assignment"] + (["params"] if has_params else [])
    header += ["val loss", "std", "n", "Δ vs best", "noise", "vs best"]
    rows = []
    for r in ranking.rows:
        label = records[r.number].label if r.number in records and not grid else r.label
        rank = "=1" if r.number in ranking.tied and len(ranking.tied) > 1 else str(r.rank)
        row = [rank, r.number, label] + ([format_params(params[r.number])] if has_params else [])
        row += [_fmt(r.score.mean), _fmt(r.score.std) if r.score.n >= 2 else "unknown", r.score.n]
        row += ["—" if r.rank == 1 else f"{r.gap:+.4f}", _fmt(r.threshold), r.versus_best]
        rows.append(row)
    return _table(header, rows)


def _md_baselines(table: BaselineTable) -> list[str]:
    lines = ["## Baselines", ""]
    if not table.baselines:
        return lines + ["No baseline was trained (the space's `baselines:` is empty)."]
    grid = table.shared is not None
    how = ("reported and never exported, tuned over the step grid as the assignments are (AdamW at "
           "lr × each factor, Muon at spectral_lr × each factor). Δ = each assignment at its own best "
           "step minus each baseline at its own best step (its lowest mean val loss over the grid)"
           if grid else "trained with the study's seeds at the proxy's step sizes (not tuned separately), "
           "reported and never exported. Δ = the assignment's val loss minus the baseline's")
    lines += [f"The optimizers people use today, {how} at the baseline's rung (AdamW: rung 0, it takes no "
              "spectral step; Muon: the top rung), negative = the assignment is better, with the "
              "95% interval of the paired test on shared seeds; × ms/step = the assignment's step "
              f"time over {table.cost_to}'s, the one cost baseline of every ratio here (see Cost). "
              "Each baseline says the step it trained at and, for Muon, "
              "its shape scale (`muon_scale`: keller = × √max(1, fan_out/fan_in), the torch.optim.Muon "
              "convention; none = the assignments' spectral step) and its msign.", ""]
    lines += _md_baseline_blocks(table, grid)
    if grid:
        lines += ["### At the shared step", "", "The points at the shared step (factor 1) against each "
                  "baseline at factor 1.", "", *_md_baseline_blocks(table.shared, grid)]
    return lines[:-1]


def _md_baseline_blocks(table: BaselineTable, grid: bool) -> list[str]:
    lines = []
    for name, b in table.baselines.items():
        where = f"rung {b['rung']}" + (f", Σ η {b['sum_eta']:.3g}" if b["sum_eta"] is not None else "")
        step = b["step"] or (f"x{b['factor']:g}" if b["factor"] is not None else "?")
        tried = "; ".join(f"{s}: {_fmt(sc.mean) if sc is not None and sc.n else st}" for _, s, st, sc in b["tried"])
        where += f"; over the grid {tried}" if tried else ""
        head = f"**{name}** at {step}" if grid else f"**{name}**"
        trained = f" Trained as {b['trained']}." if b.get("trained") else ""
        if b["status"] != "completed":
            lines += [f"{head} (trial {b['trial']}, {where}): {b['status']}: {b['reason']}.{trained}", ""]
            continue
        lines += [f"{head} (trial {b['trial']}, {where}): val loss {b['score'].text()}, "
                  f"{_fmt(b['step_ms'], '.1f')} ms/step.{trained}", ""]
        lines += _table(["trial", "assignment", *(["baseline's step"] if grid else []), "Δ val loss", "± 95%",
                         "test", "× ms/step"],
                        [[r.number, r.label, *([step] if grid else []), f"{r.delta:+.4f}", _fmt(r.interval),
                          r.test, _fmt(r.step_ratio, ".2f")] for r in table.rows[name]])
        lines.append("")
    return lines


def _md_unfinished(by_status: dict[str, list[TrialRecord]]) -> list[str]:
    unstable = by_status.get("unstable", [])
    lines = ["## Unstable trials (pruned)", ""]
    if unstable:
        lines += _table(["trial", "assignment", "stopped at step", "reason"],
                        [[t.number, t.label, _step(t), t.reason] for t in unstable])
    else:
        lines.append("None.")
    pruned = by_status.get("pruned", [])
    if pruned:
        lines += ["", "Pruned by the loss pruner (slow, not unstable):", ""]
        lines += _table(["trial", "assignment", "stopped at step", "reason"],
                        [[t.number, t.label, _step(t), t.reason] for t in pruned])
    failed = by_status.get("failed", [])
    if failed:
        lines += ["", "## Failed trials", ""]
        lines += _table(["trial", "assignment", "message"], [[t.number, t.label, t.reason] for t in failed])
    others = [t for s, v in by_status.items() if s not in FINISHED for t in v]
    if others:
        lines += ["", "## Not finished", ""]
        if by_status.get("interrupted"):
            lines += ["Interrupted trials were stopped by Ctrl-C or lost their worker; their "
                      "point was queued again, and rerunning the search runs it.", ""]
        if by_status.get("retried"):
            lines += ["Retried trials failed because of their environment (out of memory, CUDA, "
                      "disk, storage); their point was queued again (`--max-retries`).", ""]
        lines += _table(["trial", "assignment", "status", "note"],
                        [[t.number, t.label, t.status, t.reason or ""] for t in others])
    return lines


def _md_importance(importance: Importance, stability: list[dict[str, Any]]) -> list[str]:
    lines = ["## Which module type's geometry matters most", ""]
    if importance.values is None:
        lines.append(f"Importance: {importance.note}")
    else:
        lines += [f"{_importance_headline(importance)} {importance.note}", ""]
        lines += _table(["module type", "parameter", "importance", "main effect"],
                        [[p.removeprefix("geometry."), p, f"{v:.3f}", _effect_word(importance, p)]
                         for p, v in importance.values.items()])
    if stability:
        lines += ["", "Stability by geometry (every finished trial, including unstable and failed ones):", ""]
        lines += _table(
            ["module type", "geometry", "trials", "unstable", "failed", "best val loss"],
            [[r["param"], r["value"], r["trials"], r["unstable"], r["failed"], _fmt(r["best"])]
             for r in stability],
        )
    return lines


def _main_effect(importance: Importance, param: str) -> MainEffect | None:
    """The parameter's most telling main effect: a decisive one first, then the largest."""
    effects = importance.effects.get(param, ())
    return max(effects, key=lambda e: (e.decisive, e.effect), default=None)


def _effect_word(importance: Importance, param: str) -> str:
    e = _main_effect(importance, param)
    if e is None:
        return "no matched pair"
    if e.half_width is None:
        return "spread unknown"
    return f"beyond noise ({e.better} better)" if e.decisive else "within noise"


def _importance_headline(importance: Importance) -> str:
    """The top factor, in bold only when its main effect is beyond seed noise: PED-ANOVA
    ranks the factors by the points' mean losses and does not know the noise."""
    top = importance.top or ""
    name = top.removeprefix("geometry.")
    e = _main_effect(importance, top)
    if e is not None and e.decisive:
        return f"Most important: **{name}**, beyond seed noise ({e.text()})."
    if e is None:
        why = "no two assignments differ only in it, so no main effect checks it against seed noise"
    elif e.half_width is None:
        why = f"its main effect has no spread to judge by ({e.text()})"
    else:
        why = f"its main effect is within seed noise ({e.text()})"
    head = f"Largest importance: {name}, not shown to matter most: {why}."
    beyond = [p.removeprefix("geometry.") for p in importance.values or {} if importance.decisive(p)]
    if beyond:
        head += f" Beyond noise: {', '.join(beyond)} (the main effects under Result)."
    return head


def _md_cost(cost: CostTable) -> list[str]:
    lines = ["## Cost", ""]
    if not cost.rows:
        return lines + [f"No cost data: {cost.baseline}."]
    if cost.baseline.startswith("the fastest"):
        lines.append(f"Ratios are to {cost.baseline}.")
    else:
        plural = "s" if len(cost.baseline_trials) > 1 else ""
        trials = ", ".join(map(str, cost.baseline_trials))
        lines.append(f"Ratios are to the {cost.baseline} baseline (trial{plural} {trials}).")
    lines += [
        "Time = mean step time × steps run, per seed (the trial's wall time when no step time "
        "was recorded).",
        "",
    ]
    rows = [
        [c.trial.number, c.trial.label, c.trial.status, _fmt(c.step_ms, ".1f"), _fmt(c.step_ratio, ".2f"),
         _fmt(c.tokens_per_s, ",.0f"), _fmt(c.tokens_ratio, ".2f"), _fmt(c.time_s, ".1f")]
        for c in cost.rows
    ]
    header = ["trial", "assignment", "status", "ms/step", "× baseline", "tokens/s", "× baseline", "time (s)"]
    return lines + _table(header, rows)


def _md_pareto(trials: Sequence[TrialRecord]) -> list[str]:
    lines = ["## Loss versus time (Pareto front)", ""]
    pts, front = pareto_trials(trials)
    if not front:
        return lines + ["No completed trial has both a val loss and a time."]
    lines += [
        "Completed trials no other trial beats on both final val loss and training time "
        "(both minimised), fastest first:",
        "",
    ]
    on_front = [pts[i] for i in front]
    rows = [[t.number, t.label, _fmt(t.time_s(), ".1f"), _fmt_spread(t.loss)] for t in on_front]
    return lines + _table(["trial", "assignment", "time (s)", "val loss"], rows)


def _md_plots(run: RunData, plots: dict[str, str], note: str | None) -> list[str]:
    lines = ["## Plots", ""]
    if run.threshold is not None:
        lines.append(f"Pruning threshold on the max attention logit: {run.threshold:g} "
                     f"(from {run.threshold_source}).")
    else:
        lines.append(f"Pruning threshold on the max attention logit: {run.threshold_source}.")
    for name, rel in plots.items():
        if name != "horizon":  # shown in its own section
            lines += ["", f"![{PLOT_NAMES.get(name, name)}]({rel})"]
        if name == "max_logit_layers" and (peaks := _peak_line(run)):
            lines += ["", peaks]
    if note:
        lines += ["", note]
    return lines


def _peak_line(run: RunData) -> str | None:
    """Which layer holds each run's largest attention logit at its last probe, by layer."""
    by_layer: dict[int, list[int]] = {}
    for p in peak_layers(run.trials + run.baselines):
        by_layer.setdefault(p.layer, []).append(p.trial.number)
    if not by_layer:
        return None
    total = sum(map(len, by_layer.values()))
    parts = []
    for layer, numbers in sorted(by_layer.items(), key=lambda kv: (-len(kv[1]), kv[0])):
        shown = ", ".join(map(str, numbers[:8])) + (", ..." if len(numbers) > 8 else "")
        parts.append(f"layer {layer} in {len(numbers)} of {total} runs (trial{'s' * (len(numbers) > 1)} {shown})")
    return ("The layer holding the largest attention logit at each run's last probe (first seed, "
            "the last rung it reached): " + "; ".join(parts) + ".")
