"""Backtest the plateau stopping rule against fixed-fraction, patience and Optuna baselines.

Replays every bundled run (``data/runs``) and every external real run
(``../shared/external_runs/runs``) as the live callback would (see
:mod:`bayes_grpo.backtest`), and writes to ``benchmarks/results/``:

* ``backtest_stopping_runs.csv``: one row per (run, rule, threshold, tolerance);
* ``backtest_stopping.csv`` / ``backtest_stopping.md``: the summary and trade-off tables.

Usage::

    python benchmarks/backtest_stopping.py [--model DIR] [--limit N] [--tolerances 0.01,0.02] [--traces CACHE.pkl]
"""

from __future__ import annotations

import argparse
import pickle
import time
from pathlib import Path

import pandas as pd

import bayes_grpo as bg
from bayes_grpo.backtest import evaluate, summarise, trace

ROOT = Path(__file__).resolve().parents[1]
EXTERNAL = ROOT.parent / "shared" / "external_runs" / "runs"
RESULTS = ROOT / "benchmarks" / "results"
THRESHOLDS = (0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.99)
DEFAULT_THRESHOLD, DEFAULT_TOLERANCE = 0.9, 0.01


def _runs(limit: int | None) -> list[tuple[str, bg.RunLog]]:
    sets = []
    try:
        sets += [("bundled", r) for r in bg.load_runs()]
    except bg.LogError as exc:
        print(f"no bundled runs: {exc}")
    if EXTERNAL.is_dir():
        sets += [("external", r) for r in bg.load_runs(EXTERNAL)]
    return sets[:limit] if limit else sets


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="saved model folder (default: bg.default_model())")
    parser.add_argument("--limit", type=int, help="only the first N runs (smoke test)")
    parser.add_argument("--tolerances", default="0.005,0.01,0.02,0.05", help="comma-separated tolerances")
    parser.add_argument("--n-draws", type=int, default=400)
    parser.add_argument("--drift", type=float, help="forecast model-discrepancy drift (default: the model's own)")
    parser.add_argument("--traces", help="pickle file caching the replays: read when it exists, else written")
    parser.add_argument("--checks", type=int, default=50, help="checks per run (every n // checks logged points)")
    args = parser.parse_args()
    tolerances = [float(t) for t in args.tolerances.split(",")]

    if args.traces and Path(args.traces).is_file():
        traces = pickle.loads(Path(args.traces).read_bytes())
    else:
        model = bg.load_model(args.model) if args.model else bg.default_model()
        traces, start = [], time.perf_counter()
        for source, run in _runs(args.limit):
            t0 = time.perf_counter()
            traces.append(trace(model, run, source=source, checks=args.checks, n_draws=args.n_draws, drift=args.drift))
            print(f"{source:8s} {run.run_id:50s} {len(run):5d} pts {len(traces[-1].indices):3d} checks {time.perf_counter() - t0:5.1f}s", flush=True)
        print(f"replayed {len(traces)} runs in {time.perf_counter() - start:.0f}s")
        if args.traces:
            Path(args.traces).write_bytes(pickle.dumps(traces))

    results = evaluate(traces, THRESHOLDS, tolerances)
    RESULTS.mkdir(parents=True, exist_ok=True)
    results.to_csv(RESULTS / "backtest_stopping_runs.csv", index=False)
    tables = {}
    for source in ["all", *sorted(results["source"].unique())]:
        subset = results if source == "all" else results[results["source"] == source]
        tables[source] = summarise(subset).assign(set=source)
    summary = pd.concat(tables.values(), ignore_index=True)
    summary.to_csv(RESULTS / "backtest_stopping.csv", index=False)

    lines = ["# Plateau stopping backtest", "", f"Runs: {results.groupby('source')['run_id'].nunique().to_dict()}.",
             f"Targets at the default (threshold {DEFAULT_THRESHOLD}, tolerance {DEFAULT_TOLERANCE}): "
             "median regret <= 0.02, share with regret > 0.05 <= 10%, mean saved >= 20%.", ""]
    for source, table in tables.items():
        lines += [f"## {source} runs", "", _markdown(table.drop(columns="set")), ""]
    text = "\n".join(lines)
    (RESULTS / "backtest_stopping.md").write_text(text)
    print(text)


def _markdown(table: pd.DataFrame) -> str:
    cols = list(table.columns)
    fmt = lambda v: "" if pd.isna(v) else (f"{v:.3f}" if isinstance(v, float) else str(v))  # noqa: E731
    rows = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    rows += ["| " + " | ".join(fmt(v) for v in row) + " |" for row in table.itertuples(index=False)]
    return "\n".join(rows)


if __name__ == "__main__":
    main()
