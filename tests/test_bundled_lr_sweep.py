"""The bundled learning-rate sweep (``data/sweeps/lr``): one setting, learning rates only, held out of ``data/runs``."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pytest

import bayes_grpo as bg
from bayes_grpo.settings import bundled_runs_dir, bundled_sweep_dir

REPO = Path(__file__).resolve().parents[1]


def _metas() -> dict[str, dict]:
    folder = bundled_sweep_dir("lr")
    assert folder == REPO / "data" / "sweeps" / "lr", folder
    metas = sorted(folder.glob("*.meta.json"))
    assert metas, f"no bundled learning-rate sweep in {folder}"
    return {m.name[: -len(".meta.json")]: json.loads(m.read_text()) for m in metas}


def _without_lr(meta: dict) -> dict:
    """Meta fields that must agree across the sweep: all but the learning rate and per-run records."""
    per_run = {"started_utc", "wall_time_s", "warmup_time_s", "grpo_time_s", "s_per_step", "command", "hardware"}
    same = {k: v for k, v in meta.items() if k not in per_run}
    same["hyperparameters"] = {k: v for k, v in meta["hyperparameters"].items() if k != "learning_rate"}
    return same


def test_lr_sweep_is_one_setting_differing_only_in_learning_rate() -> None:
    metas = _metas()
    assert len(metas) >= 8
    runs = bg.load_runs(bundled_sweep_dir("lr"))
    assert sorted(r.run_id for r in runs) == sorted(metas)
    assert len({r.meta.family for r in runs}) == 1 and len({r.meta.params_b for r in runs}) == 1
    assert {r.meta.total_steps for r in runs} == {300}
    for run in runs:
        assert len(run.steps) == 300 and np.isfinite(run.rewards).all()
    reference = _without_lr(next(iter(metas.values())))
    for name, meta in metas.items():
        assert _without_lr(meta) == reference, name
        assert meta["prompts"]["shared_with_warmup"] == 0 and meta["synthetic"] is True
    lrs = sorted(meta["hyperparameters"]["learning_rate"] for meta in metas.values())
    assert len(set(lrs)) == len(lrs) and lrs[-1] / lrs[0] >= 30
    assert np.ptp(np.diff(np.log(lrs))) < 0.1, "learning rates not log-spaced"


def test_lr_sweep_matches_its_design_and_commands() -> None:
    from bayes_grpo.experiments.generate import add_arguments, command_for, run_id
    from bayes_grpo.experiments.sweep import LR_SWEEP, LR_SWEEP_OUT, sweep_argv
    from bayes_grpo.experiments.tasks import DEFAULT_DIGITS

    metas = _metas()
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    planned = [parser.parse_args([*a, "--out", LR_SWEEP_OUT]) for a in sweep_argv("lr")]
    assert sorted(run_id(a) for a in planned) == sorted(metas)
    assert sorted(metas[run_id(a)]["hyperparameters"]["learning_rate"] for a in planned) == sorted(LR_SWEEP)
    for args in planned:
        args.digits = DEFAULT_DIGITS[args.task]  # generate_run fills this in before it records the command
        assert metas[run_id(args)]["command"] == command_for(args)


def test_lr_sweep_is_held_out_of_the_bundled_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    from bayes_grpo.experiments.sweep import sweep_argv

    names = set(_metas())
    monkeypatch.delenv("BAYES_GRPO_DATA", raising=False)
    training = {r.run_id for r in bg.load_runs()}  # what the shipped model's fit and load_runs() read
    assert training and names.isdisjoint(training)
    assert bundled_runs_dir().resolve() not in bundled_sweep_dir("lr").resolve().parents
    assert not any(p.name in names for p in bundled_runs_dir().rglob("*"))
    from bayes_grpo.experiments.generate import add_arguments, run_id

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    assert names.isdisjoint(run_id(parser.parse_args(a)) for a in sweep_argv("all"))


def test_lr_sweep_cli_refuses_to_write_into_the_bundled_runs() -> None:
    from bayes_grpo.experiments.sweep import main

    with pytest.raises(SystemExit):
        main(["--slice", "lr", "--out", str(bundled_runs_dir()), "--dry-run"])
