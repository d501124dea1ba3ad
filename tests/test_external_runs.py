"""Every real GRPO log in ../shared/external_runs loads with its metadata (never copied here); counts come from its index."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

import bayes_grpo as bg

EXTERNAL = Path(__file__).resolve().parents[2] / "shared" / "external_runs"
RUNS = sorted((EXTERNAL / "runs").glob("*.csv"))

pytestmark = pytest.mark.skipif(not RUNS, reason=f"external validation runs not found at {EXTERNAL}/runs")


INDEX = pd.read_csv(EXTERNAL / "index.csv") if RUNS else pd.DataFrame(columns=["run_id", "source_repo"])
N_RUNS = len(INDEX)


def test_every_run_file_is_in_the_index_and_every_indexed_run_has_a_file():
    assert len(RUNS) == N_RUNS and INDEX["run_id"].is_unique
    assert {p.stem for p in RUNS} == set(INDEX["run_id"])
    assert INDEX["source_repo"].notna().all()


@pytest.mark.parametrize("path", RUNS, ids=[p.stem for p in RUNS])
def test_external_run_loads_with_metadata(path):
    raw = pd.read_csv(path)
    run = bg.read_log(path)
    assert run.run_id == raw["run_id"].iloc[0] == path.stem
    assert run.family == raw["family"].iloc[0] and run.params_b == pytest.approx(raw["params_b"].iloc[0])
    planned = raw["total_steps"].dropna()
    assert run.total_steps == (int(planned.iloc[0]) if len(planned) else None)
    assert len(run) == len(raw) and list(run.steps) == list(raw["step"])
    assert list(run.rewards) == pytest.approx(list(raw["reward"]))
    components = [c for c in raw.columns if c.startswith("reward__")]
    assert {f"rewards/{c[len('reward__'):]}/mean" for c in components} <= set(run.table.columns)


def test_summary_matches_sources_md():
    """Start/end means (first/last 10%) reproduce the figures in SOURCES.md."""
    run = bg.read_log(EXTERNAL / "runs" / "imjonezz_llama3.1-8b_gsm8k.csv")
    k = len(run) // 10
    assert round(run.rewards[:k].mean(), 3) == 0.183 and round(run.rewards[-k:].mean(), 3) == 1.446


def test_load_runs_external_folder():
    runs = bg.load_runs(EXTERNAL / "runs")
    assert len(runs) == N_RUNS
    ds = runs.to_xarray()
    assert ds.reward.shape[0] == N_RUNS and set(ds.family.values) >= {"qwen", "llama", "gemma", "phi"}
