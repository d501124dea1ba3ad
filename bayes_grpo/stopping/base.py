"""The stop rule's one method: :class:`StopRule`, a decision from a forecast.

Every rule of the package (:class:`~bayes_grpo.stopping.plateau.PlateauRule`,
:class:`~bayes_grpo.stopping.value.ValueRule`, the baselines
:class:`~bayes_grpo.stopping.fixed.FixedFractionRule` and
:class:`~bayes_grpo.stopping.patience.PatienceRule`) and any rule a user writes
subclasses it; the TRL callback, ``bayes-grpo stop --rule`` and the backtest take
any of them. Like Optuna's pruners, a rule is one class with one method, and rules
can wrap rules.
"""

from __future__ import annotations

import importlib
import importlib.util
from abc import ABC, abstractmethod
from pathlib import Path

from bayes_grpo.errors import BayesGrpoError
from bayes_grpo.forecast import Forecast
from bayes_grpo.stopping.decision import StopDecision, decision


class StopRule(ABC):
    """Base of every stop rule: subclass it and write :meth:`decide`.

    Example
    -------
    A rule that stops half-way through the plan:

    >>> class StopAtHalf(StopRule):
    ...     def decide(self, forecast):
    ...         half_way = (forecast.last_observed_step or 0) >= forecast.total_steps / 2
    ...         return self.decision(forecast, half_way, "half way", "half the planned steps are done")
    """

    @abstractmethod
    def decide(self, forecast: Forecast) -> StopDecision:
        """Whether to stop the run the forecast describes, and why."""

    def decision(self, forecast: Forecast, should_stop: bool, reason: str, detail: str = "") -> StopDecision:
        """A :class:`StopDecision` with this rule's verdict and the forecast's evidence beside it.

        Parameters
        ----------
        forecast : Forecast
            The forecast judged.
        should_stop : bool
            The verdict.
        reason : str
            A short word for why (shown by the CLI and the callback).
        detail : str
            A sentence for :meth:`StopDecision.explain`.

        Returns
        -------
        StopDecision
        """
        return decision(forecast, should_stop=should_stop, reason=reason, rule=type(self).__name__, detail=detail)


def load_rule(spec: str) -> StopRule:
    """A stop rule named as ``module:Class`` or ``path/to/file.py:Class``, made with no arguments (``bayes-grpo stop --rule``).

    Parameters
    ----------
    spec : str
        The module (importable, or a Python file) and the rule class in it.

    Returns
    -------
    StopRule
        Anything with a ``decide(forecast)`` method.

    Raises
    ------
    BayesGrpoError
        For a spec without ``:``, a module or file that cannot be loaded, a missing class, or a class that is not a rule.

    Example
    -------
    >>> load_rule("bayes_grpo.stopping:PatienceRule")
    PatienceRule(patience=0.1, min_delta=0.0)
    """
    module_name, sep, class_name = spec.rpartition(":")
    if not sep or not module_name or not class_name:
        raise BayesGrpoError(f"a stop rule is named as module:Class or file.py:Class, got {spec!r}")
    try:
        if module_name.endswith(".py"):
            path = Path(module_name)
            if not path.is_file():
                raise BayesGrpoError(f"stop rule file {module_name} does not exist")
            loader_spec = importlib.util.spec_from_file_location(f"bayes_grpo_user_rule_{path.stem}", path)
            module = importlib.util.module_from_spec(loader_spec)
            loader_spec.loader.exec_module(module)
        else:
            module = importlib.import_module(module_name)
    except BayesGrpoError:
        raise
    except Exception as exc:  # noqa: BLE001 - a user's module may fail in any way; say so in one line
        raise BayesGrpoError(f"could not load the stop rule module {module_name}: {type(exc).__name__}: {exc}") from exc
    rule_class = getattr(module, class_name, None)
    if rule_class is None:
        raise BayesGrpoError(f"{module_name} has no {class_name}")
    rule = rule_class() if isinstance(rule_class, type) else rule_class
    if not callable(getattr(rule, "decide", None)):
        raise BayesGrpoError(f"{spec} is not a stop rule (a class with a decide(forecast) method, e.g. a StopRule subclass)")
    return rule
