"""TensorBoard event files written by the real ``torch.utils.tensorboard.SummaryWriter``, as TRL (through
transformers' TensorBoardCallback), verl, OpenRLHF and NeMo-RL write them: read, several runs, followed live."""

from __future__ import annotations

import builtins
import warnings
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("tensorboard")
SummaryWriter = pytest.importorskip("torch.utils.tensorboard").SummaryWriter

import bayes_grpo as bg
from bayes_grpo.cli import main
from bayes_grpo.errors import LogError
from bayes_grpo.logs import read_runs


def curve(step: int) -> float:
    return 0.2 + 0.5 * (1 - np.exp(-step / 25))


def write_trl(folder: Path, steps: range, writer: SummaryWriter | None = None) -> SummaryWriter:
    """TRL 1.x GRPOTrainer's logged names, as transformers' TensorBoardCallback writes them (train/ and eval/ prefixes)."""
    writer = writer or SummaryWriter(str(folder))
    for step in steps:
        writer.add_scalar("train/reward", curve(step), step)
        writer.add_scalar("train/reward_std", 0.35 - step / 1000, step)
        writer.add_scalar("train/frac_reward_zero_std", 0.1, step)
        writer.add_scalar("train/completions/mean_length", 200.0 + step, step)
        writer.add_scalar("train/rewards/accuracy_reward/mean", curve(step), step)
        writer.add_scalar("train/kl", 0.001 * step, step)
        if step % 10 == 0:
            writer.add_scalar("eval/reward", curve(step) - 0.05, step)
    writer.flush()
    return writer


def test_folder_written_by_summary_writer_reads_and_forecasts(tmp_path):
    write_trl(tmp_path / "runs" / "Jan01_12-00-00_host", range(1, 41)).close()
    run = bg.read_log(tmp_path / "runs", total_steps=200)
    assert run.run_id == "runs"
    np.testing.assert_array_equal(run.steps, np.arange(1, 41))
    np.testing.assert_allclose(run.rewards, [curve(s) for s in range(1, 41)], rtol=1e-6)
    assert {"reward_std", "frac_reward_zero_std", "completions/mean_length", "kl", "rewards/accuracy_reward/mean", "eval_reward"} <= set(run.signals)
    np.testing.assert_allclose(run.signal("train/reward_std")[:2], [0.349, 0.348], rtol=1e-6)
    fc = bg.default_model().forecast(run, seed=0)
    assert fc.total_steps == 200 and np.isfinite(fc.final.median)
    assert not any("no reward_std" in note for note in fc.caveats)
    evaluation = bg.read_log(tmp_path / "runs", metric="eval/reward", total_steps=200)
    np.testing.assert_array_equal(evaluation.steps, [10, 20, 30, 40])


def test_single_event_file(tmp_path):
    write_trl(tmp_path / "exp", range(1, 11)).close()
    (event,) = (tmp_path / "exp").glob("events.out.tfevents.*")
    run = bg.read_log(event)
    assert run.run_id == "exp" and len(run) == 10


def test_several_runs_in_one_folder(tmp_path):
    write_trl(tmp_path / "lr1e-6", range(1, 11)).close()
    write_trl(tmp_path / "lr3e-6", range(1, 21)).close()
    with pytest.raises(LogError, match=r"holds 2 TensorBoard runs \('lr1e-6', 'lr3e-6'\).*read_runs") as info:
        bg.read_log(tmp_path)
    assert "\n" not in str(info.value)
    runs = read_runs(tmp_path)
    assert [r.run_id for r in runs] == ["lr1e-6", "lr3e-6"] and [len(r) for r in runs] == [10, 20]
    assert bg.load_runs(tmp_path).run_ids == ["lr1e-6", "lr3e-6"]
    assert len(bg.read_log(tmp_path / "lr3e-6")) == 20  # one run's folder


def test_resumed_run_keeps_the_later_values(tmp_path):
    first = write_trl(tmp_path, range(1, 21))
    first.close()
    resumed = SummaryWriter(str(tmp_path))  # a second event file in the same folder, from step 11 on
    for step in range(11, 31):
        resumed.add_scalar("train/reward", curve(step) + 0.01, step)
    resumed.close()
    run = bg.read_log(tmp_path)
    np.testing.assert_array_equal(run.steps, np.arange(1, 31))
    assert run.rewards[15] == pytest.approx(curve(16) + 0.01, rel=1e-6)


def test_trainer_tag_names(tmp_path):
    writer = SummaryWriter(str(tmp_path / "verl"))  # verl's _TensorboardAdapter: its metric keys as tags
    for step in range(1, 6):
        for key, value in {"critic/score/mean": 0.3, "response_length/mean": 300.0, "actor/pg_clipfrac": 0.02,
                           "actor/entropy": 0.6, "actor/kl_loss": 0.001, "training/global_step": step}.items():  # fmt: skip
            writer.add_scalar(key, value, step)
    writer.add_scalar("val-core/openai/gsm8k/reward/mean@1", 0.25, 0)  # the validation before training
    writer.add_scalar("val-core/openai/gsm8k/reward/mean@1", 0.35, 5)
    writer.close()
    run = bg.read_log(tmp_path / "verl")
    assert {"completions/mean_length", "clip_ratio/region_mean", "entropy", "kl", "eval_openai/gsm8k/reward/mean@1"} <= set(run.signals)
    assert "reward_std" not in run.signals
    evaluation = bg.read_log(tmp_path / "verl", metric="val-core/openai/gsm8k/reward/mean@1")
    np.testing.assert_array_equal(evaluation.steps, [0, 5])
    writer = SummaryWriter(str(tmp_path / "openrlhf"))  # OpenRLHF's TensorboardLogger: train/<key>, eval/<key>
    for step in range(1, 6):
        for key, value in {"reward": 0.4, "group_reward_std": 0.3, "response_length": 250.0, "ppo_clip_ratio": 0.01, "kl": 0.0}.items():
            writer.add_scalar(f"train/{key}", value, step)
    writer.add_scalar("eval/eval_gsm8k_pass1", 0.5, 5)
    writer.close()
    run = bg.read_log(tmp_path / "openrlhf")
    assert {"reward_std", "completions/mean_length", "clip_ratio/region_mean", "kl", "eval_gsm8k_pass1"} <= set(run.signals)
    writer = SummaryWriter(str(tmp_path / "nemo" / "tensorboard"))  # NeMo-RL: <log_dir>/tensorboard, train/ and validation/
    for step in range(1, 6):
        for key, value in {"reward": 0.4, "mean_gen_tokens_per_sample": 250.0, "approx_entropy": 0.5, "truncation_rate": 0.0}.items():
            writer.add_scalar(f"train/{key}", value, step)
    writer.add_scalar("validation/accuracy", 0.5, 5)
    writer.close()
    run = bg.read_log(tmp_path / "nemo")
    assert {"completions/mean_length", "entropy", "completions/clipped_ratio", "eval_accuracy"} <= set(run.signals)


def test_watch_follows_a_growing_folder(tmp_path):
    writer = write_trl(tmp_path, range(1, 11))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        updates = bg.watch(tmp_path, total_steps=100, poll=0.01)
        assert next(updates).run.last_step == 10
        write_trl(tmp_path, range(11, 26), writer)
        assert next(updates).run.last_step == 25
    writer.close()


def test_malformed_event_file_one_line_error_and_exit_2(tmp_path, capsys):
    bad = tmp_path / "events.out.tfevents.1700000000.host.1.0"
    bad.write_bytes(b"this is not a TFRecord file at all\n" * 4)
    with pytest.raises(LogError) as info:
        bg.read_log(bad)
    assert "\n" not in str(info.value) and str(bad) in str(info.value)
    assert main(["forecast", str(bad), "--total-steps", "100"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "TensorBoard" in err


def test_missing_tensorboard_names_the_extra(tmp_path, monkeypatch):
    write_trl(tmp_path, range(1, 4)).close()
    real_import = builtins.__import__

    def no_tensorboard(name, *args, **kwargs):
        if name.startswith("tensorboard"):
            raise ImportError(f"No module named {name!r}")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_tensorboard)
    with pytest.raises(LogError, match=r'pip install "bayes-grpo\[tensorboard\]"'):
        bg.read_log(tmp_path)
