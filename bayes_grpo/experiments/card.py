"""Curve-shape statistics, seed spread and a figure of the bundled sweep, for the data card (``data/README.md``).

``python -m bayes_grpo.experiments.card --runs data/runs --figure data/curves.png`` prints the
card's tables as Markdown: the shape statistics of the bundled runs beside the shared real
runs (when ``--shared`` names their CSVs' folder, or ``BAYES_GRPO_SHARED_RUNS`` the folder that
holds ``runs/``), runs per family x size cell, seed-to-seed spread per grid setting and speed;
and draws all curves. The package never looks for the shared runs on its own.

The shape statistics use the reference definitions of ``tools/curve_shapes.py`` in the shared
data folder (re-implemented here so the card works without it). Per run, with S the
Gaussian-kernel smoother of the reward (bandwidth 8% of the steps, ``measures.smoothed``):

* ``rise``: (S at end - S at start) / noise, noise = 1.4826 MAD(first differences) / sqrt(2);
* ``t50``: fraction of the steps at which S first reaches half its climb from start to max;
* ``decline``: (max S - S at end) / (max S - min S); "declined" when above 0.2;
* ``took_off``: S at end is above S at start by at least half of S's range;
* ``noise_rel``: noise / the run's 10-90% reward spread.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from bayes_grpo.measures import smoothed
from bayes_grpo.settings import SMOOTHING_BANDWIDTH

MIN_POINTS = 30  # runs with fewer logged rewards are left out, as in the shared tool
DECLINE_CUT = 0.2
STATISTICS = ("rise", "t50", "noise_rel")


def shape_stats(steps: np.ndarray, rewards: np.ndarray) -> dict[str, float]:
    """Shape statistics of one reward curve (definitions in the module docstring).

    Parameters
    ----------
    steps, rewards : numpy.ndarray
        Logged steps (increasing) and rewards.

    Returns
    -------
    dict
        ``rise``, ``t50`` (NaN when S never exceeds its start), ``decline``, ``took_off`` (0 or 1), ``noise_rel``.

    Example
    -------
    >>> s = np.arange(1.0, 101.0)
    >>> round(shape_stats(s, np.minimum(s / 50, 1.0) + 0.01 * np.sin(7 * s))["took_off"])
    1
    """
    steps = np.asarray(steps, dtype=float)
    r = np.asarray(rewards, dtype=float)
    span = steps.max() - steps.min() + 1
    curve = smoothed(steps, r, SMOOTHING_BANDWIDTH, span=span)
    d = np.diff(r)
    noise = 1.4826 * np.median(np.abs(d - np.median(d))) / np.sqrt(2) + 1e-9
    lo, hi = curve.min(), curve.max()
    climb = curve[-1] - curve[0]
    t50 = (steps[np.argmax(curve >= curve[0] + 0.5 * (hi - curve[0]))] - steps.min()) / span if hi > curve[0] else np.nan
    spread = max(float(np.percentile(r, 90) - np.percentile(r, 10)), 1e-9)
    return {"rise": climb / noise, "t50": t50, "decline": (hi - curve[-1]) / max(hi - lo, 1e-9),
            "took_off": float(climb >= 0.5 * max(hi - lo, 1e-9)), "noise_rel": noise / spread}


def folder_stats(folder: Path) -> pd.DataFrame:
    """Shape statistics of every CSV log in ``folder`` (one row per run, indexed by file stem).

    Parameters
    ----------
    folder : pathlib.Path
        Folder of CSV logs with ``step`` and ``reward`` columns (``index.csv`` is skipped).

    Returns
    -------
    pandas.DataFrame
    """
    rows = {}
    for f in sorted(Path(folder).glob("*.csv")):
        if f.name == "index.csv":
            continue
        df = pd.read_csv(f).dropna(subset=["reward"]).sort_values("step")
        if len(df) >= MIN_POINTS:
            rows[f.stem] = shape_stats(df["step"].to_numpy(float), df["reward"].to_numpy(float))
    return pd.DataFrame.from_dict(rows, orient="index")


def shape_summary(table: pd.DataFrame) -> dict[str, object]:
    """Median and IQR of each statistic, share that took off and share that declined."""
    out: dict[str, object] = {"n": len(table)}
    for c in STATISTICS:
        out[c] = [float(v) for v in table[c].quantile([0.25, 0.5, 0.75])]
    out["took_off"] = float(table["took_off"].mean())
    out["declined"] = float((table["decline"] > DECLINE_CUT).mean())
    return out


def load(runs: Path) -> list[tuple[dict, pd.DataFrame]]:
    """(metadata, per-step table) of every run in ``runs`` that has a ``.meta.json``."""
    return [(json.loads(m.read_text()), pd.read_csv(m.with_name(m.name.replace(".meta.json", ".csv"))))
            for m in sorted(Path(runs).glob("*.meta.json"))]


def _final(df: pd.DataFrame) -> float:
    return float(df["reward"].iloc[-max(1, len(df) // 10):].mean())


GRID_RECIPE = {"lr_scheduler_type": "constant_with_warmup", "beta": 0.0, "num_generations": 4, "prompts_per_step": 2}
"""Hyperparameters of the grid runs (``sweep.GRID_RECIPE``, 300 steps); other runs are the recipe and batch slices."""


BATCH_PROMPTS_PER_STEP = 16
"""Prompts per step of the batch slice (``sweep.BATCH_RECIPE``); its other hyperparameters are the grid's."""


def is_grid(meta: dict) -> bool:
    """True for a run of the family x size x level x seed grid, False for the recipe and batch slices."""
    h = meta["hyperparameters"]
    return meta["total_steps"] == 300 and all(h[k] == v for k, v in GRID_RECIPE.items())


def slice_of(meta: dict) -> str:
    """Part of the sweep a run belongs to: ``"grid"``, ``"batch"`` (grid recipe at 16 prompts per step) or ``"recipe"``.

    Example
    -------
    >>> h = {**GRID_RECIPE, "prompts_per_step": BATCH_PROMPTS_PER_STEP}
    >>> slice_of({"total_steps": 300, "hyperparameters": h})
    'batch'
    """
    if is_grid(meta):
        return "grid"
    h = meta["hyperparameters"]
    grid_otherwise = meta["total_steps"] == 300 and all(h[k] == v for k, v in GRID_RECIPE.items() if k != "prompts_per_step")
    return "batch" if grid_otherwise and h["prompts_per_step"] == BATCH_PROMPTS_PER_STEP else "recipe"


def seed_spread(runs: list[tuple[dict, pd.DataFrame]], part: str = "grid") -> pd.DataFrame:
    """Per setting (family, size, task, noise, learning rate) of one part of the sweep: initial and final reward across seeds, with their SDs.

    Parameters
    ----------
    runs : list of (dict, pandas.DataFrame)
        Output of :func:`load`.
    part : {"grid", "recipe", "batch"}
        Part of the sweep (:func:`slice_of`); settings with a single seed get SD NaN.

    Returns
    -------
    pandas.DataFrame
    """
    rows = []
    for m, d in runs:
        if slice_of(m) == part:
            rows.append({"family": m["family"], "size": m["size"], "task": m["task"], "noise": m["warmup"]["label_noise"],
                         "lr": m["hyperparameters"]["learning_rate"], "seed": m["seeds"]["run"],
                         "initial": m["initial_reward"], "final": _final(d)})
    t = pd.DataFrame(rows)
    g = t.groupby(["family", "size", "task", "noise", "lr"])
    return pd.DataFrame({"seeds": g["seed"].count(), "initial_mean": g["initial"].mean(), "initial_sd": g["initial"].std(),
                         "final_mean": g["final"].mean(), "final_sd": g["final"].std()}).reset_index()


def _fmt(q: list[float]) -> str:
    return f"{q[1]:.3f} ({q[0]:.3f}–{q[2]:.3f})"


def card_markdown(runs_dir: Path, shared: Path | None) -> str:
    """The card's measured tables as Markdown.

    Parameters
    ----------
    runs_dir : pathlib.Path
        Bundled runs (CSV + ``.meta.json``).
    shared : pathlib.Path or None
        Folder of the shared real runs' CSVs, or None to leave that column out.

    Returns
    -------
    str
    """
    runs = load(runs_dir)
    stats = folder_stats(runs_dir)
    ours = shape_summary(stats)
    cols = [("bundled", ours)]
    if shared is not None:
        cols.append(("shared real runs", shape_summary(folder_stats(shared))))
    head = " | ".join(f"{name} (n = {s['n']})" for name, s in cols)
    lines = [f"| statistic | {head} |", "|---|" + "---|" * len(cols)]
    for c in STATISTICS:
        lines.append(f"| {c.replace('noise_rel', 'noise / spread')} (median, IQR) | "
                     + " | ".join(_fmt(s[c]) for _, s in cols) + " |")
    for c in ("took_off", "declined"):
        lines.append(f"| {c.replace('_', ' ')} | " + " | ".join(f"{s[c]:.1%}" for _, s in cols) + " |")
    slices = pd.Series({p.name[: -len(".meta.json")]: slice_of(json.loads(p.read_text()))
                        for p in sorted(Path(runs_dir).glob("*.meta.json"))})
    parts = [(name, shape_summary(stats.loc[slices.index[slices == name].intersection(stats.index)]))
             for name in ("grid", "recipe", "batch") if (slices == name).any()]
    lines += ["", "The same statistics per part of the sweep (grid: 2 prompts x 4 generations per step; recipe: "
              "one recipe change each; batch: 16 prompts x 4 generations per step):", "",
              "| statistic | " + " | ".join(f"{name} (n = {s['n']})" for name, s in parts) + " |",
              "|---|" + "---|" * len(parts)]
    for c in STATISTICS:
        lines.append(f"| {c.replace('noise_rel', 'noise / spread')} (median, IQR) | "
                     + " | ".join(_fmt(s[c]) for _, s in parts) + " |")
    for c in ("took_off", "declined"):
        lines.append(f"| {c.replace('_', ' ')} | " + " | ".join(f"{s[c]:.1%}" for _, s in parts) + " |")
    meta = pd.DataFrame([{"family": m["family"], "size": m["size"], "n_params": m["n_params"], "task": m["task"],
                          "part": slice_of(m), "s_per_step": m["s_per_step"], "wall_time_s": m["wall_time_s"],
                          "warmup_time_s": m["warmup_time_s"], "initial": m["initial_reward"], "final": _final(d)}
                         for m, d in runs])
    cells = meta.pivot_table(index="family", columns="size", values="n_params", aggfunc="count").fillna(0)
    sizes = meta.groupby("size")["n_params"].median().sort_values().index
    lines += ["", "Runs per family × size cell (all runs; grid runs are 9 per cell):", "",
              "| family | " + " | ".join(sizes) + " |", "|---|" + "---|" * len(sizes)]
    lines += [f"| {f} | " + " | ".join(str(int(cells.loc[f, s])) for s in sizes) + " |" for f in cells.index]
    params = meta.groupby(["family", "size"])["n_params"].first().unstack()[list(sizes)].fillna(0)
    lines += ["", "Parameters:", "", "| family | " + " | ".join(sizes) + " |", "|---|" + "---|" * len(sizes)]
    lines += [f"| {f} | " + " | ".join(f"{int(params.loc[f, s]):,}" for s in sizes) + " |" for f in params.index]
    by_task = meta.groupby("task")[["initial", "final"]].median()
    lines += ["", "Median initial and final reward (mean of the last 10% of steps) per task:", "",
              "| task | runs | initial | final |", "|---|---|---|---|"]
    lines += [f"| {t} | {int((meta.task == t).sum())} | {r.initial:.3f} | {r.final:.3f} |" for t, r in by_task.iterrows()]
    lines += _seed_spread_lines("Seed-to-seed spread per grid setting (SD across seeds; final = mean of the last 10% of steps):",
                                seed_spread(runs))
    batch = seed_spread(runs, "batch") if any(slice_of(m) == "batch" for m, _ in runs) else pd.DataFrame()
    batch = batch[batch.seeds > 1] if len(batch) else batch
    if len(batch):
        lines += _seed_spread_lines("Seed-to-seed spread of the batch slice's replicated level (16 prompts per step):", batch)
    speed = meta.groupby(["part", "size"])[["n_params", "s_per_step", "warmup_time_s", "wall_time_s"]].median()
    speed = speed.reindex([(part, s) for part in ("grid", "recipe", "batch") for s in sizes]).dropna()
    lines += ["", "Speed (medians per part of the sweep and size; 1 torch thread per run on a shared 2-core CPU):", "",
              "| part | size | params | GRPO s/step | warm-up s | wall s per run |", "|---|---|---|---|---|---|"]
    lines += [f"| {part} | {s} | {int(r.n_params):,} | {r.s_per_step:.3f} | {r.warmup_time_s:.0f} | {r.wall_time_s:.0f} |"
              for (part, s), r in speed.iterrows()]
    lines += ["", f"Total run wall time {meta.wall_time_s.sum() / 3600:.2f} h over {len(meta)} runs."]
    return "\n".join(lines)


def figure(runs: list[tuple[dict, pd.DataFrame]], path: Path) -> None:
    """Grid of smoothed reward curves: rows = families, columns = sizes, colour = task.

    Parameters
    ----------
    runs : list of (dict, pandas.DataFrame)
        Output of :func:`load`.
    path : pathlib.Path
        PNG to write.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fams = sorted({m["family"] for m, _ in runs})
    sizes = sorted({m["size"] for m, _ in runs}, key=lambda s: min(m["n_params"] for m, _ in runs if m["size"] == s))
    task_names = sorted({m["task"] for m, _ in runs})
    colours = dict(zip(task_names, plt.cm.tab10(np.arange(len(task_names)))))
    fig, axes = plt.subplots(len(fams), len(sizes), figsize=(3.2 * len(sizes), 2.4 * len(fams)),
                             sharex=True, sharey=True, squeeze=False)
    for m, d in runs:
        ax = axes[fams.index(m["family"])][sizes.index(m["size"])]
        steps = d["step"].to_numpy(float)
        curve = smoothed(steps, d["reward"].to_numpy(float), SMOOTHING_BANDWIDTH)
        part = slice_of(m)
        ax.plot(steps, curve, color=colours[m["task"]], lw=1.0 if part == "grid" else 0.8,
                alpha=0.8 if part == "grid" else 0.6, ls={"grid": "-", "batch": "--", "recipe": ":"}[part],
                label=m["task"])
        ax.set_title(f"{m['family']} {m['size']} (~{m['n_params'] / 1e3:.0f}k params)", fontsize=9)
    for ax in axes[-1]:
        ax.set_xlabel("GRPO step")
    for row in axes:
        row[0].set_ylabel("reward (smoothed)")
        for ax in row:
            ax.grid(alpha=0.3)
    handles, labels = axes[0][0].get_legend_handles_labels()
    uniq = dict(zip(labels, handles))
    fig.legend(list(uniq.values()), list(uniq.keys()), loc="lower center", ncol=len(uniq), fontsize=8, frameon=False)
    fig.suptitle("Bundled GRPO runs (tasks add / sort / reverse; reward range 0–1.8)\n"
                 "Gaussian-kernel smoother, bandwidth 8% of steps; dashed = batch slice, dotted = recipe slice", fontsize=10)
    fig.tight_layout(rect=(0, 0.04, 1, 0.95))
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _seed_spread_lines(title: str, spread: pd.DataFrame) -> list[str]:
    """A :func:`seed_spread` table as Markdown lines, under ``title``, with the median SDs below it."""
    lines = ["", title, "",
             "| family | size | task | noise | GRPO lr | seeds | initial (mean ± sd) | final (mean ± sd) |",
             "|---|---|---|---|---|---|---|---|"]
    lines += [f"| {r.family} | {r['size']} | {r.task} | {r.noise:g} | {r.lr:g} | {r.seeds} | "
              f"{r.initial_mean:.3f} ± {r.initial_sd:.3f} | {r.final_mean:.3f} ± {r.final_sd:.3f} |"
              for _, r in spread.iterrows()]
    return lines + ["", f"Median SD across seeds: initial {spread.initial_sd.median():.3f}, final {spread.final_sd.median():.3f}."]


def _shared_runs_from_env() -> Path | None:
    """``runs/`` in the folder ``BAYES_GRPO_SHARED_RUNS`` names, or None when it is unset or has no ``runs/``."""
    folder = os.environ.get("BAYES_GRPO_SHARED_RUNS")
    return Path(folder) / "runs" if folder and (Path(folder) / "runs").is_dir() else None


def main(argv: list[str] | None = None) -> int:
    """Print the card's tables as Markdown and write the figure; returns 0."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", default="data/runs")
    ap.add_argument("--figure", default="data/curves.png", help="PNG to write ('' for none)")
    ap.add_argument(
        "--shared", default=None,
        help="folder of the shared real runs' CSVs (default: runs/ in the folder BAYES_GRPO_SHARED_RUNS names; none when unset)",
    )  # fmt: skip
    opts = ap.parse_args(argv)
    shared = Path(opts.shared) if opts.shared else _shared_runs_from_env()
    print(card_markdown(Path(opts.runs), shared))
    if opts.figure:
        figure(load(Path(opts.runs)), Path(opts.figure))
    return 0


if __name__ == "__main__":
    sys.exit(main())
