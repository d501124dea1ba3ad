"""Condition one run on its logged steps: importance sampling from the population posterior, with fallbacks.

:func:`condition` samples the run's robust prior (:class:`RobustPrior`: the population
predictive for its covariates, a mixture over a fixed subset of population draws, mixed with a
wide component), falls back to a Laplace/multivariate-t proposal and then to a
Metropolis-placed mixture when the weights degenerate, and measures every attempt with
Pareto-smoothed importance sampling (ArviZ).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import arviz as az
import numpy as np
from scipy.special import gammaln

from bayes_grpo.population import (
    PARAMS, PopulationPosterior, RunPrior, in_support, log_likelihood, logsumexp_rows,
)  # fmt: skip
from bayes_grpo.prepare import PreparedRun, bin_observations


#: Population posterior draws the forecast prior is a mixture over (for sampling and density alike).
PRIOR_COMPONENTS = 128
#: Prior weight of the wide component of a run's prior (:class:`RobustPrior`).
WIDE_SHARE = 0.1
#: How much wider than the population predictive the wide component is (its SDs are multiplied by this).
WIDE_SCALE = 2.5
#: Importance-sampling particles per proposal.
N_PARTICLES = 3000
#: Pareto k-hat above this: the importance weights are unreliable (Vehtari et al. 2024, JMLR 25(72)).
PARETO_K_MAX = 0.7
#: Weights whose ESS is below this share of the particles make the sampler try a better proposal.
MIN_ESS_FRACTION = 0.1
#: A forecast warns only when its best weights have k-hat above PARETO_K_MAX or fewer effective
#: particles than this (quantiles of fewer are too rough to trust).
MIN_ESS_WARN = 100
#: Share of every local proposal drawn from the prior (defensive importance sampling).
DEFENSIVE_SHARE = 0.2
#: Chains and steps of the Metropolis run that places the fallback proposal, and how many such rounds
#: (each starts from the best particles so far) are tried before giving up.
MCMC_CHAINS, MCMC_STEPS, MCMC_ROUNDS = 400, 30, 3
#: Kernels of the fallback mixture, and their width relative to the chains' spread.
MIXTURE_KERNELS, KERNEL_BANDWIDTH = 64, 0.6


@dataclass(frozen=True)
class Conditioning:
    """Weighted parameter particles of one run given its logged steps, and how trustworthy the weights are.

    Attributes
    ----------
    theta : ndarray
        (n_particles, len(PARAMS)) unconstrained parameters.
    log_weights : ndarray
        Pareto-smoothed (PSIS), normalised log importance weights.
    ess : float
        Effective sample size of the smoothed weights, ``1 / sum(w^2)``.
    pareto_k : float
        Estimated shape k-hat of the generalised Pareto fitted to the largest raw weights
        (:func:`arviz.psislw`): at most 0.7 the weighted estimates are reliable, above it not.
    proposal : str
        Which proposal made the particles: ``"prior"``, ``"laplace"`` or ``"mcmc"`` (see :func:`condition`).
    outside_population : float
        Posterior probability that the run's parameters come from the wide component of its prior
        (:class:`RobustPrior`): near 1 when the population cannot explain the logged steps.
    """

    theta: np.ndarray
    log_weights: np.ndarray
    ess: float
    pareto_k: float
    proposal: str
    outside_population: float = 0.0

    @property
    def reliable(self) -> bool:
        """k-hat at most :data:`PARETO_K_MAX` and ESS at least :data:`MIN_ESS_FRACTION` of the particles."""
        return bool(self.pareto_k <= PARETO_K_MAX and self.ess >= MIN_ESS_FRACTION * self.theta.shape[0])


def _smoothed(theta: np.ndarray, log_w: np.ndarray, proposal: str) -> Conditioning:
    """PSIS-smooth raw log weights (ArviZ) and measure them: ESS and Pareto k-hat."""
    with warnings.catch_warnings():  # ArviZ warns on a large k-hat; condition() decides what to do about it
        warnings.simplefilter("ignore")
        smoothed, k_hat = az.psislw(np.asarray(log_w, dtype=float))
    smoothed = np.asarray(smoothed, dtype=float)
    ess = float(1.0 / np.sum(np.exp(2.0 * smoothed)))
    return Conditioning(theta=theta, log_weights=smoothed, ess=ess, pareto_k=float(k_hat), proposal=proposal)


class _ThinnedPopulation:
    """A population posterior restricted to a subset of its draws (the forecast prior's mixture components).

    Everything but :meth:`population_arrays` (families, sources, size centres,
    settings) is the wrapped model's own.
    """

    def __init__(self, model: PopulationPosterior, picks: np.ndarray):
        self._model = model
        self._arrays = {name: values[..., picks] for name, values in model.population_arrays().items()}

    def __getattr__(self, name: str) -> Any:
        return getattr(self._model, name)

    def population_arrays(self) -> dict[str, np.ndarray]:
        return self._arrays


def _thinned(model: PopulationPosterior, rng: np.random.Generator, n_draws: int) -> PopulationPosterior:
    """``model`` with ``n_draws`` of its posterior draws picked at random (the sample axis is last)."""
    n_total = next(iter(model.population_arrays().values())).shape[-1]
    if n_total <= n_draws:
        return model
    return _ThinnedPopulation(model, np.sort(rng.choice(n_total, size=n_draws, replace=False)))


def condition(
    model: PopulationPosterior,
    prepared: PreparedRun,
    *,
    n_particles: int = N_PARTICLES,
    seed: int = 0,
) -> Conditioning:
    """Importance-sample the run's parameters given its steps, with PSIS diagnostics.

    The prior is the population posterior predictive of the run's parameters,
    mixed over :data:`PRIOR_COMPONENTS` posterior draws picked at random; the
    same draws serve to sample it and to evaluate its density, so every weight
    is exactly ``prior * likelihood / proposal``. Proposals, in turn, until the
    weights are reliable (Pareto k-hat <= :data:`PARETO_K_MAX` and ESS >=
    :data:`MIN_ESS_FRACTION` of the particles):

    1. ``"prior"``: particles from the prior, weighted by the likelihood; kept
       when the weights stay spread out (ESS >= 25% of the particles), as they
       do for runs with few steps.
    2. ``"laplace"``: a multivariate t around the posterior mode (BFGS from the
       best particles, finite-difference Hessian), mixed with the prior
       (defensive importance sampling keeps a "not taken off yet" mode that has
       mass), then refitted once to the weighted particles (moment matching).
    3. ``"mcmc"``: a short random-walk Metropolis run on the run's log posterior
       (:data:`MCMC_CHAINS` chains from the best particles so far, the step
       covariance adapted halfway) places a mixture of t kernels on the
       posterior's actual shape (curved or multimodal posteriors defeat the
       Laplace step); mixed with the prior, as in 2. Up to
       :data:`MCMC_ROUNDS` rounds, each starting from the best particles so far.

    The attempt with the best weights is returned (reliable first, then the
    largest ESS); a ``UserWarning`` says so when its k-hat is above
    :data:`PARETO_K_MAX` or it has fewer than :data:`MIN_ESS_WARN` effective particles.

    Parameters
    ----------
    model : PopulationPosterior
        The fitted population.
    prepared : PreparedRun
        The run, normalised.
    n_particles : int
        Particles per proposal.
    seed : int
        Seed of the prior's components and of every proposal.

    Returns
    -------
    Conditioning
        Particles, PSIS-smoothed log weights, ESS, k-hat and the proposal used.
    """
    best = _best_attempt(model, prepared, n_particles, seed)
    if best.pareto_k > PARETO_K_MAX or best.ess < MIN_ESS_WARN:
        warnings.warn(
            f"forecast of run {prepared.run_id!r}: the importance weights stay poor after every proposal "
            f"(ESS {best.ess:.0f} of {n_particles} particles, Pareto k-hat {best.pareto_k:.2f}, "
            f"proposal {best.proposal!r}); its intervals may be too narrow",
            UserWarning,
            stacklevel=3,
        )
    return best


class RobustPrior:
    """A run's prior: the population predictive (:class:`~bayes_grpo.population.RunPrior`) mixed with a wide component.

    The wide component is a Normal with the population predictive's mean and its
    standard deviations times ``scale``, with prior weight ``share``. A run that looks
    like the population's runs keeps the population's sharp prior (the wide component's
    marginal likelihood is lower), while a run whose logged steps the population cannot
    explain moves to its own evidence: the posterior weight of the wide component,
    :meth:`wide_share`, says how far outside the population the run lies (a robust
    meta-analytic prior, Schmidli et al. 2014, Biometrics 70(4)).
    """

    def __init__(self, population: RunPrior, share: float = WIDE_SHARE, scale: float = WIDE_SCALE):
        rows = population.components
        mean, sd = population.mean[rows], population.sd[rows]
        self.population = population
        self.share = float(share)
        self.wide_mean = mean.mean(axis=0)
        self.wide_sd = scale * np.sqrt(np.mean(sd**2, axis=0) + mean.var(axis=0))

    def sample(self, rng: np.random.Generator, size: int) -> np.ndarray:
        """``size`` parameter vectors (rows) from the mixture."""
        theta = self.population.sample(rng, size)
        wide = rng.random(size) < self.share
        theta[wide] = self.wide_mean + self.wide_sd * rng.standard_normal((int(wide.sum()), len(PARAMS)))
        return theta

    def _wide_logpdf(self, theta: np.ndarray) -> np.ndarray:
        z = (theta - self.wide_mean) / self.wide_sd
        return -0.5 * np.sum(z**2, axis=1) - np.sum(np.log(self.wide_sd)) - 0.5 * len(PARAMS) * np.log(2 * np.pi)

    def logpdf(self, theta: np.ndarray) -> np.ndarray:
        """Log density of the mixture."""
        if self.share <= 0:
            return self.population.logpdf(theta)
        return np.logaddexp(np.log1p(-self.share) + self.population.logpdf(theta), np.log(self.share) + self._wide_logpdf(theta))

    def wide_share(self, theta: np.ndarray) -> np.ndarray:
        """Per particle, the probability that it comes from the wide component (its responsibility)."""
        if self.share <= 0:
            return np.zeros(theta.shape[0])
        return np.exp(np.log(self.share) + self._wide_logpdf(theta) - self.logpdf(theta))


def _best_attempt(model: PopulationPosterior, prepared: PreparedRun, n_particles: int, seed: int) -> Conditioning:
    """The proposals of :func:`condition` in turn; the first reliable attempt, else the best one."""
    rng = np.random.default_rng(seed)
    config = model.model_config
    prior = RobustPrior(RunPrior(_thinned(model, rng, PRIOR_COMPONENTS), prepared, rng, n_components=PRIOR_COMPONENTS), WIDE_SHARE, WIDE_SCALE)
    t, z, counts = bin_observations(prepared.t, prepared.z, config.forecast_bins)

    def measured(attempt: Conditioning) -> Conditioning:
        return replace(attempt, outside_population=float(np.exp(attempt.log_weights) @ prior.wide_share(attempt.theta)))

    def log_lik(theta: np.ndarray) -> np.ndarray:
        # A declared reward range bounds where the curve can start and end.
        return np.where(in_support(config, theta, prepared.kind), log_likelihood(config, theta, t, z, counts), -np.inf)

    def log_post(theta: np.ndarray) -> np.ndarray:
        return log_lik(theta) + prior.logpdf(theta)

    theta = prior.sample(rng, n_particles)
    log_l = log_lik(theta)
    attempts = [_smoothed(theta, log_l, "prior")]
    if attempts[0].reliable and attempts[0].ess >= 0.25 * n_particles:
        return measured(attempts[0])

    fallback = _weighted_cov(theta, attempts[0].log_weights) + np.diag(np.full(len(PARAMS), 1e-4))
    mode, cov = _laplace(log_post, theta[np.argsort(log_l)[-2:]], fallback)
    for _ in range(2):
        n_local = int((1 - DEFENSIVE_SHARE) * n_particles)
        theta = np.vstack([_mvt_sample(rng, mode, cov, n_local), prior.sample(rng, n_particles - n_local)])
        log_prior = prior.logpdf(theta)
        log_q = np.logaddexp(np.log1p(-DEFENSIVE_SHARE) + _mvt_logpdf(theta, mode, cov), np.log(DEFENSIVE_SHARE) + log_prior)
        attempts.append(_smoothed(theta, log_prior + log_lik(theta) - log_q, "laplace"))
        if attempts[-1].reliable:
            return measured(attempts[-1])
        mode = np.exp(attempts[-1].log_weights) @ theta
        cov = _weighted_cov(theta, attempts[-1].log_weights) * 1.5 + np.diag(np.full(len(PARAMS), 1e-8))

    for _ in range(MCMC_ROUNDS):
        attempts.append(_mcmc_mixture(rng, prior, log_lik, log_post, max(attempts, key=_quality), n_particles))
        if attempts[-1].reliable:
            return measured(attempts[-1])
    return measured(max(attempts, key=_quality))


def _quality(attempt: Conditioning) -> tuple[bool, float, float]:
    """Order of preference between attempts: reliable first, then k-hat at most the limit, then the larger ESS."""
    return attempt.reliable, attempt.pareto_k <= PARETO_K_MAX, attempt.ess


def _weighted_cov(theta: np.ndarray, log_weights: np.ndarray) -> np.ndarray:
    """Covariance of the rows of ``theta`` under normalised log weights (no small-sample correction)."""
    weights = np.exp(log_weights)
    centred = theta - weights @ theta
    return (centred * weights[:, None]).T @ centred


def _mcmc_mixture(
    rng: np.random.Generator,
    prior: RobustPrior,
    log_lik: Callable[[np.ndarray], np.ndarray],
    log_post: Callable[[np.ndarray], np.ndarray],
    start: Conditioning,
    n_particles: int,
) -> Conditioning:
    """Particles from a mixture of t kernels placed by a short Metropolis run on the log posterior (step 3 of :func:`condition`)."""
    dim = len(PARAMS)
    jitter = np.diag(np.full(dim, 1e-8))
    chains = start.theta[_systematic_resample(np.exp(start.log_weights), MCMC_CHAINS, rng)]
    step_cov = _weighted_cov(start.theta, start.log_weights) + np.diag(np.full(dim, 1e-6))
    current = log_post(chains)
    for phase in range(2):
        chol = np.linalg.cholesky(step_cov * 2.38**2 / dim + jitter)
        for _ in range(MCMC_STEPS // 2):
            proposed = chains + rng.standard_normal(chains.shape) @ chol.T
            proposed_lp = log_post(proposed)
            accept = np.log(rng.random(MCMC_CHAINS)) < proposed_lp - current
            chains[accept], current[accept] = proposed[accept], proposed_lp[accept]
        step_cov = np.cov(chains.T) + jitter  # adapted to the chains for the second half
    centres = chains[rng.choice(MCMC_CHAINS, size=MIXTURE_KERNELS, replace=False)]
    kernel_cov = step_cov * KERNEL_BANDWIDTH**2
    n_local = int((1 - DEFENSIVE_SHARE) * n_particles)
    local = centres[rng.integers(0, MIXTURE_KERNELS, n_local)] + _mvt_sample(rng, np.zeros(dim), kernel_cov, n_local)
    theta = np.vstack([local, prior.sample(rng, n_particles - n_local)])
    log_prior = prior.logpdf(theta)
    log_q = np.logaddexp(np.log1p(-DEFENSIVE_SHARE) + _mvt_mixture_logpdf(theta, centres, kernel_cov), np.log(DEFENSIVE_SHARE) + log_prior)
    return _smoothed(theta, log_prior + log_lik(theta) - log_q, "mcmc")


_T_DF = 5.0
#: Steps of the Laplace proposal's finite-difference Hessian, tried in turn until all its points are finite.
HESSIAN_STEPS = (1e-3, 1e-4, 1e-5, 1e-6)


def _laplace(log_post: Any, starts: np.ndarray, fallback_cov: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Mode of ``log_post`` (vectorised over rows) and a positive-definite inverse-Hessian covariance.

    Where the Hessian cannot be taken even with the smallest of :data:`HESSIAN_STEPS` (the mode
    sits on a boundary of the support, e.g. a declared reward range), ``fallback_cov`` is used instead.
    """
    from scipy.optimize import minimize

    dim, h = starts.shape[1], 1e-5
    steps = np.vstack([np.zeros(dim), np.eye(dim) * h, -np.eye(dim) * h])

    def objective(x: np.ndarray) -> tuple[float, np.ndarray]:
        # Value and central-difference gradient from one vectorised evaluation. A forward difference's
        # error (h times the curvature) exceeds gtol on a sharp posterior (a long log): BFGS then spent
        # over half its calls in line searches that could not make the gradient smaller.
        values = log_post(x[None] + steps)
        if not np.all(np.isfinite(values)):
            return 1e300, np.zeros(dim)
        return -values[0], -(values[1 : dim + 1] - values[dim + 1 :]) / (2 * h)

    best = min((minimize(objective, x0, jac=True, method="BFGS", options={"gtol": 1e-2, "maxiter": 40}) for x0 in starts), key=lambda r: r.fun)
    mode = best.x
    # A mode on (or within a step of) a boundary of the support has -inf neighbours: the Hessian is retaken
    # with steps ten times smaller until every point is inside (a run whose curve, extrapolated, would leave
    # its declared range sits there; the prior-particle covariance instead sent every proposal astray).
    for h in HESSIAN_STEPS:
        precision = _precision_at(log_post, mode, h)
        if np.all(np.isfinite(precision)):
            break
    else:
        return mode, fallback_cov
    eigval, eigvec = np.linalg.eigh(precision)
    eigval = np.clip(eigval, 1e-2, 1e8)
    cov = (eigvec / eigval) @ eigvec.T
    return mode, cov * 1.5


def _precision_at(log_post: Any, mode: np.ndarray, h: float) -> np.ndarray:
    """Minus the central-difference Hessian of ``log_post`` at ``mode`` with step ``h``, symmetrised (one vectorised call)."""
    dim = mode.size
    eye = np.eye(dim) * h
    points = [mode]
    for i in range(dim):
        for j in range(dim):
            points += [mode + eye[i] + eye[j], mode + eye[i] - eye[j], mode - eye[i] + eye[j], mode - eye[i] - eye[j]]
    with np.errstate(invalid="ignore"):  # -inf on a support boundary: the caller falls back
        values = log_post(np.array(points))
        hessian = np.empty((dim, dim))
        k = 1
        for i in range(dim):
            for j in range(dim):
                pp, pm_, mp, mm = values[k : k + 4]
                hessian[i, j] = (pp - pm_ - mp + mm) / (4 * h * h)
                k += 4
    return -(hessian + hessian.T) / 2


def _mvt_sample(rng: np.random.Generator, mode: np.ndarray, cov: np.ndarray, size: int) -> np.ndarray:
    chol = np.linalg.cholesky(cov)
    normal = rng.standard_normal((size, mode.size)) @ chol.T
    scale = np.sqrt(rng.chisquare(_T_DF, size) / _T_DF)
    return mode + normal / scale[:, None]


def _mvt_logpdf(x: np.ndarray, mode: np.ndarray, cov: np.ndarray) -> np.ndarray:
    chol = np.linalg.cholesky(cov)
    solved = np.linalg.solve(chol, (x - mode).T)
    maha = np.sum(solved**2, axis=0)
    dim = mode.size
    return (
        gammaln((_T_DF + dim) / 2)
        - gammaln(_T_DF / 2)
        - 0.5 * dim * np.log(_T_DF * np.pi)
        - np.sum(np.log(np.diag(chol)))
        - (_T_DF + dim) / 2 * np.log1p(maha / _T_DF)
    )


def _mvt_mixture_logpdf(x: np.ndarray, centres: np.ndarray, cov: np.ndarray) -> np.ndarray:
    """Log density of an equal-weight mixture of multivariate t kernels sharing ``cov``, one per row of ``centres``."""
    chol = np.linalg.cholesky(cov)
    x_w = np.linalg.solve(chol, x.T)  # whitened points (dim, n)
    c_w = np.linalg.solve(chol, centres.T)  # whitened centres (dim, m)
    maha = np.clip(np.sum(x_w**2, axis=0)[:, None] + np.sum(c_w**2, axis=0)[None] - 2.0 * np.einsum("ji,jk->ik", x_w, c_w), 0.0, None)  # not BLAS: no threads
    dim = centres.shape[1]
    log_norm = gammaln((_T_DF + dim) / 2) - gammaln(_T_DF / 2) - 0.5 * dim * np.log(_T_DF * np.pi) - np.sum(np.log(np.diag(chol)))
    return log_norm + logsumexp_rows(-(_T_DF + dim) / 2 * np.log1p(maha / _T_DF)) - np.log(centres.shape[0])


def _systematic_resample(weights: np.ndarray, n: int, rng: np.random.Generator) -> np.ndarray:
    positions = (rng.random() + np.arange(n)) / n
    return np.minimum(np.searchsorted(np.cumsum(weights), positions), weights.size - 1)
