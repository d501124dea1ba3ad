"""One self-contained HTML report of a fitted model: data, diagnostics, checks, forecasts, stopping.

:func:`write_report` renders every figure to a base64 PNG inside the page, so the
file opens offline and can be mailed or attached to an experiment tracker.

The report only renders. It takes a fitted model, runs and precomputed results
(benchmark tables, markdown, figures, PNG bytes) and fits nothing: comparing
curve forms is :func:`bayes_grpo.model.compare_forms` (pass its table as
``comparison``), and evaluations are written by the scripts in ``benchmarks/``,
whose outputs the caller passes as ``results``. It reads no file.
"""

from __future__ import annotations

import base64
import html
import io
import os
import re
import warnings
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Iterable, Mapping, Sequence, Union

import arviz as az
import numpy as np
import pandas as pd
from tqdm.auto import tqdm

from bayes_grpo.errors import ModelError
from bayes_grpo.logs import RunLog
from bayes_grpo.measures import cut, final_reward, horizon
from bayes_grpo.sampling import UNMIXED_R_HAT, steps_per_chain
from bayes_grpo.population import simulate
from bayes_grpo.prepare import prepare_training_run
from bayes_grpo.settings import STOP_THRESHOLD, STOP_TOLERANCE

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from bayes_grpo.forecast import Forecast
    from bayes_grpo.model import FittedModel

FORECAST_FRACTIONS = (0.2, 0.3, 0.5)
EFFECT_VARS = ("gain_size", "gain_init", "tau_size", "tau_init")
TRACE_VARS = ("gain_mu", "gain_sd", "gain_size", "gain_init", "tau_mu", "tau_sd", "tau_size", "tau_init", "beta_mu")
MIN_SHOWN_STEPS = 20

_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Helvetica,Arial,sans-serif;max-width:1100px;margin:2em auto;
padding:0 1em;color:#222;line-height:1.45}
h1{border-bottom:2px solid #2a6;padding-bottom:.2em}h2{margin-top:2em;border-bottom:1px solid #ccc}
table{border-collapse:collapse;font-size:.85em;margin:.8em 0}th,td{border:1px solid #ddd;padding:.25em .6em;text-align:right}
th{background:#f3f3f3}td:first-child,th:first-child{text-align:left}img{max-width:100%;display:block;margin:.6em 0}
.note{background:#fff8e1;border-left:4px solid #f0b400;padding:.5em 1em}.ok{color:#080}.bad{color:#b00}
nav a{margin-right:1em}code{background:#f3f3f3;padding:0 .25em}
"""


def figure_to_base64(fig: Figure, dpi: int = 90) -> str:
    """PNG bytes of a matplotlib figure, base64-encoded; the figure is closed."""
    import matplotlib.pyplot as plt

    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=dpi, bbox_inches="tight")
    plt.close(fig)
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def _img(fig: Figure, alt: str) -> str:
    return f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{figure_to_base64(fig)}">'


def _note(text: str) -> str:
    return f'<p class="note">{text}</p>'


def _table(frame: pd.DataFrame, index: bool = True) -> str:
    return frame.to_html(index=index, float_format=lambda v: f"{v:.3g}", border=0, na_rep="-")


def pick_runs(runs: Sequence[RunLog], n: int = 4) -> list[RunLog]:
    """Up to ``n`` complete-looking runs, one family at a time, longest logs first."""
    candidates = [r for r in runs if len(r) >= MIN_SHOWN_STEPS] or list(runs)
    candidates.sort(key=lambda r: (r.total_steps not in (None, r.last_step), -len(r)))
    by_family: dict[str, list[RunLog]] = {}
    for run in candidates:
        by_family.setdefault(run.family or "unknown", []).append(run)
    picked: list[RunLog] = []
    while len(picked) < n and any(by_family.values()):
        for queue in by_family.values():
            if queue and len(picked) < n:
                picked.append(queue.pop(0))
    return picked


# ------------------------------------------------------------------ figures


def data_figure(runs: Sequence[RunLog]) -> Figure:
    """Every reward curve, one panel per family, coloured by model size."""
    import matplotlib.pyplot as plt
    from matplotlib.colors import LogNorm

    families = sorted({r.family or "unknown" for r in runs})
    sizes = [r.params_b for r in runs if r.params_b]
    norm = LogNorm(min(sizes, default=0.1), max(max(sizes, default=10.0), min(sizes, default=0.1) * 1.01))
    cols = min(3, len(families))
    rows = -(-len(families) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.0 * rows), squeeze=False, layout="constrained")
    cmap = plt.get_cmap("viridis")
    for ax, family in zip(axes.flat, families):
        for run in (r for r in runs if (r.family or "unknown") == family):
            color = cmap(norm(run.params_b)) if run.params_b else "0.5"
            ax.plot(run.steps / horizon(run), run.rewards, lw=0.7, color=color, alpha=0.8)
        ax.set_title(family, fontsize=10)
        ax.set_xlabel("progress (step / total steps)")
        ax.set_ylabel("reward")
    for ax in axes.flat[len(families) :]:
        ax.set_visible(False)
    fig.colorbar(plt.cm.ScalarMappable(norm=norm, cmap=cmap), ax=axes, label="params (B)", shrink=0.8)
    return fig


def forecast_cuts(
    model: FittedModel, runs: Sequence[RunLog], fractions: Sequence[float] = FORECAST_FRACTIONS, progress: bool = True
) -> list[tuple[RunLog, float, RunLog, Forecast]]:
    """Each run cut at each of ``fractions`` of its planned steps (:func:`bayes_grpo.measures.cut`) and forecast to its end.

    Returns
    -------
    list of (run, fraction, head, forecast)
        Run by run, fractions in order.
    """
    jobs = [(run, frac) for run in runs for frac in fractions]
    cuts = []
    for run, frac in tqdm(jobs, desc="forecasts", disable=not progress, leave=False):
        head = cut(run, frac)
        cuts.append((run, frac, head, model.forecast(head, total_steps=horizon(run))))
    return cuts


def forecast_figure(model: FittedModel, runs: Sequence[RunLog], fractions: Sequence[float] = FORECAST_FRACTIONS, progress: bool = True) -> Figure:
    """Fan charts: each run forecast from ``fractions`` of its planned steps (:func:`forecast_cuts`), the full run overlaid."""
    return _fan_charts(forecast_cuts(model, runs, fractions, progress), len(fractions))


def _fan_charts(cuts: Sequence[tuple[RunLog, float, RunLog, Forecast]], n_fractions: int) -> Figure:
    import matplotlib.pyplot as plt

    from bayes_grpo.plotting import draw_fan

    n_runs = len(cuts) // n_fractions
    fig, axes = plt.subplots(n_runs, n_fractions, figsize=(4.2 * n_fractions, 2.8 * n_runs), squeeze=False)
    for k, (run, frac, head, fc) in enumerate(cuts):
        i, j = divmod(k, n_fractions)
        draw_fan(axes[i, j], fc, truth=run)
        axes[i, j].set_title(f"{run.run_id}\nfrom {frac:.0%} (step {head.last_step}), P(take-off ahead) {fc.regimes['take_off_ahead']:.2f}", fontsize=8)
        axes[i, j].set_xlabel("step")
        if not (i or j):
            axes[i, j].set_ylabel("reward")
            axes[i, j].legend(fontsize=6, loc="lower right")
    fig.tight_layout()
    return fig


def forecast_table(cuts: Sequence[tuple[RunLog, float, RunLog, Forecast]]) -> pd.DataFrame:
    """One row per forecast of :func:`forecast_cuts`: its final reward against the truth, regime weights and sampler health.

    Columns: ``run, from, step``, ``final median``, ``final q05`` / ``q95``
    (:attr:`Forecast.final`), ``truth`` (:func:`bayes_grpo.measures.final_reward`
    of the whole run), ``P(take-off ahead)``, ``P(plateau)``, ``P(decline)``
    (:attr:`Forecast.regimes`), ``ESS`` and ``Pareto k`` (above 0.7: unreliable weights).
    """
    rows = []
    for run, frac, head, fc in cuts:
        lo, hi = fc.final.interval(0.9)
        regimes = fc.regimes
        rows.append({
            "run": run.run_id, "from": f"{frac:.0%}", "step": head.last_step, "final median": fc.final.median, "final q05": lo,
            "final q95": hi, "truth": final_reward(run.rewards), "P(take-off ahead)": regimes["take_off_ahead"],
            "P(plateau)": regimes["plateau"], "P(decline)": regimes["decline"], "ESS": fc.ess, "Pareto k": fc.pareto_k,
        })  # fmt: skip
    return pd.DataFrame(rows)


def caveat_list(cuts: Sequence[tuple[RunLog, float, RunLog, Forecast]]) -> str:
    """The caveats of the forecasts of :func:`forecast_cuts` (:attr:`Forecast.caveats`), each named by its run and
    cut, as an HTML list ("" when there are none): what a forecast cannot see belongs beside its numbers."""
    items = [
        f"<li><code>{html.escape(run.run_id)}</code> from {frac:.0%}: {html.escape(note)}</li>" for run, frac, _, fc in cuts for note in fc.caveats
    ]
    return f"<p>Caveats of these forecasts:</p><ul>{''.join(items)}</ul>" if items else ""


def _forecast_section(model: FittedModel, shown: Sequence[RunLog], progress: bool) -> list[str]:
    cuts = forecast_cuts(model, shown, FORECAST_FRACTIONS, progress)
    return [
        "<p>Each row is one run forecast from part of its log (black), with the rest of the run (grey) "
        "for comparison; bands are 50% and 90% credible intervals of the mean reward.</p>",
        _img(_fan_charts(cuts, len(FORECAST_FRACTIONS)), "forecast fan charts"),
        "<p>Final reward (mean logged reward over the last 10% of the steps, noise included) against the truth; "
        "posterior weights of the regimes: take-off still ahead, plateau, decline after the best level so far; "
        "and the importance sampler's health (ESS of 3,000 particles; Pareto k above 0.7 means unreliable weights).</p>",
        _table(forecast_table(cuts), index=False),
        caveat_list(cuts),
    ]


def component_panel(model: FittedModel, run: RunLog, fraction: float = 0.3) -> tuple[Figure, pd.DataFrame]:
    """Each reward function of ``run`` forecast from ``fraction`` of its planned steps: small fans and a table.

    The table has one row per function: its level at the cut, the forecast final value
    with its 90% interval, the truth, and whether it has saturated (and why).
    """
    from matplotlib.figure import Figure

    from bayes_grpo.components import forecast_components, plot_components

    head = cut(run, fraction, horizon(run))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        components = forecast_components(model, head, total_steps=horizon(run))
    drawn = sum(not c.constant for c in components)  # a constant function is neither forecast nor drawn
    columns = min(4, max(1, drawn))
    figure = Figure(figsize=(2.8 * columns, 2.4 * max(1, -(-drawn // columns))), layout="constrained")
    plot_components(components, figure, truth=run)
    rows = []
    for c in components:
        lo, hi = c.forecast.final.interval(0.9) if c.forecast is not None else (np.nan, np.nan)
        rows.append({
            "function": c.name, f"at step {head.last_step}": final_reward(head.signal(f"rewards/{c.name}/mean")),
            "forecast final": c.forecast.final.median if c.forecast is not None else np.nan,
            "90% interval": f"{lo:.3g} to {hi:.3g}" if c.forecast is not None else "-",
            "truth": final_reward(run.signal(f"rewards/{c.name}/mean")), "saturated": c.status if c.constant else (c.reason or "no"),
        })  # fmt: skip
    return figure, pd.DataFrame(rows)


def _components_section(model: FittedModel, runs: Sequence[RunLog]) -> list[str]:
    from bayes_grpo.components import reward_functions

    run = next((r for r in runs if len(reward_functions(r)) >= 2), None)
    if run is None:
        return [_note("None of these runs logs per-function rewards (rewards/&lt;fn&gt;/mean), so there is no component view.")]
    figure, table = component_panel(model, run)
    return [
        f"<p>Run <code>{html.escape(run.run_id)}</code>: each reward function's mean forecast as a run of its own from "
        "30% of the planned steps (black), with the rest of the run (grey). A function counts as saturated when its "
        "within-step spread has fallen to 5% of its peak (its groups' completions all score alike, so GRPO gets no "
        f"gradient from it) or when the stop rule finds its curve on a plateau (P &ge; {STOP_THRESHOLD:g}). The model "
        "was fitted on summed rewards; benchmarks/results/components.md measures how well it forecasts single functions.</p>",
        _img(figure, "reward function forecasts"),
        _table(table, index=False),
    ]


def stop_curve(model: FittedModel, run: RunLog, n_points: int = 12) -> pd.DataFrame:
    """Stop probability of ``run`` at ``n_points`` steps through its log: columns step, probability."""
    first = int(run.steps[min(4, len(run) - 1)])
    total = horizon(run)
    steps = np.unique(np.linspace(first, run.last_step, n_points).round().astype(int))
    steps = steps[steps < total]  # at the planned end there is trivially nothing left to gain
    probability = [model.stop_probability(run.head(int(s)), total_steps=total) for s in steps]
    return pd.DataFrame({"step": steps, "probability": probability})


def stop_figure(model: FittedModel, runs: Sequence[RunLog], threshold: float = STOP_THRESHOLD, progress: bool = True) -> Figure:
    """Stop probability across training for each run (:func:`stop_curve`), its reward curve behind it and ``threshold`` marked."""
    import matplotlib.pyplot as plt

    cols = min(2, len(runs))
    rows = -(-len(runs) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5.5 * cols, 3.0 * rows), squeeze=False)
    for ax, run in tqdm(list(zip(axes.flat, runs)), desc="stop probability", disable=not progress, leave=False):
        curve = stop_curve(model, run)
        reward_ax = ax.twinx()
        reward_ax.plot(run.steps, run.rewards, color="0.75", lw=0.6)
        reward_ax.set_ylabel("reward", color="0.5", fontsize=8)
        ax.set_zorder(reward_ax.get_zorder() + 1)
        ax.patch.set_visible(False)
        ax.plot(curve.step, curve.probability, "o-", color="C3", ms=3, label="P(plateau)")
        ax.axhline(threshold, color="C3", ls=":", lw=0.8)
        crossed = curve[curve.probability >= threshold]
        if len(crossed):
            ax.axvline(crossed.step.iloc[0], color="k", ls="--", lw=0.8, label=f"stop at {crossed.step.iloc[0]}")
        ax.set_ylim(-0.02, 1.02)
        ax.set_xlim(0, horizon(run))
        ax.set_xlabel("step")
        ax.set_ylabel("stop probability")
        ax.set_title(run.run_id, fontsize=9)
        ax.legend(fontsize=7, loc="upper left")
    for ax in axes.flat[len(runs) :]:
        ax.set_visible(False)
    fig.tight_layout()
    return fig


def ppc_figure(model: FittedModel, runs: Sequence[RunLog], n_draws: int = 400, seed: int = 0) -> Figure:
    """Observed rewards against the posterior predictive (curve band and 90% predictive band) of fitted runs.

    The predictive is :func:`bayes_grpo.population.simulate`, the model's own
    observation model, at each run's posterior draws.

    Parameters
    ----------
    model : FittedModel
        A fit that kept its full InferenceData (``model.idata``).
    runs : sequence of RunLog
        Runs that were in the fit.
    n_draws : int
        Posterior draws per run.
    seed : int
        Seed of the draw selection and of the simulated noise.

    Returns
    -------
    matplotlib.figure.Figure

    Raises
    ------
    ModelError
        When the model has no full fit.
    """
    import matplotlib.pyplot as plt

    if model.idata is None:
        raise ModelError("posterior predictive checks need the full fit: fit with keep_full=True and save with full=True")
    post = az.extract(model.idata, group="posterior", num_samples=n_draws, rng=seed)
    rng = np.random.default_rng(seed)
    cols = min(2, len(runs))
    rows = -(-len(runs) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5.5 * cols, 2.9 * rows), squeeze=False)
    for ax, run in zip(axes.flat, runs):
        prepared = prepare_training_run(run, model.model_config.unit_progress)
        p = post.sel(run=run.run_id)
        params = {name: p[name].values for name in ("r0", "gain", "tau", "beta", "sigma") if name in p}
        mu, predictive = simulate(model.model_config, prepared.t, params, rng)
        for values, alpha, label in ((predictive, 0.2, "90% predictive"), (mu, 0.45, "90% curve")):
            lo, hi = np.quantile(prepared.to_reward(values), [0.05, 0.95], axis=0)
            ax.fill_between(run.steps, lo, hi, color="C0", alpha=alpha, lw=0, label=label)
        ax.plot(run.steps, run.rewards, color="k", lw=0.6, label="observed")
        ax.set_title(run.run_id, fontsize=9)
        ax.set_xlabel("step")
        ax.set_ylabel("reward")
    axes.flat[0].legend(fontsize=7)
    for ax in axes.flat[len(runs) :]:
        ax.set_visible(False)
    fig.tight_layout()
    return fig


# ------------------------------------------------------------------ sections


def _section(anchor: str, title: str, body: Iterable[str]) -> str:
    return f'<section id="{anchor}"><h2>{html.escape(title)}</h2>\n' + "\n".join(body) + "</section>"


def _data_section(runs: Sequence[RunLog]) -> list[str]:
    table = pd.DataFrame(
        {
            "run": [r.run_id for r in runs],
            "family": [r.family or "-" for r in runs],
            "params (B)": [r.params_b for r in runs],
            "steps logged": [len(r) for r in runs],
            "total steps": [r.total_steps for r in runs],
            "first reward": [float(r.rewards[: max(1, len(r) // 10)].mean()) for r in runs],
            "final reward": [final_reward(r.rewards) for r in runs],
        }
    )
    return [
        f"<p>{len(runs)} runs from {table.family.nunique()} model families. Progress is step / planned steps.</p>",
        _img(data_figure(runs), "reward curves by family and size"),
        "<details><summary>Runs</summary>" + _table(table, index=False) + "</details>",
    ]


def _diagnostics_section(model: FittedModel) -> list[str]:
    data = model.idata if model.idata is not None else model.population
    names = [v for v in TRACE_VARS if v in model.population]
    levels = ["fam_gain", "fam_tau"] + [v for v in ("src_gain_sd", "src_tau_sd") if v in model.population]
    summary = az.summary(data, var_names=names + levels + ["sig_mu", "r0_sd"], kind="all", hdi_prob=0.9)
    body = []
    if model.diagnostics is not None:
        d = model.diagnostics
        verdict = '<span class="ok">looks converged</span>' if d.ok else '<span class="bad">check convergence</span>'
        body.append(
            f"<p>Sampler <code>{html.escape(d.sampler)}</code>, {d.seconds:.0f} s: max r_hat {d.max_r_hat:.3f}, "
            f"min bulk ESS {d.min_ess_bulk:.0f}, <b>{d.divergences}</b> divergences — {verdict}.</p>"
        )
        if d.unmixed_runs:
            body.append(
                f"<p>The chains disagree on the curves of these runs (a per-run r_hat of at least {UNMIXED_R_HAT}; "
                f"see the fit's warning): {html.escape(', '.join(d.unmixed_runs))}.</p>"
            )
    if model.idata is not None and "diverging" in model.idata.get("sample_stats", {}):
        per_chain = model.idata.sample_stats["diverging"].sum("draw").values
        body.append(f"<p>Divergences per chain: {', '.join(str(int(v)) for v in per_chain)}.</p>")
    steps = steps_per_chain(model.idata) if model.idata is not None else None
    if steps is not None:
        # One chain far above the others adapted a tiny step size: the fit was slow, not wrong.
        body.append(f"<p>Leapfrog steps per draw, per chain: {', '.join(f'{v:.0f}' for v in steps.values)}.</p>")
    body.append(_table(summary))
    panels = sum(int(np.prod([n for d, n in model.population[v].sizes.items() if d not in ("chain", "draw")])) for v in names)
    if model.population.sizes.get("chain", 1) > 1:
        axes = az.plot_rank(model.population, var_names=names, kind="vlines", figsize=(12, 2.6 * -(-panels // 3)))
        body.append("<p>Rank plots: uniform ranks across chains mean the chains agree.</p>")
    else:
        axes = az.plot_trace(model.population, var_names=names, figsize=(12, 1.6 * panels))
    fig = np.ravel(axes)[0].figure
    fig.tight_layout()
    body.append(_img(fig, "rank plots of population variables"))
    return body


def _ppc_section(model: FittedModel, shown: Sequence[RunLog]) -> list[str]:
    fitted = set() if model.idata is None else {str(r) for r in model.idata.posterior["run"].values}
    runs = [r for r in shown if r.run_id in fitted]
    if not runs:
        return [_note("No posterior predictive check: the model has no full fit (fit.nc) for these runs; fit them with <code>bayes-grpo fit</code>.")]
    return [
        "<p>Posterior predictive of the hierarchical fit: the dark band is the 90% interval of the mean curve, "
        "the light band adds step noise (Student-t). Observed rewards should sit inside the light band.</p>",
        _img(ppc_figure(model, runs), "posterior predictive checks"),
    ]


def _loo_section(model: FittedModel, comparison: pd.DataFrame | None, quick: bool) -> list[str]:
    body = []
    if comparison is not None:
        body.append("<p>Curve forms ranked by PSIS-LOO expected log predictive density (higher elpd_loo is better).</p>")
        body.append(_table(comparison))
        axes = az.plot_compare(comparison, figsize=(8, 1 + 0.5 * len(comparison)))
        body.append(_img(np.ravel(axes)[0].figure, "LOO comparison of curve forms"))
        return body
    if quick or model.idata is None or "log_likelihood" not in model.idata:
        reason = " in quick mode" if quick else " (no full fit with pointwise log-likelihood stored)"
        body.append(_note(
            "Comparison of curve forms skipped" + reason
            + ". Run it with <code>bayes-grpo report --compare</code> or "
            "<code>bayes_grpo.model.compare_forms(runs)</code> and pass the table to <code>write_report(comparison=...)</code>."
        ))
        return body
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # high Pareto k is reported in the table instead
        loo = az.loo(model.idata)
    frame = pd.DataFrame({model.form: {"elpd_loo": loo.elpd_loo, "se": loo.se, "p_loo": loo.p_loo,
                                      "pareto k > 0.7": int((loo.pareto_k.values > 0.7).sum())}}).T
    body.append(f"<p>PSIS-LOO of the fitted {html.escape(model.form)} form (other forms not fitted; see "
                "<code>bayes-grpo report --compare</code>).</p>")
    body.append(_table(frame))
    return body


def _effects_section(model: FittedModel) -> list[str]:
    pop = model.population
    effects = az.summary(pop, var_names=list(EFFECT_VARS), kind="stats", hdi_prob=0.9)
    prob_positive = {v: float((pop[v] > 0).mean()) for v in EFFECT_VARS}
    effects["P(>0)"] = [prob_positive[v] for v in effects.index]
    axes = az.plot_forest(pop, var_names=list(EFFECT_VARS), combined=True, hdi_prob=0.9, figsize=(7, 3))
    ax = np.ravel(axes)[0]
    ax.axvline(0, color="k", lw=0.6, ls=":")
    ax.set_title("population effects (90% HDI)", fontsize=10)
    body = [
        "<p><code>*_size</code>: effect of log10 model size; <code>*_init</code>: effect of the initial reward; "
        f"<code>gain_*</code> act on the (asinh) gain {'by the end of the planned run' if model.model_config.gain_at == 'plan_end' else 'of the whole curve'}, "
        "<code>tau_*</code> on the log timescale of the rise "
        "(negative = faster).</p>",
        _table(effects),
        _img(ax.figure, "forest plot of population effects"),
    ]
    axes = az.plot_forest(pop, var_names=["fam_gain", "fam_tau"], combined=True, hdi_prob=0.9, figsize=(7, 1 + 0.45 * 2 * pop.sizes["family"]))
    ax = np.ravel(axes)[0]
    ax.axvline(0, color="k", lw=0.6, ls=":")
    ax.set_title("family effects (90% HDI)", fontsize=10)
    body.append(_img(ax.figure, "forest plot of family effects"))
    if "src_gain" in pop:
        body.append(
            "<p>Source effects (repository / recipe / task): a run from a source the model has not seen gets "
            f"none, with the spread between sources added (gain: {float(pop['src_gain_sd'].mean()):.2f} x gain_sd, "
            f"log timescale: {float(pop['src_tau_sd'].mean()):.2f}, posterior means).</p>"
        )
        axes = az.plot_forest(pop, var_names=["src_gain", "src_tau"], combined=True, hdi_prob=0.9,
                              figsize=(7, 1 + 0.3 * 2 * pop.sizes["source"]))
        ax = np.ravel(axes)[0]
        ax.axvline(0, color="k", lw=0.6, ls=":")
        ax.set_title("source effects (90% HDI)", fontsize=10)
        body.append(_img(ax.figure, "forest plot of source effects"))
    return body


def _inline(text: str) -> str:
    """Escaped text with `code` spans."""
    return re.sub(r"`([^`]+)`", r"<code>\1</code>", html.escape(text))


def _markdown_to_html(text: str) -> str:
    """Headings, pipe tables, paragraphs and `code` of a small markdown text (what the benchmarks write)."""
    out: list[str] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i].strip()
        if line.startswith("|"):
            rows = []
            while i < len(lines) and lines[i].strip().startswith("|"):
                cells = [_inline(c.strip()) for c in lines[i].strip().strip("|").split("|")]
                if not all(re.fullmatch(r":?-{2,}:?", c) for c in cells):
                    rows.append(cells)
                i += 1
            head, *rest = rows
            out.append("<table><tr>" + "".join(f"<th>{c}</th>" for c in head) + "</tr>"
                       + "".join("<tr>" + "".join(f"<td>{c}</td>" for c in r) + "</tr>" for r in rest) + "</table>")
            continue
        heading = re.match(r"(#{1,4})\s+(.*)", line)
        if re.fullmatch(r"!\[[^\]]*\]\([^)]*\)", line):
            pass  # an image file reference: the report reads no file; pass the image itself (figure or PNG bytes)
        elif heading:
            level = min(6, len(heading.group(1)) + 2)
            out.append(f"<h{level}>{_inline(heading.group(2))}</h{level}>")
        elif line:
            out.append(f"<p>{_inline(line)}</p>")
        i += 1
    return "\n".join(out)


#: What a results section may hold: markdown text, a table, a matplotlib figure, or PNG bytes.
ResultItem = Union[str, pd.DataFrame, "Figure", bytes]


def _result_html(item: ResultItem, title: str) -> str:
    if isinstance(item, str):
        return _markdown_to_html(item)
    if isinstance(item, pd.DataFrame):
        return _table(item, index=False)
    if isinstance(item, bytes):
        return f'<img alt="{html.escape(title)}" src="data:image/png;base64,{base64.b64encode(item).decode("ascii")}">'
    return _img(item, title)


def _check_results(results: Mapping[str, Sequence[ResultItem]] | None) -> None:
    """Fail before any work when a results item cannot be rendered."""
    for title, items in (results or {}).items():
        for item in items:
            if not (isinstance(item, (str, bytes, pd.DataFrame)) or hasattr(item, "savefig")):
                raise ModelError(f"results[{title!r}]: cannot render a {type(item).__name__}; pass markdown text, a DataFrame, a figure or PNG bytes")


def _results_section(results: Mapping[str, Sequence[ResultItem]] | None) -> list[str]:
    if not results:
        return [_note(
            "No benchmark results were passed to this report. The scripts in <code>benchmarks/</code> "
            "(<code>calibration.py</code>, <code>backtest_stopping.py</code>, <code>compare_forms.py</code>, ...) write "
            "them to <code>benchmarks/results/</code>; pass them with <code>write_report(results=...)</code> "
            "or <code>bayes-grpo report --results benchmarks/results</code>."
        )]
    body = []
    for title, items in results.items():
        body.append(f"<h3>{html.escape(title)}</h3>")
        body += [_result_html(item, title) for item in items]
    return body


def _stop_section(model: FittedModel, shown: Sequence[RunLog], progress: bool) -> list[str]:
    return [
        f"<p>Probability that less than the tolerance ({STOP_TOLERANCE:.0%} of the 10-90% spread of the rewards logged so far, "
        "the stop rule's default) is still to gain by the planned end, computed at each point as if training stopped there. "
        f"The dashed line marks where it first crosses the default threshold, {STOP_THRESHOLD:g}: stopping there saves the rest "
        "of the steps.</p>",
        _img(stop_figure(model, shown, progress=progress), "stop probability across training"),
    ]


def write_report(
    model: FittedModel,
    runs: Sequence[RunLog],
    path: str | os.PathLike,
    *,
    quick: bool = False,
    comparison: pd.DataFrame | None = None,
    n_shown: int = 4,
    results: Mapping[str, Sequence[ResultItem]] | None = None,
    progress: bool = True,
) -> Path:
    """Write one self-contained HTML report for ``model`` and ``runs`` to ``path`` and return the path.

    Sections: data, sampler diagnostics, posterior predictive checks, LOO
    comparison of curve forms, population and family effects, forecast fan
    charts from 20/30/50% of the planned steps, each reward function's forecast
    (the first run that logs two or more, from 30% of its steps), stop
    probability through training, and the precomputed ``results``. Nothing is fitted and no file is
    read: the report renders what it is given.

    Parameters
    ----------
    model : FittedModel
        The fitted model to describe and forecast with.
    runs : sequence of RunLog
        Runs to show (the per-run figures show ``n_shown`` of them).
    path : path
        HTML file to write (its folder is created).
    quick : bool
        Quick mode: without ``comparison``, the LOO section is a note.
    comparison : pandas.DataFrame, optional
        An ``az.compare`` table of curve forms (e.g. from
        :func:`bayes_grpo.model.compare_forms`); without it, the fitted form's
        own PSIS-LOO is shown when the fit kept its pointwise log-likelihood.
    n_shown : int
        Runs shown in the per-run figures.
    results : mapping, optional
        Section title -> items to embed, in order: markdown text (headings,
        pipe tables, paragraphs), a DataFrame, a matplotlib figure, or PNG
        bytes; e.g. the files the benchmark scripts write to ``benchmarks/results/``.
    progress : bool
        Show progress bars.

    Returns
    -------
    pathlib.Path
        The written file.

    Raises
    ------
    ModelError
        No runs, or a results item that cannot be rendered.

    Example
    -------
    >>> md = Path("benchmarks/results/calibration.md").read_text()  # doctest: +SKIP
    >>> write_report(model, runs, "report.html", results={"Calibration": [md]})  # doctest: +SKIP
    """
    runs = list(runs)
    if not runs:
        raise ModelError("write_report needs at least one run")
    _check_results(results)
    shown = pick_runs(runs, n_shown)
    steps = [
        ("data", "Data", lambda: _data_section(runs)),
        ("diagnostics", "Sampler diagnostics", lambda: _diagnostics_section(model)),
        ("ppc", "Posterior predictive checks", lambda: _ppc_section(model, shown)),
        ("loo", "LOO comparison of curve forms", lambda: _loo_section(model, comparison, quick)),
        ("effects", "Population effects", lambda: _effects_section(model)),
        ("forecasts", "Forecasts from 20%, 30% and 50% of the steps", lambda: _forecast_section(model, shown, progress)),
        ("components", "Reward functions", lambda: _components_section(model, runs)),
        ("stopping", "Stop probability across training", lambda: _stop_section(model, shown, progress)),
        ("benchmarks", "Benchmarks", lambda: _results_section(results)),
    ]
    with np.errstate(all="ignore"):  # overflow in far-out curve draws is harmless
        sections = [_section(anchor, title, build()) for anchor, title, build in tqdm(steps, desc="report", disable=not progress)]
    nav = "".join(f'<a href="#{a}">{html.escape(t.split(" from ")[0])}</a>' for a, t, _ in steps)
    config = ", ".join(f"{k}={v}" for k, v in model.config.items() if k in ("n_runs", "draws", "tune", "chains", "seed"))
    page = (
        f"<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>bayes_grpo report</title>"
        f"<style>{_CSS}</style></head><body>\n<h1>bayes_grpo report</h1>\n"
        f"<p>{datetime.now():%Y-%m-%d %H:%M} · curve form <b>{html.escape(model.form)}</b> · {html.escape(config)}"
        f"{' · quick mode' if quick else ''}</p>\n<nav>{nav}</nav>\n" + "\n".join(sections) + "\n</body></html>\n"
    )
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(page, encoding="utf-8")
    return out

