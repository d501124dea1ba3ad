"""Tests of the run generator and of the bundled sweep in data/runs."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

RUNS = Path(__file__).resolve().parents[1] / "data" / "runs"
META_KEYS = {"family", "architecture", "n_params", "n_params_non_embedding", "params_b", "task", "reward_functions",
             "reward_range", "initial_reward", "steps_per_epoch", "total_steps", "seeds", "hyperparameters",
             "versions", "hardware", "wall_time_s", "command", "warmup"}


def test_tasks_rewards() -> None:
    from bayes_grpo.experiments import tasks

    ex = tasks.make_examples("reverse", 3, 2, seed=0)
    assert ex == tasks.make_examples("reverse", 3, 2, seed=0)
    assert ex[0].answer == ex[0].prompt[2:-1][::-1]
    answers = [ex[0].answer] * 3
    completions = [ex[0].answer + ".", ex[0].answer, "1."]
    assert tasks.correctness(completions, answer=answers) == [1.0, 1.0, 0.0]
    assert tasks.format(completions, answer=answers) == [0.25, 0.0, 0.0]


@pytest.mark.slow
def test_generate_smoke(tmp_path: Path) -> None:
    pytest.importorskip("trl")
    from bayes_grpo.experiments.generate import main

    argv = ["--family", "llama", "--size", "xs", "--clean-steps", "5", "--noisy-steps", "5", "--prompts", "24",
            "--eval-prompts", "4", "--eval-samples", "2", "--out", str(tmp_path)]
    assert main(argv) == 0
    (csv,) = tmp_path.glob("*.csv")
    meta = json.loads(csv.with_name(csv.stem + ".meta.json").read_text())
    df = pd.read_csv(csv)
    assert META_KEYS <= set(meta)
    assert meta["total_steps"] == meta["steps_per_epoch"] == 3 == len(df)
    assert list(df["step"]) == [1, 2, 3]
    assert {"reward", "reward_std", "rewards/correctness/mean", "rewards/format/mean", "family", "params_b",
            "total_steps"} <= set(df.columns)
    assert df["reward"].between(*meta["reward_range"]).all()
    assert "--size xs" in meta["command"] and meta["command"].startswith("python -m bayes_grpo.experiments.generate")
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_bundled_runs_load(monkeypatch: pytest.MonkeyPatch) -> None:
    metas = sorted(RUNS.glob("*.meta.json"))
    if not metas:
        pytest.skip("no bundled runs yet")
    for m in metas:
        meta = json.loads(m.read_text())
        assert META_KEYS <= set(meta), m.name
        df = pd.read_csv(m.with_name(m.name.replace(".meta.json", ".csv")))
        assert len(df) == meta["total_steps"] >= 300 and meta["total_steps"] >= meta["steps_per_epoch"]
    import bayes_grpo as bg

    monkeypatch.delenv("BAYES_GRPO_DATA", raising=False)
    from bayes_grpo.experiments.models import FAMILIES
    from bayes_grpo.logs import normalise_family

    runs = bg.load_runs()
    assert sorted(r.run_id for r in runs) == sorted(m.name[: -len(".meta.json")] for m in metas)
    assert {r.meta.family for r in runs} == {normalise_family(f) for f in FAMILIES}
    for run in runs:
        meta = run.meta
        assert meta.params_b > 0 and meta.total_steps >= 300 and meta.steps_per_epoch <= meta.total_steps
        assert tuple(meta.reward_range) == (0.0, 1.25) and 0.0 <= meta.initial_reward <= 1.25
        assert meta.hardware and meta.extra["command"]
