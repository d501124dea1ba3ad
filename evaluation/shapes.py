"""Canonical reward-curve shapes: synthetic GRPO reward logs whose future is known.

Each shape is a noiseless reward level on training progress ``t = step / total_steps``
in [0, 1], on a 0-1 reward scale (an accuracy-like reward). :func:`make_run` logs
that level at every step from 1 to ``total_steps`` plus Gaussian noise and returns
a :class:`~bayes_grpo.logs.RunLog` whose ``total_steps`` is the planned length, so a
head of it (``run.head(step)``) is what a user sees mid-run and the rest is the
future a forecast is judged against. Runs are seeded: the same shape, length,
noise and seed give the same rewards on every machine.

The shapes (:data:`SHAPES`) are the behaviour a forecast and a stop rule must get
right:

* ``straight``: a straight rise from 0.1 to 0.9, still climbing at the last step;
* ``concave``: a square-root rise from 0.1 to 0.9, slowing but never flat;
* ``late_40`` / ``late_60``: a late take-off, a logistic rise from 0.1 to 0.9
  centred at 40% / 60% of the run (flat heads that are not plateaus);
* ``two_stage``: a first rise to 0.4 by 20% of the run, a plateau, then a second
  climb to 0.9 centred at 65% (format first, then correctness);
* ``early_plateau``: a fast rise to 0.7 that is flat from about 20% on;
* ``rise_decline``: a rise to 0.7, then a steady fall from 45% to 0.4 at the end;
* ``dip``: a rise to 0.7 with a dip of 0.3 centred at 45% that recovers fully
  (:attr:`Shape.dip` is where it lies);
* ``flat``: a run that never learns, level 0.2 throughout;
* ``staircase``: discrete jumps of 0.2 at 15, 35, 55 and 75% of the run, from
  0.1 to 0.9, as game or pass/fail rewards make;
* ``flat_signal``: flat at 0.2 while its completions still disagree (plentiful
  learning signal), then a take-off centred at 75% to 0.8: a flat head that is
  not a plateau;
* ``flat_no_signal``: flat at 0.2, with no learning signal from 10% on: every
  group's completions score the same, every step, so the logged reward no longer
  moves at all (no noise): a finished run.

**GRPO's signals.** Every run logs ``reward_std`` and ``frac_reward_zero_std`` as
GRPO would (:func:`learning_signal`): a group can learn only while its completions
score differently, and a run's rise comes from such groups, so the share of groups
with spread follows the rise still ahead (high before and during a rise, falling
as the run saturates, low on a plateau or a decline), and ``reward_std`` is that
share times the spread of a mixed group (:data:`GROUP_SPREAD`, the mean within-group
spread, as TRL before 0.27 logged it).

**The suite** (:func:`cells`, :func:`score_cell`, :func:`summarise`,
:func:`spec_checks`; run by ``benchmarks/shapes.py``) forecasts each shape at
:data:`LENGTHS` steps, :data:`NOISES` noise levels and a few seeds, cut at
:data:`CUTS` of its planned steps, through the public API: ``model.forecast`` and
``model.stop_decision`` on the head, with no reward range declared (what a user
who gives none gets) or with ``reward_range=(0, 1)``. Each forecast is scored by
:func:`evaluation.calibration.evaluate_run`, the calibration benchmark's scorer:
the truth is the mean logged reward over the final 10% of the steps
(:func:`bayes_grpo.measures.final_reward`, noise included), and the row carries
the 90% and 50% coverage, the quantile score and the regime weights of
:attr:`bayes_grpo.forecast.Forecast.regimes`.

:func:`spec_checks` judges the behaviour the suite specifies: the 90% interval holds the truth
in at least 85% of the forecasts at 30% and 50% observed for the shapes whose
log already shows where they are going; the straight rise is never called a
plateau (plateau weight below 0.5 at every cut); no stop inside a dip that
recovers. For late take-offs and two-stage rises, whose heads look like
plateaus, the weight given to a rise still ahead is reported (it has no
threshold of its own).
"""

from __future__ import annotations

import functools
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, get_args

import numpy as np
import pandas as pd

from bayes_grpo.logs import RunLog, RunMetadata
from bayes_grpo.stopping import MIN_STOP_FRACTION

if TYPE_CHECKING:
    from bayes_grpo.model import FittedModel

__all__ = [
    "CUTS", "LENGTHS", "NOISES", "SHAPES", "Cell", "Shape", "cells", "in_dip", "learning_signal", "level", "make_run", "score_cell",
    "spec_checks", "summarise",
]  # fmt: skip

#: Planned lengths (steps) each shape is generated at.
LENGTHS = (50, 250, 2000)
#: Standard deviations of the per-step Gaussian noise, on the 0-1 reward scale.
NOISES = (0.03, 0.08)
#: Observed shares of the planned steps at which the suite forecasts.
CUTS = (0.2, 0.3, 0.5, 0.7)
#: Depth, centre and width (standard deviation, in progress) of the ``dip`` shape's dip.
DIP_DEPTH, DIP_CENTRE, DIP_WIDTH = 0.3, 0.45, 0.05
#: The dip spans the progress where it is deeper than this share of its depth.
DIP_EDGE = 0.1
#: Reward spread of a group whose completions disagree (a 0-1 reward near 0.5: about 0.45).
GROUP_SPREAD = 0.45
#: Share of groups with spread when no rise is ahead (chance disagreements), and the rise still
#: ahead (0-1 scale) at which every group has spread.
IDLE_SHARE, FULL_SIGNAL_RISE = 0.05, 0.3
#: ``flat_no_signal`` loses its last group with spread at this share of the plan.
NO_SIGNAL_FROM = 0.1


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * x))


def _take_off(t: np.ndarray, centre: float, width: float) -> np.ndarray:
    """A logistic rise in progress, rescaled to run from exactly 0 at t = 0 to exactly 1 at t = 1."""
    low, high = _sigmoid(np.asarray(-centre / width)), _sigmoid(np.asarray((1.0 - centre) / width))
    return (_sigmoid((t - centre) / width) - low) / (high - low)


def _saturating(t: np.ndarray, timescale: float) -> np.ndarray:
    """``1 - exp(-t / timescale)``: a fast rise that levels off."""
    return 1.0 - np.exp(-t / timescale)


def _dip_depth(t: np.ndarray) -> np.ndarray:
    return DIP_DEPTH * np.exp(-0.5 * ((t - DIP_CENTRE) / DIP_WIDTH) ** 2)


_DIP_HALF_SPAN = DIP_WIDTH * float(np.sqrt(-2.0 * np.log(DIP_EDGE)))


@dataclass(frozen=True)
class Shape:
    """One canonical shape: its noiseless level as a function of progress, and what it is.

    Attributes
    ----------
    name : str
        Key in :data:`SHAPES`.
    description : str
        One line: what the curve does.
    curve : callable
        Progress in [0, 1] (array) -> noiseless reward level (array, 0-1 scale).
    rising : bool
        The level never falls (a non-decreasing curve).
    dip : (float, float) or None
        The progress interval of a dip the run recovers from (where the level is
        more than :data:`DIP_EDGE` of the dip's depth below the curve without it).
    """

    name: str
    description: str
    curve: Callable[[np.ndarray], np.ndarray]
    rising: bool
    dip: tuple[float, float] | None = None


SHAPES: dict[str, Shape] = {
    shape.name: shape
    for shape in (
        Shape("straight", "straight rise from 0.1 to 0.9", lambda t: 0.1 + 0.8 * t, rising=True),
        Shape("concave", "square-root rise from 0.1 to 0.9", lambda t: 0.1 + 0.8 * np.sqrt(t), rising=True),
        Shape("late_40", "late take-off: logistic rise from 0.1 to 0.9 centred at 40%", lambda t: 0.1 + 0.8 * _take_off(t, 0.4, 0.05), rising=True),
        Shape("late_60", "late take-off: logistic rise from 0.1 to 0.9 centred at 60%", lambda t: 0.1 + 0.8 * _take_off(t, 0.6, 0.05), rising=True),
        Shape(
            "two_stage", "rise to 0.4 by 20%, plateau, second climb to 0.9 centred at 65%",
            lambda t: 0.1 + 0.3 * _take_off(t, 0.1, 0.025) + 0.5 * _take_off(t, 0.65, 0.05), rising=True,
        ),  # fmt: skip
        Shape("early_plateau", "fast rise to 0.7, flat from about 20% on", lambda t: 0.1 + 0.6 * _saturating(t, 0.05), rising=True),
        Shape(
            "rise_decline", "rise to 0.7, then a steady fall from 45% to 0.4 at the end",
            lambda t: 0.1 + 0.6 * _saturating(t, 0.08) - 0.3 * np.clip(t - 0.45, 0.0, None) / 0.55, rising=False,
        ),  # fmt: skip
        Shape(
            "dip", f"rise to 0.7, a dip of {DIP_DEPTH:g} centred at {DIP_CENTRE:.0%} that recovers",
            lambda t: 0.1 + 0.6 * _saturating(t, 0.08) - _dip_depth(t), rising=False,
            dip=(DIP_CENTRE - _DIP_HALF_SPAN, DIP_CENTRE + _DIP_HALF_SPAN),
        ),  # fmt: skip
        Shape("flat", "never learns: level 0.2 throughout", lambda t: np.full_like(t, 0.2), rising=True),
        Shape(
            "staircase", "jumps of 0.2 at 15, 35, 55 and 75%, from 0.1 to 0.9",
            lambda t: 0.1 + 0.2 * np.searchsorted([0.15, 0.35, 0.55, 0.75], t, side="right"), rising=True,
        ),  # fmt: skip
        Shape(
            "flat_signal", "flat at 0.2 with plentiful learning signal, then a take-off centred at 75% to 0.8",
            lambda t: 0.2 + 0.6 * _take_off(t, 0.75, 0.05), rising=True,
        ),  # fmt: skip
        Shape("flat_no_signal", f"flat at 0.2 with no learning signal from {NO_SIGNAL_FROM:.0%} on", lambda t: np.full_like(t, 0.2), rising=True),
    )
}


def _shape(name: str) -> Shape:
    try:
        return SHAPES[name]
    except KeyError:
        raise ValueError(f"unknown shape {name!r}; known: {', '.join(SHAPES)}") from None


def level(shape: str, progress: np.ndarray | float) -> np.ndarray:
    """The noiseless reward level of ``shape`` at ``progress`` (share of the planned steps).

    Parameters
    ----------
    shape : str
        A key of :data:`SHAPES`.
    progress : float or array
        ``step / total_steps``, in [0, 1].

    Returns
    -------
    ndarray
        The level, on the 0-1 reward scale, with the shape of ``progress``.

    Raises
    ------
    ValueError
        An unknown shape.

    Example
    -------
    >>> level("straight", [0.0, 0.5, 1.0]).round(2).tolist()
    [0.1, 0.5, 0.9]
    """
    t = np.asarray(progress, dtype=float)
    return np.asarray(_shape(shape).curve(t), dtype=float)


def learning_signal(shape: str, progress: np.ndarray | float) -> tuple[np.ndarray, np.ndarray]:
    """The noiseless ``(reward_std, frac_reward_zero_std)`` GRPO would log for ``shape`` at ``progress``.

    The share of groups whose completions disagree is :data:`IDLE_SHARE` plus the rise still
    ahead (the best level to come minus the level now) over :data:`FULL_SIGNAL_RISE`, capped
    at 1 (``flat_no_signal``: 0 from :data:`NO_SIGNAL_FROM` on); ``reward_std`` is that share
    times :data:`GROUP_SPREAD` and ``frac_reward_zero_std`` the rest.

    Example
    -------
    >>> std, zero = learning_signal("late_60", [0.3, 0.95])
    >>> bool(std[0] > 0.4 > 0.1 > std[1])
    True
    """
    t = np.atleast_1d(np.asarray(progress, dtype=float))
    grid = np.linspace(0.0, 1.0, 1001)
    best_ahead = np.maximum.accumulate(level(shape, grid)[::-1])[::-1]  # best level from each grid point to the end
    rise_ahead = np.interp(t, grid, best_ahead) - level(shape, t)
    share = np.clip(IDLE_SHARE + rise_ahead / FULL_SIGNAL_RISE, 0.0, 1.0)
    if shape == "flat_no_signal":
        share = np.where(t >= NO_SIGNAL_FROM, 0.0, IDLE_SHARE)
    return GROUP_SPREAD * share, 1.0 - share


def make_run(
    shape: str,
    total_steps: int = 250,
    noise: float = 0.05,
    seed: int = 0,
    *,
    reward_range: tuple[float, float] | None = None,
) -> RunLog:
    """A complete synthetic run of ``shape``: its level at steps 1..``total_steps`` plus Gaussian noise.

    Parameters
    ----------
    shape : str
        A key of :data:`SHAPES`.
    total_steps : int
        Planned (and logged) length; recorded as the run's ``total_steps``.
    noise : float
        Standard deviation of the per-step noise (0-1 reward scale); 0 logs the level itself.
    seed : int
        Seed of the noise. The stream is also keyed by the shape, length and noise, so
        runs of different cells never share noise.
    reward_range : (float, float), optional
        Declare this range on the run (as a user passing ``reward_range=`` would). The
        logged rewards are then clipped to it: a mean reward cannot leave the range the
        reward functions can give.

    Returns
    -------
    RunLog
        ``run_id`` ``"<shape>-T<total_steps>-noise<noise>-seed<seed>"``, with ``reward``,
        ``reward_std`` and ``frac_reward_zero_std`` per step (:func:`learning_signal`, with 10%
        multiplicative noise on ``reward_std`` and 0.03 on the share; an exact 0 stays 0);
        ``meta.extra`` holds ``shape``, ``noise`` and ``seed``.

    Raises
    ------
    ValueError
        An unknown shape, fewer than 3 steps, or a negative or non-finite noise.

    Example
    -------
    >>> run = make_run("late_40", total_steps=250, noise=0.03, seed=1)
    >>> len(run), run.total_steps
    (250, 250)
    """
    spec = _shape(shape)
    if int(total_steps) != total_steps or total_steps < 3:
        raise ValueError(f"total_steps must be a whole number of at least 3, got {total_steps!r}")
    if not (np.isfinite(noise) and noise >= 0):
        raise ValueError(f"noise must be a finite number >= 0, got {noise!r}")
    total = int(total_steps)
    steps = np.arange(1, total + 1)
    rng = np.random.default_rng([int(seed) % 2**32, zlib.crc32(spec.name.encode()), total, int(round(noise * 1e6))])
    rewards = level(spec.name, steps / total) + noise * rng.standard_normal(total)
    if spec.name == "flat_no_signal":  # nothing varies any more: the same completions, the same rewards
        rewards = np.where(steps / total >= NO_SIGNAL_FROM, level(spec.name, steps / total), rewards)
    if reward_range is not None:
        rewards = np.clip(rewards, *reward_range)
    spread, zero_share = learning_signal(spec.name, steps / total)
    spread = spread * np.clip(1.0 + 0.1 * rng.standard_normal(total), 0.0, None)
    zero_share = np.where(spread > 0, np.clip(zero_share + 0.03 * rng.standard_normal(total), 0.0, 1.0), 1.0)
    meta = RunMetadata(
        total_steps=total,
        reward_range=None if reward_range is None else (float(reward_range[0]), float(reward_range[1])),
        source=f"bayes_grpo.shapes: {spec.description}",
        extra={"shape": spec.name, "noise": float(noise), "seed": int(seed)},
    )
    table = pd.DataFrame({"step": steps, "reward": rewards, "reward_std": spread, "frac_reward_zero_std": zero_share})
    return RunLog(f"{spec.name}-T{total}-noise{noise:g}-seed{seed}", table, meta)


def in_dip(shape: str, step: float, total_steps: int) -> bool:
    """Whether ``step`` of a ``total_steps`` run of ``shape`` lies inside the shape's dip (False for shapes without one).

    Example
    -------
    >>> in_dip("dip", 125, 250), in_dip("dip", 175, 250), in_dip("straight", 125, 250)
    (True, False, False)
    """
    span = _shape(shape).dip
    return span is not None and span[0] <= step / total_steps <= span[1]


# ------------------------------------------------------------------ the suite

#: How a cell's runs declare their reward scale: none (learned from the log) or ``reward_range=(0, 1)``.
Setting = Literal["learned", "declared"]
SETTINGS: tuple[str, ...] = get_args(Setting)
#: Seeds per (shape, length, noise) in the full suite.
SEEDS = 3
#: Shapes whose log already shows where they are going at 30% and 50% observed, and the 90% coverage they need there.
SPEC_COVERED = ("straight", "concave", "early_plateau", "flat", "dip")
SPEC_COVERAGE, SPEC_COVERAGE_CUTS = 0.85, (0.3, 0.5)
#: Shapes still climbing at every cut, and the plateau weight no forecast of them may reach.
SPEC_NO_PLATEAU, SPEC_PLATEAU_MAX = ("straight",), 0.5
#: Shapes whose heads look like plateaus with a rise ahead: the weight given to that rise is reported.
SPEC_RISE_AHEAD = ("late_40", "late_60", "two_stage", "flat_signal")
#: The two flat heads told apart by their learning signal: at these cuts the one with plentiful signal must be
#: forecast with a q95 at least this far (0-1 scale) above the one without, and never be stopped; the one
#: without must be stopped at every cut from the stop rule's minimum fraction on.
SPEC_FLAT_PAIR, SPEC_FLAT_CUTS, SPEC_FLAT_Q95_GAP = ("flat_signal", "flat_no_signal"), (0.3, 0.5), 0.05


@dataclass(frozen=True)
class Cell:
    """One cell of the suite: a shape at one length, noise and seed, forecast at every cut.

    Attributes
    ----------
    shape, total_steps, noise, seed
        The run (:func:`make_run`).
    setting : {"learned", "declared"}
        No reward range declared, or ``reward_range=(0, 1)``.
    model : str, optional
        Path of a saved model (:meth:`~bayes_grpo.model.FittedModel.save`); None: the shipped model.
    cuts : tuple of float
        Observed shares of the planned steps.
    """

    shape: str
    total_steps: int
    noise: float
    seed: int
    setting: Setting = "learned"
    model: str | None = None
    cuts: tuple[float, ...] = CUTS

    @property
    def name(self) -> str:
        return f"{self.shape} T={self.total_steps} noise={self.noise:g} seed={self.seed} ({self.setting})"


def cells(
    shapes: Sequence[str] | None = None,
    lengths: Sequence[int] = LENGTHS,
    noises: Sequence[float] = NOISES,
    seeds: int = SEEDS,
    settings: Sequence[str] = ("learned",),
    model: str | None = None,
    cuts: Sequence[float] = CUTS,
) -> list[Cell]:
    """Every combination of shape, length, noise, seed and setting, longest runs first (they take longest).

    Parameters
    ----------
    shapes : sequence of str, optional
        Keys of :data:`SHAPES` (default: all).
    lengths, noises : sequences
        Planned lengths and noise levels.
    seeds : int
        Seeds ``0 .. seeds - 1`` per (shape, length, noise).
    settings : sequence of {"learned", "declared"}
        Reward scales (see :class:`Cell`).
    model : str, optional
        Path of the model file to forecast with (None: the shipped model).
    cuts : sequence of float
        Observed shares of the planned steps.

    Returns
    -------
    list of Cell

    Raises
    ------
    ValueError
        An unknown shape or setting.

    Example
    -------
    >>> len(cells())  # 12 shapes x 3 lengths x 2 noises x 3 seeds
    216
    """
    for name in shapes or ():
        _shape(name)
    for setting in settings:
        if setting not in SETTINGS:
            raise ValueError(f"unknown setting {setting!r}; known: {', '.join(SETTINGS)}")
    return [
        Cell(shape, int(length), float(noise), seed, setting, model, tuple(cuts))  # type: ignore[arg-type]
        for setting in settings
        for length in sorted(lengths, reverse=True)
        for shape in (shapes or SHAPES)
        for noise in noises
        for seed in range(seeds)
    ]


@functools.lru_cache(maxsize=4)
def _load(path: str | None) -> FittedModel:
    """The model of a cell, loaded once per process (the shipped one for None)."""
    from bayes_grpo.model import default_model, load_model

    return default_model() if path is None else load_model(path)


def score_cell(cell: Cell) -> list[dict[str, Any]]:
    """Forecast and stop-decide one cell's run at each of its cuts; one row per cut.

    Each row is :func:`evaluation.calibration.evaluate_run`'s (truth, quantiles,
    coverage, quantile score, regime weights ``p_take_off_ahead``, ``p_plateau``,
    ``p_decline``) plus the cell (``shape, total_steps, noise, seed, setting``),
    ``stop`` (``model.stop_decision(head).should_stop``, same seed, so the same
    forecast) and ``stop_in_dip`` (a stop at a step inside the shape's dip).

    Example
    -------
    >>> rows = score_cell(Cell("dip", 250, 0.03, 0))  # doctest: +SKIP
    >>> [(r["fraction"], r["stop"]) for r in rows]  # doctest: +SKIP
    """
    import warnings

    from bayes_grpo import measures
    from evaluation.calibration import evaluate_run, run_seed

    model = _load(cell.model)
    run = make_run(cell.shape, cell.total_steps, cell.noise, cell.seed, reward_range=(0.0, 1.0) if cell.setting == "declared" else None)
    seed = run_seed(cell.seed, run.run_id)
    rows = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for fraction in cell.cuts:
            row = evaluate_run(model, run, fraction, seed=seed)
            if row is None:
                continue
            head = measures.cut(run, fraction)
            stop = bool(model.stop_decision(head, total_steps=cell.total_steps, seed=seed).should_stop)
            rows.append({
                "shape": cell.shape, "total_steps": cell.total_steps, "noise": cell.noise, "seed": cell.seed, "setting": cell.setting,
                **{k: v for k, v in row.items() if k != "total_steps"},
                "stop": stop, "stop_in_dip": stop and in_dip(cell.shape, head.last_step, cell.total_steps),
            })  # fmt: skip
    return rows


def summarise(scores: pd.DataFrame, by: Sequence[str] = ("setting", "shape", "fraction")) -> pd.DataFrame:
    """Per group (default: setting, shape and cut): coverage, tails, quantile score, regime weights, stops.

    Parameters
    ----------
    scores : pandas.DataFrame
        Rows of :func:`score_cell`.
    by : sequence of str
        Grouping columns.

    Returns
    -------
    pandas.DataFrame
        ``forecasts, coverage_90, coverage_50, above_q95, below_q05, quantile_score,
        width_90_median, p_plateau, p_plateau_max, p_take_off_ahead, p_decline, stopped,
        stops_in_dip`` (``stopped``: share of the forecasts where the rule says stop; ``stops_in_dip``:
        how many of those stops lie inside a dip), groups sorted, shapes in the order of :data:`SHAPES`.
    """
    if "shape" in by:  # shapes in the order of SHAPES, not alphabetical
        scores = scores.assign(shape=pd.Categorical(scores["shape"], categories=list(SHAPES)))
    grouped = scores.groupby(list(by), observed=True)
    table = pd.DataFrame(
        {
            "forecasts": grouped.size(),
            "coverage_90": grouped["covered_90"].mean(),
            "coverage_50": grouped["covered_50"].mean(),
            "above_q95": grouped["above_q95"].mean(),
            "below_q05": grouped["below_q05"].mean(),
            "quantile_score": grouped["quantile_score"].mean(),
            "width_90_median": grouped["width_90"].median(),
            "p_plateau": grouped["p_plateau"].mean(),
            "p_plateau_max": grouped["p_plateau"].max(),
            "p_take_off_ahead": grouped["p_take_off_ahead"].mean(),
            "p_decline": grouped["p_decline"].mean(),
            "stopped": grouped["stop"].mean(),
            "stops_in_dip": grouped["stop_in_dip"].sum().astype(int),
        }
    ).reset_index()
    if "shape" in by:
        table["shape"] = table["shape"].astype(str)
    return table


def spec_checks(scores: pd.DataFrame) -> pd.DataFrame:
    """The behaviour spec judged on the rows of one setting: one row per check, with the figure and the verdict.

    Parameters
    ----------
    scores : pandas.DataFrame
        Rows of :func:`score_cell` for one setting.

    Returns
    -------
    pandas.DataFrame
        ``check, shape, fraction, forecasts, figure, target, verdict`` with ``verdict`` "met",
        "missed" or "reported" (a figure with no threshold: the weight of a rise still ahead).
    """
    summary = summarise(scores, by=("shape", "fraction")).set_index(["shape", "fraction"])
    rows = []

    def add(check: str, shape: str, fraction: float | None, forecasts: int, figure: float, target: str, ok: bool | None) -> None:
        verdict = "reported" if ok is None else ("met" if ok else "missed")
        rows.append({"check": check, "shape": shape, "fraction": fraction, "forecasts": forecasts, "figure": figure, "target": target, "verdict": verdict})

    for shape in SPEC_COVERED:
        for fraction in SPEC_COVERAGE_CUTS:
            if (shape, fraction) in summary.index:
                row = summary.loc[(shape, fraction)]
                add("90% coverage", shape, fraction, int(row["forecasts"]), float(row["coverage_90"]), f">= {SPEC_COVERAGE:g}", row["coverage_90"] >= SPEC_COVERAGE)
    for shape in SPEC_NO_PLATEAU:
        for (name, fraction), row in summary.iterrows():
            if name == shape:
                add("plateau weight, largest", shape, fraction, int(row["forecasts"]), float(row["p_plateau_max"]), f"< {SPEC_PLATEAU_MAX:g}", row["p_plateau_max"] < SPEC_PLATEAU_MAX)
    for shape in SPEC_RISE_AHEAD:
        for (name, fraction), row in summary.iterrows():
            if name == shape:
                add("weight of a rise ahead, mean", shape, fraction, int(row["forecasts"]), float(row["p_take_off_ahead"]), "reported", None)
    dip = scores[scores["shape"] == "dip"]
    if len(dip):
        add("stops inside the dip", "dip", None, len(dip), float(dip["stop_in_dip"].sum()), "0", not dip["stop_in_dip"].any())
    live, idle = SPEC_FLAT_PAIR
    for fraction in SPEC_FLAT_CUTS:
        if (live, fraction) in summary.index and (idle, fraction) in summary.index:
            at = scores[scores["fraction"] == fraction]
            gap = float(at.loc[at["shape"] == live, "q95"].mean() - at.loc[at["shape"] == idle, "q95"].mean())
            add("q95 above the flat head without signal", live, fraction, int((at["shape"] == live).sum()), gap, f">= {SPEC_FLAT_Q95_GAP:g}", gap >= SPEC_FLAT_Q95_GAP)
            row = summary.loc[(live, fraction)]
            add("stopped", live, fraction, int(row["forecasts"]), float(row["stopped"]), "0", row["stopped"] == 0)
    for (name, fraction), row in summary.iterrows():
        if name == idle and fraction >= MIN_STOP_FRACTION:
            add("stopped", idle, fraction, int(row["forecasts"]), float(row["stopped"]), "1", row["stopped"] == 1.0)
    return pd.DataFrame(rows)
