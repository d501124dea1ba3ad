"""What the command line prints besides its results (issue 48, item 9): warnings in CLI terms, one line per cause, no bars in logs."""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from bayes_grpo.cli import main
from bayes_grpo.cli._common import _advice_wording
from bayes_grpo.settings import bundled_runs_dir

BUNDLED = bundled_runs_dir() / "llama-m-sort4-noise0.8-lr0.0001-s0.csv"
#: What a terminal-only progress bar leaves in a log: carriage returns and ANSI escape sequences.
BAR_DEBRIS = re.compile(r"\r|\x1b\[")


def test_a_constant_loss_warns_about_the_loss_and_names_the_flag(tmp_path, capsys):
    """``--metric loss --minimize`` on a loss that is 0 at every step: the warning names the loss and ``--reward-range LO HI``."""
    steps = np.arange(1, 61)
    log = tmp_path / "loss.csv"
    pd.DataFrame({"step": steps, "reward": 0.2 + 0.005 * steps, "loss": np.zeros(steps.size)}).to_csv(log, index=False)
    assert main(["forecast", str(log), "--total-steps", "200", "--metric", "loss", "--minimize", "--rows", "2"]) == 0
    err = capsys.readouterr().err
    warning = next(line for line in err.splitlines() if "all equal" in line)
    assert "values of loss logged so far are all equal" in warning and "rewards" not in warning
    assert "--reward-range LO HI" in warning
    assert "reward_range" not in err and "(min, max)" not in err


def test_library_advice_in_warnings_and_notes_names_the_flags():
    assert _advice_wording("no scale; pass reward_range=(min, max) for one") == "no scale; pass --reward-range LO HI for one"
    assert _advice_wording("pass reward_range=(min, max) if that is wrong") == "pass --reward-range LO HI if that is wrong"
    assert _advice_wording("run: pass total_steps= (the planned steps)") == "run: pass --total-steps (the planned steps)"
    # A value or a bare name may be the log's own, not a flag: left alone.
    assert _advice_wording("total_steps=1200 is more than 4 times the threshold") == "total_steps=1200 is more than 4 times the threshold"


def test_poor_importance_weights_are_reported_once(tmp_path, capsys):
    """The 'too-clean' run of test_forecast_trend: its weights stay poor, which the CLI says in one line, not two."""
    rewards = 0.1 + 0.5 * np.sqrt(np.linspace(0, 1, 600)) + 0.001 * np.random.default_rng(0).standard_normal(600)
    log = tmp_path / "too_clean.csv"
    log.write_text("step,reward\n" + "".join(f"{step},{reward}\n" for step, reward in zip(range(1, 601), rewards)))
    assert main(["forecast", str(log), "--total-steps", "1200", "--rows", "2"]) == 0
    captured = capsys.readouterr()
    lines = (captured.out + captured.err).splitlines()
    poor = [line for line in lines if "importance weights" in line]
    assert len(poor) == 1, poor
    assert poor[0].startswith("note: the importance weights are unreliable (Pareto k-hat")
    assert "importance weights stay poor" not in captured.err


def test_no_progress_bars_when_stderr_is_not_a_terminal(tmp_path, capsys):
    """``report`` shows tqdm bars on a terminal; captured (as in CI or ``2> log``) they would garble the log."""
    runs = tmp_path / "runs"
    runs.mkdir()
    (runs / BUNDLED.name).write_bytes(BUNDLED.read_bytes())
    out = tmp_path / "report.html"
    assert main(["report", "--runs", str(runs), "--out", str(out), "--quick", "--shown", "1"]) == 0
    err = capsys.readouterr().err
    assert not BAR_DEBRIS.search(err), repr(err[:300])
    assert "report:" not in err and "%|" not in err
    assert out.stat().st_size > 0
