"""The documentation site says what the shipped model and the results files say, and its API pages render.

* Pages name the shipped model's figures and the headline benchmark figures as ``{{ name }}``
  (``docs/hooks.py`` fills them in at build time from ``FittedModel.fitted_on``, its diagnostics
  and ``benchmarks/results``); every name must exist, and no page may retype a run count that
  contradicts ``fitted_on``.
* The README, which GitHub renders as it is, holds the same figures typed out: they must be the
  ones the hook computes.
* The Griffe extension leaves no Sphinx role and no doctest directive in any docstring.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

pytest.importorskip("mkdocs", reason="the docs extra is not installed")
griffe = pytest.importorskip("griffe", reason="the docs extra is not installed")

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"
#: Pages that describe the package as it is (the notes and the changelog record history).
CURRENT_PAGES = [p for p in DOCS.rglob("*.md") if p.parent.name != "notes" and p.name != "changelog.md"]


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, DOCS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


@pytest.fixture(scope="module")
def hooks():
    return _load("hooks")


@pytest.fixture(scope="module")
def figures(hooks) -> dict[str, str]:
    return hooks.figures()


def _flat(text: str) -> str:
    return re.sub(r"\s+", " ", text)


def test_figures_come_from_the_model_card(figures):
    import bayes_grpo as bg

    model = bg.default_model()
    assert figures["model.n_runs"] == str(model.fitted_on["n_runs"])
    assert int(figures["model.n_bundled"]) + int(figures["model.n_real"]) == model.fitted_on["n_runs"]
    assert figures["model.families"].split(", ") == list(model.families)
    assert float(figures["model.r_hat"]) == pytest.approx(model.diagnostics.max_r_hat, abs=5e-4)


@pytest.mark.parametrize("page", CURRENT_PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_figure_a_page_names_exists(page: Path, hooks):
    filled = hooks.fill(page.read_text(encoding="utf-8"), str(page))  # KeyError for a name it does not know
    assert not hooks.PLACEHOLDER.search(filled)


#: Phrases that state a figure of the shipped model, and the ``figures`` name each must equal.
MODEL_CLAIMS = {
    r"fitted on (\d[\d,]*) runs": "model.n_runs",
    r"on all (\d[\d,]*) runs": "model.n_runs",
    r"(\d+) real (?:public )?(?:GRPO )?runs": "model.n_real",
    r"(\d+) tiny CPU runs": "model.n_bundled",
    r"(\d+) small CPU runs": "model.n_bundled",
    r"r_hat (\d\.\d{3})": "model.r_hat",
    r"min (?:bulk )?ESS (\d+)": "model.min_ess",
}


@pytest.mark.parametrize("page", [REPO / "README.md", *CURRENT_PAGES], ids=lambda p: str(p.relative_to(REPO)))
def test_no_page_contradicts_the_shipped_model(page: Path, hooks, figures):
    text = _flat(hooks.fill(page.read_text(encoding="utf-8"), str(page)))
    for pattern, name in MODEL_CLAIMS.items():
        for found in re.findall(pattern, text):
            assert found.replace(",", "") == figures[name], f"{page.name}: '{pattern}' says {found}, the shipped model {figures[name]}"


def test_readme_headline_figures_are_the_results_files(figures):
    readme = _flat((REPO / "README.md").read_text(encoding="utf-8"))
    headline = readme.split("headline-figures:start", 1)[1].split("headline-figures:end", 1)[0]
    for name in (
        "calibration.coverage_90", "calibration.quantile_score", "calibration.error_30_50", "calibration.persistence_30_50",
        "stopping.default.saved", "stopping.default.bad_stops", "stopping.fixed_90.saved", "stopping.fixed_90.bad_stops",
        "stopping.patient_10.saved", "stopping.patient_10.bad_stops", "stopping.oracle.saved",
    ):  # fmt: skip
        assert figures[name] in headline, f"README headline: {name} is {figures[name]} in benchmarks/results"
    assert f"{figures['shapes.checks_met']} of {figures['shapes.checks']} spec checks met" in headline
    limits = readme.split("## Limits", 1)[1].split("##", 1)[0]
    assert figures["calibration.above_q95"] in limits and figures["calibration.ratio_30_50"] in limits


def test_benchmarks_page_links_every_results_page():
    page = (DOCS / "benchmarks.md").read_text(encoding="utf-8")
    for result in sorted((REPO / "benchmarks" / "results").glob("*.md")):
        if not result.name.endswith(".notes.md"):
            assert f"(results/{result.name})" in page, f"docs/benchmarks.md does not link results/{result.name}"


def test_gallery_has_a_card_for_every_notebook():
    gallery = (DOCS / "gallery.md").read_text(encoding="utf-8")
    for notebook in sorted((REPO / "notebooks").glob("*.ipynb")):
        assert f"(gallery/{notebook.stem}.png)" in gallery and f"(notebooks/{notebook.name})" in gallery, notebook.name


def test_docstrings_render_without_roles_or_doctest_directives():
    extension = _load("griffe_docstrings")
    package = griffe.load("bayes_grpo", extensions=griffe.load_extensions(extension.SphinxDocstrings))
    texts = {obj.path: obj.docstring.value for obj in extension.walk(package) if obj.docstring is not None}
    assert len(texts) > 100
    left = {path: re.findall(r":\w+:`[^`]*`|doctest:", text) for path, text in texts.items()}
    assert not {path: found for path, found in left.items() if found}
    linked = "\n".join(texts.values())
    assert '<autoref identifier="bayes_grpo.forecast.result.Forecast" optional>' in linked  # resolved to where the class lives
    examples = griffe.load("bayes_grpo.model", extensions=griffe.load_extensions(extension.SphinxDocstrings))["FittedModel.forecast"]
    kinds = [section.kind.value for section in examples.docstring.parse("numpy")]
    assert "examples" in kinds


# ---------------------------------------------------------------- the built site's search


@pytest.fixture(scope="module")
def search_index(tmp_path_factory) -> list[dict]:
    """The search index of the site as ``.ci/run`` builds it (``mkdocs build --strict``; the notebooks
    come from the build's cache in ``.cache/notebooks``, or are executed, a few minutes)."""
    import json
    import os
    import subprocess
    import sys

    site = tmp_path_factory.mktemp("site")
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=REPO, capture_output=True, text=True, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads((site / "search" / "search_index.json").read_text(encoding="utf-8"))["docs"]


def _naive_score(entry: dict, query: str) -> float:
    """A plain stand-in for the site's search: query words (prefix match, as stemming would) found in the
    title count 10, in the text 1, times the page's boost."""
    words = [w for w in query.lower().split() if w not in {"my", "i", "do", "how", "the", "a"}]
    title, text = entry["title"].lower(), entry["text"].lower()
    score = sum(10 * bool(re.search(rf"\b{w}", title)) + bool(re.search(rf"\b{w}", text)) for w in words)
    return score * entry.get("boost", 1)


@pytest.mark.slow
def test_search_index_holds_no_notebook_chrome(search_index):
    chrome = [e["location"] for e in search_index if "Copied!" in e["text"] or re.search(r"\b(In|Out)\s?\[\d*\]:", e["text"])]
    assert not chrome, f"notebook prompts or copy-button text indexed: {chrome}"
    import nbformat

    for notebook in sorted((REPO / "notebooks").glob("*.ipynb")):  # each cell's code is indexed once, not twice
        indexed = " ".join(e["text"] for e in search_index if e["location"].startswith(f"notebooks/{notebook.stem}/"))
        firsts = [c.source.strip().split("\n")[0] for c in nbformat.read(notebook, as_version=4).cells if c.cell_type == "code"]
        for line in {f for f in firsts if len(f) > 20 and not set("<>&\"'") & set(f)}:
            assert indexed.count(line) <= firsts.count(line), f"{notebook.name}: {line!r} indexed {indexed.count(line)} times"


@pytest.mark.slow
def test_search_for_stopping_early_finds_the_guides_before_the_api(search_index):
    ranked = sorted(search_index, key=lambda e: -_naive_score(e, "stop my run early"))
    guides = [i for i, e in enumerate(ranked) if e["location"].startswith(("guide/callback/", "guide/stopping/"))]
    api = [i for i, e in enumerate(ranked) if e["location"].startswith("api/")]
    assert guides and api and guides[0] < api[0], [(e["location"], _naive_score(e, "stop my run early")) for e in ranked[:8]]


def _published_texts() -> dict[str, str]:
    """Every page a reader meets: README, the docs' Markdown and the notebooks' generator."""
    pages = {"README.md": (REPO / "README.md").read_text(encoding="utf-8")}
    pages |= {str(p.relative_to(REPO)): p.read_text(encoding="utf-8") for p in DOCS.rglob("*.md") if "notes" not in p.parts}
    pages["notebooks/make_notebooks.py"] = (REPO / "notebooks" / "make_notebooks.py").read_text(encoding="utf-8")
    return pages


def test_one_definition_of_the_final_reward():
    """The final reward is the mean logged reward over the last 10% of the steps, everywhere (measures.final_reward)."""
    for name, text in _published_texts().items():
        assert "at the last planned step" not in text, name


def test_the_first_examples_read_files_that_exist():
    """README's tour and getting-started read a bundled run, not an outputs/ folder a newcomer does not have."""
    for name in ("README.md", "docs/getting-started.md"):
        text = (REPO / name).read_text(encoding="utf-8")
        code = "\n".join(re.findall(r"```(?:python|console|bash)\n(.*?)```", text, flags=re.S))
        assert "outputs/" not in code, name
        for path in re.findall(r"data/runs/[\w.\-]+\.csv", code):
            assert (REPO / path).is_file(), (name, path)


def test_tensorboard_keys_are_documented_with_their_train_prefix():
    for name in ("docs/guide/callback.md", "docs/guide/watch.md"):
        assert "train/plateau/probability" in (REPO / name).read_text(encoding="utf-8"), name
