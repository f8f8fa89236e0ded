"""Tests of geosearch.cli.train: ``geosearch train``'s flags and their messages."""

from __future__ import annotations

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
