"""The evidence a stop rule weighs, read off one forecast: remaining gain, rise just ahead, the reward scale, the best step so far and the chance of getting back to it.

The maths behind :class:`~bayes_grpo.stopping.plateau.PlateauRule` (see :mod:`bayes_grpo.stopping`
for what each quantity means for the decision). Every function takes a
:class:`~bayes_grpo.forecast.Forecast`; none of them decides anything.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, NamedTuple

import numpy as np

from bayes_grpo.errors import ModelError
from bayes_grpo.forecast import Forecast
from bayes_grpo.measures import reward_spread, smoothed
from bayes_grpo.prepare import noise_scale
from bayes_grpo.settings import SMOOTHING_BANDWIDTH, STOP_TOLERANCE

#: What ``tolerance`` is a fraction of (see :func:`reward_scale`).
RelativeTo = Literal["spread", "range", "gain"]
#: A run is in a dip when its smoothed reward is this many standard errors below its best so far...
DIP_SE = 2.0
#: ...or below it by more than this share of the logged 10-90% spread: the regret above which the backtest counts a stop
#: as bad, so a drop within the noise but large enough to matter if the run comes back still counts.
DIP_SPREAD = 0.05
#: The rise that counts as "still rising" is measured over this share of the planned steps ahead.
RISE_WINDOW = SMOOTHING_BANDWIDTH


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

    The share of the model's own trajectory draws (``Forecast.raw.draws``: the
    curve plus the model-discrepancy wander, which is what lets a saturating
    curve come back after a fall) whose level at some forecast step after the last
    logged one reaches the best smoothed logged reward so far (see :func:`peak`). 1
    for a run at its best now (nothing to recover) or not started. Like the
    remaining gain, it is judged on the model's own forecast, not the calibrated
    one: the calibration layer draws every draw towards the last logged level and
    calibrates the final window, not the path to it. Judged on the calibrated draws
    whose upper tail narrows as the plan runs out (layer form 3), a run in a dip
    late in its plan was stopped as fallen in 3.3% of the real runs although it
    recovered (``docs/notes/2026-12-07-take-off-room.md``).

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
    return float(np.mean(fc.raw.draws[:, ahead].max(axis=1) >= best.level))


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
