"""One naming for GRPO's per-step signals across every loader; RunLog.signal / signals; read_log(metric=, direction=)."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import bayes_grpo as bg
from bayes_grpo.logs import GRPO_SIGNALS, LogWarning
from bayes_grpo.logs.names import normalise_column
from bayes_grpo.settings import bundled_runs_dir

FIXTURES = Path(__file__).resolve().parent / "fixtures"
SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "external_runs" / "runs"
BUNDLED = bundled_runs_dir() / "gpt_neox-l-add2-noise0.2-lr0.001-s0.csv"


def trainer_state(path: Path, history: list[dict], max_steps: int = 10) -> Path:
    """Write a trainer_state.json as transformers saves it."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "trainer_state.json").write_text(json.dumps({"max_steps": max_steps, "log_history": history}))
    return path / "trainer_state.json"


@pytest.mark.parametrize(
    "source",
    [FIXTURES / "trl_tiny" / "trainer_state.json", FIXTURES / "trl_tiny" / "console.log"],
    ids=["trainer_state", "console"],
)
def test_trl_files_keep_grpo_signals(source):
    """Real TRL 1.x output: reward_std, frac_reward_zero_std and per-function means and stds under one name."""
    run = bg.read_log(source)
    expected = {"reward_std", "frac_reward_zero_std", "entropy", "completions/mean_length", "completions/clipped_ratio",
                "rewards/digit_reward/mean", "rewards/digit_reward/std", "rewards/length_reward/mean", "rewards/length_reward/std"}  # fmt: skip
    assert expected <= set(run.signals) and run.signals[0] == "reward" and "epoch" not in run.signals
    history = [e for e in json.loads((FIXTURES / "trl_tiny" / "trainer_state.json").read_text())["log_history"] if "reward" in e]
    np.testing.assert_allclose(run.signal("frac_reward_zero_std"), [e["frac_reward_zero_std"] for e in history], rtol=1e-3)
    np.testing.assert_allclose(run.signal("rewards/digit_reward/std"), [e["rewards/digit_reward/std"] for e in history], rtol=1e-3)


@pytest.mark.parametrize("name", ["unsloth_progress.ipynb", "unsloth_progress.txt"])
def test_notebook_and_text_tables_keep_per_function_means(name):
    run = bg.read_log(FIXTURES / name)
    parts = [s for s in run.signals if s.startswith("rewards/")]
    assert len(parts) == 5 and all(s.endswith("/mean") for s in parts)
    assert {"reward_std", "completions/mean_length", "kl"} <= set(run.signals)
    np.testing.assert_allclose(sum(run.signal(p) for p in parts), run.rewards, atol=1e-5)


def test_signal_names_as_logged_all_read_the_same_column():
    run = bg.read_log(BUNDLED)
    mean = run.signal("rewards/correctness/mean")
    for alias in ("rewards/correctness", "reward__correctness", "train/rewards/correctness/mean", "rewards / correctness / mean"):
        np.testing.assert_array_equal(run.signal(alias), mean)
    assert run.signal("reward_std").shape == run.steps.shape


def test_missing_signals_are_nan_and_typos_are_errors():
    run = bg.read_log(pd.DataFrame({"step": [1, 2, 3], "reward": [0.1, 0.2, 0.3]}))
    assert run.signals == ("reward",)
    for name in (*GRPO_SIGNALS, "rewards/acc/std", "eval_accuracy"):
        assert np.isnan(run.signal(name)).all() and len(run.signal(name)) == 3
    with pytest.raises(bg.LogError, match="no signal 'reward_sdt' in the log; it has: reward"):
        run.signal("reward_sdt")


def test_wandb_api_export_joins_train_and_eval_rows(tmp_path):
    """run.history() gives separate rows for training and evaluation logs of one step."""
    rows = []
    for step in range(1, 11):
        rows.append({"_step": len(rows), "train/global_step": step, "train/reward": 0.1 * step, "train/reward_std": 0.5,
                     "train/frac_reward_zero_std": 0.25, "train/rewards/acc/mean": 0.05 * step, "train/rewards/acc/std": 0.3})  # fmt: skip
        if step % 5 == 0:
            rows.append({"_step": len(rows), "train/global_step": step, "eval/accuracy": 0.02 * step})
    pd.DataFrame(rows).to_csv(tmp_path / "history.csv", index=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error", LogWarning)  # joining pieces of one step is not a repair
        run = bg.read_log(tmp_path / "history.csv")
    assert list(run.steps) == list(range(1, 11))
    assert {"reward_std", "frac_reward_zero_std", "rewards/acc/mean", "rewards/acc/std", "eval_accuracy"} <= set(run.signals)
    np.testing.assert_allclose(run.signal("eval/accuracy"), [np.nan] * 4 + [0.1] + [np.nan] * 4 + [0.2])
    sparse = bg.read_log(tmp_path / "history.csv", metric="eval/accuracy", total_steps=10)
    assert list(sparse.steps) == [5, 10] and sparse.metric == "eval_accuracy"
    np.testing.assert_allclose(sparse.rewards, [0.1, 0.2])


def test_trainer_state_eval_entries_join_their_step(tmp_path):
    history = [{"step": s, "epoch": s / 10, "reward": 0.1 * s, "reward_std": 0.4} for s in range(1, 11)]
    history += [{"step": s, "epoch": s / 10, "eval_reward": 0.05 * s, "eval_loss": 1.0 / s} for s in (4, 8, 9)]
    history.append({"step": 10, "train_runtime": 12.0, "train_loss": 0.1})
    path = trainer_state(tmp_path / "out", history)
    with warnings.catch_warnings():
        warnings.simplefilter("error", LogWarning)
        run = bg.read_log(path)
    assert list(run.steps) == list(range(1, 11))
    assert np.flatnonzero(np.isfinite(run.signal("eval_reward"))).tolist() == [3, 7, 8]
    loss = bg.read_log(path, metric="eval_loss", direction="minimize")
    assert list(loss.steps) == [4, 8, 9] and loss.direction == "minimize"
    np.testing.assert_allclose(loss.rewards, [-0.25, -0.125, -1 / 9])  # negated: better is up
    np.testing.assert_allclose(loss.signal("eval_loss"), [0.25, 0.125, 1 / 9])  # the metric itself keeps its units


def test_steps_logged_twice_still_warn_and_keep_the_later(tmp_path):
    history = [{"step": 1, "reward": 0.1}, {"step": 2, "reward": 0.2}, {"step": 2, "reward": 0.3}]
    with pytest.warns(LogWarning, match="repeats 1 time"):
        run = bg.read_log(trainer_state(tmp_path, history))
    assert list(run.rewards) == [0.1, 0.3]


def test_metric_picks_the_forecast_target_and_drops_the_summed_rewards_metadata():
    run = bg.read_log(BUNDLED)
    part = bg.read_log(BUNDLED, metric="rewards/correctness", reward_range=(0, 1))
    assert run.reward_range == (0.0, 1.8) and run.initial_reward is not None  # the sidecar's, for the summed reward
    assert part.metric == "rewards/correctness/mean" and part.reward_range == (0.0, 1.0) and part.initial_reward is None
    np.testing.assert_array_equal(part.rewards, run.signal("rewards/correctness/mean"))
    assert bg.read_log(BUNDLED, metric="rewards/correctness").reward_range is None


def test_minimize_negates_the_reward_range():
    run = bg.read_log(BUNDLED, metric="loss", direction="minimize", reward_range=(-1, 2))
    assert run.reward_range == (-2.0, 1.0)
    np.testing.assert_array_equal(run.rewards, -run.signal("loss"))
    with pytest.raises(bg.LogError, match="direction='down'"):
        bg.read_log(BUNDLED, direction="down")


def test_unknown_metric_lists_the_logged_ones():
    with pytest.raises(bg.LogError, match=r"no metric 'nope' in the log; it has: completions/clipped_ratio, .*reward, reward_std, "):
        bg.read_log(BUNDLED, metric="nope")


@pytest.mark.skipif(not SHARED.is_dir(), reason="shared runs not available")
def test_shared_runs_per_function_means_and_stds():
    """The shared runs' reward__<fn> / reward_std__<fn> columns: every run that logs per-function stds has them loaded."""
    raw_with_stds = loaded_with_stds = 0
    for path in sorted(SHARED.glob("*.csv")):
        raw = pd.read_csv(path, nrows=1)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", LogWarning)
            run = bg.read_log(path)
        means = {c[len("reward__") :] for c in raw.columns if c.startswith("reward__")}
        stds = {c[len("reward_std__") :] for c in raw.columns if c.startswith("reward_std__")}
        assert {f"rewards/{f}/mean" for f in means} | {f"rewards/{f}/std" for f in stds} <= set(run.table.columns)
        raw_with_stds += bool(stds)
        loaded_with_stds += any(c.startswith("rewards/") and c.endswith("/std") for c in run.table.columns)
    assert raw_with_stds > 0 and loaded_with_stds == raw_with_stds


fn_names = st.from_regex(r"[a-z][a-z0-9_]{0,15}", fullmatch=True).filter(lambda s: s not in ("mean", "std"))


@settings(max_examples=80, deadline=None)
@given(fn=fn_names, prefix=st.sampled_from(["", "train/"]), spaced=st.booleans())
def test_every_per_function_spelling_has_one_name(fn, prefix, spaced):
    sep = " / " if spaced else "/"
    means = [f"{prefix}rewards{sep}{fn}{sep}mean", f"{prefix}rewards{sep}{fn}", f"reward__{fn}"]
    assert {normalise_column(m) for m in means} == {f"rewards/{fn}/mean"}
    assert normalise_column(f"{prefix}rewards{sep}{fn}{sep}std") == normalise_column(f"reward_std__{fn}") == f"rewards/{fn}/std"


name_parts = st.sampled_from(["train/", "eval/", "rewards", "reward", "/", " / ", "__", "_std", "mean", "std", "step",
                              "Step", "acc", "completion_length", "global_step", " ", "Training Loss"])  # fmt: skip


@settings(max_examples=200, deadline=None)
@given(name=st.one_of(st.text(max_size=30), st.lists(name_parts, max_size=6).map("".join)))
def test_normalising_twice_changes_nothing(name):
    once = normalise_column(name)
    assert normalise_column(once) == once
