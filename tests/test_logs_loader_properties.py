"""Property tests for the issue-15 loaders: W&B web-UI exports, cut JSONL, resumed console logs, encodings."""

from __future__ import annotations

import csv
import json
import tempfile
import warnings
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import bayes_grpo as bg
from bayes_grpo.logs import LogWarning, read_runs

SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
finite = st.floats(-1e6, 1e6, allow_nan=False)
run_names = st.text(st.sampled_from("abcxyz-_. 0123456789"), min_size=1, max_size=12).map(str.strip).filter(bool)


@SETTINGS
@given(
    names=st.lists(run_names, min_size=1, max_size=4, unique=True),
    data=st.data(),
    x_axis=st.sampled_from(["Step", "train/global_step"]),
)
def test_wandb_export_round_trip(names, data, x_axis):
    """Any W&B chart export loads as one run per run, each with exactly its own steps and values."""
    runs = {}
    for name in names:
        steps = data.draw(st.lists(st.integers(0, 500), min_size=1, max_size=15, unique=True).map(sorted))
        runs[name] = dict(zip(steps, data.draw(st.lists(finite, min_size=len(steps), max_size=len(steps)))))
    all_steps = sorted({s for r in runs.values() for s in r})
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "export.csv"
        with path.open("w", newline="") as handle:
            writer = csv.writer(handle, quoting=csv.QUOTE_ALL)
            writer.writerow([x_axis] + [f"{n} - train/reward{a}" for n in runs for a in ("", "__MIN", "__MAX")])
            for step in all_steps:
                writer.writerow([step] + [v for r in runs.values() for v in [r.get(step, "")] * 3])
        loaded = bg.load_runs(path)
        assert [r.run_id for r in read_runs(path)] == loaded.run_ids
        if len(runs) > 1:
            with pytest.raises(bg.LogError, match=f"holds {len(runs)} runs"):
                bg.read_log(path)
        else:
            assert bg.read_log(path).run_id == names[0]
    assert loaded.run_ids == names
    for run in loaded:
        assert list(run.steps) == sorted(runs[run.run_id])
        assert list(run.rewards) == [runs[run.run_id][s] for s in run.steps]


records = st.lists(
    st.fixed_dictionaries({"step": st.integers(0, 10**6), "reward": finite, "note": st.text(max_size=6)}),
    min_size=2,
    max_size=10,
    unique_by=lambda r: r["step"],
)


@SETTINGS
@given(rows=records, data=st.data())
def test_jsonl_cut_anywhere_in_the_last_line(rows, data):
    """Cutting the last line anywhere drops just that line, with a warning naming it."""
    lines = [json.dumps(r, ensure_ascii=False) for r in rows]
    last = lines[-1].encode()
    cut = data.draw(st.integers(1, len(last) - 1))
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "m.jsonl"
        path.write_bytes(("\n".join(lines[:-1]) + "\n").encode() + last[:cut])
        with pytest.warns(LogWarning, match=f"line {len(lines)} \\(the last\\) is cut off"):
            run = bg.read_log(path)
    kept = sorted(rows[:-1], key=lambda r: r["step"])
    assert list(run.steps) == [r["step"] for r in kept]
    assert list(run.rewards) == [r["reward"] for r in kept]


@SETTINGS
@given(rows=records, data=st.data())
def test_jsonl_broken_line_before_the_last_is_an_error(rows, data):
    lines = [json.dumps(r) for r in rows]
    broken = data.draw(st.integers(0, len(lines) - 2))
    lines[broken] = lines[broken][: data.draw(st.integers(1, len(lines[broken]) - 1))]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "m.jsonl"
        path.write_text("\n".join(lines) + "\n")
        with pytest.raises(bg.LogError, match=f"line {broken + 1} is not JSON"):
            bg.read_log(path)


@SETTINGS
@given(
    total=st.integers(4, 300),
    data=st.data(),
    steps_per_epoch=st.integers(1, 400),
)
def test_resumed_console_log(total, data, steps_per_epoch):
    """Crash after step c, resume from checkpoint k <= c: every step once, the re-run's values, c - k replaced."""
    checkpoint = data.draw(st.integers(1, total - 1))
    crash = data.draw(st.integers(checkpoint + 1, total))

    def line(step: int, reward: float) -> str:
        return str({"loss": "0.1", "reward": repr(reward), "epoch": f"{step / steps_per_epoch:.4g}"})

    first = [line(s, float(s)) for s in range(1, crash + 1)]
    second = [line(s, s + 0.5) for s in range(checkpoint + 1, total + 1)]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "train.log"
        path.write_text("\n".join(first + second) + "\n")
        with pytest.warns(LogWarning, match=f"{crash - checkpoint} logged step\\(s\\) were logged again"):
            run = bg.read_log(path)
    assert list(run.steps) == list(range(1, total + 1))
    expected = [float(s) if s <= checkpoint else s + 0.5 for s in range(1, total + 1)]
    assert list(run.rewards) == expected


@SETTINGS
@given(epochs=st.lists(st.one_of(st.floats(allow_nan=True), st.text(max_size=4), st.none()), min_size=1, max_size=12))
@example(epochs=[1.5909613979549862e-252, -2.8600603829346317e56])  # a resume 10^308 advances away: no step to place it at
def test_console_dicts_with_any_epochs_only_raise_logerror(epochs):
    text = "\n".join(str({"reward": "0.5", "epoch": e}) for e in epochs)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "x.log"
        path.write_text(text)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", LogWarning)
                run = bg.read_log(path)
        except bg.LogError:
            return
    assert len(run) >= 1 and np.all(np.diff(run.steps) > 0)


latin1_text = st.tuples(
    st.characters(min_codepoint=0xC0, max_codepoint=0xFF),
    st.text(st.characters(min_codepoint=32, max_codepoint=255, exclude_characters=',"\r\n\x7f\x85'), max_size=20),
).map("".join)


@SETTINGS
@given(value=latin1_text)
def test_latin1_csv(value):
    """Latin-1 text is a LogError naming the problem and the fix; with encoding='latin-1' it loads unchanged."""
    content = f"step,reward,dataset\n1,0.5,{value}\n2,0.6,{value}\n".encode("latin-1")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "r.csv"
        path.write_bytes(content)
        try:
            content.decode("utf-8")
        except UnicodeDecodeError:  # the usual case; a few Latin-1 byte pairs happen to be valid UTF-8 too
            expected = r"r\.csv: not valid UTF-8 \(byte 0x[0-9a-f]{2} at position \d+, line 2.*looks like Latin-1/cp1252 text; pass encoding="
            with pytest.raises(bg.LogError, match=expected):
                bg.read_log(path)
        run = bg.read_log(path, encoding="latin-1")
    assert list(run.rewards) == [0.5, 0.6]
    assert run.meta.extra["dataset"] == value


wandb_fragments = st.sampled_from(
    ['"Step"', '"a - train/reward"', '"a - train/reward__MIN"', '"b - train/reward__MAX"', '"b - train/kl"', ",", "\n",
     '""', '"1"', '"0.5"', '"nan"', '"x"', " - ", "__MIN", '"train/global_step"', '"-1"', '"1e400"']
)  # fmt: skip


@SETTINGS
@given(parts=st.lists(wandb_fragments, max_size=50))
def test_garbage_wandb_exports_only_raise_logerror(parts):
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "export.csv"
        path.write_text('"Step","a - train/reward"\n' + "".join(parts))
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", LogWarning)
                runs = bg.load_runs(path)
        except bg.LogError:
            return
    for run in runs:
        assert len(run) > 0 and np.all(np.isfinite(run.rewards)) and np.all(np.diff(run.steps) > 0)
