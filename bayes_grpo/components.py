"""Per-reward-function forecasts: each function's own curve forecast side by side, and which have saturated.

Most GRPO recipes sum several reward functions: format rewards that saturate in the
first tens of steps beside a correctness reward that is what the run is for. TRL logs
each function's mean (``rewards/<fn>/mean``) and, from TRL 0.17 on, its within-step
spread (``rewards/<fn>/std``). :func:`forecast_components` forecasts each function's
mean as a run of its own (:meth:`~bayes_grpo.logs.RunLog.with_metric`) with the same
model, and flags a function as saturated when it has no within-step spread left (GRPO
gets no gradient from it) or when the stop rule finds its curve on a plateau. A function
that has logged one value at every step (often 0: it never scored) is reported as
constant and neither forecast nor drawn: its log gives no scale and no curve to forecast.

The shipped model was fitted on summed rewards; how well it forecasts single functions
is measured in ``benchmarks/results/components.md``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from bayes_grpo.forecast import Forecast
from bayes_grpo.logs import RunLog
from bayes_grpo.settings import STOP_THRESHOLD, STOP_TOLERANCE
from bayes_grpo.stopping import Forecaster, decision_from_forecast

__all__ = ["ComponentForecast", "constant_level", "forecast_components", "plot_components", "reward_functions"]

#: A function whose mean within-step std over the last 10% of its logged steps is at most this share of
#: its largest logged std has no spread left: its groups' completions all score alike.
SPREAD_LEFT_MIN = 0.05
#: A function that logged one value at this many steps or more is :attr:`~ComponentForecast.constant`
#: (as a forecast finds no reward scale in three or more equal rewards).
MIN_CONSTANT_STEPS = 3


@dataclass(frozen=True)
class ComponentForecast:
    """One reward function's forecast and whether it has saturated (or never moved at all).

    Attributes
    ----------
    name : str
        The function's name (``<fn>`` of ``rewards/<fn>/mean``).
    forecast : Forecast or None
        Its mean's forecast, on its own scale; None for a :attr:`constant` function (not forecast).
    spread_left : float or None
        Mean within-step std over the last 10% of its logged steps as a share of its largest
        logged std; None when the log has no ``rewards/<fn>/std``.
    plateau_probability : float
        The stop rule's probability that less than the tolerance is left to gain.
    threshold : float
        The probability from which the curve counts as on a plateau.
    level : float or None
        For a constant function, the one value it logged at every step (None otherwise).
    """

    name: str
    forecast: Forecast | None
    spread_left: float | None
    plateau_probability: float
    threshold: float = STOP_THRESHOLD
    level: float | None = None

    @property
    def constant(self) -> bool:
        """It logged the same value at every step (:data:`MIN_CONSTANT_STEPS` or more): no signal, so no forecast."""
        return self.forecast is None

    @property
    def saturated(self) -> bool:
        """No within-step spread left, or on a plateau by the stop rule (never for a :attr:`constant` function)."""
        return bool(self.reason)

    @property
    def reason(self) -> str:
        """Why it counts as saturated ('' when it does not)."""
        if self.constant:
            return ""
        reasons = []
        if self.spread_left is not None and self.spread_left <= SPREAD_LEFT_MIN:
            reasons.append(f"no spread left (std at {self.spread_left:.0%} of its peak)")
        if self.plateau_probability >= self.threshold:
            reasons.append(f"plateau (P = {self.plateau_probability:.2f})")
        return "; ".join(reasons)

    @property
    def status(self) -> str:
        """One phrase for a table: ``constant: ...``, ``saturated: <reason>`` or ``still moving``."""
        if self.constant:
            if self.level == 0:
                return "constant: never scored (0 at every logged step), no signal; not forecast"
            return f"constant: {self.level:.4g} at every logged step, no signal; not forecast"
        return f"saturated: {self.reason}" if self.saturated else "still moving"


def constant_level(run: RunLog, function: str) -> float | None:
    """The one value ``rewards/<fn>/mean`` logged at every step, or None when it varies (or has fewer than
    :data:`MIN_CONSTANT_STEPS` finite values)."""
    mean = run.signal(f"rewards/{function}/mean")
    mean = mean[np.isfinite(mean)]
    if mean.size < MIN_CONSTANT_STEPS or np.ptp(mean) > 0:
        return None
    return float(mean[0]) + 0.0  # -0.0 -> 0.0


def reward_functions(run: RunLog) -> list[str]:
    """Names of the reward functions whose per-step mean the log holds, in log order."""
    return [s[len("rewards/") : -len("/mean")] for s in run.signals if s.startswith("rewards/") and s.endswith("/mean")]


def spread_left(run: RunLog, function: str) -> float | None:
    """Mean ``rewards/<fn>/std`` over the last 10% of its logged steps / its largest logged std (None if not logged)."""
    std = run.signal(f"rewards/{function}/std")
    std = std[np.isfinite(std)]
    if std.size == 0 or std.max() <= 0:
        return None if std.size == 0 else 0.0
    return float(std[-max(1, std.size // 10) :].mean() / std.max())


def forecast_components(
    model: Forecaster,
    run: RunLog,
    *,
    total_steps: int | None = None,
    reward_ranges: Mapping[str, tuple[float, float]] | None = None,
    threshold: float = STOP_THRESHOLD,
    tolerance: float = STOP_TOLERANCE,
    seed: int = 0,
) -> list[ComponentForecast]:
    """Forecast every reward function the log holds, each as a run of its own.

    Parameters
    ----------
    model : Forecaster
        E.g. :func:`bayes_grpo.default_model`.
    run : RunLog
        A run whose log holds per-function means (``rewards/<fn>/mean``).
    total_steps : int, optional
        Planned length (default: the run's metadata).
    reward_ranges : mapping, optional
        ``{function: (min, max)}`` for functions with a known range (a 0/1 correctness reward).
    threshold, tolerance : float
        The stop rule's settings that decide a plateau.
    seed : int
        Random seed of the forecasts.

    Returns
    -------
    list of ComponentForecast
        One per function, in log order; empty when the log has no per-function means. A function
        that logged one value at every step and has no range in ``reward_ranges`` is
        :attr:`~ComponentForecast.constant`, with no forecast.

    Example
    -------
    >>> [c.name for c in forecast_components(bg.default_model(), run) if c.saturated]  # doctest: +SKIP
    ['format']
    """
    ranges = dict(reward_ranges or {})
    out = []
    for function in reward_functions(run):
        level = constant_level(run, function) if function not in ranges else None
        if level is not None:
            out.append(ComponentForecast(function, None, spread_left(run, function), float("nan"), threshold, level=level))
            continue
        part = run.with_metric(f"rewards/{function}/mean", reward_range=ranges.get(function))
        fc = model.forecast(part, total_steps=total_steps, seed=seed)
        decision = decision_from_forecast(fc, threshold=threshold, tolerance=tolerance)
        out.append(ComponentForecast(function, fc, spread_left(run, function), float(decision.probability), threshold))
    return out


def plot_components(components: Sequence[ComponentForecast], figure: Any, truth: RunLog | None = None) -> Any:
    """Small fan charts side by side, one per forecast function, saturated ones marked in their title.

    Parameters
    ----------
    components : sequence of ComponentForecast
        From :func:`forecast_components`; :attr:`~ComponentForecast.constant` ones are not drawn.
    figure : matplotlib.figure.Figure
        The figure to draw on (one row of panels, up to four per row).
    truth : RunLog, optional
        The whole run, drawn where the forecast cut it.

    Returns
    -------
    matplotlib.figure.Figure
        The figure.
    """
    components = [c for c in components if not c.constant]
    if not components:
        return figure
    columns = min(4, max(1, len(components)))
    rows = -(-len(components) // columns)
    axes = np.atleast_1d(figure.subplots(rows, columns, squeeze=False)).ravel()
    for ax, component in zip(axes, components):
        part = truth.with_metric(f"rewards/{component.name}/mean") if truth is not None else None
        component.forecast.plot(ax=ax, truth=part)
        ax.set_title(component.name + ("\nsaturated: " + component.reason if component.saturated else ""), fontsize=8)
        ax.set_ylabel("")
        ax.tick_params(labelsize=7)
        if ax.get_legend() is not None:
            ax.get_legend().remove()
    for ax in axes[len(components) :]:
        ax.set_visible(False)
    return figure
