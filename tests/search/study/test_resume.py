"""Tests of geosearch.search.study.resume: what a resumed study may change, and what it refuses;
and the preflight: what would fail every trial is refused before the study is touched, naming
the space's key (the refusals end to end, one line, exit 2, nothing written, are in
tests/faults/test_bad_inputs.py).

Run through the command (``geosearch search`` in this process, with the fake trainer of
tests/_search_helpers.py): the note, the one error line, the exit code, the study untouched.
The run-time settings a resumed study may change are checked before any trial (the
preflight, below) as a new study's are.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import optuna
import pytest
import yaml
from _search_helpers import TINY_PROXY, FakeTrain, make_space, search, trials_of, use_train

from geosearch.cli import main
from geosearch.util.errors import ConfigError, SettingsError
from geosearch.search.records import DATA_DIGEST
from geosearch.search.study.resume import (
    NOT_COMPARED,
    ON_CHANGED_FILES,
    ON_RESUME,
    RUN_TIME_KEYS,
    preflight,
)
from geosearch.search.runtime.storage import open_run_study

pytestmark = pytest.mark.usefixtures("no_plots")  # no test here checks a plot: tests/_no_plots.py

optuna.logging.set_verbosity(optuna.logging.WARNING)


def _command(tmp_path, *flags):
    path = tmp_path / "space.yaml"
    path.write_text(yaml.safe_dump(make_space().to_dict()), encoding="utf-8")
    return ["search", "--space", str(path), "--runs-dir", str(tmp_path / "runs"), *flags]


def _stored(tmp_path):
    study = open_run_study(tmp_path / "runs" / "t")
    return study.user_attrs, [(t.number, t.state, t.value) for t in study.get_trials()]


@pytest.mark.slow
def test_run_time_settings_may_change_with_a_note(fake, tmp_path, capsys):
    assert main(_command(tmp_path)) == 0
    capsys.readouterr()
    before = _stored(tmp_path)
    # half the memory per step: the same global batch of 2 in two micro-batches of 1
    assert main(_command(tmp_path, "--grad-accum", "2", "--mixed-precision", "no", "--trials", "3")) == 0
    out = capsys.readouterr().out
    assert "note: study 't' was created with proxy.grad_accum=1; this run uses 2 (a run-time " \
           "setting: what a trial measures is unchanged)" in out
    assert "proxy.mixed_precision=None; this run uses 'no'" in out
    assert _stored(tmp_path) == before  # nothing to train: the grid was done, nothing rewritten
    assert {"device", "mixed_precision", "grad_accum"} <= set(RUN_TIME_KEYS)


@pytest.mark.slow
@pytest.mark.parametrize(("flags", "key"), [
    (["--steps", "20"], "proxy.steps=10, not 20"),
    (["--model-arg", "n_layer=1"], "proxy.model_args="),
    (["--set", "proxy.eval_batches=2"], "proxy.eval_batches=1, not 2"),
    (["--set", "proxy.seed=3"], "proxy.seed=0, not 3"),
    (["--repeats", "2"], "repeats=1, not 2"),
    # Rule: what changes how a trial is judged or what it is compared with is refused too.
    (["--set", "pruner.max_logit_factor=20"], "pruner.max_logit_factor=10.0, not 20.0; how a trial is "
                                              "judged (which trials are pruned as unstable) cannot change"),
    (["--set", "pruner.loss=median"], "pruner.loss={'type': 'none'}, not {'type': 'median'}"),
    (["--set", "baselines=[muon]"], "baselines=[], not ['muon']; what the assignments are compared with"),
    (["--set", "max_repeats=3"], "max_repeats=None, not 3; how many seeds a contender gets"),
])
def test_a_change_of_what_a_trial_measures_is_one_line_exit_2_study_unchanged(flags, key, fake,
                                                                            tmp_path, capsys):
    assert main(_command(tmp_path)) == 0
    capsys.readouterr()
    before = _stored(tmp_path)
    assert main(_command(tmp_path, *flags)) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("geosearch search: error: ") and key in lines[0]
    assert _stored(tmp_path) == before


@pytest.mark.slow
def test_the_budget_and_the_sampler_may_change_with_a_note_each(fake, tmp_path, capsys):
    assert main(_command(tmp_path)) == 0
    capsys.readouterr()
    assert main(_command(tmp_path, "--trials", "3", "--seed", "7", "--set", "budget.timeout=600")) == 0
    notes = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("note: ")]
    # Rule: every changed setting that does not change verdicts is one line, naming it.
    assert notes == [
        "note: study 't' was created with budget.trials=None; this run uses 3 (how long the study runs, "
        "not what a trial measures)",
        "note: study 't' was created with budget.timeout=None; this run uses 600.0 (how long the study "
        "runs, not what a trial measures)",
        "note: study 't' was created with sampler.seed=0; this run uses 7 (which points are proposed "
        "next, not how a trial is judged)"]


def test_every_key_of_a_space_is_classified_once_and_documented():
    d = make_space().to_dict()
    keys = {f"{k}.{sub}" if k in ("proxy", "budget", "pruner", "sampler") else k
            for k, v in d.items() for sub in (v if k in ("proxy", "budget", "pruner", "sampler") else [None])}
    # Rule: every key is refused (it changes verdicts) or noted; none is taken silently.
    assert keys - set(NOT_COMPARED) == set(ON_RESUME)
    assert [k for k, r in ON_RESUME.items() if not r.refused] == [
        *(f"proxy.{k}" for k in RUN_TIME_KEYS), "budget.trials", "budget.timeout", "sampler.type",
        "sampler.seed", "sampler.n_startup_trials"]
    # Rule: docs/design.md shows this table (the proxy's measured fields in one row).
    rows, proxy_row = [], False
    for key, r in ON_RESUME.items():
        if key.startswith("proxy.") and key[len("proxy."):] not in RUN_TIME_KEYS:
            if proxy_row:
                continue
            proxy_row, shown = True, "`proxy.*`, every field but the five below"
        else:
            shown = f"`{key}`"
        rows.append(f"| {shown} | {'refused (changes verdicts)' if r.refused else 'may change (noted)'} | {r.why} |")
    text = (Path(__file__).resolve().parents[3] / "docs" / "design.md").read_text(encoding="utf-8")
    start = text.index("| key | on resume | what it is |")
    assert text[start:].split("\n\n")[0].splitlines()[2:] == rows


@pytest.mark.slow
def test_a_smaller_batch_is_refused_with_the_grad_accum_that_keeps_it(fake, tmp_path):
    search(make_space(proxy={**TINY_PROXY, "batch_size": 8}), tmp_path)
    with pytest.raises(ConfigError) as e:
        search(make_space(proxy={**TINY_PROXY, "batch_size": 3}), tmp_path)
    assert e.value.key == "proxy.batch_size"
    assert ("created with proxy.batch_size=8, not 3; the batch is part of what a trial measures: "
            "to use less memory, keep it and split it (--batch-size 8 --grad-accum 4, i.e. "
            "proxy.grad_accum=4, trains micro-batches of 2 with the same effective batch of 8)"
            ) in str(e.value)
    # and that advice resumes the study
    search(make_space(proxy={**TINY_PROXY, "batch_size": 8, "grad_accum": 4}), tmp_path)
    assert len(trials_of(tmp_path)) == 2


# --------------------------------------------------------------------------- preflight on resume
GRID4 = {"attn": ["adamw", "euclidean"], "mlp": ["adamw", "euclidean"]}


def _study_files(run):
    """Every file of the run directory with its size and modification time."""
    return {str(p.relative_to(run)): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in sorted(run.rglob("*")) if p.is_file()}


def _everything(tmp_path):
    """The study as stored: its attrs, and each trial's state, value, params and attrs."""
    study = open_run_study(tmp_path / "runs" / "t")
    return study.user_attrs, [(t.number, t.state, t.value, t.params, t.user_attrs) for t in study.get_trials()]


@pytest.mark.slow
@pytest.mark.parametrize("flags", [
    ["--grad-accum", "3"],                # the batch of 4 does not split into 3 micro-batches
    ["--mixed-precision", "fp16"],        # the proxy's device is cpu
    ["--log-with", "nosuchtracker"],
])
def test_a_bad_run_time_flag_on_a_resumed_study_is_refused_before_any_trial(flags, monkeypatch,
                                                                              tmp_path, capsys):
    # A first run trains one point of four, then is stopped by Ctrl-C on the second: three
    # points are left pending (the interrupted one queued again, two never started).
    f = use_train(monkeypatch, FakeTrain(raises=lambda key, seed: KeyboardInterrupt() if len(f.calls) == 2 else None))
    space = make_space(GRID4, proxy={**TINY_PROXY, "batch_size": 4})
    path = tmp_path / "space.yaml"
    path.write_text(yaml.safe_dump(space.to_dict()), encoding="utf-8")
    command = ["search", "--space", str(path), "--runs-dir", str(tmp_path / "runs")]
    with pytest.raises(KeyboardInterrupt):
        search(space, tmp_path)
    pending = [t.number for t in trials_of(tmp_path) if t.state == optuna.trial.TrialState.WAITING]
    assert len(pending) == 3
    before, files = _everything(tmp_path), _study_files(tmp_path / "runs" / "t")
    capsys.readouterr()

    # Rule: the flags a resumed study may change are checked as a new study's: one line,
    # exit 2, before the storage is opened: no trial asked, nothing written.
    fixed = use_train(monkeypatch, FakeTrain())
    assert main([*command, *flags]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    where = {"--grad-accum": f"overrides of {path}: proxy.grad_accum",
             "--mixed-precision": f"overrides of {path}: proxy.mixed_precision",
             "--log-with": "--log-with"}[flags[0]]  # a tracker error names the flag typed
    assert len(lines) == 1 and lines[0].startswith(f"geosearch search: error: {where}: ")
    assert "expected one of: " in lines[0]
    assert fixed.calls == []
    assert _everything(tmp_path) == before and _study_files(tmp_path / "runs" / "t") == files

    # ... and the corrected command trains the pending points, each once.
    assert main(command) == 0
    trials = trials_of(tmp_path)
    assert len(fixed.calls) == 3
    complete = sorted(tuple(sorted(t.params.items())) for t in trials if t.state == optuna.trial.TrialState.COMPLETE)
    assert len(complete) == 4 and len(set(complete)) == 4
    assert not [t for t in trials if t.state == optuna.trial.TrialState.WAITING]
    assert [t.user_attrs["status"] for t in trials if t.state == optuna.trial.TrialState.FAIL] == ["interrupted"]


# --------------------------------------------------------------------------- the data's contents
def _token_space(tmp_path, **proxy):
    """A space whose proxy trains on a nanoGPT token directory ``tok`` (no meta file: its
    vocabulary from ``proxy.vocab_size``), and its command line."""
    tok = tmp_path / "tok"
    tok.mkdir(exist_ok=True)
    np.tile(np.arange(300, dtype=np.uint16), 2).tofile(tok / "train.bin")
    np.arange(100, dtype=np.uint16).tofile(tok / "val.bin")
    space = make_space(proxy={**TINY_PROXY, "data": str(tok), "vocab_size": 300, **proxy})
    path = tmp_path / "space.yaml"
    path.write_text(yaml.safe_dump(space.to_dict()), encoding="utf-8")
    return tok, ["search", "--space", str(path), "--runs-dir", str(tmp_path / "runs")]


@pytest.mark.slow
def test_a_study_refuses_to_resume_on_data_whose_contents_changed(fake, tmp_path, capsys):
    tok, command = _token_space(tmp_path)
    assert main(command) == 0
    capsys.readouterr()
    # Rule: the study records the SHA-256 of each file it trains on.
    digest = open_run_study(tmp_path / "runs" / "t").user_attrs[DATA_DIGEST]
    assert digest["data"]["each"]["val.bin"] == hashlib.sha256((tok / "val.bin").read_bytes()).hexdigest()
    assert digest["tokenizer"] is None
    before = _everything(tmp_path)
    original = (tok / "val.bin").read_bytes()
    (tok / "val.bin").write_bytes(original[:-2] + np.array([7], dtype=np.uint16).tobytes())  # one id edited
    # Rule: the same path with other contents is refused as a change of what a trial measures:
    # one line naming the file, both hashes, exit 2, the study untouched.
    assert main([*command, "--trials", "3"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    new_sha = hashlib.sha256((tok / "val.bin").read_bytes()).hexdigest()
    old_sha = digest["data"]["each"]["val.bin"]
    assert new_sha != old_sha
    assert lines == [
        f"geosearch search: error: {tmp_path / 'runs' / 't'}: proxy.data: study 't' was created on other "
        f"contents of {tok / 'val.bin'} (sha256 {old_sha[:12]}..., now {new_sha[:12]}...); the text or token "
        "ids a trial trains and is validated on cannot change on resume: restore the study's files to resume "
        "it, or start a new study with --study NAME"]
    assert _everything(tmp_path) == before
    # Rule: a file added beside them is not read (not part of the data); restored, it resumes.
    (tok / "val.bin").write_bytes(original)
    (tok / "notes.txt").write_text("mine")
    assert main([*command, "--trials", "3"]) == 0


@pytest.mark.slow
def test_a_study_of_an_earlier_build_is_refused_in_one_line(fake, tmp_path, capsys):
    tok, command = _token_space(tmp_path)
    assert main(command) == 0
    study = open_run_study(tmp_path / "runs" / "t")
    study.set_user_attr(DATA_DIGEST, None)  # as an earlier build left it: no data recorded
    before = _everything(tmp_path)
    capsys.readouterr()
    # Rule: this build does not resume it: one line naming what it lacks, exit 2, nothing
    # written.
    assert main([*command, "--trials", "3"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "written by an earlier build of geosearch" in err
    assert "records no data_digest" in err and "--study NAME" in err
    assert _everything(tmp_path) == before


def test_the_table_of_changed_files_is_documented():
    # Rule: docs/design.md shows ON_CHANGED_FILES, row for row, and each names a key of the space.
    assert set(ON_CHANGED_FILES) <= set(ON_RESUME)
    rows = [f"| `{key}` | {'refused (changes verdicts)' if r.refused else 'may change (noted)'} | {r.why} |"
            for key, r in ON_CHANGED_FILES.items()]
    text = (Path(__file__).resolve().parents[3] / "docs" / "design.md").read_text(encoding="utf-8")
    start = text.index("| key | its files' contents on resume | what they are |")
    assert text[start:].split("\n\n")[0].splitlines()[2:] == rows


# --------------------------------------------------------------------------- the preflight
USER_MODEL = Path(__file__).resolve().parents[2] / "_user_model.py"
USER_RULES = [{"type": "attn_qkv", "pattern": r"\.mix\.qkv\.weight$", "family": "attn"},
              {"type": "attn_out", "pattern": r"\.mix\.out\.weight$", "family": "attn"},
              {"type": "mlp_in", "pattern": r"\.ff\.up\.weight$", "family": "mlp"},
              {"type": "mlp_out", "pattern": r"\.ff\.down\.weight$", "family": "mlp"}]


def test_preflight_splits_the_batch_over_the_processes_of_a_launch():
    preflight(make_space(proxy={**TINY_PROXY, "batch_size": 4, "grad_accum": 2}), processes=2)
    # Rule: each process's rows must split into grad_accum micro-batches.
    with pytest.raises(SettingsError, match=r"^test space: proxy.grad_accum: global batch 4 does not split "
                                            r"over 2 processes x 4 micro-batches; expected one of: 1, 2$"):
        preflight(make_space(proxy={**TINY_PROXY, "batch_size": 4, "grad_accum": 4}), processes=2)


def test_preflight_says_when_a_run_takes_an_hour_or_more(monkeypatch):
    from geosearch.models import memory

    lines = []
    preflight(make_space(proxy=TINY_PROXY), echo=lines.append)
    assert lines == []  # the tiny proxy: seconds
    # Rule: a run estimated at an hour or more (its FLOPs at the device's measured rate) is
    # one note before any trial; the search goes on (the user may mean it).
    monkeypatch.setattr(memory, "matmul_rate", lambda device: 1.0)  # one FLOP a second
    preflight(make_space(proxy=TINY_PROXY), echo=lines.append)
    (line,) = lines
    assert line.startswith("note: one run of 'tiny' takes at least ") and "Ctrl-C stops it" in line


def test_preflight_runs_a_py_model_for_real_when_its_forward_cannot_run_on_the_meta_device():
    def space(factory):
        return make_space(rules=USER_RULES, proxy={**TINY_PROXY, "model": f"py:{USER_MODEL}:{factory}"})

    preflight(space("checked"))  # keeps the contract: built for real on the CPU, it passes
    # Rule: a py: model whose logits are not the data's vocabulary is refused before any
    # trial, naming the space's key, even when only a real forward can show it.
    with pytest.raises(SettingsError, match=r"^test space: proxy.model: model 'py:.*checked_ignores_vocab': "
                                            r"forward\(idx\) returned logits of shape \(2, 128, 100\), "
                                            r"expected \(2, 128, 256\)"):
        preflight(space("checked_ignores_vocab"))
