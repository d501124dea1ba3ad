"""A trainer model's size in parameters, whether this process holds it whole or only a shard of it.

The callback forecasts with the model's size as a covariate. Under DeepSpeed ZeRO-3 or FSDP a
parameter's ``numel()`` is this process's shard (under ZeRO-3, 0), so :func:`parameter_count` counts
only whole parameters and otherwise estimates the size from the model's config.
"""

from __future__ import annotations

import numbers
from typing import Any


def _sharded(model: Any) -> bool:
    """True when this process holds only a shard of the model's parameters (DeepSpeed ZeRO-3, FSDP)."""
    try:
        from transformers.integrations import is_deepspeed_zero3_enabled

        if is_deepspeed_zero3_enabled():
            return True
    except ImportError:
        pass
    if any(hasattr(p, "ds_numel") or p.numel() == 0 or type(p).__name__ == "DTensor" for p in model.parameters()):
        return True  # ZeRO-3 leaves an empty placeholder; FSDP2 a DTensor
    modules = model.modules() if callable(getattr(model, "modules", None)) else []
    return any(type(m).__name__ == "FullyShardedDataParallel" or type(m).__name__.startswith("FSDP") for m in modules)


def parameter_count(model: Any) -> float | None:
    """The model's parameter count: counted when this process holds whole parameters, else estimated from its config.

    A sharded parameter's ``numel()`` is the size of this process's shard (under ZeRO-3, 0), not the
    parameter's; the config's dimensions give the whole model's size there (None when they are missing
    and no full size is recorded on the parameters).
    """
    if not _sharded(model):
        counter = getattr(model, "num_parameters", None)
        return float(counter() if callable(counter) else sum(p.numel() for p in model.parameters()))
    estimate = _config_parameter_count(getattr(model, "config", None))
    if estimate is not None:
        return estimate
    full = sum(getattr(p, "ds_numel", 0) for p in model.parameters())  # ZeRO-3 records each parameter's full size
    return float(full) if full else None


def _dimension(config: Any, *names: str) -> int | None:
    for name in names:
        value = getattr(config, name, None)
        if isinstance(value, numbers.Integral) and not isinstance(value, bool) and value > 0:
            return int(value)
    return None


def _config_parameter_count(config: Any) -> float | None:
    """Estimate a decoder language model's parameter count from its config (None when its dimensions are missing).

    Embeddings (and an untied output layer), per layer the attention (grouped-query heads and
    ``head_dim`` included) and the MLP (gated for SiLU-style activations; mixture-of-experts
    counted whole), and the norms. Exact for Llama-like models; an estimate for others.
    """
    if config is None:
        return None
    get_text_config = getattr(config, "get_text_config", None)
    if callable(get_text_config):
        try:
            config = get_text_config(decoder=True) or config
        except Exception:  # noqa: BLE001, S110 - an older or unusual config: use it as it is
            pass
    hidden = _dimension(config, "hidden_size", "n_embd", "d_model")
    layers = _dimension(config, "num_hidden_layers", "n_layer", "num_layers")
    vocab = _dimension(config, "vocab_size")
    if hidden is None or layers is None or vocab is None:
        return None
    heads = _dimension(config, "num_attention_heads", "n_head") or 1
    kv_heads = _dimension(config, "num_key_value_heads") or heads
    head_dim = _dimension(config, "head_dim") or hidden // heads
    attention = hidden * head_dim * (2 * heads + 2 * kv_heads)  # q and o, k and v
    if getattr(config, "attention_bias", False) or getattr(config, "qkv_bias", False):
        attention += head_dim * (heads + 2 * kv_heads)
    activation = str(getattr(config, "hidden_act", None) or getattr(config, "hidden_activation", None) or "")
    gated = activation in ("silu", "swish", "swiglu") or str(getattr(config, "model_type", "")).startswith("gemma")
    intermediate = _dimension(config, "intermediate_size", "n_inner", "ffn_dim") or 4 * hidden
    experts = _dimension(config, "num_local_experts", "num_experts", "n_routed_experts")
    if experts:
        expert_size = _dimension(config, "moe_intermediate_size") or intermediate
        shared = _dimension(config, "n_shared_experts") or 0
        mlp = (experts + shared) * 3 * hidden * expert_size + experts * hidden  # the experts and the router
    else:
        mlp = (3 if gated else 2) * hidden * intermediate
    embeddings = vocab * hidden * (1 if getattr(config, "tie_word_embeddings", False) else 2)
    return float(layers * (attention + mlp + 2 * hidden) + embeddings + hidden)
