"""The built wheel carries what the package needs at run time, and the light install needs no torch.

A wheel is built from a clean copy of the sources (no stale ``build/``), installed
with ``pip install --target`` into a temporary folder, and used from outside the
repository: ``bg.default_model()``, ``bg.load_runs()`` and ``bayes-grpo forecast``
on a shared real log. ``.ci/run`` does the same in a fresh virtualenv with the
core dependencies only.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

from evaluation.settings import shared_runs_dir

REPO = Path(__file__).resolve().parents[1]
TRAIN_ONLY = ("torch", "trl", "transformers", "datasets", "accelerate")


def _requirement_names(requirements: list[str]) -> set[str]:
    return {req.split(";")[0].split("[")[0].split("<")[0].split(">")[0].split("=")[0].split("~")[0].strip().lower() for req in requirements}


def test_core_dependencies_are_light_and_training_is_an_extra() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    core = _requirement_names(project["dependencies"])
    assert {"pymc", "arviz", "numpy", "pandas", "xarray", "scipy", "matplotlib", "h5netcdf", "joblib"} <= core
    assert not core & set(TRAIN_ONLY)
    extras = project["optional-dependencies"]
    assert set(TRAIN_ONLY) <= _requirement_names(extras["train"])
    assert "dask" in _requirement_names(extras["cluster"]) and "dask" in _requirement_names(extras["dev"])


def _light_script(log: Path) -> str:
    return f"""
import json, sys, warnings
import bayes_grpo as bg
model = bg.default_model()
run = bg.read_log({str(log)!r})
cut = run.head(int(run.steps[len(run) // 3]))
fc = model.forecast(cut, total_steps=int(run.total_steps or run.last_step))
decision = model.stop_decision(cut, total_steps=int(run.total_steps or run.last_step))
from bayes_grpo.cli import main
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    code = main(["forecast", {str(log)!r}, "--at", str(int(cut.last_step)), "--rows", "3"])
heavy = sorted(m for m in sys.modules if m.split(".")[0] in {TRAIN_ONLY!r})
print(json.dumps({{"code": code, "final": fc.final.mean, "stop": decision.should_stop, "heavy": heavy, "file": bg.__file__}}))
"""


def _bundled_log() -> Path:
    logs = sorted((REPO / "data" / "runs").glob("*.csv"))
    if not logs:
        pytest.skip("no bundled runs in data/runs")
    return logs[0]


def test_forecast_and_decision_never_import_torch_or_trl() -> None:
    result = subprocess.run([sys.executable, "-c", _light_script(_bundled_log())], capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["code"] == 0 and report["heavy"] == []


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A wheel built from a clean copy of the sources (``pip wheel --no-deps --no-build-isolation``)."""
    source = tmp_path_factory.mktemp("src")
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy2(REPO / name, source / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(REPO / "bayes_grpo", source / "bayes_grpo", ignore=ignore)
    shutil.copytree(REPO / "data", source / "data", ignore=ignore)
    shutil.copytree(REPO / "evaluation", source / "evaluation", ignore=ignore)  # beside the package, as in a checkout: left out
    out = tmp_path_factory.mktemp("dist")
    result = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out), str(source)],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    (built,) = out.glob("bayes_grpo-*.whl")
    return built


def test_wheel_carries_the_model_the_runs_and_every_subpackage(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    assert any(n.startswith("bayes_grpo/assets/") and n.endswith(".nc") for n in names), "no shipped model in the wheel"
    bundled = sorted(p.name for p in (REPO / "data" / "runs").iterdir() if p.is_file())
    assert bundled and all(f"bayes_grpo_data/runs/{name}" in names for name in bundled)
    packages = [p.parent.relative_to(REPO).as_posix() for p in (REPO / "bayes_grpo").rglob("__init__.py") if "__pycache__" not in p.parts]
    assert all(f"{package}/__init__.py" in names for package in packages)
    assert not any(n.startswith(("tests/", "benchmarks/", "notebooks/", "evaluation/")) for n in names)
    # The evaluation code (calibration, backtest, shapes, scoring, the fit cache) stays in the repository's evaluation/.
    assert not [n for n in names if n.rpartition("/")[2] in ("calibration.py", "backtest.py", "shapes.py", "scoring.py")]


def test_installed_wheel_works_outside_the_repository(wheel: Path, tmp_path: Path) -> None:
    target = tmp_path / "site"
    result = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(target), str(wheel)],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    shared = shared_runs_dir()
    log = sorted((shared / "runs").glob("*.csv"))[0] if shared is not None else _bundled_log()
    script = _light_script(log) + "print(len(bg.load_runs()))\n"
    env = dict(os.environ, PYTHONPATH=str(target))
    work = tmp_path / "elsewhere"
    work.mkdir()
    result = subprocess.run([sys.executable, "-c", script], cwd=work, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stderr[-2000:]
    *_, report_line, n_runs = result.stdout.strip().splitlines()
    report = json.loads(report_line)
    assert Path(report["file"]).is_relative_to(target), "the test imported the checkout instead of the wheel"
    assert report["code"] == 0 and report["heavy"] == []
    assert int(n_runs) == len(list((REPO / "data" / "runs").glob("*.csv")))
    script_path = target / "bin" / "bayes-grpo"
    cli = subprocess.run(
        [sys.executable, str(script_path), "forecast", str(log), "--rows", "3"],
        cwd=work, env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert cli.returncode == 0, cli.stderr[-2000:]
    assert "final reward (mean of the last 10% of steps to" in cli.stdout
