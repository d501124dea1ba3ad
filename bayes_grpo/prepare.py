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
  barely moved close to their current level), and better than a unit read from the
  first fifth of the plan in the fit as at forecast time
  (:attr:`~bayes_grpo.config.ModelConfig.unit_progress`, :func:`head_window`): that one
  makes the units agree, but held out by source its forecasts' error and quantile score
  were worse (``docs/notes/2026-12-05-model-v4.md``).

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
from scipy.special import betaln

from bayes_grpo.errors import ModelError
from bayes_grpo.logs import RunLog, normalise_family
from bayes_grpo.logs.plan import planned_length
from bayes_grpo.measures import reward_spread

SCALE_KINDS: tuple[str, ...] = ("range", "learned")
#: The learning signal is read up to this share of the plan (or the steps logged, when fewer) ...
SIGNAL_PROGRESS = 0.2
#: ... over this many logged steps before that point.
SIGNAL_POINTS = 10
#: Log relative spread that the covariate is centred on and its unit (about the median and SD
#: over the bundled and the shared runs), and the range it is clipped to, in those units.
SIGNAL_CENTRE, SIGNAL_SCALE, SIGNAL_CLIP = -0.3, 1.0, 3.0
#: A logged step had no learning signal when its ``reward_std`` is at most this share of the run's reward unit
#: or its share of groups without spread (``frac_reward_zero_std``) is at least :data:`NO_SIGNAL_ZERO_SHARE`;
#: a run has none left when its latest steps form a stretch of such steps too long to be chance
#: (:func:`no_learning_signal`, :data:`NO_SIGNAL_CHANCE`).
NO_SIGNAL_SPREAD = 1e-3
NO_SIGNAL_ZERO_SHARE = 0.99
#: A trailing stretch of steps without signal counts as the end of learning when a stretch that long would turn up
#: by chance anywhere in a log of that length with less than this probability (averaged over the rates of such
#: steps that the steps before the stretch leave plausible).
NO_SIGNAL_CHANCE = 0.01
# Initial reward (fraction of the range) that the population effects are centred on.
INITIAL_REWARD_CENTRE = 0.3
#: A planned length more than this many times the last logged step: a forecast extrapolates far beyond
#: what the log shows (it warns), and a fit learns only the run's logged shape (:func:`training_horizon`).
LONG_PLAN_FACTOR = 100


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
    #: Largest reward the log shows the rewards cannot pass (:func:`logged_reward_bounds`: 0-or-k outcomes, or every
    #: step's completions scored from ``reward_floor`` to it), and what showed it (in words).
    reward_ceiling: float | None = None
    ceiling_evidence: str = ""
    #: Lowest reward the log shows, with :attr:`reward_ceiling` (0 for 0-or-k outcomes).
    reward_floor: float = 0.0

    @property
    def bounds(self) -> tuple[float, float] | None:
        """The rewards' range in reward units: the declared one, else ``(reward_floor, reward_ceiling)`` when read off the
        log, else None."""
        if self.kind == "range":
            return self.loc, self.loc + self.unit
        return (self.reward_floor, self.reward_ceiling) if self.reward_ceiling is not None else None

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


def head_window(steps: np.ndarray, total_steps: int, progress: float) -> np.ndarray:
    """Mask of a run's head window: its logged steps up to ``progress`` of ``total_steps``,
    and at least its first :data:`SIGNAL_POINTS` logged steps (a run logged sparsely early still gets a unit)."""
    steps = np.asarray(steps, dtype=float)
    if steps.size == 0:
        return np.zeros(0, bool)
    edge = max(progress * total_steps, steps[min(SIGNAL_POINTS, steps.size) - 1])
    return steps <= edge


def training_horizon(run: RunLog) -> tuple[int, bool]:
    """The planned length a fit normalises ``run`` by, and whether that is its logged length instead of its plan.

    A run that logged less than 1/:data:`LONG_PLAN_FACTOR` of its plan (e.g. 200 steps of a
    56,000-step plan) shows nothing of where its plan ends: read against that plan, all its
    steps sit at progress 0 and the population's gain and timescale have nothing to hold on
    to (five such runs made a fit on the shared runs fail to mix: max r_hat 1.65). Such a run
    teaches its logged shape, so the fit treats it as a run as long as its log. A run without
    a plan is normalised by its last logged step as well.
    """
    last = int(np.max(run.steps)) if len(run.steps) else 0
    planned = run.meta.total_steps
    if planned is None:
        return last, True
    if last and planned > LONG_PLAN_FACTOR * last:
        return last, True
    return int(planned), False


#: Fewest logged steps with spread that :func:`binary_reward_ceiling` needs, the share of them whose estimate must agree
#: with the median within :data:`CEILING_AGREEMENT`, and the slack added to the inferred ceiling.
CEILING_MIN_STEPS, CEILING_AGREEING_SHARE, CEILING_AGREEMENT, CEILING_SLACK = 12, 0.9, 0.03, 0.02


def binary_reward_ceiling(rewards: np.ndarray, reward_std: np.ndarray | None) -> float | None:
    """The largest reward ``k`` of a log whose rewards are 0 or ``k`` (one 0/1 correctness reward, say), else None.

    For such rewards the spread of a step's completions is ``reward_std^2 = r (k - r)`` at its mean
    ``r``, so every step with ``0 < r`` and some spread gives ``k = r + reward_std^2 / r``. When at least
    :data:`CEILING_MIN_STEPS` such steps agree (:data:`CEILING_AGREEING_SHARE` of them within
    :data:`CEILING_AGREEMENT` of their median) and no logged mean exceeds it, the ceiling is that median
    plus :data:`CEILING_SLACK` (for the n-1 of a sample spread). On the shared runs it was inferred for 11 of
    them, all at ``k`` about 1, and no run's later reward went above it. Steps without spread are left out:
    they say ``k = r`` for any reward.
    """
    if reward_std is None:
        return None
    r, s = np.asarray(rewards, dtype=float), np.asarray(reward_std, dtype=float)
    usable = np.isfinite(r) & np.isfinite(s) & (r > 0) & (s > 0)
    if usable.sum() < CEILING_MIN_STEPS:
        return None
    estimates = r[usable] + s[usable] ** 2 / r[usable]
    ceiling = float(np.median(estimates))
    if np.mean(np.abs(estimates / ceiling - 1.0) < CEILING_AGREEMENT) < CEILING_AGREEING_SHARE or np.nanmax(r) > ceiling:
        return None
    return ceiling * (1.0 + CEILING_SLACK)


#: Most completions a logged mean may average for :func:`saturated_outcome_ceiling` to read it as a share of 0-or-k
#: outcomes, and the fewest distinct logged means it needs (a few values fit such a grid by chance).
LATTICE_MAX_COMPLETIONS, LATTICE_MIN_VALUES = 64, 5
#: Relative tolerance of the grid of :func:`saturated_outcome_ceiling` (logs print rounded floats).
LATTICE_TOLERANCE = 1e-6


def saturated_outcome_ceiling(rewards: np.ndarray, reward_std: np.ndarray | None) -> float | None:
    """The largest reward ``k`` of a log of 0-or-``k`` outcomes where ``reward_std`` does not give it exactly, else None.

    :func:`binary_reward_ceiling` needs ``reward_std^2 = r (k - r)``, which holds only where ``reward_std`` is the
    spread of one step's completions. TRL before 0.27 logged the mean spread within groups, and a log averaged over
    several steps mixes steps; for both the identity fails, and a 0/1 reward's forecast would reach far above 1.
    Three things read ``k`` there:

    * a step logged the highest mean with no spread (``reward_std`` 0): every completion of it scored that value, so
      it is a reward a completion gets, which for 0-or-k outcomes is ``k``;
    * every logged mean is a multiple of ``k / N`` for some ``N`` of at most :data:`LATTICE_MAX_COMPLETIONS`
      (the share of ``N`` outcomes that scored ``k``), among at least :data:`LATTICE_MIN_VALUES` distinct means;
    * no step's spread exceeds what 0-or-k outcomes allow at its mean, ``sqrt(2 r (k - r))`` (groups of two with the
      sample formula; larger groups, and the spread over a whole step, allow less).

    On the shared runs it holds at some cut for 8 runs of 2 sources (a 0/1 correctness reward, a 0-to-2 meme
    classification reward), and no later step of any went above it.
    """
    if reward_std is None:
        return None
    r, s = np.asarray(rewards, dtype=float), np.asarray(reward_std, dtype=float)
    keep = np.isfinite(r)
    r, s = r[keep], s[keep]
    if r.size < LATTICE_MIN_VALUES or np.min(r) < 0 or np.max(r) <= 0:
        return None
    top = float(np.max(r))
    at_top = np.abs(r - top) <= LATTICE_TOLERANCE * top
    shares = r / top
    if not np.any(at_top & (s <= NO_SIGNAL_SPREAD * top)) or np.unique(np.round(shares, 6)).size < LATTICE_MIN_VALUES:
        return None
    on_grid = (np.max(np.abs(n * shares - np.round(n * shares))) <= LATTICE_TOLERANCE * n for n in range(1, LATTICE_MAX_COMPLETIONS + 1))
    if not any(on_grid):
        return None
    spread = np.isfinite(s)
    if np.any(s[spread] > np.sqrt(2.0 * r[spread] * (top - r[spread])) * (1.0 + CEILING_SLACK)):
        return None
    return top


def completion_range_bounds(rewards: np.ndarray, completion_max: np.ndarray, completion_min: np.ndarray) -> tuple[float, float] | None:
    """The range ``(m, k)`` of a log whose every step logged the best and worst score of its completions as ``k`` and ``m``
    (verl's ``critic/score/max`` and ``/min``), else None.

    A step's mean cannot leave the range of its completions' scores. When at least :data:`CEILING_MIN_STEPS` steps log
    both, every one of them scored some completion ``k`` and some ``m < k``, and no logged mean lies outside, the scores
    are bounded by them: a reward that could go further would have shown it at one of those steps. A verl GSM8K run with
    a 0/1 score logs 1.0 and 0.0 at every step, and without the bound its forecast from step 60 of 1,450 had a 95%
    quantile of 3.5; a ReTool run's +-1 score logs 1.0 and -1.0. A best or worst that moves from step to step (a
    continuous reward, or a step whose completions all failed) gives no bound.
    """
    both = np.isfinite(completion_max) & np.isfinite(completion_min)
    if both.sum() < CEILING_MIN_STEPS:
        return None
    best, worst = np.asarray(completion_max, dtype=float)[both], np.asarray(completion_min, dtype=float)[both]
    k, m = float(best[0]), float(worst[0])
    tolerance = 1e-6 * (k - m)
    if not k > m or np.ptp(best) > tolerance or np.ptp(worst) > tolerance or np.nanmax(rewards) > k or np.nanmin(rewards) < m:
        return None
    return m, k


def reward_ceiling(rewards: np.ndarray, reward_std: np.ndarray | None) -> tuple[float, str] | None:
    """The largest reward ``k`` of a log of 0-or-k outcomes and what showed it (in words, for the forecast's caveats),
    else None: :func:`binary_reward_ceiling` where ``reward_std`` gives it, else :func:`saturated_outcome_ceiling`."""
    found = binary_reward_ceiling(rewards, reward_std)
    if found is not None:
        return found, f"0-or-{found:.2g} outcomes: reward_std^2 = reward x ({found:.2g} - reward) at every logged step with spread"
    found = saturated_outcome_ceiling(rewards, reward_std)
    if found is not None:
        return found, (
            f"0-or-{found:.2g} outcomes: a step logged {found:.2g} with no spread, so every completion scored it, and every logged mean is a "
            f"multiple of {found:.2g}/N for N of at most {LATTICE_MAX_COMPLETIONS} completions"
        )
    return None


def logged_reward_bounds(
    rewards: np.ndarray, reward_std: np.ndarray | None, completions: tuple[np.ndarray, np.ndarray] | None = None
) -> tuple[float, float, str] | None:
    """The range ``(floor, ceiling)`` a log shows its rewards cannot leave, and what showed it (in words, for the caveats),
    else None: :func:`completion_range_bounds` where the log has its completions' best and worst scores
    (``completions``), else ``(0, k)`` for 0-or-k outcomes (:func:`reward_ceiling`, for rewards that are never negative)."""
    rewards = np.asarray(rewards, dtype=float)
    if not rewards.size:
        return None
    found = completion_range_bounds(rewards, *completions) if completions is not None else None
    if found is not None:
        low, high = found
        return low, high, f"every logged step scored some completion {high:.3g} and some {low:.3g}, and none outside"
    ceiling = reward_ceiling(rewards, reward_std) if np.nanmin(rewards) >= 0 else None
    return (0.0, *ceiling) if ceiling is not None else None


def frozen_after_start(run: RunLog) -> bool:
    """Whether a run's reward never changes after the first tenth of its log (and it logged at least 10 steps).

    Such a run (one shared run collapsed from -0.68 to exactly -1 in its first steps and logged -1
    for 230 more) holds one level and a jump too early to date: the curve's timescale and shape
    have two equally good explanations, and a fit that includes it does not mix (max r_hat 1.8).
    A fit leaves it out with a warning; a forecast of it is unaffected.
    """
    rewards = np.asarray(run.rewards, dtype=float)
    return rewards.size >= 10 and np.ptp(rewards[rewards.size // 10 :]) == 0.0


def metric_spread(run: RunLog) -> np.ndarray | None:
    """The within-group spread of the metric a run's ``reward`` column holds, in its units: ``reward_std`` for the summed
    reward, ``rewards/<fn>/std`` for a reward function's mean (``read_log(metric=...)``); None for other metrics
    (an evaluation has no groups). The summed reward's spread is not in a function's units, so it never stands in."""
    metric = run.metric
    if metric == "reward":
        return run.signal("reward_std")
    if metric.startswith("rewards/") and metric.endswith("/mean"):
        return run.signal(metric[: -len("/mean")] + "/std")
    return None


def completion_scores(run: RunLog) -> tuple[np.ndarray, np.ndarray] | None:
    """The best and worst score of each step's completions (``completions/max_reward``, ``completions/min_reward``:
    verl's ``critic/score/max`` and ``/min``) when the log holds both and its metric is the summed reward; else None."""
    if run.metric != "reward" or not {"completions/max_reward", "completions/min_reward"} <= set(run.table.columns):
        return None  # the columns, not run.signals: this runs at every forecast, the live stop query's included
    return run.signal("completions/max_reward"), run.signal("completions/min_reward")


def learning_signal(steps: np.ndarray, rewards: np.ndarray, reward_std: np.ndarray | None, total_steps: int) -> float:
    """Standardised log relative spread of the completions' rewards early in the run (module docstring).

    ``log(mean reward_std / learned unit)`` over the head window (:func:`head_window`; the last
    :data:`SIGNAL_POINTS` of its steps with a finite ``reward_std``; the unit is :func:`spread_scale`
    of the rewards there, the learned scale's unit), centred and scaled by :data:`SIGNAL_CENTRE` and
    :data:`SIGNAL_SCALE` and clipped to +-:data:`SIGNAL_CLIP`. NaN when fewer than 3 such steps log a
    ``reward_std``. A spread of exactly 0 (no group could learn) gives the lower clip.
    """
    if reward_std is None:
        return float("nan")
    steps, rewards, reward_std = (np.asarray(a, dtype=float) for a in (steps, rewards, reward_std))
    early = head_window(steps, total_steps, SIGNAL_PROGRESS)
    spreads = reward_std[early]
    spreads = spreads[np.isfinite(spreads)][-SIGNAL_POINTS:]
    if spreads.size < 3:
        return float("nan")
    relative = max(float(np.mean(np.abs(spreads))), 1e-12) / spread_scale(rewards[early])
    return float(np.clip((np.log(relative) - SIGNAL_CENTRE) / SIGNAL_SCALE, -SIGNAL_CLIP, SIGNAL_CLIP))


def no_learning_signal(rewards: np.ndarray, reward_std: np.ndarray | None, zero_share: np.ndarray | None, unit: float) -> bool:
    """Whether GRPO has had no learning signal for a stretch of latest steps too long to be chance.

    A step is quiet when no group's completions disagreed (``reward_std`` at most
    :data:`NO_SIGNAL_SPREAD` of ``unit``, or ``frac_reward_zero_std`` at least
    :data:`NO_SIGNAL_ZERO_SHARE`). In logs of one small group a step a quiet step is common by
    chance (2 completions of a prompt solved 30% of the time agree 58% of the time), so the
    trailing stretch of quiet steps must be long against the log's own rate ``f`` of quiet steps
    before it: a stretch of ``L`` turns up anywhere in ``n`` steps with probability about
    ``n (1 - f) f^L``, averaged over ``f``'s posterior given the steps before the stretch
    (Beta(quiet + 1, signalled + 1): the posterior predictive, in closed form), and the run has
    no signal left when that is below :data:`NO_SIGNAL_CHANCE` and the stretch is at least
    :data:`SIGNAL_POINTS` steps. What the batch mean does meanwhile does not matter: different
    prompts are solved or failed from step to step, so it moves even when no group can teach the
    policy anything.
    """
    n = np.asarray(rewards).size
    quiet = np.zeros(n, bool)
    if reward_std is not None:
        quiet |= np.asarray(reward_std, dtype=float) <= NO_SIGNAL_SPREAD * unit
    if zero_share is not None:
        quiet |= np.asarray(zero_share, dtype=float) >= NO_SIGNAL_ZERO_SHARE
    stretch = n - int(np.flatnonzero(~quiet)[-1]) - 1 if (~quiet).any() else n
    if stretch < SIGNAL_POINTS:
        return False
    before = quiet[: n - stretch]
    if not before.any():  # no quiet step before the stretch: nothing says such steps come by chance in this log
        return True
    # E[(1 - f) f^L] under Beta(a, b) is B(a + L, b + 1) / B(a, b). A short log's few steps before the stretch leave
    # high rates plausible: one shared log of one small group a step, with 2 quiet steps of 3 and then 28 quiet ones,
    # has a chance of 0.023 (no stop; it rose later), where an 80% upper bound of the rate (0.8) gave 0.008 and
    # stopped it; the canonical flat run without signal has 1 of 4, then 11 (0.0097: stop).
    quiet_before, signalled_before = int(before.sum()), int(before.size - before.sum())
    chance = n * np.exp(betaln(quiet_before + 1 + stretch, signalled_before + 2) - betaln(quiet_before + 1, signalled_before + 1))
    return bool(chance < NO_SIGNAL_CHANCE)


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
    unit_progress: float | None = None,
) -> PreparedRun:
    """Normalise a run (or describe a run not yet started when ``run`` is None).

    Keyword arguments override the run's metadata (``source`` its ``source_repo``). ``total_steps`` falls back to
    the run's planned steps, then (only when ``require_total`` is False, as for
    finished training runs) to its last logged step. ``unit_progress`` is the head window whose reward spread
    is a learned scale's unit (:attr:`~bayes_grpo.config.ModelConfig.unit_progress`; None: all logged steps).
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
    last = int(steps.max()) if steps.size else None
    total = planned_length(total, last, f"run {run_id!r}", required=require_total or steps.size == 0)
    if total is None:  # a finished training run: its log is its plan
        total = last

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
        unit_rewards = rewards if unit_progress is None else rewards[head_window(steps, total, unit_progress)]
        loc, unit = early_level(rewards), spread_scale(unit_rewards)

    initial_z = None if initial_reward is None else (float(initial_reward) - loc) / unit
    if kind == "range":
        start = initial_z if initial_z is not None else ((early_level(rewards) - loc) / unit if rewards.size else None)
        initial_cov = 0.0 if start is None else float(np.clip(start, 0.0, 1.0)) - INITIAL_REWARD_CENTRE
    else:
        initial_cov = 0.0
    log10_size = float(np.log10(params_b)) if params_b and params_b > 0 else float("nan")
    reward_std = metric_spread(run) if run is not None else None  # NaN where not logged
    zero_share = run.signal("frac_reward_zero_std") if run is not None and run.metric == "reward" else None
    completions = completion_scores(run) if run is not None else None
    shown = logged_reward_bounds(rewards, reward_std, completions) if kind == "learned" else None
    return PreparedRun(
        run_id=run_id,
        family=normalise_family(family) if isinstance(family, str) else None,
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
        reward_ceiling=shown[1] if shown else None,
        ceiling_evidence=shown[2] if shown else "",
        reward_floor=shown[0] if shown else 0.0,
    )


def prepare_training_run(run: RunLog, unit_progress: float | None = None) -> PreparedRun:
    """A run as a fit learns from it: normalised by :func:`training_horizon`, in the units a forecast uses."""
    total, _ = training_horizon(run)
    return prepare_run(run, total_steps=total or None, require_total=False, unit_progress=unit_progress)


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
