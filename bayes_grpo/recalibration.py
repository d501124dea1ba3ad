"""The calibration layer: forecast quantiles moved to where held-out real runs say they belong.

The model alone can be miscalibrated on runs from sources it never saw (late take-offs land
above its 95% quantile). The layer corrects its quantiles by what source-grouped
cross-validation measured on real runs, and is applied by default (``calibrated=False`` in
:func:`bayes_grpo.forecast.forecast` shows the raw model).

**Form.** At a forecast step ``s`` the level-``p`` quantile ``Q_s(p)`` becomes::

    Q'_s(p) = Q_s(p) + c_g(p) * W_s,    W_s = width90_s * (s - last logged step) / total_steps

* ``W_s`` is a yardstick of how far the forecast may be off there: its own 90% width at that step,
  times the share of the plan between the last logged step and ``s`` (0 at the last logged step, so
  the logged level is not moved; it grows with the horizon, and a run cut late is moved less);
* ``c_g(p)`` is learned per level and per group ``g`` of runs: the runs whose learning signal
  ``std_rel`` (recent ``reward_std`` over the logged rewards' 10-90% spread, :func:`std_rel`) is
  below or above the median, and runs that log no ``reward_std`` (:func:`signal_group`). It is the
  (source-capped) quantile, over held-out real forecasts, of ``(truth - Q(p)) / W``: at level ``p``
  for the inner levels, and :data:`TAIL_MARGIN` further out for the 5% and 95% quantiles. The margin
  is what sources the layer never saw take: without it the 90% intervals of runs held out by source
  covered 0.87 / 0.85 / 0.90 at 20 / 30 / 50% of the plan, with it 0.90 / 0.89 / 0.94.
  Among constant offsets the inner ones have the least pinball loss, so the layer trades no more
  sharpness than calibration needs.

Each draw moves by the offset of its rank at the plan's end (:meth:`Recalibration.apply`), so
trajectories stay whole. The layer is stored in the model file beside the
population posterior, with the id of the fit it was learned for (:attr:`Recalibration.fit_id`).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np

from bayes_grpo.errors import ModelError
from bayes_grpo.measures import weighted_quantile
from bayes_grpo.prepare import PreparedRun, spread_scale

#: Levels at which the offsets are learned; between them they are interpolated linearly, beyond them held.
LEVELS: tuple[float, ...] = (0.05, 0.25, 0.5, 0.75, 0.95)
#: Groups of runs with their own offsets: ``std_rel`` below and above its median, and runs without ``reward_std``.
GROUPS: tuple[str, ...] = ("low", "high", "unknown")
#: The 5% and 95% offsets are learned this much further out (at 3% and 97%): the room sources the layer never saw need.
TAIL_MARGIN = 0.02


def std_rel(prepared: PreparedRun) -> float:
    """Recent ``reward_std`` over the logged rewards' 10-90% spread (floored by their noise); NaN without ``reward_std``."""
    if not np.isfinite(prepared.recent_reward_std) or prepared.z.size == 0:
        return float("nan")
    return float(prepared.recent_reward_std / spread_scale(prepared.to_reward(prepared.z)))


def yardstick(width90: np.ndarray, prepared: PreparedRun, steps: np.ndarray) -> np.ndarray:
    """``W_s`` at forecast ``steps`` (module docstring) from the forecast's 90% widths there."""
    last = float(prepared.steps[-1]) if prepared.steps.size else 0.0
    ahead = np.clip((np.asarray(steps, dtype=float) - last) / max(prepared.total_steps, 1), 0.0, 1.0)
    return ahead * np.asarray(width90, dtype=float)


def latent_column(level: float) -> str:
    """Column of held-out forecasts holding the level-``level`` quantile of the draws' mean over the final window."""
    return f"latent_q{round(100 * level):02d}"


def window_yardstick(forecast: Any, steps: np.ndarray) -> float:
    """Mean yardstick over a forecast's ``steps`` (e.g. a final window): what a layer's offsets multiply there."""
    values = forecast.at_steps(np.asarray(steps, dtype=float))
    width90 = np.quantile(values, 0.95, axis=0) - np.quantile(values, 0.05, axis=0)
    return float(np.mean(yardstick(width90, forecast.prepared, steps)))


@dataclass(frozen=True)
class Recalibration:
    """Offsets ``c_g(p)`` per group and level, learned for one fit (see the module docstring).

    Attributes
    ----------
    edges : tuple of float
        ``log std_rel`` between the groups (one edge: the median).
    offsets : dict
        ``group -> offsets at LEVELS`` (in units of the yardstick ``W``).
    fit_id : str
        Id of the population fit the layer was learned for (:meth:`bayes_grpo.model.FittedModel.fit_id`).
    learned_on : dict
        What it was learned from (held-out forecasts, runs and sources per group, folds, fractions).
    """

    edges: tuple[float, ...]
    offsets: dict[str, tuple[float, ...]]
    fit_id: str = ""
    learned_on: dict[str, Any] = field(default_factory=dict)

    def group(self, prepared: PreparedRun) -> str:
        """The group whose offsets a run gets."""
        return signal_group(std_rel(prepared), self.edges)

    def apply(self, values: np.ndarray, prepared: PreparedRun, steps: np.ndarray) -> np.ndarray:
        """``values`` (draws x steps, reward units) with each draw moved by the offset of its rank at the plan's end.

        A whole trajectory moves by one offset times the yardstick at each step, so it stays smooth, and the end
        level's quantiles (and those of the final window, which follows it) move by ``c_g(p) * W`` as learned.
        Ranking each step apart instead moved the 75% quantile of the final window 0.3 spreads further than
        learned: draws swap ranks between steps, and the steep offsets near the 95% level pulled them up.
        """
        values = np.asarray(values, dtype=float)
        n = values.shape[0]
        if n < 2:
            return values
        ranks = np.empty(n)
        ranks[np.argsort(values[:, -1], kind="stable")] = (np.arange(n) + 0.5) / n
        offset = np.interp(ranks, LEVELS, self.offsets[self.group(prepared)])
        width90 = np.quantile(values, 0.95, axis=0) - np.quantile(values, 0.05, axis=0)
        return values + offset[:, None] * yardstick(width90, prepared, steps)[None, :]

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> "Recalibration":
        data = json.loads(text)
        return cls(
            edges=tuple(data["edges"]),
            offsets={g: tuple(v) for g, v in data["offsets"].items()},
            fit_id=data.get("fit_id", ""),
            learned_on=data.get("learned_on", {}),
        )


def signal_group(value: float, edges: Sequence[float]) -> str:
    """``"unknown"`` for NaN ``std_rel``, else its group by ``log std_rel`` against ``edges``."""
    if not np.isfinite(value) or value <= 0:
        return "unknown"
    log_value = np.log(value)
    return GROUPS[int(np.searchsorted(np.asarray(edges), log_value, side="right"))]


def learned_level(level: float) -> float:
    """The quantile of held-out misses the offset at ``level`` is: :data:`TAIL_MARGIN` further out for the outer levels."""
    if level <= min(LEVELS):
        return level - TAIL_MARGIN
    if level >= max(LEVELS):
        return level + TAIL_MARGIN
    return level


#: Fewest held-out forecasts a group needs for offsets of its own; a smaller group takes those of all runs.
MIN_GROUP_ROWS = 20


def learn(rows: Any, fit_id: str = "", weights: Sequence[float] | None = None, learned_on: Mapping[str, Any] | None = None) -> Recalibration:
    """Learn the offsets from held-out forecasts.

    Parameters
    ----------
    rows : pandas.DataFrame
        One held-out forecast per row, with ``truth``, the quantiles of the forecast draws' mean over the final
        window (:func:`latent_column`: what :meth:`Recalibration.apply` moves; logging noise is added after), its
        yardstick ``yardstick`` there and ``std_rel`` (NaN without ``reward_std``).
    fit_id : str
        Id of the fit the layer is for.
    weights : sequence of float, optional
        Row weights (e.g. source-capped: each source counting as at most 3 runs); equal by default.
    learned_on : mapping, optional
        Provenance to record.

    Returns
    -------
    Recalibration

    Raises
    ------
    ModelError
        With no usable rows.
    """
    frame = rows.reset_index(drop=True)
    w = np.ones(len(frame)) if weights is None else np.asarray(weights, dtype=float)
    usable = np.isfinite(frame["truth"].to_numpy()) & (frame["yardstick"].to_numpy() > 0)
    if not usable.any():
        raise ModelError("the calibration layer needs held-out forecasts with a truth and a positive yardstick")
    frame, w = frame[usable].reset_index(drop=True), w[usable]
    log_rel = np.log(frame["std_rel"].where(frame["std_rel"] > 0))
    known = np.isfinite(log_rel.to_numpy())
    edges = (float(weighted_quantile(log_rel[known], 0.5, w[known])),) if known.sum() >= 3 else (0.0,)
    groups = np.array([signal_group(v, edges) for v in frame["std_rel"]])

    def offsets(mask: np.ndarray) -> tuple[float, ...]:
        return tuple(
            float(weighted_quantile((frame["truth"] - frame[latent_column(p)])[mask] / frame["yardstick"][mask], learned_level(p), w[mask]))
            for p in LEVELS
        )

    pooled = offsets(np.ones(len(frame), bool))
    table = {g: offsets(groups == g) if (groups == g).sum() >= MIN_GROUP_ROWS else pooled for g in GROUPS}
    counts = {g: int((groups == g).sum()) for g in GROUPS}
    return Recalibration(edges=edges, offsets=table, fit_id=fit_id, learned_on={"rows_per_group": counts, **(learned_on or {})})
