"""Tiny causal language models built from configs, and a local character tokenizer."""

from __future__ import annotations

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import (
    GPTNeoXConfig,
    GPTNeoXForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
    PretrainedConfig,
    PreTrainedModel,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2ForCausalLM,
)

from .tasks import ALPHABET

PAD, EOS = "<pad>", "</s>"

# name -> (hidden size, layers, attention heads, MLP width)
SIZES: dict[str, tuple[int, int, int, int]] = {
    "xs": (24, 2, 2, 48),
    "s": (48, 2, 4, 128),
    "m": (80, 3, 4, 192),
    "l": (112, 3, 4, 320),
}
# supervised warm-up learning rate, the same for every size so that size is not confounded with it
WARMUP_LR = 2e-3
FAMILIES = ("llama", "qwen2", "gpt_neox")


def build_tokenizer() -> PreTrainedTokenizerFast:
    """Character-level tokenizer over the task alphabet with pad and EOS tokens."""
    vocab = {PAD: 0, EOS: 1, **{ch: i + 2 for i, ch in enumerate(ALPHABET)}}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=PAD))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token=PAD, eos_token=EOS, padding_side="left")


def build_config(family: str, size: str, vocab_size: int) -> PretrainedConfig:
    """Config of a ``family`` model at ``size`` (see ``SIZES``)."""
    d, layers, heads, ff = SIZES[size]
    common = dict(vocab_size=vocab_size, hidden_size=d, num_hidden_layers=layers, num_attention_heads=heads,
                  intermediate_size=ff, max_position_embeddings=64, pad_token_id=0, eos_token_id=1, bos_token_id=1,
                  tie_word_embeddings=True)
    if family == "llama":
        return LlamaConfig(**common, num_key_value_heads=heads)
    if family == "qwen2":
        return Qwen2Config(**common, num_key_value_heads=max(1, heads // 2))
    if family == "gpt_neox":
        return GPTNeoXConfig(**common, hidden_act="gelu", use_parallel_residual=True, rotary_pct=0.5)
    raise ValueError(f"unknown family {family!r}; choose from {FAMILIES}")


_CLASSES = {"llama": LlamaForCausalLM, "qwen2": Qwen2ForCausalLM, "gpt_neox": GPTNeoXForCausalLM}


def build_model(family: str, size: str, vocab_size: int, seed: int) -> PreTrainedModel:
    """Randomly initialised causal LM of ``family`` at ``size``, seeded."""
    torch.manual_seed(seed)
    model = _CLASSES[family](build_config(family, size, vocab_size))
    model.generation_config.pad_token_id = 0
    model.generation_config.eos_token_id = 1
    model.generation_config.bos_token_id = 1
    return model


def count_params(model: PreTrainedModel) -> tuple[int, int]:
    """Total and non-embedding parameter counts (tied weights counted once)."""
    total = sum(p.numel() for p in model.parameters())
    emb = sum(p.numel() for p in model.get_input_embeddings().parameters())
    return total, total - emb
