"""Regenerate the bundled sweep: families x sizes x initial-reward levels x seeds, plus slices; and the LR sweep.

``python -m bayes_grpo.experiments.sweep --out data/runs --jobs 2`` runs every missing run
(a run whose ``.meta.json`` exists is skipped, so an interrupted sweep resumes where it
stopped), ``--jobs`` of them at a time in separate processes, each with one torch thread.

Design (:func:`sweep_argv`):

* **grid**: 3 families x 4 sizes x 3 warm-up label-noise levels (high, middle, low initial
  reward) x 3 seeds. Task and GRPO learning rate are two orthogonal Latin squares over
  (family, size, level): every family x size cell holds all three tasks and all three
  learning rates, each family, size and level meets every task and every learning rate
  equally often, and the three seeds of a (family, size, level) are replicates (same task,
  same recipe). Base recipe (``GRID_RECIPE``): 2 prompts x 4 generations per step, 300
  steps, constant learning rate after a 10% linear warm-up, ``beta = 0``;
* **recipe slice** (``RECIPE_VARIANTS``): two grid settings rerun (seed 0) with one recipe
  change each: cosine decay, ``beta > 0``, other group shapes;
* **batch slice** (``BATCH_RECIPE``): every grid setting (family x size x level, with its
  Latin-square task and learning rate) rerun with seed 0, and the middle level (label noise
  0.5) of every cell also with seed 1, at 16 prompts x 4 generations per step (64 completions
  instead of 8; everything else as the grid): 48 runs, 4 per family x size cell. Real runs
  sample far more completions per step than the grid's 8, so their batch reward is less
  noisy; this slice measures that recipe change across the whole design.

* **learning-rate sweep** (``LR_SWEEP``, ``--slice lr``): one grid setting (``qwen2``, size ``s``,
  sort, warm-up label noise 0.8, seed 0) at the batch slice's 16 prompts x 4 generations per
  step, rerun at 10 log-spaced GRPO learning rates from 3e-5 to 3e-3 and nothing else changed,
  so a sweep's ranking and pruning can be judged on runs that differ in one setting. It is
  **not** part of ``all`` and is written to ``data/sweeps/lr`` (the default ``--out`` of this
  slice), never to ``data/runs``: the shipped model is fitted on ``data/runs``, and this sweep
  is held out of that fit. None of its learning rates is the grid's 1e-4, 3e-4 or 1e-3, so no
  run of it is also a run of ``data/runs``.

``--slice`` restricts a sweep to one part (``grid``, ``recipe``, ``batch`` or ``lr``), so a part can be
generated into a staging folder on its own.
"""

from __future__ import annotations

import argparse
import sys
import time
import traceback
from pathlib import Path
from typing import TypeVar

from bayes_grpo.settings import bundled_runs_dir

from .generate import add_arguments, generate_run, run_id
from .models import FAMILIES, SIZES

TASK_ORDER = ("reverse", "sort", "add")
LR_ORDER = (1e-4, 3e-4, 1e-3)  # GRPO peak learning rates of the grid
NOISE_LEVELS = (0.2, 0.5, 0.8)  # warm-up label noise -> high, middle, low initial reward
SEEDS = (0, 1, 2)
_T = TypeVar("_T")
GRID_RECIPE = ["--num-generations", "4", "--prompts-per-step", "2", "--max-steps", "300",
               "--lr-schedule", "constant_with_warmup", "--lr-warmup", "0.1", "--beta", "0"]
# (family, size, noise) of the grid settings that the recipe slice varies
RECIPE_BASES = (("llama", "s", 0.2), ("gpt_neox", "xs", 0.5))
RECIPE_VARIANTS: dict[str, list[str]] = {
    "cosine": ["--lr-schedule", "cosine"],
    "beta": ["--beta", "0.04"],
    "groups8": ["--num-generations", "8"],
    "groups16x1": ["--num-generations", "16", "--prompts-per-step", "1"],
}
BATCH_RECIPE = ["--prompts-per-step", "16"]
BATCH_REPLICATED_NOISE = 0.5  # warm-up level of the batch slice that is also run with a second seed
# Learning-rate sweep (held out of data/runs): (family, size, noise) of the grid setting it reruns, its
# seed and recipe, and the GRPO peak learning rates, log-spaced 3e-5 ... 3e-3 (100x in 10 steps, rounded
# to 2 significant digits). qwen2/s sort at noise 0.8 starts low (initial reward ~0.42 of 1.8) and its
# batch-slice run climbed to ~1.15 at lr 1e-4, so the sweep spans runs that barely move and runs that
# climb fast; 16 prompts per step make the per-step reward less noisy, so the ranking is set more by
# the learning rate than by batch noise.
LR_SWEEP_BASE = ("qwen2", "s", 0.8)
LR_SWEEP_SEED = 0
LR_SWEEP_RECIPE = BATCH_RECIPE
LR_SWEEP = (3e-5, 5e-5, 8.3e-5, 1.4e-4, 2.3e-4, 3.9e-4, 6.5e-4, 1.1e-3, 1.8e-3, 3e-3)
LR_SWEEP_OUT = "data/sweeps/lr"  # default --out of --slice lr; data/runs is refused for it


def grid_task(family: str, size: str, noise: float) -> str:
    """Task of a grid setting: Latin square over (family, size, noise level).

    Parameters
    ----------
    family, size : str
        Model family and size.
    noise : float
        Warm-up label-noise level (one of ``NOISE_LEVELS``).

    Returns
    -------
    str
        One of ``TASK_ORDER``.

    Example
    -------
    >>> sorted({grid_task("llama", "xs", n) for n in NOISE_LEVELS}) == sorted(TASK_ORDER)
    True
    """
    return _latin_square(TASK_ORDER, family, size, noise, noise_weight=1)


def grid_lr(family: str, size: str, noise: float) -> float:
    """GRPO learning rate of a grid setting: a Latin square orthogonal to :func:`grid_task`.

    Parameters
    ----------
    family, size : str
        Model family and size.
    noise : float
        Warm-up label-noise level (one of ``NOISE_LEVELS``).

    Returns
    -------
    float
        One of ``LR_ORDER``.

    Example
    -------
    >>> sorted({grid_lr("qwen2", "m", n) for n in NOISE_LEVELS}) == sorted(LR_ORDER)
    True
    """
    return _latin_square(LR_ORDER, family, size, noise, noise_weight=2)


def _latin_square(order: tuple[_T, ...], family: str, size: str, noise: float, noise_weight: int) -> _T:
    """Entry of ``order`` at (family, size, noise): the index sum, noise index weighted, modulo ``len(order)`` (weights 1 and 2 give orthogonal squares)."""
    i = FAMILIES.index(family) + list(SIZES).index(size) + noise_weight * NOISE_LEVELS.index(noise)
    return order[i % len(order)]


def _setting(family: str, size: str, noise: float, seed: int, lr: float | None = None) -> list[str]:
    lr = grid_lr(family, size, noise) if lr is None else lr
    return ["--family", family, "--size", size, "--task", grid_task(family, size, noise), "--noise", str(noise),
            "--lr", str(lr), *GRID_RECIPE, "--seed", str(seed)]


def sweep_argv(part: str = "all") -> list[list[str]]:
    """Generator arguments of every run in the sweep (or one part of it), in the order they are run.

    Parameters
    ----------
    part : {"all", "grid", "recipe", "batch", "lr"}
        Whole bundled sweep (``data/runs``) or one of its parts (module docstring); ``lr`` is
        the held-out learning-rate sweep (``data/sweeps/lr``), which ``all`` does not include.

    Returns
    -------
    list of list of str
        One argument list per run: the grid seed by seed (so an early stop keeps every
        cell), with the recipe slice before the last seed, then the batch slice seed by seed;
        for ``lr``, the learning rates in increasing order.

    Raises
    ------
    ValueError
        Unknown ``part``.

    Example
    -------
    >>> grid = len(FAMILIES) * len(SIZES) * len(NOISE_LEVELS) * len(SEEDS)
    >>> len(sweep_argv()) == grid + 8 + len(FAMILIES) * len(SIZES) * (len(NOISE_LEVELS) + 1)
    True
    >>> len(sweep_argv("lr")) == len(LR_SWEEP)
    True
    """
    grid = [[_setting(f, s, n, seed) for s in SIZES for f in FAMILIES for n in NOISE_LEVELS] for seed in SEEDS]
    recipe = [[*_setting(f, s, n, 0), *extra] for f, s, n in RECIPE_BASES for extra in RECIPE_VARIANTS.values()]
    others = [n for n in NOISE_LEVELS if n != BATCH_REPLICATED_NOISE]
    batch = [[*_setting(f, s, n, seed), *BATCH_RECIPE] for n, seed in
             [(BATCH_REPLICATED_NOISE, 0), (BATCH_REPLICATED_NOISE, 1), *((n, 0) for n in others)]
             for s in SIZES for f in FAMILIES]
    lr_sweep = [[*_setting(*LR_SWEEP_BASE, LR_SWEEP_SEED, lr=lr), *LR_SWEEP_RECIPE] for lr in LR_SWEEP]
    parts = {"grid": grid[0] + grid[1] + grid[2], "recipe": recipe, "batch": batch,
             "all": grid[0] + grid[1] + recipe + grid[2] + batch, "lr": lr_sweep}
    if part not in parts:
        raise ValueError(f"unknown sweep part {part!r}; one of {sorted(parts)}")
    return parts[part]


def _run_one(argv: list[str]) -> tuple[str, float, str | None]:
    """Generate one run; returns (run id, seconds, traceback or None) so one failure does not stop the sweep."""
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(argv)
    t0 = time.time()
    try:
        generate_run(args)
        error = None
    except Exception:  # keep going: one failed run must not stop the sweep
        error = traceback.format_exc()
    print(f"{time.strftime('%H:%M:%S')} {'FAILED' if error else 'finished'} {run_id(args)} in {time.time() - t0:.0f} s",
          flush=True)
    return run_id(args), time.time() - t0, error


def main(argv: list[str] | None = None) -> int:
    """Run the missing runs of the sweep into ``--out``; returns the number of failures.

    Parameters
    ----------
    argv : list of str, optional
        Command-line arguments (``--out``, ``--jobs``, ``--cluster``, ``--slice``, ``--dry-run``).

    Returns
    -------
    int
        Number of runs that failed.
    """
    from bayes_grpo.parallel import map_jobs

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=None, help=f"output folder (default data/runs; {LR_SWEEP_OUT} for --slice lr)")
    ap.add_argument("--jobs", type=int, default=2, help="runs at a time (local processes, one torch thread each)")
    ap.add_argument("--cluster", default=None, help="Dask scheduler address or local:N (see bayes_grpo.parallel)")
    ap.add_argument("--slice", default="all", choices=("all", "grid", "recipe", "batch", "lr"),
                    help="run only this part of the sweep (lr: the held-out learning-rate sweep)")
    ap.add_argument("--dry-run", action="store_true", help="list the runs and whether they exist")
    opts = ap.parse_args(argv)
    if opts.out is None:
        opts.out = LR_SWEEP_OUT if opts.slice == "lr" else "data/runs"
    if opts.slice == "lr" and Path(opts.out).resolve() == bundled_runs_dir().resolve():
        ap.error(f"the learning-rate sweep is held out of the bundled runs: write it to {LR_SWEEP_OUT}, not {opts.out}")
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    todo = []
    for extra in sweep_argv(opts.slice):
        full = [*extra, "--out", opts.out]
        name = run_id(parser.parse_args(full))
        done = (Path(opts.out) / f"{name}.meta.json").exists()
        print(f"{'done' if done else 'todo'} {name}", flush=True)
        if not done:
            todo.append(full)
    if opts.dry_run or not todo:
        return 0
    results = map_jobs(_run_one, todo, n_jobs=opts.jobs, cluster=opts.cluster, progress=False, desc="GRPO runs",
                       name=lambda a: " ".join(a))
    failures = [(name, error) for name, _, error in results if error]
    for name, error in failures:
        print(f"FAILED {name}:\n{error}", flush=True)
    return len(failures)


if __name__ == "__main__":
    sys.exit(main())
