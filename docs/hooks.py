"""MkDocs hook: the pages that are built from the package, its notebooks and its benchmark results.

* **Figures.** ``{{ name }}`` in a page becomes the figure of that name from :func:`figures`:
  the shipped model's card (``FittedModel.fitted_on``, its families and diagnostics) and the
  benchmark results files. No page retypes them; ``tests/test_docs_figures.py`` holds the README,
  whose headline table cannot read them, to the same figures.
* **Notebooks.** The example notebooks stay where the tests run them (``notebooks/``, committed
  without outputs). The build executes them in quick mode (``BAYES_GRPO_QUICK=1``, a few minutes;
  cached in ``.cache/notebooks`` under a hash of the notebook and the package source) and puts
  the executed copies on the site as ``notebooks/<name>.ipynb``, rendered by mkdocs-jupyter;
  the first figure of each becomes its gallery thumbnail ``gallery/<name>.png``.
* **Benchmark results.** Each ``benchmarks/results/*.md`` becomes the page ``results/<name>.md``,
  with its figure: the one the benchmark wrote, or one drawn here from its CSV (Sphinx roles
  quoted from a script's docstring become code).
"""

from __future__ import annotations

import hashlib
import io
import os
import re
from functools import cache
from pathlib import Path

import nbformat
import pandas as pd
from mkdocs.plugins import event_priority
from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"
RESULTS = ROOT / "benchmarks" / "results"
EXECUTED = ROOT / ".cache" / "notebooks"
PLACEHOLDER = re.compile(r"\{\{\s*([\w.]+)\s*\}\}")
SPHINX_ROLE = re.compile(r":(?:func|class|data|attr|meth|mod|exc|obj|const):`~?([^`]+)`")
#: Results pages whose benchmark writes no figure: the figure drawn here from its CSV.
DRAWN_FIGURES = {"shapes": "shapes.png"}
REAL_CAPPED = "real runs, source-capped (each source counts as at most 3 runs)"


def _join(values) -> str:
    return " / ".join(values)


@cache
def figures() -> dict[str, str]:
    """Every figure a page may name as ``{{ name }}``, as the text it shows."""
    import bayes_grpo as bg

    model = bg.default_model()
    on, diagnostics = model.fitted_on, model.diagnostics
    sources = on["sources"]
    found = {
        "model.n_runs": f"{on['n_runs']}",
        "model.n_bundled": f"{sources['bundled (data/runs)']}",
        "model.n_real": f"{sources['shared (external runs)']}",
        "model.version": on["model_version"],
        "model.date": on["date"],
        "model.families": ", ".join(model.families),
        "model.n_families": f"{len(model.families)}",
        "model.r_hat": f"{diagnostics.max_r_hat:.3f}",
        "model.min_ess": f"{diagnostics.min_ess_bulk:.0f}",
        "model.divergences": f"{diagnostics.divergences}",
        "model.draws": f"{model.sampler_config.chains} × {model.sampler_config.draws:,}",
        "layer.beta": f"{model.recalibration.beta:.2f}" if model.recalibration is not None else "(no layer)",
        "layer.top_by_signal": " / ".join(f"{v:.1f}" for v in model.recalibration.top_by_signal) if model.recalibration is not None and model.recalibration.top_by_signal else "(pooled)",
    }
    calibration = pd.read_csv(RESULTS / "calibration.csv")
    capped = calibration[calibration["set"] == REAL_CAPPED].set_index("fraction").sort_index()
    found["calibration.coverage_90"] = _join(f"{v:.2f}" for v in capped["coverage_90"])
    found["calibration.quantile_score"] = _join(f"{v:.3f}" for v in capped["quantile_score"])
    found["calibration.error_30_50"] = _join(f"{capped.loc[f, 'error']:.3f}" for f in (0.3, 0.5))
    found["calibration.persistence_30_50"] = _join(f"{capped.loc[f, 'persistence']:.3f}" for f in (0.3, 0.5))
    found["calibration.above_q95"] = _join(f"{v:.0%}" for v in capped["above_q95"])
    ratio = re.search(r"Quantile score of the calibrated forecasts / the raw model's at [^:]*: ([\d.]+) / ([\d.]+) / ([\d.]+)", (RESULTS / "calibration.md").read_text(encoding="utf-8"))
    found["calibration.ratio"] = " / ".join(ratio.groups())
    found["calibration.ratio_30_50"] = " and ".join(f"{capped.loc[f, 'ratio_to_persistence']:.2f}" for f in (0.3, 0.5))
    stopping = pd.read_csv(RESULTS / "backtest_stopping.csv")
    rules = stopping[stopping["set"] == "real, source-capped"].set_index("rule")
    for key, rule in {"default": "bayes_grpo default", "fixed_90": "fixed 90%", "patient_10": "optuna PatientPruner(10)"}.items():
        found[f"stopping.{key}.saved"] = f"{rules.loc[rule, 'mean_saved']:.1%}"
        found[f"stopping.{key}.bad_stops"] = f"{rules.loc[rule, 'share_regret_gt_0.05']:.1%}"
    found["stopping.oracle.saved"] = f"{rules.loc['hindsight oracle (regret <= 0.05)', 'mean_saved']:.1%}"
    found["stopping.default.noise_bad"] = f"{rules.loc['bayes_grpo default', 'noise_bad']:.1%}"
    found["stopping.oracle.noise_bad"] = f"{rules.loc['hindsight oracle (regret <= 0.05)', 'noise_bad']:.1%}"
    frontier = pd.read_csv(RESULTS / "backtest_stopping_noise.csv").set_index("noise_budget")
    found["stopping.noise_frontier.saved"] = f"{frontier.loc[0.08, 'saved']:.1%}"
    components = pd.read_csv(RESULTS / "components.csv")
    for target, key in (("correctness function", "function"), ("summed reward", "summed")):
        part = components[components["target"] == target].set_index("fraction").sort_index()
        found[f"components.{key}.coverage_90"] = _join(f"{v:.2f}" for v in part["coverage_90"])
        found[f"components.{key}.above_q95"] = _join(f"{v:.0%}" for v in part["above_q95"])
        found[f"components.{key}.quantile_score"] = _join(f"{v:.3f}" for v in part["quantile_score"])
        found[f"components.{key}.ratio"] = _join(f"{v:.2f}" for v in part["ratio_to_persistence"])
    found["components.runs"] = f"{int(components['runs'].max())}"
    sparse = pd.read_csv(RESULTS / "components_sparse.csv").set_index("cut").sort_index()
    found["components.sparse.coverage_90"] = _join(f"{v:.2f}" for v in sparse["coverage_90"])
    found["components.sparse.seen"] = _join(f"{v}" for v in sparse["evaluations_seen"])
    found["components.sparse.runs"] = f"{int(sparse['runs'].max())}"
    sweeps = pd.read_csv(RESULTS / "backtest_sweeps.csv")
    for key, prefix in {
        "default": "bayes_grpo ForecastPruner (defaults", "veto20": "bayes_grpo ForecastPruner on MedianPruner, veto 0.2", "veto14": "bayes_grpo ForecastPruner on MedianPruner, veto 0.14",
        "alone": "bayes_grpo ForecastPruner alone (base=None", "patience1": "bayes_grpo ForecastPruner alone, patience 1",
        "from50": "bayes_grpo ForecastPruner alone, from 50%", "independent": "bayes_grpo ForecastPruner alone, forecast alone",
        "median": "Optuna MedianPruner (2 startup trials, 30% warm-up)",
        "halving": "Optuna SuccessiveHalvingPruner", "hyperband": "Optuna HyperbandPruner",
    }.items():  # fmt: skip
        row = sweeps[sweeps["pruner"].str.startswith(prefix)].iloc[0]
        found[f"sweeps.{key}.saved"] = f"{row['steps saved']:.0%}"
        found[f"sweeps.{key}.best_pruned"] = f"{row['best pruned']:.0%}"
    persistence = pd.read_csv(RESULTS / "sweep_persistence.csv").set_index("fraction").sort_index()
    for share in (0.3, 0.5):
        row = persistence.loc[share]
        found[f"persistence.{round(100 * share)}"] = (
            f"{row['trailing_end_best']:.0%} of the trials below the median ended best ({row['leading_end_best']:.0%} of those "
            f"above it; {row['chance_end_best']:.0%} by chance)"
        )
    sweep_order = pd.read_csv(RESULTS / "backtest_sweeps_order.csv")
    source_order = pd.read_csv(RESULTS / "source_order.csv")
    for share in (0.3, 0.5):
        by_order = sweep_order[sweep_order["fraction"] == share].set_index("order")
        ranked, current = by_order.loc["rank (its table order)"], by_order.loc["current smoothed reward"]
        found[f"order.sweeps.{round(100 * share)}"] = (
            f"Kendall tau {ranked['kendall_tau']:.2f} and {int(ranked['top1_hits'])} top picks of {int(ranked['sweeps'])} sweeps, against "
            f"{current['kendall_tau']:.2f} and {int(current['top1_hits'])}"
        )
        by_order = source_order[source_order["fraction"] == share].set_index("order")
        ranked, current = by_order.loc["forecast median"], by_order.loc["current smoothed reward"]
        found[f"order.sources.{round(100 * share)}"] = (
            f"{ranked['kendall_tau']:.2f} against {current['kendall_tau']:.2f} over {int(ranked['sources'])} sources (90% bootstrap interval of "
            f"the difference {ranked['tau_minus_current_q05']:+.2f} to {ranked['tau_minus_current_q95']:+.2f})"
        )
    coupling = pd.read_csv(RESULTS / "sweep_coupling.csv").set_index("fraction").sort_index()
    found["coupling.correlation"] = _join(f"{v:.2f}" for v in coupling["correlation"])
    found["coupling.q90_q95_30"] = f"{coupling.loc[0.3, 'z_q90']:.1f} and {coupling.loc[0.3, 'z_q95']:.1f}"
    checks = re.search(r"Spec checks \((\d+) of (\d+) met\)", (RESULTS / "shapes.md").read_text(encoding="utf-8"))
    found["shapes.checks_met"], found["shapes.checks"] = checks.groups()
    speed = re.search(r"\| forecast of a 1000-step log \| ([\d.]+) \|", (RESULTS / "forecast_speed.md").read_text(encoding="utf-8"))
    found["speed.forecast_s"] = f"{float(speed.group(1)):.2f}"
    return found


def fill(markdown: str, where: str) -> str:
    """``markdown`` with each ``{{ name }}`` replaced by its figure; an unknown name is an error."""
    known = figures()

    def replace(match: re.Match[str]) -> str:
        if match.group(1) not in known:
            raise KeyError(f"{where}: no figure named {match.group(1)!r} (docs/hooks.py: figures)")
        return known[match.group(1)]

    return PLACEHOLDER.sub(replace, markdown)


# ------------------------------------------------------------------ notebooks


def _source_hash(notebook: Path) -> str:
    digest = hashlib.sha256(notebook.read_bytes())
    for path in sorted((ROOT / "bayes_grpo").rglob("*")):
        if path.is_file() and path.suffix in (".py", ".nc"):
            digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def executed(notebook: Path) -> Path:
    """The notebook run top to bottom in quick mode (from the cache when nothing changed)."""
    from nbclient import NotebookClient

    target = EXECUTED / f"{notebook.stem}-{_source_hash(notebook)}" / "notebooks" / notebook.name
    if target.exists():
        return target
    nb = nbformat.read(notebook, as_version=4)
    quick, os.environ["BAYES_GRPO_QUICK"] = os.environ.get("BAYES_GRPO_QUICK"), "1"
    try:
        NotebookClient(nb, timeout=900, kernel_name="python3", resources={"metadata": {"path": str(NOTEBOOKS)}}).execute()
    finally:
        if quick is None:
            del os.environ["BAYES_GRPO_QUICK"]
        else:
            os.environ["BAYES_GRPO_QUICK"] = quick
    target.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, target)
    return target


def first_figure(notebook: Path) -> bytes:
    """The first PNG a notebook's outputs hold."""
    import base64

    nb = nbformat.read(notebook, as_version=4)
    for cell in nb.cells:
        for output in cell.get("outputs", []):
            if "image/png" in output.get("data", {}):
                return base64.b64decode(output["data"]["image/png"])
    raise ValueError(f"{notebook.name}: no figure in its outputs")


# ------------------------------------------------------------ results figures


def _png(fig) -> bytes:
    import matplotlib.pyplot as plt

    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    return buffer.getvalue()


def shapes_figure() -> bytes:
    """90% coverage of each canonical shape at 20/30/50% observed, by reward scale."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    table = pd.read_csv(RESULTS / "shapes.csv")
    settings = sorted(table["setting"].unique())
    fig, axes = plt.subplots(1, len(settings), figsize=(5 * len(settings), 3.6), sharey=True, squeeze=False)
    for ax, setting in zip(axes[0], settings):
        wide = table[table["setting"] == setting].pivot(index="shape", columns="fraction", values="coverage_90")
        wide.columns = [f"{f:.0%} observed" for f in wide.columns]
        wide.plot.barh(ax=ax, width=0.8)
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))
        ax.axvline(0.85, color="k", lw=0.8, ls=":")
        ax.set(title=f"{setting} reward scale", xlabel="90% interval coverage (target >= 0.85)", xlim=(0, 1), ylabel="")
    return _png(fig)


DRAW = {"shapes": shapes_figure}


# ---------------------------------------------------------------------- events


#: "Edit this page" links, relative to ``repo_url`` (set only when the build is given one).
EDIT_URI = "edit/main/docs/"


def on_config(config):
    """Edit links need a repository: without ``repo_url`` the site has none (and no warning for them)."""
    if config["repo_url"]:
        config["edit_uri"] = config["edit_uri"] or EDIT_URI
    return config


@event_priority(100)
def on_files(files: Files, config) -> Files:
    """Add the executed notebooks, their thumbnails and the benchmark results pages (before mkdocs-jupyter)."""
    for notebook in sorted(NOTEBOOKS.glob("*.ipynb")):
        run = executed(notebook)
        # A plain File (mkdocs-jupyter wraps it): the executed copy lies at <cache entry>/notebooks/<name>.
        files.append(File(f"notebooks/{notebook.name}", str(run.parent.parent), config["site_dir"], config["use_directory_urls"]))
        files.append(File.generated(config, f"gallery/{notebook.stem}.png", content=first_figure(run)))
    for result in sorted(RESULTS.glob("*.md")):
        files.append(File.generated(config, f"results/{result.name}", abs_src_path=str(result)))
    for image in sorted(RESULTS.glob("*.png")):
        files.append(File.generated(config, f"results/{image.name}", abs_src_path=str(image)))
    for stem, draw in DRAW.items():
        files.append(File.generated(config, f"results/{DRAWN_FIGURES[stem]}", content=draw()))
    return files


def on_page_markdown(markdown: str, page, config, files) -> str:
    """Fill the figures in; give a results page whose benchmark drew no figure the one drawn here."""
    markdown = fill(markdown, page.file.src_uri)
    stem = Path(page.file.src_uri).stem
    if page.file.src_uri.startswith("results/"):  # a benchmark's text may quote its script's docstring roles
        markdown = SPHINX_ROLE.sub(r"`\1`", markdown)
    if page.file.src_uri.startswith("results/") and stem in DRAWN_FIGURES:
        heading, _, rest = markdown.partition("\n")
        markdown = f"{heading}\n\n![{stem}]({DRAWN_FIGURES[stem]})\n{rest}"
    if page.file.src_uri.startswith(SEARCH_BOOSTED):  # how-to pages rank above the API reference in search
        page.meta.setdefault("search", {}).setdefault("boost", SEARCH_BOOST)
    return markdown


# ---------------------------------------------------------------------- search

#: Pages that answer "how do I ...": the search ranks them above the API reference (Material's
#: per-page ``search: boost``), so that "stop my run early" finds the guides first.
SEARCH_BOOSTED = ("guide/", "getting-started.md", "faq.md")
SEARCH_BOOST = 2
#: Notebook chrome that mkdocs-jupyter renders around each cell, kept out of the search index:
#: the "In [n]:"/"Out[n]:" prompts, the copy button (its hidden "Copied!" notice) and the hidden
#: plain-text copy of each cell's code, which the copy button reads (the code would be indexed twice).
NOTEBOOK_CHROME = re.compile(r'<div class="(jp-InputPrompt|jp-OutputPrompt|zeroclipboard-container|clipboard-copy-txt)\b')


def on_page_content(html: str, page, config, files) -> str:
    """Mark the notebook chrome ``data-search-exclude`` (Material's search skips it, then drops the mark)."""
    if page.file.src_uri.startswith("notebooks/"):
        html = NOTEBOOK_CHROME.sub(r'<div data-search-exclude="true" class="\1', html)
    return html


def on_page_context(context, page, config, nav):
    """No "edit this page" on pages built from files outside docs/ (results, notebooks): edit their sources."""
    if page.file.src_uri.startswith(("results/", "notebooks/")):
        page.edit_url = None
    return context
