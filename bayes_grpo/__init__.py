"""bayes_grpo: Bayesian forecasts and stopping rules for GRPO reward curves.

Public names are loaded lazily so that ``import bayes_grpo`` stays fast and does
not pull in PyMC or transformers until they are needed.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_PUBLIC = {
    "BayesGrpoError": "bayes_grpo.errors",
    "LogError": "bayes_grpo.errors",
    "ModelError": "bayes_grpo.errors",
    "PlanError": "bayes_grpo.errors",
    "RunLog": "bayes_grpo.logs",
    "RunSet": "bayes_grpo.logs",
    "RunMetadata": "bayes_grpo.logs",
    "read_log": "bayes_grpo.logs",
    "read_runs": "bayes_grpo.logs",
    "load_runs": "bayes_grpo.logs",
    "fit": "bayes_grpo.model",
    "FittedModel": "bayes_grpo.model",
    "load_model": "bayes_grpo.model",
    "default_model": "bayes_grpo.model",
    "Forecast": "bayes_grpo.forecast",
    "StopDecision": "bayes_grpo.stopping",
    "StopRule": "bayes_grpo.stopping",
    "PlateauRule": "bayes_grpo.stopping",
    "ValueRule": "bayes_grpo.stopping",
    "FixedFractionRule": "bayes_grpo.stopping",
    "PatienceRule": "bayes_grpo.stopping",
    "rank": "bayes_grpo.sweeps",
    "Ranking": "bayes_grpo.sweeps",
    "PlateauStoppingCallback": "bayes_grpo.callback",
    "watch": "bayes_grpo.watching",
}

__all__ = sorted(_PUBLIC) + ["__version__"]


def __getattr__(name: str) -> Any:
    if name in _PUBLIC:
        value = getattr(importlib.import_module(_PUBLIC[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'bayes_grpo' has no attribute {name!r}")


def __dir__() -> list[str]:
    return __all__
