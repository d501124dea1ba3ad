"""Stop TRL's ``GRPOTrainer`` (or any ``transformers.Trainer`` logging a reward) at the plateau.

``PlateauStoppingCallback`` reads the reward history from ``state.log_history``
at each log, and every ``check_every`` steps (once ``min_fraction`` of
``max_steps`` is done) forecasts the rest of the run and applies
:func:`bayes_grpo.stopping.decision_from_forecast`. It adds to the logs of that
step (so W&B, TensorBoard and ``trainer.state.log_history`` get them with the
other metrics):

* ``plateau/probability``, ``plateau/expected_gain``: the stop rule's evidence;
* ``plateau/best_step``: the step with the highest smoothed reward so far (the
  one worth keeping);
* ``forecast/final_q50``, ``forecast/final_q05``, ``forecast/final_q95``: the
  median and 90% interval of the forecast final reward (the mean logged reward
  over the last 10% of the steps up to ``max_steps``, :attr:`Forecast.final`);
* ``forecast/p_take_off_ahead``: the posterior weight of "most of the rise is
  still ahead" (:attr:`Forecast.regimes`);
* ``forecast/pareto_k``: the forecast's Pareto k-hat (above 0.7 its weights are unreliable);
* ``forecast/p_beats``: with ``beat=VALUE``, the probability that the final reward ends above
  ``VALUE`` (e.g. the best final reward of the other runs of a sweep).

It sets ``control.should_training_stop`` when the rule says stop, or, with ``beat=VALUE``,
once the run is unlikely to end above ``VALUE`` (``forecast/p_beats`` below ``beat_threshold``):
a sweep's run that cannot beat the best one so far need not finish. When the
trainer saves checkpoints, :attr:`PlateauStoppingCallback.best_checkpoint`
names the ``checkpoint-N`` folder that holds the best step (or the nearest one
saved before it), and the stop message says which to keep; when the trainer's
``save_total_limit`` has deleted that checkpoint, one warning and the stop
message say so and name the nearest kept one.

When the trainer reports to TensorBoard or W&B, every ``plot_every`` checks the
callback also sends the fan chart of the latest forecast, with the stop
probability of every check so far beneath it (:func:`bayes_grpo.plotting.fan_chart`),
as the image ``bayes_grpo/forecast``: to TensorBoard through the trainer's own
writer, to W&B as a ``wandb.Image`` on the trainer's step axis. The figure is drawn
in a background thread, so training does not wait for it, and the plots take at most
:data:`PLOT_BUDGET` of the training time: a chart due while the last one is still
drawing, or while the plots so far took more than that share, is skipped (on a GPU
step of a second or more none is; on a tiny CPU run most are). The last decision
is drawn at the end of training.

Problems never break training: a missing reward key or non-numeric rewards get
one warning, and a failing check or plot one warning, after which training goes
on. A forecast's own warnings (rewards that have all been equal, unreliable
importance weights) are reported once per kind, not at every check.

In multi-process training (``torch.distributed`` initialised: DDP, DeepSpeed, FSDP) only the
main process forecasts and decides; at every due check it broadcasts its decision, with the
keys it logs, to the other processes, so that every process stops at the same step and the
trainer's collectives stay aligned. The stop message and the warnings come from the main
process alone. The model's size is its parameter count, or, where each process holds a shard of
the parameters (DeepSpeed ZeRO-3, FSDP), an estimate from its config.

Reporting callbacks (W&B, TensorBoard) come before callbacks passed as
``callbacks=[...]`` in the trainer's list, and see each log before them; so at
the start of training the callback moves itself to the front of that list, as
:meth:`PlateauStoppingCallback.attach` does at once, and every reporter gets the
``plateau/*`` and ``forecast/*`` keys on the step they belong to.
"""

from __future__ import annotations

import math
import numbers
import pickle
import re
import sys
import time
import warnings
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from bayes_grpo.errors import BayesGrpoError
from bayes_grpo.logs import normalise_family
from bayes_grpo.model_size import parameter_count
from bayes_grpo.settings import STOP_THRESHOLD, STOP_TOLERANCE
from bayes_grpo.stopping import PlateauRule, StopDecision, StopRule

if TYPE_CHECKING:
    from bayes_grpo.forecast import Forecast
    from bayes_grpo.model import FittedModel

PROBABILITY_KEY = "plateau/probability"
GAIN_KEY = "plateau/expected_gain"
BEST_STEP_KEY = "plateau/best_step"
FINAL_KEYS = {"forecast/final_q05": 0.05, "forecast/final_q50": 0.5, "forecast/final_q95": 0.95}
TAKE_OFF_KEY = "forecast/p_take_off_ahead"
PARETO_K_KEY = "forecast/pareto_k"
BEATS_KEY = "forecast/p_beats"
#: Name of the fan-chart image in TensorBoard and W&B.
PLOT_KEY = "bayes_grpo/forecast"
MIN_POINTS = 5
#: Seconds the end of training waits for a plot still being drawn.
PLOT_WAIT_S = 30.0
#: The largest share of the training time (since it began) the plotting thread may have taken for a due plot to start.
PLOT_BUDGET = 0.05
_CHECKPOINT = re.compile(r"checkpoint-(\d+)$")


def _is_number(value: Any) -> bool:
    """A finite real number (bools and numeric strings are not)."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(float(value))


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise BayesGrpoError(f"PlateauStoppingCallback: {message}")


def _shown(value: Any) -> str:
    return f"{value!r} ({type(value).__name__})"


class PlateauStoppingCallback(TrainerCallback):
    """Stop training once the forecast says more steps will not raise the reward.

    Parameters
    ----------
    model
        A :class:`~bayes_grpo.model.FittedModel`; default :func:`bayes_grpo.default_model`
        (loaded at the first check).
    threshold
        Stop when P(plateau) reaches this; a number strictly between 0 and 1.
    tolerance
        Remaining gain below ``tolerance`` x the reward scale counts as none; >= 0.
    check_every
        Steps between two checks; a whole number >= 1. The planned last step (``max_steps``) is
        always checked too, however near the check before it.
    min_fraction
        No check before this fraction of ``max_steps``; in [0, 1).
    family, params_b
        Model family and size in billions; default: the trainer model's
        ``config.model_type`` and parameter count.
    reward_range
        ``(lo, hi)`` the reward functions can reach, when known.
    reward_key
        Name of the mean reward in the trainer's logs (TRL: ``"reward"``).
    verbose
        After stopping training, print :meth:`stop_message` at the end of training (once every
        checkpoint is saved, so it names the right one).
    n_draws
        Forecast draws per check (precision against speed); >= 10.
    beat
        A final reward to beat (e.g. the best of a sweep's finished runs): also stop once the
        probability of ending above it falls below ``beat_threshold``. None: the plateau rule alone.
    beat_threshold
        See ``beat``; a number strictly between 0 and 1 (default 0.05).
    plots
        Send the fan chart to TensorBoard / W&B when the trainer reports to them; False: never draw.
    plot_every
        Checks between two fan charts; a whole number >= 1.
    rule
        The stop rule (a :class:`~bayes_grpo.stopping.StopRule`, a user's own included); default:
        :class:`~bayes_grpo.stopping.PlateauRule` with ``threshold`` and ``tolerance``.

    Raises
    ------
    BayesGrpoError
        At construction, for an argument of the wrong type or out of range.

    Attributes
    ----------
    decisions : list of StopDecision
        Every decision made.
    stopped_at : int or None
        The step where the callback stopped training.
    stop_reason : {"plateau", "beat"} or None
        Which rule stopped it: the plateau rule, or ``beat`` (unlikely to end above it).
    beat_probabilities : list of (int, float)
        With ``beat``: the step and P(final > beat) of every check.
    best_checkpoint : Path or None
        The saved ``checkpoint-N`` folder holding the latest decision's best step,
        or the nearest one saved before it (None when checkpoints are not saved, or when
        ``save_total_limit`` deleted it: then see :attr:`deleted_checkpoint`).
    deleted_checkpoint : Path or None
        The checkpoint that held the best step (or the nearest one before it) when the
        trainer's checkpoint rotation has deleted it; None otherwise.
    nearest_kept_checkpoint : Path or None
        With :attr:`deleted_checkpoint`: the kept checkpoint whose step is nearest the best step.
    plot_steps : list of int
        The steps whose fan chart reached TensorBoard or W&B.
    plot_seconds : float
        Time the plotting thread took for them (drawing and sending).

    Example
    -------
    >>> trainer = GRPOTrainer(..., callbacks=[PlateauStoppingCallback()])  # doctest: +SKIP
    """

    def __init__(
        self,
        model: FittedModel | None = None,
        threshold: float = STOP_THRESHOLD,
        tolerance: float = STOP_TOLERANCE,
        check_every: int = 10,
        min_fraction: float = 0.1,
        family: str | None = None,
        params_b: float | None = None,
        reward_range: tuple[float, float] | None = None,
        reward_key: str = "reward",
        verbose: bool = True,
        n_draws: int = 500,
        beat: float | None = None,
        beat_threshold: float = 0.05,
        plots: bool = True,
        plot_every: int = 1,
        rule: StopRule | None = None,
    ) -> None:
        _require(model is None or callable(getattr(model, "forecast", None)), f"model must be a FittedModel (or None for the shipped one), got {_shown(model)}")
        _require(_is_number(threshold) and 0 < threshold < 1, f"threshold must be a number between 0 and 1 (exclusive), got {_shown(threshold)}")
        _require(_is_number(tolerance) and tolerance >= 0, f"tolerance must be a number >= 0, got {_shown(tolerance)}")
        _require(isinstance(check_every, numbers.Integral) and not isinstance(check_every, bool) and check_every >= 1, f"check_every must be a whole number >= 1, got {_shown(check_every)}")
        _require(_is_number(min_fraction) and 0 <= min_fraction < 1, f"min_fraction must be a number in [0, 1), got {_shown(min_fraction)}")
        _require(family is None or (isinstance(family, str) and family.strip() != ""), f"family must be a model family name such as 'qwen', got {_shown(family)}")
        _require(params_b is None or (_is_number(params_b) and params_b > 0), f"params_b must be a positive number (billions of parameters), got {_shown(params_b)}")
        if reward_range is not None:
            _require(
                isinstance(reward_range, (tuple, list)) and len(reward_range) == 2 and all(_is_number(v) for v in reward_range) and reward_range[0] < reward_range[1],
                f"reward_range must be two numbers (lo, hi) with lo < hi, got {_shown(reward_range)}",
            )
        _require(isinstance(reward_key, str) and reward_key != "", f"reward_key must be the name of a logged metric, got {_shown(reward_key)}")
        _require(isinstance(n_draws, numbers.Integral) and not isinstance(n_draws, bool) and n_draws >= 10, f"n_draws must be a whole number >= 10, got {_shown(n_draws)}")
        _require(beat is None or _is_number(beat), f"beat must be a number (a final reward to beat), got {_shown(beat)}")
        _require(_is_number(beat_threshold) and 0 < beat_threshold < 1, f"beat_threshold must be a number between 0 and 1 (exclusive), got {_shown(beat_threshold)}")
        _require(isinstance(plots, bool), f"plots must be True or False, got {_shown(plots)}")
        _require(isinstance(plot_every, numbers.Integral) and not isinstance(plot_every, bool) and plot_every >= 1, f"plot_every must be a whole number >= 1, got {_shown(plot_every)}")
        _require(rule is None or callable(getattr(rule, "decide", None)), f"rule must be a StopRule (a class with a decide(forecast) method), got {_shown(rule)}")
        self.model = model
        self.threshold = float(threshold)
        self.tolerance = float(tolerance)
        self.check_every = int(check_every)
        self.min_fraction = float(min_fraction)
        self.family = normalise_family(family) if family is not None else None
        self.params_b = None if params_b is None else float(params_b)
        self.reward_range = None if reward_range is None else (float(reward_range[0]), float(reward_range[1]))
        self.reward_key = reward_key
        self.verbose = verbose
        self.n_draws = int(n_draws)
        self.beat = None if beat is None else float(beat)
        self.beat_threshold = float(beat_threshold)
        self.plots = plots
        self.plot_every = int(plot_every)
        self.rule = rule if rule is not None else PlateauRule(threshold=self.threshold, tolerance=self.tolerance)
        self.decisions: list[StopDecision] = []
        self.stopped_at: int | None = None
        self.stop_reason: str | None = None
        self.beat_probabilities: list[tuple[int, float]] = []
        self.best_checkpoint: Path | None = None
        self.deleted_checkpoint: Path | None = None
        self.nearest_kept_checkpoint: Path | None = None
        self.plot_steps: list[int] = []
        self.plot_seconds = 0.0
        self._train_started = time.perf_counter()
        self._saved_steps: set[int] = set()
        self._handler: Any = None
        self._plotter: ThreadPoolExecutor | None = None
        self._plot_job: Future | None = None
        self._last_plot: tuple[int, Forecast, StopDecision] | None = None
        self._last_check: int | None = None
        self._seen_key = False
        self._warned: set[str] = set()
        self._main = True  # the main process (state.is_world_process_zero): the only one that warns and prints
        self._passed_warnings: dict = {}  # warnings.warn_explicit's registry: others' warnings shown once per place

    def attach(self, trainer: Any) -> PlateauStoppingCallback:
        """Put this callback first in ``trainer``'s callbacks, so reporters see the ``plateau/*`` keys.

        Passing it as ``callbacks=[...]`` does the same at the start of training; ``attach``
        also works where no training event reaches the callback before the first log.
        """
        self._handler = trainer.callback_handler
        if self not in self._handler.callbacks:
            self._handler.callbacks.insert(0, self)
        self._go_first()
        return self

    def on_train_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, model: Any = None, **kwargs: Any) -> None:
        self._train_started = time.perf_counter()
        self._main = state.is_world_process_zero
        try:
            if not self._go_first() and _reporters(args):
                self._warn_once("order", "could not find the trainer's callback list to go ahead of its reporters; they will not get the plateau/* keys (call callback.attach(trainer))")
        except Exception as exc:  # noqa: BLE001 - the callback must never break training
            self._warn_once("order", f"could not go ahead of the trainer's reporters ({exc!r}); call callback.attach(trainer)")
        try:
            self._describe(model)
        except Exception as exc:  # noqa: BLE001 - the callback must never break training
            self._warn_once("describe", f"could not read the model's family/size ({exc!r}); forecasting without them")

    def on_log(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, logs: dict[str, Any] | None = None, **kwargs: Any) -> None:
        if not logs:
            return
        self._main = state.is_world_process_zero
        distributed = _distributed()
        # Under torch.distributed the main process decides and the others take its decision. A check is due at the
        # same logs on every process (same step, and the main process's last check is shared with the decision),
        # so every process reaches the broadcast together, and none stops alone.
        share = distributed and self._due(state)
        outcome = fc = None
        try:
            if self._main or not distributed:
                outcome, fc = self._check(state, logs)
        except Exception as exc:  # noqa: BLE001 - the callback must never break training
            self._warn_once("check", f"the check at step {state.global_step} failed ({exc!r}); training goes on (later failures are not reported)")
            outcome = fc = None
            if not share:
                return
        if share:
            try:
                outcome = self._share(outcome)
            except Exception as exc:  # noqa: BLE001 - the callback must never break training
                self._warn_once("share", f"could not share the decision at step {state.global_step} between the processes ({exc!r}); not stopping there")
                return
        if outcome is None:
            return
        try:
            self._apply(outcome, args, state, control, logs)
        except Exception as exc:  # noqa: BLE001 - the callback must never break training
            self._warn_once("check", f"the check at step {state.global_step} failed ({exc!r}); training goes on (later failures are not reported)")
            return
        if fc is not None:
            self._plot(args, state, state.global_step, fc, outcome["decision"], due=self.stopped_at is not None or (len(self.decisions) - 1) % self.plot_every == 0)

    def _check(self, state: TrainerState, logs: dict[str, Any]) -> tuple[dict[str, Any] | None, Forecast | None]:
        """Forecast and decide when a check is due: the decision, the keys to log and whether to stop (None when no check)."""
        if not self._usable(logs, state):
            return None, None
        decision, fc = self._decide(state)
        if decision is None:
            return None, None
        values: dict[str, float] = {PROBABILITY_KEY: decision.probability, GAIN_KEY: decision.expected_gain, BEST_STEP_KEY: decision.best_step}
        values.update({key: float(fc.final.quantile(q)) for key, q in FINAL_KEYS.items()})
        values.update({TAKE_OFF_KEY: fc.regimes["take_off_ahead"], PARETO_K_KEY: fc.pareto_k})
        p_beats = None
        if self.beat is not None:
            p_beats = float((fc.final.samples > self.beat).mean())
            values[BEATS_KEY] = p_beats
        beaten = p_beats is not None and p_beats < self.beat_threshold
        outcome = {
            "decision": decision, "values": values, "p_beats": p_beats,
            "stop": bool((decision.should_stop or beaten) and state.global_step < state.max_steps),
            "reason": "plateau" if decision.should_stop else "beat",
        }  # fmt: skip
        return outcome, fc

    def _share(self, outcome: dict[str, Any] | None) -> dict[str, Any] | None:
        """The main process's outcome of this check, broadcast to every process (called by all of them at the same log)."""
        import torch.distributed as dist

        payload = [{"outcome": outcome, "last_check": self._last_check} if self._main else None]
        if self._main and outcome is not None:
            try:  # a decision that cannot be sent (a user's rule's own type) must not leave the others waiting
                pickle.dumps(payload[0])
            except Exception as exc:  # noqa: BLE001 - the callback must never break training
                self._warn_once("share", f"could not send the decision at step {self._last_check} to the other processes ({exc!r}); not stopping there")
                payload = [{"outcome": None, "last_check": self._last_check}]
        dist.broadcast_object_list(payload, src=0)
        self._last_check = payload[0]["last_check"]
        return payload[0]["outcome"]

    def _apply(self, outcome: dict[str, Any], args: TrainingArguments, state: TrainerState, control: TrainerControl, logs: dict[str, Any]) -> None:
        """Record a check's decision, add its keys to the logs and stop training when it says so (on every process alike)."""
        self.decisions.append(outcome["decision"])
        if outcome["p_beats"] is not None:
            self.beat_probabilities.append((state.global_step, outcome["p_beats"]))
        if outcome["stop"]:  # first: every process that got this decision stops, whatever fails below
            control.should_training_stop = True
            self.stopped_at = state.global_step
            self.stop_reason = outcome["reason"]
        values = outcome["values"]
        logs.update(values)
        if state.log_history and state.log_history[-1].get("step") == state.global_step:
            state.log_history[-1].update(values)
        self._name_checkpoint(args, state, saving_now=bool(control.should_save))

    def on_save(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        try:
            self._name_checkpoint(args, state, saving_now=False)
        except Exception as exc:  # noqa: BLE001 - the callback must never break training
            self._warn_once("save", f"could not look up the saved checkpoints ({exc!r})")

    def on_train_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        """Finish the plots (the last decision's included) and print the stop message, once every checkpoint is saved."""
        self._finish_plots(args, state)
        if self.verbose and self.stopped_at is not None and state.is_world_process_zero:
            try:
                self._name_checkpoint(args, state, saving_now=False)
            except Exception as exc:  # noqa: BLE001 - the callback must never break training
                self._warn_once("save", f"could not look up the saved checkpoints ({exc!r})")
            print(f"[bayes_grpo] {self.stop_message()}")

    def stop_message(self) -> str:
        """The latest decision in words, naming the best step and the checkpoint to keep.

        Returns
        -------
        str
            One sentence ('' before the first decision).
        """
        if not self.decisions:
            return ""
        decision = self.decisions[-1]
        text = decision.explain()
        if self.stop_reason == "beat":
            step, p_beats = self.beat_probabilities[-1]
            text = (
                f"Stop at step {step} of {decision.total_steps}: the probability of ending above {self.beat:g} is "
                f"{p_beats:.3f}, below {self.beat_threshold:g}; best step so far {decision.best_step}."
            )
        if self.deleted_checkpoint is not None:
            nearest = (
                f"the nearest kept checkpoint is {self.nearest_kept_checkpoint}"
                if self.nearest_kept_checkpoint is not None
                else "no checkpoint is kept"
            )
            return (
                f"{text} The best step's checkpoint {self.deleted_checkpoint.name} (the one saved at or nearest before "
                f"step {decision.best_step}) was deleted by the trainer's save_total_limit; {nearest}."
            )
        if self.best_checkpoint is None:
            return text
        return f"{text} Checkpoint to keep: {self.best_checkpoint} (the one saved at or nearest before step {decision.best_step})."

    # ---------------------------------------------------------------- internals

    def _warn_once(self, kind: str, message: str) -> None:
        if kind not in self._warned:
            self._warned.add(kind)
            if not self._main:  # the other processes of a distributed run keep quiet: the main one says it once
                return
            warnings.warn(f"PlateauStoppingCallback: {message}", RuntimeWarning, stacklevel=3)

    def _usable(self, logs: dict[str, Any], state: TrainerState) -> bool:
        """True when this log carries a numeric reward and a check is due; warns once about missing or non-numeric rewards."""
        key = self.reward_key
        if key not in logs:
            if not self._seen_key and self._due(state) and not any(k.startswith("train_") for k in logs):
                similar = sorted(k for k in logs if "reward" in k.lower())
                hint = f" (reward-like keys logged: {', '.join(similar)})" if similar else f" (keys logged: {', '.join(sorted(logs))})"
                self._warn_once("key", f"no {key!r} in the trainer's logs{hint}; pass reward_key= the name of the mean reward. Not checking for a plateau until it appears")
            return False
        self._seen_key = True
        if not _is_number(logs[key]):
            self._warn_once("value", f"the logged {key!r} is not a number (got {_shown(logs[key])} at step {state.global_step}); such steps are skipped")
            return False
        return self._due(state)

    def _due(self, state: TrainerState) -> bool:
        if not state.max_steps or state.global_step < self.min_fraction * state.max_steps:
            return False
        if state.global_step >= state.max_steps and self._last_check != state.global_step:
            return True  # the planned last step is always checked: the run's final decision and fan chart
        return self._last_check is None or state.global_step - self._last_check >= self.check_every

    def _describe(self, model: Any) -> None:
        """Fill ``family``/``params_b`` from the trainer's model when not given."""
        if model is None:
            return
        if self.family is None:
            model_type = getattr(getattr(model, "config", None), "model_type", None)
            self.family = normalise_family(model_type) if model_type else None
        if self.params_b is None:
            count = parameter_count(model)
            if count is None:
                self._warn_once("describe", "could not tell the size of the sharded model (its config lacks the dimensions); forecasting without it (pass params_b=)")
            self.params_b = None if count is None else count / 1e9

    def _decide(self, state: TrainerState) -> tuple[StopDecision | None, Forecast | None]:
        key = self.reward_key
        entries = [e for e in state.log_history if "step" in e and _is_number(e.get(key))]
        if len(entries) < MIN_POINTS:
            return None, None
        self._last_check = state.global_step  # a failing check is retried only after check_every steps
        if self.model is None:
            from bayes_grpo.model import default_model

            self.model = default_model()
        from bayes_grpo.logs import read_log
        from bayes_grpo.logs.trl import log_history_frame

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            # The loaders' own reading of log_history: every GRPO signal logged beside the reward (reward_std,
            # frac_reward_zero_std, ...) reaches the forecast, as it does from a trainer_state.json.
            run = read_log(
                log_history_frame(entries, reward_names=(key,)),
                metric=key,
                family=self.family,
                params_b=self.params_b or None,
                total_steps=max(state.max_steps, entries[-1]["step"]),
                reward_range=self.reward_range,
                run_id="live",
            )
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            fc = self.model.forecast(run, n_draws=self.n_draws, seed=state.global_step)
        for warning in caught:  # e.g. equal rewards, poor importance weights: once per kind, not once per check
            if issubclass(warning.category, UserWarning):
                kind = "forecast: " + re.sub(r"[\d.]+", "#", str(warning.message))
                self._warn_once(kind, f"at step {state.global_step}: {warning.message} (reported once)")
            else:  # numerical RuntimeWarnings, deprecations: shown as they would be without the callback
                warnings.warn_explicit(warning.message, warning.category, warning.filename, warning.lineno, registry=self._passed_warnings)
        return self.rule.decide(fc), fc

    def _name_checkpoint(self, args: TrainingArguments, state: TrainerState, saving_now: bool) -> None:
        """Set :attr:`best_checkpoint` to the saved folder holding the best step, or the nearest one before it.

        A checkpoint seen once and gone since was deleted by the trainer's rotation
        (``save_total_limit``): when it is the one that held the best step, say so once
        and name the nearest kept checkpoint instead.
        """
        if getattr(args, "save_strategy", "no") in ("no", None) or not getattr(args, "output_dir", None):
            return
        folder = Path(args.output_dir)
        kept = {int(m.group(1)) for p in folder.glob("checkpoint-*") if p.is_dir() and (m := _CHECKPOINT.search(p.name))}
        if saving_now:  # the trainer writes checkpoint-<step> right after this log
            kept.add(state.global_step)
        self._saved_steps |= kept
        if not self.decisions:
            return
        best = self.decisions[-1].best_step
        holding = max((n for n in self._saved_steps if n <= best), default=None)
        self.best_checkpoint = folder / f"checkpoint-{holding}" if holding in kept else None
        if holding is None or holding in kept:
            self.deleted_checkpoint = self.nearest_kept_checkpoint = None
            return
        self.deleted_checkpoint = folder / f"checkpoint-{holding}"
        nearest = min(kept, key=lambda n: (abs(n - best), n), default=None)
        self.nearest_kept_checkpoint = None if nearest is None else folder / f"checkpoint-{nearest}"
        limit = getattr(args, "save_total_limit", None)
        self._warn_once(
            "deleted checkpoint",
            f"checkpoint-{holding}, which holds the best step {best} (or the nearest saved before it), was deleted by the "
            f"trainer's checkpoint rotation (save_total_limit={limit}), so best_checkpoint is None; the nearest kept checkpoint is "
            f"{self.nearest_kept_checkpoint or 'none'}. Raise save_total_limit to keep the best step's checkpoint",
        )

    # ------------------------------------------------------------ reporters

    def _go_first(self) -> bool:
        """Move this callback to the front of the trainer's callbacks (reporters then see its keys); False when not found.

        transformers gives callbacks no handle on the trainer; the ``CallbackHandler`` that
        dispatches the current event (or the one :meth:`attach` saw) holds the list.
        """
        handler = self._handler or _dispatching_handler()
        if handler is None or self not in handler.callbacks:
            return False
        self._handler = handler
        if handler.callbacks[0] is not self:  # during an event: the callbacks after this one keep their places
            handler.callbacks.remove(self)
            handler.callbacks.insert(0, self)
        return True

    def _targets(self) -> tuple[Any, Any]:
        """The TensorBoard writer and the W&B run the trainer reports to (None for each it does not)."""
        from transformers.integrations import TensorBoardCallback, WandbCallback

        callbacks = self._handler.callbacks if self._handler is not None else []
        writer = next((c.tb_writer for c in callbacks if isinstance(c, TensorBoardCallback) and c.tb_writer is not None), None)
        run = None
        if any(isinstance(c, WandbCallback) for c in callbacks):
            import wandb

            run = wandb.run
        return writer, run

    def _plot(
        self, args: TrainingArguments, state: TrainerState, step: int, fc: Forecast, decision: StopDecision, due: bool, at_end: bool = False
    ) -> None:
        """Start drawing the fan chart of the check at ``step`` in the background when due and the trainer reports to TensorBoard or W&B.

        During training a plot also waits for the last one and keeps within :data:`PLOT_BUDGET`; at the end it need not.
        """
        if not (self.plots and state.is_world_process_zero and {"all", "tensorboard", "wandb"} & set(_reporters(args))):
            return
        try:
            self._collect_plot()
            self._last_plot = (step, fc, decision)
            busy = self._plot_job is not None and not self._plot_job.done()
            over_budget = self.plot_seconds > PLOT_BUDGET * (time.perf_counter() - self._train_started)
            if not due or (not at_end and (busy or over_budget)):
                return  # not due, still drawing the last one, or over budget: training does not wait
            writer, run = self._targets()
            if writer is None and run is None:
                return
            self._plotter = self._plotter or ThreadPoolExecutor(max_workers=1, thread_name_prefix="bayes_grpo-plot")
            history = tuple((d.step, d.probability) for d in self.decisions)
            self._plot_job = self._plotter.submit(self._send_plot, writer, run, step, fc, decision, history)
            self._last_plot = None
        except Exception as exc:  # noqa: BLE001 - the callback must never break training
            self._plot_failed(exc)

    def _send_plot(self, writer: Any, run: Any, step: int, fc: Forecast, decision: StopDecision, history: tuple) -> tuple[int, float]:
        """Draw and send one fan chart (in the plotting thread); the step and the seconds it took."""
        from bayes_grpo import plotting

        start = time.perf_counter()
        pixels = plotting.figure_pixels(plotting.fan_chart(fc, decision, history, self.threshold))
        if writer is not None:
            writer.add_image(PLOT_KEY, pixels, global_step=step, dataformats="HWC")
            writer.flush()
        if run is not None:
            import wandb

            run.log({PLOT_KEY: wandb.Image(pixels, caption=decision.explain()), "train/global_step": step})
        return step, time.perf_counter() - start

    def _collect_plot(self) -> None:
        """Record a finished plot; a failed one becomes the one warning and turns plots off."""
        job = self._plot_job
        if job is None or not job.done():
            return
        self._plot_job = None
        if job.exception() is not None:
            self._plot_failed(job.exception())
        else:
            step, seconds = job.result()
            self.plot_steps.append(step)
            self.plot_seconds += seconds

    def _plot_failed(self, exc: BaseException) -> None:
        self.plots = False
        self._warn_once("plot", f"could not send the fan chart to TensorBoard / W&B ({exc!r}); plots are off for the rest of training")

    def _finish_plots(self, args: TrainingArguments, state: TrainerState) -> None:
        """Wait (at most :data:`PLOT_WAIT_S`) for the plot being drawn, then draw the last decision if it was not."""
        try:
            if self._plot_job is not None:
                self._plot_job.exception(timeout=PLOT_WAIT_S)
                self._collect_plot()
            if self._last_plot is not None and self.plots:
                step, fc, decision = self._last_plot
                self._plot(args, state, step, fc, decision, due=True, at_end=True)
                if self._plot_job is not None:
                    self._plot_job.exception(timeout=PLOT_WAIT_S)
                    self._collect_plot()
        except Exception as exc:  # noqa: BLE001 - the callback must never break training
            self._plot_failed(exc)
        finally:
            if self._plotter is not None:
                self._plotter.shutdown(wait=False)
                self._plotter = None


def _distributed() -> bool:
    """True in a multi-process run with ``torch.distributed`` initialised (the processes must then agree on each decision)."""
    try:
        import torch.distributed as dist
    except ImportError:
        return False
    return bool(dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1)


def _reporters(args: TrainingArguments) -> list[str]:
    """The integrations the trainer reports to (``report_to``; ``"all"`` stays as it is)."""
    report_to = getattr(args, "report_to", None) or []
    report_to = [report_to] if isinstance(report_to, str) else list(report_to)
    return [r for r in report_to if r != "none"]


def _dispatching_handler() -> Any:
    """The transformers ``CallbackHandler`` calling the current event, from the call stack (None outside one)."""
    from transformers.trainer_callback import CallbackHandler

    frame = sys._getframe(1)
    for _ in range(8):
        if frame is None:
            return None
        if isinstance(frame.f_locals.get("self"), CallbackHandler):
            return frame.f_locals["self"]
        frame = frame.f_back
    return None
