"""What a resumed study may change: its run-time settings, not what its trials measure.

A study is created with a search space (its points, proxy run, seeds, target and ladder);
a later run of the same study must measure the same thing, or its trials would not
compare. :func:`check_identity` refuses a run whose space differs from the study's, with
one line naming the key, except for the proxy's run-time settings (:data:`RUN_TIME_KEYS`:
the device, the precision, the micro-batches of the same global batch, compilation, the
trackers), whose changes it returns as notes. Which keys are which is in
``docs/design.md`` ("Resuming a study").
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import optuna

from geosearch.errors import ConfigError
from geosearch.search.records import SPACE
from geosearch.search.space.spec import SearchSpace

__all__ = ["IDENTITY_KEYS", "RUN_TIME_KEYS", "check_identity"]

# Study attrs that define what is measured: a resumed study must keep them.
IDENTITY_KEYS = ("rules", "geometries", "hyperparams", "proxy", "repeats")
RUN_TIME_KEYS = ("device", "mixed_precision", "grad_accum", "compile", "log_with")
"""Proxy fields that say how a trial runs, not what it measures: they may change between
runs of one study (``grad_accum`` splits the same global batch into micro-batches)."""


def check_identity(study: optuna.Study, space: SearchSpace, run_dir: Path) -> list[str]:
    """A resumed study must measure the same thing: same points, same proxy but for its
    run-time settings (:data:`RUN_TIME_KEYS`), whose changes are returned as notes."""
    old = study.user_attrs.get(SPACE)
    if not isinstance(old, dict):
        return []
    new = space.to_dict()
    _check_horizon(study, old, new, run_dir)
    notes = []
    for key in IDENTITY_KEYS:
        a, b = old.get(key), new.get(key)
        if key == "proxy" and isinstance(a, dict) and isinstance(b, dict):
            for k in sorted(set(a) | set(b)):
                if a.get(k) == b.get(k):
                    continue
                if k in RUN_TIME_KEYS:
                    notes.append(f"note: study {study.study_name!r} was created with proxy.{k}="
                                 f"{a.get(k)!r}; this run uses {b.get(k)!r} (a run-time setting: "
                                 "what a trial measures is unchanged)")
                    continue
                raise ConfigError(
                    f"study {study.study_name!r} was created with proxy.{k}={a.get(k)!r}, not "
                    f"{b.get(k)!r}; " + ((_batch_hint(a, b) if k == "batch_size" else None)
                                         or "rerun with the same settings to resume it") +
                    ", or start a new study with --study NAME", source=str(run_dir), key=f"proxy.{k}")
        elif a != b:
            raise ConfigError(
                f"study {study.study_name!r} was created with a different {key} ({a!r}); rerun "
                "with the same search space to resume it, or start a new study with --study NAME",
                source=str(run_dir), key=key)
    return notes


def _batch_hint(old: dict[str, Any], new: dict[str, Any]) -> str | None:
    """What to do instead of lowering the batch of a study (for memory): split the study's
    batch into micro-batches as small as the ones asked for (``grad_accum``)."""
    batch, smaller = old.get("batch_size"), new.get("batch_size")
    if not (isinstance(batch, int) and isinstance(smaller, int) and 0 < smaller < batch):
        return None
    micro = max(1, smaller // max(1, int(new.get("grad_accum") or 1)))
    accum = next(k for k in range(1, batch + 1) if batch % k == 0 and batch // k <= micro)
    return (f"the batch is part of what a trial measures: to use less memory, keep it and split "
            f"it (--batch-size {batch} --grad-accum {accum}, i.e. proxy.grad_accum={accum}, trains "
            f"micro-batches of {batch // accum} with the same effective batch of {batch}) to resume it")


def _check_horizon(study: optuna.Study, old: dict[str, Any], new: dict[str, Any],
                   run_dir: Path) -> None:
    """The target and the ladder are part of what a study measures: the target sets the
    pruner's forecast and the rungs, the top rung the values. A study from before them had
    one rung and no target; with one rung the ladder's limits are unused."""
    name = study.study_name
    if "target" in old and old["target"] != new["target"]:
        raise ConfigError(
            f"study {name!r} was created for the target {old['target']!r}, not {new['target']!r}: "
            "another target is another question; start a new study with --study NAME, or rerun "
            "with the study's target (--target-steps ...) to resume it", source=str(run_dir),
            key="target")
    # older studies: all seeds at every rung, no stability rung
    a = {"lower_seeds": None, "stability_steps": None, **old.get("ladder", {"rungs": 1})}
    b = new["ladder"]
    one_rung = a.get("rungs") == b["rungs"] == 1 and a["stability_steps"] == b["stability_steps"]
    if a != b and not one_rung:
        raise ConfigError(f"study {name!r} was created with the ladder {a!r}, not {b!r}; rerun "
                          "with the same ladder to resume it, or start a new study with --study "
                          "NAME", source=str(run_dir), key="ladder")
