"""Evaluation code for the benchmarks and the tests; not shipped in the wheel.

The forecast calibration (:mod:`evaluation.calibration`, with the cache of fold
fits), the stopping backtest (:mod:`evaluation.backtest`), the canonical shapes
(:mod:`evaluation.shapes`), the scores they use (:mod:`evaluation.scoring`) and
where the shared real runs are (:mod:`evaluation.settings`). It lives at the
repository root beside ``benchmarks/`` and imports :mod:`bayes_grpo`; nothing in
:mod:`bayes_grpo` imports it. ``benchmarks/`` and ``scripts/`` put the repository
root on ``sys.path``; pytest does through ``pythonpath`` in ``pyproject.toml``.
"""
