"""The models a run can train: the proxy GPT-2 (:mod:`.model`), Hugging Face causal LMs
(:mod:`.hf_configs`, random weights, offline) and a user's own ``nn.Module`` (``py:``),
named by a model spec (:mod:`.specs`, torch-free) and built by :mod:`.zoo`, which also
finds each model's query/key source (:mod:`.qk`) and its logits and loss (:mod:`.lm`).

Names are imported on first use, so ``geosearch.models.specs`` loads without torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from geosearch.util.lazy import lazy_getattr

_EXPORTS = {
    **dict.fromkeys(["PRESETS", "model_spec_names"], "geosearch.models.specs"),
    **dict.fromkeys(["GPT", "CausalSelfAttention", "GPTConfig", "make_config"], "geosearch.models.model"),
    **dict.fromkeys(["LayerQK", "detect_qk_source", "qk_capture"], "geosearch.models.qk"),
    **dict.fromkeys(["BuiltModel", "build_meta_model", "build_model", "check_model_spec", "default_rules"],
                    "geosearch.models.zoo"),
    **dict.fromkeys(["lm_logits", "lm_loss"], "geosearch.models.lm"),
}

__all__ = sorted(_EXPORTS)

__getattr__ = lazy_getattr(__name__, _EXPORTS)


if TYPE_CHECKING:  # pragma: no cover
    from geosearch.models.lm import lm_logits, lm_loss
    from geosearch.models.model import GPT, CausalSelfAttention, GPTConfig, make_config
    from geosearch.models.qk import LayerQK, detect_qk_source, qk_capture
    from geosearch.models.specs import PRESETS, model_spec_names
    from geosearch.models.zoo import BuiltModel, build_meta_model, build_model, check_model_spec, default_rules
