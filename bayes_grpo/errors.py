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
