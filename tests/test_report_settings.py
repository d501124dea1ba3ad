"""The report's stop section states the stop rule's defaults as :mod:`bayes_grpo.settings` defines them."""

from __future__ import annotations

import inspect

import matplotlib.pyplot as plt

from bayes_grpo import report, settings


def test_stop_section_and_figure_take_threshold_and_tolerance_from_settings(monkeypatch):
    assert inspect.signature(report.stop_figure).parameters["threshold"].default == settings.STOP_THRESHOLD
    monkeypatch.setattr(report, "stop_figure", lambda model, runs, progress: plt.figure(figsize=(1, 1)))
    text = report._stop_section(None, [], progress=False)[0]
    assert f"{settings.STOP_TOLERANCE:.0%} of the 10-90% spread" in text and f"default threshold, {settings.STOP_THRESHOLD:g}" in text
    monkeypatch.setattr(report, "STOP_THRESHOLD", 0.97)
    monkeypatch.setattr(report, "STOP_TOLERANCE", 0.05)
    text = report._stop_section(None, [], progress=False)[0]
    assert "5% of the 10-90% spread" in text and "default threshold, 0.97" in text
    plt.close("all")
