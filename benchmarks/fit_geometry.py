"""How hard the posterior is for NUTS under each parameterisation of the per-run parameters.

Fits the hierarchy to the runs behind the default model (the bundled runs plus the shared
external runs, as ``bayes-grpo fit data/runs ../shared/external_runs/runs`` does), once per
:data:`bayes_grpo.config.PARAMETERISATIONS` entry, each in its own process, and records wall
time (model build, compilation and sampling), the mean number of leapfrog steps per draw
(NUTS's cost in gradient evaluations), max r_hat, smallest bulk ESS, divergences and the
variables that mix worst. The model is the same under both parameterisations: only the
coordinates NUTS moves in differ.

Rows are appended to ``benchmarks/results/fit_geometry.csv`` and the report
``fit_geometry.md`` is rewritten from all rows.

    python benchmarks/fit_geometry.py --draws 200                  # both parameterisations, quick
    python benchmarks/fit_geometry.py --draws 1000 --only centred  # the shipped settings
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pandas as pd
from common import RESULTS, command_line, markdown, provenance

from bayes_grpo.config import PARAMETERISATIONS


def fit_once(parameterisation: str, draws: int, chains: int, seed: int) -> dict:
    """One fit in this process: the figures of a row."""
    import arviz as az
    import numpy as np

    import bayes_grpo as bg
    from bayes_grpo import calibration

    warnings.simplefilter("ignore")
    runs, _ = calibration.load_evaluation_runs(None, bundled=True)
    started = time.perf_counter()
    model = bg.fit(runs, model_config={"parameterisation": parameterisation}, draws=draws, tune=draws, chains=chains, seed=seed, progressbar=False)
    seconds = time.perf_counter() - started
    summary = az.summary(model.idata, kind="diagnostics")
    worst = summary.sort_values("r_hat", ascending=False).head(3)
    return {
        "parameterisation": parameterisation,
        "runs": model.fitted_on["n_runs"],
        "draws": draws,
        "chains": chains,
        "wall_s": round(seconds, 1),
        "mean_leapfrog": round(float(np.mean(model.idata.sample_stats["n_steps"].values)), 1),
        "max_r_hat": float(summary["r_hat"].max()),
        "min_ess_bulk": float(summary["ess_bulk"].min()),
        "divergences": int(model.idata.sample_stats["diverging"].sum()),
        "worst": ", ".join(f"{name} ({row.r_hat:.2f})" for name, row in worst.iterrows()),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--draws", type=int, default=200, help="draws and tuning steps per chain (200)")
    parser.add_argument("--chains", type=int, default=2, help="chains (2)")
    parser.add_argument("--seed", type=int, default=1, help="sampler seed (1)")
    parser.add_argument("--only", choices=PARAMETERISATIONS, help="fit one parameterisation only")
    parser.add_argument("--worker", choices=PARAMETERISATIONS, help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, default=RESULTS, help="results folder (benchmarks/results)")
    args = parser.parse_args()
    if args.worker:  # one fit, its row as JSON on stdout
        print(json.dumps(fit_once(args.worker, args.draws, args.chains, args.seed)))
        return
    started = time.perf_counter()
    rows = []
    for parameterisation in [args.only] if args.only else PARAMETERISATIONS:
        command = [sys.executable, __file__, "--worker", parameterisation, "--draws", str(args.draws), "--chains", str(args.chains), "--seed", str(args.seed)]
        print(f"fitting ({parameterisation}, {args.draws} draws) ...", flush=True)
        done = subprocess.run(command, capture_output=True, text=True, check=True)
        row = json.loads(done.stdout.strip().splitlines()[-1])
        rows.append({**row, "command": command_line(), "finished_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime())})
        print(rows[-1], flush=True)
    table_path = args.out / "fit_geometry.csv"
    previous = pd.read_csv(table_path) if table_path.is_file() else pd.DataFrame()
    table = pd.concat([previous, pd.DataFrame(rows)], ignore_index=True)
    table.to_csv(table_path, index=False)
    text = (
        "# Fit geometry: centred and non-centred per-run parameters\n\n"
        + provenance(time.perf_counter() - started)
        + "\nThe bundled runs plus the shared external runs (what the default model is fitted on), nutpie "
        "(Numba), one process per fit. `mean_leapfrog`: leapfrog steps (gradient evaluations) per draw; "
        "`wall_s`: build, compilation and sampling. Rows accumulate across invocations (`fit_geometry.csv`).\n\n"
        + markdown(table)
    )
    (args.out / "fit_geometry.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
