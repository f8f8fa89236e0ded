"""What would fail every trial of a search, found before its study is touched; and the
digest of the data it trains on.

:func:`preflight` runs what :func:`geosearch.proxy.train.train` refuses, once, before any
trial: the run's settings on this machine (device, precision, trackers, the batch's
split), the data, the model (built on the meta device: its size against the device's
memory, one forward pass) and the rules on it. :func:`data_digest` hashes the files the
proxy trains on, which a study records and a resumed one must match
(:mod:`~geosearch.search.study.resume`). The rules are in ``docs/design.md`` ("The study").
"""

from __future__ import annotations

from typing import Any

from geosearch.util.errors import ConfigError
from geosearch.proxy.accelerator import check_device, check_precision
from geosearch.proxy.config import check_batch_split
from geosearch.search.space.spec import SearchSpace

__all__ = ["data_digest", "preflight"]


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


def preflight(space: SearchSpace, processes: int = 1) -> None:
    """Errors that would fail every trial, found before the study is touched.

    The run's settings, as :func:`geosearch.proxy.train.train` refuses them: a device this
    machine does not have, a mixed precision it cannot train in
    (:func:`~geosearch.proxy.accelerator.check_precision`), a tracker of ``log_with`` that is
    unknown or not installed, a global batch that does not split over ``processes`` x
    ``grad_accum`` micro-batches. Then the data, the model (a zoo spec, built on the meta
    device), a context the data cannot fill, one forward pass of the model
    (:func:`~geosearch.models.zoo.check_logits`: logits of the data's vocabulary; a ``py:``
    model whose forward cannot run on the meta device is built for real on the CPU for it),
    and rules that do not fit the model, match nothing or leave a hidden weight without a
    geometry: the plan (:func:`geosearch.plan.bind`) of the space's first assignment, with
    the proxy's optimizer settings. ``space.rules`` are the rules every trial's assignment
    carries: the space's, or the model's default rule set when the space names none.

    Args:
        space: the search space, flags applied.
        processes: the processes that train each trial (a data-parallel launch's world).

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
    from geosearch.models.memory import check_fits
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
    check_fits(built.model, proxy.model, device, source=where, key="proxy.model_args")
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
