"""OpenRLHF's and NeMo-RL's console logs, reproduced from their sources' format strings; bad input."""

from __future__ import annotations

import io
import json
import logging

import numpy as np
import pytest

import bayes_grpo as bg
from bayes_grpo.cli import main
from bayes_grpo.errors import LogError

# openrlhf/utils/logging_utils.py (OpenRLHF/OpenRLHF at 3c3be62, Apache-2.0)
_FORMAT = "%(levelname)s %(asctime)s %(filename)s:%(lineno)d] %(message)s"
_DATE_FORMAT = "%m-%d %H:%M:%S"


def score(step: int) -> float:
    return 0.2 + 0.5 * (1 - np.exp(-step / 20))


def openrlhf_console(steps: range) -> str:
    """What openrlhf/trainer/ppo_trainer.py logs per step (``✨ Global step``) and per evaluation, through its logger."""
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(logging.Formatter(_FORMAT, datefmt=_DATE_FORMAT))
    logger = logging.getLogger("test-openrlhf")
    logger.handlers, logger.propagate = [handler], False
    logger.setLevel(logging.INFO)
    for global_step in steps:
        logger.info(f"Sample: {['<|im_start|>user What is 2+2?', 1.0]}")
        log_status = {
            "policy_loss": -0.01, "actor_lr": 1e-06, "actor_grad_norm": 0.3, "reward": score(global_step),
            "score": score(global_step), "return": score(global_step), "response_length": 300.0 - global_step,
            "total_length": 420.0, "truncated": 0.02, "kl": 0.001 * global_step, "ppo_clip_ratio": 0.003,
            "ppo_kl": 1e-4, "group_reward_std": 0.4 - global_step / 500, "timing/make_experience": 3.2,
            "rollout/reward_mean": score(global_step), "rollout/reward_std": 0.48, "rollout/num_samples": 512.0,
        }  # fmt: skip
        logger.info(f"✨ Global step {global_step}: {log_status}")
        if global_step % 10 == 0:
            logs = {"eval_gsm8k_pass8": 0.7, "eval_gsm8k_pass1": score(global_step) - 0.05, "eval_num_samples": 1319.0}
            logger.info(f"✨ Evaluation completed in 0:01:02, global_step {global_step}, eval_metrics: {logs}")
    return out.getvalue()


def nemo_console(steps: range, per_epoch: int, epochs: int) -> str:
    """NeMo-RL's per-step block, from the print calls of nemo_rl/algorithms/grpo.py (NVIDIA-NeMo/RL at 7ea279a, Apache-2.0)."""
    lines = ["\n🔍 Running initial validation...", "\n📊 Validation Results:", f"    • Accuracy: {0.18:.4f}",
             f"    • Average response length: {350.0:.1f} tokens", f"    • Samples processed: {500}"]  # fmt: skip
    for total in steps:
        epoch, current_step = divmod(total - 1, per_epoch)
        if current_step == 0:
            lines.append(f"\n{'=' * 25} Epoch {epoch + 1}/{epochs} {'=' * 25}")
        lines.append(f"\n{'=' * 25} Step {current_step + 1}/{per_epoch} {'=' * 25}")
        lines += ["▶ Generating responses for batch of size 512...", "\n📊 Training Results:", f"  • Loss: {-0.01:.4f}",
                  f"  • Generation KL Error: {0.0012:.4f}", f"  • Avg Reward: {score(total):.4f}",
                  f"  • Mean Generation Length: {300.0 - total:.4f}", "\n⏱️  Timing:", "  • Total step time: 42.10s",
                  "  • generation: 20.00s (47.5%)"]  # fmt: skip
        if total % 10 == 0:
            lines += ["\n📊 Validation Results:", f"    • Accuracy: {score(total) - 0.05:.4f}",
                      f"    • Average response length: {300.0:.1f} tokens"]  # fmt: skip
    return "\n".join(lines) + "\n"


def test_openrlhf_console(tmp_path):
    log = tmp_path / "openrlhf.log"
    log.write_text(openrlhf_console(range(1, 31)))
    run = bg.read_log(log, total_steps=100)
    np.testing.assert_array_equal(run.steps, np.arange(1, 31))
    np.testing.assert_allclose(run.rewards, [score(s) for s in range(1, 31)])
    assert run.meta.extra["trainer"] == "OpenRLHF"
    assert {"reward_std", "completions/mean_length", "completions/clipped_ratio", "clip_ratio/region_mean", "kl",
            "grad_norm", "learning_rate", "rollout/reward_std"} <= set(run.signals)  # fmt: skip
    assert run.signal("group_reward_std")[0] == pytest.approx(0.398)  # the within-group spread: GRPO's learning signal
    evaluation = bg.read_log(log, metric="eval/eval_gsm8k_pass1")
    np.testing.assert_array_equal(evaluation.steps, [10, 20, 30])
    fc = bg.default_model().forecast(run, seed=0)
    assert not any("no reward_std" in note for note in fc.caveats)


def test_nemo_rl_console_counts_steps_across_epochs(tmp_path):
    log = tmp_path / "nemo.log"
    log.write_text(nemo_console(range(1, 26), per_epoch=10, epochs=3))
    run = bg.read_log(log, total_steps=30)
    np.testing.assert_array_equal(run.steps, np.arange(1, 26))
    np.testing.assert_allclose(run.rewards, [round(score(s), 4) for s in range(1, 26)])
    assert run.meta.extra["trainer"] == "NeMo-RL" and "completions/mean_length" in run.signals
    evaluation = bg.read_log(log, metric="validation/accuracy", total_steps=30)
    np.testing.assert_array_equal(evaluation.steps, [0, 10, 20])
    one_epoch = tmp_path / "nemo_one_epoch.log"
    one_epoch.write_text(nemo_console(range(1, 16), per_epoch=40, epochs=1))
    assert bg.read_log(one_epoch).total_steps == 40  # one epoch: its length is the plan


@pytest.mark.parametrize(
    "content",
    [
        "INFO 08-13 12:00:00 ppo_trainer.py:540] ✨ Global step 1: {'policy_loss': 0.1, 'kl': 0.0}\n" * 3,
        f"\n{'=' * 25} Step 1/10 {'=' * 25}\n\n📊 Training Results:\n  • Loss: 0.1000\n",
    ],
    ids=["openrlhf-no-reward", "nemo-no-reward"],
)
def test_logs_without_a_reward_one_line_error_and_exit_2(tmp_path, capsys, content):
    log = tmp_path / "train.log"
    log.write_text(content)
    with pytest.raises(LogError):
        bg.read_log(log)
    assert main(["forecast", str(log), "--total-steps", "100"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(log) in err


def test_cs336_grpo_metrics_jsonl_reads_and_its_rollout_range_bounds_the_forecast(tmp_path):
    # Stanford CS336 assignment 5's per-step JSONL (the keys of dequeueing/assignment5-alignment's grpo_metrics.jsonl):
    # a 0/1 answer reward over 256 rollouts, evaluated every 10th step
    rows = []
    for step in range(1, 41):
        mean = 0.04 + 0.006 * step
        rows.append({
            "step": step, "rollout_reward_mean": mean, "rollout_reward_std": (mean * (1 - mean)) ** 0.5, "rollout_reward_max": 1.0,
            "rollout_reward_min": 0.0, "advantage_mean": 1.9e-09, "advantage_std": 0.44, "train_loss_mean": -9.1e-12,
            "train_clip_fraction": 0.0, "gradient_norm": 0.21, "mean_response_length": 125.3,
            "val_accuracy": 0.3 if step % 10 == 0 else None, "step_elapsed_sec": 30.8,
        })  # fmt: skip
    log = tmp_path / "grpo_metrics.jsonl"
    log.write_text("".join(json.dumps(row) + "\n" for row in rows))
    run = bg.read_log(log, total_steps=200)
    np.testing.assert_allclose(run.rewards, [row["rollout_reward_mean"] for row in rows])
    assert "reward_std" not in run.signals  # the whole batch's spread, prompts mixed: no learning signal
    fc = bg.default_model().forecast(run, seed=0)
    assert fc.prepared.bounds == (0.0, 1.0) and fc.final.samples.max() <= 1.0
