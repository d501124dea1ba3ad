"""PlateauStoppingCallback inside a real tiny TRL GRPOTrainer run on CPU."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from datasets import Dataset
from transformers import LlamaConfig, LlamaForCausalLM, set_seed
from trl import GRPOConfig, GRPOTrainer

import bayes_grpo as bg
from bayes_grpo.callback import GAIN_KEY, PROBABILITY_KEY, PlateauStoppingCallback
from bayes_grpo.errors import ModelError

_spec = importlib.util.spec_from_file_location("make_trl_fixture", Path(__file__).parent / "fixtures" / "make_trl_fixture.py")
_fixture = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_fixture)  # type: ignore[union-attr]

MAX_STEPS = 40


def _model_or_skip() -> bg.FittedModel:
    try:
        return bg.default_model()
    except ModelError as exc:
        pytest.skip(f"no shipped default model yet ({exc})")


def _train(reward_func, callback: PlateauStoppingCallback, tmp_path: Path, max_steps: int = MAX_STEPS) -> GRPOTrainer:
    """A tiny GRPOTrainer run (2-layer Llama from a config, local char tokenizer) with ``callback``."""
    set_seed(0)
    torch.manual_seed(0)
    tokenizer = _fixture.build_tokenizer()
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64,
        pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
    )
    args = GRPOConfig(
        output_dir=str(tmp_path), max_steps=max_steps, per_device_train_batch_size=4, num_generations=4,
        max_completion_length=4, learning_rate=1e-3, logging_steps=1, save_strategy="no", report_to="none",
        use_cpu=True, bf16=False, seed=0, disable_tqdm=True,
    )
    trainer = GRPOTrainer(
        model=LlamaForCausalLM(config), reward_funcs=[reward_func], args=args,
        train_dataset=Dataset.from_dict({"prompt": [f"what is {a} + {b} ?" for a in range(4) for b in range(4)]}),
        processing_class=tokenizer, callbacks=[callback],
    )
    with contextlib.redirect_stdout(io.StringIO()):
        trainer.train()
    return trainer


def flat_reward() -> object:
    """Noise around a constant level: a run that has plateaued from the start."""
    rng = np.random.default_rng(0)

    def reward(completions: list[str], **_: object) -> list[float]:
        return list(0.5 + 0.05 * rng.standard_normal(len(completions)))

    return reward


def rising_reward() -> object:
    """A reward that climbs steadily with every trainer step (a closure counting calls)."""
    calls = [0]

    def reward(completions: list[str], **_: object) -> list[float]:
        calls[0] += 1
        return [0.02 * calls[0] for _ in completions]

    return reward


def test_stops_a_plateaued_run_early_and_logs_its_keys(tmp_path: Path) -> None:
    # A looser rule than the defaults so that 40 tiny steps are enough evidence of a plateau.
    callback = PlateauStoppingCallback(_model_or_skip(), threshold=0.75, tolerance=0.05, check_every=5, min_fraction=0.25, verbose=False)
    trainer = _train(flat_reward(), callback, tmp_path)
    assert callback.stopped_at is not None and trainer.state.global_step < MAX_STEPS
    assert callback.family == "llama" and 0 < callback.params_b < 1e-3
    logged = [e for e in trainer.state.log_history if PROBABILITY_KEY in e]
    assert logged and all(GAIN_KEY in e for e in logged)
    assert logged[-1][PROBABILITY_KEY] >= 0.75


def test_does_not_stop_a_rising_run(tmp_path: Path) -> None:
    callback = PlateauStoppingCallback(_model_or_skip(), threshold=0.75, tolerance=0.05, check_every=5, min_fraction=0.25, verbose=False)
    trainer = _train(rising_reward(), callback, tmp_path)
    assert callback.stopped_at is None and trainer.state.global_step == MAX_STEPS
    assert callback.decisions and all(not d.should_stop for d in callback.decisions if d.step < MAX_STEPS)
    assert any(PROBABILITY_KEY in e for e in trainer.state.log_history)


class _BrokenModel:
    def forecast(self, *args: object, **kwargs: object) -> None:
        raise RuntimeError("forecast exploded")


def test_a_broken_model_warns_and_training_goes_on(tmp_path: Path) -> None:
    callback = PlateauStoppingCallback(_BrokenModel(), check_every=2, min_fraction=0.0, verbose=False)  # type: ignore[arg-type]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer = _train(flat_reward(), callback, tmp_path, max_steps=8)
    assert trainer.state.global_step == 8
    assert any("forecast exploded" in str(w.message) for w in caught)
