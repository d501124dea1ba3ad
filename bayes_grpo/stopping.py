"""The plateau stopping rule: turn a forecast into a stop/continue decision.

**Remaining gain.** For each posterior draw, the remaining gain is the best
expected reward the run still reaches after the last logged step, minus the
expected reward now::

    gain = max(0, max_{last < s <= total_steps} E[reward(s)] - E[reward(last)])

``E[reward(s)]`` is the draw's parametric curve (``Forecast.curves``), without the
model-discrepancy wander of ``Forecast.draws``: the maximum of a random walk
would count noise as gain. The maximum over the future trajectory (rather than
``final - current``) is the conservative choice: it is never smaller, so a draw that rises and then falls
still counts the rise it would give up (a user keeping the best checkpoint gets
it), and a run whose forecast is flat or falling has nothing left to gain.
It is floored by :func:`trend_gain`: when the last half of the logged
rewards still climbs clearly (slope above two standard errors), continuing that
trend for one more window counts as gain too, because parametric curves
saturate faster than real runs that keep creeping up.

**Reward scale.** ``tolerance`` is a fraction of a reward scale:

* ``relative_to="spread"`` (default): the 10-90% spread of the rewards logged so
  far (:func:`bayes_grpo.measures.reward_spread`), the scale the backtest's
  regret is measured in, so "less than 1% of the scale left" means the same
  thing on every run whatever range it declares (a declared range of 0-4 on a
  run that moves by 0.3 made the old default's tolerance 13 times looser);
* ``relative_to="range"``: the declared reward range ``hi - lo`` when
  the run declares ``reward_range``; otherwise the spread of the rewards logged so
  far, the 5th-95th percentile range of the logged per-step rewards, floored by
  the learned noise unit of the run (see :mod:`bayes_grpo.prepare`).
* ``relative_to="gain"``: the gain so far, the posterior mean of the expected
  reward now minus the expected reward at step 0, floored by the run's per-step
  noise (:func:`bayes_grpo.prepare.noise_scale`) so a run that has not moved yet
  does not get a zero tolerance.

``stop_probability`` is the posterior probability that the remaining gain is
below ``tolerance * scale``. In the threshold mode (the default) ``stop_decision``
stops once at least ``min_fraction`` of the planned steps are logged (default
:data:`MIN_STOP_FRACTION`, 30%: a run that is flat earlier is ambiguous, a
take-off may still be ahead) and either

* **a plateau**: the probability reaches ``threshold`` and the run is not in a
  dip: the smoothed reward now (Gaussian kernel, bandwidth 8% of the planned
  steps) is not below the best smoothed reward so far by more than
  :data:`DIP_SE` standard errors of the difference (:func:`below_best`). A run
  in a dip may recover, and stopping there gives that recovery up, so a dip
  postpones a plateau call, unless the drop exceeds :data:`FALL_SPREAD` (half)
  of the 10-90% spread of the logged rewards; or
* **a fall**: the run has clearly peaked: its smoothed reward now is below its
  best so far by more than :data:`FALL_SPREAD` of the spread plus
  :data:`DIP_SE` standard errors (:func:`fallen`). Whatever the forecast says,
  the run stops and ``best_step`` names the checkpoint to keep.

How the defaults were chosen (issue 12): on the 37 shared real runs from 25
sources, each replayed with a model fitted without its source (5 folds grouped
by source, checks every 2% from 10%, first stop counts, regret in units of the
run's 10-90% spread; ``benchmarks/backtest_stopping.py``), the threshold (0.7,
0.8, 0.9, 0.95, 0.99), the tolerance (0.005, 0.01, 0.02 of the spread) and the
minimum fraction (20%, 30%, 40%, 50%) are chosen by nested cross-validation
(:func:`bayes_grpo.backtest.nested_selection`, on each check's
:class:`StopEvidence`, so one forecast per check serves every setting): each
fold gets the setting that saves the most steps with at most 10% of the other
folds' real runs above 0.05 regret. With model 2.3 (session 10) every fold
picked threshold 0.99, tolerance 0.02, from 20%; pooled over the held-out
folds that gave 8.1% of runs above 0.05 regret (5.4% above 0.10), median
regret 0 and 15.2% of the steps saved. The defaults take that threshold and
tolerance and keep the 30% floor against early stops on flat runs that take
off later (on all 37 runs: 15.1% saved against 15.2%, the same three bad
stops). Refitted at 2 x 4,000 draws (session 11) the folds split their picks
(two of five 0.99 / 0.02, the others 0.9 / 0.005 or 0.95 / 0.01, each decided
by single runs): held out 15.7% saved with 10.8% of runs above 0.05 regret,
while the defaults gave 14.7% saved with 5.4% (two runs); they were kept. With
model 2.4 (session 12) the defaults save 13.0% with 10.8% (four runs, two of
them at 0.050 and 0.051) and the nested selection 16.3% with 10.8%; with model
2.5 (session 13) 14.0% with 8.1% (the run at 0.050 now stops at 0.030) and
15.4% with 13.5%. The
earlier defaults (0.95, 0.01, 30%) saved 16.7% but stopped 13.5%
of the runs above 0.05 regret (10.8% above 0.10); with the selection made on
the bundled and real runs together (the bundled ones are easier and five
times as many) the held-out figure was 18.9%. The issue's target of 30% saved at that
regret is out of reach of these forecasts. Also measured, on an earlier
session's replays (one forecast per check, nested selection as above; held-out
figures), and not adopted: the probability that the *smoothed* gain still to come (the
backtest's own smoother applied to the logged rewards followed by each
trajectory draw) is below a tolerance, 12.3% saved with 16.2% of runs above
0.05 regret (18.9% and 16.2% on the curves without the model discrepancy; its
posterior mean below a tolerance, 4.5% and 2.7%); that probability as a second
condition beside the curve's, 14.9% and 10.8%, or as an alternative to it,
17.8% and 13.5%; a threshold that falls over the run, 17.7% and 10.8%; a stop
on a smaller fall confirmed by the decline regime, 16.4% and 10.8%; two to
five agreeing checks, 15.9% and 16.2%; all guards and thresholds together,
18.4% and 10.8%. A model-free guard (the slope of the last quarter or half of
the log under one or two standard errors) and a guard on the forecast's
take-off regime were never picked. Across the checks at 30-70% of the runs, no
single signal told a safe stop (regret at most 0.05) from an unsafe one with
an area under the ROC curve above 0.65, and a logistic combination of all of
them, fitted on four folds, scored 0.50 on the fifth. Stopping on any clear
decline (rather than a fall of half the spread) was measured earlier and
rejected: real runs that dip often recover.

In the decision-theoretic mode (``value_per_reward`` and ``cost_per_step``
given) it stops when the expected value of the remaining gain
(``value_per_reward * E[gain]``) is below the cost of the remaining steps
(``cost_per_step * (total_steps - step)``); the two guards do not apply there.

**The checkpoint to keep.** Every decision names ``best_step``, the logged step
with the highest smoothed reward so far (:func:`bayes_grpo.measures.smoothed`, the
Gaussian-kernel smoother the backtest's regret uses, with its bandwidth of 8% of
the run's planned steps), and says whether
the run is ``declining``: its smoothed reward now sits below that best by more
than the tolerance plus twice the standard error of the difference of the two
smoothed values (per-step noise from :func:`bayes_grpo.prepare.noise_scale`,
effective kernel sizes from the smoother's weights), so one dip is not a decline.

This module works on a :class:`~bayes_grpo.forecast.Forecast`; :func:`stop_probability`
and :func:`stop_decision` take anything with a ``forecast`` method (a
:class:`Forecaster`, e.g. a fitted model) and never import the fitting code.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Literal, Protocol

import numpy as np

from bayes_grpo.errors import ModelError
from bayes_grpo.forecast import Forecast
from bayes_grpo.logs import RunLog
from bayes_grpo.measures import reward_spread, smoothed
from bayes_grpo.prepare import noise_scale
from bayes_grpo.settings import SMOOTHING_BANDWIDTH, STOP_THRESHOLD, STOP_TOLERANCE

RelativeTo = Literal["spread", "range", "gain"]
TREND_MIN_POINTS = 8
#: Share of the logged rewards (the most recent) whose linear trend :func:`trend_gain` projects.
TREND_WINDOW_FRACTION = 0.5
INTERVAL = (0.05, 0.95)
#: Threshold mode: no stop before this share of the planned steps is logged.
MIN_STOP_FRACTION = 0.3
#: Threshold mode: no plateau stop while the smoothed reward is this many standard errors below its best so far...
DIP_SE = 2.0
#: ...unless it has fallen by more than this share of the 10-90% spread of the logged rewards (then it stops).
FALL_SPREAD = 0.5


class Forecaster(Protocol):
    """Anything that forecasts a run, e.g. :class:`bayes_grpo.model.FittedModel`."""

    def forecast(self, run: RunLog | None = None, total_steps: int | None = None, **kwargs: Any) -> Forecast: ...


@dataclass(frozen=True)
class StopDecision:
    """A stop/continue decision at ``step`` with the evidence behind it.

    Attributes
    ----------
    probability : float
        Posterior probability that the remaining gain is below ``tolerance * scale``.
    expected_gain : float
        Posterior mean of the remaining gain (reward units).
    gain_interval : (float, float)
        Its 90% interval.
    plateau_step : float
        Posterior median of the step where the curve reaches 95% of its total gain.
    plateau_interval : (float, float)
        Its 90% interval.
    should_stop : bool
        The decision.
    compute_saved : float
        Fraction of ``total_steps`` not run if stopped now.
    step, total_steps : int
        Last logged step and planned length.
    threshold, tolerance, scale : float
        The rule's settings and the reward scale ``tolerance`` multiplies.
    relative_to : str
        What the scale is (``"spread"``, ``"range"`` or ``"gain"``).
    best_step : int
        The logged step with the highest smoothed reward so far: the checkpoint to keep
        (0 for a run with no logged steps).
    declining : bool
        The run has peaked: its smoothed reward now is clearly below that at ``best_step``.
    value_of_gain, cost_of_rest : float or None
        Decision-theoretic mode: the two sides compared.
    optimal_stop_step : int or None
        Decision-theoretic mode: the step (now or later) maximising
        ``value_per_reward * E[reward(s)] - cost_per_step * s``.

    Example
    -------
    >>> decision = decision_from_forecast(fc)  # doctest: +SKIP
    >>> decision.should_stop, decision.best_step, decision.explain()  # doctest: +SKIP
    """

    probability: float
    expected_gain: float
    gain_interval: tuple[float, float]
    plateau_step: float
    plateau_interval: tuple[float, float]
    should_stop: bool
    compute_saved: float
    step: int
    total_steps: int
    threshold: float
    tolerance: float
    scale: float
    relative_to: str
    best_step: int
    declining: bool
    value_of_gain: float | None = None
    cost_of_rest: float | None = None
    optimal_stop_step: int | None = None

    def explain(self) -> str:
        """One plain sentence saying what the decision is and why, and which checkpoint to keep.

        Returns
        -------
        str
            No line breaks.
        """
        verdict = "Stop now" if self.should_stop else "Keep training"
        lo, hi = self.gain_interval
        gain = f"expected further gain {self.expected_gain:.3g} (90% interval {lo:.3g} to {hi:.3g})"
        if self.declining:
            keep = f"; the reward peaked at step {self.best_step} and has declined since: keep that checkpoint"
        else:
            keep = f"; best step so far {self.best_step}"
        if self.value_of_gain is not None:
            why = f"its value {self.value_of_gain:.3g} is {'below' if self.should_stop else 'above'} the cost {self.cost_of_rest:.3g} of the remaining steps"
            return f"{verdict} at step {self.step} of {self.total_steps}: {gain}; {why} (optimal stop at step {self.optimal_stop_step}){keep}."
        return (
            f"{verdict} at step {self.step} of {self.total_steps}: {self.probability:.0%} probability that less than "
            f"{self.tolerance:g} x {self.scale:.3g} reward remains to gain ({gain}, plateau near step "
            f"{self.plateau_step:.0f}), {'above' if self.probability >= self.threshold else 'below'} the {self.threshold:.0%} threshold"
            f"{'' if self.should_stop or self.probability < self.threshold else ' but not trusted yet (too early in the run, or the reward sits in a dip below its best)'}"
            f"{', but the reward has fallen from its peak by more than half its spread' if self.should_stop and self.probability < self.threshold and self.step < self.total_steps else ''}"
            f"{f'; stopping saves {self.compute_saved:.0%} of the steps' if self.should_stop else ''}{keep}."
        )

    def to_dict(self) -> dict[str, Any]:
        """Plain-Python dict of every field (JSON-serialisable)."""
        return asdict(self)


def remaining_gain(fc: Forecast) -> np.ndarray:
    """Per-draw remaining gain: best expected reward after the last logged step minus now, at least 0.

    Never less than :func:`trend_gain`, the rise a clear recent trend in the
    logged rewards would still add: a run the data show climbing is not called
    a plateau just because the fitted curve has saturated.
    """
    last = fc.last_observed_step or 0
    future = fc.steps > last
    if not future.any():
        return np.zeros(fc.draws.shape[0])
    return np.maximum(fc.curves[:, future].max(axis=1) - fc.current, trend_gain(fc))


def trend_gain(fc: Forecast) -> float:
    """Gain from continuing the recent linear trend of the logged rewards over one more window.

    The slope of the last half of the logged rewards (:data:`TREND_WINDOW_FRACTION`,
    at least ``TREND_MIN_POINTS``) is shrunk by its standard error (``b * max(0, 1 -
    4 se^2 / b^2)``: a slope under two standard errors counts as no trend) and
    projected over the shorter of the steps left and the window's own length.
    Only rises count. The half (rather than a shorter, noisier window) is what
    catches the slow late creep that parametric curves saturate too early to see:
    measured on the bundled runs, it takes the share of runs with regret above
    0.05 from 28% to 18% (real runs: 11% to 8%).
    """
    steps = np.asarray(fc.observed_steps, dtype=float)
    rewards = np.asarray(fc.observed_rewards, dtype=float)
    window = max(TREND_MIN_POINTS, int(steps.size * TREND_WINDOW_FRACTION))
    if steps.size < TREND_MIN_POINTS:
        return 0.0
    x, y = steps[-window:], rewards[-window:]
    centred = x - x.mean()
    sxx = float(np.sum(centred**2))
    slope = float(centred @ (y - y.mean()) / sxx)
    if slope <= 0:
        return 0.0
    scatter = y - y.mean() - slope * centred
    se2 = float(np.sum(scatter**2)) / (window - 2) / sxx
    shrunk = slope * max(0.0, 1.0 - 4.0 * se2 / slope**2)
    return shrunk * min(fc.total_steps - x[-1], x[-1] - x[0])


def reward_scale(fc: Forecast, relative_to: RelativeTo = "spread") -> float:
    """The reward scale that ``tolerance`` multiplies (see the module docstring).

    Parameters
    ----------
    fc : Forecast
        The forecast judged.
    relative_to : {"spread", "range", "gain"}
        The 10-90% spread of the logged rewards, the declared range (else the 5-95%
        range of the logged rewards), or the gain so far.

    Returns
    -------
    float
        Positive, in reward units.

    Raises
    ------
    ModelError
        For an unknown ``relative_to``.
    """
    observed = np.asarray(fc.observed_rewards, dtype=float)
    if relative_to == "spread":
        return reward_spread(observed)
    if relative_to == "gain":
        initial = fc.prepared.to_reward(fc.params["r0"])
        floor = noise_scale(observed) if observed.size else 0.0
        return max(float(np.mean(fc.current - initial)), floor, 1e-12)
    if relative_to != "range":
        raise ModelError(f"relative_to must be 'spread', 'range' or 'gain', got {relative_to!r}")
    if fc.prepared.kind == "range":
        return float(fc.prepared.unit)
    lo, hi = np.percentile(observed, [5, 95]) if observed.size else (0.0, 0.0)
    return max(float(hi - lo), float(fc.prepared.unit))


def probability_from_forecast(fc: Forecast, tolerance: float = STOP_TOLERANCE, relative_to: RelativeTo = "spread") -> float:
    """Posterior probability that the remaining gain is below ``tolerance * scale``.

    Parameters
    ----------
    fc : Forecast
        The forecast judged.
    tolerance : float
        Fraction of the reward scale (default :data:`bayes_grpo.settings.STOP_TOLERANCE`).
    relative_to : {"spread", "range", "gain"}
        See :func:`reward_scale`.

    Returns
    -------
    float
        In [0, 1].

    Raises
    ------
    ModelError
        For a negative tolerance or an unknown ``relative_to``.
    """
    if tolerance < 0:
        raise ModelError(f"tolerance must be >= 0, got {tolerance}")
    return float(np.mean(remaining_gain(fc) < tolerance * reward_scale(fc, relative_to)))


def _drop_from_best(fc: Forecast) -> tuple[int, float, float]:
    """``(best_step, drop, se)``: best smoothed step, smoothed drop from it to now, and the drop's standard error.

    The smoother's kernel has standard deviation ``SMOOTHING_BANDWIDTH`` times the
    planned steps (at least the logged step range): the resolution of the
    backtest's regret, which smooths the whole run. The standard error is the
    per-step noise (:func:`bayes_grpo.prepare.noise_scale`) times the root of the
    summed inverse effective kernel sizes at both ends. ``(0, 0, 0)`` for no steps.
    One smoothing pass serves both :func:`peak` and :func:`below_best`.
    """
    steps = np.asarray(fc.observed_steps, dtype=float)
    rewards = np.asarray(fc.observed_rewards, dtype=float)
    if steps.size == 0:
        return 0, 0.0, 0.0
    span = max(float(fc.total_steps) - float(steps[0]), float(steps[-1] - steps[0]), 1.0)
    curve = smoothed(steps, rewards, span=span)
    i_best = int(np.argmax(curve))
    if i_best == steps.size - 1 or steps.size < 3:
        return int(steps[i_best]), 0.0, 0.0
    h = max(SMOOTHING_BANDWIDTH * span, 1e-9)
    weights = np.exp(-0.5 * ((steps[[i_best, -1], None] - steps[None, :]) / h) ** 2)
    n_eff = weights.sum(axis=1) ** 2 / np.sum(weights**2, axis=1)
    se = noise_scale(rewards) * float(np.sqrt(np.sum(1.0 / n_eff)))
    return int(steps[i_best]), float(curve[i_best] - curve[-1]), se


def peak(fc: Forecast, tolerance: float = STOP_TOLERANCE, scale: float | None = None) -> tuple[int, bool]:
    """The checkpoint to keep: ``(best_step, declining)`` from the logged rewards.

    ``best_step`` is the logged step with the highest smoothed reward so far
    (:func:`bayes_grpo.measures.smoothed`, bandwidth 8% of the planned steps); ``declining`` is True when the smoothed
    reward at the last logged step is below that at ``best_step`` by more than
    ``tolerance * scale`` plus twice the standard error of the difference, the
    per-step noise divided by the kernel's effective number of points at each end.

    Parameters
    ----------
    fc : Forecast
        Its observed steps and rewards are used.
    tolerance : float
        Fraction of ``scale`` a drop must exceed (besides the noise).
    scale : float, optional
        Reward scale (default :func:`reward_scale` of ``fc``).

    Returns
    -------
    (int, bool)
        ``(0, False)`` for a run with no logged steps.

    Example
    -------
    >>> best_step, declining = peak(fc)  # doctest: +SKIP
    """
    return _peak(_drop_from_best(fc), tolerance, reward_scale(fc) if scale is None else scale)


def _peak(drop_from_best: tuple[int, float, float], tolerance: float, scale: float) -> tuple[int, bool]:
    """:func:`peak` from a precomputed :func:`_drop_from_best`."""
    best, drop, se = drop_from_best
    return best, se > 0.0 and drop > tolerance * scale + 2.0 * se


def below_best(fc: Forecast, n_se: float = DIP_SE) -> bool:
    """Whether the run sits in a dip: its smoothed reward now is clearly below its best so far.

    The smoother's bandwidth is 8% of the planned steps (``fc.total_steps``, see
    :func:`peak`), the scale of the backtest's regret, so a dip means "now is worse than what the run
    already reached" at the resolution the run is judged at. Clearly: by more than
    ``n_se`` standard errors of the difference (see :func:`peak`).

    Parameters
    ----------
    fc : Forecast
        Its observed steps and rewards are used.
    n_se : float
        Standard errors the drop must exceed (default :data:`DIP_SE`).

    Returns
    -------
    bool
        False for a run with fewer than 3 logged steps or at its best now.

    Example
    -------
    >>> below_best(fc)  # doctest: +SKIP
    False
    """
    return _below_best(_drop_from_best(fc), n_se)


def _below_best(drop_from_best: tuple[int, float, float], n_se: float) -> bool:
    """:func:`below_best` from a precomputed :func:`_drop_from_best`."""
    _, drop, se = drop_from_best
    return se > 0.0 and drop > n_se * se


def fallen(fc: Forecast) -> bool:
    """Whether the run has clearly peaked: its smoothed reward now is far below its best so far.

    Far: by more than :data:`FALL_SPREAD` (half) of the 10-90% spread of the logged
    rewards plus :data:`DIP_SE` standard errors of the difference (see
    :func:`peak`). The threshold mode stops such a run whatever its forecast says
    (once ``min_fraction`` of it is logged); ``best_step`` is the checkpoint to keep.

    Parameters
    ----------
    fc : Forecast
        Its observed steps and rewards are used.

    Returns
    -------
    bool
        False for a run with fewer than 3 logged steps or at its best now.

    Example
    -------
    >>> fallen(fc)  # doctest: +SKIP
    False
    """
    return _fallen(_drop_from_best(fc), reward_spread(fc.observed_rewards))


def _fallen(drop_from_best: tuple[int, float, float], spread: float) -> bool:
    """:func:`fallen` from a precomputed :func:`_drop_from_best` and the logged spread."""
    _, drop, se = drop_from_best
    return se > 0.0 and drop > FALL_SPREAD * spread + DIP_SE * se


@dataclass(frozen=True)
class StopEvidence:
    """What the threshold mode weighs at one check, computed once from a forecast.

    Kept apart from the rule's settings (threshold, tolerance, minimum fraction)
    so that one forecast per check serves every setting: the backtest's nested
    selection (:func:`bayes_grpo.backtest.nested_selection`) scores a grid of
    settings on these summaries in seconds instead of re-forecasting.

    Attributes
    ----------
    step, total_steps : int
        Last logged step and planned length.
    gain : ndarray
        Per-draw remaining gain (:func:`remaining_gain`), reward units.
    spread : float
        The 10-90% spread of the logged rewards (:func:`bayes_grpo.measures.reward_spread`).
    best_step : int
        The logged step with the highest smoothed reward so far.
    drop, drop_se : float
        Smoothed drop from that best to now, and its standard error (see :func:`peak`).
    """

    step: int
    total_steps: int
    gain: np.ndarray
    spread: float
    best_step: int
    drop: float
    drop_se: float

    def probability(self, tolerance: float, scale: float | None = None) -> float:
        """Share of draws whose remaining gain is below ``tolerance * scale`` (default scale: :attr:`spread`)."""
        return float(np.mean(self.gain < tolerance * (self.spread if scale is None else scale)))

    @property
    def drop_from_best(self) -> tuple[int, float, float]:
        """``(best_step, drop, drop_se)``, as the dip, fall and peak tests take them."""
        return self.best_step, self.drop, self.drop_se


def stop_evidence(fc: Forecast) -> StopEvidence:
    """The :class:`StopEvidence` of a forecast: remaining gain per draw, logged spread and drop from the best.

    Parameters
    ----------
    fc : Forecast
        The forecast judged (its raw ``curves``, ``current`` and logged rewards; never ``Forecast.final``).

    Returns
    -------
    StopEvidence

    Example
    -------
    >>> threshold_stop(stop_evidence(fc), threshold=0.9)  # doctest: +SKIP
    """
    best, drop, se = _drop_from_best(fc)
    return StopEvidence(
        step=int(fc.last_observed_step or 0),
        total_steps=int(fc.total_steps),
        gain=remaining_gain(fc),
        spread=reward_spread(fc.observed_rewards),
        best_step=best,
        drop=drop,
        drop_se=se,
    )


def threshold_stop(
    evidence: StopEvidence,
    *,
    threshold: float = STOP_THRESHOLD,
    tolerance: float = STOP_TOLERANCE,
    min_fraction: float = MIN_STOP_FRACTION,
    scale: float | None = None,
) -> bool:
    """The threshold mode's stop: a plateau call outside a dip, or a fall, once ``min_fraction`` is logged.

    See :func:`decision_from_forecast`; a run at or past its planned end always stops.

    Parameters
    ----------
    evidence : StopEvidence
        From :func:`stop_evidence`.
    threshold, tolerance, min_fraction : float
        The rule's settings (defaults :data:`bayes_grpo.settings.STOP_THRESHOLD`,
        :data:`bayes_grpo.settings.STOP_TOLERANCE`, :data:`MIN_STOP_FRACTION`).
    scale : float, optional
        Reward scale ``tolerance`` multiplies (default: the logged spread).

    Returns
    -------
    bool
    """
    drop_from_best = evidence.drop_from_best
    in_dip = _below_best(drop_from_best, DIP_SE)
    plateau = evidence.probability(tolerance, scale) >= threshold and (not in_dip or evidence.drop > FALL_SPREAD * evidence.spread)
    stop = evidence.step >= min_fraction * evidence.total_steps and (plateau or _fallen(drop_from_best, evidence.spread))
    return bool(stop or evidence.step >= evidence.total_steps)


def decision_from_forecast(
    fc: Forecast,
    *,
    threshold: float = STOP_THRESHOLD,
    tolerance: float = STOP_TOLERANCE,
    relative_to: RelativeTo = "spread",
    value_per_reward: float | None = None,
    cost_per_step: float | None = None,
    min_fraction: float = MIN_STOP_FRACTION,
) -> StopDecision:
    """The stop/continue decision for an already computed forecast.

    Threshold mode: once at least ``min_fraction`` of the planned steps are
    logged, stop when the probability that less than ``tolerance * scale`` reward
    remains to gain reaches ``threshold`` and the run is not in a dip
    (:func:`below_best`) unless it has dropped by more than :data:`FALL_SPREAD` of
    its logged 10-90% spread, or when the run has clearly fallen from its peak
    (:func:`fallen`) whatever the probability.
    Decision-theoretic mode (give
    ``value_per_reward``, the worth of one unit of reward, and ``cost_per_step``,
    e.g. GPU-hours per step x price, in the same currency): stop when
    ``value_per_reward * E[remaining gain] < cost_per_step * remaining steps``.
    A run at or past its planned end always stops.

    Parameters
    ----------
    fc : Forecast
        The forecast of the run from its last logged step.
    threshold : float
        In [0, 1] (default :data:`bayes_grpo.settings.STOP_THRESHOLD`).
    tolerance : float
        Fraction of the reward scale (default :data:`bayes_grpo.settings.STOP_TOLERANCE`, 0.02).
    relative_to : {"spread", "range", "gain"}
        See :func:`reward_scale`.
    value_per_reward, cost_per_step : float, optional
        Both or neither: the decision-theoretic mode.
    min_fraction : float
        Threshold mode: no stop before this share of ``total_steps`` is logged
        (default :data:`MIN_STOP_FRACTION`, 30%; 0 turns the guard off).

    Returns
    -------
    StopDecision
        Always with ``best_step`` and ``declining`` (see :func:`peak`).

    Raises
    ------
    ModelError
        For a threshold or ``min_fraction`` outside [0, 1], a negative tolerance, or only one of the two costs.

    Example
    -------
    >>> decision_from_forecast(model.forecast(run.head(300), total_steps=500)).explain()  # doctest: +SKIP
    """
    if not 0.0 <= threshold <= 1.0:
        raise ModelError(f"threshold must be in [0, 1], got {threshold}")
    if not 0.0 <= min_fraction <= 1.0:
        raise ModelError(f"min_fraction must be in [0, 1], got {min_fraction}")
    if tolerance < 0:
        raise ModelError(f"tolerance must be >= 0, got {tolerance}")
    if (value_per_reward is None) != (cost_per_step is None):
        raise ModelError("the decision-theoretic mode needs both value_per_reward= and cost_per_step=")
    evidence = stop_evidence(fc)
    step, total, gain = evidence.step, evidence.total_steps, evidence.gain
    scale = reward_scale(fc, relative_to)
    probability = evidence.probability(tolerance, scale)
    value = cost = optimal = None
    if value_per_reward is not None:
        value = float(value_per_reward * gain.mean())
        cost = float(cost_per_step * max(total - step, 0))
        ahead = fc.steps >= step
        utility = value_per_reward * fc.curves[:, ahead].mean(axis=0) - cost_per_step * fc.steps[ahead]
        optimal = int(fc.steps[ahead][np.argmax(utility)])
        should_stop = value < cost
    else:
        should_stop = threshold_stop(evidence, threshold=threshold, tolerance=tolerance, min_fraction=min_fraction, scale=scale)
    should_stop = should_stop or step >= total
    best, declining = _peak(evidence.drop_from_best, tolerance, evidence.spread)
    return StopDecision(
        probability=probability,
        expected_gain=float(gain.mean()),
        gain_interval=tuple(float(v) for v in np.quantile(gain, INTERVAL)),
        plateau_step=float(np.median(fc.plateau_step)),
        plateau_interval=tuple(float(v) for v in np.quantile(fc.plateau_step, INTERVAL)),
        should_stop=bool(should_stop),
        compute_saved=max(total - step, 0) / total,
        step=step,
        total_steps=total,
        threshold=float(threshold),
        tolerance=float(tolerance),
        scale=scale,
        relative_to=relative_to,
        best_step=best,
        declining=bool(declining),
        value_of_gain=value,
        cost_of_rest=cost,
        optimal_stop_step=optimal,
    )


def stop_probability(
    model: Forecaster,
    run: RunLog,
    total_steps: int | None = None,
    tolerance: float = STOP_TOLERANCE,
    relative_to: RelativeTo = "spread",
    **forecast_kw: Any,
) -> float:
    """Posterior probability that less than ``tolerance * scale`` reward remains to gain by ``total_steps``.

    Parameters
    ----------
    model : Forecaster
        E.g. :func:`bayes_grpo.default_model`.
    run : RunLog
        The steps logged so far.
    total_steps : int, optional
        Planned length (default: the run's metadata).
    tolerance : float
        Fraction of the reward scale (default 0.02).
    relative_to : {"spread", "range", "gain"}
        See :func:`reward_scale`.
    **forecast_kw
        Passed to ``model.forecast`` (``n_draws``, ``seed``, metadata overrides).

    Returns
    -------
    float
        In [0, 1].

    Raises
    ------
    ModelError
        For a negative tolerance, an unknown ``relative_to`` or an unknown ``total_steps``.

    Example
    -------
    >>> stop_probability(bg.default_model(), run.head(300), total_steps=500)  # doctest: +SKIP
    """
    fc = model.forecast(run, total_steps=total_steps, **forecast_kw)
    return probability_from_forecast(fc, tolerance, relative_to)


def stop_decision(
    model: Forecaster,
    run: RunLog,
    total_steps: int | None = None,
    threshold: float = STOP_THRESHOLD,
    tolerance: float = STOP_TOLERANCE,
    relative_to: RelativeTo = "spread",
    value_per_reward: float | None = None,
    cost_per_step: float | None = None,
    min_fraction: float = MIN_STOP_FRACTION,
    **forecast_kw: Any,
) -> StopDecision:
    """Forecast ``run`` and decide whether to stop it now (see :func:`decision_from_forecast`).

    Parameters
    ----------
    model : Forecaster
        E.g. :func:`bayes_grpo.default_model`.
    run : RunLog
        The steps logged so far.
    total_steps : int, optional
        Planned length (default: the run's metadata).
    threshold, tolerance, relative_to, value_per_reward, cost_per_step, min_fraction
        See :func:`decision_from_forecast`.
    **forecast_kw
        Passed to ``model.forecast``.

    Returns
    -------
    StopDecision

    Raises
    ------
    ModelError
        As :func:`decision_from_forecast`, or for an unknown ``total_steps``.

    Example
    -------
    >>> stop_decision(bg.default_model(), run.head(300), total_steps=500).should_stop  # doctest: +SKIP
    """
    fc = model.forecast(run, total_steps=total_steps, **forecast_kw)
    return decision_from_forecast(
        fc,
        threshold=threshold,
        tolerance=tolerance,
        relative_to=relative_to,
        value_per_reward=value_per_reward,
        cost_per_step=cost_per_step,
        min_fraction=min_fraction,
    )
