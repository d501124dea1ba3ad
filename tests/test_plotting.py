"""The figures a newcomer saves: the getting-started fan (``fc.plot(truth=full)``) and the callback's ``fan_chart``."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import pytest

import bayes_grpo as bg
from bayes_grpo.plotting import fan_chart
from bayes_grpo.settings import bundled_runs_dir
from bayes_grpo.stopping import decision_from_forecast

BUNDLED = bundled_runs_dir() / "llama-m-sort4-noise0.8-lr0.0001-s0.csv"


@pytest.fixture(scope="module")
def cut_forecast():
    full = bg.read_log(BUNDLED)
    return bg.default_model().forecast(full.head(90), seed=0), full


def _legend_labels(ax) -> list[str]:
    legend = ax.get_legend()
    assert legend is not None, "the axes have no legend"
    return [text.get_text() for text in legend.get_texts()]


def _inside(inner, outer) -> bool:
    return inner.x0 >= outer.x0 and inner.y0 >= outer.y0 and inner.x1 <= outer.x1 and inner.y1 <= outer.y1


def test_the_getting_started_plot_keeps_its_axis_labels_and_has_a_legend(cut_forecast, tmp_path):
    """Issue 48, item 7: ``fc.plot(truth=full)`` saved at default settings cut off "step" and had no legend."""
    fc, full = cut_forecast
    ax = fc.plot(truth=full)
    try:
        path = tmp_path / "fan.png"
        ax.figure.savefig(path)  # default size, dpi and bbox: what the getting-started page does
        assert path.stat().st_size > 0
        renderer = ax.figure.canvas.get_renderer()
        for label in (ax.xaxis.label, ax.yaxis.label, ax.title):
            assert label.get_text()
            assert _inside(label.get_window_extent(renderer), ax.figure.bbox), label.get_text()
        assert ax.xaxis.label.get_text() == "step"
        labels = _legend_labels(ax)
        for wanted in ("90% interval", "50% interval", "median", "full run", "logged"):
            assert wanted in labels
        assert _inside(ax.get_legend().get_window_extent(renderer), ax.figure.bbox)
    finally:
        plt.close(ax.figure)


def test_fan_chart_has_a_legend_and_marks_the_best_step_on_the_smoothed_reward(cut_forecast):
    fc, _ = cut_forecast
    decision = decision_from_forecast(fc)
    figure = fan_chart(fc, decision, history=[(60, 0.1), (90, decision.probability)])
    fan = figure.axes[0]
    labels = _legend_labels(fan)
    for wanted in ("90% interval", "50% interval", "median", "logged", "planned end"):
        assert wanted in labels
    best = [line for line in fan.get_lines() if line.get_label().startswith("best step")]
    assert len(best) == 1 and "smoothed" in best[0].get_label()
    assert f"best step {decision.best_step}" in best[0].get_label()
    (x,), (y,) = best[0].get_data()
    assert x == decision.best_step
    from bayes_grpo.plotting import best_step_level

    assert y == pytest.approx(best_step_level(fc, decision.best_step))
    # The marker sits on the smoothed reward, not on the raw logged value at that step.
    from bayes_grpo.measures import smoothed

    span = max(float(fc.total_steps - fc.observed_steps[0]), 1.0)
    level = smoothed(fc.observed_steps, fc.observed_rewards, span=span)[list(fc.observed_steps).index(decision.best_step)]
    assert y == pytest.approx(level)
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = FigureCanvasAgg(figure)
    canvas.draw()
    renderer = canvas.get_renderer()
    assert _inside(figure.axes[-1].xaxis.label.get_window_extent(renderer), figure.bbox)
