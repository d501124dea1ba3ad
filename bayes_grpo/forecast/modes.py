"""Posterior modes of many runs at once: the Laplace step of :func:`~bayes_grpo.forecast.conditioning.condition`, batched.

A run whose prior particles cannot carry its log (a long log: a sharp posterior) gets a Laplace proposal: the mode of
its log posterior (BFGS from its two best particles) and the curvature there. One run's density at the dozen points a
gradient needs is little arithmetic, so SciPy's optimizer spent most of its time in per-call overhead, and ranking a
sweep paid it once per run. Here the runs' log posteriors are stacked (:class:`StackedPosterior`: each run's binned
log, padded to the longest, and its prior's mixture constants), and every BFGS iteration moves every start of every
run at once (:func:`batched_bfgs`); the Hessians at the modes are taken in one evaluation too (:func:`laplace_modes`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from bayes_grpo.config import ModelConfig
from bayes_grpo.population import PARAMS, in_support, logsumexp_rows, natural, normal_logpdf, observation, student_t_logpdf

#: Step of the central-difference gradient the mode search follows.
GRADIENT_STEP = 1e-5
#: The search stops where every gradient entry is at most this (SciPy's BFGS ``gtol``, infinity norm), or after
#: :data:`MAX_ITERATIONS` iterations.
GRADIENT_TOLERANCE, MAX_ITERATIONS = 1e-2, 40
#: Steps of the finite-difference Hessian, tried in turn until all its points are finite.
HESSIAN_STEPS = (1e-3, 1e-4, 1e-5, 1e-6)
#: Armijo's sufficient-decrease constant, and how many times a step is shortened before a start is given up.
_ARMIJO, _MAX_BACKTRACKS = 1e-4, 30
#: Step of the second differences that start each inverse Hessian (:func:`laplace_modes`).
CURVATURE_STEP = 1e-3


@dataclass(frozen=True)
class RunDensity:
    """What one run's log posterior is made of, in the form :class:`StackedPosterior` stacks.

    Attributes
    ----------
    t, z, counts : ndarray
        The run's binned log (:func:`bayes_grpo.prepare.bin_observations`).
    bounded : bool
        Whether the run's curve must start and end within a declared reward range (:func:`bayes_grpo.population.in_support`).
    mixture_coef, mixture_offset : ndarray
        The prior's population mixture: component log densities are ``offset + [theta**2, theta] @ coef``.
    wide_mean, wide_sd : ndarray
        The prior's wide Normal component; ``wide_share`` its weight.
    wide_share : float
    """

    t: np.ndarray
    z: np.ndarray
    counts: np.ndarray
    bounded: bool
    mixture_coef: np.ndarray
    mixture_offset: np.ndarray
    wide_mean: np.ndarray
    wide_sd: np.ndarray
    wide_share: float


class StackedPosterior:
    """The log posteriors of several runs, evaluated together: ``theta`` (problems, points, params), each problem one run's.

    The likelihood is the forecast's (Student-t bins, :func:`bayes_grpo.population.log_likelihood`) and the prior its
    robust mixture (:class:`~bayes_grpo.forecast.conditioning.RobustPrior`), up to a constant per run.
    """

    def __init__(self, config: ModelConfig, runs: Sequence[RunDensity]):
        self.config = config
        width = max(max(run.t.size for run in runs), 1)
        self.t = np.zeros((len(runs), width))
        self.z = np.zeros((len(runs), width))
        self.root = np.zeros((len(runs), width))  # sqrt(count): 0 at the padding, which then adds nothing
        self.bin_of = np.zeros((len(runs), width))
        for i, run in enumerate(runs):
            n = run.t.size
            self.t[i, :n], self.z[i, :n], self.root[i, :n], self.bin_of[i, :n] = run.t, run.z, np.sqrt(run.counts), 1.0
        self.bounded = np.array([run.bounded for run in runs])
        self.coef = np.stack([run.mixture_coef for run in runs])
        self.offset = np.stack([run.mixture_offset for run in runs])
        self.wide_mean = np.stack([run.wide_mean for run in runs])
        self.wide_sd = np.stack([run.wide_sd for run in runs])
        with np.errstate(divide="ignore"):  # a prior without its wide component: log 0 = -inf, as meant
            self.log_shares = np.log([[1.0 - run.wide_share, run.wide_share] for run in runs])

    def __call__(self, theta: np.ndarray, owner: np.ndarray) -> np.ndarray:
        """Log posterior (up to a constant per run) of ``theta`` (problems, points, params); ``owner``: each problem's run.

        A point so far out that its curve overflows gets a non-finite value, without a warning: the mode search
        counts it as a failed step.
        """
        with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
            return self._log_posterior(theta, owner)

    def _log_posterior(self, theta: np.ndarray, owner: np.ndarray) -> np.ndarray:
        config = self.config
        params = natural({name: theta[..., j : j + 1] for j, name in enumerate(PARAMS)}, config)
        root = self.root[owner][:, None, :]
        mu, noise = observation(config, self.t[owner][:, None, :], 1.0, params)
        log_lik = np.sum(student_t_logpdf(self.z[owner][:, None, :] * root, config.student_nu, mu * root, noise) * self.bin_of[owner][:, None, :], axis=2)
        bounded = self.bounded[owner]
        if bounded.any():
            inside = in_support(config, theta.reshape(-1, theta.shape[-1]), "range").reshape(theta.shape[:2])
            log_lik = np.where(bounded[:, None] & ~inside, -np.inf, log_lik)
        population = logsumexp_rows(self.offset[owner][:, None, :] + np.matmul(np.concatenate([theta**2, theta], axis=-1), self.coef[owner]))
        wide = normal_logpdf(theta, self.wide_mean[owner][:, None, :], self.wide_sd[owner][:, None, :])
        shares = self.log_shares[owner]
        return log_lik + np.logaddexp(shares[:, :1] + population, shares[:, 1:] + wide)


def batched_bfgs(
    value_and_gradient: Callable[[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]],
    starts: np.ndarray,
    inverse_hessian: np.ndarray | None = None,
    tolerance: float = GRADIENT_TOLERANCE,
    max_iterations: int = MAX_ITERATIONS,
) -> tuple[np.ndarray, np.ndarray]:
    """Minimise many independent smooth functions at once by BFGS with a backtracking (Armijo) line search.

    ``value_and_gradient(x, problems)`` gives the values and gradients of the functions ``problems`` (indices) at the
    rows of ``x``; a non-finite value counts as a failed step. Each problem stops on its own (gradient infinity norm at
    most ``tolerance``, or a step that no backtracking makes acceptable); at most ``max_iterations`` iterations. A step
    too long is shortened to the minimum of the quadratic through the value and slope at the start and the value at
    the step (safeguarded to 10-50% of it). ``inverse_hessian`` (problems, dim, dim) is where the inverse Hessians
    start; without it, the first step of each problem has unit length along its gradient (SciPy's first guess), and
    the inverse Hessian starts as the identity scaled by the first step's curvature (Nocedal and Wright, eq. 6.20).

    Returns
    -------
    (ndarray, ndarray)
        The minimisers (problems, dim) and the values there.
    """
    x = np.array(starts, dtype=float)
    n, dim = x.shape
    value, gradient = value_and_gradient(x, np.arange(n))
    first = np.full(n, inverse_hessian is None)
    inverse_hessian = np.tile(np.eye(dim), (n, 1, 1)) if inverse_hessian is None else np.array(inverse_hessian, dtype=float)
    active = np.isfinite(value) & (np.max(np.abs(gradient), axis=1) > tolerance)
    for _ in range(max_iterations):
        problems = np.flatnonzero(active)
        if problems.size == 0:
            break
        direction = -np.einsum("nij,nj->ni", inverse_hessian[problems], gradient[problems])
        slope = np.einsum("ni,ni->n", direction, gradient[problems])
        uphill = slope >= 0  # a lost descent direction: back to the gradient
        direction[uphill], slope[uphill] = -gradient[problems][uphill], -np.sum(gradient[problems][uphill] ** 2, axis=1)
        step = np.where(first[problems] | uphill, 1.0 / np.maximum(np.linalg.norm(direction, axis=1), 1e-12), 1.0)
        new_x, new_value, new_gradient = x[problems].copy(), value[problems].copy(), gradient[problems].copy()
        pending = np.ones(problems.size, bool)
        for _ in range(_MAX_BACKTRACKS):
            trying = np.flatnonzero(pending)
            trial = x[problems[trying]] + step[trying, None] * direction[trying]
            trial_value, trial_gradient = value_and_gradient(trial, problems[trying])
            good = np.isfinite(trial_value) & (trial_value <= value[problems[trying]] + _ARMIJO * step[trying] * slope[trying])
            accepted = trying[good]
            new_x[accepted], new_value[accepted], new_gradient[accepted] = trial[good], trial_value[good], trial_gradient[good]
            pending[accepted] = False
            bad, step_now = trying[~good], step[trying[~good]]
            rise = np.where(np.isfinite(trial_value[~good]), trial_value[~good] - value[problems[bad]] - slope[bad] * step_now, np.inf)
            with np.errstate(divide="ignore", invalid="ignore"):
                shortened = -slope[bad] * step_now**2 / (2 * rise)
            step[bad] = np.clip(np.nan_to_num(shortened, nan=0.1 * step_now), 0.1 * step_now, 0.5 * step_now)
            if not pending.any():
                break
        active[problems[pending]] = False  # no acceptable step along its direction: as far as it goes
        moved = problems[~pending]
        s, y = new_x[~pending] - x[moved], new_gradient[~pending] - gradient[moved]
        curvature = np.einsum("ni,ni->n", s, y)
        update = curvature > 1e-10
        rescale = first[moved] & update
        inverse_hessian[moved[rescale]] *= (curvature[rescale] / np.sum(y[rescale] ** 2, axis=1))[:, None, None]
        for k in np.flatnonzero(update):  # the BFGS update of the inverse Hessian (Nocedal and Wright, eq. 6.17)
            rho, h = 1.0 / curvature[k], inverse_hessian[moved[k]]
            left = np.eye(dim) - rho * np.outer(s[k], y[k])
            inverse_hessian[moved[k]] = left @ h @ left.T + rho * np.outer(s[k], s[k])
        x[moved], value[moved], gradient[moved] = new_x[~pending], new_value[~pending], new_gradient[~pending]
        first[moved] = False
        active[moved] &= np.max(np.abs(gradient[moved]), axis=1) > tolerance
    return x, value


def laplace_modes(posterior: StackedPosterior, starts: np.ndarray, fallback_cov: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Every run's posterior mode (the best of its starts) and a positive-definite inverse-Hessian covariance there, times 1.5.

    Parameters
    ----------
    posterior : StackedPosterior
        The runs' log posteriors.
    starts : ndarray
        (runs, starts per run, params): where each run's searches begin.
    fallback_cov : ndarray
        (runs, params, params): the covariance of a run whose Hessian cannot be taken even with the smallest of
        :data:`HESSIAN_STEPS` (its mode sits on a boundary of the support, e.g. a declared reward range).

    Returns
    -------
    (ndarray, ndarray)
        Modes (runs, params) and covariances (runs, params, params).
    """
    n_runs, per_run, dim = starts.shape
    owner_of = np.repeat(np.arange(n_runs), per_run)
    directions = np.vstack([np.zeros(dim), np.eye(dim), -np.eye(dim)])  # the centre, then +/- each parameter
    stencil = directions * GRADIENT_STEP

    def value_and_gradient(x: np.ndarray, problems: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        # Value and central-difference gradient from one evaluation. A forward difference's error (h times the
        # curvature) exceeds the tolerance on a sharp posterior (a long log).
        values = posterior(x[:, None, :] + stencil, owner_of[problems])
        finite = np.all(np.isfinite(values), axis=1)
        with np.errstate(invalid="ignore"):  # -inf - -inf where the stencil leaves the support: masked just below
            gradient = -(values[:, 1 : dim + 1] - values[:, dim + 1 :]) / (2 * GRADIENT_STEP)
        return np.where(finite, -values[:, 0], np.inf), np.where(finite[:, None], gradient, 0.0)

    # The inverse Hessians start diagonal, from the curvature along each parameter at the start (the second differences
    # of one stencil): a sharp posterior's scale differs by orders of magnitude between parameters and runs.
    x0 = starts.reshape(-1, dim)
    with np.errstate(invalid="ignore"):
        around = posterior(x0[:, None, :] + directions * CURVATURE_STEP, owner_of)
        curvature = -(around[:, 1 : dim + 1] + around[:, dim + 1 :] - 2 * around[:, :1]) / CURVATURE_STEP**2
    usable = np.isfinite(curvature) & (curvature > 1e-6)
    scale = np.where(usable, 1.0 / np.where(usable, curvature, 1.0), 1.0)
    x, value = batched_bfgs(value_and_gradient, x0, scale[:, :, None] * np.eye(dim))
    best = np.argmin(np.where(np.isfinite(value), value, np.inf).reshape(n_runs, per_run), axis=1)
    modes = x.reshape(n_runs, per_run, dim)[np.arange(n_runs), best]
    covs = np.array(fallback_cov, dtype=float, copy=True)
    todo = np.arange(n_runs)
    # A mode on (or within a step of) a boundary of the support has -inf neighbours: the Hessian is retaken with steps
    # ten times smaller until every point is inside (a run whose curve, extrapolated, would leave its declared range).
    for h in HESSIAN_STEPS:
        precision = _precisions(posterior, modes[todo], todo, h)
        finite = np.all(np.isfinite(precision), axis=(1, 2))
        for run, matrix in zip(todo[finite], precision[finite]):
            eigval, eigvec = np.linalg.eigh(matrix)
            covs[run] = (eigvec / np.clip(eigval, 1e-2, 1e8)) @ eigvec.T * 1.5
        todo = todo[~finite]
        if todo.size == 0:
            break
    return modes, covs


def _precisions(posterior: StackedPosterior, modes: np.ndarray, owner: np.ndarray, h: float) -> np.ndarray:
    """Minus the central-difference Hessians of the runs ``owner``'s log posteriors at ``modes``, symmetrised (one evaluation)."""
    dim = modes.shape[1]
    eye = np.eye(dim) * h
    pairs = [(i, j) for i in range(dim) for j in range(dim)]
    offsets = np.array([eye[i] * a + eye[j] * b for i, j in pairs for a, b in ((1, 1), (1, -1), (-1, 1), (-1, -1))])
    with np.errstate(invalid="ignore"):  # -inf on a support boundary: the caller retries with a smaller step
        values = posterior(modes[:, None, :] + offsets, owner).reshape(len(owner), dim, dim, 4)
        hessian = (values[..., 0] - values[..., 1] - values[..., 2] + values[..., 3]) / (4 * h * h)
    return -(hessian + np.swapaxes(hessian, 1, 2)) / 2
