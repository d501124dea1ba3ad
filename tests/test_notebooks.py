"""The example notebooks run top to bottom in quick mode (as CI does), and are committed without outputs."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import nbformat
import pytest

pytestmark = pytest.mark.slow
NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"
NAMES = ["01_fit_posterior.ipynb", "02_forecast_a_run.ipynb", "03_stopping_rule.ipynb", "04_sweeps.ipynb"]


def _generator():
    spec = importlib.util.spec_from_file_location("make_notebooks", NOTEBOOKS / "make_notebooks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


@pytest.mark.parametrize("name", NAMES)
def test_committed_without_outputs(name):
    notebook = nbformat.read(NOTEBOOKS / name, as_version=4)
    code = [c for c in notebook.cells if c.cell_type == "code"]
    assert code and all(not c.outputs and c.execution_count is None for c in code)
    assert 'QUICK = os.environ.get("BAYES_GRPO_QUICK", "0") == "1"' in code[0].source


def test_committed_notebooks_are_what_the_generator_writes():
    generator = _generator()
    assert sorted(generator.NOTEBOOKS) == NAMES
    for name, cells in generator.NOTEBOOKS.items():
        committed = nbformat.read(NOTEBOOKS / name, as_version=4)
        assert committed == generator.build(cells), f"{name} is stale: run python notebooks/make_notebooks.py"


@pytest.mark.parametrize("name", NAMES)
def test_notebook_runs_in_quick_mode(name, monkeypatch):
    from nbclient import NotebookClient

    monkeypatch.setenv("BAYES_GRPO_QUICK", "1")
    notebook = nbformat.read(NOTEBOOKS / name, as_version=4)
    NotebookClient(notebook, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(NOTEBOOKS)}}).execute()
    outputs = [o for c in notebook.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    assert any("image/png" in o.get("data", {}) for o in outputs), "no figure drawn"
    assert os.environ["BAYES_GRPO_QUICK"] == "1"
