"""Console output: TRL's printed log dicts and the progress table Unsloth / TRL notebooks print.

Printed dicts carry no step, so the step is their order. When a run was
resumed from a checkpoint, the console holds the steps after the checkpoint
twice; the dicts' ``epoch`` goes back at the resume, which puts each later
dict back on its step, and the later entries replace the earlier ones (with a
:class:`LogWarning` saying how many). Progress tables that continue an
earlier one with the same header (a resumed ``trainer.train()``) are joined
the same way. Model names and Unsloth's banner give family, size and
planned steps.
"""

from __future__ import annotations

import ast
import math
import re
from pathlib import Path
from typing import Any

import pandas as pd

from bayes_grpo.errors import LogError
from bayes_grpo.logs.families import infer_model, model_names_in_text
from bayes_grpo.logs.validate import REWARD_NAMES, keep_later

__all__ = ["banner_meta", "join_tables", "model_meta", "parse_console", "table_frame"]

_DICT_RE = re.compile(r"\{[^{}]*\}")
_TOTAL_STEPS_RE = re.compile(r"Total steps = ([\d,]+)")
_RESUMED = "the run was resumed from a checkpoint"


def banner_meta(text: str, label: str) -> dict:
    """Planned steps from Unsloth's start-up banner (``Total steps = 250``) and the model named in ``text``.

    Parameters
    ----------
    text : str
        Console output or notebook text.
    label : str
        Provenance label for what is found (``"console"``, ``"notebook"``).

    Returns
    -------
    dict
        ``total_steps``, ``model``, ``family``, ``params_b`` where found, and ``provenance``.

    Example
    -------
    >>> banner_meta("Num Epochs = 1 | Total steps = 250", "console")
    {'total_steps': 250, 'provenance': {'total_steps': 'console'}}
    """
    found: dict[str, Any] = {}
    if match := _TOTAL_STEPS_RE.search(text):
        found["total_steps"] = int(match.group(1).replace(",", ""))
    # Printed log dicts name metrics, never the model: leave them out of the search (and its cost).
    prose = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("{"))
    found.update(model_meta(model_names_in_text(prose)))
    if found:
        found["provenance"] = {k: label for k in found}
    return found


def model_meta(names: list[str]) -> dict:
    """``model``, ``family`` and ``params_b`` from the first name that gives a family (size from the first that gives one).

    Parameters
    ----------
    names : list of str
        Model names, most explicit first (from :func:`~bayes_grpo.logs.families.model_names_in_text`).

    Returns
    -------
    dict
        The keys that were found.

    Example
    -------
    >>> model_meta(["Qwen2", "unsloth/Qwen2.5-1.5B-Instruct"])
    {'family': 'qwen', 'model': 'unsloth/Qwen2.5-1.5B-Instruct', 'params_b': 1.5}
    """
    found: dict[str, Any] = {}
    for name in names:
        family, size = infer_model(name)
        if family is not None and "family" not in found:
            found["family"] = family
            found["model"] = name
        if size is not None and "params_b" not in found and family == found.get("family"):
            found["params_b"] = size
            found["model"] = name
    return found


def parse_console(text: str, path: Path, label: str = "console") -> tuple[pd.DataFrame, dict]:
    """TRL's printed log dicts (step = order, re-aligned after resumes) or a text progress table.

    Parameters
    ----------
    text : str
        The console output.
    path : pathlib.Path
        Where it came from, for messages.
    label : str
        Provenance label for metadata found in the text.

    Returns
    -------
    tuple of (pandas.DataFrame, dict)
        The raw table and the metadata found.

    Raises
    ------
    LogError
        When the text holds neither log dicts with a reward nor a progress table.
    """
    dicts = []
    for match in _DICT_RE.finditer(text):
        if "reward" not in match.group(0):
            continue
        try:
            value = ast.literal_eval(match.group(0))
        except (ValueError, SyntaxError, MemoryError, RecursionError):
            continue
        if isinstance(value, dict) and any(k in value for k in REWARD_NAMES):
            dicts.append(value)
    table = join_tables(_text_tables(text), str(path))
    found = banner_meta(text, label)
    if table is not None and len(table) >= len(dicts):
        return table, found
    if dicts:
        frame = pd.DataFrame.from_records(dicts)
        steps = _steps_after_resumes(dicts)
        if steps is not None:
            frame = keep_later(frame.assign(step=steps), str(path), _RESUMED)
            found["step_source"] = "order of the printed log dicts, re-aligned by 'epoch' after a resume"
        return frame, found
    raise LogError(
        f"{path}: found no TRL log dicts ({{'loss': ..., 'reward': ...}}) and no progress table with "
        "'Step' and 'reward' columns; is this the training output?"
    )


def _epoch(record: dict) -> float | None:
    try:
        value = float(record.get("epoch"))  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return value if value == value and abs(value) != float("inf") else None


def _steps_after_resumes(dicts: list[dict]) -> list[int] | None:
    """Step of each printed dict when ``epoch`` goes back (a resume), else None (order is the step).

    Before the first resume the step is the dict's position (1, 2, ...). The
    epoch advances by a fixed amount per logged dict, measured on that first
    stretch; a dict whose epoch goes back, or repeats where the printed
    precision (4 significant digits) would show every advance, starts a
    resumed stretch at step ``epoch / amount``. Two equal epochs at the very
    start say nothing (no checkpoint precedes step 1): order stays the step.
    """
    epochs = [_epoch(d) for d in dicts]
    if len(dicts) < 2 or any(e is None for e in epochs):
        return None
    values = [float(e) for e in epochs]  # type: ignore[arg-type]
    first = next((i for i in range(1, len(values)) if values[i] <= values[i - 1]), None)
    if first is None or values[first - 1] <= 0 or (first == 1 and values[1] == values[0]):
        return None
    per_dict = values[first - 1] / first

    def resumed(i: int) -> bool:
        if values[i] < values[i - 1]:
            return True
        resolution = 10 ** (math.floor(math.log10(abs(values[i]))) - 3) if values[i] else 0.0
        return values[i] == values[i - 1] and per_dict > 1.5 * resolution

    resumes = {i for i in range(1, len(values)) if resumed(i)}
    if not resumes or not all(math.isfinite(values[i] / per_dict) for i in resumes):
        return None  # no resume, or one whose step the first stretch's advance cannot place (a tiny advance, a huge epoch)
    steps, current = [], 0
    for i, epoch in enumerate(values):
        current = max(1, round(epoch / per_dict)) if i in resumes else current + 1
        steps.append(current)
    return steps


def join_tables(frames: list[pd.DataFrame], name: str) -> pd.DataFrame | None:
    """Progress tables joined where one continues another (a resumed run), the longest result kept.

    A table continues the one before it when it has the same header and starts
    after that one's first step; repeated steps keep the later row (with a
    :class:`LogWarning`). A table that starts again from the same first step
    is another run: of those, the one with the most steps is returned (the
    first on a tie).

    Parameters
    ----------
    frames : list of pandas.DataFrame
        Progress tables in the order they were printed, step in the first column.
    name : str
        The log's name, for the warning.

    Returns
    -------
    pandas.DataFrame or None
        The table, or None when ``frames`` is empty.
    """
    chains: list[list[pd.DataFrame]] = []
    for frame in frames:
        first = pd.to_numeric(frame.iloc[:, 0], errors="coerce").iloc[0]
        if chains:
            previous = chains[-1]
            start = pd.to_numeric(previous[0].iloc[:, 0], errors="coerce").iloc[0]
            if list(frame.columns) == list(previous[-1].columns) and first > start:
                previous.append(frame)
                continue
        chains.append([frame])
    best: pd.DataFrame | None = None
    for chain in chains:
        joined = pd.concat(chain, ignore_index=True)
        if len(chain) > 1:
            joined = keep_later(joined, name, _RESUMED, column=joined.columns[0])
        if best is None or len(joined) > len(best):
            best = joined
    return best


def _split_row(line: str) -> list[str]:
    line = line.strip()
    if "|" in line:
        return [c.strip() for c in line.strip("|").split("|")]
    if "\t" in line:
        return [c.strip() for c in line.split("\t")]
    return re.split(r"\s{2,}", line)


def _text_tables(text: str) -> list[pd.DataFrame]:
    """Every text table whose header starts with 'Step' and has a reward column, in order."""
    lines = text.splitlines()
    tables = []
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
        frame = table_frame([header, *rows])
        if frame is not None:
            tables.append(frame)
    return tables


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


def table_frame(rows: list[list[str]]) -> pd.DataFrame | None:
    """A header + rows table as a DataFrame, if it is a progress table (``Step`` first, a ``reward`` column) with data."""
    if len(rows) < 2:
        return None
    header, body = rows[0], [r for r in rows[1:] if len(r) == len(rows[0])]
    names = [h.strip().lower() for h in header]
    if not names or names[0] != "step" or "reward" not in names or not body:
        return None
    return pd.DataFrame(body, columns=[h.strip() for h in header])
