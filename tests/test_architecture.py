"""Architecture checks: no import cycles, one-way data flow, one model definition everywhere.

The agreement test draws random parameter values and checks that the PyMC
log-density of the fitted model and the NumPy density used to condition one run
at forecast time (both derived from :mod:`bayes_grpo.population`) agree.
"""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import xarray as xr

import bayes_grpo as bg
from bayes_grpo.config import ModelConfig
from bayes_grpo.curves import CURVE_FORMS, plateau_progress, shape
from bayes_grpo.model import FittedModel
from bayes_grpo.population import (
    CENTRED,
    OFFSETS,
    PARAMS,
    POPULATION_VARS,
    RunPrior,
    build_model,
    centring,
    covariates,
    log_likelihood,
    normal_logpdf,
    run_prior,
    simulate,
)
from bayes_grpo.prepare import bin_observations, prepare_run, size_centres

PACKAGE = Path(bg.__file__).resolve().parent


def import_graph(root: Path) -> dict[str, set[str]]:
    """Module -> package-internal modules it imports (anywhere in the file, TYPE_CHECKING blocks included)."""
    modules = {}
    for file in root.rglob("*.py"):
        parts = list(file.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        modules[".".join(parts)] = file
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, file in modules.items():
        is_package = file.name == "__init__.py"
        for node in ast.walk(ast.parse(file.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = name.split(".") if is_package else name.split(".")[:-1]
                if node.level:
                    base = base[: len(base) - (node.level - 1)]
                    module = ".".join(base + ([node.module] if node.module else []))
                else:
                    module = node.module or ""
                targets = [module] + [f"{module}.{alias.name}" for alias in node.names]
            else:
                continue
            for target in targets:
                while target and target not in modules:
                    target = target.rpartition(".")[0]
                if target and target not in (name, root.name):
                    graph[name].add(target)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return found


def test_the_checker_finds_a_cycle(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.b import B\n")
    (pkg / "b.py").write_text("def f():\n    from . import a\n")
    (pkg / "c.py").write_text("import pkg.a\n")
    assert cycles(import_graph(pkg)) == [["pkg.a", "pkg.b"]]


def test_bayes_grpo_has_no_import_cycle():
    assert cycles(import_graph(PACKAGE)) == []


def test_data_flows_one_way():
    graph = import_graph(PACKAGE)
    # The forecast and the stopping rule work on a population posterior / a forecast, never on the fitting code.
    for module in ("bayes_grpo.forecast", "bayes_grpo.stopping", "bayes_grpo.population", "bayes_grpo.prepare", "bayes_grpo.curves"):
        assert "bayes_grpo.model" not in graph[module], module
    for module in ("bayes_grpo.population", "bayes_grpo.prepare", "bayes_grpo.curves", "bayes_grpo.config"):
        assert not graph[module] & {"bayes_grpo.forecast", "bayes_grpo.stopping"}, module


def _runs() -> list[bg.RunLog]:
    """Four small runs from two sources: two families on a declared range, a rising and a flat run on a learned scale."""
    rng = np.random.default_rng(0)
    runs = []
    cases = [("qwen", (0.0, 1.0), 0.4, "a"), ("llama", (0.0, 1.0), 0.4, "a"), (None, None, 0.4, "b"), ("qwen", None, 0.0, "b")]
    for i, (family, reward_range, rise, source) in enumerate(cases):
        steps = np.arange(1, 81)
        rewards = 0.2 + rise * (1 - np.exp(-steps / 25)) + 0.05 * rng.standard_normal(steps.size)
        frame = pd.DataFrame({"step": steps, "reward": rewards * (3.0 if reward_range is None else 1.0)})
        run = bg.read_log(frame, run_id=f"r{i}", family=family, params_b=0.5 * (i + 1), total_steps=100, reward_range=reward_range)
        run.meta.extra["source_repo"] = source
        runs.append(run)
    return runs


def _evaluate(model, names: list[str], point: dict) -> list[np.ndarray]:
    """Model variables at a point of the value variables (random variables replaced by their values)."""
    outputs = model.replace_rvs_by_values([model[v] for v in names])
    fn = model.compile_fn(outputs, inputs=model.value_vars, on_unused_input="ignore", point_fn=True)
    return fn(point)


@pytest.mark.parametrize(
    ("centring_se", "per_run_beta"), [(0.0, True), (8.0, False), (1e9, True)], ids=["centred", "mixed-shared-beta", "non-centred"]
)
@pytest.mark.parametrize("form", list(CURVE_FORMS))
def test_pymc_and_forecast_densities_agree(form, centring_se, per_run_beta):
    """Random population and per-run values: the PyMC and the forecast-time log-densities agree to 1e-6."""
    pytest.importorskip("pymc")
    prepared = [prepare_run(r) for r in _runs()]
    config = ModelConfig(form=form, max_bins=30, centring_se=centring_se, per_run_beta=per_run_beta)
    centres = size_centres(prepared)
    model = build_model(prepared, config, centres)
    pinned = centring(prepared, config)
    if centring_se == 8.0:
        assert pinned["asinh_gain"].any() and not pinned["asinh_gain"].all()  # both parameterisations in one model
    rng = np.random.default_rng(1)
    point = {name: value + rng.normal(0, 0.5, np.shape(value)) for name, value in model.initial_point().items()}

    # Population values at the point (natural scale), as arrays with one posterior draw on the last axis.
    present = [v for v in POPULATION_VARS if v in model.named_vars]
    values = dict(zip(present, _evaluate(model, present, point)))
    pop = {name: np.asarray(value)[..., None] for name, value in values.items()}
    families = [str(f) for f in model.coords["family"]]
    sources = [str(f) for f in model.coords["source"]]
    per_run = ["r0", "gain", "tau", "sigma"] + (["beta"] if "beta" in model.named_vars else [])
    natural_values = dict(zip(per_run, _evaluate(model, per_run, point)))
    theta_all = np.column_stack([
        natural_values["r0"],
        np.arcsinh(natural_values["gain"]),
        np.log(natural_values["tau"]),
        np.log(natural_values["beta"]) if "beta" in natural_values else np.zeros(len(prepared)),
        np.log(natural_values["sigma"]),
    ])

    numpy_lik = numpy_prior = 0.0
    for r, p in enumerate(prepared):
        cov = covariates(p, centres, families, sources)
        loc, scale = run_prior(pop, cov, config)
        theta = theta_all[r : r + 1]
        t, z, counts = bin_observations(p.t, p.z, config.max_bins)
        numpy_lik += float(log_likelihood(config, theta, t, z, counts)[0])
        sampled = [j for j, name in enumerate(PARAMS) if name != "log_beta" or ("beta" in natural_values and per_run_beta)]
        loc_v = np.array([np.ravel(loc[PARAMS[j]])[0] for j in sampled])
        scale_v = np.array([np.ravel(scale[PARAMS[j]])[0] for j in sampled])
        numpy_prior += float(normal_logpdf(theta[:, sampled], loc_v, scale_v)[0])
        # A non-centred parameter is sampled as its offset e = (theta - loc) / scale: add the Jacobian.
        numpy_prior += sum(np.log(scale_v[i]) for i, j in enumerate(sampled) if not pinned[PARAMS[j]][r])

    per_run_rvs = [rv for rv in model.free_RVs if rv.name in CENTRED.values() or rv.name in OFFSETS.values()]
    pymc_lik = float(model.compile_logp(vars=[model["z_obs"]])(point))
    pymc_prior = float(model.compile_logp(vars=per_run_rvs)(point))
    assert numpy_lik == pytest.approx(pymc_lik, abs=1e-6, rel=1e-9)
    assert numpy_prior == pytest.approx(pymc_prior, abs=1e-6, rel=1e-9)

    # The forecast-time prior of a run (mixture over posterior draws; here one draw) is that same Normal.
    dataset = xr.Dataset(
        {name: (("chain", "draw") + tuple(model.named_vars_to_dims.get(name, ())), np.asarray(value)[None, None]) for name, value in values.items()},
        coords={"family": families, "source": sources, "kind": list(model.coords["kind"])},
    )
    fitted = FittedModel(population=dataset, model_config=config, size_centres=centres)
    p = prepared[0]
    prior = RunPrior(fitted, p, np.random.default_rng(0))
    loc, scale = run_prior(pop, covariates(p, centres, families, sources), config)
    theta = prior.sample(np.random.default_rng(2), 5)
    expected = normal_logpdf(theta, np.array([np.ravel(loc[n])[0] for n in PARAMS]), np.array([np.ravel(scale[n])[0] for n in PARAMS]))
    np.testing.assert_allclose(prior.logpdf(theta), expected, rtol=1e-9, atol=1e-6)


def test_a_new_source_gets_the_spread_between_sources():
    """A run from a source the population has not seen: no source effect, and the source spread in its scale."""
    prepared = [prepare_run(r) for r in _runs()]
    pop = {
        "gain_mu": np.array([[0.3], [1.0]]), "gain_sd": np.array([[0.2], [0.5]]), "gain_size": np.array([[0.0], [0.0]]),
        "gain_init": np.array([0.0]), "fam_gain": np.array([[0.1], [-0.1]]), "fam_gain_sd": np.array([0.1]),
        "src_gain": np.array([[0.7], [-0.7]]), "src_gain_sd": np.array([[0.7], [0.7]]), "tau_mu": np.array([-1.0]),
        "tau_sd": np.array([0.3]), "tau_size": np.array([0.0]), "tau_init": np.array([0.0]),
        "fam_tau": np.array([[0.0], [0.0]]), "fam_tau_sd": np.array([0.1]), "src_tau": np.array([[0.2], [-0.2]]),
        "src_tau_sd": np.array([0.2]), "beta_mu": np.array([0.5]), "beta_sd": np.array([0.2]),
        "r0_sd": np.array([[0.05], [0.5]]), "sig_mu": np.array([[-3.0], [0.0]]), "sig_sd": np.array([[0.3], [0.3]]),
    }
    config = ModelConfig()
    known_loc, known_scale = run_prior(pop, covariates(prepared[0], size_centres(prepared), ["llama", "qwen"], ["a", "b"]), config)
    new_loc, new_scale = run_prior(pop, covariates(prepared[0], size_centres(prepared), ["llama", "qwen"], ["c"]), config)
    assert float(known_loc["asinh_gain"][0]) - float(new_loc["asinh_gain"][0]) == pytest.approx(0.7)
    assert float(new_scale["asinh_gain"][0]) == pytest.approx(np.sqrt(0.2**2 + 0.7**2))
    assert float(new_scale["log_tau"][0]) == pytest.approx(np.sqrt(0.3**2 + 0.2**2))


def test_posterior_predictive_uses_the_likelihood_noise():
    config = ModelConfig(noise_floor=0.0)
    t = np.linspace(0.01, 1, 50)
    params = {"r0": np.zeros(4000), "gain": np.ones(4000), "tau": np.full(4000, 0.3), "beta": np.full(4000, 2.0), "sigma": np.full(4000, 0.1)}
    mu, predictive = simulate(config, t, params, np.random.default_rng(0))
    resid = (predictive - mu).ravel()
    # Student-t(4) with scale 0.1: variance nu / (nu - 2) * scale^2.
    assert np.std(resid) == pytest.approx(0.1 * np.sqrt(2.0), rel=0.1)
    # gain is the rise by the end of the planned run (t = 1).
    np.testing.assert_allclose(mu[0], shape(config.form, t, 0.3, 2.0) / shape(config.form, 1.0, 0.3, 2.0))


@pytest.mark.parametrize("form", list(CURVE_FORMS))
def test_every_registered_form_is_a_proper_curve(form):
    pytensor = pytest.importorskip("pytensor")
    import pytensor.tensor as pt

    entry = CURVE_FORMS[form]
    assert entry.name == form and entry.params[0] == "tau"
    t = np.array([0.0, 0.05, 0.3, 0.9, 50.0])
    values = shape(form, t, 0.3, 2.5)
    assert values[0] == pytest.approx(0.0, abs=1e-6) and values[-1] == pytest.approx(1.0, abs=1e-4)
    assert np.all(np.diff(values) >= 0)
    symbolic = pytensor.function([], shape(form, pt.as_tensor(t), 0.3, 2.5, xp=pt))()
    np.testing.assert_allclose(symbolic, values, rtol=1e-6, atol=1e-8)  # pytensor's sigmoid differs from tanh in the last digits
    t95 = plateau_progress(form, 0.3, 2.5)
    assert shape(form, np.array([t95]), 0.3, 2.5)[0] == pytest.approx(0.95, abs=1e-6)
