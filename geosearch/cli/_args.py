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
