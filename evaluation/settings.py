"""Evaluation defaults and where the shared real runs are.

The shared external runs (``index.csv`` + ``runs/``) are other people's public
runs, read in place beside a source checkout; the package itself never looks for
them (:mod:`bayes_grpo.experiments.card` takes the folder only from its
``--shared`` argument or ``BAYES_GRPO_SHARED_RUNS``).
"""

from __future__ import annotations

import os
from pathlib import Path

#: Observed fractions at which forecasts are evaluated.
EVALUATION_FRACTIONS = (0.2, 0.3, 0.5)

#: Environment variable naming the folder of the shared external runs
#: (the folder that holds ``index.csv`` and ``runs/``).
SHARED_RUNS_ENV = "BAYES_GRPO_SHARED_RUNS"
_REPO_SHARED = Path(__file__).resolve().parents[2] / "shared" / "external_runs"


def shared_runs_dir(path: str | os.PathLike | None = None) -> Path | None:
    """Folder of the shared external runs (``index.csv`` + ``runs/``), or None when absent.

    Resolution order: the ``path`` argument, then the ``BAYES_GRPO_SHARED_RUNS``
    environment variable, then ``../shared/external_runs`` beside the source
    checkout. The data are other people's runs: they are read in place, never
    copied into the repository.
    """
    candidate = path if path is not None else os.environ.get(SHARED_RUNS_ENV)
    folder = Path(candidate) if candidate else _REPO_SHARED
    if path is not None or os.environ.get(SHARED_RUNS_ENV):
        if not folder.is_dir():
            raise FileNotFoundError(f"shared runs folder {folder} does not exist (set {SHARED_RUNS_ENV} or pass a path)")
        return folder
    return folder if folder.is_dir() else None
