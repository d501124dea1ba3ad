"""Follow a GRPO run while it trains: forecast, stop decision and fan chart at every new step.

:func:`watch` rereads a log as it grows (a TRL output folder, whose newest
``checkpoint-N/trainer_state.json`` it reads as checkpoints appear, or a
CSV/TSV/JSONL log a training loop appends to) and yields one
:class:`WatchUpdate` (forecast, stop decision, the GRPO signals the log has)
each time new steps arrive; ``bayes-grpo watch`` shows each as a live
:func:`panel` in the terminal. What is caught mid-write is waited for, not read:
a line of a text log counts once its line end is written (as log shippers do),
and a ``trainer_state.json`` that does not parse yet gives way to the previous
checkpoint's.

:func:`fan_chart` draws what a watcher wants to see (logged rewards, forecast
median with 50% and 90% bands, the planned end, the best step, and the stop
probability of every check so far); the TRL callback sends the same figure to
W&B and TensorBoard.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import tempfile
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from bayes_grpo.errors import BayesGrpoError, LogError, PlanError
from bayes_grpo.logs.plan import planned_length
from bayes_grpo.plotting import fan_chart, figure_pixels, save_figure  # noqa: F401 - the watch figures, re-exported
from bayes_grpo.settings import STOP_THRESHOLD, STOP_TOLERANCE
from bayes_grpo.stopping import StopDecision, decision_from_forecast

if TYPE_CHECKING:
    from rich.console import RenderableType

    from bayes_grpo.forecast import Forecast
    from bayes_grpo.logs import RunLog
    from bayes_grpo.model import FittedModel

#: Fewer logged steps than this (without a reward range) give no reward scale: watch waits for more.
MIN_STEPS = 3
#: Signals shown beside the forecast when the log has them (canonical names, :attr:`RunLog.signals`) -> label;
#: per-function rewards ``rewards/<fn>/mean`` follow them.
SHOWN_SIGNALS = {
    "reward_std": "reward std within a step",
    "frac_reward_zero_std": "groups with equal rewards",
    "kl": "KL to the reference",
    "entropy": "entropy",
    "completions/mean_length": "completion length",
    "completions/clipped_ratio": "completions cut at max length",
    "clip_ratio/region_mean": "clipped policy ratio",
    "loss": "loss",
    "grad_norm": "gradient norm",
    "learning_rate": "learning rate",
}
_PER_FUNCTION = re.compile(r"rewards/(.+)/mean")
_CHECKPOINT = re.compile(r"checkpoint-(\d+)$")
_TEXT_SUFFIXES = (".csv", ".tsv", ".jsonl", ".ndjson", ".txt", ".log", ".out", ".err")


@dataclass(frozen=True)
class WatchUpdate:
    """One look at a run that has logged new steps.

    Attributes
    ----------
    run : RunLog
        Every step logged so far.
    forecast : Forecast
        The run forecast to its planned end.
    decision : StopDecision
        The stop rule's verdict on that forecast.
    signals : dict of str to float
        The latest value of each GRPO signal the log has (:data:`SHOWN_SIGNALS` and per-function
        rewards), by label.
    history : tuple of (int, float)
        Step and stop probability of this update and every earlier one.
    source : Path
        The file read (for an output folder: the ``trainer_state.json`` used).
    """

    run: RunLog
    forecast: Forecast
    decision: StopDecision
    signals: dict[str, float]
    history: tuple[tuple[int, float], ...]
    source: Path

    @property
    def finished(self) -> bool:
        """The run has reached its planned last step."""
        return self.run.last_step >= self.forecast.total_steps


def watch(
    path: str | os.PathLike,
    *,
    model: FittedModel | None = None,
    family: str | None = None,
    params_b: float | None = None,
    total_steps: int | None = None,
    reward_range: tuple[float, float] | None = None,
    threshold: float = STOP_THRESHOLD,
    tolerance: float = STOP_TOLERANCE,
    poll: float = 5.0,
    once: bool = False,
    seed: int = 0,
    encoding: str | None = None,
    metric: str = "reward",
    direction: str = "maximize",
) -> Iterator[WatchUpdate]:
    """Yield a forecast and stop decision each time the run at ``path`` logs new steps.

    Ends after the update that reaches the planned last step (or after the first update with
    ``once=True``). Until the log is readable it waits, warning once per distinct problem (a
    folder with no ``trainer_state.json`` yet, too few steps). A text log's last line counts
    once its line end is written; a checkpoint whose ``trainer_state.json`` does not parse yet
    is skipped for the one before it.

    Parameters
    ----------
    path
        A TRL output folder, a ``trainer_state.json``, or a CSV/TSV/JSONL (or console) log.
    model
        A :class:`~bayes_grpo.model.FittedModel`; default the shipped one.
    family, params_b, total_steps, reward_range
        Metadata, as for :func:`~bayes_grpo.logs.read_log`; ``total_steps`` is needed when the
        log does not say it (TRL's ``trainer_state.json`` does).
    threshold, tolerance
        The stop rule's settings (:func:`~bayes_grpo.stopping.decision_from_forecast`).
    poll
        Seconds between two looks at the log; > 0.
    once
        Yield one update and stop; a log that cannot be read then raises instead of being waited for,
        and a last line without its line end is still left out (it may be half written), unless with
        it the log reaches its planned end (a finished log may lack its last line end).
    seed
        Seed of the forecast draws.
    encoding
        Text encoding of the log; default UTF-8.
    metric, direction
        The logged per-step metric to forecast and whether higher or lower is better, as for
        :func:`~bayes_grpo.logs.read_log` (default: the summed reward, higher is better).

    Yields
    ------
    WatchUpdate

    Raises
    ------
    BayesGrpoError
        When the planned length is unknown, ``poll`` is not positive, or (``once=True``) the log cannot be read.

    Example
    -------
    >>> for update in watch("outputs/", reward_range=(0, 1)):  # doctest: +SKIP
    ...     print(update.decision.explain())
    """
    if not (isinstance(poll, (int, float)) and poll > 0):
        raise BayesGrpoError(f"watch: poll must be a number of seconds > 0, got {poll!r}")
    source = Path(path)
    metadata = dict(
        family=family, params_b=params_b, total_steps=total_steps, reward_range=reward_range, encoding=encoding, metric=metric, direction=direction
    )  # fmt: skip
    history: list[tuple[int, float]] = []
    seen: tuple | None = None
    reported: set[str] = set()
    while True:
        try:
            run, used = _read_complete(source, metadata, whole_lines=True, finished_whole=once)
            if len(run) < MIN_STEPS and run.reward_range is None:
                raise LogError(f"{source}: {len(run)} logged step(s) so far; the forecast starts at {MIN_STEPS} (or pass a reward range)")
        except (LogError, OSError, ValueError) as exc:
            if isinstance(exc, PlanError):  # a wrong plan does not fix itself as the log grows
                raise
            if once:
                raise BayesGrpoError(str(exc)) from exc
            message = f"waiting for {source}: {exc}"
            if message not in reported:
                reported.add(message)
                warnings.warn(message, stacklevel=2)
            time.sleep(poll)
            continue
        except _MidWrite:
            time.sleep(poll)
            continue
        planned_length(run.total_steps, run.last_step, str(source))
        if (len(run), run.last_step, float(run.rewards[-1])) != seen:
            seen = (len(run), run.last_step, float(run.rewards[-1]))
            model = model or _shipped_model()
            update = _update(run, used, model, threshold, tolerance, seed, history)
            yield update
            if once or update.finished:
                return
        time.sleep(poll)


class _MidWrite(Exception):
    """Every ``trainer_state.json`` of the folder is being written: look again at the next poll."""


def _read_complete(source: Path, metadata: dict, whole_lines: bool, finished_whole: bool = False) -> tuple[RunLog, Path]:
    """The run at ``source`` and the file it came from, read from what is completely written.

    For an output folder, the newest ``trainer_state.json`` that parses (:class:`_MidWrite` when
    none does yet); for a text log with ``whole_lines``, the lines up to the last line end (with
    ``finished_whole``, the whole log when with its unterminated last line it reaches its planned end).
    """
    from bayes_grpo.logs import read_log

    if source.is_dir():
        for state in _trainer_states(source):
            try:
                json.loads(state.read_text(encoding="utf-8"))
            except (OSError, ValueError):  # a checkpoint still being written: the one before it is complete
                continue
            return read_log(state, **metadata), state
        if any(source.glob("checkpoint-*/trainer_state.json")) or (source / "trainer_state.json").exists():
            raise _MidWrite
        return read_log(source, **metadata), source  # no trainer_state.json yet: read_log says what is missing
    if whole_lines and source.suffix.lower() in _TEXT_SUFFIXES and source.is_file():
        data = source.read_bytes()
        end = max(data.rfind(b"\n"), data.rfind(b"\r")) + 1
        if end < len(data):  # the last line has no line end yet: read a copy of the lines before it
            if finished_whole:  # ...unless it is the planned last step of a log written without a last line end
                try:
                    whole = read_log(source, **metadata)
                except (LogError, ValueError):
                    whole = None
                if whole is not None and whole.total_steps is not None and whole.last_step >= whole.total_steps:
                    return whole, source
            return _read_prefix(source, data[:end], metadata), source
    return read_log(source, **metadata), source


def _read_prefix(source: Path, prefix: bytes, metadata: dict) -> RunLog:
    """:func:`read_log` of ``source`` as if it held only ``prefix`` (a copy of the same name, beside a copy of its sidecar)."""
    from bayes_grpo.logs import RunLog, read_log

    sidecar = source.with_name(source.name[: -len(source.suffix)] + ".meta.json")
    with tempfile.TemporaryDirectory(prefix="bayes_grpo-watch-") as folder:
        copy = Path(folder) / source.name
        copy.write_bytes(prefix)
        if sidecar.is_file():
            (Path(folder) / sidecar.name).write_bytes(sidecar.read_bytes())
        try:
            run = read_log(copy, **metadata)
        except LogError as exc:
            raise LogError(str(exc).replace(str(copy), str(source))) from None
    return RunLog(run.run_id, run.table, dataclasses.replace(run.meta, source=str(source)))


def _trainer_states(folder: Path) -> list[Path]:
    """The folder's ``trainer_state.json`` files, newest checkpoint first (the top-level one after them)."""
    checkpoints = [(int(m.group(1)), p) for p in folder.glob("checkpoint-*/trainer_state.json") if (m := _CHECKPOINT.search(p.parent.name))]
    states = [p for _, p in sorted(checkpoints, reverse=True)]
    top = folder / "trainer_state.json"
    return states + ([top] if top.is_file() else [])


def _shipped_model() -> FittedModel:
    from bayes_grpo.model import default_model

    return default_model()


def _update(
    run: RunLog, source: Path, model: FittedModel, threshold: float, tolerance: float, seed: int, history: list[tuple[int, float]]
) -> WatchUpdate:
    """Forecast ``run``, decide, and add the decision to ``history``."""
    fc = model.forecast(run, seed=seed)
    decision = decision_from_forecast(fc, threshold=threshold, tolerance=tolerance)
    history.append((run.last_step, decision.probability))
    return WatchUpdate(run=run, forecast=fc, decision=decision, signals=grpo_signals(run), history=tuple(history), source=source)


def grpo_signals(run: RunLog) -> dict[str, float]:
    """The latest finite value of each GRPO signal ``run`` holds, by label (per-function rewards last).

    Parameters
    ----------
    run : RunLog
        A run read with :func:`~bayes_grpo.logs.read_log`.

    Returns
    -------
    dict of str to float
        Label -> value: labels of :data:`SHOWN_SIGNALS`, then ``reward <fn>`` per reward function.
    """
    held = run.signals
    names = [(name, label) for name, label in SHOWN_SIGNALS.items() if name in held]
    names += [(name, f"reward {match.group(1)}") for name in held if (match := _PER_FUNCTION.fullmatch(name))]
    signals = {}
    for name, label in names:
        values = run.signal(name)
        finite = values[np.isfinite(values)]
        if finite.size:
            signals[label] = float(finite[-1])
    return signals


# ------------------------------------------------------------------- figures


# --------------------------------------------------------------- the panel


def panel(update: WatchUpdate, poll: float | None = None, plot: Path | None = None) -> RenderableType:
    """The terminal panel of one update (:mod:`rich`): progress, reward, forecast, decision, signals.

    Parameters
    ----------
    update : WatchUpdate
        What to show.
    poll : float, optional
        Seconds between looks, named in the footer while the run goes on.
    plot : Path, optional
        The fan chart file rewritten at each update, named in the footer.

    Returns
    -------
    rich.panel.Panel
    """
    from rich.columns import Columns
    from rich.console import Group
    from rich.panel import Panel
    from rich.progress_bar import ProgressBar
    from rich.table import Table
    from rich.text import Text

    run, fc, decision = update.run, update.forecast, update.decision
    final = fc.final
    lo, hi = final.interval(0.9)
    facts = Table.grid(padding=(0, 2))
    facts.add_column(style="bold cyan", no_wrap=True)
    facts.add_column()
    progress = Table.grid(padding=(0, 1))
    progress.add_row(ProgressBar(total=fc.total_steps, completed=min(run.last_step, fc.total_steps), width=30), f"{run.last_step} of {fc.total_steps} steps ({run.last_step / fc.total_steps:.0%})")
    facts.add_row("steps", progress)
    facts.add_row("reward now", f"{run.rewards[-1]:.4g} (best step so far {decision.best_step})")
    facts.add_row("forecast final", f"{final.quantile(0.5):.4g}, 90% interval {lo:.4g} to {hi:.4g}")
    facts.add_row("P(plateau)", f"{decision.probability:.1%} (stop at {decision.threshold:.0%})")
    verdict = Text("STOP", style="bold red") if decision.should_stop else Text("keep training", style="bold green")
    facts.add_row("decision", verdict + Text(f" ({decision.reason})"))
    parts: list[RenderableType] = [facts, Text(decision.explain(), style="italic")]
    if update.signals:  # side by side, as many to a row as fit: the panel stays within a 24-line terminal
        cells = [Text.assemble((label, "cyan"), f" {value:.4g}") for label, value in update.signals.items()]
        parts += [Text("GRPO signals (latest)"), Columns(cells, padding=(0, 3))]
    footer = f"read {update.source} at {datetime.now():%H:%M:%S}"
    if update.finished:
        footer += "; the run reached its planned end"
    elif poll is not None:
        footer += f"; looking every {poll:g} s (Ctrl-C to quit)"
    if plot is not None:
        footer += f"; fan chart in {plot}"
    parts.append(Text(footer, style="dim"))
    return Panel(Group(*parts), title=f"[bold]bayes-grpo watch[/] {run.run_id}", title_align="left")
