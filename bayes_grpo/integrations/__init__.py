"""Bridges to other tools: :mod:`bayes_grpo.integrations.optuna` prunes Optuna trials by their forecast.

Each integration imports its tool only when imported itself, so the tool stays an optional extra.
"""
