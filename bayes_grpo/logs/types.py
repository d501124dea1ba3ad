"""The run types: :class:`RunMetadata`, :class:`RunLog`, :class:`RunSet`, and the metadata checks they share."""

from __future__ import annotations

import dataclasses
import json
import math
import warnings
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import xarray as xr

from bayes_grpo.errors import LogError
from bayes_grpo.logs.families import infer_model, normalise_family
from bayes_grpo.logs.plan import planned_length
from bayes_grpo.logs.names import normalise_column

__all__ = ["GRPO_SIGNALS", "LogWarning", "RunLog", "RunMetadata", "RunSet", "params_in_billions"]

GRPO_SIGNALS = (
    "reward_std", "frac_reward_zero_std", "completions/mean_length", "completions/clipped_ratio", "kl", "entropy",
)  # fmt: skip
"""The per-step signals GRPO trainers log beside the mean reward, by their canonical names.

Besides these, :meth:`RunLog.signal` knows every per-function reward (``rewards/<fn>/mean``,
``rewards/<fn>/std``) and evaluation metric (``eval_<name>``): a log without one gives NaN.
"""

#: The largest model size, in billions of parameters, taken as given (2 trillion parameters).
MAX_PARAMS_B = 2_000.0
#: A size from this value on is read as a raw parameter count (100,000 parameters and up) and converted to billions.
RAW_PARAMS_MIN = 1e5


class LogWarning(UserWarning):
    """A log was repaired while reading (rows dropped, steps re-sorted, a cut last line dropped)."""


def params_in_billions(value: float, subject: str | None = None) -> float:
    """A model size in billions of parameters, from a value given as billions or as a raw parameter count.

    Sizes are billions of parameters (1.5 for a 1.5B model). A value of at most
    :data:`MAX_PARAMS_B` (2,000: 2 trillion parameters) is taken as given. A value of
    :data:`RAW_PARAMS_MIN` (100,000) up to 2e12 cannot be billions, so it is read as a raw
    parameter count (what ``sum(p.numel() for p in model.parameters())`` gives) and divided
    by 1e9, with a warning. Anything else is rejected: zero, negative or non-finite sizes,
    values between the two bounds (2,000 to 100,000) and above 2e12, which are neither a
    plausible size in billions nor a plausible raw count. The result is always in
    (0, :data:`MAX_PARAMS_B`].

    Parameters
    ----------
    value : float
        The size as given.
    subject : str, optional
        How messages name it (default ``"params_b=<value>"``).

    Returns
    -------
    float
        The size in billions of parameters.

    Raises
    ------
    LogError
        A size that is not positive and finite, lies between :data:`MAX_PARAMS_B` and
        :data:`RAW_PARAMS_MIN`, or is above 2e12.

    Warns
    -----
    LogWarning
        When a raw parameter count was converted.

    Example
    -------
    >>> params_in_billions(1.5)
    1.5
    >>> import warnings
    >>> with warnings.catch_warnings():
    ...     warnings.simplefilter("ignore")
    ...     params_in_billions(1.5e9)  # a raw count, converted with a warning
    1.5
    """
    subject = subject or f"params_b={value:g}"
    if not (math.isfinite(value) and value > 0):
        raise LogError(f"{subject} must be positive (model size in billions of parameters, e.g. 1.5 for a 1.5B model)")
    if value <= MAX_PARAMS_B:
        return float(value)
    if RAW_PARAMS_MIN <= value <= MAX_PARAMS_B * 1e9:
        billions = value / 1e9
        warnings.warn(
            f"{subject} is far above any model size in billions ({MAX_PARAMS_B:g}); read it as a raw parameter count: "
            f"{billions:g} billion parameters (give sizes in billions, e.g. 1.5 for a 1.5B model)",
            LogWarning,
            stacklevel=3,
        )
        return billions
    raise LogError(
        f"{subject} is neither a model size in billions of parameters (at most {MAX_PARAMS_B:g}, 2 trillion parameters) "
        f"nor a raw parameter count ({RAW_PARAMS_MIN:g} to {MAX_PARAMS_B * 1e9:g}); give the size in billions, e.g. 1.5 for a 1.5B model"
    )


@dataclass(frozen=True)
class RunMetadata:
    """What is known about a run besides its per-step table.

    ``provenance`` records where each known field came from, as
    ``{field: source}``. The sources are ``"argument"`` (passed to
    :func:`~bayes_grpo.logs.read_log`, :func:`~bayes_grpo.logs.load_runs` or
    :meth:`RunLog.with_meta`), ``"sidecar"`` (the log's ``<name>.meta.json``),
    ``"column"`` (a constant column of the table), ``"model name (column)"`` /
    ``"model name (sidecar)"`` (inferred from a ``model`` value),
    ``"trainer_state.json"``, ``"config.json"`` / ``"adapter_config.json"``
    (the model named beside a ``trainer_state.json``), ``"notebook"`` (a model
    name or banner in a notebook's code or output), ``"console"`` (a console
    log's printouts) and ``"W&B export"``. :meth:`describe` shows values with
    their sources.
    """

    family: str | None = None
    """Lower-case model family, e.g. ``"qwen"``, ``"llama"``, ``"gemma"``, ``"phi"``."""
    params_b: float | None = None
    """Model size in billions of parameters; a raw parameter count is converted (:func:`params_in_billions`)."""
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
    provenance: dict = field(default_factory=dict)
    """Where each known field came from: ``{"family": "notebook", "params_b": "argument", ...}``."""

    def __post_init__(self) -> None:
        if self.params_b is not None:
            where = f"{self.source}: " if self.source else ""
            object.__setattr__(self, "params_b", params_in_billions(self.params_b, f"{where}params_b={self.params_b:g}"))

    def describe(self) -> dict[str, str]:
        """Known fields as text with their source, e.g. ``{"family": "qwen (notebook)"}``.

        Returns
        -------
        dict of str to str
            One entry per field that is set (``source`` and ``extra`` left out).

        Example
        -------
        >>> RunMetadata(family="qwen", provenance={"family": "notebook"}).describe()
        {'family': 'qwen (notebook)'}
        """
        out = {}
        for name in META_FIELDS:
            value = getattr(self, name)
            if value is None or name == "source":
                continue
            origin = self.provenance.get(name)
            out[name] = f"{value} ({origin})" if origin else str(value)
        return out


META_FIELDS = tuple(f.name for f in dataclasses.fields(RunMetadata) if f.name not in ("extra", "provenance"))
"""The typed :class:`RunMetadata` fields (everything but ``extra`` and ``provenance``)."""


@dataclass(frozen=True, eq=False)
class RunLog:
    """One training run: ``table`` has one row per logged step, ``meta`` the rest.

    ``table`` always has an int64 ``step`` column (sorted, unique, >= 0) and a
    finite float64 ``reward`` column, the forecast target: the summed reward, or
    the metric chosen with ``read_log(metric=...)`` (:attr:`metric`; negated for
    ``direction="minimize"``). Every other logged number keeps one canonical name
    whatever the logger called it (:func:`~bayes_grpo.logs.validate.normalise_column`):
    ``reward_std``, ``frac_reward_zero_std``, ``rewards/<fn>/mean`` and
    ``rewards/<fn>/std``, ``completions/mean_length``, ``completions/clipped_ratio``,
    ``kl``, ``entropy``, ``eval_<name>``, ... :attr:`signals` lists them and
    :meth:`signal` reads one, aligned with :attr:`steps`. Build one with
    :func:`~bayes_grpo.logs.read_log`, which repairs and validates; the
    constructor only checks. ``meta.provenance`` says where each metadata value
    came from (an argument, a column, a notebook, ``config.json``, ...); the
    ``repr`` shows it in brackets.
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
        check_meta(self.meta, int(steps[-1]), where)

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
        """Deprecated: use ``run.signal("reward_std")`` (NaN where not logged), the one accessor of GRPO's signals.

        Still returns the within-step reward standard deviation, or None when the log has none; it
        will be removed in the next version.
        """
        warnings.warn('RunLog.reward_std is deprecated; use run.signal("reward_std") (NaN where not logged)', DeprecationWarning, stacklevel=2)
        values = self.signal("reward_std")
        return None if np.isnan(values).all() else values

    @property
    def metric(self) -> str:
        """The metric the ``reward`` column holds: ``"reward"`` (the summed reward) or the one chosen in ``read_log``."""
        return str(self.meta.extra.get("metric", "reward"))

    @property
    def direction(self) -> str:
        """``"maximize"``, or ``"minimize"`` when the ``reward`` column holds the negated metric."""
        return str(self.meta.extra.get("direction", "maximize"))

    @property
    def signals(self) -> tuple[str, ...]:
        """Canonical names of the numeric per-step signals this log holds (``reward`` first; not ``step``, ``epoch``)."""
        return tuple(
            str(c) for c in self.table.columns
            if c not in ("step", "epoch") and pd.api.types.is_numeric_dtype(self.table[c]) and self.table[c].notna().any()
        )  # fmt: skip

    def signal(self, name: str) -> np.ndarray:
        """One per-step signal as float64, aligned with :attr:`steps`, NaN at steps where it was not logged.

        ``name`` may be any name the signal is logged under (``train/reward_std``,
        ``rewards/acc``, ``reward__acc``, ...): it is normalised like the table's columns.

        Parameters
        ----------
        name : str
            E.g. ``"reward_std"``, ``"frac_reward_zero_std"``, ``"rewards/correctness/mean"``.

        Returns
        -------
        ndarray
            ``len(self)`` values; all NaN for a signal of :data:`GRPO_SIGNALS`, a per-function
            reward or an evaluation metric that this log does not hold.

        Raises
        ------
        LogError
            For any other name the log does not hold (a typo, say), listing :attr:`signals`.

        Example
        -------
        >>> run.signal("reward_std")[-3:]  # doctest: +SKIP
        array([0.41, 0.39, 0.40])
        """
        canonical = normalise_column(name)
        if canonical in self.signals:
            return pd.to_numeric(self.table[canonical], errors="coerce").to_numpy(dtype=np.float64)
        if canonical in GRPO_SIGNALS or canonical.startswith(("rewards/", "eval_")):
            return np.full(len(self), np.nan)
        raise LogError(f"run {self.run_id!r}: no signal {name!r} in the log; it has: {', '.join(self.signals)}")

    def with_metric(self, name: str, direction: str = "maximize", reward_range: tuple[float, float] | None = None) -> RunLog:
        """The same run forecasting another logged signal: its steps where ``name`` was logged, ``reward`` = its values.

        As ``read_log(..., metric=name, direction=direction)`` would give from the file:
        the summed reward's ``reward_range`` and ``initial_reward`` are dropped (give the
        metric's range in its own units), and a minimised metric is negated.

        Parameters
        ----------
        name : str
            A signal of :attr:`signals`, under any of its names.
        direction : str
            ``"maximize"`` or ``"minimize"``.
        reward_range : tuple of float, optional
            (min, max) the metric can reach, in its own units.

        Returns
        -------
        RunLog
            A new run; this one is unchanged.

        Raises
        ------
        LogError
            When the log does not hold ``name`` or it has no finite value.

        Example
        -------
        >>> run.with_metric("rewards/correctness/mean", reward_range=(0, 1)).rewards[:3]  # doctest: +SKIP
        array([0.03, 0.02, 0.05])
        """
        canonical = normalise_column(name)
        if canonical not in self.signals:
            raise LogError(f"run {self.run_id!r}: no metric {name!r} in the log; it has: {', '.join(self.signals)}")
        if direction not in ("maximize", "minimize"):
            raise LogError(f"direction={direction!r}: give one of 'maximize', 'minimize'")
        values = self.signal(canonical)
        logged = np.isfinite(values)
        if not logged.any():
            raise LogError(f"run {self.run_id!r}: metric {canonical!r} has no finite values; nothing to forecast from")
        sign = -1.0 if direction == "minimize" else 1.0
        table = self.table.loc[logged].drop(columns="reward").reset_index(drop=True)
        table.insert(1, "reward", sign * values[logged])
        extra = {**self.meta.extra, "metric": canonical, "direction": direction}
        if reward_range is not None and direction == "minimize":
            reward_range = (-float(reward_range[1]), -float(reward_range[0]))
        provenance = {k: v for k, v in self.meta.provenance.items() if k not in ("reward_range", "initial_reward")}
        if reward_range is not None:
            provenance["reward_range"] = "argument"
        meta = dataclasses.replace(
            self.meta, reward_range=None if reward_range is None else tuple(map(float, reward_range)),
            initial_reward=None, extra=extra, provenance=provenance,
        )  # fmt: skip
        return RunLog(self.run_id, table, meta)

    @property
    def family(self) -> str | None:
        """Model family (``meta.family``)."""
        return self.meta.family

    @property
    def params_b(self) -> float | None:
        """Model size in billions of parameters (``meta.params_b``)."""
        return self.meta.params_b

    @property
    def total_steps(self) -> int | None:
        """Planned number of steps (``meta.total_steps``)."""
        return self.meta.total_steps

    @property
    def reward_range(self) -> tuple[float, float] | None:
        """(min, max) attainable reward (``meta.reward_range``)."""
        return self.meta.reward_range

    @property
    def initial_reward(self) -> float | None:
        """Reward before training (``meta.initial_reward``)."""
        return self.meta.initial_reward

    @property
    def last_step(self) -> int:
        """The last logged step."""
        return int(self.table["step"].iloc[-1])

    def __len__(self) -> int:
        return len(self.table)

    def __repr__(self) -> str:
        def shown(name: str) -> str:
            origin = self.meta.provenance.get(name)
            value = getattr(self.meta, name)
            return f"{name}={value!r}" + (f" [{origin}]" if origin and value is not None else "")

        return (
            f"RunLog({self.run_id!r}, {len(self)} steps {self.steps[0]}..{self.last_step}, "
            f"{shown('family')}, {shown('params_b')}, {shown('total_steps')})"
        )

    def to_frame(self) -> pd.DataFrame:
        """The table with ``run_id`` and the metadata fields as extra columns."""
        frame = self.table.copy()
        frame.insert(0, "run_id", self.run_id)
        for name, value in meta_columns(self.meta).items():
            frame[name] = value
        return frame

    def head(self, step: int) -> RunLog:
        """The run as it looked at ``step``: rows with ``step <= step``, same metadata.

        Parameters
        ----------
        step : int
            Last step to keep.

        Returns
        -------
        RunLog
            The truncated run (same ``meta`` object).

        Raises
        ------
        LogError
            When no step was logged at or before ``step``.

        Example
        -------
        >>> run.head(50).last_step <= 50  # doctest: +SKIP
        True
        """
        table = self.table[self.table["step"] <= step].reset_index(drop=True)
        if table.empty:
            raise LogError(
                f"{self.meta.source or self.run_id}: no logged step at or before step {step} "
                f"(first logged step is {self.steps[0]}); pick a later step"
            )
        return RunLog(self.run_id, table, self.meta)

    def with_meta(self, **changes: Any) -> RunLog:
        """A copy with the given :class:`RunMetadata` fields replaced (validated, provenance ``"argument"``).

        Parameters
        ----------
        **changes
            Field names of :class:`RunMetadata` and their new values.

        Returns
        -------
        RunLog
            A new run; the original is unchanged.

        Raises
        ------
        LogError
            On an unknown field or an invalid value.

        Example
        -------
        >>> run.with_meta(total_steps=500).total_steps  # doctest: +SKIP
        500
        """
        unknown = set(changes) - {f.name for f in dataclasses.fields(RunMetadata)}
        if unknown:
            raise LogError(f"unknown metadata field(s) {sorted(unknown)}; known: {list(META_FIELDS)} and extra")
        provenance = {**self.meta.provenance, **{k: "argument" for k in changes if k in META_FIELDS}}
        values = {**dataclasses.asdict(self.meta), **changes, "provenance": provenance}
        meta = clean_meta(values, self.meta.source or self.run_id)
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
        """The run ids, in order."""
        return [r.run_id for r in self.runs]

    def filter(self, **criteria: Any) -> RunSet:
        """Runs whose metadata equal the given values, e.g. ``filter(family="qwen")``."""
        return RunSet(r for r in self.runs if all(getattr(r.meta, k) == v for k, v in criteria.items()))

    def to_frame(self) -> pd.DataFrame:
        """Tidy long table: one row per (run, step), metadata repeated per row."""
        if not self.runs:
            return pd.DataFrame(columns=["run_id", "step", "reward", *META_FIELDS])
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


# ------------------------------------------------------------------ metadata


def clean_meta(values: dict, name: str) -> RunMetadata:
    """Typed RunMetadata from loose values (CSV cells, JSON, arguments); unknown keys go to ``extra``.

    ``values["provenance"]`` (optional) says where each value came from; a
    family or size inferred from a ``model`` value is recorded as
    ``"model name (<where the model value came from>)"``.
    """
    values = dict(values)
    extra = dict(values.pop("extra", None) or {})
    origin = dict(values.pop("provenance", None) or {})
    lo, hi = values.pop("reward_min", None), values.pop("reward_max", None)
    if values.get("reward_range") is None and lo is not None and hi is not None:
        values["reward_range"] = (lo, hi)
        origin.setdefault("reward_range", origin.get("reward_min", "column"))
    kwargs: dict[str, Any] = {}
    for key, value in values.items():
        if key not in META_FIELDS:
            extra[key] = value
        elif value is not None and not (isinstance(value, float) and math.isnan(value)):
            kwargs[key] = _convert_meta(key, value, name)
    model = extra.get("model")
    if isinstance(model, str) and ("family" not in kwargs or "params_b" not in kwargs):
        family, size = infer_model(model)
        label = f"model name ({origin['model']})" if origin.get("model") else "model name"
        for key, value in (("family", family), ("params_b", size)):
            if key not in kwargs and value is not None:
                kwargs[key] = value
                origin[key] = label
    provenance = {k: v for k, v in origin.items() if k in kwargs and k != "source"}
    return RunMetadata(**kwargs, extra=extra, provenance=provenance)


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


def check_meta(meta: RunMetadata, last_step: int, name: str) -> None:
    """Raise :class:`LogError` unless the metadata is consistent with itself and with the logged steps."""
    planned_length(meta.total_steps, last_step, name, required=False)
    if meta.steps_per_epoch is not None and meta.steps_per_epoch <= 0:
        raise LogError(f"{name}: steps_per_epoch={meta.steps_per_epoch} must be positive")
    if meta.reward_range is not None:
        lo, hi = meta.reward_range
        if not (math.isfinite(lo) and math.isfinite(hi) and lo < hi):
            raise LogError(f"{name}: reward_range={meta.reward_range} must be two finite numbers (min, max) with min < max")


def meta_columns(meta: RunMetadata) -> dict[str, Any]:
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
