"""The proxy run: its settings, corpora, trainer and probes, for any model of :mod:`geosearch.models`.

A geometry search scores each assignment by a short pretraining run of a model of
:mod:`~geosearch.models.zoo` in :mod:`geosearch.proxy.train`, set up by a
:class:`~geosearch.proxy.config.TrainConfig`; :mod:`~geosearch.proxy.probes` turns the run's
attention logits and weights into the instability signal the pruner reads. Names are
imported on first use, so that ``geosearch.proxy.config`` loads without torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from geosearch.util.lazy import lazy_getattr

# name -> module that defines it. `train` itself stays in geosearch.proxy.train:
# re-exporting it here would shadow the module.
_EXPORTS = {
    **dict.fromkeys(["TrainConfig", "TrainResult"], "geosearch.proxy.config"),
    "get_accelerator": "geosearch.proxy.accelerator",
    **dict.fromkeys(["Corpus", "clear_corpus_cache", "get_batch", "load_corpus"],
                    "geosearch.proxy.data"),
    **dict.fromkeys(["ProbedWeight", "WeightProbe", "attention_stats", "recording_qk",
                     "weight_stats"], "geosearch.proxy.probes"),
    "QKClip": "geosearch.proxy.qkclip",
}

__all__ = sorted(_EXPORTS)


__getattr__ = lazy_getattr(__name__, _EXPORTS)


if TYPE_CHECKING:  # pragma: no cover
    from geosearch.proxy.accelerator import get_accelerator
    from geosearch.proxy.config import TrainConfig, TrainResult
    from geosearch.proxy.data import Corpus, clear_corpus_cache, get_batch, load_corpus
    from geosearch.proxy.probes import (
        ProbedWeight,
        WeightProbe,
        attention_stats,
        recording_qk,
        weight_stats,
    )
    from geosearch.proxy.qkclip import QKClip
