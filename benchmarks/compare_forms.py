"""LOO comparison of the curve forms (Weibull, logistic, exponential) with ArviZ.

Fits the hierarchy once per form on the bundled and external runs and ranks the
forms by PSIS-LOO expected log predictive density (az.compare). Writes
benchmarks/results/loo_forms.{md,csv}.

    python benchmarks/compare_forms.py [--draws 500]
"""

from __future__ import annotations

import argparse
import warnings
from pathlib import Path

import bayes_grpo as bg
from bayes_grpo.model import compare_forms

RESULTS = Path(__file__).resolve().parent / "results"
EXTERNAL = Path(__file__).resolve().parents[2] / "shared" / "external_runs" / "runs"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--draws", type=int, default=500)
    parser.add_argument("--external", type=Path, default=EXTERNAL)
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    runs = list(bg.load_runs()) + (list(bg.load_runs(args.external)) if args.external.is_dir() else [])
    table, fits = compare_forms(runs, draws=args.draws, tune=args.draws, progressbar=False)
    for form, fitted in fits.items():
        print(f"{form}: {fitted.diagnostics}")
    RESULTS.mkdir(parents=True, exist_ok=True)
    table.to_csv(RESULTS / "loo_forms.csv")
    columns = ["rank", "elpd_loo", "p_loo", "elpd_diff", "weight", "se", "dse", "warning"]
    text = (
        "# LOO comparison of curve forms\n\n"
        f"PSIS-LOO over {len(runs)} runs (bundled + external; binned observations), {args.draws} draws x 2 chains per form. "
        "Higher elpd_loo is better; elpd_diff is relative to the best form.\n\n"
        + table[[c for c in columns if c in table.columns]].round(2).to_markdown()
        + "\n"
    )
    (RESULTS / "loo_forms.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
