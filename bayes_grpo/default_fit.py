"""Refit the population posterior shipped as :func:`bayes_grpo.default_model`.

The default model is fitted on the runs bundled in ``data/runs`` (tiny models
trained by this project, on a declared reward range) together with the real
public GRPO runs in ``../shared/external_runs/runs`` (0.5B-21B models on
learned reward scales). Only the population-level posterior is kept (a few
hundred kB): the logs themselves stay out of the repository and the package.

    python -m bayes_grpo.default_fit            # full settings (about 10-20 min on 2 cores)
    python -m bayes_grpo.default_fit --quick    # short chains, for a smoke check
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import warnings
from pathlib import Path

import bayes_grpo as bg
from bayes_grpo.model import DEFAULT_MODEL_DIR

EXTERNAL = Path(__file__).resolve().parents[2] / "shared" / "external_runs" / "runs"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--external", type=Path, default=EXTERNAL, help="folder of the external validation runs")
    parser.add_argument("--out", type=Path, default=DEFAULT_MODEL_DIR, help="where to write the model")
    parser.add_argument("--quick", action="store_true", help="200 draws/tune instead of 1000")
    parser.add_argument("--seed", type=int, default=2026)
    args = parser.parse_args(argv)

    bundled = list(bg.load_runs())
    external = list(bg.load_runs(args.external)) if args.external.is_dir() else []
    if not external:
        warnings.warn(f"no external runs at {args.external}: fitting on the bundled runs only", stacklevel=1)
    draws = 200 if args.quick else 1000
    model = bg.fit(bundled + external, draws=draws, tune=draws, chains=2, seed=args.seed)
    print(model.diagnostics)
    model.config["fitted_on"] = {
        "bundled": [r.run_id for r in bundled],
        "external": [r.run_id for r in external],
        "date": dt.date.today().isoformat(),
        "command": "python -m bayes_grpo.default_fit" + (" --quick" if args.quick else ""),
    }
    model.save(args.out, full=False)
    print(json.dumps({"out": str(args.out), "runs": len(bundled) + len(external)}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
