"""The HTML report: self-contained, every section present, and it renders in real headless Chromium."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from bayes_grpo.report import write_report

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
    assert "not yet run: " in page or "<table>" in page.split('id="benchmarks"')[1]


def test_quick_report_notes_skipped_comparison_and_embeds_benchmarks(tmp_path, quick_model, few_runs):
    (tmp_path / "calibration.md").write_text("# Calibration\n\n| fraction | coverage90 |\n|---|---|\n| 0.3 | 0.91 |\n")
    path = write_report(quick_model, few_runs[:2], tmp_path / "q.html", quick=True, benchmarks_dir=tmp_path, n_shown=1, progress=False)
    page = path.read_text()
    assert "skipped in quick mode" in page
    assert "<td>0.91</td>" in page
    assert "not yet run: <code>python benchmarks/backtest_stopping.py</code>" in page


def test_report_renders_a_given_loo_comparison(tmp_path, quick_model, few_runs):
    import arviz as az

    from bayes_grpo.report import _log_likelihood_idata

    with_ll = _log_likelihood_idata(quick_model, few_runs)
    table = az.compare({"weibull": with_ll, "same again": with_ll}, ic="loo")
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
