"""Rank the runs of a sweep by their forecast final reward: which run will end best, and by how likely.

A sweep trains one recipe several times with one setting changed. :func:`rank`
forecasts every run (:func:`bayes_grpo.forecast.forecast`) and combines the
forecasts into **joint** draws of the runs' final rewards, from which it reads,
per run, the forecast final reward (mean and quantiles), ``p_best`` (the
probability that the run ends highest of those given) and ``p_beats(value)``
(the probability that it ends above ``value``). The Optuna pruner
(:class:`bayes_grpo.integrations.optuna.ForecastPruner`) reads its probabilities
from the same joint draws.

**A sweep is a source.** Its runs share a task, reward functions, model and
length, so what the recipe does later (take off late, saturate early) moves them
together, and their forecasts miss together. Measured on the shared real runs,
cross-validated by source (``benchmarks/results/sweep_coupling.md``), in normal
scores ``z = Phi^-1(F(final))`` of each run's real final under its forecast
``F``: the core of the scores is close to calibrated, but a tenth of the runs
seen at 20-30% of their plan end far above their forecast (late take-offs), and
about half the variance of the scores' ranks is shared by the runs of one
source. :class:`SweepCoupling` keeps, per share of the plan observed, the
distribution ``G`` of real scores and that shared share ``rho``, and joint draws
follow them through a Gaussian copula::

    x_i = sqrt(rho) w + sqrt(1 - rho) e_i,    w, e_i ~ N(0, 1)
    final_i = Q_i(G^-1(Phi(x_i)))

with ``Q_i`` the run's forecast quantile in normal scores (:class:`ScoreMap`:
interpolated between the forecast draws' quantiles, its tails continued
linearly). The sweep's shared effect ``w`` is one draw for all its runs, so a
difference between two runs is forecast with it cancelled: only the
``sqrt(1 - rho)`` parts differ. It is conditioned on the sweep's **finished
runs**: a finished run's score in its forecast from the share of the plan that
the runs still going have reached is an observation of ``w``
(:meth:`SweepCoupling.shared_effect`), so a sweep whose finished runs ended
above their forecasts lifts the forecasts of the runs still going, and one whose
runs ended below them lowers them. A finished run's own final is its measured
final-window mean (:func:`bayes_grpo.measures.final_reward`). Joint finals are kept within :func:`sweep_bounds` (the declared reward range, else a
spread beyond the rewards the sweep's runs have logged) and each run's own reachable range (declared,
or inferred from ``reward_std``), never narrower than a run's own forecast (its 1-99% quantiles). :data:`FORECAST_ALONE` (``coupling=FORECAST_ALONE``)
draws every run independently from its forecast as it is.

**rank and forecast agree.** :func:`rank` forecasts every run as :func:`bayes_grpo.forecast.forecast` does (with fewer
particles and draws), through the model's calibration layer (:mod:`bayes_grpo.recalibration`), which already puts real
finals where they land; ``G`` is then the standard normal (:meth:`SweepCoupling.for_calibrated`), so with no finished run
a run's final in the ranking is drawn from its forecast. ``calibrated=False`` ranks on the raw forecasts through ``G``,
as the Optuna pruner does (its probabilities of ending above a bar were tuned on those).
"""

from __future__ import annotations

import json
import os
import warnings
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import pandas as pd
from scipy.stats import norm

from bayes_grpo.errors import ModelError, PlanError
from bayes_grpo.forecast import Forecast, forecast_many, within_shared_ceiling
from bayes_grpo.forecast.result import sweep_caveats
from bayes_grpo.logs import RunLog
from bayes_grpo.logs.plan import planned_length
from bayes_grpo.measures import final_reward, reward_spread
from bayes_grpo.population import PopulationPosterior

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

#: Joint draws of the runs' final rewards.
JOINT_DRAWS = 4000
#: Forecast draws, importance-sampling particles and grid steps per run: half of a forecast's own draws and particles and a
#: fifth of its grid, for speed (``benchmarks/rank_speed.py``); each run's final is the same forecast's, within Monte Carlo noise.
RANK_FORECAST_DRAWS, RANK_PARTICLES, RANK_GRID_POINTS = 500, 1500, 100
#: Quantiles of the final reward in the ranking table.
TABLE_QUANTILES = (0.05, 0.5, 0.95)
#: Probability levels at which a forecast's draws are read into a :class:`ScoreMap` (finer in the tails,
#: where a pruner's probabilities are decided).
MAP_LEVELS = (0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.98, 0.99)
#: Fewest logged steps a finished run needs at the cut to be forecast from there (its score then informs the sweep).
MIN_CUT_POINTS = 5
#: Probability levels at which :class:`SweepCoupling` keeps the distribution of real scores.
COUPLING_LEVELS = (0.02, 0.05, 0.1, 0.25, 0.5, 0.75, 0.9, 0.95, 0.98)
#: Normal scores are kept within this many SDs (a value beyond a flat tail would otherwise be infinitely far).
MAX_SCORE = 50.0


class SweepModel(PopulationPosterior, Protocol):
    """A population posterior that forecasts runs, e.g. :class:`bayes_grpo.model.FittedModel`."""

    def forecast(self, run: RunLog | None = None, total_steps: int | None = None, **kwargs: Any) -> Forecast: ...


@dataclass(frozen=True)
class ScoreMap:
    """A forecast's quantile function in normal scores: value at score ``z`` and score of a value.

    Piecewise linear between the quantiles at ``levels`` (normal scores ``Phi^-1(level)``), continued
    linearly beyond the outermost ones with the slope of the outermost two on each side (a normal tail
    of the forecast's own width there), so scores beyond the draws still map to values.

    Example
    -------
    >>> m = ScoreMap.from_draws(np.random.default_rng(0).normal(1.0, 0.5, 4000))
    >>> round(float(m.value(0.0)), 1), round(float(m.score(1.5)), 1)
    (1.0, 1.0)
    """

    scores: np.ndarray
    values: np.ndarray

    @classmethod
    def from_quantiles(cls, levels: Sequence[float], quantiles: Sequence[float]) -> ScoreMap:
        """From quantiles at probability ``levels`` (increasing, in (0, 1)); quantiles are made non-decreasing."""
        return cls(norm.ppf(np.asarray(levels, float)), np.maximum.accumulate(np.asarray(quantiles, float)))

    @classmethod
    def from_draws(cls, draws: np.ndarray, levels: Sequence[float] = MAP_LEVELS) -> ScoreMap:
        """From a forecast's draws (e.g. :attr:`Forecast.final` samples)."""
        return cls.from_quantiles(levels, np.quantile(np.asarray(draws, float), levels))

    def _slopes(self) -> tuple[float, float]:
        z, q = self.scores, self.values
        return (q[1] - q[0]) / (z[1] - z[0]), (q[-1] - q[-2]) / (z[-1] - z[-2])

    def value(self, z: np.ndarray | float) -> np.ndarray:
        """The value at normal score(s) ``z``."""
        z = np.asarray(z, float)
        low, high = self._slopes()
        inside = np.interp(z, self.scores, self.values)
        below = self.values[0] + (z - self.scores[0]) * low
        above = self.values[-1] + (z - self.scores[-1]) * high
        return np.where(z < self.scores[0], below, np.where(z > self.scores[-1], above, inside))

    def bounded_value(self, z: np.ndarray, low: float, high: float) -> np.ndarray:
        """:meth:`value`, kept within ``[low, high]`` widened to the map's own outermost quantiles (a bound never
        cuts into the forecast itself)."""
        return np.clip(self.value(z), min(low, self.values[0]), max(high, self.values[-1]))

    def score(self, value: float) -> float:
        """The normal score of ``value`` (within +-:data:`MAX_SCORE`): ``Phi^-1`` of the forecast probability of at most it."""
        low, high = self._slopes()
        q, z = self.values, self.scores
        if value < q[0]:
            found = z[0] + (value - q[0]) / low if low > 0 else -np.inf
        elif value > q[-1]:
            found = z[-1] + (value - q[-1]) / high if high > 0 else np.inf
        else:  # a flat stretch (tied quantiles) made strictly increasing by a negligible amount
            found = np.interp(value, q + 1e-12 * np.arange(q.size), z)
        return float(np.clip(found, -MAX_SCORE, MAX_SCORE))


@dataclass(frozen=True)
class SweepCoupling:
    """How the forecasts of one sweep's runs miss together, in normal scores (module docstring).

    Real finals, as normal scores ``z`` in their forecasts, are not standard normal: the core is
    close to calibrated, but a tenth of the runs seen at 20-30% of their plan end far above their
    forecast (a late take-off the curve did not expect). The coupling therefore keeps the scores'
    **distribution** ``G`` per share of the plan (its quantiles at :data:`COUPLING_LEVELS`) and couples
    runs through a Gaussian copula on ``x = Phi^-1(G(z))``::

        x_i = sqrt(rho) w + sqrt(1 - rho) e_i,    z_i = G^-1(Phi(x_i)),    final_i = Q_i(z_i)

    Attributes
    ----------
    fractions : tuple of float
        Shares of the plan observed at which the figures were measured; between them they are
        interpolated (quantile by quantile), beyond them the nearest is used.
    score_quantiles : tuple of tuple of float
        Per fraction, the quantiles of the real scores at :data:`COUPLING_LEVELS` (for calibrated forecasts
        they would be ``Phi^-1`` of the levels).
    correlation : tuple of float
        Per fraction, the share of the variance of ``x`` shared by the runs of one sweep (``rho``, in [0, 1)).

    Example
    -------
    >>> bg.default_model().sweep_coupling.at(0.3).value(0.0)  # doctest: +SKIP
    """

    fractions: tuple[float, ...]
    score_quantiles: tuple[tuple[float, ...], ...]
    correlation: tuple[float, ...]

    def __post_init__(self) -> None:
        if not self.fractions or not len(self.fractions) == len(self.score_quantiles) == len(self.correlation):
            raise ModelError("a SweepCoupling needs one row of score quantiles and one correlation per fraction")
        if list(self.fractions) != sorted(set(self.fractions)):
            raise ModelError(f"SweepCoupling fractions must increase, got {self.fractions}")
        if any(len(row) != len(COUPLING_LEVELS) for row in self.score_quantiles) or not all(0 <= r < 1 for r in self.correlation):
            raise ModelError(f"SweepCoupling needs {len(COUPLING_LEVELS)} score quantiles per fraction and correlations in [0, 1)")

    def at(self, fraction: float) -> ScoreMap:
        """The scores' distribution ``G`` at a share of the plan, as a map from ``x`` to ``z``."""
        rows = np.asarray(self.score_quantiles, float)
        quantiles = [np.interp(fraction, self.fractions, rows[:, j]) for j in range(rows.shape[1])]
        return ScoreMap.from_quantiles(COUPLING_LEVELS, quantiles)

    def rho(self, fraction: float) -> float:
        """The shared share ``rho`` at a share of the plan."""
        return float(np.interp(fraction, self.fractions, self.correlation))

    def shared_effect(self, fraction: float, finished_scores: Sequence[float] = ()) -> tuple[float, float]:
        """Mean and SD of the sweep's shared effect ``w`` given its finished runs' normal scores.

        Each score ``z_j`` (a finished run's real final in its forecast from ``fraction`` of its plan)
        gives ``x_j = Phi^-1(G(z_j)) ~ N(sqrt(rho) w, 1 - rho)``; with the prior ``w ~ N(0, 1)`` the
        posterior is Normal with precision ``1 + n rho / (1 - rho)``.
        """
        rho, spread = self.rho(fraction), self.at(fraction)
        latent = np.array([spread.score(z) for z in finished_scores], float)
        precision = 1.0 + latent.size * rho / (1.0 - rho)
        return float(np.sqrt(rho) / (1.0 - rho) * latent.sum() / precision), float(1.0 / np.sqrt(precision))

    def draw_scores(
        self, fraction: float, n_runs: int, size: int, rng: np.random.Generator, finished_scores: Sequence[float] = ()
    ) -> np.ndarray:
        """(size, n_runs) joint normal scores ``z`` of ``n_runs`` forecast runs of one sweep: one shared ``w``
        per row, drawn from :meth:`shared_effect`, and an own part per run."""
        rho = self.rho(fraction)
        mean, spread = self.shared_effect(fraction, finished_scores)
        shared = mean + spread * rng.standard_normal((size, 1))
        latent = np.sqrt(rho) * shared + np.sqrt(1.0 - rho) * rng.standard_normal((size, n_runs))
        return self.at(fraction).value(latent)

    def joint_finals(
        self,
        fraction: float,
        samples: Sequence[np.ndarray],
        size: int,
        rng: np.random.Generator,
        finished_scores: Sequence[float] = (),
        bounds: tuple[float, float] | Sequence[tuple[float, float]] = (-np.inf, np.inf),
    ) -> tuple[np.ndarray, np.ndarray]:
        """(size, n) joint draws of the finals of ``n`` forecast runs of one sweep (each run's forecast draws of its final in
        ``samples``), kept within ``bounds`` (one pair, or one per run), and the normal scores they were read at."""
        z = self.draw_scores(fraction, len(samples), size, rng, finished_scores)
        finals = np.empty_like(z)
        for i, (draws, (low, high)) in enumerate(zip(samples, [bounds] * len(samples) if np.ndim(bounds) == 1 else bounds)):
            finals[:, i] = ScoreMap.from_draws(draws).bounded_value(z[:, i], low, high)
        return finals, z

    def for_calibrated(self) -> SweepCoupling:
        """The coupling of calibrated forecasts: the same shared share ``rho``, with standard normal scores ``G``.

        A calibrated forecast already places real finals where they land (its layer was learned on the same
        kind of held-out misses ``G`` describes), so its draws are kept as they are and only how a sweep's
        runs miss together remains: with no finished run, each run's marginal is its forecast.
        """
        standard = tuple(float(v) for v in norm.ppf(COUPLING_LEVELS))
        return SweepCoupling(self.fractions, tuple(standard for _ in self.fractions), self.correlation)

    def to_json(self, fit_id: str) -> str:
        """JSON of the coupling and the id of the fit it was measured for (stored in the model file)."""
        return json.dumps({"fractions": self.fractions, "score_quantiles": self.score_quantiles, "correlation": self.correlation, "fit_id": fit_id})

    @classmethod
    def from_json(cls, text: str) -> tuple[SweepCoupling, str]:
        """The coupling stored by :meth:`to_json`, and the fit id it was measured for."""
        data = json.loads(text)
        rows = tuple(tuple(float(v) for v in row) for row in data["score_quantiles"])
        return cls(tuple(float(v) for v in data["fractions"]), rows, tuple(float(v) for v in data["correlation"])), str(data["fit_id"])

    @classmethod
    def from_table(cls, table: pd.DataFrame) -> SweepCoupling:
        """The coupling of ``benchmarks/results/sweep_coupling.csv`` (columns ``fraction``, ``z_qNN`` per level, ``correlation``)."""
        columns = [f"z_q{round(100 * level):02d}" for level in COUPLING_LEVELS]
        missing = [c for c in ("fraction", *columns, "correlation") if c not in table]
        if missing:
            raise ModelError(f"a sweep-coupling table needs the columns fraction, {', '.join(columns)} and correlation; missing {', '.join(missing)}")
        table = table.sort_values("fraction")
        rows = tuple(tuple(float(v) for v in row) for row in table[columns].to_numpy())
        return cls(tuple(float(v) for v in table["fraction"]), rows, tuple(float(v) for v in table["correlation"]))

    @classmethod
    def measure(cls, scores: pd.DataFrame, cap: int = 3, repeats: int = 50, seed: int = 0) -> SweepCoupling:
        """The scores' quantiles and shared share per fraction, each source counted as at most ``cap`` runs.

        Parameters
        ----------
        scores : DataFrame
            Columns ``fraction``, ``source`` and ``score``: each held-out run's real final as a normal
            score in its forecast (:meth:`ScoreMap.score`), one row per run and fraction.
        cap, repeats, seed
            Every figure is averaged over ``repeats`` random picks of at most ``cap`` runs per source.
            The shared share is the one-way ANOVA intraclass correlation of ``x = Phi^-1(G(z))`` (ranks
            of the scores, so a few far misses do not decide it) over the sources with two or more runs,
            clipped to [0, 0.95].

        Returns
        -------
        SweepCoupling
        """
        rng = np.random.default_rng(seed)
        fractions, quantiles, rho = [], [], []
        for fraction, group in scores.groupby("fraction"):
            picks = [group.sample(frac=1.0, random_state=rng.integers(2**31)).groupby("source").head(cap) for _ in range(repeats)]
            fractions.append(float(fraction))
            quantiles.append(tuple(float(v) for v in np.mean([np.quantile(pick["score"], COUPLING_LEVELS) for pick in picks], axis=0)))
            latent = [pick.assign(score=norm.ppf((pick["score"].rank() - 0.5) / len(pick))) for pick in picks]
            rho.append(float(np.clip(np.mean([_intraclass_correlation(pick) for pick in latent]), 0.0, 0.95)))
        return cls(tuple(fractions), tuple(quantiles), tuple(rho))


def _intraclass_correlation(frame: pd.DataFrame) -> float:
    """One-way ANOVA intraclass correlation of ``score`` within ``source`` (sources with at least two rows)."""
    groups = [g.to_numpy() for _, g in frame.groupby("source")["score"] if len(g) >= 2]
    if len(groups) < 2:
        return 0.0
    n, k = sum(map(len, groups)), len(groups)
    grand = np.concatenate(groups).mean()
    between = sum(len(g) * (g.mean() - grand) ** 2 for g in groups) / (k - 1)
    within = sum(((g - g.mean()) ** 2).sum() for g in groups) / (n - k)
    size = (n - sum(len(g) ** 2 for g in groups) / n) / (k - 1)
    return float((between - within) / (between + (size - 1) * within))


#: Every run drawn independently from its forecast as it is (no sweep coupling, no calibration).
FORECAST_ALONE = SweepCoupling(fractions=(0.0,), score_quantiles=(tuple(norm.ppf(COUPLING_LEVELS)),), correlation=(0.0,))


def model_coupling(model: Any) -> SweepCoupling:
    """The sweep coupling stored with ``model``'s fit (``FittedModel.sweep_coupling``), else :data:`FORECAST_ALONE`.

    The coupling is learned from a fit's own held-out forecasts (``benchmarks/sweep_coupling.py``), so it
    lives in the model file beside the fit it was measured for; a fit without one ranks on its forecasts alone.
    """
    coupling = getattr(model, "sweep_coupling", None)
    return coupling if isinstance(coupling, SweepCoupling) else FORECAST_ALONE


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
        (n_joint_draws, n_runs) for each joint draw, the forecast draw of each run at its quantile (0 for finished runs).
    fraction : float
        Share of the plan the runs still going have reached (their median): where the coupling is read.
    finished_scores : ndarray
        Normal scores of the finished runs' finals in their forecasts from ``fraction`` of their plan:
        what the sweep's shared effect was conditioned on (empty when no run has finished).
    shared_effect : (float, float)
        Mean and SD of the sweep's shared effect ``w`` (:meth:`SweepCoupling.shared_effect`): above 0
        when the finished runs ended above their forecasts.
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
    fraction: float = float("nan")
    finished_scores: np.ndarray = field(default_factory=lambda: np.empty(0), repr=False)
    shared_effect: tuple[float, float] = (0.0, 1.0)
    beat: float | None = None

    @property
    def caveats(self) -> list[str]:
        """Plain-language warnings about the ranking (empty when there are none): the caveats of the forecasts of the runs
        still going (rough draws, a run outside the population, a missing learning signal), with their run ids
        (:func:`~bayes_grpo.forecast.result.sweep_caveats`)."""
        return sweep_caveats([(run_id, fc) for run_id, fc, done in zip(self.run_ids, self.forecasts, self.finished) if not done])

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
        """One row per run, best first (by the median final ``q50``, the point forecast; ties by ``p_best``):
        ``run_id, step, total_steps, finished, mean, q05, q50, q95, p_best`` (and ``p_beats`` when :func:`rank` was
        given ``beat``)."""
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
        # Best first by the median final (the point forecast): on the shared real sweeps its order agreed with the runs'
        # final order more often than p_best's (benchmarks/results/backtest_sweeps.md), whose draws favour wide forecasts.
        return frame.sort_values(["q50", "p_best"], ascending=False, kind="stable").reset_index(drop=True)

    def trajectories(self, run_id: str) -> np.ndarray:
        """The joint draws' trajectories of one run on its forecast grid: (n_joint_draws, grid size): for each joint draw,
        the forecast draw at its quantile (a joint draw beyond all the forecast's draws shows the outermost one)."""
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

    def plot_fans(self, columns: int = 4) -> Figure:
        """One panel per run, side by side on a shared reward axis, best ``p_best`` first: the logged rewards (the
        other runs' faint behind), for runs still going the forecast's median, 50% and 90% bands, and at the plan's
        end the 90% interval of the run's final from the joint draws (the sweep's coupling included)."""
        import matplotlib.pyplot as plt

        from bayes_grpo.plotting import draw_fan

        order = [self.run_ids.index(run_id) for run_id in self.table["run_id"]]
        columns = max(1, min(columns, len(order)))
        rows = -(-len(order) // columns)
        figure, axes = plt.subplots(rows, columns, figsize=(3.2 * columns, 2.5 * rows), sharex=True, sharey=True, squeeze=False, layout="constrained")
        prefix = os.path.commonprefix(self.run_ids) if len(self.run_ids) > 1 else ""
        p_best = self.p_best
        low, high = np.quantile(self.finals, [0.05, 0.95], axis=0)
        for ax, i in zip(axes.flat, order):
            for other in self.forecasts:
                ax.plot(other.observed_steps, other.observed_rewards, color="0.85", lw=0.5)
            fc = self.forecasts[i]
            if self.finished[i]:
                ax.plot(fc.observed_steps, fc.observed_rewards, color="k", lw=0.8)
            else:
                draw_fan(ax, fc, colour="C1", ahead_only=True, labels=False)
            middle = float(np.median(self.finals[:, i]))
            ax.errorbar([fc.total_steps], [middle], yerr=[[middle - low[i]], [high[i] - middle]], fmt="o", color="C3", ms=3, capsize=3, lw=1)
            ax.set_title(f"{self.run_ids[i][len(prefix):] or self.run_ids[i]}\np_best {p_best.iloc[i]:.2f}", fontsize=8)
            ax.tick_params(labelsize=7)
        for ax in axes.flat[len(order):]:
            ax.set_visible(False)
        figure.supxlabel("step", fontsize=8)
        figure.supylabel("reward", fontsize=8)
        return figure

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
    coupling: SweepCoupling | None = None,
    calibrated: bool = True,
    n_draws: int = RANK_FORECAST_DRAWS,
    joint_draws: int = JOINT_DRAWS,
    seed: int = 0,
    n_jobs: int | None = None,
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
    coupling : SweepCoupling, optional
        How the runs' forecasts miss together; default the model's own (:func:`model_coupling`: measured
        on real runs for the shipped model and stored in its file); :data:`FORECAST_ALONE` draws each
        run independently from its forecast as it is.
    calibrated : bool
        Forecast through the model's calibration layer, as :func:`bayes_grpo.forecast.forecast` does by default
        (then the coupling ties the runs with its shared share only, :meth:`SweepCoupling.for_calibrated`, and with no
        finished run each run's final is drawn from exactly its forecast). False: the raw forecasts, drawn through the
        coupling's distribution of real misses (what :class:`~bayes_grpo.integrations.optuna.ForecastPruner` does). A
        model without a layer gives raw forecasts either way, and they are drawn through that distribution.
    n_draws : int
        Forecast draws per run (made from :data:`RANK_PARTICLES` particles on a grid of :data:`RANK_GRID_POINTS` steps).
    joint_draws : int
        Joint draws of the final rewards.
    seed : int
        Seed of the forecasts (each run's own, derived from this and its id) and the joint draws.
    n_jobs : int, optional
        Threads the runs' forecasts are made on (joblib; NumPy does the work outside the interpreter
        lock); default one per CPU core. The result does not depend on it.

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
    coupling = model_coupling(model) if coupling is None else coupling
    if not isinstance(coupling, SweepCoupling):
        raise ModelError(f"coupling must be a SweepCoupling (e.g. bayes_grpo.sweeps.FORECAST_ALONE), got {coupling!r}")
    for name, value in (("n_draws", n_draws), ("joint_draws", joint_draws)):
        if not isinstance(value, (int, np.integer)) or value < 2:
            raise ModelError(f"{name} must be a whole number of at least 2, got {value!r}")
    total = _planned_length(runs, total_steps)
    finished = np.array([run.last_step >= total for run in runs])
    options = {"total_steps": total, "family": family, "params_b": params_b, "n_draws": n_draws, "calibrated": bool(calibrated),
               "n_particles": RANK_PARTICLES, "grid_points": RANK_GRID_POINTS}  # fmt: skip
    forecasts = within_shared_ceiling(_forecast_runs(model, runs, options, seed, n_jobs))
    if all(fc.calibrated for fc in forecasts):  # the layer is the calibration: keep each forecast as it is
        coupling = coupling.for_calibrated()
    going = sorted((i for i in range(len(runs)) if not finished[i]), key=lambda i: runs[i].run_id)  # by id: any order of the runs gives one ranking
    fraction = float(np.median([runs[i].last_step / total for i in going])) if going else 1.0
    done = sorted((run for run, is_done in zip(runs, finished) if is_done), key=lambda run: run.run_id)
    scores = _finished_scores(model, done if going else [], fraction, total, options, seed, n_jobs)
    rng = np.random.default_rng([seed, len(runs)])
    ranges = {run.reward_range for run in runs}
    low, high = sweep_bounds([run.rewards for run in runs], ranges.pop() if len(ranges) == 1 else None)
    limits = [(max(low, own[0]), min(high, own[1])) for own in (forecasts[i].prepared.bounds or (low, high) for i in going)]
    joint, z = coupling.joint_finals(fraction, [forecasts[i].final.samples for i in going], joint_draws, rng, scores, limits)
    finals = np.tile([final_reward(run.rewards) if done_ else np.nan for run, done_ in zip(runs, finished)], (joint_draws, 1))
    picks = np.zeros((joint_draws, len(runs)), dtype=int)
    for column, i in enumerate(going):
        finals[:, i] = joint[:, column]
        picks[:, i] = _nearest_draws(forecasts[i].final.samples, z[:, column])
    return Ranking(
        run_ids=[run.run_id for run in runs],
        steps=np.array([run.last_step for run in runs]),
        total_steps=np.full(len(runs), total),
        finished=finished,
        finals=finals,
        forecasts=forecasts,
        picks=picks,
        fraction=fraction,
        finished_scores=scores,
        shared_effect=coupling.shared_effect(fraction, scores),
        beat=None if beat is None else float(beat),
    )


def sweep_bounds(rewards: Sequence[np.ndarray], reward_range: tuple[float, float] | None = None) -> tuple[float, float]:
    """The finals a sweep's joint draws may reach: its declared reward range, else the logged rewards of all its runs
    widened by their 10-90% spread on each side.

    The distribution of real scores has a long upper tail (late take-offs, measured in units of each forecast's own
    width), so a run with a wide forecast would otherwise be drawn to implausible heights; a run of the sweep can end
    up to a spread beyond the best any of its runs has logged.
    """
    if reward_range is not None:
        return float(reward_range[0]), float(reward_range[1])
    logged = np.concatenate([np.asarray(r, float) for r in rewards])
    spread = reward_spread(logged)
    return float(logged.min() - spread), float(logged.max() + spread)


def _forecast_runs(model: SweepModel, runs: Sequence[RunLog], options: dict[str, Any], seed: int, n_jobs: int | None) -> list[Forecast]:
    """Every run's forecast, made together (:func:`bayes_grpo.forecast.forecast_many`) on ``n_jobs`` threads; their warnings
    are gathered and given once each from here (``warnings`` filters are process-wide: threads that change them lose some)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        forecasts = forecast_many(model, runs, seeds=[_run_seed(seed, run.run_id) for run in runs], n_jobs=n_jobs, **options)
    for message, category in dict.fromkeys((str(w.message), w.category) for w in caught):
        warnings.warn(message, category, stacklevel=3)
    return forecasts


def _finished_scores(model: SweepModel, done: Sequence[RunLog], fraction: float, total: int, options: dict[str, Any], seed: int, n_jobs: int | None) -> np.ndarray:
    """The finished runs' measured finals as normal scores in their forecasts from ``fraction`` of the plan, made
    together (:func:`bayes_grpo.forecast.forecast_many`); a run that logged too little by then to be forecast is left out."""
    cut = int(round(fraction * total))
    if not (heads := [run.head(cut) for run in done if np.sum(run.steps <= cut) >= MIN_CUT_POINTS]):
        return np.array([])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the cut forecasts' own caveats are not the ranking's
        forecasts = forecast_many(model, heads, seeds=[_run_seed(seed + 1, run.run_id) for run in heads], n_jobs=n_jobs, **options)
    finals = {run.run_id: final_reward(run.rewards) for run in done}
    scores = np.array([ScoreMap.from_draws(fc.final.samples).score(finals[fc.run_id]) for fc in forecasts])
    return scores[np.isfinite(scores)]


def _nearest_draws(samples: np.ndarray, z: np.ndarray) -> np.ndarray:
    """For each normal score, the forecast draw at (or nearest) that quantile: the trajectory a joint draw shows."""
    order = np.argsort(samples, kind="stable")
    position = np.clip((norm.cdf(z) * samples.size).astype(int), 0, samples.size - 1)
    return order[position]


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
    plans = {run.run_id: planned_length(run.total_steps if total_steps is None else total_steps, run.last_step, f"run {run.run_id!r}") for run in runs}
    if len(set(plans.values())) > 1:
        shown = ", ".join(f"{run_id}: {plan}" for run_id, plan in plans.items())
        raise PlanError(f"the runs plan different lengths ({shown}); pass total_steps= to compare their final rewards at one length")
    return next(iter(plans.values()))


def _run_seed(seed: int, run_id: str) -> int:
    """A forecast seed for one run, stable whatever the order of the runs."""
    return (seed * 1_000_003 + zlib.crc32(run_id.encode())) % 2**32
