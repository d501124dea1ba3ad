"""The example notebooks as the documentation site publishes them: no warnings, no local paths, a converged fit.

``docs/hooks.py`` executes each notebook in quick mode for the site and caches the executed copy in
``.cache/notebooks`` (under a hash of the notebook and the package source). These tests read those
copies, executing a notebook first when its copy is missing (a few minutes for all four), so they
check what a reader of the site sees: no red ``TqdmWarning`` block, no path of the machine that
built the site (its temporary folders, its Python installation), and a fit in "Fit the posterior"
that converged.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import nbformat
import pytest

pytest.importorskip("mkdocs", reason="the docs extra is not installed")
pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
NAMES = sorted(p.name for p in (REPO / "notebooks").glob("*.ipynb"))
#: Paths of the machine that executed a notebook: temporary folders (the kernel's cells among
#: them), home folders, Python installations and virtual environments.
LOCAL_PATH = re.compile(r"/tmp/|/var/folders/|/root/|/home/|/Users/|site-packages|\.pyenv|/\.?venv/|ipykernel_\d+")


@pytest.fixture(scope="module")
def hooks():
    spec = importlib.util.spec_from_file_location("hooks", REPO / "docs" / "hooks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def _texts(notebook: nbformat.NotebookNode) -> list[str]:
    """Every text output of the code cells (streams, text/plain and HTML results, tracebacks); no images."""
    found = []
    for cell in notebook.cells:
        for output in cell.get("outputs", []):
            if "text" in output:
                found.append(output["text"])
            for mime, value in output.get("data", {}).items():
                if mime.startswith("text/"):
                    found.append(value if isinstance(value, str) else "".join(value))
            found.extend(output.get("traceback", []))
    return found


@pytest.fixture(scope="module")
def published(hooks) -> dict[str, nbformat.NotebookNode]:
    return {name: nbformat.read(hooks.executed(REPO / "notebooks" / name), as_version=4) for name in NAMES}


@pytest.mark.parametrize("name", NAMES)
def test_published_notebook_shows_no_warning_block_and_no_local_path(name, published):
    texts = _texts(published[name])
    assert texts, f"{name}: no outputs"
    assert not [t for t in texts if "TqdmWarning" in t or "IProgress not found" in t], f"{name}: tqdm's IProgress warning"
    paths = sorted({m.group(0) for t in texts for m in LOCAL_PATH.finditer(t)})
    assert not paths, f"{name}: outputs show local paths {paths}"


def test_published_fit_converged(published):
    printed = "\n".join(_texts(published["01_fit_posterior.ipynb"]))
    r_hat = re.search(r"max r_hat=([\d.]+)", printed)
    ess = re.search(r"min bulk ESS=(\d+)", printed)
    assert r_hat and ess, "01_fit_posterior prints no model.diagnostics"
    assert float(r_hat.group(1)) <= 1.01, f"the published fit has max r_hat {r_hat.group(1)}"
    assert int(ess.group(1)) >= 400, f"the published fit has min bulk ESS {ess.group(1)}"
    assert "may not have converged" not in printed
    assert "[0.0, 0.0" not in printed, "the sizes table rounds every size to 0.0"
