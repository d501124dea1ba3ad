"""The result of a stop rule: :class:`StopDecision`, with the evidence behind it and a sentence that explains it.

:func:`decision` builds one from a forecast for any rule, so a rule only says
whether to stop and why (:class:`~bayes_grpo.stopping.base.StopRule`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Literal, get_args

import numpy as np

from bayes_grpo.forecast import Forecast
from bayes_grpo.settings import STOP_THRESHOLD, STOP_TOLERANCE
from bayes_grpo.stopping.evidence import RelativeTo, StopEvidence, _declining, reward_scale, stop_evidence

#: The package's own reasons (a user's rule may give others).
Reason = Literal["end", "early", "no_signal", "flat", "rising", "fall", "dip", "plateau", "gain", "value"]
#: The central interval reported for the gain and the plateau step.
INTERVAL = (0.05, 0.95)
#: The explanation names the learning signal when the latest ``reward_std`` is at least this share of the logged spread.
PLENTIFUL_SIGNAL = 0.5


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
    rule : str
        The rule that decided (its class name, e.g. ``"PlateauRule"``).
    detail : str
        The rule's own words for a reason the package does not know (a user's rule).

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
    rule: str = "PlateauRule"
    detail: str = ""

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
        if self.reason not in _KNOWN_REASONS:  # a user's rule: its own words, and the evidence it may not have weighed
            said = f": {self.detail}" if self.detail else f" ({self.reason})"
            return f"{verdict} at step {self.step} of {self.total_steps} by {self.rule}{said} ({gain}){saves}{keep}."
        side = "at or above" if self.probability >= self.threshold else "below"
        if self.relative_to == "gain":
            scale_name = "the gain so far"
        elif self.relative_to == "spread" and np.isclose(self.scale, self.logged_spread):
            scale_name = "the logged reward spread"
        else:  # the declared range (also what a flat log on a declared range is judged on), or the logged 5-95% range
            scale_name = "the reward range"
        if self.plateau_step <= self.step:
            plateau = f"the curve levelled off near step {self.plateau_step:.0f}"
        elif np.isfinite(self.plateau_step):
            plateau = f"plateau expected near step {self.plateau_step:.0f}"
        else:  # most draws' curves rise too slowly to reach 95% of their gain at any step
            plateau = "no plateau expected at any step"
        head = (
            f"{verdict} at step {self.step} of {self.total_steps}: {self.probability:.0%} probability that less than "
            f"{self.tolerance * self.scale:.3g} more reward is to come ({self.tolerance:.0%} of {scale_name}, {self.scale:.3g}; {gain}, "
            f"{plateau}), {side} the {self.threshold:.0%} threshold"
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


_KNOWN_REASONS = frozenset(get_args(Reason))


def decision(
    fc: Forecast,
    *,
    should_stop: bool,
    reason: str,
    rule: str,
    detail: str = "",
    evidence: StopEvidence | None = None,
    scale: float | None = None,
    threshold: float = STOP_THRESHOLD,
    tolerance: float = STOP_TOLERANCE,
    relative_to: RelativeTo = "spread",
    value_of_gain: float | None = None,
    cost_of_rest: float | None = None,
    optimal_stop_step: int | None = None,
) -> StopDecision:
    """A :class:`StopDecision` for ``fc``: the rule's verdict with the forecast's evidence beside it.

    Whatever the rule weighed, the decision reports the same evidence (remaining gain, plateau
    step, best step, rise and recovery probabilities), so every rule's decisions read alike in
    the callback, the CLI and the backtest.

    Parameters
    ----------
    fc : Forecast
        The forecast the rule judged.
    should_stop : bool
        The verdict.
    reason : str
        Why (one of :data:`Reason`, or the rule's own word).
    rule : str
        The rule's name.
    detail : str
        Words for a reason outside :data:`Reason`.
    evidence : StopEvidence, optional
        Already computed (:func:`~bayes_grpo.stopping.evidence.stop_evidence`); computed here otherwise.
    scale : float, optional
        The reward scale ``tolerance`` multiplies, when the rule already has it (:func:`~bayes_grpo.stopping.evidence.reward_scale`).
    threshold, tolerance, relative_to
        The settings the reported probabilities use.
    value_of_gain, cost_of_rest, optimal_stop_step
        The decision-theoretic mode's figures.

    Returns
    -------
    StopDecision
    """
    evidence = evidence if evidence is not None else stop_evidence(fc)
    step, total, gain = evidence.step, evidence.total_steps, evidence.gain
    scale = reward_scale(fc, relative_to) if scale is None else scale
    # Draws' order statistics, not interpolated: a draw whose plateau lies beyond any horizon is inf, and inf - inf is NaN.
    plateau_median, plateau_low, plateau_high = (float(v) for v in np.quantile(fc.plateau_step, (0.5, *INTERVAL), method="nearest"))
    return StopDecision(
        probability=evidence.probability(tolerance, scale),
        expected_gain=float(gain.mean()),
        gain_interval=tuple(float(v) for v in np.quantile(gain, INTERVAL)),
        plateau_step=plateau_median,
        plateau_interval=(plateau_low, plateau_high),
        should_stop=bool(should_stop),
        reason=str(reason),
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
        value_of_gain=value_of_gain,
        cost_of_rest=cost_of_rest,
        optimal_stop_step=optimal_stop_step,
        rule=rule,
        detail=detail,
    )
