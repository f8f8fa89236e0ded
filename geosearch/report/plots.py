"""The report's PNG plots, drawn with matplotlib (the ``report`` extra), imported lazily.

:func:`make_plots` writes ``plots/<name>.png`` for each entry of :data:`PLOT_NAMES` that the
run has data for: the max attention logit over steps coloured by attention geometry with
the pruning threshold drawn, σ_max per module type, validation loss curves, loss versus
time with the Pareto front, the importance of each module type's geometry, and the
horizon: each assignment's final val loss at each rung of the Σ η ladder and its max
logit against Σ η, with the target's Σ η marked and the rungs' crossings, and the max
logit of each attention layer over steps (when the metrics record it). Pruned trials are
dashed; the baselines (AdamW, Muon, ...) are drawn in grey, each with a dash pattern of its
own and labelled by its name, beside the assignments (whose colours are never grey).
matplotlib is imported only when plots are drawn, through its object-oriented API (no
pyplot, no GUI backend); without it :func:`make_plots` raises ImportError and the report
says how to install it (:data:`PLOTS_HINT`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from geosearch.report.analysis import (
    Importance,
    geometry_importances,
    head_logits,
    layer_logits,
    pareto_trials,
)
from geosearch.report.load import RunData, TrialRecord, as_finite
from geosearch.search.horizon.ladder import forecast_at

__all__ = ["PLOTS_HINT", "PLOT_NAMES", "make_plots"]

#: Plot files written under ``<run>/plots/`` (name -> what it shows).
PLOT_NAMES = {
    "max_logit": "max attention logit over steps, coloured by attention geometry",
    "sigma_max": "largest singular value over steps, per module type and geometry",
    "val_loss": "validation loss over steps",
    "pareto": "final validation loss versus time, with the Pareto front",
    "importance": "importance of each module type's geometry",
    "horizon": "final val loss and max logit against Σ η across the ladder's rungs, target marked",
    "max_logit_layers": "max attention logit of each layer over steps, one panel per run (first seed, top rung)",
    "max_logit_heads": "max attention logit of each layer and head at the end of the stability "
                       "rung, one panel per run",
}

#: A baseline's (grey, dash pattern) in every plot; other names get the last.
_BASELINE_STYLES = {"adamw": ("0.2", (0, (7, 2))), "muon": ("0.45", (0, (4, 1.5, 1, 1.5))),
                    "muon_qkclip": ("0.65", (0, (1.5, 1.2))), None: ("0.35", (0, (2, 1, 2, 4)))}
_MAX_PANELS = 16  # panels of max_logit_layers.png

PLOTS_HINT = "plots need matplotlib: pip install 'geosearch[report]'"


def _import_matplotlib():
    """matplotlib's Figure class; ImportError when the ``report`` extra is missing.

    Uses the object-oriented API (no pyplot), so no GUI backend or global state is touched.
    """
    import matplotlib  # noqa: F401  (first, so a missing package fails here)
    from matplotlib.figure import Figure

    return Figure


def _palette(labels: Iterable[str]) -> dict[str, Any]:
    import matplotlib

    labels = sorted(set(labels))
    cmap = matplotlib.colormaps["tab10" if len(labels) <= 9 else "tab20"]
    colours = [c for c in (cmap(i) for i in range(cmap.N)) if not c[0] == c[1] == c[2]]  # grey: baselines
    return {lab: colours[i % len(colours)] for i, lab in enumerate(labels)}


def _series(records: list[dict], key: str, by: str = "step") -> tuple[list[float], list[float]]:
    xs, ys = [], []
    for r in records:
        x, y = as_finite(r.get(by)), as_finite(r.get(key))
        if x is not None and y is not None:
            xs.append(x)
            ys.append(y)
    return xs, ys


def _logit_series(t: TrialRecord) -> list[tuple[list[float], list[float]]]:
    runs = [_series(m, "max_logit") for m in t.metrics]
    runs = [r for r in runs if r[0]]
    if not runs and t.probe_history:
        runs = [_series(t.probe_history, "max_logit")]
    return [r for r in runs if r[0]]


def _type_geometry(t: TrialRecord, module_type: str) -> str:
    family = module_type.split("_")[0]
    return (
        t.assignment.get(module_type)
        or t.geometry_params.get(module_type)
        or t.geometry_params.get(family)
        or "?"
    )


def _legend(ax) -> None:
    handles, labels = ax.get_legend_handles_labels()
    if handles:
        seen: dict[str, Any] = {}
        for h, lab in zip(handles, labels):
            seen.setdefault(lab, h)
        ax.legend(list(seen.values())[:20], list(seen)[:20], fontsize="small")


def make_plots(
    run: RunData, plots_dir: str | Path, importance: Importance | None = None
) -> tuple[dict[str, Path], list[str]]:
    """Write the report's PNG plots.

    Args:
        run: the loaded run.
        plots_dir: where to write (created).
        importance: from :func:`~geosearch.report.analysis.geometry_importances` (computed
            when ``None``).

    Returns:
        (plot name -> file written, notes on plots skipped for lack of data).

    Raises:
        ImportError: matplotlib is not installed.
    """
    Figure = _import_matplotlib()
    plots_dir = Path(plots_dir)
    plots_dir.mkdir(parents=True, exist_ok=True)
    written: dict[str, Path] = {}
    skipped: list[str] = []

    def save(fig, name: str) -> None:
        path = plots_dir / f"{name}.png"
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        written[name] = path

    def keep(fig, name: str, missing: str) -> None:
        """Save ``fig`` as plot ``name``, or note ``missing`` when there is no figure."""
        if fig is None:
            skipped.append(f"{name}: {missing}")
        else:
            save(fig, name)

    keep(_max_logit_figure(Figure, run), "max_logit", "no trial recorded max_logit")
    keep(_sigma_max_figure(Figure, run), "sigma_max", "no trial recorded sigma_max")
    keep(_val_loss_figure(Figure, run), "val_loss", "no trial recorded val_loss")
    keep(_pareto_figure(Figure, run), "pareto", "no completed trial with a val loss and a time")
    importance = importance if importance is not None else geometry_importances(run.study)
    keep(_importance_figure(Figure, importance), "importance", importance.note)
    keep(_horizon_figure(Figure, run), "horizon",
         "the study records no target, or no trial a loss or probe with Σ η")
    for name, figure in (("max_logit_layers", _layers_figure), ("max_logit_heads", _heads_figure)):
        fig = figure(Figure, run)
        if fig is not None:  # no note without: a study from before per-layer (per-head) probes
            save(fig, name)
    for name in PLOT_NAMES.keys() - written.keys():  # a stale plot from an earlier report would mislead
        (plots_dir / f"{name}.png").unlink(missing_ok=True)
    return written, skipped


def _seed_style(t: TrialRecord, seed: int) -> dict[str, Any]:
    """A trial's curve of its ``seed``-th run: the first seed bold, the others faint; dashed
    when the trial was pruned as unstable."""
    return {"alpha": 0.85 if seed == 0 else 0.35, "ls": "--" if t.status == "unstable" else "-"}


def _baseline_style(t: TrialRecord, seed: int = 0) -> dict[str, Any]:
    """A baseline's curve: grey with its own dash pattern (any state), its first seed
    darker, labelled by its name."""
    colour, dashes = _BASELINE_STYLES.get(t.baseline, _BASELINE_STYLES[None])
    return {"color": colour, "ls": dashes, "alpha": 0.9 if seed == 0 else 0.4, "label": t.label}


def _rung_note(run: RunData, t: TrialRecord) -> str:
    """``" (rung 0)"`` for a run whose curves come from below the ladder's top rung, where
    the completed assignments' come from: the AdamW baseline (it takes no spectral step), a
    point pruned at a lower rung."""
    if len(run.rungs) > 1 and t.rung_indices and t.rung_indices[-1] != run.rungs[-1].index:
        return f" (rung {t.rung_indices[-1]})"
    return ""


def _max_logit_figure(Figure, run: RunData):
    """Max attention logit over steps by attention geometry, threshold drawn; ``None`` without data."""
    trials = run.trials + run.baselines
    series = {t.number: _logit_series(t) for t in trials}
    if not any(series.values()):
        return None
    colours = _palette(t.family_geometry("attn") for t in run.trials if series[t.number])
    fig = Figure(figsize=(8, 4.5))
    ax = fig.add_subplot()
    for t in trials:
        for k, (xs, ys) in enumerate(series[t.number]):
            ys = [max(y, 1e-3) for y in ys]  # log scale
            if t.baseline is None:
                style = {"color": colours[t.family_geometry("attn")],
                         "label": f"attn={t.family_geometry('attn')}", **_seed_style(t, k)}
            else:
                style = _baseline_style(t, k)
                style["label"] += _rung_note(run, t)
            ax.plot(xs, ys, lw=1.2, **style)
            if t.status == "unstable" and k == 0:
                ax.plot(xs[-1], ys[-1], "x", color=style["color"], ms=8)
    if run.threshold is not None:
        ax.axhline(run.threshold, color="black", ls=":", lw=1.2,
                   label=f"prune threshold {run.threshold:g}")
    ax.set_yscale("log")
    ax.set_xlabel("step")
    ax.set_ylabel("max attention logit")
    ax.set_title("Max attention logit (dashed + x: pruned as unstable; grey: baselines)")
    _legend(ax)
    return fig


def _sigma_max_figure(Figure, run: RunData):
    """σ_max over steps, one panel per module type, coloured by its geometry; ``None`` without data."""
    trials = run.trials
    types = sorted({k for t in trials for m in t.metrics for r in m for k in (r.get("sigma_max") or {})})
    if not types:
        return None
    colours = _palette(_type_geometry(t, ty) for t in trials for ty in types)
    ncol = min(2, len(types))
    nrow = math.ceil(len(types) / ncol)
    fig = Figure(figsize=(5 * ncol, 3.2 * nrow))
    for k, ty in enumerate(types):
        ax = fig.add_subplot(nrow, ncol, k + 1)
        for t in trials:
            g = _type_geometry(t, ty)
            for j, m in enumerate(t.metrics):
                points = [{"step": r.get("step"), "v": (r.get("sigma_max") or {}).get(ty)} for r in m]
                xs, ys = _series(points, "v")
                if xs:
                    ax.plot(xs, ys, color=colours[g], lw=1.1, label=g, **_seed_style(t, j))
        ax.set_yscale("log")
        ax.set_title(f"σ_max: {ty}")
        ax.set_xlabel("step")
        _legend(ax)
    return fig


def _val_loss_figure(Figure, run: RunData):
    """Validation loss curves over steps, one colour per trial; ``None`` without data."""
    trials = run.trials + run.baselines
    val = {t.number: [r for r in (_series(m, "val_loss") for m in t.metrics) if r[0]] for t in trials}
    if not any(val.values()):
        return None
    colours = _palette(t.label for t in run.trials if val[t.number])
    fig = Figure(figsize=(8, 4.5))
    ax = fig.add_subplot()
    for t in trials:
        for j, (xs, ys) in enumerate(val[t.number]):
            if t.baseline is None:
                ax.plot(xs, ys, color=colours[t.label], lw=1.2, marker=".", label=t.label, **_seed_style(t, j))
            else:
                style = _baseline_style(t, j)
                ax.plot(xs, ys, lw=1.4, marker=".", **{**style, "label": style["label"] + _rung_note(run, t)})
    ax.set_xlabel("step")
    ax.set_ylabel("validation loss")
    ax.set_title("Validation loss (dashed: pruned as unstable; grey: baselines)")
    _legend(ax)
    return fig


def _pareto_figure(Figure, run: RunData):
    """Final validation loss versus training time with the Pareto front; ``None`` without data."""
    pts, front = pareto_trials(run.trials)
    if not pts:
        return None
    fig = Figure(figsize=(7, 4.5))
    ax = fig.add_subplot()
    xs = [t.time_s() for t in pts]
    ys = [t.loss.mean for t in pts]
    err = [t.loss.std if t.loss.n >= 2 else 0.0 for t in pts]
    ax.errorbar(xs, ys, yerr=err, fmt="o", color="tab:gray", alpha=0.7, label="completed trial")
    fx = [xs[i] for i in front]
    fy = [ys[i] for i in front]
    ax.step(fx, fy, where="post", color="tab:red", lw=1.5, label="Pareto front")
    ax.plot(fx, fy, "o", color="tab:red")
    for t, x, y in zip(pts, xs, ys):
        ax.annotate(str(t.number), (x, y), textcoords="offset points", xytext=(4, 4), fontsize="small")
    ax.set_xlabel("training time (s)")
    ax.set_ylabel("final validation loss")
    ax.set_title("Loss versus time (numbers: trials)")
    _legend(ax)
    return fig


def _importance_figure(Figure, importance: Importance):
    """The importance of each module type's geometry as bars, blue where its main effect is
    beyond seed noise, grey where it is not (or has no matched pair to judge it by);
    ``None`` when there is none."""
    if not importance.values:
        return None
    params = list(importance.values)[::-1]
    names = [p.removeprefix("geometry.") for p in params]
    colours = ["tab:blue" if importance.decisive(p) else "tab:gray" for p in params]
    fig = Figure(figsize=(6, 0.5 * len(names) + 1.5))
    ax = fig.add_subplot()
    ax.barh(names, [importance.values[p] for p in params], color=colours)
    ax.set_xlabel("importance (PED-ANOVA over the assignments, normalised)")
    title = "Which module type's geometry matters most"
    if "tab:gray" in colours:
        title += "\n(grey: main effect within seed noise or untested)"
    ax.set_title(title)
    return fig


def _layers_figure(Figure, run: RunData):
    """The max attention logit of each layer over steps, one panel per run (its first seed at
    the last rung it reached), the assignments best first, then the baselines; ``None``
    when no trial's metrics record per-layer values."""
    import matplotlib

    order = sorted(run.trials, key=lambda t: (0, t.loss.mean, t.number)
                   if t.status == "completed" and t.loss.n else (1, 0.0, t.number))
    points = [(t, rows) for t in order if (rows := layer_logits(t))]
    bases = [(t, rows) for t in run.baselines if (rows := layer_logits(t))]
    if not points and not bases:
        return None
    shown = points[:max(0, _MAX_PANELS - len(bases))] + bases
    layers = max(len(values) for _, rows in shown for _, values in rows)
    colour = [matplotlib.colormaps["viridis"](0.9 * i / max(1, layers - 1)) for i in range(layers)]
    ncol = min(4, len(shown))
    nrow = math.ceil(len(shown) / ncol)
    fig = Figure(figsize=(3.6 * ncol, 2.8 * nrow + 0.6))
    for k, (t, rows) in enumerate(shown):
        ax = fig.add_subplot(nrow, ncol, k + 1)
        for i in range(layers):
            pts = [(x, max(v[i], 1e-3)) for x, v in rows if i < len(v) and v[i] is not None]
            if pts:
                ax.plot(*zip(*pts), color=colour[i], lw=1.2, label=f"layer {i}")
        if run.threshold is not None:
            ax.axhline(run.threshold, color="black", ls=":", lw=1.0, label=f"prune threshold {run.threshold:g}")
        ax.set_yscale("log")
        state = "" if t.status == "completed" else f", {t.status}"
        ax.set_title(f"{t.label}{_rung_note(run, t)}\n(trial {t.number}{state})", fontsize="small")
        ax.set_xlabel("step", fontsize="small")
        if k % ncol == 0:
            ax.set_ylabel("max attention logit", fontsize="small")
        if k == 0:
            _legend(ax)
    kept = len(shown) - len(bases)
    more = f" (the {kept} best of {len(points)} assignments)" if kept < len(points) else ""
    fig.suptitle(f"Max attention logit per layer, first seed{more}")
    return fig


def _heads_figure(Figure, run: RunData):
    """The max attention logit of each layer (rows) and head (columns) at the end of each run's
    stability rung (:func:`~geosearch.report.analysis.head_logits`), one heatmap per run on one
    colour scale, the assignments best first, then the baselines; ``None`` without per-head
    values."""
    order = sorted(run.trials, key=lambda t: (0, t.loss.mean, t.number)
                   if t.status == "completed" and t.loss.n else (1, 0.0, t.number))
    shown = [(t, got) for t in order + run.baselines if (got := head_logits(run.run_dir, t))]
    if not shown:
        return None
    shown = shown[:_MAX_PANELS]
    values = [v for _, (_, _, grid) in shown for row in grid for v in row if v is not None]
    vmin, vmax = (min(values), max(values)) if values else (0.0, 1.0)
    ncol = min(4, len(shown))
    nrow = math.ceil(len(shown) / ncol)
    fig = Figure(figsize=(3.2 * ncol + 0.8, 2.6 * nrow + 0.6))
    for k, (t, (where, step, grid)) in enumerate(shown):
        ax = fig.add_subplot(nrow, ncol, k + 1)
        heads = max(len(row) for row in grid)
        cells = [[math.nan if v is None else v for v in row] + [math.nan] * (heads - len(row))
                 for row in grid]
        image = ax.imshow(cells, vmin=vmin, vmax=vmax, cmap="magma", aspect="auto")
        if len(grid) * heads <= 64:
            for i, row in enumerate(cells):
                for j, v in enumerate(row):
                    if not math.isnan(v):
                        ax.text(j, i, f"{v:.3g}", ha="center", va="center", fontsize="x-small",
                                color="white" if v < (vmin + vmax) / 2 else "black")
        ax.set_xticks(range(heads))
        ax.set_yticks(range(len(grid)))
        ax.set_xlabel("head", fontsize="small")
        if k % ncol == 0:
            ax.set_ylabel("layer", fontsize="small")
        ax.set_title(f"{t.label}\n(trial {t.number}, {where} step {step:g})", fontsize="small")
    fig.colorbar(image, ax=ax, label="max attention logit (every panel's scale)")
    fig.suptitle("Max attention logit per layer and head, end of the stability rung")
    return fig


def _horizon_figure(Figure, run: RunData):
    """Loss at each rung and max logit against Σ η (log-log), per assignment and baseline
    (each at the rungs it trained: AdamW at rung 0), the target's Σ η as a vertical line;
    ``None`` when there is nothing to draw."""
    target = as_finite((run.target or {}).get("sum_eta"))
    trials = run.trials + run.baselines
    at = {r.index: r for r in run.rungs}
    losses = {t.number: [(at[i].sum_eta, y) for i, y in zip(t.rung_indices, t.rung_losses)
                         if i in at and as_finite(y)] for t in trials}
    logits = {t.number: [_series(rows, "max_logit", by="sum_eta")
                         for rows in (t.rung_probes or [t.probe_history])] for t in trials}
    if target is None or not any(losses.values()) and not any(xs for v in logits.values() for xs, _ in v):
        return None
    colours = _palette(t.label for t in run.trials)
    fig = Figure(figsize=(12, 4.5))
    ax_loss, ax_logit = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    extrapolate = run.reading is not None and run.reading.extrapolated
    for t in trials:
        if t.baseline is None:
            style = {"color": colours[t.label], "ls": "--" if t.status == "unstable" else "-", "label": t.label}
        else:
            style = {k: v for k, v in _baseline_style(t).items() if k != "alpha"}
            style["label"] += _rung_note(run, t)
            colours[t.label] = style["color"]  # its forecast marker too
        points = losses[t.number]
        if points:
            ax_loss.plot(*zip(*points), marker="o", lw=1.4, **style)
            if (extrapolate and t.baseline is None and t.status == "completed"
                    and len(points) == len(run.rungs) > 1):
                end = forecast_at(run.rungs, [y for _, y in points], target)
                ax_loss.plot([points[-1][0], target], [points[-1][1], end], color=style["color"],
                             ls=":", lw=1.2)  # the reading's line in log Σ η, not a measurement
        for k, (xs, ys) in enumerate(logits[t.number]):
            keep = [(x, y) for x, y in zip(xs, ys) if x > 0 and y > 0]  # log-log
            if keep:
                ax_logit.plot(*zip(*keep), lw=1.1, alpha=0.5 + 0.5 * (k + 1) / len(logits[t.number]), **style)
    _draw_forecasts(ax_logit, run, colours)
    for c in run.reading.crossings if run.reading is not None else []:
        ax_loss.axvline(c.sum_eta, color="tab:gray", ls=":" if c.measured else "-.", lw=0.9,
                        label="crossing" + ("" if c.measured else " (forecast)"))
    for ax in (ax_loss, ax_logit):
        ax.axvline(target, color="black", lw=1.3, label=f"your target: Σ η {target:.3g}")
        ax.set_xscale("log")
        ax.set_xlabel("cumulative spectral step Σ η")
        _legend(ax)
    ax_logit.set_yscale("log")
    ax_loss.set_ylabel("final validation loss (mean over seeds)")
    ax_logit.set_ylabel("max attention logit")
    ax_loss.set_title("Loss at each rung (dotted: extrapolated to the target; grey: baselines)")
    ax_logit.set_title("Max logit vs Σ η (dashed: pruned; ◆: forecast, 90%; grey: baselines)")
    return fig


def _draw_forecasts(ax_logit, run: RunData, colours: dict[str, Any]) -> None:
    """The pruner's forecasts at the target (in the proxy's logits) and its threshold there."""
    forecasts = [r for r in run.stability if r.outlook is not None and r.label in colours
                 and 0 < r.outlook.forecast.low <= r.outlook.forecast.value <= r.outlook.forecast.high]
    for r in forecasts:  # the pruner's forecast at the target, in the proxy's logits
        o = r.outlook
        v, lo, hi = (x / r.scale_ratio for x in (o.forecast.value, o.forecast.low, o.forecast.high))
        ax_logit.errorbar([o.forecast.target_sum_eta], [v], yerr=[[v - lo], [hi - v]], fmt="D",
                          color=colours[r.label], ms=5, capsize=3, alpha=1.0 if o.acted_on else 0.5)
    if forecasts:
        r = forecasts[0]
        ax_logit.axhline(r.outlook.threshold / r.scale_ratio, color="tab:red", ls="--", lw=0.9,
                         label="pruning threshold at the target")
