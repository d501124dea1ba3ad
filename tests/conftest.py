"""Shared fixtures: a few real runs and one short PyMC fit on them, reused by every test in the session."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

import bayes_grpo as bg

REPO = Path(__file__).resolve().parents[1]
EXTERNAL_RUNS = REPO.parent / "shared" / "external_runs" / "runs"


@pytest.fixture(scope="session")
def few_runs() -> bg.RunSet:
    """Six runs from different families: the bundled runs, else the external validation runs."""
    from bayes_grpo.report import pick_runs

    for source in (None, EXTERNAL_RUNS):
        try:
            runs = bg.load_runs(source)
        except bg.LogError:
            continue
        if len(runs) >= 3:
            return bg.RunSet(pick_runs(runs, 6))
    pytest.skip("no runs to fit: neither data/runs nor ../shared/external_runs/runs has logs")


@pytest.fixture(scope="session")
def quick_model(few_runs: bg.RunSet) -> bg.FittedModel:
    """A short NUTS fit (2 chains x 150 draws, about a minute) with the full InferenceData kept."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return bg.fit(few_runs, draws=150, tune=150, chains=2, progressbar=False)
