"""Architecture checks: no import cycles, one-way data flow, one model definition everywhere.

The agreement test draws random parameter values and checks that the PyMC
log-density of the fitted model and the NumPy density used to condition one run
at forecast time (both derived from :mod:`bayes_grpo.population`) agree.
"""

from __future__ import annotations

import ast
import importlib.util
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import xarray as xr

import bayes_grpo as bg
from bayes_grpo.config import GAIN_REFERENCES, PARAMETERISATIONS, ModelConfig
from bayes_grpo.curves import CURVE_FORMS, DEFAULT_FORM, plateau_progress, relative_shape, shape
from bayes_grpo.model import FittedModel
from bayes_grpo.population import (
    Covariates,
    natural,
    PARAMS,
    POPULATION_VARS,
    RunPrior,
    covariates,
    log_likelihood,
    normal_logpdf,
    run_prior,
    SHEARED_GAIN,
    simulate,
)
from bayes_grpo.pymc_model import BinGrid, build_model, is_centred, sampled_name
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


#: The longest a module of the package may be: a longer one holds more than one concern.
MAX_MODULE_LINES = 700


def test_no_module_is_over_700_lines():
    long = {str(path.relative_to(PACKAGE)): n for path in PACKAGE.rglob("*.py") if (n := len(path.read_text(encoding="utf-8").splitlines())) > MAX_MODULE_LINES}
    assert not long, f"split these by concern: {long}"


def test_data_flows_one_way():
    graph = import_graph(PACKAGE)
    # The forecast and the stopping rule work on a population posterior / a forecast, never on the fitting code.
    fitting = {"bayes_grpo.model", "bayes_grpo.pymc_model"}
    for prefix in ("bayes_grpo.forecast", "bayes_grpo.stopping", "bayes_grpo.plotting", "bayes_grpo.population", "bayes_grpo.prepare", "bayes_grpo.curves"):
        for module in [m for m in graph if m == prefix or m.startswith(prefix + ".")]:
            assert not graph[module] & fitting, module
    for module in ("bayes_grpo.population", "bayes_grpo.prepare", "bayes_grpo.curves", "bayes_grpo.config"):
        assert not graph[module] & {"bayes_grpo.forecast", "bayes_grpo.stopping"}, module


#: What moved out of the package into the repository's ``evaluation/`` (not in the wheel).
EVALUATION_MODULES = ("bayes_grpo.calibration", "bayes_grpo.backtest", "bayes_grpo.shapes")
#: Ways of reaching a sibling ``shared`` folder from a file's location: ``../shared``, ``parents[2] / "shared"``,
#: ``joinpath("shared", ...)``, ``os.path.join(..., "shared")``.
SHARED_FOLDER = re.compile(r"""\.\.[/\\]+shared|/\s*["']shared["']|joinpath\([^)]*["']shared["']|path\.join\([^)]*["']shared["']""")


def _package_files() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def test_the_package_never_imports_the_evaluation_code():
    importers = []
    for file in _package_files():
        source = file.read_text(encoding="utf-8")
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                names = [node.module or ""]
            else:
                continue
            if any(name == "evaluation" or name.startswith("evaluation.") for name in names):
                importers.append(f"{file.relative_to(PACKAGE)}:{node.lineno}")
        if re.search(r"""import_module\(\s*["']evaluation""", source):
            importers.append(str(file.relative_to(PACKAGE)))
    assert importers == []


def test_the_package_never_looks_for_the_shared_runs_folder():
    # The shared real runs sit beside a source checkout; only evaluation/ (and the scripts, tests and
    # benchmarks that use it) may look there. The package takes such a folder only as an argument.
    found = [
        f"{file.relative_to(PACKAGE)}:{number}: {line.strip()}"
        for file in _package_files()
        for number, line in enumerate(file.read_text(encoding="utf-8").splitlines(), 1)
        if SHARED_FOLDER.search(line)
    ]
    assert found == []
    assert SHARED_FOLDER.search('_REPO = Path(__file__).resolve().parents[2] / "shared" / "external_runs"')  # the checker finds it
    assert SHARED_FOLDER.search("runs in ``../shared/external_runs``")


@pytest.mark.parametrize("module", EVALUATION_MODULES)
def test_the_evaluation_modules_are_not_in_the_package(module):
    assert importlib.util.find_spec(module) is None
    assert importlib.util.find_spec(module.replace("bayes_grpo.", "evaluation.")) is not None
    assert not (PACKAGE / f"{module.rpartition('.')[2]}.py").exists()


def test_the_package_keeps_only_the_measures_it_uses():
    import bayes_grpo.measures as measures
    import bayes_grpo.settings as settings

    moved = ("best_step", "regret", "pinball_loss", "quantile_score", "interval_outcome", "change_after_cut", "hardest_third")
    assert not [name for name in moved if hasattr(measures, name)]
    # persistence is the package's own again: the calibration layer draws forecasts towards it
    import bayes_grpo.recalibration as recalibration
    from evaluation import scoring

    assert recalibration.persistence is measures.persistence is scoring.persistence
    assert not [name for name in ("shared_runs_dir", "SHARED_RUNS_ENV", "EVALUATION_FRACTIONS") if hasattr(settings, name)]


def _runs() -> list[bg.RunLog]:
    """Three small runs: two families on a declared range from one source (one declares its initial reward),
    one without family or source on a learned scale, shorter than the fit's bins (so the likelihood's grid is padded).
    The first two log ``reward_std`` (a known learning signal), the third does not (marginalised)."""
    rng = np.random.default_rng(0)
    runs = []
    for i, (family, reward_range, length) in enumerate([("qwen", (0.0, 1.0), 80), ("llama", (0.0, 1.0), 80), (None, None, 24)]):
        steps = np.arange(1, length + 1)
        rewards = 0.2 + 0.4 * (1 - np.exp(-steps / 25)) + 0.05 * rng.standard_normal(steps.size)
        frame = pd.DataFrame({"step": steps, "reward": rewards * (3.0 if reward_range is None else 1.0)})
        if reward_range is not None:
            frame["reward_std"] = 0.1 + 0.2 * i * np.exp(-steps / 30)
        run = bg.read_log(frame, run_id=f"r{i}", family=family, params_b=0.5 * (i + 1), total_steps=100, reward_range=reward_range)
        run = run.with_meta(extra={"source_repo": "org/recipe"}) if reward_range else run
        runs.append(run.with_meta(initial_reward=0.2) if i == 0 else run)
    return runs


def _evaluate(model, names: list[str], point: dict) -> list[np.ndarray]:
    """Model variables at a point of the value variables (random variables replaced by their values)."""
    outputs = model.replace_rvs_by_values([model[v] for v in names])
    fn = model.compile_fn(outputs, inputs=model.value_vars, on_unused_input="ignore", point_fn=True)
    return fn(point)


@pytest.mark.parametrize("gain_at", GAIN_REFERENCES)
@pytest.mark.parametrize("parameterisation", PARAMETERISATIONS)
@pytest.mark.parametrize("form,source_level", [(form, False) for form in CURVE_FORMS] + [(DEFAULT_FORM, True)])
def test_pymc_and_forecast_densities_agree(form, source_level, parameterisation, gain_at):
    """Random population values and per-run parameters (or offsets): the two log-densities agree to 1e-6."""
    pm = pytest.importorskip("pymc")
    prepared = [prepare_run(r) for r in _runs()]
    config = ModelConfig(form=form, max_bins=30, parameterisation=parameterisation, gain_at=gain_at, source_level=source_level)
    centred = np.array([is_centred(name, config) for name in PARAMS])
    centres = size_centres(prepared)
    model = build_model(prepared, config, centres)
    rng = np.random.default_rng(1)
    point = {name: value + rng.normal(0, 0.5, np.shape(value)) for name, value in model.initial_point().items()}

    # Population values at the point (natural scale), as arrays with one posterior draw on the last axis.
    present = [v for v in POPULATION_VARS if v in model.named_vars]
    values = dict(zip(present, _evaluate(model, present, point)))
    pop = {name: np.asarray(value)[..., None] for name, value in values.items()}
    families = [str(f) for f in model.coords["family"]]
    sources = [str(s) for s in model.coords.get("source", [])]
    per_run = ["r0", "gain", "tau", "sigma"] + (["beta"] if "beta" in model.named_vars else [])
    deterministic = dict(zip(per_run, _evaluate(model, per_run, point)))

    names = {name: sampled_name(name, config) for name in PARAMS}
    sampled_values = {name: point[v] if v in point else np.zeros(len(prepared)) for name, v in names.items()}
    if names["asinh_gain"] == SHEARED_GAIN:
        # The sheared gain is asinh_gain plus a shift fixed by r0: its density given r0 is asinh_gain's (unit Jacobian).
        (sampled_values["asinh_gain"],) = _evaluate(model, ["asinh_gain"], point)
    numpy_lik = numpy_prior = 0.0
    for r, p in enumerate(prepared):
        cov = covariates(p, centres, families, sources)
        loc, scale = run_prior(pop, cov, config)
        loc_r = np.array([np.ravel(loc[name])[0] for name in PARAMS])
        scale_r = np.array([np.ravel(scale[name])[0] for name in PARAMS])
        v = np.array([sampled_values[name][r] for name in PARAMS])
        theta = np.where(centred, v, loc_r + scale_r * v)[None]
        # The per-run transform matches the PyMC deterministics.
        gain = natural(dict(zip(PARAMS, theta.T)), config)["gain"]
        assert float(gain[0]) == pytest.approx(float(deterministic["gain"][r]), rel=1e-9, abs=1e-12)
        assert np.exp(theta[0, 2]) == pytest.approx(float(deterministic["tau"][r]), rel=1e-9)
        assert theta[0, 0] == pytest.approx(float(deterministic["r0"][r]), rel=1e-9, abs=1e-12)
        t, z, counts = bin_observations(p.t, p.z, config.max_bins)
        numpy_lik += float(log_likelihood(config, theta, t, z, counts)[0])
        sampled = [j for j, name in enumerate(PARAMS) if names[name] in point]
        loc_v = np.array([np.ravel(loc[PARAMS[j]])[0] for j in sampled])
        scale_v = np.array([np.ravel(scale[PARAMS[j]])[0] for j in sampled])
        # An offset's density is theta's density plus the Jacobian of theta = loc + scale * e.
        jacobian = float(np.sum(~centred[sampled] * np.log(scale_v)))
        numpy_prior += float(normal_logpdf(theta[:, sampled], loc_v, scale_v)[0]) + jacobian

    pymc_lik = float(model.compile_logp(vars=[model["z_obs"]])(point))
    pymc_prior = float(model.compile_logp(vars=[model[names[n]] for n in PARAMS if names[n] in point])(point))
    assert numpy_lik == pytest.approx(pymc_lik, abs=1e-6, rel=1e-9)
    assert numpy_prior == pytest.approx(pymc_prior, abs=1e-6, rel=1e-9)

    # The forecast-time prior of a run (mixture over posterior draws; here one draw) is that same Normal.
    dataset = xr.Dataset(
        {name: (("chain", "draw") + tuple(model.named_vars_to_dims.get(name, ())), np.asarray(value)[None, None]) for name, value in values.items()},
        coords={"family": families, "kind": list(model.coords["kind"]), **({"source": sources} if sources else {})},
    )
    fitted = FittedModel(population=dataset, model_config=config, size_centres=centres)
    p = prepared[0]
    prior = RunPrior(fitted, p, np.random.default_rng(0))
    assert p.source == "org/recipe" and fitted.sources == (["org/recipe"] if source_level else [])
    loc, scale = run_prior(pop, covariates(p, centres, families, sources), config)
    theta = prior.sample(np.random.default_rng(2), 5)
    expected = normal_logpdf(theta, np.array([np.ravel(loc[n])[0] for n in PARAMS]), np.array([np.ravel(scale[n])[0] for n in PARAMS]))
    np.testing.assert_allclose(prior.logpdf(theta), expected, rtol=1e-9, atol=1e-6)


def test_the_bin_grid_pads_short_runs_and_flattens_back_to_run_order():
    """Runs of 3, 1 and 2 bins: a 3 x 3 grid whose flat view of the real bins is the runs' bins concatenated."""
    binned = [bin_observations(np.arange(1.0, n + 1) / 10, np.arange(n) + 10.0 * r, 10) for r, n in enumerate([3, 1, 2])]
    grid = BinGrid.of(binned)
    assert grid.t.shape == (3, 3) and grid.n_obs == 6
    np.testing.assert_array_equal(grid.real, [0, 1, 2, 3, 6, 7])
    z = np.zeros((3, 3))
    for row, b in enumerate(binned):
        z[row, : b[1].size] = b[1]
    np.testing.assert_array_equal(grid.flat(z), np.concatenate([b[1] for b in binned]))
    np.testing.assert_array_equal(grid.flat(grid.t), np.concatenate([b[0] for b in binned]))
    full = BinGrid.of(binned[:1] * 2)
    assert full.real is None and full.n_obs == 6


def test_posterior_predictive_uses_the_likelihood_noise():
    config = ModelConfig(noise_floor=0.0)
    t = np.linspace(0.01, 1, 50)
    params = {"r0": np.zeros(4000), "gain": np.ones(4000), "tau": np.full(4000, 0.3), "beta": np.full(4000, 2.0), "sigma": np.full(4000, 0.1)}
    mu, predictive = simulate(config, t, params, np.random.default_rng(0))
    resid = (predictive - mu).ravel()
    # Student-t(4) with scale 0.1: variance nu / (nu - 2) * scale^2.
    assert np.std(resid) == pytest.approx(0.1 * np.sqrt(2.0), rel=0.1)
    np.testing.assert_allclose(mu[0], shape(config.form, t, 0.3, 2.0))


def test_stored_per_run_draws_give_the_fitted_curve_also_past_the_floor_on_f_1():
    """A fit stores the asymptote ``gain``, whose division by F(1) is floored; the report's posterior predictive
    must still give the fit's curve ``r0 + G F(t) / F(1)``, also for a late sharp take-off with F(1) < 1e-12."""
    config = ModelConfig(gain_at="plan_end")
    theta = {"r0": np.array([0.1, 0.1]), "asinh_gain": np.arcsinh([0.5, 0.5]), "log_tau": np.log([0.3, 2.0]),
             "log_beta": np.log([2.0, 60.0]), "log_sigma": np.log([0.05, 0.05])}  # fmt: skip
    assert shape(config.form, 1.0, 2.0, 60.0) < 1e-12
    params = natural(theta, config)
    stored = {name: params[name] for name in ("r0", "gain", "tau", "beta", "sigma")}
    t = np.linspace(0.05, 1.0, 20)
    mu_stored, _ = simulate(config, t, stored, np.random.default_rng(0))
    mu_fitted, _ = simulate(config, t, params, np.random.default_rng(0))
    np.testing.assert_allclose(mu_stored, mu_fitted, rtol=1e-12)
    np.testing.assert_allclose(mu_stored[1], 0.1 + 0.5 * t**60.0, rtol=1e-9)


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


@pytest.mark.parametrize("form", list(CURVE_FORMS))
def test_the_share_of_the_plan_end_gain_is_f_t_over_f_1_in_numpy_and_pytensor(form):
    import pytensor
    import pytensor.tensor as pt

    t = np.array([0.01, 0.2, 0.5, 1.0])
    for tau, beta in [(0.3, 2.5), (2.0, 1.5)]:
        expected = shape(form, t, tau, beta) / shape(form, 1.0, tau, beta)
        np.testing.assert_allclose(relative_shape(form, t, tau, beta), expected, rtol=1e-9)
        symbolic = pytensor.function([], relative_shape(form, pt.as_tensor(t), tau, beta, xp=pt))()
        np.testing.assert_allclose(symbolic, expected, rtol=1e-5)  # the logistic: pytensor's sigmoid, as above


def test_a_late_sharp_take_off_keeps_a_smooth_curve_and_gradient_where_f_1_underflows():
    """beta * log(tau) = 500 * log(5): F(1) is 0 in floating point; F(t) / F(1) -> t ** beta, with finite gradients."""
    import pytensor
    import pytensor.tensor as pt

    t = np.array([0.5, 0.99, 0.999, 1.0])
    assert shape("loglogistic", 1.0, 5.0, 500.0) == 0.0
    np.testing.assert_allclose(relative_shape("loglogistic", t, 5.0, 500.0), t**500.0, rtol=1e-9)
    log_tau, log_beta = pt.dscalar("log_tau"), pt.dscalar("log_beta")
    value = pt.sum(relative_shape("loglogistic", pt.as_tensor(t), pt.exp(log_tau), pt.exp(log_beta), xp=pt))
    grads = pytensor.function([log_tau, log_beta], pt.grad(value, [log_tau, log_beta]))
    for point in [(np.log(3.0), np.log(500.0)), (np.log(1.7), np.log(50.0)), (np.log(1.7001), np.log(50.0))]:
        assert np.all(np.isfinite(grads(*point)))
    # No kink where F(1) crosses 1e-12 (beta * log(tau) ~ 27.6; a floor on F(1) there made d/dlog_tau jump
    # by ~100), nor where the logit of F(1) meets its floor of -30.
    for crossing in (27.6, 30.0):
        below, above = (np.array(grads(np.log(tau), np.log(50.0))) for tau in np.exp((crossing + np.array([-0.1, 0.1])) / 50))
        np.testing.assert_allclose(below, above, rtol=0.05, atol=1e-9)


def test_a_declared_start_has_its_fixed_spread_whatever_the_population_says():
    config = ModelConfig()
    # Population values as the fit sees them (one value per kind / family, no draw axis).
    pop = {
        "fam_gain": np.zeros(1), "fam_tau": np.zeros(1), "fam_gain_sd": 0.1, "fam_tau_sd": 0.1,
        "gain_mu": np.zeros(2), "gain_sd": np.ones(2), "gain_size": 0.0, "gain_init": 0.0,
        "tau_mu": np.zeros(2), "tau_sd": np.ones(2), "tau_size": 0.0, "tau_init": 0.0, "beta_mu": np.zeros(2), "beta_sd": np.ones(2),
        "r0_sd": np.array([0.004, 0.3]), "sig_mu": np.zeros(2), "sig_sd": np.ones(2),
    }
    cov = Covariates(kind=np.array([0, 0, 1, 1]), family=np.zeros(4, int), source=np.full(4, -1), size=np.zeros(4), init=np.zeros(4),
                     start=np.full(4, 0.2), declared=np.array([1.0, 0.0, 1.0, 0.0]))
    _, scale = run_prior(pop, cov, config)
    declared_sd = np.asarray(config.priors.declared_start_sd)
    np.testing.assert_allclose(scale["r0"], [declared_sd[0], 0.004, declared_sd[1], 0.3])


def test_a_run_from_an_unseen_source_gets_the_spread_between_sources_and_a_seen_one_its_effect():
    config = ModelConfig()
    pop = {
        "fam_gain": np.zeros(1), "fam_tau": np.zeros(1), "fam_gain_sd": 0.0, "fam_tau_sd": 0.0,
        "src_gain": np.array([0.7, -0.7]), "src_tau": np.array([0.4, -0.4]), "src_gain_sd": 0.5, "src_tau_sd": 0.3,
        "gain_mu": np.zeros(2), "gain_sd": np.full(2, 0.8), "gain_size": 0.0, "gain_init": 0.0,
        "tau_mu": np.zeros(2), "tau_sd": np.full(2, 0.4), "tau_size": 0.0, "tau_init": 0.0, "beta_mu": np.zeros(2), "beta_sd": np.ones(2),
        "r0_sd": np.full(2, 0.1), "sig_mu": np.zeros(2), "sig_sd": np.ones(2),
    }
    cov = Covariates(kind=np.ones(3, int), family=np.zeros(3, int), source=np.array([0, 1, -1]), size=np.zeros(3),
                     init=np.zeros(3), start=np.zeros(3), declared=np.zeros(3))
    loc, scale = run_prior(pop, cov, config)
    np.testing.assert_allclose(loc["asinh_gain"], [0.8 * 0.7, -0.8 * 0.7, 0.0])
    np.testing.assert_allclose(loc["log_tau"], [0.4, -0.4, 0.0])
    np.testing.assert_allclose(scale["asinh_gain"], [0.8, 0.8, 0.8 * np.sqrt(1 + 0.5**2)])
    np.testing.assert_allclose(scale["log_tau"], [0.4, 0.4, np.sqrt(0.4**2 + 0.3**2)])
    # A model file written before the source level (no src_* variables): no source effect, no added spread.
    old = {k: v for k, v in pop.items() if not k.startswith("src_")}
    loc_old, scale_old = run_prior(old, cov, config)
    np.testing.assert_allclose(loc_old["log_tau"], 0.0)
    np.testing.assert_allclose(scale_old["asinh_gain"], 0.8)


@pytest.mark.parametrize("spread_prior", ["halfnormal", "gamma"])
def test_every_population_spread_has_the_configured_prior_with_the_halfnormal_mean(spread_prior):
    """Each ``*_sd`` variable's log-density is HalfNormal(scale), or Gamma(2) with the same mean: no mass at zero."""
    pytest.importorskip("pymc")
    from scipy import stats

    prepared = [prepare_run(r) for r in _runs()]
    config = ModelConfig.from_dict({"priors": {"spread_prior": spread_prior, "fixed_start_sd": [None, None]}, "source_level": True})
    model = build_model(prepared, config, size_centres(prepared))
    p = config.priors
    scales = {
        "gain_sd": p.gain_sd_scale, "fam_gain_sd": p.fam_gain_sd_scale, "tau_sd": p.tau_sd_scale, "fam_tau_sd": p.fam_tau_sd_scale,
        "beta_sd": p.beta_sd_scale, "src_gain_sd": p.src_gain_sd_scale, "src_tau_sd": p.src_tau_sd_scale,
        "r0_sd": p.r0_sd_scale, "sig_sd": p.sig_sd_scale,
    }
    assert {v.name for v in model.free_RVs if v.name.endswith("_sd")} == set(scales)
    for name, scale in scales.items():
        value = np.full(np.shape(model.initial_point()[f"{name}_log__"]), 0.07)
        scale = np.broadcast_to(np.asarray(scale, float), value.shape)
        logp = model.compile_logp(vars=[model[name]], jacobian=False)({**model.initial_point(), f"{name}_log__": np.log(value)})
        if spread_prior == "gamma":
            expected = stats.gamma(a=2.0, scale=np.sqrt(2 / np.pi) * scale / 2.0)
            assert np.allclose(expected.mean(), stats.halfnorm(scale=scale).mean())
            assert expected.pdf(1e-9).max() < 1e-6
        else:
            expected = stats.halfnorm(scale=scale)
        assert logp == pytest.approx(float(np.sum(expected.logpdf(value))), rel=1e-7)


@pytest.mark.parametrize("priors,match", [
    ({"spread_prior": "cauchy"}, "spread_prior"),
    ({"fixed_start_sd": [None, 0.0]}, "fixed_start_sd"),
    ({"fixed_start_sd": [0.1]}, "fixed_start_sd"),
])
def test_bad_prior_settings_are_refused(priors, match):
    with pytest.raises(bg.ModelError, match=match):
        ModelConfig.from_dict({"priors": priors})


def test_a_fixed_start_spread_replaces_the_learned_one_for_its_kind_only():
    """``fixed_start_sd=(None, 0.12)``: the learned-scale start spread is the constant 0.12, the range kind's is still sampled."""
    pytest.importorskip("pymc")
    prepared = [prepare_run(r) for r in _runs()]
    config = ModelConfig.from_dict({"priors": {"fixed_start_sd": [None, 0.12]}})
    model = build_model(prepared, config, size_centres(prepared))
    assert {v.name for v in model.free_RVs if v.name.startswith("r0_sd")} == {"r0_sd_range"}
    point = model.initial_point()
    for value in (0.01, 0.3):
        (r0_sd,) = _evaluate(model, ["r0_sd"], {**point, "r0_sd_range_log__": np.log(value)})
        np.testing.assert_allclose(r0_sd, [value, 0.12])
