"""Prune Optuna trials whose reward curve is unlikely to beat the best trial's.

:class:`ForecastPruner` is an Optuna pruner for sweeps of GRPO runs: each trial
reports its logged mean reward with ``trial.report(reward, step)``, and at each
check the pruner forecasts the trial's final reward
(:attr:`bayes_grpo.forecast.Forecast.final`) and prunes it when the probability
that it ends above every other trial falls below ``threshold``. Trials are read
from the study's storage, so trials of other processes count. The other trials
that set the **bar**:

* a COMPLETE trial (or one that has reported its planned length), with its
  measured final-window mean, whatever its last step (steps may count from 0);
* a RUNNING trial past ``min_fraction`` of its plan, with its forecast draws from
  the steps it had at its latest check, unless the trial asking leads it now
  (its mean over the last check interval both have reached is higher: a
  forecast the rival has not shown never prunes a trial ahead of it), or it is
  **stale**: it reported no new step while the trial asking went through
  :data:`STALE_SHARE` of its plan (its process died or hangs).

The probability is read from **joint draws** of the trials' finals, made as
:func:`bayes_grpo.rank` makes them (:mod:`bayes_grpo.sweeps`): **the study is one
sweep**, and its trials' forecasts miss together. With ``coupling`` (default the
model's own, measured on real runs and stored in its file: :func:`bayes_grpo.sweeps.model_coupling`) every forecast trial's
final is drawn through the distribution of real finals' normal scores at its share of
the plan (heavy upper tail: late take-offs) with one shared sweep effect per joint
draw, so the difference between two forecast trials has that shared part cancelled.
The shared effect is conditioned on the study's **finished trials**: each one's
measured final as a normal score in its forecast from the same share of its plan (made
at its own check there, or now). A study whose finished trials ended above their
forecasts lifts the others' forecasts, so the pruner waits; one whose trials ended
where they were forecast lets it prune with confidence.
``coupling=bayes_grpo.sweeps.FORECAST_ALONE`` trusts each forecast alone, independently.

The pruner follows the study's direction: for ``"minimize"`` it forecasts the
negated values (a falling loss is then a rising curve, the shape the population
was fitted on) and the bar is the lowest final. Multi-objective studies are not
served.

A trial's planned length, model family and size come from its user attributes
``total_steps``, ``family`` and ``params_b`` when it sets them
(``trial.set_user_attr("total_steps", 500)``), else from the pruner's arguments, so
a sweep may mix lengths. The planned length is required one way or the other: it
is what the forecast extrapolates to.

Optuna is an optional extra: ``pip install "bayes_grpo[optuna]"``.
"""

from __future__ import annotations

import math
import numbers
import warnings
import zlib
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from bayes_grpo.errors import BayesGrpoError
from bayes_grpo.logs import normalise_family, read_log
from bayes_grpo.logs.plan import planned_length
from bayes_grpo.measures import final_reward
from bayes_grpo.sweeps import JOINT_DRAWS, ScoreMap, SweepCoupling, model_coupling, sweep_bounds

try:
    from optuna.pruners import BasePruner
    from optuna.study import StudyDirection
    from optuna.trial import TrialState
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "bayes_grpo.integrations.optuna needs Optuna: pip install 'bayes_grpo[optuna]' (or pip install 'optuna>=4')"
    ) from exc

if TYPE_CHECKING:
    from optuna.study import Study
    from optuna.trial import FrozenTrial

    from bayes_grpo.forecast import Forecast
    from bayes_grpo.model import FittedModel

#: Fewest reported values a trial needs before it is forecast (fewer barely constrain its curve).
MIN_POINTS = 5
#: A running trial that reports no new step while the asking trial goes through this share of its plan is stale (crashed, or hung): it sets no bar.
STALE_SHARE = 0.2
#: User attributes a trial may set to describe its run.
TRIAL_ATTRS = ("total_steps", "family", "params_b")


def _is_number(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(float(value))


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise BayesGrpoError(f"ForecastPruner: {message}")


class ForecastPruner(BasePruner):
    """Prune a trial once it is unlikely to end above the best other trial (module docstring).

    Parameters
    ----------
    model : FittedModel, optional
        The population posterior; default :func:`bayes_grpo.default_model` (loaded at the first check).
    threshold : float
        Prune when P(final > bar) falls below this; in (0, 1). Default 0.05.
    min_fraction : float
        No check before this share of the trial's planned steps; in [0, 1). Default 0.3.
    check_interval : float
        Share of the planned steps between two checks, in (0, 1]; the pruner answers False
        between checks. Default 0.02 (every 2% of the plan; every step of a 50-step run).
    total_steps : int, optional
        Planned length of trials that do not set the ``total_steps`` user attribute.
    family, params_b : optional
        Model family and size (billions of parameters) of trials that do not set them as user attributes.
    n_draws : int
        Forecast draws per check (precision against speed); at least 100.
    seed : int
        Seed of the forecasts (each check's own, derived from this, the trial and the step).
    patience : int
        Prune only when the probability is below ``threshold`` at this many checks in a row (1: at the first):
        each check is another chance for a run that is behind by noise to look hopeless once. Default 2.
        The defaults (from 30%, patience 2, checks every 2%) were chosen among the variants replayed on the
        shared real sweeps (``benchmarks/results/backtest_sweeps.md``) as the one that kept the best run
        most often; patience 1 pruned the best run in a fifth of the replays.
    coupling : SweepCoupling, optional
        How the study's forecasts miss together (module docstring); default the model's own
        (:func:`bayes_grpo.sweeps.model_coupling`), :data:`bayes_grpo.sweeps.FORECAST_ALONE` trusts each forecast alone.
    base : optuna BasePruner, "median" or None
        A pruner to compose with, as Optuna's ``PatientPruner`` wraps one: when it proposes to prune, the
        forecast vetoes the proposal unless P(final > bar) is below ``veto`` (a take-off still ahead keeps the
        trial). ``"median"`` (default): Optuna's ``MedianPruner`` with 2 startup trials and a warm-up of 30% of
        each trial's plan, the pruner users reach for: trials that trail the others at the same step rarely end
        first, which the median pruner uses and the forecast alone does not. The forecast's own rule
        (``threshold``, ``patience``) prunes as well. None: the forecast's rule alone (on the shared real sweeps it
        saved three quarters of the composed default's steps, never pruning the best run).
    veto : float
        With ``base``: the probability of ending beyond the bar at or above which a proposal is vetoed; in (0, 1).
        Default 0.12: on the shared real sweeps (``benchmarks/results/backtest_sweeps.md``), with ``base="median"``,
        it saved 0.9 times the median pruner's steps and never pruned the best run. The dial trades one for the
        other: 0.1 and 0.05 saved less; from 0.14 on, the best run of a sweep of three near-identical runs was
        pruned as often as the median pruner prunes it. Chosen on those same sweeps.

    Raises
    ------
    BayesGrpoError
        At construction for an argument out of range; at a check for a trial without a planned
        length, an invalid user attribute, or a study direction it cannot serve.

    Example
    -------
    >>> study = optuna.create_study(direction="maximize", pruner=ForecastPruner(total_steps=500))  # doctest: +SKIP
    >>> # in the objective: trial.report(mean_reward, step); if trial.should_prune(): raise optuna.TrialPruned()
    """

    def __init__(
        self,
        model: FittedModel | None = None,
        threshold: float = 0.05,
        min_fraction: float = 0.3,
        check_interval: float = 0.02,
        total_steps: int | None = None,
        family: str | None = None,
        params_b: float | None = None,
        n_draws: int = 500,
        seed: int = 0,
        coupling: SweepCoupling | None = None,
        patience: int = 2,
        base: BasePruner | str | None = "median",
        veto: float = 0.12,
    ) -> None:
        _require(model is None or callable(getattr(model, "forecast", None)), f"model must be a FittedModel (or None for the shipped one), got {model!r}")
        _require(_is_number(threshold) and 0 < threshold < 1, f"threshold must be a number between 0 and 1 (exclusive), got {threshold!r}")
        _require(_is_number(min_fraction) and 0 <= min_fraction < 1, f"min_fraction must be a number in [0, 1), got {min_fraction!r}")
        _require(_is_number(check_interval) and 0 < check_interval <= 1, f"check_interval must be a number in (0, 1], got {check_interval!r}")
        _require(isinstance(n_draws, numbers.Integral) and not isinstance(n_draws, bool) and n_draws >= 100, f"n_draws must be a whole number >= 100, got {n_draws!r}")
        _require(isinstance(seed, numbers.Integral) and not isinstance(seed, bool) and seed >= 0, f"seed must be a whole number >= 0, got {seed!r}")
        self.model = model
        self.threshold = float(threshold)
        self.min_fraction = float(min_fraction)
        self.check_interval = float(check_interval)
        self.defaults = _run_description({"total_steps": total_steps, "family": family, "params_b": params_b}, "the pruner's arguments")
        self.n_draws = int(n_draws)
        self.seed = int(seed)
        _require(coupling is None or isinstance(coupling, SweepCoupling), f"coupling must be a SweepCoupling (e.g. bayes_grpo.sweeps.FORECAST_ALONE) or None for the model's own, got {coupling!r}")
        _require(isinstance(patience, numbers.Integral) and not isinstance(patience, bool) and patience >= 1, f"patience must be a whole number >= 1, got {patience!r}")
        _require(base is None or base == "median" or isinstance(base, BasePruner), f"base must be an Optuna pruner, 'median' or None, got {base!r}")
        _require(_is_number(veto) and 0 < veto < 1, f"veto must be a number between 0 and 1 (exclusive), got {veto!r}")
        self.coupling = coupling
        self.patience = int(patience)
        self.base = base
        self.veto = float(veto)
        self._median_by_plan: dict[int, BasePruner] = {}
        self._below: dict[int, int] = {}
        self._finals: dict[tuple[int, int, int], np.ndarray] = {}
        self._sightings: dict[tuple[int, int], tuple[int, float]] = {}
        self._watched: dict[int, int] = {}
        self._warned: set[int] = set()

    def prune(self, study: Study, trial: FrozenTrial) -> bool:
        """Whether ``trial`` should stop: its latest report is not finite (it diverged), or P(its final > the best
        other trial's) < ``threshold`` at ``patience`` checks in a row.

        Parameters
        ----------
        study : optuna.study.Study
            The study (its storage holds the other trials).
        trial : optuna.trial.FrozenTrial
            The trial asking, with its reported intermediate values.

        Returns
        -------
        bool
        """
        if _diverged(trial):
            return True
        check = self.beat_probability(study, trial)
        if check is not None:
            below = self._below.get(trial.number, 0) + 1 if check[0] < self.threshold else 0
            self._below[trial.number] = below
            if below >= self.patience:
                return True
        base = self._base_pruner(trial)
        if base is None or not base.prune(study, trial):
            return False
        if check is None:  # the base proposes between checks: ask the forecast now
            check = self.beat_probability(study, trial, force=True)
        return check is None or check[0] < self.veto  # no forecast to judge by (too few points, no bar): the base decides

    def _base_pruner(self, trial: FrozenTrial) -> BasePruner | None:
        """The pruner composed with, for this trial's plan (``"median"`` is made once per planned length)."""
        if self.base != "median":
            return self.base  # type: ignore[return-value]
        total = self._describe(trial)["total_steps"]
        if total not in self._median_by_plan:
            from optuna.pruners import MedianPruner

            self._median_by_plan[total] = MedianPruner(n_startup_trials=2, n_warmup_steps=int(round(0.3 * total)))
        return self._median_by_plan[total]

    def beat_probability(self, study: Study, trial: FrozenTrial, force: bool = False) -> tuple[float, float] | None:
        """At a check, the probability that ``trial`` ends beyond the best other trial, and the bar; None between checks.

        The probability comes from joint draws of the trials' finals (module docstring); the bar is
        the median of the joint draws of the best other final. None also when the trial has fewer than
        :data:`MIN_POINTS` finite values, has finished its plan, its latest report is not finite, or no
        other trial sets a bar yet. Values are in the study's own units (for ``"minimize"``, "beyond"
        means below). ``force``: judge now even between checks (a composed base pruner's proposal).

        Raises
        ------
        BayesGrpoError
            A multi-objective study, a trial without a planned length, or an invalid user attribute of the trial.
        """
        sign = _direction_sign(study)
        description = self._describe(trial)
        total = description["total_steps"]
        steps, values = _series(trial, sign)
        checks = self._check_steps(steps, total)
        on_schedule = checks.size > 0 and checks[-1] == steps[-1]
        at_check = steps.size >= MIN_POINTS and steps[-1] < total and (on_schedule or force) and not _diverged(trial)
        interval = -1 if trial.last_step is None else trial.last_step // self._interval(total)
        if not at_check and self._watched.get(trial.number) == interval:
            return None
        self._watched[trial.number] = interval
        others = [other for other in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.RUNNING)) if other.number != trial.number]
        self._sight(trial, others, total)
        if not at_check:
            return None
        own = self._final_samples(trial.number, steps, values, description)  # also kept: a finished trial's score later
        rivals = self._rivals(trial, others, sign, steps, values)
        if not rivals:
            return None
        measured = [value for kind, value in rivals if kind == "measured"]
        forecast = [own, *(samples for kind, samples in rivals if kind == "forecast")]
        rng = np.random.default_rng(zlib.crc32(f"{self.seed}:{trial.number}:{int(steps[-1])}:joint".encode()))
        fraction = float(steps[-1]) / total
        scores = self._sweep_scores(others, int(steps[-1] // self._interval(total)), sign)
        bounds = sweep_bounds([values, *(_series(other, sign)[1] for other in others)])
        coupling = self.coupling if self.coupling is not None else model_coupling(self.model)
        finals, _ = coupling.joint_finals(fraction, forecast, JOINT_DRAWS, rng, scores, bounds)
        best_other = finals[:, 1:].max(axis=1) if finals.shape[1] > 1 else np.full(JOINT_DRAWS, -np.inf)
        if measured:
            best_other = np.maximum(best_other, max(measured))
        probability = float(np.mean(finals[:, 0] > best_other))
        return probability, sign * float(np.median(best_other))

    # ---------------------------------------------------------------- internals

    def _describe(self, trial: FrozenTrial) -> dict[str, Any]:
        """The trial's planned length, family and size: its user attributes, else the pruner's arguments."""
        given = _run_description({k: trial.user_attrs[k] for k in TRIAL_ATTRS if k in trial.user_attrs}, f"trial {trial.number}'s user attributes")
        description = {**self.defaults, **given}
        if description.get("total_steps") is None:
            raise BayesGrpoError(
                f"ForecastPruner: trial {trial.number} has no planned length; pass ForecastPruner(total_steps=N) "
                "or set it in the objective with trial.set_user_attr('total_steps', N) (the trainer's max_steps)"
            )
        return description

    def _rival_description(self, other: FrozenTrial) -> dict[str, Any] | None:
        """Another trial's description, or None (with one warning per trial) when it has no valid one: it then sets no bar."""
        try:
            return self._describe(other)
        except BayesGrpoError as exc:
            if other.number not in self._warned:
                self._warned.add(other.number)
                warnings.warn(f"{exc}; it is left out of the comparisons", UserWarning, stacklevel=4)
            return None

    def _interval(self, total: int) -> int:
        """Steps between two checks of a run planned for ``total`` steps."""
        return max(1, int(round(self.check_interval * total)))

    def _check_steps(self, steps: np.ndarray, total: int) -> np.ndarray:
        """The reported steps at which a run is checked: from ``min_fraction`` of the plan on, the first in each check interval."""
        late = steps[(steps >= self.min_fraction * total) & (steps < total)]
        if late.size == 0:
            return late
        group = late // self._interval(total)
        return late[np.concatenate([[True], group[1:] != group[:-1]])]

    def _sight(self, trial: FrozenTrial, others: list[FrozenTrial], total: int) -> None:
        """Note, for each running trial, the asking trial's progress when its latest step was first seen (to tell stale ones)."""
        progress = (trial.last_step or 0) / total
        for other in others:
            if other.state == TrialState.RUNNING:
                seen = self._sightings.get((trial.number, other.number))
                if seen is None or seen[0] != other.last_step:
                    self._sightings[(trial.number, other.number)] = (other.last_step, progress)

    def _stale(self, trial: FrozenTrial, other: FrozenTrial, total: int) -> bool:
        """Whether running ``other`` has reported nothing new while ``trial`` went through :data:`STALE_SHARE` of its plan."""
        seen = self._sightings.get((trial.number, other.number))
        return seen is not None and seen[0] == other.last_step and (trial.last_step or 0) / total - seen[1] >= STALE_SHARE

    def _rivals(
        self, trial: FrozenTrial, others: list[FrozenTrial], sign: float, steps: np.ndarray, values: np.ndarray
    ) -> list[tuple[str, Any]]:
        """Every other trial that sets a bar for ``trial`` (whose finite reports are ``steps``, ``values``):
        ``("measured", final)`` or ``("forecast", final draws)``.

        A COMPLETE trial (or one logged to its plan) counts with its measured final-window mean, whatever
        its last step. A running one counts with its forecast draws from the steps it had at its latest
        check (so it is forecast once per check), once it is past ``min_fraction`` of its plan, unless it
        is stale, its latest report is not finite, or ``trial`` is ahead of it now (:func:`_ahead`: a
        forecast it has not shown yet never prunes a trial that leads it). Trials without a valid
        description are left out (one warning each).
        """
        total = self._describe(trial)["total_steps"]
        rivals: list[tuple[str, Any]] = []
        for other in others:
            description = self._rival_description(other)
            other_steps, other_values = _series(other, sign)
            if description is None or other_steps.size < MIN_POINTS or _diverged(other):
                continue
            plan = description["total_steps"]
            if other.state == TrialState.COMPLETE or other_steps[-1] >= plan:
                rivals.append(("measured", final_reward(other_values)))
                continue
            checks = self._check_steps(other_steps, plan)
            if checks.size == 0 or self._stale(trial, other, total) or _ahead(steps, values, other_steps, other_values, self._interval(total)):
                continue
            seen = other_steps <= checks[-1]
            rivals.append(("forecast", self._final_samples(other.number, other_steps[seen], other_values[seen], description)))
        return rivals

    def _sweep_scores(self, others: list[FrozenTrial], check: int, sign: float) -> list[float]:
        """The finished trials' measured finals as normal scores in their forecasts from check ``check`` of their plan
        (the same share of the plan as the trial asking): what the sweep's shared effect is conditioned on."""
        scores = []
        for other in others:
            description = self._rival_description(other)
            steps, values = _series(other, sign)
            if other.state != TrialState.COMPLETE or description is None or steps.size < MIN_POINTS or _diverged(other):
                continue
            total = description["total_steps"]
            at = [s for s in self._check_steps(steps, total) if s // self._interval(total) == check]
            if not at or np.sum(steps <= at[0]) < MIN_POINTS:
                continue
            seen = steps <= at[0]
            samples = self._final_samples(other.number, steps[seen], values[seen], description)
            scores.append(ScoreMap.from_draws(samples).score(final_reward(values)))
        return scores

    def _final_samples(self, number: int, steps: np.ndarray, values: np.ndarray, description: dict[str, Any]) -> np.ndarray:
        """Draws of the forecast final reward of trial ``number`` from the values reported up to ``steps[-1]`` (cached)."""
        key = (number, int(steps[-1]), hash(values.tobytes()))
        if key not in self._finals:
            self._finals[key] = self._run_forecast(number, steps, values, description).final.samples
        return self._finals[key]

    def _run_forecast(self, number: int, steps: np.ndarray, values: np.ndarray, description: dict[str, Any]) -> Forecast:
        """The forecast of trial ``number`` from the values reported up to ``steps[-1]`` (seeded by the trial and step)."""
        if self.model is None:
            from bayes_grpo.model import default_model

            self.model = default_model()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # repairs of the log and poor weights are the forecast's business here
            run = read_log(pd.DataFrame({"step": steps, "reward": values}), run_id=f"trial {number}", **description)
            seed = zlib.crc32(f"{self.seed}:{number}:{int(steps[-1])}".encode())
            return self.model.forecast(run, n_draws=self.n_draws, seed=seed, calibrated=False)  # the coupling is its calibration


def _direction_sign(study: Study) -> float:
    """+1 for a maximised objective, -1 for a minimised one; other studies are refused."""
    directions = study.directions
    if len(directions) != 1:
        raise BayesGrpoError(f"ForecastPruner serves single-objective studies; this one has {len(directions)} objectives")
    if directions[0] == StudyDirection.MAXIMIZE:
        return 1.0
    if directions[0] == StudyDirection.MINIMIZE:
        return -1.0
    raise BayesGrpoError(f"ForecastPruner needs a study direction of 'maximize' or 'minimize', got {directions[0].name}")


def _diverged(trial: FrozenTrial) -> bool:
    """Whether the trial's latest report is not finite (NaN or infinite): its training diverged."""
    values = trial.intermediate_values
    return bool(values) and not math.isfinite(values[max(values)])


def _ahead(steps: np.ndarray, values: np.ndarray, other_steps: np.ndarray, other_values: np.ndarray, window: int) -> bool:
    """Whether a trial's mean reported value leads another's over the same steps: the last ``window`` steps both have reached."""
    common = min(int(steps[-1]), int(other_steps[-1]))
    mine = values[(steps > common - window) & (steps <= common)]
    theirs = other_values[(other_steps > common - window) & (other_steps <= common)]
    return mine.size > 0 and theirs.size > 0 and float(mine.mean()) > float(theirs.mean())


def _series(trial: FrozenTrial, sign: float) -> tuple[np.ndarray, np.ndarray]:
    """A trial's reported steps and finite values (times ``sign``), in step order."""
    items = sorted((int(step), float(value)) for step, value in trial.intermediate_values.items() if math.isfinite(value))
    if not items:
        return np.empty(0, dtype=int), np.empty(0)
    steps, values = zip(*items)
    return np.asarray(steps, dtype=int), sign * np.asarray(values, dtype=float)


def _run_description(values: dict[str, Any], where: str) -> dict[str, Any]:
    """Checked ``total_steps``, ``family`` and ``params_b`` (those not None)."""
    out: dict[str, Any] = {}
    total, family, params_b = values.get("total_steps"), values.get("family"), values.get("params_b")
    if total is not None:
        out["total_steps"] = planned_length(total, name=where)
    if family is not None:
        _require(isinstance(family, str) and family.strip() != "", f"family in {where} must be a model family name such as 'qwen', got {family!r}")
        out["family"] = normalise_family(family)
    if params_b is not None:
        _require(_is_number(params_b) and params_b > 0, f"params_b in {where} must be a positive number (billions of parameters), got {params_b!r}")
        out["params_b"] = float(params_b)
    return out
