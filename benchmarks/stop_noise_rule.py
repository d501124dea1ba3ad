"""Would a stop rule that weighs logging noise save more? Replayed on the stopping backtest's pickled replays.

The stopping backtest counts a stop as bad when the smoothed reward at the last step is more than 0.05 of the
spread above the smoothed reward at the stop (``evaluation.scoring.regret``). Part of that regret is logging
noise, not the curve (``backtest_stopping.md``: the default rule's stops would count as bad in about 6% of the runs
from noise alone). The package's plateau test looks at the curve only: P(remaining gain < 0.02 x spread) >= 0.99.
This script replays, on the same checks and forecasts, a plateau test on the regret as the backtest measures it:

    P(gain + noise <= 0.05 x spread) = mean over draws of Phi((0.05 x spread - gain) / sd) >= level

``gain`` the forecast's per-draw remaining gain (``StopEvidence.gain``), ``spread`` the head's logged 10-90% spread and
``sd`` the smoother's noise between the check and the last step: the head's per-step noise
(``bayes_grpo.measures.step_noise``) times the norm of the difference of the smoother's weights there
(``bayes_grpo.measures.smoother_weights`` on the run's logged steps, whose cadence a live rule knows ahead).
Every other part of the rule stays the package's (no stop before 30%, the rise veto, the dip rule, the
no-signal stop). Rows ``curve only`` vary the package's plateau level with the same rise veto, so both
variants are on one footing. Real runs, each source counted as at most 3 runs. Writes ``stop_noise_rule.md``.

    python benchmarks/backtest_stopping.py --cache /tmp/folds --scored real --save-replays /tmp/replays.pkl
    python benchmarks/stop_noise_rule.py --replays /tmp/replays.pkl
"""

from __future__ import annotations

import argparse
import pickle
import time
from pathlib import Path

import numpy as np
import pandas as pd
from common import RESULTS, markdown, write_results_page
from scipy.stats import norm

from bayes_grpo.measures import smoother_weights, step_noise
from bayes_grpo.settings import STOP_TOLERANCE
from bayes_grpo.stopping import STOP_REASONS, StopEvidence, stop_reason
from evaluation import backtest
from evaluation.backtest import RunTrace

#: The regret above which the backtest counts a stop as bad, in shares of the spread.
BAD_REGRET = 0.05
#: Levels of each plateau test replayed.
CURVE_LEVELS = (0.9, 0.95, 0.97, 0.98, 0.99, 0.995)
NOISE_LEVELS = (0.5, 0.6, 0.7, 0.8, 0.85, 0.9, 0.95, 0.97)
#: The package's reasons that come from its plateau test, the one part of the rule replaced here.
PLATEAU_TEST = ("plateau", "gain")


def smoother_noise(trace: RunTrace, check: int) -> float:
    """SD of the noise part of the regret of a stop at ``check``: the head's step noise times the smoother-weight distance to the last step."""
    index = trace.indices[check]
    steps = np.asarray(trace.run.steps, dtype=float)
    weights = smoother_weights(steps, [steps[index], steps[-1]])
    return step_noise(np.asarray(trace.run.rewards, dtype=float)[: index + 1]) * float(np.linalg.norm(weights[1] - weights[0]))


def regret_probability(evidence: StopEvidence, sd: float) -> float:
    """P(the backtest's regret of a stop now is at most :data:`BAD_REGRET`): the curve's gain plus the smoother's noise."""
    limit = BAD_REGRET * evidence.spread
    if sd <= 0:
        return float(np.mean(evidence.gain <= limit))
    return float(np.mean(norm.cdf((limit - evidence.gain) / sd)))


def decisions(trace: RunTrace, test: str, level: float) -> np.ndarray:
    """The package's rule at every check of a replay, its plateau test replaced by ``test`` ('curve' or 'noise') at ``level``."""
    out = []
    for check, evidence in enumerate(trace.evidence):
        reason = stop_reason(evidence)
        if reason not in PLATEAU_TEST:
            out.append(reason in STOP_REASONS)
        elif test == "curve":
            out.append(evidence.probability(STOP_TOLERANCE) >= level)
        else:
            out.append(regret_probability(evidence, smoother_noise(trace, check)) >= level)
    return np.asarray(out, dtype=bool)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--replays", type=Path, required=True, help="replays pickled by backtest_stopping.py --save-replays")
    parser.add_argument("--out", type=Path, default=RESULTS, help="folder to write stop_noise_rule.md to (default benchmarks/results)")
    args = parser.parse_args()
    started = time.perf_counter()
    traces, _ = pickle.loads(args.replays.read_bytes())
    real = [trace for trace in traces if trace.set == "real"]
    rows = [
        backtest._row(trace, label, level, decisions(trace, test, level))
        for test, label, levels in (("curve", "curve only", CURVE_LEVELS), ("noise", "regret with noise", NOISE_LEVELS))
        for level in levels
        for trace in real
    ]
    summary = backtest.summarise_source_capped(pd.DataFrame(rows))
    columns = ["rule", "threshold", "weight", "mean_saved", "share_regret_gt_0.05", "noise_bad", "share_dip_stops", "share_stopped"]
    table = summary[columns].rename(columns={"rule": "plateau test", "threshold": "level"})
    write_results_page(
        args.out / "stop_noise_rule.md",
        "A plateau test on the regret as the backtest measures it",
        time.perf_counter() - started,
        __doc__,
        [
            (
                f"{len(real)} real runs replayed from `{args.replays.name}`. The row `curve only` at 0.99 is the package's default "
                "rule on these replays; `noise_bad` is the share of runs whose stop logging noise alone would make bad "
                "(`evaluation.scoring.noise_bad_probability`)."
            ),
            "",
            markdown(table),
            "",
        ],
    )

if __name__ == "__main__":
    main()
