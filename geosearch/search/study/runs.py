"""One proxy run of a trial: its config at a rung (:func:`rung_run`) and folder
(:func:`rung_dir`), what it does to its trial (the run's callback: reports, probes, the
pruner's verdict) and the attrs a trained trial keeps of its runs. Used by
:class:`~geosearch.search.study.trial_loop.Searcher`; the attrs are described in
``docs/design.md`` ("Study and trial attributes").
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import optuna

from geosearch.assignment import Assignment
from geosearch.proxy.config import TrainConfig, TrainResult
from geosearch.proxy.state import state_path
from geosearch.search.horizon.ladder import Rung
from geosearch.search.horizon.stability import STABILITY_RUNG, stability_clock, stability_skip
from geosearch.search.horizon.target import (
    branch_warmup,
    probe_sum_eta,
    takes_spectral_qk,
    warmup_share,
)
from geosearch.search.horizon.probe_rows import TrialProbes, probe_row
from geosearch.search.horizon.pruner import prune_verdict
from geosearch.search.records import (
    MAX_LOGIT,
    MEAN_STEP_MS,
    PROBE_HISTORY,
    PRUNED_RUNG,
    RUNG_LOSSES,
    RUNG_PROBES,
    SEED_OF,
    STABILITY_FROM,
    STABILITY_PASSED_AT,
    STABILITY_PROBES,
    STABILITY_RUN,
    STOP_STEP,
    TOKENS_PER_S,
    json_safe,
)
from geosearch.search.records import write_probes_file, write_rung_probes
from geosearch.search.runtime.interrupts import CTRL_C
from geosearch.search.runtime.liveness import Heartbeat, TrialLost
from geosearch.search.space.plan import StudyPlan
from geosearch.search.space.spec import SearchSpace, Suggestion
from geosearch.search.study.extras import passed_above

__all__ = ["TrialRuns", "rung_dir", "rung_run", "run_attrs", "run_callback", "stopped_attrs"]


class TrialRuns:
    """Trains the runs of a trial of ``space`` as its ``plan`` says: the stability rung
    first, then each seed at each rung of the ladder.

    Args:
        space, plan, study, run_dir: the study's space, plan, study and run directory.
        train: trains one run (``train(config, assignment, **kwargs) -> TrainResult``).
        on_prune: called with ``unstable`` when the pruner stops a run.
    """

    def __init__(self, space: SearchSpace, plan: StudyPlan, study: optuna.Study, run_dir: Path,
                 train: Callable[..., TrainResult], on_prune: Callable[[bool], None]) -> None:
        self.space, self.plan, self.study, self.run_dir = space, plan, study, run_dir
        self.train, self.on_prune = train, on_prune

    def stability(self, trial: optuna.Trial, suggestion: Suggestion, seeds: list[int],
                  rungs: list[Rung], trial_dir: Path, heartbeat: Heartbeat,
                  rows: list[dict]) -> TrainResult | None:
        """Train the stability rung with the trial's first seed, before the ladder
        (:mod:`geosearch.search.horizon.stability`: its step, which trials skip it, how it is
        judged); its probes are appended to ``rows`` (``stability_probes``), a pass as
        ``stability_passed_at`` (the trial's step factor), a skip for a larger step's pass as
        ``stability_from``. ``None`` when the space has none or the trial skips it."""
        stab = self.plan.stability
        if stab is None or not rungs:
            return None
        repeat = seeds[0] - self.space.proxy.seed
        config, assignment = rung_run(self.space, suggestion, repeat, stab.rung)
        seed_trial = SEED_OF in trial.user_attrs
        spectral_qk = not seed_trial and takes_spectral_qk(assignment)
        above = (passed_above(self.study, trial, suggestion.step_factor)
                 if spectral_qk and self.plan.halving else None)
        if stability_skip(seed_trial=seed_trial, spectral_qk=spectral_qk, passed_above=above):
            if above is not None:
                trial.set_user_attr(STABILITY_FROM, above)
            return None
        trial.set_user_attr(STABILITY_RUN, True)
        clock = stability_clock(self.space.proxy, self.plan.target, stab.rung)
        callback = run_callback(self.study, trial, TrialProbes(rows),
                                probe_sum_eta(config, assignment),
                                heartbeat, report=False, judge=True, target_step=clock,
                                on_prune=self.on_prune)
        out_dir = rung_dir(trial_dir, stab.rung.index, len(rungs), seeds[0], len(seeds))
        result = self.train(config, assignment, callback=callback, out_dir=out_dir,
                            project=self.study.study_name, store_dir=self.run_dir,
                            run_name=f"trial {trial.number} stability seed {seeds[0]}")
        trial.set_user_attr(STABILITY_RUN, False)
        if result.status == "completed":
            trial.set_user_attr(STABILITY_PASSED_AT, suggestion.step_factor)
        return result

    def ladder(self, trial: optuna.Trial, suggestion: Suggestion, seeds: list[int],
               rungs: list[Rung], trial_dir: Path, heartbeat: Heartbeat,
               stability: list[dict]) -> tuple[list[list[TrainResult]], list[list[list[dict]]]]:
        """Train each seed at each rung, lowest first, until a run does not complete; the
        pruner is handed each run's probes and the ``stability`` rung's.

        Returns:
            Per rung reached, per seed run: its result, and the probe rows it recorded.
        """
        results: list[list[TrainResult]] = []
        probes: list[list[list[dict]]] = []
        trunk_rows: dict[int, list[dict]] = {}  # each seed's trunk's probes so far (branches)
        for rung in rungs:
            results.append([])
            probes.append([])
            for seed in self.plan.rung_seeds(seeds, rung):
                r = seed - self.space.proxy.seed  # the repeat: a seed trial's may be past repeats
                config, assignment = rung_run(self.space, suggestion, r, rung)
                start: dict[str, Any] = {}
                if rung.cooldown is not None:  # a branch: the trunk to its branch point first
                    rows_so_far = trunk_rows.setdefault(seed, [])
                    trunk, start = self.trunk(trial, config, assignment, rung, rungs, trial_dir,
                                              seed, len(seeds), heartbeat, stability, rows_so_far)
                    if trunk is not None:
                        results[-1].append(trunk)
                        probes[-1].append(list(trunk_rows[seed]))
                        return results, probes
                rows: list[dict] = list(trunk_rows.get(seed, []))
                live = TrialProbes(rows, stability)
                judge = rung.spectral_lr <= self.plan.target.spectral_lr * (1 + 1e-9)
                callback = run_callback(self.study, trial, live, probe_sum_eta(config, assignment),
                                        heartbeat, report=rung.index == rungs[-1].index and r == 0,
                                        judge=judge, on_prune=self.on_prune)
                out_dir = rung_dir(trial_dir, rung.index, len(rungs), seed, len(seeds))
                # trackers (proxy.log_with): one run per trial and seed, in the study's project
                # (MLflow's store: the study's directory)
                name = f"trial {trial.number}" + (f" rung {rung.index}" if len(rungs) > 1 else "")
                results[-1].append(self.train(
                    config, assignment, callback=callback, out_dir=out_dir,
                    project=self.study.study_name, run_name=f"{name} seed {seed}",
                    store_dir=self.run_dir, **start))
                probes[-1].append(rows)
                if results[-1][-1].status != "completed":  # TrainResult.status
                    return results, probes
        return results, probes


    def trunk(self, trial: optuna.Trial, config: TrainConfig, assignment: Assignment, rung: Rung,
              rungs: list[Rung], trial_dir: Path, seed: int, seeds: int, heartbeat: Heartbeat,
              stability: list[dict], rows: list[dict]) -> tuple[TrainResult | None, dict[str, Any]]:
        """Train one seed's trunk (``ladder.branches``) on from its latest saved branch point
        to ``rung``'s, saving its state there; its probes are appended to ``rows`` and the
        pruner judges them as the rung's. Returns the trunk's result when it did not complete
        (the rung then ends there), and the branch's ``train`` keywords (its start)."""
        here = trunk_dir(trial_dir, seed, seeds)
        start = {"start_from": state_path(here, rung.branch_point)}
        if start["start_from"].is_file():
            return None, start
        done = [r.branch_point for r in rungs if r.branch_point < rung.branch_point
                and state_path(here, r.branch_point).is_file()]
        trunk_config = dataclasses.replace(config, steps=rung.branch_point, cooldown_steps=0)
        judge = rung.spectral_lr <= self.plan.target.spectral_lr * (1 + 1e-9)
        callback = run_callback(self.study, trial, TrialProbes(rows, stability),
                                probe_sum_eta(trunk_config, assignment), heartbeat, report=False,
                                judge=judge, on_prune=self.on_prune)
        result = self.train(trunk_config, assignment, callback=callback, out_dir=here,
                            project=self.study.study_name,
                            run_name=f"trial {trial.number} trunk seed {seed}",
                            store_dir=self.run_dir, save_at=(rung.branch_point,),
                            start_from=state_path(here, max(done)) if done else None)
        return (None if result.status == "completed" else result), start


def trunk_dir(trial_dir: Path, seed: int, seeds: int) -> Path:
    """``trials/<n>/trunk[/seed<s>]``: one seed's trunk (``ladder.branches``) and its states."""
    out = trial_dir / "trunk"
    return out if seeds == 1 else out / f"seed{seed}"


def rung_run(space: SearchSpace, suggestion: Suggestion, repeat: int,
             rung: Rung) -> tuple[TrainConfig, Assignment]:
    """The config and assignment of one seed's run at ``rung``: rung 0 is the proxy run as
    the space makes it; a higher rung (or the stability rung) takes the rung's steps (the
    warmup stretched with them) and multiplies every spectral step of the trial (the
    searched ones too) by the rung's over the proxy's."""
    if rung.cooldown is not None:  # a branch (ladder.branches): the proxy's step and warmup
        config = dataclasses.replace(space.train_config(suggestion, repeat=repeat),
                                     steps=rung.steps, warmup_steps=branch_warmup(space.proxy),
                                     cooldown_steps=rung.cooldown)
        return config, suggestion.assignment()
    if rung.index == 0:
        return space.train_config(suggestion, repeat=repeat), suggestion.assignment()
    factor = rung.spectral_lr / space.proxy.spectral_lr
    options = {k: {**o, "lr": o["lr"] * factor} if "lr" in o else dict(o)
               for k, o in suggestion.options.items()}
    scaled = dataclasses.replace(suggestion, options=options)
    config = space.train_config(scaled, repeat=repeat)
    config = dataclasses.replace(config, steps=rung.steps, spectral_lr=config.spectral_lr * factor,
                                 warmup_steps=warmup_share(space.proxy, rung.steps))
    return config, scaled.assignment()


def rung_dir(trial_dir: Path, rung: int, rungs: int, seed: int, seeds: int) -> Path:
    """``trials/<n>[/rung<k>][/seed<s>]``: a level only where there is more than one;
    ``trials/<n>/stability`` for the stability rung (one seed)."""
    if rung == STABILITY_RUNG:
        return trial_dir / "stability"
    out = trial_dir if rungs == 1 else trial_dir / f"rung{rung}"
    return out if seeds == 1 else out / f"seed{seed}"


def run_callback(study: optuna.Study, trial: optuna.Trial, probes: TrialProbes,
                 sum_eta: Callable[[int], float | None], heartbeat: Heartbeat, *, report: bool,
                 judge: bool, on_prune: Callable[[bool], None],
                 target_step: Callable[[int], int] | None = None,
                 ) -> Callable[[int, dict], str | None]:
    """The trainer's callback for one run of ``trial``.

    It reports (``report``: the first seed at the ranked, top rung only, as Optuna keeps one
    value per step and the trial's value is read there), records probes (appended to
    ``probes.history``, with their Σ η, and with ``target_step`` the target's step at their
    Σ η²) and asks the pruner, handing it ``probes`` (``judge``: the stability rung, and a
    rung whose spectral step is not above the target's; a larger step stands in for Σ η in
    the loss, but its logits overshoot the long run's at the same Σ η: ``docs/design.md``,
    "The ladder"). A prune calls
    ``on_prune(unstable)`` and returns the reason, which stops the run; the trainer stops a
    non-finite run at any rung.
    """
    pruner = study.pruner

    def callback(step: int, metrics: dict) -> str | None:
        if heartbeat.lost.is_set():
            raise TrialLost
        if CTRL_C.is_set():  # a Ctrl-C whose KeyboardInterrupt Python swallowed (see ctrl_c_latch)
            raise KeyboardInterrupt
        try:
            if report and metrics.get("val_loss") is not None:
                trial.report(float(metrics["val_loss"]), step)
            if metrics.get("max_logit") is not None:
                row = probe_row(metrics, sum_eta=sum_eta(step))
                if target_step is not None:
                    row["target_step"] = target_step(step)
                probes.history.append(json_safe(row))
            verdict = prune_verdict(pruner, study, trial, step, probes) if judge else None
        except optuna.exceptions.UpdateFinishedTrialError:
            raise TrialLost from None
        if verdict is None:
            return None
        why, unstable = verdict
        on_prune(unstable)
        return why

    return callback


def run_attrs(results: list[list[TrainResult]], probes: list[list[list[dict]]],
              stability: list[dict]) -> dict[str, Any]:
    """The attrs of a trained trial whatever its outcome: the first seed's probes at the
    last rung it reached (and at every rung), its ``stability`` rung's, speed, last max
    logit, losses per rung."""
    first = results[-1][0]
    probed = [m for m in first.history if m.get("max_logit") is not None]
    runs = [r for rung in results for r in rung]
    speeds = [r.mean_step_ms for r in runs if math.isfinite(r.mean_step_ms)]
    tokens = [r.tokens_per_s for r in runs if math.isfinite(r.tokens_per_s)]
    return {
        PROBE_HISTORY: probes[-1][0],
        STABILITY_PROBES: stability,
        MEAN_STEP_MS: sum(speeds) / len(speeds) if speeds else None,
        TOKENS_PER_S: sum(tokens) / len(tokens) if tokens else None,
        MAX_LOGIT: probed[-1]["max_logit"] if probed else None,
        RUNG_LOSSES: [[r.final_val_loss for r in rung] for rung in results],
        RUNG_PROBES: [rung[0] for rung in probes],
    }


def stopped_attrs(result: TrainResult, rows: list[dict]) -> dict[str, Any]:
    """The attrs of a trial whose stability rung did not complete (its probe ``rows``): no
    rung of the ladder was trained."""
    last = rows[-1] if rows else {}
    return {PROBE_HISTORY: rows, STABILITY_PROBES: rows, PRUNED_RUNG: "stability",
            STOP_STEP: result.stop_step,
            MEAN_STEP_MS: result.mean_step_ms if math.isfinite(result.mean_step_ms) else None,
            MAX_LOGIT: last.get("max_logit"), RUNG_LOSSES: [], RUNG_PROBES: []}


def store_probes(trial_dir: Path, attrs: dict[str, Any]) -> None:
    """Move the probe rows out of a trial's final ``attrs`` into its folder: ``rung_probes``
    to ``rung_probes.json``, ``probe_history`` and ``stability_probes`` to ``probes.json``.
    The attrs keep the last max logit (``max_logit``); the peak is the rows' to read."""
    rung_probes = attrs.pop(RUNG_PROBES, None)
    if rung_probes:
        write_rung_probes(trial_dir, rung_probes)
    write_probes_file(trial_dir, {k: attrs.pop(k) for k in (PROBE_HISTORY, STABILITY_PROBES)
                                  if k in attrs})
