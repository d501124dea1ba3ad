"""LOO comparison of the registered curve forms with ArviZ.

Fits the hierarchy once per curve form (``bayes_grpo.curves.CURVE_FORMS``) on
the bundled and shared external runs, one fit per job through
``bayes_grpo.parallel.map_jobs``, and ranks the forms by PSIS-LOO expected log
predictive density (``az.compare``). This is where the report's comparison table
comes from: pass it to ``write_report(comparison=...)``. Writes
``benchmarks/results/loo_forms.md`` (with the command and each fit's sampler
health), ``loo_forms.csv`` and ``loo_forms.png``.

    python benchmarks/compare_forms.py [--draws 500] [--cluster local:3]
    BAYES_GRPO_QUICK=1 python benchmarks/compare_forms.py --max-runs 12 --out /tmp/loo   # smoke test
"""

from __future__ import annotations

import argparse
import functools
import time
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import arviz as az
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from common import RESULTS, add_engine_args, add_run_args, fit_options, markdown, provenance

from bayes_grpo.curves import CURVE_FORMS
from bayes_grpo.logs import RunLog
from bayes_grpo.model import FittedModel
from bayes_grpo.parallel import map_jobs
from evaluation.calibration import fit_fold, fold_health, load_evaluation_runs


def fit_form(form: str, runs: Sequence[RunLog], options: Mapping[str, Any], seed: int) -> FittedModel:
    """One full fit (pointwise log-likelihood kept, for LOO) with curve form ``form``."""
    return fit_fold(runs, {**options, "form": form, "keep_full": True}, seed)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_run_args(parser)
    add_engine_args(parser)
    parser.add_argument("--draws", type=int, help="draws and tuning steps per chain (default: the package's)")
    parser.add_argument("--chains", type=int, help="chains per fit (default: the package's)")
    parser.add_argument("--forms", default=",".join(CURVE_FORMS), help=f"comma-separated forms (default: {','.join(CURVE_FORMS)})")
    parser.add_argument("--out", type=Path, default=RESULTS, help="folder to write the results to (default benchmarks/results)")
    args = parser.parse_args()
    warnings.simplefilter("ignore")

    runs, sources = load_evaluation_runs(args.shared, bundled=not args.no_bundled, max_runs=args.max_runs, seed=args.seed)
    forms = [f.strip() for f in args.forms.split(",") if f.strip()]
    options = fit_options(args.draws, args.chains)
    started = time.perf_counter()
    job = functools.partial(fit_form, runs=runs, options=options, seed=args.seed)
    fits = dict(zip(forms, map_jobs(job, forms, n_jobs=args.jobs, cluster=args.cluster, progress=not args.quiet, desc="curve forms")))
    table = az.compare({form: fitted.idata for form, fitted in fits.items()}, ic="loo")
    seconds = time.perf_counter() - started

    args.out.mkdir(parents=True, exist_ok=True)
    table.to_csv(args.out / "loo_forms.csv")
    axes = az.plot_compare(table, figsize=(8, 1 + 0.6 * len(table)))
    fig = np.ravel(axes)[0].figure
    fig.savefig(args.out / "loo_forms.png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    columns = ["rank", "elpd_loo", "p_loo", "elpd_diff", "weight", "se", "dse", "warning"]
    ranked = table[[c for c in columns if c in table.columns]].reset_index(names="form")
    health = pd.DataFrame([{"form": form, **fold_health(fitted)} for form, fitted in fits.items()])
    text = (
        "# LOO comparison of curve forms\n\n"
        + provenance(seconds)
        + f"\nPSIS-LOO over {len(runs)} runs from {len(set(sources.values()))} sources (binned observations); fit options "
        f"{options or 'package defaults'}. Higher elpd_loo is better; elpd_diff is relative to the best form.\n\n"
        "![LOO comparison](loo_forms.png)\n\n"
        + markdown(ranked, 2)
        + "\n## Sampler health of each fit\n\n"
        + markdown(health)
    )
    (args.out / "loo_forms.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
