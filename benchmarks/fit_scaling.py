"""How the cost of a full hierarchical fit grows with the number of runs and their length.

Runs are simulated from a fitted population (``--truth FILE``, else
:func:`bayes_grpo.default_model`, whatever model file the package ships when the benchmark
runs), so the answer is known:

* the *truth* is the posterior mean of every population variable of that model;
* when the population has source levels (``src_gain_sd``), the simulated runs come in
  sources of :data:`RUNS_PER_SOURCE` runs, each source with its own effects drawn from
  the true source spreads;
* each run gets a family (cycling over the families the model knows, so their true
  effects are the model's), a size ``params_b = 10**x`` with ``x ~ U(-1.5, 1)``, the
  declared reward range (0, 1) and a declared initial reward ``~ U(0.05, 0.6)``, so its
  covariates are exact; its covariates come from :func:`bayes_grpo.prepare.prepare_run`
  (a run not yet started) and :func:`bayes_grpo.prepare.size_centres`, as in the fit;
* its five parameters are drawn from :func:`bayes_grpo.population.run_prior` (the density
  the fit uses) and its ``steps`` logged rewards from :func:`bayes_grpo.population.simulate`
  (curve plus Student-t per-step noise), one per step, ``total_steps = steps``.

Every fit runs in its own subprocess through the public API (:func:`bayes_grpo.fit` with the
truth model's ``model_config``) and records its wall time (model build, compilation and
sampling), peak resident memory (the worker's ``ru_maxrss``), smallest bulk ESS per second
of wall time, r_hat, divergences, the machine's load, and the error of the recovered
population parameters: every population variable that is a scalar or has one value per
scale kind (the declared-range kind's value, the kind the runs are simulated on), as the
mean |posterior mean - truth|, the same in posterior SDs, and the share of truths inside the
central 90% interval.

``--gradients`` measures, instead of fits, the cost of one log-density-plus-gradient
evaluation of the same PyMC model: compiled by PyTensor's Numba backend (what nutpie
samples with) and by JAX (what ``pm.sample(nuts_sampler="numpyro")`` samples with, on a
GPU when JAX sees one). NUTS spends almost all its time in these evaluations, so this is
where a JAX engine (and a GPU) can overtake nutpie. ``--sampler numpyro`` runs the fits
themselves through numpyro; both need the ``jax`` extra (``pip install .[jax]``).

The likelihood holds ``runs x bins`` terms, ``bins = min(steps, ModelConfig.max_bins)``:
longer runs than ``max_bins`` steps cost the same per gradient and only change the data
(less noise per bin).

Rows are merged into ``benchmarks/results/fit_scaling.csv`` (fits) and
``fit_scaling.gradients.csv`` (gradient cost), replacing rows of the same setting, so a grid
can be filled over several calls; ``fit_scaling.md`` and ``fit_scaling.png`` are rewritten
from both after every row.

    python benchmarks/fit_scaling.py --sizes 40 80 --steps 200 --draws 200     # a partial grid
    python benchmarks/fit_scaling.py                                           # 40..640 runs x 200/1000/5000 steps
    python benchmarks/fit_scaling.py --gradients --sizes 40 80 160 320 640     # per-gradient cost, Numba vs JAX
    python benchmarks/fit_scaling.py --sizes 40 --steps 200 --draws 200 --sampler numpyro
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import resource
import shlex
import subprocess
import sys
import time
import warnings
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import pandas as pd
from common import parameterisation_label

from bayes_grpo.config import PARAMETERISATIONS, ModelConfig

RESULTS = Path(__file__).resolve().parent / "results"
#: Simulated runs per source, when the population has source levels (real data: 77 runs from 26 sources).
RUNS_PER_SOURCE = 5
#: Declared reward range of the simulated runs, and the kind it selects in per-kind variables.
REWARD_RANGE = (0.0, 1.0)
RANGE_KIND = 0
#: Columns that identify one setting (a new row replaces an old one with the same values).
FIT_KEY = ["runs", "steps", "draws", "chains", "sampler", "device", "parameterisation", "gain_at"]
GRADIENT_KEY = ["runs", "steps", "backend", "device"]


def population_truth(model) -> dict[str, np.ndarray]:
    """Posterior mean of every population variable of ``model`` (the simulation's truth)."""
    return {name: np.asarray(values).mean(axis=-1) for name, values in model.population_arrays().items()}


def simulate_runs(model, n_runs: int, steps: int, seed: int) -> tuple[list, dict[str, np.ndarray]]:
    """Simulate ``n_runs`` logs of ``steps`` steps from ``model``'s population (see the module docstring).

    Returns
    -------
    (list of RunLog, dict)
        The runs and the truth (population values, before any simulated source effects).
    """
    import bayes_grpo as bg
    from bayes_grpo.population import PARAMS, Covariates, natural, run_prior, simulate
    from bayes_grpo.prepare import centred_size, prepare_run, size_centres, start_level

    truth = population_truth(model)
    families = [f for f in model.families if f not in ("unknown", "(no family)")] or list(model.families)
    rng = np.random.default_rng(seed)
    log10_size = rng.uniform(-1.5, 1.0, n_runs)
    initial = rng.uniform(0.05, 0.6, n_runs)
    source = np.arange(n_runs) // RUNS_PER_SOURCE
    family_names = [families[r % len(families)] for r in range(n_runs)]
    described = [
        prepare_run(None, total_steps=steps, family=family_names[r], params_b=float(10 ** log10_size[r]), initial_reward=float(initial[r]), reward_range=REWARD_RANGE)
        for r in range(n_runs)
    ]
    centres = size_centres(described)
    values = {
        "kind": np.array([p.kind_index for p in described]),
        "family": np.array([list(model.families).index(p.family) for p in described]),
        "source": source,
        "size": np.array([centred_size(p, centres) for p in described]),
        "init": np.array([p.initial_cov for p in described]),
        "start": np.array([start_level(p) for p in described]),
        "declared": np.ones(n_runs),  # every simulated run declares its initial reward
    }
    # A covariate computed from the run's own rewards (e.g. its early rise) cannot be drawn before
    # the rewards: the simulated population has no such effect (its coefficients, named
    # ``<parameter>_<covariate>``, are 0 in the truth), so the fit should find them near 0.
    for field in dataclasses.fields(Covariates):
        if field.name not in values:
            values[field.name] = np.zeros(n_runs)
            truth.update({name: np.zeros_like(value) for name, value in truth.items() if name.endswith(f"_{field.name}")})
    simulated_population = dict(truth)
    if "src_gain_sd" in truth:
        n_sources = int(source.max()) + 1
        simulated_population["src_gain"] = np.atleast_1d(truth["src_gain_sd"])[RANGE_KIND] * rng.standard_normal(n_sources)
        simulated_population["src_tau"] = float(truth["src_tau_sd"]) * rng.standard_normal(n_sources)
    cov = Covariates(**{field.name: values[field.name] for field in dataclasses.fields(Covariates)})
    loc, scale = run_prior(simulated_population, cov, model.model_config, np)
    theta = {name: np.broadcast_to(loc[name], (n_runs,)) + np.broadcast_to(scale[name], (n_runs,)) * rng.standard_normal(n_runs) for name in PARAMS}
    t = np.arange(1, steps + 1) / steps
    _, z = simulate(model.model_config, t, natural(theta, model.model_config), rng)
    runs = []
    for r, p in enumerate(described):
        frame = pd.DataFrame({"step": np.arange(1, steps + 1), "reward": p.loc + p.unit * z[r]})
        run = bg.read_log(frame, run_id=f"sim-{r:04d}", family=family_names[r], params_b=float(10 ** log10_size[r]), total_steps=steps, reward_range=REWARD_RANGE)
        runs.append(run.with_meta(initial_reward=float(initial[r]), extra={"source_repo": f"sim-source-{source[r]:03d}"}))
    return runs, truth


def recovery(population, truth: dict[str, np.ndarray]) -> dict[str, float]:
    """Error of the recovered population parameters (scalars and the range kind's per-kind values).

    Returns the mean |posterior mean - truth|, the mean of the same in posterior SDs, the share
    of truths inside the central 90% interval, and the number of values compared.
    """
    absolute, standardised, covered = [], [], []
    for name, draws in population.data_vars.items():
        other_dims = set(draws.dims) - {"chain", "draw"}
        if name not in truth or not other_dims <= {"kind"}:
            continue
        true = float(truth[name][RANGE_KIND]) if "kind" in other_dims else float(truth[name])
        if "kind" in other_dims:
            draws = draws.isel(kind=RANGE_KIND)
        values = np.asarray(draws).ravel()
        mean, sd = float(values.mean()), float(values.std())
        lo, hi = np.quantile(values, [0.05, 0.95])
        absolute.append(abs(mean - true))
        standardised.append(abs(mean - true) / max(sd, 1e-12))
        covered.append(lo <= true <= hi)
    return {
        "pop_abs_error": float(np.mean(absolute)),
        "pop_error_sds": float(np.mean(standardised)),
        "pop_cover90": float(np.mean(covered)),
        "n_pop_values": len(absolute),
    }


def _peak_mb() -> float:
    """Peak resident memory of this process so far, MB (Linux reports ``ru_maxrss`` in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def fit_worker(spec: dict) -> dict:
    """Simulate and fit one setting in this process; returns the measured row."""
    import bayes_grpo as bg
    from bayes_grpo.config import merge

    warnings.simplefilter("ignore")
    device = _jax_device() if spec["sampler"] == "numpyro" else "cpu"
    print(json.dumps({"device": device}), flush=True)  # known to the parent even if the fit times out
    truth_model = _truth_model(spec)
    runs, truth = simulate_runs(truth_model, spec["runs"], spec["steps"], spec["seed"])
    sampler_config = {"draws": spec["draws"], "tune": spec["draws"], "chains": spec["chains"], "seed": spec["seed"], "progressbar": False}
    if spec["sampler"]:
        sampler_config["sampler"] = spec["sampler"]
    started = time.perf_counter()
    model_config = merge(truth_model.model_config, {"parameterisation": spec["parameterisation"]})
    fitted = bg.fit(runs, model_config=model_config, sampler_config=sampler_config, keep_full=False)
    wall = time.perf_counter() - started
    diag = fitted.diagnostics
    bins = min(spec["steps"], int(fitted.model_config.max_bins))
    return {
        "runs": spec["runs"],
        "steps": spec["steps"],
        "bins_per_run": bins,
        "runs_x_bins": spec["runs"] * bins,
        "sampler": diag.sampler,
        "device": device,
        "parameterisation": parameterisation_label(spec["parameterisation"], fitted.model_config),
        "gain_at": fitted.model_config.gain_at,
        "draws": spec["draws"],
        "chains": spec["chains"],
        "wall_s": round(wall, 1),
        "sampling_s": round(diag.seconds, 1),
        "peak_mb": round(_peak_mb()),
        "max_r_hat": round(diag.max_r_hat, 3),
        "min_ess_bulk": round(diag.min_ess_bulk),
        "ess_per_s": round(diag.min_ess_bulk / wall, 3),
        "divergences": diag.divergences,
        **{k: (round(v, 3) if isinstance(v, float) else v) for k, v in recovery(fitted.population, truth).items()},
        "load_1min": round(os.getloadavg()[0], 2),
        "status": "ok",
    }


def _time_calls(call, min_seconds: float = 2.0, max_calls: int = 500) -> tuple[float, int]:
    """Median seconds of one call of ``call`` (after one warm-up call) and the number of calls timed."""
    call()
    times = []
    begun = time.perf_counter()
    while len(times) < max_calls and (time.perf_counter() - begun < min_seconds or len(times) < 5):
        started = time.perf_counter()
        call()
        times.append(time.perf_counter() - started)
    return float(np.median(times)), len(times)


def gradient_worker(spec: dict) -> dict:
    """Build the PyMC model of one simulated setting and time one log-density + gradient with ``spec["backend"]``."""
    import bayes_grpo as bg
    from bayes_grpo.pymc_model import build_model
    from bayes_grpo.prepare import prepare_run, size_centres

    warnings.simplefilter("ignore")
    device = _jax_device() if spec["backend"] == "jax" else "cpu"
    print(json.dumps({"device": device}), flush=True)
    truth_model = _truth_model(spec)
    runs, _ = simulate_runs(truth_model, spec["runs"], spec["steps"], spec["seed"])
    prepared = [prepare_run(run, require_total=False) for run in runs]
    model = build_model(prepared, truth_model.model_config, size_centres(prepared))
    point = model.initial_point()
    started = time.perf_counter()
    if spec["backend"] == "numba":
        logp_grad = model.logp_dlogp_function(ravel_inputs=True, mode="NUMBA")
        logp_grad.set_extra_values({})
        x = np.concatenate([np.ravel(point[v.name]) for v in model.continuous_value_vars])
        logp_grad(x)
        compile_s = time.perf_counter() - started
        seconds, calls = _time_calls(lambda: logp_grad(x))
    else:
        import jax
        from pymc.sampling.jax import get_jaxified_logp

        logp = get_jaxified_logp(model, negative_logp=False)
        value_and_grad = jax.jit(jax.value_and_grad(logp))
        x = [np.asarray(point[v.name]) for v in model.value_vars]
        jax.block_until_ready(value_and_grad(x))
        compile_s = time.perf_counter() - started
        seconds, calls = _time_calls(lambda: jax.block_until_ready(value_and_grad(x)))
    bins = min(spec["steps"], int(truth_model.model_config.max_bins))
    return {
        "runs": spec["runs"],
        "steps": spec["steps"],
        "bins_per_run": bins,
        "runs_x_bins": spec["runs"] * bins,
        "backend": spec["backend"],
        "device": device,
        "n_params": int(sum(np.size(point[v.name]) for v in model.value_vars)),
        "compile_s": round(compile_s, 2),
        "grad_ms": round(1000 * seconds, 4),
        "calls_timed": calls,
        "peak_mb": round(_peak_mb()),
        "load_1min": round(os.getloadavg()[0], 2),
        "status": "ok",
    }


def _truth_model(spec: dict):
    """The population the runs are simulated from and whose settings the fits use: ``--truth``, else the shipped model."""
    import bayes_grpo as bg

    return bg.load_model(spec["truth"]) if spec.get("truth") else bg.default_model()


def _jax_device() -> str:
    """The platform of JAX's default device (``cpu``, ``gpu``, ...)."""
    import jax

    return str(jax.devices()[0].platform)


def run_worker(spec: dict, timeout: float) -> dict:
    """Run one fit or gradient measurement in a fresh subprocess (its memory and compile time are its own)."""
    base = {k: spec[k] for k in ("runs", "steps") + (("backend",) if spec["mode"] == "gradients" else ("draws", "chains", "sampler"))}
    try:
        done = subprocess.run([sys.executable, __file__, "--worker", json.dumps(spec)], capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired as stopped:
        return {**base, **_printed(stopped.stdout), "status": f"timeout after {timeout:.0f} s", "load_1min": round(os.getloadavg()[0], 2)}
    if done.returncode != 0 or "status" not in _printed(done.stdout):
        return {**base, **_printed(done.stdout), "status": "failed: " + (done.stderr.strip().splitlines() or ["?"])[-1][:200]}
    return _printed(done.stdout)


def _printed(stdout: str | bytes | None) -> dict:
    """The JSON lines a worker printed, merged in order (the early ``device`` line, then the row)."""
    text = stdout.decode(errors="replace") if isinstance(stdout, bytes) else (stdout or "")
    return {key: value for line in text.splitlines() if line.startswith("{") for key, value in json.loads(line).items()}


def merge_rows(path: Path, rows: list[dict], key: list[str]) -> pd.DataFrame:
    """The table at ``path`` with ``rows`` added, replacing older rows with the same ``key``; written back."""
    new = pd.DataFrame(rows)
    new = new.reindex(columns=[*new.columns, *(k for k in key if k not in new.columns)])  # a failed row lacks some
    if path.exists():
        old = pd.read_csv(path)
        if "device" in key and "device" not in old:  # rows from before the device column: all measured on CPU
            old = old.assign(device="cpu")
        if set(key) <= set(old.columns):
            fresh = set(map(tuple, new[key].astype(str).values))
            old = old[[tuple(row) not in fresh for row in old[key].astype(str).values]]
        new = pd.concat([old, new], ignore_index=True)
    new = new.sort_values(key, kind="stable").reset_index(drop=True)
    new.to_csv(path, index=False)
    return new


def exponent(table: pd.DataFrame, y: str) -> float | None:
    """Slope of log(``y``) on log(runs x bins) over the rows with status ok (None with fewer than two sizes)."""
    if table.empty or "status" not in table:
        return None
    ok = table[table["status"] == "ok"]
    if ok["runs_x_bins"].nunique() < 2:
        return None
    return float(np.polyfit(np.log(ok["runs_x_bins"].astype(float)), np.log(ok[y].astype(float)), 1)[0])


def _loglog(ax, table: pd.DataFrame, y: str, by: str, label: str, ylabel: str) -> None:
    """Points of ``y`` against runs x bins, one line per value of ``by``, and the fitted power law."""
    from matplotlib.ticker import NullFormatter

    import matplotlib.pyplot as plt

    ax.set_prop_cycle(color=plt.cm.tab20.colors)  # more settings than the default ten colours
    for value, group in table.groupby(by):
        group = group.sort_values("runs_x_bins")
        slope = exponent(group, y)
        ax.loglog(group["runs_x_bins"], group[y], "o-", label=label.format(value) + ("" if slope is None else f" (exponent {slope:.2f})"))
    ticks = sorted(int(v) for v in table["runs_x_bins"].unique())
    ax.set_xticks(ticks, [str(v) for v in ticks], fontsize=7)
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("runs x bins (likelihood terms)")
    ax.set_ylabel(ylabel)
    # Below the axes: the whole-fit panel has a dozen settings, whose labels would hide the points.
    ax.legend(fontsize=6, loc="upper left", bbox_to_anchor=(0.0, -0.16), frameon=False)


def write_report(fits: pd.DataFrame, gradients: pd.DataFrame, out: Path) -> None:
    """Rewrite ``fit_scaling.md`` and ``fit_scaling.png`` from the two tables."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if len(fits):  # rows from before these options: CPU, non-centred and the gain at the asymptote, the only choices then
        fits = fits.assign(
            device=fits.get("device", pd.Series(index=fits.index, dtype=object)).fillna("cpu"),
            parameterisation=fits.get("parameterisation", pd.Series(index=fits.index, dtype=object)).fillna("non_centred"),
            gain_at=fits.get("gain_at", pd.Series(index=fits.index, dtype=object)).fillna("asymptote"),
        )
        columns = [c for c in fits.columns if c not in ("device", "parameterisation", "gain_at")]
        fits = fits[columns[: columns.index("sampler") + 1] + ["device", "parameterisation", "gain_at"] + columns[columns.index("sampler") + 1 :]]
    ok_fits = fits[fits["status"] == "ok"] if "status" in fits else fits.iloc[0:0]
    ok_gradients = gradients[gradients["status"] == "ok"] if "status" in gradients else gradients.iloc[0:0]
    fig, axes = plt.subplots(1, 2, figsize=(13, 7.5), gridspec_kw={"width_ratios": [1.6, 1]})
    if len(ok_fits):
        setting = ok_fits["sampler"] + " (" + ok_fits["device"] + ") " + ok_fits["parameterisation"] + ", gain at " + ok_fits["gain_at"] + ", " + ok_fits["steps"].astype(str) + " steps, " + ok_fits["draws"].astype(str) + " draws"
        _loglog(axes[0], ok_fits.assign(setting=setting), "wall_s", "setting", "{}", "wall time of the fit (s)")
    axes[0].set_title("whole fit", fontsize=9)
    if len(ok_gradients):
        _loglog(axes[1], ok_gradients.assign(setting=ok_gradients["backend"] + " (" + ok_gradients["device"] + ")"), "grad_ms", "setting", "{}", "one log-density + gradient (ms)")
    axes[1].set_title("per gradient", fontsize=9)
    fig.subplots_adjust(left=0.06, right=0.98, top=0.95, bottom=0.4, wspace=0.2)
    fig.savefig(out / "fit_scaling.png", dpi=110)
    plt.close(fig)

    def table_or_none(table: pd.DataFrame) -> str:
        return table.drop(columns=["command"], errors="ignore").to_markdown(index=False) if len(table) else "(none yet)"

    commands = sorted(set(fits.get("command", pd.Series(dtype=str)).dropna()) | set(gradients.get("command", pd.Series(dtype=str)).dropna()))
    fit_slopes = {setting: exponent(group, "wall_s") for setting, group in ok_fits.groupby(["sampler", "device", "parameterisation", "gain_at", "steps", "draws"])} if len(ok_fits) else {}
    grad_slopes = {setting: exponent(group, "grad_ms") for setting, group in ok_gradients.groupby(["backend", "device"])} if len(ok_gradients) else {}
    lines = [
        "# Fit cost vs number of runs and steps",
        "",
        "Produced by `benchmarks/fit_scaling.py` (its docstring has the design). Commands that produced these rows:",
        "",
        *[f"- `{c}`" for c in commands],
        "",
        f"Report rewritten {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC. The machine has 2 cores shared with other "
        "jobs; `load_1min` is its 1-minute load when the row ended, and times at a load above 2 are inflated.",
        "",
        "## Whole fits",
        "",
        "Runs simulated from the shipped population (truth: its posterior means); each fit in its own process "
        "through `bg.fit`. `wall_s`: build + compile + sampling; `sampling_s`: what `FittedModel.diagnostics` "
        "records; `peak_mb`: the worker's peak resident memory; `ess_per_s`: smallest bulk ESS / wall time; "
        "`pop_abs_error`, `pop_error_sds`, `pop_cover90`: mean |posterior mean - truth|, the same in posterior SDs, "
        "and the share of true values inside the 90% interval, over `n_pop_values` population values.",
        "",
        table_or_none(fits),
        "",
        *[f"- Exponent of wall time in runs x bins ({s} on {dev}, {p}, gain at {g}, {st} steps, {d} draws): {v:.2f}" for (s, dev, p, g, st, d), v in fit_slopes.items() if v is not None],
        "",
        "## Cost of one log-density + gradient",
        "",
        "The same PyMC model compiled by PyTensor's Numba backend (nutpie's) and by JAX (numpyro's); median of "
        "repeated calls at the initial point after a warm-up call. `compile_s` includes the first call.",
        "",
        table_or_none(gradients),
        "",
        *[f"- Exponent of per-gradient time in runs x bins ({b} on {dev}): {v:.2f}" for (b, dev), v in grad_slopes.items() if v is not None],
        "",
        "![fit scaling](fit_scaling.png)",
        "",
    ]
    notes = out / "fit_scaling.notes.md"
    if notes.exists():
        lines += ["## Notes", "", notes.read_text().strip(), ""]
    (out / "fit_scaling.md").write_text("\n".join(lines))


def main(argv: list[str] | None = None) -> int:
    """Parse the options, run the requested grid row by row, and keep the results and report up to date."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[40, 80, 160, 320, 640], help="numbers of runs")
    parser.add_argument("--steps", type=int, nargs="+", default=[200, 1000, 5000], help="logged steps per run")
    parser.add_argument("--draws", type=int, default=1000, help="posterior draws per chain (tuning steps: the same)")
    parser.add_argument("--chains", type=int, default=2)
    parser.add_argument("--sampler", choices=["nutpie", "numpyro", "pymc"], default=None, help="default: bg.fit's choice")
    parser.add_argument("--parameterisation", choices=PARAMETERISATIONS, default=ModelConfig.parameterisation, help="of the per-run parameters in the fits")
    parser.add_argument("--truth", type=Path, help="model file to simulate from and whose settings the fits use (default: the shipped model)")
    parser.add_argument("--gradients", action="store_true", help="time one log-density + gradient (Numba and JAX) instead of fitting")
    parser.add_argument("--backends", nargs="+", choices=["numba", "jax"], default=["numba", "jax"], help="with --gradients")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds allowed per fit or measurement")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        spec = json.loads(args.worker)
        print(json.dumps(fit_worker(spec) if spec["mode"] == "fits" else gradient_worker(spec)), flush=True)
        return 0
    command = "python benchmarks/fit_scaling.py " + shlex.join(argv if argv is not None else sys.argv[1:])
    args.out.mkdir(parents=True, exist_ok=True)
    fits_path, gradients_path = args.out / "fit_scaling.csv", args.out / "fit_scaling.gradients.csv"
    for steps in args.steps:
        for n_runs in args.sizes:
            for backend in args.backends if args.gradients else [None]:
                spec = {"runs": n_runs, "steps": steps, "seed": args.seed, "truth": str(args.truth) if args.truth else None}
                if args.gradients:
                    spec.update(mode="gradients", backend=backend)
                else:
                    spec.update(mode="fits", draws=args.draws, chains=args.chains, sampler=args.sampler, parameterisation=args.parameterisation)
                row = {**run_worker(spec, args.timeout), "command": command.strip()}
                if not args.gradients and row.get("sampler") is None:
                    row["sampler"] = "default"
                print(json.dumps(row), flush=True)
                path, key = (gradients_path, GRADIENT_KEY) if args.gradients else (fits_path, FIT_KEY)
                merge_rows(path, [row], key)
                fits = pd.read_csv(fits_path) if fits_path.exists() else pd.DataFrame()
                gradients = pd.read_csv(gradients_path) if gradients_path.exists() else pd.DataFrame()
                write_report(fits, gradients, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
