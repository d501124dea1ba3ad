"""The bayes-grpo CLI: exit 0 on good logs, exit 2 with one stderr line (no traceback) on bad input.

Everything here is checked before a model is loaded, so these tests are fast (except the one
``report --results`` run, marked slow); commands that forecast are in ``test_cli_model.py``.
"""

from __future__ import annotations

import argparse
import base64
import json
import math
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bayes_grpo.cli import COMMANDS, _cli_wording, _non_negative_float, _positive_float, _probability, _warnings_as_lines, main, read_results
from bayes_grpo.errors import BayesGrpoError

FIXTURES = Path(__file__).resolve().parent / "fixtures"


def test_inspect_good_logs(capsys):
    logs = [FIXTURES / "trl_tiny", FIXTURES / "unsloth_progress.ipynb", FIXTURES / "trl_tiny" / "console.log"]
    assert main(["inspect", *map(str, logs), "--family", "llama", "--params-b", "0.0001"]) == 0
    out, err = capsys.readouterr()
    assert err == ""
    assert out.count("first / last step") == 3 and "1 / 6" in out and "1 / 12" in out
    assert "reward start (first 1)" in out and "digit_reward, length_reward" in out
    assert "fields missing          reward_range, initial_reward" in out


def test_inspect_accepts_a_reward_range(capsys):
    assert main(["inspect", str(FIXTURES / "trl_tiny"), "--reward-range", "-2", "0"]) == 0
    out = capsys.readouterr().out
    assert "reward_range" not in out.split("fields missing", 1)[1]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["inspect", "does-not-exist.csv"], "no such file"),
        (["inspect", str(FIXTURES / "trl_tiny"), "--total-steps", "3"], "--total-steps 3 is before the last logged step 6"),
        (["inspect", str(FIXTURES / "make_trl_fixture.py")], "unsupported file type"),
    ],
)
def test_inspect_bad_input_one_line_exit_2(capsys, args, message):
    assert main(args) == 2
    out, err = capsys.readouterr()
    assert err.startswith("bayes-grpo: error: ") and message in err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert "total_steps" not in err  # the CLI's flag names, not Python's


def _csv(path: Path, rows: list[tuple[int, float]], total_steps: int | None = 100) -> Path:
    lines = ["step,reward" + (",total_steps" if total_steps else "")]
    lines += [f"{s},{r}" + (f",{total_steps}" if total_steps else "") for s, r in rows]
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["forecast", "{log}", "--at", "99"], "--at 99 is beyond the last logged step 6"),
        (["stop", "{log}", "--at", "500"], "--at 500 is beyond the last logged step 6"),
        (["forecast", "{log}", "--params-b", "-1"], "argument --params-b: must be positive, got -1"),
        (["forecast", "{log}", "--params-b", "0"], "argument --params-b: must be positive, got 0"),
        (["stop", "{log}", "--tolerance", "-0.1"], "argument --tolerance: must be 0 or more, got -0.1"),
        (["stop", "{log}", "--threshold", "1.5"], "argument --threshold: must be between 0 and 1 (exclusive), got 1.5"),
        (["stop", "{log}", "--threshold", "0"], "argument --threshold: must be between 0 and 1 (exclusive), got 0"),
        (["stop", "{log}", "--threshold", "high"], "argument --threshold: expected a number, got 'high'"),
        (["stop", "{log}", "--threshold", "nan"], "argument --threshold: expected a finite number"),
        (["stop", "{log}", "--value-per-reward", "10"], "needs both --value-per-reward and --cost-per-step"),
        (["forecast", "{log}", "--total-steps", "0"], "argument --total-steps: must be at least 1, got 0"),
        (["forecast", "{log}", "--reward-range", "1", "0"], "--reward-range 1 0: LO must be below HI"),
        (["forecast", "{log}", "--reward-range", "0", "1"], "6 logged reward(s) lie outside the reward range 0 to 1"),
        (["forecast", "{log}", "--plot", "chart.txt"], "--plot chart.txt: give a file name ending in .png, .pdf or .svg"),
        (["demo", "--fraction", "1.2"], "argument --fraction: must be between 0 and 1 (exclusive), got 1.2"),
        (["demo", "--draws", "-5"], "argument --draws: must be at least 1, got -5"),
    ],
)
def test_out_of_range_options_one_line_exit_2(capsys, args, message):
    code = _exit_code([a.replace("{log}", str(FIXTURES / "trl_tiny")) for a in args])
    assert code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err and "error: " in err
    assert message in err


def _exit_code(argv: list[str]) -> int:
    """main()'s return code, or the SystemExit code of an argparse usage error."""
    try:
        return main(argv)
    except SystemExit as exc:
        return int(exc.code)


def test_a_log_without_total_steps_asks_for_the_flag(tmp_path, capsys):
    log = _csv(tmp_path / "run.csv", [(s, 0.1 * s) for s in range(1, 11)], total_steps=None)
    assert main(["forecast", str(log)]) == 2
    err = capsys.readouterr().err
    assert "pass --total-steps" in err and "total_steps=" not in err


def test_a_one_row_log_without_a_range_is_an_error_not_a_forecast(tmp_path, capsys):
    log = _csv(tmp_path / "one.csv", [(1, 0.4)])
    assert main(["forecast", str(log)]) == 2
    err = capsys.readouterr().err
    assert "only 1 logged step(s)" in err and "--reward-range LO HI for a prior-only forecast" in err


def test_console_script_subprocess(tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text("step,reward\n1,oops\n")
    result = subprocess.run(
        [sys.executable, "-m", "bayes_grpo", "inspect", str(FIXTURES / "unsloth_progress.txt"), str(bad)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert result.returncode == 2
    assert "run                     unsloth_progress" in result.stdout  # good logs are still shown
    assert result.stderr.strip().splitlines() == [
        f"bayes-grpo: error: {bad}: field 'reward' is not numeric (1 value(s) like 'oops'); give numbers in the 'reward' column"
    ]


def test_out_of_range_at_in_a_subprocess_has_no_traceback():
    result = subprocess.run(
        [sys.executable, "-m", "bayes_grpo", "forecast", str(FIXTURES / "trl_tiny"), "--at", "1000"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.splitlines() == [
        f"bayes-grpo: error: --at 1000 is beyond the last logged step 6 of {FIXTURES / 'trl_tiny'}; give a step from 1 to 6"
    ]


def test_warnings_are_single_lines(tmp_path, capsys):
    path = tmp_path / "dup.csv"
    path.write_text("step,reward\n1,0.1\n1,0.2\n2,nan\n3,0.3\n")
    assert main(["inspect", str(path)]) == 0
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2 and all(line.startswith("bayes-grpo: warning: ") for line in err)


def test_runtime_warnings_become_one_formatted_line(capsys):
    import numpy as np

    with _warnings_as_lines():
        np.log(np.array([-1.0]))  # numpy's "invalid value encountered in log"
        warnings.warn("first line\nsecond line", RuntimeWarning)
    err = capsys.readouterr().err.splitlines()
    assert err == ["bayes-grpo: warning: invalid value encountered in log", "bayes-grpo: warning: first line second line"]


def test_library_messages_use_the_flag_names():
    given_flag = argparse.Namespace(total_steps=3, params_b=None)
    assert _cli_wording("x: total_steps=3 is smaller than 6; or leave total_steps unset", given_flag) == (
        "x: --total-steps 3 is smaller than 6; or leave --total-steps unset"
    )
    not_given = argparse.Namespace(total_steps=None)
    # Advice always names the flag; a value read from the log keeps its field name.
    assert _cli_wording("run: pass total_steps= (the planned steps)", not_given) == "run: pass --total-steps (the planned steps)"
    assert _cli_wording("log.csv: total_steps=5 is smaller", not_given) == "log.csv: total_steps=5 is smaller"


@given(st.floats(allow_nan=True, allow_infinity=True))
def test_option_validators_accept_exactly_their_range(value):
    checks = [(_probability, lambda v: 0 < v < 1), (_positive_float, lambda v: v > 0), (_non_negative_float, lambda v: v >= 0)]
    for parse, ok in checks:
        if math.isfinite(value) and ok(value):
            assert parse(repr(value)) == value
        else:
            with pytest.raises(argparse.ArgumentTypeError):
                parse(repr(value))


@given(st.text(max_size=12))
def test_option_validators_reject_text_that_is_not_a_number(text):
    try:
        value = float(text)
    except ValueError:
        with pytest.raises(argparse.ArgumentTypeError):
            _probability(text)
    else:
        assert (0 < value < 1) == _accepts(text)


def _accepts(text: str) -> bool:
    try:
        _probability(text)
    except argparse.ArgumentTypeError:
        return False
    return True


def test_usage_errors_exit_2(capsys):
    with pytest.raises(SystemExit) as info:
        main(["inspect"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("bayes-grpo inspect: error: ")
    assert "inspect" in COMMANDS


@pytest.mark.parametrize("command", [[]] + [[name] for name in COMMANDS if name != "generate"])
def test_help_shows_percent_signs_as_written(command, capsys):
    """argparse %-formats help= strings but not a description: neither may show a doubled '%%'."""
    with pytest.raises(SystemExit) as info:
        main([*command, "--help"])
    out = capsys.readouterr().out
    assert info.value.code == 0 and "%%" not in out
    if command in (["watch"], ["demo"]):
        assert "90% interval" in out or "30% of their steps" in out


def _results_folder(folder: Path) -> tuple[Path, bytes]:
    """A benchmark-style results folder: one markdown file with a pipe table that shows a real PNG figure."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    folder.mkdir()
    figure = Figure(figsize=(3, 2))
    figure.add_subplot().plot([1, 2, 3], [0.2, 0.5, 0.55])
    figure.savefig(folder / "speed.png", dpi=40)
    (folder / "speed.md").write_text(
        "# Forecast speed\n\n| runs | seconds per forecast |\n|---|---|\n| 12 | 0.0473 |\n\n![speed](speed.png)\n",
        encoding="utf-8",
    )
    return folder, (folder / "speed.png").read_bytes()


def test_read_results_takes_each_markdown_file_with_the_pngs_it_shows(tmp_path):
    folder, png = _results_folder(tmp_path / "results")
    (folder / "notes.md").write_text("plain text, no figure\n", encoding="utf-8")
    results = read_results(folder)
    assert list(results) == ["notes.md", "speed.md"]
    assert results["notes.md"] == ["plain text, no figure\n"]
    text, image = results["speed.md"]
    assert "| 12 | 0.0473 |" in text and image == png and image.startswith(b"\x89PNG")


def test_read_results_warns_about_a_missing_png_and_refuses_a_folder_without_markdown(tmp_path):
    (tmp_path / "gone.md").write_text("![lost](lost.png)\n", encoding="utf-8")
    with pytest.warns(RuntimeWarning, match="lost.png"):
        assert read_results(tmp_path) == {"gone.md": ["![lost](lost.png)\n"]}
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(BayesGrpoError, match="no markdown"):
        read_results(empty)


def test_report_results_that_is_not_a_folder_is_one_line_exit_2(tmp_path, capsys):
    code = main(["report", "--results", str(tmp_path / "missing"), "--out", str(tmp_path / "r.html")])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "--results" in err and "not a folder" in err
    assert not (tmp_path / "r.html").exists()


@pytest.mark.slow
def test_report_embeds_the_results_folder(tmp_path, quick_model, few_runs, capsys):
    folder, png = _results_folder(tmp_path / "results")
    model_file = quick_model.save(tmp_path / "model.nc")
    run_file = tmp_path / f"{few_runs[0].run_id}.csv"
    few_runs[0].to_frame().to_csv(run_file, index=False)
    out = tmp_path / "report.html"
    argv = ["report", "--model", str(model_file), "--runs", str(run_file), "--results", str(folder), "--out", str(out), "--quick", "--shown", "1"]
    assert main(argv) == 0
    assert str(out) in capsys.readouterr().out
    page = out.read_text(encoding="utf-8")
    assert "<h3>speed.md</h3>" in page and "<td>0.0473</td>" in page
    assert base64.b64encode(png).decode("ascii") in page


def test_an_encoding_error_names_the_encoding_flag(tmp_path, capsys):
    """A Latin-1 log is one error line that names ``--encoding``; with the flag it reads (inspect, forecast's reader, fit's)."""
    source = FIXTURES / "latin1_run.csv"
    assert main(["inspect", str(source)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("bayes-grpo: error: ") and err.count("\n") == 1
    assert "looks like Latin-1/cp1252" in err and "pass --encoding cp1252" in err
    assert "encoding=" not in err and "read_log" not in err  # a CLI fix, not a Python argument
    assert main(["inspect", str(source), "--encoding", "cp1252"]) == 0
    assert "fields missing" in capsys.readouterr().out
    assert main(["inspect", str(source), "--encoding", "utf-8"]) == 2
    assert "check --encoding" in capsys.readouterr().err
    for command in ("forecast", "stop", "fit", "report", "demo"):
        parser = argparse.ArgumentParser()
        COMMANDS[command][0](parser.add_subparsers())
        assert any("--encoding" in action.option_strings for sub in parser._subparsers._group_actions[0].choices.values() for action in sub._actions), command


# ------------------------------------------------------------------ --metric and the metrics a log has


def test_inspect_lists_metrics_with_their_logging_frequency_and_grpo_signals(capsys, tmp_path):
    history = [{"step": s, "reward": 0.01 * s, "reward_std": 0.3, "rewards/acc/mean": 0.01 * s, "rewards/acc/std": 0.2} for s in range(1, 501)]
    history += [{"step": s, "eval_accuracy": 0.001 * s} for s in range(50, 501, 50)]
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "trainer_state.json").write_text(json.dumps({"max_steps": 500, "log_history": history}))
    assert main(["inspect", str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out
    assert "reward functions         acc (means and stds)" in out
    assert "GRPO signals             reward_std\n" in out and "GRPO signals missing     frac_reward_zero_std, " in out
    assert "  eval_accuracy     every 50 steps, 10 values" in out and "  rewards/acc/std   every step, 500 values" in out
    assert main(["inspect", str(tmp_path / "out"), "--metric", "eval/accuracy"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^metric +eval_accuracy\nsource", out, re.M) and re.search(r"^steps logged +10$", out, re.M)


@pytest.mark.parametrize("command", ["inspect", "forecast", "stop"])
def test_unknown_metric_is_one_line_listing_the_metrics(capsys, command):
    log = FIXTURES / "trl_tiny"
    assert main([command, str(log), "--metric", "nope"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no metric 'nope' in the log; it has: " in err
    assert "rewards/digit_reward/mean" in err and "frac_reward_zero_std" in err


def test_rank_unknown_metric_exits_2(capsys):
    log = FIXTURES / "trl_tiny"
    assert main(["rank", str(log), str(log / "console.log"), "--metric", "nope"]) == 2
    assert "no metric 'nope'" in capsys.readouterr().err


def test_components_with_another_metric_is_refused_before_the_model(capsys):
    assert main(["forecast", str(FIXTURES / "unsloth_progress.txt"), "--components", "--metric", "kl", "--total-steps", "50"]) == 2
    assert "--components forecasts the reward functions" in capsys.readouterr().err
