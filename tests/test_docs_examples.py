"""Every code example of README.md and the user guide runs, and the outputs they show are what they print.

The collector reads the fenced blocks of each page in :data:`PAGES`:

* ````python`` blocks run in one namespace per page, in order;
* ````bash`` blocks run with ``bash -e``, each block as one script (a pipeline's status is
  its last command's, so ``| head`` is fine);
* ````console`` blocks hold ``$ command`` lines, each followed by the exact output it prints;
* a ````text`` block right after an ``<!-- output -->`` line is the exact standard output of the
  block before it.

Everything runs in a scratch folder with ``BAYES_GRPO_QUICK=1``. It holds ``data`` and
``benchmarks`` (links to the repository's), ``latin1_run.csv`` (a log saved in Latin-1), and
``outputs/``, a TRL output folder (``checkpoint-120/trainer_state.json``) of a run logged to step
120 of a planned 300: the bundled run ``qwen2-s-reverse4-noise0.5-lr0.0003-p16-s0``, its rewards
divided by 1.8 so that they lie in the range 0 to 1.

A block is skipped only when the line before it is ``<!-- no-test -->`` (installing packages,
running the whole test suite, a GPU training run); :data:`MAX_SKIPPED` bounds how many.

``BAYES_GRPO_UPDATE_DOCS=1 python -m pytest tests/test_docs_examples.py`` rewrites the shown
outputs from the run instead of comparing them (after a change to the forecasts, say).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

import bayes_grpo as bg
from evaluation.settings import SHARED_RUNS_ENV, shared_runs_dir

REPO = Path(__file__).resolve().parents[1]
PAGES = [REPO / "README.md", REPO / "docs" / "getting-started.md", *sorted((REPO / "docs" / "guide").glob("*.md"))]
API_PAGES = sorted((REPO / "docs" / "api").glob("*.md"))
#: Blocks marked ``<!-- no-test -->`` across all pages: installs, the test suite, GPU training.
MAX_SKIPPED = 6
UPDATE = os.environ.get("BAYES_GRPO_UPDATE_DOCS") == "1"
EXAMPLE_RUN = "qwen2-s-reverse4-noise0.5-lr0.0003-p16-s0"
FENCE = re.compile(r"^(```+)\s*([\w-]*)\s*$")


@dataclass
class Block:
    lang: str
    code: str
    start: int  # index of the first line after the opening fence
    end: int  # index of the closing fence
    skip: bool
    output: bool  # an expected-output block for the block before it


def blocks(text: str) -> list[Block]:
    """The fenced blocks of a Markdown page (fences at the start of a line only)."""
    lines, found, i = text.split("\n"), [], 0
    while i < len(lines):
        match = FENCE.match(lines[i])
        if not match:
            i += 1
            continue
        marker = next((line.strip() for line in reversed(lines[:i]) if line.strip()), "")
        j = i + 1
        while j < len(lines) and lines[j].rstrip() != match.group(1):
            j += 1
        found.append(
            Block(match.group(2).lower(), "\n".join(lines[i + 1 : j]), i + 1, j, marker == "<!-- no-test -->", marker == "<!-- output -->")
        )
        i = j + 1
    return found


def _normalise(text: str) -> str:
    return "\n".join(line.rstrip() for line in text.strip("\n").split("\n"))


@pytest.fixture
def sandbox(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A scratch folder with the files the examples name, as the current directory."""
    for name in ("data", "benchmarks"):
        (tmp_path / name).symlink_to(REPO / name, target_is_directory=True)
    shutil.copy(REPO / "tests" / "fixtures" / "latin1_run.csv", tmp_path / "latin1_run.csv")
    run = bg.read_log(REPO / "data" / "runs" / f"{EXAMPLE_RUN}.csv").head(120)
    history = [
        {"step": int(step), "epoch": round(int(step) / 300, 4), "reward": round(float(reward) / 1.8, 5)}
        for step, reward in zip(run.steps, run.rewards)
    ]
    checkpoint = tmp_path / "outputs" / "checkpoint-120"
    checkpoint.mkdir(parents=True)
    state = {"global_step": 120, "max_steps": 300, "num_train_epochs": 1, "logging_steps": 1, "log_history": history}
    (checkpoint / "trainer_state.json").write_text(json.dumps(state, indent=1), encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("BAYES_GRPO_QUICK", "1")
    shared = shared_runs_dir()  # the examples read the shared runs from the folder this variable names
    if shared is not None:
        monkeypatch.setenv(SHARED_RUNS_ENV, str(shared))
    monkeypatch.setenv("MPLBACKEND", "Agg")
    return tmp_path


def _run_shell(script: str, cwd: Path) -> str:
    done = subprocess.run(
        ["bash", "-e", "-c", script], cwd=cwd, capture_output=True, text=True, timeout=300,
        env={**os.environ, "BAYES_GRPO_QUICK": "1", "COLUMNS": "200", "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"},
    )  # fmt: skip
    assert done.returncode == 0, f"{script}\nexit {done.returncode}\nstdout:\n{done.stdout}\nstderr:\n{done.stderr}"
    return done.stdout


def _run_python(code: str, namespace: dict, where: str) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, where, "exec"), namespace)  # noqa: S102 - the docs' own examples
    import matplotlib.pyplot as plt

    plt.close("all")
    return out.getvalue()


def _console(code: str, cwd: Path) -> list[tuple[str, str]]:
    """``$ command`` lines and the output shown after each."""
    pairs: list[tuple[str, list[str]]] = []
    for line in code.split("\n"):
        if line.startswith("$ "):
            pairs.append((line[2:], []))
        elif pairs:
            pairs[-1][1].append(line)
        elif line.strip():
            raise AssertionError(f"console block starts with output, not a '$ ' command: {line!r}")
    return [(command, "\n".join(shown)) for command, shown in pairs]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_page_examples_run_and_print_what_they_show(page: Path, sandbox: Path):
    text = page.read_text(encoding="utf-8")
    if SHARED_RUNS_ENV in text and shared_runs_dir() is None:  # as every test on the shared real runs does without them
        pytest.skip(f"{page.name} forecasts the shared real runs: put them at ../shared/external_runs or set {SHARED_RUNS_ENV}")
    lines = text.split("\n")
    namespace: dict = {"__name__": "__docs__"}
    last_output: str | None = None
    replacements: list[tuple[int, int, list[str]]] = []
    for block in blocks(text):
        where = f"{page.relative_to(REPO)}:{block.start}"
        if block.output:
            assert last_output is not None, f"{where}: an output block must follow a block that runs"
            if UPDATE:
                replacements.append((block.start, block.end, _normalise(last_output).split("\n")))
            else:
                assert _normalise(block.code) == _normalise(last_output), f"{where}: the shown output is not what the example prints"
            last_output = None
            continue
        last_output = None
        if block.skip:
            continue
        if block.lang == "python":
            last_output = _run_python(block.code, namespace, where)
        elif block.lang in ("bash", "sh", "shell"):
            last_output = _run_shell(block.code, sandbox)
        elif block.lang == "console":
            new_lines = []
            for command, shown in _console(block.code, sandbox):
                printed = _run_shell(command, sandbox)
                new_lines += [f"$ {command}", *(_normalise(printed).split("\n") if printed.strip() else [])]
                if not UPDATE:
                    assert _normalise(shown) == _normalise(printed), f"{where}: `{command}` printed something else"
            if UPDATE:
                replacements.append((block.start, block.end, new_lines))
    if UPDATE and replacements:
        for start, end, new in sorted(replacements, reverse=True):
            lines[start:end] = new
        page.write_text("\n".join(lines), encoding="utf-8")


def test_pages_have_examples_and_few_skips():
    skipped = 0
    for page in PAGES:
        found = blocks(page.read_text(encoding="utf-8"))
        runnable = [b for b in found if b.lang in ("python", "bash", "sh", "shell", "console") and not b.skip and not b.output]
        assert runnable, f"{page}: no runnable example"
        skipped += sum(b.skip for b in found)
    assert skipped <= MAX_SKIPPED, f"{skipped} blocks marked no-test; keep them to installs, the test suite and GPU training"


def test_readme_test_command_is_the_first_block_after_run_the_tests():
    """``.ci/run`` runs the fenced block after the line holding "Run the tests" (awk); it must be the pytest command."""
    text = (REPO / "README.md").read_text(encoding="utf-8")
    after = text.split("Run the tests", 1)[1]
    block = next(b for b in blocks(after))
    assert "pytest" in block.code and "BAYES_GRPO_QUICK=1" in block.code


def test_every_public_name_has_an_api_entry():
    """Each name of ``bayes_grpo.__all__`` is rendered by an ``::: module.name`` line of docs/api/."""
    api = "\n".join(p.read_text(encoding="utf-8") for p in API_PAGES)
    documented = set(re.findall(r"^::: ([\w.]+)$", api, flags=re.MULTILINE))
    for name in bg.__all__:
        if name == "__version__":
            assert "__version__" in api
            continue
        module = bg._PUBLIC[name]
        assert f"{module}.{name}" in documented, f"bayes_grpo.{name} has no '::: {module}.{name}' entry in docs/api/"


def test_mkdocs_nav_lists_every_page():
    """Every Markdown page under docs/ is in the site's navigation (so no page is built but unreachable)."""
    config = (REPO / "mkdocs.yml").read_text(encoding="utf-8")
    for page in (REPO / "docs").rglob("*.md"):
        relative = page.relative_to(REPO / "docs").as_posix()
        assert relative in config, f"docs/{relative} is not in mkdocs.yml's nav"
