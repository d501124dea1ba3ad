"""read_log on every supported source format, with real TRL output where possible."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import bayes_grpo as bg
from bayes_grpo.logs import RunLog, RunMetadata, RunSet

FIXTURES = Path(__file__).resolve().parent / "fixtures"
TRL = FIXTURES / "trl_tiny"


def trl_reference() -> tuple[list[int], list[float]]:
    """Steps and rewards straight from the TRL file, without our reader."""
    history = json.loads((TRL / "trainer_state.json").read_text())["log_history"]
    entries = [e for e in history if "reward" in e]
    return [e["step"] for e in entries], [e["reward"] for e in entries]



def test_the_old_reward_std_accessor_warns_and_agrees_with_signal(tmp_path):
    run = bg.read_log(TRL / "trainer_state.json")
    with pytest.warns(DeprecationWarning, match='run.signal\\("reward_std"\\)'):
        old = run.reward_std
    np.testing.assert_array_equal(old, run.signal("reward_std"))
    (tmp_path / "plain.csv").write_text("step,reward\n1,0.1\n2,0.2\n3,0.3\n")
    without = bg.read_log(tmp_path / "plain.csv")
    assert np.isnan(without.signal("reward_std")).all()
    with pytest.warns(DeprecationWarning):
        assert without.reward_std is None

def test_trl_trainer_state_json():
    run = bg.read_log(TRL / "trainer_state.json")
    steps, rewards = trl_reference()
    assert run.run_id == "trl_tiny"
    assert run.steps.dtype == np.int64 and list(run.steps) == steps == [1, 2, 3, 4, 5, 6]
    np.testing.assert_allclose(run.rewards, rewards)
    assert run.total_steps == 6 and run.last_step == 6
    assert run.meta.steps_per_epoch == 16  # epoch 0.375 at step 6
    assert np.isfinite(run.signal("reward_std")).all() and len(run.signal("reward_std")) == 6
    # TRL 1.16 writes per-function rewards as rewards/<name>/mean and /std: the canonical names
    assert {"rewards/digit_reward/mean", "rewards/digit_reward/std", "rewards/length_reward/mean", "kl" if "kl" in run.table else "entropy"} <= set(run.table)
    assert run.table["reward"].dtype == np.float64


def test_trl_output_dir_uses_newest_checkpoint(tmp_path):
    out = tmp_path / "my-run"
    shutil.copytree(TRL, out)
    older = out / "checkpoint-3"
    older.mkdir()
    state = json.loads((TRL / "trainer_state.json").read_text())
    state["log_history"] = state["log_history"][:3]
    (older / "trainer_state.json").write_text(json.dumps(state))
    run = bg.read_log(out)
    assert run.run_id == "my-run" and run.last_step == 6
    (out / "checkpoint-6" / "trainer_state.json").unlink()
    (out / "checkpoint-6").rmdir()
    assert bg.read_log(out).last_step == 3  # checkpoint-3 is now the newest
    shutil.rmtree(older)
    assert bg.read_log(out).last_step == 6  # falls back to the top-level trainer_state.json


def test_docs_variant_reward_keys(tmp_path):
    state = {"max_steps": 10, "log_history": [{"step": s, "reward": 0.1 * s, "reward/acc/mean": 0.1 * s} for s in (1, 2)]}
    (tmp_path / "trainer_state.json").write_text(json.dumps(state))
    run = bg.read_log(tmp_path / "trainer_state.json")
    assert list(run.table["rewards/acc/mean"]) == pytest.approx([0.1, 0.2])


def test_trl_console_log_dicts():
    """TRL's printed dicts (values as strings in transformers 5), step = order."""
    run = bg.read_log(TRL / "console.log")
    steps, rewards = trl_reference()
    assert list(run.steps) == steps
    np.testing.assert_allclose(run.rewards, rewards, rtol=1e-3)
    assert run.table["rewards/digit_reward/mean"].dtype == np.float64


@pytest.mark.parametrize("name", ["unsloth_progress.ipynb", "unsloth_progress.txt"])
def test_unsloth_progress_table(name):
    run = bg.read_log(FIXTURES / name)
    assert list(run.steps) == list(range(1, 13))
    assert run.total_steps == 50  # from Unsloth's banner "Total steps = 50"
    assert run.rewards[0] == pytest.approx(0.092593)
    assert "loss" in run.table and "rewards/correctness_reward_func/mean" in run.table
    parts = run.table[[c for c in run.table if c.startswith("rewards/") and c.endswith("/mean")]].sum(axis=1)
    np.testing.assert_allclose(parts, run.rewards, atol=1e-5)


def test_space_aligned_text_table(tmp_path):
    text = (
        "Step  Training Loss  reward  reward_std  rewards / xmlcount_reward_func\n"
        "1     0.000000       0.125   0.20        0.125\n"
        "2     0.000100       0.250   0.30        0.250\n"
    )
    (tmp_path / "out.txt").write_text(text)
    run = bg.read_log(tmp_path / "out.txt")
    assert list(run.rewards) == [0.125, 0.25] and "rewards/xmlcount_reward_func/mean" in run.table


def test_wandb_style_csv(tmp_path):
    frame = pd.DataFrame(
        {"_step": [0, 1, 2], "train/global_step": [5, 10, 15], "train/reward": [0.1, 0.2, 0.3],
         "train/reward_std": [0.5, 0.4, 0.3], "train/rewards/acc/mean": [0.1, 0.2, 0.3], "_runtime": [1.0, 2.0, 3.0]}
    )  # fmt: skip
    frame.to_csv(tmp_path / "wandb_export.csv", index=False)
    run = bg.read_log(tmp_path / "wandb_export.csv")
    assert list(run.steps) == [5, 10, 15]  # train/global_step wins over W&B's _step
    assert list(run.table.columns[:2]) == ["step", "reward"] and "rewards/acc/mean" in run.table
    assert "reward_std" in run.table


def test_csv_metadata_columns_and_sidecar(tmp_path):
    frame = pd.DataFrame({"step": [1, 2], "reward": [0.0, 1.0], "model": "Qwen/Qwen2.5-0.5B", "params_b": 0.49,
                          "reward_min": 0.0, "reward_max": 4.0})  # fmt: skip
    frame.to_csv(tmp_path / "r.csv", index=False)
    run = bg.read_log(tmp_path / "r.csv")
    assert run.family == "qwen"  # guessed from the model name
    assert run.params_b == 0.49 and run.reward_range == (0.0, 4.0)
    assert run.meta.extra["model"] == "Qwen/Qwen2.5-0.5B"
    assert list(run.table.columns) == ["step", "reward"]
    (tmp_path / "r.meta.json").write_text(json.dumps({"family": "Llama", "total_steps": 100, "seed": 3}))
    run = bg.read_log(tmp_path / "r.csv")
    assert run.family == "llama" and run.total_steps == 100 and run.meta.extra["seed"] == 3
    run = bg.read_log(tmp_path / "r.csv", family="gemma", total_steps=200, run_id="mine")
    assert (run.family, run.total_steps, run.run_id) == ("gemma", 200, "mine")  # arguments win


def test_dataframe_and_jsonl(tmp_path):
    frame = pd.DataFrame({"step": [0, 2, 4], "reward": [1, 2, 3]})
    run = bg.read_log(frame, params_b=1.5)
    assert run.run_id == "run" and run.params_b == 1.5 and run.rewards.dtype == np.float64
    (tmp_path / "m.jsonl").write_text("\n".join(json.dumps({"global_step": s, "mean_reward": r}) for s, r in [(1, 0.5), (2, 0.7)]))
    assert list(bg.read_log(tmp_path / "m.jsonl").rewards) == [0.5, 0.7]


def test_runlog_head_to_frame_with_meta():
    run = bg.read_log(TRL / "trainer_state.json", family="llama", params_b=0.0001)
    part = run.head(3)
    assert list(part.steps) == [1, 2, 3] and part.total_steps == 6 and part.meta is run.meta
    frame = run.to_frame()
    assert {"run_id", "step", "reward", "family", "params_b", "total_steps"} <= set(frame.columns)
    assert (frame["family"] == "llama").all()
    assert run.with_meta(total_steps=100).total_steps == 100 and run.total_steps == 6
    with pytest.raises(bg.LogError, match="total_steps=2"):
        run.with_meta(total_steps=2)
    with pytest.raises(bg.LogError, match="no logged step at or before step 0"):
        run.head(0)


def test_load_runs_folder_and_runset(tmp_path):
    pd.DataFrame({"step": [1, 2, 3], "reward": [0.1, 0.2, 0.3]}).to_csv(tmp_path / "a.csv", index=False)
    (tmp_path / "a.meta.json").write_text(json.dumps({"family": "qwen", "params_b": 0.5}))
    pd.DataFrame({"step": [2, 4], "reward": [1.0, 2.0]}).to_csv(tmp_path / "b.csv", index=False)
    shutil.copytree(TRL, tmp_path / "trl_run")
    (tmp_path / "notes.md").write_text("not a log")
    runs = bg.load_runs(tmp_path)
    assert isinstance(runs, RunSet) and runs.run_ids == ["a", "b", "trl_run"]
    assert runs["a"].family == "qwen" and runs[1].run_id == "b"
    assert len(runs.filter(family="qwen")) == 1
    ds = runs.to_xarray()
    assert ds.reward.dims == ("run", "step") and list(ds.step.values) == [1, 2, 3, 4, 5, 6]
    assert np.isnan(ds.reward.sel(run="b", step=1)) and ds.reward.sel(run="b", step=4) == 2.0
    assert list(ds.family.values) == ["qwen", "unknown", "unknown"]
    assert np.isnan(ds.params_b.sel(run="b")) and ds.total_steps.sel(run="trl_run") == 6
    tidy = runs.to_frame()
    assert len(tidy) == 3 + 2 + 6 and {"run_id", "step", "reward", "family", "params_b", "total_steps"} <= set(tidy)


def test_load_runs_default_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("BAYES_GRPO_DATA", str(tmp_path / "missing"))
    with pytest.raises(bg.LogError, match="BAYES_GRPO_DATA"):
        bg.load_runs()
    pd.DataFrame({"step": [1], "reward": [0.1]}).to_csv(tmp_path / "x.csv", index=False)
    monkeypatch.setenv("BAYES_GRPO_DATA", str(tmp_path))
    assert bg.load_runs().run_ids == ["x"]


def test_runlog_constructor_checks_invariants():
    with pytest.raises(bg.LogError, match="strictly increasing"):
        RunLog("r", pd.DataFrame({"step": [2, 1], "reward": [0.0, 1.0]}), RunMetadata())
    with pytest.raises(bg.LogError, match="duplicate run_id"):
        RunSet([bg.read_log(pd.DataFrame({"reward": [1.0]}))] * 2)


@pytest.mark.slow
def test_fresh_grpotrainer_run_reads_back(tmp_path):
    """Re-run the fixture generator with the installed TRL: its output must still read the same way."""
    import subprocess
    import sys

    out = tmp_path / "fresh"
    subprocess.run([sys.executable, str(FIXTURES / "make_trl_fixture.py"), str(out)], check=True, capture_output=True)
    for source in (out, out / "console.log"):
        run = bg.read_log(source)
        assert list(run.steps) == [1, 2, 3, 4, 5, 6]
        assert {"reward_std", "rewards/digit_reward/mean", "rewards/length_reward/mean"} <= set(run.table)
