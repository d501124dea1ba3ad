"""The population model, defined once: priors, curve, noise, and how covariates enter.

Each run ``r`` follows ``z(t) = r0 + gain * F(t; tau, beta)`` in normalised
progress ``t`` and normalised reward ``z`` (:mod:`bayes_grpo.prepare`), with the
shape ``F`` from the curve-form registry (:mod:`bayes_grpo.curves`). A run's
five parameters ``theta = (r0, asinh_gain, log_tau, log_beta, log_sigma)`` are
Normal given the population, with means depending on the scale kind ``k``
(declared range or learned unit), the family ``f`` and, optionally, the source ``s``
(repository / recipe / task; both partially pooled), the centred log10 size
``x``, the centred initial reward ``i`` and GRPO's standardised learning signal ``g``
(the relative spread of the completions' rewards early in the run,
:func:`bayes_grpo.prepare.learning_signal`)::

    asinh_gain ~ Normal(gain_mu[k] + gain_sd[k] (fam_gain[f] + src_gain[s] + gain_size x + gain_init i + gain_signal[k] g), gain_sd[k])
    log_tau    ~ Normal(tau_mu[k] + fam_tau[f] + src_tau[s] + tau_size x + tau_init i + tau_signal[k] g, tau_sd[k])
    log_beta   ~ Normal(beta_mu[k], beta_sd[k])       (beta = 1 for forms without beta)
    r0         ~ Normal(start_r, r0_sd[k])
    log_sigma  ~ Normal(sig_mu[k], sig_sd[k])
    z_bin      ~ StudentT(nu, r0 + G F(t_bin) / F(1), sqrt(sigma^2 + floor^2) / sqrt(n_bin))

Here ``G = sinh(asinh_gain)`` is the gain reached by the end of the planned run
(``G = gain * F(1)``; with ``ModelConfig.gain_at="asymptote"`` it is the total gain
and the curve ``r0 + G F(t)``, see :func:`natural`). A run without a family, or
(at forecast time) with a family the population has not seen, gets ``fam = 0``
with the family spread added to the scale; the same holds for sources, so a run
from a new source gets the spread between sources on top of the spread within
one (runs of one source share task, reward scale and recipe, so they are not
independent draws from the population; the source level is optional,
``ModelConfig.source_level``, and without it ``src = 0``). A log without ``reward_std``
gets ``g = 0`` with the signal's effect marginalised (``g`` is standardised, so its
coefficients' squares are added to the variances). The sinh keeps small gains
near-Normal while giving the heavy right tail of real runs; a gain by the end of
the plan near zero is how the model says "no take-off".

Everything else is derived from the three functions :func:`run_prior` (per-run
Normal given population values and covariates), :func:`observation` (mean and
scale of a binned observation) and :func:`population_priors` (the population
level), each written once against an array namespace (NumPy or PyTensor):

* :func:`build_model` - the PyMC model that is fitted (each per-run parameter
  centred, ``theta ~ Normal(loc, scale)``, or an offset, ``theta = loc + scale * e``,
  as :attr:`~bayes_grpo.config.ModelConfig.parameterisation` says; a centred gain is
  sampled sheared by the start, :func:`gain_variable`);
* :class:`RunPrior` and :func:`log_likelihood` - the density that conditions one
  run at forecast time (:mod:`bayes_grpo.forecast`);
* :func:`simulate` - the posterior predictive of logged rewards (report PPCs).

``tests/test_architecture.py`` checks that the PyMC log-density and the
forecast-time density agree on random parameter values.

A run that declares its initial reward has its start spread fixed at
``PriorConfig.declared_start_sd[kind]`` (in the fit as at forecast time), so ``r0_sd``
is the spread of runs whose start is read from their first rewards; on a learned
scale that spread is fixed too (``PriorConfig.fixed_start_sd``, 0.12 of the unit: the
rewards that set the start level cannot also say how far the start may sit from it).
Every other population spread (``*_sd``) has a zero-avoiding Gamma(2) prior with the
mean of a HalfNormal of its ``*_sd_scale`` (``PriorConfig.spread_prior``). One deliberate
forecast-time refinement, switched on only by the conditioning code: on a declared
reward range a curve must start and end inside it (:func:`in_support`; a hard
boundary would stall NUTS, so the fit does not use it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Protocol, Sequence

import numpy as np
from scipy.special import gammaln

from bayes_grpo.config import ModelConfig
from bayes_grpo.curves import SMALLEST_END_SHARE, get_form, relative_shape, reward_curve, shape
from bayes_grpo.prepare import SCALE_KINDS, PreparedRun, centred_size, start_level

#: Version of this model definition, recorded in what a fit was made with (``FittedModel.fitted_on``).
#: 2: total gain; 2.1: gain by the end of the plan; 2.2: a declared start has a fixed spread;
#: 2.3: timescale and shape (mean and spread) per scale kind, an optional source level;
#: 2.4: the curve relative to the plan end without a floor on F(1) (:func:`expected_reward`);
#: 2.5: zero-avoiding Gamma(2) priors on the population spreads and a fixed learned-scale start spread;
#: 3.0: GRPO's learning signal (``reward_std``) as a covariate of gain and timescale, per scale kind.
#: 4.0: runs with a plan hundreds of times their log fitted as their logged shape, runs frozen after their first steps left
#:      out; forecasts calibrated by a layer stored with the fit (:mod:`bayes_grpo.recalibration`).
MODEL_VERSION = "4.0"
#: Per-run parameters, in the unconstrained space the forecast samples.
PARAMS = ("r0", "asinh_gain", "log_tau", "log_beta", "log_sigma")
#: Name of each parameter's standard-normal offset in the non-centred PyMC model.
OFFSETS = {"r0": "e_r0", "asinh_gain": "e_gain", "log_tau": "e_tau", "log_beta": "e_beta", "log_sigma": "e_sig"}
#: What NUTS samples for a centred gain: ``asinh_gain`` plus the start's scaled deviation (:func:`gain_variable`).
SHEARED_GAIN = "asinh_end_rise"
#: Population-level variables kept in a fitted model (the per-run ones are not).
POPULATION_VARS = (
    "gain_mu", "gain_sd", "gain_size", "gain_init", "gain_signal", "tau_signal", "fam_gain", "fam_gain_sd", "src_gain", "src_gain_sd",
    "tau_mu", "tau_sd", "tau_size", "tau_init", "fam_tau", "fam_tau_sd", "src_tau", "src_tau_sd",
    "beta_mu", "beta_sd", "r0_sd", "sig_mu", "sig_sd",
)
#: Fewest runs for which ``parameterisation="auto"`` samples ``"mixed"`` (see :func:`resolve_parameterisation`).
MIXED_MIN_RUNS = 100
#: Family coordinate of a fit in which no run names its family (never matches a run).
NO_FAMILY = "(no family)"
#: Source coordinate of a fit in which no run names its source (never matches a run).
NO_SOURCE = "(no source)"
# Scale given to log_beta of a form without beta: a point mass at 0 for the forecast sampler.
_FIXED_SCALE = 1e-9


class PopulationPosterior(Protocol):
    """What forecasting needs from a fitted model: population draws, families, settings.

    :class:`bayes_grpo.model.FittedModel` satisfies it; :mod:`bayes_grpo.forecast`
    depends on this protocol, not on the fitting module.
    """

    @property
    def model_config(self) -> ModelConfig: ...

    @property
    def families(self) -> list[str]: ...

    @property
    def sources(self) -> list[str]: ...

    @property
    def size_centres(self) -> Sequence[float]: ...

    def population_arrays(self) -> dict[str, np.ndarray]: ...


@dataclass(frozen=True)
class Covariates:
    """How one run (or, as arrays, many runs) enters the population model.

    ``kind`` indexes :data:`bayes_grpo.prepare.SCALE_KINDS`; ``family`` indexes
    the fitted families, -1 for a run without family or with one the population
    has not seen (in the fit as at forecast time); ``source`` likewise the fitted sources;
    ``size`` is the centred log10 size, ``init`` the centred initial reward,
    ``start`` the prior centre of ``r0`` and ``declared`` 1 when the run declares its
    initial reward (then ``start`` is it), else 0; ``signal`` the standardised learning
    signal (0 where unknown) and ``signal_known`` 1 where the log has it, else 0.
    """

    kind: Any
    family: Any
    source: Any
    size: Any
    init: Any
    start: Any
    declared: Any
    signal: Any = 0.0
    signal_known: Any = 0.0


def covariates(prepared: PreparedRun, centres: Sequence[float], families: Sequence[str], sources: Sequence[str] = ()) -> Covariates:
    """The covariates of one prepared run against a fitted population's size centres, families and sources."""
    return Covariates(
        kind=prepared.kind_index,
        family=_index(prepared.family, families),
        source=_index(prepared.source, sources),
        size=centred_size(prepared, list(centres)),
        init=prepared.initial_cov,
        start=start_level(prepared),
        declared=float(prepared.declares_start),
        signal=prepared.signal if prepared.has_signal else 0.0,
        signal_known=float(prepared.has_signal),
    )


def _index(name: str | None, names: Sequence[str]) -> int:
    """Position of ``name`` among ``names``; -1 when it is None or not there (an unseen level)."""
    names = list(names)
    return names.index(name) if name in names else -1


def population_priors(config: ModelConfig) -> dict[str, Any]:
    """Create the population-level PyMC variables (inside a ``pm.Model`` with ``kind``/``family`` coords, and
    ``source`` with ``config.source_level``)."""
    import pymc as pm
    import pytensor.tensor as pt

    p = config.priors

    def spread(name: str, scale: Any, dims: str | None = None) -> Any:
        """A population spread's prior: HalfNormal(scale), or Gamma(2) with the same mean (``p.spread_prior``)."""
        if p.spread_prior == "gamma":
            return pm.Gamma(name, alpha=2.0, beta=2.0 / (np.sqrt(2.0 / np.pi) * np.asarray(scale)), dims=dims)
        return pm.HalfNormal(name, sigma=scale, dims=dims)

    pop: dict[str, Any] = {
        "gain_mu": pm.Normal("gain_mu", mu=np.array(p.gain_mu_loc), sigma=np.array(p.gain_mu_scale), dims="kind"),
        "gain_sd": spread("gain_sd", np.array(p.gain_sd_scale), dims="kind"),
        "gain_size": pm.Normal("gain_size", 0.0, p.gain_size_scale),
        "gain_init": pm.Normal("gain_init", 0.0, p.gain_init_scale),
        "fam_gain_sd": spread("fam_gain_sd", p.fam_gain_sd_scale),
    }
    pop["fam_gain"] = pm.Deterministic("fam_gain", pop["fam_gain_sd"] * pm.Normal("fam_gain_raw", 0, 1, dims="family"), dims="family")
    if config.learning_signal:
        pop["gain_signal"] = pm.Normal("gain_signal", 0.0, p.gain_signal_scale, dims="kind")
        pop["tau_signal"] = pm.Normal("tau_signal", 0.0, p.tau_signal_scale, dims="kind")
    pop["tau_mu"] = pm.Normal("tau_mu", p.tau_mu_loc, p.tau_mu_scale, dims="kind")
    pop["tau_sd"] = spread("tau_sd", p.tau_sd_scale, dims="kind")
    pop["tau_size"] = pm.Normal("tau_size", 0.0, p.tau_size_scale)
    pop["tau_init"] = pm.Normal("tau_init", 0.0, p.tau_init_scale)
    pop["fam_tau_sd"] = spread("fam_tau_sd", p.fam_tau_sd_scale)
    pop["fam_tau"] = pm.Deterministic("fam_tau", pop["fam_tau_sd"] * pm.Normal("fam_tau_raw", 0, 1, dims="family"), dims="family")
    if get_form(config.form).has_beta:
        pop["beta_mu"] = pm.Normal("beta_mu", config.resolved_beta_centre(), p.beta_mu_scale, dims="kind")
        pop["beta_sd"] = spread("beta_sd", p.beta_sd_scale, dims="kind")
    if config.source_level:
        for effect, scale in (("gain", p.src_gain_sd_scale), ("tau", p.src_tau_sd_scale)):
            pop[f"src_{effect}_sd"] = spread(f"src_{effect}_sd", scale)
            raw = pm.Normal(f"src_{effect}_raw", 0, 1, dims="source")
            pop[f"src_{effect}"] = pm.Deterministic(f"src_{effect}", pop[f"src_{effect}_sd"] * raw, dims="source")
    if all(sd is None for sd in p.fixed_start_sd):  # one per-kind variable, as model files before 2.5 have it, so their fits reproduce
        pop["r0_sd"] = spread("r0_sd", np.array(p.r0_sd_scale), dims="kind")
    else:  # a kind's start spread is learned, or fixed where PriorConfig.fixed_start_sd says so
        # Written as fixed values plus each learned spread times its kind's indicator: elementwise
        # work that PyTensor fuses (stacking the scalars cost 14 us per gradient, 10% of it, on 201 runs).
        fixed = np.array([0.0 if sd is None else float(sd) for sd in p.fixed_start_sd])
        r0_sd = pt.as_tensor(fixed)
        for i, kind in enumerate(SCALE_KINDS):
            if p.fixed_start_sd[i] is None:
                r0_sd = r0_sd + np.eye(len(SCALE_KINDS))[i] * spread(f"r0_sd_{kind}", p.r0_sd_scale[i])
        pop["r0_sd"] = pm.Deterministic("r0_sd", r0_sd, dims="kind")
    pop["sig_mu"] = pm.Normal("sig_mu", mu=np.array(p.sig_mu_loc), sigma=np.array(p.sig_mu_scale), dims="kind")
    pop["sig_sd"] = spread("sig_sd", p.sig_sd_scale, dims="kind")
    return pop


def run_prior(
    pop: Mapping[str, Any],
    cov: Covariates,
    config: ModelConfig,
    xp: Any = np,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Location and scale of each per-run parameter (:data:`PARAMS`) given population values.

    Parameters
    ----------
    pop : mapping
        Population values by name (:data:`POPULATION_VARS`): PyMC variables, or NumPy
        arrays whose trailing axis is the posterior draw.
    cov : Covariates
        The run(s)' kind, family and source (-1: unseen), size, initial reward, start and whether it is declared.
    config : ModelConfig
        Curve form and prior settings.
    xp : module
        ``numpy`` or ``pytensor.tensor``.

    Returns
    -------
    (dict, dict)
        ``loc[name]`` and ``scale[name]`` for each name of :data:`PARAMS`.
    """
    k = cov.kind
    # A family or source the population has seen enters with its effect; an unseen one
    # (index -1) with effect 0 and its spread added to the scale (its effect marginalised).
    fam_gain, fam_gain_var, fam_tau, fam_tau_var = _level_effects(pop, "fam", cov.family)
    src_gain, src_gain_var, src_tau, src_tau_var = _level_effects(pop, "src", cov.source)
    sig_gain, sig_gain_var, sig_tau, sig_tau_var = _signal_effects(pop, cov, k)
    gain_sd = pop["gain_sd"][k] * xp.sqrt(1.0 + fam_gain_var + src_gain_var + sig_gain_var)
    tau_sd = xp.sqrt(pop["tau_sd"][k] ** 2 + fam_tau_var + src_tau_var + sig_tau_var)
    has_beta = get_form(config.form).has_beta
    # A declared initial reward fixes the start's spread: the population spread r0_sd is
    # learned from runs whose start is read from their rewards. (Learning it from declared
    # starts, which their rewards pin down to about its own size, is a funnel for NUTS.)
    declared_sd = np.asarray(config.priors.declared_start_sd)[k]
    r0_sd = pop["r0_sd"][k] * (1.0 - cov.declared) + declared_sd * cov.declared
    loc = {
        "r0": cov.start,
        "asinh_gain": pop["gain_mu"][k] + pop["gain_sd"][k] * (fam_gain + src_gain + pop["gain_size"] * cov.size + pop["gain_init"] * cov.init + sig_gain),
        "log_tau": pop["tau_mu"][k] + fam_tau + src_tau + pop["tau_size"] * cov.size + pop["tau_init"] * cov.init + sig_tau,
        "log_beta": pop["beta_mu"][k] if has_beta else 0.0,
        "log_sigma": pop["sig_mu"][k],
    }
    scale = {
        "r0": r0_sd,
        "asinh_gain": gain_sd,
        "log_tau": tau_sd,
        "log_beta": pop["beta_sd"][k] if has_beta else _FIXED_SCALE,
        "log_sigma": pop["sig_sd"][k],
    }
    return loc, scale


def _level_effects(pop: Mapping[str, Any], level: str, index: Any) -> tuple[Any, Any, Any, Any]:
    """Gain and log-timescale effects of a partially pooled level (``"fam"`` or ``"src"``) and the variance added for unseen ones.

    Returns ``(gain effect, added gain variance in gain_sd units, tau effect, added tau variance)``;
    a population without that level (the source level when ``ModelConfig.source_level`` is off, or a
    model file written before it existed) adds nothing.
    """
    if f"{level}_gain" not in pop:
        return 0.0, 0.0, 0.0, 0.0
    known = np.asarray(index) >= 0
    seen = np.where(known, index, 0)
    unseen = 1.0 - known
    return (
        pop[f"{level}_gain"][seen] * known,
        unseen * pop[f"{level}_gain_sd"] ** 2,
        pop[f"{level}_tau"][seen] * known,
        unseen * pop[f"{level}_tau_sd"] ** 2,
    )


def _signal_effects(pop: Mapping[str, Any], cov: Covariates, k: Any) -> tuple[Any, Any, Any, Any]:
    """Gain (in ``gain_sd`` units) and log-timescale effects of the learning signal, and the variances added where it is unknown.

    A log without ``reward_std`` has its (standardised) signal marginalised: no shift, and the
    coefficient's square added to the variance. A population fitted without the signal
    (``ModelConfig.learning_signal`` off, or before model 3.0) has no coefficients and adds nothing.
    """
    if "gain_signal" not in pop:
        return 0.0, 0.0, 0.0, 0.0
    unknown = 1.0 - cov.signal_known
    gain, tau = pop["gain_signal"][k], pop["tau_signal"][k]
    return gain * cov.signal, unknown * gain**2, tau * cov.signal, unknown * tau**2


def natural(theta: Mapping[str, Any], config: ModelConfig, xp: Any = np) -> dict[str, Any]:
    """Curve parameters ``r0, gain, tau, beta, sigma`` from the unconstrained ones.

    ``asinh_gain`` is the gain reached at the end of the planned run (progress 1) when
    ``config.gain_at == "plan_end"``, the total gain (the asymptote) when ``"asymptote"``.
    Measured at the end of the plan, a run that never took off has a gain near zero
    whatever its timescale, instead of the ridge (gain ~ 0, any tau) or (tau beyond the
    horizon, any gain) that the asymptote leaves; ``gain`` is always the asymptote, and
    under ``"plan_end"`` the result also holds that gain by the end of the plan,
    ``end_gain``, from which :func:`expected_reward` computes the curve.
    """
    tau = xp.exp(theta["log_tau"])
    beta = xp.exp(theta["log_beta"])
    gain = xp.sinh(theta["asinh_gain"])
    params = {"r0": theta["r0"], "gain": gain, "tau": tau, "beta": beta, "sigma": xp.exp(theta["log_sigma"])}
    if config.gain_at == "plan_end":
        params["end_gain"] = gain
        params["gain"] = gain / xp.maximum(shape(config.form, 1.0, tau, beta, xp), SMALLEST_END_SHARE)
    return params


def expected_reward(config: ModelConfig, t: Any, params: Mapping[str, Any], xp: Any = np) -> Any:
    """Expected normalised reward at progress ``t``: ``r0 + end_gain * F(t) / F(1)`` under
    ``gain_at="plan_end"``, ``r0 + gain * F(t)`` under ``"asymptote"``.

    The first is computed with :func:`~bayes_grpo.curves.relative_shape`, which stays smooth
    where ``F(1)`` is tiny and the asymptote ``gain`` astronomically large. ``end_gain`` comes
    from :func:`natural`; parameters without it (a fit's stored per-run draws) get it back from
    the asymptote by undoing :func:`natural`'s division.
    """
    r0, tau, beta = params["r0"], params["tau"], params["beta"]
    if config.gain_at != "plan_end":
        return reward_curve(config.form, t, r0, params["gain"], tau, beta, xp=xp)
    end_gain = params["end_gain"] if "end_gain" in params else params["gain"] * xp.maximum(shape(config.form, 1.0, tau, beta, xp), SMALLEST_END_SHARE)
    return r0 + end_gain * relative_shape(config.form, t, tau, beta, xp)


def step_noise(sigma: Any, floor: float, xp: Any = np) -> Any:
    """Per-step noise of the likelihood: the run's ``sigma`` with the noise ``floor`` added in quadrature."""
    return xp.sqrt(sigma**2 + floor**2)


def observation(config: ModelConfig, t: Any, count: Any, params: Mapping[str, Any], xp: Any = np) -> tuple[Any, Any]:
    """Mean and Student-t scale of a bin of ``count`` logged rewards at progress ``t``."""
    mu = expected_reward(config, t, params, xp)
    return mu, step_noise(params["sigma"], config.noise_floor, xp) / xp.sqrt(count)


def student_t_logpdf(x: np.ndarray, nu: float, mu: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """Log density of a Student-t (NumPy, elementwise; cheapest with a ``scale`` that broadcasts, e.g. a column).

    Computed in place in one array: the forecast evaluates it on thousands of parameter vectors. ``log(1 + r)``
    rather than ``log1p(r)``, which took twice as long: they differ by under 1e-16 where ``r`` is tiny.
    """
    out = np.subtract(x, mu, out=np.empty(np.broadcast_shapes(np.shape(x), np.shape(mu), np.shape(scale))))
    out *= 1.0 / (np.sqrt(nu) * scale)
    np.square(out, out=out)
    out += 1.0
    np.log(out, out=out)
    out *= -(nu + 1) / 2
    out += _student_t_const(nu) - np.log(scale)
    return out


def _student_t_const(nu: float) -> float:
    """Log normalising constant of a unit Student-t with ``nu`` degrees of freedom."""
    return float(gammaln((nu + 1) / 2) - gammaln(nu / 2) - 0.5 * np.log(nu * np.pi))


def log_likelihood(config: ModelConfig, theta: np.ndarray, t: np.ndarray, z: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Log-likelihood of one run's binned observations for each row of ``theta`` (n, len(PARAMS)).

    Taken in blocks of :data:`BLOCK_ROWS` rows, whose (rows, bins) temporaries stay in a core's cache.
    """
    if t.size == 0:
        return np.zeros(theta.shape[0])
    return np.concatenate([_block_log_likelihood(config, block, t, z, counts) for block in row_blocks(theta)])


def _block_log_likelihood(config: ModelConfig, theta: np.ndarray, t: np.ndarray, z: np.ndarray, counts: np.ndarray) -> np.ndarray:
    params = natural({name: theta[:, j : j + 1] for j, name in enumerate(PARAMS)}, config)
    mu, noise = observation(config, t[None], 1.0, params)  # the noise of one step: a column
    # A bin of `count` steps is Student-t with scale noise / sqrt(count); times sqrt(count), it has the noise of
    # one step, so the scale stays a column (no log per bin) and the change of variable adds sum(log sqrt(count)).
    root = np.sqrt(counts)
    return np.sum(student_t_logpdf(z * root, config.student_nu, mu * root, noise), axis=1) + np.sum(np.log(root))


#: Rows of parameter vectors a forecast-time density takes at once (:func:`row_blocks`).
BLOCK_ROWS = 256


def row_blocks(theta: np.ndarray) -> list[np.ndarray]:
    """``theta`` cut into blocks of at most :data:`BLOCK_ROWS` rows (one, possibly empty, for few rows).

    A density over many parameter vectors makes (rows, bins or components) temporaries; blocks of
    256 rows keep them within a core's cache, which made the forecast's densities about twice as fast.
    """
    return [theta[start : start + BLOCK_ROWS] for start in range(0, max(theta.shape[0], 1), BLOCK_ROWS)]


def in_support(config: ModelConfig, theta: np.ndarray, kind: str) -> np.ndarray:
    """Rows of ``theta`` whose curve starts and ends within a declared range (all rows on a learned scale).

    The end is ``r0 + sinh(asinh_gain)``: the level at the end of the plan, or the asymptote
    under ``gain_at="asymptote"``.
    """
    if kind != "range":
        return np.ones(theta.shape[0], bool)
    ends = np.stack([theta[:, 0], theta[:, 0] + np.sinh(theta[:, 1])])
    return ~np.any((ends < -config.range_slack) | (ends > 1 + config.range_slack), axis=0)


def normal_logpdf(theta: np.ndarray, loc: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """Sum over parameters of independent Normal log densities (rows of ``theta``)."""
    return np.sum(-0.5 * ((theta - loc) / scale) ** 2 - np.log(scale) - 0.5 * np.log(2 * np.pi), axis=-1)


class RunPrior:
    """Population posterior predictive of one run's parameters: Normal per draw, mixed over draws.

    Parameters
    ----------
    model : PopulationPosterior
        The fitted population.
    prepared : PreparedRun
        The run to forecast (its covariates; its steps are not used here).
    rng : numpy.random.Generator
        Picks the ``n_components`` posterior draws used by :meth:`logpdf`.
    n_components : int
        Number of mixture components in :meth:`logpdf` (sampling uses every draw).
    """

    def __init__(self, model: PopulationPosterior, prepared: PreparedRun, rng: np.random.Generator, n_components: int = 128):
        cov = covariates(prepared, model.size_centres, model.families, model.sources)
        loc, scale = run_prior(model.population_arrays(), cov, model.model_config, np)
        n = np.size(loc["log_sigma"])
        self.mean = np.stack([np.broadcast_to(loc[name], (n,)) for name in PARAMS], axis=1)
        self.sd = np.stack([np.broadcast_to(scale[name], (n,)) for name in PARAMS], axis=1)
        self.components = rng.choice(n, size=min(n_components, n), replace=False)
        # logpdf's per-component constants, fixed once: the quadratic form is [theta^2, theta] @ _coef.
        precision = 1.0 / self.sd[self.components] ** 2
        mean = self.mean[self.components]
        self._coef = np.vstack([-0.5 * precision.T, (mean * precision).T])
        self._offset = (
            -0.5 * np.sum(mean**2 * precision, axis=1) - np.sum(np.log(self.sd[self.components]), axis=1)
            - 0.5 * len(PARAMS) * np.log(2 * np.pi) - np.log(self.components.size)
        )  # fmt: skip

    @property
    def mixture_constants(self) -> tuple[np.ndarray, np.ndarray]:
        """``(coef, offset)``: the components' log densities at ``theta`` are ``offset + [theta**2, theta] @ coef``."""
        return self._coef, self._offset

    def sample(self, rng: np.random.Generator, size: int) -> np.ndarray:
        """``size`` parameter vectors (rows) from the mixture over all posterior draws."""
        rows = rng.integers(0, self.mean.shape[0], size)
        return self.mean[rows] + self.sd[rows] * rng.standard_normal((size, len(PARAMS)))

    def logpdf(self, theta: np.ndarray) -> np.ndarray:
        """Log density of the mixture (over a fixed random subset of posterior draws), by a matrix product per
        block of rows (:func:`row_blocks`), small enough that BLAS keeps it on one thread (threads made it ten
        times slower on two cores shared with other work)."""
        return np.concatenate([logsumexp_rows(self._offset + np.hstack([block**2, block]) @ self._coef) for block in row_blocks(theta)])


def logsumexp_rows(values: np.ndarray) -> np.ndarray:
    """``log(sum(exp(values), axis=-1))``, stably: :func:`scipy.special.logsumexp` without its array-API
    dispatch, which cost more than the arithmetic on the forecast's small arrays."""
    top = np.max(values, axis=-1, keepdims=True)
    top = np.where(np.isfinite(top), top, 0.0)
    with np.errstate(divide="ignore"):  # a row of -inf has log(0) = -inf, as it should
        return np.log(np.sum(np.exp(values - top), axis=-1)) + top[..., 0]


def simulate(config: ModelConfig, t: np.ndarray, params: Mapping[str, np.ndarray], rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Posterior predictive of a run's logged rewards at progress ``t`` (one step per point).

    Parameters
    ----------
    config : ModelConfig
        The fitted model's settings.
    t : ndarray
        Normalised progress of the logged steps.
    params : mapping
        Per-draw ``r0, gain, tau, sigma`` (and ``beta``; 1 when absent), 1-D arrays: a fit's stored
        per-run draws, or :func:`natural` of parameter vectors.
    rng : numpy.random.Generator
        Source of the Student-t noise.

    Returns
    -------
    (ndarray, ndarray)
        The expected curve and simulated per-step rewards, both (n_draws, len(t)), normalised units.
    """
    params = {name: np.asarray(value, dtype=float)[:, None] for name, value in params.items()}
    params.setdefault("beta", np.ones_like(params["r0"]))
    mu, scale = observation(config, np.asarray(t, dtype=float)[None], 1.0, params)
    return mu, mu + scale * rng.standard_t(config.student_nu, size=mu.shape)
