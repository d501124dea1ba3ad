"""Model and sampler settings, each in one documented, overridable config object.

As in pymc-marketing's ``model_config`` / ``sampler_config``: :class:`ModelConfig`
says *what* is fitted (curve form, likelihood, priors, forecast discrepancy),
:class:`SamplerConfig` *how* it is sampled. Both have documented defaults, are
frozen dataclasses (override a field with :func:`dataclasses.replace` or by
passing a dict of overrides to :func:`bayes_grpo.fit`), and are saved with a fit
as JSON in the model file's attributes.

Example
-------
>>> from bayes_grpo.config import ModelConfig, SamplerConfig
>>> ModelConfig.from_dict({"form": "weibull", "max_bins": 40}).max_bins
40
>>> SamplerConfig(draws=300, chains=4).chains
4
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Mapping

from bayes_grpo.curves import CURVE_FORMS, DEFAULT_FORM
from bayes_grpo.errors import ModelError
from bayes_grpo.settings import quick_mode


#: Ways of writing the per-run parameters for NUTS (:attr:`ModelConfig.parameterisation`).
PARAMETERISATIONS = ("auto", "mixed", "centred", "non_centred")
#: Where a run's gain parameter is measured (:attr:`ModelConfig.gain_at`).
GAIN_REFERENCES = ("asymptote", "plan_end")
#: Families of the population spreads' priors (:attr:`PriorConfig.spread_prior`).
SPREAD_PRIORS = ("halfnormal", "gamma")


@dataclass(frozen=True)
class PriorConfig:
    """Scales and centres of the population-level priors (normalised units).

    Pairs are per scale kind: (declared reward range, learned unit). The
    structure these numbers enter is defined once in :mod:`bayes_grpo.population`.

    Attributes
    ----------
    gain_mu_loc, gain_mu_scale : tuple of float
        Normal prior of the kind's mean asinh-gain.
    gain_sd_scale : tuple of float
        HalfNormal scale of the kind's per-run asinh-gain spread.
    gain_size_scale, gain_init_scale : float
        Normal scales of the size and initial-reward effects on gain (in units of ``gain_sd``).
    gain_signal_scale, tau_signal_scale : float
        Normal scales of the learning signal's effects (per scale kind) on gain (in units of
        ``gain_sd``) and on log timescale (:func:`bayes_grpo.prepare.learning_signal`).
    fam_gain_sd_scale, fam_tau_sd_scale : float
        HalfNormal scales of the family spreads of gain and log timescale.
    src_gain_sd_scale, src_tau_sd_scale : float
        HalfNormal scales of the source spreads (repository / recipe / task) of gain and log timescale.
    tau_mu_loc, tau_mu_scale, tau_sd_scale : float
        Normal prior of the mean log timescale and HalfNormal scale of its per-run spread.
    tau_size_scale, tau_init_scale : float
        Normal scales of the size and initial-reward effects on log timescale.
    beta_mu_scale, beta_sd_scale : float
        Normal scale of the mean log shape (centred on the form's ``beta_prior_centre``) and
        HalfNormal scale of its per-run spread.
    r0_sd_scale : tuple of float
        HalfNormal scale of the spread of a run's start around its start level.
    fixed_start_sd : tuple of (float or None)
        Per kind (range, learned), the start spread ``r0_sd`` fixed at this value instead of
        learned (None: learned); default ``(None, 0.12)``. On a learned scale the start
        level is read from the run's own first rewards, so the same rewards that set the level
        also judge how far the start may sit from it, and a learned spread can shrink towards
        zero, where a run whose first rewards straddle an early collapse must call them outliers:
        a second posterior mode (``benchmarks/results/fit_scaling.notes.md``). 0.12 is the median
        of that spread's posterior when it is learned on the 201 bundled + shared runs.
    sig_mu_loc, sig_mu_scale : tuple of float
        Normal prior of the kind's mean log per-step noise.
    sig_sd_scale : float
        HalfNormal scale of the per-run spread of the log noise.
    declared_start_sd : tuple of float
        Spread of the start of a run that declares its initial reward, around it (in the
        fit and at forecast time); ``r0_sd`` is learned from the other runs.
    spread_prior : {"halfnormal", "gamma"}
        Family of the priors of every population spread (the ``*_sd`` variables, scaled by the
        ``*_sd_scale`` fields, called HalfNormal scales above): HalfNormal, or (the default) a
        Gamma of shape 2 with the same mean, which has no mass at zero (a zero-avoiding prior, so
        no funnel neck there) and a longer right tail. On the 201 runs the Gamma gave no
        divergence in 22 fits, HalfNormal 6 in 11 (``benchmarks/results/fit_scaling.notes.md``).
    """

    gain_mu_loc: tuple[float, float] = (0.3, 0.5)
    gain_mu_scale: tuple[float, float] = (0.3, 0.5)
    gain_sd_scale: tuple[float, float] = (0.3, 0.5)
    gain_size_scale: float = 0.5
    gain_init_scale: float = 1.0
    gain_signal_scale: float = 0.5
    tau_signal_scale: float = 0.5
    fam_gain_sd_scale: float = 0.5
    src_gain_sd_scale: float = 0.5
    tau_mu_loc: float = math.log(0.3)
    tau_mu_scale: float = 1.0
    tau_sd_scale: float = 0.8
    tau_size_scale: float = 0.3
    tau_init_scale: float = 1.0
    fam_tau_sd_scale: float = 0.5
    src_tau_sd_scale: float = 0.5
    beta_mu_scale: float = 0.5
    beta_sd_scale: float = 0.5
    r0_sd_scale: tuple[float, float] = (0.1, 0.3)
    fixed_start_sd: tuple[float | None, float | None] = (None, 0.12)
    sig_mu_loc: tuple[float, float] = (math.log(0.05), math.log(0.3))
    sig_mu_scale: tuple[float, float] = (1.0, 0.7)
    sig_sd_scale: float = 0.5
    declared_start_sd: tuple[float, float] = (0.02, 0.1)
    spread_prior: str = "gamma"

    def __post_init__(self) -> None:
        if self.spread_prior not in SPREAD_PRIORS:
            raise ModelError(f"priors.spread_prior must be one of {SPREAD_PRIORS}, got {self.spread_prior!r}")
        if len(self.fixed_start_sd) != 2 or any(sd is not None and not float(sd) > 0 for sd in self.fixed_start_sd):
            raise ModelError(f"priors.fixed_start_sd must be two entries (range, learned), each None or positive, got {self.fixed_start_sd!r}")


@dataclass(frozen=True)
class ModelConfig:
    """What the hierarchical model is: curve form, likelihood, priors and forecast discrepancy.

    Attributes
    ----------
    form : str
        Curve form, a key of :data:`bayes_grpo.curves.CURVE_FORMS` (default ``"loglogistic"``).
    max_bins : int
        Observations of a run are averaged into at most this many bins for the fit (20: the
        cost of a gradient grows with runs x bins, and 20 bins keep a curve's shape).
    forecast_bins : int
        Bins used when conditioning one run at forecast time (120).
    student_nu : float
        Degrees of freedom of the Student-t likelihood (4: outliers and collapses).
    noise_floor : float
        Per-step noise never drops below this, added in quadrature (0.02 normalised units),
        so quantised rewards do not drive the noise to zero.
    drift : float
        Scale of the Brownian model-discrepancy term of forecasts, in per-step noise units per
        unit of progress (0.75 with ``drift_df=2``; 1.5 suits Normal paths, ``drift_df=None``).
    drift_df : float or None
        Degrees of freedom of the discrepancy's Student-t scale mixture (2): each forecast draw's
        drift scale is multiplied by ``sqrt(df / chi2_df)``, so most paths wander little and a few
        far. None gives Normal (Brownian) paths, as model files written before this setting are
        read. On the real runs held out by source, 2 and 0.75 gave the same or better 90% coverage,
        a 50% coverage closer to 0.5, narrower intervals and a lower quantile score than Normal paths
        at 1.5 (``benchmarks/calibration.py``).
    range_slack : float
        At forecast time, on a declared reward range, a curve's start and its level at the
        end of the plan (``gain_at="plan_end"``) or asymptote may sit at most this fraction
        of the range outside it (0.02).
    beta_prior_centre : float or None
        Prior centre of log(beta); None takes the curve form's own centre from the registry.
    parameterisation : {"auto", "mixed", "centred", "non_centred"}
        How the per-run parameters are written for NUTS; the model is the same in every case.
        ``"centred"`` samples ``theta ~ Normal(loc, scale)``, ``"non_centred"`` offsets
        ``e ~ Normal(0, 1)`` with ``theta = loc + scale * e``, ``"mixed"`` the start and the
        shape as offsets and the rest centred. A centred gain is sampled sheared by the start
        (:func:`bayes_grpo.pymc_model.gain_variable`). ``"auto"`` (default) takes ``"mixed"`` from
        :data:`bayes_grpo.population.MIXED_MIN_RUNS` (100) runs up and ``"non_centred"``
        below: mixed mixes on a large, varied set (the 201 bundled + shared runs), centring
        funnels on a few similar runs (``benchmarks/results/fit_geometry.md``).
    gain_at : {"plan_end", "asymptote"}
        What a run's gain parameter measures: the gain reached by the end of the planned
        run (default), or the total gain of the curve (the version-2 model; model files
        written without this setting are read as ``"asymptote"``). Measured at the end of
        the plan, a run that never took off has a gain near zero whatever its timescale,
        which removes the slowest ridge of the fit.
    source_level : bool
        Add a level for a run's source (repository / recipe / task, its ``source_repo``):
        partially pooled gain and timescale effects per source, so that runs of one source
        are not counted as independent draws and a run from a new source gets the spread
        between sources. Off by default: on the shared runs it changed no forecast figure
        beyond noise and made the 201-run fit mix worse (``benchmarks/calibration.py``).
    learning_signal : bool
        Let GRPO's learning signal (the relative spread of the completions' rewards early in
        the run, :func:`bayes_grpo.prepare.learning_signal`) shift a run's gain and timescale
        (default on, model 3.0; ``benchmarks/results/signal_ablation.md`` measures it on and off).
    priors : PriorConfig
        Scales and centres of the population-level priors.

    Raises
    ------
    ModelError
        For an unknown curve form or a non-positive setting.

    Example
    -------
    >>> ModelConfig(form="weibull").resolved_beta_centre() > 0
    True
    unit_progress : float or None
        A learned-scale run's unit is the reward spread of its logged steps up to this share of the
        plan, in the fit as at forecast time (:func:`bayes_grpo.prepare.head_window`); None (the
        default): of all its logged steps, a whole finished run in the fit and the head at forecast
        time. A head-window unit of 0.2 made the units agree but, held out by source, forecast worse
        (error 1.75 / 1.82 / 1.30 x persistence's at 20 / 30 / 50% against 0.98 / 1.04 / 0.93, quantile
        score 0.182 / 0.151 / 0.089 against 0.152 / 0.122 / 0.076; ``docs/notes/2026-12-05-model-v4.md``).
    """

    form: str = DEFAULT_FORM
    max_bins: int = 20
    forecast_bins: int = 120
    student_nu: float = 4.0
    noise_floor: float = 0.02
    drift: float = 0.75
    drift_df: float | None = 2.0
    range_slack: float = 0.02
    beta_prior_centre: float | None = None
    parameterisation: str = "auto"
    gain_at: str = "plan_end"
    source_level: bool = False
    learning_signal: bool = True
    unit_progress: float | None = None
    priors: PriorConfig = field(default_factory=PriorConfig)

    def __post_init__(self) -> None:
        if self.form not in CURVE_FORMS:
            raise ModelError(f"unknown curve form {self.form!r}; choose one of {', '.join(CURVE_FORMS)}")
        if self.unit_progress is not None and not 0 < self.unit_progress <= 1:
            raise ModelError(f"model_config.unit_progress must be in (0, 1] or None, got {self.unit_progress!r}")
        if self.gain_at not in GAIN_REFERENCES:
            raise ModelError(f"unknown gain reference {self.gain_at!r}; choose one of {', '.join(GAIN_REFERENCES)}")
        if self.parameterisation not in PARAMETERISATIONS:
            raise ModelError(f"unknown parameterisation {self.parameterisation!r}; choose one of {', '.join(PARAMETERISATIONS)}")
        for name in ("max_bins", "forecast_bins", "student_nu"):
            if not getattr(self, name) > 0:
                raise ModelError(f"model_config.{name} must be positive, got {getattr(self, name)}")
        if self.noise_floor < 0 or self.drift < 0 or self.range_slack < 0:
            raise ModelError("model_config.noise_floor, drift and range_slack must be >= 0")
        if self.drift_df is not None and not self.drift_df > 0:
            raise ModelError(f"model_config.drift_df must be positive or None (Normal paths), got {self.drift_df}")

    def resolved_beta_centre(self) -> float:
        """Prior centre of log(beta): the override, else the curve form's registry entry."""
        return self.beta_prior_centre if self.beta_prior_centre is not None else CURVE_FORMS[self.form].beta_prior_centre

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-serialisable dict (priors nested)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, values: Mapping[str, Any] | None) -> ModelConfig:
        """Build from a (possibly partial) dict such as :meth:`to_dict` wrote; unknown keys raise.

        Raises
        ------
        ModelError
            For an unknown key.
        """
        values = dict(values or {})
        _check_keys(cls, values, "model_config")
        priors = values.pop("priors", None)
        if isinstance(priors, Mapping):
            _check_keys(PriorConfig, priors, "model_config.priors")
            values["priors"] = PriorConfig(**{k: tuple(v) if isinstance(v, list) else v for k, v in priors.items()})
        elif priors is not None:
            values["priors"] = priors
        return cls(**values)


@dataclass(frozen=True)
class SamplerConfig:
    """How the model is sampled (NUTS).

    Attributes
    ----------
    draws, tune : int
        Posterior draws and tuning steps per chain: 4000 draws after 1000 tuning steps, or
        200 each in quick mode (``BAYES_GRPO_QUICK=1``, read when the config is created). On the
        283 bundled + shared runs of model 4.0, 500 tuning steps left max r_hat 1.011 and a smallest
        bulk ESS of 234; 1000 gave 1.008 and 620 in the same 62 s of sampling.
        4000 draws: a draw costs about 35 gradients (the sheared gain) of about 130 us each on
        the 201 bundled + shared runs (the (run, bin) grid likelihood), and 2 x 4000 draws reach
        a smallest bulk ESS of 444-727 over every variable with max r_hat 1.005-1.008 and no
        divergence in 46-53 s of sampling with compilation at nine seeds of eleven (two seeds
        leave one per-run variable at ESS 293-305; 2 x 2000 draws give ESS 233-385;
        ``benchmarks/results/fit_scaling.notes.md``). On the 283 runs at seeds 1-3: max r_hat
        1.003-1.007 and no divergence, but a smallest bulk ESS of 266 at seed 1, and 328 s at seed 2,
        whose slower chain adapted a step size that takes 178 leapfrog steps per draw
        (``docs/notes/2026-12-07-replicates-and-noise-rule.md``).
    chains : int
        Number of chains (2).
    sampler : str or None
        ``"nutpie"``, ``"numpyro"`` or ``"pymc"``; None picks the first installed in that order.
    seed : int
        Random seed of the sampler (0).
    target_accept : float or None
        NUTS target acceptance, passed to every sampler. None (the default) picks it by the fit:
        0.95 for per-run parameters sampled as offsets (``parameterisation="non_centred"``, which
        ``"auto"`` gives fits of fewer than 100 runs: on 12 bundled runs 0.8 left 12 and 41
        divergences at two seeds, 0.95 one and none, in 25% more time;
        ``benchmarks/results/fit_scaling.notes.md``); otherwise 0.8 with nutpie (measured on the
        201 runs; 0.7 was worse, r_hat 1.07) and 0.9 with ``"pymc"`` and ``"numpyro"``. A fitted
        model stores the value used.
    progressbar : bool
        Show the sampler's progress bar (True).

    Example
    -------
    >>> SamplerConfig.from_dict({"draws": 500}).draws
    500
    """

    draws: int = field(default_factory=lambda: 200 if quick_mode() else 4000)
    tune: int = field(default_factory=lambda: 200 if quick_mode() else 1000)
    chains: int = 2
    sampler: str | None = None
    seed: int = 0
    target_accept: float | None = None
    progressbar: bool = True

    def __post_init__(self) -> None:
        for name in ("draws", "tune", "chains"):
            if int(getattr(self, name)) <= 0:
                raise ModelError(f"sampler_config.{name} must be positive, got {getattr(self, name)}")
        if self.target_accept is not None and not 0.0 < float(self.target_accept) < 1.0:
            raise ModelError(f"sampler_config.target_accept must be between 0 and 1 (exclusive), got {self.target_accept}")
        if self.sampler not in (None, "nutpie", "numpyro", "pymc"):
            raise ModelError(f"sampler_config.sampler must be 'nutpie', 'numpyro' or 'pymc', got {self.sampler!r}")

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-serialisable dict."""
        return asdict(self)

    @classmethod
    def from_dict(cls, values: Mapping[str, Any] | None) -> SamplerConfig:
        """Build from a (possibly partial) dict; unknown keys raise :class:`ModelError`."""
        values = dict(values or {})
        _check_keys(cls, values, "sampler_config")
        return cls(**values)


def merge(base: Any, overrides: Any) -> Any:
    """``base`` with ``overrides`` (a config of the same type, a dict, or None) applied.

    Raises
    ------
    ModelError
        For an unknown key or a config of another type.
    """
    if overrides is None:
        return base
    if isinstance(overrides, type(base)):
        return overrides
    what = "model_config" if isinstance(base, ModelConfig) else "sampler_config"
    if not isinstance(overrides, Mapping):
        raise ModelError(f"{what} must be a {type(base).__name__} or a dict of overrides, got {type(overrides).__name__}")
    _check_keys(type(base), overrides, what)
    values = {**base.to_dict(), **dict(overrides)}
    if isinstance(base, ModelConfig) and isinstance(overrides.get("priors"), Mapping):
        values["priors"] = {**base.priors.__dict__, **overrides["priors"]}
    return type(base).from_dict(values)


def _check_keys(cls: type, values: Mapping[str, Any], what: str) -> None:
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise ModelError(f"unknown {what} setting(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
