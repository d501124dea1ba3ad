"""Prune Optuna trials whose reward curve is unlikely to beat the best trial's.

:class:`ForecastPruner` is an Optuna pruner for sweeps of GRPO runs: each trial
reports its logged mean reward with ``trial.report(reward, step)``, and at each
check the pruner forecasts the trial's final reward
(:attr:`bayes_grpo.forecast.Forecast.final`) and prunes it when the probability
that it ends above the **bar** falls below ``threshold``. The bar is the best
forecast final reward of the study's other completed or running trials: a
finished trial's measured final-window mean, a running trial's forecast median
(from the steps it had reported at its latest check, and only once it has done
``min_fraction`` of its plan). Trials are read from the study's storage, so
trials of other processes count.

**Recalibration on the study's own trials.** The runs of one sweep share a recipe,
so their forecasts tend to miss the same way: a recipe whose runs take off late is
forecast too low for all of them. The study's finished trials measure that bias. At
each check, every finished trial's forecast from the same share of its plan (made at
its own check there, or now) is compared with its measured final: its PIT ``u_j``
(the forecast probability of a final at most the measured one), as a normal score
``z_j = Phi^-1(u_j)``. With calibrated forecasts the scores are standard normal; a
sweep's bias ``d`` shifts them all, ``z_j ~ N(d, 1)``, and with a ``N(0, 1 / w)``
prior on ``d`` (``w`` = :data:`MODEL_WEIGHT`: the model's calibration counts as ``w``
finished trials) the bias is estimated as ``sum z_j / (n + w)`` with variance
``1 / (n + w)``. A trial whose forecast gives probability ``p`` of ending above the
bar then has ``Phi((Phi^-1(p) + sum z_j / (n + w)) / sqrt(1 + 1 / (n + w)))``. The
pruner uses the larger of ``p`` and that, so the recalibration only makes it more
cautious: where finished trials ended above their forecasts, or before any has, a
small ``p`` is not taken at face value.

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
from scipy.stats import norm

from bayes_grpo.errors import BayesGrpoError
from bayes_grpo.logs import normalise_family, read_log
from bayes_grpo.measures import final_reward

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

    from bayes_grpo.model import FittedModel

#: Fewest reported values a trial needs before it is forecast (fewer barely constrain its curve).
MIN_POINTS = 5
#: Prior precision of a sweep's forecast bias in normal scores: how many finished trials the model's own calibration counts as.
MODEL_WEIGHT = 1.0
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
        No check before this share of the trial's planned steps; in [0, 1). Default 0.5: on the shared
        real sweeps (``benchmarks/results/backtest_sweeps.md``) checks from 30% pruned a run that took off
        late and ended best; from 50% none was, at half the steps saved.
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
    recalibrate : bool
        Guard the probability with its recalibration on the study's finished trials (module
        docstring); False trusts the forecast alone.

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
        min_fraction: float = 0.5,
        check_interval: float = 0.02,
        total_steps: int | None = None,
        family: str | None = None,
        params_b: float | None = None,
        n_draws: int = 500,
        seed: int = 0,
        recalibrate: bool = True,
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
        self.recalibrate = bool(recalibrate)
        self._samples: dict[tuple[int, int, int], np.ndarray] = {}

    def prune(self, study: Study, trial: FrozenTrial) -> bool:
        """Whether ``trial`` should stop: at a check, P(its final > the bar) < ``threshold``.

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
        check = self.beat_probability(study, trial)
        return check is not None and check[0] < self.threshold

    def beat_probability(self, study: Study, trial: FrozenTrial) -> tuple[float, float] | None:
        """At a check, the probability that ``trial`` ends beyond the bar, and the bar; None between checks.

        None also when the trial has fewer than :data:`MIN_POINTS` finite values, has
        finished its plan, or no other trial sets a bar yet. Values are in the
        study's own units (for ``"minimize"``, "beyond" means below). With ``recalibrate``
        the probability is the recalibrated one (class docstring).

        Raises
        ------
        BayesGrpoError
            A multi-objective study, a trial without a planned length, or an invalid user attribute.
        """
        sign = _direction_sign(study)
        description = self._describe(trial)
        total = description["total_steps"]
        steps, values = _series(trial, sign)
        checks = self._check_steps(steps, total)
        if steps.size < MIN_POINTS or steps[-1] >= total or checks.size == 0 or checks[-1] != steps[-1]:
            return None
        samples = self._final_samples(trial.number, steps, values, description)  # also kept to recalibrate later checks
        bar = self._bar(study, trial, sign)
        if bar is None:
            return None
        probability = float(np.mean(samples > bar))
        if self.recalibrate:
            probability = self._recalibrated(study, trial, probability, int(steps[-1] // self._interval(total)), sign)
        return probability, sign * bar

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

    def _bar(self, study: Study, trial: FrozenTrial, sign: float) -> float | None:
        """The best final of the other completed or running trials (in sign-adjusted units), or None when there is none.

        A finished trial's final is its measured final-window mean; any other its forecast median, a
        running trial's from the steps it had at its latest check (so it is forecast once per check).
        """
        finals = []
        for other in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.RUNNING)):
            steps, values = _series(other, sign)
            if other.number == trial.number or steps.size < MIN_POINTS:
                continue
            description = self._describe(other)
            total = description["total_steps"]
            if steps[-1] >= total:
                finals.append(final_reward(values))
                continue
            if other.state == TrialState.RUNNING:
                checks = self._check_steps(steps, total)
                if checks.size == 0:
                    continue
                seen = steps <= checks[-1]
                steps, values = steps[seen], values[seen]
            finals.append(float(np.median(self._final_samples(other.number, steps, values, description))))
        return max(finals) if finals else None

    def _recalibrated(self, study: Study, trial: FrozenTrial, probability: float, check: int, sign: float) -> float:
        """``probability``, or its recalibration for the sweep's forecast bias measured on the finished trials when larger (module docstring)."""
        pits = []
        for other in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
            steps, values = _series(other, sign)
            if other.number == trial.number or steps.size < MIN_POINTS:
                continue
            description = self._describe(other)
            total = description["total_steps"]
            at = [s for s in self._check_steps(steps, total) if s // self._interval(total) == check]
            if steps[-1] < total or not at:
                continue
            seen = steps <= at[0]
            samples = self._final_samples(other.number, steps[seen], values[seen], description)
            pits.append(float(np.mean(samples <= final_reward(values))))
        # Draws resolve probabilities to one draw's share: 0 or 1 means beyond every draw, taken as half a draw's share.
        edge = 0.5 / self.n_draws
        scores = norm.ppf(np.clip(pits, edge, 1.0 - edge))
        precision = len(pits) + MODEL_WEIGHT
        z = (norm.ppf(min(max(probability, edge), 1.0 - edge)) + float(np.sum(scores)) / precision) / np.sqrt(1.0 + 1.0 / precision)
        return max(probability, float(norm.cdf(z)))

    def _final_samples(self, number: int, steps: np.ndarray, values: np.ndarray, description: dict[str, Any]) -> np.ndarray:
        """Draws of the forecast final reward of trial ``number`` from the values reported up to ``steps[-1]`` (cached)."""
        key = (number, int(steps[-1]), hash(values.tobytes()))
        if key not in self._samples:
            if self.model is None:
                from bayes_grpo.model import default_model

                self.model = default_model()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # repairs of the log and poor weights are the forecast's business here
                run = read_log(pd.DataFrame({"step": steps, "reward": values}), run_id=f"trial {number}", **description)
                seed = zlib.crc32(f"{self.seed}:{number}:{int(steps[-1])}".encode())
                self._samples[key] = self.model.forecast(run, n_draws=self.n_draws, seed=seed).final.samples
        return self._samples[key]


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
        _require(isinstance(total, numbers.Integral) and not isinstance(total, bool) and total >= 1, f"total_steps in {where} must be a whole number >= 1, got {total!r}")
        out["total_steps"] = int(total)
    if family is not None:
        _require(isinstance(family, str) and family.strip() != "", f"family in {where} must be a model family name such as 'qwen', got {family!r}")
        out["family"] = normalise_family(family)
    if params_b is not None:
        _require(_is_number(params_b) and params_b > 0, f"params_b in {where} must be a positive number (billions of parameters), got {params_b!r}")
        out["params_b"] = float(params_b)
    return out
