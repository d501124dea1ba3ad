"""The PyMC model of the hierarchy, built from the one model definition in :mod:`bayes_grpo.population`.

:func:`build_model` assembles the fit's PyMC graph from ``population_priors``, ``run_prior`` and
``observation`` (the same functions the forecast evaluates with NumPy), choosing how each per-run
parameter is sampled (:func:`resolve_parameterisation`: offsets, centred, or mixed) and binning
long logs (:class:`BinGrid`). Only the fit imports this module; the forecast never does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from bayes_grpo.config import ModelConfig, merge
from bayes_grpo.curves import get_form
from bayes_grpo.errors import ModelError
from bayes_grpo.population import (
    MIXED_MIN_RUNS, NO_FAMILY, NO_SOURCE, OFFSETS, SHEARED_GAIN, Covariates, _index, natural, observation, population_priors, run_prior,
)  # fmt: skip
from bayes_grpo.prepare import SCALE_KINDS, PreparedRun, bin_observations, centred_size, size_centres, start_level



def resolve_parameterisation(config: ModelConfig, n_runs: int) -> ModelConfig:
    """``config`` with ``parameterisation="auto"`` replaced by what suits ``n_runs`` runs.

    ``"mixed"`` from :data:`MIXED_MIN_RUNS` runs up, ``"non_centred"`` below. Measured
    (``benchmarks/results/fit_geometry.md``): on the 201 bundled + shared runs mixed
    reaches max r_hat 1.01-1.02 over three seeds at about 140 leapfrog steps per draw
    (centred did as well on two seeds); on 8 similar simulated runs and on folds of
    29-30 real runs the per-run parameters are too weakly identified for their
    population spreads, and centring them funnels (r_hat 1.1-1.8).
    """
    if config.parameterisation != "auto":
        return config
    return merge(config, {"parameterisation": "mixed" if n_runs >= MIXED_MIN_RUNS else "non_centred"})


def sampled_name(name: str, config: ModelConfig) -> str:
    """Name of the PyMC variable NUTS samples for per-run parameter ``name``: itself or the sheared gain (centred), or its offset."""
    if not is_centred(name, config):
        return OFFSETS[name]
    return SHEARED_GAIN if name == "asinh_gain" else name


#: Per-run parameters that ``"mixed"`` samples as offsets (see :func:`is_centred`).
MIXED_OFFSETS = ("r0", "log_beta")


def is_centred(name: str, config: ModelConfig) -> bool:
    """Whether per-run parameter ``name`` is sampled centred under ``config.parameterisation``.

    ``"mixed"`` centres the gain, timescale and noise, which a run's rewards pin down far more
    tightly than the population does, and samples as offsets the start ``r0`` (read from the
    first rewards only about as tightly as the small population spread of such starts) and
    the shape ``log_beta`` (on the 201 bundled + shared runs the posterior spread of 137 of
    the 164 bundled runs' shapes is within 30% of the population spread: their rewards say
    little about it, and centring it made ``beta_sd`` the slowest variable;
    ``benchmarks/results/fit_scaling.notes.md``).
    """
    return config.parameterisation == "centred" or (config.parameterisation == "mixed" and name not in MIXED_OFFSETS)


def per_run_variable(name: str, loc: Any, scale: Any, config: ModelConfig) -> Any:
    """Per-run parameter ``name`` ~ Normal(loc, scale), sampled centred or as an offset ``theta = loc + scale * e``."""
    import pymc as pm

    if is_centred(name, config):
        return pm.Normal(name, loc, scale, dims="run")
    return loc + scale * pm.Normal(OFFSETS[name], 0, 1, dims="run")


def end_rise(prepared: PreparedRun, binned_z: np.ndarray) -> float:
    """How far a run's last three bins sit above its expected start (normalised units): a rough plan-end gain."""
    return float(np.mean(binned_z[-3:]) - start_level(prepared))


def gain_variable(loc: Any, scale: Any, r0: Any, start: Any, rise: np.ndarray) -> Any:
    """Centred ``asinh_gain ~ Normal(loc, scale)``, sampled as ``u = asinh_gain + (r0 - start) / sqrt(1 + rise^2)``.

    A run's rewards pin its level at the end of the plan, ``r0 + sinh(asinh_gain)``, far more
    tightly than its start or gain alone, so NUTS would move along a narrow ridge in
    ``(r0, asinh_gain)`` (posterior correlation -0.87 in the median bundled run). ``u``
    follows the end level to first order (``1 / sqrt(1 + rise^2)`` is ``1 / cosh`` at the
    run's observed gain ``rise``), and the ridge becomes an axis: 33-40 leapfrog steps per
    draw instead of about 175 on the 201 bundled + shared runs. Given ``r0`` the shift is a
    constant, so ``u ~ Normal(loc + shift, scale)`` has a unit Jacobian and the model is
    unchanged. ``u`` starts at ``asinh(rise)`` rather than the population mean, so no chain
    begins a whole reward range away from its run's data.
    """
    import pymc as pm

    shift = (r0 - start) / np.sqrt(1.0 + rise**2)
    u = pm.Normal(SHEARED_GAIN, loc + shift, scale, dims="run", initval=np.arcsinh(rise))
    return pm.Deterministic("asinh_gain", u - shift, dims="run")


@dataclass(frozen=True)
class BinGrid:
    """The binned observations of a fit as a (run, bin) grid, padded where a run has fewer bins.

    The likelihood broadcasts each run's parameters over its row instead of gathering them
    per observation: on the 201 bundled + shared runs this halves the cost of a log-density
    and gradient (263 to 129 us), since a column broadcast's gradient is a row sum where a
    gather's is a scatter, and the progress and counts enter as constants whose logs and
    square roots PyTensor folds at compile time.

    Attributes
    ----------
    t, count : ndarray
        (runs, bins) progress and number of logged steps of each bin (1 in the padding).
    real : ndarray or None
        Flat (row-major) positions of the real bins, in run order; None when nothing is padded.
    """

    t: np.ndarray
    count: np.ndarray
    real: np.ndarray | None

    @classmethod
    def of(cls, binned: Sequence[tuple[np.ndarray, np.ndarray, np.ndarray]]) -> "BinGrid":
        """The grid of per-run ``(t, z, count)`` bins, as :func:`~bayes_grpo.prepare.bin_observations` returns them."""
        lengths = np.array([b[0].size for b in binned])
        width = int(lengths.max())
        t = np.ones((lengths.size, width))
        count = np.ones((lengths.size, width))
        for row, (t_bins, _, counts) in enumerate(binned):
            t[row, : t_bins.size] = t_bins
            count[row, : counts.size] = counts
        mask = np.arange(width)[None, :] < lengths[:, None]
        return cls(t=t, count=count, real=None if mask.all() else np.flatnonzero(mask))

    @property
    def n_obs(self) -> int:
        """Number of real (unpadded) bins."""
        return self.t.size if self.real is None else self.real.size

    def flat(self, values: Any) -> Any:
        """A (runs, bins) tensor as the flat vector of the real bins, in run order."""
        flat = values.ravel()
        return flat if self.real is None else flat[self.real]


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
        With ``run``, ``family``, ``kind`` and ``obs`` coordinates (and ``source`` with
        ``config.source_level``); per-run deterministics ``r0, gain, tau, sigma`` (and
        ``beta``), observed ``z_obs``.

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
    config = resolve_parameterisation(merge(config or ModelConfig(), overrides or None), len(prepared))
    # Runs without a family enter with the family effect marginalised (as unseen families do
    # at forecast time); the coordinate keeps one placeholder when no run names a family.
    families = sorted({p.family for p in prepared if p.family}) or [NO_FAMILY]
    sources = (sorted({p.source for p in prepared if p.source}) or [NO_SOURCE]) if config.source_level else []
    centres = list(centres) if centres is not None else size_centres(prepared)
    binned = [bin_observations(p.t, p.z, config.max_bins) for p in prepared]
    grid = BinGrid.of(binned)
    coords = {
        "run": [p.run_id for p in prepared],
        "family": families,
        **({"source": sources} if sources else {}),
        "kind": list(SCALE_KINDS),
        "obs": np.arange(grid.n_obs),
    }
    with pm.Model(coords=coords) as model:
        z_data = pm.Data("z", np.concatenate([b[1] for b in binned]), dims="obs")
        cov = Covariates(
            kind=np.array([p.kind_index for p in prepared]),
            family=np.array([_index(p.family, families) for p in prepared]),
            source=np.array([_index(p.source, sources) for p in prepared]),
            size=pm.Data("log10_size", np.array([centred_size(p, centres) for p in prepared]), dims="run"),
            init=pm.Data("initial_cov", np.array([p.initial_cov for p in prepared]), dims="run"),
            start=pm.Data("start", np.array([start_level(p) for p in prepared]), dims="run"),
            declared=np.array([float(p.declares_start) for p in prepared]),
            signal=pm.Data("signal", np.array([p.signal if p.has_signal else 0.0 for p in prepared]), dims="run"),
            signal_known=np.array([float(p.has_signal) for p in prepared]),
        )
        loc, scale = run_prior(population_priors(config), cov, config, xp=pt)
        has_beta = get_form(config.form).has_beta
        sheared = is_centred("asinh_gain", config)
        # The sheared gain needs r0, so it comes last; offsets keep the order of earlier versions
        # (the order of the sampled vector changes a seeded fit's draws, not its posterior).
        order = ("r0", "log_tau", "log_sigma", "log_beta") if sheared else ("asinh_gain", "log_tau", "r0", "log_sigma", "log_beta")
        theta = {name: per_run_variable(name, loc[name], scale[name], config) for name in order if name != "log_beta" or has_beta}
        if sheared:
            rise = np.array([end_rise(p, b[1]) for p, b in zip(prepared, binned)])
            theta["asinh_gain"] = gain_variable(loc["asinh_gain"], scale["asinh_gain"], theta["r0"], cov.start, rise)
        theta.setdefault("log_beta", pt.zeros(len(prepared)))
        params = natural(theta, config, xp=pt)
        for name in ("gain", "tau", "r0", "sigma") + (("beta",) if has_beta else ()):
            if name not in model.named_vars:  # a centred fit samples r0 itself
                params[name] = pm.Deterministic(name, params[name], dims="run")
        # Per-run parameters broadcast as columns over the (run, bin) grid of constants.
        mu, noise = observation(config, grid.t, grid.count, {name: value[:, None] for name, value in params.items()}, xp=pt)
        pm.StudentT("z_obs", nu=config.student_nu, mu=grid.flat(mu), sigma=grid.flat(noise), observed=z_data, dims="obs")
    return model
