"""Regenerate the bundled sweep: families x sizes x initial-reward levels x seeds, plus a recipe slice.

``python -m bayes_grpo.experiments.sweep --out data/runs --jobs 2`` runs every missing run
(a run whose ``.meta.json`` exists is skipped, so an interrupted sweep resumes where it
stopped), ``--jobs`` of them at a time in separate processes, each with one torch thread.

Design (:func:`sweep_argv`):

* **grid**: 3 families x 4 sizes x 3 warm-up label-noise levels (high, middle, low initial
  reward) x 3 seeds with the base recipe. The task is a Latin square over
  (family, size, level), so every family x size cell holds all three tasks, each at one
  level, and the three seeds of a (family, size, level) share their task;
* **recipe slice**: two grid settings rerun (seed 0) with one recipe change each: cosine or
  linear decay after a 10% LR warm-up, ``beta > 0``, other group shapes, a higher learning
  rate, a longer run.
"""

from __future__ import annotations

import argparse
import sys
import time
import traceback
from pathlib import Path

from .generate import add_arguments, generate_run, run_id
from .models import FAMILIES, SIZES

TASK_ORDER = ("reverse", "sort", "add")
NOISE_LEVELS = (0.2, 0.5, 0.8)  # warm-up label noise -> high, middle, low initial reward
SEEDS = (0, 1, 2)
# (family, size, noise) of the grid settings that the recipe slice varies
RECIPE_BASES = (("llama", "s", 0.5), ("qwen2", "m", 0.5))
RECIPE_VARIANTS: dict[str, list[str]] = {
    "cosine": ["--lr-schedule", "cosine"],
    "linear": ["--lr-schedule", "linear"],
    "beta": ["--beta", "0.04"],
    "groups4x4": ["--num-generations", "4", "--prompts-per-step", "4"],
    "groups1x16": ["--num-generations", "16", "--prompts-per-step", "1"],
    "lr1e-3": ["--lr", "0.001"],
    "steps800": ["--max-steps", "800", "--lr-schedule", "cosine"],
}


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
    i = FAMILIES.index(family) + list(SIZES).index(size) + NOISE_LEVELS.index(noise)
    return TASK_ORDER[i % len(TASK_ORDER)]


def sweep_argv() -> list[list[str]]:
    """Generator arguments of every run in the sweep, in the order they are run.

    Returns
    -------
    list of list of str
        One argument list per run: the grid seed by seed (so an early stop keeps every
        cell), then the recipe slice.

    Example
    -------
    >>> len(sweep_argv()) == len(FAMILIES) * len(SIZES) * len(NOISE_LEVELS) * len(SEEDS) + 14
    True
    """
    runs = [["--family", f, "--size", s, "--task", grid_task(f, s, n), "--noise", str(n), "--seed", str(seed)]
            for seed in SEEDS for s in SIZES for f in FAMILIES for n in NOISE_LEVELS]
    runs += [["--family", f, "--size", s, "--task", grid_task(f, s, n), "--noise", str(n), "--seed", "0", *extra]
             for f, s, n in RECIPE_BASES for extra in RECIPE_VARIANTS.values()]
    return runs


def _run_one(argv: list[str]) -> tuple[str, float, str | None]:
    """Generate one run; returns (run id, seconds, traceback or None) so one failure does not stop the sweep."""
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(argv)
    t0 = time.time()
    try:
        generate_run(args)
        return run_id(args), time.time() - t0, None
    except Exception:  # keep going: one failed run must not stop the sweep
        return run_id(args), time.time() - t0, traceback.format_exc()


def main(argv: list[str] | None = None) -> int:
    """Run the missing runs of the sweep into ``--out``; returns the number of failures.

    Parameters
    ----------
    argv : list of str, optional
        Command-line arguments (``--out``, ``--jobs``, ``--dry-run``).

    Returns
    -------
    int
        Number of runs that failed.
    """
    from joblib import Parallel, delayed

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="data/runs")
    ap.add_argument("--jobs", type=int, default=2, help="runs at a time (processes, one torch thread each)")
    ap.add_argument("--dry-run", action="store_true", help="list the runs and whether they exist")
    opts = ap.parse_args(argv)
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    todo = []
    for extra in sweep_argv():
        full = [*extra, "--out", opts.out]
        done = (Path(opts.out) / f"{run_id(parser.parse_args(full))}.meta.json").exists()
        print(f"{'done' if done else 'todo'} {run_id(parser.parse_args(full))}", flush=True)
        if not done:
            todo.append(full)
    if opts.dry_run or not todo:
        return 0
    failures = 0
    results = Parallel(n_jobs=opts.jobs, backend="loky", return_as="generator_unordered")(
        delayed(_run_one)(a) for a in todo)
    for name, seconds, error in results:
        print(f"{time.strftime('%H:%M:%S')} {'FAILED' if error else 'finished'} {name} in {seconds:.0f} s", flush=True)
        if error:
            failures += 1
            print(error, flush=True)
    return failures


if __name__ == "__main__":
    sys.exit(main())
