"""Stop TRL's ``GRPOTrainer`` (or any ``transformers.Trainer`` logging a reward) at the plateau.

``PlateauStoppingCallback`` reads the reward history from ``state.log_history``
at each log, and every ``check_every`` steps (once ``min_fraction`` of
``max_steps`` is done) forecasts the rest of the run and applies
:func:`bayes_grpo.stopping.decision_from_forecast`. It adds
``plateau/probability`` and ``plateau/expected_gain`` to the logs of that step
and sets ``control.should_training_stop`` when the rule says stop. Any failure
inside the callback becomes a warning; training always goes on.

Reporting callbacks (W&B, TensorBoard) run before callbacks passed by the user,
so to have the ``plateau/*`` keys reach them on the same step, attach the
callback with :meth:`PlateauStoppingCallback.attach` (it goes first); passed
as ``callbacks=[...]`` the keys still land in ``trainer.state.log_history``.
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Any

import pandas as pd
from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from bayes_grpo.logs import normalise_family
from bayes_grpo.stopping import StopDecision, decision_from_forecast

if TYPE_CHECKING:
    from bayes_grpo.model import FittedModel

PROBABILITY_KEY = "plateau/probability"
GAIN_KEY = "plateau/expected_gain"
MIN_POINTS = 5


class PlateauStoppingCallback(TrainerCallback):
    """Stop training once the forecast says more steps will not raise the reward.

    ``model`` defaults to :func:`bayes_grpo.default_model` (loaded at the first
    check). ``family``/``params_b`` default to the trainer model's
    ``config.model_type`` and parameter count, ``total_steps`` to ``state.max_steps``.
    ``n_draws`` trades forecast precision for speed. ``decisions`` keeps every
    :class:`~bayes_grpo.stopping.StopDecision` made, ``stopped_at`` the step of the stop.
    """

    def __init__(
        self,
        model: FittedModel | None = None,
        threshold: float = 0.9,
        tolerance: float = 0.01,
        check_every: int = 10,
        min_fraction: float = 0.1,
        family: str | None = None,
        params_b: float | None = None,
        reward_range: tuple[float, float] | None = None,
        reward_key: str = "reward",
        verbose: bool = True,
        n_draws: int = 500,
    ) -> None:
        self.model = model
        self.threshold = threshold
        self.tolerance = tolerance
        self.check_every = max(1, int(check_every))
        self.min_fraction = min_fraction
        self.family = family
        self.params_b = params_b
        self.reward_range = reward_range
        self.reward_key = reward_key
        self.verbose = verbose
        self.n_draws = n_draws
        self.decisions: list[StopDecision] = []
        self.stopped_at: int | None = None
        self._last_check: int | None = None

    def attach(self, trainer: Any) -> PlateauStoppingCallback:
        """Insert this callback first in ``trainer``'s callbacks, so reporters see the ``plateau/*`` keys."""
        trainer.callback_handler.callbacks.insert(0, self)
        return self

    def on_train_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, model: Any = None, **kwargs: Any) -> None:
        try:
            self._describe(model)
        except Exception as exc:  # noqa: BLE001 - the callback must never break training
            warnings.warn(f"PlateauStoppingCallback: could not read the model's family/size ({exc!r}); forecasting without them", stacklevel=2)

    def on_log(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, logs: dict[str, Any] | None = None, **kwargs: Any) -> None:
        try:
            if logs is None or self.reward_key not in logs or not self._due(state):
                return
            decision = self._decide(state)
            if decision is None:
                return
            self.decisions.append(decision)
            values = {PROBABILITY_KEY: decision.probability, GAIN_KEY: decision.expected_gain}
            logs.update(values)
            if state.log_history and state.log_history[-1].get("step") == state.global_step:
                state.log_history[-1].update(values)
            if decision.should_stop and state.global_step < state.max_steps:
                control.should_training_stop = True
                self.stopped_at = state.global_step
                if self.verbose:
                    print(f"[bayes_grpo] {decision.explain()}")
        except Exception as exc:  # noqa: BLE001 - the callback must never break training
            warnings.warn(f"PlateauStoppingCallback: check at step {state.global_step} failed ({exc!r}); training goes on", stacklevel=2)

    def _due(self, state: TrainerState) -> bool:
        if not state.max_steps or state.global_step < self.min_fraction * state.max_steps:
            return False
        return self._last_check is None or state.global_step - self._last_check >= self.check_every

    def _describe(self, model: Any) -> None:
        """Fill ``family``/``params_b`` from the trainer's model when not given."""
        if model is None:
            return
        if self.family is None:
            model_type = getattr(getattr(model, "config", None), "model_type", None)
            self.family = normalise_family(model_type) if model_type else None
        if self.params_b is None:
            self.params_b = sum(p.numel() for p in model.parameters()) / 1e9

    def _decide(self, state: TrainerState) -> StopDecision | None:
        key = self.reward_key
        rows = [(e["step"], e[key]) for e in state.log_history if key in e and "step" in e and e[key] is not None]
        if len(rows) < MIN_POINTS:
            return None
        self._last_check = state.global_step  # a failing check is retried only after check_every steps
        if self.model is None:
            from bayes_grpo.model import default_model

            self.model = default_model()
        from bayes_grpo.logs import read_log

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            run = read_log(
                pd.DataFrame(rows, columns=["step", "reward"]),
                family=self.family,
                params_b=self.params_b or None,
                total_steps=max(state.max_steps, rows[-1][0]),
                reward_range=self.reward_range,
                run_id="live",
            )
        forecast = self.model.forecast(run, n_draws=self.n_draws, seed=state.global_step)
        return decision_from_forecast(forecast, threshold=self.threshold, tolerance=self.tolerance)
