"""The proxy: a small GPT-2 (or any zoo model), its corpora, its trainer and the probes.

A geometry search scores each assignment by a short pretraining run of a model of
:mod:`~geosearch.proxy.zoo` in :mod:`geosearch.proxy.train`, set up by a
:class:`~geosearch.proxy.config.TrainConfig`; :mod:`~geosearch.proxy.probes` turns the run's
attention logits and weights into the instability signal the pruner reads. Names are
imported on first use, so that ``geosearch.proxy.config`` and ``geosearch.proxy.specs``
load without torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from geosearch.lazy import lazy_getattr

# name -> module that defines it. `train` itself stays in geosearch.proxy.train:
# re-exporting it here would shadow the module.
_EXPORTS = {
    **dict.fromkeys(["TrainConfig", "TrainResult"], "geosearch.proxy.config"),
    "get_accelerator": "geosearch.proxy.accelerator",
    **dict.fromkeys(["PRESETS", "default_rules", "model_spec_names"], "geosearch.proxy.specs"),
    **dict.fromkeys(["Corpus", "clear_corpus_cache", "get_batch", "load_corpus"],
                    "geosearch.proxy.data"),
    **dict.fromkeys(["GPT", "CausalSelfAttention", "GPTConfig", "make_config"],
                    "geosearch.proxy.model"),
    **dict.fromkeys(["ProbedWeight", "WeightProbe", "attention_stats", "recording_qk",
                     "weight_stats"], "geosearch.proxy.probes"),
    **dict.fromkeys(["LayerQK", "detect_qk_source", "qk_capture"], "geosearch.proxy.qk"),
    "QKClip": "geosearch.proxy.qkclip",
    **dict.fromkeys(["BuiltModel", "build_meta_model", "build_model", "check_model_spec"],
                    "geosearch.proxy.zoo"),
    **dict.fromkeys(["lm_logits", "lm_loss"], "geosearch.proxy.lm"),
}

__all__ = sorted(_EXPORTS)


__getattr__ = lazy_getattr(__name__, _EXPORTS)


if TYPE_CHECKING:  # pragma: no cover
    from geosearch.proxy.accelerator import get_accelerator
    from geosearch.proxy.config import TrainConfig, TrainResult
    from geosearch.proxy.data import Corpus, clear_corpus_cache, get_batch, load_corpus
    from geosearch.proxy.model import GPT, CausalSelfAttention, GPTConfig, make_config
    from geosearch.proxy.probes import (
        ProbedWeight,
        WeightProbe,
        attention_stats,
        recording_qk,
        weight_stats,
    )
    from geosearch.proxy.qk import LayerQK, detect_qk_source, qk_capture
    from geosearch.proxy.qkclip import QKClip
    from geosearch.proxy.specs import PRESETS, default_rules, model_spec_names
    from geosearch.proxy.lm import lm_logits, lm_loss
    from geosearch.proxy.zoo import BuiltModel, build_meta_model, build_model, check_model_spec
