"""One name per logged signal: the names loggers use (TRL versions, W&B, consoles, the shared runs) -> canonical ones."""

from __future__ import annotations

import re

__all__ = ["REWARD_NAMES", "STEP_NAMES", "normalise_column"]

STEP_NAMES = ("step", "global_step", "trainer/global_step", "_step")
REWARD_NAMES = ("reward", "mean_reward", "reward_mean")
#: Names one GRPO signal is logged under (lower case, after ``train/`` is dropped) -> its canonical name.
_COLUMN_ALIASES = {
    "training loss": "loss", "validation loss": "eval_loss", "completion_length": "completions/mean_length",
    "clipped_ratio": "completions/clipped_ratio", "std_reward": "reward_std",
}  # fmt: skip


def normalise_column(name: object) -> str:
    """Canonical column name, one per GRPO signal whatever the logger called it.

    Per-function rewards become ``rewards/<fn>/mean`` (TRL's ``rewards/<fn>/mean``, older
    TRL's ``rewards/<fn>``, console tables' ``rewards / <fn> / mean``, the shared runs'
    ``reward__<fn>``) and ``rewards/<fn>/std`` (``reward_std__<fn>``); W&B's ``train/``
    prefix is dropped and its ``eval/`` prefix becomes ``eval_`` (as TRL's
    ``trainer_state.json`` names evaluation metrics); ``completion_length`` and
    ``clipped_ratio`` become TRL's ``completions/mean_length`` and ``completions/clipped_ratio``.

    Parameters
    ----------
    name : object
        A column name as logged.

    Returns
    -------
    str
        The name :class:`RunLog` tables use.

    Example
    -------
    >>> normalise_column("train/rewards/acc/mean"), normalise_column("reward_std__acc"), normalise_column("eval/accuracy")
    ('rewards/acc/mean', 'rewards/acc/std', 'eval_accuracy')
    """
    text = re.sub(r"\s*/\s*", "/", str(name).strip())
    while text.startswith(("train/", "eval/")):
        text = text[len("train/") :] if text.startswith("train/") else "eval_" + text[len("eval/") :]
    if text.lower() == "step":
        return "step"
    text = _COLUMN_ALIASES.get(text.lower(), text)
    if m := re.fullmatch(r"rewards?/(.+?)(/mean|/std)?", text):
        if m.group(1) not in ("mean", "std"):
            return f"rewards/{m.group(1)}/{(m.group(2) or '/mean')[1:]}"
    if m := re.fullmatch(r"reward(_std)?__(.+)", text):
        return f"rewards/{m.group(2)}/{'std' if m.group(1) else 'mean'}"
    return text
