"""verl's console log (``step:N - key:value - ...``) and its JSONL file logger: read, followed live, bad input."""

from __future__ import annotations

import json
import numbers
import pprint
import re
import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import bayes_grpo as bg
from bayes_grpo.cli import main
from bayes_grpo.errors import LogError
from bayes_grpo.logs import LogWarning
from bayes_grpo.logs.trainers import parse_verl_line


def concat_dict_to_str(dict: dict, step):
    """verl's console line, copied from verl/utils/logger/aggregate_logger.py (volcengine/verl at b178a3c, Apache-2.0)."""
    output = [f"step:{step}"]
    for k, v in dict.items():
        if isinstance(v, numbers.Number):
            output.append(f"{k}:{pprint.pformat(v)}")
    output_str = " - ".join(output)
    return output_str


def metrics(step: int, shift: float = 0.0) -> dict:
    """A GRPO step's metrics under verl's keys (verl/trainer/ppo/metric_utils.py, verl/workers/actor/dp_actor.py)."""
    score = 0.2 + 0.5 * (1 - np.exp(-step / 20)) + shift
    out = {
        "actor/entropy": np.float32(0.6 - step / 500), "actor/kl_loss": 0.001 * step, "actor/pg_clipfrac": 0.002,
        "actor/pg_loss": -0.01, "actor/lr": 1e-06, "actor/grad_norm": np.float64(0.2),
        "critic/score/mean": np.float64(score), "critic/score/max": 1.0, "critic/score/min": 0.0,
        "critic/rewards/mean": np.float64(score), "response_length/mean": 300.0 - step,
        "response_length/clip_ratio": 0.01, "training/global_step": step, "training/epoch": 0, "timing_s/gen": 12.5,
    }  # fmt: skip
    if step % 10 == 0:
        out["val-core/openai/gsm8k/reward/mean@1"] = score - 0.05
    return out


def console(steps: range, total: int = 100, shift: float = 0.0) -> str:
    """verl's output through Ray: the worker prefix, tqdm's bar, the start-up lines."""
    lines = [f"Total training steps: {total}", "(TaskRunner pid=2741) " + concat_dict_to_str({"val-core/openai/gsm8k/reward/mean@1": 0.18}, 0)]
    for step in steps:
        lines.append(f"\x1b[36m(TaskRunner pid=2741)\x1b[0m {concat_dict_to_str(metrics(step, shift), step)}")
        lines.append(f"Training Progress:  {step}%|#         | {step}/{total} [00:{step:02d}<01:00,  1.00s/it]\r")
    return "\n".join(lines) + "\n"


def test_console_log_reads_with_ray_prefixes_and_progress_bars(tmp_path):
    log = tmp_path / "verl_grpo.log"
    log.write_text(console(range(1, 31)))
    run = bg.read_log(log)
    np.testing.assert_array_equal(run.steps, np.arange(1, 31))
    np.testing.assert_allclose(run.rewards, [float(metrics(s)["critic/score/mean"]) for s in range(1, 31)])
    assert run.total_steps == 100 and run.meta.provenance["total_steps"] == "console" and run.meta.extra["trainer"] == "verl"
    assert {"completions/mean_length", "completions/clipped_ratio", "clip_ratio/region_mean", "entropy", "kl", "grad_norm",
            "learning_rate", "critic/rewards/mean"} <= set(run.signals)  # fmt: skip
    assert "reward_std" not in run.signals  # verl logs no within-group spread
    assert run.signal("actor/entropy")[0] == pytest.approx(0.598, rel=1e-6)
    evaluation = bg.read_log(log, metric="val-core/openai/gsm8k/reward/mean@1")
    np.testing.assert_array_equal(evaluation.steps, [0, 10, 20, 30])
    assert evaluation.rewards[0] == pytest.approx(0.18)


def test_forecast_says_the_learning_signal_is_missing(tmp_path):
    log = tmp_path / "verl.log"
    log.write_text(console(range(1, 31)))
    fc = bg.default_model().forecast(bg.read_log(log), seed=0)
    assert any("no reward_std" in note and "learning signal" in note for note in fc.caveats)


def test_a_score_capped_at_every_step_keeps_the_forecast_within_it(tmp_path):
    # SLURM's job output, as verl runs on a cluster: every step's best and worst completion scored 1 and 0
    log = tmp_path / "slurm-6231820.out"
    log.write_text(console(range(1, 31), total=400))
    run = bg.read_log(log)
    assert {"completions/max_reward", "completions/min_reward"} <= set(run.signals)
    fc = bg.default_model().forecast(run, seed=0)
    assert fc.prepared.bounds == (0.0, 1.0) and fc.final.samples.max() <= 1.0
    assert any("bounded by 0 and 1" in note and "some completion 1 and some 0" in note for note in fc.caveats)


def test_a_plus_minus_one_score_keeps_the_forecast_within_it(tmp_path):
    # a ReTool-style score: +1 right, -1 wrong; every step has both
    log = tmp_path / "output.log"
    text = console(range(1, 31), total=400).replace("critic/score/min:0.0 - ", "critic/score/min:-1.0 - ")
    log.write_text(text)
    fc = bg.default_model().forecast(bg.read_log(log), seed=0)
    assert fc.prepared.bounds == (-1.0, 1.0) and -1.0 <= fc.final.samples.min() and fc.final.samples.max() <= 1.0
    assert any("bounded by -1 and 1" in note for note in fc.caveats)


def test_inspect_says_where_the_log_shows_the_reward_s_range(tmp_path, capsys):
    log = tmp_path / "slurm-6231820.out"
    log.write_text(console(range(1, 31), total=400))
    assert main(["inspect", str(log)]) == 0
    assert re.search(r"\nreward bounds +0 \.\. 1, read from the log \(every logged step scored some completion 1 and some 0", capsys.readouterr().out)
    moved = tmp_path / "verl.log"
    moved.write_text(console(range(1, 31), total=400).replace("critic/score/max:1.0 - ", "critic/score/max:1.25 - ", 1))
    assert main(["inspect", str(moved)]) == 0
    assert "reward bounds" not in capsys.readouterr().out


def test_a_best_completion_that_moves_shows_no_cap(tmp_path):
    log = tmp_path / "verl.log"
    text = console(range(1, 31), total=400)
    log.write_text(text.replace("critic/score/max:1.0 - ", "critic/score/max:1.25 - ", 1))  # one step's best scored above 1
    fc = bg.default_model().forecast(bg.read_log(log), seed=0)
    assert fc.prepared.reward_ceiling is None and fc.prepared.bounds is None
    assert not any("bounded by" in note for note in fc.caveats)


def test_jsonl_file_logger(tmp_path):
    log = tmp_path / "verl_grpo.jsonl"
    with log.open("w") as fp:  # verl/utils/tracking.py FileLogger.log: orjson.dumps({"step": step, "data": data}) + b"\n"
        for step in range(1, 21):
            data = {k: float(v) for k, v in metrics(step).items()}
            fp.write(json.dumps({"step": step, "data": data}, separators=(",", ":")) + "\n")
    run = bg.read_log(log, total_steps=100)
    np.testing.assert_array_equal(run.steps, np.arange(1, 21))
    assert {"entropy", "kl", "completions/mean_length"} <= set(run.signals)


def test_cut_last_line_and_resume(tmp_path):
    log = tmp_path / "verl.log"
    text = console(range(1, 21))
    resumed = console(range(11, 26), shift=0.01)  # a resume from step 10's checkpoint prints steps 11.. again
    log.write_text(text + resumed + concat_dict_to_str(metrics(26), 26)[:80])
    with pytest.warns(LogWarning) as caught:
        run = bg.read_log(log)
    messages = " ".join(str(w.message) for w in caught)
    assert "cut off mid-write" in messages and "kept the last row of each step" in messages
    np.testing.assert_array_equal(run.steps, np.arange(1, 26))
    assert run.rewards[14] == pytest.approx(float(metrics(15)["critic/score/mean"]) + 0.01)


def test_watch_follows_a_growing_console_log(tmp_path):
    log = tmp_path / "verl.log"
    text = console(range(1, 41))
    cut = text.index("step:13 ") + 40  # half of step 13's line written
    log.write_text(text[:cut])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        updates = bg.watch(log, poll=0.01)
        assert next(updates).run.last_step == 12
        log.write_text(text)
        update = next(updates)
    assert update.run.last_step == 40 and update.signals["entropy"] == pytest.approx(0.52, rel=1e-6)


@pytest.mark.parametrize(
    "name, content",
    [
        ("verl.log", "(TaskRunner pid=1) step:1 - actor/entropy:0.5 - actor/kl_loss:0.01\n" * 3),
        ("verl.jsonl", '{"step": 1, "data": {"critic/score/mean": 0.1}}\n{"step": 2, "data": \n{"step": 3, "data": {}}\n'),
    ],
)
def test_malformed_log_one_line_error_and_exit_2(tmp_path, capsys, name, content):
    log = tmp_path / name
    log.write_text(content)
    with pytest.raises(LogError):
        bg.read_log(log)
    assert main(["forecast", str(log), "--total-steps", "100"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(log) in err


keys = st.from_regex(r"[a-z_]{1,10}(/[a-z_@0-9.-]{1,12}){0,3}", fullmatch=True)
values = st.one_of(
    st.floats(allow_nan=False, allow_infinity=False, width=64).map(np.float64),
    st.floats(allow_nan=False, allow_infinity=False),
    st.integers(-(10**9), 10**9),
    st.floats(allow_nan=False, allow_infinity=False, width=32).map(np.float32),
)
prefixes = st.sampled_from(["", "(TaskRunner pid=1234) ", "\x1b[36m(main_task pid=7)\x1b[0m ", "Training Progress: 3%|#| 3/100 [00:03<01:37]"])


@settings(max_examples=150, deadline=None)
@given(step=st.integers(0, 10**6), logged=st.dictionaries(keys, values, min_size=1, max_size=8), prefix=prefixes)
def test_verl_line_round_trips(step, logged, prefix):
    from bayes_grpo.logs.trainers import _lines

    (line,) = _lines(prefix + concat_dict_to_str(logged, step))[-1:]
    parsed = parse_verl_line(line)
    assert parsed is not None and parsed[0] == step
    assert parsed[1] == {k: float(str(v)) for k, v in logged.items()}  # a float32 as printed: its shortest repr
