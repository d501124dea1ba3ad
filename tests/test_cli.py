"""The bayes-grpo CLI: exit 0 on good logs, exit 2 with one stderr line (no traceback) on bad input."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from bayes_grpo.cli import COMMANDS, main

FIXTURES = Path(__file__).resolve().parent / "fixtures"


def test_inspect_good_logs(capsys):
    logs = [FIXTURES / "trl_tiny", FIXTURES / "unsloth_progress.ipynb", FIXTURES / "trl_tiny" / "console.log"]
    assert main(["inspect", *map(str, logs), "--family", "llama", "--params-b", "0.0001"]) == 0
    out, err = capsys.readouterr()
    assert err == ""
    assert out.count("first / last step") == 3 and "1 / 6" in out and "1 / 12" in out
    assert "reward start (first 1)" in out and "digit_reward, length_reward" in out
    assert "fields missing          reward_range, initial_reward" in out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["inspect", "does-not-exist.csv"], "no such file"),
        (["inspect", str(FIXTURES / "trl_tiny"), "--total-steps", "3"], "total_steps=3 is smaller"),
        (["inspect", str(FIXTURES / "make_trl_fixture.py")], "unsupported file type"),
    ],
)
def test_inspect_bad_input_one_line_exit_2(capsys, args, message):
    assert main(args) == 2
    out, err = capsys.readouterr()
    assert err.startswith("bayes-grpo: error: ") and message in err
    assert err.count("\n") == 1 and "Traceback" not in err


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


def test_warnings_are_single_lines(tmp_path, capsys):
    path = tmp_path / "dup.csv"
    path.write_text("step,reward\n1,0.1\n1,0.2\n2,nan\n3,0.3\n")
    assert main(["inspect", str(path)]) == 0
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2 and all(line.startswith("bayes-grpo: warning: ") for line in err)


def test_usage_errors_exit_2():
    with pytest.raises(SystemExit) as info:
        main(["inspect"])
    assert info.value.code == 2
    assert "inspect" in COMMANDS
