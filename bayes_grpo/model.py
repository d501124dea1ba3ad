"""The hierarchical Bayesian reward-curve model (PyMC) and its fitted form.

Each run ``r`` follows ``z(t) = r0 + gain * F(t; tau, beta)`` in normalised
progress ``t`` and normalised reward ``z`` (see :mod:`bayes_grpo.prepare` and
:mod:`bayes_grpo.curves`). Per-run parameters come from population
distributions whose means depend on the model family (partially pooled, with a
population level, so an unseen family still works), on log model size and on
the initial reward:

    gain_r     = sinh(gain_mu[k] + gain_sd[k] * (fam_gain[f] + gain_size * x + gain_init * i + e))
    log tau_r  = tau_mu + fam_tau[f] + tau_size * x + tau_init * i + tau_sd * e
    log beta_r = beta_mu + beta_sd * e
    r0_r       = start_r + r0_sd[k] * e
    log sig_r  = sig_mu[k] + sig_sd[k] * e

``k`` is the scale kind (declared reward range, or a unit learned from the run's own spread), ``x`` the
log10 size (centred within each kind) and ``i`` the centred initial reward. The sinh keeps small gains near-Normal while giving
the heavy right tail of real runs (most gain a few noise units, a few gain
tens) without spreading prior mass evenly over huge gains. A gain near zero or a
timescale beyond the horizon is how the model says "no take-off (yet)".

Per-step rewards are noisy batch means with outliers and collapses: they are
binned (at most ``max_bins`` per run) and given a Student-t likelihood whose
scale shrinks with the bin count.

:class:`FittedModel` keeps only the population posterior (small, shipped in the
package as :func:`default_model`); forecasts for any run are conditioned on that
run's steps by adaptive importance sampling in :mod:`bayes_grpo.forecast`,
without recompiling or refitting the hierarchy.
"""

from __future__ import annotations

import importlib.util
import json
import os
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

import arviz as az
import numpy as np
import xarray as xr

from bayes_grpo.curves import CURVE_FORMS, DEFAULT_FORM, reward_curve
from bayes_grpo.errors import ModelError
from bayes_grpo.logs import RunLog, RunSet
from bayes_grpo.prepare import SCALE_KINDS, PreparedRun, bin_observations, centred_size, prepare_run, size_centres, start_level

STUDENT_NU = 4.0

# Per-step noise never drops below this (normalised units): quantised rewards
# (a run logging exactly 2.0 for twenty steps) would otherwise drive sigma to 0.
NOISE_FLOOR = 0.02
# Scale of the Brownian model-discrepancy term of forecasts (in per-step noise
# units per unit of progress), chosen so that 90% intervals of forecasts from 30%
# of a run cover about 90% of finals in the calibration benchmark.
CALIBRATED_DRIFT = 1.5
# Prior centre of log(beta) per form: a mild slow start for the Weibull, a
# moderately sharp sigmoid for the logistic.
BETA_PRIOR_CENTRE = {"weibull": np.log(1.5), "loglogistic": np.log(2.0), "logistic": np.log(6.0), "exponential": 0.0}
POPULATION_VARS = (
    "gain_mu", "gain_sd", "gain_size", "gain_init", "fam_gain", "fam_gain_sd",
    "tau_mu", "tau_sd", "tau_size", "tau_init", "fam_tau", "fam_tau_sd",
    "beta_mu", "beta_sd", "r0_sd", "sig_mu", "sig_sd",
)
DEFAULT_MODEL_DIR = Path(__file__).resolve().parent / "assets" / "default_model"


def quick_mode() -> bool:
    """True when ``BAYES_GRPO_QUICK`` is set: tests and CI use short sampler runs."""
    return os.environ.get("BAYES_GRPO_QUICK", "").strip().lower() not in ("", "0", "false", "no")


def _prepare_all(runs: Iterable[RunLog]) -> list[PreparedRun]:
    prepared = [prepare_run(run, require_total=False) for run in runs]
    if not prepared:
        raise ModelError("fit needs at least one run")
    return prepared


def build_model(prepared: list[PreparedRun], form: str = DEFAULT_FORM, max_bins: int = 60, centres: list[float] | None = None) -> Any:
    """Build the hierarchical PyMC model for prepared runs (observations binned).

    ``centres`` are the per-kind log10-size centres (default: computed from ``prepared``).
    """
    import pymc as pm
    import pytensor.tensor as pt

    if form not in CURVE_FORMS:
        raise ModelError(f"unknown curve form {form!r}; choose one of {', '.join(CURVE_FORMS)}")
    families = sorted({p.family or "unknown" for p in prepared})
    fam_index = np.array([families.index(p.family or "unknown") for p in prepared])
    kind_index = np.array([p.kind_index for p in prepared])
    centres = centres if centres is not None else size_centres(prepared)
    size = np.array([centred_size(p, centres) for p in prepared])
    init = np.array([p.initial_cov for p in prepared])
    start = np.array([start_level(p) for p in prepared])
    t_obs, z_obs, counts, run_of_obs = [], [], [], []
    for r, p in enumerate(prepared):
        t_b, z_b, c_b = bin_observations(p.t, p.z, max_bins)
        t_obs.append(t_b), z_obs.append(z_b), counts.append(c_b), run_of_obs.append(np.full(t_b.size, r))
    coords = {
        "run": [p.run_id for p in prepared],
        "family": families,
        "kind": list(SCALE_KINDS),
        "obs": np.arange(sum(t.size for t in t_obs)),
    }
    with pm.Model(coords=coords) as model:
        t_data = pm.Data("t", np.concatenate(t_obs), dims="obs")
        z_data = pm.Data("z", np.concatenate(z_obs), dims="obs")
        count_data = pm.Data("count", np.concatenate(counts), dims="obs")
        run_idx = pm.Data("run_idx", np.concatenate(run_of_obs).astype("int64"), dims="obs")
        size_data = pm.Data("log10_size", size, dims="run")
        init_data = pm.Data("initial_cov", init, dims="run")
        start_data = pm.Data("start", start, dims="run")

        gain_mu = pm.Normal("gain_mu", mu=np.array([0.3, 0.5]), sigma=np.array([0.3, 0.5]), dims="kind")
        gain_sd = pm.HalfNormal("gain_sd", sigma=np.array([0.3, 0.5]), dims="kind")
        gain_size = pm.Normal("gain_size", 0.0, 0.5)
        gain_init = pm.Normal("gain_init", 0.0, 1.0)
        fam_gain_sd = pm.HalfNormal("fam_gain_sd", 0.5)
        fam_gain = pm.Deterministic("fam_gain", fam_gain_sd * pm.Normal("fam_gain_raw", 0, 1, dims="family"), dims="family")

        tau_mu = pm.Normal("tau_mu", np.log(0.3), 1.0)
        tau_sd = pm.HalfNormal("tau_sd", 0.8)
        tau_size = pm.Normal("tau_size", 0.0, 0.3)
        tau_init = pm.Normal("tau_init", 0.0, 1.0)
        fam_tau_sd = pm.HalfNormal("fam_tau_sd", 0.5)
        fam_tau = pm.Deterministic("fam_tau", fam_tau_sd * pm.Normal("fam_tau_raw", 0, 1, dims="family"), dims="family")

        beta_mu = pm.Normal("beta_mu", BETA_PRIOR_CENTRE[form], 0.5)
        beta_sd = pm.HalfNormal("beta_sd", 0.5)
        r0_sd = pm.HalfNormal("r0_sd", sigma=np.array([0.1, 0.3]), dims="kind")
        sig_mu = pm.Normal("sig_mu", mu=np.array([np.log(0.05), np.log(0.3)]), sigma=np.array([1.0, 0.7]), dims="kind")
        sig_sd = pm.HalfNormal("sig_sd", 0.5, dims="kind")

        kind = kind_index
        e_gain = pm.Normal("e_gain", 0, 1, dims="run")
        e_tau = pm.Normal("e_tau", 0, 1, dims="run")
        e_r0 = pm.Normal("e_r0", 0, 1, dims="run")
        e_sig = pm.Normal("e_sig", 0, 1, dims="run")
        gain = pm.Deterministic(
            "gain",
            pt.sinh(gain_mu[kind] + gain_sd[kind] * (fam_gain[fam_index] + gain_size * size_data + gain_init * init_data + e_gain)),
            dims="run",
        )
        tau = pm.Deterministic(
            "tau",
            pt.exp(tau_mu + fam_tau[fam_index] + tau_size * size_data + tau_init * init_data + tau_sd * e_tau),
            dims="run",
        )
        if form == "exponential":
            beta = pt.ones(len(prepared))
        else:
            beta = pm.Deterministic("beta", pt.exp(beta_mu + beta_sd * pm.Normal("e_beta", 0, 1, dims="run")), dims="run")
        r0 = pm.Deterministic("r0", start_data + r0_sd[kind] * e_r0, dims="run")
        sigma = pm.Deterministic("sigma", pt.exp(sig_mu[kind] + sig_sd[kind] * e_sig), dims="run")

        mu = reward_curve(form, t_data, r0[run_idx], gain[run_idx], tau[run_idx], beta[run_idx], xp=pt)
        noise = step_noise(sigma[run_idx], xp=pt) / pt.sqrt(count_data)
        pm.StudentT("z_obs", nu=STUDENT_NU, mu=mu, sigma=noise, observed=z_data, dims="obs")
    return model


def step_noise(sigma: Any, xp: Any = np) -> Any:
    """Per-step noise of the likelihood: the run's ``sigma`` with the :data:`NOISE_FLOOR` added in quadrature."""
    return xp.sqrt(sigma**2 + NOISE_FLOOR**2)


def _pick_sampler(requested: str | None) -> str:
    if requested:
        return requested
    for name in ("nutpie", "numpyro"):
        if importlib.util.find_spec(name) is not None:
            return name
    return "pymc"


@dataclass
class FitDiagnostics:
    """Sampler health of a fit: worst r_hat, smallest bulk ESS and divergences."""

    max_r_hat: float
    min_ess_bulk: float
    divergences: int
    sampler: str
    seconds: float

    @property
    def ok(self) -> bool:
        return self.max_r_hat < 1.05 and self.min_ess_bulk > 100 and self.divergences == 0

    def __str__(self) -> str:
        return (
            f"sampler={self.sampler} time={self.seconds:.1f}s max r_hat={self.max_r_hat:.3f} "
            f"min bulk ESS={self.min_ess_bulk:.0f} divergences={self.divergences}"
        )


@dataclass
class FittedModel:
    """The population posterior of the hierarchy, able to forecast any run.

    ``population`` holds posterior draws (chain, draw) of the population-level
    variables; ``idata`` (optional, not saved in compact form) is the full
    InferenceData of the fit, for diagnostics and posterior predictive checks.
    """

    population: xr.Dataset
    form: str
    config: dict[str, Any] = field(default_factory=dict)
    idata: az.InferenceData | None = None
    diagnostics: FitDiagnostics | None = None
    _arrays: dict[str, np.ndarray] | None = field(default=None, init=False, repr=False)

    @property
    def families(self) -> list[str]:
        return [str(f) for f in self.population["family"].values]

    def population_arrays(self) -> dict[str, np.ndarray]:
        """Posterior draws as NumPy arrays with the sample axis last (cached: the live path reads these)."""
        if self._arrays is None:
            stacked = self.population.stack(sample=("chain", "draw"))
            self._arrays = {name: np.asarray(stacked[name].values) for name in stacked.data_vars}
        return self._arrays

    def forecast(self, run: RunLog | None = None, total_steps: int | None = None, **kwargs: Any) -> Any:
        """Forecast the reward trajectory up to ``total_steps`` (see :func:`bayes_grpo.forecast.forecast`)."""
        from bayes_grpo.forecast import forecast

        return forecast(self, run, total_steps=total_steps, **kwargs)

    def stop_probability(self, run: RunLog, total_steps: int | None = None, tolerance: float = 0.01, **kwargs: Any) -> float:
        """Posterior probability that the reward still to gain is below ``tolerance`` (see :mod:`bayes_grpo.stopping`)."""
        from bayes_grpo.stopping import stop_probability

        return stop_probability(self, run, total_steps=total_steps, tolerance=tolerance, **kwargs)

    def stop_decision(self, run: RunLog, total_steps: int | None = None, threshold: float = 0.9, tolerance: float = 0.01, **kwargs: Any) -> Any:
        """A stop/continue decision with its evidence (see :mod:`bayes_grpo.stopping`)."""
        from bayes_grpo.stopping import stop_decision

        return stop_decision(self, run, total_steps=total_steps, threshold=threshold, tolerance=tolerance, **kwargs)

    def summary(self) -> Any:
        """ArviZ summary table (mean, hdi, r_hat, ess) of the population variables."""
        return az.summary(self.population, kind="all")

    def save(self, path: str | os.PathLike, *, full: bool = True) -> Path:
        """Save to a folder: ``population.nc`` + ``config.json`` (+ ``fit.nc``, the full InferenceData, when ``full``)."""
        out = Path(path)
        out.mkdir(parents=True, exist_ok=True)
        self.population.to_netcdf(out / "population.nc", engine="h5netcdf")
        config = dict(self.config, form=self.form)
        if self.diagnostics is not None:
            config["diagnostics"] = self.diagnostics.__dict__
        (out / "config.json").write_text(json.dumps(config, indent=2, default=float))
        if full and self.idata is not None:
            self.idata.to_netcdf(str(out / "fit.nc"), engine="h5netcdf")
        return out


def load_model(path: str | os.PathLike) -> FittedModel:
    """Load a model saved with :meth:`FittedModel.save` (the full fit too, when present)."""
    folder = Path(path)
    if not (folder / "population.nc").is_file() or not (folder / "config.json").is_file():
        raise ModelError(f"{folder}: not a saved bayes_grpo model (population.nc and config.json expected); save one with FittedModel.save")
    config = json.loads((folder / "config.json").read_text())
    population = xr.load_dataset(folder / "population.nc", engine="h5netcdf")
    idata = az.from_netcdf(str(folder / "fit.nc")) if (folder / "fit.nc").is_file() else None
    diagnostics = FitDiagnostics(**config["diagnostics"]) if "diagnostics" in config else None
    return FittedModel(population=population, form=config.pop("form"), config=config, idata=idata, diagnostics=diagnostics)


_DEFAULT: FittedModel | None = None


def default_model() -> FittedModel:
    """The population posterior shipped with the package (no fitting, no network)."""
    global _DEFAULT
    if _DEFAULT is None:
        _DEFAULT = load_model(DEFAULT_MODEL_DIR)
    return _DEFAULT


def fit(
    runs: RunSet | Iterable[RunLog],
    *,
    form: str = DEFAULT_FORM,
    draws: int | None = None,
    tune: int | None = None,
    chains: int | None = None,
    sampler: str | None = None,
    seed: int = 0,
    max_bins: int = 60,
    progressbar: bool = True,
    keep_full: bool = True,
) -> FittedModel:
    """Fit the hierarchical model to runs with NUTS and return a :class:`FittedModel`.

    ``sampler`` is "nutpie", "numpyro" or "pymc" (default: the first installed, in
    that order). Defaults are 1000 draws, 1000 tuning steps and 2 chains, or 200
    each in quick mode (``BAYES_GRPO_QUICK=1``). Sampler diagnostics (r_hat, ESS,
    divergences) are computed and a warning is raised when they are poor.
    """
    import time

    import pymc as pm

    quick = quick_mode()
    draws = draws or (200 if quick else 1000)
    tune = tune or (200 if quick else 1000)
    chains = chains or 2
    prepared = _prepare_all(runs)
    centres = size_centres(prepared)
    model = build_model(prepared, form=form, max_bins=max_bins, centres=centres)
    sampler_name = _pick_sampler(sampler)
    started = time.perf_counter()
    with model:
        options: dict[str, Any] = dict(draws=draws, tune=tune, chains=chains, random_seed=seed, progressbar=progressbar)
        if sampler_name == "pymc":
            options.update(cores=min(chains, os.cpu_count() or 1), target_accept=0.9)
        elif sampler_name == "nutpie":
            options.update(nuts_sampler="nutpie", nuts_sampler_kwargs={"backend": "numba"})
        else:
            options.update(nuts_sampler=sampler_name, target_accept=0.9)
        idata = pm.sample(**options)
        seconds = time.perf_counter() - started
        if keep_full and "log_likelihood" not in idata:
            # nutpie and numpyro ignore idata_kwargs: add the pointwise log-likelihood LOO needs.
            pm.compute_log_likelihood(idata, progressbar=False)
    diagnostics = _diagnose(idata, sampler_name, seconds)
    if not diagnostics.ok:
        warnings.warn(
            f"the fit may not have converged ({diagnostics}); run more draws/tune or check the runs",
            RuntimeWarning,
            stacklevel=2,
        )
    population = idata.posterior[[v for v in POPULATION_VARS if v in idata.posterior]]
    config = {
        "form": form,
        "max_bins": max_bins,
        "size_centres": centres,
        "student_nu": STUDENT_NU,
        "drift": CALIBRATED_DRIFT,
        "runs": [p.run_id for p in prepared],
        "n_runs": len(prepared),
        "draws": draws,
        "tune": tune,
        "chains": chains,
        "seed": seed,
    }
    return FittedModel(
        population=population.load(),
        form=config.pop("form"),
        config=config,
        idata=idata if keep_full else None,
        diagnostics=diagnostics,
    )


def _diagnose(idata: az.InferenceData, sampler: str, seconds: float) -> FitDiagnostics:
    names = [v for v in POPULATION_VARS if v in idata.posterior] + ["gain", "tau", "r0", "sigma"]
    summary = az.summary(idata, var_names=names, kind="diagnostics")
    divergences = int(idata.sample_stats["diverging"].sum()) if "diverging" in idata.sample_stats else 0
    return FitDiagnostics(
        max_r_hat=float(summary["r_hat"].max()),
        min_ess_bulk=float(summary["ess_bulk"].min()),
        divergences=divergences,
        sampler=sampler,
        seconds=seconds,
    )


def compare_forms(runs: RunSet | Iterable[RunLog], forms: Iterable[str] = CURVE_FORMS, **fit_options: Any) -> tuple[Any, dict[str, FittedModel]]:
    """Fit each curve form and rank them by PSIS-LOO (``az.compare``); returns (table, fits)."""
    runs = list(runs)
    fits = {form: fit(runs, form=form, **fit_options) for form in forms}
    table = az.compare({form: f.idata for form, f in fits.items()}, ic="loo")
    return table, fits
