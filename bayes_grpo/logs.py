"""Run logs: read GRPO reward logs from every format users have, validate them.

Everything downstream (model, forecast, stopping rule) works on a
:class:`RunLog` — one run's per-step table plus its metadata — or a
:class:`RunSet` of them. :func:`read_log` accepts TRL ``trainer_state.json``
files and output directories, CSV/JSONL metric exports (W&B too), DataFrames,
console logs and notebooks holding TRL's printed log dicts or the progress
table Unsloth/TRL notebooks print. Bad input raises :class:`LogError` naming
the file, the field and the fix; repairs (dropped NaN rewards, re-sorted
steps) are announced with a :class:`LogWarning`, never done silently.
"""

from __future__ import annotations

import ast
import csv
import dataclasses
import json
import math
import os
import re
import warnings
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import xarray as xr

from bayes_grpo.errors import LogError

__all__ = ["LogWarning", "RunLog", "RunMetadata", "RunSet", "load_runs", "normalise_family", "read_log"]

LOG_SUFFIXES = (".json", ".jsonl", ".ndjson", ".csv", ".tsv", ".txt", ".log", ".ipynb")
"""File endings :func:`read_log` understands (plus TRL output directories)."""

_STEP_NAMES = ("step", "global_step", "trainer/global_step", "_step")
_REWARD_NAMES = ("reward", "mean_reward", "reward_mean")
_STD_NAMES = ("reward_std", "std_reward")
_COLUMN_ALIASES = {"training loss": "loss", "validation loss": "eval_loss"}
# Columns that describe the run rather than the step; constant ones become metadata.
_META_COLUMNS = {
    "run_id", "family", "params_b", "total_steps", "steps_per_epoch", "reward_min",
    "reward_max", "reward_range", "initial_reward", "hardware", "model", "model_name",
    "dataset", "task", "method", "lora", "seed", "source_repo", "source_path", "source_commit",
}  # fmt: skip
_FAMILIES = ("qwen", "llama", "gemma", "phi", "mistral", "gpt-oss", "gpt-neox", "deepseek", "smollm", "olmo")


def normalise_family(name: str) -> str:
    """Canonical family name: ``"Qwen2"``/``"qwen3"`` -> ``"qwen"``, ``"gpt_oss"`` -> ``"gpt-oss"``, ``"gemma3_text"`` -> ``"gemma"``.

    Families are matched by prefix against the known ones (transformers'
    ``model_type`` values and hub names alike); anything else is lower-cased with
    everything from the first non-letter on dropped (``"falcon_h1"`` -> ``"falcon"``).
    """
    text = str(name).strip().lower().replace("_", "-")
    known = next((family for family in _FAMILIES if text.startswith(family)), None)
    if known:
        return known
    match = re.match(r"[a-z]+", text)
    return match.group(0) if match else text


class LogWarning(UserWarning):
    """A log was repaired while reading (rows dropped, steps re-sorted)."""


@dataclass(frozen=True)
class RunMetadata:
    """What is known about a run besides its per-step table."""

    family: str | None = None
    """Lower-case model family, e.g. ``"qwen"``, ``"llama"``, ``"gemma"``, ``"phi"``."""
    params_b: float | None = None
    """Model size in billions of parameters."""
    total_steps: int | None = None
    """Planned number of training steps (``max_steps``)."""
    steps_per_epoch: int | None = None
    reward_range: tuple[float, float] | None = None
    """(min, max) attainable reward, when the recipe defines one."""
    initial_reward: float | None = None
    """Reward measured before GRPO started, if known."""
    hardware: str | None = None
    source: str | None = None
    """File path or description of where the log came from."""
    extra: dict = field(default_factory=dict)
    """Anything else (model name, dataset, seeds, command line, ...)."""


_META_FIELDS = tuple(f.name for f in dataclasses.fields(RunMetadata) if f.name != "extra")


@dataclass(frozen=True, eq=False)
class RunLog:
    """One training run: ``table`` has one row per logged step, ``meta`` the rest.

    ``table`` always has an int64 ``step`` column (sorted, unique, >= 0) and a
    finite float64 ``reward`` column; optionally ``reward_std``, per-function
    rewards as ``rewards/<name>`` and any other logged metric. Build one with
    :func:`read_log`, which repairs and validates; the constructor only checks.
    """

    run_id: str
    table: pd.DataFrame
    meta: RunMetadata = field(default_factory=RunMetadata)

    def __post_init__(self) -> None:
        where = self.meta.source or self.run_id
        if not {"step", "reward"} <= set(self.table.columns):
            raise LogError(f"{where}: a RunLog table needs 'step' and 'reward' columns; use read_log() to build one")
        if self.table.empty:
            raise LogError(f"{where}: the run has no logged steps")
        steps = self.table["step"].to_numpy()
        if np.any(np.diff(steps) <= 0):
            raise LogError(f"{where}: 'step' must be strictly increasing; use read_log() to sort and de-duplicate")
        _check_meta(self.meta, int(steps[-1]), where)

    @property
    def steps(self) -> np.ndarray:
        """Logged steps (int64)."""
        return self.table["step"].to_numpy(dtype=np.int64)

    @property
    def rewards(self) -> np.ndarray:
        """Mean reward at each logged step (float64)."""
        return self.table["reward"].to_numpy(dtype=np.float64)

    @property
    def reward_std(self) -> np.ndarray | None:
        """Within-step reward standard deviation, or None when not logged."""
        if "reward_std" not in self.table:
            return None
        return self.table["reward_std"].to_numpy(dtype=np.float64)

    @property
    def family(self) -> str | None:
        return self.meta.family

    @property
    def params_b(self) -> float | None:
        return self.meta.params_b

    @property
    def total_steps(self) -> int | None:
        return self.meta.total_steps

    @property
    def reward_range(self) -> tuple[float, float] | None:
        return self.meta.reward_range

    @property
    def initial_reward(self) -> float | None:
        return self.meta.initial_reward

    @property
    def last_step(self) -> int:
        """The last logged step."""
        return int(self.table["step"].iloc[-1])

    def __len__(self) -> int:
        return len(self.table)

    def __repr__(self) -> str:
        return (
            f"RunLog({self.run_id!r}, {len(self)} steps {self.steps[0]}..{self.last_step}, "
            f"family={self.family!r}, params_b={self.params_b}, total_steps={self.total_steps})"
        )

    def to_frame(self) -> pd.DataFrame:
        """The table with ``run_id`` and the metadata fields as extra columns."""
        frame = self.table.copy()
        frame.insert(0, "run_id", self.run_id)
        for name, value in _meta_columns(self.meta).items():
            frame[name] = value
        return frame

    def head(self, step: int) -> RunLog:
        """The run as it looked at ``step``: rows with ``step <= step``, same metadata."""
        table = self.table[self.table["step"] <= step].reset_index(drop=True)
        if table.empty:
            raise LogError(
                f"{self.meta.source or self.run_id}: no logged step at or before step {step} "
                f"(first logged step is {self.steps[0]}); pick a later step"
            )
        return RunLog(self.run_id, table, self.meta)

    def with_meta(self, **changes: Any) -> RunLog:
        """A copy with the given :class:`RunMetadata` fields replaced (validated)."""
        unknown = set(changes) - {f.name for f in dataclasses.fields(RunMetadata)}
        if unknown:
            raise LogError(f"unknown metadata field(s) {sorted(unknown)}; known: {list(_META_FIELDS)} and extra")
        meta = _clean_meta({**dataclasses.asdict(self.meta), **changes}, self.meta.source or self.run_id)
        return RunLog(self.run_id, self.table, meta)


class RunSet(Sequence[RunLog]):
    """An ordered collection of runs with unique run ids."""

    def __init__(self, runs: Iterable[RunLog]) -> None:
        self.runs: list[RunLog] = list(runs)
        ids = [r.run_id for r in self.runs]
        dupes = sorted({i for i in ids if ids.count(i) > 1})
        if dupes:
            raise LogError(f"duplicate run_id(s) {dupes}; give each run its own run_id")

    def __len__(self) -> int:
        return len(self.runs)

    def __iter__(self) -> Iterator[RunLog]:
        return iter(self.runs)

    def __getitem__(self, key: int | str) -> RunLog:  # type: ignore[override]
        if isinstance(key, str):
            for run in self.runs:
                if run.run_id == key:
                    return run
            raise KeyError(key)
        return self.runs[key]

    def __repr__(self) -> str:
        return f"RunSet({len(self)} runs: {', '.join(r.run_id for r in self.runs[:5])}{', ...' if len(self) > 5 else ''})"

    @property
    def run_ids(self) -> list[str]:
        return [r.run_id for r in self.runs]

    def filter(self, **criteria: Any) -> RunSet:
        """Runs whose metadata equal the given values, e.g. ``filter(family="qwen")``."""
        return RunSet(r for r in self.runs if all(getattr(r.meta, k) == v for k, v in criteria.items()))

    def to_frame(self) -> pd.DataFrame:
        """Tidy long table: one row per (run, step), metadata repeated per row."""
        if not self.runs:
            return pd.DataFrame(columns=["run_id", "step", "reward", *_META_FIELDS])
        return pd.concat([r.to_frame() for r in self.runs], ignore_index=True)

    def to_xarray(self) -> xr.Dataset:
        """Dataset on dims (run, step): ``reward`` (and ``reward_std``) NaN where not logged.

        Per-run coords: ``family`` (str, ``"unknown"`` when not known),
        ``params_b`` and ``total_steps`` (float, NaN when not known).
        """
        steps = np.unique(np.concatenate([r.steps for r in self.runs])) if self.runs else np.array([], np.int64)
        data: dict[str, Any] = {}
        for var in ("reward", "reward_std"):
            if any(var in r.table for r in self.runs):
                grid = np.full((len(self.runs), len(steps)), np.nan)
                for i, run in enumerate(self.runs):
                    if var in run.table:
                        grid[i, np.searchsorted(steps, run.steps)] = run.table[var].to_numpy(dtype=float)
                data[var] = (("run", "step"), grid)
        if "reward" not in data:
            data["reward"] = (("run", "step"), np.empty((0, len(steps))))

        def _num(value: float | None) -> float:
            return np.nan if value is None else float(value)

        coords = {
            "run": [r.run_id for r in self.runs],
            "step": steps.astype(np.int64),
            "family": ("run", [r.family or "unknown" for r in self.runs]),
            "params_b": ("run", np.array([_num(r.params_b) for r in self.runs], dtype=float)),
            "total_steps": ("run", np.array([_num(r.total_steps) for r in self.runs], dtype=float)),
        }
        return xr.Dataset(data, coords=coords)


# --------------------------------------------------------------------- public


def read_log(
    source: str | os.PathLike | pd.DataFrame,
    *,
    family: str | None = None,
    params_b: float | None = None,
    total_steps: int | None = None,
    reward_range: tuple[float, float] | None = None,
    run_id: str | None = None,
) -> RunLog:
    """Read and validate one run's reward log.

    ``source`` is a TRL ``trainer_state.json``, a TRL/transformers output
    directory, a CSV/TSV/JSONL of per-step metrics, a DataFrame, or a console
    log / notebook (``.txt``, ``.log``, ``.ipynb``) holding TRL's printed log
    dicts or progress table. Metadata given as arguments wins over metadata
    found in the source. Raises :class:`LogError` on anything unusable.
    """
    if isinstance(source, pd.DataFrame):
        name = "DataFrame"
        frame, found = source.copy(), {}
        default_id = "run"
    else:
        path = Path(source)
        name = str(path)
        frame, found = _read_path(path)
        default_id = _default_run_id(path)
    given = {"family": family, "params_b": params_b, "total_steps": total_steps, "reward_range": reward_range}
    return _build(frame, found, {k: v for k, v in given.items() if v is not None}, run_id, default_id, name)


def load_runs(path: str | os.PathLike | Iterable[str | os.PathLike] | None = None) -> RunSet:
    """Read every log in a folder (or a list of paths) into a :class:`RunSet`.

    With no argument, reads the runs bundled with the repository in
    ``data/runs/`` (override the folder with the ``BAYES_GRPO_DATA`` env var).
    Sidecar ``*.meta.json`` files are metadata, not runs.
    """
    if path is None:
        folder = Path(os.environ.get("BAYES_GRPO_DATA") or _bundled_runs_dir())
        if not folder.is_dir():
            raise LogError(
                f"bundled runs folder {folder} does not exist; generate the runs (see README) "
                "or point BAYES_GRPO_DATA at a folder of logs"
            )
        paths = _log_files(folder)
    elif isinstance(path, (str, os.PathLike)):
        p = Path(path)
        if not p.exists():
            raise LogError(f"{p}: no such file or folder; check the path")
        paths = _log_files(p) if p.is_dir() and not _is_trl_output_dir(p) else [p]
    else:
        paths = [Path(p) for p in path]
    if not paths:
        raise LogError(f"{path}: no logs found (looked for {', '.join(LOG_SUFFIXES)} files and TRL output folders)")
    return RunSet(read_log(p) for p in paths)


# ------------------------------------------------------------------ locating


def _bundled_runs_dir() -> Path:
    import bayes_grpo

    return Path(bayes_grpo.__file__).resolve().parents[1] / "data" / "runs"


def _is_trl_output_dir(path: Path) -> bool:
    return (path / "trainer_state.json").is_file() or any(path.glob("checkpoint-*/trainer_state.json"))


def _log_files(folder: Path) -> list[Path]:
    """Logs directly inside ``folder``: files with a known suffix and TRL output dirs."""
    found = []
    for p in sorted(folder.iterdir()):
        if p.name.startswith(".") or p.name.endswith(".meta.json"):
            continue
        if (p.is_file() and p.suffix.lower() in LOG_SUFFIXES) or (p.is_dir() and _is_trl_output_dir(p)):
            found.append(p)
    return found


def _default_run_id(path: Path) -> str:
    """File stem; for ``trainer_state.json`` the enclosing run folder's name."""
    if path.is_dir():
        return path.resolve().name
    if path.name == "trainer_state.json":
        parent = path.resolve().parent
        if re.fullmatch(r"checkpoint-\d+", parent.name):
            parent = parent.parent
        return parent.name
    return path.stem


# ------------------------------------------------------------------- readers


def _read_path(path: Path) -> tuple[pd.DataFrame, dict]:
    """Raw table and the metadata found in the file(s); errors become LogError."""
    if not path.exists():
        raise LogError(f"{path}: no such file or folder; check the path")
    if path.is_dir():
        return _read_output_dir(path)
    suffix = path.suffix.lower()
    readers = {
        ".json": _read_json, ".jsonl": _read_jsonl, ".ndjson": _read_jsonl, ".csv": _read_csv,
        ".tsv": _read_csv, ".txt": _read_console, ".log": _read_console, ".ipynb": _read_notebook,
    }  # fmt: skip
    if suffix not in readers:
        raise LogError(
            f"{path}: unsupported file type {suffix or '(none)'!r}; give a TRL trainer_state.json or output folder, "
            f"or a {', '.join(LOG_SUFFIXES[1:])} file"
        )
    try:
        frame, found = readers[suffix](path)
    except LogError:
        raise
    except UnicodeDecodeError as exc:
        raise LogError(f"{path}: not a text file ({exc.reason} at byte {exc.start}); give a text log") from exc
    except (ValueError, TypeError, KeyError, IndexError, RecursionError, csv.Error, pd.errors.ParserError) as exc:
        raise LogError(f"{path}: could not parse as a {suffix} log ({type(exc).__name__}: {exc})") from exc
    sidecar = path.with_name(path.name[: -len(path.suffix)] + ".meta.json")
    if sidecar.is_file():
        found = {**found, **_read_sidecar(sidecar)}
    return frame, found


def _read_text(path: Path) -> str:
    return path.read_bytes().decode("utf-8")


def _read_output_dir(path: Path) -> tuple[pd.DataFrame, dict]:
    """Newest ``checkpoint-N/trainer_state.json``, else the top-level one."""
    checkpoints = [
        (int(m.group(1)), p)
        for p in path.glob("checkpoint-*/trainer_state.json")
        if (m := re.fullmatch(r"checkpoint-(\d+)", p.parent.name))
    ]
    if checkpoints:
        state = max(checkpoints)[1]
    elif (path / "trainer_state.json").is_file():
        state = path / "trainer_state.json"
    else:
        raise LogError(
            f"{path}: folder has no trainer_state.json nor checkpoint-N/trainer_state.json; "
            "pass the log file itself or a TRL output folder"
        )
    return _read_path(state)


def _read_json(path: Path) -> tuple[pd.DataFrame, dict]:
    """A TRL ``trainer_state.json`` or a JSON list of per-step records."""
    data = json.loads(_read_text(path))
    if isinstance(data, dict) and isinstance(data.get("log_history"), list):
        return _from_trainer_state(data, path)
    if isinstance(data, list) and data and all(isinstance(r, dict) for r in data):
        return pd.DataFrame.from_records(data), {}
    raise LogError(
        f"{path}: JSON is neither a TRL trainer_state.json (no 'log_history' list) nor a list of per-step "
        "records; give the trainer_state.json from the output folder"
    )


def _from_trainer_state(state: dict, path: Path) -> tuple[pd.DataFrame, dict]:
    """Training entries of ``log_history`` (those with a reward); max_steps -> total_steps."""
    records = [e for e in state["log_history"] if isinstance(e, dict)]
    training = [e for e in records if any(k in e for k in _REWARD_NAMES)]
    if records and not training:
        raise LogError(
            f"{path}: log_history has {len(records)} entries but none with a 'reward' field; "
            "is this a GRPO run? (TRL's GRPOTrainer logs 'reward' every logging step)"
        )
    found: dict[str, Any] = {}
    if isinstance(state.get("max_steps"), int) and state["max_steps"] > 0:
        found["total_steps"] = state["max_steps"]
    last = training[-1] if training else {}
    if isinstance(last.get("epoch"), (int, float)) and last["epoch"] > 0 and isinstance(last.get("step"), int):
        found["steps_per_epoch"] = max(1, round(last["step"] / last["epoch"]))
    return pd.DataFrame.from_records(training), found


def _read_jsonl(path: Path) -> tuple[pd.DataFrame, dict]:
    records = []
    for number, line in enumerate(_read_text(path).splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise LogError(f"{path}: line {number} is not JSON ({exc.msg}); fix or delete that line") from exc
        if not isinstance(record, dict):
            raise LogError(f"{path}: line {number} is not a JSON object of metrics; each line must be {{...}}")
        records.append(record)
    return pd.DataFrame.from_records(records), {}


def _read_csv(path: Path) -> tuple[pd.DataFrame, dict]:
    text = _read_text(path)
    if not text.strip():
        raise LogError(f"{path}: the file is empty; nothing to read")
    sep = "\t" if path.suffix.lower() == ".tsv" else ","
    return pd.read_csv(path, sep=sep, encoding="utf-8"), {}


def _read_sidecar(path: Path) -> dict:
    try:
        data = json.loads(_read_text(path))
    except (ValueError, UnicodeDecodeError) as exc:
        raise LogError(f"{path}: metadata sidecar is not valid JSON ({exc}); fix or delete it") from exc
    if not isinstance(data, dict):
        raise LogError(f"{path}: metadata sidecar must be a JSON object of RunMetadata fields")
    return data


def _read_console(path: Path) -> tuple[pd.DataFrame, dict]:
    return _parse_console(_read_text(path), path)


def _read_notebook(path: Path) -> tuple[pd.DataFrame, dict]:
    """HTML progress tables in cell outputs, else printed dicts / text tables."""
    notebook = json.loads(_read_text(path))
    cells = notebook.get("cells") if isinstance(notebook, dict) else None
    if not isinstance(cells, list):
        raise LogError(f"{path}: not a Jupyter notebook (no 'cells' list)")
    html_parts, text_parts = [], []
    for cell in cells:
        for output in (cell.get("outputs") or []) if isinstance(cell, dict) else []:
            if not isinstance(output, dict):
                continue
            data = output.get("data") or {}
            html = data.get("text/html") if isinstance(data, dict) else None
            if html:
                html_parts.append(_joined(html))
            for text in (output.get("text"), data.get("text/plain") if isinstance(data, dict) and not html else None):
                if text:
                    text_parts.append(_joined(text))
    tables = [t for part in html_parts for t in _html_tables(part)]
    frames = [f for f in (_table_frame(t) for t in tables) if f is not None]
    text = "\n".join(text_parts)
    if frames:
        return max(frames, key=len), _banner_meta(text)
    return _parse_console(text, path)


def _joined(value: str | list) -> str:
    return "".join(value) if isinstance(value, list) else str(value)


# ----------------------------------------------------- console / table parsing

_DICT_RE = re.compile(r"\{[^{}]*\}")
_TOTAL_STEPS_RE = re.compile(r"Total steps = ([\d,]+)")


def _banner_meta(text: str) -> dict:
    """Planned steps from Unsloth's start-up banner ('Total steps = 250'), if printed."""
    match = _TOTAL_STEPS_RE.search(text)
    return {"total_steps": int(match.group(1).replace(",", ""))} if match else {}


def _parse_console(text: str, path: Path) -> tuple[pd.DataFrame, dict]:
    """TRL's printed log dicts (one per logging step, step = order) or a text progress table."""
    dicts = []
    for match in _DICT_RE.finditer(text):
        if "reward" not in match.group(0):
            continue
        try:
            value = ast.literal_eval(match.group(0))
        except (ValueError, SyntaxError, MemoryError, RecursionError):
            continue
        if isinstance(value, dict) and any(k in value for k in _REWARD_NAMES):
            dicts.append(value)
    table = _text_table(text)
    if table is not None and len(table) >= len(dicts):
        return table, _banner_meta(text)
    if dicts:
        return pd.DataFrame.from_records(dicts), _banner_meta(text)
    raise LogError(
        f"{path}: found no TRL log dicts ({{'loss': ..., 'reward': ...}}) and no progress table with "
        "'Step' and 'reward' columns; is this the training output?"
    )


def _split_row(line: str) -> list[str]:
    line = line.strip()
    if "|" in line:
        return [c.strip() for c in line.strip("|").split("|")]
    if "\t" in line:
        return [c.strip() for c in line.split("\t")]
    return re.split(r"\s{2,}", line)


def _text_table(text: str) -> pd.DataFrame | None:
    """The longest text table whose header starts with 'Step' and has a reward column."""
    lines = text.splitlines()
    best: pd.DataFrame | None = None
    for i, line in enumerate(lines):
        header = _split_row(line)
        if not header or header[0].lower() != "step" or not any(h.strip().lower() == "reward" for h in header):
            continue
        if len(header) == 1 or (len(header) > 1 and "|" not in line and "\t" not in line):
            header = _merge_header_words(line.split())
        rows = []
        for row_line in lines[i + 1 :]:
            if re.fullmatch(r"[\s|:+=-]*", row_line):
                if rows:
                    break
                continue  # separator line under the header
            cells = _split_row(row_line) if ("|" in row_line or "\t" in row_line) else row_line.split()
            if len(cells) != len(header) or not re.fullmatch(r"\d+", cells[0]):
                break
            rows.append(cells)
        frame = _table_frame([header, *rows])
        if frame is not None and (best is None or len(frame) > len(best)):
            best = frame
    return best


def _merge_header_words(words: list[str]) -> list[str]:
    """Rebuild multi-word headers of a space-separated table ('Training Loss', 'rewards / f')."""
    merged: list[str] = []
    i = 0
    while i < len(words):
        word = words[i]
        if word.lower() in ("training", "validation") and i + 1 < len(words) and words[i + 1].lower() == "loss":
            merged.append(f"{word} {words[i + 1]}")
            i += 2
        elif merged and (word == "/" or merged[-1].endswith("/")):
            merged[-1] = f"{merged[-1]} {word}"
            i += 1
        elif word.startswith("/") and merged:
            merged[-1] += f" {word}"
            i += 1
        else:
            merged.append(word)
            i += 1
    return [re.sub(r"\s*/\s*", " / ", m) for m in merged]


def _table_frame(rows: list[list[str]]) -> pd.DataFrame | None:
    """A header + rows table as a DataFrame, if it is a progress table with data."""
    if len(rows) < 2:
        return None
    header, body = rows[0], [r for r in rows[1:] if len(r) == len(rows[0])]
    names = [h.strip().lower() for h in header]
    if not names or names[0] != "step" or "reward" not in names or not body:
        return None
    return pd.DataFrame(body, columns=[h.strip() for h in header])


class _TableParser(HTMLParser):
    """Collect the cells of every <table> in an HTML fragment."""

    def __init__(self) -> None:
        super().__init__()
        self.tables: list[list[list[str]]] = []
        self._row: list[str] | None = None
        self._cell: list[str] | None = None

    def handle_starttag(self, tag: str, attrs: list) -> None:
        if tag == "table":
            self.tables.append([])
        elif tag == "tr" and self.tables:
            self._row = []
        elif tag in ("td", "th") and self._row is not None:
            self._cell = []

    def handle_endtag(self, tag: str) -> None:
        if tag in ("td", "th") and self._cell is not None and self._row is not None:
            self._row.append(" ".join("".join(self._cell).split()))
            self._cell = None
        elif tag == "tr" and self._row is not None:
            if self._row:
                self.tables[-1].append(self._row)
            self._row = None

    def handle_data(self, data: str) -> None:
        if self._cell is not None:
            self._cell.append(data)


def _html_tables(html: str) -> list[list[list[str]]]:
    parser = _TableParser()
    parser.feed(html)
    parser.close()
    return parser.tables


# ------------------------------------------------------ normalise + validate


def _normalise_name(name: object) -> str:
    """Canonical column name: 'rewards / f / mean', 'reward/f/mean', 'reward__f' -> 'rewards/f'."""
    text = re.sub(r"\s*/\s*", "/", str(name).strip())
    text = _COLUMN_ALIASES.get(text.lower(), text)
    if text.lower() == "step":
        return "step"
    if text.startswith("train/") and text != "train/global_step":
        text = text[len("train/") :]
    elif text == "train/global_step":
        text = "global_step"
    if m := re.fullmatch(r"rewards?/(.+?)(/mean)?", text):
        if m.group(1) not in ("mean", "std"):
            return f"rewards/{m.group(1)}"
    if m := re.fullmatch(r"reward__(.+)", text):
        return f"rewards/{m.group(1)}"
    return text


def _rename_columns(frame: pd.DataFrame, name: str) -> pd.DataFrame:
    """Normalise names; on a clash keep the first column and leave the other as it was."""
    if frame.columns.duplicated().any():
        dupes = sorted({str(c) for c in frame.columns[frame.columns.duplicated()]})
        raise LogError(f"{name}: duplicate column name(s) {dupes}; give every column its own name")
    mapping, taken = {}, set()
    for col in frame.columns:
        new = _normalise_name(col)
        if new in taken:
            new = str(col)
        mapping[col] = new
        taken.add(new)
    if len(set(mapping.values())) != len(mapping):
        dupes = sorted({v for v in mapping.values() if list(mapping.values()).count(v) > 1})
        raise LogError(f"{name}: columns {dupes} mean the same field; keep only one of them")
    return frame.rename(columns=mapping)


def _build(
    raw: pd.DataFrame, found: dict, given: dict, run_id: str | None, default_id: str, name: str
) -> RunLog:
    """Validate and repair a raw table, merge metadata (given > found), make a RunLog."""
    if raw.shape[0] == 0 or raw.shape[1] == 0:
        raise LogError(f"{name}: the log is empty (no rows); nothing to forecast from")
    frame = _rename_columns(raw.reset_index(drop=True), name)
    meta_values = dict(found)
    for col in [c for c in frame.columns if c in _META_COLUMNS]:
        values = frame[col].dropna().unique()
        if len(values) <= 1:
            if len(values) == 1:
                meta_values.setdefault(col, values[0].item() if hasattr(values[0], "item") else values[0])
            frame = frame.drop(columns=col)
        elif col == "run_id":
            raise LogError(
                f"{name}: column 'run_id' holds {len(values)} runs; split the file into one log per run"
            )
    reward_col = next((c for c in _REWARD_NAMES if c in frame.columns), None)
    if reward_col is None:
        raise LogError(
            f"{name}: no reward column; looked for {list(_REWARD_NAMES)} (also 'train/reward'), found "
            f"{[str(c) for c in frame.columns][:20]}; rename the mean-reward column to 'reward'"
        )
    frame = frame.rename(columns={reward_col: "reward"})
    if (std_col := next((c for c in _STD_NAMES if c in frame.columns), None)) and "reward_std" not in frame:
        frame = frame.rename(columns={std_col: "reward_std"})
    frame["reward"] = _numeric(frame["reward"], "reward", name)

    step_col = next((c for c in _STEP_NAMES if c in frame.columns), None)
    if step_col is None:
        frame.insert(0, "step", np.arange(1, len(frame) + 1, dtype=np.int64))
        meta_values.setdefault("step_source", "row order (the log has no step column)")
    else:
        steps = _numeric(frame[step_col], step_col, name)
        if steps.isna().any():
            raise LogError(f"{name}: field {step_col!r} is missing in {int(steps.isna().sum())} row(s); fill in the steps")
        if not np.all(np.isfinite(steps)) or not np.all(steps == np.round(steps)):
            raise LogError(f"{name}: field {step_col!r} has non-integer values; steps must be whole numbers")
        if (steps < 0).any():
            raise LogError(
                f"{name}: field {step_col!r} has {int((steps < 0).sum())} negative value(s) "
                f"(min {int(steps.min())}); steps must be >= 0"
            )
        frame = frame.drop(columns=[c for c in _STEP_NAMES if c in frame.columns])
        frame.insert(0, "step", steps.astype(np.int64))

    bad = ~np.isfinite(frame["reward"].to_numpy(dtype=float))
    if bad.all():
        raise LogError(f"{name}: field 'reward' has no finite values ({int(bad.sum())} NaN/inf); nothing to forecast from")
    if bad.any():
        warnings.warn(
            f"{name}: dropped {int(bad.sum())} row(s) whose 'reward' is NaN or inf (steps "
            f"{_preview(frame.loc[bad, 'step'])}); check the log if that is unexpected",
            LogWarning,
            stacklevel=3,
        )
        frame = frame.loc[~bad]
    steps = frame["step"].to_numpy()
    if np.any(np.diff(steps) < 0):
        warnings.warn(f"{name}: field 'step' was not in order; sorted the rows by step", LogWarning, stacklevel=3)
        frame = frame.sort_values("step", kind="stable")
    duplicated = frame["step"].duplicated(keep="last")
    if duplicated.any():
        warnings.warn(
            f"{name}: field 'step' repeats {int(duplicated.sum())} time(s) (steps "
            f"{_preview(frame.loc[duplicated, 'step'])}); kept the last row of each step (e.g. a resumed run)",
            LogWarning,
            stacklevel=3,
        )
        frame = frame.loc[~duplicated]
    frame = frame.reset_index(drop=True)
    for col in frame.columns.drop(["step", "reward"]):
        frame[col] = _maybe_numeric(frame[col])
    frame = frame[["step", "reward", *[c for c in frame.columns if c not in ("step", "reward")]]]

    meta_values.update(given)
    meta_values["source"] = meta_values.get("source") or (name if name != "DataFrame" else None)
    meta = _clean_meta(meta_values, name)
    _check_meta(meta, int(frame["step"].iloc[-1]), name)
    final_id = run_id or meta.extra.get("run_id") or default_id
    return RunLog(str(final_id), frame, meta)


def _numeric(column: pd.Series, field_name: str, name: str) -> pd.Series:
    """The column as float64; any value that is present but not a number is an error."""
    if pd.api.types.is_bool_dtype(column):
        raise LogError(f"{name}: field {field_name!r} is boolean, not numeric; log the numeric value")
    values = pd.to_numeric(column.map(_to_number), errors="coerce").astype("float64")
    wrong = values.isna() & column.notna() & ~column.map(_is_nan_text)
    if wrong.any():
        first = column[wrong].iloc[0]
        raise LogError(
            f"{name}: field {field_name!r} is not numeric ({int(wrong.sum())} value(s) like {str(first)[:40]!r}); "
            f"give numbers in the {field_name!r} column"
        )
    return values


def _to_number(value: object) -> object:
    """Value ready for ``pd.to_numeric``: booleans become non-numbers, 'inf' strings floats."""
    if isinstance(value, (bool, np.bool_)):
        return "bool"
    if isinstance(value, str):
        text = value.strip().lower()
        return {"inf": math.inf, "+inf": math.inf, "-inf": -math.inf, "infinity": math.inf}.get(text, value.strip())
    return value


def _is_nan_text(value: object) -> bool:
    return isinstance(value, str) and value.strip().lower() in ("", "nan", "none", "null", "n/a", "na")


def _maybe_numeric(column: pd.Series) -> pd.Series:
    """Convert to numbers when every present value is one; otherwise leave as it is."""
    if pd.api.types.is_numeric_dtype(column) and not pd.api.types.is_bool_dtype(column):
        return column.astype("float64") if not pd.api.types.is_float_dtype(column) else column
    try:
        converted = pd.to_numeric(column, errors="raise")
    except (ValueError, TypeError):
        return column
    return converted.astype("float64") if pd.api.types.is_numeric_dtype(converted) else column


def _preview(values: pd.Series, n: int = 5) -> str:
    items = [str(v) for v in values.iloc[:n]]
    return ", ".join(items) + (", ..." if len(values) > n else "")


def _clean_meta(values: dict, name: str) -> RunMetadata:
    """Typed RunMetadata from loose values (CSV cells, JSON, arguments); unknown keys -> extra."""
    values = dict(values)
    extra = dict(values.pop("extra", None) or {})
    lo, hi = values.pop("reward_min", None), values.pop("reward_max", None)
    if values.get("reward_range") is None and lo is not None and hi is not None:
        values["reward_range"] = (lo, hi)
    kwargs: dict[str, Any] = {}
    for key, value in values.items():
        if key not in _META_FIELDS:
            extra[key] = value
        elif value is not None and not (isinstance(value, float) and math.isnan(value)):
            kwargs[key] = _convert_meta(key, value, name)
    if "family" not in kwargs and isinstance(extra.get("model"), str):
        guess = next((f for f in _FAMILIES if f in extra["model"].lower()), None)
        if guess:
            kwargs["family"] = guess
    return RunMetadata(**kwargs, extra=extra)


def _convert_meta(key: str, value: Any, name: str) -> Any:
    try:
        if key == "family":
            return normalise_family(value)
        if key in ("params_b", "initial_reward"):
            number = float(value)
            if not math.isfinite(number):
                raise ValueError("not finite")
            return number
        if key in ("total_steps", "steps_per_epoch"):
            number = float(value)
            if not number.is_integer():
                raise ValueError("not a whole number")
            return int(number)
        if key == "reward_range":
            if isinstance(value, str):
                value = json.loads(value)
            lo, hi = (float(v) for v in value)
            return (lo, hi)
        return str(value)
    except (ValueError, TypeError) as exc:
        raise LogError(f"{name}: metadata field {key!r} has an invalid value {value!r} ({exc}); fix or omit it") from exc


def _check_meta(meta: RunMetadata, last_step: int, name: str) -> None:
    """Metadata consistent with itself and with the logged steps."""
    if meta.total_steps is not None:
        if meta.total_steps <= 0:
            raise LogError(f"{name}: total_steps={meta.total_steps} must be positive")
        if meta.total_steps < last_step:
            raise LogError(
                f"{name}: total_steps={meta.total_steps} is smaller than the last logged step {last_step}; "
                "pass the planned number of steps (max_steps) or leave total_steps unset"
            )
    if meta.params_b is not None and meta.params_b <= 0:
        raise LogError(f"{name}: params_b={meta.params_b} must be positive (model size in billions)")
    if meta.steps_per_epoch is not None and meta.steps_per_epoch <= 0:
        raise LogError(f"{name}: steps_per_epoch={meta.steps_per_epoch} must be positive")
    if meta.reward_range is not None:
        lo, hi = meta.reward_range
        if not (math.isfinite(lo) and math.isfinite(hi) and lo < hi):
            raise LogError(f"{name}: reward_range={meta.reward_range} must be two finite numbers (min, max) with min < max")


def _meta_columns(meta: RunMetadata) -> dict[str, Any]:
    """Metadata as flat columns for :meth:`RunLog.to_frame`."""
    lo, hi = meta.reward_range if meta.reward_range else (None, None)
    return {
        "family": meta.family,
        "params_b": meta.params_b,
        "total_steps": meta.total_steps,
        "steps_per_epoch": meta.steps_per_epoch,
        "reward_min": lo,
        "reward_max": hi,
        "initial_reward": meta.initial_reward,
        "hardware": meta.hardware,
        "source": meta.source,
    }
