"""The package's own exception types.

Every error caused by bad input (a malformed log, an impossible argument) is a
:class:`BayesGrpoError`, a subclass of :class:`ValueError`, so callers can catch
one type and the CLI can turn it into a one-line message with exit code 2.
"""

from __future__ import annotations


class BayesGrpoError(ValueError):
    """Base class of all bad-input errors raised by bayes_grpo."""


class LogError(BayesGrpoError):
    """A reward log could not be read or failed validation."""


class ModelError(BayesGrpoError):
    """A fitted model is missing, corrupt, or cannot answer the query."""


class PlanError(LogError, ModelError):
    """A run's planned length (``total_steps``) is missing or impossible.

    Raised by :func:`bayes_grpo.logs.plan.planned_length`, the one check every entry point
    (loaders, forecasts, the CLI, ``watch``, ``rank``, the Optuna pruner) makes; it is a
    :class:`LogError` and a :class:`ModelError`, the two types these entry points raised before.
    """
