"""Tests of geosearch.cli.train: ``geosearch train``'s flags and their messages."""

from __future__ import annotations

import pytest

from pathlib import Path

import numpy as np
import yaml

from geosearch.cli import main


def test_a_tracker_error_names_the_flag_that_asked_for_it(tmp_path, capsys):
    base = ["train", "--assign", "attn=adamw,mlp=adamw", "--model", "tiny", "--steps", "2",
            "--out", str(tmp_path / "out")]
    assert main([*base, "--log-with", "nosuchtracker"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("geosearch train: error: --log-with: unknown tracker 'nosuchtracker'; expected one of:")
    config = tmp_path / "c.yaml"
    config.write_text("log_with: [nosuchtracker]\n", encoding="utf-8")
    assert main([*base, "--config", str(config)]) == 2  # from a file: the file and its key
    assert f"{config}: log_with: unknown tracker" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()  # refused before the run directory is made


def _bare_tokens(directory: Path, top: int = 50257) -> Path:
    """A token directory as nanoGPT's openwebtext/prepare.py leaves it: uint16 GPT-2 ids in
    train.bin and val.bin, no meta file."""
    directory.mkdir()
    ids = np.random.default_rng(0).integers(0, top, size=600).astype(np.uint16)
    ids[0] = ids[-1] = top - 1  # the largest id occurs in both files
    ids[:500].tofile(directory / "train.bin")
    ids[500:].tofile(directory / "val.bin")
    return directory


@pytest.mark.slow
def test_a_bare_nanogpt_token_directory_trains_once_its_vocabulary_is_given(tmp_path, capsys):
    data = _bare_tokens(tmp_path / "owt")
    base = ["train", "--assign", "attn=adamw,mlp=euclidean", "--model", "tiny", "--device", "cpu", "--steps", "2",
            "--batch-size", "2", "--eval-every", "2", "--probe-every", "2", "--data", str(data), "--quiet"]
    # Rule: no vocabulary: one line naming the directory and the flags that give one, exit 2.
    assert main(base) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"geosearch train: error: {data}: vocab_size: no vocabulary size")
    assert "--vocab-size N" in err[0] and "--model-arg vocab_size=N" in err[0] and len(err[0]) <= 400
    # Rule: --vocab-size gives the data's vocabulary; the model's is the same.
    assert main([*base, "--vocab-size", "50257", "--out", str(tmp_path / "a")]) == 0, capsys.readouterr().err
    config = yaml.safe_load((tmp_path / "a" / "config.yaml").read_text())
    assert config["data"]["vocab_size"] == config["model"]["vocab_size"] == config["train"]["vocab_size"] == 50257
    # Rule: --model-arg vocab_size alone serves as both (nanoGPT's padded 50304)...
    assert main([*base, "--model-arg", "vocab_size=50304", "--out", str(tmp_path / "b")]) == 0
    config = yaml.safe_load((tmp_path / "b" / "config.yaml").read_text())
    assert config["data"]["vocab_size"] == config["model"]["vocab_size"] == 50304
    # ... and pads the model past the data's when both are given (a train config's key too).
    (tmp_path / "c.yaml").write_text("vocab_size: 50257\nmodel_args: {vocab_size: 50304}\n")
    assert main([*base, "--config", str(tmp_path / "c.yaml"), "--out", str(tmp_path / "c")]) == 0
    config = yaml.safe_load((tmp_path / "c" / "config.yaml").read_text())
    assert (config["data"]["vocab_size"], config["model"]["vocab_size"]) == (50257, 50304)
    capsys.readouterr()
    # Rule: ids at or above the vocabulary given are one line naming the file; a vocabulary
    # out of range is refused with the key and its range.
    assert main([*base, "--vocab-size", "50000"]) == 2
    assert capsys.readouterr().err.strip() == (
        f"geosearch train: error: {data / 'train.bin'}: vocab_size: holds token id 50256 but the vocabulary "
        "has 50000 ids (0..49999); give the data's vocabulary (--vocab-size, meta.json) or tokenizer")
    assert main([*base, "--vocab-size", "0"]) == 2
    assert capsys.readouterr().err.strip() == (
        "geosearch train: error: command line: vocab_size: expected a whole number in [1, 16,777,216] or null, "
        "got 0 (the data's vocabulary; null: its meta file's, its tokenizer's, or 256 for text)")
