"""Figures and summary statistics of the bundled sweep, for the data card (``data/README.md``).

``python -m bayes_grpo.experiments.card --runs data/runs --figure data/curves.png`` draws all
curves by family and size and prints the measured statistics as Markdown.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd

SMOOTH = 20  # steps of the rolling mean used for "final reward" and curve comparisons
TAKEOFF = 0.1  # a run whose gain is below this fraction of the reward range never took off


def load(runs: Path) -> list[tuple[dict, pd.DataFrame]]:
    """(metadata, per-step table) of every run in ``runs``."""
    out = []
    for m in sorted(runs.glob("*.meta.json")):
        out.append((json.loads(m.read_text()), pd.read_csv(m.with_name(m.name.replace(".meta.json", ".csv")))))
    return out


def smooth(df: pd.DataFrame) -> pd.Series:
    """Rolling mean of the reward over ``SMOOTH`` steps."""
    return df["reward"].rolling(SMOOTH, min_periods=1).mean()


def gain_fraction(meta: dict, df: pd.DataFrame) -> float:
    """(final - initial reward) / reward range; final = mean of the last ``SMOOTH`` steps."""
    lo, hi = meta["reward_range"]
    return (float(df["reward"].iloc[-SMOOTH:].mean()) - meta["initial_reward"]) / (hi - lo)


def curve_gap(a: pd.DataFrame, b: pd.DataFrame) -> tuple[float, float]:
    """Mean and max absolute difference between two smoothed reward curves."""
    d = (smooth(a) - smooth(b)).abs()
    return float(d.mean()), float(d.max())


def summary(runs: list[tuple[dict, pd.DataFrame]]) -> dict:
    """Measured statistics of the sweep (gains, take-off, seed spread, speed)."""
    gains = np.array([gain_fraction(m, d) for m, d in runs])
    by_cfg: dict[tuple, list] = {}
    for m, d in runs:
        by_cfg.setdefault((m["family"], m["size"], m["warmup"]["label_noise"]), []).append((m, d))
    seed_groups = {k: v for k, v in by_cfg.items() if len(v) > 1}
    spread = {}
    for k, group in seed_groups.items():
        finals = [float(d["reward"].iloc[-SMOOTH:].mean()) for _, d in group]
        gaps = [curve_gap(group[i][1], group[j][1]) for i in range(len(group)) for j in range(i + 1, len(group))]
        spread["/".join(map(str, k))] = {
            "seeds": [m["seeds"]["run"] for m, _ in group],
            "initial_reward": [m["initial_reward"] for m, _ in group],
            "final_reward": [round(f, 3) for f in finals],
            "final_sd": round(float(np.std(finals, ddof=1)), 4),
            "mean_abs_curve_gap": round(float(np.mean([g[0] for g in gaps])), 4),
            "max_abs_curve_gap": round(float(np.max([g[1] for g in gaps])), 4),
        }
    sps = pd.DataFrame([{"size": m["size"], "n_params": m["n_params"], "s_per_step": m["s_per_step"],
                         "wall_time_s": m["wall_time_s"]} for m, _ in runs])
    return {
        "runs": len(runs), "median_gain_fraction": round(float(np.median(gains)), 3),
        "gain_fraction_quartiles": [round(float(q), 3) for q in np.quantile(gains, [0.25, 0.75])],
        "never_took_off": [f"{m['family']}-{m['size']}-noise{m['warmup']['label_noise']}-s{m['seeds']['run']}"
                           for (m, _), g in zip(runs, gains) if g < TAKEOFF],
        "seed_spread": spread,
        "s_per_step_by_size": sps.groupby("size")[["n_params", "s_per_step", "wall_time_s"]].median().round(4)
        .sort_values("n_params").to_dict("index"),
        "total_wall_time_s": round(float(sps["wall_time_s"].sum())),
    }


def figure(runs: list[tuple[dict, pd.DataFrame]], path: Path) -> None:
    """Grid of smoothed reward curves: rows = families, columns = sizes, colour = warm-up noise."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fams = sorted({m["family"] for m, _ in runs})
    sizes = sorted({m["size"] for m, _ in runs}, key=lambda s: min(m["n_params"] for m, _ in runs if m["size"] == s))
    noises = sorted({m["warmup"]["label_noise"] for m, _ in runs})
    colours = dict(zip(noises, plt.cm.viridis(np.linspace(0.0, 0.85, len(noises)))))
    fig, axes = plt.subplots(len(fams), len(sizes), figsize=(3.2 * len(sizes), 2.4 * len(fams)),
                             sharex=True, sharey=True, squeeze=False)
    for m, d in runs:
        ax = axes[fams.index(m["family"])][sizes.index(m["size"])]
        c = colours[m["warmup"]["label_noise"]]
        seed = m["seeds"]["run"]
        ax.plot(d["step"], d["reward"], color=c, alpha=0.12, lw=0.6)
        ax.plot(d["step"], smooth(d), color=c, lw=1.4, ls=("-", "--", ":")[seed % 3],
                label=f"noise {m['warmup']['label_noise']}" + (f" seed {seed}" if seed else ""))
        ax.scatter([0], [m["initial_reward"]], color=c, s=12, zorder=3)
        ax.set_title(f"{m['family']} {m['size']} ({m['n_params'] / 1e3:.0f}k params)", fontsize=9)
    for ax in axes[-1]:
        ax.set_xlabel("GRPO step")
    for row in axes:
        row[0].set_ylabel("reward")
        for ax in row:
            ax.set_ylim(-0.02, 1.3)
            ax.grid(alpha=0.3)
    handles, labels = axes[0][0].get_legend_handles_labels()
    for row in axes:
        for ax in row:
            h, lab = ax.get_legend_handles_labels()
            if len(h) > len(handles):
                handles, labels = h, lab
    fig.legend(handles, labels, loc="lower center", ncol=len(handles), fontsize=8, frameon=False)
    fig.suptitle("Bundled GRPO runs (reverse 3 digits; reward = correctness 1.0 + format 0.25)\n"
                 f"{SMOOTH}-step mean over the raw per-step reward; dot = initial reward before GRPO", fontsize=10)
    fig.tight_layout(rect=(0, 0.04, 1, 0.97))
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    """Print the statistics as JSON and write the figure."""
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--runs", default="data/runs")
    ap.add_argument("--figure", default="data/curves.png")
    opts = ap.parse_args(argv)
    runs = load(Path(opts.runs))
    figure(runs, Path(opts.figure))
    print(json.dumps(summary(runs), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
