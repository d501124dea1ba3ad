"""How the cost of a full hierarchical fit grows with the number of runs and their length.

Runs are simulated from the shipped population (:func:`bayes_grpo.default_model`),
so the answer is known: the *truth* is the posterior mean of every population
variable, and each simulated run gets

* a family (cycling over the families the default model knows), a size
  ``params_b = 10**x`` with ``x ~ U(-1.5, 1)``, a declared reward range (0, 1) and a
  declared initial reward ``i0 ~ U(0.05, 0.6)`` (so its covariates are exact);
* per-run parameters drawn from the population model given those covariates
  (:func:`bayes_grpo.population.run_prior`, the same density the fit uses);
* ``steps`` logged rewards from :func:`bayes_grpo.population.simulate`
  (curve + Student-t per-step noise), one per step, ``total_steps = steps``.

Every fit runs in its own subprocess through the public API
(:func:`bayes_grpo.fit`, :attr:`FittedModel.diagnostics`) and reports its wall
time (build, compile and sampling), its peak resident memory (the worker's own
``ru_maxrss``), the smallest bulk ESS per second of wall time, r_hat,
divergences, the machine load, and the error of the recovered population
parameters (posterior mean minus truth, absolute and in posterior SDs; only
the declared-range kind's parameters, the kind the runs are simulated on).

``--sampler numpyro`` runs the same fits through ``pm.sample(nuts_sampler="numpyro")``
(JAX; it uses a GPU when JAX sees one). It needs ``numpyro`` and ``jax``, which are
not dependencies of the package; where it overtakes nutpie on CPU is not measured yet.

Results go to ``benchmarks/results/fit_scaling.{md,csv,png}``; the plot is wall
time against runs x bins (the size of the likelihood) on log-log axes with the
fitted exponent.

    python benchmarks/fit_scaling.py --quick                        # 40 and 80 runs, 200 steps, 200 draws
    python benchmarks/fit_scaling.py                                # 40..640 runs x 200/1000/5000 steps
    python benchmarks/fit_scaling.py --sizes 40 80 --steps 200 --draws 500 --sampler numpyro
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import pandas as pd

RESULTS = Path(__file__).resolve().parent / "results"
#: Population variables compared with the truth (index 0 of ``kind`` = declared range).
RECOVERED = (
    "gain_mu", "gain_sd", "gain_size", "gain_init", "fam_gain_sd",
    "tau_mu", "tau_sd", "tau_size", "tau_init", "fam_tau_sd",
    "beta_mu", "beta_sd", "r0_sd", "sig_mu", "sig_sd",
)  # fmt: skip
RANGE_KIND = 0


def truth_values(model) -> dict[str, np.ndarray]:
    """Posterior mean of every population variable of ``model`` (the simulation's truth)."""
    return {name: np.asarray(values).mean(axis=-1) for name, values in model.population_arrays().items()}


def simulate_runs(n_runs: int, steps: int, seed: int) -> tuple[list, dict[str, np.ndarray], list[str]]:
    """Simulate ``n_runs`` logs of ``steps`` steps from the default model's population (see module docstring).

    Returns the runs, the truth and the families of the default model.
    """
    import bayes_grpo as bg
    from bayes_grpo.population import PARAMS, Covariates, natural, run_prior, simulate

    model = bg.default_model()
    truth = truth_values(model)
    families = [f for f in model.families if f != "unknown"] or model.families
    rng = np.random.default_rng(seed)
    log10_size = rng.uniform(-1.5, 1.0, n_runs)
    centre = float(log10_size.mean())  # what size_centres computes for runs of one kind
    initial = rng.uniform(0.05, 0.6, n_runs)
    t = np.arange(1, steps + 1) / steps
    runs = []
    for r in range(n_runs):
        family = families[r % len(families)]
        cov = Covariates(
            kind=RANGE_KIND,
            family=model.families.index(family),
            size=log10_size[r] - centre,
            init=initial[r] - 0.3,
            start=initial[r],
        )
        loc, scale = run_prior(truth, cov, model.model_config, np)
        theta = {name: np.atleast_1d(loc[name] + scale[name] * rng.standard_normal()) for name in PARAMS}
        _, rewards = simulate(model.model_config, t, natural(theta), rng)
        frame = pd.DataFrame({"step": np.arange(1, steps + 1), "reward": rewards[0]})
        run = bg.read_log(frame, run_id=f"sim-{r:04d}", family=family, params_b=float(10 ** log10_size[r]), total_steps=steps, reward_range=(0.0, 1.0))
        runs.append(run.with_meta(initial_reward=float(initial[r])))
    return runs, truth, families


def recovery_error(population, truth: dict[str, np.ndarray]) -> tuple[float, float]:
    """Mean |posterior mean - truth| and mean |posterior mean - truth| / posterior SD over :data:`RECOVERED`."""
    absolute, standardised = [], []
    for name in RECOVERED:
        if name not in population:
            continue
        draws = population[name]
        if "kind" in draws.dims:
            draws = draws.isel(kind=RANGE_KIND)
        true = truth[name][RANGE_KIND] if np.ndim(truth[name]) else truth[name]
        mean, sd = float(draws.mean()), float(draws.std())
        absolute.append(abs(mean - float(true)))
        standardised.append(abs(mean - float(true)) / max(sd, 1e-12))
    return float(np.mean(absolute)), float(np.mean(standardised))


def worker(spec: dict) -> dict:
    """Simulate and fit one setting in this process; returns the measured row."""
    import bayes_grpo as bg

    warnings.simplefilter("ignore")
    runs, truth, _ = simulate_runs(spec["runs"], spec["steps"], spec["seed"])
    sampler_config = {"draws": spec["draws"], "tune": spec["tune"], "chains": spec["chains"], "seed": spec["seed"], "progressbar": False}
    if spec["sampler"]:
        sampler_config["sampler"] = spec["sampler"]
    started = time.perf_counter()
    model = bg.fit(runs, sampler_config=sampler_config, keep_full=False)
    wall = time.perf_counter() - started
    diag = model.diagnostics
    abs_err, sd_err = recovery_error(model.population, truth)
    max_bins = int(model.model_config.max_bins)
    return {
        "runs": spec["runs"],
        "steps": spec["steps"],
        "bins_per_run": min(spec["steps"], max_bins),
        "runs_x_bins": spec["runs"] * min(spec["steps"], max_bins),
        "sampler": diag.sampler,
        "draws": spec["draws"],
        "chains": spec["chains"],
        "wall_s": round(wall, 1),
        "peak_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0, 0),
        "max_r_hat": round(diag.max_r_hat, 3),
        "min_ess_bulk": round(diag.min_ess_bulk, 0),
        "ess_per_s": round(diag.min_ess_bulk / wall, 2),
        "divergences": diag.divergences,
        "pop_abs_error": round(abs_err, 3),
        "pop_error_sds": round(sd_err, 2),
        "load_1min": round(os.getloadavg()[0], 2),
        "status": "ok",
    }


def run_one(spec: dict, timeout: float) -> dict:
    """Run :func:`worker` for ``spec`` in a fresh subprocess (so memory and compile time are its own)."""
    base = {"runs": spec["runs"], "steps": spec["steps"], "draws": spec["draws"], "chains": spec["chains"]}
    try:
        done = subprocess.run(
            [sys.executable, __file__, "--worker", json.dumps(spec)], capture_output=True, text=True, timeout=timeout, check=False
        )
    except subprocess.TimeoutExpired:
        return {**base, "status": f"timeout after {timeout:.0f} s", "load_1min": round(os.getloadavg()[0], 2)}
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        return {**base, "status": f"failed: {(done.stderr.strip().splitlines() or ['?'])[-1][:200]}"}
    return json.loads(lines[-1])


def fitted_exponent(table: pd.DataFrame) -> float | None:
    """Slope of log(wall time) on log(runs x bins) over the successful fits (None with < 2 sizes)."""
    ok = table[table["status"] == "ok"]
    if ok["runs_x_bins"].nunique() < 2:
        return None
    return float(np.polyfit(np.log(ok["runs_x_bins"].astype(float)), np.log(ok["wall_s"].astype(float)), 1)[0])


def write_results(table: pd.DataFrame, command: str, out: Path) -> None:
    """Write the CSV, the markdown table and the log-log plot."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    table.to_csv(out / "fit_scaling.csv", index=False)
    slope = fitted_exponent(table)
    ok = table[table["status"] == "ok"]
    if len(ok):
        fig, ax = plt.subplots(figsize=(5.5, 4))
        for steps, group in ok.groupby("steps"):
            ax.loglog(group["runs_x_bins"], group["wall_s"], "o-", label=f"{steps} steps/run")
        if slope is not None:
            x = np.geomspace(ok["runs_x_bins"].min(), ok["runs_x_bins"].max(), 20)
            coef = np.polyfit(np.log(ok["runs_x_bins"].astype(float)), np.log(ok["wall_s"].astype(float)), 1)
            ax.loglog(x, np.exp(np.polyval(coef, np.log(x))), "k--", label=f"fit: time ~ (runs x bins)^{slope:.2f}")
        ax.set_xlabel("runs x bins (likelihood terms)")
        ax.set_ylabel("wall time of the fit (s)")
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(out / "fit_scaling.png", dpi=120)
        plt.close(fig)
    lines = [
        "# Fit cost vs number of runs and steps",
        "",
        f"Command: `{command}`",
        "",
        "Runs simulated from the shipped population (posterior means as the truth, declared range (0, 1), "
        "declared initial reward); each fit in its own process through `bg.fit` "
        "(see the docstring of `benchmarks/fit_scaling.py`). Wall time includes model build and compilation. "
        "`pop_abs_error` / `pop_error_sds`: mean |posterior mean - truth| of the declared-range population "
        "parameters, absolute and in posterior SDs. `load_1min`: the machine's 1-minute load average when the "
        "fit ended (the CPU is shared; times at a load above the core count are inflated).",
        "",
        table.to_markdown(index=False),
        "",
        f"Fitted exponent of wall time in runs x bins: {slope:.2f}" if slope is not None else "Fitted exponent: needs at least two sizes.",
        "",
        "![fit scaling](fit_scaling.png)",
        "",
    ]
    (out / "fit_scaling.md").write_text("\n".join(lines))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[40, 80, 160, 320, 640], help="numbers of runs")
    parser.add_argument("--steps", type=int, nargs="+", default=[200, 1000, 5000], help="logged steps per run")
    parser.add_argument("--draws", type=int, default=1000, help="posterior draws per chain (tuning steps: the same)")
    parser.add_argument("--chains", type=int, default=2)
    parser.add_argument("--sampler", choices=["nutpie", "numpyro", "pymc"], default=None, help="default: bg.fit's choice")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds allowed per fit")
    parser.add_argument("--quick", action="store_true", help="40 and 80 runs, 200 steps, 200 draws")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(json.loads(args.worker))), flush=True)
        return 0
    if args.quick:
        args.sizes, args.steps, args.draws = [40, 80], [200], 200
    rows = []
    for steps in args.steps:
        for n_runs in args.sizes:
            spec = {"runs": n_runs, "steps": steps, "draws": args.draws, "tune": args.draws, "chains": args.chains, "sampler": args.sampler, "seed": args.seed}
            row = run_one(spec, args.timeout)
            print(json.dumps(row), flush=True)
            rows.append(row)
    command = "python benchmarks/fit_scaling.py " + " ".join(argv if argv is not None else sys.argv[1:])
    write_results(pd.DataFrame(rows), command.strip(), args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
