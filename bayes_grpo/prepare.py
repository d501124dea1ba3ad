"""Turn a validated :class:`~bayes_grpo.logs.RunLog` into model inputs.

The model works on *normalised progress* ``t = step / total_steps`` and on a
*normalised reward* ``z = (reward - loc) / unit``:

* when the run declares its reward range ``(lo, hi)``: ``loc = lo`` and
  ``unit = hi - lo`` ("range" scale: z is the fraction of the attainable range);
* otherwise the normalisation is learned from the run's own logged steps:
  ``loc`` is the median of the first few rewards and ``unit`` the 10-90% spread
  of the rewards so far, floored by twice the per-step noise ("learned" scale).
  A training run is normalised on all its steps, a run in progress on the steps
  it has: the unit is then smaller early on, which measured better than a unit
  fixed to the first quarter of the run (it keeps forecasts of runs that have
  barely moved close to their current level).

Both are computed only from the steps a run has logged so far, so a run in
progress is normalised exactly as it will be at forecast time.

GRPO's learning signal
----------------------
GRPO normalises each completion's reward within its group, so a group whose
completions all score the same gives no gradient: the spread of the completions'
rewards (``reward_std``, logged by TRL and Unsloth at every step) is the raw
material of learning. :func:`learning_signal` reads it as a covariate of the run's
future: the mean ``reward_std`` over the last :data:`SIGNAL_POINTS` logged steps up to
:data:`SIGNAL_PROGRESS` of the plan, relative to the learned unit of the rewards up to
there, on a log scale. It is a yardstick of how far the mean reward can still move
against how far it has moved: a run whose completions still disagree a lot while its
mean has barely moved has most of its rise ahead (on the 92 shared runs it correlates
0.4-0.5 with what the reward-only model missed after the cut, and about 0 with the
head's noise-to-spread ratio). Being read at a fixed share of the plan, it means the
same thing in the fit (whole runs) as at forecast time (any cut from that share on).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from bayes_grpo.errors import ModelError
from bayes_grpo.logs import RunLog
from bayes_grpo.measures import reward_spread

SCALE_KINDS: tuple[str, ...] = ("range", "learned")
#: The learning signal is read up to this share of the plan (or the steps logged, when fewer) ...
SIGNAL_PROGRESS = 0.2
#: ... over this many logged steps before that point.
SIGNAL_POINTS = 10
#: Log relative spread that the covariate is centred on and its unit (about the median and SD
#: over the bundled and the shared runs), and the range it is clipped to, in those units.
SIGNAL_CENTRE, SIGNAL_SCALE, SIGNAL_CLIP = -0.3, 1.0, 3.0
#: A run's latest completions carry no learning signal when, at every one of its last
#: :data:`SIGNAL_POINTS` logged steps, ``reward_std`` is at most this share of its reward unit or the
#: share of groups with no spread (``frac_reward_zero_std``) is at least :data:`NO_SIGNAL_ZERO_SHARE`,
#: and the logged reward did not move over those steps (:func:`no_learning_signal`).
NO_SIGNAL_SPREAD = 1e-3
NO_SIGNAL_ZERO_SHARE = 0.99
# Initial reward (fraction of the range) that the population effects are centred on.
INITIAL_REWARD_CENTRE = 0.3


@dataclass(frozen=True)
class PreparedRun:
    """A run as the model sees it: covariates, normalisation and observed (t, z)."""

    run_id: str
    family: str | None
    source: str | None  # repository / recipe / task the run comes from (``source_repo``); None when unknown
    log10_size: float  # log10(params in billions); NaN when the size is unknown
    kind: str
    initial_cov: float
    loc: float
    unit: float
    total_steps: int
    steps: np.ndarray
    t: np.ndarray
    z: np.ndarray
    initial_z: float | None
    #: Standardised learning signal (:func:`learning_signal`); NaN when the log has no ``reward_std``.
    signal: float = float("nan")
    #: Mean ``reward_std`` and ``frac_reward_zero_std`` over the last logged steps (reward units; NaN when not logged).
    recent_reward_std: float = float("nan")
    recent_zero_share: float = float("nan")
    #: The latest steps gave GRPO no learning signal (:func:`no_learning_signal`).
    signal_exhausted: bool = False

    @property
    def has_signal(self) -> bool:
        """Whether the log carries ``reward_std`` early enough to read the learning signal."""
        return bool(np.isfinite(self.signal))

    @property
    def kind_index(self) -> int:
        return SCALE_KINDS.index(self.kind)

    @property
    def declares_start(self) -> bool:
        """Whether the run declares its initial reward (its start then has a fixed prior spread)."""
        return self.initial_z is not None

    def to_reward(self, z: np.ndarray) -> np.ndarray:
        """Map normalised rewards back to the run's own reward scale."""
        return self.loc + self.unit * np.asarray(z)


#: Smallest noise unit, relative to the rewards' magnitude (and absolute, for all-zero rewards): a
#: guard against dividing by zero, far below any real noise, so forecasts stay equivariant under
#: a change of reward units or offset (``a * reward + b`` is forecast as ``a * forecast + b``).
NOISE_GUARD_RELATIVE = 1e-9
NOISE_GUARD_ABSOLUTE = 1e-12


def noise_scale(rewards: np.ndarray) -> float:
    """Robust per-step noise of a reward series (MAD of first differences / sqrt 2).

    Discrete rewards can give a zero MAD, so a quarter of the plain standard
    deviation is used as a floor; only rewards that never varied fall through to
    the numerical guard (:data:`NOISE_GUARD_RELATIVE`), which is relative to the rewards'
    magnitude: nothing here has an absolute size, so a log in other units or with an offset
    gets the same forecast in those units (an absolute floor of ``1e-3 * max(1, |mean reward|)``
    made a log in units of 1e-4 forecast 40 times too wide).
    """
    y = np.asarray(rewards, dtype=float)
    if y.size < 3:
        return max(float(np.abs(y).mean()) * 0.1 if y.size else 0.0, 1e-3)
    diffs = np.diff(y)
    mad = 1.4826 * float(np.median(np.abs(diffs - np.median(diffs)))) / np.sqrt(2.0)
    floor = 0.25 * float(np.std(y))
    return max(mad, floor, NOISE_GUARD_RELATIVE * float(np.abs(y).max()), NOISE_GUARD_ABSOLUTE)


def early_level(values: np.ndarray) -> float:
    """Median of a series' first rewards (its first fifth, 3 to 10 points): where the run started."""
    values = np.asarray(values, dtype=float)
    return float(np.median(values[: max(3, min(10, values.size // 5))]))


def start_level(p: PreparedRun) -> float:
    """Prior centre of a run's initial normalised reward: its declared initial reward, else its first logged rewards.

    On the learned scale ``loc`` already is that early level, hence 0.
    """
    if p.declares_start:
        return p.initial_z
    if p.kind == "learned" or p.z.size == 0:
        return 0.0
    return early_level(p.z)


def spread_scale(rewards: np.ndarray) -> float:
    """Learned reward unit of a run without a declared range: its 10-90% reward spread so far
    (:func:`bayes_grpo.measures.reward_spread`).

    Floored at twice the per-step noise so that a run that has not moved yet
    gets a unit set by its noise. Unlike the noise alone, this unit grows with
    the rise a run has shown, so the population's "gain in units" stays on a
    comparable footing for runs whose noise changes as the reward climbs.
    """
    y = np.asarray(rewards, dtype=float)
    if y.size == 0:
        return 1e-3
    return max(reward_spread(y), 2.0 * noise_scale(y))


def learning_signal(steps: np.ndarray, rewards: np.ndarray, reward_std: np.ndarray | None, total_steps: int) -> float:
    """Standardised log relative spread of the completions' rewards early in the run (module docstring).

    ``log(mean reward_std / learned unit)`` over the logged steps up to :data:`SIGNAL_PROGRESS` of
    ``total_steps`` (the last :data:`SIGNAL_POINTS` of them with a finite ``reward_std``; the unit is
    :func:`spread_scale` of the rewards up to there), centred and scaled by :data:`SIGNAL_CENTRE` and
    :data:`SIGNAL_SCALE` and clipped to +-:data:`SIGNAL_CLIP`. NaN when fewer than 3 such steps log a
    ``reward_std``. A spread of exactly 0 (no group could learn) gives the lower clip.
    """
    if reward_std is None:
        return float("nan")
    steps, rewards, reward_std = (np.asarray(a, dtype=float) for a in (steps, rewards, reward_std))
    early = steps <= max(SIGNAL_PROGRESS * total_steps, steps[0] if steps.size else 0.0)
    spreads = reward_std[early]
    spreads = spreads[np.isfinite(spreads)][-SIGNAL_POINTS:]
    if spreads.size < 3:
        return float("nan")
    relative = max(float(np.mean(np.abs(spreads))), 1e-12) / spread_scale(rewards[early])
    return float(np.clip((np.log(relative) - SIGNAL_CENTRE) / SIGNAL_SCALE, -SIGNAL_CLIP, SIGNAL_CLIP))


def no_learning_signal(rewards: np.ndarray, reward_std: np.ndarray | None, zero_share: np.ndarray | None, unit: float) -> bool:
    """Whether GRPO had no learning signal over the last :data:`SIGNAL_POINTS` logged steps, and nothing moved.

    Every one of those steps logged no spread within its groups (``reward_std`` at most
    :data:`NO_SIGNAL_SPREAD` of ``unit``, or ``frac_reward_zero_std`` at least
    :data:`NO_SIGNAL_ZERO_SHARE`), and the logged reward was the same at all of them. The second
    condition matters for logs of one small group a step: there a step without spread is common
    by chance (a group of 2 completions of a prompt solved 30% of the time agrees 58% of the
    time), the reward then jumps between steps, and later groups do disagree again (on the
    shared runs two such runs recovered after 10 such steps).
    """
    rewards = np.asarray(rewards, dtype=float)[-SIGNAL_POINTS:]
    if rewards.size < SIGNAL_POINTS or np.ptp(rewards) > 0:
        return False
    quiet = np.zeros(rewards.size, bool)
    if reward_std is not None:
        quiet |= np.asarray(reward_std, dtype=float)[-SIGNAL_POINTS:] <= NO_SIGNAL_SPREAD * unit
    if zero_share is not None:
        quiet |= np.asarray(zero_share, dtype=float)[-SIGNAL_POINTS:] >= NO_SIGNAL_ZERO_SHARE
    return bool(quiet.all())


def _recent_mean(values: np.ndarray | None) -> float:
    """Mean of the last :data:`SIGNAL_POINTS` finite values of a logged signal; NaN when there are none."""
    if values is None:
        return float("nan")
    values = np.asarray(values, dtype=float)
    values = values[np.isfinite(values)][-SIGNAL_POINTS:]
    return float(np.mean(values)) if values.size else float("nan")


def prepare_run(
    run: RunLog | None = None,
    *,
    total_steps: int | None = None,
    family: str | None = None,
    params_b: float | None = None,
    initial_reward: float | None = None,
    reward_range: tuple[float, float] | None = None,
    source: str | None = None,
    require_total: bool = True,
) -> PreparedRun:
    """Normalise a run (or describe a run not yet started when ``run`` is None).

    Keyword arguments override the run's metadata (``source`` its ``source_repo``). ``total_steps`` falls back to
    the run's planned steps, then (only when ``require_total`` is False, as for
    finished training runs) to its last logged step.
    """
    meta = run.meta if run is not None else None
    family = family if family is not None else (meta.family if meta else None)
    params_b = params_b if params_b is not None else (meta.params_b if meta else None)
    initial_reward = initial_reward if initial_reward is not None else (meta.initial_reward if meta else None)
    reward_range = reward_range if reward_range is not None else (meta.reward_range if meta else None)
    source = source if source is not None else (meta.extra.get("source_repo") if meta else None)
    total = total_steps if total_steps is not None else (meta.total_steps if meta else None)
    run_id = run.run_id if run is not None else "new-run"

    steps = np.asarray(run.steps, dtype=float) if run is not None else np.empty(0)
    rewards = np.asarray(run.rewards, dtype=float) if run is not None else np.empty(0)
    if total is None:
        if require_total or steps.size == 0:
            raise ModelError(
                f"run {run_id!r}: total_steps is unknown; pass total_steps= (the planned number of training steps)"
            )
        total = int(steps.max())
    total = int(total)
    if total <= 0:
        raise ModelError(f"run {run_id!r}: total_steps must be positive, got {total}")
    if steps.size and steps.max() > total:
        raise ModelError(
            f"run {run_id!r}: total_steps={total} is smaller than the last logged step {int(steps.max())}; "
            "pass the planned number of steps"
        )

    if reward_range is not None:
        lo, hi = (float(v) for v in reward_range)
        if not hi > lo:
            raise ModelError(f"run {run_id!r}: reward_range must be (min, max) with max > min, got {reward_range}")
        kind, loc, unit = "range", lo, hi - lo
    else:
        if rewards.size == 0:
            raise ModelError(
                f"run {run_id!r}: a run with no logged steps needs reward_range=(min, max) to put the forecast on a reward scale"
            )
        kind = "learned"
        loc, unit = early_level(rewards), spread_scale(rewards)

    initial_z = None if initial_reward is None else (float(initial_reward) - loc) / unit
    if kind == "range":
        start = initial_z if initial_z is not None else ((early_level(rewards) - loc) / unit if rewards.size else None)
        initial_cov = 0.0 if start is None else float(np.clip(start, 0.0, 1.0)) - INITIAL_REWARD_CENTRE
    else:
        initial_cov = 0.0
    log10_size = float(np.log10(params_b)) if params_b and params_b > 0 else float("nan")
    reward_std = run.signal("reward_std") if run is not None else None  # NaN where not logged
    zero_share = run.signal("frac_reward_zero_std") if run is not None else None
    return PreparedRun(
        run_id=run_id,
        family=family.lower() if isinstance(family, str) else None,
        source=str(source) if source else None,
        log10_size=log10_size,
        kind=kind,
        initial_cov=initial_cov,
        loc=loc,
        unit=unit,
        total_steps=total,
        steps=steps,
        t=steps / total,
        z=(rewards - loc) / unit,
        initial_z=initial_z,
        signal=learning_signal(steps, rewards, reward_std, total) if steps.size else float("nan"),
        recent_reward_std=_recent_mean(reward_std),
        recent_zero_share=_recent_mean(zero_share),
        signal_exhausted=no_learning_signal(rewards, reward_std, zero_share, unit),
    )


def size_centres(prepared: list[PreparedRun]) -> list[float]:
    """Mean log10 size of the runs of each scale kind (0 where a kind has no sized run).

    The size effect is entered centred within each kind so that it is not
    confounded with the kind's mean gain (the bundled runs are tiny models on a
    declared range, real runs are 0.5B-70B models on learned scales).
    """
    centres = []
    for kind in SCALE_KINDS:
        sizes = [p.log10_size for p in prepared if p.kind == kind and np.isfinite(p.log10_size)]
        centres.append(float(np.mean(sizes)) if sizes else 0.0)
    return centres


def centred_size(p: PreparedRun, centres: list[float]) -> float:
    """The run's log10 size minus its kind's centre; 0 (the centre) when the size is unknown."""
    return p.log10_size - centres[p.kind_index] if np.isfinite(p.log10_size) else 0.0


def bin_observations(t: np.ndarray, z: np.ndarray, max_bins: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Average consecutive observations into at most ``max_bins`` bins: (t, z, count).

    Bin means keep the information about the curve's level while making the
    likelihood cost independent of log length; the model scales the noise of a
    bin by ``1 / sqrt(count)``.
    """
    n = t.size
    if n <= max_bins:
        return t, z, np.ones(n)
    edges = np.linspace(0, n, max_bins + 1).astype(int)
    counts = np.diff(edges).astype(float)
    t_bins = np.add.reduceat(t, edges[:-1]) / counts
    z_bins = np.add.reduceat(z, edges[:-1]) / counts
    return t_bins, z_bins, counts
