"""Tests of geosearch.cli (the command and its parser)."""

from __future__ import annotations

from geosearch.cli import _dashes, build_parser


def test_every_dashed_flag_takes_the_underscore_spelling_too():
    parser = build_parser()
    args = parser.parse_args(_dashes(["train", "--assign", "attn=adamw,mlp=adamw", "--mixed_precision", "bf16",
                                      "--grad_accum=2", "--log_with", "tensorboard", "--spectral_lr", "0.05"]))
    assert (args.mixed_precision, args.grad_accum, args.log_with, args.spectral_lr) == ("bf16", 2, "tensorboard", 0.05)
    search = parser.parse_args(_dashes(["search", "--runs_dir", "r", "--max_retries", "1", "--target_steps", "9"]))
    assert (search.runs_dir, search.max_retries, search.target_steps) == ("r", 1, 9)
    # values, unknown flags and what follows "--" are left as they are
    assert _dashes(["--study", "a_b", "--no_such_flag", "--", "--runs_dir"]) == \
        ["--study", "a_b", "--no_such_flag", "--", "--runs_dir"]
