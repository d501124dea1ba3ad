"""Regenerate the bundled sweep: families x sizes x initial-reward levels, plus a seed slice.

``python -m bayes_grpo.experiments.sweep --out data/runs`` runs every missing run (a run whose
``.meta.json`` exists is skipped, so an interrupted sweep resumes where it stopped).
"""

from __future__ import annotations

import argparse
import sys
import time
import traceback
from pathlib import Path

from .generate import add_arguments, generate_run, run_id
from .models import FAMILIES

SIZES_ORDER = ("xs", "l", "s", "m")  # smallest and largest first, so an early stop keeps the span
NOISE_LEVELS = (0.3, 0.5, 0.65)  # warm-up label noise -> high, middle, low initial reward
# (family, size, noise) slices rerun with extra seeds to show seed-to-seed spread
SEED_SLICES = (("llama", "s", 0.5), ("qwen2", "m", 0.5))
EXTRA_SEEDS = (1, 2)


def sweep_argv() -> list[list[str]]:
    """Generator arguments of every run in the sweep, in the order they are run."""
    runs = [["--family", f, "--size", s, "--noise", str(n), "--seed", "0"]
            for s in SIZES_ORDER for f in FAMILIES for n in NOISE_LEVELS]
    runs += [["--family", f, "--size", s, "--noise", str(n), "--seed", str(seed)]
             for f, s, n in SEED_SLICES for seed in EXTRA_SEEDS]
    return runs


def main(argv: list[str] | None = None) -> int:
    """Run the missing runs of the sweep into ``--out``; returns the number of failures."""
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", default="data/runs")
    ap.add_argument("--dry-run", action="store_true", help="list the runs and whether they exist")
    opts = ap.parse_args(argv)
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    failures = 0
    for extra in sweep_argv():
        args = parser.parse_args(extra + ["--out", opts.out])
        done = (Path(opts.out) / f"{run_id(args)}.meta.json").exists()
        print(f"{'done' if done else 'todo'} {run_id(args)}", flush=True)
        if done or opts.dry_run:
            continue
        t0 = time.time()
        try:
            generate_run(args)
            print(f"  finished in {time.time() - t0:.0f} s", flush=True)
        except Exception:  # keep going: one failed run must not stop the sweep
            failures += 1
            traceback.print_exc()
    return failures


if __name__ == "__main__":
    sys.exit(main())
