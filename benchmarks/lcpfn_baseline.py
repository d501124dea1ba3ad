"""LC-PFN baseline for the forecast-calibration benchmark.

LC-PFN (Adriaensen et al., NeurIPS 2023; package ``lcpfn``) is a transformer
trained on curves drawn from a parametric learning-curve prior; given the head
of a curve it returns a predictive distribution of the curve's value at later
epochs. Its published weights cannot be downloaded here, so this module trains
a small one on CPU with the package's own training function
(:func:`lcpfn.train_lcpfn`) on the package's own prior
(:func:`lcpfn.sample_from_prior`), and keeps the weights outside git
(default ``~/.cache/bayes_grpo/lcpfn_small.pt``).

How a GRPO run is fed to it (LC-PFN only knows increasing curves with y in
[0, 1] over epochs 1..100, and says to normalise curves to that):

* **x**: steps are mapped to LC-PFN's epoch scale, ``epoch = ceil(100 * step /
  total_steps)`` (clipped to 1..100); logged points that fall in the same epoch
  are averaged, so a run is never longer than the 100 positions the prior has;
* **y**: ``lcpfn.utils.pfn_normalize`` (the normaliser of the package's
  ``curve_normalization`` notebook). With a declared reward range ``(lo, hi)``
  it maps ``[lo, hi]`` onto [0, 1]. Without one, both hard bounds are infinite
  and the soft range, from the observed head only, is ``[q05, q95 + (q95 -
  q05)]`` of the binned head: the head's own range, with as much room again
  above it for a rise still to come;
* **prediction**: quantiles at each epoch of the final window (the last 10% of
  the logged steps, :func:`bayes_grpo.measures.final_window_size`) are mapped
  back to reward units and averaged over the window, weighted by the number of
  logged steps in each epoch. LC-PFN's output is per epoch, not joint, so this
  average treats the window's epochs as moving together (exact for the curve's
  level, conservative for its noise). The forecast mean is the window average
  of each epoch's predictive mean in reward units (the bar distribution's
  bucket centres mapped back, weighted by their probabilities).

Every row is scored by :func:`evaluation.calibration.score_cut`, the scoring
of the package's own forecasts (the same cut, truth, baselines and
:mod:`bayes_grpo.measures` scores), so
:func:`evaluation.calibration.summarise` turns them into the calibration table.

    nice -n 15 python benchmarks/lcpfn_baseline.py train --minutes 18
    python benchmarks/lcpfn_baseline.py evaluate      # writes benchmarks/results/lcpfn.md and lcpfn_runs.csv
"""

from __future__ import annotations

import argparse
import inspect
import json
import math
import random
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import common  # noqa: F401  (puts the repository root on sys.path, for evaluation)
import numpy as np
import pandas as pd
import torch

from bayes_grpo import measures
from bayes_grpo.errors import BayesGrpoError
from bayes_grpo.logs import RunLog, load_runs
from bayes_grpo.settings import FORECAST_QUANTILES
from evaluation import calibration, scoring
from evaluation.settings import EVALUATION_FRACTIONS, shared_runs_dir

#: Where the small LC-PFN trained here is kept (outside the repository).
DEFAULT_WEIGHTS = Path.home() / ".cache" / "bayes_grpo" / "lcpfn_small.pt"
#: Curve length of LC-PFN's prior and training (epochs 1..SEQ_LEN).
SEQ_LEN = 100
#: Normalised predictions are clipped to [_EDGE, 1 - _EDGE] before mapping back
#: (the full-support bar distribution's tails reach outside (0, 1)).
_EDGE = 1e-4
RESULTS = Path(__file__).resolve().parent / "results"


def _lcpfn() -> Any:
    """The ``lcpfn`` package, or a one-line error saying how to install it."""
    try:
        import lcpfn
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise BayesGrpoError("the LC-PFN baseline needs the 'lcpfn' package: pip install --no-deps lcpfn") from exc
    import lcpfn.layer

    # lcpfn pins torch <= 1.11, whose torch.nn.modules.transformer had no __all__, so
    # lcpfn.layer's "from torch.nn.modules.transformer import *" brought these names
    # in; newer torch exports only the Transformer classes. Give the module the same
    # objects it got then.
    for name, value in {
        "torch": torch, "F": torch.nn.functional, "Dropout": torch.nn.Dropout, "LayerNorm": torch.nn.LayerNorm,
        "Linear": torch.nn.Linear, "MultiheadAttention": torch.nn.MultiheadAttention,
    }.items():  # fmt: skip
        if not hasattr(lcpfn.layer, name):
            setattr(lcpfn.layer, name, value)
    # Newer torch.nn.TransformerEncoder also passes is_causal to each layer, which
    # lcpfn's layer (written for torch 1.11) does not take; its attention mask
    # already says everything, so the flag is dropped.
    layer = lcpfn.layer.TransformerEncoderLayer
    if "is_causal" not in inspect.signature(layer.forward).parameters:
        forward = layer.forward

        def forward_ignoring_is_causal(self, src, src_mask=None, src_key_padding_mask=None, is_causal=False):  # noqa: ANN001, ANN202
            return forward(self, src, src_mask, src_key_padding_mask)

        layer.forward = forward_ignoring_is_causal
    return lcpfn


# ------------------------------------------------------------------ training


@dataclass(frozen=True)
class TrainingReport:
    """What a training run of the small LC-PFN did and reached."""

    path: str
    emsize: int
    nlayers: int
    num_borders: int
    batch_size: int
    lr: float
    epochs_planned: int
    steps_done: int
    curves_seen: int
    seconds: float
    total_seconds: float
    final_loss: float
    parameters: int
    seed: int


def _deadline_batches(get_batch: Callable[..., Any], deadline: float, calls: list[float]) -> Callable[..., Any]:
    """``get_batch`` that records the time of each call in ``calls`` and stops training at ``deadline``.

    :func:`lcpfn.train.train` catches ``KeyboardInterrupt`` in its epoch loop
    and returns the model trained so far, so raising it is the package's own
    way to end training early.
    """

    def batches(*args: Any, **kwargs: Any) -> Any:
        if time.perf_counter() > deadline:
            raise KeyboardInterrupt
        calls.append(time.perf_counter())
        return get_batch(*args, **kwargs)

    return batches


def train_small_lcpfn(
    out: Path = DEFAULT_WEIGHTS,
    minutes: float = 15.0,
    *,
    emsize: int = 128,
    nlayers: int = 2,
    num_borders: int = 200,
    batch_size: int = 25,
    lr: float = 1e-3,
    seed: int = 0,
    threads: int = 2,
    probe_seconds: float = 45.0,
) -> TrainingReport:
    """Train a small LC-PFN on its published prior with :func:`lcpfn.train_lcpfn`, within a time budget.

    A short probe run measures the seconds per training step; the real run is
    then given as many 100-step epochs as fit in what is left of ``minutes``
    (so its warm-up and cosine learning-rate schedule run to the end), and is
    stopped at the budget in any case.

    Parameters
    ----------
    out : Path
        Where the trained model is saved (a pickled ``torch.nn.Module``).
    minutes : float
        Wall-clock budget, probe included.
    emsize, nlayers, num_borders, batch_size, lr
        :func:`lcpfn.train_lcpfn` settings (``emsize`` must be a multiple of 128:
        the package uses ``emsize // 128`` attention heads).
    seed : int
        Seed of numpy (the prior sampler uses the global numpy RNG), ``random``
        (the cut position) and torch.
    threads : int
        Torch CPU threads.
    probe_seconds : float
        Length of the timing probe.

    Returns
    -------
    TrainingReport
        Settings, steps done, seconds and the last epoch's mean training loss
        (the bar distribution's negative log density).

    Raises
    ------
    BayesGrpoError
        ``emsize`` is not a positive multiple of 128, or the budget is shorter than the probe.

    Example
    -------
    >>> report = train_small_lcpfn(Path("/tmp/lcpfn.pt"), minutes=2)  # doctest: +SKIP
    """
    if emsize < 128 or emsize % 128:
        raise BayesGrpoError(f"emsize must be a positive multiple of 128 (lcpfn uses emsize // 128 heads), got {emsize}")
    if minutes * 60 <= probe_seconds + 30:
        raise BayesGrpoError(f"a budget of {minutes} min leaves no time after the {probe_seconds:.0f} s timing probe")
    lcpfn = _lcpfn()
    torch.set_num_threads(threads)
    started = time.perf_counter()
    settings = {"seq_len": SEQ_LEN, "emsize": emsize, "nlayers": nlayers, "num_borders": num_borders, "lr": lr, "batch_size": batch_size}

    def seeded(offset: int) -> None:
        np.random.seed(seed + offset)
        random.seed(seed + offset)
        torch.manual_seed(seed + offset)

    prior_batches = lcpfn.create_get_batch_func(prior=lcpfn.sample_from_prior)
    seeded(1)
    probe_calls: list[float] = []
    lcpfn.train_lcpfn(_deadline_batches(prior_batches, time.perf_counter() + probe_seconds, probe_calls), epochs=1, **settings)
    # The first call samples 10,000 curves for the bucket borders and the second
    # is the data loader's style probe; training steps follow.
    if len(probe_calls) < 4:
        raise BayesGrpoError(f"the {probe_seconds:.0f} s timing probe did not reach two training steps; give it more time")
    per_step = float(np.median(np.diff(probe_calls[2:])))
    setup = probe_calls[2] - probe_calls[0]
    left = minutes * 60 - (time.perf_counter() - started) - setup
    epochs = max(1, int(0.95 * left / (100 * per_step)))
    print(f"probe: {per_step:.2f} s per step -> {epochs} epochs of 100 steps in {left:.0f} s", flush=True)

    seeded(0)
    calls: list[float] = []
    main_start = time.perf_counter()
    total_loss, _, model, _ = lcpfn.train_lcpfn(
        _deadline_batches(prior_batches, started + minutes * 60, calls), epochs=epochs, **settings
    )
    seconds = time.perf_counter() - main_start
    model.eval()
    out.parent.mkdir(parents=True, exist_ok=True)
    torch.save(model, out)
    steps = max(len(calls) - 2, 0)
    report = TrainingReport(
        path=str(out), emsize=emsize, nlayers=nlayers, num_borders=num_borders, batch_size=batch_size, lr=lr,
        epochs_planned=epochs, steps_done=steps, curves_seen=steps * batch_size, seconds=round(seconds, 1),
        total_seconds=round(time.perf_counter() - started, 1),
        final_loss=float(total_loss), parameters=sum(p.numel() for p in model.parameters()), seed=seed,
    )  # fmt: skip
    load_lcpfn.cache_clear()
    return report


@lru_cache(maxsize=4)
def load_lcpfn(path: Path = DEFAULT_WEIGHTS) -> Any:
    """Load a model saved by :func:`train_small_lcpfn` as an :class:`lcpfn.LCPFN` (cached).

    Parameters
    ----------
    path : Path
        The saved model.

    Returns
    -------
    lcpfn.LCPFN
        The model in eval mode, with ``predict_quantiles`` / ``predict_mean``.

    Raises
    ------
    BayesGrpoError
        No model at ``path``.

    Example
    -------
    >>> model = load_lcpfn()  # doctest: +SKIP
    """
    lcpfn = _lcpfn()
    if not Path(path).is_file():
        raise BayesGrpoError(f"no LC-PFN weights at {path}: train them with 'python benchmarks/lcpfn_baseline.py train --out {path}'")

    class _Trained(lcpfn.LCPFN):
        """LCPFN around an in-memory model (``LCPFN()`` itself torch.loads with the pre-2.6 defaults)."""

        def __init__(self, model: torch.nn.Module) -> None:
            torch.nn.Module.__init__(self)
            self.model = model.eval()

    return _Trained(torch.load(path, weights_only=False, map_location="cpu"))


# ------------------------------------------------------------------ forecasting


@dataclass(frozen=True)
class LcpfnForecast:
    """LC-PFN's forecast of the final reward (mean over the final window)."""

    mean: float
    quantiles: dict[float, float]


def _epochs(steps: np.ndarray, total_steps: float) -> np.ndarray:
    """LC-PFN epoch (1..SEQ_LEN) of each step on the planned horizon."""
    return np.clip(np.ceil(SEQ_LEN * np.asarray(steps, float) / float(total_steps)), 1, SEQ_LEN).astype(int)


def _binned(steps: np.ndarray, rewards: np.ndarray, total_steps: float) -> tuple[np.ndarray, np.ndarray]:
    """Mean reward per LC-PFN epoch: (epochs, means), epochs ascending."""
    frame = pd.DataFrame({"epoch": _epochs(steps, total_steps), "reward": np.asarray(rewards, float)})
    means = frame.groupby("epoch")["reward"].mean()
    return means.index.to_numpy(), means.to_numpy()


def _normaliser(head: np.ndarray, reward_range: tuple[float, float] | None, headroom: float = 1.0) -> tuple[Callable, Callable]:
    """``lcpfn.utils.pfn_normalize`` for a reward curve (maximised), as (to [0,1], back).

    Without a reward range the soft range is ``[q05, q95 + headroom * (q95 - q05)]`` of the head.
    """
    from lcpfn import utils

    if reward_range is not None:
        lo, hi = (float(v) for v in reward_range)
        if not hi > lo:
            raise BayesGrpoError(f"reward_range must be (min, max) with max > min, got {reward_range}")
        return utils.pfn_normalize(lb=torch.tensor(lo), ub=torch.tensor(hi), soft_lb=lo, soft_ub=hi, minimize=False)
    q05, q95 = np.quantile(head, [0.05, 0.95])
    width = max(float(q95 - q05), 1e-3 * max(1.0, abs(float(np.median(head)))))
    inf = torch.tensor(float("inf"), dtype=torch.float64)
    return utils.pfn_normalize(lb=-inf, ub=inf, soft_lb=float(q05), soft_ub=float(q05) + (1 + headroom) * width, minimize=False)


def lcpfn_forecast(
    steps_observed: Sequence[float],
    rewards_observed: Sequence[float],
    total_steps: float,
    quantiles: Sequence[float] = FORECAST_QUANTILES,
    *,
    window_steps: Sequence[float] | None = None,
    reward_range: tuple[float, float] | None = None,
    headroom: float = 1.0,
    weights: Path = DEFAULT_WEIGHTS,
) -> LcpfnForecast:
    """LC-PFN's forecast of the mean reward over the final window, from the observed head.

    Parameters
    ----------
    steps_observed, rewards_observed : sequence of float
        The head of the run (logged steps and mean rewards).
    total_steps : float
        Planned total steps (LC-PFN's horizon: step ``total_steps`` is epoch 100).
    quantiles : sequence of float
        Quantile levels to return.
    window_steps : sequence of float, optional
        Steps whose mean reward is forecast (default: every step in the last
        10% of ``total_steps``).
    reward_range : (float, float), optional
        Declared (min, max) attainable reward; without it the head sets the scale.
    headroom : float
        Without a reward range, room left above the head in the normalisation's
        soft range, in units of the head's 5-95% range (module docstring).
    weights : Path
        Model saved by :func:`train_small_lcpfn`.

    Returns
    -------
    LcpfnForecast
        Forecast mean and ``{q: value}`` in reward units.

    Raises
    ------
    BayesGrpoError
        Fewer than 2 observed points, ``total_steps`` not positive, or no weights.

    Example
    -------
    >>> fc = lcpfn_forecast(steps[:60], rewards[:60], total_steps=200)  # doctest: +SKIP
    >>> fc.quantiles[0.95]  # doctest: +SKIP
    """
    steps = np.asarray(steps_observed, float)
    rewards = np.asarray(rewards_observed, float)
    if steps.size < 2 or steps.size != rewards.size:
        raise BayesGrpoError(f"LC-PFN needs at least 2 observed (step, reward) pairs of equal length, got {steps.size} and {rewards.size}")
    if not total_steps > 0:
        raise BayesGrpoError(f"total_steps must be positive, got {total_steps}")
    if window_steps is None:
        window_steps = np.arange(math.floor(0.9 * total_steps) + 1, int(total_steps) + 1)
    model = load_lcpfn(Path(weights))
    x_seen, y_seen = _binned(steps, rewards, total_steps)
    to_unit, from_unit = _normaliser(y_seen, reward_range, headroom)
    window_epochs, counts = np.unique(_epochs(np.asarray(window_steps, float), total_steps), return_counts=True)
    weight = counts / counts.sum()
    y_unit = to_unit(torch.tensor(y_seen, dtype=torch.float64)).clamp(0.0, 1.0).float()
    levels = [float(q) for q in quantiles]
    with torch.no_grad():
        # LC-PFN takes (points, 1) columns; logits are (test points, 1, buckets).
        logits = model(
            x_train=torch.tensor(x_seen, dtype=torch.float32).unsqueeze(-1),
            y_train=y_unit.unsqueeze(-1),
            x_test=torch.tensor(window_epochs, dtype=torch.float32).unsqueeze(-1),
        )
        criterion = model.model.criterion
        unit = torch.cat([criterion.icdf(logits, q) for q in levels], dim=1)  # as LCPFN.predict_quantiles
        probs = logits.softmax(-1)[:, 0, :].double().numpy()
        middles = criterion.borders[:-1] + criterion.bucket_widths / 2
    values = from_unit(unit.double().clamp(_EDGE, 1 - _EDGE)).numpy()  # (window epochs, levels)
    means = probs @ from_unit(middles.double().clamp(_EDGE, 1 - _EDGE)).numpy()  # (window epochs,)
    return LcpfnForecast(mean=float(weight @ means), quantiles=dict(zip(quantiles, (weight @ values).tolist())))


def lcpfn_quantiles(
    steps_observed: Sequence[float],
    rewards_observed: Sequence[float],
    total_steps: float,
    quantiles: Sequence[float] = FORECAST_QUANTILES,
    **options: Any,
) -> dict[float, float]:
    """LC-PFN's quantiles of the final reward (mean over the final window): ``{q: value}``.

    The plug-in for the calibration benchmark; see :func:`lcpfn_forecast` for
    the options (``window_steps``, ``reward_range``, ``weights``).

    Parameters
    ----------
    steps_observed, rewards_observed : sequence of float
        The head of the run.
    total_steps : float
        Planned total steps.
    quantiles : sequence of float
        Quantile levels.
    **options
        Passed to :func:`lcpfn_forecast`.

    Returns
    -------
    dict
        ``{q: value}`` in reward units.

    Example
    -------
    >>> lcpfn_quantiles(head.steps, head.rewards, 250)  # doctest: +SKIP
    {0.05: 0.41, 0.25: 0.55, 0.5: 0.61, 0.75: 0.68, 0.95: 0.80}
    """
    return lcpfn_forecast(steps_observed, rewards_observed, total_steps, quantiles, **options).quantiles


# ------------------------------------------------------------------ evaluation


def evaluate_run(run: RunLog, fraction: float, *, headroom: float = 1.0, weights: Path = DEFAULT_WEIGHTS) -> dict[str, Any] | None:
    """Score LC-PFN on one run cut at ``fraction``: a row with the columns of :func:`evaluation.calibration.evaluate_run`.

    Parameters
    ----------
    run : RunLog
        The complete run.
    fraction : float
        Share of the planned steps observed (:func:`bayes_grpo.measures.cut`).
    headroom : float
        See :func:`lcpfn_forecast`.
    weights : Path
        The trained LC-PFN.

    Returns
    -------
    dict or None
        The scores; None when the cut already reaches the final window.

    Example
    -------
    >>> evaluate_run(run, 0.3)["covered_90"]  # doctest: +SKIP
    """

    def predict(head: RunLog, total: int, window: np.ndarray) -> tuple[float, dict[float, float], float]:
        fc = lcpfn_forecast(head.steps, head.rewards, total, window_steps=window, reward_range=run.reward_range, headroom=headroom, weights=weights)
        return fc.mean, fc.quantiles, np.nan

    return calibration.score_cut(run, fraction, predict)


def evaluate(
    runs: Sequence[RunLog], fractions: Sequence[float] = EVALUATION_FRACTIONS, *, headroom: float = 1.0, weights: Path = DEFAULT_WEIGHTS
) -> pd.DataFrame:
    """Rows of :func:`evaluate_run` for every run and fraction that can be scored.

    Parameters
    ----------
    runs : sequence of RunLog
        Complete runs.
    fractions : sequence of float
        Observed shares of the planned steps.
    headroom : float
        See :func:`lcpfn_forecast`.
    weights : Path
        The trained LC-PFN.

    Returns
    -------
    pandas.DataFrame
        One row per (run, fraction).

    Example
    -------
    >>> calibration.summarise(evaluate(runs))  # doctest: +SKIP
    """
    rows = [row for run in runs for f in fractions if (row := evaluate_run(run, f, headroom=headroom, weights=weights)) is not None]
    return pd.DataFrame(rows)


def prior_check(n_curves: int = 300, *, seed: int = 123, weights: Path = DEFAULT_WEIGHTS) -> pd.DataFrame:
    """Coverage of the trained LC-PFN on fresh curves from its own prior (a check of the training).

    Each curve (100 epochs, LC-PFN's prior with its noise) is cut at 20/30/50
    epochs and forecast through :func:`lcpfn_forecast` with the reward range
    (0, 1), the prior's own scale; the truth is the mean of the noisy curve over
    epochs 91..100.

    Parameters
    ----------
    n_curves : int
        Curves drawn.
    seed : int
        Seed of the prior draws.
    weights : Path
        The trained LC-PFN.

    Returns
    -------
    pandas.DataFrame
        Per fraction: 90% and 50% coverage and mean quantile score (units of
        each curve's 10-90% spread).

    Example
    -------
    >>> prior_check(100)  # doctest: +SKIP
    """
    lcpfn = _lcpfn()
    rng = np.random.RandomState(seed)
    x = np.arange(1, SEQ_LEN + 1)
    rows = []
    for _ in range(n_curves):
        _, y = lcpfn.sample_from_prior(rng, seq_len=SEQ_LEN)()
        truth, spread = float(y[90:].mean()), measures.reward_spread(y)
        for fraction in EVALUATION_FRACTIONS:
            n = int(fraction * SEQ_LEN)
            q = lcpfn_quantiles(x[:n], y[:n], SEQ_LEN, window_steps=x[90:], reward_range=(0.0, 1.0), weights=weights)
            rows.append({
                "fraction": fraction,
                "covered_90": scoring.interval_outcome(truth, q[0.05], q[0.95]) == "inside",
                "covered_50": scoring.interval_outcome(truth, q[0.25], q[0.75]) == "inside",
                "quantile_score": scoring.quantile_score(truth, q, spread),
            })  # fmt: skip
    return pd.DataFrame(rows).groupby("fraction").mean().reset_index()


# ------------------------------------------------------------------ command line


_METHOD = """How it is run: `benchmarks/lcpfn_baseline.py` (module docstring). A small LC-PFN is trained on CPU
with `lcpfn.train_lcpfn` on `lcpfn.sample_from_prior` (the package's published prior: pow3, ilog2 and
janoschek curves, increasing, in [0, 1], over epochs 1..100, with Gaussian noise), weights kept outside git.
Each run is cut with `bayes_grpo.measures.cut` at 20/30/50% of its planned steps; steps become LC-PFN epochs
(`ceil(100 * step / total_steps)`, points in one epoch averaged); rewards are normalised with
`lcpfn.utils.pfn_normalize` (no declared reward range in these runs, so infinite hard bounds and the soft range
`[q05, q95 + headroom * (q95 - q05)]` of the binned head, headroom 1 unless the command says otherwise); quantiles at the epochs of the final window are mapped back and
averaged over the window. Scores: `bayes_grpo.measures` / `evaluation.calibration.summarise`, in units of each
run's 10-90% reward spread; error uses the forecast mean; truth = mean of the last 10% of logged steps.
No fitting on the shared runs is involved (LC-PFN only sees its prior), so no cross-validation is needed.
"""


def _table(summary: pd.DataFrame) -> str:
    """The calibration table: error, persistence, coverages, misses, median 90% width, quantile score."""
    lines = [
        "| observed | runs | error | persistence | 90% coverage | 50% coverage | truth above q95 | truth below q05 | median 90% width | quantile score |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in summary.itertuples():
        lines.append(
            f"| {row.fraction:.0%} | {row.runs} | {row.error:.3f} | {row.persistence:.3f} | {row.coverage_90:.2f} | {row.coverage_50:.2f} "
            f"| {row.above_q95:.0%} | {row.below_q05:.0%} | {row.width_90_median:.2f} | {row.quantile_score:.3f} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> None:
    """Command line: ``train`` a small LC-PFN, or ``evaluate`` it on the shared runs."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    train = sub.add_parser("train", help="train a small LC-PFN on CPU on the package's prior")
    train.add_argument("--out", type=Path, default=DEFAULT_WEIGHTS)
    train.add_argument("--minutes", type=float, default=15.0)
    train.add_argument("--emsize", type=int, default=128)
    train.add_argument("--nlayers", type=int, default=2)
    train.add_argument("--num-borders", type=int, default=200)
    train.add_argument("--batch-size", type=int, default=25)
    train.add_argument("--lr", type=float, default=1e-3)
    train.add_argument("--seed", type=int, default=0)
    train.add_argument("--threads", type=int, default=2)
    evaluate_cmd = sub.add_parser("evaluate", help="score it on the shared runs at 20/30/50%% observed")
    evaluate_cmd.add_argument("--weights", type=Path, default=DEFAULT_WEIGHTS)
    evaluate_cmd.add_argument("--headroom", type=float, default=1.0, help="room above the head in the soft normalisation range")
    evaluate_cmd.add_argument("--shared", type=Path, default=None, help="folder with index.csv and runs/ (default: settings.shared_runs_dir())")
    evaluate_cmd.add_argument("--prior-curves", type=int, default=300, help="curves of the prior self-check (0: skip)")
    evaluate_cmd.add_argument("--out", type=Path, default=RESULTS / "lcpfn.md")
    evaluate_cmd.add_argument("--csv", type=Path, default=RESULTS / "lcpfn_runs.csv", help="per-run scores (read by benchmarks/calibration.py --lcpfn)")
    args = parser.parse_args(argv)

    if args.command == "train":
        report = train_small_lcpfn(
            args.out, args.minutes, emsize=args.emsize, nlayers=args.nlayers, num_borders=args.num_borders,
            batch_size=args.batch_size, lr=args.lr, seed=args.seed, threads=args.threads,
        )  # fmt: skip
        print(asdict(report))
        args.out.with_suffix(".json").write_text(json.dumps(asdict(report), indent=1))
        return

    torch.set_num_threads(1)
    folder = shared_runs_dir(args.shared)
    if folder is None:
        raise BayesGrpoError("the shared external runs were not found (pass --shared or set BAYES_GRPO_SHARED_RUNS)")
    runs = list(load_runs(folder / "runs"))
    started = time.perf_counter()
    scores = evaluate(runs, headroom=args.headroom, weights=args.weights)
    seconds = time.perf_counter() - started
    summary = calibration.summarise(scores)
    hardest = calibration.summarise(calibration.hardest(scores))
    trained = args.weights.with_suffix(".json")
    parts = [
        "# LC-PFN baseline\n\n",
        _METHOD,
        f"\n## Training\n\n`{trained}`:\n\n" + (f"```json\n{trained.read_text().strip()}\n```" if trained.is_file() else "(no training report found)") + "\n\n",
        f"## LC-PFN on the {len(runs)} shared runs\n\n",
        f"Weights: `{args.weights}`; {len(scores)} forecasts in {seconds:.1f} s "
        f"({1000 * seconds / max(len(scores), 1):.0f} ms each). Command: `python {' '.join(sys.argv)}`\n\n",
        _table(summary),
        "\nHardest third (largest |final - persistence|) at each fraction:\n\n",
        _table(hardest),
    ]
    if args.prior_curves:
        check = prior_check(args.prior_curves, weights=args.weights)
        parts.append(f"\nSelf-check on {args.prior_curves} fresh curves from LC-PFN's own prior (reward range (0, 1)):\n\n")
        parts.append(check.round(3).to_markdown(index=False) + "\n")
    text = "".join(parts)
    print(text)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    args.csv.parent.mkdir(parents=True, exist_ok=True)
    scores.to_csv(args.csv, index=False)


if __name__ == "__main__":
    main()
