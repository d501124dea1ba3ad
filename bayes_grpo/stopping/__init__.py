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
   :func:`recovery_probability`, the share of the model's own trajectory draws
   (``Forecast.raw.draws``, curve plus wander: the wander is what lets a saturating
   curve come back) that get back to that best before the planned end, is below
   ``1 - threshold``. Otherwise it waits, and no plateau is called inside a dip.
3. **Is the rise over?** Outside a dip, the run stops when the posterior
   probability that the remaining gain is below ``tolerance * scale``
   (:func:`probability_from_forecast`) reaches ``threshold``.

Tying all three to one confidence keeps the rule one dial: "stop when, with
probability ``threshold``, the run has no material rise left and is not about to
get back what it lost".

How the defaults were chosen: ``benchmarks/backtest_stopping.py`` replays each shared real
run check by check with a model fitted without its source; its figures, beside the fixed-fraction
and patience baselines, are in ``benchmarks/results/backtest_stopping.md``. The rule judges the
model's own curves; the calibration layer (:mod:`bayes_grpo.recalibration`) moves only the
forecast's draws.

The decision-theoretic mode (:class:`~bayes_grpo.stopping.value.ValueRule`, or
``value_per_reward`` and ``cost_per_step`` given) stops when the expected value of the remaining gain
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

**Rules are objects** (:class:`~bayes_grpo.stopping.base.StopRule`, one method: a decision from
a forecast), one per module: :class:`~bayes_grpo.stopping.plateau.PlateauRule` (the threshold
mode, the default), :class:`~bayes_grpo.stopping.value.ValueRule` (the decision-theoretic mode),
and the baselines :class:`~bayes_grpo.stopping.fixed.FixedFractionRule` and
:class:`~bayes_grpo.stopping.patience.PatienceRule`. The callback, ``bayes-grpo stop --rule`` and the
backtest take any rule, a user's included. This package works on a
:class:`~bayes_grpo.forecast.Forecast`; :func:`stop_probability` and :func:`stop_decision` take
anything with a ``forecast`` method (a :class:`Forecaster`, e.g. a fitted model) and never import
the fitting code.
"""

from __future__ import annotations

from typing import Any, Protocol

from bayes_grpo.errors import ModelError
from bayes_grpo.forecast import Forecast
from bayes_grpo.logs import RunLog
from bayes_grpo.settings import STOP_THRESHOLD, STOP_TOLERANCE
from bayes_grpo.stopping.base import StopRule, load_rule
from bayes_grpo.stopping.decision import INTERVAL, PLENTIFUL_SIGNAL, Reason, StopDecision, decision
from bayes_grpo.stopping.evidence import (
    DIP_SE, DIP_SPREAD, RISE_WINDOW, RelativeTo, StopEvidence, below_best, peak, probability_from_forecast, recovery_probability,
    remaining_gain, reward_scale, rise_ahead, rise_probability, stop_evidence,
)  # fmt: skip
from bayes_grpo.stopping.fixed import FixedFractionRule
from bayes_grpo.stopping.patience import PatienceRule
from bayes_grpo.stopping.plateau import MIN_STOP_FRACTION, STOP_REASONS, PlateauRule, stop_reason, threshold_stop
from bayes_grpo.stopping.value import ValueRule

__all__ = [
    "DIP_SE", "DIP_SPREAD", "INTERVAL", "MIN_STOP_FRACTION", "PLENTIFUL_SIGNAL", "RISE_WINDOW", "STOP_REASONS",
    "FixedFractionRule", "Forecaster", "PatienceRule", "PlateauRule", "Reason", "RelativeTo", "StopDecision", "StopEvidence",
    "StopRule", "ValueRule", "below_best", "load_rule", "decision", "decision_from_forecast", "peak", "probability_from_forecast",
    "recovery_probability", "remaining_gain", "reward_scale", "rise_ahead", "rise_probability", "rule_from_settings",
    "stop_decision", "stop_evidence", "stop_probability", "stop_reason", "threshold_stop",
]  # fmt: skip


class Forecaster(Protocol):
    """Anything that forecasts a run, e.g. :class:`bayes_grpo.model.FittedModel`."""

    def forecast(self, run: RunLog | None = None, total_steps: int | None = None, **kwargs: Any) -> Forecast: ...


def rule_from_settings(
    *,
    threshold: float = STOP_THRESHOLD,
    tolerance: float = STOP_TOLERANCE,
    relative_to: RelativeTo = "spread",
    value_per_reward: float | None = None,
    cost_per_step: float | None = None,
    min_fraction: float = MIN_STOP_FRACTION,
) -> StopRule:
    """The rule the keyword settings name: :class:`ValueRule` when both costs are given, else :class:`PlateauRule`.

    Raises
    ------
    ModelError
        For only one of the two costs, or a setting its rule refuses.
    """
    if (value_per_reward is None) != (cost_per_step is None):
        raise ModelError("the decision-theoretic mode needs both value_per_reward= and cost_per_step=")
    plateau = PlateauRule(threshold=threshold, tolerance=tolerance, relative_to=relative_to, min_fraction=min_fraction)
    if value_per_reward is None:
        return plateau
    return ValueRule(value_per_reward, cost_per_step, threshold=threshold, tolerance=tolerance, relative_to=relative_to)


def decision_from_forecast(
    fc: Forecast,
    *,
    threshold: float = STOP_THRESHOLD,
    tolerance: float = STOP_TOLERANCE,
    relative_to: RelativeTo = "spread",
    value_per_reward: float | None = None,
    cost_per_step: float | None = None,
    min_fraction: float = MIN_STOP_FRACTION,
    rule: StopRule | None = None,
) -> StopDecision:
    """The stop/continue decision for an already computed forecast: ``rule.decide(fc)``.

    Without ``rule``, the settings name it (:func:`rule_from_settings`): the threshold mode
    (:class:`PlateauRule`) by default, the decision-theoretic mode (:class:`ValueRule`) when
    ``value_per_reward`` (the worth of one unit of reward) and ``cost_per_step`` are given.
    A run at or past its planned end always stops under either.

    Parameters
    ----------
    fc : Forecast
        The forecast of the run from its last logged step.
    threshold, tolerance, relative_to, min_fraction
        See :class:`PlateauRule`.
    value_per_reward, cost_per_step : float, optional
        Both or neither: the decision-theoretic mode.
    rule : StopRule, optional
        Any rule (then the settings are not used).

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
    if rule is None:
        rule = rule_from_settings(
            threshold=threshold, tolerance=tolerance, relative_to=relative_to, value_per_reward=value_per_reward,
            cost_per_step=cost_per_step, min_fraction=min_fraction,
        )  # fmt: skip
    return rule.decide(fc)


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
    rule: StopRule | None = None,
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
    threshold, tolerance, relative_to, value_per_reward, cost_per_step, min_fraction, rule
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
        rule=rule,
    )
