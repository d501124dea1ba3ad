"""Condition one run on its logged steps: importance sampling from the population posterior, with fallbacks.

:func:`condition` samples the run's robust prior (:class:`RobustPrior`: the population
predictive for its covariates, a mixture over a fixed subset of population draws, mixed with a
wide component), falls back to a Laplace/multivariate-t proposal and then to a
Metropolis-placed mixture when the weights degenerate, and measures every attempt with
Pareto-smoothed importance sampling (ArviZ).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import arviz as az
import numpy as np
from scipy.special import gammaln

from bayes_grpo.errors import ModelError
from bayes_grpo.forecast.modes import RunDensity, StackedPosterior, laplace_modes
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
#: Rounds of kernels on the weighted particles (each on the best particles so far) tried before the Metropolis run.
PARTICLE_ROUNDS = 2
#: Kernels of the fallback mixtures (on the weighted particles, on the Metropolis chains), and their width
#: relative to the spread of the particles or chains.
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
       two best particles, finite-difference Hessian: :mod:`bayes_grpo.forecast.modes`),
       mixed with the prior (defensive importance sampling keeps a "not taken off yet"
       mode that has mass), then refitted once to the weighted particles (moment matching).
    3. ``"particles"``: a mixture of t kernels on the best weighted particles so
       far, mixed with the prior, as in 2 (one adaptive importance-sampling step).
    4. ``"mcmc"``: a short random-walk Metropolis run on the run's log posterior
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
    conditioned = condition_many(model, [prepared], n_particles=n_particles, seeds=[seed])[0]
    warn_if_poor(conditioned, prepared, n_particles)
    return conditioned


def condition_many(
    model: PopulationPosterior,
    runs: Sequence[PreparedRun],
    *,
    n_particles: int = N_PARTICLES,
    seeds: Sequence[int],
    n_jobs: int = 1,
) -> list[Conditioning]:
    """:func:`condition` for several runs at once, each with its own seed: the particles of one call per run, to rounding.

    The posterior modes the runs' Laplace proposals need are searched together (:func:`~bayes_grpo.forecast.modes.laplace_modes`:
    one batched BFGS over every run), the per-run work goes to ``n_jobs`` threads (joblib). Nothing is warned:
    :func:`warn_if_poor` says which weights stayed poor.
    """
    from joblib import Parallel, delayed

    if len(seeds) != len(runs):
        raise ModelError(f"condition_many needs one seed per run: got {len(seeds)} seeds for {len(runs)} runs")
    parallel = Parallel(n_jobs=max(1, n_jobs), require="sharedmem")  # threads: the runs' states are filled in place
    states = [_RunConditioning(model, prepared, n_particles, seed) for prepared, seed in zip(runs, seeds)]
    from_prior: list[Conditioning | None] = list(parallel(delayed(state.from_prior)() for state in states))
    pending = [i for i, result in enumerate(from_prior) if result is None]
    from_mode: dict[int, Conditioning] = {}
    if pending:
        posterior = StackedPosterior(model.model_config, [states[i].density() for i in pending])
        modes, covs = laplace_modes(posterior, np.stack([states[i].starts for i in pending]), np.stack([states[i].fallback_cov for i in pending]))
        from_mode = dict(zip(pending, parallel(delayed(states[i].from_mode)(mode, cov) for i, mode, cov in zip(pending, modes, covs))))
    return [from_mode[i] if result is None else result for i, result in enumerate(from_prior)]


def warn_if_poor(conditioned: Conditioning, prepared: PreparedRun, n_particles: int, stacklevel: int = 2) -> None:
    """Warn when a run's best weights have k-hat above :data:`PARETO_K_MAX` or fewer than :data:`MIN_ESS_WARN` effective particles."""
    if conditioned.pareto_k > PARETO_K_MAX or conditioned.ess < MIN_ESS_WARN:
        warnings.warn(
            f"forecast of run {prepared.run_id!r}: the importance weights stay poor after every proposal "
            f"(ESS {conditioned.ess:.0f} of {n_particles} particles, Pareto k-hat {conditioned.pareto_k:.2f}, "
            f"proposal {conditioned.proposal!r}); its intervals may be too narrow",
            UserWarning,
            stacklevel=stacklevel + 1,
        )


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


class _RunConditioning:
    """The proposals of :func:`condition` for one run, in two parts around the mode search that :func:`condition_many` batches."""

    def __init__(self, model: PopulationPosterior, prepared: PreparedRun, n_particles: int, seed: int):
        self.rng = np.random.default_rng(seed)
        self.config = model.model_config
        self.prepared, self.n_particles = prepared, n_particles
        self.prior = RobustPrior(RunPrior(_thinned(model, self.rng, PRIOR_COMPONENTS), prepared, self.rng, n_components=PRIOR_COMPONENTS), WIDE_SHARE, WIDE_SCALE)
        self.t, self.z, self.counts = bin_observations(prepared.t, prepared.z, self.config.forecast_bins)
        self.attempts: list[Conditioning] = []

    def log_lik(self, theta: np.ndarray) -> np.ndarray:
        # A declared reward range bounds where the curve can start and end.
        return np.where(in_support(self.config, theta, self.prepared.kind), log_likelihood(self.config, theta, self.t, self.z, self.counts), -np.inf)

    def log_post(self, theta: np.ndarray) -> np.ndarray:
        return self.log_lik(theta) + self.prior.logpdf(theta)

    def measured(self, attempt: Conditioning) -> Conditioning:
        return replace(attempt, outside_population=float(np.exp(attempt.log_weights) @ self.prior.wide_share(attempt.theta)))

    def from_prior(self) -> Conditioning | None:
        """Step 1: the prior's particles; None when they are not enough, with the mode search's starts and fallback covariance set."""
        theta = self.prior.sample(self.rng, self.n_particles)
        log_l = self.log_lik(theta)
        self.attempts = [_smoothed(theta, log_l, "prior")]
        if self.attempts[0].reliable and self.attempts[0].ess >= 0.25 * self.n_particles:
            return self.measured(self.attempts[0])
        self.fallback_cov = _weighted_cov(theta, self.attempts[0].log_weights) + np.diag(np.full(len(PARAMS), 1e-4))
        self.starts = theta[np.argsort(log_l)[-2:]]
        return None

    def density(self) -> RunDensity:
        """The run's log posterior in the form the batched mode search stacks."""
        coef, offset = self.prior.population.mixture_constants
        return RunDensity(self.t, self.z, self.counts, self.prepared.kind == "range", coef, offset, self.prior.wide_mean, self.prior.wide_sd, self.prior.share)

    def from_mode(self, mode: np.ndarray, cov: np.ndarray) -> Conditioning:
        """Steps 2 and 3, from the posterior mode and Laplace covariance; the first reliable attempt, else the best one."""
        rng, prior, n_particles, attempts = self.rng, self.prior, self.n_particles, self.attempts
        for _ in range(2):
            n_local = int((1 - DEFENSIVE_SHARE) * n_particles)
            theta = np.vstack([_mvt_sample(rng, mode, cov, n_local), prior.sample(rng, n_particles - n_local)])
            log_prior = prior.logpdf(theta)
            log_q = np.logaddexp(np.log1p(-DEFENSIVE_SHARE) + _mvt_logpdf(theta, mode, cov), np.log(DEFENSIVE_SHARE) + log_prior)
            attempts.append(_smoothed(theta, log_prior + self.log_lik(theta) - log_q, "laplace"))
            if attempts[-1].reliable:
                return self.measured(attempts[-1])
            mode = np.exp(attempts[-1].log_weights) @ theta
            cov = _weighted_cov(theta, attempts[-1].log_weights) * 1.5 + np.diag(np.full(len(PARAMS), 1e-8))

        for _ in range(PARTICLE_ROUNDS):
            attempts.append(_particle_mixture(rng, prior, self.log_lik, max(attempts, key=_quality), n_particles))
            if attempts[-1].reliable:
                return self.measured(attempts[-1])
        for _ in range(MCMC_ROUNDS):
            attempts.append(_mcmc_mixture(rng, prior, self.log_lik, self.log_post, max(attempts, key=_quality), n_particles))
            if attempts[-1].reliable:
                return self.measured(attempts[-1])
        return self.measured(max(attempts, key=_quality))


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
    return _kernel_mixture(rng, prior, log_lik, centres, step_cov * KERNEL_BANDWIDTH**2, n_particles, "mcmc")


def _particle_mixture(
    rng: np.random.Generator, prior: RobustPrior, log_lik: Callable[[np.ndarray], np.ndarray], start: Conditioning, n_particles: int
) -> Conditioning:
    """Particles from a mixture of t kernels placed on the best weighted particles so far (step 3 of :func:`condition`).

    One adaptive importance-sampling step (population Monte Carlo, Cappe et al. 2004, JCGS 13(4)): the kernels sit
    where the weights already put the posterior, as wide as :func:`_mcmc_mixture`'s relative to its spread. It costs
    one proposal's densities where the Metropolis run costs about ten.
    """
    centres = start.theta[_systematic_resample(np.exp(start.log_weights), MIXTURE_KERNELS, rng)]
    cov = _weighted_cov(start.theta, start.log_weights) + np.diag(np.full(len(PARAMS), 1e-8))
    return _kernel_mixture(rng, prior, log_lik, centres, cov * KERNEL_BANDWIDTH**2, n_particles, "particles")


def _kernel_mixture(
    rng: np.random.Generator,
    prior: RobustPrior,
    log_lik: Callable[[np.ndarray], np.ndarray],
    centres: np.ndarray,
    kernel_cov: np.ndarray,
    n_particles: int,
    proposal: str,
) -> Conditioning:
    """Importance-sample from an equal-weight mixture of t kernels (one per row of ``centres``), mixed with the prior."""
    dim = centres.shape[1]
    n_local = int((1 - DEFENSIVE_SHARE) * n_particles)
    local = centres[rng.integers(0, centres.shape[0], n_local)] + _mvt_sample(rng, np.zeros(dim), kernel_cov, n_local)
    theta = np.vstack([local, prior.sample(rng, n_particles - n_local)])
    log_prior = prior.logpdf(theta)
    log_q = np.logaddexp(np.log1p(-DEFENSIVE_SHARE) + _mvt_mixture_logpdf(theta, centres, kernel_cov), np.log(DEFENSIVE_SHARE) + log_prior)
    return _smoothed(theta, log_prior + log_lik(theta) - log_q, proposal)


_T_DF = 5.0


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
