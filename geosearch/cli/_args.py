"""What several commands of the ``geosearch`` command line share: help texts, flags and
the ``KEY=VALUE`` reader."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

MODEL_HELP = ("the model: a proxy preset (tiny, small, gpt2), hf:gpt2, hf:llama, hf:MODEL_TYPE (e.g. "
              "hf:mistral, hf:qwen2, hf:gemma, hf:phi3) or hf:PATH (a directory with config.json) (Hugging Face, "
              "random weights, no download), or py:MODULE:FACTORY (your own nn.Module)")
MODEL_ARG_HELP = ("override a model field, e.g. n_layer=2 (presets, hf:gpt2), num_hidden_layers=2 "
                  "(hf:llama), block_size=64 (any); repeatable")
RULES_DEFAULT = ("nanogpt for the presets, gpt2 for hf:gpt2, llama for hf:llama; for other hf: models the "
                 "registered rule set that fits, else rules read off their module names")
VOCAB_HELP = ("the data's vocabulary size, for train.bin/val.bin token files that name none (nanoGPT's "
              "openwebtext: 50257, GPT-2 ids; default: meta.json or meta.pkl, the tokenizer's, else "
              "--model-arg vocab_size); token ids must be below it")
TOKENIZER_HELP = ("a Hugging Face tokenizer.json (or a directory holding one) to encode the text with; "
                  "the vocabulary size is then the tokenizer's")


def key_values(items: Sequence[str], flag: str) -> dict:
    """``KEY=VALUE`` flags as a dict, each value read as YAML (numbers, booleans, null;
    :func:`geosearch.util.yaml_io.parse_value`)."""
    from geosearch.util.errors import ConfigError
    from geosearch.util.yaml_io import parse_value

    out = {}
    for item in items:
        key, eq, value = item.partition("=")
        if not eq or not key.strip():
            raise ConfigError(f"expected KEY=VALUE but got {item!r}", source=flag)
        out[key.strip()] = parse_value(value, source=f"{flag} {key.strip()}")
    return out


def add_knobs(p: argparse.ArgumentParser) -> None:
    """The training flags ``train`` and ``search`` share (TrainConfig fields)."""
    p.add_argument("--mixed-precision", metavar="{no,bf16,fp16}",
                   help="default: Accelerate's configuration (accelerate launch --mixed_precision, "
                        "accelerate config), else no; fp16 needs CUDA")
    p.add_argument("--grad-accum", type=int, metavar="N",
                   help="split the global batch into N micro-batches per optimizer step (default 1)")
    p.add_argument("--compile", action="store_true", default=None,
                   help="torch.compile the model for the training steps")
    p.add_argument("--log-with", metavar="TRACKER[,TRACKER]",
                   help="log each run's records to Accelerate trackers (tensorboard, wandb, mlflow, "
                        "...), offline, under the run directory")


# --------------------------------------------------------------------------- argparse's errors
_TYPE_WORDS = {"int": "a whole number", "float": "a number"}


def parse_error_line(message: str, parser: argparse.ArgumentParser) -> str:
    """One of argparse's error messages said as the project's errors are: the flag first,
    then the problem and the values it takes, one problem, no usage dump.

    Example:
        >>> parse_error_line("argument --workers: invalid int value: 'x'",
        ...                  argparse.ArgumentParser())
        "--workers: expected a whole number, got 'x'"
    """
    import re

    from geosearch.util.errors import ConfigError

    m = re.fullmatch(r"argument (\S+): invalid (\w+) value: (.*)", message, re.S)
    if m:
        flag, kind, value = m.groups()
        return str(ConfigError(f"expected {_TYPE_WORDS.get(kind, kind)}, got {_cut(value)}",
                               source=flag))
    m = re.fullmatch(r"argument (\S+): invalid choice: (.*?) \(choose from (.*)\)", message, re.S)
    if m:
        flag, value, choices = m.groups()
        what = "command" if flag == "COMMAND" else "value"
        return str(ConfigError(f"unknown {what} {_cut(value)}",
                               source=None if flag == "COMMAND" else flag,
                               allowed=[c.strip(" '") for c in choices.split(",")]))
    m = re.fullmatch(r"argument (\S+): expected one argument", message)
    if m:
        return f"{m.group(1)}: expected a value after it"
    m = re.fullmatch(r"the following arguments are required: (.*)", message)
    if m:
        return f"{m.group(1).split(',')[0].strip()}: missing; see {parser.prog} --help"
    return _cut(" ".join(message.split()), 300)


def unknown_argument(extra: Sequence[str], parser: argparse.ArgumentParser) -> str:
    """The line for the first of the arguments argparse did not recognise: an unknown flag
    (with the flag meant, when one is close) or an argument too many."""
    import difflib

    from geosearch.util.errors import ConfigError

    first = extra[0]
    if not first.startswith("-") or first == "-":
        return f"unexpected argument {_cut(repr(first))}; see {parser.prog} --help"
    name = first.partition("=")[0]
    flags = [s for a in parser._actions if a.help != argparse.SUPPRESS
             for s in a.option_strings if s.startswith("--") and s != "--help"]
    close = difflib.get_close_matches(name, flags, n=1)
    if close:
        return f"{_cut(name)}: unknown flag; did you mean {close[0]}? (see {parser.prog} --help)"
    return str(ConfigError("unknown flag", source=_cut(name), allowed=flags))


def _cut(text: str, limit: int = 60) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."
