"""How hard the posterior is for NUTS under each parameterisation of the per-run parameters.

Fits the hierarchy to the runs behind the default model (the bundled runs plus the shared
external runs, as ``bayes-grpo fit data/runs ../shared/external_runs/runs`` does), once per
:data:`bayes_grpo.config.PARAMETERISATIONS` entry (or one, ``--only``), each in its own
process, and records wall time (model build, compilation and sampling), the mean number of
leapfrog steps per draw (NUTS's cost in gradient evaluations), max r_hat, smallest bulk ESS,
divergences and the variables that mix worst. The model is the same under every
parameterisation: only the coordinates NUTS moves in differ. ``--gain-at`` and
``--max-bins`` change the model itself (where the gain is measured, bins per run).

Rows are appended to ``benchmarks/results/fit_geometry.csv`` and the report
``fit_geometry.md`` is rewritten from all rows.

    python benchmarks/fit_geometry.py --draws 200                  # every parameterisation, quick
    python benchmarks/fit_geometry.py --draws 1000 --only auto     # the shipped settings
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
from common import RESULTS, command_line, markdown, parameterisation_label, provenance

from bayes_grpo.config import GAIN_REFERENCES, PARAMETERISATIONS, ModelConfig, SamplerConfig
from bayes_grpo.population import MODEL_VERSION


def fit_once(parameterisation: str, draws: int, chains: int, seed: int, gain_at: str, max_bins: int, tune: int | None) -> dict:
    """One fit in this process: the figures of a row."""
    import arviz as az
    import numpy as np

    import bayes_grpo as bg
    from evaluation import calibration

    warnings.simplefilter("ignore")
    runs, sources = calibration.load_evaluation_runs(None, bundled=True)
    shared = {run_id for run_id, source in sources.items() if not calibration.is_bundled(source)}
    tune = tune or SamplerConfig().tune
    started = time.perf_counter()
    model = bg.fit(
        runs, model_config={"parameterisation": parameterisation, "gain_at": gain_at, "max_bins": max_bins},
        draws=draws, tune=tune, chains=chains, seed=seed, progressbar=False,
    )
    seconds = time.perf_counter() - started
    summary = az.summary(model.idata, kind="diagnostics")
    worst = summary.sort_values("r_hat", ascending=False).head(3)
    return {
        "model": MODEL_VERSION,
        "parameterisation": parameterisation,
        "label": parameterisation_label(parameterisation, model.model_config),
        "gain_at": gain_at,
        "max_bins": max_bins,
        "tune": tune,
        "runs": model.fitted_on["n_runs"],
        "draws": draws,
        "chains": chains,
        "seed": seed,
        "wall_s": round(seconds, 1),
        "mean_leapfrog": round(float(np.mean(model.idata.sample_stats["n_steps"].values)), 1),
        "max_r_hat": float(summary["r_hat"].max()),
        "min_ess_bulk": float(summary["ess_bulk"].min()),
        "divergences": int(model.idata.sample_stats["diverging"].sum()),
        "worst": ", ".join(f"{_public(name, shared)} ({row.r_hat:.2f})" for name, row in worst.iterrows()),
    }


def _public(variable: str, shared: set[str]) -> str:
    """``variable`` with a shared run's id replaced by "a shared run" (others' runs are not named in results)."""
    name, _, coordinate = variable.partition("[")
    return f"{name}[a shared run]" if coordinate.rstrip("]") in shared else variable


def report(table: pd.DataFrame, seconds: float) -> str:
    """The markdown report of every row so far (``seconds``: this invocation's wall time)."""
    return (
        "# Fit geometry: how the per-run parameters are written, and where the gain is measured\n\n"
        + provenance(seconds)
        + "\nThe bundled runs plus the shared external runs (what `bayes-grpo fit data/runs "
        "../shared/external_runs/runs` fits), nutpie (Numba), one process per fit, options in the `command` "
        "column. `model`: the model version (`bayes_grpo.population.MODEL_VERSION`; 2 measures the total gain, "
        "2.1 the gain by the end of the planned run, 2.2 also gives a declared start a fixed spread, 2.3 gives the "
        "timescale and shape a mean and spread per scale kind). "
        "`mean_leapfrog`: leapfrog steps (gradient evaluations) "
        "per draw; `wall_s`: build, compilation and sampling. `gain_at`: `asymptote` (the gain parameter is the "
        "total gain) or `plan_end` (the gain by the end of the planned run); `max_bins`: bins per run in the "
        "likelihood. `auto (mixed)`: the default `parameterisation=\"auto\"`, which from 100 runs up samples the "
        "start as an offset and the rest centred (in rows of models 2.1-2.3); later rows' labels list what NUTS samples "
        "for each per-run parameter (`e_*`: an offset; `asinh_end_rise`: the gain sheared by the start, "
        "`bayes_grpo.population.gain_variable`). `per-run partial (not kept)`: an experiment on models 2.0-2.1 that wrote "
        "each run's gain, timescale and shape between centred and offset by how far the run moved; removed. "
        "Rows accumulate across invocations (`fit_geometry.csv`); what they mean: `fit_scaling.notes.md`.\n\n"
        + markdown(table)
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--draws", type=int, default=200, help="draws per chain (200)")
    parser.add_argument("--chains", type=int, default=2, help="chains (2)")
    parser.add_argument("--seed", type=int, default=1, help="sampler seed (1)")
    parser.add_argument("--only", choices=PARAMETERISATIONS, help="fit one parameterisation only")
    parser.add_argument("--gain-at", choices=GAIN_REFERENCES, default=ModelConfig.gain_at, help="where the gain is measured (model default)")
    parser.add_argument("--max-bins", type=int, default=ModelConfig.max_bins, help="bins per run in the likelihood (model default)")
    parser.add_argument("--tune", type=int, help="tuning steps per chain (default: the package's, 500)")
    parser.add_argument("--worker", choices=PARAMETERISATIONS, help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, default=RESULTS, help="results folder (benchmarks/results)")
    args = parser.parse_args()
    if args.worker:  # one fit, its row as JSON on stdout
        print(json.dumps(fit_once(args.worker, args.draws, args.chains, args.seed, args.gain_at, args.max_bins, args.tune)))
        return
    started = time.perf_counter()
    rows = []
    for parameterisation in [args.only] if args.only else PARAMETERISATIONS:
        command = [sys.executable, __file__, "--worker", parameterisation, "--draws", str(args.draws), "--chains", str(args.chains), "--seed", str(args.seed),
                   "--gain-at", args.gain_at, "--max-bins", str(args.max_bins)] + (["--tune", str(args.tune)] if args.tune else [])
        print(f"fitting ({parameterisation}, {args.draws} draws) ...", flush=True)
        done = subprocess.run(command, capture_output=True, text=True, check=True)
        row = json.loads(done.stdout.strip().splitlines()[-1])
        label = row.pop("label")
        rows.append({**row, "parameterisation": label, "command": command_line(), "finished_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime())})
        print(rows[-1], flush=True)
    table_path = args.out / "fit_geometry.csv"
    previous = pd.read_csv(table_path) if table_path.is_file() else pd.DataFrame()
    table = pd.concat([previous, pd.DataFrame(rows)], ignore_index=True)
    table = table[["model"] + [c for c in table.columns if c != "model"]]
    table.to_csv(table_path, index=False)
    text = report(table, time.perf_counter() - started)
    (args.out / "fit_geometry.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
