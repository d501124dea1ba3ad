"""Validation and repair: one raw table plus the metadata found beside it becomes a :class:`RunLog`.

Column names are normalised to one naming (:func:`normalise_column`: ``train/reward``
-> ``reward``, ``rewards / f``, ``reward__f`` -> ``rewards/f/mean``, ``completion_length``
-> ``completions/mean_length``, ``eval/accuracy`` -> ``eval_accuracy``), pieces of one
step logged as separate rows (a training entry and an evaluation entry) are joined,
steps and rewards are checked, and every repair (NaN rewards dropped, steps sorted,
repeated steps replaced by the later entry) is announced with a :class:`LogWarning`. Metadata is merged in a fixed order, later winning:
what the reader found, then constant columns (only where the reader found
nothing), then the caller's arguments; ``meta.provenance`` records the winner.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pandas as pd

from bayes_grpo.errors import LogError
from bayes_grpo.logs.names import REWARD_NAMES, STEP_NAMES, normalise_column
from bayes_grpo.logs.types import LogWarning, RunLog, check_meta, clean_meta

__all__ = ["DIRECTIONS", "build_run", "keep_later", "normalise_column"]

#: ``direction=`` values: the model forecasts a rising curve, so a minimised metric is negated.
DIRECTIONS = ("maximize", "minimize")
# Columns that describe the run rather than the step; constant ones become metadata.
META_COLUMNS = {
    "run_id", "family", "params_b", "total_steps", "steps_per_epoch", "reward_min",
    "reward_max", "reward_range", "initial_reward", "hardware", "model", "model_name",
    "dataset", "task", "method", "lora", "seed", "source_repo", "source_path", "source_commit",
}  # fmt: skip


def _rename_columns(frame: pd.DataFrame, name: str) -> pd.DataFrame:
    """Normalise names; on a clash keep the first column and leave the other as it was."""
    if frame.columns.duplicated().any():
        dupes = sorted({str(c) for c in frame.columns[frame.columns.duplicated()]})
        raise LogError(f"{name}: duplicate column name(s) {dupes}; give every column its own name")
    mapping, taken = {}, set()
    for col in frame.columns:
        new = normalise_column(col)
        if new in taken:
            new = str(col)
        mapping[col] = new
        taken.add(new)
    if len(set(mapping.values())) != len(mapping):
        dupes = sorted({v for v in mapping.values() if list(mapping.values()).count(v) > 1})
        raise LogError(f"{name}: columns {dupes} mean the same field; keep only one of them")
    return frame.rename(columns=mapping)


def keep_later(frame: pd.DataFrame, name: str, reason: str, column: str = "step") -> pd.DataFrame:
    """Rows with a repeated ``step`` replaced by the later entry, announced with a :class:`LogWarning`.

    Parameters
    ----------
    frame : pandas.DataFrame
        A table with a step column (numbers or numeric text), in logging order.
    name : str
        The log's name, for the warning.
    reason : str
        Why steps repeat, e.g. ``"the run was resumed from a checkpoint"``.
    column : str
        The step column's name.

    Returns
    -------
    pandas.DataFrame
        The frame sorted by step with each step once (the last entry kept).

    Example
    -------
    >>> keep_later(pd.DataFrame({"step": [1, 2, 2], "reward": [0, 1, 2]}), "log", "resumed")["reward"].tolist()  # doctest: +SKIP
    [0, 2]
    """
    steps = pd.to_numeric(frame[column], errors="coerce")
    replaced = steps.duplicated(keep="last") & steps.notna()
    if not replaced.any():
        return frame
    warnings.warn(
        f"{name}: {reason}; {int(replaced.sum())} logged step(s) were logged again (steps "
        f"{_preview(pd.Series(steps[replaced].astype('int64').unique()))}); the later entries replaced them",
        LogWarning,
        stacklevel=4,
    )
    kept = frame.loc[~replaced].assign(_order=steps[~replaced])
    return kept.sort_values("_order", kind="stable").drop(columns="_order").reset_index(drop=True)


def build_run(
    raw: pd.DataFrame, found: dict, given: dict, run_id: str | None, default_id: str, name: str,
    metric: str = "reward", direction: str = "maximize",
) -> RunLog:
    """Validate and repair a raw table, merge metadata (arguments > found > constant columns), make a RunLog.

    The ``reward`` column of the result is the forecast target: the summed reward, or
    the ``metric`` asked for (its own column stays beside it, in its own units), negated
    when ``direction="minimize"`` so that better is always up.

    Parameters
    ----------
    raw : pandas.DataFrame
        The table as read: one row per logged step, column names as logged.
    found : dict
        Metadata the reader found; ``found["provenance"]`` maps each key to its source.
    given : dict
        Metadata passed by the caller (provenance ``"argument"``); None values are left out.
    run_id : str or None
        The caller's run id, else ``run_id`` found in the metadata, else ``default_id``.
    default_id : str
        Run id to fall back on (the file stem).
    name : str
        The log's name in messages.
    metric : str
        The per-step metric to forecast, under any of its logged names (default the summed ``reward``).
        Steps where it was not logged are left out; a ``reward_range`` or ``initial_reward``
        found in the log describes the summed reward and is dropped for another metric.
    direction : str
        ``"maximize"`` or ``"minimize"`` (a loss): then the target and ``reward_range`` are negated.

    Returns
    -------
    RunLog
        The validated run.

    Raises
    ------
    LogError
        On anything unusable: no reward column (or no ``metric`` column, naming the
        metrics the log has), non-numeric rewards or steps, negative steps, invalid metadata.
    """
    if raw.shape[0] == 0 or raw.shape[1] == 0:
        raise LogError(f"{name}: the log is empty (no rows); nothing to forecast from")
    if direction not in DIRECTIONS:
        raise LogError(f"direction={direction!r}: give one of {', '.join(map(repr, DIRECTIONS))}")
    frame = _rename_columns(raw.reset_index(drop=True), name)
    meta_values = {k: v for k, v in found.items() if k != "provenance"}
    origin = {k: "log file" for k in meta_values} | dict(found.get("provenance") or {})
    for col in [c for c in frame.columns if c in META_COLUMNS]:
        values = frame[col].dropna().unique()
        if len(values) <= 1:
            if len(values) == 1 and col not in meta_values:
                meta_values[col] = values[0].item() if hasattr(values[0], "item") else values[0]
                origin[col] = "column"
            frame = frame.drop(columns=col)
        elif col == "run_id":
            raise LogError(
                f"{name}: column 'run_id' holds {len(values)} runs; read it with load_runs() or "
                "bayes_grpo.logs.read_runs() (one RunLog per run), or split the file into one log per run"
            )
    reward_col = next((c for c in REWARD_NAMES if c in frame.columns), None)
    target = "reward" if normalise_column(metric) in REWARD_NAMES else normalise_column(metric)
    if reward_col is None and target == "reward":
        raise LogError(
            f"{name}: no reward column; looked for {list(REWARD_NAMES)} (also 'train/reward'), found "
            f"{[str(c) for c in frame.columns][:20]}; rename the mean-reward column to 'reward'"
        )
    if target == "reward":
        frame = frame.rename(columns={reward_col: "reward"})
    else:
        if target not in frame.columns:
            numeric = [c for c in frame.columns if pd.api.types.is_numeric_dtype(_maybe_numeric(frame[c]))]
            logged = sorted({"reward" if c == reward_col else str(c) for c in numeric} - set(STEP_NAMES) - {"epoch"})
            raise LogError(f"{name}: no metric {metric!r} in the log; it has: {', '.join(logged)}")
        frame[target] = _numeric(frame[target], target, name)
        frame = frame.drop(columns=[reward_col] if reward_col else []).assign(reward=frame[target])
        for key in ("reward_range", "reward_min", "reward_max", "initial_reward"):
            meta_values.pop(key, None)
        meta_values["metric"] = target
    frame["reward"] = _numeric(frame["reward"], "reward", name)

    step_col = next((c for c in STEP_NAMES if c in frame.columns), None)
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
        frame = frame.drop(columns=[c for c in STEP_NAMES if c in frame.columns])
        frame.insert(0, "step", steps.astype(np.int64))

    frame = _join_pieces(frame)
    unlogged = frame["reward"].isna().to_numpy() & (_only_eval(frame) | (target != "reward"))
    frame = frame.loc[~unlogged]
    bad = ~np.isfinite(frame["reward"].to_numpy(dtype=float))
    if bad.all():
        what = "field 'reward'" if target == "reward" else f"metric {target!r}"
        raise LogError(f"{name}: {what} has no finite values ({int(bad.sum())} NaN/inf); nothing to forecast from")
    frame = _drop_rows(frame, bad, name, "dropped {n} row(s) whose 'reward' is NaN or inf", "check the log if that is unexpected")
    steps = frame["step"].to_numpy()
    if np.any(np.diff(steps) < 0):
        warnings.warn(f"{name}: field 'step' was not in order; sorted the rows by step", LogWarning, stacklevel=3)
        frame = frame.sort_values("step", kind="stable")
    frame = _drop_rows(
        frame, frame["step"].duplicated(keep="last").to_numpy(), name, "field 'step' repeats {n} time(s)",
        "kept the last row of each step (e.g. a resumed run)",
    )  # fmt: skip
    frame = frame.reset_index(drop=True)
    for col in frame.columns.drop(["step", "reward"]):
        frame[col] = _maybe_numeric(frame[col])
    frame = frame[["step", "reward", *[c for c in frame.columns if c not in ("step", "reward")]]]

    meta_values.update(given)
    origin.update({k: "argument" for k in given})
    if direction == "minimize":
        frame["reward"] = -frame["reward"]
        meta_values["direction"] = direction
        if meta_values.get("reward_range") is not None:
            lo, hi = (float(v) for v in meta_values["reward_range"])
            meta_values["reward_range"] = (-hi, -lo)
    meta_values["source"] = meta_values.get("source") or (name if name != "DataFrame" else None)
    meta = clean_meta({**meta_values, "provenance": origin}, name)
    check_meta(meta, int(frame["step"].iloc[-1]), name)
    final_id = run_id or meta.extra.get("run_id") or default_id
    return RunLog(str(final_id), frame, meta)


def _join_pieces(frame: pd.DataFrame) -> pd.DataFrame:
    """Rows of one step that complement each other (a training entry and an evaluation entry) joined into one.

    Rows of a step that give two different values for any column are left alone: they are
    a step logged twice (a resumed run), which the later repair settles with a warning.
    """
    frame = frame.reset_index(drop=True)
    repeated = frame["step"].duplicated(keep=False)
    if not repeated.any():
        return frame
    try:
        distinct = frame.loc[repeated].groupby("step", sort=False).nunique(dropna=True)
    except TypeError:  # unhashable cells (lists, dicts): not pieces of one entry
        return frame
    pieces = distinct.index[(distinct <= 1).all(axis=1)]
    if pieces.empty:
        return frame
    in_pieces = frame["step"].isin(pieces).to_numpy()
    firsts = in_pieces & ~frame["step"].duplicated(keep="first").to_numpy()
    joined = frame.loc[in_pieces].groupby("step", sort=False).first()
    out = frame.loc[~in_pieces | firsts].copy()
    at = frame.index[firsts]
    for col in joined.columns:
        out.loc[at, col] = joined[col].reindex(frame.loc[at, "step"]).to_numpy()
    return out


def _only_eval(frame: pd.DataFrame) -> np.ndarray:
    """Rows whose values (besides step and epoch) are all evaluation metrics (``eval_*``): not training steps."""
    training = [c for c in frame.columns if c not in ("step", "epoch") and not str(c).startswith("eval_")]
    has_eval = frame[[c for c in frame.columns if str(c).startswith("eval_")]].notna().any(axis=1).to_numpy()
    return has_eval & ~frame[training].notna().any(axis=1).to_numpy()


def _drop_rows(frame: pd.DataFrame, rows: np.ndarray, name: str, what: str, then: str) -> pd.DataFrame:
    """``frame`` without ``rows`` (a boolean mask), announced as "name: what (steps ...); then" ({n}: how many)."""
    if not rows.any():
        return frame
    warnings.warn(
        f"{name}: {what.format(n=int(rows.sum()))} (steps {_preview(frame.loc[rows, 'step'])}); {then}",
        LogWarning,
        stacklevel=4,  # one frame deeper than build_run: the same caller its stacklevel=3 warnings name
    )
    return frame.loc[~rows]


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
