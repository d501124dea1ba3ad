"""The HTML report: self-contained, every section present, and it renders in real headless Chromium."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import bayes_grpo as bg
from bayes_grpo.report import caveat_list, forecast_cuts, write_report

pytestmark = pytest.mark.slow
CHROMIUM = next((shutil.which(n) for n in ("chromium", "chromium-browser") if shutil.which(n)), None)
CHROMIUM_FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]  # fmt: skip
# Written into the page after load: "N/M" images decoded with a non-zero width.
PROBE = (
    "<script>window.addEventListener('load', () => {const i = Array.from(document.images);"
    "const ok = i.filter(x => x.complete && x.naturalWidth > 0).length;"
    "document.body.insertAdjacentHTML('beforeend', `<p id=\"probe\">images ${ok}/${i.length}</p>`);});</script>"
)


@pytest.fixture(scope="module")
def report(tmp_path_factory, quick_model, few_runs) -> Path:
    return write_report(quick_model, few_runs, tmp_path_factory.mktemp("report") / "report.html", progress=False)


def test_report_is_self_contained_with_every_section(report):
    page = report.read_text()
    for anchor in ("data", "diagnostics", "ppc", "loo", "effects", "forecasts", "stopping", "benchmarks"):
        assert f'<section id="{anchor}">' in page
    assert len(re.findall(r'<img [^>]*src="data:image/png;base64,', page)) >= 7
    assert not re.search(r'(src|href)="(https?:)?//', page)  # nothing fetched from the network
    assert "r_hat" in page and "ess_bulk" in page and "elpd_loo" in page and "fam_gain" in page
    assert re.search(r"Leapfrog steps per draw, per chain: \d+, \d+\.", page)  # the quick fit's two chains
    forecasts = page.split('<section id="forecasts">')[1].split("</section>")[0]
    assert all(column in forecasts for column in ("P(take-off ahead)", "P(plateau)", "P(decline)", "ESS", "Pareto k", "truth"))
    # The report reads no file: without results passed in, it says so instead of looking in benchmarks/results.
    assert "No benchmark results were passed" in page.split('id="benchmarks"')[1]


def test_quick_report_notes_skipped_comparison_and_renders_the_results_it_is_given(tmp_path, quick_model, few_runs):
    import matplotlib.pyplot as plt
    import pandas as pd

    fig, ax = plt.subplots()
    ax.plot([0, 1], [0, 1])
    png = tmp_path / "curve.png"
    fig.savefig(png)
    results = {
        "Calibration": ["# Calibration\n\nCommand: `python benchmarks/calibration.py`\n\n| fraction | coverage90 |\n|---|---|\n| 0.3 | 0.91 |\n", png.read_bytes()],
        "Backtest of the stopping rule": [pd.DataFrame({"rule": ["fixed 80%"], "mean_saved": [0.2]}), fig],
    }
    path = write_report(quick_model, few_runs[:2], tmp_path / "q.html", quick=True, results=results, n_shown=1, progress=False)
    page = path.read_text()
    assert "skipped in quick mode" in page
    benchmarks = page.split('<section id="benchmarks">')[1].split("</section>")[0]
    assert "<h3>Calibration</h3>" in benchmarks and "<td>0.91</td>" in benchmarks
    assert "<code>python benchmarks/calibration.py</code>" in benchmarks
    assert "<h3>Backtest of the stopping rule</h3>" in benchmarks and "fixed 80%" in benchmarks
    assert len(re.findall(r'<img [^>]*src="data:image/png;base64,', benchmarks)) == 2


def test_results_that_cannot_be_rendered_are_a_one_line_error(tmp_path, quick_model, few_runs):
    from bayes_grpo.errors import ModelError

    with pytest.raises(ModelError, match="cannot render a int"):
        write_report(quick_model, few_runs[:1], tmp_path / "bad.html", quick=True, results={"x": [3]}, n_shown=1, progress=False)


def test_report_renders_a_given_loo_comparison(tmp_path, quick_model, few_runs):
    import arviz as az

    assert "log_likelihood" in quick_model.idata
    table = az.compare({"weibull": quick_model.idata, "same again": quick_model.idata}, ic="loo")
    page = write_report(quick_model, few_runs, tmp_path / "c.html", comparison=table, n_shown=1, progress=False).read_text()
    loo = page.split('<section id="loo">')[1].split("</section>")[0]
    assert "same again" in loo and "elpd_loo" in loo and 'alt="LOO comparison of curve forms"' in loo


def _chromium(*args: str, profile: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [CHROMIUM, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *args],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


@pytest.mark.skipif(CHROMIUM is None, reason="Chromium not installed (apt-get install chromium; .ci/run does it)")
def test_report_renders_in_headless_chromium(report, tmp_path):
    from PIL import Image

    shot = tmp_path / "shot.png"
    result = _chromium(f"--screenshot={shot}", "--window-size=1200,3000", report.as_uri(), profile=tmp_path / "profile")
    assert shot.is_file(), result.stderr[-2000:]
    pixels = np.asarray(Image.open(shot).convert("RGB"))
    assert pixels.shape[:2] == (3000, 1200)
    non_white = (pixels < 245).any(axis=2).mean()
    colours = len(np.unique(pixels.reshape(-1, 3)[::7], axis=0))
    assert non_white > 0.05 and colours > 50, (non_white, colours)

    probed = tmp_path / "probed.html"
    probed.write_text(report.read_text().replace("</body>", PROBE + "</body>"))
    dom = _chromium("--dump-dom", "--virtual-time-budget=10000", probed.as_uri(), profile=tmp_path / "profile").stdout
    found = re.search(r"images (\d+)/(\d+)", dom)
    assert found, dom[-500:]
    loaded, total = map(int, found.groups())
    assert total >= 7 and loaded == total


def test_the_forecasts_caveats_are_listed_beside_them() -> None:
    steps = np.arange(1, 401)
    rewards = 0.1 + 0.7 / (1 + np.exp(-(steps - 250) / 20)) + np.random.default_rng(0).normal(0, 0.03, steps.size)
    run = bg.read_log(pd.DataFrame({"step": steps, "reward": rewards}), total_steps=400, run_id="late-riser")
    cuts = forecast_cuts(bg.default_model(), [run], (0.2,), progress=False)
    listed = caveat_list(cuts)
    notes = cuts[0][3].caveats
    assert any("nothing bounds the reward" in note for note in notes)  # a late take-off's head, no range declared
    assert listed.count("<li><code>late-riser</code> from 20%: ") == len(notes)
    assert caveat_list([]) == ""
