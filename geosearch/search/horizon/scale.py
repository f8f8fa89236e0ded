"""A model's logit scale d_model/√d_head: the Stiefel bound the pruner's threshold and forecast
scale with (:func:`~geosearch.search.horizon.forecast.stiefel_logit_bound`), read from the model
built on the meta device (the only use of torch in the horizon, imported on first use)."""

from __future__ import annotations

from typing import Any

from geosearch.util.checks import is_whole
from geosearch.search.horizon.forecast import stiefel_logit_bound

__all__ = ["model_logit_scale"]


def model_logit_scale(model: str, model_args: dict[str, Any] | None = None) -> float | None:
    """d_model/√d_head of a model spec (:func:`~geosearch.search.horizon.forecast.stiefel_logit_bound`),
    read from its config once built on the meta device; ``None`` when the config does not
    say (a ``py:`` model).

    Raises:
        ConfigError: an unknown or bad model spec.
    """
    from geosearch.models.zoo import build_meta_model  # torch

    args = dict(model_args or {})
    vocab = args.get("vocab_size", 256)
    built = build_meta_model(model, vocab_size=vocab if is_whole(vocab) else 256, model_args=args,
                             for_data=False)
    if built.family == "nanogpt":
        width, heads, head_dim = built.config.get("n_embd"), built.config.get("n_head"), None
    else:
        config = getattr(built.model, "config", None)
        width, heads = getattr(config, "hidden_size", None), getattr(config, "num_attention_heads", None)
        head_dim = getattr(config, "head_dim", None)
    if not (is_whole(width) and is_whole(heads)) or width < 1 or heads < 1:
        return None
    return stiefel_logit_bound(width, head_dim if is_whole(head_dim) else max(1, width // heads))
