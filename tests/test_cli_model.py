"""CLI commands that use a fitted model: fit, forecast, report, demo (exit 0 and readable output; bad input exit 2)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bayes_grpo.cli import main

pytestmark = pytest.mark.slow
FIXTURES = Path(__file__).resolve().parent / "fixtures"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, quick_model) -> Path:
    return quick_model.save(tmp_path_factory.mktemp("model"))


@pytest.fixture(scope="module")
def run_files(tmp_path_factory, few_runs) -> list[str]:
    """The fitted runs as CSV files (table + metadata columns), as a user would pass them."""
    folder = tmp_path_factory.mktemp("runs")
    for run in few_runs:
        run.to_frame().to_csv(folder / f"{run.run_id}.csv", index=False)
    return [str(folder / f"{run.run_id}.csv") for run in few_runs]


def test_forecast_prints_table_and_final_summary(model_dir, capsys):
    assert main(["forecast", str(FIXTURES / "trl_tiny"), "--at", "3", "--model", str(model_dir)]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0] == "trl_tiny: forecast from step 3 to 6"
    assert lines[1].split() == ["step", "mean", "q05", "q25", "q50", "q75", "q95"]
    assert [int(line.split()[0]) for line in lines[2:-1]] == [3, 4, 5, 6]
    assert lines[-1].startswith("final reward at step 6: mean ") and "90% [" in lines[-1]


def test_forecast_thins_long_runs(model_dir, few_runs, run_files, capsys):
    i = max(range(len(few_runs)), key=lambda k: len(few_runs[k]))
    run = few_runs[i]
    assert main(["forecast", run_files[i], "--model", str(model_dir), "--at", str(run.steps[len(run) // 3]), "--rows", "5"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 1 + 1 + 5 + 1


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["forecast", "missing.csv"], "no such file"),
        (["forecast", str(FIXTURES / "trl_tiny"), "--model", str(FIXTURES)], "not a saved bayes_grpo model"),
        (["forecast", str(FIXTURES / "trl_tiny"), "--at", "0"], "no logged step at or before step 0"),
        (["report", "--model", str(FIXTURES), "--out", "x.html"], "not a saved bayes_grpo model"),
    ],
)
def test_bad_input_is_one_line_exit_2(args, message, capsys):
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("bayes-grpo: error: ") and message in err and err.count("\n") == 1


def test_report_command_writes_html(model_dir, run_files, tmp_path, capsys):
    out = tmp_path / "r.html"
    paths = run_files[:2]
    assert main(["report", "--model", str(model_dir), "--runs", *paths, "--out", str(out), "--quick", "--shown", "1"]) == 0
    assert capsys.readouterr().out.strip() == f"wrote {out}"
    assert out.stat().st_size > 50_000 and "skipped in quick mode" in out.read_text()


def test_demo_end_to_end_quick(run_files, tmp_path, capsys):
    paths = run_files[:3]
    args = ["demo", "--runs", *paths, "--quick", "--draws", "100", "--tune", "100", "--shown", "2", "--out", str(tmp_path)]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "stop decisions from 30% of each run's steps" in out
    assert "P(plateau)" in out and "compute saved" in out and ("continue" in out or " stop " in out)
    assert (tmp_path / "report.html").stat().st_size > 50_000
    assert (tmp_path / "model" / "population.nc").is_file()
