"""Refit the population posterior that the package ships as ``bg.default_model()``.

Fitted on the runs bundled in ``data/runs`` (tiny models trained by this
project, on a declared reward range) together with the real public GRPO runs
found through :func:`evaluation.settings.shared_runs_dir` (``--shared``, else
``$BAYES_GRPO_SHARED_RUNS``, else ``../shared/external_runs``). Only the
population posterior is written (about 2 MB). The package's model and
sampler defaults are used, its seed included (on these 200-odd runs: the "mixed" parameterisation with
the sheared gain, 4,000 draws after 500 tuning steps, about 40-50 s of sampling;
``benchmarks/results/fit_geometry.md``). The shared runs are other
people's data: the model records how many there were and the SHA-256 of their
``index.csv``, not their identifiers.

    python scripts/refit_default_model.py --out /tmp/default_model.nc                     # full settings
    python scripts/refit_default_model.py --out /tmp/quick.nc --quick                     # smoke check
    python scripts/refit_default_model.py --out /tmp/default_model.nc --replace-shipped   # also replace the shipped file
    python scripts/refit_default_model.py --from-fit /tmp/default_model.nc --layer-from benchmarks/results/calibration_runs.csv \\
        --out /tmp/default_model.nc --replace-shipped                                     # with its calibration layer
    python scripts/refit_default_model.py --from-fit /tmp/default_model.nc --coupling-from benchmarks/results/sweep_coupling.csv \
        --out /tmp/default_model.nc --replace-shipped                                     # with its sweep coupling

The shipped file is replaced only with ``--replace-shipped``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import shutil
import sys
import warnings
from pathlib import Path

import pandas as pd

import bayes_grpo as bg
from bayes_grpo.model import DEFAULT_MODEL_PATH
from bayes_grpo.population import MODEL_VERSION
from bayes_grpo.recalibration import Recalibration
from bayes_grpo.settings import bundled_runs_dir
from bayes_grpo.sweeps import SweepCoupling

# The repository root, for evaluation/ (the shared-runs locator and the calibration layer's learner; not in the wheel).
sys.path.append(str(Path(__file__).resolve().parents[1]))
from evaluation.settings import shared_runs_dir  # noqa: E402


def provenance(bundled: list[bg.RunLog], shared: Path | None, external: list[bg.RunLog], fitted: set[str], argv: list[str]) -> dict:
    """What the model was fitted on: bundled run ids, shared runs by count and index checksum (runs the fit left out, e.g.
    frozen after their first steps, are not counted)."""
    index = shared / "index.csv" if shared is not None else None
    n_shared = sum(r.run_id in fitted for r in external)
    return {
        "runs": [r.run_id for r in bundled if r.run_id in fitted],
        "n_runs": sum(r.run_id in fitted for r in bundled) + n_shared,
        "sources": {"bundled (data/runs)": sum(r.run_id in fitted for r in bundled), "shared (external runs)": n_shared},
        "left_out": len(bundled) + len(external) - len(fitted),
        "external_index_sha256": hashlib.sha256(index.read_bytes()).hexdigest() if index is not None and index.is_file() else None,
        "model_version": MODEL_VERSION,
        "date": dt.date.today().isoformat(),
        "command": "python scripts/refit_default_model.py " + " ".join(argv),
    }


def calibration_layer(scores_csv: Path, model: bg.FittedModel) -> "Recalibration":
    """The calibration layer learned from a calibration benchmark's held-out forecasts of this model version."""
    import pandas as pd

    from evaluation.calibration import learn_layer

    scores = pd.read_csv(scores_csv)
    if "signal_scale" not in scores or set(scores.get("model_version", pd.Series(["?"])).astype(str)) != {MODEL_VERSION}:
        raise SystemExit(f"{scores_csv}: not held-out forecasts of model {MODEL_VERSION}; rerun benchmarks/calibration.py first")
    return learn_layer(scores, fit_id=model.fit_id)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="model file to write (.nc)")
    parser.add_argument("--replace-shipped", action="store_true", help=f"also copy the result over {DEFAULT_MODEL_PATH}")
    parser.add_argument("--shared", type=Path, default=None, help="folder of the shared runs (index.csv + runs/)")
    parser.add_argument("--quick", action="store_true", help="200 draws and tuning steps instead of the package defaults")
    parser.add_argument("--seed", type=int, default=None, help="sampler seed (default: the package's, 0, as `bayes-grpo fit` uses)")
    parser.add_argument("--from-fit", type=Path, default=None, metavar="NC", help="a model file this script wrote: learn its layer without refitting")
    parser.add_argument(
        "--layer-from", type=Path, default=None, metavar="CSV",
        help="held-out forecasts (benchmarks/results/calibration_runs.csv, written by benchmarks/calibration.py with this model "
        "version) to learn the calibration layer from; it is stored in the model file",
    )  # fmt: skip
    parser.add_argument(
        "--coupling-from", type=Path, default=None, metavar="CSV",
        help="the sweep coupling measured on this fit's held-out forecasts (benchmarks/results/sweep_coupling.csv, written by "
        "benchmarks/sweep_coupling.py); it is stored in the model file for rank and the Optuna pruner",
    )  # fmt: skip
    args = parser.parse_args(argv)

    bundled = list(bg.load_runs(bundled_runs_dir()))
    shared = shared_runs_dir(args.shared)
    external = list(bg.load_runs(shared / "runs")) if shared is not None else []
    if not external:
        warnings.warn("no shared runs found: fitting on the bundled runs only", stacklevel=1)
    if args.from_fit is not None:  # the fit is done: only (re)learn its calibration layer
        model = bg.load_model(args.from_fit)
    else:
        quick = {"draws": 200, "tune": 200} if args.quick else {}
        seed = {} if args.seed is None else {"seed": args.seed}
        model = bg.fit(bundled + external, sampler_config={"chains": 2, **seed, **quick}, keep_full=False)
        print(model.diagnostics)
        model.fitted_on = provenance(bundled, shared, external, set(model.fitted_on["runs"]), argv)
    if args.layer_from is not None:
        model.recalibration = calibration_layer(args.layer_from, model)
        print(f"calibration layer from {args.layer_from}: beta {model.recalibration.beta}, offsets {model.recalibration.offsets}")
    if args.coupling_from is not None:
        model.sweep_coupling = SweepCoupling.from_table(pd.read_csv(args.coupling_from))
        print(f"sweep coupling from {args.coupling_from}: correlation {model.sweep_coupling.correlation}")
    written = model.save(args.out, full=False)
    print(f"wrote {written} ({len(bundled)} bundled + {len(external)} shared runs)")
    if args.replace_shipped:
        shutil.copyfile(written, DEFAULT_MODEL_PATH)
        print(f"replaced the shipped model {DEFAULT_MODEL_PATH}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
