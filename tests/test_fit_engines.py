"""The JAX path of the fit (``sampler="numpyro"``): it runs on CPU, records its diagnostics and agrees with nutpie.

``bg.fit(..., sampler_config={"sampler": "numpyro"})`` goes through
``pm.sample(nuts_sampler="numpyro")``, the path that uses a GPU when JAX sees one.
Both fits here sample the same tiny data set: three runs simulated from known
curves with :func:`bayes_grpo.population.simulate`. Skipped when numpyro or jax
is not installed (``pip install .[jax]``).
"""

from __future__ import annotations

import warnings

import arviz as az
import numpy as np
import pandas as pd
import pytest

import bayes_grpo as bg
from bayes_grpo.config import ModelConfig
from bayes_grpo.population import simulate
from bayes_grpo.settings import quick_mode

pytest.importorskip("numpyro")
pytest.importorskip("jax")

pytestmark = pytest.mark.slow

STEPS = 200
#: Draws and tuning steps per chain: short under BAYES_GRPO_QUICK=1.
DRAWS = 150 if quick_mode() else 500
#: Known curves of the three runs (normalised reward on the declared range (0, 1)).
CURVES = {
    "r0": np.array([0.15, 0.25, 0.2]),
    "gain": np.array([0.5, 0.35, 0.6]),
    "tau": np.array([0.25, 0.4, 0.3]),
    "beta": np.array([2.0, 2.0, 2.0]),
    "sigma": np.array([0.05, 0.08, 0.06]),
}
#: Population means compared between the engines (range kind where per kind).
COMPARED = ("gain_mu", "tau_mu", "sig_mu")


def _simulated_runs() -> list[bg.RunLog]:
    """Three 200-step runs on the declared range (0, 1) drawn from :data:`CURVES`."""
    steps = np.arange(1, STEPS + 1)
    _, rewards = simulate(ModelConfig(), steps / STEPS, CURVES, np.random.default_rng(3))
    return [
        bg.read_log(
            pd.DataFrame({"step": steps, "reward": rewards[r]}),
            run_id=f"engine-sim-{r}",
            family="qwen",
            params_b=[0.5, 1.5, 3.0][r],
            total_steps=STEPS,
            reward_range=(0.0, 1.0),
        )
        for r in range(len(CURVES["r0"]))
    ]


def _fit(sampler: str, keep_full: bool = False) -> bg.FittedModel:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return bg.fit(
            _simulated_runs(),
            sampler_config={"sampler": sampler, "draws": DRAWS, "tune": DRAWS, "chains": 2, "seed": 1, "progressbar": False},
            keep_full=keep_full,
        )


@pytest.fixture(scope="module")
def numpyro_fit() -> bg.FittedModel:
    return _fit("numpyro", keep_full=True)


def _range_kind(draws):
    """The declared-range kind's values of a per-kind variable (others unchanged)."""
    return draws.isel(kind=0) if "kind" in draws.dims else draws


def test_numpyro_fit_records_its_engine_and_diagnostics(numpyro_fit) -> None:
    # Three runs do not pin the population's spreads, so the health of this fit is not the point
    # (that is the fast-fit benchmark's); the diagnostics must describe the draws numpyro returned.
    diag = numpyro_fit.diagnostics
    idata = numpyro_fit.idata
    assert diag.sampler == "numpyro"
    assert numpyro_fit.sampler_config.sampler == "numpyro"
    assert diag.seconds > 0
    assert dict(idata.posterior.sizes)["chain"] == 2 and dict(idata.posterior.sizes)["draw"] == DRAWS
    assert diag.divergences == int(idata.sample_stats["diverging"].sum())
    gain_mu = az.summary(idata, var_names=["gain_mu"], kind="diagnostics", round_to="none")  # unrounded, as the diagnostics are
    assert np.isfinite(diag.max_r_hat) and diag.max_r_hat >= float(gain_mu["r_hat"].max())
    assert 0 < diag.min_ess_bulk <= float(gain_mu["ess_bulk"].min())
    steps = next(idata.sample_stats[name] for name in ("n_steps", "num_steps") if name in idata.sample_stats)
    assert diag.steps_per_draw == pytest.approx(float(steps.mean("draw").max())) and diag.steps_per_draw >= 1
    assert "log_likelihood" in idata


def test_numpyro_posterior_is_sane(numpyro_fit) -> None:
    population = numpyro_fit.population
    for name, draws in population.data_vars.items():
        assert np.all(np.isfinite(draws.values)), name
    # The three runs rise by 0.35-0.6 of the range: the mean gain of the range kind is clearly positive.
    gain_mu = _range_kind(population["gain_mu"])
    assert float(gain_mu.quantile(0.05)) > 0
    # Their per-step noise is 0.05-0.08: the mean log sigma sits near log(0.06), not at the prior's edge.
    sig_mu = float(_range_kind(population["sig_mu"]).mean())
    assert np.log(0.02) < sig_mu < np.log(0.2)
    # The fitted model forecasts like any other.
    head = _simulated_runs()[0].head(60)
    forecast = numpyro_fit.forecast(head, total_steps=STEPS, seed=0)
    assert forecast.draws.shape[-1] == forecast.steps.size
    assert np.all(np.isfinite(forecast.draws))


def test_numpyro_and_nutpie_agree_on_population_means(numpyro_fit) -> None:
    pytest.importorskip("nutpie")
    nutpie_fit = _fit("nutpie")
    assert nutpie_fit.diagnostics.sampler == "nutpie"
    for name in COMPARED:
        a = _range_kind(numpyro_fit.population[name])
        b = _range_kind(nutpie_fit.population[name])
        spread = float(np.sqrt(a.var() + b.var()))
        assert abs(float(a.mean()) - float(b.mean())) < 0.6 * spread, (name, float(a.mean()), float(b.mean()), spread)
