"""Write the example notebooks (without outputs) from the cells below: ``python notebooks/make_notebooks.py``.

Every notebook starts with the quick-mode switch: ``BAYES_GRPO_QUICK=1`` (CI, tests)
uses a few runs and short sampler settings so that all of them run in a few minutes.
"""

from __future__ import annotations

from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

HERE = Path(__file__).resolve().parent
SETUP = """import os
import warnings

# Before the imports: tqdm warns that Jupyter's widgets (ipywidgets) are missing; progress bars stay text.
warnings.filterwarnings("ignore", message=".*IProgress not found.*")
import arviz as az
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

import bayes_grpo as bg
from bayes_grpo.measures import final_reward, horizon
from bayes_grpo.report import pick_runs

QUICK = os.environ.get("BAYES_GRPO_QUICK", "0") == "1"  # CI: few runs, short sampler runs
pd.set_option("display.precision", 3)
warnings.filterwarnings("ignore", message=".*(idata_kwargs|BLAS|PatientPruner|removed in v6|invalid value encountered).*")  # library chatter"""

FIT_POSTERIOR = [
    "# Fit the hierarchical reward-curve model\n\n"
    "Every GRPO run in the bundled set is a reward curve `reward(step)`. The model describes each run as a "
    "rise `r0 + gain * F(step / total_steps; tau, beta)` with noise, and ties the runs together: the gain and the "
    "timescale `tau` of a run depend on its model family, its size and its initial reward, through population "
    "effects that are learned from all runs at once (partial pooling). This notebook fits that hierarchy with "
    "NUTS, checks that the sampler converged, and reads the effects.",
    SETUP,
    "## The runs\n\nThe bundled runs live in `data/runs` (`bg.load_runs()` reads them; pass a folder to read your own). "
    "Each has metadata: model family, size (`params_b`, in billions of parameters), planned steps. The bundled runs "
    "train tiny models on the CPU, tens to hundreds of thousands of parameters, so the table shows their sizes in "
    "thousands of parameters.",
    """runs = bg.load_runs()
overview = pd.DataFrame(
    [(r.run_id, r.family, r.params_b, len(r), r.total_steps) for r in runs],
    columns=["run", "family", "params_b", "steps", "total_steps"],
)
overview.groupby("family").agg(
    runs=("run", "count"), sizes_thousands=("params_b", lambda s: sorted({round(v * 1e6, 1) for v in s}))
)""",
    """from bayes_grpo.report import data_figure

data_figure(runs);""",
    "## Fit\n\nIn quick mode (`BAYES_GRPO_QUICK=1`, as the documentation site builds it) the fit uses 12 of the runs, "
    "four per family, with 2 chains of 2,000 draws after 1,000 tuning steps: one to two minutes on two CPU cores. "
    "Otherwise it uses every run and the defaults (2 chains of 4,000 draws after 1,000 tuning steps). `bg.fit` picks "
    "nutpie when it is installed, and warns when the fit has not converged.",
    """fit_runs = pick_runs(runs, 12) if QUICK else runs
model = bg.fit(fit_runs, draws=2000 if QUICK else None, tune=1000 if QUICK else None, progressbar=not QUICK)
print(model.diagnostics)""",
    "## Diagnostics\n\n`r_hat` close to 1 (at most 1.01) and a bulk ESS in the hundreds (400 or more) mean the chains "
    "agree and the draws are informative; divergences point at a geometry the sampler could not explore. The line "
    "above gives the worst of them over the population and per-run parameters; the table gives them per population "
    "parameter.",
    """population = ["gain_mu", "gain_sd", "gain_size", "gain_init", "tau_mu", "tau_sd", "tau_size", "tau_init", "beta_mu"]
az.summary(model.idata, var_names=population, kind="diagnostics")""",
    """az.plot_rank(model.idata, var_names=["gain_size", "gain_init", "tau_size", "tau_init"], kind="vlines", figsize=(10, 4))
plt.tight_layout()""",
    "## Population effects\n\n`gain_size` and `tau_size` say how the total gain (on an asinh scale) and the (log) timescale of the rise "
    "change per factor of 10 in model size; `gain_init` and `tau_init` how they change with the initial reward. An "
    "interval away from zero is an effect the data support.",
    """effects = ["gain_size", "gain_init", "tau_size", "tau_init"]
az.plot_forest(model.idata, var_names=effects, combined=True, hdi_prob=0.9, figsize=(6, 3))
plt.axvline(0, color="k", lw=0.6, ls=":");""",
    """pd.DataFrame({name: {"P(effect > 0)": float((model.population[name] > 0).mean())} for name in effects}).T""",
    "Family effects shift the gain and the timescale of every run of a family; a family the model has not seen "
    "gets the population average with the between-family spread added.",
    """az.plot_forest(model.idata, var_names=["fam_gain", "fam_tau"], combined=True, hdi_prob=0.9, figsize=(6, 4))
plt.axvline(0, color="k", lw=0.6, ls=":");""",
    "## Save and reuse\n\n`model.save(path)` writes one NetCDF file: the population posterior and the full fit, "
    "with attributes recording the package version, the model settings (`model.model_config`), the curve form and the "
    "runs it was fitted on. `bg.load_model(path)` or `bayes-grpo forecast LOG --model path` use it later, and refuse a "
    "file that is not a bayes_grpo model or comes from an incompatible version. Here it goes to a temporary folder.",
    """import tempfile

saved = model.save(os.path.join(tempfile.mkdtemp(), "model.nc"))
loaded = bg.load_model(saved)
print(saved.name, f"{saved.stat().st_size / 1e6:.1f} MB")
pd.Series({"form": loaded.form, "families": loaded.families, "fitted on": loaded.fitted_on["n_runs"], "draws": loaded.sampler_config.draws})""",
]

FORECAST_A_RUN = [
    "# Forecast a run from part of its steps\n\n"
    "A forecast conditions one run on the steps it has logged so far and projects its mean reward to the planned "
    "last step, with credible intervals. It uses the population posterior shipped with the package "
    "(`bg.default_model()`), so no sampling is needed: a forecast takes well under a second.",
    SETUP,
    "## Read a TRL log\n\n`bg.read_log` takes a `trainer_state.json`, a TRL output folder (newest checkpoint), a "
    "CSV/JSONL export or a console log. This tiny log comes from a real `GRPOTrainer` run on a toy model.",
    """run = bg.read_log("../tests/fixtures/trl_tiny/trainer_state.json")
print(run)
run.table[["step", "reward", "reward_std"]].head()""",
    "Model family and size are unknown here, so the forecast uses the population average; pass `family=` and "
    "`params_b=` (or `--family`/`--params-b` on the command line) when you know them.",
    """model = bg.default_model()
fc = model.forecast(run.head(3), total_steps=run.total_steps)
fc.to_frame()""",
    "## A longer run, forecast from 30% of its steps\n\nOne of the bundled runs, cut at 30% of its steps; the grey "
    "line is what happened next, which the forecast did not see.",
    """runs = bg.load_runs()
full = max(runs, key=len)
cut = int(full.steps[int(0.3 * (len(full) - 1))])
fc = model.forecast(full.head(cut), total_steps=horizon(full))
fc.plot(truth=full)
plt.legend(fontsize=7);""",
    "The `fc.final` attribute is the forecast of the run's final reward: the mean logged reward over the last 10% of "
    "the planned steps (what `bayes_grpo.measures.final_reward` measures on the finished run), with its mean, "
    "quantiles and intervals.",
    """final = fc.final
pd.DataFrame(
    {"mean": [final.mean], "median": [final.quantile(0.5)], "50% interval": [final.interval(0.5)],
     "90% interval": [final.interval(0.9)], "actual (last 10% of steps)": [final_reward(full.rewards)]}
)""",
    "## Intervals narrow as the run goes on\n\nThe same run forecast from more and more of its steps.",
    """fractions = [0.1, 0.2, 0.3, 0.5] if QUICK else [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8]
rows = []
for frac in fractions:
    step = int(full.steps[int(frac * (len(full) - 1))])
    f = model.forecast(full.head(step), total_steps=horizon(full)).final
    rows.append((frac, step, f.mean, *f.interval(0.9)))
intervals = pd.DataFrame(rows, columns=["fraction", "step", "mean", "q05", "q95"])
ax = plt.subplots(figsize=(6, 3))[1]
ax.fill_between(intervals.fraction, intervals.q05, intervals.q95, alpha=0.3, label="90% interval of the final reward")
ax.plot(intervals.fraction, intervals["mean"], "o-", label="forecast mean")
ax.axhline(final_reward(full.rewards), color="k", ls=":", label="actual (last 10% of steps)")
ax.set_xlabel("fraction of steps seen")
ax.set_ylabel("final reward")
ax.legend(fontsize=7);""",
]

STOPPING_RULE = [
    "# When to stop: the plateau stopping rule\n\n"
    "At any step, the forecast gives a posterior over the reward still to gain before the planned end. The stop "
    "probability is the posterior probability that this remaining gain is below a tolerance (2% of the 10-90% spread "
    "of the rewards logged so far, by default). The rule stops when it reaches a threshold (0.99 by default) and at "
    "least 30% of the planned steps are logged; `compute_saved` is the fraction of "
    "the planned steps not run.",
    SETUP,
    """model = bg.default_model()
runs = bg.load_runs()
run = max(runs, key=len)
run""",
    "## Stop probability through a run\n\nThe probability at each point is computed from the steps logged up to "
    "that point only, as `PlateauStoppingCallback` would see it during training.",
    """from bayes_grpo.report import stop_curve
from bayes_grpo.settings import STOP_THRESHOLD  # the default threshold (0.99)

curve = stop_curve(model, run, n_points=8 if QUICK else 20)
fig, reward_ax = plt.subplots(figsize=(7, 3))
reward_ax.plot(run.steps, run.rewards, color="0.7", lw=0.6)
reward_ax.set_xlabel("step")
reward_ax.set_ylabel("reward")
ax = reward_ax.twinx()  # drawn on top of the reward
ax.plot(curve.step, curve.probability, "o-", color="C3", label="stop probability")
ax.axhline(STOP_THRESHOLD, color="C3", ls=":", lw=0.8, label=f"threshold {STOP_THRESHOLD}")
ax.set_ylim(0, 1.02)
ax.set_ylabel("P(plateau)")
ax.legend(fontsize=7, loc="lower right");""",
    "## One decision, explained\n\n`stop_decision` returns the evidence: probability, expected remaining gain with "
    "its interval, the step where the curve plateaus, and the compute saved by stopping now. It also names the checkpoint "
    "to keep: `best_step` is the logged step with the highest smoothed reward so far, and `declining` says whether the "
    "run has peaked (its smoothed reward now clearly below that at `best_step`). A rule that trusts a high probability "
    "too early, or inside a dip below the best, waits (the sentence says so).",
    """crossed = curve[curve.probability >= STOP_THRESHOLD]
step = int(crossed.step.iloc[0]) if len(crossed) else int(curve.step.iloc[-1])
decision = model.stop_decision(run.head(step), total_steps=horizon(run))
print(decision.explain())
pd.Series({k: decision.to_dict()[k] for k in ("step", "probability", "expected_gain", "plateau_step", "compute_saved", "best_step", "declining", "should_stop")})""",
    "## The callback during training\n\n`PlateauStoppingCallback` makes the same decision inside a `GRPOTrainer` "
    "run every `check_every` steps, logs `plateau/probability`, `plateau/expected_gain`, `plateau/best_step` and the "
    "forecast quantiles, and stops training when the rule says so. When the trainer saves checkpoints, "
    "`best_checkpoint` names the saved folder holding the best step (or the nearest one saved before it). Below (this cell needs the `[train]` extra), "
    "a real `GRPOTrainer` run on CPU: a one-layer Llama built from a config, the character tokenizer of the test fixtures, and "
    "a toy reward that rises for 12 steps and then falls, so the best checkpoint lies before the end.",
    """import contextlib
import io
import sys
import tempfile

from datasets import Dataset
from transformers import LlamaConfig, LlamaForCausalLM, set_seed
from trl import GRPOConfig, GRPOTrainer

sys.path.insert(0, "../tests/fixtures")
from make_trl_fixture import build_tokenizer  # a character-level tokenizer built locally, no download

calls, rng = [0], np.random.default_rng(1)


def peaked_reward(completions, **_):
    \"\"\"Toy reward: rises for 12 trainer steps, then falls.\"\"\"
    calls[0] += 1
    level = 0.05 * min(calls[0], 12) - 0.03 * max(calls[0] - 12, 0)
    return list(level + 0.01 * rng.standard_normal(len(completions)))


set_seed(0)
tokenizer = build_tokenizer()
tiny = LlamaForCausalLM(LlamaConfig(
    vocab_size=len(tokenizer), hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
    num_key_value_heads=2, max_position_embeddings=64, pad_token_id=tokenizer.pad_token_id,
    bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
))
output_dir = "grpo_output"  # relative: the trainer runs in a scratch folder, and the paths printed below are relative to it
callback = bg.PlateauStoppingCallback(model, check_every=5, min_fraction=0.25, verbose=False)
with contextlib.chdir(tempfile.mkdtemp()):
    trainer = GRPOTrainer(
        model=tiny, reward_funcs=[peaked_reward], processing_class=tokenizer, callbacks=[callback],
        train_dataset=Dataset.from_dict({"prompt": [f"what is {a} + {b} ?" for a in range(4) for b in range(4)]}),
        args=GRPOConfig(
            output_dir=output_dir, max_steps=30, per_device_train_batch_size=4, num_generations=4, max_completion_length=4,
            learning_rate=1e-3, logging_steps=1, save_strategy="steps", save_steps=5, report_to="none", use_cpu=True,
            bf16=False, seed=0, disable_tqdm=True,
        ),
    )
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):  # the trainer's own chatter
        trainer.train()
print("stopped at step", callback.stopped_at, "| best step", callback.decisions[-1].best_step, "| keep", callback.best_checkpoint)
print(callback.stop_message())""",
    """logged = pd.DataFrame([e for e in trainer.state.log_history if "plateau/probability" in e])
logged[["step", "reward", "plateau/probability", "plateau/best_step", "forecast/final_q05", "forecast/final_q95"]]""",
    "## Against simple rules\n\nThe backtest replays finished runs, consulting each rule every 2% of the steps from "
    "10% on with only the steps logged so far, and scores it by the share of steps it saves and its *regret*: how far "
    "the run's Gaussian-kernel smoothed reward (bandwidth 8% of the steps) at the stop lies below that at the end, as a "
    "share of the run's 10-90% reward spread. Baselines: stop at a fixed fraction of the steps, after `patience` checks "
    "without a new best smoothed reward (like `EarlyStoppingCallback`), Optuna's `PatientPruner`, and the hindsight "
    "oracle, which knows the future. A negative regret means the reward fell after the stop. Here the shipped model replays runs it was fitted on (quick mode: three runs, a "
    "check every 5%); `benchmarks/backtest_stopping.py` replays every run with models fitted without the run's source.",
    """import sys

sys.path.append("..")  # the repository root: evaluation/ holds the backtest (benchmark code, not in the wheel)
from evaluation import backtest

sample = pick_runs(runs, 3 if QUICK else len(runs))
traces = [
    backtest.trace(model, r, thresholds=[0.8, 0.9, 0.95], forecast_options={"n_draws": 200 if QUICK else 400}, every=0.05 if QUICK else 0.02)
    for r in sample
]
results = backtest.evaluate(traces)
summary = backtest.summarise(results)
summary[["rule", "threshold", "runs", "mean_saved", "median_regret", "share_regret_gt_0.05"]]""",
    """backtest.tradeoff_figure(summary, title="shipped model, bundled runs (in-sample)");""",
    "A good rule saves much compute with little regret: up and to the left in the figure, towards the oracle. Fixed "
    "fractions ignore the run; patience rules react to noise; the Bayesian rule stops once the forecast says little is "
    "left, which also tells you how sure it is. A few runs in-sample say little: the measured figures are in the "
    "README and `benchmarks/results/backtest_stopping.md`.",
]

SWEEPS = [
    "# Rank a sweep and prune it with Optuna\n\n"
    "A sweep trains one recipe several times with one setting changed. Two questions matter while it runs: which run "
    "will end best, and which runs cannot win any more. `model.rank` answers the first with `p_best`, the probability "
    "that each run ends highest, from joint draws of all the runs' forecasts (a sweep is a source: its runs' forecasts "
    "miss together, and the joint draws share that). `bayes_grpo.integrations.optuna.ForecastPruner` answers the second inside an Optuna study: it "
    "prunes a trial once it is unlikely to end above the best other trial.",
    SETUP,
    "## A real sweep\n\nThe shared real runs (`../shared/external_runs`, when present) hold a 17-run ablation of a "
    "50-step GSM8K recipe (learning rate, LoRA rank, group size, temperature, ...). Without them, the notebook uses the "
    "bundled runs of one toy task instead. The shipped model was fitted on these runs too, so this is an illustration; "
    "`benchmarks/backtest_sweeps.py` scores sweeps with models fitted without their source.",
    """import sys

from bayes_grpo.measures import cut, smoothed

sys.path.append("..")  # the repository root: evaluation/ finds the shared runs (benchmark code, not in the wheel)
from evaluation.calibration import shared_index
from evaluation.settings import shared_runs_dir

shared = shared_runs_dir()
if shared is not None and (shared / "runs" / "tonywang1990_qwen3-1.7b_gsm8k_baseline.csv").is_file():
    members = set(shared_index().query("source_repo == 'tonywang1990/gsm8k-grpo'")["run_id"])
    sweep = [r for r in bg.load_runs(shared / "runs") if r.run_id in members]
else:  # no shared runs here: the bundled runs of one toy recipe (three seeds and a batch-size change)
    sweep = [r for r in bg.load_runs() if r.run_id.startswith("llama-s-reverse4")]
sweep = sweep[:6] if QUICK else sweep
total = sweep[0].total_steps
truth = pd.Series({r.run_id: smoothed(r.steps, r.rewards)[-1] for r in sweep}, name="smoothed final")
print(f"{len(sweep)} runs planned for {total} steps")""",
    "## Rank it at 30% of its steps\n\nEvery run cut at 30% of its planned steps, as a sweep run in parallel looks "
    "then. Each run is forecast as `model.forecast` would (through the calibration layer); the table is sorted by the median final `q50` (the point forecast), `p_best` beside it; the last column is what really happened.",
    """model = bg.default_model()
ranking = model.rank([cut(r, 0.3, total) for r in sweep], total_steps=total, beat=float(truth.median()))
ranking.table.assign(truth=lambda t: t["run_id"].map(truth))""",
    """ranking.plot(ax=plt.subplots(figsize=(9, 4.5))[1]);""",
    "The probability of ending above any value, e.g. the best final reward of a finished run, is `p_beats(value)`.",
    """values = np.linspace(truth.min(), truth.max(), 5)
pd.DataFrame({f"> {v:.2f}": ranking.p_beats(v) for v in values})""",
    "## Prune it with Optuna\n\nThe sweep replayed as an Optuna study: one trial per run, in a random order, each "
    "reporting its logged reward step by step (`trial.report(reward, step)`) and asking `trial.should_prune()`. The "
    "trial's planned length comes from its user attribute `total_steps`. By default `ForecastPruner` composes with "
    "Optuna's median pruner (2 startup trials, a warm-up of 30% of the plan): the median pruner proposes, and the "
    "forecast vetoes a trial whose chance of ending above the best other trial is still at least 10%. The forecast's "
    "own rule checks every `check_interval` of the plan from `min_fraction` (30% of the plan) on, here every 10% to "
    "keep the notebook quick, and prunes when the probability of ending above the best other trial's final is below "
    "5% at two checks in a row (`patience=2`). The study is one sweep: the trials' forecasts are drawn jointly, and "
    "the finished trials tell how this recipe's runs end against their forecasts. Optuna's `MedianPruner` alone, with "
    "the same warm-up and startup trials, and the forecast's rule alone (`base=None`) replay the same order.",
    """import optuna

from bayes_grpo.integrations.optuna import ForecastPruner

optuna.logging.set_verbosity(optuna.logging.WARNING)


def replay(pruner, order):
    study = optuna.create_study(direction="maximize", pruner=pruner)
    rows = []
    for run in (sweep[i] for i in order):
        trial = study.ask()
        trial.set_user_attr("total_steps", total)
        stop = None
        for step, reward in zip(run.steps, run.rewards):
            trial.report(float(reward), int(step))
            if trial.should_prune():
                stop = int(step)
                study.tell(trial, state=optuna.trial.TrialState.PRUNED)
                break
        if stop is None:
            study.tell(trial, final_reward(run.rewards))
        rows.append((run.run_id, stop if stop is not None else run.last_step, stop is not None))
    return pd.DataFrame(rows, columns=["run_id", "steps run", "pruned"]).assign(truth=lambda t: t["run_id"].map(truth))


order = np.random.default_rng(0).permutation(len(sweep))
pruned = {
    "ForecastPruner": replay(ForecastPruner(model, check_interval=0.1), order),
    "ForecastPruner(base=None)": replay(ForecastPruner(model, check_interval=0.1, base=None), order),
    "MedianPruner": replay(optuna.pruners.MedianPruner(n_startup_trials=2, n_warmup_steps=int(0.3 * total)), order),
}
pruned["ForecastPruner"]""",
    "Steps saved, and whether the best run survived:",
    """best = truth.idxmax()
pd.DataFrame({
    name: {"steps saved": 1 - t["steps run"].sum() / sum(r.last_step for r in sweep),
           "runs pruned": int(t["pruned"].sum()), "best run kept": not bool(t.set_index("run_id").loc[best, "pruned"])}
    for name, t in pruned.items()
}).T""",
]

NOTEBOOKS = {
    "01_fit_posterior.ipynb": FIT_POSTERIOR,
    "02_forecast_a_run.ipynb": FORECAST_A_RUN,
    "03_stopping_rule.ipynb": STOPPING_RULE,
    "04_sweeps.ipynb": SWEEPS,
}


def build(cells: list[str]) -> nbformat.NotebookNode:
    """A notebook without outputs: prose cells start with '#' or a capital letter, code cells never do.

    Cell ids are their positions, so regenerating an unchanged notebook gives the same file.
    """
    return new_notebook(
        cells=[
            (new_markdown_cell if c[0] == "#" or c[0].isupper() else new_code_cell)(c, id=f"cell-{i}")
            for i, c in enumerate(cells)
        ],
        metadata={"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}},
    )


def main() -> None:
    for name, cells in NOTEBOOKS.items():
        nbformat.write(build(cells), HERE / name)
        print(f"wrote {HERE / name}")


if __name__ == "__main__":
    main()
