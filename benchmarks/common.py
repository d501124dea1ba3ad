"""What the benchmark scripts share: the repository root on ``sys.path`` (for ``evaluation``), engine options, the results folder, markdown tables, provenance, results pages."""

from __future__ import annotations

import argparse
import json
import platform
import shlex
import subprocess
import sys
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path

import pandas as pd

#: The repository root: ``evaluation/`` (calibration, backtest, shapes, scoring; not in the wheel) lives there.
ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.append(str(ROOT))  # every benchmark imports this module before evaluation
RESULTS = Path(__file__).resolve().parent / "results"


def add_engine_args(parser: argparse.ArgumentParser) -> None:
    """``--jobs``, ``--cluster`` and ``--quiet``: where the independent jobs run (see bayes_grpo.parallel.map_jobs)."""
    parser.add_argument("--jobs", type=int, default=1, help="local worker processes (default 1: each fit already uses every core)")
    parser.add_argument("--cluster", metavar="ADDRESS", help="Dask scheduler address (tcp://host:8786), or local:N for a local N-worker cluster")
    parser.add_argument("--quiet", action="store_true", help="no progress bars")


def add_fold_fit_args(parser: argparse.ArgumentParser) -> None:
    """``--cache`` and ``--scored``: where fold fits are kept, and which held-out runs are scored (calibration, backtest)."""
    from evaluation.calibration import SCORED_SETS

    parser.add_argument(
        "--cache", type=Path,
        help="folder of cached fold fits: a rerun with the same bayes_grpo source and version, runs and sampler settings skips the fits (shared by calibration.py and backtest_stopping.py)",
    )  # fmt: skip
    parser.add_argument(
        "--model-config", type=json.loads, default=None, metavar="JSON",
        help='model settings of every fold fit, overriding the defaults (e.g. \'{"unit_progress": null}\' for model 3\'s units)',
    )  # fmt: skip
    parser.add_argument(
        "--scored", choices=SCORED_SETS, default="all",
        help="which held-out runs are scored (the folds still train on every run, so cached fold fits are reused; 'real' is about 5x faster)",
    )  # fmt: skip


def add_run_args(parser: argparse.ArgumentParser) -> None:
    """``--shared``, ``--no-bundled``, ``--max-runs``, ``--folds``, ``--seed``: which runs and how they are split."""
    parser.add_argument("--shared", type=Path, help="folder with index.csv and runs/ (default: evaluation.settings.shared_runs_dir())")
    parser.add_argument("--no-bundled", action="store_true", help="leave out the runs bundled with the repository")
    parser.add_argument("--max-runs", type=int, help="only this many runs, one source at a time (smoke tests)")
    parser.add_argument("--folds", type=int, default=5, help="folds grouped by source (default 5)")
    parser.add_argument("--seed", type=int, default=0)


def fit_options(draws: int | None, chains: int | None, model_config: dict | None = None) -> dict:
    """Keyword arguments of bayes_grpo.fit for every fold (None: the package defaults, shorter with BAYES_GRPO_QUICK=1)."""
    options: dict = {"model_config": model_config} if model_config else {}
    if draws:
        options.update(draws=draws, tune=draws)
    if chains:
        options["chains"] = chains
    return options


def command_line() -> str:
    """The command that is running, as it could be typed again."""
    return "python " + " ".join(shlex.quote(a) for a in [Path(sys.argv[0]).as_posix(), *sys.argv[1:]])


def provenance(seconds: float) -> str:
    """A markdown paragraph: command, date, machine, wall time."""
    return (
        f"Command: `{command_line()}`  \n"
        f"Run {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC on {platform.machine()} ({platform.system()}), "
        f"wall time {seconds:.0f} s.\n"
    )


def write_results_page(path: Path, title: str, seconds: float, doc: str, body: Sequence[str]) -> None:
    """Write (and print) a results page: title, provenance, the script's description, then ``body``'s blocks.

    The description is the script's docstring ``doc`` between its summary line and its indented command block.
    """
    description = doc.split("\n\n", 1)[1].split("\n\n    python")[0].strip()
    text = "\n".join([f"# {title}", "", provenance(seconds), "", description, "", *body])
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    print(text)


def markdown(table: pd.DataFrame, digits: int = 3) -> str:
    """A pipe table with floats rounded to ``digits`` (NaN as blank)."""
    cols = list(table.columns)

    def cell(value: object) -> str:
        if isinstance(value, float):
            return "" if pd.isna(value) else f"{value:.{digits}f}"
        return str(value)

    rows = ["| " + " | ".join(map(str, cols)) + " |", "|" + "---|" * len(cols)]
    rows += ["| " + " | ".join(cell(v) for v in row) + " |" for row in table.itertuples(index=False)]
    return "\n".join(rows) + "\n"


def verdict(ok: bool) -> str:
    """'met' or '**missed**'."""
    return "met" if ok else "**missed**"


def parameterisation_label(requested: str, config) -> str:
    """A fit's parameterisation as a table label: what was asked, and for ``auto`` what it resolved to and
    which variable NUTS samples for each per-run parameter (``e_*``: an offset; ``asinh_end_rise``: the
    sheared gain)."""
    from bayes_grpo.population import PARAMS
    from bayes_grpo.pymc_model import sampled_name

    sampled = ", ".join(sampled_name(name, config) for name in PARAMS)
    return f"auto ({config.parameterisation}: {sampled})" if requested == "auto" else f"{requested}: {sampled}"


def package_code() -> str:
    """Which package code ran: the git commit of the imported package, and its files changed since (a candidate in progress)."""
    import bayes_grpo

    package = Path(bayes_grpo.__file__).resolve().parent

    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(package), *args], capture_output=True, text=True, check=True).stdout.rstrip("\n")

    try:
        commit = git("rev-parse", "--short", "HEAD")
        changed = [line[3:] for line in git("status", "--porcelain", "--", ".").splitlines()]
    except (OSError, subprocess.CalledProcessError):
        return f"`{package}` (not a git checkout)"
    return f"commit {commit}" + (f", with uncommitted changes to {', '.join(changed)}" if changed else " (no uncommitted changes to the package)")
