"""One name per logged signal: the names loggers use (TRL versions, W&B, consoles, the shared runs) -> canonical ones."""

from __future__ import annotations

import re

__all__ = ["REWARD_NAMES", "STEP_NAMES", "normalise_column"]

STEP_NAMES = ("step", "global_step", "trainer/global_step", "training/global_step", "_step")
REWARD_NAMES = ("reward", "mean_reward", "reward_mean")
#: Names one GRPO signal is logged under (lower case, after ``train/`` is dropped) -> its canonical name.
_COLUMN_ALIASES = {
    "training loss": "loss", "validation loss": "eval_loss", "completion_length": "completions/mean_length",
    "clipped_ratio": "completions/clipped_ratio", "std_reward": "reward_std",
}  # fmt: skip
#: What the RL trainers beyond TRL call the same signals (:mod:`bayes_grpo.logs.trainers`). verl
#: (``verl/trainer/ppo/metric_utils.py``, ``verl/workers/actor/dp_actor.py``): the reward functions' score is
#: ``critic/score/mean`` (``critic/rewards/mean`` is it less verl's in-reward KL penalty, kept under its own name),
#: PPO's clipped share of the policy ratio ``actor/pg_clipfrac``, the KL to the reference ``actor/kl_loss``, and the
#: best and worst score of a step's completions ``critic/score/max`` and ``/min`` (``completions/max_reward``,
#: ``completions/min_reward``: they can show the reward's range, :func:`bayes_grpo.prepare.completion_range_bounds`).
#: OpenRLHF (``openrlhf/trainer/ppo_utils/experience_maker.py``, ``openrlhf/trainer/ray/ppo_actor.py``): the
#: within-group reward spread ``group_reward_std`` (its ``rollout/reward_std`` is over the whole batch, prompts
#: mixed, so it is no learning signal and keeps its own name). NeMo-RL (``nemo_rl/experience/rollouts.py``,
#: ``nemo_rl/algorithms/loss/loss_functions.py``): ``mean_gen_tokens_per_sample``, ``truncation_rate``,
#: ``approx_entropy``, ``kl_penalty``. Stanford CS336's GRPO assignment trainer (its per-step JSONL): the mean, best and
#: worst reward of a step's rollouts ``rollout_reward_mean``, ``_max``, ``_min`` (its ``rollout_reward_std`` is over the
#: whole rollout batch, prompts mixed, and keeps its own name).
_TRAINER_ALIASES = {
    # verl
    "critic/score/mean": "reward", "critic/score/max": "completions/max_reward", "critic/score/min": "completions/min_reward",
    "response_length/mean": "completions/mean_length",
    "response_length/clip_ratio": "completions/clipped_ratio", "actor/pg_clipfrac": "clip_ratio/region_mean",
    "actor/entropy": "entropy", "actor/kl_loss": "kl", "actor/grad_norm": "grad_norm", "actor/lr": "learning_rate",
    "training/epoch": "epoch",
    # OpenRLHF
    "group_reward_std": "reward_std", "response_length": "completions/mean_length",
    "truncated": "completions/clipped_ratio", "ppo_clip_ratio": "clip_ratio/region_mean",
    "actor_grad_norm": "grad_norm", "actor_lr": "learning_rate",
    # NeMo-RL
    "mean_gen_tokens_per_sample": "completions/mean_length", "truncation_rate": "completions/clipped_ratio",
    "approx_entropy": "entropy", "kl_penalty": "kl",
    # CS336 assignment 5
    "rollout_reward_mean": "reward", "rollout_reward_max": "completions/max_reward", "rollout_reward_min": "completions/min_reward",
}  # fmt: skip
#: Prefixes of evaluation metrics besides W&B's ``eval/``: verl's ``val-core/`` and ``val-aux/``
#: (``verl/trainer/ppo/ray_trainer.py``), NeMo-RL's ``validation/``. Each becomes ``eval_``.
_EVAL_PREFIXES = ("eval/", "val-core/", "val-aux/", "validation/")


def normalise_column(name: object) -> str:
    """Canonical column name, one per GRPO signal whatever the logger called it.

    Per-function rewards become ``rewards/<fn>/mean`` (TRL's ``rewards/<fn>/mean``, older
    TRL's ``rewards/<fn>``, console tables' ``rewards / <fn> / mean``, the shared runs'
    ``reward__<fn>``) and ``rewards/<fn>/std`` (``reward_std__<fn>``); W&B's ``train/``
    prefix is dropped and its ``eval/`` prefix becomes ``eval_`` (as TRL's
    ``trainer_state.json`` names evaluation metrics); ``completion_length`` and
    ``clipped_ratio`` become TRL's ``completions/mean_length`` and ``completions/clipped_ratio``.
    verl's, OpenRLHF's and NeMo-RL's names for the same signals are mapped the same way
    (``critic/score/mean`` -> ``reward``, ``actor/entropy`` -> ``entropy``, ``group_reward_std`` ->
    ``reward_std``, ...), and their evaluation prefixes (``val-core/``, ``val-aux/``, ``validation/``)
    become ``eval_`` too.

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
    while text.startswith(("train/", *_EVAL_PREFIXES)):
        if text.startswith("train/"):
            text = text[len("train/") :]
        else:
            text = "eval_" + text.split("/", 1)[1]
    while text.startswith("eval_eval_"):  # OpenRLHF writes its eval_* metrics under TensorBoard's eval/ prefix
        text = text[len("eval_") :]
    if text.lower() == "step":
        return "step"
    text = _COLUMN_ALIASES.get(text.lower(), text)
    text = _TRAINER_ALIASES.get(text.lower(), text)
    if m := re.fullmatch(r"rewards?/(.+?)(/mean|/std)?", text):
        if m.group(1) not in ("mean", "std"):
            return f"rewards/{m.group(1)}/{(m.group(2) or '/mean')[1:]}"
    if m := re.fullmatch(r"reward(_std)?__(.+)", text):
        return f"rewards/{m.group(2)}/{'std' if m.group(1) else 'mean'}"
    return text
