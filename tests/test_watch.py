"""bayes_grpo.watching and ``bayes-grpo watch``: following logs that grow while a writer appends to them."""

from __future__ import annotations

import json
import shutil
import threading
import time
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import bayes_grpo as bg
from bayes_grpo.cli import main
from bayes_grpo.errors import BayesGrpoError
from bayes_grpo.watching import _read_complete, fan_chart, figure_pixels, grpo_signals, panel

FIXTURES = Path(__file__).parent / "fixtures"
RUN = "data/runs/llama-m-sort4-noise0.8-lr0.0001-s0.csv"
POLL = 0.2


def _rows(n: int) -> pd.DataFrame:
    """The first ``n`` steps of a bundled run: step, reward, reward_std."""
    table = bg.read_log(Path(__file__).parents[1] / RUN).table
    return table[["step", "reward", "reward_std"]].head(n).reset_index(drop=True)


def _lines(rows: pd.DataFrame, suffix: str) -> list[str]:
    """One log line per row (with its line end), as a CSV writer or a JSONL logger writes them."""
    if suffix == ".jsonl":
        return [json.dumps({"step": int(r.step), "reward": float(r.reward), "reward_std": float(r.reward_std)}) + "\n" for r in rows.itertuples()]
    return [f"{int(r.step)},{float(r.reward)!r},{float(r.reward_std)!r}\n" for r in rows.itertuples()]


class _Writer(threading.Thread):
    """Appends log lines in batches; the last line of every batch in two halves, a few polls apart."""

    def __init__(self, path: Path, lines: list[str], batches: list[int]) -> None:
        super().__init__(daemon=True)
        self.path, self.lines, self.batches = path, lines, batches
        self.written_at: dict[int, float] = {}  # lines written -> when the batch's last line was complete

    def run(self) -> None:
        done = 0
        for size in self.batches:
            time.sleep(3 * POLL)
            batch = self.lines[done : done + size]
            with self.path.open("a") as handle:
                handle.write("".join(batch[:-1]) + batch[-1][: len(batch[-1]) // 2])
            time.sleep(3 * POLL)  # the watcher looks at the half line at least twice
            with self.path.open("a") as handle:
                handle.write(batch[-1][len(batch[-1]) // 2 :])
            done += size
            self.written_at[done] = time.monotonic()


@pytest.mark.parametrize("suffix", [".csv", ".jsonl"])
def test_watch_follows_a_growing_log_and_never_reads_a_half_line(tmp_path: Path, suffix: str) -> None:
    rows = _rows(60)
    path = tmp_path / f"run{suffix}"
    path.write_text("step,reward,reward_std\n" if suffix == ".csv" else "")
    writer = _Writer(path, _lines(rows, suffix), batches=[20, 20, 20])
    updates, seen_at = [], []
    writer.start()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "waiting for ...: no steps yet" until the first batch lands
        for update in bg.watch(path, total_steps=60, poll=POLL):
            updates.append(update)
            seen_at.append(time.monotonic())
    writer.join()
    lengths = [len(u.run) for u in updates]
    assert len(updates) >= 2 and lengths == sorted(set(lengths)) and lengths[-1] == 60
    assert updates[-1].finished and not any(u.finished for u in updates[:-1])
    for update in updates:  # every update holds exactly the lines whose line end was written: never a half line
        np.testing.assert_array_equal(update.run.rewards, rows.reward.to_numpy()[: len(update.run)])
        assert update.decision.step == update.run.last_step and update.forecast.total_steps == 60
    assert [step for step, _ in updates[-1].history] == [int(rows.step.iloc[n - 1]) for n in lengths]
    assert updates[-1].signals["reward std within a step"] == rows.reward_std.iloc[-1]
    # Each batch shows up in the next look: within one poll interval, plus the forecast of the update before it.
    for written, when in writer.written_at.items():
        shown = min(t for t, n in zip(seen_at, lengths) if n >= written)
        assert shown - when < POLL + 20


def _trainer_state(entries: int, max_steps: int) -> str:
    state = json.loads((FIXTURES / "trl_tiny" / "trainer_state.json").read_text())
    state["log_history"] = state["log_history"][:entries]
    state["global_step"], state["max_steps"] = entries, max_steps
    return json.dumps(state, indent=2)


def test_watch_reads_the_newest_complete_checkpoint_of_an_output_folder(tmp_path: Path) -> None:
    """A checkpoint whose trainer_state.json is still being written gives way to the one before it, until it is complete."""
    (tmp_path / "checkpoint-4").mkdir()
    (tmp_path / "checkpoint-4" / "trainer_state.json").write_text(_trainer_state(4, max_steps=6))
    (tmp_path / "checkpoint-6").mkdir()  # the trainer is writing this one: its model files, then a cut trainer_state.json
    full = _trainer_state(6, max_steps=6)
    (tmp_path / "checkpoint-6" / "trainer_state.json").write_text(full[: len(full) // 2])
    updates = bg.watch(tmp_path, reward_range=(-2, 1), poll=POLL)
    first = next(updates)
    assert first.run.last_step == 4 and first.source == tmp_path / "checkpoint-4" / "trainer_state.json" and not first.finished
    (tmp_path / "checkpoint-6" / "trainer_state.json").write_text(full)
    second = next(updates)
    assert second.run.last_step == 6 and second.finished and second.source.parent.name == "checkpoint-6"
    assert [step for step, _ in second.history] == [4, 6]
    assert {"reward digit_reward", "reward length_reward", "entropy"} <= set(second.signals)
    with pytest.raises(StopIteration):  # the planned end is reached: the watch is over
        next(updates)


def test_cli_watch_once_prints_the_forecast_and_decision(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "run.csv"
    _rows(150).to_csv(path, index=False)
    plot = tmp_path / "fan.png"
    assert main(["watch", str(path), "--once", "--total-steps", "300", "--plot", str(plot)]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "150 of 300 steps (50%)" in out and "forecast final" in out and "90% interval" in out
    assert "Keep training at step 150 of 300" in out or "Stop now at step 150 of 300" in out
    assert "reward std within a step" in out
    assert plot.read_bytes().startswith(b"\x89PNG")


def test_watch_forecasts_another_metric_and_names_unknown_ones(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "run.csv"
    rows = _rows(150).assign(**{"rewards/correctness/mean": lambda t: t["reward"] / 3})
    rows.to_csv(path, index=False)
    update = next(bg.watch(path, total_steps=300, once=True, metric="rewards/correctness/mean"))
    assert update.run.metric == "rewards/correctness/mean"
    assert update.run.rewards[-1] == pytest.approx(rows["reward"].iloc[-1] / 3)
    assert main(["watch", str(path), "--once", "--total-steps", "300", "--metric", "nope"]) == 2
    err = capsys.readouterr().err
    assert "no metric 'nope'" in err and "rewards/correctness/mean" in err


def test_cli_watch_follows_a_growing_log_until_its_planned_end(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rows = _rows(40)
    path = tmp_path / "run.csv"
    path.write_text("step,reward,reward_std\n" + "".join(_lines(rows.head(20), ".csv")))
    writer = _Writer(path, _lines(rows.tail(20), ".csv"), batches=[20])
    writer.start()
    assert main(["watch", str(path), "--total-steps", "40", "--poll", str(POLL)]) == 0
    writer.join()
    out = capsys.readouterr().out
    panels = out.split("bayes-grpo watch")[1:]  # one panel per update (a pipe, not a terminal)
    assert len(panels) >= 2 and "20 of 40 steps" in panels[0] and "40 of 40 steps" in panels[-1]
    assert "reached its planned end" in panels[-1] and not any("reached" in panel for panel in panels[:-1])


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["missing.csv", "--once"], "missing.csv"),
        (["RUN", "--once"], "pass --total-steps"),
        (["RUN", "--once", "--total-steps", "300", "--plot", "fan.gif"], "--plot fan.gif: give a file name ending in .png"),
    ],
)
def test_cli_watch_bad_input_is_one_error_line(tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str) -> None:
    path = tmp_path / "run.csv"
    _rows(30).to_csv(path, index=False)
    code = main(["watch", *[str(path) if a == "RUN" else str(tmp_path / a) if a == "missing.csv" else a for a in args]])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and err.startswith("bayes-grpo: error:") and message in err


def test_watch_rejects_a_poll_that_is_not_positive() -> None:
    with pytest.raises(BayesGrpoError, match="poll must be a number of seconds > 0"):
        next(bg.watch("run.csv", poll=0))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cut=st.integers(min_value=1, max_value=10_000), suffix=st.sampled_from([".csv", ".jsonl"]))
def test_a_log_cut_anywhere_is_read_as_its_complete_lines(tmp_path: Path, cut: int, suffix: str) -> None:
    """A log cut at any byte reads as exactly the rows whose line ends are written, under its own name."""
    rows = _rows(12)
    text = ("step,reward,reward_std\n" if suffix == ".csv" else "") + "".join(_lines(rows, suffix))
    path = tmp_path / f"cut{cut}{suffix}"
    path.write_text(text[: min(cut, len(text))])
    complete = text[: min(cut, len(text))].count("\n") - (suffix == ".csv")
    try:
        run, used = _read_complete(path, {"total_steps": 20}, whole_lines=True)
    except bg.LogError as error:  # no complete row yet: nothing to read, and the message names the log itself
        assert complete < 1 and str(path) in str(error)
        return
    assert len(run) == complete and used == path and run.meta.source == str(path) and run.run_id == path.stem
    np.testing.assert_array_equal(run.rewards, rows.reward.to_numpy()[:complete])


def test_grpo_signals_and_the_panel_of_a_real_trl_log() -> None:
    run = bg.read_log(FIXTURES / "trl_tiny")
    signals = grpo_signals(run)
    assert signals["reward std within a step"] == run.signal("reward_std")[-1]
    assert signals["reward digit_reward"] == run.signal("rewards/digit_reward/mean")[-1]
    assert list(signals)[-2:] == ["reward digit_reward", "reward length_reward"]
    from rich.console import Console

    update = next(bg.watch(FIXTURES / "trl_tiny", reward_range=(-2, 1), once=True))
    console = Console(record=True, width=120)
    console.print(panel(update, poll=5))
    text = console.export_text()
    assert "6 of 6 steps (100%)" in text and "P(plateau)" in text and "reached its planned end" in text
    pixels = figure_pixels(fan_chart(update.forecast, update.decision, update.history))
    assert pixels.dtype == np.uint8 and pixels.shape[2] == 3 and pixels.shape[0] > 300


def test_watch_waits_for_an_output_folder_that_has_no_checkpoint_yet(tmp_path: Path) -> None:
    """Started before the first save: one warning, then the first checkpoint's update."""
    updates = bg.watch(tmp_path, reward_range=(-2, 1), poll=POLL)

    def save_later() -> None:
        time.sleep(4 * POLL)
        shutil.copytree(FIXTURES / "trl_tiny" / "checkpoint-6", tmp_path / "checkpoint-6")

    threading.Thread(target=save_later, daemon=True).start()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        update = next(updates)
    assert update.run.last_step == 6 and update.finished
    waiting = [str(w.message) for w in caught if "waiting for" in str(w.message)]
    assert len(waiting) == 1 and "trainer_state.json" in waiting[0]


def test_watch_once_leaves_out_a_half_written_last_line_but_reads_a_finished_log_without_its_line_end(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--once`` on a log caught mid-write (``...\\n200,-0.``) reads the steps before it, as following does."""
    rows = _rows(200)[["step", "reward"]]
    path = tmp_path / "run.csv"
    path.write_text("step,reward\n" + "".join(f"{int(r.step)},{float(r.reward)!r}\n" for r in rows.head(199).itertuples()) + "200,-0.")
    update = next(bg.watch(path, total_steps=400, once=True))
    assert update.run.last_step == 199 and update.run.rewards[-1] == pytest.approx(rows.reward.iloc[198])
    assert main(["watch", str(path), "--once", "--total-steps", "400"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "199 of 400 steps" in out and "200 of 400 steps" not in out
    finished = next(bg.watch(path, total_steps=200, once=True))  # step 200 is the planned end: the log is complete
    assert finished.run.last_step == 200 and finished.finished


def test_the_watch_panel_fits_an_80_by_24_terminal() -> None:
    """A typical TRL log (eleven GRPO signals), a long footer: the panel leaves a line for the prompt."""
    from rich.console import Console

    update = next(bg.watch(FIXTURES / "trl_tiny", reward_range=(-2, 1), once=True))
    assert len(update.signals) >= 10
    console = Console(record=True, width=80, height=24)
    console.print(panel(update, poll=5, plot=Path("runs/watch/fan_chart.png")))
    text = console.export_text()
    assert len(text.splitlines()) <= 23
    assert "reward std within a step" in text and "reward length_reward" in text and "fan chart in" in text


def test_watch_plot_files_get_the_permissions_of_any_new_file(tmp_path: Path) -> None:
    """The fan chart is written through a temporary file (mode 0600); the file itself honours the umask."""
    import os

    path = tmp_path / "run.csv"
    _rows(60).to_csv(path, index=False)
    plot = tmp_path / "fan.png"
    previous = os.umask(0o022)
    try:
        assert main(["watch", str(path), "--once", "--total-steps", "120", "--plot", str(plot)]) == 0
    finally:
        os.umask(previous)
    assert plot.stat().st_mode & 0o777 == 0o644
