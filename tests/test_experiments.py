"""Tests of the run generator (tasks, prompt split, a real tiny GRPO run) and of the bundled sweep in data/runs."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bayes_grpo.experiments import tasks

RUNS = Path(__file__).resolve().parents[1] / "data" / "runs"
META_KEYS = {"family", "architecture", "size", "n_params", "n_params_non_embedding", "params_b", "task",
             "reward_functions", "reward_range", "initial_reward", "initial_rewards", "steps_per_epoch", "total_steps",
             "prompts", "seeds", "warmup", "hyperparameters", "versions", "hardware", "started_utc", "wall_time_s",
             "warmup_time_s", "grpo_time_s", "source", "source_repo", "command"}
HYPER_KEYS = {"learning_rate", "lr_scheduler_type", "warmup_steps", "beta", "prompts_per_step", "num_generations"}


def test_rewards_partial_credit() -> None:
    answers = ["1234"] * 5
    completions = ["1234.", "1244.", "1234", "12.", "abcd"]
    assert tasks.correctness(completions, answer=answers) == [1.0, 0.0, 1.0, 0.0, 0.0]
    assert tasks.partial_credit(completions, answer=answers) == [0.5, 0.375, 0.5, 0.25, 0.0]
    assert tasks.format(completions, answer=answers) == [0.2, 0.2, 0.0, 0.2, 0.0]
    assert tasks.length(completions, answer=answers) == pytest.approx([0.1, 0.1, 0.1, 0.05, 0.1])
    best = sum(f(["1234."], answer=["1234"])[0] for f in tasks.REWARD_FUNCS)
    assert best == pytest.approx(tasks.REWARD_RANGE[1])


@pytest.mark.parametrize("task", sorted(tasks.TASKS))
def test_prompt_splits_are_disjoint(task: str) -> None:
    digits = tasks.DEFAULT_DIGITS[task]
    warm = {e.prompt for e in tasks.make_examples(task, digits, 3000, seed=1, split="warmup")}
    grpo = tasks.make_examples(task, digits, 3000, seed=2, split="grpo")
    assert len(warm) > 1000 and len({e.prompt for e in grpo}) > 1000
    assert warm.isdisjoint(e.prompt for e in grpo)
    for e in grpo[:200]:  # answers follow the task's rule
        body = e.prompt.split(":")[-1][:-1]
        if task == "sort":
            assert e.answer == "".join(sorted(body))
        elif task == "reverse":
            assert e.answer == "".join(ch for ch in body if ch.isdigit())[::-1] and set(body) - set("0123456789")
        else:
            a, b = body.split("+")
            assert int(e.answer) == int(a) + int(b)


@settings(max_examples=50, deadline=None)
@given(st.sampled_from(sorted(tasks.TASKS)), st.integers(2, 6), st.integers(0, 10_000))
def test_split_is_a_function_of_the_prompt(task: str, digits: int, seed: int) -> None:
    for split in tasks.SPLITS:
        for e in tasks.make_examples(task, digits, 5, seed=seed, split=split):
            assert tasks.split_of(e.prompt) == split
            assert set(e.prompt) <= set(tasks.ALPHABET) and len(e.answer) <= tasks.max_answer_length(task, digits)


def test_make_examples_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="unknown task"):
        tasks.make_examples("multiply", 2, 1, seed=0, split="grpo")
    with pytest.raises(ValueError, match="unknown split"):
        tasks.make_examples("add", 2, 1, seed=0, split="test")


def test_sweep_design() -> None:
    from bayes_grpo.experiments.models import FAMILIES, SIZES
    from bayes_grpo.experiments.sweep import NOISE_LEVELS, SEEDS, TASK_ORDER, grid_task, sweep_argv

    design = sweep_argv()
    assert len(design) >= 108 and len({tuple(a) for a in design}) == len(design)
    for f in FAMILIES:
        for s in SIZES:
            assert sorted(grid_task(f, s, n) for n in NOISE_LEVELS) == sorted(TASK_ORDER)
    per_cell = pd.Series([(a[1], a[3]) for a in design]).value_counts()
    assert len(per_cell) == len(FAMILIES) * len(SIZES) and per_cell.min() >= 3 * len(SEEDS)


@pytest.mark.slow
def test_generate_real_grpo_run(tmp_path: Path) -> None:
    pytest.importorskip("trl")
    from bayes_grpo.experiments.generate import main

    argv = ["--family", "qwen2", "--size", "xs", "--task", "sort", "--clean-steps", "4", "--noisy-steps", "2",
            "--max-steps", "4", "--prompts", "16", "--num-generations", "4", "--beta", "0.04", "--lr-schedule", "cosine",
            "--eval-prompts", "4", "--eval-samples", "2", "--out", str(tmp_path)]
    assert main(argv) == 0
    (csv,) = tmp_path.glob("*.csv")
    meta = json.loads(csv.with_name(csv.stem + ".meta.json").read_text())
    df = pd.read_csv(csv)
    assert META_KEYS <= set(meta) and HYPER_KEYS <= set(meta["hyperparameters"])
    assert meta["total_steps"] == 4 == len(df) and list(df["step"]) == [1, 2, 3, 4]
    assert meta["prompts"]["shared_with_warmup"] == 0
    assert meta["source_repo"] == "bayes_grpo/generator/sort" and meta["hyperparameters"]["beta"] == 0.04
    names = {f"rewards/{f.__name__}/mean" for f in tasks.REWARD_FUNCS}
    assert names <= set(df.columns) and "kl" in df.columns
    total = df[sorted(names)].sum(axis=1)
    assert np.allclose(total, df["reward"], atol=1e-3)
    assert df["reward"].between(*meta["reward_range"]).all()
    assert meta["command"].startswith("python -m bayes_grpo.experiments.generate") and "--beta 0.04" in meta["command"]


def _bundled() -> list[Path]:
    metas = sorted(RUNS.glob("*.meta.json"))
    if not metas:
        pytest.skip("no bundled runs")
    return metas


def test_bundled_runs_files() -> None:
    metas = _bundled()
    assert len(metas) >= 100 and len(list(RUNS.glob("*.csv"))) == len(metas)
    assert sum(p.stat().st_size for p in RUNS.iterdir()) < 20e6
    cells: dict[tuple[str, str], int] = {}
    params: dict[str, list[int]] = {}
    for m in metas:
        meta = json.loads(m.read_text())
        assert META_KEYS <= set(meta), m.name
        assert meta["prompts"]["shared_with_warmup"] == 0 and meta["source_repo"].startswith("bayes_grpo/generator/")
        df = pd.read_csv(m.with_name(m.name.replace(".meta.json", ".csv")))
        assert len(df) == meta["total_steps"] >= 300
        components = [c for c in df.columns if c.startswith("rewards/") and c.endswith("/mean")]
        assert len(components) >= 2
        assert np.allclose(df[components].sum(axis=1), df["reward"], atol=1e-3)
        cells[(meta["family"], meta["size"])] = cells.get((meta["family"], meta["size"]), 0) + 1
        params.setdefault(meta["family"], []).append(meta["n_params"])
    assert len(cells) == 12 and min(cells.values()) >= 6
    assert all(max(p) / min(p) >= 30 for p in params.values())


def test_bundled_runs_load(monkeypatch: pytest.MonkeyPatch) -> None:
    metas = _bundled()
    import bayes_grpo as bg
    from bayes_grpo.experiments.models import FAMILIES
    from bayes_grpo.logs import normalise_family

    monkeypatch.delenv("BAYES_GRPO_DATA", raising=False)
    runs = bg.load_runs()
    assert sorted(r.run_id for r in runs) == sorted(m.name[: -len(".meta.json")] for m in metas)
    assert {r.meta.family for r in runs} == {normalise_family(f) for f in FAMILIES}
    for run in runs:
        meta = run.meta
        assert meta.params_b > 0 and meta.total_steps >= 300 and meta.steps_per_epoch > 0
        assert tuple(meta.reward_range) == tasks.REWARD_RANGE and 0.0 <= meta.initial_reward <= tasks.REWARD_RANGE[1]
        assert meta.hardware and meta.extra["command"] and meta.extra["source_repo"].startswith("bayes_grpo/generator/")


def test_card_statistics_match_reference_definitions() -> None:
    from bayes_grpo.experiments.card import shape_stats

    steps = np.arange(1.0, 301.0)
    rng = np.random.default_rng(0)
    flat = shape_stats(steps, 0.5 + 0.1 * rng.standard_normal(300))
    assert abs(flat["rise"]) < 3 and 0.2 < flat["noise_rel"] < 0.6
    rising = shape_stats(steps, np.clip(steps / 150, 0, 1) + 0.05 * rng.standard_normal(300))
    assert rising["took_off"] == 1.0 and rising["rise"] > 10 and 0.2 < rising["t50"] < 0.4 and rising["decline"] < 0.1
    peaked = shape_stats(steps, np.exp(-(((steps - 120) / 40) ** 2)))
    assert peaked["decline"] > 0.9 and peaked["took_off"] == 0.0


def test_card_grid_recipe_matches_sweep_and_generator() -> None:
    import argparse

    from bayes_grpo.experiments.card import GRID_RECIPE
    from bayes_grpo.experiments.generate import add_arguments
    from bayes_grpo.experiments.sweep import sweep_argv

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    grid = [parser.parse_args(a) for a in sweep_argv()[:72]]
    for args in grid:
        assert (args.lr_schedule, args.beta, args.num_generations, args.prompts_per_step, args.max_steps) == (
            GRID_RECIPE["lr_scheduler_type"], GRID_RECIPE["beta"], GRID_RECIPE["num_generations"],
            GRID_RECIPE["prompts_per_step"], 300)
    slice_ = [parser.parse_args(a) for a in sweep_argv()[72:80]]
    assert all((a.lr_schedule, a.beta, a.num_generations, a.prompts_per_step) != tuple(
        GRID_RECIPE[k] for k in ("lr_scheduler_type", "beta", "num_generations", "prompts_per_step")) for a in slice_)


def test_batch_slice_design_and_card_classification() -> None:
    import argparse

    from bayes_grpo.experiments.card import BATCH_PROMPTS_PER_STEP, GRID_RECIPE, slice_of
    from bayes_grpo.experiments.generate import add_arguments, run_id
    from bayes_grpo.experiments.models import FAMILIES, SIZES
    from bayes_grpo.experiments.sweep import NOISE_LEVELS, sweep_argv

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    parts = {name: [parser.parse_args(a) for a in sweep_argv(name)] for name in ("grid", "recipe", "batch")}
    assert sorted(run_id(parser.parse_args(a)) for a in sweep_argv()) == sorted(
        run_id(a) for runs in parts.values() for a in runs)
    batch = parts["batch"]
    assert len(batch) == len(FAMILIES) * len(SIZES) * (len(NOISE_LEVELS) + 1)
    assert pd.Series([(a.family, a.size) for a in batch]).value_counts().eq(len(NOISE_LEVELS) + 1).all()
    grid_seed0 = {run_id(a).removesuffix("-s0") for a in parts["grid"] if a.seed == 0}
    assert {run_id(a).removesuffix(f"-p{BATCH_PROMPTS_PER_STEP}-s0") for a in batch if a.seed == 0} == grid_seed0

    def meta(a: argparse.Namespace) -> dict:
        return {"total_steps": a.max_steps, "hyperparameters": {
            "lr_scheduler_type": a.lr_schedule, "beta": a.beta, "num_generations": a.num_generations,
            "prompts_per_step": a.prompts_per_step}}

    assert {name: {slice_of(meta(a)) for a in runs} for name, runs in parts.items()} == {
        "grid": {"grid"}, "recipe": {"recipe"}, "batch": {"batch"}}
    assert GRID_RECIPE["prompts_per_step"] != BATCH_PROMPTS_PER_STEP
    with pytest.raises(ValueError, match="unknown sweep part"):
        sweep_argv("pilot")


def test_bundled_runs_are_the_whole_sweep() -> None:
    import argparse

    from bayes_grpo.experiments.generate import add_arguments, run_id
    from bayes_grpo.experiments.sweep import sweep_argv

    metas = _bundled()
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    assert sorted(m.name[: -len(".meta.json")] for m in metas) == sorted(run_id(parser.parse_args(a)) for a in sweep_argv())
