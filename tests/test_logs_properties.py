"""Property tests: garbage only ever raises LogError; CSV/JSONL round-trip."""

from __future__ import annotations

import json
import tempfile
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra.pandas import column, data_frames, range_indexes

import bayes_grpo as bg
from bayes_grpo.logs import LogWarning

SUFFIXES = [".csv", ".tsv", ".json", ".jsonl", ".txt", ".log", ".ipynb", ".bin"]
SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# Text that looks almost like a log: fragments of real headers, dicts and JSON.
fragments = st.sampled_from(
    ["step", "reward", ",", "\n", "\t", "|", "{", "}", "'reward': ", "0.5", "-1", "nan", "inf", "Step",
     "Training Loss", '"log_history": [', "]", '"cells"', ":", " ", "abc", "1e309", "[", '"', "rewards / f"]
)  # fmt: skip
garbage_text = st.one_of(st.text(max_size=300), st.lists(fragments, max_size=60).map("".join))


def read_quietly(path_or_frame):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", LogWarning)
        return bg.read_log(path_or_frame)


def assert_only_logerror(source) -> None:
    try:
        run = read_quietly(source)
    except bg.LogError:
        return
    assert len(run) > 0 and np.all(np.isfinite(run.rewards)) and np.all(np.diff(run.steps) > 0)


@SETTINGS
@given(content=st.one_of(st.binary(max_size=300), garbage_text.map(str.encode)), suffix=st.sampled_from(SUFFIXES))
def test_garbage_files_only_raise_logerror(content, suffix):
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"log{suffix}"
        path.write_bytes(content)
        assert_only_logerror(path)


json_values = st.recursive(
    st.none() | st.booleans() | st.floats() | st.integers() | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.sampled_from(["step", "reward", "x"]), inner, max_size=3),
    max_leaves=10,
)


@SETTINGS
@given(history=st.lists(json_values, max_size=6), max_steps=json_values)
def test_garbage_trainer_state_only_raises_logerror(history, max_steps):
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trainer_state.json"
        path.write_text(json.dumps({"log_history": history, "max_steps": max_steps}))
        assert_only_logerror(path)


cells = st.one_of(st.floats(), st.integers(-5, 5), st.text(max_size=5), st.none(), st.booleans())


@SETTINGS
@given(
    frame=data_frames(
        columns=[column("step", elements=cells), column("reward", elements=cells), column("family", elements=cells)],
        index=range_indexes(max_size=8),
    )
)
def test_garbage_dataframes_only_raise_logerror(frame):
    assert_only_logerror(frame)


@SETTINGS
@given(
    steps=st.lists(st.integers(0, 10_000), min_size=1, max_size=30, unique=True).map(sorted),
    data=st.data(),
    fmt=st.sampled_from(["csv", "jsonl", "tsv"]),
)
def test_round_trip(steps, data, fmt):
    rewards = data.draw(st.lists(st.floats(-1e6, 1e6, allow_nan=False), min_size=len(steps), max_size=len(steps)))
    frame = pd.DataFrame({"step": steps, "reward": rewards, "kl": rewards})
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"run.{fmt}"
        if fmt == "jsonl":
            path.write_text("\n".join(json.dumps(r) for r in frame.to_dict(orient="records")))
        else:
            frame.to_csv(path, index=False, sep="\t" if fmt == "tsv" else ",")
        run = bg.read_log(path)
    assert list(run.steps) == steps
    assert list(run.rewards) == rewards  # exact: both writers keep full precision
    assert list(run.table.columns) == ["step", "reward", "kl"]
