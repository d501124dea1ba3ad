"""CLI commands that use a fitted model: fit, forecast, stop, report, demo (exit 0 and readable output; bad input exit 2)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import bayes_grpo as bg

from bayes_grpo.cli import EXIT_BROKEN_PIPE, _demo_table, main

pytestmark = pytest.mark.slow
FIXTURES = Path(__file__).resolve().parent / "fixtures"


@pytest.fixture(scope="module")
def model_file(tmp_path_factory, quick_model) -> Path:
    return quick_model.save(tmp_path_factory.mktemp("model") / "model.nc")


@pytest.fixture(scope="module")
def run_files(tmp_path_factory, few_runs) -> list[str]:
    """The fitted runs as CSV files (table + metadata columns), as a user would pass them."""
    folder = tmp_path_factory.mktemp("runs")
    for run in few_runs:
        run.to_frame().to_csv(folder / f"{run.run_id}.csv", index=False)
    return [str(folder / f"{run.run_id}.csv") for run in few_runs]


def _unit_log(path: Path, n: int = 40, total: int = 100) -> Path:
    """A rising reward in [0, 1] with noise, as a CSV with its planned total steps."""
    rng = np.random.default_rng(0)
    steps = np.arange(1, n + 1)
    rewards = np.clip(0.2 + 0.5 * (1 - np.exp(-steps / 15)) + 0.03 * rng.standard_normal(n), 0, 1)
    path.write_text("step,reward,total_steps\n" + "".join(f"{s},{r:.4f},{total}\n" for s, r in zip(steps, rewards)))
    return path


def test_forecast_prints_table_and_final_summary(model_file, capsys):
    assert main(["forecast", str(FIXTURES / "trl_tiny"), "--at", "3", "--model", str(model_file)]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0].startswith("trl_tiny: forecast from step 3 to 6 (prior-only: 3 logged step(s)")
    assert lines[1].split() == ["step", "mean", "q05", "q25", "q50", "q75", "q95"]
    regimes = next(i for i, line in enumerate(lines) if line.startswith("regimes: take off ahead "))
    assert [int(line.split()[0]) for line in lines[2:regimes]] == [3, 4, 5, 6] and "Pareto k" in lines[regimes]
    assert all(line.startswith("note: ") for line in lines[regimes + 1 : -1])  # the forecast's caveats, if any
    assert lines[-1].startswith("final reward (mean of the last 10% of steps to 6): mean ") and "90% [" in lines[-1]


def test_forecast_thins_long_runs(model_file, few_runs, run_files, capsys):
    i = max(range(len(few_runs)), key=lambda k: len(few_runs[k]))
    run = few_runs[i]
    assert main(["forecast", run_files[i], "--model", str(model_file), "--at", str(run.steps[len(run) // 3]), "--rows", "5"]) == 0
    out = capsys.readouterr().out.splitlines()
    # The table holds the 5 rows asked for, thinned over the whole plan (its last row is the planned end),
    # whatever notes (ESS, caveats) the forecast prints around it.
    header = next(i for i, line in enumerate(out) if line.split()[:2] == ["step", "mean"])
    rows = [line.split() for line in out[header + 1 : header + 6]]
    assert all(row[0].isdigit() for row in rows) and len(rows) == 5
    steps = [int(row[0]) for row in rows]
    assert steps == sorted(steps) and steps[-1] == int(run.total_steps or run.steps[-1])
    assert "prior-only" not in out[0]


def test_reward_range_is_accepted_and_narrows_the_forecast(model_file, tmp_path, capsys):
    log = _unit_log(tmp_path / "unit.csv")
    assert main(["forecast", str(log), "--model", str(model_file), "--reward-range", "0", "1"]) == 0
    with_range = capsys.readouterr().out.splitlines()[-1]
    lo90, hi90 = (float(v) for v in with_range.split("90% [")[1].rstrip("]").split(", "))
    assert 0 - 0.05 <= lo90 <= hi90 <= 1 + 0.05  # the declared range bounds the curve


def test_unknown_family_warns_which_population_it_falls_back_to(model_file, quick_model, tmp_path, capsys):
    log = _unit_log(tmp_path / "unit.csv")
    assert main(["forecast", str(log), "--model", str(model_file), "--family", "falcon", "--rows", "2"]) == 0
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("bayes-grpo: warning: family 'falcon' is not among the model's families (")
    assert ", ".join(quick_model.families) in err[0] and "population level" in err[0]


def test_a_one_row_log_with_a_range_is_flagged_prior_only(model_file, tmp_path, capsys):
    log = tmp_path / "one.csv"
    log.write_text("step,reward,total_steps\n1,0.3,200\n")
    assert main(["forecast", str(log), "--model", str(model_file), "--reward-range", "0", "1", "--rows", "3"]) == 0
    assert "(prior-only: 1 logged step(s)" in capsys.readouterr().out.splitlines()[0]
    assert main(["stop", str(log), "--model", str(model_file), "--reward-range", "0", "1", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["prior_only"] is True


def test_forecast_plot_writes_the_fan_chart(model_file, tmp_path, capsys):
    chart = tmp_path / "charts" / "fan.png"
    log = _unit_log(tmp_path / "unit.csv")
    assert main(["forecast", str(log), "--model", str(model_file), "--at", "20", "--plot", str(chart)]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == f"wrote the fan chart to {chart}"
    assert chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and chart.stat().st_size > 10_000


def test_stop_json_names_the_best_step(model_file, tmp_path, capsys):
    log = _unit_log(tmp_path / "unit.csv")
    assert main(["stop", str(log), "--model", str(model_file), "--json"]) == 0
    decision = json.loads(capsys.readouterr().out)
    assert 1 <= decision["best_step"] <= 40 and decision["prior_only"] is False


def test_broken_pipe_exits_quietly_with_141(model_file, tmp_path):
    log = _unit_log(tmp_path / "unit.csv")
    process = subprocess.Popen(
        [sys.executable, "-m", "bayes_grpo", "forecast", str(log), "--model", str(model_file), "--rows", "200"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    process.stdout.close()  # the reader goes away before the forecast is printed, like `| head -0`
    stderr = process.stderr.read().decode()
    assert process.wait(timeout=300) == EXIT_BROKEN_PIPE
    assert stderr == ""


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["forecast", "missing.csv"], "no such file"),
        (["forecast", str(FIXTURES / "trl_tiny"), "--model", str(FIXTURES)], "not a saved bayes_grpo model"),
        (["forecast", str(FIXTURES / "trl_tiny"), "--at", "0"], "--at 0 is before the first logged step 1"),
        (["report", "--model", str(FIXTURES), "--out", "x.html"], "not a saved bayes_grpo model"),
    ],
)
def test_bad_input_is_one_line_exit_2(args, message, capsys):
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("bayes-grpo: error: ") and message in err and err.count("\n") == 1


def test_report_command_writes_html(model_file, run_files, tmp_path, capsys):
    out = tmp_path / "r.html"
    paths = run_files[:2]
    assert main(["report", "--model", str(model_file), "--runs", *paths, "--out", str(out), "--quick", "--shown", "1"]) == 0
    assert capsys.readouterr().out.strip() == f"wrote {out}"
    assert out.stat().st_size > 50_000 and "skipped in quick mode" in out.read_text()


def test_demo_table_is_reproducible_and_shows_savings_and_hindsight_of_the_rules_stop(quick_model, few_runs):
    runs = list(few_runs)[:4]
    tables = [_demo_table(quick_model, runs, fraction, seed=7) for fraction in (0.3, 0.95)]
    assert tables == [_demo_table(quick_model, runs, fraction, seed=7) for fraction in (0.3, 0.95)]
    for table in tables:
        lines = table.splitlines()
        header = lines[1]
        for column in ("decision", "stops at", "compute saved", "hindsight"):
            assert column in header
        rows = lines[2 : 2 + len(runs)]
        assert lines[2 + len(runs)].startswith("compute saved: share of the planned steps")
        ends = {name: header.index(name) + len(name) for name in ("final actual", "stops at", "compute saved", "hindsight")}
        for line in rows:  # string columns are right-aligned: each value ends where its header does
            stops_at = line[ends["final actual"] : ends["stops at"]].strip()
            saved = line[ends["stops at"] : ends["compute saved"]].strip()
            verdict = line[ends["compute saved"] : ends["hindsight"]].strip()
            assert (stops_at == "-") == (saved == "0%") == (verdict == "no stop")
            if stops_at != "-":
                total = int(line.split()[2])
                assert saved == f"{(total - int(stops_at)) / total:.0%}"
                assert re.fullmatch(r"(right|too early) \(regret -?\d+\.\d\d\)", verdict)


def test_demo_checks_the_rule_until_it_stops_and_judges_the_stop_by_the_backtest_regret():
    from bayes_grpo.cli.demo import BAD_STOP_REGRET, _check_steps, _hindsight

    steps = np.arange(1, 101)
    flat = bg.read_log(pd.DataFrame({"step": steps, "reward": np.full(100, 0.5) + 0.001 * (steps % 2)}), run_id="flat", total_steps=100)
    rising = bg.read_log(pd.DataFrame({"step": steps, "reward": steps / 100.0}), run_id="rising", total_steps=100)
    assert _check_steps(flat, 0.3) == [30, 40, 50, 60, 70, 80, 90]
    assert _check_steps(flat, 0.95) == [95]
    assert _hindsight(flat, 30).startswith("right (regret ")
    assert _hindsight(rising, 30).startswith("too early (regret ")
    assert float(_hindsight(rising, 30).split()[-1].rstrip(")")) > BAD_STOP_REGRET


def test_demo_end_to_end_quick(run_files, tmp_path, capsys):
    paths = run_files[:3]
    args = ["demo", "--runs", *paths, "--quick", "--draws", "100", "--tune", "100", "--shown", "2", "--out", str(tmp_path)]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "stop decisions from 30% of each run's steps" in out
    assert "P(plateau)" in out and "compute saved" in out and ("continue" in out or " stop " in out)
    assert (tmp_path / "report.html").stat().st_size > 50_000
    assert (tmp_path / "model.nc").is_file()
