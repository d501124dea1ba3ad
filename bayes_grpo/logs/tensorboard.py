"""TensorBoard event files: what TRL (through transformers), verl, OpenRLHF and NeMo-RL write with ``SummaryWriter``.

Every scalar tag becomes a column, every logged step a row; tag names are
normalised like any other column (:func:`~bayes_grpo.logs.names.normalise_column`:
TRL's ``train/reward`` -> ``reward``, verl's ``critic/score/mean`` -> ``reward``,
OpenRLHF's ``train/group_reward_std`` -> ``reward_std``, NeMo-RL's
``validation/accuracy`` -> ``eval_accuracy``, ...). The events are read with
TensorBoard's own reader (``EventAccumulator``), so the ``tensorboard`` package
is needed: ``pip install "bayes-grpo[tensorboard]"``. It is imported only when
an event file is read.

A *run* is a folder holding event files (``events.out.tfevents.*``), as
TensorBoard itself counts runs. A folder given to
:func:`~bayes_grpo.logs.read_log` may be one run or hold several in its
sub-folders (``runs/Jan01_12-00-00_host/``, ``tensorboard_log/project/exp1/``):
one run is read whatever its depth; several are an error that lists them
(read them with :func:`~bayes_grpo.logs.read_runs` or
:func:`~bayes_grpo.logs.load_runs`, one :class:`~bayes_grpo.logs.RunLog` per
run, named by its folder relative to the one given). A step logged again after
a resume keeps its later value, as TensorBoard shows it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from bayes_grpo.errors import LogError

__all__ = ["EVENT_MARK", "is_event_file", "read_tensorboard", "tensorboard_runs"]

#: Part of every event file's name (``events.out.tfevents.<time>.<host>.<pid>.<n>``).
EVENT_MARK = "tfevents"
_INSTALL = 'pip install "bayes-grpo[tensorboard]"'


def is_event_file(path: Path) -> bool:
    """True for a TensorBoard event file (its name holds ``tfevents``)."""
    return EVENT_MARK in path.name and path.is_file()


def tensorboard_runs(folder: Path) -> list[Path]:
    """The run folders under ``folder`` (itself included): every folder that directly holds an event file, sorted.

    Parameters
    ----------
    folder : pathlib.Path
        Any folder.

    Returns
    -------
    list of pathlib.Path
        Empty when no event file is in or below ``folder``.
    """
    return sorted({p.parent for p in folder.rglob(f"*{EVENT_MARK}*") if p.is_file() and not p.name.startswith(".")})


def read_tensorboard(path: Path, encoding: str | None = None) -> list[tuple[str | None, pd.DataFrame, dict]]:
    """Every run's raw table in a TensorBoard folder or event file: ``(run name or None, table, found metadata)``.

    Parameters
    ----------
    path : pathlib.Path
        An event file, a run folder, or a folder whose sub-folders are runs.
    encoding : str, optional
        Unused (event files are binary); accepted like every reader's.

    Returns
    -------
    list of (str or None, pandas.DataFrame, dict)
        One entry per run: named None when there is one, else by the run folder's path relative
        to ``path``. Each table has a ``step`` column and one column per scalar tag.

    Raises
    ------
    LogError
        When tensorboard is not installed, no event file is found, or the event files hold no scalars.
    """
    try:
        from tensorboard.backend.event_processing import event_accumulator
    except ImportError as exc:
        raise LogError(f"{path}: reading TensorBoard event files needs the tensorboard package; {_INSTALL}") from exc
    if path.is_file():
        return [(None, _run_table(event_accumulator, path, path), {})]
    runs = tensorboard_runs(path)
    if not runs:
        raise LogError(f"{path}: no TensorBoard event files (events.out.tfevents.*) in or below this folder")
    if len(runs) == 1:
        return [(None, _run_table(event_accumulator, runs[0], path), {})]
    return [(run.relative_to(path).as_posix(), _run_table(event_accumulator, run, path), {}) for run in runs]


def _run_table(event_accumulator: Any, run: Path, given: Path) -> pd.DataFrame:
    """One run's scalars as a table: one row per step, one column per tag (the later value of a repeated step)."""
    guidance = {kind: 1 for kind in event_accumulator.DEFAULT_SIZE_GUIDANCE}
    guidance.update({event_accumulator.SCALARS: 0, event_accumulator.TENSORS: 0})  # 0: keep every event
    accumulator = event_accumulator.EventAccumulator(str(run), size_guidance=guidance)
    try:
        accumulator.Reload()
    except Exception as exc:  # tensorboard raises its own types (DataLossError, protobuf DecodeError, ...)
        raise LogError(f"{run}: not a readable TensorBoard event file ({type(exc).__name__}: {exc})") from exc
    tags = accumulator.Tags()
    columns: dict[str, dict[int, float]] = {}
    for tag in tags.get(event_accumulator.SCALARS, []):
        columns[tag] = {int(e.step): float(e.value) for e in accumulator.Scalars(tag)}
    for tag in tags.get(event_accumulator.TENSORS, []):
        if tag in columns:
            continue
        values = {}
        for event in accumulator.Tensors(tag):
            value = _scalar(event.tensor_proto)
            if value is not None:
                values[int(event.step)] = value
        if values:
            columns[tag] = values
    columns.pop("step", None)  # the step is each event's own
    if not columns:
        where = run if run == given else f"{run} (under {given})"
        raise LogError(
            f"{where}: the TensorBoard event files hold no scalars; is this the training run's log folder "
            "(the one SummaryWriter wrote to)?"
        )
    steps = sorted({step for values in columns.values() for step in values})
    frame = pd.DataFrame({tag: [values.get(s, np.nan) for s in steps] for tag, values in columns.items()})
    frame.insert(0, "step", np.asarray(steps, dtype=np.int64))
    return frame


def _scalar(proto: Any) -> float | None:
    """The number a scalar tensor summary holds (TF2 ``tf.summary.scalar``), else None (text, images, ...)."""
    from tensorboard.util import tensor_util

    try:
        array = tensor_util.make_ndarray(proto)
    except Exception:  # noqa: BLE001 - not a numeric tensor
        return None
    if array.size != 1 or not np.issubdtype(array.dtype, np.number):
        return None
    return float(array.reshape(()))
