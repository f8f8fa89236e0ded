"""What ``geosearch train`` does once its flags are parsed: one proxy run, summarised.

:func:`train_once` builds the :class:`~geosearch.proxy.config.TrainConfig` from a YAML file
and the command-line fields over it, reads the assignment (inline, in the module types of
the model's rule set, or from a file), trains once and prints the run's summary; its return
value is the command's exit code. The command line (:mod:`geosearch.cli`) only parses flags
and calls it.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from typing import Any

from geosearch.assignment import Assignment, load_assignment
from geosearch.errors import ConfigError
from geosearch.proxy.accelerator import check_device
from geosearch.proxy.config import TrainConfig
from geosearch.proxy.specs import default_rules
from geosearch.proxy.train import get_accelerator, train
from geosearch.yaml_io import load_yaml


def train_once(*, config_file: str | os.PathLike | None, fields: Mapping[str, Any],
               model_args: Mapping[str, Any], assign: str | None, assignment_file: str | None,
               rules: str | None, out: str | None, progress: bool) -> int:
    """Train the proxy once, as ``geosearch train`` does, and print the summary.

    Args:
        config_file: YAML of :class:`~geosearch.proxy.config.TrainConfig` fields, or None.
        fields: TrainConfig fields given on the command line; they override the file's.
        model_args: model fields (``--model-arg``), merged over the file's ``model_args``.
        assign: an inline assignment (``"attn=stiefel,mlp=dgram"``), or None.
        assignment_file: an assignment YAML file, when ``assign`` is None.
        rules: the rule set ``assign``'s module types refer to; None = the model's
            (``nanogpt`` for ``py:`` models). Only with ``assign``.
        out: the run directory, or None.
        progress: show progress on stderr.

    Returns:
        0 when the run completed, 1 when it ended unstable or failed.

    Raises:
        ConfigError: an unreadable config file, a bad field, an unknown module type or
            geometry, ``rules`` with an assignment file (before anything is trained).
    """
    config = _config(config_file, fields, model_args)
    if config.log_with and not out:
        raise ConfigError("the trackers write their files under the run directory: add --out DIR",
                          source="--log-with")
    if assign is not None:
        # the module types of --assign are the model's (hf:llama: attn_q, ..., mlp_gate)
        assignment = Assignment.parse(assign, rules=rules or default_rules(config.model, config.model_args) or "nanogpt")
        source = "--assign"
    else:
        if rules is not None:
            raise ConfigError("--rules goes with --assign; an assignment file names its own rules",
                              source="--rules")
        assignment = load_assignment(assignment_file)
        source = assignment_file
    assignment.resolve()  # unknown types or geometries fail here, before any work

    flag = "device" in fields  # else the config file's, or the default
    check_device(config.device, source="--device" if flag else os.fspath(config_file or "--config"),
                 key=None if flag else "device")
    main_process = get_accelerator(config.device, config.mixed_precision).is_main_process
    if main_process:
        print(f"training {config.model} with {source}: "
              + ", ".join(f"{t}={g}" for t, g in assignment.resolve().items()), file=sys.stderr)
    result = train(config, assignment, out_dir=out, progress=progress)
    if not main_process:
        return 0 if result.status == "completed" else 1
    print(result.summary())
    if out:
        print(f"files       {out}/config.yaml, metrics.jsonl, result.json")
    return 0 if result.status == "completed" else 1


def _config(config_file: str | os.PathLike | None, fields: Mapping[str, Any],
            model_args: Mapping[str, Any]) -> TrainConfig:
    """The file's fields, the command line's over them."""
    merged: Any = {}
    if config_file:
        merged = load_yaml(config_file, what="a mapping of TrainConfig fields", default={})
    source = os.fspath(config_file) if config_file else "command line"
    if not isinstance(merged, dict):
        return TrainConfig.from_dict(merged, source=source)  # says it must be a mapping
    merged.update(fields)
    if model_args:
        merged["model_args"] = {**(merged.get("model_args") or {}), **model_args}
    return TrainConfig.from_dict(merged, source=source)
