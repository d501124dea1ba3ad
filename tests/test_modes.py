"""The batched mode search: BFGS over many problems at once, and the runs' log posteriors stacked for it."""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.optimize import minimize

import bayes_grpo as bg
from bayes_grpo.forecast import condition, condition_many, forecast_many
from bayes_grpo.forecast.conditioning import _RunConditioning
from bayes_grpo.forecast.modes import StackedPosterior, batched_bfgs, laplace_modes
from bayes_grpo.prepare import prepare_run


@pytest.fixture(scope="module")
def model() -> bg.FittedModel:
    return bg.default_model()


def _runs(n_runs: int, seed: int = 0) -> list[bg.RunLog]:
    """Noisy saturating climbs of different lengths (long logs: a sharp posterior), the last on a declared 0-1 range."""
    rng = np.random.default_rng(seed)
    runs = []
    for i in range(n_runs):
        n = int(rng.integers(60, 900))
        t = np.arange(1, n + 1) / 1000
        rewards = 0.1 + rng.uniform(0.2, 0.6) / (1 + (rng.uniform(0.1, 0.5) / t) ** 3) + 0.05 * rng.standard_normal(n)
        frame = pd.DataFrame({"step": np.arange(1, n + 1), "reward": rewards})
        bounds = (0.0, 1.0) if i == n_runs - 1 else None
        runs.append(bg.read_log(frame, run_id=f"run-{i}", family="qwen", params_b=1.5, total_steps=1000, reward_range=bounds))
    return runs


def _quadratics(x: np.ndarray, problems: np.ndarray, centres: np.ndarray, precisions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    d = x - centres[problems]
    hd = np.einsum("nij,nj->ni", precisions[problems], d)
    return 0.5 * np.einsum("ni,ni->n", d, hd), hd


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 6), st.integers(1, 5), st.integers(0, 2**31 - 1), st.floats(0.0, 4.0))
def test_batched_bfgs_finds_the_minimum_of_every_quadratic_at_once(n_problems, dim, seed, log_condition) -> None:
    """Independent quadratics with scales a thousand-fold apart: each minimiser within tolerance of its centre."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(0, 3, (n_problems, dim))
    rotations = [np.linalg.qr(rng.standard_normal((dim, dim)))[0] for _ in range(n_problems)]
    eigen = 10 ** rng.uniform(0, log_condition, (n_problems, dim))
    precisions = np.stack([q * e @ q.T for q, e in zip(rotations, eigen)])
    x, value = batched_bfgs(lambda x, p: _quadratics(x, p, centres, precisions), rng.normal(0, 3, (n_problems, dim)), tolerance=1e-8, max_iterations=200)
    np.testing.assert_allclose(x, centres, atol=1e-5)
    np.testing.assert_allclose(value, 0.0, atol=1e-8)


def test_batched_bfgs_matches_scipy_on_rosenbrock_and_stays_out_of_a_forbidden_region() -> None:
    """Curved valleys from different starts reach SciPy's minimiser; a step into a region of infinite value is shortened."""

    def rosenbrock(x: np.ndarray, problems: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        a, b = x[:, 0], x[:, 1]
        value = (1 - a) ** 2 + 100 * (b - a**2) ** 2
        gradient = np.column_stack([-2 * (1 - a) - 400 * a * (b - a**2), 200 * (b - a**2)])
        forbidden = a > 1.2  # beyond it the value is infinite: a support boundary
        return np.where(forbidden, np.inf, value), gradient

    starts = np.array([[-1.2, 1.0], [0.0, 0.0], [1.1, 1.3], [-0.5, 2.0]])
    x, _ = batched_bfgs(rosenbrock, starts, tolerance=1e-6, max_iterations=500)
    for start, found in zip(starts, x):
        reference = minimize(lambda v: rosenbrock(v[None], np.zeros(1))[0][0], start, method="BFGS").x
        np.testing.assert_allclose(found, reference, atol=1e-3)
        assert found[0] <= 1.2


def test_stacked_posteriors_are_each_runs_log_posterior_up_to_a_constant(model) -> None:
    """Runs of different lengths (padded) and one on a declared range, evaluated together, give what each run's own
    density gives, up to a constant per run; the bounded run's curves that leave its range have no density."""
    states = [_RunConditioning(model, prepare_run(run), 300, seed) for seed, run in enumerate(_runs(4))]
    for state in states:
        state.from_prior()
    posterior = StackedPosterior(model.model_config, [state.density() for state in states])
    rng = np.random.default_rng(0)
    theta = np.stack([state.prior.sample(rng, 50) for state in states])
    theta[-1, :5, 0] = 1.5  # a start above the declared range
    stacked = posterior(theta, np.arange(len(states)))
    for state, values, points in zip(states, stacked, theta):
        own = state.log_post(points)
        np.testing.assert_array_equal(np.isfinite(values), np.isfinite(own))
        difference = values[np.isfinite(own)] - own[np.isfinite(own)]
        assert np.ptp(difference) < 1e-9
    assert np.all(stacked[-1, :5] == -np.inf)


def test_batched_modes_are_scipys_modes(model) -> None:
    """Every run's mode from the batched search is where SciPy's BFGS on that run's own log posterior ends."""
    states = [_RunConditioning(model, prepare_run(run), 1500, seed) for seed, run in enumerate(_runs(6, seed=1))]
    pending = [state for state in states if state.from_prior() is None]
    assert len(pending) >= 4  # long logs: the prior's particles are not enough
    posterior = StackedPosterior(model.model_config, [state.density() for state in pending])
    modes, covs = laplace_modes(posterior, np.stack([s.starts for s in pending]), np.stack([s.fallback_cov for s in pending]))
    for state, mode, cov in zip(pending, modes, covs):
        best = min((minimize(lambda x: -state.log_post(x[None])[0], x0, method="BFGS", options={"gtol": 1e-4}) for x0 in state.starts), key=lambda r: r.fun)
        assert -state.log_post(mode[None])[0] <= best.fun + 1e-3
        np.testing.assert_allclose(mode, best.x, atol=2e-3)
        assert np.all(np.linalg.eigvalsh(cov) > 0)


def test_forecasts_made_together_are_the_forecasts_made_one_by_one(model) -> None:
    """forecast_many (what rank uses) gives each run the forecast that forecast gives it with the same seed, to rounding
    (the runs' logs are padded to the longest in the stacked density, which changes the order of a sum)."""
    runs = _runs(5, seed=2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        together = forecast_many(model, runs, seeds=[7, 8, 9, 10, 11], n_draws=300, n_particles=1000, grid_points=50, n_jobs=2)
        alone = [model.forecast(run, seed=seed, n_draws=300, n_particles=1000, grid_points=50) for run, seed in zip(runs, [7, 8, 9, 10, 11])]
    for a, b in zip(together, alone):
        np.testing.assert_allclose(a.draws, b.draws, rtol=1e-6, atol=1e-9)
        assert a.proposal == b.proposal and a.ess == pytest.approx(b.ess, rel=1e-6)
    with pytest.raises(bg.ModelError, match="one seed per run"):
        forecast_many(model, runs, seeds=[1, 2])


def test_condition_of_one_run_is_its_share_of_conditioning_many(model) -> None:
    prepared = prepare_run(_runs(3, seed=3)[1])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        alone = condition(model, prepared, n_particles=800, seed=4)
    together = condition_many(model, [prepare_run(run) for run in _runs(3, seed=3)], n_particles=800, seeds=[9, 4, 5])[1]
    with pytest.raises(bg.ModelError, match="one seed per run"):
        condition_many(model, [prepared], seeds=[1, 2])
    np.testing.assert_allclose(alone.theta, together.theta, rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(alone.log_weights, together.log_weights, rtol=1e-6, atol=1e-9)


def test_conditioning_many_stays_in_threads_under_a_process_backend(model) -> None:
    """A joblib process backend in force (a CV fold on Dask or loky) does not take the per-run work away from the
    states it fills in place: the same particles as without it."""
    from joblib import parallel_config

    runs = [prepare_run(run) for run in _runs(3, seed=4)]
    plain = condition_many(model, runs, n_particles=500, seeds=[1, 2, 3], n_jobs=2)
    with parallel_config(backend="loky", n_jobs=2):
        under_processes = condition_many(model, runs, n_particles=500, seeds=[1, 2, 3], n_jobs=2)
    for a, b in zip(plain, under_processes):
        np.testing.assert_array_equal(a.theta, b.theta)
