"""Every figure of a forecast is drawn here: one fan (:func:`draw_fan`) for the forecast, the callback, ``watch`` and ``rank``.

:func:`draw_fan` draws a forecast's 50% and 90% bands, its median and the logged rewards
on one axis; :meth:`Forecast.plot <bayes_grpo.forecast.Forecast.plot>`, the panels of
:meth:`Ranking.plot_fans <bayes_grpo.sweeps.Ranking.plot_fans>` and the report's fan charts
use it as it is. :func:`fan_chart` adds the planned end, the checkpoint to keep and the stop
probability of every check so far: the figure the TRL callback sends to TensorBoard and W&B
and ``bayes-grpo watch --plot`` writes. Matplotlib is imported inside the functions, so
importing the package stays light.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from bayes_grpo.measures import smoothed

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

    from bayes_grpo.logs import RunLog


class Forecast(Protocol):
    """What a fan is drawn from (:class:`bayes_grpo.forecast.Forecast`; a protocol, so the forecast may draw itself)."""

    run_id: str
    steps: np.ndarray
    draws: np.ndarray
    total_steps: int
    observed_steps: np.ndarray
    observed_rewards: np.ndarray

    @property
    def last_observed_step(self) -> int | None: ...


class StopDecision(Protocol):
    """What :func:`fan_chart` shows of a decision (:class:`bayes_grpo.stopping.StopDecision`)."""

    best_step: int
    probability: float
    should_stop: bool
    threshold: float

#: Quantiles of the bands: outer 90%, inner 50%, and the median.
BAND_LEVELS = (0.05, 0.25, 0.5, 0.75, 0.95)


def draw_bands(ax: Axes, steps: np.ndarray, draws: np.ndarray, colour: str = "C0", labels: bool = True) -> None:
    """The 90% and 50% bands and the median of ``draws`` (n_draws, len(steps)) over ``steps``."""
    q05, q25, q50, q75, q95 = np.quantile(draws, BAND_LEVELS, axis=0)
    ax.fill_between(steps, q05, q95, alpha=0.2, color=colour, lw=0, label="90% interval" if labels else None)
    ax.fill_between(steps, q25, q75, alpha=0.35, color=colour, lw=0, label="50% interval" if labels else None)
    ax.plot(steps, q50, color=colour, lw=1.5, label="median" if labels else None)


def draw_fan(
    ax: Axes,
    fc: Forecast,
    truth: RunLog | None = None,
    colour: str = "C0",
    ahead_only: bool = False,
    labels: bool = True,
) -> Axes:
    """One forecast's fan on ``ax``: bands and median of its trajectory draws, the logged rewards, and the truth if given.

    Parameters
    ----------
    ax : matplotlib Axes
        Where to draw.
    fc : Forecast
        The forecast.
    truth : RunLog, optional
        The whole run, drawn in grey behind (for a forecast from a cut).
    colour : str
        Colour of the bands.
    ahead_only : bool
        Draw the bands only from the last logged step on.
    labels : bool
        Give the artists legend labels.

    Returns
    -------
    matplotlib Axes
    """
    keep = fc.steps >= (fc.last_observed_step or 0) if ahead_only else np.ones(fc.steps.size, dtype=bool)
    draw_bands(ax, fc.steps[keep], fc.draws[:, keep], colour, labels)
    if truth is not None:
        ax.plot(truth.steps, truth.rewards, color="0.6", lw=0.6, label="full run" if labels else None)
    ax.plot(fc.observed_steps, fc.observed_rewards, color="k", lw=0.8, label="logged" if labels else None)
    if fc.last_observed_step is not None:
        ax.axvline(fc.last_observed_step, color="k", ls=":", lw=0.8)
    return ax


def plot_forecast(fc: Forecast, ax: Axes | None = None, truth: RunLog | None = None) -> Axes:
    """The fan of :meth:`Forecast.plot <bayes_grpo.forecast.Forecast.plot>`: :func:`draw_fan` with axis labels, a title and a legend."""
    if ax is None:
        import matplotlib.pyplot as plt

        ax = plt.figure(figsize=(6.5, 3.8), layout="constrained").add_subplot()
    draw_fan(ax, fc, truth=truth)
    ax.set_xlabel("step")
    ax.set_ylabel("reward")
    ax.set_title(fc.run_id, fontsize=9)
    ax.legend(fontsize=7, loc="best")
    return ax


def best_step_level(fc: Forecast, best_step: int) -> float | None:
    """The smoothed logged reward at ``best_step`` (the level the stop rule judged best), or None when not logged."""
    hit = np.flatnonzero(fc.observed_steps == best_step)
    if not hit.size:
        return None
    span = max(float(fc.total_steps - fc.observed_steps[0]), 1.0)
    return float(smoothed(fc.observed_steps, fc.observed_rewards, span=span)[hit[0]])


def fan_chart(
    fc: Forecast, decision: StopDecision | None = None, history: Sequence[tuple[int, float]] = (), threshold: float | None = None
) -> Figure:
    """The forecast fan with the logged rewards, planned end and best step; below it, the stop probability so far.

    Parameters
    ----------
    fc : Forecast
        The forecast to draw.
    decision : StopDecision, optional
        Marks its best step (on the smoothed reward the rule judged) and names its verdict in the title.
    history : sequence of (int, float)
        Step and stop probability of every check so far (the lower panel; none: fan only).
    threshold : float, optional
        The stop threshold, drawn in the lower panel (default: the decision's).

    Returns
    -------
    matplotlib.figure.Figure
        A figure not managed by pyplot (safe to draw outside the main thread).
    """
    from matplotlib.figure import Figure

    figure = Figure(figsize=(7, 5 if history else 3.6), dpi=80)
    figure.subplots_adjust(left=0.1, right=0.97, top=0.93, bottom=0.1 if history else 0.13, hspace=0.12)  # fixed: faster than a layout engine
    if history:
        fan, below = figure.subplots(2, 1, sharex=True, height_ratios=(3, 1))
    else:
        fan, below = figure.subplots(), None
    draw_fan(fan, fc)
    fan.axvline(fc.total_steps, color="0.3", ls="--", lw=0.8, label="planned end")
    if decision is not None and decision.best_step:
        level = best_step_level(fc, decision.best_step)
        if level is not None:
            fan.plot(decision.best_step, level, "o", color="C3", ms=5, label=f"best step {decision.best_step} (smoothed)")
    fan.set_ylabel("reward")
    fan.legend(fontsize=7, loc="best")
    title = f"{fc.run_id}: step {fc.last_observed_step} of {fc.total_steps}"
    if decision is not None:
        title += f", P(plateau) {decision.probability:.0%}: {'stop' if decision.should_stop else 'keep training'}"
    fan.set_title(title, fontsize=9)
    axis = below if below is not None else fan
    if below is not None:
        steps, probabilities = zip(*history)
        below.plot(steps, probabilities, "o-", color="C2", ms=3, lw=1)
        limit = threshold if threshold is not None else (decision.threshold if decision is not None else None)
        if limit is not None:
            below.axhline(limit, color="C3", ls=":", lw=0.8)
        below.set_ylim(-0.02, 1.02)
        below.set_ylabel("P(plateau)")
    axis.set_xlim(0, fc.total_steps * 1.02)
    axis.set_xlabel("step")
    return figure


def figure_pixels(figure: Figure) -> np.ndarray:
    """Render ``figure`` (Agg) to an (height, width, 3) uint8 RGB array, the form W&B and TensorBoard take."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = FigureCanvasAgg(figure)
    canvas.draw()
    return np.asarray(canvas.buffer_rgba())[..., :3].copy()


def save_figure(figure: Any, path: str | os.PathLike, dpi: int = 120) -> Path:
    """Write ``figure`` to ``path`` through a temporary file, so a viewer never sees half an image.

    The temporary file is created by ``savefig`` itself (not ``mkstemp``, whose files are private
    ``0o600``), so the image gets the permissions of any new file: ``0o666`` less the umask.
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    temporary = target.parent / f".{target.stem}-{uuid.uuid4().hex}{target.suffix}"
    try:
        figure.savefig(temporary, dpi=dpi)
        os.replace(temporary, target)
    finally:
        temporary.unlink(missing_ok=True)
    return target
