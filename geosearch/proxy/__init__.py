"""The proxy: a small GPT-2, its corpora, and the probes that watch it train.

A geometry search scores each assignment by a short pretraining run of this model (or
of a Hugging Face or user model, see :mod:`~geosearch.proxy.zoo`) in
:mod:`geosearch.proxy.train`; :mod:`~geosearch.proxy.probes` turns the run's attention
logits and weights into the instability signal the pruner reads.
"""

from geosearch.proxy.data import Corpus, clear_corpus_cache, get_batch, load_corpus
from geosearch.proxy.model import GPT, PRESETS, CausalSelfAttention, GPTConfig, make_config
from geosearch.proxy.probes import (
    ProbedWeight,
    WeightProbe,
    attention_stats,
    recording_qk,
    weight_stats,
)
# `train` itself stays in geosearch.proxy.train: re-exporting it here would shadow the module.
from geosearch.proxy.train import TrainConfig, TrainResult, get_accelerator
from geosearch.proxy.qk import LayerQK, detect_qk_source, qk_capture
from geosearch.proxy.zoo import (
    BuiltModel,
    build_meta_model,
    build_model,
    check_model_spec,
    default_rules,
    describe_parameters,
    lm_logits,
    lm_loss,
    model_spec_names,
)

__all__ = [
    "TrainConfig",
    "TrainResult",
    "get_accelerator",
    "GPT",
    "PRESETS",
    "BuiltModel",
    "CausalSelfAttention",
    "Corpus",
    "GPTConfig",
    "LayerQK",
    "ProbedWeight",
    "WeightProbe",
    "attention_stats",
    "build_meta_model",
    "build_model",
    "check_model_spec",
    "clear_corpus_cache",
    "default_rules",
    "describe_parameters",
    "detect_qk_source",
    "get_batch",
    "lm_logits",
    "lm_loss",
    "load_corpus",
    "make_config",
    "model_spec_names",
    "qk_capture",
    "recording_qk",
    "weight_stats",
]
