"""The population model, defined once: priors, curve, noise, and how covariates enter.

Each run ``r`` follows ``z(t) = r0 + gain * F(t; tau, beta)`` in normalised
progress ``t`` and normalised reward ``z`` (:mod:`bayes_grpo.prepare`), with the
shape ``F`` from the curve-form registry (:mod:`bayes_grpo.curves`). A run's
five parameters ``theta = (r0, asinh_gain, log_tau, log_beta, log_sigma)`` are
Normal given the population, with means depending on the scale kind ``k``
(declared range or learned unit), the family ``f`` and the source ``s`` (a
repository / recipe / task; both partially pooled), the centred log10 size
``x`` and the centred initial reward ``i``::

    asinh_gain ~ Normal(gain_mu[k] + fam_gain[f] + src_gain[s] + gain_size[k] x + gain_init i, gain_sd[k])
    log_tau    ~ Normal(tau_mu + fam_tau[f] + src_tau[s] + tau_size x + tau_init i, tau_sd)

(``src_gain[s] ~ Normal(0, src_gain_sd[k])``, with the source and run spreads
written as a total and the share of its variance between sources;
family and source effects sum to zero, see :func:`population_priors`)
    log_beta   ~ Normal(beta_mu, beta_sd)             (beta = 1 for forms without beta)
    r0         ~ Normal(start_r, r0_sd[k])
    log_sigma  ~ Normal(sig_mu[k], sig_sd[k])
    z_bin      ~ StudentT(nu, r0 + gain F(t_bin), sqrt(sigma^2 + floor^2) / sqrt(n_bin))

A run without a family, or (at forecast time) with a family the population has
not seen, gets ``fam = 0`` with the family spread added to the scale; a run
from a source the population has not seen (every user's own run) likewise gets
the spread between sources, so a new source is forecast with the honest
uncertainty of "another repository, recipe and task".
The gain is the rise by the end of the planned run, in the run's unit. The
sinh keeps small gains near-Normal while giving the heavier right tail of real
runs (a Normal gain measured worse in the grouped cross-validation: wider and
symmetric intervals). A gain near zero is how the model says "no take-off (yet)".

Everything else is derived from the three functions :func:`run_prior` (per-run
Normal given population values and covariates), :func:`observation` (mean and
scale of a binned observation) and :func:`population_priors` (the population
level), each written once against an array namespace (NumPy or PyTensor):

* :func:`build_model` - the PyMC model that is fitted (per run and parameter
  centred where the run's own data pin the parameter, non-centred
  ``theta = loc + scale * e`` where the population prior dominates;
  :func:`centring`);
* :class:`RunPrior` and :func:`log_likelihood` - the density that conditions one
  run at forecast time (:mod:`bayes_grpo.forecast`);
* :func:`simulate` - the posterior predictive of logged rewards (report PPCs).

``tests/test_architecture.py`` checks that the PyMC log-density and the
forecast-time density agree on random parameter values.

Two deliberate forecast-time refinements, both switched on only by the
conditioning code: a run that declares its initial reward has its start spread
capped (``PriorConfig.declared_start_sd``), and on a declared reward range a
curve must start and end inside it (:func:`in_support`; a hard boundary would
stall NUTS, so the fit does not use it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Protocol, Sequence

import numpy as np
from scipy.special import gammaln

from bayes_grpo.config import ModelConfig, merge
from bayes_grpo.curves import get_form, reward_curve
from bayes_grpo.errors import ModelError
from bayes_grpo.measures import smoothed
from bayes_grpo.prepare import SCALE_KINDS, PreparedRun, bin_observations, centred_size, noise_scale, size_centres, start_level

#: Per-run parameters, in the unconstrained space the forecast samples.
PARAMS = ("r0", "asinh_gain", "log_tau", "log_beta", "log_sigma")
#: Name of each parameter's standard-normal offset in the PyMC model.
OFFSETS = {"r0": "e_r0", "asinh_gain": "e_gain", "log_tau": "e_tau", "log_beta": "e_beta", "log_sigma": "e_sig"}
#: Name of each parameter's centred per-run variable in the PyMC model.
CENTRED = {"r0": "c_r0", "asinh_gain": "c_gain", "log_tau": "c_tau", "log_beta": "c_beta", "log_sigma": "c_sig"}
#: Population-level variables kept in a fitted model (the per-run ones are not).
POPULATION_VARS = (
    "gain_mu", "gain_sd", "gain_size", "gain_init", "fam_gain", "fam_gain_sd", "src_gain", "src_gain_sd",
    "gain_total_sd", "gain_src_share",
    "tau_mu", "tau_sd", "tau_size", "tau_init", "fam_tau", "fam_tau_sd", "src_tau", "src_tau_sd",
    "tau_total_sd", "tau_src_share",
    "beta_mu", "beta_sd", "r0_sd", "sig_mu", "sig_sd",
)
#: Family coordinate of a fit in which no run names its family (never matches a run).
NO_FAMILY = "(no family)"
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
    has not seen (in the fit as at forecast time); ``source`` indexes the fitted
    sources, -1 for a source the population has not seen;
    ``size`` is the centred log10 size, ``init`` the centred initial reward and
    ``start`` the prior centre of ``r0``.
    """

    kind: Any
    family: Any
    source: Any
    size: Any
    init: Any
    start: Any


def covariates(prepared: PreparedRun, centres: Sequence[float], families: Sequence[str], sources: Sequence[str]) -> Covariates:
    """The covariates of one prepared run against a fitted population's size centres, families and sources."""
    families, sources = list(families), list(sources)
    return Covariates(
        kind=prepared.kind_index,
        family=families.index(prepared.family) if prepared.family in families else -1,
        source=sources.index(prepared.source) if prepared.source in sources else -1,
        size=centred_size(prepared, list(centres)),
        init=prepared.initial_cov,
        start=start_level(prepared),
    )


def population_priors(config: ModelConfig, source_kinds: Sequence[int]) -> dict[str, Any]:
    """Create the population-level PyMC variables (inside a ``pm.Model`` with ``kind``/``family``/``source`` coords).

    Family and source effects sum to zero (sources within each scale kind, whose
    mean gain already has its own intercept): with free effects, the
    intercepts and the effects trade off along ridges that slow NUTS down,
    while the zero-sum effects describe the same population. ``source_kinds``
    gives the scale kind of each source, in the ``source`` coordinate's order.
    """
    import pymc as pm
    import pytensor.tensor as pt

    p = config.priors
    pop: dict[str, Any] = {
        "gain_mu": pm.Normal("gain_mu", mu=np.array(p.gain_mu_loc), sigma=np.array(p.gain_mu_scale), dims="kind"),
        "gain_total_sd": pm.HalfNormal("gain_total_sd", sigma=np.array(p.gain_sd_scale), dims="kind"),
        "gain_src_share": pm.Beta("gain_src_share", *p.source_share_prior),
        "gain_size": pm.Normal("gain_size", 0.0, np.array(p.gain_size_scale), dims="kind"),
        "gain_init": pm.Normal("gain_init", 0.0, p.gain_init_scale),
        "fam_gain_sd": pm.HalfNormal("fam_gain_sd", p.fam_gain_sd_scale),
    }
    n_families = len(pm.modelcontext(None).coords["family"])
    pop["fam_gain"] = pm.Deterministic("fam_gain", pop["fam_gain_sd"] * _zero_sum("fam_gain_raw", np.zeros(n_families, int)), dims="family")
    # The spread of a run's gain around its kind's mean, split between sources and runs: the total
    # is what a run from a new source gets, and is pinned even when few sources have several runs.
    pop["gain_sd"] = pm.Deterministic("gain_sd", pop["gain_total_sd"] * pt.sqrt(1.0 - pop["gain_src_share"]), dims="kind")
    pop["src_gain_sd"] = pm.Deterministic("src_gain_sd", pop["gain_total_sd"] * pt.sqrt(pop["gain_src_share"]), dims="kind")
    source_kinds = np.asarray(source_kinds, dtype=int)
    pop["src_gain"] = pm.Deterministic("src_gain", pop["src_gain_sd"][source_kinds] * _zero_sum("src_gain_raw", source_kinds), dims="source")
    pop["tau_mu"] = pm.Normal("tau_mu", p.tau_mu_loc, p.tau_mu_scale)
    pop["tau_total_sd"] = pm.HalfNormal("tau_total_sd", p.tau_sd_scale)
    pop["tau_src_share"] = pm.Beta("tau_src_share", *p.source_share_prior)
    pop["tau_sd"] = pm.Deterministic("tau_sd", pop["tau_total_sd"] * pt.sqrt(1.0 - pop["tau_src_share"]))
    pop["src_tau_sd"] = pm.Deterministic("src_tau_sd", pop["tau_total_sd"] * pt.sqrt(pop["tau_src_share"]))
    pop["tau_size"] = pm.Normal("tau_size", 0.0, p.tau_size_scale)
    pop["tau_init"] = pm.Normal("tau_init", 0.0, p.tau_init_scale)
    pop["fam_tau_sd"] = pm.HalfNormal("fam_tau_sd", p.fam_tau_sd_scale)
    pop["fam_tau"] = pm.Deterministic("fam_tau", pop["fam_tau_sd"] * _zero_sum("fam_tau_raw", np.zeros(n_families, int)), dims="family")
    pop["src_tau"] = pm.Deterministic("src_tau", pop["src_tau_sd"] * _zero_sum("src_tau_raw", np.zeros(source_kinds.size, int)), dims="source")
    if get_form(config.form).has_beta:
        pop["beta_mu"] = pm.Normal("beta_mu", config.resolved_beta_centre(), p.beta_mu_scale)
        if config.per_run_beta:
            pop["beta_sd"] = pm.HalfNormal("beta_sd", p.beta_sd_scale)
    pop["r0_sd"] = pm.HalfNormal("r0_sd", sigma=np.array(p.r0_sd_scale), dims="kind")
    pop["sig_mu"] = pm.Normal("sig_mu", mu=np.array(p.sig_mu_loc), sigma=np.array(p.sig_mu_scale), dims="kind")
    pop["sig_sd"] = pm.HalfNormal("sig_sd", p.sig_sd_scale, dims="kind")
    return pop


def _zero_sum(name: str, groups: np.ndarray) -> Any:
    """Standard-normal effects that sum to zero within each group (0 for a group of one)."""
    import pymc as pm
    import pytensor.tensor as pt

    value = pt.zeros(groups.size)
    for group in np.unique(groups):
        members = np.flatnonzero(groups == group)
        if members.size >= 2:
            suffix = f"_{group}" if np.unique(groups).size > 1 else ""
            value = pt.set_subtensor(value[members], pm.ZeroSumNormal(f"{name}{suffix}", sigma=1.0, shape=members.size))
    return value


def run_prior(
    pop: Mapping[str, Any],
    cov: Covariates,
    config: ModelConfig,
    xp: Any = np,
    declared_start: bool = False,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Location and scale of each per-run parameter (:data:`PARAMS`) given population values.

    Parameters
    ----------
    pop : mapping
        Population values by name (:data:`POPULATION_VARS`): PyMC variables, or NumPy
        arrays whose trailing axis is the posterior draw.
    cov : Covariates
        The run(s)' kind, family and source (-1: unseen), size, initial reward and start.
    config : ModelConfig
        Curve form and prior settings.
    xp : module
        ``numpy`` or ``pytensor.tensor``.
    declared_start : bool
        True when the (single) run declares its initial reward: the start spread is capped at
        ``config.priors.declared_start_sd[kind]`` (used at forecast time only).

    Returns
    -------
    (dict, dict)
        ``loc[name]`` and ``scale[name]`` for each name of :data:`PARAMS`.
    """
    k = cov.kind
    # A family or source the population has seen enters with its effect; an unseen one
    # (index -1) with effect 0 and its spread added to the scale (its effect marginalised).
    known_family = np.asarray(cov.family) >= 0
    known_source = np.asarray(cov.source) >= 0
    family = np.where(known_family, cov.family, 0)
    source = np.where(known_source, cov.source, 0)
    new_family, new_source = 1.0 - known_family, 1.0 - known_source
    group_gain = pop["fam_gain"][family] * known_family + pop["src_gain"][source] * known_source
    group_tau = pop["fam_tau"][family] * known_family + pop["src_tau"][source] * known_source
    gain_sd = xp.sqrt(pop["gain_sd"][k] ** 2 + new_family * pop["fam_gain_sd"] ** 2 + new_source * pop["src_gain_sd"][k] ** 2)
    tau_sd = xp.sqrt(pop["tau_sd"] ** 2 + new_family * pop["fam_tau_sd"] ** 2 + new_source * pop["src_tau_sd"] ** 2)
    has_beta = get_form(config.form).has_beta
    r0_sd = pop["r0_sd"][k]
    if declared_start:
        r0_sd = xp.minimum(r0_sd, config.priors.declared_start_sd[k])
    loc = {
        "r0": cov.start,
        "asinh_gain": pop["gain_mu"][k] + group_gain + pop["gain_size"][k] * cov.size + pop["gain_init"] * cov.init,
        "log_tau": pop["tau_mu"] + group_tau + pop["tau_size"] * cov.size + pop["tau_init"] * cov.init,
        "log_beta": pop["beta_mu"] if has_beta else 0.0,
        "log_sigma": pop["sig_mu"][k],
    }
    scale = {
        "r0": r0_sd,
        "asinh_gain": gain_sd,
        "log_tau": tau_sd,
        "log_beta": pop["beta_sd"] if has_beta and config.per_run_beta else _FIXED_SCALE,
        "log_sigma": pop["sig_sd"][k],
    }
    return loc, scale


def natural(theta: Mapping[str, Any], xp: Any = np) -> dict[str, Any]:
    """Curve parameters ``r0, gain, tau, beta, sigma`` from the unconstrained ones."""
    return {
        "r0": theta["r0"],
        "gain": xp.sinh(theta["asinh_gain"]),
        "tau": xp.exp(theta["log_tau"]),
        "beta": xp.exp(theta["log_beta"]),
        "sigma": xp.exp(theta["log_sigma"]),
    }


def step_noise(sigma: Any, floor: float, xp: Any = np) -> Any:
    """Per-step noise of the likelihood: the run's ``sigma`` with the noise ``floor`` added in quadrature."""
    return xp.sqrt(sigma**2 + floor**2)


def observation(config: ModelConfig, t: Any, count: Any, params: Mapping[str, Any], xp: Any = np) -> tuple[Any, Any]:
    """Mean and Student-t scale of a bin of ``count`` logged rewards at progress ``t``."""
    mu = reward_curve(config.form, t, params["r0"], params["gain"], params["tau"], params["beta"], xp=xp)
    return mu, step_noise(params["sigma"], config.noise_floor, xp) / xp.sqrt(count)


def student_t_logpdf(x: np.ndarray, nu: float, mu: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """Log density of a Student-t (NumPy, elementwise)."""
    resid = (x - mu) / scale
    const = gammaln((nu + 1) / 2) - gammaln(nu / 2) - 0.5 * np.log(nu * np.pi)
    return const - np.log(scale) - (nu + 1) / 2 * np.log1p(resid**2 / nu)


def log_likelihood(config: ModelConfig, theta: np.ndarray, t: np.ndarray, z: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Log-likelihood of one run's binned observations for each row of ``theta`` (n, len(PARAMS))."""
    if t.size == 0:
        return np.zeros(theta.shape[0])
    params = natural({name: theta[:, j : j + 1] for j, name in enumerate(PARAMS)})
    mu, scale = observation(config, t[None], counts[None], params)
    return np.sum(student_t_logpdf(z[None], config.student_nu, mu, scale), axis=1)


def in_support(config: ModelConfig, theta: np.ndarray, kind: str) -> np.ndarray:
    """Rows of ``theta`` whose curve starts and ends within a declared range (all rows on a learned scale)."""
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
        loc, scale = run_prior(model.population_arrays(), cov, model.model_config, np, declared_start=prepared.initial_z is not None)
        n = np.size(loc["log_sigma"])
        self.mean = np.stack([np.broadcast_to(loc[name], (n,)) for name in PARAMS], axis=1)
        self.sd = np.stack([np.broadcast_to(scale[name], (n,)) for name in PARAMS], axis=1)
        self.components = rng.choice(n, size=min(n_components, n), replace=False)

    def sample(self, rng: np.random.Generator, size: int) -> np.ndarray:
        """``size`` parameter vectors (rows) from the mixture over all posterior draws."""
        rows = rng.integers(0, self.mean.shape[0], size)
        return self.mean[rows] + self.sd[rows] * rng.standard_normal((size, len(PARAMS)))

    def logpdf(self, theta: np.ndarray) -> np.ndarray:
        """Log density of the mixture (over a fixed random subset of posterior draws), by matrix products."""
        rows = self.components
        mean, sd = self.mean[rows], self.sd[rows]
        # Direct differences, not an expanded square: a fixed parameter's scale (1e-9) would cancel catastrophically.
        quad = np.sum(((theta[:, None, :] - mean[None]) / sd[None]) ** 2, axis=2)
        log_norm = -np.sum(np.log(self.sd[rows]), axis=1) - 0.5 * len(PARAMS) * np.log(2 * np.pi)
        terms = log_norm[None] - 0.5 * quad
        # A plain max-shifted log-sum-exp: scipy's has a call overhead that dominates on the few rows
        # of each step of the forecast's mode search.
        top = np.max(terms, axis=1, keepdims=True)
        top = np.where(np.isfinite(top), top, 0.0)
        return np.log(np.sum(np.exp(terms - top), axis=1)) + top[:, 0] - np.log(rows.size)


def build_model(prepared: list[PreparedRun], config: ModelConfig | None = None, centres: Sequence[float] | None = None, **overrides: Any) -> Any:
    """The hierarchical PyMC model of prepared runs (observations binned to ``config.max_bins``).

    Parameters
    ----------
    prepared : list of PreparedRun
        The runs to fit.
    config : ModelConfig, optional
        Model settings (default :class:`ModelConfig`).
    centres : sequence of float, optional
        Per-kind log10-size centres (default: computed from ``prepared``).
    **overrides
        Fields of ``config`` to override, e.g. ``form="weibull"``, ``max_bins=40``.

    Returns
    -------
    pymc.Model
        With ``run``, ``family``, ``source``, ``kind`` and ``obs`` coordinates; per-run
        deterministics ``r0, gain, tau, sigma`` (and ``beta``), observed ``z_obs``.

    Raises
    ------
    ModelError
        For no runs or an unknown setting.

    Example
    -------
    >>> model = build_model(prepared, form="weibull")  # doctest: +SKIP
    """
    import pymc as pm
    import pytensor.tensor as pt

    if not prepared:
        raise ModelError("the model needs at least one run")
    config = merge(config or ModelConfig(), overrides or None)
    # Runs without a family enter with the family effect marginalised (as unseen families do
    # at forecast time); the coordinate keeps one placeholder when no run names a family.
    families = sorted({p.family for p in prepared if p.family}) or [NO_FAMILY]
    sources = sorted({p.source for p in prepared})
    centres = list(centres) if centres is not None else size_centres(prepared)
    binned = [bin_observations(p.t, p.z, config.max_bins) for p in prepared]
    coords = {
        "run": [p.run_id for p in prepared],
        "family": families,
        "source": sources,
        "kind": list(SCALE_KINDS),
        "obs": np.arange(sum(b[0].size for b in binned)),
    }
    with pm.Model(coords=coords) as model:
        t_data = pm.Data("t", np.concatenate([b[0] for b in binned]), dims="obs")
        z_data = pm.Data("z", np.concatenate([b[1] for b in binned]), dims="obs")
        count_data = pm.Data("count", np.concatenate([b[2] for b in binned]), dims="obs")
        run_idx = pm.Data("run_idx", np.concatenate([np.full(b[0].size, r) for r, b in enumerate(binned)]).astype("int64"), dims="obs")
        cov = Covariates(
            kind=np.array([p.kind_index for p in prepared]),
            family=np.array([families.index(p.family) if p.family else -1 for p in prepared]),
            source=np.array([sources.index(p.source) for p in prepared]),
            size=pm.Data("log10_size", np.array([centred_size(p, centres) for p in prepared]), dims="run"),
            init=pm.Data("initial_cov", np.array([p.initial_cov for p in prepared]), dims="run"),
            start=pm.Data("start", np.array([start_level(p) for p in prepared]), dims="run"),
        )
        source_kinds = [next(p.kind_index for p in prepared if p.source == source) for source in sources]
        loc, scale = run_prior(population_priors(config, source_kinds), cov, config, xp=pt)
        has_beta = get_form(config.form).has_beta
        pinned = centring(prepared, config)
        theta = {
            name: _per_run(name, loc[name], scale[name], pinned[name])
            for name in ("asinh_gain", "log_tau", "r0", "log_sigma", "log_beta")
            if name != "log_beta" or (has_beta and config.per_run_beta)
        }
        # A shape shared by all runs (or a form without beta): every run's log beta is the population's.
        theta.setdefault("log_beta", loc["log_beta"] * pt.ones(len(prepared)))
        params = natural(theta, xp=pt)
        for name in ("gain", "tau", "r0", "sigma") + (("beta",) if has_beta else ()):
            params[name] = pm.Deterministic(name, params[name], dims="run")
        mu, noise = observation(config, t_data, count_data, {name: value[run_idx] for name, value in params.items()}, xp=pt)
        pm.StudentT("z_obs", nu=config.student_nu, mu=mu, sigma=noise, observed=z_data, dims="obs")
    return model


def centring(prepared: Sequence[PreparedRun], config: ModelConfig) -> dict[str, np.ndarray]:
    """Which runs get a centred parameterisation of each per-run parameter.

    A parameter the run's own data pin is best sampled centred: as an offset
    from the population (non-centred) it would sit in a narrow ridge that NUTS
    crosses only with its longest trees. A parameter left to the population
    prior is best sampled non-centred, which avoids the funnel. The start and
    noise level of every run are pinned by its data (centred). Its rise by the
    end of the run is pinned when its last fifth sits ``config.centring_se``
    standard errors from its first fifth; its timescale and shape only when,
    in addition, it has visibly levelled off (half its smoothed rise reached in
    the first half of its steps). The choice changes only the geometry, not the
    posterior.

    Returns
    -------
    dict
        ``name -> bool array`` (True: centred), one entry per name of :data:`PARAMS`.
    """
    n = len(prepared)
    rise_pinned = np.array([rise_significance(p.z) >= config.centring_se for p in prepared])
    shape_pinned = rise_pinned & np.array([half_rise_progress(p.z) <= 0.5 for p in prepared])
    return {
        "r0": np.ones(n, bool),
        "log_sigma": np.ones(n, bool),
        "asinh_gain": rise_pinned,
        "log_tau": shape_pinned,
        "log_beta": shape_pinned,
    }


def rise_significance(z: np.ndarray) -> float:
    """How many standard errors separate a run's last fifth from its first fifth (mean levels)."""
    z = np.asarray(z, dtype=float)
    if z.size < 10:
        return 0.0
    n = z.size // 5
    se = noise_scale(z) * np.sqrt(2.0 / n)
    return float(abs(z[-n:].mean() - z[:n].mean()) / se)


def half_rise_progress(z: np.ndarray) -> float:
    """Share of a run's logged steps after which its smoothed reward first covers half its start-to-end change."""
    z = np.asarray(z, dtype=float)
    if z.size < 10:
        return 1.0
    level = smoothed(np.arange(z.size), z)
    change = level[-1] - level[0]
    if change == 0:
        return 1.0
    reached = np.flatnonzero((level - level[0]) / change >= 0.5)
    return float(reached[0] / (z.size - 1)) if reached.size else 1.0


def _per_run(name: str, loc: Any, scale: Any, centred: np.ndarray) -> Any:
    """A per-run parameter vector, centred for the runs flagged in ``centred`` and non-centred for the rest."""
    import pymc as pm
    import pytensor.tensor as pt

    n = centred.size
    loc = loc * pt.ones(n)
    scale = scale * pt.ones(n)
    if centred.all():
        return pm.Normal(CENTRED[name], loc, scale, dims="run")
    if not centred.any():
        return loc + scale * pm.Normal(OFFSETS[name], 0, 1, dims="run")
    c, nc = np.flatnonzero(centred), np.flatnonzero(~centred)
    value = pt.zeros(n)
    value = pt.set_subtensor(value[c], pm.Normal(CENTRED[name], loc[c], scale[c], shape=c.size))
    return pt.set_subtensor(value[nc], loc[nc] + scale[nc] * pm.Normal(OFFSETS[name], 0, 1, shape=nc.size))


def simulate(config: ModelConfig, t: np.ndarray, params: Mapping[str, np.ndarray], rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Posterior predictive of a run's logged rewards at progress ``t`` (one step per point).

    Parameters
    ----------
    config : ModelConfig
        The fitted model's settings.
    t : ndarray
        Normalised progress of the logged steps.
    params : mapping
        Per-draw ``r0, gain, tau, sigma`` (and ``beta``; 1 when absent), 1-D arrays.
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
