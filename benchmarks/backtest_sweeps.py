"""Sweep pruning on the shared real sweeps: bayes_grpo's ForecastPruner against Optuna's pruners.

A sweep is the shared runs of one ``source_repo``, one ``dataset`` and one planned length
``total_steps`` (``index.csv``), at least three of them. Each sweep is replayed as an Optuna study
(in-memory storage, direction "maximize"): one trial per run, in a random order (one order per
seed), each trial reporting the run's logged mean reward step by step with ``trial.report`` and
asking ``trial.should_prune()`` after every report; a pruned trial stops there, a finished one
reports its final reward (mean over its last 10% of logged steps) as the objective. Every pruner
sees the same orders.

The model that prunes a sweep was fitted without any run of its source: the runs (bundled and
shared, as ``benchmarks/calibration.py`` loads them) are split into the same source-grouped folds
(``evaluation.calibration.grouped_splits``, 5 folds, seed 0) with the same fit seeds, so with
``--cache`` the fold fits of the calibration benchmark are read instead of refitted.

The ForecastPruner and ``rank`` treat each sweep as one source: its runs are coupled by a
``bayes_grpo.sweeps.SweepCoupling`` measured (``benchmarks/sweep_coupling.py``) from the calibration
benchmark's held-out forecasts of the other sources, never the sweep's own.

The project's own held-out sweeps (``data/sweeps``, e.g. the learning-rate sweep) are replayed the
same way with the shipped model (fitted without them) and reported apart, below the headline
(``--no-bundled`` leaves them out).

Scores per pruner, over the replays (sweeps x seeds), with each run's truth its smoothed final
reward (``bayes_grpo.measures.smoothed`` at its last step, kernel SD 8% of its steps):

* **steps saved**: share of the sweep's logged steps not run;
* **best pruned**: share of replays in which the truly best run was pruned;
* **regret**: (truth of the best run - truth of the best surviving run) / the sweep's reward
  spread (10-90% of all its runs' logged rewards); the share of replays with regret <= 0.05.

Also: the reliability of ``p_best`` from ``bayes_grpo.rank`` (every run of a sweep cut at 20, 30,
50 and 70% of the plan, as a sweep run in parallel is; outcome: the run ends best), the reliability
of the pruner's own P(final > bar) at its checks, and timings (``model.rank`` on 20 runs of 1,000
steps, ``should_prune`` at the checks). Writes ``backtest_sweeps.md``, ``backtest_sweeps.csv``
(per pruner), ``backtest_sweeps_replays.csv`` (per replay) and ``backtest_sweeps_checks.csv`` (the
pruner's checks) to ``benchmarks/results/``.

    python benchmarks/backtest_sweeps.py --cache /work/cache/folds            # 10 orders per sweep, checks every 5% of the plan
    python benchmarks/backtest_sweeps.py --seeds 3 --out /tmp/sweeps          # a quick look
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import optuna
import pandas as pd
from common import RESULTS, fit_options, markdown, package_code, provenance, verdict
from rank_speed import measure as measure_rank_speed
from rank_speed import synthetic_sweep
from scipy.stats import binomtest

import bayes_grpo as bg
from bayes_grpo import measures
from bayes_grpo.integrations.optuna import ForecastPruner
from bayes_grpo.parallel import map_jobs
from bayes_grpo.sweeps import FORECAST_ALONE, SweepCoupling
from evaluation import calibration
from sweep_coupling import normal_scores

MIN_SWEEP_RUNS = 3
#: Shares of the plan at which every run of a sweep is cut to score p_best.
RANK_FRACTIONS = (0.2, 0.3, 0.5, 0.7)
#: Reliability bins of p_best and of the pruner's P(final > bar).
BINS = (0.0, 0.05, 0.2, 0.5, 1.0)


@dataclass(frozen=True)
class Sweep:
    """Runs of one source, recipe and planned length, and the fold model fitted without that source."""

    name: str
    source: str
    total_steps: int
    runs: tuple[bg.RunLog, ...]
    model: bg.FittedModel
    fold: int
    coupling: SweepCoupling | None = None  # None: the model's own (FittedModel.sweep_coupling)
    bundled: bool = False

    def truths(self) -> dict[str, float]:
        """Each run's smoothed final reward."""
        return {run.run_id: float(measures.smoothed(run.steps, run.rewards)[-1]) for run in self.runs}

    def spread(self) -> float:
        """10-90% spread of all the sweep's logged rewards."""
        return measures.reward_spread(np.concatenate([run.rewards for run in self.runs]))


def find_sweeps(runs: Sequence[bg.RunLog], index: pd.DataFrame) -> list[tuple[str, str, int, list[bg.RunLog]]]:
    """``(name, source, total_steps, runs)`` of every group of at least :data:`MIN_SWEEP_RUNS` shared runs of one source, dataset and planned length."""
    by_id = {run.run_id: run for run in runs}
    index = index.dropna(subset=["total_steps"]).loc[lambda t: t["run_id"].isin(by_id)]
    found = []
    for (source, dataset, total), group in index.groupby(["source_repo", "dataset", "total_steps"]):
        if len(group) >= MIN_SWEEP_RUNS:
            found.append((f"{source} ({dataset}, {int(total)} steps)", str(source), int(total), [by_id[r] for r in sorted(group["run_id"])]))
    return found


#: The baseline the targets name: Optuna's MedianPruner with 2 startup trials and a warm-up of 30% of the plan.
MEDIAN_2_30 = "Optuna MedianPruner (2 startup trials, 30% warm-up)"
#: A p_best bin is judged when it holds at least this many check points; its realised share must be within :data:`P_BEST_TOLERANCE`.
P_BEST_MIN_COUNT = 20
P_BEST_TOLERANCE = 0.1

#: The ForecastPruner settings replayed: the defaults first (the targets are judged on them).
DEFAULTS = "bayes_grpo ForecastPruner (defaults: on MedianPruner with 2 startup trials and 30% warm-up, veto 0.12; its own rule: threshold 0.05 from 30%, patience 2)"
FORECAST_VARIANTS = {
    DEFAULTS: {},
    "bayes_grpo ForecastPruner on MedianPruner, veto 0.2": {"veto": 0.2},
    "bayes_grpo ForecastPruner on MedianPruner, veto 0.14": {"veto": 0.14},
    "bayes_grpo ForecastPruner on MedianPruner, veto 0.1": {"veto": 0.1},
    "bayes_grpo ForecastPruner on MedianPruner, veto 0.05": {"veto": 0.05},
    "bayes_grpo ForecastPruner alone (base=None: threshold 0.05, from 30%, patience 2)": {"base": None},
    "bayes_grpo ForecastPruner alone, from 50% (base=None, min_fraction=0.5)": {"base": None, "min_fraction": 0.5},
    "bayes_grpo ForecastPruner alone, patience 1 (base=None, patience=1)": {"base": None, "patience": 1},
    "bayes_grpo ForecastPruner alone, forecast alone, patience 1 (base=None, coupling=FORECAST_ALONE, patience=1)": {"base": None, "coupling": FORECAST_ALONE, "patience": 1},
}


def pruners(total_steps: int, model: bg.FittedModel, check_interval: float, coupling: SweepCoupling | None = None) -> dict[str, Callable[[], optuna.pruners.BasePruner]]:
    """Name -> a fresh pruner for one replay of a sweep planned for ``total_steps`` (``coupling``: the ForecastPruner's
    sweep coupling where its variant does not name one)."""
    warmup = int(round(0.3 * total_steps))
    made: dict[str, Callable[[], optuna.pruners.BasePruner]] = {
        name: (lambda options=options: RecordingPruner(model, **{"check_interval": check_interval, "coupling": coupling, **options}))
        for name, options in FORECAST_VARIANTS.items()
    }
    made.update({
        "Optuna MedianPruner (defaults: 5 startup trials, no warm-up)": lambda: optuna.pruners.MedianPruner(),
        "Optuna MedianPruner (5 startup trials, 30% warm-up)": lambda: optuna.pruners.MedianPruner(n_warmup_steps=warmup),
        MEDIAN_2_30: lambda: optuna.pruners.MedianPruner(n_startup_trials=2, n_warmup_steps=warmup),
        "Optuna PatientPruner (MedianPruner with 2 startup trials, 30% warm-up; patience 5)": lambda: optuna.pruners.PatientPruner(
            optuna.pruners.MedianPruner(n_startup_trials=2, n_warmup_steps=warmup), patience=5
        ),
        "Optuna PercentilePruner (keep the top 25%; 5 startup trials, 30% warm-up)": lambda: optuna.pruners.PercentilePruner(25.0, n_warmup_steps=warmup),
        "Optuna SuccessiveHalvingPruner (defaults)": lambda: optuna.pruners.SuccessiveHalvingPruner(),
        "Optuna HyperbandPruner (defaults)": lambda: optuna.pruners.HyperbandPruner(),
        "no pruning": lambda: optuna.pruners.NopPruner(),
    })  # fmt: skip
    return made


class RecordingPruner(ForecastPruner):
    """A ForecastPruner that keeps every check: trial number, step, P(final > bar), bar, seconds."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.checks: list[dict] = []

    def beat_probability(self, study: optuna.Study, trial: optuna.trial.FrozenTrial, force: bool = False) -> tuple[float, float] | None:
        started = time.perf_counter()
        result = super().beat_probability(study, trial, force=force)
        if result is not None:
            self.checks.append({"number": trial.number, "step": trial.last_step, "p_beats": result[0], "bar": result[1], "seconds": time.perf_counter() - started})
        return result


@dataclass(frozen=True)
class ReplayJob:
    """One sweep replayed in one order by one pruner."""

    sweep: Sweep
    seed: int
    pruner: str
    check_interval: float

    @property
    def name(self) -> str:
        return f"{self.sweep.name}, seed {self.seed}, {self.pruner}"


def replay(job: ReplayJob) -> tuple[list[dict], list[dict]]:
    """Replay the sweep as an Optuna study: one row per trial, and the ForecastPruner's checks (with the seconds of each should_prune)."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warnings.simplefilter("ignore")
    sweep = job.sweep
    pruner = pruners(sweep.total_steps, sweep.model, job.check_interval, sweep.coupling)[job.pruner]()
    # Named, so the replay is reproducible: HyperbandPruner assigns a trial's bracket from a hash of the study's name
    # (a random one when unnamed, which moved its steps saved from 0.230 to 0.240 between two runs of this script).
    study = optuna.create_study(
        study_name=job.name, direction="maximize", pruner=pruner, sampler=optuna.samplers.RandomSampler(seed=job.seed)
    )
    order = np.random.default_rng(job.seed).permutation(len(sweep.runs))
    trials, timings = [], {}
    for position, index in enumerate(order):
        run = sweep.runs[index]
        trial = study.ask()
        trial.set_user_attr("total_steps", sweep.total_steps)
        stopped = None
        for step, reward in zip(run.steps, run.rewards):
            trial.report(float(reward), int(step))
            started = time.perf_counter()
            prune = trial.should_prune()
            timings[(trial.number, int(step))] = time.perf_counter() - started
            if prune:
                stopped = int(step)
                study.tell(trial, state=optuna.trial.TrialState.PRUNED)
                break
        if stopped is None:
            study.tell(trial, measures.final_reward(run.rewards))
        trials.append({"position": position, "number": trial.number, "run_id": run.run_id, "pruned": stopped is not None,
                       "steps_run": stopped if stopped is not None else int(run.last_step), "last_step": int(run.last_step)})  # fmt: skip
    checks = getattr(pruner, "checks", [])
    run_of = {t["number"]: t["run_id"] for t in trials}
    for check in checks:
        check["run_id"] = run_of[check["number"]]
        check["should_prune_seconds"] = timings[(check["number"], int(check["step"]))]
    keys = {"sweep": sweep.name, "seed": job.seed, "pruner": job.pruner}
    return [{**keys, **t} for t in trials], [{**keys, **c} for c in checks]


def score_replays(trials: pd.DataFrame, sweeps: Sequence[Sweep]) -> pd.DataFrame:
    """One row per replay (sweep, seed, pruner): steps saved, whether the best run was pruned, regret."""
    truths = {s.name: s.truths() for s in sweeps}
    spreads = {s.name: s.spread() for s in sweeps}
    rows = []
    for (sweep, seed, pruner), part in trials.groupby(["sweep", "seed", "pruner"], sort=False):
        truth = truths[sweep]
        best = max(truth, key=truth.get)
        survivors = part.loc[~part["pruned"], "run_id"]
        best_surviving = max((truth[r] for r in survivors), default=min(truth.values()))
        rows.append({
            "sweep": sweep, "seed": seed, "pruner": pruner, "runs": len(part), "pruned_runs": int(part["pruned"].sum()),
            "steps_saved": 1.0 - part["steps_run"].sum() / part["last_step"].sum(),
            "best_pruned": bool(part.loc[part["run_id"] == best, "pruned"].iloc[0]),
            "regret": (truth[best] - best_surviving) / spreads[sweep],
        })  # fmt: skip
    return pd.DataFrame(rows)


def summary(replays: pd.DataFrame) -> pd.DataFrame:
    """Per pruner, over all replays: mean steps saved, best-pruned rate, regret (median, share <= 0.05, worst)."""
    rows = []
    for pruner, part in replays.groupby("pruner", sort=False):
        rows.append({
            "pruner": pruner, "replays": len(part), "steps saved": part["steps_saved"].mean(), "best pruned": part["best_pruned"].mean(),
            "regret median": part["regret"].median(), "regret <= 0.05": (part["regret"] <= 0.05).mean(), "regret worst": part["regret"].max(),
        })  # fmt: skip
    return pd.DataFrame(rows)


def per_sweep(replays: pd.DataFrame) -> pd.DataFrame:
    """Per sweep and pruner: mean steps saved, best-pruned rate, mean regret."""
    grouped = replays.groupby(["sweep", "pruner"], sort=False)
    return grouped.agg(steps_saved=("steps_saved", "mean"), best_pruned=("best_pruned", "mean"), regret_mean=("regret", "mean")).reset_index()


def still_to_come(run: bg.RunLog, head: bg.RunLog) -> bool:
    """Whether ``head`` stops before the final window its truth is measured on (as the calibration benchmark scores a cut)."""
    return head.last_step < run.steps[-measures.final_window_size(len(run))]


def rank_checks(sweeps: Sequence[Sweep], seed: int) -> pd.DataFrame:
    """p_best of every run of every sweep with all its runs cut at each of :data:`RANK_FRACTIONS`, and whether it ends best.

    A run whose log already reaches its final window at the cut has nothing left to rank (its current reward is its
    truth: runs that logged a small part of their plan), so it is left out of that cut, as the calibration benchmark
    leaves such cuts out; a sweep keeps a cut while :data:`MIN_SWEEP_RUNS` of its runs have their end still to come.
    """
    rows = []
    for sweep in sweeps:
        for fraction in RANK_FRACTIONS:
            cuts = [(run, measures.cut(run, fraction, sweep.total_steps)) for run in sweep.runs]
            heads = [head for run, head in cuts if still_to_come(run, head)]
            if len(heads) < MIN_SWEEP_RUNS:
                continue
            truth = {run_id: value for run_id, value in sweep.truths().items() if run_id in {head.run_id for head in heads}}
            best = max(truth, key=truth.get)
            ranking = sweep.model.rank(heads, total_steps=sweep.total_steps, seed=seed, coupling=sweep.coupling)
            table = ranking.table.set_index("run_id")
            current = {head.run_id: float(measures.smoothed(head.steps, head.rewards)[-1]) for head in heads}
            rows += [{"sweep": sweep.name, "fraction": fraction, "run_id": r, "p_best": float(table.loc[r, "p_best"]), "best": r == best,
                      "rank_position": int(table.index.get_loc(r)), "q50": float(table.loc[r, "q50"]), "current": current[r], "truth": truth[r]}
                     for r in ranking.run_ids]  # fmt: skip
    return pd.DataFrame(rows)


#: Shares of the plan at which rank's order is set against the current-reward order (judged at 30% and 50%).
ORDER_FRACTIONS = (0.2, 0.3, 0.5)


def agreement(score: pd.Series, truth: pd.Series) -> tuple[float, bool]:
    """How an order by ``score`` (higher first) agrees with the true finals ``truth`` of the same runs: Kendall tau, and
    whether its top pick ends best."""
    from scipy.stats import kendalltau

    return float(kendalltau(score, truth).statistic), bool(truth.to_numpy()[np.argmax(score.to_numpy())] == truth.max())


def order_agreement(ranks: pd.DataFrame) -> pd.DataFrame:
    """Per share of the plan, over the sweeps: mean Kendall tau against the true final order and top-1 hits, of rank's
    order (its table, best first) and of the order of the smoothed current reward (what the median pruner compares)."""
    rows = []
    for fraction in ORDER_FRACTIONS:
        part = ranks[np.isclose(ranks["fraction"], fraction)]
        for order, score in (("rank (its table order)", lambda g: -g["rank_position"]), ("current smoothed reward", lambda g: g["current"])):
            taus, hits = [], []
            for _, sweep in part.groupby("sweep"):
                tau, hit = agreement(score(sweep), sweep["truth"])
                taus.append(tau)
                hits.append(hit)
            rows.append({"fraction": fraction, "order": order, "sweeps": len(taus), "kendall_tau": float(np.mean(taus)), "top1_hits": int(sum(hits))})
    return pd.DataFrame(rows)


def discordant_pairs(ranks: pd.DataFrame) -> pd.DataFrame:
    """Per share of the plan, the pairs of runs of one sweep that rank's order and the current-reward order put the
    other way round, how many of them each order gets right, and a two-sided sign test of the difference.

    A tau averaged over 4-5 sweeps hides how few pairs decide it: only where the two orders differ can either be
    better, and a pair whose truths tie to the printed digits still counts for one of them."""
    rows = []
    for fraction in ORDER_FRACTIONS:
        rank_right = current_right = 0
        for _, sweep in ranks[np.isclose(ranks["fraction"], fraction)].groupby("sweep"):
            position, current, truth = (sweep[column].to_numpy() for column in ("rank_position", "current", "truth"))
            for i, j in zip(*np.triu_indices(len(sweep), k=1)):
                rank_says, current_says, truth_says = position[i] < position[j], current[i] > current[j], truth[i] > truth[j]
                if rank_says != current_says:
                    rank_right += int(rank_says == truth_says)
                    current_right += int(current_says == truth_says)
        pairs = rank_right + current_right
        rows.append({"fraction": fraction, "discordant_pairs": pairs, "rank_right": rank_right, "current_right": current_right,
                     "sign_test_p": binomtest(rank_right, pairs).pvalue if pairs else float("nan")})  # fmt: skip
    return pd.DataFrame(rows)


#: rank's Monte Carlo seeds at which its order is measured again (the headline's seed among them).
ORDER_SEEDS = 4


def order_by_seed(sweeps: Sequence[Sweep], seed: int, first: pd.DataFrame) -> pd.DataFrame:
    """rank's Kendall tau and top-1 hits over the real sweeps at :data:`ORDER_SEEDS` seeds (``first``: the rank checks
    at ``seed``, already made): their mean and SD per share of the plan, the part of a tau difference that is rank's
    own Monte Carlo noise rather than the sweeps'."""
    real = [sweep for sweep in sweeps if not sweep.bundled]
    tables = [order_agreement(first[first["sweep"].isin({s.name for s in real})])]
    tables += [order_agreement(rank_checks(real, seed + k)) for k in range(1, ORDER_SEEDS)]
    ranked = pd.concat(tables)
    ranked = ranked[ranked["order"] != "current smoothed reward"]
    spread = ranked.groupby("fraction").agg(
        seeds=("kendall_tau", "size"), kendall_tau_mean=("kendall_tau", "mean"), kendall_tau_sd=("kendall_tau", "std"),
        top1_hits_min=("top1_hits", "min"), top1_hits_max=("top1_hits", "max"),
    )  # fmt: skip
    return spread.reset_index()


def frontier_figure(table: pd.DataFrame, out: Path) -> None:
    """Steps saved against the best-run-pruned rate of every pruner on the real sweeps (``backtest_sweeps_frontier.png``)."""
    import matplotlib.pyplot as plt

    figure, ax = plt.subplots(figsize=(7.5, 4.5), layout="constrained")
    for i, (name, saved, pruned) in enumerate(zip(table["pruner"], table["steps saved"], table["best pruned"])):
        ours = name.startswith("bayes_grpo")
        ax.plot(saved, pruned, "o" if ours else "s", color="C1" if ours else "C0", ms=8 if name == DEFAULTS else 5)
        ax.annotate(str(i + 1), (saved, pruned), textcoords="offset points", xytext=(4, 3), fontsize=7)
    ax.set_xlabel("steps saved (share of the sweeps' logged steps)")
    ax.set_ylabel("best run pruned (share of replays)")
    ax.set_title("pruners on the shared real sweeps (orange: bayes_grpo, blue: Optuna; numbers: rows of the table)", fontsize=8)
    ax.grid(alpha=0.3)
    figure.savefig(out / "backtest_sweeps_frontier.png", dpi=110)


#: The fan chart of the results: the real sweep with the most runs, up to this many, ranked at :data:`FANS_AT` of its plan.
FANS_MAX_RUNS, FANS_AT = 8, 0.3


def fans_figure(sweeps: Sequence[Sweep], seed: int, out: Path) -> str:
    """Rank one real sweep at :data:`FANS_AT` of its plan with its fold model and draw every run's fan side by side
    (``backtest_sweeps_fans.png``); return the sweep's name."""
    sweep = max((s for s in sweeps if not s.bundled and len(s.runs) <= FANS_MAX_RUNS), key=lambda s: len(s.runs))
    heads = [measures.cut(run, FANS_AT, sweep.total_steps) for run in sweep.runs]
    ranking = sweep.model.rank(heads, total_steps=sweep.total_steps, seed=seed, coupling=sweep.coupling)
    figure = ranking.plot_fans()
    truth = sweep.truths()
    order = list(ranking.table["run_id"])
    for ax, run_id in zip(figure.axes, order):
        ax.axhline(truth[run_id], color="k", lw=0.8, ls=":")
    figure.suptitle(f"{sweep.name} at {FANS_AT:.0%} of the plan: fold model that never saw the source (dotted: the real final)", fontsize=9)
    figure.savefig(out / "backtest_sweeps_fans.png", dpi=110)
    return sweep.name


def reliability(probability: pd.Series, outcome: pd.Series) -> pd.DataFrame:
    """Per bin of :data:`BINS`: count, mean predicted probability, observed rate."""
    bins = pd.cut(probability, BINS, include_lowest=True, right=False)
    bins = bins.cat.rename_categories([f"{lo:g}-{hi:g}" for lo, hi in zip(BINS[:-1], BINS[1:])])
    table = pd.DataFrame({"bin": bins, "p": probability, "outcome": outcome.astype(float)}).groupby("bin", observed=False)
    return table.agg(count=("p", "size"), mean_predicted=("p", "mean"), observed_rate=("outcome", "mean")).reset_index()


def load_sweeps(args: argparse.Namespace) -> list[Sweep]:
    """The shared sweeps, each with the fold model fitted without its source (read from --cache when there)."""
    runs, sources = calibration.load_evaluation_runs(args.shared, bundled=True, seed=args.seed)
    found = find_sweeps(runs, calibration.shared_index(args.shared))
    if not found:
        raise SystemExit("no shared sweeps found (need ../shared/external_runs with index.csv, or --shared)")
    splits = calibration.grouped_splits(runs, sources, args.folds, args.seed)
    fold_of = {run.run_id: fold for fold, (_, test) in enumerate(splits) for run in test}
    models: dict[int, bg.FittedModel] = {}
    held_out = pd.read_csv(args.coupling_runs)
    scores = normal_scores(held_out)
    sweeps = []
    for name, source, total, members in found:
        fold = fold_of[members[0].run_id]
        if fold not in models:
            train = splits[fold][0]
            assert not any(sources[r.run_id] == source for r in train)
            fitted, cached = calibration.cached_fit_fold(train, fit_options(args.draws, args.chains), args.seed + fold, args.cache)
            # rank forecasts through a calibration layer by default: the one learned on the other folds' held-out runs
            models[fold] = dataclasses.replace(fitted, recalibration=calibration.learn_layer(held_out[held_out["fold"] != fold], fit_id=fitted.fit_id))
            print(f"fold {fold + 1}/{args.folds}: {len(train)} training runs, {'read from the cache' if cached else 'fitted'}", flush=True)
        coupling = SweepCoupling.measure(scores[scores["source"] != source])  # measured without the sweep's own source
        sweeps.append(Sweep(name, source, total, tuple(members), models[fold], fold, coupling))
    return sweeps


def load_bundled_sweeps() -> list[Sweep]:
    """The project's own held-out sweeps (``data/sweeps``), pruned by the shipped model, which was fitted without them."""
    from bayes_grpo.settings import bundled_sweep_dir

    model = bg.default_model()
    sweeps = []
    for folder in sorted(bundled_sweep_dir("lr").parent.iterdir()):
        runs = bg.load_runs(folder)
        totals = {run.total_steps for run in runs}
        if len(runs) >= MIN_SWEEP_RUNS and len(totals) == 1:
            name = f"bundled {folder.name} sweep ({runs[0].meta.extra.get('task', 'task')}, {totals.pop()} steps)"
            sweeps.append(Sweep(name, f"bundled:{folder.name}", int(runs[0].total_steps), tuple(runs), model, -1, None, bundled=True))
    return sweeps


def write(
    args: argparse.Namespace, sweeps: list[Sweep], trials: pd.DataFrame, replays: pd.DataFrame, checks: pd.DataFrame, ranks: pd.DataFrame,
    seeded_orders: pd.DataFrame, speed: dict, seconds: float,
) -> str:
    """Write the csv files and the markdown report; return the markdown."""
    bundled_names = {s.name for s in sweeps if s.bundled}
    own = replays[replays["sweep"].isin(bundled_names)]
    replays = replays[~replays["sweep"].isin(bundled_names)]
    own_ranks = ranks[ranks["sweep"].isin(bundled_names)]
    ranks = ranks[~ranks["sweep"].isin(bundled_names)]
    table = summary(replays)
    args.out.mkdir(parents=True, exist_ok=True)
    fans_name = fans_figure(sweeps, args.seed, args.out)
    table.to_csv(args.out / "backtest_sweeps.csv", index=False)
    replays.to_csv(args.out / "backtest_sweeps_replays.csv", index=False)
    trials.to_csv(args.out / "backtest_sweeps_trials.csv", index=False)
    checks.to_csv(args.out / "backtest_sweeps_checks.csv", index=False)
    ranks.to_csv(args.out / "backtest_sweeps_rank.csv", index=False)

    frontier_figure(table, args.out)
    orders = order_agreement(ranks)
    orders.to_csv(args.out / "backtest_sweeps_order.csv", index=False)
    pairs = discordant_pairs(ranks)
    baselines = table.set_index("pruner")
    ours = baselines.loc[DEFAULTS]
    median = baselines.loc[MEDIAN_2_30]
    halving = baselines.loc["Optuna SuccessiveHalvingPruner (defaults)"]
    timed = checks[checks["pruner"] == DEFAULTS]
    p_best = reliability(ranks["p_best"], ranks["best"])
    judged = p_best[p_best["count"] >= P_BEST_MIN_COUNT]
    beats = timed.dropna(subset=["p_beats"])
    p_beats = reliability(beats["p_beats"], beats["ends_above_bar"])
    sweep_rows = pd.DataFrame([{"sweep": s.name, "runs": len(s.runs), "fold": "shipped model" if s.bundled else s.fold + 1, "spread": s.spread(),
                                "best run": max(s.truths(), key=s.truths().get)} for s in sweeps])  # fmt: skip
    def order_row(fraction: float, order: str) -> pd.Series:
        return orders[np.isclose(orders["fraction"], fraction) & (orders["order"] == order)].iloc[0]

    order_verdicts = []
    for fraction in (0.3, 0.5):
        ranked, current = order_row(fraction, "rank (its table order)"), order_row(fraction, "current smoothed reward")
        order_verdicts.append(
            f"- `rank` at {fraction:.0%}: Kendall tau {ranked['kendall_tau']:.2f} and top-1 hits {ranked['top1_hits']} of {ranked['sweeps']} "
            f"against the current smoothed reward's {current['kendall_tau']:.2f} and {current['top1_hits']}: "
            f"{verdict(ranked['kendall_tau'] >= current['kendall_tau'] and ranked['top1_hits'] >= current['top1_hits'])}"
        )
    targets = [
        f"- defaults save >= 0.9x the steps of their base pruner ({MEDIAN_2_30}: {median['steps saved']:.1%}): "
        f"{ours['steps saved']:.1%}, {ours['steps saved'] / median['steps saved']:.2f}x: {verdict(ours['steps saved'] >= 0.9 * median['steps saved'])}",
        f"- defaults prune the best run in <= 5% of replays and no more often than the base pruner ({median['best pruned']:.1%}): "
        f"{ours['best pruned']:.1%}: {verdict(ours['best pruned'] <= 0.05 and ours['best pruned'] <= median['best pruned'])}",
        *order_verdicts,
        f"- `rank` of 20 runs of 1,000 steps <= 10x one forecast: {speed['rank_wall_s']:.2f} s against "
        f"{speed['reference_forecast_s']:.3f} s, {speed['rank_wall_s'] / speed['reference_forecast_s']:.1f}x: "
        f"{verdict(speed['rank_wall_s'] <= 10 * speed['reference_forecast_s'])}",
        "\nBeside them, the first targets of the pruner (40% of the steps saved, more than the median pruner alone) and of "
        "p_best's reliability and the speeds:\n",
        f"- true best run pruned in <= 5% of replays: {ours['best pruned']:.1%} ({int(round(ours['best pruned'] * ours['replays']))} of {int(ours['replays'])}): {verdict(ours['best pruned'] <= 0.05)}",
        f"- regret <= 0.05 of the spread in >= 95% of replays: {ours['regret <= 0.05']:.1%}: {verdict(ours['regret <= 0.05'] >= 0.95)}",
        f"- steps saved >= 40%: {ours['steps saved']:.1%}: {verdict(ours['steps saved'] >= 0.40)}",
        f"- more steps saved than MedianPruner with 2 startup trials and 30% warm-up ({median['steps saved']:.1%}, best pruned "
        f"{median['best pruned']:.1%}, regret <= 0.05 in {median['regret <= 0.05']:.1%}) at the same or better safety: "
        f"{verdict(ours['steps saved'] > median['steps saved'] and ours['best pruned'] <= median['best pruned'] and ours['regret <= 0.05'] >= median['regret <= 0.05'])}",
        f"- (beside it) SuccessiveHalvingPruner: {halving['steps saved']:.1%} saved, best pruned {halving['best pruned']:.1%}",
        f"- p_best reliability: realised share within {P_BEST_TOLERANCE} of the mean predicted in every bin of >= {P_BEST_MIN_COUNT} "
        f"check points ({', '.join(f'{r.bin}: {r.mean_predicted:.2f} predicted, {r.observed_rate:.2f} realised, {r.count} points' for r in judged.itertuples())}): "
        f"{verdict(bool((abs(judged['mean_predicted'] - judged['observed_rate']) <= P_BEST_TOLERANCE).all()))}",
        f"- ranking 20 runs of 1,000 steps <= 1 s (`benchmarks/rank_speed.py`): median {speed['rank_wall_s']:.2f} s wall "
        f"({speed['rank_cpu_s']:.2f} s CPU; the 20 forecasts alone {speed['forecasts_wall_s']:.2f} s, {speed['per_forecast_s']:.3f} s each; "
        f"machine load average {speed['load_rank']:.1f} on 2 cores, under which one forecast of `forecast_speed.py`'s reference log took "
        f"{speed['reference_forecast_s']:.3f} s): {verdict(speed['rank_wall_s'] <= 1.0)}",
        f"- should_prune <= 0.2 s at a check: median {timed['should_prune_seconds'].median():.3f} s, 95th percentile "
        f"{timed['should_prune_seconds'].quantile(0.95):.3f} s, max {timed['should_prune_seconds'].max():.3f} s over {len(timed)} checks "
        f"(load average {speed['load_replays']:.1f} on 2 cores): {verdict(timed['should_prune_seconds'].quantile(0.95) <= 0.2)} (95th percentile)",
    ]
    parts = [
        "# Sweep pruning on the shared real sweeps (and, apart, the project's own)\n\n",
        provenance(seconds),
        f"Package code: {package_code()}.\n",
        f"\n{len(sweeps)} sweeps (runs of one source, recipe and planned length, at least {MIN_SWEEP_RUNS} runs), each replayed "
        f"as an Optuna study in {args.seeds} random trial orders (seeds 0-{args.seeds - 1}), the same orders for every pruner. "
        f"Each sweep is pruned by the model of the source-grouped fold that holds it ({args.folds} folds, seed {args.seed}, "
        f"fit options {fit_options(args.draws, args.chains) or 'package defaults'}; the model never saw the sweep's source). "
        f"The ForecastPruner checks every {args.check_interval:.0%} of the plan (`check_interval={args.check_interval:g}`, unless its variant says otherwise) from its `min_fraction` on; "
        "Optuna's pruners are asked after every reported step. Truth = smoothed final reward; regret in units of the sweep's "
        "10-90% reward spread. The ForecastPruner and `rank` couple each sweep's runs with a `SweepCoupling` measured "
        f"(`benchmarks/sweep_coupling.py`, from `{args.coupling_runs.name}`) without the sweep's own source.\n\n",
        markdown(sweep_rows),
        "\n## Targets\n\n", "\n".join(targets), "\n\n",
        "## Per pruner, over all replays\n\n", markdown(table.assign(row=range(1, len(table) + 1))[["row", *table.columns]]),
        "\n![frontier](backtest_sweeps_frontier.png)\n",
        "\n## rank's order against the current-reward order\n\n",
        f"Every run of each real sweep cut at {', '.join(f'{f:.0%}' for f in ORDER_FRACTIONS)} of the plan and ranked with `model.rank` "
        "(the fold model with the calibration layer learned on the other folds, as the package ranks by default); "
        "Kendall tau of its table order (best first) and of the smoothed current reward against the runs' true final order, "
        "averaged over the sweeps, and the sweeps whose top pick is the true winner. A run whose log already reaches the final "
        "window its truth is measured on is left out of that cut (nothing is left to forecast, and its current reward is its truth), "
        f"as the calibration benchmark leaves such cuts out; a sweep counts at a cut while {MIN_SWEEP_RUNS} of its runs remain.\n\n",
        markdown(orders),
        "\n\nWhere the two orders differ. The pairs of runs of one sweep that `rank` and the current reward put the other way "
        "round, how many of them each gets right, and a two-sided sign test. Only these pairs can make either order better; "
        "the others count alike for both.\n\n",
        markdown(pairs),
        f"\n\n`rank`'s order again at {ORDER_SEEDS} seeds of its Monte Carlo (seeds {args.seed}-{args.seed + ORDER_SEEDS - 1}, "
        "the fold models unchanged). The SD is the part of a tau difference that is `rank`'s own sampling, not the sweeps'.\n\n",
        markdown(seeded_orders),
        "\n## Per sweep\n\n", markdown(per_sweep(replays)),
        "\n## A real sweep ranked at 30%\n\n",
        f"`{fans_name}`, every run cut at {FANS_AT:.0%} of its plan and ranked by the fold model that never saw the sweep's source "
        "(`Ranking.plot_fans`): logged rewards, and for each run the median, 50% and 90% bands of the joint draws; "
        "dotted, the run's real final.\n\n![fans](backtest_sweeps_fans.png)\n",
        "\n## Reliability of p_best\n\n",
        f"Every run of a sweep cut at {', '.join(f'{f:.0%}' for f in RANK_FRACTIONS)} of the plan and ranked with `model.rank` "
        f"(joint draws; the same runs left out); outcome = the run ends best. {len(ranks)} (run, cut) pairs, {int(ranks['best'].sum())} of them the best run.\n\n",
        markdown(p_best),
        "\n## Reliability of the pruner's P(final > bar) at its checks\n\n",
        f"Every check of `{DEFAULTS}` in every replay ({len(beats)} checks); outcome = the run's real final reward "
        "(mean of its last 10% of logged steps) ends above the bar the check used.\n\n",
        markdown(p_beats),
    ]  # fmt: skip
    if not own.empty:
        parts += [
            "\n## The project's own sweeps (bundled; not the headline)\n\n",
            "Held-out sweeps this project generated (`data/sweeps`, one recipe, one setting varied), pruned by the **shipped** "
            "model, which was fitted on `data/runs` without them (but on runs of the same generator and tasks: easier than a "
            "stranger's sweep). Same replays and scores as above; the sweep coupling is the one stored in the shipped model file.\n\n",
            markdown(summary(own)),
            "\nReliability of p_best on these sweeps (every run cut as above):\n\n",
            markdown(reliability(own_ranks["p_best"], own_ranks["best"])),
        ]
    text = "".join(parts)
    (args.out / "backtest_sweeps.md").write_text(text)
    return text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shared", type=Path, help="folder with index.csv and runs/ (default: evaluation.settings.shared_runs_dir())")
    parser.add_argument("--folds", type=int, default=5, help="source-grouped folds (default 5, as benchmarks/calibration.py)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the fold layout and fits (default 0, as benchmarks/calibration.py)")
    parser.add_argument("--draws", type=int, help="draws and tuning steps per chain of each fold's fit (default: the package's)")
    parser.add_argument("--chains", type=int, help="chains per fit (default: the package's)")
    parser.add_argument("--cache", type=Path, help="folder of cached fold fits, shared with benchmarks/calibration.py (default: none, fit)")
    parser.add_argument("--seeds", type=int, default=10, help="random trial orders per sweep (default 10)")
    parser.add_argument("--check-interval", type=float, default=0.05, help="share of the plan between two ForecastPruner checks (default 0.05)")
    parser.add_argument("--jobs", type=int, default=1, help="local worker processes for the replays (default 1)")
    parser.add_argument("--quiet", action="store_true", help="no progress bars")
    parser.add_argument("--out", type=Path, default=RESULTS, help="folder to write the results to (default benchmarks/results)")
    parser.add_argument("--no-bundled", action="store_true", help="leave out the project's own bundled sweeps (data/sweeps)")
    parser.add_argument("--coupling-runs", type=Path, default=RESULTS / "calibration_runs.csv",
                        help="held-out forecasts the sweep coupling is measured from, each sweep's source left out (default results/calibration_runs.csv)")
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    optuna.logging.set_verbosity(optuna.logging.WARNING)

    started = time.perf_counter()
    sweeps = load_sweeps(args) + ([] if args.no_bundled else load_bundled_sweeps())
    names = list(pruners(100, sweeps[0].model, args.check_interval))
    jobs = [ReplayJob(s, seed, name, args.check_interval) for s in sweeps for seed in range(args.seeds) for name in names]
    results = map_jobs(replay, jobs, n_jobs=args.jobs, progress=not args.quiet, desc="replays", name=lambda job: job.name)
    trials = pd.DataFrame([row for rows, _ in results for row in rows])
    checks = pd.DataFrame([row for _, rows in results for row in rows])
    finals = {run.run_id: measures.final_reward(run.rewards) for s in sweeps for run in s.runs}
    checks["ends_above_bar"] = checks["run_id"].map(finals) > checks["bar"]
    replays = score_replays(trials, sweeps)
    ranks = rank_checks(sweeps, args.seed)
    seeded_orders = order_by_seed(sweeps, args.seed, ranks)
    load_during_replays = os.getloadavg()[1]  # the machine's load over the last 5 minutes, as the timings were taken
    speed = measure_rank_speed(bg.default_model(), synthetic_sweep(), calls=5)
    speed.update(load_replays=load_during_replays, load_rank=os.getloadavg()[0])
    print(write(args, sweeps, trials, replays, checks, ranks, seeded_orders, speed, time.perf_counter() - started))


if __name__ == "__main__":
    main()
