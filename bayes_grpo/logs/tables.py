"""Tables of per-step metrics: CSV / TSV (metric exports, W&B web-UI chart exports) and JSONL.

A W&B web-UI chart export ("Download CSV" on a line plot) has a ``Step``
column and, per run, ``<run name> - <metric>`` plus ``__MIN`` / ``__MAX``
columns (the extremes of each plotted bucket when W&B samples the history);
it holds one run or several, and :func:`read_csv_runs` gives one table per run.
A W&B *API* export (``run.history()`` saved as CSV) is an ordinary table with
``train/reward`` and ``train/global_step`` columns.
"""

from __future__ import annotations

import csv
import io
import json
import re
import warnings
from pathlib import Path

import pandas as pd

from bayes_grpo.errors import LogError
from bayes_grpo.logs.files import decode
from bayes_grpo.logs.types import LogWarning
from bayes_grpo.logs.validate import REWARD_NAMES, STEP_NAMES, normalise_column

__all__ = ["is_wandb_export", "read_csv_runs", "read_jsonl", "split_run_id", "split_wandb_export"]

_AGGREGATE = re.compile(r"__(MIN|MAX)$")


def read_csv_runs(path: Path, encoding: str | None = None) -> list[tuple[str | None, pd.DataFrame, dict]]:
    """Every run's raw table in a CSV/TSV file as ``(run name or None, table, found metadata)``.

    A W&B web-UI chart export gives one entry per run (named by the run); any
    other table gives one entry named None.

    Parameters
    ----------
    path : pathlib.Path
        The ``.csv`` (comma) or ``.tsv`` (tab) file.
    encoding : str, optional
        Text encoding; default UTF-8 (see :func:`~bayes_grpo.logs.files.read_text`).

    Returns
    -------
    list of (str or None, pandas.DataFrame, dict)
        ``(run name, raw table, found metadata)`` per run.

    Raises
    ------
    LogError
        When the file is empty or not valid text, or a W&B export repeats a run name.
    """
    text = decode(path.read_bytes(), path, encoding)
    if not text.strip():
        raise LogError(f"{path}: the file is empty; nothing to read")
    sep = "\t" if path.suffix.lower() == ".tsv" else ","
    header = next(csv.reader(io.StringIO(text.lstrip("\ufeff")), delimiter=sep), [])
    if is_wandb_export(header):
        duplicated = sorted({h for h in header if header.count(h) > 1})
        if duplicated:
            raise LogError(
                f"{path}: W&B export has repeated columns {duplicated[:3]} (two runs with the same name); "
                "rename the runs in W&B before exporting"
            )
        frame = pd.read_csv(io.StringIO(text), sep=sep, dtype=str, keep_default_na=False)
        return split_wandb_export(frame, str(path))
    return [(None, pd.read_csv(io.StringIO(text), sep=sep), {})]


def is_wandb_export(columns: list[str]) -> bool:
    """True for the header of a W&B web-UI chart export: ``<run> - <metric>`` columns, one a reward.

    Example
    -------
    >>> is_wandb_export(["Step", "grpo-1 - train/reward", "grpo-1 - train/reward__MIN"])
    True
    """
    return any(
        " - " in str(c) and normalise_column(_AGGREGATE.sub("", str(c)).rsplit(" - ", 1)[1]) in REWARD_NAMES
        for c in columns
    )


def split_wandb_export(frame: pd.DataFrame, name: str) -> list[tuple[str, pd.DataFrame, dict]]:
    """One raw table per run of a W&B web-UI chart export, runs in column order.

    The x-axis column becomes ``step``; ``<run> - <metric>`` columns become
    ``<metric>``; ``__MIN`` / ``__MAX`` columns are left out (they bound W&B's
    sampling buckets, they are not logged values). Rows where the run has no
    value at all belong to the other runs and are left out.

    Parameters
    ----------
    frame : pandas.DataFrame
        The export read as text (``dtype=str``, empty cells as ``""``).
    name : str
        The file's name, for messages.

    Returns
    -------
    list of (str, pandas.DataFrame, dict)
        ``(run name, raw table, found metadata)`` per run.

    Raises
    ------
    LogError
        When no column is a step axis.

    Example
    -------
    >>> split_wandb_export(pd.DataFrame({"Step": ["1"], "a - train/reward": ["0.5"]}), "x.csv")[0][0]
    'a'
    """
    plain = [c for c in frame.columns if " - " not in str(c)]
    step_col = next((c for c in plain if normalise_column(c) in STEP_NAMES), None)
    if step_col is None:
        raise LogError(
            f"{name}: W&B export has no step column (x-axis columns {plain[:5]}); "
            "export the chart with Step (or train/global_step) on the x-axis"
        )
    runs: dict[str, dict[str, str]] = {}
    for col in frame.columns:
        if " - " not in str(col) or _AGGREGATE.search(str(col)):
            continue
        run, metric = str(col).rsplit(" - ", 1)
        runs.setdefault(run.strip(), {})[col] = metric.strip()
    out = []
    for run, columns in runs.items():
        part = frame[[step_col, *columns]].rename(columns={step_col: "step", **columns})
        values = part[list(columns.values())].apply(lambda c: c.str.strip())
        part = part.loc[(values != "").any(axis=1)].reset_index(drop=True)
        if part.empty:
            continue
        found = {"extra": {"export": "W&B web-UI chart export", "wandb_run": run}}
        out.append((run, part.replace("", None), found))
    if not out:
        raise LogError(f"{name}: W&B export has no values for any run; export the chart after the runs logged")
    return out


def split_run_id(frame: pd.DataFrame) -> list[tuple[str | None, pd.DataFrame]]:
    """A table with a ``run_id`` column holding several runs, split into one table per run (first-seen order).

    Parameters
    ----------
    frame : pandas.DataFrame
        A raw table.

    Returns
    -------
    list of (str or None, pandas.DataFrame)
        ``(run_id, rows of that run)``; ``[(None, frame)]`` when the table holds one run.
    """
    if "run_id" not in frame.columns or frame["run_id"].dropna().nunique() <= 1:
        return [(None, frame)]
    ids = frame["run_id"].dropna().unique()
    return [(str(run_id), frame.loc[frame["run_id"] == run_id].reset_index(drop=True)) for run_id in ids]


def read_jsonl(path: Path, encoding: str | None = None) -> tuple[pd.DataFrame, dict]:
    """One JSON object of metrics per line; a last line cut mid-write is dropped with a :class:`LogWarning`.

    verl's file logger nests each step's metrics, ``{"step": N, "data": {...}}``: those are unnested.

    A line that is not JSON anywhere else is an error: only the last line can
    have been cut by a crash or a copy taken while training was still writing.
    A multi-byte character cut at the very end of the file counts as part of
    that cut line.

    Parameters
    ----------
    path : pathlib.Path
        The ``.jsonl`` / ``.ndjson`` file.
    encoding : str, optional
        Text encoding; default UTF-8.

    Returns
    -------
    tuple of (pandas.DataFrame, dict)
        The raw table (one row per complete line) and found metadata (none).

    Raises
    ------
    LogError
        On a broken line that is not the last one, or a line that is not a JSON object.
    """
    data = path.read_bytes()
    cut_bytes = b""
    if encoding is None:
        try:
            data.decode("utf-8")
        except UnicodeDecodeError as exc:
            # A multi-byte character cut at the very end of the file: part of a cut last line.
            if exc.reason == "unexpected end of data" and exc.end == len(data) and b"\n" not in data[exc.start :]:
                data, cut_bytes = data[: exc.start], data[exc.start :]
    # Only "\n" ends a JSONL line: str.splitlines() would also split inside strings at U+0085, U+2028, ...
    lines = [line.removesuffix("\r") for line in decode(data, path, encoding).split("\n")]
    numbered = [(n, line) for n, line in enumerate(lines, 1) if line.strip()]
    records = []
    for position, (number, line) in enumerate(numbered):
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            if position == len(numbered) - 1 and line.lstrip().startswith("{"):
                warnings.warn(
                    f"{path}: line {number} (the last) is cut off mid-write ({exc.msg}: "
                    f"{(line.strip() + cut_bytes.decode('latin-1'))[-40:]!r}); dropped it and read the "
                    f"{len(records)} complete line(s) before it",
                    LogWarning,
                    stacklevel=4,
                )
                break
            raise LogError(f"{path}: line {number} is not JSON ({exc.msg}); fix or delete that line") from exc
        if not isinstance(record, dict):
            raise LogError(f"{path}: line {number} is not a JSON object of metrics; each line must be {{...}}")
        if record.keys() == {"step", "data"} and isinstance(record["data"], dict):
            # verl's file logger (verl/utils/tracking.py, FileLogger): {"step": N, "data": {metric: value, ...}}
            record = {**record["data"], "step": record["step"]}
        records.append(record)
    return pd.DataFrame.from_records(records), {}
