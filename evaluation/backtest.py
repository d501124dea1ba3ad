"""Backtest of stopping rules on finished runs, with folds grouped by source.

Every run is replayed as a live rule would see it. The replay's horizon is the
run as it was trained (its last logged step). Checks happen every 2% of the
steps from 10% on (:func:`check_indices`); each check sees only the steps logged
so far (``RunLog.head``), forecasts the rest once, and keeps the forecast's
:class:`~bayes_grpo.stopping.StopEvidence`: the Bayesian rule's decision at its
default settings and at each threshold of a sweep
(:func:`bayes_grpo.stopping.stop_reason`, the threshold mode of
:func:`bayes_grpo.stopping.decision_from_forecast`) comes from that one
forecast. A rule stops the run at the first check that says stop; the results
record why the Bayesian rule stopped (a plateau, a fall, the end).

The model behind each run's forecasts was fitted **without the run's source**
(cross-validation grouped by source, :func:`evaluation.calibration.grouped_folds`);
folds run through :func:`bayes_grpo.parallel.map_jobs`. With a cache folder
(:func:`evaluation.calibration.cached_fit_fold`) each fold's fit is saved as a model file named by the
package source, the training runs and the sampler settings, so trying a new rule
costs only the replay's forecasts.

Scores, from the full logged run (never shown to a rule; all on the smoother of :mod:`bayes_grpo.measures`):

* **regret** of a stop at step s: (S at the last step - S at s) / the run's 10-90%
  reward spread, S the Gaussian-kernel smoother of the whole run (bandwidth 8%
  of its steps); 0 for a run never stopped (:func:`evaluation.scoring.regret`);
* **saved**: (last step - s) / last step;
* **dip stop**: the stop fell inside a dip the run later recovered from
  (:func:`stopped_in_recovering_dip`): what a rule that mistakes a dip for a
  decline does;
* **flips**: the share of consecutive checks whose decisions differ;
* **noise bad**: the probability that logging noise alone makes the stop count as bad, were the
  run's expected reward flat from the stop on (:func:`evaluation.scoring.noise_bad_probability`).
  Its mean is the share of bad stops no forecast could avoid at those stops; the best a rule
  that knew where every run stops rising could save under a budget of such noise is
  :func:`noise_limited_frontier`.

Summaries count every run once (:func:`summarise`) or each source as at most
:data:`~evaluation.calibration.SOURCE_CAP` runs (:func:`summarise_source_capped`),
so a sweep of many runs of one recipe does not outvote single runs of many others.
The targets the rule is judged on (:data:`MAX_BAD_SHARE`, :data:`MIN_SAVED`): at most 8% of
runs above 0.05 regret, at least 20% of the steps saved, no stop inside a recovering dip.

**Nested selection** (:func:`nested_selection`): every check keeps its
:class:`~bayes_grpo.stopping.StopEvidence`, so a grid of the rule's settings
(threshold, tolerance, minimum fraction) is scored without new forecasts; each
fold gets the setting that saves the most steps on the other folds with at most
:data:`MAX_BAD_SHARE` of their runs above 0.05 regret (each source counted as at most three runs),
and the pooled held-out figures (:data:`NESTED_RULE`) are the honest estimate of
choosing the rule this way.

Baselines: **rule objects** (:class:`~bayes_grpo.stopping.StopRule`, the same objects the
callback and the CLI take, a user's own included) asked at every check from the check's
forecast (:func:`trace`'s ``rules``; default :func:`rule_baselines`: stopping at fixed
fractions of 40/60/80/90%, :class:`~bayes_grpo.stopping.FixedFractionRule`, and patience on
the causally smoothed reward, :class:`~bayes_grpo.stopping.PatienceRule`, like
``EarlyStoppingCallback``); and **trace functions** for what no live rule can be
(:func:`baseline_rules`): the paper's "80% of an epoch" (arXiv 2507.18014;
:func:`epoch_fraction`: each run's declared ``steps_per_epoch``, else the planned run taken
as one epoch), Optuna's ``PatientPruner``, and the hindsight oracle (the first check whose
regret is at most 0.05), which knows the future (its logging noise included) and bounds what any rule can save.
"""

from __future__ import annotations

import dataclasses
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from bayes_grpo import measures
from bayes_grpo.errors import BayesGrpoError
from bayes_grpo.logs import RunLog
from bayes_grpo.parallel import map_jobs
from bayes_grpo.recalibration import Recalibration
from bayes_grpo.settings import STOP_THRESHOLD, STOP_TOLERANCE
from bayes_grpo.stopping import MIN_STOP_FRACTION, STOP_REASONS, FixedFractionRule, PatienceRule, StopEvidence, StopRule, stop_evidence, stop_reason
from evaluation import scoring
from evaluation.calibration import (
    BUNDLED_SOURCE, SOURCE_CAP, ScoredSet, cached_fit_fold, fold_health, is_bundled, run_seed, scored_splits, source_weights,
)  # fmt: skip

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from bayes_grpo.model import FittedModel

#: First check, as a share of the run's steps.
CHECK_START = 0.10
#: Spacing of the checks, as a share of the run's steps.
CHECK_EVERY = 0.02
#: Thresholds on P(plateau) swept for the trade-off curve.
THRESHOLDS = (0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.99)
#: Regret levels whose exceedance is reported ("share of runs with regret > 0.05 / 0.10").
REGRET_LIMITS = (0.05, 0.10)
#: Share of an epoch after which the paper's baseline (arXiv 2507.18014) stops.
EPOCH_FRACTION = 0.8
#: The hindsight oracle stops at the first check with regret at most this.
ORACLE_REGRET = 0.05
#: A dip stop counts as beyond the smoother's noise when the dip is deeper than this many noise SDs (one-sided 2.3%).
DIP_NOISE_Z = 2.0
#: Name of the Bayesian rule at its default settings in the results.
DEFAULT_RULE = "bayes_grpo default"
#: Name of the rule whose settings each held-out fold gets from the other folds (:func:`nested_selection`).
NESTED_RULE = "bayes_grpo nested CV"
#: The settings grid of the nested selection: thresholds, tolerances (share of the logged spread), minimum fractions.
SELECTION_THRESHOLDS = (0.7, 0.8, 0.9, 0.95, 0.99)
SELECTION_TOLERANCES = (0.005, 0.01, 0.02)
SELECTION_MIN_FRACTIONS = (0.2, 0.3, 0.4, 0.5)
#: The stopping targets (the model-4 issue): at most this share of runs with regret above :data:`ORACLE_REGRET` (also the
#: nested selection's constraint on its training runs), and at least this mean share of the steps saved.
MAX_BAD_SHARE, MIN_SAVED = 0.08, 0.20


def check_indices(run: RunLog, start: float = CHECK_START, every: float = CHECK_EVERY) -> tuple[np.ndarray, np.ndarray]:
    """Logged indices and step fractions at which a rule is consulted.

    A check at fraction f sees the logged points with step <= f * last step; the
    end of the run itself is not a check (stopping there saves nothing).

    Parameters
    ----------
    run : RunLog
        The complete run.
    start, every : float
        First check and spacing, as shares of the run's last step.

    Returns
    -------
    (numpy.ndarray, numpy.ndarray)
        Indices into ``run.steps`` (at least 3 points seen, strictly increasing)
        and the fraction of each check.

    Example
    -------
    >>> indices, fractions = check_indices(run)  # doctest: +SKIP
    """
    steps = run.steps
    fractions = np.round(np.arange(start, 1.0 - every / 2, every), 6)
    indices = np.searchsorted(steps, fractions * steps[-1] + 1e-9, side="right") - 1
    keep = (indices >= 2) & (indices < len(steps) - 1)
    indices, fractions = indices[keep], fractions[keep]
    first = np.unique(indices, return_index=True)[1]
    return indices[first], fractions[first]


def score(run: RunLog, stop_index: int | None) -> dict[str, float]:
    """Stop step, saved share and regret of stopping ``run`` at logged index ``stop_index`` (None: never).

    Parameters
    ----------
    run : RunLog
        The complete run.
    stop_index : int or None
        Index into ``run.steps`` of the stop.

    Returns
    -------
    dict
        ``stop_step``, ``saved`` ((last - stop) / last), ``regret`` (:func:`evaluation.scoring.regret`),
        ``dip_stop`` (:func:`stopped_in_recovering_dip`), ``dip_z`` (for a dip stop, how many noise SDs deep the
        dip is, :func:`evaluation.scoring.dip_noise_z`; NaN otherwise) and ``noise_bad``
        (:func:`evaluation.scoring.noise_bad_probability`).

    Example
    -------
    >>> score(run, None)  # doctest: +SKIP
    {'stop_step': 100, 'saved': 0.0, 'regret': 0.0, 'dip_stop': False, 'dip_z': nan, 'noise_bad': 0.0}
    """
    steps = run.steps
    last = int(steps[-1])
    if stop_index is None:
        return {"stop_step": last, "saved": 0.0, "regret": 0.0, "dip_stop": False, "dip_z": float("nan"), "noise_bad": 0.0}
    stop = int(steps[stop_index])
    dip = stopped_in_recovering_dip(run, stop)
    return {
        "stop_step": stop,
        "saved": (last - stop) / last,
        "regret": scoring.regret(steps, run.rewards, stop),
        "dip_stop": dip,
        "dip_z": scoring.dip_noise_z(steps, run.rewards, stop) if dip else float("nan"),
        "noise_bad": scoring.noise_bad_probability(steps, run.rewards, stop, ORACLE_REGRET),
    }


def stopped_in_recovering_dip(run: RunLog, stop_step: int, limit: float = ORACLE_REGRET) -> bool:
    """Whether a stop at ``stop_step`` fell inside a dip that the run later recovered from (known only afterwards).

    On the smoother of the whole run that the regret uses (S, bandwidth 8% of
    its steps): at the stop, S is more than ``limit`` of the run's 10-90% spread
    below its best before the stop (a dip deep enough to matter for the regret),
    and after the stop S gets back to within ``limit`` of the spread of that best.

    Parameters
    ----------
    run : RunLog
        The complete run.
    stop_step : int
        The step of the stop.
    limit : float
        Depth and recovery margin, as a share of the spread (default :data:`ORACLE_REGRET`).

    Returns
    -------
    bool
        False for a stop at or after the last step.

    Example
    -------
    >>> stopped_in_recovering_dip(run, 120)  # doctest: +SKIP
    False
    """
    steps = run.steps.astype(float)
    after = steps > stop_step
    if not after.any():
        return False
    curve = measures.smoothed(steps, run.rewards)
    margin = limit * measures.reward_spread(run.rewards)
    best_before = float(curve[steps <= stop_step].max())
    at_stop = float(np.interp(stop_step, steps, curve))
    return best_before - at_stop > margin and float(curve[after].max()) >= best_before - margin


@dataclass
class RunTrace:
    """The Bayesian rule's evidence at every check of one run.

    ``probability`` is P(plateau) at each check, ``default`` the default rule's
    decisions, ``by_threshold`` the decisions at each of ``thresholds`` (shape
    (len(thresholds), checks)), ``best_step`` the decision's checkpoint to keep,
    ``evidence`` each check's :class:`~bayes_grpo.stopping.StopEvidence` (so any
    other setting of the rule can be scored without a new forecast: :func:`setting_decisions`),
    ``rule_decisions`` each rule object's decisions at the checks (name -> bool array),
    and ``fold`` the backtest fold the run was held out in (-1 outside a backtest).
    """

    run: RunLog
    source: str
    indices: np.ndarray
    fractions: np.ndarray
    probability: np.ndarray
    default: np.ndarray
    thresholds: tuple[float, ...]
    by_threshold: np.ndarray
    best_step: np.ndarray
    seconds_per_check: float = float("nan")
    evidence: list[StopEvidence] = field(default_factory=list)
    fold: int = -1
    rule_decisions: dict[str, np.ndarray] = field(default_factory=dict)

    @property
    def set(self) -> str:
        """"bundled" for the project's own runs, else "real"."""
        return "bundled" if is_bundled(self.source) else "real"


def trace(
    model: FittedModel,
    run: RunLog,
    *,
    source: str = BUNDLED_SOURCE,
    thresholds: Sequence[float] = THRESHOLDS,
    forecast_options: Mapping[str, Any] | None = None,
    seed: int = 0,
    every: float = CHECK_EVERY,
    rules: Mapping[str, StopRule] | None = None,
) -> RunTrace:
    """Replay ``run`` check by check with ``model`` and keep the decisions.

    Parameters
    ----------
    model : FittedModel
        The model that forecasts (for honest figures: one that never saw this run's source).
    run : RunLog
        The complete run; the replay's planned length is its last logged step.
    source : str
        The run's source (kept for the summaries).
    thresholds : sequence of float
        Thresholds on P(plateau) at which decisions are also recorded.
    forecast_options : mapping, optional
        Extra keyword arguments of ``model.forecast`` (e.g. ``n_draws``).
    seed : int
        Base seed of the forecasts (each check gets its own).
    every : float
        Spacing of the checks (share of the run's steps), from 10% on.
    rules : mapping, optional
        Name -> stop rule asked at every check from the check's forecast (default :func:`rule_baselines`;
        any :class:`~bayes_grpo.stopping.StopRule`, a user's own included).

    Returns
    -------
    RunTrace

    Example
    -------
    >>> tr = trace(bg.default_model(), run)  # doctest: +SKIP
    >>> tr.default  # doctest: +SKIP
    """
    last = run.last_step
    run = run.with_meta(total_steps=last)
    indices, fractions = check_indices(run, every=every)
    base = run_seed(seed, run.run_id)
    rules = rule_baselines() if rules is None else dict(rules)
    probability, default, best, by_threshold, evidence = [], [], [], [], []
    decided: dict[str, list[bool]] = {name: [] for name in rules}
    started = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for k, i in enumerate(indices):
            fc = model.forecast(run.head(int(run.steps[i])), total_steps=last, seed=base + k, **dict(forecast_options or {}))
            # The default decision from the check's evidence, computed once: stop_reason at the
            # defaults is decision_from_forecast's threshold mode (tests/test_stopping.py checks they agree).
            evidence.append(stop_evidence(fc))
            probability.append(evidence[-1].probability(STOP_TOLERANCE))
            default.append(stop_reason(evidence[-1]) in STOP_REASONS)
            best.append(evidence[-1].best_step)
            by_threshold.append([stop_reason(evidence[-1], threshold=t) in STOP_REASONS for t in thresholds])
            for name, rule in rules.items():
                decided[name].append(bool(rule.decide(fc).should_stop))
    seconds = (time.perf_counter() - started) / max(len(indices), 1)
    return RunTrace(
        run=run,
        source=source,
        indices=indices,
        fractions=fractions,
        probability=np.asarray(probability, dtype=float),
        default=np.asarray(default, dtype=bool),
        thresholds=tuple(thresholds),
        by_threshold=np.asarray(by_threshold, dtype=bool).reshape(len(indices), len(thresholds)).T,
        best_step=np.asarray(best, dtype=float),
        seconds_per_check=seconds,
        evidence=evidence,
        rule_decisions={name: np.asarray(values, dtype=bool) for name, values in decided.items()},
    )


# ------------------------------------------------------------------ baseline rules

#: A trace function maps a run's trace to its decision (stop or not) at each check: for baselines no live
#: rule object can be (each run's own epoch, Optuna's pruner fed check by check, the hindsight oracle).
Rule = Callable[[RunTrace], np.ndarray]


def rule_baselines() -> dict[str, StopRule]:
    """The baseline rule objects every replay asks at each check: fixed fractions and patience (10% and 20% of the plan)."""
    return {
        "fixed 40%": FixedFractionRule(0.4),
        "fixed 60%": FixedFractionRule(0.6),
        "fixed 80%": FixedFractionRule(0.8),
        "fixed 90%": FixedFractionRule(0.9),
        "patience 10% of the plan": PatienceRule(0.1),
        "patience 20% of the plan": PatienceRule(0.2),
    }


def epoch_fraction(fraction: float = EPOCH_FRACTION) -> Rule:
    """Baseline from arXiv 2507.18014 ("training past roughly 40-80% of an epoch buys little"): stop at ``fraction`` of an epoch.

    The epoch is the run's declared ``steps_per_epoch`` (``RunLog.meta``, read
    e.g. from a ``trainer_state.json``) when it has one; otherwise the run as
    planned is taken to be one epoch, and the rule is the same as stopping at
    ``fraction`` of the run's steps. A run whose logged steps end before
    ``fraction`` of its epoch is never stopped.
    """

    def rule(tr: RunTrace) -> np.ndarray:
        last = float(tr.run.steps[-1])
        epoch = float(tr.run.meta.steps_per_epoch or last)
        return tr.fractions * last >= fraction * epoch - 1e-9

    return rule


def causal_smoothed(run: RunLog, indices: np.ndarray) -> np.ndarray:
    """The smoothed reward at each check from the points seen so far (what a live rule can know).

    The same Gaussian kernel as the regret's smoother (bandwidth 8% of the run's
    steps), one-sided because the future is not logged yet.
    """
    steps, rewards = run.steps, run.rewards
    span = max(float(steps[-1] - steps[0]), 1.0)
    return np.array([measures.smoothed(steps[: i + 1], rewards[: i + 1], span=span)[-1] for i in indices])


def optuna_patient_rule(patience: int) -> Rule:
    """Baseline: Optuna's ``PatientPruner`` (no wrapped pruner) fed the causally smoothed reward at each check."""

    def rule(tr: RunTrace) -> np.ndarray:
        import optuna

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            study = optuna.create_study(direction="maximize", pruner=optuna.pruners.PatientPruner(None, patience=patience))
        trial = study.ask()
        out = []
        for value, i in zip(causal_smoothed(tr.run, tr.indices), tr.indices):
            trial.report(float(value), step=int(tr.run.steps[i]))
            out.append(trial.should_prune())
        return np.asarray(out, dtype=bool)

    return rule


def oracle_rule(limit: float = ORACLE_REGRET) -> Rule:
    """The hindsight oracle: stop at the first check whose regret (known only afterwards) is at most ``limit``."""

    def rule(tr: RunTrace) -> np.ndarray:
        steps, rewards = tr.run.steps, tr.run.rewards
        return np.array([scoring.regret(steps, rewards, int(steps[i])) <= limit for i in tr.indices], dtype=bool)

    return rule


#: Budgets of bad stops from logging noise alone at which :func:`noise_limited_frontier` is read.
NOISE_BUDGETS = (0.04, 0.06, 0.08, 0.10, 0.15)


def noise_limited_frontier(
    runs: Sequence[RunLog],
    sources: Sequence[str],
    budgets: Sequence[float] = NOISE_BUDGETS,
    start: float = MIN_STOP_FRACTION,
    every: float = CHECK_EVERY,
    cap: float = SOURCE_CAP,
) -> pd.DataFrame:
    """Most steps a rule could save within each budget of bad stops from logging noise, had it known where every run stops rising.

    Such a rule may stop a run at any check from ``start`` whose hindsight regret is at most
    :data:`ORACLE_REGRET` (where the hindsight oracle may stop), but it cannot know the logging
    noise after its stop: that stop counts as bad with probability
    :func:`evaluation.scoring.noise_bad_probability`. Choosing for each run a stop, or none, to
    save the most steps while the expected share of bad stops stays within a budget is solved on
    a grid of Lagrange multipliers (each run then picks the stop that maximises saved minus the
    multiplier times its chance of counting as bad); the largest saving found within each budget
    is reported. Runs are weighed as the targets weigh them (each source as at most ``cap`` runs).
    Not a rule: it shows how much of the bad-stop budget logging noise takes from the best stops there are.

    Parameters
    ----------
    runs : sequence of RunLog
        Complete runs.
    sources : sequence of str
        Each run's source.
    budgets : sequence of float
        Expected shares of bad stops (from noise alone) to read the frontier at.
    start, every : float
        First stop and spacing of the checks, shares of each run's last step (the rule's minimum fraction and the backtest's checks).
    cap : float
        Most runs a source counts as.

    Returns
    -------
    pandas.DataFrame
        One row per budget: ``noise_budget``, ``saved`` (mean share of the steps saved) and ``stopped`` (share of runs stopped).

    Example
    -------
    >>> noise_limited_frontier(runs, [sources[r.run_id] for r in runs])  # doctest: +SKIP
    """
    if len(runs) != len(sources):
        raise ValueError(f"one source per run: got {len(runs)} runs and {len(sources)} sources")
    counts = pd.Series(list(sources)).value_counts()
    weights = np.array([min(1.0, cap / counts[s]) for s in sources])
    options = []  # per run: (saved, chance of a bad stop from noise) at each stop a plateau-knowing rule may make
    for run in runs:
        steps, rewards = run.steps.astype(float), run.rewards
        spread = measures.reward_spread(rewards)
        indices, fractions = check_indices(run, CHECK_START, every)
        indices = indices[fractions >= start - 1e-9]
        curve = measures.smoothed(steps, rewards)
        plateau = [i for i in indices if spread > 0 and (curve[-1] - curve[i]) / spread <= ORACLE_REGRET]
        options.append(np.array([((steps[-1] - steps[i]) / steps[-1], scoring.noise_bad_probability(steps, rewards, steps[i], ORACLE_REGRET)) for i in plateau]).reshape(-1, 2))
    points = [(0.0, 0.0, 0.0)]  # stopping no run
    for multiplier in np.concatenate([[0.0], np.geomspace(1e-3, 1e3, 400)]):
        saved = bad = stopped = 0.0
        for w, opts in zip(weights, options):
            if not opts.size:
                continue
            value = opts[:, 0] - multiplier * opts[:, 1]
            best = int(np.argmax(value))
            if value[best] > 0:
                saved, bad, stopped = saved + w * opts[best, 0], bad + w * opts[best, 1], stopped + w
        points.append((saved / weights.sum(), bad / weights.sum(), stopped / weights.sum()))
    frontier = pd.DataFrame(points, columns=["saved", "bad", "stopped"])
    rows = []
    for budget in budgets:
        best = frontier[frontier["bad"] <= budget + 1e-12].sort_values("saved").iloc[-1]
        rows.append({"noise_budget": float(budget), "saved": float(best["saved"]), "stopped": float(best["stopped"])})
    return pd.DataFrame(rows)


def baseline_rules() -> dict[str, Rule]:
    """The comparison trace functions, by name (the rule-object baselines are :func:`rule_baselines`)."""
    return {
        f"paper: {EPOCH_FRACTION:.0%} of an epoch": epoch_fraction(),
        "optuna PatientPruner(5)": optuna_patient_rule(5),
        "optuna PatientPruner(10)": optuna_patient_rule(10),
        f"hindsight oracle (regret <= {ORACLE_REGRET})": oracle_rule(),
    }


def _row(tr: RunTrace, rule: str, threshold: float, decisions: np.ndarray, reasons: np.ndarray | None = None) -> dict[str, Any]:
    """One result row: the first stop of ``decisions`` scored, the decisions' flips, and the Bayesian rule's reason for that stop."""
    stop_index = _first_stop(tr, decisions)
    hits = np.flatnonzero(decisions)
    reason = str(reasons[hits[0]]) if reasons is not None and hits.size else ""
    flips = float(np.mean(decisions[1:] != decisions[:-1])) if decisions.size > 1 else 0.0
    flip_back = bool(np.any(decisions[:-1] & ~decisions[1:])) if decisions.size > 1 else False
    return {
        "run_id": tr.run.run_id,
        "source": tr.source,
        "set": tr.set,
        "rule": rule,
        "threshold": threshold,
        "checks": int(tr.indices.size),
        **score(tr.run, stop_index),
        "stop_reason": reason,
        "flip_rate": flips,
        "flip_back": flip_back,
    }


def evaluate(traces: Sequence[RunTrace], baselines: Mapping[str, Rule] | None = None) -> pd.DataFrame:
    """One row per (run, rule): the default rule, every threshold of the sweep, the rule objects replayed and the baselines.

    Parameters
    ----------
    traces : sequence of RunTrace
        Replays from :func:`trace` (their ``rule_decisions`` give one row per rule object).
    baselines : mapping, optional
        Name -> trace function (default: :func:`baseline_rules`).

    Returns
    -------
    pandas.DataFrame
        Columns ``run_id, source, set, rule, threshold, checks, stop_step, saved,
        regret, dip_stop, stop_reason, flip_rate, flip_back``; ``threshold`` is NaN for the default rule
        and the baselines; ``stop_reason`` is the default rule's reason for its stop
        (:func:`bayes_grpo.stopping.stop_reason`; empty for other rules and runs not stopped).

    Example
    -------
    >>> results = evaluate([trace(model, run) for run in runs])  # doctest: +SKIP
    """
    rules = baseline_rules() if baselines is None else baselines
    rows = []
    for tr in traces:
        reasons = np.array([stop_reason(e) for e in tr.evidence]) if len(tr.evidence) == tr.indices.size else None
        rows.append(_row(tr, DEFAULT_RULE, np.nan, tr.default, reasons))
        rows += [_row(tr, "bayes_grpo threshold", t, d) for t, d in zip(tr.thresholds, tr.by_threshold)]
        rows += [_row(tr, name, np.nan, decisions) for name, decisions in tr.rule_decisions.items()]
        rows += [_row(tr, name, np.nan, rule(tr)) for name, rule in rules.items()]
    return pd.DataFrame(rows)


def summarise(results: pd.DataFrame, by: Sequence[str] = ("rule", "threshold")) -> pd.DataFrame:
    """Per rule: mean and median saved, median regret, shares with regret over 0.05 and 0.10, stops, flips.

    Parameters
    ----------
    results : pandas.DataFrame
        Rows of :func:`evaluate`.
    by : sequence of str
        Grouping columns.

    Returns
    -------
    pandas.DataFrame
        Columns ``runs, mean_saved, median_saved, median_regret,
        share_regret_gt_0.05, share_regret_gt_0.10, noise_bad (the mean chance that logging noise alone
        makes a stop count as bad, :func:`score`), share_stopped, share_dip_stops
        (stops inside a dip the run recovered from, :func:`stopped_in_recovering_dip`), share_dip_stops_beyond_noise
        (of them, dips more than :data:`DIP_NOISE_Z` noise SDs deep, :func:`evaluation.scoring.dip_noise_z`), flip_rate,
        share_flip_back`` per group, in the order rules first appear.

    Example
    -------
    >>> summarise(results[results["set"] == "real"])  # doctest: +SKIP
    """
    grouped = results.groupby(list(by), dropna=False, sort=False)
    table = pd.DataFrame(
        {
            "runs": grouped.size(),
            "mean_saved": grouped["saved"].mean(),
            "median_saved": grouped["saved"].median(),
            "median_regret": grouped["regret"].median(),
            **{f"share_regret_gt_{limit:.2f}": grouped["regret"].apply(lambda r, v=limit: float(np.mean(r > v))) for limit in REGRET_LIMITS},
            "noise_bad": grouped["noise_bad"].mean(),
            "share_stopped": grouped["saved"].apply(lambda s: float(np.mean(s > 0))),
            "share_dip_stops": grouped["dip_stop"].mean(),
            "share_dip_stops_beyond_noise": grouped["dip_z"].apply(lambda z: float(np.mean(z > DIP_NOISE_Z))),
            "flip_rate": grouped["flip_rate"].mean(),
            "share_flip_back": grouped["flip_back"].mean(),
        }
    )
    return table.reset_index()


def summarise_source_capped(results: pd.DataFrame, by: Sequence[str] = ("rule", "threshold"), cap: float = SOURCE_CAP) -> pd.DataFrame:
    """:func:`summarise` with each source counted as at most ``cap`` runs per group.

    Every run of a source with ``n`` runs weighs ``min(1, cap / n)``
    (:func:`evaluation.calibration.source_weights`), so a sweep of many runs of one
    recipe counts as ``cap`` runs and cannot outvote single runs of many recipes;
    means, shares and medians are weighted.

    Parameters
    ----------
    results : pandas.DataFrame
        Rows of :func:`evaluate` (with their ``source``).
    by : sequence of str
        Grouping columns.
    cap : float
        Most runs a source counts as.

    Returns
    -------
    pandas.DataFrame
        The columns of :func:`summarise`, plus ``weight`` (the runs the group counts as) after ``runs``.

    Example
    -------
    >>> summarise_source_capped(results[results["set"] == "real"])  # doctest: +SKIP
    """
    weights = source_weights(results, by, cap)
    rows = []
    for key, part in results.groupby(list(by), dropna=False, sort=False):
        w = weights.loc[part.index].to_numpy()
        share = {f"share_regret_gt_{limit:.2f}": float(np.average(part["regret"] > limit, weights=w)) for limit in REGRET_LIMITS}
        rows.append({
            **dict(zip(by, key)), "runs": len(part), "weight": float(w.sum()),
            "mean_saved": float(np.average(part["saved"], weights=w)),
            "median_saved": measures.weighted_quantile(part["saved"], 0.5, w),
            "median_regret": measures.weighted_quantile(part["regret"], 0.5, w),
            **share,
            "noise_bad": float(np.average(part["noise_bad"], weights=w)),
            "share_stopped": float(np.average(part["saved"] > 0, weights=w)),
            "share_dip_stops": float(np.average(part["dip_stop"].astype(float), weights=w)),
            "share_dip_stops_beyond_noise": float(np.average(part["dip_z"] > DIP_NOISE_Z, weights=w)),
            "flip_rate": float(np.average(part["flip_rate"], weights=w)),
            "share_flip_back": float(np.average(part["flip_back"].astype(float), weights=w)),
        })  # fmt: skip
    return pd.DataFrame(rows)


def tradeoff_figure(summary: pd.DataFrame, title: str = "") -> Figure:
    """Mean steps saved against the share of runs with regret > 0.05: the threshold sweep as a curve, other rules as points.

    Parameters
    ----------
    summary : pandas.DataFrame
        A :func:`summarise` table (one set of runs).
    title : str
        Figure title.

    Returns
    -------
    matplotlib.figure.Figure

    Example
    -------
    >>> tradeoff_figure(summarise(results)).savefig("tradeoff.png")  # doctest: +SKIP
    """
    import matplotlib.pyplot as plt

    x, y = "share_regret_gt_0.05", "mean_saved"
    fig, ax = plt.subplots(figsize=(7, 4.6), layout="constrained")
    ax.add_patch(plt.Rectangle((0, MIN_SAVED), MAX_BAD_SHARE, 1 - MIN_SAVED, color="C2", alpha=0.12, lw=0, label=f"target (<= {MAX_BAD_SHARE:.0%}, >= {MIN_SAVED:.0%})"))
    sweep = summary[summary["rule"] == "bayes_grpo threshold"].sort_values("threshold")
    ax.plot(sweep[x], sweep[y], "o-", color="C0", label="bayes_grpo, threshold sweep")
    for _, row in sweep.iterrows():
        ax.annotate(f"{row['threshold']:g}", (row[x], row[y]), textcoords="offset points", xytext=(4, 4), fontsize=7, color="C0")
    others = summary[summary["rule"] != "bayes_grpo threshold"]
    markers = {DEFAULT_RULE: ("*", "C3", 14)}
    for i, (_, row) in enumerate(others.iterrows()):
        marker, color, size = markers.get(row["rule"], ("os^Dv<>ph"[i % 9], f"C{(i % 7) + 1}", 7))
        ax.plot(row[x], row[y], marker, color=color, ms=size, ls="none", label=row["rule"])
    ax.set_xlabel("share of runs with regret > 0.05")
    ax.set_ylabel("mean share of steps saved")
    ax.set_xlim(-0.02, 1.02)
    ax.set_ylim(-0.02, 1.02)
    ax.set_title(title or "stopping rules: compute saved against bad stops", fontsize=10)
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    return fig


# ------------------------------------------------------------------ nested selection of the rule's settings


@dataclass(frozen=True)
class RuleSetting:
    """One setting of the threshold mode (:func:`bayes_grpo.stopping.threshold_stop`)."""

    threshold: float
    tolerance: float
    min_fraction: float

    @property
    def label(self) -> str:
        """Short name, e.g. ``"threshold 0.95, tolerance 0.01, from 30%"``."""
        return f"threshold {self.threshold:g}, tolerance {self.tolerance:g}, from {self.min_fraction:.0%}"


def selection_grid(
    thresholds: Sequence[float] = SELECTION_THRESHOLDS,
    tolerances: Sequence[float] = SELECTION_TOLERANCES,
    min_fractions: Sequence[float] = SELECTION_MIN_FRACTIONS,
) -> list[RuleSetting]:
    """Every combination of the given thresholds, tolerances and minimum fractions (defaults: the ``SELECTION_*`` grids)."""
    return [RuleSetting(t, tol, f) for t in thresholds for tol in tolerances for f in min_fractions]


def setting_reasons(tr: RunTrace, setting: RuleSetting) -> np.ndarray:
    """The reason (:func:`bayes_grpo.stopping.stop_reason`) of ``setting`` at each check of ``tr``, from its stored evidence.

    Example
    -------
    >>> setting_reasons(tr, RuleSetting(0.9, 0.01, 0.3))  # doctest: +SKIP
    """
    return np.array(
        [stop_reason(e, threshold=setting.threshold, tolerance=setting.tolerance, min_fraction=setting.min_fraction) for e in tr.evidence],
        dtype=str,
    )


def setting_decisions(tr: RunTrace, setting: RuleSetting) -> np.ndarray:
    """The decision of ``setting`` at each check of ``tr``, from its stored evidence (no new forecast).

    Example
    -------
    >>> setting_decisions(tr, RuleSetting(0.9, 0.01, 0.3))  # doctest: +SKIP
    """
    return np.isin(setting_reasons(tr, setting), sorted(STOP_REASONS))


@dataclass
class NestedSelection:
    """Nested cross-validation of the rule's settings: held-out results and what each fold's training runs picked.

    ``results`` has one row per run (rule :data:`NESTED_RULE`, the columns of
    :func:`evaluate`), each scored with the setting its fold's training runs
    chose; ``picks`` has one row per fold: the setting, whether it met the
    constraint on the training runs, its mean saved share and share of regret
    above the limit there, and the held-out figures of the fold.
    """

    results: pd.DataFrame
    picks: pd.DataFrame


def nested_selection(
    traces: Sequence[RunTrace],
    settings: Sequence[RuleSetting] | None = None,
    *,
    max_bad_share: float = MAX_BAD_SHARE,
    limit: float = ORACLE_REGRET,
    cap: float | None = SOURCE_CAP,
) -> NestedSelection:
    """Choose the rule's setting on the other folds, score it on the held-out fold, for every fold.

    On the training runs of each outer fold (every fold but the held-out one),
    the chosen setting is the one with the largest mean share of steps saved
    among those with at most ``max_bad_share`` of runs above ``limit`` regret;
    when none qualifies, the one with the fewest such runs (then the most saved).
    Means and shares count each source as at most ``cap`` runs (a run of a source
    with ``n`` training runs weighs ``min(1, cap / n)``), so a sweep of many runs of
    one recipe cannot choose the setting for everyone else.
    Ties go to the earlier setting of ``settings``. The held-out runs are then
    scored with it, so the pooled held-out figures are an honest estimate of
    the selected rule on unseen sources. Every check's forecast is computed once
    (:attr:`RunTrace.evidence`); a grid of settings costs seconds.

    Parameters
    ----------
    traces : sequence of RunTrace
        Replays with evidence and fold (from :func:`backtest`).
    settings : sequence of RuleSetting, optional
        Candidates (default :func:`selection_grid`).
    max_bad_share : float
        Largest share of training runs allowed above ``limit`` regret.
    limit : float
        The regret a stop must not exceed.
    cap : float or None
        Most runs a source counts as in the choice and the fold figures (None: every run once).

    Returns
    -------
    NestedSelection

    Raises
    ------
    BayesGrpoError
        For fewer than two folds, or traces without evidence.

    Example
    -------
    >>> summarise(nested_selection(bt.traces).results)  # doctest: +SKIP
    """
    settings = list(selection_grid() if settings is None else settings)
    folds = sorted({tr.fold for tr in traces})
    if len(folds) < 2 or not settings:
        raise BayesGrpoError("nested selection needs traces from at least two folds and at least one setting")
    if any(len(tr.evidence) != tr.indices.size for tr in traces):
        raise BayesGrpoError("nested selection needs the evidence of every check (traces from evaluation.backtest.trace)")
    reasons = [[setting_reasons(tr, s) for tr in traces] for s in settings]
    decisions = [[np.isin(r, sorted(STOP_REASONS)) for r in row] for row in reasons]
    scored: dict[tuple[int, int | None], dict[str, Any]] = {}  # many settings stop a run at the same check
    for row in decisions:
        for j, d in enumerate(row):
            stop = _first_stop(traces[j], d)
            if (j, stop) not in scored:
                scored[j, stop] = score(traces[j].run, stop)
    scores = [[scored[j, _first_stop(traces[j], d)] for j, d in enumerate(row)] for row in decisions]
    saved = np.array([[sc["saved"] for sc in row] for row in scores])
    bad = np.array([[sc["regret"] > limit for sc in row] for row in scores])
    fold_of = np.array([tr.fold for tr in traces])
    sources = pd.Series([tr.source for tr in traces])

    def weights(runs: np.ndarray) -> np.ndarray:
        if cap is None:
            return np.ones(runs.size)
        return source_weights(pd.DataFrame({"source": sources[runs].to_numpy()}), cap=cap).to_numpy()

    rows, picks = [], []
    for fold in folds:
        train, held = np.flatnonzero(fold_of != fold), np.flatnonzero(fold_of == fold)
        w_train, w_held = weights(train), weights(held)
        train_saved, train_bad = saved[:, train] @ w_train / w_train.sum(), bad[:, train] @ w_train / w_train.sum()
        feasible = train_bad <= max_bad_share + 1e-12
        # np.lexsort sorts by its last key first: feasible settings first (else the fewest bad stops), then the most saved, then grid order.
        first_key = ~feasible if feasible.any() else train_bad
        best = int(np.lexsort((np.arange(len(settings)), -train_saved, first_key))[0])
        rows += [_row(traces[j], NESTED_RULE, np.nan, decisions[best][j], reasons[best][j]) for j in held]
        picks.append(
            {
                "fold": fold,
                **asdict(settings[best]),
                "feasible": bool(feasible[best]),
                "train_runs": int(train.size),
                "train_mean_saved": float(train_saved[best]),
                f"train_share_regret_gt_{limit:.2f}": float(train_bad[best]),
                "held_out_runs": int(held.size),
                "held_out_mean_saved": float(saved[best, held] @ w_held / w_held.sum()),
                f"held_out_share_regret_gt_{limit:.2f}": float(bad[best, held] @ w_held / w_held.sum()),
            }
        )
    return NestedSelection(results=pd.DataFrame(rows), picks=pd.DataFrame(picks))


def _first_stop(tr: RunTrace, decisions: np.ndarray) -> int | None:
    """Index into ``tr.run.steps`` of the first check that says stop (None: never)."""
    hits = np.flatnonzero(decisions)
    return int(tr.indices[hits[0]]) if hits.size else None


# ------------------------------------------------------------------ grouped cross-validated backtest


@dataclass(frozen=True)
class BacktestJob:
    """One fold of the backtest: fit on ``train`` (or use ``model``), replay ``test``."""

    fold: int
    n_folds: int
    train: tuple[RunLog, ...]
    test: tuple[RunLog, ...]
    sources: Mapping[str, str]
    fit_options: Mapping[str, Any] = field(default_factory=dict)
    forecast_options: Mapping[str, Any] = field(default_factory=dict)
    thresholds: tuple[float, ...] = THRESHOLDS
    seed: int = 0
    every: float = CHECK_EVERY
    model: FittedModel | None = None
    cache_dir: str | None = None
    layer: Recalibration | None = None

    @property
    def name(self) -> str:
        fitted = "given model" if self.model is not None else f"fit {len(self.train)} runs"
        return f"fold {self.fold + 1}/{self.n_folds}: {fitted}, replay {len(self.test)}"


def run_backtest_fold(job: BacktestJob) -> tuple[list[RunTrace], dict[str, Any]]:
    """Fit one fold (unless a model is given; from the cache when it holds it) and replay its held-out runs: (traces, fold health)."""
    if job.model is not None:
        model, from_cache = job.model, False
    else:
        model, from_cache = cached_fit_fold(job.train, job.fit_options, job.seed + job.fold, job.cache_dir)
    if job.layer is not None:
        model = dataclasses.replace(model, recalibration=job.layer)
    traces = [
        trace(
            model, run, source=job.sources[run.run_id], thresholds=job.thresholds,
            forecast_options=job.forecast_options, seed=job.seed, every=job.every,
        )
        for run in job.test
    ]
    for tr in traces:
        tr.fold = job.fold
    health = {"fold": job.fold, "train_runs": len(job.train), "test_runs": len(job.test)}
    if job.model is None:
        health.update(fold_health(model), cached=from_cache)
    return traces, health


@dataclass
class Backtest:
    """A backtest's replays, per-(run, rule) results, each fold's fit health, and the nested selection.

    ``results`` holds the rows of :func:`evaluate` and, with two folds or more,
    those of :data:`NESTED_RULE` (:func:`nested_selection`, on the real runs when
    at least two folds hold some, else on every run); ``selection`` is that
    selection (None with one fold).
    """

    traces: list[RunTrace]
    results: pd.DataFrame
    folds: pd.DataFrame
    selection: NestedSelection | None = None


def backtest(
    runs: Sequence[RunLog],
    sources: Mapping[str, str],
    *,
    n_folds: int = 5,
    model: FittedModel | None = None,
    fit_options: Mapping[str, Any] | None = None,
    forecast_options: Mapping[str, Any] | None = None,
    thresholds: Sequence[float] = THRESHOLDS,
    seed: int = 0,
    every: float = CHECK_EVERY,
    n_jobs: int | None = 1,
    cluster: str | None = None,
    progress: bool = True,
    cache_dir: str | Path | None = None,
    scored: ScoredSet = "all",
    layers: Mapping[int, Recalibration] | None = None,
) -> Backtest:
    """Backtest the stopping rule with folds grouped by source: each run is replayed with a model that never saw its source.

    Parameters
    ----------
    runs : sequence of RunLog
        Complete runs.
    sources : mapping
        ``run_id -> source`` (see :func:`evaluation.calibration.load_evaluation_runs`).
    n_folds : int
        Number of folds grouped by source.
    model : FittedModel, optional
        Replay every run with this model instead of fitting folds (quick, but
        in-sample for the runs it was fitted on; the folds then only split the work).
    fit_options : mapping, optional
        Keyword arguments of :func:`bayes_grpo.fit` for every fold.
    forecast_options : mapping, optional
        Keyword arguments of ``model.forecast`` at every check.
    thresholds : sequence of float
        Thresholds of the trade-off sweep.
    seed : int
        Seed of the fold layout, the fits and the forecasts.
    every : float
        Spacing of the checks (share of each run's steps), from 10% on.
    n_jobs, cluster, progress
        Passed to :func:`bayes_grpo.parallel.map_jobs`.
    cache_dir : path-like, optional
        Folder of cached fold fits (:func:`evaluation.calibration.cached_fit_fold`, shared with
        the calibration benchmark's folds of the same runs and seed): a rerun with the
        same model code, runs and sampler settings skips the fits and only
        replays the forecasts and rules.
    scored : {"all", "real", "bundled"}
        Which held-out runs are replayed (:func:`evaluation.calibration.scored_splits`). The
        folds still train on every run, so the fits (and cache entries) are unchanged; the
        nested selection then picks settings on the other folds' runs of this set only.
    layers : mapping, optional
        ``fold -> calibration layer`` for each fold's model (:func:`evaluation.calibration.learn_layer` of the
        calibration benchmark's held-out forecasts of the *other* folds), so the rule is replayed on calibrated
        forecasts as the package makes them, without a layer that saw the run.

    Returns
    -------
    Backtest

    Raises
    ------
    BayesGrpoError
        Bad ``n_folds`` (see :func:`evaluation.calibration.grouped_folds`), an unknown ``scored`` set, or no run in it.

    Example
    -------
    >>> runs, sources = load_evaluation_runs()  # doctest: +SKIP
    >>> bt = backtest(runs, sources, fit_options={"draws": 300, "tune": 300})  # doctest: +SKIP
    >>> summarise(bt.results)  # doctest: +SKIP
    """
    jobs = [
        BacktestJob(
            fold,
            n_folds,
            train,
            test,
            {r.run_id: sources[r.run_id] for r in test},
            dict(fit_options or {}),
            dict(forecast_options or {}),
            tuple(thresholds),
            seed,
            every,
            model,
            None if cache_dir is None else str(cache_dir),
            (layers or {}).get(fold),
        )
        for fold, train, test in scored_splits(runs, sources, n_folds, seed, scored)
    ]
    done = map_jobs(run_backtest_fold, jobs, n_jobs=n_jobs, cluster=cluster, progress=progress, desc="backtest folds")
    return rescore([tr for fold_traces, _ in done for tr in fold_traces], pd.DataFrame([h for _, h in done]))


def rescore(traces: Sequence[RunTrace], folds: pd.DataFrame) -> Backtest:
    """Score every rule and the nested selection on finished replays (no new forecast): the second half of :func:`backtest`.

    The rules' decisions come from each check's stored evidence, so replays kept from an
    earlier :func:`backtest` can be scored again after a change to the rule.

    Parameters
    ----------
    traces : sequence of RunTrace
        Replays with their evidence and folds (``Backtest.traces``).
    folds : pandas.DataFrame
        The fold fits' health (``Backtest.folds``), passed through.

    Returns
    -------
    Backtest

    Example
    -------
    >>> bt = rescore(old.traces, old.folds)  # doctest: +SKIP
    """
    traces = list(traces)
    for tr in traces:
        tr.default = setting_decisions(tr, RuleSetting(STOP_THRESHOLD, STOP_TOLERANCE, MIN_STOP_FRACTION))
        tr.by_threshold = np.array([setting_decisions(tr, RuleSetting(t, STOP_TOLERANCE, MIN_STOP_FRACTION)) for t in tr.thresholds])
    results = evaluate(traces)
    # The settings are chosen for real runs: the bundled toy runs are easier (and five times as many).
    real = [tr for tr in traces if tr.set == "real"]
    chosen_on = real if len({tr.fold for tr in real}) > 1 else traces
    selection = nested_selection(chosen_on) if len({tr.fold for tr in chosen_on}) > 1 else None
    if selection is not None:
        results = pd.concat([results, selection.results], ignore_index=True)
    return Backtest(traces=traces, results=results, folds=folds, selection=selection)
