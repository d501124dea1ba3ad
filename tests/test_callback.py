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
from hypothesis import given
from hypothesis import strategies as st
from transformers import LlamaConfig, LlamaForCausalLM, TrainerControl, TrainerState, set_seed
from trl import GRPOConfig, GRPOTrainer

import bayes_grpo as bg
from bayes_grpo.callback import BEATS_KEY, BEST_STEP_KEY, FINAL_KEYS, GAIN_KEY, PARETO_K_KEY, PLOT_KEY, PROBABILITY_KEY, TAKE_OFF_KEY, PlateauStoppingCallback
from bayes_grpo.errors import BayesGrpoError

_spec = importlib.util.spec_from_file_location("make_trl_fixture", Path(__file__).parent / "fixtures" / "make_trl_fixture.py")
_fixture = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_fixture)  # type: ignore[union-attr]

MAX_STEPS = 40


def _config(tmp_path: Path, max_steps: int, **overrides: object) -> GRPOConfig:
    options = dict(
        output_dir=str(tmp_path), max_steps=max_steps, per_device_train_batch_size=4, num_generations=4,
        max_completion_length=4, learning_rate=1e-3, logging_steps=1, save_strategy="no", report_to="none",
        use_cpu=True, bf16=False, seed=0, disable_tqdm=True,
    )  # fmt: skip
    options.update(overrides)
    return GRPOConfig(**options)


def _train(
    reward_func, callback: PlateauStoppingCallback, tmp_path: Path, max_steps: int = MAX_STEPS, attach: bool = False, **config: object
) -> GRPOTrainer:
    """A tiny GRPOTrainer run (1-layer Llama from a config, local char tokenizer) with ``callback`` (passed, or attached)."""
    set_seed(0)
    torch.manual_seed(0)
    tokenizer = _fixture.build_tokenizer()
    model_config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64,
        pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
    )  # fmt: skip
    trainer = GRPOTrainer(
        model=LlamaForCausalLM(model_config), reward_funcs=[reward_func], args=_config(tmp_path, max_steps, **config),
        train_dataset=Dataset.from_dict({"prompt": [f"what is {a} + {b} ?" for a in range(4) for b in range(4)]}),
        processing_class=tokenizer, callbacks=None if attach else [callback],
    )  # fmt: skip
    if attach:
        callback.attach(trainer)
    with contextlib.redirect_stdout(io.StringIO()):
        trainer.train()
    return trainer


def flat_reward() -> object:
    """Noise around a constant level: a run that has plateaued from the start."""
    rng = np.random.default_rng(0)

    def reward(completions: list[str], **_: object) -> list[float]:
        return list(0.5 + 0.05 * rng.standard_normal(len(completions)))

    return reward


def rising_reward(spread: float = 0.01) -> object:
    """A reward that climbs steadily with every trainer step (a closure counting calls); the completions of a
    step score ``spread`` apart, so GRPO has a signal to learn from (0: every completion scores the same)."""
    calls = [0]

    def reward(completions: list[str], **_: object) -> list[float]:
        calls[0] += 1
        return [0.02 * calls[0] + spread * (i % 2) for i, _ in enumerate(completions)]

    return reward


def peaked_reward(peak: int = 12) -> object:
    """Rises for ``peak`` trainer steps, then falls: the best checkpoint lies well before the end."""
    calls = [0]
    rng = np.random.default_rng(1)

    def reward(completions: list[str], **_: object) -> list[float]:
        calls[0] += 1
        level = 0.05 * min(calls[0], peak) - 0.03 * max(calls[0] - peak, 0)
        return list(level + 0.01 * rng.standard_normal(len(completions)))

    return reward


def test_stops_a_plateaued_run_early_and_logs_its_keys(tmp_path: Path) -> None:
    # A looser rule than the defaults so that 40 tiny steps are enough evidence of a plateau: the shipped
    # model (2.3) learned from real runs that a flat start often takes off later, so on this flat run
    # P(plateau) climbs only to about 0.6 by step 30 of 40.
    callback = PlateauStoppingCallback(bg.default_model(), threshold=0.55, tolerance=0.05, check_every=5, min_fraction=0.25, verbose=False)
    trainer = _train(flat_reward(), callback, tmp_path)
    assert callback.stopped_at is not None and trainer.state.global_step < MAX_STEPS
    assert callback.family == "llama" and 0 < callback.params_b < 1e-3
    logged = [e for e in trainer.state.log_history if PROBABILITY_KEY in e]
    assert logged and all({GAIN_KEY, BEST_STEP_KEY, TAKE_OFF_KEY, PARETO_K_KEY, *FINAL_KEYS} <= set(e) for e in logged)
    assert logged[-1][PROBABILITY_KEY] >= 0.55
    for entry in logged:
        assert 1 <= entry[BEST_STEP_KEY] <= entry["step"]
        assert 0.0 <= entry[TAKE_OFF_KEY] <= 1.0 and np.isfinite(entry[PARETO_K_KEY])
        assert entry["forecast/final_q05"] <= entry["forecast/final_q50"] <= entry["forecast/final_q95"]
    assert callback.best_checkpoint is None  # save_strategy="no": no checkpoint to name


def test_does_not_stop_a_rising_run(tmp_path: Path) -> None:
    callback = PlateauStoppingCallback(bg.default_model(), threshold=0.75, tolerance=0.05, check_every=5, min_fraction=0.25, verbose=False)
    trainer = _train(rising_reward(), callback, tmp_path)
    assert callback.stopped_at is None and trainer.state.global_step == MAX_STEPS
    assert callback.decisions and all(not d.should_stop for d in callback.decisions if d.step < MAX_STEPS)
    assert any(PROBABILITY_KEY in e for e in trainer.state.log_history)


def test_stops_a_run_whose_completions_all_score_the_same(tmp_path: Path) -> None:
    """The callback reads reward_std and frac_reward_zero_std from log_history: a rising mean with no spread in any
    group gives GRPO no gradient, and the run stops for that reason."""
    callback = PlateauStoppingCallback(bg.default_model(), threshold=0.75, tolerance=0.05, check_every=5, min_fraction=0.25, verbose=False)
    _train(rising_reward(spread=0.0), callback, tmp_path)
    assert callback.stopped_at is not None and callback.decisions[-1].reason == "no_signal"


def test_names_the_checkpoint_that_holds_the_best_step(tmp_path: Path) -> None:
    callback = PlateauStoppingCallback(bg.default_model(), check_every=5, min_fraction=0.25, verbose=False)
    trainer = _train(peaked_reward(), callback, tmp_path, max_steps=30, save_strategy="steps", save_steps=5)
    best = callback.decisions[-1].best_step
    assert 5 <= best <= 20  # the reward peaks at trainer step 12
    saved = sorted(int(p.name.split("-")[1]) for p in tmp_path.glob("checkpoint-*"))
    expected = max(n for n in saved if n <= best)
    assert callback.best_checkpoint == tmp_path / f"checkpoint-{expected}" and callback.best_checkpoint.is_dir()
    assert str(callback.best_checkpoint) in callback.stop_message()
    assert any(e.get(BEST_STEP_KEY) == best for e in trainer.state.log_history)


class _BrokenModel:
    def forecast(self, *args: object, **kwargs: object) -> None:
        raise RuntimeError("forecast exploded")


def test_a_broken_model_warns_once_and_training_goes_on(tmp_path: Path) -> None:
    callback = PlateauStoppingCallback(_BrokenModel(), check_every=2, min_fraction=0.0, verbose=False)  # type: ignore[arg-type]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer = _train(flat_reward(), callback, tmp_path, max_steps=12)
    assert trainer.state.global_step == 12
    assert sum("forecast exploded" in str(w.message) for w in caught) == 1


def test_a_missing_reward_key_warns_once_and_training_goes_on(tmp_path: Path) -> None:
    callback = PlateauStoppingCallback(bg.default_model(), reward_key="accuracy", check_every=2, min_fraction=0.0, verbose=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer = _train(flat_reward(), callback, tmp_path, max_steps=8)
    assert trainer.state.global_step == 8 and not callback.decisions
    messages = [str(w.message) for w in caught if "PlateauStoppingCallback" in str(w.message)]
    assert len(messages) == 1 and "no 'accuracy' in the trainer's logs" in messages[0] and "reward" in messages[0]


def _log_rewards(
    tmp_path: Path, rewards: list[object], max_steps: int, callback: PlateauStoppingCallback | None = None
) -> tuple[PlateauStoppingCallback, list[str]]:
    """Feed a callback that checks at every step one logged reward per step (no trainer); return it and every warning raised."""
    callback = callback or PlateauStoppingCallback(bg.default_model(), check_every=1, min_fraction=0.0, verbose=False)
    state = TrainerState(global_step=0, max_steps=max_steps)
    args = _config(tmp_path, max_steps)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for step, reward in enumerate(rewards, start=1):
            state.global_step = step
            logs = {"reward": reward, "loss": 0.1}
            state.log_history.append({**logs, "step": step})
            callback.on_log(args, state, TrainerControl(), logs=logs)
    return callback, [str(w.message) for w in caught]


@pytest.mark.parametrize("bad", [None, "0.7", float("nan"), True])
def test_non_numeric_rewards_warn_once(tmp_path: Path, bad: object) -> None:
    callback, messages = _log_rewards(tmp_path, [bad if step % 2 else 0.5 + 0.01 * step for step in range(1, 11)], max_steps=20)
    assert len(messages) == 1 and "is not a number" in messages[0] and "skipped" in messages[0]
    assert callback.decisions  # the numeric steps are still used


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"threshold": "0.9"}, "threshold must be a number between 0 and 1 (exclusive), got '0.9' (str)"),
        ({"threshold": 1.0}, "threshold must be a number between 0 and 1"),
        ({"threshold": 0}, "threshold must be a number between 0 and 1"),
        ({"threshold": True}, "threshold must be a number between 0 and 1"),
        ({"tolerance": -0.01}, "tolerance must be a number >= 0, got -0.01"),
        ({"tolerance": "small"}, "tolerance must be a number >= 0"),
        ({"check_every": 0}, "check_every must be a whole number >= 1, got 0"),
        ({"check_every": 2.5}, "check_every must be a whole number >= 1"),
        ({"check_every": "10"}, "check_every must be a whole number >= 1"),
        ({"min_fraction": 1.0}, "min_fraction must be a number in [0, 1)"),
        ({"params_b": -1.5}, "params_b must be a positive number"),
        ({"reward_range": (1, 0)}, "reward_range must be two numbers (lo, hi) with lo < hi"),
        ({"reward_range": "0,1"}, "reward_range must be two numbers"),
        ({"reward_key": ""}, "reward_key must be the name of a logged metric"),
        ({"n_draws": 0}, "n_draws must be a whole number >= 10"),
        ({"model": "default"}, "model must be a FittedModel"),
        ({"plots": "yes"}, "plots must be True or False, got 'yes' (str)"),
        ({"plot_every": 0}, "plot_every must be a whole number >= 1, got 0"),
        ({"plot_every": 1.5}, "plot_every must be a whole number >= 1"),
    ],
)
def test_bad_arguments_are_rejected_at_construction(kwargs: dict, message: str) -> None:
    with pytest.raises(BayesGrpoError, match="^PlateauStoppingCallback: ") as info:
        PlateauStoppingCallback(**kwargs)
    assert message in str(info.value)


@given(st.one_of(st.floats(allow_nan=True), st.integers(-5, 5), st.text(max_size=4), st.none()))
def test_threshold_is_accepted_exactly_inside_the_unit_interval(value: object) -> None:
    valid = isinstance(value, (int, float)) and not isinstance(value, bool) and np.isfinite(value) and 0 < value < 1
    if valid:
        assert PlateauStoppingCallback(threshold=value).threshold == value
    else:
        with pytest.raises(BayesGrpoError):
            PlateauStoppingCallback(threshold=value)


def test_a_forecast_warning_is_reported_once_not_at_every_check(tmp_path: Path) -> None:
    """Equal rewards give the forecast no scale: the callback says so once, however many checks run."""
    callback, messages = _log_rewards(tmp_path, [0.0] * 15, max_steps=40)
    messages = [m for m in messages if "PlateauStoppingCallback" in m]
    assert len(messages) == 1 and "all equal" in messages[0] and "reported once" in messages[0]
    assert len(callback.decisions) > 5  # the checks went on


def test_other_warnings_of_a_forecast_pass_through(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Only the forecast's own UserWarnings are folded into one report; a RuntimeWarning is shown as without the callback."""
    model = bg.default_model()
    forecast = model.forecast

    def forecast_with_a_numerical_warning(*args: object, **kwargs: object) -> object:
        warnings.warn("overflow in a reward function", RuntimeWarning, stacklevel=1)
        return forecast(*args, **kwargs)

    monkeypatch.setattr(model, "forecast", forecast_with_a_numerical_warning)
    callback = PlateauStoppingCallback(model, check_every=1, min_fraction=0.0, verbose=False)
    _, messages = _log_rewards(tmp_path, [0.5 + 0.01 * step for step in range(1, 12)], max_steps=30, callback=callback)
    assert len(callback.decisions) >= 5
    assert messages.count("overflow in a reward function") == len(callback.decisions)  # one per forecast: the test shows all


def test_beat_stops_a_run_that_cannot_reach_the_value_and_names_the_checkpoint(tmp_path: Path) -> None:
    """A run that peaked near 0.6 at step 12 and fell cannot end above 2: with beat=2 it stops at its first check, keeping its best checkpoint."""
    callback = PlateauStoppingCallback(bg.default_model(), check_every=5, min_fraction=0.5, verbose=False, beat=2.0)
    trainer = _train(peaked_reward(), callback, tmp_path, max_steps=30, save_strategy="steps", save_steps=5)
    assert callback.stop_reason == "beat" and callback.stopped_at is not None and trainer.state.global_step < 30
    logged = [e for e in trainer.state.log_history if BEATS_KEY in e]
    assert logged and logged[-1][BEATS_KEY] < 0.05 and logged[-1][BEATS_KEY] == callback.beat_probabilities[-1][1]
    assert callback.best_checkpoint is not None and callback.best_checkpoint.is_dir()
    message = callback.stop_message()
    assert "probability of ending above 2" in message and str(callback.best_checkpoint) in message


def test_beat_below_the_run_lets_it_train_and_orders_the_probabilities(tmp_path: Path) -> None:
    rewards = [0.5 + 0.01 * step for step in range(1, 16)]
    low, _ = _log_rewards(tmp_path, rewards, max_steps=30, callback=PlateauStoppingCallback(bg.default_model(), check_every=1, min_fraction=0.0, verbose=False, beat=0.0))
    high, _ = _log_rewards(tmp_path, rewards, max_steps=30, callback=PlateauStoppingCallback(bg.default_model(), check_every=1, min_fraction=0.0, verbose=False, beat=0.8))
    assert low.stopped_at is None and low.stop_reason is None
    assert all(p > 0.95 for _, p in low.beat_probabilities)
    assert all(p_low >= p_high for (_, p_low), (_, p_high) in zip(low.beat_probabilities, high.beat_probabilities))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"beat": "0.9"}, "beat must be a number"), ({"beat": float("inf")}, "beat must be a number"), ({"beat_threshold": 1.0}, "beat_threshold must be a number between 0 and 1")],
)
def test_bad_beat_arguments_are_rejected_at_construction(kwargs: dict, message: str) -> None:
    with pytest.raises(BayesGrpoError, match=message):
        PlateauStoppingCallback(**kwargs)


def _tensorboard(folder: Path) -> object:
    """Everything the trainer's TensorBoard writer wrote under ``folder`` (one run folder), read by TensorBoard's own reader."""
    reader = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    (events,) = {path.parent for path in folder.rglob("events.out.tfevents.*")}
    accumulator = reader.EventAccumulator(str(events), size_guidance={"images": 0, "scalars": 0})
    accumulator.Reload()
    return accumulator


def test_callbacks_list_delivers_the_keys_and_fan_charts_to_tensorboard(tmp_path: Path) -> None:
    """Passed as callbacks=[...] (after the reporters in the trainer's list), every check still reaches TensorBoard on its step."""
    callback = PlateauStoppingCallback(bg.default_model(), check_every=3, min_fraction=0.25, verbose=False, plot_every=2)
    trainer = _train(rising_reward(), callback, tmp_path, max_steps=15, report_to=["tensorboard"])
    checks = [e["step"] for e in trainer.state.log_history if PROBABILITY_KEY in e]
    assert len(checks) >= 3
    board = _tensorboard(tmp_path / "runs")
    for key in (PROBABILITY_KEY, GAIN_KEY, BEST_STEP_KEY, TAKE_OFF_KEY, PARETO_K_KEY, *FINAL_KEYS):
        assert f"train/{key}" in board.Tags()["scalars"], key
        assert [event.step for event in board.Scalars(f"train/{key}")] == checks, key
    assert trainer.callback_handler.callbacks[0] is callback
    images = board.Images(PLOT_KEY)
    assert [image.step for image in images] == callback.plot_steps
    due = set(checks[::2]) | {checks[-1]}  # every second check, and the last decision at the end of training
    assert checks[-1] in callback.plot_steps and set(callback.plot_steps) <= due
    assert images[-1].width > 300 and images[-1].height > 200 and images[-1].encoded_image_string.startswith(b"\x89PNG")


def test_fan_charts_reach_an_offline_wandb_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    wandb = pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_SILENT", "true")
    callback = PlateauStoppingCallback(bg.default_model(), check_every=3, min_fraction=0.25, verbose=False)
    try:
        _train(rising_reward(), callback, tmp_path / "out", max_steps=10, attach=True, report_to=["wandb"])
    finally:
        wandb.finish()
    (run_folder,) = tmp_path.glob("wandb/offline-run-*")
    pngs = sorted((run_folder / "files" / "media" / "images").rglob("*.png"))
    assert len(callback.plot_steps) >= 2 and len(pngs) == len(callback.plot_steps)
    assert all(png.read_bytes().startswith(b"\x89PNG") and PLOT_KEY.split("/")[1] in png.name for png in pngs)


def test_a_failing_plot_warns_once_and_training_goes_on(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import bayes_grpo.watching

    def broken_fan_chart(*args: object, **kwargs: object) -> None:
        raise RuntimeError("drawing exploded")

    monkeypatch.setattr(bayes_grpo.plotting, "fan_chart", broken_fan_chart)
    callback = PlateauStoppingCallback(bg.default_model(), check_every=1, min_fraction=0.0, verbose=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer = _train(flat_reward(), callback, tmp_path, max_steps=8, report_to=["tensorboard"])
    assert trainer.state.global_step == 8 and len(callback.decisions) >= 3 and not callback.plot_steps
    assert sum("drawing exploded" in str(w.message) for w in caught) == 1


def test_plots_off_draws_nothing(tmp_path: Path) -> None:
    callback = PlateauStoppingCallback(bg.default_model(), check_every=2, min_fraction=0.0, verbose=False, plots=False)
    _train(flat_reward(), callback, tmp_path, max_steps=7, report_to=["tensorboard"])
    board = _tensorboard(tmp_path / "runs")
    assert callback.decisions and not callback.plot_steps and PLOT_KEY not in board.Tags()["images"]
    assert f"train/{PROBABILITY_KEY}" in board.Tags()["scalars"]


def test_a_best_checkpoint_deleted_by_save_total_limit_is_reported(tmp_path: Path) -> None:
    """save_total_limit=2 keeps the last two checkpoints: the one of the best step is gone, and the callback says so once."""
    callback = PlateauStoppingCallback(bg.default_model(), check_every=3, min_fraction=0.25, verbose=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _train(peaked_reward(peak=5), callback, tmp_path, max_steps=16, save_strategy="steps", save_steps=2, save_total_limit=2)
    best = callback.decisions[-1].best_step
    kept = sorted(int(p.name.split("-")[1]) for p in tmp_path.glob("checkpoint-*"))
    assert 2 <= best <= 10 and len(kept) == 2 and min(kept) > best  # the rotation deleted every checkpoint up to the best step
    messages = [str(w.message) for w in caught if "was deleted" in str(w.message)]
    assert len(messages) == 1 and f"best step {best}" in messages[0] and "save_total_limit=2" in messages[0]
    assert "was deleted" in callback.stop_message()
    nearest = min(kept, key=lambda n: abs(n - best))
    assert callback.best_checkpoint is None
    assert callback.deleted_checkpoint == tmp_path / f"checkpoint-{best // 2 * 2}"
    assert callback.nearest_kept_checkpoint == tmp_path / f"checkpoint-{nearest}"
    message = callback.stop_message()
    assert f"checkpoint-{best // 2 * 2}" in message and "was deleted" in message and str(callback.nearest_kept_checkpoint) in message


def test_the_planned_last_step_is_always_checked(tmp_path: Path) -> None:
    """A 40-step run checked every 10 steps from step 5 (5, 15, 25, 35) is checked at step 40 too, and not stopped there."""
    callback = PlateauStoppingCallback(bg.default_model(), check_every=10, min_fraction=0.125, verbose=False, plots=False)
    state = TrainerState(global_step=0, max_steps=MAX_STEPS)
    args = _config(tmp_path, MAX_STEPS)
    for step in range(1, MAX_STEPS + 1):
        state.global_step = step
        logs = {"reward": 0.2 + 0.5 * (1 - np.exp(-step / 8)), "loss": 0.1}
        state.log_history.append({**logs, "step": step})
        control = TrainerControl()
        callback.on_log(args, state, control, logs=logs)
        assert not control.should_training_stop or step < MAX_STEPS
    checked = [entry["step"] for entry in state.log_history if PROBABILITY_KEY in entry]
    assert checked == [5, 15, 25, 35, 40] and len(callback.decisions) == 5
