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
import hashlib
import json
import warnings
from pathlib import Path

import bayes_grpo as bg
from bayes_grpo.model import DEFAULT_MODEL_DIR

EXTERNAL = Path(__file__).resolve().parents[2] / "shared" / "external_runs" / "runs"


def fitted_on(bundled: list, external_dir: Path, n_external: int, quick: bool) -> dict:
    """Provenance of the default model: bundled run ids, and the external runs by count and index checksum."""
    index = external_dir.parent / "index.csv"
    return {
        "bundled": [r.run_id for r in bundled],
        "external": {
            "runs": n_external,
            "index": "../shared/external_runs/index.csv",
            "index_sha256": hashlib.sha256(index.read_bytes()).hexdigest() if index.is_file() else None,
        },
        "date": dt.date.today().isoformat(),
        "command": "python -m bayes_grpo.default_fit" + (" --quick" if quick else ""),
    }


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
    model.config["fitted_on"] = fitted_on(bundled, args.external, len(external), args.quick)
    # The external runs are others' data: the model records how many there were and
    # the checksum of their index, not their identifiers.
    model.config["runs"] = [r.run_id for r in bundled]
    model.save(args.out, full=False)
    print(json.dumps({"out": str(args.out), "runs": len(bundled) + len(external)}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
