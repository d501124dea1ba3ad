"""Run logs: read GRPO reward logs from every format users have, validate them.

Everything downstream (model, forecast, stopping rule) works on a
:class:`RunLog` — one run's per-step table plus its metadata — or a
:class:`RunSet` of them. :func:`read_log` accepts TRL ``trainer_state.json``
files and output directories, CSV/TSV/JSONL metric exports (W&B API and
web-UI chart exports too), DataFrames, console logs and notebooks holding
TRL's printed log dicts or the progress table Unsloth/TRL notebooks print,
verl/OpenRLHF/NeMo-RL console logs (verl's JSONL too), and TensorBoard event
files or folders of them. Bad input raises :class:`~bayes_grpo.errors.LogError` naming the file, the
field and the fix; repairs (dropped NaN rewards, re-sorted steps, a cut last
JSONL line, steps logged twice after a resume) are announced with a
:class:`LogWarning`, never done silently.

One module per format family: :mod:`~bayes_grpo.logs.trl` (``trainer_state.json``,
output folders), :mod:`~bayes_grpo.logs.tables` (CSV/TSV/JSONL),
:mod:`~bayes_grpo.logs.console` (console logs), :mod:`~bayes_grpo.logs.notebooks`
(``.ipynb``), :mod:`~bayes_grpo.logs.trainers` (verl, OpenRLHF and NeMo-RL console logs),
:mod:`~bayes_grpo.logs.tensorboard` (TensorBoard event files and folders);
:mod:`~bayes_grpo.logs.types` holds the run types,
:mod:`~bayes_grpo.logs.validate` the checks and repairs,
:mod:`~bayes_grpo.logs.families` family/size inference from model names. To
add a format, write its reader in one of those (or a new module) and add its
file ending to ``_READERS`` below.
"""

from __future__ import annotations

import csv
import os
from collections.abc import Callable, Iterable
from pathlib import Path

import pandas as pd

from bayes_grpo.errors import LogError
from bayes_grpo.logs.console import parse_console
from bayes_grpo.logs.families import infer_model, normalise_family
from bayes_grpo.logs.files import read_sidecar, read_text
from bayes_grpo.logs.notebooks import read_notebook
from bayes_grpo.logs.tables import read_csv_runs, read_jsonl, split_run_id
from bayes_grpo.logs.tensorboard import (
    is_event_file,
    read_tensorboard,
    tensorboard_runs,
)
from bayes_grpo.logs.trainers import parse_trainer_console
from bayes_grpo.logs.trl import (
    is_trl_output_dir,
    newest_trainer_state,
    read_json,
    run_id_for,
)
from bayes_grpo.logs.types import GRPO_SIGNALS, LogWarning, RunLog, RunMetadata, RunSet
from bayes_grpo.logs.validate import build_run
from bayes_grpo.settings import bundled_runs_dir

__all__ = [
    "GRPO_SIGNALS", "LogWarning", "RunLog", "RunMetadata", "RunSet", "infer_model", "load_runs", "normalise_family",
    "read_log", "read_runs",
]  # fmt: skip

#: Environment variable that replaces the bundled runs folder for ``load_runs()``.
DATA_ENV = "BAYES_GRPO_DATA"

_Raw = list[tuple[str | None, pd.DataFrame, dict]]


def _console(path: Path, encoding: str | None) -> tuple[pd.DataFrame, dict]:
    text = read_text(path, encoding)
    return parse_trainer_console(text, path) or parse_console(text, path)


def _one(reader: Callable[[Path, str | None], tuple[pd.DataFrame, dict]]) -> Callable[[Path, str | None], _Raw]:
    def read(path: Path, encoding: str | None) -> _Raw:
        frame, found = reader(path, encoding)
        return [(None, frame, found)]

    return read


_READERS: dict[str, Callable[[Path, str | None], _Raw]] = {
    ".json": _one(read_json), ".jsonl": _one(read_jsonl), ".ndjson": _one(read_jsonl), ".csv": read_csv_runs,
    ".tsv": read_csv_runs, ".txt": _one(_console), ".log": _one(_console), ".ipynb": _one(read_notebook),
    # a batch scheduler's job output (SLURM's slurm-<job>.out and .err) is the console's
    ".out": _one(_console), ".err": _one(_console),
}  # fmt: skip

LOG_SUFFIXES = tuple(_READERS)
"""File endings :func:`read_log` understands (plus TRL output directories)."""


def read_log(
    source: str | os.PathLike | pd.DataFrame,
    *,
    family: str | None = None,
    params_b: float | None = None,
    total_steps: int | None = None,
    reward_range: tuple[float, float] | None = None,
    run_id: str | None = None,
    encoding: str | None = None,
    metric: str = "reward",
    direction: str = "maximize",
) -> RunLog:
    """Read and validate one run's reward log.

    Metadata given as arguments wins over metadata found in the source (a
    sidecar ``<name>.meta.json``, constant columns, ``trainer_state.json``, the
    model named in a notebook, ``config.json`` or console output);
    ``run.meta.provenance`` records where each value came from. Every logged
    per-step number is kept under one canonical name (``run.signals``,
    ``run.signal(name)``); ``metric=`` picks the one to forecast.

    Parameters
    ----------
    source : str, os.PathLike or pandas.DataFrame
        A TRL ``trainer_state.json``, a TRL/transformers output directory, a
        CSV/TSV/JSONL of per-step metrics (a one-run W&B web-UI export and verl's
        file logger included), a DataFrame, a console log / notebook (``.txt``,
        ``.log``, ``.ipynb``) holding TRL's printed log dicts or progress table or
        verl's, OpenRLHF's or NeMo-RL's per-step output, or a TensorBoard event
        file or folder of one run (a folder of several runs is an error that lists them).
    family, params_b, total_steps, reward_range : optional
        Model family, size in billions of parameters, planned steps, (min, max) reward.
    run_id : str, optional
        Run id; default: ``run_id`` in the metadata, else the file stem (the
        run folder for ``trainer_state.json``, the run name for a W&B export).
    encoding : str, optional
        Text encoding of the file (e.g. ``"latin-1"``); default UTF-8.
    metric : str
        The per-step metric the run's ``reward`` column holds, the one forecasts and stop
        decisions are about: default the summed ``reward``; else any logged number, under
        any of its names (``"rewards/correctness_reward_func"``, ``"eval_reward"``,
        ``"train/kl"``). Steps where it was not logged are left out (an evaluation metric
        logged every 50 steps gives a run of those steps); ``reward_range`` is then in
        the metric's units, and a reward range or initial reward found in the log
        (they describe the summed reward) is not used.
    direction : str
        ``"maximize"`` (default) or ``"minimize"`` for a lower-is-better metric (a loss):
        the run then holds the negated metric and ``reward_range``, so that a falling
        loss is a rising curve; ``run.direction`` says so.

    Returns
    -------
    RunLog
        The validated run.

    Raises
    ------
    LogError
        On anything unusable, including a file holding several runs (read
        those with :func:`read_runs` or :func:`load_runs`), and a ``metric`` the
        log does not hold (the message lists the metrics it has).

    Example
    -------
    >>> run = read_log("outputs/checkpoint-500/trainer_state.json", family="qwen")  # doctest: +SKIP
    >>> run.meta.provenance["family"]  # doctest: +SKIP
    'argument'
    """
    given = _given(family, params_b, total_steps, reward_range)
    target = {"metric": metric, "direction": direction}
    if isinstance(source, pd.DataFrame):
        return build_run(source.copy(), {}, given, run_id, "run", "DataFrame", **target)
    path = Path(source)
    raws = _read_raw(path, encoding)
    if len(raws) > 1 and path.is_dir():
        names = ", ".join(repr(n) for n, _, _ in raws[:5]) + (", ..." if len(raws) > 5 else "")
        raise LogError(
            f"{path}: the folder holds {len(raws)} TensorBoard runs ({names}); give one run's folder, or read "
            "them all with bayes_grpo.load_runs(path) or bayes_grpo.logs.read_runs(path), one RunLog per run"
        )
    if len(raws) > 1:
        names = ", ".join(repr(n) for n, _, _ in raws[:5]) + (", ..." if len(raws) > 5 else "")
        raise LogError(
            f"{path}: the file holds {len(raws)} runs ({names}); read it with bayes_grpo.load_runs(path) or "
            "bayes_grpo.logs.read_runs(path), which give one RunLog per run"
        )
    name, frame, found = raws[0]
    return build_run(frame, found, given, run_id, name or _default_run_id(path), str(path), **target)


def read_runs(
    source: str | os.PathLike,
    *,
    family: str | None = None,
    params_b: float | None = None,
    total_steps: int | None = None,
    reward_range: tuple[float, float] | None = None,
    encoding: str | None = None,
    metric: str = "reward",
    direction: str = "maximize",
) -> list[RunLog]:
    """Every run in one log file: one :class:`RunLog` per run of a W&B export or ``run_id`` value.

    A file with one run gives a one-element list (the same run as :func:`read_log`).

    Parameters
    ----------
    source : str or os.PathLike
        A log file or TRL output folder (see :func:`read_log`).
    family, params_b, total_steps, reward_range : optional
        Metadata applied to every run (wins over what the file says).
    encoding : str, optional
        Text encoding of the file; default UTF-8.
    metric, direction : str
        The metric each run forecasts and whether lower is better (see :func:`read_log`).

    Returns
    -------
    list of RunLog
        The runs in file order; run ids are the W&B run names or ``run_id`` values.

    Raises
    ------
    LogError
        On anything unusable.

    Example
    -------
    >>> [r.run_id for r in read_runs("wandb_chart_export.csv")]  # doctest: +SKIP
    ['qwen-1.5b-lr1e-6', 'qwen-1.5b-lr3e-6']
    """
    path = Path(source)
    given = _given(family, params_b, total_steps, reward_range)
    parts = [
        (run_name or name, part, found)
        for name, frame, found in _read_raw(path, encoding)
        for run_name, part in split_run_id(frame)
    ]
    default_id = _default_run_id(path)
    return [
        build_run(
            part, found, given, run_id, default_id, str(path) if len(parts) == 1 else f"{path} (run {run_id!r})",
            metric=metric, direction=direction,
        )
        for run_id, part, found in parts
    ]


def load_runs(
    path: str | os.PathLike | Iterable[str | os.PathLike] | None = None,
    *,
    encoding: str | None = None,
    metric: str = "reward",
    direction: str = "maximize",
) -> RunSet:
    """Read every log in a folder, a file or a list of paths into a :class:`RunSet`.

    A file holding several runs (a W&B web-UI export of several runs, a table
    with a ``run_id`` column) gives one run each. Sidecar ``*.meta.json`` files
    are metadata, not runs.

    Parameters
    ----------
    path : str, os.PathLike, iterable of those, or None
        A folder (every log directly inside it: files ending in
        :data:`LOG_SUFFIXES` and TRL output folders; a folder with none of
        those but TensorBoard event files in or below it gives its runs), one file, or a list of
        paths. None reads the runs bundled with the package
        (:func:`bayes_grpo.settings.bundled_runs_dir`), or the folder named by
        the ``BAYES_GRPO_DATA`` environment variable when it is set.
    encoding : str, optional
        Text encoding of the files; default UTF-8.
    metric, direction : str
        The metric each run forecasts and whether lower is better (see :func:`read_log`).

    Returns
    -------
    RunSet
        The runs, in path order.

    Raises
    ------
    LogError
        When the path does not exist, holds no logs, or a log is unusable.

    Example
    -------
    >>> runs = load_runs()  # doctest: +SKIP
    >>> runs.filter(family="qwen")  # doctest: +SKIP
    """
    if path is None:
        folder = Path(os.environ.get(DATA_ENV) or bundled_runs_dir())
        if not folder.is_dir():
            raise LogError(
                f"bundled runs folder {folder} does not exist; generate the runs (see README) "
                f"or point {DATA_ENV} at a folder of logs"
            )
        paths = _log_files(folder)
    elif isinstance(path, (str, os.PathLike)):
        p = Path(path)
        if not p.exists():
            raise LogError(f"{p}: no such file or folder; check the path")
        paths = _log_files(p) if p.is_dir() and not is_trl_output_dir(p) else [p]
        if not paths and p.is_dir() and tensorboard_runs(p):
            paths = [p]  # a folder of TensorBoard runs: one RunLog per run
    else:
        paths = [Path(p) for p in path]
    if not paths:
        raise LogError(f"{path}: no logs found (looked for {', '.join(LOG_SUFFIXES)} files and TRL output folders)")
    return RunSet(run for p in paths for run in read_runs(p, encoding=encoding, metric=metric, direction=direction))


def _given(family: str | None, params_b: float | None, total_steps: int | None, reward_range: tuple | None) -> dict:
    given = {"family": family, "params_b": params_b, "total_steps": total_steps, "reward_range": reward_range}
    return {k: v for k, v in given.items() if v is not None}


def _log_files(folder: Path) -> list[Path]:
    """Logs directly inside ``folder``: files with a known suffix and TRL output dirs."""
    found = []
    for p in sorted(folder.iterdir()):
        if p.name.startswith(".") or p.name.endswith(".meta.json"):
            continue
        if (p.is_file() and p.suffix.lower() in LOG_SUFFIXES) or (p.is_dir() and is_trl_output_dir(p)):
            found.append(p)
    return found


def _default_run_id(path: Path) -> str:
    """File stem; for ``trainer_state.json`` the enclosing run folder's name, for an event file its folder's."""
    if path.is_dir():
        return path.resolve().name
    if path.name == "trainer_state.json":
        return run_id_for(path)
    if is_event_file(path):
        return path.resolve().parent.name
    return path.stem


def _read_raw(path: Path, encoding: str | None) -> _Raw:
    """Raw tables and the metadata found in the file(s), one entry per run; errors become LogError."""
    if not path.exists():
        raise LogError(f"{path}: no such file or folder; check the path")
    if path.is_dir():
        if not is_trl_output_dir(path) and tensorboard_runs(path):
            return read_tensorboard(path)
        return _read_raw(newest_trainer_state(path), encoding)
    if is_event_file(path):
        return read_tensorboard(path)
    suffix = path.suffix.lower()
    if suffix not in _READERS:
        raise LogError(
            f"{path}: unsupported file type {suffix or '(none)'!r}; give a TRL trainer_state.json or output folder, "
            f"or a {', '.join(LOG_SUFFIXES[1:])} file"
        )
    try:
        raws = _READERS[suffix](path, encoding)
    except LogError:
        raise
    except UnicodeDecodeError as exc:
        raise LogError(f"{path}: not a text file ({exc.reason} at byte {exc.start}); give a text log") from exc
    except (ValueError, TypeError, KeyError, IndexError, RecursionError, csv.Error, pd.errors.ParserError) as exc:
        raise LogError(f"{path}: could not parse as a {suffix} log ({type(exc).__name__}: {exc})") from exc
    sidecar = path.with_name(path.name[: -len(path.suffix)] + ".meta.json")
    if sidecar.is_file():
        extra = read_sidecar(sidecar, encoding)
        label = {k: "sidecar" for k in extra}
        raws = [
            (name, frame, {**found, **extra, "provenance": {**(found.get("provenance") or {}), **label}})
            for name, frame, found in raws
        ]
    return raws

