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
It is floored by :func:`trend_gain`: when the last quarter of the logged
rewards still climbs clearly (slope above two standard errors), continuing that
trend for one more window counts as gain too, because parametric curves
saturate faster than real runs that keep creeping up.

**Reward scale.** ``tolerance`` is a fraction of a reward scale:

* ``relative_to="range"`` (default): the declared reward range ``hi - lo`` when
  the run declares ``reward_range``; otherwise the spread of the rewards logged so
  far, the 5th-95th percentile range of the logged per-step rewards, floored by
  the learned noise unit of the run (see :mod:`bayes_grpo.prepare`).
* ``relative_to="gain"``: the gain so far, the posterior mean of the expected
  reward now minus the expected reward at step 0, floored by the run's per-step
  noise (:func:`bayes_grpo.prepare.noise_scale`) so a run that has not moved yet
  does not get a zero tolerance.

``stop_probability`` is the posterior probability that the remaining gain is
below ``tolerance * scale``. ``stop_decision`` stops when it reaches
``threshold`` or, in the decision-theoretic mode (``value_per_reward`` and
``cost_per_step`` given), when the expected value of the remaining gain
(``value_per_reward * E[gain]``) is below the cost of the remaining steps
(``cost_per_step * (total_steps - step)``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from bayes_grpo.errors import ModelError
from bayes_grpo.prepare import noise_scale

if TYPE_CHECKING:
    from bayes_grpo.forecast import Forecast
    from bayes_grpo.logs import RunLog
    from bayes_grpo.model import FittedModel

RelativeTo = Literal["range", "gain"]
TREND_MIN_POINTS = 8
INTERVAL = (0.05, 0.95)


@dataclass(frozen=True)
class StopDecision:
    """A stop/continue decision at ``step`` with the evidence behind it.

    ``expected_gain``/``gain_interval`` are the posterior mean and 90% interval of
    the remaining gain (reward units); ``plateau_step``/``plateau_interval`` the
    posterior median and 90% interval of the step where the curve reaches 95% of
    its total gain; ``compute_saved`` the fraction of ``total_steps`` not run if
    stopped now. In the decision-theoretic mode ``value_of_gain`` and
    ``cost_of_rest`` are the two sides compared and ``best_step`` the step that
    maximises ``value_per_reward * E[reward(s)] - cost_per_step * s``.
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
    value_of_gain: float | None = None
    cost_of_rest: float | None = None
    best_step: int | None = None

    def explain(self) -> str:
        """One plain sentence saying what the decision is and why."""
        verdict = "Stop now" if self.should_stop else "Keep training"
        lo, hi = self.gain_interval
        gain = f"expected further gain {self.expected_gain:.3g} (90% interval {lo:.3g} to {hi:.3g})"
        if self.value_of_gain is not None:
            why = f"its value {self.value_of_gain:.3g} is {'below' if self.should_stop else 'above'} the cost {self.cost_of_rest:.3g} of the remaining steps"
            return f"{verdict} at step {self.step} of {self.total_steps}: {gain}; {why} (best step {self.best_step})."
        return (
            f"{verdict} at step {self.step} of {self.total_steps}: {self.probability:.0%} probability that less than "
            f"{self.tolerance:g} x {self.scale:.3g} reward remains to gain ({gain}, plateau near step "
            f"{self.plateau_step:.0f}), {'above' if self.should_stop else 'below'} the {self.threshold:.0%} threshold"
            f"{f'; stopping saves {self.compute_saved:.0%} of the steps' if self.should_stop else ''}."
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

    The slope of the last quarter of the logged rewards (at least
    ``TREND_MIN_POINTS``) is shrunk by its standard error (``b * max(0, 1 -
    4 se^2 / b^2)``: a slope under two standard errors counts as no trend) and
    projected over the shorter of the steps left and the window's own length.
    Only rises count.
    """
    steps = np.asarray(fc.observed_steps, dtype=float)
    rewards = np.asarray(fc.observed_rewards, dtype=float)
    window = max(TREND_MIN_POINTS, steps.size // 4)
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


def reward_scale(fc: Forecast, relative_to: RelativeTo = "range") -> float:
    """The reward scale that ``tolerance`` multiplies (see the module docstring)."""
    observed = np.asarray(fc.observed_rewards, dtype=float)
    if relative_to == "gain":
        initial = fc.prepared.to_reward(fc.params["r0"])
        floor = noise_scale(observed) if observed.size else 0.0
        return max(float(np.mean(fc.current - initial)), floor, 1e-12)
    if relative_to != "range":
        raise ModelError(f"relative_to must be 'range' or 'gain', got {relative_to!r}")
    if fc.prepared.kind == "range":
        return float(fc.prepared.unit)
    lo, hi = np.percentile(observed, [5, 95]) if observed.size else (0.0, 0.0)
    return max(float(hi - lo), float(fc.prepared.unit))


def probability_from_forecast(fc: Forecast, tolerance: float = 0.01, relative_to: RelativeTo = "range") -> float:
    """Posterior probability that the remaining gain is below ``tolerance * scale``."""
    if tolerance < 0:
        raise ModelError(f"tolerance must be >= 0, got {tolerance}")
    return float(np.mean(remaining_gain(fc) < tolerance * reward_scale(fc, relative_to)))


def decision_from_forecast(
    fc: Forecast,
    *,
    threshold: float = 0.9,
    tolerance: float = 0.01,
    relative_to: RelativeTo = "range",
    value_per_reward: float | None = None,
    cost_per_step: float | None = None,
) -> StopDecision:
    """The :class:`StopDecision` for an already computed forecast (see :func:`stop_decision`)."""
    if not 0.0 <= threshold <= 1.0:
        raise ModelError(f"threshold must be in [0, 1], got {threshold}")
    if (value_per_reward is None) != (cost_per_step is None):
        raise ModelError("the decision-theoretic mode needs both value_per_reward= and cost_per_step=")
    step, total = int(fc.last_observed_step or 0), int(fc.total_steps)
    gain = remaining_gain(fc)
    scale = reward_scale(fc, relative_to)
    probability = float(np.mean(gain < tolerance * scale))
    value = cost = best = None
    if value_per_reward is not None:
        value = float(value_per_reward * gain.mean())
        cost = float(cost_per_step * max(total - step, 0))
        ahead = fc.steps >= step
        utility = value_per_reward * fc.curves[:, ahead].mean(axis=0) - cost_per_step * fc.steps[ahead]
        best = int(fc.steps[ahead][np.argmax(utility)])
        should_stop = value < cost
    else:
        should_stop = probability >= threshold
    should_stop = should_stop or step >= total
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
        value_of_gain=value,
        cost_of_rest=cost,
        best_step=best,
    )


def stop_probability(
    model: FittedModel,
    run: RunLog,
    total_steps: int | None = None,
    tolerance: float = 0.01,
    relative_to: RelativeTo = "range",
    **forecast_kw: Any,
) -> float:
    """Posterior probability that less than ``tolerance * scale`` reward remains to gain by ``total_steps``.

    ``forecast_kw`` go to :meth:`FittedModel.forecast` (``n_draws``, ``seed``, metadata overrides).
    """
    fc = model.forecast(run, total_steps=total_steps, **forecast_kw)
    return probability_from_forecast(fc, tolerance, relative_to)


def stop_decision(
    model: FittedModel,
    run: RunLog,
    total_steps: int | None = None,
    threshold: float = 0.9,
    tolerance: float = 0.01,
    relative_to: RelativeTo = "range",
    value_per_reward: float | None = None,
    cost_per_step: float | None = None,
    **forecast_kw: Any,
) -> StopDecision:
    """Decide whether to stop the run now.

    Threshold mode: stop when :func:`stop_probability` >= ``threshold``.
    Decision-theoretic mode (give ``value_per_reward``, the worth of one unit of
    reward, and ``cost_per_step``, e.g. GPU-hours x price, in the same currency):
    stop when ``value_per_reward * E[remaining gain] < cost_per_step * remaining steps``.
    """
    fc = model.forecast(run, total_steps=total_steps, **forecast_kw)
    return decision_from_forecast(
        fc,
        threshold=threshold,
        tolerance=tolerance,
        relative_to=relative_to,
        value_per_reward=value_per_reward,
        cost_per_step=cost_per_step,
    )
