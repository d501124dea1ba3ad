"""The stopping rule: turn a forecast into a stop/continue decision and name the checkpoint to keep.

Everything the rule weighs comes from one :class:`~bayes_grpo.forecast.Forecast`
and the rewards logged so far; it never looks at the log's trend on its own (a
run that is still climbing is the forecast's business: its curve draws follow
the log's recent trend where the saturating curve would bend too soon).

**Remaining gain.** Per posterior draw, the expected reward over the run's final
window (the last 10% of the steps it is expected to log, the window of
:attr:`Forecast.final <bayes_grpo.forecast.Forecast.final>`) minus the expected
reward now, both read off the draw's curve (``Forecast.curves``)::

    gain = mean_{s in final window} E[reward(s)] - E[reward(last)]

The curve is each draw's expected trajectory: the trajectories of
``Forecast.draws`` add to it a zero-mean wander (the model discrepancy), so the
gain's posterior mean is the gain the forecast's own final reward implies
(``Forecast.final.mean`` minus the current level, up to the Monte Carlo error of
the wander), and the mean, its 90% interval and the stop probability all come
from the same draws. A gain can be negative: a forecast that falls says so.

**Reward scale.** ``tolerance`` is a fraction of a reward scale:

* ``relative_to="spread"`` (default): the 10-90% spread of the rewards logged so
  far (:func:`bayes_grpo.measures.reward_spread`), the scale the backtest's
  regret is measured in, so "less than 2% of the scale left" means the same
  thing on every run whatever range it declares;
* ``relative_to="range"``: the declared reward range ``hi - lo`` when
  the run declares ``reward_range``; otherwise the 5th-95th percentile range of
  the logged per-step rewards, floored by the learned noise unit of the run
  (see :mod:`bayes_grpo.prepare`).
* ``relative_to="gain"``: the gain so far, the posterior mean of the expected
  reward now minus the expected reward at step 0, floored by the run's per-step
  noise (:func:`bayes_grpo.prepare.noise_scale`) so a run that has not moved yet
  does not get a zero tolerance.

**The threshold mode** (the default) answers three questions from the forecast's
draws, each at the same confidence ``threshold`` (default 0.99,
:data:`bayes_grpo.settings.STOP_THRESHOLD`), and stops only once at least
``min_fraction`` of the planned steps are logged (default
:data:`MIN_STOP_FRACTION`, 30%: a run that is flat earlier is ambiguous, a
take-off may still be ahead). A run at or past its planned end always stops.

0. **Can GRPO still learn?** GRPO learns only from groups whose completions score
   differently. A run whose last logged steps had no such group (``reward_std`` 0,
   or ``frac_reward_zero_std`` 1: :attr:`~bayes_grpo.prepare.PreparedRun.signal_exhausted`)
   gets no gradient from its reward, so it stops (``reason="no_signal"``) whatever
   the curve says. Where the completions still disagree a lot (``reward_std`` at
   least :data:`PLENTIFUL_SIGNAL` of the logged spread) and the run goes on, the
   explanation names the signal, and where the mean reward has moved less than
   half the completions' spread, that this flat stretch is not a plateau.

1. **Is the run still rising?** :func:`rise_probability` is the posterior
   probability that the curve's slope at the last logged step is materially
   positive: that the expected reward rises by more than ``tolerance * scale``
   over the next :data:`RISE_WINDOW` (8%) of the planned steps, the resolution
   at which the backtest judges a stop. While it is above ``1 - threshold`` the
   run never stops, whatever else holds.
2. **Has the run fallen for good?** A run whose smoothed reward now (Gaussian
   kernel, bandwidth 8% of the planned steps) is below its smoothed best so far
   by more than :data:`DIP_SE` standard errors of the difference, or by more
   than :data:`DIP_SPREAD` (5%) of the logged spread, is *in a dip*
   (:func:`below_best`). A dip is not a decline: the run stops there only when
   :func:`recovery_probability`, the share of trajectory draws
   (``Forecast.draws``, curve plus wander: the wander is what lets a saturating
   curve come back) that get back to that best before the planned end, is below
   ``1 - threshold``. Otherwise it waits, and no plateau is called inside a dip.
3. **Is the rise over?** Outside a dip, the run stops when the posterior
   probability that the remaining gain is below ``tolerance * scale``
   (:func:`probability_from_forecast`) reaches ``threshold``.

Tying all three to one confidence keeps the rule one dial: "stop when, with
probability ``threshold``, the run has no material rise left and is not about to
get back what it lost".

How the defaults were chosen (``benchmarks/backtest_stopping.py``; its figures are in
``benchmarks/results/backtest_stopping.md``): each shared real run is replayed check by
check (every 2% of its steps from 10%) by a model fitted without its source (5 folds
grouped by source); regret is the loss of the smoothed reward from the stop to the end,
in units of the run's 10-90% spread. The defaults (threshold 0.99, tolerance 0.02, from
30%) keep the share of runs stopped above 0.05 regret near a tenth, with each source
counted as at most three runs; looser settings chosen by nested cross-validation
(:func:`bayes_grpo.backtest.nested_selection`) saved more steps on the folds that chose
them but stopped more held-out runs badly, so the defaults stay. Most of the saving a
hindsight oracle finds is out of reach of these forecasts: at most checks from 30% on
where a stop would have been safe, a material rise was still ahead at more than 1%
probability. The rule judges the model's own curves; the calibration layer
(:mod:`bayes_grpo.recalibration`), whose long upper tail stopped no canonical plateau,
moves only the forecast's draws.

In the decision-theoretic mode (``value_per_reward`` and ``cost_per_step``
given) it stops when the expected value of the remaining gain
(``value_per_reward * E[gain]``) is below the cost of the remaining steps
(``cost_per_step * (total_steps - step)``); the three questions do not apply there.

**The checkpoint to keep.** Every decision names ``best_step``, the logged step
with the highest smoothed reward so far (:func:`bayes_grpo.measures.smoothed`, the
Gaussian-kernel smoother the backtest's regret uses, with its bandwidth of 8% of
the run's planned steps), and says whether the run is ``declining``: its smoothed
reward now sits below that best by more than the tolerance plus twice the
standard error of the difference of the two smoothed values (per-step noise from
:func:`bayes_grpo.prepare.noise_scale`, effective kernel sizes from the
smoother's weights).

This module works on a :class:`~bayes_grpo.forecast.Forecast`; :func:`stop_probability`
and :func:`stop_decision` take anything with a ``forecast`` method (a
:class:`Forecaster`, e.g. a fitted model) and never import the fitting code.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Literal, NamedTuple, Protocol

import numpy as np

from bayes_grpo.errors import ModelError
from bayes_grpo.forecast import Forecast
from bayes_grpo.logs import RunLog
from bayes_grpo.measures import reward_spread, smoothed
from bayes_grpo.prepare import noise_scale
from bayes_grpo.settings import SMOOTHING_BANDWIDTH, STOP_THRESHOLD, STOP_TOLERANCE

RelativeTo = Literal["spread", "range", "gain"]
Reason = Literal["end", "early", "no_signal", "flat", "rising", "fall", "dip", "plateau", "gain", "value"]
INTERVAL = (0.05, 0.95)
#: Threshold mode: no stop before this share of the planned steps is logged.
MIN_STOP_FRACTION = 0.3
#: A run is in a dip when its smoothed reward is this many standard errors below its best so far...
DIP_SE = 2.0
#: ...or below it by more than this share of the logged 10-90% spread: the regret above which the backtest counts a stop
#: as bad, so a drop within the noise but large enough to matter if the run comes back still counts.
DIP_SPREAD = 0.05
#: The rise that counts as "still rising" is measured over this share of the planned steps ahead.
RISE_WINDOW = SMOOTHING_BANDWIDTH
#: The decisions that stop the run (the others keep it training).
STOP_REASONS = frozenset({"end", "no_signal", "fall", "plateau", "value"})
#: The explanation names the learning signal when the latest ``reward_std`` is at least this share of the logged spread.
PLENTIFUL_SIGNAL = 0.5


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
        Posterior mean of the remaining gain (reward units; negative when the forecast falls).
    gain_interval : (float, float)
        Its 90% interval (from the same draws, so it holds the mean but for extreme skew).
    plateau_step : float
        Posterior median of the step where the curve reaches 95% of its total gain.
    plateau_interval : (float, float)
        Its 90% interval.
    should_stop : bool
        The decision.
    reason : str
        Why: ``"plateau"`` (no material gain left), ``"fall"`` (in a dip it is unlikely to
        leave), ``"no_signal"`` (GRPO has no learning signal left: every group's completions
        scored the same over the last logged steps), ``"end"`` (the planned end is reached),
        ``"value"`` (decision-theoretic stop);
        or, to keep training, ``"gain"`` (gain still likely), ``"rising"`` (the curve may still
        rise), ``"dip"`` (in a dip it may leave), ``"early"`` (before ``min_fraction``), ``"flat"``
        (every reward logged so far is the same and no range is declared: nothing to judge
        a plateau or a rise against).
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
    rise_probability : float
        Posterior probability that the curve still rises materially (:func:`rise_probability`).
    recovery_probability : float
        Posterior probability that the run gets back to its best so far before ``total_steps``
        (:func:`recovery_probability`; 1 when it is at its best now).
    reward_std : float
        Mean ``reward_std`` over the last logged steps (reward units; NaN when the log has none):
        GRPO's learning signal, named in :meth:`explain` when it is at least :data:`PLENTIFUL_SIGNAL`
        of ``logged_spread``, or when it is gone (``reason="no_signal"``).
    logged_spread : float
        The 10-90% spread of the rewards logged so far (:func:`bayes_grpo.measures.reward_spread`).
    last_reward : float
        The last logged reward (NaN for a run with no logged steps).
    value_of_gain, cost_of_rest : float or None
        Decision-theoretic mode: the two sides compared.
    optimal_stop_step : int or None
        Decision-theoretic mode: the step (now or later) maximising
        ``value_per_reward * E[reward(s)] - cost_per_step * s``.

    Example
    -------
    >>> decision = decision_from_forecast(fc)  # doctest: +SKIP
    >>> decision.should_stop, decision.reason, decision.best_step, decision.explain()  # doctest: +SKIP
    """

    probability: float
    expected_gain: float
    gain_interval: tuple[float, float]
    plateau_step: float
    plateau_interval: tuple[float, float]
    should_stop: bool
    reason: str
    compute_saved: float
    step: int
    total_steps: int
    threshold: float
    tolerance: float
    scale: float
    relative_to: str
    best_step: int
    declining: bool
    rise_probability: float
    recovery_probability: float
    reward_std: float = float("nan")
    logged_spread: float = float("nan")
    last_reward: float = float("nan")
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
        saves = f"; stopping saves {self.compute_saved:.0%} of the steps" if self.should_stop and self.compute_saved > 0 else ""
        if self.value_of_gain is not None:
            why = f"its value {self.value_of_gain:.3g} is {'below' if self.should_stop else 'above'} the cost {self.cost_of_rest:.3g} of the remaining steps"
            return f"{verdict} at step {self.step} of {self.total_steps}: {gain}; {why} (optimal stop at step {self.optimal_stop_step}){saves}{keep}."
        side = "at or above" if self.probability >= self.threshold else "below"
        head = (
            f"{verdict} at step {self.step} of {self.total_steps}: {self.probability:.0%} probability that less than "
            f"{self.tolerance:g} x {self.scale:.3g} reward remains to gain ({gain}, plateau near step "
            f"{self.plateau_step:.0f}), {side} the {self.threshold:.0%} threshold"
        )
        if self.reason in ("flat", "no_signal"):  # decided before any gain is weighed: the gain's figures would only confuse
            head = f"{verdict} at step {self.step} of {self.total_steps}"
        chance = f"{self.recovery_probability:.1%} chance of getting back there before step {self.total_steps}"
        but = " but" if self.probability >= self.threshold else " and"
        signal = ""
        if self.reason in ("gain", "rising") and self.reward_std >= PLENTIFUL_SIGNAL * self.logged_spread:
            signal = (
                f"; the completions still disagree (reward_std {self.reward_std:.3g} against a logged reward spread of "
                f"{self.logged_spread:.3g}): GRPO still has a signal to learn from"
            )
            if self.reward_std >= 2 * self.logged_spread:  # the mean has barely moved against the completions' spread
                signal += ", so this flat stretch is not a plateau"
        why = {
            "end": "; the run has reached its planned end",
            "early": f"{but} not trusted yet: too early in the run",
            "rising": f"{but} {self._rising_text()}",
            "flat": (
                f": every reward logged so far is {self.last_reward:.6g}, so there is no spread to judge a plateau or a rise "
                "against: declare the reward range (reward_range=, --reward-range) or keep training until the rewards move"
            ),
            "dip": f"{but} the reward sits in a dip below its best (step {self.best_step}) with a {chance}: a dip is not a decline",
            "fall": f"; the reward peaked at step {self.best_step} and has fallen since, with only a {chance}: the decline persists",
            "no_signal": (
                ": GRPO has no learning signal left: over the last logged steps every group's completions scored the same "
                f"(reward_std {self.reward_std:.3g}), so this reward gives the policy no gradient and will not rise by itself"
            ),
            "plateau": "",
            "gain": "",
        }[self.reason] + signal
        if self.reason == "fall":
            keep = "; keep that checkpoint"
        return f"{head}{why}{saves}{keep}."

    def _rising_text(self) -> str:
        """Why a possible rise keeps the run training, in words that match its probability."""
        allowed = 1.0 - self.threshold
        if self.rise_probability >= 0.5:
            return f"the forecast says the run is still rising ({self.rise_probability:.0%} probability of a rise of more than the tolerance just ahead)"
        return (
            f"the forecast cannot rule out a rise of more than the tolerance just ahead ({self.rise_probability:.1%} probability, "
            f"above the {allowed:.0%} the rule allows)"
        )

    def to_dict(self) -> dict[str, Any]:
        """Plain-Python dict of every field (JSON-serialisable)."""
        return asdict(self)


def remaining_gain(fc: Forecast) -> np.ndarray:
    """Per-draw remaining gain: the expected reward over the final window minus the expected reward now.

    Both are read off each draw's curve (``Forecast.curves``), the expected
    trajectory that the forecast's trajectory draws wander around, so the mean
    of the gain is the gain ``Forecast.final`` implies (see the module
    docstring). Negative when the draw falls.

    Parameters
    ----------
    fc : Forecast
        The forecast judged.

    Returns
    -------
    numpy.ndarray
        One gain per draw, in reward units.

    Example
    -------
    >>> remaining_gain(fc).mean(), fc.final.mean - fc.current.mean()  # doctest: +SKIP
    """
    return fc.mean_over(fc.curves, fc.final_window_steps()) - fc.current


def rise_ahead(fc: Forecast) -> np.ndarray:
    """Per-draw rise of the expected reward over the next :data:`RISE_WINDOW` of the planned steps (to the end at most).

    The curve's slope at the last logged step, integrated over the resolution at
    which the backtest judges a stop (8% of the planned steps): what "still
    rising" means for the rule. Zero for a run at its planned end.
    """
    last = float(fc.last_observed_step or 0)
    ahead = min(last + RISE_WINDOW * fc.total_steps, float(fc.total_steps))
    if ahead <= last:
        return np.zeros(fc.curves.shape[0])
    return fc.mean_over(fc.curves, np.array([ahead])) - fc.current


def rise_probability(fc: Forecast, tolerance: float = STOP_TOLERANCE, relative_to: RelativeTo = "spread") -> float:
    """Posterior probability that the run is still rising: its expected reward gains more than ``tolerance * scale`` just ahead.

    Just ahead: over the next :data:`RISE_WINDOW` (8%) of the planned steps
    (:func:`rise_ahead`). The threshold mode never stops while this is above
    ``1 - threshold``.

    Parameters
    ----------
    fc : Forecast
        The forecast judged.
    tolerance : float
        Fraction of the reward scale a rise must exceed.
    relative_to : {"spread", "range", "gain"}
        See :func:`reward_scale`.

    Returns
    -------
    float
        In [0, 1].

    Example
    -------
    >>> rise_probability(fc) > 0.01  # doctest: +SKIP
    True
    """
    return float(np.mean(rise_ahead(fc) > tolerance * reward_scale(fc, relative_to)))


def reward_scale(fc: Forecast, relative_to: RelativeTo = "spread") -> float:
    """The reward scale that ``tolerance`` multiplies (see the module docstring).

    Parameters
    ----------
    fc : Forecast
        The forecast judged.
    relative_to : {"spread", "range", "gain"}
        The 10-90% spread of the logged rewards (the declared range while every logged
        reward is the same), the declared range (else the 5-95% range of the logged
        rewards), or the gain so far.

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
        if fc.prepared.kind == "range" and (observed.size == 0 or np.ptp(observed) == 0.0):
            return float(fc.prepared.unit)  # nothing has moved yet: the declared range is the only scale there is
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


class _Peak(NamedTuple):
    """The logged run's best so far: its step, its smoothed level, the drop from it to now and the drop's standard error."""

    step: int
    level: float
    drop: float
    se: float


def _peak_so_far(fc: Forecast) -> _Peak:
    """The best smoothed logged reward so far, and the smoothed drop from it to now with its standard error.

    The smoother's kernel has standard deviation ``SMOOTHING_BANDWIDTH`` times the
    planned steps (at least the logged step range): the resolution of the
    backtest's regret, which smooths the whole run. The standard error is the
    per-step noise (:func:`bayes_grpo.prepare.noise_scale`) times the root of the
    summed inverse effective kernel sizes at both ends. All zero for no steps.
    One smoothing pass serves :func:`peak`, :func:`below_best` and :func:`recovery_probability`.
    """
    steps = np.asarray(fc.observed_steps, dtype=float)
    rewards = np.asarray(fc.observed_rewards, dtype=float)
    if steps.size == 0:
        return _Peak(0, 0.0, 0.0, 0.0)
    span = max(float(fc.total_steps) - float(steps[0]), float(steps[-1] - steps[0]), 1.0)
    curve = smoothed(steps, rewards, span=span)
    i_best = int(np.argmax(curve))
    if i_best == steps.size - 1 or steps.size < 3:
        return _Peak(int(steps[i_best]), float(curve[i_best]), 0.0, 0.0)
    h = max(SMOOTHING_BANDWIDTH * span, 1e-9)
    weights = np.exp(-0.5 * ((steps[[i_best, -1], None] - steps[None, :]) / h) ** 2)
    n_eff = weights.sum(axis=1) ** 2 / np.sum(weights**2, axis=1)
    se = noise_scale(rewards) * float(np.sqrt(np.sum(1.0 / n_eff)))
    return _Peak(int(steps[i_best]), float(curve[i_best]), float(curve[i_best] - curve[-1]), se)


def recovery_probability(fc: Forecast) -> float:
    """Posterior probability that the run gets back to its best so far before its planned end.

    The share of trajectory draws (``Forecast.draws``: the curve plus the
    model-discrepancy wander, which is what lets a saturating curve come back
    after a fall) whose level at some forecast step after the last logged one
    reaches the best smoothed logged reward so far (see :func:`peak`). 1 for a run
    at its best now (nothing to recover) or not started.

    Parameters
    ----------
    fc : Forecast
        The forecast judged.

    Returns
    -------
    float
        In [0, 1].

    Example
    -------
    >>> recovery_probability(fc) < 0.01  # doctest: +SKIP
    True
    """
    return _recovery(fc, _peak_so_far(fc))


def _recovery(fc: Forecast, best: _Peak) -> float:
    """:func:`recovery_probability` from a precomputed :func:`_peak_so_far`."""
    if best.drop <= 0.0:
        return 1.0
    ahead = fc.steps > (fc.last_observed_step or 0)
    if not ahead.any():
        return 0.0
    return float(np.mean(fc.draws[:, ahead].max(axis=1) >= best.level))


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
    best = _peak_so_far(fc)
    return best.step, _declining(best.drop, best.se, tolerance, reward_scale(fc) if scale is None else scale)


def _declining(drop: float, se: float, tolerance: float, scale: float) -> bool:
    """:func:`peak`'s ``declining`` from a drop below the best and its standard error."""
    return bool(se > 0.0 and drop > tolerance * scale + 2.0 * se)


def below_best(fc: Forecast, n_se: float = DIP_SE, share: float = DIP_SPREAD) -> bool:
    """Whether the run sits in a dip: its smoothed reward now is below its best so far by a drop that matters.

    The smoother's bandwidth is 8% of the planned steps (``fc.total_steps``, see
    :func:`peak`), the scale of the backtest's regret, so a dip means "now is worse than what the run
    already reached" at the resolution the run is judged at. A drop matters when it
    exceeds ``n_se`` standard errors of the difference (see :func:`peak`), or
    ``share`` of the 10-90% spread of the logged rewards: a drop within the noise
    still costs that much if the run comes back.

    Parameters
    ----------
    fc : Forecast
        Its observed steps and rewards are used.
    n_se : float
        Standard errors the drop must exceed (default :data:`DIP_SE`).
    share : float
        Share of the logged spread the drop must exceed otherwise (default :data:`DIP_SPREAD`).

    Returns
    -------
    bool
        False for a run with fewer than 3 logged steps or at its best now.

    Example
    -------
    >>> below_best(fc)  # doctest: +SKIP
    False
    """
    best = _peak_so_far(fc)
    return _in_dip(best.drop, best.se, reward_spread(fc.observed_rewards), n_se, share)


def _in_dip(drop: float, se: float, spread: float, n_se: float = DIP_SE, share: float = DIP_SPREAD) -> bool:
    """:func:`below_best` from a precomputed drop below the best, its standard error and the logged spread."""
    return bool(se > 0.0 and (drop > n_se * se or drop > share * spread))


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
    rise : ndarray
        Per-draw rise just ahead (:func:`rise_ahead`), reward units.
    spread : float
        The 10-90% spread of the logged rewards (:func:`bayes_grpo.measures.reward_spread`).
    best_step : int
        The logged step with the highest smoothed reward so far.
    drop, drop_se : float
        Smoothed drop from that best to now, and its standard error (see :func:`peak`).
    recovery : float
        Posterior probability of getting back to that best before the planned end (:func:`recovery_probability`).
    no_signal : bool
        GRPO had no learning signal over the last logged steps
        (:attr:`~bayes_grpo.prepare.PreparedRun.signal_exhausted`).
    flat : bool
        Every reward logged so far is the same and the run declares no range: no scale to judge on.
    """

    step: int
    total_steps: int
    gain: np.ndarray
    rise: np.ndarray
    spread: float
    best_step: int
    drop: float
    drop_se: float
    recovery: float
    no_signal: bool = False
    flat: bool = False

    def probability(self, tolerance: float, scale: float | None = None) -> float:
        """Share of draws whose remaining gain is below ``tolerance * scale`` (default scale: :attr:`spread`)."""
        return float(np.mean(self.gain < tolerance * (self.spread if scale is None else scale)))

    def rise_probability(self, tolerance: float, scale: float | None = None) -> float:
        """Share of draws whose rise just ahead exceeds ``tolerance * scale`` (default scale: :attr:`spread`)."""
        return float(np.mean(self.rise > tolerance * (self.spread if scale is None else scale)))

    @property
    def in_dip(self) -> bool:
        """The smoothed reward now is in a dip below the best so far (:func:`below_best`)."""
        return _in_dip(self.drop, self.drop_se, self.spread)


def stop_evidence(fc: Forecast) -> StopEvidence:
    """The :class:`StopEvidence` of a forecast: remaining gain and rise per draw, logged spread, drop from the best and the chance of recovering it.

    Parameters
    ----------
    fc : Forecast
        The forecast judged.

    Returns
    -------
    StopEvidence

    Example
    -------
    >>> threshold_stop(stop_evidence(fc), threshold=0.9)  # doctest: +SKIP
    """
    best = _peak_so_far(fc)
    return StopEvidence(
        step=int(fc.last_observed_step or 0),
        total_steps=int(fc.total_steps),
        gain=remaining_gain(fc),
        rise=rise_ahead(fc),
        spread=reward_spread(fc.observed_rewards),
        best_step=best.step,
        drop=best.drop,
        drop_se=best.se,
        recovery=_recovery(fc, best),
        no_signal=fc.prepared.signal_exhausted,
        flat=fc.prepared.kind == "learned" and fc.observed_rewards.size >= 3 and np.ptp(fc.observed_rewards) == 0.0,
    )


def stop_reason(
    evidence: StopEvidence,
    *,
    threshold: float = STOP_THRESHOLD,
    tolerance: float = STOP_TOLERANCE,
    min_fraction: float = MIN_STOP_FRACTION,
    scale: float | None = None,
) -> Reason:
    """Why the threshold mode stops or goes on at this check (see the module docstring).

    In order: ``"end"`` at or past the planned end; ``"early"`` before
    ``min_fraction`` of it; ``"no_signal"`` when GRPO had no learning signal over the
    last logged steps (no group's completions disagreed, so nothing can move the
    reward); ``"flat"`` when every reward logged so far is the same on an undeclared
    scale (nothing to judge against: keep training); ``"rising"`` while the probability of a material rise
    just ahead exceeds ``1 - threshold``; in a dip, ``"fall"`` when the
    probability of getting back to the best is below ``1 - threshold``, else
    ``"dip"``; outside one, ``"plateau"`` when the probability that the remaining
    gain is below ``tolerance * scale`` reaches ``threshold``, else ``"gain"``.
    The reasons in :data:`STOP_REASONS` stop the run.

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
    str
    """
    if evidence.step >= evidence.total_steps:
        return "end"
    if evidence.step < min_fraction * evidence.total_steps:
        return "early"
    if evidence.no_signal:
        return "no_signal"
    if evidence.flat:
        return "flat"
    doubt = round(1.0 - threshold, 12)  # 1 - 0.99 is 0.010000000000000009 in floating point: a share of exactly 1% is not below it
    if evidence.rise_probability(tolerance, scale) > doubt:
        return "rising"
    if evidence.in_dip:
        return "fall" if evidence.recovery < doubt else "dip"
    return "plateau" if evidence.probability(tolerance, scale) >= threshold else "gain"


def threshold_stop(
    evidence: StopEvidence,
    *,
    threshold: float = STOP_THRESHOLD,
    tolerance: float = STOP_TOLERANCE,
    min_fraction: float = MIN_STOP_FRACTION,
    scale: float | None = None,
) -> bool:
    """The threshold mode's decision: whether :func:`stop_reason` is one that stops the run.

    Parameters
    ----------
    evidence : StopEvidence
        From :func:`stop_evidence`.
    threshold, tolerance, min_fraction : float
        The rule's settings (see :func:`stop_reason`).
    scale : float, optional
        Reward scale ``tolerance`` multiplies (default: the logged spread).

    Returns
    -------
    bool
    """
    return stop_reason(evidence, threshold=threshold, tolerance=tolerance, min_fraction=min_fraction, scale=scale) in STOP_REASONS


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

    Threshold mode (see the module docstring and :func:`stop_reason`): once at
    least ``min_fraction`` of the planned steps are logged and unless the curve
    is still rising, stop on a plateau (the probability that less than
    ``tolerance * scale`` reward remains to gain reaches ``threshold``) outside a
    dip, or on a fall the run is unlikely to recover from (probability of
    getting back to its best below ``1 - threshold``).
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
    value = cost = optimal = None
    if value_per_reward is not None:
        value = float(value_per_reward * gain.mean())
        cost = float(cost_per_step * max(total - step, 0))
        ahead = fc.steps >= step
        utility = value_per_reward * fc.curves[:, ahead].mean(axis=0) - cost_per_step * fc.steps[ahead]
        optimal = int(fc.steps[ahead][np.argmax(utility)])
        reason: Reason = "end" if step >= total else ("value" if value < cost else "gain")
    else:
        reason = stop_reason(evidence, threshold=threshold, tolerance=tolerance, min_fraction=min_fraction, scale=scale)
    return StopDecision(
        probability=evidence.probability(tolerance, scale),
        expected_gain=float(gain.mean()),
        gain_interval=tuple(float(v) for v in np.quantile(gain, INTERVAL)),
        plateau_step=float(np.median(fc.plateau_step)),
        plateau_interval=tuple(float(v) for v in np.quantile(fc.plateau_step, INTERVAL)),
        should_stop=reason in STOP_REASONS,
        reason=reason,
        compute_saved=max(total - step, 0) / total,
        step=step,
        total_steps=total,
        threshold=float(threshold),
        tolerance=float(tolerance),
        scale=scale,
        relative_to=relative_to,
        best_step=evidence.best_step,
        declining=_declining(evidence.drop, evidence.drop_se, tolerance, evidence.spread),
        rise_probability=evidence.rise_probability(tolerance, scale),
        recovery_probability=evidence.recovery,
        reward_std=fc.prepared.recent_reward_std,
        logged_spread=evidence.spread,
        last_reward=float(fc.observed_rewards[-1]) if fc.observed_rewards.size else float("nan"),
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
