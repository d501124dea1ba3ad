"""Console logs of the RL trainers beyond TRL: verl, OpenRLHF and NeMo-RL.

Each prints one record of metrics per training step; the formats are those of
their sources (verl at commit b178a3c, OpenRLHF at 3c3be62, NeMo-RL at 7ea279a):

* **verl** -- ``verl/utils/logger/aggregate_logger.py`` (``LocalLogger``, the ``console``
  backend) prints ``step:3 - critic/score/mean:0.41 - actor/entropy:0.52 - ...``: the keys
  of the step's metrics dict and ``pprint.pformat`` of each number (``np.float64(0.41)``
  under NumPy 2). Ray puts ``(TaskRunner pid=1234)`` before lines printed in its workers
  and tqdm's progress bar shares the output: both are skipped. ``Total training steps: N``
  (``verl/trainer/ppo/ray_trainer.py``) gives the planned length. The validation before
  training is logged at step 0. (Its ``file`` backend writes JSONL, read by
  :func:`~bayes_grpo.logs.tables.read_jsonl`.)
* **OpenRLHF** -- ``openrlhf/trainer/ppo_trainer.py`` logs ``✨ Global step 3: {...}``, the
  step's metrics as a Python dict, and ``✨ Evaluation completed in ..., global_step 3,
  eval_metrics: {...}``.
* **NeMo-RL** -- ``nemo_rl/algorithms/grpo.py`` prints a block per step: ``===== Step k/M =====``
  (``k`` counts within the epoch, ``===== Epoch e/E =====`` before it), then under
  ``📊 Training Results:`` lines ``  • Avg Reward: 0.4100``, ``  • Loss: ...``,
  ``  • Mean Generation Length: ...``, and under ``📊 Validation Results:`` ``• Accuracy: ...``.
  Its step is ``(e - 1) * M + k``, the step it logs to TensorBoard.

Metric names are normalised afterwards like every column
(:func:`~bayes_grpo.logs.names.normalise_column`). Within-group reward spread: OpenRLHF
logs it (``group_reward_std``); verl and NeMo-RL do not, so a forecast from their logs
says the learning signal is missing.
"""

from __future__ import annotations

import ast
import math
import re
import warnings
from pathlib import Path

import pandas as pd

from bayes_grpo.logs.console import banner_meta
from bayes_grpo.logs.types import LogWarning

__all__ = ["parse_trainer_console", "parse_verl_line"]

_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
# verl: "step:N - key:value - key:value"; "step" may follow a Ray prefix or a progress bar, never a word or "/".
_VERL_LINE = re.compile(r"(?<![\w/])step:(\d+)((?: - [^:\s][^:]*:[^:]*?)+)\s*$")
_VERL_TOTAL = re.compile(r"Total training steps: (\d+)")
_NUMPY_SCALAR = re.compile(r"np\.(?:float|int|uint|bool_?)\w*\((.*)\)")
_OPENRLHF_TRAIN = re.compile(r"Global step (\d+): (\{.*\})\s*$")
_OPENRLHF_EVAL = re.compile(r"global_step (\d+), eval_metrics: (\{.*\})\s*$")
_NEMO_EPOCH = re.compile(r"=+ Epoch (\d+)/(\d+) =+")
_NEMO_STEP = re.compile(r"=+ Step (\d+)/(\d+) =+")
_NEMO_BULLET = re.compile(r"^\s*•\s*([^:]+):\s*(-?[\d.]+(?:e[-+]?\d+)?|nan|-?inf)\b", re.IGNORECASE)
# NeMo-RL's printed labels -> the names it logs to TensorBoard (under train/ and validation/).
_NEMO_TRAIN = {
    "avg reward": "reward", "avg total reward": "reward", "avg filtered reward": "filtered_reward", "loss": "loss",
    "mean generation length": "mean_gen_tokens_per_sample", "generation kl error": "gen_kl_error",
}  # fmt: skip
_NEMO_VALIDATION = {"accuracy": "validation/accuracy", "average response length": "validation/avg_length"}


def _lines(text: str) -> list[str]:
    """Physical lines without colour codes; a carriage return (a progress bar redrawn) also ends a line."""
    return [_ANSI.sub("", line) for line in re.split(r"\r\n|\r|\n", text)]


def _number(text: str) -> float | None:
    """A printed number: ``0.41``, ``-1e-06``, ``nan``, ``np.float64(0.41)``, ``True``; None when it is none."""
    text = text.strip()
    if match := _NUMPY_SCALAR.fullmatch(text):
        text = match.group(1).strip()
    if text in ("True", "False"):
        return float(text == "True")
    try:
        return float(text)
    except ValueError:
        return None


def parse_verl_line(line: str) -> tuple[int, dict[str, float]] | None:
    """The step and metrics of one line verl's console logger printed, else None.

    Parameters
    ----------
    line : str
        One line of output; text before ``step:`` (a Ray prefix, a progress bar) is ignored.

    Returns
    -------
    tuple of (int, dict of str to float) or None
        ``(step, {key: value})``; entries whose value is not a number are left out.

    Example
    -------
    >>> parse_verl_line("(TaskRunner pid=7) step:2 - critic/score/mean:np.float64(0.5) - actor/lr:1e-06")
    (2, {'critic/score/mean': 0.5, 'actor/lr': 1e-06})
    """
    match = _VERL_LINE.search(line)
    if not match:
        return None
    metrics = {}
    for part in match.group(2)[len(" - ") :].split(" - "):
        key, _, value = part.rpartition(":")
        number = _number(value)
        if key and number is not None:
            metrics[key.strip()] = number
    return (int(match.group(1)), metrics) if metrics else None


def _literal_dict(text: str) -> dict | None:
    """A printed Python dict of metrics (``nan``, ``inf`` and NumPy scalars allowed), else None."""
    text = re.sub(r"np\.\w+\(([^()]*)\)", r"\1", text)
    text = re.sub(r"(?<![\w'\"])(-?inf|nan)(?![\w'\"])", r"'\1'", text)
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return None
    if not isinstance(value, dict):
        return None
    out = {}
    for key, item in value.items():
        number = _number(str(item)) if isinstance(item, (int, float, str)) else None
        if number is not None:
            out[str(key)] = number
    return out


def parse_trainer_console(text: str, path: Path, label: str = "console") -> tuple[pd.DataFrame, dict] | None:
    """The per-step table of a verl, OpenRLHF or NeMo-RL console log, or None when ``text`` is none of them.

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
    tuple of (pandas.DataFrame, dict) or None
        The raw table (a ``step`` column, metrics under their logged names) and the metadata found
        (``trainer``; ``total_steps`` where the log says it; the model named in the output).
    """
    lines = _lines(text)
    for name, parse in (("verl", _verl), ("OpenRLHF", _openrlhf), ("NeMo-RL", _nemo)):
        rows, found = parse(lines, text.endswith(("\n", "\r")), path)
        if rows:
            prose = "\n".join(line for line in lines if not _VERL_LINE.search(line) and "{" not in line)
            meta = banner_meta(prose, label)
            provenance = {**meta.pop("provenance", {}), **{k: label for k in found}}
            meta.update(found, trainer=name, provenance=provenance)
            return pd.DataFrame.from_records(rows), meta
    return None


def _verl(lines: list[str], ended: bool, path: Path) -> tuple[list[dict], dict]:
    rows = []
    for number, line in enumerate(lines):
        parsed = parse_verl_line(line)
        if parsed is None:
            continue
        if number == len(lines) - 1 and not ended:
            warnings.warn(
                f"{path}: the last line (step {parsed[0]}) has no line end: cut off mid-write; dropped it and read "
                f"the {len(rows)} complete step line(s) before it",
                LogWarning,
                stacklevel=5,
            )
            break
        rows.append({"step": parsed[0], **parsed[1]})
    found = {}
    totals = [int(m.group(1)) for line in lines if (m := _VERL_TOTAL.search(line))]
    if rows and totals:
        found["total_steps"] = totals[-1]
    return rows, found


def _openrlhf(lines: list[str], ended: bool, path: Path) -> tuple[list[dict], dict]:
    rows = []
    for line in lines:
        match = _OPENRLHF_TRAIN.search(line) or _OPENRLHF_EVAL.search(line)
        if match and (metrics := _literal_dict(match.group(2))) is not None:
            rows.append({"step": int(match.group(1)), **metrics})
    return (rows if any("reward" in r for r in rows) else []), {}


def _nemo(lines: list[str], ended: bool, path: Path) -> tuple[list[dict], dict]:
    rows: list[dict] = []
    epoch, epochs, step, per_epoch, section = 1, None, 0, None, None
    for line in lines:
        if match := _NEMO_EPOCH.search(line):
            epoch, epochs = int(match.group(1)), int(match.group(2))
        elif match := _NEMO_STEP.search(line):
            per_epoch = int(match.group(2))
            step = (epoch - 1) * per_epoch + int(match.group(1))
            section = None
        elif "Training Results:" in line:
            section = _NEMO_TRAIN
        elif "Validation Results:" in line:
            section = _NEMO_VALIDATION
        elif line.strip().endswith(":") and "•" not in line:
            section = None  # another block (timing, ...)
        elif section is not None and (match := _NEMO_BULLET.match(line)):
            key = section.get(match.group(1).strip().lower())
            value = _number(match.group(2))
            if key is not None and value is not None and not (math.isnan(value) and key == "reward"):
                if not rows or rows[-1]["step"] != step:
                    rows.append({"step": step})
                rows[-1][key] = value
    found = {}
    if rows and epochs == 1 and per_epoch:  # one epoch: its length is the planned length
        found["total_steps"] = per_epoch
    return (rows if any("reward" in r for r in rows) else []), found
