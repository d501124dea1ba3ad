"""The calibration layer: forecasts moved to where held-out real runs say they belong.

The model alone is miscalibrated on runs from sources it never saw (late take-offs land above its
95% quantile), and its point forecast is no better than persistence: the change it predicts after
the cut is about half realised. The layer corrects both by what source-grouped cross-validation
measured on real runs, and is applied by default (``calibrated=False`` in
:func:`bayes_grpo.forecast.forecast` shows the raw model).

**Form.** After the last logged step, every draw is first drawn towards the persistence level
``a`` (:func:`bayes_grpo.measures.persistence`: the mean of the last 10 logged rewards), keeping the share ``beta`` of
the change the model predicts; then the level-``p`` quantile moves by ``c(p)`` yardsticks, one below the
median and another above it::

    x'_s = a + beta * (x_s - a)
    Q'_s(p) = Q_s(p) + c(p) * W_s                         below the median
    Q'_s(p) = Q_s(p) + c(p) * g (R + v(p) U) h_s            above it
    W_s = (width90_s + R) * h_s,    h_s = (s - last logged step) / total_steps
    g = (1 - t)^2 + (1 - (1 - t)^2) pi,    t = last logged step / total_steps,    pi = the model's weight of a take-off ahead

* ``beta`` is a forecast combination with persistence: the share of the predicted change that
  minimises the held-out error of the median (source-capped). On the shared real runs it is about
  0.6, and with it the median's error is below persistence's at every cut, where the model's own
  median was not.
* ``W_s`` (below the median) is a yardstick of how far the forecast may be off there: the (drawn-in) forecast's own 90%
  width plus ``R``, the run's recent ``reward_std`` (the learning signal: how much the groups still
  disagree, so how open the future is: 0 for a run that has lost its learning signal; the logged rewards' 10-90%
  spread for a log without a positive recent ``reward_std``),
  times the share of the plan between the last logged step and ``s`` (0 at the last logged step, so
  the logged level is not moved; it grows with the horizon, and a run cut late is moved less).
* ``U`` (:func:`excursion`) widens the upper tail: how far the highest reward logged so far lies above
  ``a``, beyond the largest value logging noise alone gives in that many steps. A run whose batches have
  already reached well above its level has shown room it may climb into; the runs that took off after a
  cut had such excursions, and with ``U`` in their yardstick the 95% offset no longer has to be wide
  enough for them on every other run (it falls from about 4.7 to about 3 yardsticks). It is evidence of
  a take-off, not of where the bulk lands, so it enters from the 75% level on: ``v(p)`` (:func:`excursion_weight`)
  is 0 up to the 75% level and grows linearly to 1 at the 95% level (continuous, so no draw jumps past
  another). With ``U`` from the median on, the 50% interval at 50% of the plan held the truth in 0.61 of
  the held-out runs (target at most 0.60).
* **Above the median the yardstick is the room for a take-off, not the forecast's width** (form 3,
  :func:`upper_room`): the learning signal and the excursion, times the share of the plan ahead, times
  ``g``, how much of that room is still live. An unforeseen take-off grows rarer as the plan runs out:
  ``(1 - t)^2`` (:data:`TIME_LEFT_POWER`), ``t`` the share of the plan logged at the cut. A take-off the
  model itself sees ahead is not: with the model's weight ``pi`` of a take-off ahead
  (:attr:`bayes_grpo.forecast.Forecast.regimes`) the room stays whole. The model's own width above its
  median is already in ``Q(p)``. Held-out real runs need far less room above it late in a run than early
  on: learned per cut, the 95% offset of the earlier form was 8.1 yardsticks at 20% of the plan, 6.5 at
  30% and 1.0 at 50%. One set of offsets in that form covered the 20% cut and left the 50% cut's 95%
  quantile about two spreads above any truth (quantile score 1.19 times the raw model's there)
  (``docs/notes/2026-12-07-take-off-room.md``).
* ``c(p)`` at the 5% and 95% levels is the (source-capped) quantile, over held-out real forecasts, of
  ``(truth - Q(p))`` over the yardstick, :data:`TAIL_MARGIN` further out (the room sources the layer never
  saw take): the tails hold their share of the truths. At the 25% and 75% levels it is the offset that
  minimises the held-out quantile score (the same quantile with each row weighted by its yardstick, since a
  row's pinball loss is its yardstick times its miss), the 75% one raised where needed until the central
  50% interval holds half the truths (:data:`CENTRAL_HOLD`). Counted by row, the 75% offset was 1.5
  yardsticks and the 75% quantile's loss 0.26 spreads at 20% of the plan, against the raw model's 0.23;
  the score's own minimiser alone left the 50% interval holding 0.38 of the truths.
  The median's offset is 0: ``beta`` already placed it.
* **The 95% offset holds in every third of the learning signal** (:attr:`Recalibration.top_by_signal`): split the
  learning rows into thirds of ``log std_rel`` (:func:`std_rel`: recent ``reward_std`` over the logged spread), a third
  whose own 96% quantile of misses lies above the pooled one gets that offset. Pooled alone, the runs of the middle
  third (late take-offs of runs whose groups still disagreed a little) landed above q95 in 12% of held-out forecasts at
  30% of the plan, the other thirds in 0-4%; learned per third outright, each third's 75-odd rows gave offsets too noisy
  to hold 8% overall. Raising a third, never lowering it, keeps every tail at least as wide as the pooled one.

The layer calibrates what is scored and learned from: the mean logged reward over a window, logging
noise included (:meth:`Recalibration.apply_to_window`, which
:meth:`bayes_grpo.forecast.Forecast.window_reward` and so ``Forecast.final`` use). Learned on the
noise-free draws against logged truths, its offsets already held the truths' logging noise, and the
forecast added it again: the 50% interval at 50% of the plan held the truth 0.63 of the time. The
trajectory draws (fan charts) move the same way, each by the offset of its rank at the plan's end
(:meth:`Recalibration.apply`), so they stay whole. The layer is stored in the model file beside the
population posterior, with the id of the fit it was learned for (:attr:`Recalibration.fit_id`) and the
form of its yardstick (:data:`LAYER_FORM`).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np
from scipy.stats import norm

from bayes_grpo.errors import ModelError
from bayes_grpo.measures import persistence, step_noise, weighted_quantile
from bayes_grpo.prepare import PreparedRun, spread_scale

#: Levels at which the offsets are learned; between them they are interpolated linearly, beyond them held.
LEVELS: tuple[float, ...] = (0.05, 0.25, 0.5, 0.75, 0.95)
#: The 5% and 95% offsets are learned this much further out (at 4% and 96%): the room sources the layer never saw need.
TAIL_MARGIN = 0.01
#: Levels whose offsets are counted by row (a quantile of the misses: the tails' coverage targets); the others minimise the quantile score.
OUTER_LEVELS = (min(LEVELS), max(LEVELS))
#: The central 50% interval holds at least this share of the learning rows' truths (its nominal share; target on held-out runs 0.40-0.60).
CENTRAL_HOLD = 0.5
#: The yardstick's form the offsets were learned for: 3 = ``W`` below the median, ``g (R + v(p) U) h`` above it
#: (:func:`upper_room`; 2: ``W + v(p) U h`` at every level; 1: ``W`` alone).
LAYER_FORM = 3
#: Above the median the room for an unforeseen take-off shrinks as this power ``k`` of the share of the plan left at the cut.
TIME_LEFT_POWER = 2.0
#: The excursion enters the yardstick from this level (weight 0) to the top level of :data:`LEVELS` (weight 1).
EXCURSION_FROM = 0.75
#: Fewest learning rows of known ``std_rel`` in each third for the top offset to be learned per third (else pooled only).
MIN_ROWS_PER_THIRD = 20
#: Shares of the predicted change ``beta`` is chosen among.
BETA_GRID = tuple(np.round(np.linspace(0.0, 1.0, 51), 2))


def std_rel(prepared: PreparedRun) -> float:
    """Recent ``reward_std`` over the logged rewards' 10-90% spread (floored by their noise); NaN without ``reward_std``."""
    if not np.isfinite(prepared.recent_reward_std) or prepared.z.size == 0:
        return float("nan")
    return float(prepared.recent_reward_std / spread_scale(prepared.to_reward(prepared.z)))


def anchor(prepared: PreparedRun) -> float:
    """The persistence level of the logged rewards (:func:`bayes_grpo.measures.persistence`; NaN for an empty log)."""
    return persistence(prepared.to_reward(prepared.z)) if prepared.z.size else float("nan")


def signal_scale(prepared: PreparedRun) -> float:
    """``R``: the recent ``reward_std`` in reward units; 0 for a run that has lost its learning signal; otherwise, for a
    log without a positive recent ``reward_std``, the logged rewards' 10-90% spread (0 for an empty log).

    A run the no-signal test judges to have lost its learning signal (:attr:`PreparedRun.signal_exhausted`: a stretch of
    steps in which no group disagreed, longer than chance makes it at the logged group size) has no advantage for GRPO
    to learn from, so its future is no more open than the forecast's own width says. It used to get the logged spread,
    which gave a run that never learned a 95% quantile 18 spreads above its truth. A recent ``reward_std`` of 0 alone is
    not that: in a log of small groups ten quiet steps in a row come by chance (judged as such, a tiny-batch run stopped
    inside a fall it recovered from).
    """
    if prepared.signal_exhausted:
        return 0.0
    if np.isfinite(prepared.recent_reward_std) and prepared.recent_reward_std > 0:
        return float(prepared.recent_reward_std)
    return float(spread_scale(prepared.to_reward(prepared.z))) if prepared.z.size else 0.0


def excursion(prepared: PreparedRun) -> float:
    """``U``: how far the highest logged reward lies above the persistence level (:func:`anchor`), beyond what logging
    noise alone reaches in as many steps (0 when it does not; 0 for an empty log).

    The noise is :func:`bayes_grpo.measures.step_noise` (robust to the run's trend), and its reach over ``n`` steps is
    the typical largest of ``n`` standard normal draws, ``Phi^-1(1 - 1 / (n + 1))`` noise SDs. A run that has lost its learning signal
    (:attr:`PreparedRun.signal_exhausted`) has no room to climb into, whatever it logged before.
    """
    if prepared.z.size < 2 or prepared.signal_exhausted:
        return 0.0
    rewards = prepared.to_reward(prepared.z)
    reach = float(norm.ppf(1.0 - 1.0 / (rewards.size + 1)))
    return max(float(np.max(rewards)) - anchor(prepared) - reach * step_noise(rewards), 0.0)


def excursion_weight(level: Any) -> Any:
    """``v(p)``: the share of the excursion in the yardstick at quantile level ``p``: 0 up to :data:`EXCURSION_FROM`,
    rising linearly to 1 at the top level of :data:`LEVELS`, 1 beyond."""
    return np.clip((np.asarray(level, dtype=float) - EXCURSION_FROM) / (max(LEVELS) - EXCURSION_FROM), 0.0, 1.0)


def logged_share(prepared: PreparedRun) -> float:
    """``t``: the share of the plan logged, the last logged step over the planned steps (0 for an empty log)."""
    last = float(prepared.steps[-1]) if prepared.steps.size else 0.0
    return float(np.clip(last / max(prepared.total_steps, 1), 0.0, 1.0))


def ahead(prepared: PreparedRun, steps: np.ndarray) -> np.ndarray:
    """Share of the plan between the last logged step and each of ``steps`` (0 up to the last logged step)."""
    last = float(prepared.steps[-1]) if prepared.steps.size else 0.0
    return np.clip((np.asarray(steps, dtype=float) - last) / max(prepared.total_steps, 1), 0.0, 1.0)


def raw_column(level: float) -> str:
    """Column of held-out forecasts holding the level-``level`` quantile of the raw forecast's final-window reward
    (:meth:`bayes_grpo.forecast.Forecast.window_reward`, logging noise included: the quantity scored)."""
    return f"raw_q{round(100 * level):02d}"


def upper_room(logged: Any, take_off: Any, signal_scale: Any, excursion: Any, level: Any) -> Any:
    """The room for a take-off per unit share of the plan ahead, at quantile level(s) ``level`` above the median:
    ``g (R + v(p) U)`` with ``g = (1 - t)^k + (1 - (1 - t)^k) pi``, ``t`` the share of the plan logged, ``k``
    :data:`TIME_LEFT_POWER` and ``pi`` the raw forecast's weight of a take-off ahead: an unforeseen take-off grows
    rarer as the plan runs out, one the model sees ahead does not."""
    time_left = (1.0 - np.asarray(logged, dtype=float)) ** TIME_LEFT_POWER
    live = time_left + (1.0 - time_left) * np.asarray(take_off, dtype=float)
    return live * (signal_scale + excursion_weight(level) * excursion)


def yardstick(beta: float, ahead: Any, width_ahead: Any, signal_scale: Any, excursion: Any, logged: Any, take_off: Any, level: Any) -> Any:
    """The yardstick over a window at quantile level(s) ``level``: below the median ``W``, ``beta`` times the mean
    share of the plan ahead times the raw draws' 90% width (the drawn-in width) plus the mean share ahead ``h``
    times ``R``; above it ``h g (R + v(p) U)`` (:func:`upper_room`). :func:`window_terms` gives the terms."""
    level = np.asarray(level, dtype=float)
    below = beta * np.asarray(width_ahead, dtype=float) + np.asarray(ahead, dtype=float) * signal_scale
    above = np.asarray(ahead, dtype=float) * upper_room(logged, take_off, signal_scale, excursion, level)
    return np.where(level < 0.5, below, above)


def width_90(values: np.ndarray) -> np.ndarray:
    """Per step (column), the 90% width of the draws (rows): both quantiles from one partition of each column."""
    low, high = np.quantile(values, (0.05, 0.95), axis=0)
    return high - low


def window_terms(forecast: Any, steps: np.ndarray) -> dict[str, float]:
    """What :func:`learn` needs of one held-out raw forecast over its final-window ``steps``: the persistence level,
    the mean share of the plan ahead, the mean of that share times the draws' 90% width, ``R``, ``U``, ``t`` and the
    forecast's weight of a take-off ahead ``pi``."""
    steps = np.asarray(steps, dtype=float)
    values = forecast.at_steps(steps)
    width90 = width_90(values)
    share = ahead(forecast.prepared, steps)
    return {
        "anchor": anchor(forecast.prepared),
        "ahead": float(np.mean(share)),
        "width_ahead": float(np.mean(share * width90)),
        "signal_scale": signal_scale(forecast.prepared),
        "excursion": excursion(forecast.prepared),
        "logged": logged_share(forecast.prepared),
        "take_off": forecast.regimes["take_off_ahead"],
    }


@dataclass(frozen=True)
class Recalibration:
    """The share ``beta`` of the predicted change kept and the offsets ``c(p)``, learned for one fit (module docstring).

    Attributes
    ----------
    beta : float
        Share of the change after the cut the model predicts that the layer keeps (in [0, 1]).
    offsets : tuple of float
        ``c(p)`` at :data:`LEVELS`, in units of the yardstick ``W``.
    fit_id : str
        Id of the population fit the layer was learned for (:meth:`bayes_grpo.model.FittedModel.fit_id`).
    learned_on : dict
        What it was learned from (held-out forecasts, runs, sources, fractions).
    form : int
        The yardstick's form the offsets are in units of (:data:`LAYER_FORM`).
    signal_edges : tuple of float
        The two edges of ``log std_rel`` between its low, middle and high thirds in the learning rows (empty: no thirds).
    top_by_signal : tuple of float
        The 95% offset for each third (never below the pooled one); a run without ``reward_std`` keeps the pooled one.
    """

    beta: float
    offsets: tuple[float, ...]
    fit_id: str = ""
    learned_on: dict[str, Any] = field(default_factory=dict)
    form: int = LAYER_FORM
    signal_edges: tuple[float, ...] = ()
    top_by_signal: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        if not 0.0 <= float(self.beta) <= 1.0 or len(self.offsets) != len(LEVELS) or list(self.offsets) != sorted(self.offsets):
            raise ModelError(f"a calibration layer needs beta in [0, 1] and {len(LEVELS)} non-decreasing offsets, got {self.beta!r}, {self.offsets!r}")
        if self.offsets[LEVELS.index(0.5)] != 0.0:  # beta places the median; with offsets >= 0 where v(p) > 0 the order is kept
            raise ModelError(f"a calibration layer's offset at the median is 0 (beta places the median), got {self.offsets!r}")
        if self.form != LAYER_FORM:
            raise ModelError(f"the calibration layer was learned for the yardstick of another bayes_grpo (form {self.form!r}, this one applies {LAYER_FORM}); relearn it")
        thirds_ok = len(self.signal_edges) == 2 and len(self.top_by_signal) == 3 and self.signal_edges[0] <= self.signal_edges[1]
        if (self.signal_edges or self.top_by_signal) and not (thirds_ok and min(self.top_by_signal) >= self.offsets[-1]):
            raise ModelError(
                f"a calibration layer's thirds need 2 ordered edges and 3 top offsets at or above the pooled {self.offsets[-1]!r}, got {self.signal_edges!r}, {self.top_by_signal!r}"
            )

    def offsets_for(self, prepared: PreparedRun) -> tuple[float, ...]:
        """The offsets a run gets: the pooled ones, the top one that of its third of ``log std_rel`` (:func:`std_rel`)."""
        relative = std_rel(prepared)
        if not self.top_by_signal or not (np.isfinite(relative) and relative > 0):
            return self.offsets
        third = int(np.searchsorted(self.signal_edges, np.log(relative), side="left"))
        return (*self.offsets[:-1], self.top_by_signal[third])

    def apply(self, values: np.ndarray, prepared: PreparedRun, steps: np.ndarray, take_off: float) -> np.ndarray:
        """``values`` (draws x steps, reward units) drawn towards persistence by ``beta`` after the last logged step, then
        each draw moved by the offset of its rank at the plan's end.

        A whole trajectory moves by one offset times the yardstick at each step (at its rank ``p``: ``W`` below the
        median, ``h g (R + v(p) U)`` above it, ``take_off`` the raw forecast's weight of a take-off ahead in ``g``),
        so it stays smooth, and the end level's quantiles (and those of the final window, which follows it) move by
        ``c(p)`` yardsticks as learned.
        Ranking each step apart instead moved the 75% quantile of the final window 0.3 spreads further than
        learned: draws swap ranks between steps, and the steep offsets near the 95% level pulled them up.
        """
        values = np.asarray(values, dtype=float)
        n = values.shape[0]
        if n < 2 or prepared.z.size == 0:
            return values
        rank = _mid_ranks(values[:, -1])  # ranked before drawing in (the same order for beta > 0; defined for 0)
        offset = np.interp(rank, LEVELS, self.offsets_for(prepared))
        share = ahead(prepared, steps)
        level = anchor(prepared)
        values = np.where(share[None, :] > 0, level + self.beta * (values - level), values)
        signal = signal_scale(prepared)
        below = width_90(values)[None, :] + signal  # W / h, the same for every draw
        above = upper_room(logged_share(prepared), take_off, signal, excursion(prepared), rank)[:, None]  # g (R + v(p) U), per draw
        return values + offset[:, None] * share[None, :] * np.where(rank[:, None] < 0.5, below, above)

    def apply_to_window(self, samples: np.ndarray, raw: Any, steps: np.ndarray) -> np.ndarray:
        """Samples of the mean logged reward over ``steps`` from the raw forecast ``raw`` (logging noise included)
        moved as the layer learned them: drawn towards persistence by ``beta``, then each by the offset of its rank
        times the window's :func:`yardstick` at that rank, from the same :func:`window_terms` :func:`learn` read.

        This is the quantity :func:`learn` calibrates, so a window's reward is calibrated as held-out runs measured
        it. A window wholly at or before the last logged step is returned unchanged.
        """
        samples = np.asarray(samples, dtype=float)
        terms = window_terms(raw, steps)
        if samples.size < 2 or raw.prepared.z.size == 0 or terms["ahead"] <= 0:
            return samples
        level, rank = terms["anchor"], _mid_ranks(samples)
        width = yardstick(
            self.beta, terms["ahead"], terms["width_ahead"], terms["signal_scale"], terms["excursion"], terms["logged"], terms["take_off"], rank
        )
        return level + self.beta * (samples - level) + np.interp(rank, LEVELS, self.offsets_for(raw.prepared)) * width

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> "Recalibration":
        """The layer stored by :meth:`to_json`.

        Raises
        ------
        ModelError
            For a layer of another form (e.g. the per-signal-group offsets of model 4.0), which must be relearned.
        """
        data = json.loads(text)
        offsets = data.get("offsets")
        if "beta" not in data or not isinstance(offsets, list) or not all(isinstance(v, (int, float)) for v in offsets):
            raise ModelError("the calibration layer has the form of an earlier bayes_grpo (offsets per signal group, no beta); relearn it")
        return cls(
            beta=float(data["beta"]), offsets=tuple(float(v) for v in data["offsets"]), fit_id=data.get("fit_id", ""), learned_on=data.get("learned_on", {}),
            form=data.get("form", 1),  # a layer stored before forms were recorded has form 1 (no excursion)
            signal_edges=tuple(float(v) for v in data.get("signal_edges", ())), top_by_signal=tuple(float(v) for v in data.get("top_by_signal", ())),
        )


def _mid_ranks(values: np.ndarray) -> np.ndarray:
    """Each value's mid-rank ``p = (i + 0.5) / n`` among ``values`` (ties in order of appearance)."""
    ranks = np.empty(values.size)
    ranks[np.argsort(values, kind="stable")] = (np.arange(values.size) + 0.5) / values.size
    return ranks


def _widened_to_hold(lower_misses: np.ndarray, lower_offset: float, upper_misses: np.ndarray, upper_offset: float, weights: np.ndarray) -> float:
    """The 75% offset, raised where needed until the central 50% interval holds :data:`CENTRAL_HOLD` of the rows' weight.

    The inner offsets minimise the quantile score, which alone left the 50% interval holding 0.38 of the held-out
    truths at 20% of the plan (target 0.40-0.60): sharpness is optimised under calibration, not instead of it.
    """
    above_lower = lower_misses >= lower_offset  # the truth at or above the 25% quantile
    if not np.any(above_lower):
        return upper_offset
    share = CENTRAL_HOLD * weights.sum() / weights[above_lower].sum()
    needed = weighted_quantile(upper_misses[above_lower], min(share, 1.0), weights[above_lower])
    return float(max(upper_offset, needed)) if np.isfinite(needed) else upper_offset


def learned_level(level: float) -> float:
    """The quantile of held-out misses the offset at ``level`` is: :data:`TAIL_MARGIN` further out for the outer levels."""
    if level <= min(LEVELS):
        return level - TAIL_MARGIN
    if level >= max(LEVELS):
        return level + TAIL_MARGIN
    return level


#: Columns :func:`learn` reads from each held-out forecast (besides the raw quantiles).
LEARN_COLUMNS = ("truth", "spread", "anchor", "ahead", "width_ahead", "signal_scale", "excursion", "logged", "take_off")


def learn(rows: Any, fit_id: str = "", weights: Sequence[float] | None = None, learned_on: Mapping[str, Any] | None = None) -> Recalibration:
    """Learn ``beta`` and the offsets from held-out raw forecasts.

    Parameters
    ----------
    rows : pandas.DataFrame
        One held-out forecast per row: ``truth`` and ``spread`` (the run's measured final and 10-90% reward spread),
        the quantiles of the raw forecast's final-window reward (:func:`raw_column`, logging noise included) and
        :func:`window_terms` there (``anchor``, ``ahead``, ``width_ahead``, ``signal_scale``, ``excursion``, ``logged``, ``take_off``);
        optionally ``std_rel`` (:func:`std_rel`, NaN without ``reward_std``), for the top offset per third of it.
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
        With missing columns or no usable rows.
    """
    missing = [c for c in (*LEARN_COLUMNS, *map(raw_column, LEVELS)) if c not in rows]
    if missing:
        raise ModelError(f"the calibration layer is learned from held-out forecasts with {', '.join(missing)} (evaluation.calibration rows)")
    frame = rows.reset_index(drop=True)
    w = np.ones(len(frame)) if weights is None else np.asarray(weights, dtype=float)
    terms = frame[list(LEARN_COLUMNS)].to_numpy(float)
    usable = np.isfinite(terms).all(axis=1) & (frame["spread"].to_numpy() > 0) & (frame["ahead"].to_numpy() > 0)
    if not usable.any():
        raise ModelError("the calibration layer needs held-out forecasts with a truth, a positive spread and steps ahead")
    frame, w = frame[usable].reset_index(drop=True), w[usable]
    truth, level, spread = (frame[c].to_numpy(float) for c in ("truth", "anchor", "spread"))
    raw = {p: frame[raw_column(p)].to_numpy(float) for p in LEVELS}
    errors = [np.average(np.abs(level + b * (raw[0.5] - level) - truth) / spread, weights=w) for b in BETA_GRID]
    beta = float(BETA_GRID[int(np.argmin(errors))])
    terms = [frame[c].to_numpy(float) for c in ("ahead", "width_ahead", "signal_scale", "excursion", "logged", "take_off")]
    drawn_in = {p: level + beta * (raw[p] - level) for p in LEVELS}

    def misses(p: float) -> tuple[np.ndarray, np.ndarray]:
        """Each usable row's miss at level ``p`` in yardsticks, and its yardstick in spreads."""
        scale = yardstick(beta, *terms, p)
        known = scale > 0
        return np.where(known, (truth - drawn_in[p]) / np.where(known, scale, 1.0), np.nan), np.where(known, scale / spread, 0.0)

    missed = {p: misses(p) for p in LEVELS if p != 0.5}

    def offset(p: float) -> float:
        miss, scale = missed[p]
        if p in OUTER_LEVELS:  # the tails hold their share of the truths: a quantile of the misses, counted by row
            return float(weighted_quantile(miss, learned_level(p), w))
        return float(weighted_quantile(miss, p, w * scale))  # the quantile score's minimiser (each row's loss is yardstick x miss)

    offsets = [0.0 if p == 0.5 else offset(p) for p in LEVELS]
    middle = LEVELS.index(0.5)  # offsets made monotone away from the median's 0, so quantiles keep their order
    offsets = [*np.minimum.accumulate(offsets[middle::-1])[::-1], *np.maximum.accumulate(offsets[middle:])[1:]]
    inner = LEVELS.index(0.25), LEVELS.index(0.75)
    offsets[inner[1]] = _widened_to_hold(missed[0.25][0], offsets[inner[0]], missed[0.75][0], offsets[inner[1]], w)
    record = {"rows": int(usable.sum()), "median_error_by_beta": {str(b): round(float(e), 4) for b, e in zip(BETA_GRID[::5], errors[::5])}}
    ordered = tuple(float(v) for v in np.maximum.accumulate(offsets))
    thirds = _top_by_signal(frame, missed[max(LEVELS)][0], w, ordered[-1]) if "std_rel" in frame else None
    edges, tops = thirds if thirds is not None else ((), ())
    return Recalibration(
        beta=beta, offsets=ordered, fit_id=fit_id, learned_on={**record, **(learned_on or {})}, signal_edges=edges, top_by_signal=tops
    )


def _top_by_signal(frame: Any, top_misses: np.ndarray, weights: np.ndarray, pooled: float) -> tuple[tuple[float, ...], tuple[float, ...]] | None:
    """The edges of ``log std_rel`` between its thirds in the rows (weighted) and each third's top offset, the larger
    of ``pooled`` and its own quantile of the misses at the top level (as :func:`learn` counts the tails); None with
    fewer than :data:`MIN_ROWS_PER_THIRD` rows of known ``std_rel`` in some third."""
    relative = frame["std_rel"].to_numpy(float)
    known = np.isfinite(relative) & (relative > 0) & np.isfinite(top_misses)
    if known.sum() < 3 * MIN_ROWS_PER_THIRD:
        return None
    log_rel = np.log(np.where(known, relative, 1.0))
    edges = tuple(float(weighted_quantile(log_rel[known], q, weights[known])) for q in (1 / 3, 2 / 3))
    third = np.searchsorted(edges, log_rel, side="left")
    tops = []
    for index in range(3):
        rows = known & (third == index)
        if rows.sum() < MIN_ROWS_PER_THIRD:
            return None
        own = float(weighted_quantile(top_misses[rows], learned_level(max(LEVELS)), weights[rows]))
        tops.append(max(pooled, own))
    return edges, tuple(tops)
