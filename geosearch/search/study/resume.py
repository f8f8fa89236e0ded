"""What a resumed study may change: its run-time settings, not what its trials measure.

A study is created with a search space (its points, proxy run, seeds, target, ladder,
pruner, baselines); a later run of the same study must measure and judge the same thing, or
its trials would not compare. Every key of a space is classified once, in :data:`ON_RESUME`:
a change of a key that changes a verdict (what a trial measures, how it is judged, what it
is compared with, the question itself) is refused with one line naming the key, exit 2, the
study untouched; a change of any other key (the proxy's run-time settings, the budget, the
sampler) is allowed and returned as a one-line note. ``docs/design.md`` ("Resuming a study")
shows the same table.

The files the space names are compared by their contents too (:data:`ON_CHANGED_FILES`): a
study records the SHA-256 of its data and tokenizer when it is created
(:meth:`geosearch.proxy.data.Corpus.digest`, the study attr ``data_digest``), and a run that
finds them changed is refused the same way, naming the file.

Before the study is touched, :func:`preflight` refuses what would fail every trial, and
:func:`data_digest` hashes the data a resumed study must still be trained on.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import optuna

from geosearch.util.checks import shown
from geosearch.util.errors import ConfigError
from geosearch.proxy.config import TrainConfig
from geosearch.search.records import DATA_DIGEST, LADDER, SPACE, STABILITY, TARGET
from geosearch.search.space.spec import SearchSpace

from geosearch.proxy.accelerator import check_device, check_precision
from geosearch.proxy.config import check_batch_split

__all__ = ["NOT_COMPARED", "ON_CHANGED_FILES", "ON_RESUME", "RUN_TIME_KEYS", "Resume",
           "check_data", "check_identity", "data_digest", "preflight"]


class Resume(NamedTuple):
    """What a change of one key of a resumed study's space does."""

    refused: bool
    """True: the change is refused (it changes verdicts); False: allowed, with a note."""
    why: str
    """What the key is, for the message."""


RUN_TIME_KEYS = ("device", "mixed_precision", "grad_accum", "compile", "log_with")
"""Proxy fields that say how a trial runs, not what it measures: they may change between
runs of one study (``grad_accum`` splits the same global batch into micro-batches)."""

_POINTS = Resume(True, "the points of the study")
_MEASURED = Resume(True, "what a trial measures")
_RUN_TIME = Resume(False, "a run-time setting: what a trial measures is unchanged")
_JUDGED = Resume(True, "how a trial is judged (which trials are pruned as unstable)")
_SEEDS = Resume(True, "how many seeds a contender gets, which decides when a tie is called")
_COMPARED = Resume(True, "what the assignments are compared with")
_QUESTION = Resume(True, "the run the answer is for")
_RUNGS = Resume(True, "the rungs a trial trains and is ranked at, the stability rung included")
_BUDGET = Resume(False, "how long the study runs, not what a trial measures")
_SAMPLER = Resume(False, "which points are proposed next, not how a trial is judged")

ON_RESUME: dict[str, Resume] = {
    "rules": _POINTS,
    "geometries": _POINTS,
    "hyperparams": _POINTS,
    **{f"proxy.{f.name}": _RUN_TIME if f.name in RUN_TIME_KEYS else _MEASURED
       for f in dataclasses.fields(TrainConfig)},
    "repeats": _MEASURED,
    "max_repeats": _SEEDS,
    "baselines": _COMPARED,
    "target": _QUESTION,
    "ladder": _RUNGS,
    "budget.trials": _BUDGET,
    "budget.timeout": _BUDGET,
    "pruner.max_logit": _JUDGED,
    "pruner.max_logit_factor": _JUDGED,
    "pruner.min_entropy": _JUDGED,
    "pruner.n_warmup_steps": _JUDGED,
    "pruner.window": _JUDGED,
    "pruner.interval": _JUDGED,
    "pruner.max_extrapolation": _JUDGED,
    "pruner.loss": Resume(True, "how a trial is judged (which trials are pruned as slow)"),
    "sampler.type": _SAMPLER,
    "sampler.seed": _SAMPLER,
    "sampler.n_startup_trials": _SAMPLER,
}
"""Every key of a space (a top-level key, or ``section.key``) -> what changing it on resume
does. The proxy's fields all change what a trial measures but :data:`RUN_TIME_KEYS`."""
NOT_COMPARED = ("version", "name")
"""Keys that cannot differ: the schema's version, and the name, which selects the study."""

ON_CHANGED_FILES: dict[str, Resume] = {
    "proxy.data": Resume(True, "the text or token ids a trial trains and is validated on"),
    "proxy.tokenizer": Resume(True, "how a trial's text becomes token ids"),
}
"""The keys that name files -> what a change of those files' contents (their SHA-256,
the study attr ``data_digest``) does on resume; the key's value itself is in :data:`ON_RESUME`."""
_DIGEST_PARTS = {"proxy.data": "data", "proxy.tokenizer": "tokenizer"}
"""Each key of :data:`ON_CHANGED_FILES` -> its part of the digest."""


def check_identity(study: optuna.Study, space: SearchSpace, run_dir: Path) -> list[str]:
    """A resumed study must measure and judge the same thing (:data:`ON_RESUME`): a change of
    a key that would change verdicts raises; the others are returned as notes, one line each.

    A study written by an earlier build of geosearch 0.1.0 (one that recorded no target,
    ladder, stability rung or data digest) is refused (:func:`_check_this_build`). A proxy
    field the study's stored space lacks must be unset.

    Raises:
        ConfigError: one line naming the first refused key (``key``) and both values.
    """
    old = study.user_attrs.get(SPACE)
    if not isinstance(old, dict):
        return []
    new = space.to_dict()
    name = study.study_name
    _check_this_build(study, old, run_dir)
    _check_horizon(study, old, new, run_dir)
    notes = []
    for key, resume in ON_RESUME.items():
        if key in ("target", "ladder"):
            continue  # _check_horizon
        found, a, b = _values(old, new, key)
        if not found or a == b:
            continue
        if not resume.refused:
            notes.append(f"note: study {name!r} was created with {key}={shown(a)}; this run uses "
                         f"{shown(b)} ({resume.why})")
            continue
        fix = (_batch_hint(old["proxy"], new["proxy"]) if key == "proxy.batch_size" else None) or (
            f"{resume.why} cannot change on resume: rerun with the study's value to resume it")
        raise ConfigError(f"study {name!r} was created with {key}={shown(a)}, not {shown(b)}; {fix}, or "
                          "start a new study with --study NAME", source=str(run_dir), key=key)
    return notes


def _check_this_build(study: optuna.Study, old: dict[str, Any], run_dir: Path) -> None:
    """Refuse, in one line, a study written by an earlier build of geosearch 0.1.0: one
    without the study attrs or space sections this build records (its target, ladder,
    stability rung and data digest)."""
    if not study.get_trials(deepcopy=False):  # created by a command starting beside this one,
        return  # which has not recorded its attrs yet: nothing an earlier build trained
    attrs = study.user_attrs
    missing = [k for k in (TARGET, LADDER, STABILITY) if k not in attrs]
    missing += [] if isinstance(attrs.get(DATA_DIGEST), dict) else [DATA_DIGEST]
    missing += [f"space.{k}" for k in ("target", "ladder") if not isinstance(old.get(k), dict)]
    if missing:
        raise ConfigError(f"study {study.study_name!r} was written by an earlier build of geosearch "
                          f"(it records no {missing[0]}), which this one does not resume: start a new "
                          "study with --study NAME", source=str(run_dir))


def check_data(study: optuna.Study, digest: dict[str, Any] | None, run_dir: Path) -> list[str]:
    """A resumed study must train on the contents it was created on: compare ``digest`` (the
    data's and tokenizer's, :meth:`geosearch.proxy.data.Corpus.digest`) with the one the study
    recorded, by :data:`ON_CHANGED_FILES`. A run that gives none (a worker process: its
    command checked) is not compared.

    Returns:
        One note per allowed change (none in the table today).

    Raises:
        ConfigError: one line naming the key, the changed file (when the study recorded
            each file's hash) and both hashes' first digits.
    """
    old = study.user_attrs.get(DATA_DIGEST)
    if not isinstance(old, dict) or digest is None:
        return []
    name, notes = study.study_name, []
    for key, resume in ON_CHANGED_FILES.items():
        part = _DIGEST_PARTS[key]
        a, b = old.get(part), digest.get(part)
        sha = (a or {}).get("sha256") if isinstance(a, dict) else None, (b or {}).get("sha256")
        if sha[0] == sha[1]:
            continue
        what, then, now = _changed_file(a, b)
        if not resume.refused:
            notes.append(f"note: study {name!r} was created on other contents of {what} ({resume.why})")
            continue
        raise ConfigError(
            f"study {name!r} was created on other contents of {what} (sha256 {then}, now {now}); "
            f"{resume.why} cannot change on resume: restore the study's files to resume it, or start a "
            "new study with --study NAME", source=str(run_dir), key=key)
    return notes


def _changed_file(old: Any, new: Any) -> tuple[str, str, str]:
    """What changed between two digest parts, in words, and its SHA-256 then and now (their
    first 12 digits, ``none`` for a file or part that is not there): the first file whose hash
    differs (its path; added or removed) when both list each file's, else the part as a whole."""
    def cut(sha: Any) -> str:
        return f"{sha[:12]}..." if isinstance(sha, str) else "none"

    a, b = (old if isinstance(old, dict) else {}), (new if isinstance(new, dict) else {})
    old_each, new_each = a.get("each"), b.get("each")
    part = b or a
    if isinstance(old_each, dict) and isinstance(new_each, dict):
        for f in sorted(set(old_each) | set(new_each)):
            if old_each.get(f) != new_each.get(f):
                change = " (added)" if f not in old_each else " (removed)" if f not in new_each else ""
                path = os.path.join(str(part.get("root") or ""), f)
                return _printable(path, 160) + change, cut(old_each.get(f)), cut(new_each.get(f))
    return _printable(str(part.get("source") or "the data"), 160), cut(a.get("sha256")), cut(b.get("sha256"))


def _printable(text: str, limit: int) -> str:
    """``text`` for a one-line message: as it is when printable, else its ``repr``; cut to ``limit``."""
    return text[:limit] if text.isprintable() else shown(text, limit)


def _values(old: dict[str, Any], new: dict[str, Any], key: str) -> tuple[bool, Any, Any]:
    """``(whether the stored space has key, its value there, its value now)``."""
    section, _, sub = key.partition(".")
    if not sub:
        return section in old, old.get(section), new.get(section)
    a, b = old.get(section), new.get(section) or {}
    if not isinstance(a, dict):
        return False, None, None
    return sub in a or section == "proxy", a.get(sub), b.get(sub)


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
    pruner's forecast and the rungs, the top rung the values; with one rung the ladder's
    limits are unused."""
    name = study.study_name
    if old["target"] != new["target"]:
        raise ConfigError(
            f"study {name!r} was created for the target {shown(old['target'], 100)}, not "
            f"{shown(new['target'], 100)}: another target is another question; start a new study with "
            "--study NAME, or rerun with the study's target (--target-steps ...) to resume it",
            source=str(run_dir), key="target")
    a, b = old["ladder"], new["ladder"]
    one_rung = a.get("rungs") == b["rungs"] == 1 and a["stability_steps"] == b["stability_steps"]
    if a != b and not one_rung:
        raise ConfigError(f"study {name!r} was created with the ladder {shown(a, 120)}, not {shown(b, 120)}; "
                          "rerun with the same ladder to resume it, or start a new study with --study "
                          "NAME", source=str(run_dir), key="ladder")


def data_digest(space: SearchSpace) -> dict[str, Any]:
    """The SHA-256 of the files the space's proxy trains on, its data and tokenizer
    (:meth:`geosearch.proxy.data.Corpus.digest`; the corpus is the one the preflight loaded,
    from the process's cache), for :func:`bind_study`. Reads every file once: a command calls
    it once, its workers never.

    Raises:
        ConfigError: the data cannot be loaded or read.
    """
    from geosearch.proxy.data import config_corpus

    return config_corpus(space.proxy).digest()


def preflight(space: SearchSpace, processes: int = 1,
              echo: Callable[[str], None] | None = None) -> None:
    """Errors that would fail every trial, found before the study is touched.

    The run's settings, as :func:`geosearch.proxy.train.train` refuses them: a device this
    machine does not have, a mixed precision it cannot train in
    (:func:`~geosearch.proxy.accelerator.check_precision`), a tracker of ``log_with`` that is
    unknown or not installed, a global batch that does not split over ``processes`` x
    ``grad_accum`` micro-batches. Then the data, the model (a zoo spec, built on the meta
    device), a context the data cannot fill, one forward pass of the model
    (:func:`~geosearch.models.zoo.check_logits`: logits of the data's vocabulary; a ``py:``
    model whose forward cannot run on the meta device is built for real on the CPU for it),
    (its memory, and its time: a line to ``echo`` when a run would take an hour or more,
    :func:`~geosearch.models.memory.time_note`),
    and rules that do not fit the model, match nothing or leave a hidden weight without a
    geometry: the plan (:func:`geosearch.plan.bind`) of the space's first assignment, with
    the proxy's optimizer settings. ``space.rules`` are the rules every trial's assignment
    carries: the space's, or the model's default rule set when the space names none.

    Args:
        space: the search space, flags applied.
        processes: the processes that train each trial (a data-parallel launch's world).
        echo: prints the time line (``None``: not estimated).

    Raises:
        ConfigError: the first problem, naming the space's key (``proxy.grad_accum``, ...);
            a :class:`~geosearch.util.errors.SettingsError` for the run's settings.
    """
    from geosearch.assignment import Assignment
    from geosearch.rules.modules import empty_rule_error, get_rule_set, match_parameters
    from geosearch.plan import bind
    from geosearch.proxy.data import config_corpus
    from geosearch.proxy.trackers import check_trackers
    from geosearch.models.specs import PY_PREFIX
    from geosearch.models.memory import (check_fits, matmul_rate, parameter_count,
                                         probe_logit_bytes, step_flops, time_note)
    from geosearch.models.zoo import build_meta_model, build_model, check_logits

    proxy = space.proxy
    where = space.source or "the search space"
    device = check_device(proxy.device, source=where, key="proxy.device")
    check_precision(proxy.device, proxy.mixed_precision, source=where, key="proxy.mixed_precision")
    check_trackers(proxy.log_with, source=where, key="proxy.log_with")
    check_batch_split(proxy.batch_size, proxy.grad_accum, processes, source=where, prefix="proxy.")
    corpus = config_corpus(proxy)
    built = build_meta_model(proxy.model, vocab_size=corpus.vocab_size, model_args=proxy.model_args)
    corpus.check_block_size(built.block_size)
    check_fits(built.model, proxy.model, device, source=where, key="proxy.model_args",
               probe_bytes=probe_logit_bytes(built.config, built.block_size,
                                             proxy.probe_batch_size))
    if echo is not None:  # a run of an hour or more is said (memory.time_note)
        flops = step_flops(parameter_count(built.model), built.config, built.block_size,
                           proxy.batch_size)
        note = time_note(proxy.model, flops, proxy.steps, matmul_rate(device) * processes)
        if note:
            echo(note)
    if not check_logits(built, corpus.vocab_size, source=where, key="proxy.model") \
            and proxy.model.startswith(PY_PREFIX):  # its forward needs real tensors
        real = build_model(proxy.model, vocab_size=corpus.vocab_size, model_args=proxy.model_args)
        check_logits(real, corpus.vocab_size, source=where, key="proxy.model")
        del real
    rules = get_rule_set(space.rules) if isinstance(space.rules, str) else space.rules
    try:
        match = match_parameters(built.model, rules)
    except ConfigError as e:  # e.g. nanogpt's nn.Linear rules on hf:gpt2's Conv1D weights
        raise ConfigError(e.problem, source=where, key=e.key, allowed=e.allowed) from None
    empty = empty_rule_error(match, proxy.model, source=where)
    if empty is not None:
        raise empty
    first = Assignment(geometry={k: v[0] for k, v in space.geometries.items()},
                       rules=space.rules if isinstance(space.rules, str) else list(space.rules))
    try:  # what the trials' optimizers will be built from: unassigned hidden weights, ...
        bind(built.model, first, proxy.optimizer_settings(), source=where)
    except ConfigError as e:
        raise ConfigError(e.problem, source=where, key=e.key, allowed=e.allowed) from None
