"""TRL / transformers output: ``trainer_state.json``, output folders and their checkpoints.

Besides the reward history, the files TRL and transformers save next to a
``trainer_state.json`` name the model: ``config.json`` (``_name_or_path``,
``model_type``), ``adapter_config.json`` (``base_model_name_or_path``, for
LoRA checkpoints) and the model card ``README.md`` (``base_model:``). Family
and size are inferred from that name (see :func:`~bayes_grpo.logs.families.infer_model`).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pandas as pd

from bayes_grpo.errors import LogError
from bayes_grpo.logs.families import infer_model, normalise_family
from bayes_grpo.logs.files import read_text
from bayes_grpo.logs.validate import REWARD_NAMES

__all__ = ["is_trl_output_dir", "model_beside", "newest_trainer_state", "read_json", "run_id_for"]

_CHECKPOINT_RE = re.compile(r"checkpoint-(\d+)")


def is_trl_output_dir(path: Path) -> bool:
    """True when ``path`` is a folder holding ``trainer_state.json`` or ``checkpoint-N/trainer_state.json``.

    Parameters
    ----------
    path : pathlib.Path
        Any path.

    Returns
    -------
    bool
    """
    return (path / "trainer_state.json").is_file() or any(path.glob("checkpoint-*/trainer_state.json"))


def newest_trainer_state(path: Path) -> Path:
    """The newest ``checkpoint-N/trainer_state.json`` of an output folder, else its top-level one.

    Parameters
    ----------
    path : pathlib.Path
        A TRL / transformers output folder.

    Returns
    -------
    pathlib.Path
        The ``trainer_state.json`` to read.

    Raises
    ------
    LogError
        When the folder has neither.
    """
    checkpoints = [
        (int(m.group(1)), p)
        for p in path.glob("checkpoint-*/trainer_state.json")
        if (m := _CHECKPOINT_RE.fullmatch(p.parent.name))
    ]
    if checkpoints:
        return max(checkpoints)[1]
    if (path / "trainer_state.json").is_file():
        return path / "trainer_state.json"
    raise LogError(
        f"{path}: folder has no trainer_state.json nor checkpoint-N/trainer_state.json; "
        "pass the log file itself, a TRL output folder or a folder of TensorBoard event files"
    )


def run_id_for(path: Path) -> str:
    """Default run id of a ``trainer_state.json``: its run folder's name (above ``checkpoint-N``)."""
    parent = path.resolve().parent
    if _CHECKPOINT_RE.fullmatch(parent.name):
        parent = parent.parent
    return parent.name


def read_json(path: Path, encoding: str | None = None) -> tuple[pd.DataFrame, dict]:
    """A TRL ``trainer_state.json`` or a JSON list of per-step records: raw table and found metadata.

    Parameters
    ----------
    path : pathlib.Path
        The ``.json`` file.
    encoding : str, optional
        Text encoding; default UTF-8.

    Returns
    -------
    tuple of (pandas.DataFrame, dict)
        The training entries of ``log_history`` (those with a reward) and its
        evaluation entries (``eval_*`` metrics, joined with the training entry of
        their step when reading), and the metadata found: ``total_steps`` (``max_steps``), ``steps_per_epoch``,
        and the model named beside it (:func:`model_beside`), with provenance.

    Raises
    ------
    LogError
        When the JSON is neither, or ``log_history`` has no reward entries.
    """
    data = json.loads(read_text(path, encoding))
    if isinstance(data, dict) and isinstance(data.get("log_history"), list):
        return _from_trainer_state(data, path)
    if isinstance(data, list) and data and all(isinstance(r, dict) for r in data):
        return pd.DataFrame.from_records(data), {}
    raise LogError(
        f"{path}: JSON is neither a TRL trainer_state.json (no 'log_history' list) nor a list of per-step "
        "records; give the trainer_state.json from the output folder"
    )


def log_history_frame(log_history: list, reward_names: tuple[str, ...] = REWARD_NAMES) -> pd.DataFrame:
    """The training entries of a trainer's ``log_history`` (those with a reward: every GRPO signal logged beside it
    kept) and its evaluation entries (``eval_*`` metrics), one row each: what :func:`bayes_grpo.logs.read_log`
    reads from a ``trainer_state.json``, and the TRL callback from the live trainer state."""
    records = [e for e in log_history if isinstance(e, dict)]
    training = [e for e in records if any(k in e for k in reward_names)]
    evaluation = [e for e in records if e not in training and any(str(k).startswith("eval_") for k in e)]
    return pd.DataFrame.from_records(training + evaluation)


def _from_trainer_state(state: dict, path: Path) -> tuple[pd.DataFrame, dict]:
    """Training and evaluation entries of ``log_history``; max_steps -> total_steps; the model beside it."""
    records = [e for e in state["log_history"] if isinstance(e, dict)]
    training = [e for e in records if any(k in e for k in REWARD_NAMES)]
    if records and not training:
        raise LogError(
            f"{path}: log_history has {len(records)} entries but none with a 'reward' field; "
            "is this a GRPO run? (TRL's GRPOTrainer logs 'reward' every logging step)"
        )
    found: dict[str, Any] = {}
    origin: dict[str, str] = {}
    if isinstance(state.get("max_steps"), int) and state["max_steps"] > 0:
        found["total_steps"] = state["max_steps"]
        origin["total_steps"] = "trainer_state.json"
    last = training[-1] if training else {}
    if isinstance(last.get("epoch"), (int, float)) and last["epoch"] > 0 and isinstance(last.get("step"), int):
        found["steps_per_epoch"] = max(1, round(last["step"] / last["epoch"]))
        origin["steps_per_epoch"] = "trainer_state.json"
    if path.name == "trainer_state.json":
        model = model_beside(path)
        found.update({k: v for k, v in model.items() if k != "provenance"})
        origin.update(model.get("provenance", {}))
    if origin:
        found["provenance"] = origin
    return log_history_frame(records), found


def model_beside(state_path: Path) -> dict:
    """Model name, family and size from the files saved next to a ``trainer_state.json``.

    Looks in the ``trainer_state.json``'s folder, then (for a checkpoint) the
    output folder above it, then the output folder's newest checkpoint, at
    ``config.json``, ``adapter_config.json`` and the model card ``README.md``.
    Unreadable files are skipped: they are not the log.

    Parameters
    ----------
    state_path : pathlib.Path
        A ``trainer_state.json``.

    Returns
    -------
    dict
        ``model`` (the name), ``family``, ``params_b`` where known, and
        ``provenance`` naming the file each came from; empty when nothing names the model.

    Example
    -------
    >>> model_beside(Path("outputs/checkpoint-500/trainer_state.json"))  # doctest: +SKIP
    {'model': 'Qwen/Qwen2.5-1.5B-Instruct', 'family': 'qwen', 'params_b': 1.5, 'provenance': {...}}
    """
    folder = state_path.resolve().parent
    folders = [folder]
    if _CHECKPOINT_RE.fullmatch(folder.name):
        folders.append(folder.parent)
    else:
        checkpoints = sorted(
            (int(m.group(1)), p) for p in folder.glob("checkpoint-*") if (m := _CHECKPOINT_RE.fullmatch(p.name))
        )
        folders += [p for _, p in reversed(checkpoints)]
    found: dict[str, Any] = {}
    origin: dict[str, str] = {}
    for place in folders:
        for file_name, names, type_key in (
            ("config.json", ("_name_or_path", "name_or_path"), "model_type"),
            ("adapter_config.json", ("base_model_name_or_path",), None),
            ("README.md", (), None),
        ):
            name, model_type = _named_in(place / file_name, names, type_key)
            family, size = infer_model(name) if name else (None, None)
            if family is None and model_type:
                family = normalise_family(model_type)
            for key, value in (("model", name if family or size else None), ("family", family), ("params_b", size)):
                if value is not None and key not in found:
                    found[key] = value
                    origin[key] = file_name
        if "family" in found and "params_b" in found:
            break
    if found:
        found["provenance"] = origin
    return found


def _named_in(path: Path, keys: tuple[str, ...], type_key: str | None) -> tuple[str | None, str | None]:
    """(model name, model_type) from a config JSON, or (``base_model`` of a model card, None)."""
    if not path.is_file():
        return None, None
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None, None
    if path.suffix == ".md":
        match = re.search(r"^base_model:\s*(?:\n\s*-\s*)?['\"]?([^'\"\s]+)", text, re.MULTILINE)
        return (match.group(1) if match else None), None
    try:
        config = json.loads(text)
    except ValueError:
        return None, None
    if not isinstance(config, dict):
        return None, None
    name = next((config[k] for k in keys if isinstance(config.get(k), str) and config[k].strip()), None)
    model_type = config.get(type_key) if type_key and isinstance(config.get(type_key), str) else None
    return name, model_type
