"""Fit the hierarchical reward-curve model, and save, load and use the fitted population.

The model itself (priors, curve form, noise model, covariates) is defined once
in :mod:`bayes_grpo.population`; its settings are :class:`~bayes_grpo.config.ModelConfig`
and :class:`~bayes_grpo.config.SamplerConfig`. :func:`fit` samples it with NUTS
and returns a :class:`FittedModel`, which keeps the population posterior (small,
shipped in the package as :func:`default_model`) and forecasts any run by
conditioning on its steps (:mod:`bayes_grpo.forecast`), without recompiling or
refitting the hierarchy. Decisions come from :mod:`bayes_grpo.stopping`.

Data flow: ``logs -> prepare -> population -> model (fit) -> forecast -> stopping``;
this module may import the later stages, they never import it.

A fitted model is saved as **one** NetCDF file (ArviZ InferenceData) whose root
attributes record the package version, the model-file format version
(:data:`FORMAT_VERSION`), the model and sampler configs (JSON), the curve form,
what it was fitted on and the sampler diagnostics.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping

import arviz as az
import h5netcdf
import numpy as np
import xarray as xr

from bayes_grpo import __version__
from bayes_grpo.config import ModelConfig, SamplerConfig, merge
from bayes_grpo.curves import CURVE_FORMS
from bayes_grpo.errors import ModelError
from bayes_grpo.forecast import Forecast, forecast
from bayes_grpo.logs import RunLog, RunSet
from bayes_grpo.population import MODEL_VERSION, POPULATION_VARS
from bayes_grpo.pymc_model import build_model, resolve_parameterisation
from bayes_grpo.prepare import LONG_PLAN_FACTOR, SCALE_KINDS, PreparedRun, frozen_after_start, prepare_training_run, size_centres, training_horizon
from bayes_grpo.recalibration import Recalibration
from bayes_grpo.sampling import PER_RUN_VARS, FitDiagnostics, _diagnose, _pick_sampler, target_accept
from bayes_grpo.settings import STOP_THRESHOLD, STOP_TOLERANCE
from bayes_grpo.stopping import RelativeTo, StopDecision, stop_decision, stop_probability
from bayes_grpo.sweeps import Ranking, SweepCoupling, rank

#: Version of the model-file layout; :func:`load_model` refuses files of another version.
FORMAT_VERSION = 1
#: Root attribute that marks a NetCDF file as a bayes_grpo model.
FORMAT_ATTR = "bayes_grpo_model_format"
DEFAULT_MODEL_PATH = Path(__file__).resolve().parent / "assets" / "default_model.nc"


@dataclass
class FittedModel:
    """The population posterior of the hierarchy, able to forecast any run.

    Attributes
    ----------
    population : xarray.Dataset
        Posterior draws (chain, draw) of the population-level variables.
    model_config : ModelConfig
        The model settings it was fitted with (curve form, likelihood, priors, drift).
    sampler_config : SamplerConfig
        The sampler settings it was fitted with.
    size_centres : list of float
        Per-kind log10-size centres of the fitted runs.
    fitted_on : dict
        ``runs`` (ids listed), ``n_runs``, ``sources`` (runs per source) and ``model_version``
        (:data:`bayes_grpo.population.MODEL_VERSION`), plus any provenance.
    idata : arviz.InferenceData or None
        The full fit (per-run parameters, sample stats, log-likelihood) when kept.
    diagnostics : FitDiagnostics or None
        Sampler health.
    recalibration : Recalibration or None
        The calibration layer learned for this fit by source-grouped cross-validation on real runs
        (:mod:`bayes_grpo.recalibration`), applied to every forecast unless ``calibrated=False``;
        None for a fit without one (``scripts/refit_default_model.py`` learns it).
    sweep_coupling : SweepCoupling or None
        How this fit's forecasts of one sweep's runs miss together (:class:`bayes_grpo.sweeps.SweepCoupling`),
        measured on its held-out forecasts of real runs; ``rank`` and the Optuna pruner use it. None: the
        forecasts alone.

    Example
    -------
    >>> model = bg.default_model()  # doctest: +SKIP
    >>> model.stop_decision(run.head(200), total_steps=500).should_stop  # doctest: +SKIP
    """

    population: xr.Dataset
    model_config: ModelConfig = field(default_factory=ModelConfig)
    sampler_config: SamplerConfig = field(default_factory=SamplerConfig)
    size_centres: list[float] = field(default_factory=lambda: [0.0, 0.0])
    fitted_on: dict[str, Any] = field(default_factory=dict)
    idata: az.InferenceData | None = None
    diagnostics: FitDiagnostics | None = None
    recalibration: Recalibration | None = None
    sweep_coupling: SweepCoupling | None = None
    _arrays: dict[str, np.ndarray] | None = field(default=None, init=False, repr=False)

    @property
    def fit_id(self) -> str:
        """Id of this fit: a hash of the model version and config, what it was fitted on and its posterior draws
        (as pymc-marketing's ``ModelIO.id``); a calibration layer records the id it was learned for."""
        digest = hashlib.sha256()
        digest.update(MODEL_VERSION.encode())
        digest.update(json.dumps(self.model_config.to_dict(), sort_keys=True).encode())
        digest.update(json.dumps({k: v for k, v in self.fitted_on.items() if k != "date"}, sort_keys=True, default=str).encode())
        for name in sorted(self.population.data_vars):
            digest.update(np.ascontiguousarray(self.population[name].values, dtype=float).tobytes())
        return digest.hexdigest()[:16]

    @property
    def form(self) -> str:
        """The curve form (``model_config.form``)."""
        return self.model_config.form

    @property
    def families(self) -> list[str]:
        """The model families the population has seen (others get the population level)."""
        return [str(f) for f in self.population["family"].values]

    @property
    def sources(self) -> list[str]:
        """The sources (repository / recipe / task) the population has seen; empty for a model file without a source level."""
        return [str(s) for s in self.population["source"].values] if "source" in self.population.coords else []

    @property
    def config(self) -> dict[str, Any]:
        """Flat read-only view of the settings and provenance (model, sampler, size centres, runs)."""
        model = {k: v for k, v in self.model_config.to_dict().items() if k != "priors"}
        return {**model, **self.sampler_config.to_dict(), "size_centres": list(self.size_centres),
                "runs": list(self.fitted_on.get("runs", [])), "n_runs": self.fitted_on.get("n_runs")}

    def population_arrays(self) -> dict[str, np.ndarray]:
        """Posterior draws as NumPy arrays with the sample axis last (cached: the live path reads these)."""
        if self._arrays is None:
            stacked = self.population.stack(sample=("chain", "draw"))
            self._arrays = {name: np.asarray(stacked[name].values) for name in stacked.data_vars}
        return self._arrays

    def forecast(self, run: RunLog | None = None, total_steps: int | None = None, **kwargs: Any) -> Forecast:
        """Forecast the reward trajectory of ``run`` up to ``total_steps``.

        Parameters
        ----------
        run : RunLog or None
            The steps logged so far (None for a run not yet started).
        total_steps : int, optional
            Planned length (default: the run's metadata).
        **kwargs
            ``family``, ``params_b``, ``initial_reward``, ``reward_range``, ``source``, ``n_draws``, ``drift``,
            ``seed``, ``calibrated``, ``n_particles``, ``grid_points`` (see :func:`bayes_grpo.forecast.forecast`).

        Returns
        -------
        Forecast

        Raises
        ------
        ModelError
            When ``total_steps`` is unknown or smaller than the last logged step.

        Example
        -------
        >>> model.forecast(run.head(120), total_steps=500).final.interval(0.9)  # doctest: +SKIP
        """
        return forecast(self, run, total_steps=total_steps, **kwargs)

    def rank(self, runs: Iterable[RunLog], total_steps: int | None = None, **kwargs: Any) -> Ranking:
        """Rank runs of a sweep by their forecast final reward, with the probability that each ends best.

        Parameters
        ----------
        runs : iterable of RunLog
            At least two runs; they may have reached different steps, and some may be finished.
        total_steps : int, optional
            Planned length of every run (default: the runs' metadata, which must agree).
        **kwargs
            ``family``, ``params_b``, ``beat``, ``coupling``, ``n_draws``, ``joint_draws``, ``seed``
            (see :func:`bayes_grpo.sweeps.rank`).

        Returns
        -------
        Ranking
            ``.table`` (one row per run: step, finished, final mean/q05/q50/q95, ``p_best``),
            ``.p_beats(value)``, ``.plot()``.

        Raises
        ------
        ModelError
            Fewer than two runs, or no one planned length to compare them at.

        Example
        -------
        >>> model.rank([r.head(75) for r in sweep], total_steps=250).table  # doctest: +SKIP
        """
        return rank(self, runs, total_steps=total_steps, **kwargs)

    def stop_probability(
        self,
        run: RunLog,
        total_steps: int | None = None,
        tolerance: float = STOP_TOLERANCE,
        relative_to: RelativeTo = "spread",
        **kwargs: Any,
    ) -> float:
        """Posterior probability that less than ``tolerance * scale`` reward remains to gain by ``total_steps``.

        Parameters
        ----------
        run : RunLog
            The steps logged so far.
        total_steps : int, optional
            Planned length (default: the run's metadata).
        tolerance : float
            Fraction of the reward scale (default 0.02).
        relative_to : {"spread", "range", "gain"}
            What the scale is (see :mod:`bayes_grpo.stopping`).
        **kwargs
            Passed to :meth:`forecast`.

        Returns
        -------
        float
            In [0, 1].

        Raises
        ------
        ModelError
            For a negative tolerance or an unknown ``relative_to``.

        Example
        -------
        >>> model.stop_probability(run.head(300), total_steps=500)  # doctest: +SKIP
        """
        return stop_probability(self, run, total_steps=total_steps, tolerance=tolerance, relative_to=relative_to, **kwargs)

    def stop_decision(
        self,
        run: RunLog,
        total_steps: int | None = None,
        threshold: float = STOP_THRESHOLD,
        tolerance: float = STOP_TOLERANCE,
        relative_to: RelativeTo = "spread",
        value_per_reward: float | None = None,
        cost_per_step: float | None = None,
        **kwargs: Any,
    ) -> StopDecision:
        """A stop/continue decision with its evidence, from a forecast of ``run``.

        Parameters
        ----------
        run : RunLog
            The steps logged so far.
        total_steps : int, optional
            Planned length (default: the run's metadata).
        threshold, tolerance, relative_to, value_per_reward, cost_per_step
            See :func:`bayes_grpo.stopping.decision_from_forecast`.
        **kwargs
            ``min_fraction`` and ``rule`` (any :class:`~bayes_grpo.stopping.StopRule`, then the settings above do not
            apply) go to :func:`bayes_grpo.stopping.stop_decision`; the rest to :meth:`forecast` (``n_draws``, ``seed``,
            metadata overrides).

        Returns
        -------
        StopDecision

        Raises
        ------
        ModelError
            For an impossible threshold or tolerance, or only one of the decision-theoretic costs.

        Example
        -------
        >>> print(model.stop_decision(run.head(300), total_steps=500).explain())  # doctest: +SKIP
        """
        return stop_decision(
            self,
            run,
            total_steps=total_steps,
            threshold=threshold,
            tolerance=tolerance,
            relative_to=relative_to,
            value_per_reward=value_per_reward,
            cost_per_step=cost_per_step,
            **kwargs,
        )

    def summary(self) -> Any:
        """ArviZ summary table (mean, hdi, r_hat, ess) of the population variables.

        Returns
        -------
        pandas.DataFrame
        """
        return az.summary(self.population, kind="all")

    def save(self, path: str | os.PathLike, *, full: bool = True) -> Path:
        """Write the model to one NetCDF file.

        Parameters
        ----------
        path : path-like
            The file to write; an existing folder gets ``model.nc`` inside it.
        full : bool
            Also store the full fit (per-run parameters, sample stats, the log-likelihood in single
            precision) when the model has it; otherwise only the population posterior (about 2 MB at
            2 x 4,000 draws).

        Returns
        -------
        Path
            The file written.

        Example
        -------
        >>> model.save("my_model.nc", full=False)  # doctest: +SKIP
        PosixPath('my_model.nc')
        """
        out = Path(path)
        if out.is_dir():
            out = out / "model.nc"
        out.parent.mkdir(parents=True, exist_ok=True)
        full = full and self.idata is not None
        if full:
            # The pointwise log-likelihood (for LOO) is the largest group: stored in single precision it
            # halves (257 to 129 MB at 201 runs x 20 bins x 8,000 draws), ample for LOO's sums.
            groups = {name: self.idata[name] for name in self.idata.groups()}
            if "log_likelihood" in groups:
                groups["log_likelihood"] = groups["log_likelihood"].astype("float32")
            data = az.InferenceData(**groups)
        else:
            data = az.InferenceData(posterior=self.population)
        if out.exists():
            out.unlink()
        # zlib barely shrinks posterior draws (a full fit: 293 to 270 MB) but made writing one ten times
        # slower (0.9 to 8.8 s), so only the small population-only file is compressed.
        data.to_netcdf(str(out), engine="h5netcdf", compress=not full)
        with h5netcdf.File(out, "a") as handle:
            for key, value in self._attributes().items():
                handle.attrs[key] = value
        return out

    def _attributes(self) -> dict[str, Any]:
        return {
            FORMAT_ATTR: FORMAT_VERSION,
            "package_version": __version__,
            "curve_form": self.form,
            "model_config": json.dumps(self.model_config.to_dict()),
            "sampler_config": json.dumps(self.sampler_config.to_dict()),
            "size_centres": json.dumps(list(self.size_centres)),
            "fitted_on": json.dumps(self.fitted_on, default=str),
            "diagnostics": json.dumps(asdict(self.diagnostics) if self.diagnostics is not None else None),
            **({"recalibration": self.recalibration.to_json()} if self.recalibration is not None else {}),
            **({"sweep_coupling": self.sweep_coupling.to_json(self.fit_id)} if self.sweep_coupling is not None else {}),
        }


def load_model(path: str | os.PathLike) -> FittedModel:
    """Load a model file written by :meth:`FittedModel.save` (the full fit too, when stored).

    Parameters
    ----------
    path : path-like
        A ``.nc`` model file.

    Returns
    -------
    FittedModel

    Raises
    ------
    ModelError
        When the path is missing or a folder, is not a bayes_grpo model file (e.g. another
        NetCDF file), or has an incompatible format version.

    Example
    -------
    >>> model = bg.load_model("my_model.nc")  # doctest: +SKIP
    """
    file = Path(path)
    hint = "; write one with FittedModel.save or 'bayes-grpo fit --out FILE'"
    if not file.exists():
        raise ModelError(f"{file}: no such model file{hint}")
    if file.is_dir():
        raise ModelError(f"{file}: not a saved bayes_grpo model (a folder, expected one .nc model file){hint}")
    try:
        with h5netcdf.File(file, "r") as handle:
            attrs = dict(handle.attrs)
    except (OSError, ValueError) as exc:
        raise ModelError(f"{file}: not a saved bayes_grpo model (not a NetCDF-4 file: {type(exc).__name__}){hint}") from None
    if FORMAT_ATTR not in attrs:
        raise ModelError(f"{file}: not a saved bayes_grpo model (a NetCDF file without the {FORMAT_ATTR} attribute){hint}")
    version = int(attrs[FORMAT_ATTR])
    if version != FORMAT_VERSION:
        raise ModelError(
            f"{file}: model file format {version} (written by bayes_grpo {attrs.get('package_version', '?')}) is not "
            f"the format {FORMAT_VERSION} this bayes_grpo {__version__} reads; refit or convert it"
        )
    idata = az.from_netcdf(str(file), engine="h5netcdf")
    posterior = idata.posterior
    population = _with_kind_means(posterior[[v for v in POPULATION_VARS if v in posterior]].load())
    full = any(v in posterior for v in PER_RUN_VARS)
    diagnostics = json.loads(attrs["diagnostics"])
    fitted_on = json.loads(attrs["fitted_on"])
    fitted_version = str(fitted_on.get("model_version", "2"))
    if fitted_version.split(".")[0] != MODEL_VERSION.split(".")[0]:
        raise ModelError(
            f"{file}: fitted with model {fitted_version}; this bayes_grpo {__version__} forecasts with model {MODEL_VERSION} "
            "(which reads GRPO's learning signal, reward_std); refit it on your runs with bg.fit(runs).save(path) or "
            "'bayes-grpo fit RUNS --out FILE', or use bg.default_model()"
        )
    # Settings a file written before they existed was fitted without (their old behaviour).
    stored = {"gain_at": "asymptote", "drift_df": None} | json.loads(attrs["model_config"])
    stored["priors"] = {"spread_prior": "halfnormal", "fixed_start_sd": [None, None]} | stored.get("priors", {})
    model = FittedModel(
        population=population,
        model_config=ModelConfig.from_dict(stored),
        sampler_config=SamplerConfig.from_dict(json.loads(attrs["sampler_config"])),
        size_centres=list(json.loads(attrs["size_centres"])),
        fitted_on=fitted_on,
        idata=idata if full else None,
        diagnostics=FitDiagnostics(**diagnostics) if diagnostics else None,
    )
    if "recalibration" in attrs:
        try:
            layer = Recalibration.from_json(attrs["recalibration"])
        except ModelError as error:
            warnings.warn(f"{file}: {error}; its forecasts are the raw model's until then", UserWarning, stacklevel=2)
            return _with_coupling(model, attrs, file)
        if layer.fit_id != model.fit_id:
            raise ModelError(f"{file}: its calibration layer was learned for fit {layer.fit_id}, not this file's fit {model.fit_id}; relearn it")
        model.recalibration = layer
    return _with_coupling(model, attrs, file)


def _with_coupling(model: FittedModel, attrs: Mapping[str, Any], file: Any) -> FittedModel:
    """The model with the sweep coupling stored in its file's attributes, if any."""
    if "sweep_coupling" in attrs:
        coupling, measured_for = SweepCoupling.from_json(attrs["sweep_coupling"])
        if measured_for != model.fit_id:
            raise ModelError(f"{file}: its sweep coupling was measured for fit {measured_for}, not this file's fit {model.fit_id}; measure it again")
        model.sweep_coupling = coupling
    return model


def _with_kind_means(population: xr.Dataset) -> xr.Dataset:
    """A population written before version 2.3, whose timescale and shape (mean and spread) were
    shared by the scale kinds, with that one value for each kind (the model's present form)."""
    for name in ("tau_mu", "tau_sd", "beta_mu", "beta_sd"):
        if name in population and "kind" not in population[name].dims:
            population[name] = population[name].expand_dims(kind=list(SCALE_KINDS), axis=-1).copy()
    return population


_DEFAULT: FittedModel | None = None


def default_model() -> FittedModel:
    """The population posterior shipped with the package (no fitting, no network).

    Returns
    -------
    FittedModel
        Loaded once from ``bayes_grpo/assets/default_model.nc`` and cached; see the card
        ``bayes_grpo/assets/default_model.md`` for what it was fitted on.

    Raises
    ------
    ModelError
        When the shipped file is missing or unreadable (a broken install).

    Example
    -------
    >>> bg.default_model().form
    'loglogistic'
    """
    global _DEFAULT
    if _DEFAULT is None:
        _DEFAULT = load_model(DEFAULT_MODEL_PATH)
    return _DEFAULT


def fit(
    runs: RunSet | Iterable[RunLog],
    *,
    model_config: ModelConfig | Mapping[str, Any] | None = None,
    sampler_config: SamplerConfig | Mapping[str, Any] | None = None,
    form: str | None = None,
    draws: int | None = None,
    tune: int | None = None,
    chains: int | None = None,
    sampler: str | None = None,
    seed: int | None = None,
    max_bins: int | None = None,
    progressbar: bool | None = None,
    keep_full: bool = True,
) -> FittedModel:
    """Fit the hierarchical model to runs with NUTS.

    Parameters
    ----------
    runs : RunSet or iterable of RunLog
        Training runs (finished or not; a run without planned total steps is normalised by
        its last logged step).
    model_config : ModelConfig or dict, optional
        Model settings, or a dict of overrides of the defaults (see :class:`ModelConfig`).
    sampler_config : SamplerConfig or dict, optional
        Sampler settings, or a dict of overrides (defaults: 4000 draws after 1000 tuning steps,
        2 chains; 200 in quick mode, ``BAYES_GRPO_QUICK=1``).
    form, max_bins : optional
        Shortcuts overriding ``model_config.form`` / ``model_config.max_bins``.
    draws, tune, chains, sampler, seed, progressbar : optional
        Shortcuts overriding the same fields of ``sampler_config``. ``sampler`` is "nutpie",
        "numpyro" or "pymc" (default: the first installed, in that order). numpyro samples on a
        GPU when JAX sees one, but for this model that was slower than nutpie on two CPU cores at
        every size measured, 40 to 10,240 runs (``benchmarks/results/fit_scaling.md``).
    keep_full : bool
        Keep the full InferenceData (per-run parameters, log-likelihood for LOO) on the result.

    Returns
    -------
    FittedModel
        Sampler diagnostics in ``.diagnostics``; a ``RuntimeWarning`` is raised when they are poor.

    Raises
    ------
    ModelError
        For no runs, an unknown setting, or a run that cannot be normalised.

    Example
    -------
    >>> model = bg.fit(bg.load_runs(), sampler_config={"draws": 500}, model_config={"form": "weibull"})  # doctest: +SKIP
    """
    import pymc as pm

    shortcuts_model = {k: v for k, v in {"form": form, "max_bins": max_bins}.items() if v is not None}
    shortcuts_sampler = {
        k: v
        for k, v in {"draws": draws, "tune": tune, "chains": chains, "sampler": sampler, "seed": seed, "progressbar": progressbar}.items()
        if v is not None
    }
    mconfig = merge(merge(ModelConfig(), model_config), shortcuts_model or None)
    runs = list(runs)
    frozen = [run.run_id for run in runs if frozen_after_start(run)]
    _warn_about_runs(
        frozen, "left out of the fit: their reward never changes after the first tenth of their log, so they "
        "hold nothing the curve's timescale and shape can be learned from",
    )  # fmt: skip
    runs = [run for run in runs if run.run_id not in frozen]
    mconfig = resolve_parameterisation(mconfig, len(runs))
    sconfig = merge(merge(SamplerConfig(), sampler_config), shortcuts_sampler or None)
    sconfig = merge(sconfig, {"sampler": _pick_sampler(sconfig.sampler)})
    sconfig = merge(sconfig, {"target_accept": target_accept(sconfig, mconfig)})
    if not runs:
        raise ModelError("fit needs at least one run")
    _warn_about_runs(
        [f"{run.run_id} ({len(run)} steps of {run.meta.total_steps})" for run in runs if run.meta.total_steps and training_horizon(run)[1]],
        f"logged less than 1/{LONG_PLAN_FACTOR} of their planned steps, so they show nothing of where their plan ends: "
        "the fit learns their logged shape, as runs as long as their logs",
    )  # fmt: skip
    prepared = [prepare_training_run(run, mconfig.unit_progress) for run in runs]
    centres = size_centres(prepared)
    model = build_model(prepared, mconfig, centres)
    started = time.perf_counter()
    with model:
        options: dict[str, Any] = dict(
            draws=sconfig.draws, tune=sconfig.tune, chains=sconfig.chains, random_seed=sconfig.seed,
            progressbar=sconfig.progressbar, target_accept=sconfig.target_accept,
        )  # fmt: skip
        if sconfig.sampler == "pymc":
            options.update(cores=min(sconfig.chains, os.cpu_count() or 1))
        elif sconfig.sampler == "nutpie":
            options.update(nuts_sampler="nutpie", nuts_sampler_kwargs={"backend": "numba"})
        else:  # numpyro: one JAX device runs chains one after another unless they are vectorised
            import jax

            chain_method = "parallel" if jax.local_device_count() >= sconfig.chains else "vectorized"
            options.update(nuts_sampler="numpyro", nuts_sampler_kwargs={"chain_method": chain_method})
        idata = pm.sample(**options)
        seconds = time.perf_counter() - started
        # The data-based starts (pymc_model.gain_variable) matter only to the sampler, and
        # PyMC's model transforms (the pointwise log-likelihood below) refuse models that carry them.
        for rv in model.free_RVs:
            model.set_initval(rv, None)
        if keep_full and "log_likelihood" not in idata:
            # nutpie and numpyro ignore idata_kwargs: add the pointwise log-likelihood LOO needs.
            pm.compute_log_likelihood(idata, progressbar=False)
    diagnostics = _diagnose(idata, sconfig.sampler, seconds)
    if not diagnostics.ok:
        advice = "run more draws/tune or check the runs"
        if diagnostics.unmixed_runs:  # named in the diagnostics
            advice = (
                "run more draws/tune; if the chains still disagree on the runs named, each settled on a different explanation "
                "of their curves (a log far shorter than its plan, or a rise that may be over or still under way, allows both) "
                "and the fit weighs them arbitrarily: fit without these runs and compare, or with more chains "
                "(sampler_config={'chains': 4})"
            )
        if diagnostics.divergences and mconfig.priors.spread_prior != "gamma":
            advice += "; against divergences, model_config={'priors': {'spread_prior': 'gamma'}} may help"
        warnings.warn(f"the fit may not have converged ({diagnostics}); {advice}", RuntimeWarning, stacklevel=2)
    population = idata.posterior[[v for v in POPULATION_VARS if v in idata.posterior]]
    return FittedModel(
        population=population.load(),
        model_config=mconfig,
        sampler_config=sconfig,
        size_centres=centres,
        fitted_on=_provenance(runs, prepared),
        idata=idata if keep_full else None,
        diagnostics=diagnostics,
    )


def _warn_about_runs(names: list[str], what: str) -> None:
    """One warning naming the runs (the first five) that a fit treats specially, and how."""
    if names:
        listed = ", ".join(names[:5]) + (", ..." if len(names) > 5 else "")
        warnings.warn(f"{len(names)} run(s) {what}: {listed}", UserWarning, stacklevel=3)


def _provenance(runs: list[RunLog], prepared: list[PreparedRun]) -> dict[str, Any]:
    """Provenance of a fit: run ids, their count, runs per source (the folder or writer of each log), model version."""
    sources: dict[str, int] = {}
    for run in runs:
        source = run.meta.source or "unknown"
        key = str(Path(source).parent) if os.sep in source else source
        sources[key] = sources.get(key, 0) + 1
    return {"runs": [p.run_id for p in prepared], "n_runs": len(prepared), "sources": sources, "model_version": MODEL_VERSION}


def compare_forms(runs: RunSet | Iterable[RunLog], forms: Iterable[str] = CURVE_FORMS, **fit_options: Any) -> tuple[Any, dict[str, FittedModel]]:
    """Fit each curve form and rank them by PSIS-LOO.

    Parameters
    ----------
    runs : RunSet or iterable of RunLog
        Training runs.
    forms : iterable of str
        Curve forms to fit (default: every registered form).
    **fit_options
        Passed to :func:`fit`.

    Returns
    -------
    (pandas.DataFrame, dict)
        The ``az.compare`` table and the fits by form.
    """
    runs = list(runs)
    fits = {form: fit(runs, form=form, **fit_options) for form in forms}
    table = az.compare({form: f.idata for form, f in fits.items()}, ic="loo")
    return table, fits
