"""``py:MODULE:FACTORY`` models: a user's own ``nn.Module``, made by their factory.

:func:`plan_py` checks a ``py:`` spec (the module imports, the factory exists and takes the
arguments) and returns the build that calls the factory; see :mod:`geosearch.models.zoo`
for the contract a factory's model keeps.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import os
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from geosearch.models.built import SOURCE as _SOURCE
from geosearch.models.built import BuiltModel, check_vocab
from geosearch.models.qk import detect_qk_source
from geosearch.models.specs import DEFAULT_BLOCK_SIZE, PY_PREFIX, PY_SPEC_HELP, model_spec_names
from geosearch.util.errors import ConfigError, GeosearchError
from geosearch.util.yaml_io import plain

__all__ = ["one_line", "plan_py"]


def plan_py(spec: str, vocab_size: int, block_size: int | None,
            model_args: dict[str, Any]) -> Callable[[], BuiltModel]:
    target, colon, name = spec[len(PY_PREFIX):].rpartition(":")
    if not colon or not target or not name.isidentifier():
        raise ConfigError(f"model {spec!r}: expected {PY_SPEC_HELP}, e.g. py:mypackage.models:make_model",
                          source=_SOURCE, key="model", allowed=model_spec_names())
    module = _import(spec, target)
    factory = getattr(module, name, None)
    if not callable(factory):
        found = sorted(k for k, v in vars(module).items() if not k.startswith("_") and callable(v)
                       and getattr(v, "__module__", None) == module.__name__)
        raise ConfigError(f"model {spec!r}: module {target!r} has no factory {name!r}", source=_SOURCE,
                          key="model", allowed=found or None)
    kwargs = {"vocab_size": vocab_size, "block_size": block_size or DEFAULT_BLOCK_SIZE, **model_args}
    check_vocab(spec, vocab_size, kwargs["vocab_size"])
    try:
        signature = inspect.signature(factory)
    except (TypeError, ValueError):  # a builtin without a signature: let the call decide
        signature = None
    if signature is not None:
        try:
            signature.bind(**kwargs)
        except TypeError as e:
            raise ConfigError(f"model {spec!r}: {name}() does not take the arguments "
                              f"{', '.join(kwargs)} ({e})", source=_SOURCE, key="model_args",
                              allowed=list(signature.parameters)) from None

    def build() -> BuiltModel:
        try:
            model = factory(**kwargs)
        except GeosearchError:
            raise
        except Exception as e:  # noqa: BLE001 - the user's code: any error, as one line
            if torch.empty(0).is_meta:  # build_meta_model builds it again on the CPU
                raise
            raise ConfigError(f"model {spec!r}: {name}() raised {one_line(e)}", source=_SOURCE,
                              key="model") from e
        if not isinstance(model, nn.Module):
            raise ConfigError(f"model {spec!r}: {name}() returned a {type(model).__name__}, not a "
                              "torch.nn.Module", source=_SOURCE, key="model")
        vocab = kwargs["vocab_size"]
        return BuiltModel(model, spec, "py", None, int(kwargs["block_size"]), vocab, detect_qk_source(model),
                          {"factory": f"{target}:{name}", "kwargs": plain(kwargs)})
    return build


def _import(spec: str, target: str) -> Any:
    """The module ``target``: a dotted module name, or a ``.py`` file path.

    Raises:
        ConfigError: no such file or module, or its code fails on import (a syntax error,
            an exception): one line with the error's type and message.
    """
    if target.endswith(".py") or os.sep in target or "/" in target:
        if not os.path.isfile(target):
            raise ConfigError(f"model {spec!r}: no file {target!r}", source=_SOURCE, key="model")
        mod_name = "_geosearch_user_model_" + os.path.splitext(os.path.basename(target))[0]
        try:
            file_spec = importlib.util.spec_from_file_location(mod_name, target)
            module = importlib.util.module_from_spec(file_spec)
            file_spec.loader.exec_module(module)
        except Exception as e:  # noqa: BLE001 - the user's code: any error, as one line
            raise ConfigError(f"model {spec!r}: cannot import {target!r} ({one_line(e)})",
                              source=_SOURCE, key="model") from None
        return module
    try:
        return importlib.import_module(target)
    except ImportError as e:
        raise ConfigError(f"model {spec!r}: cannot import module {target!r} ({type(e).__name__}: {e}); "
                          "is it installed or on PYTHONPATH?", source=_SOURCE, key="model") from None
    except Exception as e:  # noqa: BLE001 - the module's own code failed on import
        raise ConfigError(f"model {spec!r}: cannot import module {target!r} ({one_line(e)})",
                          source=_SOURCE, key="model") from None


def one_line(e: BaseException, limit: int = 200) -> str:
    """``Type: message`` on one line, at most ``limit`` characters of message; a syntax
    error says where."""
    text = " ".join(str(e).split())
    if isinstance(e, SyntaxError) and e.lineno is not None:
        text = f"{' '.join(str(e.msg).split())} at line {e.lineno}"
    if len(text) > limit:
        text = text[:limit] + "..."
    return f"{type(e).__name__}: {text}" if text else type(e).__name__
