"""The package's stop rule: stop on a plateau (or a fall) the forecast is sure of, never while a rise may be ahead.

:class:`PlateauRule` is the threshold mode described in :mod:`bayes_grpo.stopping`;
:func:`stop_reason` is its logic on a :class:`~bayes_grpo.stopping.evidence.StopEvidence`,
so one forecast per check can be judged at many settings (the backtest's nested
selection does).
"""

from __future__ import annotations

from dataclasses import dataclass

from bayes_grpo.errors import ModelError
from bayes_grpo.forecast import Forecast
from bayes_grpo.settings import STOP_THRESHOLD, STOP_TOLERANCE
from bayes_grpo.stopping.base import StopRule
from bayes_grpo.stopping.decision import Reason, StopDecision, decision
from bayes_grpo.stopping.evidence import RelativeTo, StopEvidence, reward_scale, stop_evidence

#: No stop before this share of the planned steps is logged.
MIN_STOP_FRACTION = 0.3
#: The reasons that stop the run (the others keep it training).
STOP_REASONS = frozenset({"end", "no_signal", "fall", "plateau", "value"})


@dataclass(frozen=True)
class PlateauRule(StopRule):
    """Stop when, with probability ``threshold``, no material rise is left and a fall will not be recovered.

    Parameters
    ----------
    threshold : float
        In [0, 1] (default :data:`bayes_grpo.settings.STOP_THRESHOLD`, 0.99).
    tolerance : float
        Fraction of the reward scale that counts as material (default
        :data:`bayes_grpo.settings.STOP_TOLERANCE`, 0.02).
    relative_to : {"spread", "range", "gain"}
        The reward scale (:func:`~bayes_grpo.stopping.evidence.reward_scale`).
    min_fraction : float
        No stop before this share of the planned steps (default :data:`MIN_STOP_FRACTION`, 30%).

    Raises
    ------
    ModelError
        For a threshold or ``min_fraction`` outside [0, 1], or a negative tolerance.

    Example
    -------
    >>> PlateauRule(threshold=0.95).decide(fc).explain()  # doctest: +SKIP
    """

    threshold: float = STOP_THRESHOLD
    tolerance: float = STOP_TOLERANCE
    relative_to: RelativeTo = "spread"
    min_fraction: float = MIN_STOP_FRACTION

    def __post_init__(self) -> None:
        if not 0.0 <= self.threshold <= 1.0:
            raise ModelError(f"threshold must be in [0, 1], got {self.threshold}")
        if not 0.0 <= self.min_fraction <= 1.0:
            raise ModelError(f"min_fraction must be in [0, 1], got {self.min_fraction}")
        if self.tolerance < 0:
            raise ModelError(f"tolerance must be >= 0, got {self.tolerance}")
        if self.relative_to not in ("spread", "range", "gain"):
            raise ModelError(f"relative_to must be 'spread', 'range' or 'gain', got {self.relative_to!r}")

    def decide(self, forecast: Forecast) -> StopDecision:
        """The threshold mode's decision for ``forecast`` (see :func:`stop_reason`)."""
        evidence = stop_evidence(forecast)
        scale = reward_scale(forecast, self.relative_to)
        reason = stop_reason(evidence, threshold=self.threshold, tolerance=self.tolerance, min_fraction=self.min_fraction, scale=scale)
        return decision(
            forecast, should_stop=reason in STOP_REASONS, reason=reason, rule=type(self).__name__, evidence=evidence, scale=scale,
            threshold=self.threshold, tolerance=self.tolerance, relative_to=self.relative_to,
        )  # fmt: skip


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
