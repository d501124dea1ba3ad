"""Each bad input gives a precise LogError or a LogWarning naming the file and field."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import bayes_grpo as bg
from bayes_grpo.logs import LogWarning


def write_csv(tmp_path: Path, frame: pd.DataFrame, name: str = "run.csv") -> Path:
    path = tmp_path / name
    frame.to_csv(path, index=False)
    return path


def test_logerror_is_a_valueerror():
    assert issubclass(bg.LogError, ValueError) and issubclass(bg.LogError, bg.BayesGrpoError)


@pytest.mark.parametrize(
    ("content", "name", "match"),
    [
        ("hello, this is a shopping list\n", "notes.txt", "no TRL log dicts"),
        ('{"a": 1}', "config.json", "neither a TRL trainer_state.json"),
        ("", "empty.csv", "empty"),
        ("step,reward\n", "header_only.csv", "empty"),
        ("x\n1\n", "x.parquet", "unsupported file type '.parquet'"),
        ('{"cells": 3}', "nb.ipynb", "not a Jupyter notebook"),
        ('{"step": 1, "reward": 0.1}\nnot json\n', "m.jsonl", "line 2 is not JSON"),
    ],
)
def test_not_a_log(tmp_path, content, name, match):
    path = tmp_path / name
    path.write_text(content)
    with pytest.raises(bg.LogError, match=match) as info:
        bg.read_log(path)
    assert name in str(info.value)


def test_binary_file(tmp_path):
    (tmp_path / "w.csv").write_bytes(b"\x89PNG\r\n\x1a\n\xff\xfe\x00")
    with pytest.raises(bg.LogError, match="not a text file"):
        bg.read_log(tmp_path / "w.csv")


def test_missing_file_and_empty_folder(tmp_path):
    with pytest.raises(bg.LogError, match="no such file"):
        bg.read_log(tmp_path / "nope.csv")
    with pytest.raises(bg.LogError, match="no trainer_state.json"):
        bg.read_log(tmp_path)
    with pytest.raises(bg.LogError, match="no logs found"):
        bg.load_runs(tmp_path)


def test_no_reward_column(tmp_path):
    path = write_csv(tmp_path, pd.DataFrame({"step": [1, 2], "loss": [0.1, 0.2]}))
    with pytest.raises(bg.LogError, match=r"run\.csv: no reward column.*found \['step', 'loss'\].*rename"):
        bg.read_log(path)


def test_trainer_state_without_reward(tmp_path):
    state = {"max_steps": 3, "log_history": [{"step": 1, "loss": 0.5}]}
    (tmp_path / "trainer_state.json").write_text(json.dumps(state))
    with pytest.raises(bg.LogError, match="none with a 'reward' field"):
        bg.read_log(tmp_path / "trainer_state.json")


def test_non_numeric_reward(tmp_path):
    path = write_csv(tmp_path, pd.DataFrame({"step": [1, 2, 3], "reward": ["0.1", "high", "0.3"]}))
    with pytest.raises(bg.LogError, match=r"run\.csv: field 'reward' is not numeric .*'high'"):
        bg.read_log(path)


def test_nan_and_inf_rewards_dropped_with_warning(tmp_path):
    path = write_csv(tmp_path, pd.DataFrame({"step": [1, 2, 3, 4], "reward": [0.1, np.nan, np.inf, 0.4]}))
    with pytest.warns(LogWarning, match=r"run\.csv: dropped 2 row\(s\) whose 'reward' is NaN or inf \(steps 2, 3\)"):
        run = bg.read_log(path)
    assert list(run.steps) == [1, 4]


def test_all_rewards_nan(tmp_path):
    path = write_csv(tmp_path, pd.DataFrame({"step": [1, 2], "reward": [np.nan, np.nan]}))
    with pytest.raises(bg.LogError, match="no finite values"):
        bg.read_log(path)


def test_unsorted_steps_sorted_with_warning(tmp_path):
    path = write_csv(tmp_path, pd.DataFrame({"step": [3, 1, 2], "reward": [0.3, 0.1, 0.2]}))
    with pytest.warns(LogWarning, match="not in order; sorted"):
        run = bg.read_log(path)
    assert list(run.steps) == [1, 2, 3] and list(run.rewards) == [0.1, 0.2, 0.3]


def test_duplicate_steps_keep_last_with_warning(tmp_path):
    path = write_csv(tmp_path, pd.DataFrame({"step": [1, 2, 2, 3], "reward": [0.1, 0.2, 0.25, 0.3]}))
    with pytest.warns(LogWarning, match=r"field 'step' repeats 1 time\(s\) \(steps 2\); kept the last"):
        run = bg.read_log(path)
    assert list(run.steps) == [1, 2, 3] and list(run.rewards) == [0.1, 0.25, 0.3]


def test_negative_steps(tmp_path):
    path = write_csv(tmp_path, pd.DataFrame({"step": [-1, 0, 1], "reward": [0.1, 0.2, 0.3]}))
    with pytest.raises(bg.LogError, match=r"run\.csv: field 'step' has 1 negative value\(s\)"):
        bg.read_log(path)


def test_non_integer_or_missing_steps(tmp_path):
    with pytest.raises(bg.LogError, match="non-integer"):
        bg.read_log(pd.DataFrame({"step": [1.5, 2], "reward": [0.1, 0.2]}))
    with pytest.raises(bg.LogError, match="missing in 1 row"):
        bg.read_log(pd.DataFrame({"step": [1, None], "reward": [0.1, 0.2]}))


def test_total_steps_smaller_than_last_step(tmp_path):
    path = write_csv(tmp_path, pd.DataFrame({"step": [1, 2, 10], "reward": [0.1, 0.2, 0.3]}))
    with pytest.raises(bg.LogError, match=r"run\.csv: total_steps=5 is before the last logged step 10"):
        bg.read_log(path, total_steps=5)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [({"params_b": -1.0}, "params_b"), ({"reward_range": (1.0, 0.0)}, "reward_range"), ({"total_steps": 0}, "total_steps must be a whole number >= 1")],
)
def test_bad_metadata_arguments(kwargs, match):
    with pytest.raises(bg.LogError, match=match):
        bg.read_log(pd.DataFrame({"step": [0], "reward": [0.0]}), **kwargs)


def test_csv_with_several_runs(tmp_path):
    frame = pd.DataFrame({"run_id": ["a", "b"], "step": [1, 1], "reward": [0.1, 0.2]})
    with pytest.raises(bg.LogError, match="holds 2 runs"):
        bg.read_log(write_csv(tmp_path, frame))


def test_clashing_columns():
    with pytest.raises(bg.LogError, match="duplicate column name"):
        bg.read_log(pd.DataFrame([[1, 0.1, 0.2]], columns=["step", "reward", "reward"]))
    with pytest.raises(bg.LogError, match="mean the same field"):
        bg.read_log(pd.DataFrame({"step": [1], "reward": [0.1], "reward__a": [0.1], "rewards/a/mean": [0.1]}))
