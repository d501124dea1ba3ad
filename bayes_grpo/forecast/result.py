"""What a forecast returns: :class:`Forecast` (trajectory draws, the final reward, regimes, caveats, tables) and :class:`FinalReward`."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any

import numpy as np
import pandas as pd
import xarray as xr

from bayes_grpo.config import ModelConfig
from bayes_grpo.errors import ModelError
from bayes_grpo.logs import RunLog
from bayes_grpo.population import (
    step_noise,
)  # fmt: skip
from bayes_grpo.prepare import LONG_PLAN_FACTOR, PreparedRun
from bayes_grpo.recalibration import Recalibration
from bayes_grpo.measures import final_window_size, smoothed
from bayes_grpo.settings import FINAL_WINDOW_FRACTION, FORECAST_QUANTILES
from bayes_grpo.forecast.conditioning import MIN_ESS_WARN, PARETO_K_MAX


#: :attr:`Forecast.caveats` says a run lies outside the population above this posterior weight of the wide component.
OUTSIDE_POPULATION_WARN = 0.5
#: :attr:`Forecast.caveats` says a run has fallen and its fall is not forecast to carry on above this decline weight.
DECLINE_WARN = 0.5
#: A change of the reward level counts as material, for the regimes, beyond this many per-step noise SDs.
MATERIAL_NOISE = 1.0
#: :attr:`Forecast.caveats` advises declaring a reward range when nothing bounds the final reward and its 95% quantile
#: lies more than this many times the logged rewards' range above the best logged reward.
UNBOUNDED_TAIL_WARN = 1.0
#: Regimes reported by :attr:`Forecast.regimes`, in order.
REGIMES = ("take_off_ahead", "plateau", "decline")
# Second entry of the seed of the logging noise in Forecast.window_reward (apart from the sampler's streams).
_WINDOW_NOISE_STREAM = 2


#: The advice of :func:`unbounded_tail_note`, the same for one forecast and for a sweep's.
_DECLARE_RANGE = (
    "room for a late take-off; if the reward cannot exceed a maximum (an accuracy's 1, a sum of capped reward functions), "
    "pass reward_range=(min, max) and the forecast stays within it"
)


def unbounded_tail_note(q95: float, ranges: float) -> str:
    """The caveat of a forecast whose upper tail nothing bounds (:meth:`Forecast.unbounded_tail`: its final reward's 95%
    quantile and how many logged ranges that lies above the best logged reward)."""
    return (
        f"nothing bounds the reward, so the final reward's 95% quantile ({q95:.3g}) lies {ranges:.1f} times the logged "
        f"rewards' range above the best logged reward, {_DECLARE_RANGE}"
    )


def sweep_caveats(forecasts: list[tuple[str, Forecast]]) -> list[str]:
    """The caveats of a sweep's forecasts (run id, forecast), each with its run id; the advice to declare a range that
    nothing bounds (:meth:`Forecast.unbounded_tail`) once for all the runs it concerns when there are several, since a
    sweep's runs share their reward functions."""
    tails = {run_id: fc.unbounded_tail() for run_id, fc in forecasts}
    unbounded = [run_id for run_id, tail in tails.items() if tail is not None]
    grouped = len(unbounded) > 1
    notes = [
        f"{run_id}: {note}" for run_id, fc in forecasts for note in fc.caveats
        if not (grouped and tails[run_id] is not None and note == unbounded_tail_note(*tails[run_id]))
    ]  # fmt: skip
    if grouped:
        ranges = [tails[run_id][1] for run_id in unbounded]
        notes.append(
            f"nothing bounds the reward of {len(unbounded)} runs ({', '.join(unbounded)}), so their final rewards' 95% quantiles "
            f"lie {min(ranges):.1f} to {max(ranges):.1f} times their logged rewards' range above their best logged rewards, {_DECLARE_RANGE}"
        )
    return notes


@dataclass
class FinalReward:
    """Posterior predictive draws of one reward quantity (e.g. :attr:`Forecast.final`).

    Parameters
    ----------
    samples : ndarray
        Draws of the quantity, in the run's own reward scale.

    Example
    -------
    >>> final = FinalReward(np.array([0.4, 0.5, 0.6]))
    >>> round(final.mean, 2), final.quantile(0.5)
    (0.5, 0.5)
    """

    samples: np.ndarray

    @property
    def mean(self) -> float:
        """Posterior mean of the final reward (it follows a long upper tail of late take-offs)."""
        return float(np.mean(self.samples))

    @property
    def median(self) -> float:
        """Posterior median: the point forecast (the one absolute error calls for)."""
        return float(np.median(self.samples))

    def quantile(self, q: float | np.ndarray) -> float | np.ndarray:
        """Posterior quantile(s) of the final reward.

        Parameters
        ----------
        q : float or array of float
            Probabilities in [0, 1].

        Returns
        -------
        float or ndarray
            A float for a scalar ``q``, else an array of the same shape.
        """
        value = np.quantile(self.samples, q)
        return float(value) if np.ndim(value) == 0 else value

    def interval(self, mass: float = 0.9) -> tuple[float, float]:
        """Central credible interval holding ``mass`` of the posterior.

        Parameters
        ----------
        mass : float
            Probability mass inside the interval (0.9: the 5% and 95% quantiles).

        Returns
        -------
        (float, float)
            Lower and upper bound.
        """
        lo, hi = np.quantile(self.samples, [(1 - mass) / 2, (1 + mass) / 2])
        return float(lo), float(hi)


@dataclass
class Forecast:
    """Posterior trajectories of one run's expected reward, on the run's own scale.

    Made by :func:`forecast` (or :meth:`bayes_grpo.model.FittedModel.forecast`).

    Attributes
    ----------
    run_id : str
        The run forecast.
    steps : ndarray
        Forecast grid (every step up to ``total_steps``, thinned to at most 500 points, always
        including the last logged step).
    draws : ndarray
        (n_draws, len(steps)): predictive of the reward level (curve plus model discrepancy).
    curves : ndarray
        The same draws of the parametric curve alone (what the stopping rule judges gains on).
    total_steps : int
        Planned length of the run.
    observed_steps, observed_rewards : ndarray
        What the forecast was conditioned on.
    params : dict
        Per-draw curve parameters ``r0, gain, tau, beta, sigma`` (normalised units; ``end_gain``, the
        gain by the end of the plan, for a model with ``gain_at="plan_end"``) and ``unit``.
    plateau_step : ndarray
        Per-draw step where the curve reaches 95% of its total gain.
    current : ndarray
        Per-draw expected reward at the last logged step (the curve's).
    departure : ndarray or float
        Per-draw departure of the run from that curve at the last logged step, where its wander starts: after the
        cut a draw is its curve plus this plus its wander, so ``current + departure`` is where the run is now.
    prepared : PreparedRun
        The normalised run.
    ess : float
        Effective sample size of the (Pareto-smoothed) importance weights the draws were resampled from.
    pareto_k : float
        Pareto k-hat of those weights (:func:`arviz.psislw`): above 0.7 they are unreliable
        (:func:`condition` then tried better proposals, and warned if none helped).
    proposal : str
        The proposal the weights came from: ``"prior"``, ``"laplace"``, ``"particles"`` or ``"mcmc"`` (see :func:`condition`).
    noise_floor : float
        The model's per-step noise floor (normalised units).
    trend_weight : float
        Share of the draws that carry on along the run's own recent trend after the last step
        instead of following the curve (:func:`trend_weight`).
    outside_population : float
        Posterior probability that the run lies outside what the population has seen: the weight
        of the wide component of its prior (:class:`RobustPrior`). Above
        :data:`OUTSIDE_POPULATION_WARN` the forecast leans on the run's own steps and is wider;
        :attr:`caveats` says so.
    seed : int
        Seed of the forecast; also fixes the logging noise drawn by :meth:`window_reward`.
    layer : Recalibration or None
        The model's calibration layer (:mod:`bayes_grpo.recalibration`) the draws went through (:attr:`calibrated`);
        :meth:`window_reward` (and so :attr:`final`) applies it to the raw forecast's window reward, logging noise
        included, as it was learned. The curves (what the stop rule judges) are the model's own.
    raw_draws : ndarray or None
        The model's own draws (:attr:`raw`), before the layer and before the reward's range (:attr:`PreparedRun.bounds`)
        bounds them (given with ``layer`` or a range): the layer calibrates the model's own draws, and a range then
        keeps out what cannot happen. Bounding first would narrow the layer's yardstick with the clipped upper tail,
        and its draw towards persistence would lift draws at a floor the run has logged off it.
    uses_signal : bool
        Whether the model reads GRPO's learning signal (``reward_std``, model 3.0; see
        :func:`bayes_grpo.prepare.learning_signal`), so that a log without it is worth a caveat.

    Example
    -------
    >>> fc = bg.default_model().forecast(run.head(100), total_steps=400)  # doctest: +SKIP
    >>> fc.final.quantile(0.5), fc.final.interval(0.9)  # doctest: +SKIP
    >>> fc.regimes["take_off_ahead"], fc.ess, fc.pareto_k  # doctest: +SKIP
    """

    run_id: str
    steps: np.ndarray
    draws: np.ndarray
    curves: np.ndarray
    total_steps: int
    observed_steps: np.ndarray
    observed_rewards: np.ndarray
    params: dict[str, np.ndarray]
    plateau_step: np.ndarray
    current: np.ndarray
    prepared: PreparedRun = field(repr=False)
    ess: float = float("nan")
    pareto_k: float = float("nan")
    proposal: str = ""
    noise_floor: float = ModelConfig.noise_floor
    trend_weight: float = 0.0
    outside_population: float = 0.0
    seed: int = 0
    uses_signal: bool = False
    layer: Recalibration | None = field(default=None, repr=False)
    raw_draws: np.ndarray | None = field(default=None, repr=False)
    departure: np.ndarray | float = 0.0

    def __post_init__(self) -> None:
        if self.layer is not None and self.raw_draws is None:
            raise ModelError("a calibrated forecast needs its raw_draws (the draws before the layer)")

    def within_bounds(self, floor: float, ceiling: float, evidence: str) -> Forecast:
        """This forecast kept within ``floor`` to ``ceiling``, as if its own log had shown that range (``evidence``: what
        showed it, in words, for :attr:`caveats`). :func:`bayes_grpo.sweeps.rank` gives a sweep's runs the range one of
        them shows: they share their reward functions, but only some logs reach the top."""
        prepared = replace(self.prepared, reward_ceiling=float(ceiling), ceiling_evidence=evidence, reward_floor=float(floor))
        bounded = {name: np.clip(getattr(self, name), *prepared.bounds) for name in ("draws", "curves")}
        return replace(self, prepared=prepared, raw_draws=self.raw.draws, **bounded)

    @property
    def calibrated(self) -> bool:
        """Whether the draws went through the model's calibration layer (:attr:`layer`)."""
        return self.layer is not None

    @property
    def caveats(self) -> list[str]:
        """Plain-language warnings about this forecast (empty when there are none).

        A run whose latest steps gave GRPO no learning signal (every group's completions
        scored the same: :attr:`~bayes_grpo.prepare.PreparedRun.signal_exhausted`), a log
        without the GRPO signals the model reads, a plan more than
        :data:`~bayes_grpo.prepare.LONG_PLAN_FACTOR` times the log, a run that has fallen below its best (a
        decline weight of :attr:`regimes` above :data:`DECLINE_WARN`: the forecast starts where it fell to, and only a
        rise carries on), a run outside what the population has seen (:attr:`outside_population` above
        :data:`OUTSIDE_POPULATION_WARN`), a final reward whose upper tail nothing bounds and that lies far above the
        best logged reward (:meth:`unbounded_tail`), and importance weights that stayed unreliable (Pareto k-hat
        above :data:`PARETO_K_MAX`, or fewer than :data:`MIN_ESS_WARN` effective draws).
        """
        notes = []
        prepared = self.prepared
        if prepared.signal_exhausted:
            notes.append(
                "GRPO has no learning signal left: over the last logged steps the completions of each group scored the same "
                "(reward_std 0 or frac_reward_zero_std 1), so this reward gives the policy no gradient and will not rise by itself"
            )
        missing = [name for name, value in (("reward_std", prepared.recent_reward_std), ("frac_reward_zero_std", prepared.recent_zero_share)) if not np.isfinite(value)]
        if self.uses_signal and prepared.steps.size and "reward_std" in missing:
            notes.append(
                f"the log has no {' or '.join(missing)}: the forecast cannot read how much the completions of a "
                "group still disagree (GRPO's learning signal) and is as wide as for a run whose signal is unknown"
            )
        if prepared.kind == "learned" and prepared.reward_ceiling is not None:
            low, high = f"{prepared.reward_floor:.3g}", f"{prepared.reward_ceiling:.3g}"
            notes.append(
                f"the reward looks bounded by {low} and {high} ({prepared.ceiling_evidence}): the forecast stays within "
                f"{low} to {high}; pass reward_range=(min, max) if that is wrong"
            )
        unbounded = self.unbounded_tail()
        if unbounded is not None:
            notes.append(unbounded_tail_note(*unbounded))
        if self.observed_steps.size and self.total_steps > LONG_PLAN_FACTOR * self.observed_steps[-1]:
            notes.append(
                f"the planned {self.total_steps} steps are {self.total_steps / self.observed_steps[-1]:.0f} times the "
                f"{int(self.observed_steps[-1])} logged: the log shows nothing of where the plan ends, so the forecast of its "
                "end is the population's, hardly this run's"
            )
        decline = self.regimes["decline"] if self.observed_steps.size else 0.0
        if decline > DECLINE_WARN:
            notes.append(
                f"the run has fallen below its best smoothed reward (decline weight {decline:.2f}): the forecast starts where it "
                "is now and does not carry the fall on, so a fall that goes on will end below it"
            )
        if self.outside_population > OUTSIDE_POPULATION_WARN:
            notes.append(
                f"the logged steps lie outside what the fitted runs have shown (probability {self.outside_population:.2f}): "
                "the forecast leans on this run's own steps and its intervals are wider"
            )
        if self.pareto_k > PARETO_K_MAX:
            notes.append(f"the importance weights are unreliable (Pareto k-hat {self.pareto_k:.2f} > {PARETO_K_MAX}): the intervals may be too narrow")
        elif self.ess < MIN_ESS_WARN:
            notes.append(f"the forecast rests on about {self.ess:.0f} effective draws (fewer than {MIN_ESS_WARN}): its quantiles are rough")
        return notes

    def unbounded_tail(self) -> tuple[float, float] | None:
        """The final reward's 95% quantile and how many logged ranges it lies above the best logged reward, when no
        reward range bounds the forecast (declared or inferred: :attr:`PreparedRun.bounds`) and that is more than
        :data:`UNBOUNDED_TAIL_WARN` ranges; None otherwise.

        The calibrated upper tail leaves room for a late take-off, which an accuracy or a sum of capped reward
        functions cannot always take: a verl run's 0/1 score, read without its completions' best and worst scores and
        forecast from step 60 of 1,450, had a 95% quantile of 3.5. Only the user knows such a maximum when the log
        does not show it.
        """
        if self.prepared.bounds is not None or self.observed_rewards.size < 2:
            return None
        top = float(np.max(self.observed_rewards))
        width = top - float(np.min(self.observed_rewards))
        q95 = self.final.quantile(0.95)
        if width <= 0 or q95 <= top + UNBOUNDED_TAIL_WARN * width:
            return None
        return q95, (q95 - top) / width

    @property
    def raw(self) -> Forecast:
        """The model's own forecast, without the calibration layer and before a reward range bounds its draws
        (:attr:`raw_draws`; this forecast when it has neither): the layer's input. Its :meth:`window_reward` is bounded."""
        if self.raw_draws is None:
            return self
        return replace(self, draws=self.raw_draws, raw_draws=None, layer=None)

    @property
    def last_observed_step(self) -> int | None:
        """The last logged step the forecast saw (None for a run not yet started)."""
        return int(self.observed_steps[-1]) if self.observed_steps.size else None

    @property
    def step_noise(self) -> np.ndarray:
        """Per-draw noise of one logged step, in reward units (the likelihood's, noise floor included)."""
        return step_noise(self.params["sigma"], self.noise_floor) * self.prepared.unit

    @cached_property
    def final(self) -> FinalReward:
        """Mean logged reward over the final window, noise included: ``.mean``, ``.quantile(q)``, ``.interval``, ``.samples``.

        The final window is the last :data:`~bayes_grpo.settings.FINAL_WINDOW_FRACTION`
        (10%) of the steps the run is expected to log up to ``total_steps``
        (:meth:`final_window_steps`), and the quantity is :meth:`window_reward` of
        those steps: what :func:`bayes_grpo.measures.final_reward` measures on the
        finished run (computed once per forecast). The latent level at ``total_steps`` is :attr:`level_at_end`.
        """
        return self.window_reward(self.final_window_steps())

    @property
    def level_at_end(self) -> FinalReward:
        """The expected reward level (no logging noise) at ``total_steps``."""
        return FinalReward(self.draws[:, -1])

    @property
    def logging_interval(self) -> float:
        """Steps between logged rewards: the median spacing of the observed steps (1 with fewer than two)."""
        if self.observed_steps.size < 2:
            return 1.0
        return max(float(np.median(np.diff(self.observed_steps))), 1.0)

    def final_window_steps(self, fraction: float = FINAL_WINDOW_FRACTION) -> np.ndarray:
        """The steps the run is expected to log in its final window (the last ``fraction`` of its logged steps).

        The run logs every :attr:`logging_interval` steps up to ``total_steps``;
        the window holds :func:`bayes_grpo.measures.final_window_size` of those
        points, counted back from ``total_steps``.
        """
        interval = self.logging_interval
        n_logged = max(1, int(round(self.total_steps / interval)))
        size = final_window_size(n_logged, fraction)
        return np.clip(self.total_steps - interval * np.arange(size)[::-1], 1.0, None)

    def window_reward(self, steps: np.ndarray, bounded: bool = True) -> FinalReward:
        """Posterior predictive of the mean logged reward at ``steps``, noise included.

        Per draw: the mean of the trajectory draw over ``steps`` plus Normal noise
        of SD ``step_noise / sqrt(len(steps))``, the noise of averaging that many
        logged rewards. The noise is fixed by the forecast's ``seed``, so repeated
        calls agree. Calibration scores this quantity on the real window's steps.
        A calibrated forecast takes it from the raw draws and then moves it by its
        :attr:`layer` (:meth:`~bayes_grpo.recalibration.Recalibration.apply_to_window`),
        the quantity the layer was learned on; the reward's range (:attr:`PreparedRun.bounds`) then bounds it.

        Parameters
        ----------
        steps : array of int or float
            The logged steps averaged (at least one).
        bounded : bool
            Keep the samples within the reward's range (default). False gives what a layer moves and learns from:
            the raw forecast's window reward (:attr:`raw`) before the range bounds it.

        Returns
        -------
        FinalReward
        """
        steps = np.atleast_1d(np.asarray(steps, dtype=float))
        if steps.size == 0:
            raise ModelError("window_reward needs at least one step")
        raw = self.raw
        noise = np.random.default_rng([self.seed, _WINDOW_NOISE_STREAM]).standard_normal(self.draws.shape[0])
        samples = raw.mean_over(raw.draws, steps) + noise * self.step_noise / np.sqrt(steps.size)
        if self.layer is not None:
            samples = self.layer.apply_to_window(samples, raw, steps)
        if bounded and self.prepared.bounds is not None:  # a mean of rewards inside the range they can take stays inside it
            samples = np.clip(samples, *self.prepared.bounds)
        return FinalReward(samples)

    @cached_property
    def regimes(self) -> dict[str, float]:
        """Posterior weights of three regimes: ``take_off_ahead``, ``plateau`` and ``decline`` (they sum to 1; computed
        once per forecast: the CLI prints them, the caveats and the callback read them).

        Judged per draw of the expected reward's smooth part (:attr:`curves`: the
        curve, or the run's own trend for the draws that follow it), moved by the draw's
        :attr:`departure` (where the run is now, off its curve), without the wander ahead or
        logging noise, in units of that draw's per-step noise
        :attr:`step_noise`: a change beyond ``m = MATERIAL_NOISE`` (1) noise SD
        is *material*.

        * ``now``: the level at the last logged step, its curve's plus its departure;
        * ``window``: the mean level over :meth:`final_window_steps` (the
          latent part of :attr:`final` before the wander: the curve's plus the departure);
          ``rise ahead``: ``window - now``;
        * ``best``: the larger of ``now`` and the highest smoothed logged reward
          (:func:`bayes_grpo.measures.smoothed`, kernel SD
          :data:`~bayes_grpo.settings.SMOOTHING_BANDWIDTH` of the planned steps).

        A draw is in **decline** when ``window < best - m``: the final window
        sits materially below the best level reached so far. Otherwise it has a
        **take-off ahead** when ``rise ahead > m``: a material rise is still to
        come, whether the run takes off late or keeps climbing as it has. Otherwise
        it is a **plateau**: no material change is ahead. A run not yet started
        has no best.

        Judged on the curves alone, a run that had fallen well below its best (a steady decline after a
        rise, 70% of the plan in) got a decline weight of 0 and a plateau weight of 1, beside a forecast
        that kept it down: its saturating curve stays at the level it rose to.
        """
        levels = self.curves + np.reshape(self.departure, (-1, 1))
        window = self.mean_over(levels, self.final_window_steps())
        if self.observed_steps.size:
            now = self.mean_over(levels, self.observed_steps[-1:].astype(float))
            span = max(float(self.total_steps - self.observed_steps[0]), float(self.observed_steps[-1] - self.observed_steps[0]), 1.0)
            best = np.maximum(now, float(np.max(smoothed(self.observed_steps, self.observed_rewards, span=span))))
        else:
            now = levels[:, 0]
            best = now
        material = MATERIAL_NOISE * self.step_noise
        ahead = window - now
        decline = window < best - material
        take_off = ~decline & (ahead > material)
        weights = (take_off.mean(), (~decline & ~take_off).mean(), decline.mean())
        return {name: float(w) for name, w in zip(REGIMES, weights)}

    def mean_over(self, values: np.ndarray, steps: np.ndarray) -> np.ndarray:
        """Per-draw mean over ``steps`` of ``values`` (draws x :attr:`steps` grid, e.g. :attr:`draws` or
        :attr:`curves`), linearly interpolated between grid steps."""
        grid = self.steps
        if grid.size == 1:
            return values[:, 0].copy()
        right = np.clip(np.searchsorted(grid, steps), 1, grid.size - 1)
        left = right - 1
        frac = np.clip((steps - grid[left]) / (grid[right] - grid[left]), 0.0, 1.0)
        weights = np.zeros(grid.size)
        np.add.at(weights, left, 1.0 - frac)
        np.add.at(weights, right, frac)
        used = np.flatnonzero(weights)  # a window covers a few grid steps: weigh those columns only
        return (values[:, used] * (weights[used] / steps.size)).sum(axis=1)

    @property
    def remaining_gain(self) -> np.ndarray:
        """Per-draw expected reward still to gain between the last logged step and ``total_steps`` (curve only)."""
        return self.curves[:, -1] - self.current

    def at_steps(self, steps: np.ndarray) -> np.ndarray:
        """Trajectory draws interpolated at arbitrary steps: shape (n_draws, len(steps))."""
        steps = np.asarray(steps, dtype=float)
        right = np.clip(np.searchsorted(self.steps, steps), 1, self.steps.size - 1) if self.steps.size > 1 else np.zeros(steps.size, int)
        if self.steps.size == 1:
            return np.repeat(self.draws[:, :1], steps.size, axis=1)
        left = right - 1
        frac = np.clip((steps - self.steps[left]) / (self.steps[right] - self.steps[left]), 0.0, 1.0)
        return self.draws[:, left] * (1 - frac) + self.draws[:, right] * frac

    def to_frame(self) -> pd.DataFrame:
        """Columns ``step, mean, q05, q25, q50, q75, q95`` on the forecast grid."""
        quantiles = np.quantile(self.draws, FORECAST_QUANTILES, axis=0)
        frame = pd.DataFrame({"step": self.steps.astype(int), "mean": self.draws.mean(axis=0)})
        for q, row in zip(FORECAST_QUANTILES, quantiles):
            frame[f"q{int(round(q * 100)):02d}"] = row
        return frame

    def to_xarray(self) -> xr.Dataset:
        """Trajectory draws as an xarray Dataset with dims (draw, step)."""
        return xr.Dataset(
            {"reward": (("draw", "step"), self.draws), "plateau_step": ("draw", self.plateau_step)},
            coords={"step": self.steps.astype(int), "draw": np.arange(self.draws.shape[0])},
            attrs={"run_id": self.run_id, "total_steps": self.total_steps},
        )

    def plot(self, ax: Any = None, truth: RunLog | None = None) -> Any:
        """Fan chart (:func:`bayes_grpo.plotting.plot_forecast`): 50% and 90% bands, median, logged steps (and the truth, if given), with a legend."""
        from bayes_grpo.plotting import plot_forecast

        return plot_forecast(self, ax, truth)


#: Inferred ceilings of a sweep's runs that differ by more than this factor are not shared (:func:`within_shared_ceiling`).
SHARED_CEILING_AGREEMENT = 1.05


def within_shared_ceiling(forecasts: list[Forecast]) -> list[Forecast]:
    """A sweep's forecasts (:func:`bayes_grpo.sweeps.rank`), each run without a range kept within the range others show.

    A sweep's runs share their reward functions, but only the runs whose logs reached the top show where the reward
    stops (:func:`bayes_grpo.prepare.logged_reward_bounds`); the others' forecasts would reach far above it. Each run
    without a range whose logged rewards lie within that range gets it (:meth:`Forecast.within_bounds`, which its
    caveats name); none does where a run declares a range, the shown floors differ, or the shown ceilings disagree (by
    more than :data:`SHARED_CEILING_AGREEMENT` times).
    """
    shown = [fc for fc in forecasts if fc.prepared.reward_ceiling is not None]
    if not shown or any(fc.prepared.kind == "range" for fc in forecasts):
        return forecasts
    ceilings, floors = [fc.prepared.reward_ceiling for fc in shown], [fc.prepared.reward_floor for fc in shown]
    if max(ceilings) > SHARED_CEILING_AGREEMENT * min(ceilings) or not np.allclose(floors, floors[0]):
        return forecasts
    top = max(shown, key=lambda fc: fc.prepared.reward_ceiling)
    floor, ceiling = top.prepared.reward_floor, top.prepared.reward_ceiling
    evidence = f"run {top.run_id!r} of the sweep shows it: {top.prepared.ceiling_evidence}"

    def fits(fc: Forecast) -> bool:
        logged = fc.observed_rewards
        return fc.prepared.bounds is None and logged.size > 0 and floor <= logged.min() and logged.max() <= ceiling

    return [fc.within_bounds(floor, ceiling, evidence) if fits(fc) else fc for fc in forecasts]
