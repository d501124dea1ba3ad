"""The one home of a run's planned length: :func:`planned_length` checks it, for every entry point.

Loaders, :func:`~bayes_grpo.prepare.prepare_run` (and so every forecast), the CLI, ``watch``,
``rank`` and the Optuna pruner all ask this function, so a bad plan gets the same
:class:`~bayes_grpo.errors.PlanError` and the same words wherever it is given.
"""

from __future__ import annotations

import numbers
from typing import Any

from bayes_grpo.errors import PlanError

#: What a user is told to pass when the plan is unknown or wrong (the CLI rewords ``total_steps=`` as ``--total-steps``).
PLAN_HINT = "pass total_steps= (the trainer's max_steps)"


def planned_length(total_steps: Any, last_step: int | None = None, name: str = "the run", required: bool = True) -> int | None:
    """The planned number of training steps, checked: a whole number >= 1, not before the last logged step.

    Parameters
    ----------
    total_steps : int or None
        The plan as given (an argument, a log's metadata, a trainer's ``max_steps``).
    last_step : int, optional
        The last logged step, which the plan may not precede.
    name : str
        The run or file named in the message.
    required : bool
        Whether a missing plan is an error (else None is returned).

    Returns
    -------
    int or None
        None only for a missing plan when not ``required``.

    Raises
    ------
    PlanError
        For a missing plan (when required), a plan that is not a whole number >= 1, or one
        before ``last_step``.

    Example
    -------
    >>> planned_length(500, last_step=120)
    500
    """
    if total_steps is None:
        if required:
            raise PlanError(f"{name}: the planned number of steps is unknown; {PLAN_HINT}")
        return None
    whole = isinstance(total_steps, numbers.Integral) or (isinstance(total_steps, float) and total_steps.is_integer())
    if isinstance(total_steps, bool) or not whole or total_steps < 1:
        raise PlanError(f"{name}: total_steps must be a whole number >= 1, got {total_steps!r}")
    total = int(total_steps)
    if last_step is not None and total < last_step:
        raise PlanError(f"{name}: total_steps={total} is before the last logged step {int(last_step)}; {PLAN_HINT}")
    return total
