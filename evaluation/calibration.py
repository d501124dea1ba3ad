"""Forecast calibration, judged the way users meet the package: cross-validation grouped by source.

Each run is cut at 20%, 30% and 50% of its planned steps (:func:`bayes_grpo.measures.cut`),
forecast to its end by a model fitted **without any run from the same source**,
and scored against what really happened. Every definition comes from
:mod:`bayes_grpo.measures` and :mod:`evaluation.scoring`:

* **truth**: mean reward over the last 10% of the logged steps (the final window);
* **spread**: the run's 10-90% reward spread; every error and width is in these units;
* **error**: |forecast median - truth| / spread (the point forecast that absolute error calls for: a
  calibrated forecast's mean follows its long upper tail of late take-offs); ``mean_error`` the same for the mean;
* **persistence** baseline: mean of the last 10 observed rewards;
* **paper-law** baseline: the paper's sigmoid fitted by least squares to the
  observed head (:func:`bayes_grpo.curves.fit_paper_law`), averaged over the final window;
* **coverage** of the central 90% and 50% intervals; **truth above q95** and
  **truth below q05** (where the misses go); **90% width** / spread;
* **quantile score**: mean pinball loss at q = 0.05, 0.25, 0.5, 0.75, 0.95, over spread;
* **change after the cut**: |truth - persistence| / spread; the top third of it
  (:func:`evaluation.scoring.hardest_third`) is summarised separately;
* **run-weighted and source-capped**: every summary (:func:`summarise`) counts each
  run once, or each source as at most :data:`SOURCE_CAP` runs (:func:`source_weights`),
  so a sweep of many runs of one recipe does not outvote single runs of many recipes.

**Forecast quantity.** By default (``quantity="window"``) the forecast is
:meth:`bayes_grpo.forecast.Forecast.window_reward` of the run's real
final-window steps: the posterior predictive of the mean logged reward over
those steps, the noise of averaging them included. That is exactly the quantity
the truth measures, also for runs logged only part of their planned steps.
``quantity="final"`` scores ``Forecast.final`` instead, as the public API
returns it: the same computation on the final window the forecast expects from
``total_steps`` and the run's logging interval (identical when the run logs up
to its planned end at a steady interval).

**Forecast health.** Every row also carries the forecast's importance-sampling
``ess``, its Pareto ``pareto_k`` (above 0.7: unreliable weights), the
``proposal`` that made them, and the posterior weights of the three regimes
(``p_take_off_ahead``, ``p_plateau``, ``p_decline``; :attr:`Forecast.regimes`);
:func:`summarise` reports the median ESS and the share of k-hat above 0.7.

Sources: the ``source_repo`` of each shared external run (from the metadata the
loader attaches, else from ``index.csv``), and one source for all bundled runs.
Folds are fitted and scored through :func:`bayes_grpo.parallel.map_jobs`, so they
run on local processes or a Dask cluster with the same result. With a cache folder
(:func:`cached_fit_fold`) each fold's fit is kept as a model file named by the whole
``bayes_grpo`` source and version (:func:`package_fingerprint`), the training runs,
the model and sampler settings and the seed; the stopping backtest
(:mod:`evaluation.backtest`) fits the same folds, so the two benchmarks share the fits.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import warnings
import zlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, get_args

import numpy as np
import pandas as pd

import bayes_grpo
from bayes_grpo import measures, recalibration
from bayes_grpo.measures import weighted_quantile
from bayes_grpo.config import ModelConfig, SamplerConfig
from bayes_grpo.curves import fit_paper_law
from bayes_grpo.errors import BayesGrpoError, LogError
from bayes_grpo.forecast import PARETO_K_MAX
from bayes_grpo.logs import RunLog, load_runs
from bayes_grpo.parallel import map_jobs
from bayes_grpo.prepare import PreparedRun, prepare_run
from bayes_grpo.settings import FORECAST_QUANTILES, GENERATOR_SOURCE
from evaluation import scoring
from evaluation.settings import EVALUATION_FRACTIONS, shared_runs_dir

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from bayes_grpo.forecast import Forecast
    from bayes_grpo.model import FittedModel

#: Source name of a run that records none (a bundled run records its generator task, :func:`is_bundled`).
BUNDLED_SOURCE = "bundled"
Quantity = Literal["window", "final"]
#: Which held-out runs a cross-validation scores (and the stopping backtest replays): all, others' real runs, or the bundled ones.
ScoredSet = Literal["all", "real", "bundled"]
SCORED_SETS: tuple[str, ...] = get_args(ScoredSet)
#: Source-capped summaries count each source as at most this many runs (:func:`source_weights`).
SOURCE_CAP = 3


# ------------------------------------------------------------------ runs and sources


def shared_index(shared_dir: str | Path | None = None) -> pd.DataFrame:
    """The shared runs' ``index.csv`` (one row per run, with ``run_id`` and ``source_repo``).

    Parameters
    ----------
    shared_dir : path, optional
        Folder holding ``index.csv`` and ``runs/`` (default: :func:`evaluation.settings.shared_runs_dir`).

    Returns
    -------
    pandas.DataFrame
        The index, empty when there is no shared folder.

    Raises
    ------
    BayesGrpoError
        The index has no ``run_id`` or ``source_repo`` column.

    Example
    -------
    >>> shared_index().set_index("run_id")["source_repo"].nunique()  # doctest: +SKIP
    25
    """
    folder = shared_runs_dir(shared_dir)
    if folder is None or not (folder / "index.csv").is_file():
        return pd.DataFrame(columns=["run_id", "source_repo"])
    index = pd.read_csv(folder / "index.csv")
    missing = {"run_id", "source_repo"} - set(index.columns)
    if missing:
        raise BayesGrpoError(f"{folder / 'index.csv'}: missing column(s) {sorted(missing)}")
    return index


def source_of(run: RunLog, index: Mapping[str, str] | None = None) -> str:
    """The source (repository / recipe) a run comes from.

    The ``source_repo`` metadata the loader attaches wins, then ``index``
    (run_id -> source_repo), else the run counts as bundled.

    Parameters
    ----------
    run : RunLog
        The run.
    index : mapping, optional
        ``run_id -> source_repo`` (e.g. from :func:`shared_index`).

    Returns
    -------
    str
        The source name; :data:`BUNDLED_SOURCE` for the project's own runs.

    Example
    -------
    >>> source_of(run)  # doctest: +SKIP
    'Sunshine535/nips-grpo-dynamics'
    """
    extra = run.meta.extra or {}
    source = extra.get("source_repo") or (index or {}).get(run.run_id)
    return str(source) if source else BUNDLED_SOURCE


def is_bundled(source: str) -> bool:
    """Whether a source is the project's own: a generator task (:data:`~bayes_grpo.settings.GENERATOR_SOURCE`
    ``/<task>``, what the bundled runs record) or :data:`BUNDLED_SOURCE` (a run that names none)."""
    return source == BUNDLED_SOURCE or source.startswith(GENERATOR_SOURCE + "/")


def load_evaluation_runs(
    shared_dir: str | Path | None = None, *, bundled: bool = True, max_runs: int | None = None, seed: int = 0
) -> tuple[list[RunLog], dict[str, str]]:
    """The runs to evaluate on (shared external runs, plus the bundled runs) and the source of each.

    Parameters
    ----------
    shared_dir : path, optional
        Folder of the shared runs (default: :func:`evaluation.settings.shared_runs_dir`).
    bundled : bool
        Add the runs bundled with the repository (one source per generator task).
    max_runs : int, optional
        Keep this many runs, taken one per source in turn (sources in a
        seeded random order), so a small subset still spans many sources.
    seed : int
        Seed of that order.

    Returns
    -------
    (list of RunLog, dict)
        The runs and ``run_id -> source``.

    Raises
    ------
    BayesGrpoError
        No runs were found.

    Example
    -------
    >>> runs, sources = load_evaluation_runs(max_runs=12)  # doctest: +SKIP
    """
    runs: list[RunLog] = []
    folder = shared_runs_dir(shared_dir)
    if folder is not None and (folder / "runs").is_dir():
        runs += list(load_runs(folder / "runs"))
    if bundled:
        try:
            runs += list(load_runs())
        except LogError:
            pass  # an installed package without data/runs: shared runs only
    if not runs:
        raise BayesGrpoError("no runs to evaluate: neither the shared external runs nor the bundled runs were found")
    index = shared_index(shared_dir).set_index("run_id")["source_repo"].astype(str).to_dict()
    sources = {run.run_id: source_of(run, index) for run in runs}
    for run in runs:
        # Recorded on the run so that a fit sees it too (its source level; bayes_grpo.prepare.prepare_run).
        run.meta.extra["source_repo"] = sources[run.run_id]
    if max_runs is not None and max_runs < len(runs):
        runs = _spread_over_sources(runs, sources, max_runs, seed)
    return runs, {run.run_id: sources[run.run_id] for run in runs}


def _spread_over_sources(runs: list[RunLog], sources: Mapping[str, str], n: int, seed: int) -> list[RunLog]:
    by_source: dict[str, list[RunLog]] = {}
    for run in runs:
        by_source.setdefault(sources[run.run_id], []).append(run)
    order = sorted(by_source)
    np.random.default_rng(seed).shuffle(order)
    picked: list[RunLog] = []
    while len(picked) < n:
        for source in order:
            if by_source[source] and len(picked) < n:
                picked.append(by_source[source].pop(0))
    return picked


def grouped_folds(sources: Mapping[str, str], n_folds: int, seed: int = 0) -> dict[str, int]:
    """Assign runs to folds so that no source is on both sides of a fold.

    Sources are shuffled (seeded), then placed largest first into the fold with
    the fewest runs so far *of their kind* (the project's bundled runs, or
    others' runs: :func:`is_bundled`), ties going to the fold with the fewest
    runs in all. Every fold then holds its share of both kinds, so each real
    run is forecast by a model that saw most of the other real sources, as the
    shipped model sees all of them (placing by total size alone put the few,
    small real sources together into the last folds).

    Parameters
    ----------
    sources : mapping
        ``run_id -> source``.
    n_folds : int
        Number of folds (at least 2, at most the number of sources).
    seed : int
        Seed of the shuffle.

    Returns
    -------
    dict
        ``run_id -> fold`` (0-based).

    Raises
    ------
    BayesGrpoError
        ``n_folds`` is below 2 or above the number of sources.

    Example
    -------
    >>> grouped_folds({"a": "s1", "b": "s1", "c": "s2"}, 2)
    {'a': 0, 'b': 0, 'c': 1}
    """
    groups: dict[str, list[str]] = {}
    for run_id, source in sources.items():
        groups.setdefault(source, []).append(run_id)
    if not 2 <= n_folds <= len(groups):
        raise BayesGrpoError(f"n_folds must be between 2 and the number of sources ({len(groups)}), got {n_folds}")
    names = sorted(groups)
    np.random.default_rng(seed).shuffle(names)
    names.sort(key=lambda s: -len(groups[s]))  # stable: shuffled order breaks ties
    kind_sizes = {kind: np.zeros(n_folds, dtype=int) for kind in (False, True)}
    fold_of: dict[str, int] = {}
    for source in names:
        of_kind = kind_sizes[is_bundled(source)]
        in_all = kind_sizes[False] + kind_sizes[True]
        fold = int(np.lexsort((in_all, of_kind))[0])  # fewest of its kind, then fewest in all
        of_kind[fold] += len(groups[source])
        fold_of.update({run_id: fold for run_id in groups[source]})
    return fold_of


def grouped_splits(
    runs: Sequence[RunLog], sources: Mapping[str, str], n_folds: int, seed: int = 0
) -> list[tuple[tuple[RunLog, ...], tuple[RunLog, ...]]]:
    """``(train, test)`` runs of each fold of :func:`grouped_folds`, in fold order and run order.

    Parameters
    ----------
    runs : sequence of RunLog
        The runs to split.
    sources : mapping
        ``run_id -> source`` for every run.
    n_folds : int
        Number of folds.
    seed : int
        Seed of the fold layout.

    Returns
    -------
    list of (tuple of RunLog, tuple of RunLog)
        One ``(train, test)`` pair per fold; no source is on both sides.

    Raises
    ------
    BayesGrpoError
        Bad ``n_folds`` (see :func:`grouped_folds`).

    Example
    -------
    >>> [len(test) for _, test in grouped_splits(runs, sources, 5)]  # doctest: +SKIP
    """
    fold_of = grouped_folds({r.run_id: sources[r.run_id] for r in runs}, n_folds, seed)
    return [
        (tuple(r for r in runs if fold_of[r.run_id] != fold), tuple(r for r in runs if fold_of[r.run_id] == fold))
        for fold in range(n_folds)
    ]


def scored_runs(runs: Iterable[RunLog], sources: Mapping[str, str], scored: ScoredSet = "all") -> tuple[RunLog, ...]:
    """The runs of ``runs`` that belong to the set ``scored``: all, the real ones (others' runs) or the bundled ones.

    Only what is scored is filtered: the folds' training runs stay whole, so their fits
    (and the cache entries naming them, :func:`fold_cache_key`) are the same for every set.

    Parameters
    ----------
    runs : iterable of RunLog
        Held-out runs.
    sources : mapping
        ``run_id -> source`` (bundled runs are recognised by :func:`is_bundled`).
    scored : {"all", "real", "bundled"}
        The set to keep.

    Returns
    -------
    tuple of RunLog

    Raises
    ------
    BayesGrpoError
        An unknown set.

    Example
    -------
    >>> real = scored_runs(test, sources, "real")  # doctest: +SKIP
    """
    if scored not in SCORED_SETS:
        raise BayesGrpoError(f"scored must be 'all', 'real' or 'bundled', got {scored!r}")
    return tuple(r for r in runs if scored == "all" or is_bundled(sources[r.run_id]) == (scored == "bundled"))


def scored_splits(
    runs: Sequence[RunLog], sources: Mapping[str, str], n_folds: int, seed: int = 0, scored: ScoredSet = "all"
) -> list[tuple[int, tuple[RunLog, ...], tuple[RunLog, ...]]]:
    """``(fold, train, held-out runs of the set scored)`` of :func:`grouped_splits`, leaving out folds with none to score.

    Shared by the calibration folds and the stopping backtest, so both fit the same
    training runs (and share cache entries) whatever set they score.

    Raises
    ------
    BayesGrpoError
        Bad ``n_folds``, an unknown ``scored`` set, or no run of that set among ``runs``.

    Example
    -------
    >>> [(fold, len(test)) for fold, _, test in scored_splits(runs, sources, 5, scored="real")]  # doctest: +SKIP
    """
    splits = [(fold, train, scored_runs(test, sources, scored)) for fold, (train, test) in enumerate(grouped_splits(runs, sources, n_folds, seed))]
    kept = [split for split in splits if split[2]]
    if not kept:
        raise BayesGrpoError(f"no {scored} runs to score among the {len(runs)} runs given")
    return kept


# ------------------------------------------------------------------ scoring one forecast


def run_seed(seed: int, run_id: str) -> int:
    """A seed for one run, stable across processes and fold layouts (CRC32 of the run id)."""
    return (seed * 1_000_003 + zlib.crc32(run_id.encode())) % 2**32


#: What :func:`score_cut` asks a forecaster: ``(head, total_steps, window_steps) -> (mean, {q: value}, ess)``.
Predictor = Callable[[RunLog, int, np.ndarray], tuple[float, Mapping[float, float], float]]


def score_cut(run: RunLog, fraction: float, predict: Predictor) -> dict[str, Any] | None:
    """Cut ``run`` at ``fraction`` of its planned steps, forecast its end with ``predict`` and score it.

    The scoring shared by every forecaster judged (this module's model, the
    benchmarks' baselines): truth, spread, baselines, coverage and scores all
    come from :mod:`bayes_grpo.measures` and :mod:`evaluation.scoring` (see the module docstring).

    Parameters
    ----------
    run : RunLog
        The complete run.
    fraction : float
        Share of the planned steps observed (:func:`bayes_grpo.measures.cut`).
    predict : callable
        ``predict(head, total_steps, window_steps)`` returns the forecast mean of
        the final-window reward, its quantiles ``{q: value}`` at
        :data:`bayes_grpo.settings.FORECAST_QUANTILES`, and the forecast's
        effective sample size (NaN when it has none).

    Returns
    -------
    dict or None
        One row of scores (the columns of :func:`evaluate_run`); None when the
        cut already reaches the final window, where there is nothing to forecast.

    Example
    -------
    >>> score_cut(run, 0.3, lambda head, total, window: (0.5, dict.fromkeys(FORECAST_QUANTILES, 0.5), np.nan))  # doctest: +SKIP
    """
    total = measures.horizon(run)
    head = measures.cut(run, fraction, total)
    window = run.steps[-measures.final_window_size(len(run)) :]
    if head.last_step >= window[0]:
        return None
    truth, spread = measures.final_reward(run.rewards), measures.reward_spread(run.rewards)
    mean, predicted, ess = predict(head, total, window)
    quantiles = dict(predicted)
    q05, q25, q75, q95 = (quantiles[q] for q in (0.05, 0.25, 0.75, 0.95))
    persistence = scoring.persistence(head.rewards)
    try:
        law = fit_paper_law(head.steps / total, head.rewards)
        paper = float(np.mean(law.predict(window / total)))
    except BayesGrpoError:
        paper = persistence  # too few points to fit: the law says "stay"
    outcome = scoring.interval_outcome(truth, q05, q95)
    return {
        "run_id": run.run_id,
        "family": run.family,
        "fraction": fraction,
        "observed_step": head.last_step,
        "total_steps": total,
        "truth": truth,
        "spread": spread,
        "forecast_mean": mean,
        **{f"q{round(100 * q):02d}": v for q, v in quantiles.items()},
        "error": abs(quantiles[0.5] - truth) / spread,
        "mean_error": abs(mean - truth) / spread,
        "persistence_error": abs(persistence - truth) / spread,
        "paper_law_error": abs(paper - truth) / spread,
        "covered_90": outcome == "inside",
        "covered_50": scoring.interval_outcome(truth, q25, q75) == "inside",
        "above_q95": outcome == "above",
        "below_q05": outcome == "below",
        "width_90": (q95 - q05) / spread,
        "quantile_score": scoring.quantile_score(truth, quantiles, spread),
        "change_after_cut": scoring.change_after_cut(run.rewards, head.rewards),
        "best_logged": float(np.max(head.rewards)),
        "ess": ess,
    }


def reward_bounds(prepared: PreparedRun) -> str:
    """Where the forecast's reachable range came from: ``"declared"`` (a reward range), ``"inferred"`` (read off the
    log: :func:`bayes_grpo.prepare.logged_reward_bounds`) or ``"none"``."""
    if prepared.kind == "range":
        return "declared"
    return "inferred" if prepared.bounds is not None else "none"


def evaluate_run(
    model: FittedModel, run: RunLog, fraction: float, *, seed: int = 0, quantity: Quantity = "window", calibrated: bool = True
) -> dict[str, Any] | None:
    """Forecast ``run`` from ``fraction`` of its planned steps and score it against its real end.

    Parameters
    ----------
    model : FittedModel
        The model to forecast with (for honest figures: one that never saw this run's source).
    run : RunLog
        The complete run.
    fraction : float
        Share of the planned steps observed (:func:`bayes_grpo.measures.cut`).
    seed : int
        Seed of the forecast.
    quantity : {"window", "final"}
        What is scored (see the module docstring).
    calibrated : bool
        Apply the model's calibration layer when it has one (default, as the package does; a fold's fit has none).

    Returns
    -------
    dict or None
        One row of scores (those of :func:`score_cut`, plus ``pareto_k``, ``proposal``, the
        regime weights ``p_take_off_ahead``, ``p_plateau``, ``p_decline``, ``reward_bounds`` (:func:`reward_bounds`), and what a calibration layer
        learns from: ``std_rel``, :func:`bayes_grpo.recalibration.window_terms` over the final window and the
        quantiles of the raw forecast's reward over that window before a reward range bounds it, ``raw_q05`` ...); None when the cut
        already reaches the final window (a run logged only part of its planned steps), where
        there is nothing to forecast.

    Example
    -------
    >>> row = evaluate_run(model, run, 0.3)  # doctest: +SKIP
    >>> row["error"], row["covered_90"]  # doctest: +SKIP
    """

    forecasts: list[Forecast] = []

    def predict(head: RunLog, total: int, window: np.ndarray) -> tuple[float, dict[float, float], float]:
        fc = model.forecast(head, total_steps=total, seed=seed, calibrated=calibrated)
        forecasts.append(fc)
        if quantity == "window":
            predicted = fc.window_reward(window)
        elif quantity == "final":
            predicted = fc.final
        else:
            raise BayesGrpoError(f"quantity must be 'window' or 'final', got {quantity!r}")
        values = np.asarray(predicted.quantile(np.asarray(FORECAST_QUANTILES)), dtype=float)
        return predicted.mean, dict(zip(FORECAST_QUANTILES, values.tolist())), fc.ess

    row = score_cut(run, fraction, predict)
    if row is None:
        return None
    fc = forecasts[-1]
    window = run.steps[-measures.final_window_size(len(run)) :].astype(float)
    raw = fc.raw.window_reward(window, bounded=False).quantile(np.asarray(recalibration.LEVELS))  # what the layer moves
    return {
        **row, "pareto_k": fc.pareto_k, "proposal": fc.proposal, **{f"p_{name}": weight for name, weight in fc.regimes.items()},
        "std_rel": recalibration.std_rel(fc.prepared), "reward_bounds": reward_bounds(fc.prepared), **recalibration.window_terms(fc.raw, window),
        **{recalibration.raw_column(level): value for level, value in zip(recalibration.LEVELS, raw)},
    }  # fmt: skip


def evaluate(
    model: FittedModel,
    runs: Iterable[RunLog],
    fractions: Sequence[float] = EVALUATION_FRACTIONS,
    *,
    seed: int = 0,
    quantity: Quantity = "window",
    calibrated: bool = True,
) -> pd.DataFrame:
    """Score forecasts of every run at every fraction with one model (rows of :func:`evaluate_run`).

    Parameters
    ----------
    model : FittedModel
        The model to forecast with.
    runs : iterable of RunLog
        Complete runs.
    fractions : sequence of float
        Observed shares of the planned steps.
    seed : int
        Base seed; each run gets :func:`run_seed` of it.
    quantity : {"window", "final"}
        What is scored.
    calibrated : bool
        Forecast with the model's calibration layer when it has one (default).

    Returns
    -------
    pandas.DataFrame
        One row per (run, fraction) that could be scored.

    Example
    -------
    >>> scores = evaluate(bg.default_model(), runs[:3])  # doctest: +SKIP
    """
    rows = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for run in runs:
            for fraction in fractions:
                row = evaluate_run(model, run, fraction, seed=run_seed(seed, run.run_id), quantity=quantity, calibrated=calibrated)
                if row is not None:
                    rows.append(row)
    return pd.DataFrame(rows)


# ------------------------------------------------------------------ cross-validation


@dataclass(frozen=True)
class FoldJob:
    """One fold of a grouped cross-validation: fit on ``train``, score ``test``."""

    fold: int
    n_folds: int
    train: tuple[RunLog, ...]
    test: tuple[RunLog, ...]
    fractions: tuple[float, ...] = EVALUATION_FRACTIONS
    fit_options: Mapping[str, Any] = field(default_factory=dict)
    seed: int = 0
    quantity: Quantity = "window"
    cache_dir: str | None = None

    @property
    def name(self) -> str:
        return f"fold {self.fold + 1}/{self.n_folds}: fit {len(self.train)} runs, score {len(self.test)}"


def fit_fold(train: Sequence[RunLog], fit_options: Mapping[str, Any], seed: int) -> FittedModel:
    """Fit the hierarchy to one fold's training runs, quietly (its sampler health is kept in ``diagnostics``)."""
    from bayes_grpo.model import fit

    # The sampler's chatter would interleave with the folds' progress bar; its health is kept instead.
    loggers = [logging.getLogger(name) for name in ("pymc", "pymc.sampling.mcmc", "pymc.stats.convergence")]
    levels = [log.level for log in loggers]
    for log in loggers:
        log.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return fit(list(train), **{"seed": seed, "progressbar": False, "keep_full": False, **fit_options})
    finally:
        for log, level in zip(loggers, levels):
            log.setLevel(level)


def package_fingerprint(package_dir: str | Path | None = None) -> str:
    """Hex digest of a package's whole source: every ``*.py`` under it, by relative path, contents hashed.

    Any edit to any module (a new helper, a changed default, even a comment) names a new
    digest, so a cached fit can never outlive the code that made it; there is no hand-kept
    list of the files or definitions a fit depends on.

    Parameters
    ----------
    package_dir : path, optional
        The package folder (default: the installed ``bayes_grpo``).

    Returns
    -------
    str
        64 hex characters.

    Example
    -------
    >>> package_fingerprint() == package_fingerprint()
    True
    """
    root = Path(package_dir) if package_dir is not None else Path(bayes_grpo.__file__).resolve().parent
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.py"), key=lambda p: p.relative_to(root).as_posix()):
        digest.update(path.relative_to(root).as_posix().encode() + b"\0")
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()


def fold_cache_key(
    train: Sequence[RunLog], fit_options: Mapping[str, Any], seed: int, *, package_dir: str | Path | None = None
) -> str:
    """Hex digest naming one fold's fit in a cache: the package code, the training runs and the sampler settings.

    It hashes the whole ``bayes_grpo`` source (:func:`package_fingerprint`) and the
    package version, every training run (id, steps, rewards, metadata), the fit's
    keyword arguments and seed, and the default :class:`~bayes_grpo.config.ModelConfig`
    and :class:`~bayes_grpo.config.SamplerConfig` as this process sees them (so quick
    mode, ``BAYES_GRPO_QUICK=1``, and full settings never share an entry).

    Parameters
    ----------
    train : sequence of RunLog
        The fold's training runs (their order does not matter).
    fit_options : mapping
        Keyword arguments of :func:`bayes_grpo.fit`.
    seed : int
        The fit's seed.
    package_dir : path, optional
        The package folder whose source is fingerprinted (default: the installed ``bayes_grpo``).

    Returns
    -------
    str
        64 hex characters.

    Example
    -------
    >>> fold_cache_key(train, {}, 0)  # doctest: +SKIP
    '3f9c...'
    """
    digest = hashlib.sha256()
    digest.update(b"package\0" + package_fingerprint(package_dir).encode() + b"\0")
    digest.update(b"version\0" + str(bayes_grpo.__version__).encode() + b"\0")
    for run in sorted(train, key=lambda r: r.run_id):
        digest.update(run.run_id.encode() + b"\0")
        digest.update(np.asarray(run.steps, dtype=np.float64).tobytes())
        digest.update(np.asarray(run.rewards, dtype=np.float64).tobytes())
        digest.update(repr(run.meta.describe()).encode())
    settings = {
        "fit_options": dict(fit_options),
        "seed": seed,
        "model_config": ModelConfig().to_dict(),
        "sampler_config": SamplerConfig().to_dict(),
    }
    digest.update(json.dumps(settings, sort_keys=True, default=str).encode())
    return digest.hexdigest()


def cached_fit_fold(
    train: Sequence[RunLog], fit_options: Mapping[str, Any], seed: int, cache_dir: str | Path | None
) -> tuple[FittedModel, bool]:
    """:func:`fit_fold`, reading and writing ``cache_dir/fold-<key>.nc`` when a folder is given.

    A cached fit is a :meth:`~bayes_grpo.model.FittedModel.save` file (population
    posterior and fit diagnostics) named by :func:`fold_cache_key`, so it is only
    reused for the same package source and version, training runs and sampler settings. With
    ``cache_dir=None`` this is a plain fit.

    Parameters
    ----------
    train : sequence of RunLog
        The fold's training runs.
    fit_options : mapping
        Keyword arguments of :func:`bayes_grpo.fit`.
    seed : int
        The fit's seed.
    cache_dir : path-like or None
        Folder of cached fold fits (created when missing).

    Returns
    -------
    (FittedModel, bool)
        The model, and whether it came from the cache.

    Example
    -------
    >>> model, from_cache = cached_fit_fold(train, {}, 0, "/tmp/bt_cache")  # doctest: +SKIP
    """
    from bayes_grpo.model import load_model

    if cache_dir is None:
        return fit_fold(train, fit_options, seed), False
    path = Path(cache_dir) / f"fold-{fold_cache_key(train, fit_options, seed)}.nc"
    if path.is_file():
        return load_model(path), True
    model = fit_fold(train, fit_options, seed)
    partial = path.with_suffix(".partial.nc")
    model.save(partial, full=False)
    partial.replace(path)
    return model, False


def fold_health(model: FittedModel) -> dict[str, Any]:
    """Sampler figures of a fold's fit: sampler, seconds, max r_hat, min bulk ESS, divergences, and the runs the chains disagree on."""
    diagnostics = model.diagnostics
    names = ("sampler", "seconds", "max_r_hat", "min_ess_bulk", "divergences")
    return {name: getattr(diagnostics, name, np.nan) for name in names} | {"unmixed_runs": " ".join(getattr(diagnostics, "unmixed_runs", ()))}


def run_fold(job: FoldJob) -> tuple[pd.DataFrame, dict[str, Any], FittedModel]:
    """Fit one fold (from the cache when it holds it) and score its held-out runs: (scores, fold health, model)."""
    model, from_cache = cached_fit_fold(job.train, job.fit_options, job.seed + job.fold, job.cache_dir)
    scores = evaluate(model, job.test, job.fractions, seed=job.seed, quantity=job.quantity)
    health = {"fold": job.fold, "train_runs": len(job.train), "test_runs": len(job.test), **fold_health(model), "cached": from_cache}
    return scores.assign(fold=job.fold), health, model


@dataclass
class CrossValidation:
    """Scores of a grouped cross-validation (one row per run and fraction), each fold's fit health, and the folds
    (jobs) with their fitted models, from which :func:`cross_fitted` scores a calibration layer."""

    scores: pd.DataFrame
    folds: pd.DataFrame
    jobs: list[FoldJob] = field(default_factory=list)
    models: list[FittedModel] = field(default_factory=list)


def fold_jobs(
    runs: Sequence[RunLog],
    sources: Mapping[str, str],
    n_folds: int,
    *,
    fractions: Sequence[float] = EVALUATION_FRACTIONS,
    fit_options: Mapping[str, Any] | None = None,
    seed: int = 0,
    quantity: Quantity = "window",
    cache_dir: str | Path | None = None,
    scored: ScoredSet = "all",
) -> list[FoldJob]:
    """The folds of a cross-validation grouped by source (see :func:`grouped_folds`), as jobs.

    Only the held-out runs in the set ``scored`` are scored (:func:`scored_splits`); a fold with none is left out.
    """
    cache = None if cache_dir is None else str(cache_dir)
    return [
        FoldJob(fold, n_folds, train, test, tuple(fractions), dict(fit_options or {}), seed, quantity, cache)
        for fold, train, test in scored_splits(runs, sources, n_folds, seed, scored)
    ]


def cross_validate(
    runs: Sequence[RunLog],
    sources: Mapping[str, str],
    *,
    n_folds: int = 5,
    fractions: Sequence[float] = EVALUATION_FRACTIONS,
    fit_options: Mapping[str, Any] | None = None,
    seed: int = 0,
    quantity: Quantity = "window",
    n_jobs: int | None = 1,
    cluster: str | None = None,
    progress: bool = True,
    cache_dir: str | Path | None = None,
    scored: ScoredSet = "all",
) -> CrossValidation:
    """Cross-validate forecasts with folds grouped by source: no source is on both sides of a fold.

    Parameters
    ----------
    runs : sequence of RunLog
        Complete runs.
    sources : mapping
        ``run_id -> source`` (see :func:`load_evaluation_runs`).
    n_folds : int
        Number of folds.
    fractions : sequence of float
        Observed shares of the planned steps.
    fit_options : mapping, optional
        Keyword arguments of :func:`bayes_grpo.fit` for every fold (e.g. ``draws``, ``tune``).
    seed : int
        Seed of the fold layout, the fits (``seed + fold``) and the forecasts.
    quantity : {"window", "final"}
        What is scored (module docstring).
    n_jobs, cluster, progress
        Passed to :func:`bayes_grpo.parallel.map_jobs`: folds run on ``n_jobs``
        local processes (default 1: each fit already uses every core for its
        chains), or on a Dask cluster.
    cache_dir : path-like, optional
        Folder of cached fold fits (:func:`cached_fit_fold`): a rerun with the same
        model code, runs, sampler settings and seed skips the fits and only scores the
        forecasts. The stopping backtest (:func:`evaluation.backtest.backtest`) splits the
        same runs into the same folds with the same fit seeds, so the two share entries.
    scored : {"all", "real", "bundled"}
        Which held-out runs are scored (:func:`scored_runs`). The folds still train on
        every run, so the fits (and cache entries) are those of a full cross-validation;
        ``"real"`` scores the others' runs only, a fraction of the time when the fits are cached.

    Returns
    -------
    CrossValidation
        ``scores`` (rows of :func:`evaluate_run` plus ``fold``, ``source`` and
        ``set`` = "real" / "bundled") and ``folds`` (one row of fit health per fold,
        ``cached`` saying whether it came from the cache).

    Raises
    ------
    BayesGrpoError
        Bad ``n_folds`` (see :func:`grouped_folds`), an unknown ``scored`` set, or no run in it.

    Example
    -------
    >>> runs, sources = load_evaluation_runs()  # doctest: +SKIP
    >>> cv = cross_validate(runs, sources, n_folds=5, fit_options={"draws": 300, "tune": 300})  # doctest: +SKIP
    >>> summarise(cv.scores)  # doctest: +SKIP
    """
    jobs = fold_jobs(
        runs, sources, n_folds, fractions=fractions, fit_options=fit_options, seed=seed, quantity=quantity, cache_dir=cache_dir, scored=scored
    )  # fmt: skip
    results = map_jobs(run_fold, jobs, n_jobs=n_jobs, cluster=cluster, progress=progress, desc="calibration folds")
    scores = pd.concat([s for s, _, _ in results], ignore_index=True)
    scores["source"] = scores["run_id"].map(sources)
    scores["set"] = np.where(scores["source"].map(is_bundled), "bundled", "real")
    return CrossValidation(scores=scores, folds=pd.DataFrame([h for _, h, _ in results]), jobs=jobs, models=[m for _, _, m in results])


# ------------------------------------------------------------------ the calibration layer, cross-fitted


def learn_layer(scores: pd.DataFrame, fit_id: str = "") -> recalibration.Recalibration:
    """The calibration layer learned from held-out forecasts of real runs, each source counting as at most :data:`SOURCE_CAP` runs."""
    real = scores[scores["set"] == "real"] if "set" in scores else scores
    weights = source_weights(real, by=["fraction"]) if "source" in real else None
    learned_on = {"rows": int(len(real)), "runs": int(real["run_id"].nunique()), "fractions": sorted(set(real["fraction"].round(3)))}
    if "source" in real:
        learned_on["sources"] = int(real["source"].nunique())
    return recalibration.learn(real, fit_id=fit_id, weights=weights, learned_on=learned_on)


def _other_folds_layer(cv: CrossValidation, fold: int) -> recalibration.Recalibration:
    """The layer a fold's model forecasts with when judged honestly: learned on the other folds' held-out real runs."""
    return learn_layer(cv.scores[cv.scores["fold"] != fold])


def _calibrated_fold(job: tuple[FoldJob, FittedModel, recalibration.Recalibration]) -> pd.DataFrame:
    fold, model, layer = job
    layered = dataclasses.replace(model, recalibration=layer)
    return evaluate(layered, fold.test, fold.fractions, seed=fold.seed, quantity=fold.quantity, calibrated=True).assign(fold=fold.fold)


def cross_fitted(cv: CrossValidation, *, n_jobs: int | None = 1, cluster: str | None = None, progress: bool = True) -> pd.DataFrame:
    """The held-out runs forecast again with a calibration layer, honestly: each fold's model gets a layer learned on
    the *other* folds' held-out real runs (:func:`learn_layer`), so no run is scored by a layer that saw it.

    Returns scores like :attr:`CrossValidation.scores` (same ``source`` and ``set`` columns).
    """
    jobs = [(job, model, _other_folds_layer(cv, job.fold)) for job, model in zip(cv.jobs, cv.models)]
    parts = map_jobs(_calibrated_fold, jobs, n_jobs=n_jobs, cluster=cluster, progress=progress, desc="calibrated folds")
    scores = pd.concat(parts, ignore_index=True)
    scores["source"] = scores["run_id"].map(dict(zip(cv.scores["run_id"], cv.scores["source"])))
    scores["set"] = np.where(scores["source"].map(is_bundled), "bundled", "real")
    return scores


def declared_range(run: RunLog) -> RunLog | None:
    """``run`` with its 0-or-k rewards' range declared, ``reward_range=(0, k)`` (``k`` inferred from its whole log,
    :func:`bayes_grpo.prepare.reward_ceiling`, to one decimal: a 0/1 reward declares (0, 1));
    None for a run whose rewards are not 0-or-k or that declares a range already."""
    if run.reward_range is not None:
        return None
    ceiling = prepare_run(run, require_total=False).reward_ceiling
    return None if ceiling is None else run.with_meta(reward_range=(0.0, round(ceiling, 1)))


def with_declared_ranges(cv: CrossValidation, *, n_jobs: int | None = 1, cluster: str | None = None, progress: bool = True) -> pd.DataFrame:
    """The held-out real runs with 0-or-k rewards forecast again with that range declared (:func:`declared_range`), each
    by its fold's model and the layer learned on the other folds, as :func:`cross_fitted` forecasts them: is a forecast
    within a declared range as calibrated as one within the same range inferred, or one without?"""
    sources = dict(zip(cv.scores["run_id"], cv.scores["source"]))
    jobs = []
    for job, model in zip(cv.jobs, cv.models):
        real = (run for run in job.test if not is_bundled(sources.get(run.run_id, BUNDLED_SOURCE)))
        declared = tuple(d for d in map(declared_range, real) if d is not None)
        if declared:
            jobs.append((dataclasses.replace(job, test=declared), model, _other_folds_layer(cv, job.fold)))
    if not jobs:
        return pd.DataFrame()
    parts = map_jobs(_calibrated_fold, jobs, n_jobs=n_jobs, cluster=cluster, progress=progress, desc="declared ranges")
    scores = pd.concat(parts, ignore_index=True)
    scores["source"], scores["set"] = scores["run_id"].map(sources), "real"
    return scores


# ------------------------------------------------------------------ summaries


def source_weights(frame: pd.DataFrame, by: Sequence[str] = (), cap: float = SOURCE_CAP) -> pd.Series:
    """Weight of each row when every source counts as at most ``cap`` runs: ``min(1, cap / n)``.

    ``n`` is the number of rows of the row's ``source`` within its ``by`` group (one row
    per run and group, as in a summary per observed fraction or per rule), so a source
    of 17 runs weighs 3 in all and a source of 1 to 3 runs weighs what it has. A sweep
    of many runs of one recipe then cannot outvote many single runs of other recipes.

    Parameters
    ----------
    frame : pandas.DataFrame
        Rows with a ``source`` column.
    by : sequence of str
        Grouping columns the counts are taken within (NaN is a group of its own).
    cap : float
        Most runs a source counts as (positive).

    Returns
    -------
    pandas.Series
        One weight in (0, 1] per row, on ``frame``'s index.

    Raises
    ------
    BayesGrpoError
        No ``source`` column, or a cap that is not positive.

    Example
    -------
    >>> frame = pd.DataFrame({"source": ["sweep"] * 6 + ["a", "b"]})
    >>> source_weights(frame).tolist()
    [0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 1.0, 1.0]
    """
    if "source" not in frame:
        raise BayesGrpoError("source-capped figures need a 'source' column (cross_validate's scores have one)")
    if not cap > 0:
        raise BayesGrpoError(f"the source cap must be positive, got {cap!r}")
    counts = frame.groupby([*by, "source"], dropna=False)["source"].transform("size")
    return np.minimum(1.0, cap / counts.astype(float))


def _weights(frame: pd.DataFrame, by: Sequence[str], source_cap: float | None) -> pd.Series:
    """All ones (run-weighted), or :func:`source_weights` within the ``by`` groups."""
    if source_cap is None:
        return pd.Series(1.0, index=frame.index)
    return source_weights(frame, by, source_cap)


def _mean(values: pd.Series, weights: pd.Series) -> float:
    return float(np.average(values.astype(float), weights=weights))


def summarise(scores: pd.DataFrame, by: Sequence[str] = ("fraction",), *, source_cap: float | None = None) -> pd.DataFrame:
    """Means, coverages and shares of the scores, one row per ``by`` group (default: per observed fraction).

    Parameters
    ----------
    scores : pandas.DataFrame
        Rows of :func:`evaluate_run` (and a ``source`` column for ``source_cap``).
    by : sequence of str
        Grouping columns.
    source_cap : float, optional
        Count each source as at most this many runs within a group (:func:`source_weights`;
        :data:`SOURCE_CAP` is the benchmark's): every mean, share and median is then
        weighted. None (default): every run counts once.

    Returns
    -------
    pandas.DataFrame
        Columns ``runs, weight, error, persistence, paper_law, ratio_to_persistence,
        coverage_90, coverage_50, above_q95, below_q05, width_90_median,
        quantile_score, change_after_cut, ess_median`` and, for forecasts that
        report it, ``pareto_k_above_0.7`` (share of forecasts with unreliable weights).
        ``weight`` is the runs the group counts as (``runs`` without a cap).

    Raises
    ------
    BayesGrpoError
        ``source_cap`` without a ``source`` column.

    Example
    -------
    >>> real = cv.scores[cv.scores["set"] == "real"]  # doctest: +SKIP
    >>> summarise(real), summarise(real, source_cap=SOURCE_CAP)  # doctest: +SKIP
    """
    weights = _weights(scores, by, source_cap)
    rows = []
    for key, part in scores.groupby(list(by)):
        w = weights.loc[part.index]
        row = {
            **dict(zip(by, key)),
            "runs": len(part),
            "weight": float(w.sum()),
            "error": _mean(part["error"], w),
            **({"mean_error": _mean(part["mean_error"], w)} if "mean_error" in part else {}),
            "persistence": _mean(part["persistence_error"], w),
            "paper_law": _mean(part["paper_law_error"], w),
            "coverage_90": _mean(part["covered_90"], w),
            "coverage_50": _mean(part["covered_50"], w),
            "above_q95": _mean(part["above_q95"], w),
            "below_q05": _mean(part["below_q05"], w),
            "width_90_median": measures.weighted_quantile(part["width_90"], 0.5, w),
            "quantile_score": _mean(part["quantile_score"], w),
            "change_after_cut": _mean(part["change_after_cut"], w),
            "ess_median": measures.weighted_quantile(part["ess"], 0.5, w),
        }
        if "pareto_k" in part:
            row["pareto_k_above_0.7"] = _mean(part["pareto_k"] > PARETO_K_MAX, w)
        rows.append(row)
    table = pd.DataFrame(rows)
    if len(table):
        table.insert(list(table.columns).index("persistence") + 2, "ratio_to_persistence", table["error"] / table["persistence"])
    return table


def health_table(scores: pd.DataFrame, by: Sequence[str] = ("fraction",)) -> pd.DataFrame:
    """How well the forecasts' importance sampling went, one row per ``by`` group.

    Parameters
    ----------
    scores : pandas.DataFrame
        Rows of :func:`evaluate_run` (with ``ess``, ``pareto_k``, ``proposal`` and the regime weights).

    Returns
    -------
    pandas.DataFrame
        ``forecasts``; ``ess_p10`` and ``ess_median``; ``pareto_k_median``, ``pareto_k_p90`` and
        ``pareto_k_above_0.7``; the share of forecasts from each proposal (``from_prior``,
        ``from_laplace``, ``from_particles``, ``from_mcmc``); and the mean regime weights (``p_take_off_ahead``,
        ``p_plateau``, ``p_decline``).

    Example
    -------
    >>> health_table(cv.scores[cv.scores["set"] == "real"])  # doctest: +SKIP
    """
    grouped = scores.groupby(list(by))
    table = pd.DataFrame(
        {
            "forecasts": grouped.size(),
            "ess_p10": grouped["ess"].quantile(0.1),
            "ess_median": grouped["ess"].median(),
            "pareto_k_median": grouped["pareto_k"].median(),
            "pareto_k_p90": grouped["pareto_k"].quantile(0.9),
            "pareto_k_above_0.7": grouped["pareto_k"].apply(lambda k: float(np.mean(k > PARETO_K_MAX))),
        }
    )
    for proposal in ("prior", "laplace", "particles", "mcmc"):
        table[f"from_{proposal}"] = grouped["proposal"].apply(lambda p, name=proposal: float(np.mean(p == name)))
    for column in ("p_take_off_ahead", "p_plateau", "p_decline"):
        table[column] = grouped[column].mean()
    return table.reset_index()


def hardest(scores: pd.DataFrame, *, source_cap: float | None = None) -> pd.DataFrame:
    """The rows in the top third of change after the cut, taken separately at each observed fraction.

    With ``source_cap`` the third is of the source-capped weight (:func:`source_weights`
    within each fraction; :func:`evaluation.scoring.hardest_third`), so a source of many
    runs does not decide alone where the hardest third begins.
    """
    if scores.empty:
        return scores
    weights = _weights(scores, ("fraction",), source_cap)
    mask = pd.Series(False, index=scores.index)
    for _, part in scores.groupby("fraction"):
        w = None if source_cap is None else weights.loc[part.index].to_numpy()
        mask.loc[part.index] = scoring.hardest_third(part["change_after_cut"].to_numpy(), w)
    return scores[mask]


#: Title of the source-capped summary of the real runs in :func:`summary_tables` (the benchmark's targets judge it).
REAL_CAPPED = f"real runs, source-capped (each source counts as at most {SOURCE_CAP} runs)"


def summary_tables(scores: pd.DataFrame) -> dict[str, pd.DataFrame]:
    """The summaries a calibration report shows, by title.

    Real runs run-weighted and source-capped (:data:`REAL_CAPPED`: each source counts as at
    most :data:`SOURCE_CAP` runs, the figure that says how the package does on a recipe it
    has not seen), the hardest third of the real runs both ways, the bundled runs, all runs,
    and the hardest third of all runs.

    Parameters
    ----------
    scores : pandas.DataFrame
        Scores with a ``set`` column and, for the source-capped tables, a ``source`` column
        (:func:`cross_validate`'s scores have both).

    Returns
    -------
    dict
        Title -> :func:`summarise` table; sets without rows, and source-capped tables of
        scores without sources, are left out.

    Example
    -------
    >>> for title, table in summary_tables(cv.scores).items(): print(title, table)  # doctest: +SKIP
    """
    real, bundled = scores[scores["set"] == "real"], scores[scores["set"] == "bundled"]
    hard = "real runs, hardest third (largest |final - persistence|)"
    parts = {"real runs": (real, None), hard: (hardest(real), None)}
    if "source" in scores:
        parts = {
            "real runs": (real, None), REAL_CAPPED: (real, SOURCE_CAP),
            hard: (hardest(real), None), "real runs, hardest third, source-capped": (hardest(real, source_cap=SOURCE_CAP), SOURCE_CAP),
        }  # fmt: skip
    parts |= {"bundled runs": (bundled, None), "all runs": (scores, None), "all runs, hardest third": (hardest(scores), None)}
    return {title: summarise(part, source_cap=cap) for title, (part, cap) in parts.items() if len(part)}


def by_reward_bounds(scores: pd.DataFrame, *, source_cap: float | None = SOURCE_CAP) -> pd.DataFrame:
    """The summary (:func:`summarise`) per observed fraction and :func:`reward_bounds` of the forecast: are forecasts kept
    within a declared or inferred range as calibrated as those without one? Empty for rows without ``reward_bounds``."""
    if "reward_bounds" not in scores:
        return pd.DataFrame()
    return summarise(scores, by=("reward_bounds", "fraction"), source_cap=source_cap)


def by_signal_third(scores: pd.DataFrame, *, source_cap: float | None = SOURCE_CAP) -> pd.DataFrame:
    """Share of truths above q95 and 90% coverage per observed fraction in each third of ``std_rel`` (runs without
    ``reward_std`` apart), source-capped: where the learning signal says the future is open, are the intervals wide enough?"""
    rows = []
    for fraction, part in scores.groupby("fraction"):
        weights = source_weights(part) if source_cap is not None and "source" in part else pd.Series(1.0, index=part.index)
        log_rel = np.log(part["std_rel"].where(part["std_rel"] > 0))
        known = log_rel.notna()
        edges = [weighted_quantile(log_rel[known], q, weights[known]) for q in (1 / 3, 2 / 3)]
        third = np.where(~known, "no reward_std", np.select([log_rel <= edges[0], log_rel <= edges[1]], ["low", "middle"], "high"))
        for name in ("low", "middle", "high", "no reward_std"):
            mask = third == name
            if mask.any():
                w = weights[mask]
                rows.append({
                    "fraction": fraction, "std_rel third": name, "runs": int(mask.sum()), "weight": float(w.sum()),
                    "above_q95": _mean(part.loc[mask, "above_q95"], w), "coverage_90": _mean(part.loc[mask, "covered_90"], w),
                    "quantile_score": _mean(part.loc[mask, "quantile_score"], w),
                })  # fmt: skip
    return pd.DataFrame(rows)


#: Plan lengths (steps) at which :func:`by_plan_length` splits the runs: short sweeps, the common 61-300, long plans.
PLAN_LENGTH_EDGES = (60, 300)


def by_plan_length(scores: pd.DataFrame, *, source_cap: float | None = SOURCE_CAP) -> pd.DataFrame:
    """:func:`summarise` per observed fraction and plan length (:data:`PLAN_LENGTH_EDGES`), with the weighted median of
    (truth - forecast median) / spread (``median_miss``, positive where the forecast is low).
    Progress is a share of the plan, but a rise takes steps: are short plans forecast as well as long ones?"""
    low, high = PLAN_LENGTH_EDGES
    names = (f"up to {low}", f"{low + 1}-{high}", f"over {high}")
    plan = scores["total_steps"].astype(float)
    by = ["fraction", "plan (steps)"]
    labelled = scores.assign(**{by[1]: np.select([plan <= low, plan <= high], names[:2], names[2])})
    table = summarise(labelled, by, source_cap=source_cap)
    weights = _weights(labelled, by, source_cap)
    miss = (labelled["truth"] - labelled["q50"]) / labelled["spread"]
    table["median_miss"] = [weighted_quantile(miss[part.index], 0.5, weights[part.index]) for _, part in labelled.groupby(by)]
    table = table.sort_values(["fraction", by[1]], key=lambda c: c.map(names.index) if c.name == by[1] else c, ignore_index=True)
    return table[[*by, "runs", "weight", "median_miss", "coverage_90", "above_q95", "ratio_to_persistence"]]


def upper_reach(scores: pd.DataFrame, raw: pd.DataFrame | None = None, *, source_cap: float | None = SOURCE_CAP) -> pd.DataFrame:
    """How far the upper tail reaches above the best reward logged by the cut, against how far truths went, per
    observed fraction (source-capped weighted quantiles, in units of each run's 10-90% spread).

    ``q95_above_best``: (q95 - best logged reward at the cut) / spread; ``truth_above_best``: the same for the truth.
    A q95 far above every truth's reach is width that buys no coverage: the sharpness cost of the upper tail.
    """
    rows = []
    for fraction, part in scores.groupby("fraction"):
        weights = _weights(part, (), source_cap if "source" in part else None)
        spread = part["spread"]
        truth = (part["truth"] - part["best_logged"]) / spread
        q95 = (part["q95"] - part["best_logged"]) / spread
        row = {"fraction": fraction, "runs": len(part), "truth_above_best_q50": weighted_quantile(truth, 0.5, weights),
               "truth_above_best_q95": weighted_quantile(truth, 0.95, weights), "truth_above_best_max": float(truth.max()),
               "q95_above_best_q50": weighted_quantile(q95, 0.5, weights), "q95_above_best_q90": weighted_quantile(q95, 0.9, weights)}  # fmt: skip
        if raw is not None:  # the raw model's forecasts of the same runs (the same sources, so the same weights)
            same = raw[(raw["fraction"] == fraction) & raw["run_id"].isin(part["run_id"])]
            same_weights = _weights(same, (), source_cap if "source" in same else None)
            row["raw_q95_above_best_q50"] = weighted_quantile((same["q95"] - same["best_logged"]) / same["spread"], 0.5, same_weights)
        rows.append(row)
    return pd.DataFrame(rows)


def calibration_figure(scores: pd.DataFrame) -> Figure:
    """Coverage of the 90% and 50% intervals (targets shaded) and mean error against the baselines, by observed fraction.

    Parameters
    ----------
    scores : pandas.DataFrame
        Scores with a ``set`` column (from :func:`cross_validate`).

    Returns
    -------
    matplotlib.figure.Figure
        Three panels: 90% coverage, 50% coverage (real runs, their hardest third, bundled runs),
        and mean error of the forecast, persistence and the paper law (real runs).

    Example
    -------
    >>> calibration_figure(cv.scores).savefig("calibration.png")  # doctest: +SKIP
    """
    import matplotlib.pyplot as plt

    tables = summary_tables(scores)
    if any(title.startswith(("real", "bundled")) for title in tables):
        tables = {title: table for title, table in tables.items() if not title.startswith("all")}
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6), layout="constrained")
    for ax, column, band in ((axes[0], "coverage_90", (0.85, 0.95)), (axes[1], "coverage_50", (0.40, 0.60))):
        ax.axhspan(*band, color="C2", alpha=0.15, lw=0, label="target")
        for i, (title, table) in enumerate(tables.items()):
            ax.plot(table["fraction"], table[column], "o-", color=f"C{i}", label=title.split(" (")[0])
        ax.set_ylim(0, 1.02)
        ax.set_title(column.replace("_", " ") + "%", fontsize=10)
        ax.set_xlabel("observed share of the planned steps")
    axes[0].legend(fontsize=7, loc="lower right")
    first = next(iter(tables))
    table = tables[first]
    for column, style in (("error", "o-"), ("persistence", "s--"), ("paper_law", "^:")):
        axes[2].plot(table["fraction"], table[column], style, label=column.replace("_", " "))
    axes[2].set_title(f"mean error / spread ({first})", fontsize=10)
    axes[2].set_xlabel("observed share of the planned steps")
    axes[2].legend(fontsize=7)
    return fig

