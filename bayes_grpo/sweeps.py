"""Rank the runs of a sweep by their forecast final reward: which run will end best, and by how likely.

A sweep trains one recipe several times with one setting changed. :func:`rank`
forecasts every run (:func:`bayes_grpo.forecast.forecast`) and combines the
forecasts into **joint** draws of the runs' final rewards, from which it reads,
per run, the forecast final reward (mean and quantiles), ``p_best`` (the
probability that the run ends highest of those given) and ``p_beats(value)``
(the probability that it ends above ``value``).

Why joint draws. Every forecast starts from the same population posterior: a
run's parameters are drawn around one population draw (a mixture component of
the forecast prior, :class:`~bayes_grpo.population.RunPrior`). The runs of one
sweep share that draw, so they are not independent: a population draw with a
slow rise makes every run of the sweep rise slowly. :func:`rank` makes this
explicit. It takes ``components`` population draws ``c`` (the same for every
run); for each forecast draw of a run's parameters ``theta`` it computes the
probability that ``theta`` came from each ``c`` (its responsibility
``N(theta; loc_c, scale_c)``, normalised over ``c``). Given ``c``, runs are
independent, and the sweep's runs together say which population draws fit them:
``P(c | all runs)`` is proportional to the product over runs of ``P(c | run)``
(uniform prior over the draws). A joint draw picks ``c`` from that, then one
forecast draw of every run from its draws weighted by their responsibility for
``c``. The marginal of one run can therefore differ a little from its
forecast alone: the other runs have informed the population.

Finished runs (logged up to the planned length) are not forecast forward: their
final reward is their measured final-window mean
(:func:`bayes_grpo.measures.final_reward`), without uncertainty. They are still
conditioned on, so they inform the population draws like the others.
"""

from __future__ import annotations

import warnings
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import pandas as pd
from scipy.special import logsumexp

from bayes_grpo.errors import ModelError
from bayes_grpo.forecast import Forecast
from bayes_grpo.logs import RunLog
from bayes_grpo.measures import final_reward
from bayes_grpo.population import PARAMS, PopulationPosterior, RunPrior

if TYPE_CHECKING:
    from matplotlib.axes import Axes

#: Population draws the runs' joint draws are coupled through.
COUPLING_COMPONENTS = 64
#: Joint draws of the runs' final rewards.
JOINT_DRAWS = 4000
#: Forecast draws per run.
RANK_FORECAST_DRAWS = 500
#: Quantiles of the final reward in the ranking table.
TABLE_QUANTILES = (0.05, 0.5, 0.95)


class SweepModel(PopulationPosterior, Protocol):
    """A population posterior that forecasts runs, e.g. :class:`bayes_grpo.model.FittedModel`."""

    def forecast(self, run: RunLog | None = None, total_steps: int | None = None, **kwargs: Any) -> Forecast: ...


#: Fewer effective population draws than this behind a ranking's joint draws is a caveat (:attr:`Ranking.caveats`).
MIN_COMPONENT_ESS = 100


@dataclass
class Ranking:
    """Joint forecast of a sweep's final rewards (made by :func:`rank`).

    Attributes
    ----------
    run_ids : list of str
        The runs, in the order given.
    steps : ndarray
        Last logged step of each run.
    total_steps : ndarray
        Planned length of each run.
    finished : ndarray of bool
        Whether each run has logged its planned length (its final reward is then measured, not forecast).
    finals : ndarray
        (n_joint_draws, n_runs) joint draws of the runs' final rewards (mean logged reward over the
        last 10% of the plan, :attr:`bayes_grpo.forecast.Forecast.final`).
    forecasts : list of Forecast
        Each run's own forecast (trajectories for :meth:`plot`).
    picks : ndarray
        (n_joint_draws, n_runs) which draw of each forecast every joint draw took.
    component_ess : float
        Effective number of population draws the joint draws rest on (``1 / sum w_c^2``): near 1
        when the sweep's runs agree on one population draw, near ``components`` when they say little.
    beat : float or None
        The value of the table's ``p_beats`` column, when :func:`rank` was given one.

    Example
    -------
    >>> ranking = bg.rank(runs, total_steps=250)  # doctest: +SKIP
    >>> ranking.table[["run_id", "q50", "p_best"]]  # doctest: +SKIP
    >>> ranking.p_beats(2.0)  # doctest: +SKIP
    """

    run_ids: list[str]
    steps: np.ndarray
    total_steps: np.ndarray
    finished: np.ndarray
    finals: np.ndarray
    forecasts: list[Forecast] = field(repr=False)
    picks: np.ndarray = field(repr=False)
    component_ess: float = float("nan")
    beat: float | None = None

    @property
    def caveats(self) -> list[str]:
        """Plain-language warnings about the ranking (empty when there are none): joint draws that rest on
        fewer than :data:`MIN_COMPONENT_ESS` effective population draws give rough ``p_best`` and ``p_beats``."""
        if np.isfinite(self.component_ess) and self.component_ess < MIN_COMPONENT_ESS:
            return [
                f"p_best and p_beats rest on about {self.component_ess:.0f} effective population draws (fewer than {MIN_COMPONENT_ESS}): "
                "the runs agree on few population draws, so these probabilities are rough to a few percent"
            ]
        return []

    @property
    def p_best(self) -> pd.Series:
        """Probability that each run ends highest of the sweep (ties split evenly); sums to 1."""
        top = self.finals.max(axis=1, keepdims=True)
        at_top = self.finals == top
        share = at_top / at_top.sum(axis=1, keepdims=True)
        return pd.Series(share.mean(axis=0), index=self.run_ids, name="p_best")

    def p_beats(self, value: float) -> pd.Series:
        """Probability that each run's final reward ends above ``value``.

        Parameters
        ----------
        value : float
            A reward, in the runs' own units (e.g. the best final reward seen so far).

        Returns
        -------
        pandas.Series
            Indexed by run id.

        Raises
        ------
        ModelError
            When ``value`` is not a finite number.
        """
        if not _is_finite_number(value):
            raise ModelError(f"p_beats needs a finite number, got {value!r}")
        return pd.Series((self.finals > float(value)).mean(axis=0), index=self.run_ids, name="p_beats")

    @property
    def table(self) -> pd.DataFrame:
        """One row per run, best first: ``run_id, step, total_steps, finished, mean, q05, q50, q95, p_best``
        (and ``p_beats`` when :func:`rank` was given ``beat``)."""
        quantiles = np.quantile(self.finals, TABLE_QUANTILES, axis=0)
        frame = pd.DataFrame(
            {
                "run_id": self.run_ids,
                "step": self.steps.astype(int),
                "total_steps": self.total_steps.astype(int),
                "finished": self.finished,
                "mean": self.finals.mean(axis=0),
                **{f"q{int(round(q * 100)):02d}": row for q, row in zip(TABLE_QUANTILES, quantiles)},
                "p_best": self.p_best.to_numpy(),
            }
        )
        if self.beat is not None:
            frame["p_beats"] = self.p_beats(self.beat).to_numpy()
        return frame.sort_values(["p_best", "mean"], ascending=False, kind="stable").reset_index(drop=True)

    def trajectories(self, run_id: str) -> np.ndarray:
        """The joint draws' trajectories of one run on its forecast grid: (n_joint_draws, grid size)."""
        i = self.run_ids.index(run_id)
        return self.forecasts[i].draws[self.picks[:, i]]

    def plot(self, ax: Axes | None = None) -> Axes:
        """All runs' fans on one axis: the logged rewards, and for runs still going the median and
        90% band of the forecast from the joint draws, each run in its own colour."""
        import matplotlib.pyplot as plt

        ax = ax or plt.subplots(figsize=(8, 4.5))[1]
        p_best = self.p_best
        for i, (run_id, fc) in enumerate(zip(self.run_ids, self.forecasts)):
            colour = f"C{i % 10}"
            label = f"{run_id} (p_best {p_best[run_id]:.2f})"
            ax.plot(fc.observed_steps, fc.observed_rewards, color=colour, lw=0.6, alpha=0.7, label=label)
            if self.finished[i]:
                ax.plot([fc.total_steps], [self.finals[0, i]], "o", color=colour, ms=4)
                continue
            ahead = fc.steps >= (fc.last_observed_step or 0)
            lo, mid, hi = np.quantile(self.trajectories(run_id)[:, ahead], [0.05, 0.5, 0.95], axis=0)
            ax.fill_between(fc.steps[ahead], lo, hi, color=colour, alpha=0.15, lw=0)
            ax.plot(fc.steps[ahead], mid, color=colour, lw=1.4)
        ax.set_xlabel("step")
        ax.set_ylabel("reward")
        ax.set_title("forecasts of the sweep (median and 90% band)", fontsize=9)
        ax.legend(fontsize=7, loc="best")
        return ax

    def __str__(self) -> str:
        return self.table.to_string(index=False, float_format=lambda v: f"{v:.4g}")


def rank(
    model: SweepModel,
    runs: Iterable[RunLog],
    total_steps: int | None = None,
    *,
    family: str | None = None,
    params_b: float | None = None,
    beat: float | None = None,
    components: int = COUPLING_COMPONENTS,
    n_draws: int = RANK_FORECAST_DRAWS,
    joint_draws: int = JOINT_DRAWS,
    seed: int = 0,
) -> Ranking:
    """Rank runs by their forecast final reward, with ``p_best`` from joint draws (module docstring).

    Parameters
    ----------
    model : FittedModel
        The population posterior (e.g. :func:`bayes_grpo.default_model`).
    runs : iterable of RunLog
        At least two runs, with distinct run ids; they may have reached different steps, and some may be finished.
    total_steps : int, optional
        Planned length of every run; default each run's own metadata, which must then agree
        (final rewards are compared at one planned length).
    family, params_b : optional
        Model family and size for every run (default: each run's metadata).
    beat : float, optional
        Add a ``p_beats`` column to the table: the probability of ending above this value.
    components : int
        Population draws the runs are coupled through (at most the model's draws).
    n_draws : int
        Forecast draws per run.
    joint_draws : int
        Joint draws of the final rewards.
    seed : int
        Seed of the forecasts (each run's own, derived from this and its id) and the joint draws.

    Returns
    -------
    Ranking

    Raises
    ------
    ModelError
        Fewer than two runs, repeated run ids, an unknown or disagreeing planned length,
        a run logged beyond its planned length, or a ``beat`` that is not a number.

    Example
    -------
    >>> ranking = rank(bg.default_model(), [r.head(75) for r in sweep], total_steps=250)  # doctest: +SKIP
    >>> print(ranking)  # doctest: +SKIP
    """
    runs = list(runs)
    _check_runs(runs)
    if beat is not None and not _is_finite_number(beat):
        raise ModelError(f"beat must be a finite number, got {beat!r}")
    for name, value in (("components", components), ("n_draws", n_draws), ("joint_draws", joint_draws)):
        if not isinstance(value, (int, np.integer)) or value < 2:
            raise ModelError(f"{name} must be a whole number of at least 2, got {value!r}")
    total = _planned_length(runs, total_steps)
    n_population = next(iter(model.population_arrays().values())).shape[-1]
    rng = np.random.default_rng([seed, n_population])
    draws = coupling_draws(model, components, rng)
    forecasts, finals, log_resp = [], [], []
    for run in runs:
        fc = model.forecast(run, total_steps=total, family=family, params_b=params_b, n_draws=n_draws, seed=_run_seed(seed, run.run_id))
        forecasts.append(fc)
        done = run.last_step >= total
        finals.append(np.full(n_draws, final_reward(run.rewards)) if done else fc.final.samples)
        log_resp.append(log_responsibilities(model, fc, draws, rng))
    finals_arr, picks, ess = joint_finals(finals, log_resp, joint_draws, rng)
    return Ranking(
        run_ids=[run.run_id for run in runs],
        steps=np.array([run.last_step for run in runs]),
        total_steps=np.full(len(runs), total),
        finished=np.array([run.last_step >= total for run in runs]),
        finals=finals_arr,
        forecasts=forecasts,
        picks=picks,
        component_ess=ess,
        beat=None if beat is None else float(beat),
    )


def _is_finite_number(value: Any) -> bool:
    return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool) and bool(np.isfinite(value))


def _check_runs(runs: Sequence[Any]) -> None:
    if not all(isinstance(run, RunLog) for run in runs):
        kinds = sorted({type(run).__name__ for run in runs if not isinstance(run, RunLog)})
        raise ModelError(f"rank needs RunLog objects (bg.read_log, bg.load_runs), got {', '.join(kinds)}")
    if len(runs) < 2:
        raise ModelError(f"rank compares runs: it needs at least two, got {len(runs)}")
    ids = [run.run_id for run in runs]
    repeated = sorted({i for i in ids if ids.count(i) > 1})
    if repeated:
        raise ModelError(f"rank needs distinct run ids; repeated: {', '.join(repeated)}")


def _planned_length(runs: Sequence[RunLog], total_steps: int | None) -> int:
    """The one planned length the runs are compared at (given, else their metadata's, which must agree)."""
    if total_steps is not None:
        if not isinstance(total_steps, (int, np.integer)) or isinstance(total_steps, bool) or total_steps < 1:
            raise ModelError(f"total_steps must be a whole number of at least 1, got {total_steps!r}")
        total = int(total_steps)
    else:
        plans = {run.run_id: run.total_steps for run in runs}
        unknown = [run_id for run_id, plan in plans.items() if plan is None]
        if unknown:
            raise ModelError(f"the planned length of {', '.join(unknown)} is unknown; pass total_steps= (the trainer's max_steps)")
        if len(set(plans.values())) > 1:
            shown = ", ".join(f"{run_id}: {plan}" for run_id, plan in plans.items())
            raise ModelError(f"the runs plan different lengths ({shown}); pass total_steps= to compare their final rewards at one length")
        total = int(next(iter(plans.values())))
    beyond = [f"{run.run_id} (step {run.last_step})" for run in runs if run.last_step > total]
    if beyond:
        raise ModelError(f"runs logged beyond total_steps={total}: {', '.join(beyond)}; pass their planned length")
    return total


def _run_seed(seed: int, run_id: str) -> int:
    """A forecast seed for one run, stable whatever the order of the runs."""
    return (seed * 1_000_003 + zlib.crc32(run_id.encode())) % 2**32


def unconstrained(params: dict[str, np.ndarray], gain_at: str) -> np.ndarray:
    """Per-draw unconstrained parameters (columns :data:`~bayes_grpo.population.PARAMS`) from a forecast's
    natural ones (:attr:`Forecast.params`): the inverse of :func:`bayes_grpo.population.natural`."""
    gain = params["end_gain"] if gain_at == "plan_end" else params["gain"]
    columns = {
        "r0": params["r0"],
        "asinh_gain": np.arcsinh(gain),
        "log_tau": np.log(params["tau"]),
        "log_beta": np.log(params["beta"]),
        "log_sigma": np.log(params["sigma"]),
    }
    return np.column_stack([np.broadcast_to(columns[name], np.shape(params["r0"])) for name in PARAMS])


def coupling_draws(model: PopulationPosterior, components: int, rng: np.random.Generator) -> np.ndarray:
    """The population draws (sorted indices) a sweep's joint draws are coupled through, ``components`` of them at most."""
    n_population = next(iter(model.population_arrays().values())).shape[-1]
    return np.sort(rng.choice(n_population, size=min(components, n_population), replace=False))


def log_responsibilities(model: PopulationPosterior, fc: Forecast, draws: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """(n_draws, len(draws)): log probability that each forecast draw's parameters came from each population draw,
    plus the log of that draw's share of the forecast (so a logsumexp over the forecast draws is log P(c | run))."""
    prior = RunPrior(model, fc.prepared, rng, n_components=1)
    mean, sd = prior.mean[draws], prior.sd[draws]
    theta = unconstrained(fc.params, model.model_config.gain_at)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a -inf log density at a parameter's boundary
        z = (theta[:, None, :] - mean[None]) / sd[None]
        log_density = -0.5 * np.sum(z**2, axis=2) - np.sum(np.log(sd), axis=1)[None]
    log_density = np.where(np.isfinite(log_density), log_density, -np.inf)
    normaliser = logsumexp(log_density, axis=1, keepdims=True)
    return np.where(np.isfinite(normaliser), log_density - normaliser, -np.log(draws.size)) - np.log(theta.shape[0])


def joint_finals(
    finals: Sequence[np.ndarray], log_resp: Sequence[np.ndarray], size: int, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray, float]:
    """Joint draws of several runs' final rewards, coupled through the population draws (module docstring).

    Parameters
    ----------
    finals : sequence of ndarray
        Per run, its forecast draws of the final reward (a measured final repeated, for a finished run).
    log_resp : sequence of ndarray
        Per run, :func:`log_responsibilities` of its forecast draws (one row per entry of ``finals``).
    size : int
        Joint draws to make.
    rng : numpy.random.Generator

    Returns
    -------
    (ndarray, ndarray, float)
        ``(size, n_runs)`` joint final rewards, ``(size, n_runs)`` the forecast draw each took, and the
        effective number of population draws they rest on.
    """
    log_resp_arr = np.stack(log_resp)  # (run, draw, component)
    log_weight = logsumexp(log_resp_arr, axis=1).sum(axis=0)  # sum over runs of log P(c | run), up to constants
    weight = np.exp(log_weight - logsumexp(log_weight))
    chosen = rng.choice(weight.size, size=size, p=weight)
    picks = np.column_stack([_pick_within(rng, resp, chosen) for resp in log_resp_arr])
    joint = np.column_stack([np.asarray(f)[picks[:, i]] for i, f in enumerate(finals)])
    return joint, picks, float(1.0 / np.sum(weight**2))


def _pick_within(rng: np.random.Generator, log_resp: np.ndarray, chosen: np.ndarray) -> np.ndarray:
    """For each joint draw, one forecast draw of a run, picked by its responsibility for the joint draw's population draw."""
    weights = np.exp(log_resp - logsumexp(log_resp, axis=0, keepdims=True))  # (draw, component), columns sum to 1
    cumulative = np.cumsum(weights, axis=0).T  # (component, draw)
    cumulative[:, -1] = 1.0
    offset = np.arange(cumulative.shape[0])[:, None]
    flat = (cumulative + offset).ravel()  # monotone: component c occupies (c, c + 1]
    position = np.searchsorted(flat, chosen + rng.random(chosen.size), side="right")
    return np.minimum(position - chosen * cumulative.shape[1], cumulative.shape[1] - 1)
